package session

/*
#include "fastpath.h"

// n span pairs on the calling thread with no cgo call between them, as a C
// program makes them: what BenchmarkSpanPairsDrained profiles the drainer on.
static ct_status bench_span_pairs(ct_session h, long n) {
    for (long i = 0; i < n; i++) {
        ct_span sp;
        ct_status st = ct__span_begin(h, "layer/forward", CT_SPAN_FUNCTION, CT_STEP_NONE, 0, &sp);
        if (st == CT_OK) st = ct__span_end(h, sp);
        if (st != CT_OK) return st;
    }
    return CT_OK;
}
*/
import "C"

// spanPairsC makes n begin/end pairs of one name through the C fast path on
// the calling OS thread (benchmarks only).
func spanPairsC(h uint64, n int) error {
	if st := C.bench_span_pairs(C.ct_session(h), C.long(n)); st != C.CT_OK {
		return &Error{Code: Status(st), Msg: lastCError()}
	}
	return nil
}
