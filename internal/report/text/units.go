package text

import (
	"fmt"

	"github.com/candle-trace/candle-trace/internal/report/units"
)

// FormatNS renders nanoseconds with a unit a person reads at a glance
// (units.NS, which the analysis's explanations use too).
func FormatNS(ns float64) string { return units.NS(ns) }

// FormatBytes renders a byte count in binary units.
func FormatBytes(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit && exp < 5; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

// FormatShare renders a fraction as a percentage.
func FormatShare(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

func FormatDeltaNS(d int64) string {
	if d < 0 {
		return "-" + FormatNS(float64(-d))
	}
	return "+" + FormatNS(float64(d))
}

func FormatDeltaBytes(d int64) string {
	if d < 0 {
		return "-" + FormatBytes(uint64(-d))
	}
	return "+" + FormatBytes(uint64(d))
}
