package main

/*
#include "candle_trace.h"
*/
import "C"

import "github.com/candle-trace/candle-trace/internal/events"

// Benchmark-only exports (not in the public header): the one-Go-call-per-event
// design that tests/bench/bench_spans.c measures beside the C fast path.

//export ctbench_naive_span_begin
func ctbench_naive_span_begin(h C.ct_session, name *C.char, kind, step C.uint32_t, out *C.ct_span) (rc C.int) {
	defer guard("naive_span_begin", &rc)
	s, err := lookup(h)
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
	s, err := lookup(h)
	if err != nil {
		return status(err)
	}
	return status(s.NaiveEndSpan(uint64(span)))
}
