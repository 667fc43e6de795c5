// Package units renders the report's quantities for a person: one place for
// the text report (package text) and the analysis's explanations (package
// analysis, which text imports) to share.
package units

import (
	"fmt"
	"math"
	"strconv"
)

// NS renders nanoseconds with a unit a person reads at a glance. Below a
// microsecond a mean of integer durations keeps one decimal ("210.9 ns"), not
// every digit of the float.
func NS(ns float64) string {
	switch tenths := math.Round(ns*10) / 10; {
	case tenths < 1e3:
		return strconv.FormatFloat(tenths, 'f', -1, 64) + " ns"
	case ns < 1e6:
		return fmt.Sprintf("%.2f µs", ns/1e3)
	case ns < 1e9:
		return fmt.Sprintf("%.2f ms", ns/1e6)
	default:
		return fmt.Sprintf("%.3f s", ns/1e9)
	}
}
