// Command libtrace is the C ABI of candle-trace, built with
// -buildmode=c-shared into libcandle_trace.so. Only the private ctgo_*
// exports live here; the public ct_* functions are the C shims in shims.c,
// which keep the header const-correct and refuse calls in a fork child before
// any Go code runs.
package main

import (
	"os"
	"runtime"
	"strconv"
)

func main() {}

// DefaultMaxProcs caps the Go scheduler inside a training process, whose
// cores belong to the training. CANDLE_TRACE_GOMAXPROCS (or GOMAXPROCS)
// overrides it.
const DefaultMaxProcs = 2

func init() {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	n := DefaultMaxProcs
	if v, err := strconv.Atoi(os.Getenv("CANDLE_TRACE_GOMAXPROCS")); err == nil && v > 0 {
		n = v
	}
	if n < runtime.GOMAXPROCS(0) {
		runtime.GOMAXPROCS(n)
	}
}
