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
//
// One, because with a second P idle the runtime's monitor thread leaves a P
// with the thread that last ran Go (back in C, or in a system call) for up
// to 10 ms, polling every 20 µs meanwhile: a flight recorder's one ct_reopen
// per update cost about 45 wake-ups and 1.4 ms of CPU an update that way on
// a 2-core VM, more than all its other work in Go. With no idle P the
// monitor takes the P back on its second look and sleeps. The price: a call
// coming more than ~40 µs after the one before wakes the monitor (a few µs
// on the caller; +15 µs an update for the Rust binding's 250 µs toy update).
// The Go side is one drainer and a few tickers, which share one lock anyway.
const DefaultMaxProcs = 1

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
