package main

/*
#include "candle_trace.h"
*/
import "C"

import (
	"runtime"

	"github.com/candle-trace/candle-trace/internal/events"
)

// Benchmark- and test-only exports (not in the public header): the one-Go-call-per-event
// design that tests/bench/bench_spans.c measures beside the C fast path.
// build/libcandle_trace.so keeps them local (exports.map); only the
// benchmark build, build/bench/libcandle_trace.so, exports them
// (exports_bench.map).

//export ctbench_naive_span_begin
func ctbench_naive_span_begin(h C.ct_session, name *C.char, kind, step C.uint32_t, out *C.ct_span) (rc C.int) {
	defer guard("naive_span_begin", &rc)
	s, err := lookup("ctbench_naive_span_begin", h)
	if err != nil {
		return status(err)
	}
	id, err := s.NaiveBeginSpan(C.GoString(name), events.SpanKind(kind), events.Step(step))
	if err == nil {
		*out = C.ct_span(id)
	}
	return status(err)
}

//export ctbench_naive_span_end
func ctbench_naive_span_end(h C.ct_session, span C.ct_span) (rc C.int) {
	defer guard("naive_span_end", &rc)
	s, err := lookup("ctbench_naive_span_end", h)
	if err != nil {
		return status(err)
	}
	return status(s.NaiveEndSpan(uint64(span)))
}

// ctdebug_runtime reports the Go runtime's thread cap and goroutine count,
// for tests of what the library does to its host process (not in the header).
//
//export ctdebug_runtime
func ctdebug_runtime(maxprocs, goroutines *C.int) {
	*maxprocs = C.int(runtime.GOMAXPROCS(0))
	*goroutines = C.int(runtime.NumGoroutine())
}
