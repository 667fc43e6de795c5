package session

/*
#include "fastpath.h"
#include "ticks.h"
#include <stdlib.h>
*/
import "C"

import (
	"math/bits"
	"unsafe"

	"github.com/candle-trace/candle-trace/internal/events"
)

// tscSegs is how many of the newest counter-clock segments a drain copies:
// a record's counter value is nearly always in the newest (one is published
// at most every 20 ms); an older one converts through C.
const tscSegs = 4

// tscSnap is the counter clock's newest segments (ticks.h), copied once per
// ring drain after the ring's head was read: every record up to that head
// read its counter before the copy, so no segment published later applies
// to it (a new segment starts past the counter's value at its publication).
type tscSnap struct {
	n    int
	segs [tscSegs]C.ct_tsc_seg // newest first
}

func (s *tscSnap) take() {
	s.n = int(C.ct__tsc_snapshot(&s.segs[0], tscSegs))
}

// ns converts counter value t as ct__tsc_ns does, in the same integers.
func (s *tscSnap) ns(t uint64) uint64 {
	for i := 0; i < s.n; i++ {
		g := &s.segs[i]
		if t >= uint64(g.tick) {
			hi, lo := bits.Mul64(t-uint64(g.tick), uint64(g.mult))
			return uint64(g.ns) + (hi<<32 | lo>>32)
		}
	}
	return uint64(C.ct__tsc_ns(C.uint64_t(t)))
}

// tscUpdate lets the counter clock publish a segment when one is due.
func tscUpdate() { C.ct__tsc_update(0) }

// tscNsC is ct__tsc_ns, for tests comparing the two conversions.
func tscNsC(t uint64) uint64 { return uint64(C.ct__tsc_ns(C.uint64_t(t))) }

// traceClockForce is for tests: switches the clock of trace sessions opened
// from now on (tickMonotonic, or tickCounter where usable) and returns the
// one in force.
func traceClockForce(source int) int { return int(C.ct__trace_clock_force(C.int(source))) }

// slotOnCounter reports whether slot s's clock is the converted counter.
func slotOnCounter(s *C.ct_slot) bool { return s.tsc != 0 }

// ringNames is the drainer's side of each ring's name cache (fastpath.h):
// the name a NAME_DEF record put at each slot; guarded by mu. A ring freed
// and another allocated at its address starts with an empty C cache, so
// its slots are defined again before any record refers to them.
var ringNames = map[*C.ct_ring]*ringNameSlots{}

type ringNameSlots [C.CT_NAME_SLOTS]ringName

// ringName is one slot's name: its bytes, and those as the JSON string a
// span_start carries (spelled once per definition, not per span).
type ringName struct {
	raw, json []byte
}

// pruneRingNames forgets the names of rings no longer linked; mu is held.
func pruneRingNames() {
	if len(ringNames) == 0 {
		return
	}
	linked := make(map[*C.ct_ring]bool, len(ringNames))
	for r := firstRing(); r != nil; r = r.next {
		linked[r] = true
	}
	for r := range ringNames {
		if !linked[r] {
			delete(ringNames, r)
		}
	}
}

// slotsOf is ring r's name slots, *names once looked up.
func slotsOf(r *C.ct_ring, names **ringNameSlots) *ringNameSlots {
	if *names == nil {
		if *names = ringNames[r]; *names == nil {
			*names = new(ringNameSlots)
			ringNames[r] = *names
		}
	}
	return *names
}

// spanName resolves a span_start record's name (at off in data): its bytes,
// kept for the slot when they define it, or the slot's; json is their JSON
// string when the slot holds them (nil for a name too long to cache).
func spanName(r *C.ct_ring, names **ringNameSlots, h *C.ct_rec_hdr, data []byte, off uint64) (raw, json []byte) {
	flags := uint32(h.flags)
	if flags&(C.CT_RECF_NAME_DEF|C.CT_RECF_NAME_REF) == 0 {
		return data[off+recHdrSize : off+recHdrSize+uint64(h.name_len)], nil
	}
	n := &slotsOf(r, names)[(flags>>8)&(C.CT_NAME_SLOTS-1)]
	if flags&C.CT_RECF_NAME_DEF != 0 {
		n.raw = append(n.raw[:0], data[off+recHdrSize:off+recHdrSize+uint64(h.name_len)]...)
		n.json = events.AppendName(n.json[:0], n.raw)
	}
	return n.raw, n.json
}

// tscCounter reads the counter (tests).
func tscCounter() uint64 { return uint64(C.ct__counter()) }

// tscNowC is ct__tsc_now (tests).
func tscNowC() uint64 { return uint64(C.ct__tsc_now()) }

// tscPublish makes the counter clock publish a segment now (tests).
func tscPublish() { C.ct__tsc_update(1) }

// cNames are span names as a C program's literals: one pointer each for as
// long as they live, so that a begin's name is found in the ring's name
// cache from its second use on (tests).
type cNames []*C.char

func newCNames(names ...string) cNames {
	n := make(cNames, len(names))
	for i, name := range names {
		n[i] = C.CString(name)
	}
	return n
}

func (n cNames) free() {
	for _, c := range n {
		C.free(unsafe.Pointer(c))
	}
}

// begin opens a function span named n[i] on the calling thread through the
// C fast path.
func (n cNames) begin(h uint64, i int) (uint64, error) {
	var id C.ct_span
	if st := C.ct__span_begin(C.ct_session(h), n[i], C.CT_SPAN_FUNCTION, C.CT_STEP_NONE, 0, &id); st != C.CT_OK {
		return 0, &Error{Code: Status(st), Msg: lastCError()}
	}
	return uint64(id), nil
}

// spanNestC makes depth nested spans named by level on the calling thread
// through the C fast path, with one name pointer per level (as a C program's
// literals), and ends them innermost first: n times (tests).
func spanNestC(h uint64, depth, n int) error {
	names := make([]*C.char, depth)
	for i := range names {
		names[i] = C.CString("level/" + string(rune('a'+i)))
		defer C.free(unsafe.Pointer(names[i]))
	}
	ids := make([]C.ct_span, depth)
	for k := 0; k < n; k++ {
		for i := 0; i < depth; i++ {
			if st := C.ct__span_begin(C.ct_session(h), names[i], C.CT_SPAN_FUNCTION, C.CT_STEP_NONE, 0, &ids[i]); st != C.CT_OK {
				return &Error{Code: Status(st), Msg: lastCError()}
			}
		}
		for i := depth - 1; i >= 0; i-- {
			if st := C.ct__span_end(C.ct_session(h), ids[i]); st != C.CT_OK {
				return &Error{Code: Status(st), Msg: lastCError()}
			}
		}
	}
	return nil
}
