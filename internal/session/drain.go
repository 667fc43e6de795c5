package session

/*
#include "fastpath.h"
*/
import "C"

import (
	"math"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/candle-trace/candle-trace/internal/aggregate"
)

// mu guards every session's Go-side state and is the single consumer lock of
// the per-thread rings. One lock is enough: the hot path never takes it, and
// the slow-path records are orders of magnitude rarer than spans.
var mu sync.Mutex

// live maps handles to open sessions; guarded by mu.
var live = map[uint64]*Session{}

var recHdrSize = uint64(unsafe.Sizeof(C.ct_rec_hdr{}))

// drainLocked moves every record out of every ring into its session's
// encode buffer. Records of sessions that no longer exist (a call that raced
// with finish) are dropped. Only the drainer goroutine, the flushers and the
// rare calls that must see every thread's spans (finish, flush) run it: a
// producer whose ring is full waits for it (fastpath.c) rather than drain.
func drainLocked() {
	tscUpdate()
	dead := false
	for r := firstRing(); r != nil; r = r.next {
		drainRing(r)
		if atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.dead))) != 0 {
			dead = true
		}
	}
	folder.done()
	if dead {
		C.ct__ring_unlink_dead()
		pruneRingNames()
	}
}

// drainRingsOfLocked drains the rings of the threads with id tid (a thread
// id is on one live ring; one of an exited thread may linger beside it).
func drainRingsOfLocked(tid int64) {
	for r := firstRing(); r != nil; r = r.next {
		if int64(r.tid) == tid {
			drainRing(r)
		}
	}
	folder.done()
}

// drainOwnRingLocked drains the calling thread's ring only: what a record
// call needs so that its own thread's spans are current (beginRecord).
func drainOwnRingLocked() {
	if r := C.ct__own_ring(); r != nil {
		drainRing(r)
		folder.done()
	}
}

// recordSpan finds span id for a record call, which drained only its own
// thread's ring: a span open on the calling thread (or opened in Go) is
// current; one open on another thread may have ended in that thread's ring,
// which is drained first; a span found nowhere may have begun in a ring not
// drained yet, so every ring is, and it is looked up again. mu is held.
func (s *Session) recordSpan(id uint64) (o openSpan, open bool, c closedSpan, closed bool) {
	ts, p := s.open.locate(id)
	switch {
	case p != nil && (ts == nil || ts.ring == C.ct__own_ring()):
		return *p, true, c, false
	case p != nil:
		drainRing(ts.ring)
		folder.done()
	default:
		if c, ok := s.closed.get(id); ok {
			return o, false, c, true
		}
		if s.aggr != nil {
			return // its spans never reach the tables (spanBounds)
		}
		drainLocked()
	}
	if o, ok := s.open.get(id); ok {
		return o, true, c, false
	}
	c, closed = s.closed.get(id)
	return o, false, c, closed
}

func firstRing() *C.ct_ring {
	return (*C.ct_ring)(atomic.LoadPointer((*unsafe.Pointer)(unsafe.Pointer(&C.ct__rings))))
}

// ringSession is a session as one ring's records reach it: its open spans
// on the ring's thread and its clock's origin. s is nil while the handle is
// no longer live (its records are dropped).
type ringSession struct {
	handle uint64
	s      *Session
	stack  *threadSpans
	t0     uint64 // the session's clock at open (counter-clock records)
}

// to makes handle the session records of r go to.
func (c *ringSession) to(handle uint64, r *C.ct_ring) {
	if handle == c.handle {
		return
	}
	c.handle, c.s = handle, live[handle]
	if c.s == nil {
		settleLocked(handle) // a session re-armed in C: Go opens it now (rearm.go)
		c.s = live[handle]
	}
	if c.s != nil {
		c.stack = c.s.open.thread(r)
		c.t0 = slotT0(c.s.slot)
	}
}

// usable reports whether the session takes records: live and not poisoned.
func (c *ringSession) usable() bool { return c.s != nil && c.s.poison == nil && !c.s.released }

// drainRing applies r's records up to its head; mu is held.
func drainRing(r *C.ct_ring) {
	var long ringSession    // the session of the record in hand (long records name theirs)
	var compact ringSession // the session of compact records (the ring's last marker)
	var names *ringNameSlots
	var tsc tscSnap // taken at the first counter record, after head was read
	head := atomic.LoadUint64((*uint64)(unsafe.Pointer(&r.head)))
	tailp := (*uint64)(unsafe.Pointer(&r.tail))
	tail := *tailp
	if tail == head {
		return
	}
	mask := uint64(r.cap) - 1
	if head&mask > uint64(r.soft) {
		C.ct__ring_prefault(r, C.uint64_t(head))
	}
	data := unsafe.Slice((*byte)(unsafe.Pointer(r.data)), uint64(r.cap))
	tid := int64(r.tid)
	compact.to(uint64(r.trace_cur), r)
	waiting := (*uint32)(unsafe.Pointer(&r.waiting))
	published, step := tail, uint64(r.soft)/drainSteps
	// Every compact record moves these, whoever's session it is: the short
	// forms are deltas from them (ct_rec_short).
	lastID, lastTicks := uint64(r.id_cur), uint64(r.ticks_cur)
	for tail < head {
		if tail-published >= step {
			// A producer waiting for room gets it now, not once the whole
			// ring is drained: it goes on filling while this goes on.
			published = tail
			if atomic.LoadUint32(waiting) != 0 {
				atomic.StoreUint64(tailp, tail)
				C.ct__ring_consumed(r, C.uint64_t(tail))
			}
		}
		off := tail & mask
		h := (*C.ct_rec_hdr)(unsafe.Pointer(&data[off]))
		size := uint64(h.size)
		switch h._type {
		case C.CT_REC_BEGIN:
			b := (*C.ct_rec_begin)(unsafe.Pointer(h))
			lastID, lastTicks = uint64(b.id), uint64(b.ticks)
			if compact.usable() {
				compact.begin(r, &names, &tsc, lastID, lastTicks, uint32(b.kind), uint32(b.step), uint32(b.slot), tid)
			}
		case C.CT_REC_BEGIN_NEXT:
			w := uint32((*C.ct_rec_short)(unsafe.Pointer(h)).word)
			lastID, lastTicks = lastID+1, lastTicks+uint64(w>>C.CT_SHORT_BEGIN_DELTA_SHIFT)
			if compact.usable() {
				compact.begin(r, &names, &tsc, lastID, lastTicks, w>>C.CT_SHORT_KIND_SHIFT&3,
					w>>C.CT_SHORT_STEP_SHIFT&3, w>>C.CT_SHORT_SLOT_SHIFT, tid)
			}
		case C.CT_REC_END:
			lastTicks = uint64((*C.ct_rec_end)(unsafe.Pointer(h)).ticks)
			if compact.usable() {
				compact.end(&tsc, lastTicks)
			}
		case C.CT_REC_END_NEXT:
			lastTicks += uint64(uint32((*C.ct_rec_short)(unsafe.Pointer(h)).word) >> C.CT_SHORT_END_DELTA_SHIFT)
			if compact.usable() {
				compact.end(&tsc, lastTicks)
			}
		case C.CT_REC_TRACE_SESSION:
			r.trace_cur = (*C.ct_rec_agg)(unsafe.Pointer(h)).val
			compact.to(uint64(r.trace_cur), r)
		case C.CT_REC_PAD:
		case C.CT_REC_AGG_SESSION:
			r.agg_cur = (*C.ct_rec_agg)(unsafe.Pointer(h)).val
		case C.CT_REC_AGG:
			a := (*C.ct_rec_agg)(unsafe.Pointer(h))
			folder.add(uint64(r.agg_cur), uint32(a.type_key)>>8, uint64(a.val))
		case C.CT_REC_AGG_SCALAR:
			a := (*C.ct_rec_agg)(unsafe.Pointer(h))
			folder.scalar(uint64(r.agg_cur), uint32(a.type_key)>>8, math.Float64frombits(uint64(a.val)))
		default:
			drainLongSpanRecord(r, h, data, off, &long, &names, &tsc, tid)
		}
		tail += size
	}
	r.id_cur, r.ticks_cur = C.uint64_t(lastID), C.uint64_t(lastTicks)
	// As ct__ring_consumed: tail, then whether a producer waits for room
	// (both sequentially consistent, against the producer's waiting-then-tail).
	atomic.StoreUint64(tailp, tail)
	if atomic.LoadUint32(waiting) != 0 {
		C.ct__ring_consumed(r, C.uint64_t(tail))
	}
}

// begin applies a compact span begin: its parent is the thread's innermost
// open span in the session, else the root; mu is held.
func (c *ringSession) begin(r *C.ct_ring, names **ringNameSlots, tsc *tscSnap, id, ticks uint64, kind, step, slot uint32, tid int64) {
	if tsc.n == 0 {
		tsc.take()
	}
	name := &slotsOf(r, names)[slot&(C.CT_NAME_SLOTS-1)]
	parent := uint64(1)
	if top := c.stack.innermost(); top != nil {
		parent = top.id
	}
	c.s.onSpanStart(c.stack, id, parent, name.raw, name.json, tsc.ns(ticks)-c.t0, kind, step, false, tid)
}

// end applies a compact span end: it ends the thread's innermost open span
// in the session, whose start the drainer kept; mu is held.
func (c *ringSession) end(tsc *tscSnap, ticks uint64) {
	if tsc.n == 0 {
		tsc.take()
	}
	if top := c.stack.innermost(); top != nil {
		end := tsc.ns(ticks) - c.t0
		c.s.onSpanEnd(c.stack, top.id, end-min(end, top.start), false, 0)
	}
}

// drainLongSpanRecord applies a span record in its long form (ct_rec_hdr),
// which names its session, its span and its parent; mu is held.
func drainLongSpanRecord(r *C.ct_ring, h *C.ct_rec_hdr, data []byte, off uint64, c *ringSession, names **ringNameSlots, tsc *tscSnap, tid int64) {
	var name, nameJSON []byte
	if h._type == C.CT_REC_SPAN_START {
		// Before the session's checks: the ring's name cache follows
		// every record, whoever's it is.
		name, nameJSON = spanName(r, names, h, data, off)
	}
	c.to(uint64(h.session), r)
	if !c.usable() {
		return
	}
	ticks := uint32(h.flags)&C.CT_RECF_TICKS != 0
	if ticks && tsc.n == 0 {
		tsc.take()
	}
	switch h._type {
	case C.CT_REC_SPAN_START:
		start := uint64(h.ts)
		if ticks {
			start = tsc.ns(start) - c.t0
		}
		c.s.onSpanStart(c.stack, uint64(h.id), uint64(h.parent), name, nameJSON, start,
			uint32(h.kind), uint32(h.step), h.measured != 0, tid)
	case C.CT_REC_SPAN_END:
		dur, tracer := uint64(h.ts), uint64(h.parent)
		endAt := uint32(h.flags)&C.CT_RECF_END_AT != 0 // the end on the session clock
		if ticks {                                     // both ends on the counter: no tracer time between them
			dur, tracer, endAt = tsc.ns(dur)-c.t0, 0, true
		}
		// From an end, the duration takes the start its span_start was
		// written with, not its ticks converted again: a span open longer
		// than the counter's kept segments would convert them through
		// another. (A span not the innermost is not ended: onSpanEnd ignores
		// the record.)
		if endAt {
			if top := c.stack.innermost(); top != nil && top.id == uint64(h.id) {
				dur -= min(dur, top.start)
			}
		}
		c.s.onSpanEnd(c.stack, uint64(h.id), dur, h.measured != 0, tracer)
	}
}

// drainSteps: the drainer hands room to a producer waiting for it each
// time it has read this fraction of the ring. More often would cost a futex
// wake and a sleep per step while the producer outruns the drainer.
const drainSteps = 4

// folder batches one drain's aggregate records per session, converting
// ticks to nanoseconds at the rate measured at this drain; guarded by mu.
var folder aggFolder

type aggFolder struct {
	handle uint64
	s      *Session // nil: records of a session that is gone
	rate   float64  // ns per tick, 0 until this drain needs it
	batch  []aggregate.Observation
}

const foldBatch = 1024

// to makes handle's session the one records are folded into.
func (f *aggFolder) to(handle uint64) {
	if handle != f.handle {
		f.flush()
		f.handle, f.s = handle, live[handle]
		if f.s != nil && (f.s.aggr == nil || f.s.poison != nil) {
			f.s = nil
		}
	}
}

// scalar folds one value, gated when it was recorded.
func (f *aggFolder) scalar(handle uint64, key uint32, v float64) {
	f.to(handle)
	if f.s != nil {
		f.s.aggr.agg.FoldScalar(aggregate.ScalarKey(key), v)
	}
}

func (f *aggFolder) add(handle uint64, key uint32, ticks uint64) {
	f.to(handle)
	if f.s == nil {
		return
	}
	if f.rate == 0 {
		f.rate = nsPerTick()
	}
	f.batch = append(f.batch, aggregate.Observation{Key: aggregate.Key(key), DurationNS: uint64(float64(ticks)*f.rate + 0.5)})
	if len(f.batch) == foldBatch {
		f.flush()
	}
}

func (f *aggFolder) flush() {
	if f.s != nil && len(f.batch) > 0 {
		f.s.aggr.agg.ObserveBatch(f.batch)
	}
	f.batch = f.batch[:0]
}

// done ends a drain: a later drain may find other sessions under the same
// handles' slots, and the clock rate moves on.
func (f *aggFolder) done() {
	f.flush()
	f.handle, f.s, f.rate = 0, nil, 0
}
