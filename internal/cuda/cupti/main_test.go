package cupti

import (
	"os"
	"testing"
)

// The tests' sessions run on CLOCK_MONOTONIC. A test's truth for where an
// interval lands is the fake CUPTI clock (CLOCK_MONOTONIC plus an offset)
// less the session's start; the counter clock is an estimate of
// CLOCK_MONOTONIC steered to within its calibration's error, a few ns that
// the collector's bound (the anchors' half-brackets, against the session
// clock) does not include and need not: under -race on a busy machine,
// TestCollectorDecodesAndAttributes found intervals 1-3 ns outside it (86
// of them in 30 runs, 0 on CLOCK_MONOTONIC). How the counter follows
// CLOCK_MONOTONIC is the session package's test (tsc_test.go).
func TestMain(m *testing.M) {
	os.Setenv("CANDLE_TRACE_CLOCK", "monotonic")
	os.Exit(m.Run())
}
