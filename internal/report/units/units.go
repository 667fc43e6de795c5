// Package units renders the report's quantities for a person: one place for
// the text report (package text) and the analysis's explanations (package
// analysis, which text imports) to share.
package units

import (
	"fmt"
	"strconv"
)

// NS renders nanoseconds with a unit a person reads at a glance.
func NS(ns float64) string {
	switch {
	case ns < 1e3:
		return strconv.FormatFloat(ns, 'f', -1, 64) + " ns"
	case ns < 1e6:
		return fmt.Sprintf("%.2f µs", ns/1e3)
	case ns < 1e9:
		return fmt.Sprintf("%.2f ms", ns/1e6)
	default:
		return fmt.Sprintf("%.3f s", ns/1e9)
	}
}
