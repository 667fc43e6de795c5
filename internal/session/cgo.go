package session

/*
#cgo CFLAGS: -I${SRCDIR}/../../include -O2 -std=gnu11 -Wall
#include <stdlib.h>
#include "fastpath.h"
#include "ticks.h"
*/
import "C"

import (
	"sync/atomic"
	"unsafe"
)

// The C side keeps the session slots (registry.go decides when one is taken
// and freed, state.go what state it publishes), the per-thread span stacks
// and the rings (fastpath.c). These wrappers are the only Go code that
// touches them, but for the drainer's reads of the rings (drain.go).

func slotAlloc() uint64 { return uint64(C.ct__slot_alloc()) }

func slotRelease(h uint64) { C.ct__slot_release(C.uint64_t(h)) }

func slotOf(h uint64) *C.ct_slot { return C.ct__slot_of(C.uint64_t(h)) }

func setSlotState(s *C.ct_slot, state uint32) {
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&s.state)), state)
}

// casSlotState moves the slot from one state to another, if it is still in
// the first (a re-arm in C changes it without Go's lock).
func casSlotState(s *C.ct_slot, from, to uint32) bool {
	return atomic.CompareAndSwapUint32((*uint32)(unsafe.Pointer(&s.state)), from, to)
}

func slotState(s *C.ct_slot) uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&s.state)))
}

// setSlotAggregate routes the slot's spans to the aggregate path (before
// the handle is returned to anyone) with statistics on or off.
func setSlotAggregate(s *C.ct_slot, on bool) {
	C.ct__ticks_init()
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&s.agg)), 1)
	setSlotAggregateOn(s, on)
}

func setSlotAggregateOn(s *C.ct_slot, on bool) {
	v := uint32(0)
	if on {
		v = 1
	}
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&s.agg_on)), v)
}

// nsPerTick converts aggregate span ticks to nanoseconds (ticks.h).
func nsPerTick() float64 { return float64(C.ct__ns_per_tick()) }

// openSpansC counts the spans open in aggregate session h on every thread,
// with up to max threads' ids and their counts.
func openSpansC(h uint64, max int) (total uint64, tids []int64, counts []uint32, threads int) {
	tids = make([]int64, max)
	counts = make([]uint32, max)
	var n C.int
	total = uint64(C.ct__open_spans(C.ct_session(h), (*C.int64_t)(unsafe.Pointer(&tids[0])), (*C.uint32_t)(unsafe.Pointer(&counts[0])), C.int(max), &n))
	threads = int(n)
	if threads < max {
		tids, counts = tids[:threads], counts[:threads]
	}
	return total, tids, counts, threads
}

// innermostKeyC is the calling thread's innermost aggregate span's key.
func innermostKeyC(h uint64) (uint32, bool) {
	k := uint32(C.ct__innermost_key(C.ct_session(h)))
	return k, k != ^uint32(0)
}

const (
	tickMonotonic = C.CT_TICKS_MONOTONIC
	tickCounter   = C.CT_TICKS_COUNTER
)

// forceTicks is for tests: switches the aggregate tick source (the counter
// only where usable) and returns the one in force.
func forceTicks(source int) int { return int(C.ct__ticks_force(C.int(source))) }

func slotMeasured(s *C.ct_slot) bool {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&s.measured))) != 0
}

func setSlotMeasured(s *C.ct_slot) {
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&s.measured)), 1)
}

// nextSpanID hands out a span id from the same counter the C fast path uses.
func nextSpanID(s *C.ct_slot) uint64 {
	return atomic.AddUint64((*uint64)(unsafe.Pointer(&s.next_span)), 1)
}

func lastSpanID(s *C.ct_slot) uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&s.next_span)))
}

// setPoison stores the reason before the state flips, so the C side can quote it.
func setPoison(s *C.ct_slot, msg string) {
	n := len(msg)
	if n > C.CT_POISON_CAP-1 {
		n = C.CT_POISON_CAP - 1
	}
	buf := unsafe.Slice((*byte)(unsafe.Pointer(&s.poison[0])), C.CT_POISON_CAP)
	copy(buf, msg[:n])
	buf[n] = 0
	setSlotState(s, C.CT_SLOT_POISONED)
}

func clockNs() uint64 { return uint64(C.ct__clock_ns()) }

func slotNow(s *C.ct_slot) uint64 { return uint64(C.ct__slot_now(s, nil)) }

func slotTracerNs(s *C.ct_slot) uint64 {
	var excluded C.uint64_t
	C.ct__slot_now(s, &excluded)
	return uint64(excluded)
}

func tracerBeginC(h uint64) error {
	if st := C.ct__tracer_begin(C.ct_session(h)); st != C.CT_OK {
		return &Error{Code: Status(st), Msg: lastCError()}
	}
	return nil
}

func tracerBeginEarlierC(h, earlierNs uint64) error {
	if st := C.ct__tracer_begin_earlier(C.ct_session(h), C.uint64_t(earlierNs)); st != C.CT_OK {
		return &Error{Code: Status(st), Msg: lastCError()}
	}
	return nil
}

func slotTracerEstimated(s *C.ct_slot) uint64 { return uint64(C.ct__slot_tracer_estimated(s)) }

func tracerEndC(h uint64) error {
	if st := C.ct__tracer_end(C.ct_session(h)); st != C.CT_OK {
		return &Error{Code: Status(st), Msg: lastCError()}
	}
	return nil
}

func slotT0(s *C.ct_slot) uint64 { return uint64(s.t0) }

func threadID() int64 { return int64(C.ct__gettid()) }

// Forked reports whether this process is a fork child of the one that loaded
// the library (every session is then out of reach).
func Forked() bool { return atomic.LoadInt32((*int32)(unsafe.Pointer(&C.ct__forked))) != 0 }

const (
	slotOpen      = C.CT_SLOT_OPEN
	slotFinishing = C.CT_SLOT_FINISHING
	slotPoisoned  = C.CT_SLOT_POISONED
)

// WriteCError puts err's message into the calling thread's ct_last_error()
// buffer (cut to fit) and returns its status. Exports and the C path's calls
// into Go run on the C caller's thread, so the buffer is the caller's.
func WriteCError(err error) Status {
	msg := err.Error()
	if len(msg) > C.CT_ERR_CAP-1 {
		msg = msg[:C.CT_ERR_CAP-1]
	}
	buf := unsafe.Slice((*byte)(unsafe.Pointer(C.ct__errbuf())), C.CT_ERR_CAP)
	copy(buf, msg)
	buf[len(msg)] = 0
	return CodeOf(err)
}

// lastCError is the calling thread's C message buffer (set by the fast path).
func lastCError() string { return C.GoString(C.ct__errbuf()) }

// beginSpanC and endSpanC run the C fast path; Go callers (tests, Go users)
// use them through Session.BeginSpan / EndSpan.
func beginSpanC(h uint64, name string, kind, step uint32, measured bool) (uint64, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var out C.ct_span
	m := C.int(0)
	if measured {
		m = 1
	}
	st := C.ct__span_begin(C.ct_session(h), cname, C.ct_span_kind(kind), C.ct_step(step), m, &out)
	if st != C.CT_OK {
		return 0, &Error{Code: Status(st), Msg: lastCError()}
	}
	return uint64(out), nil
}

func endSpanC(h uint64, span uint64) error {
	st := C.ct__span_end(C.ct_session(h), C.ct_span(span))
	if st != C.CT_OK {
		return &Error{Code: Status(st), Msg: lastCError()}
	}
	return nil
}

// InnermostSpan is the calling OS thread's innermost open span in s, 1 (the
// root) when it has none: what the C fast path would nest a new span in.
func (s *Session) InnermostSpan() uint64 { return uint64(C.ct__innermost_span(C.ct_session(s.handle))) }

// MonotonicStart is the session clock's zero: CLOCK_MONOTONIC ns when the
// session opened (session ns = CLOCK_MONOTONIC ns - MonotonicStart).
func (s *Session) MonotonicStart() uint64 { return slotT0(s.slot) }

type cSlot = C.ct_slot

// ownRingBacklog is how many bytes of the calling thread's ring wait for
// the drainer (tests: who drained what).
func ownRingBacklog() uint64 {
	r := C.ct__own_ring()
	if r == nil {
		return 0
	}
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&r.head))) - atomic.LoadUint64((*uint64)(unsafe.Pointer(&r.tail)))
}
