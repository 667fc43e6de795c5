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

// ctgo_drain_rings is called by the C fast path when a thread's ring is full.
//
//export ctgo_drain_rings
func ctgo_drain_rings() {
	mu.Lock()
	drainLocked()
	mu.Unlock()
}

var recHdrSize = uint64(unsafe.Sizeof(C.ct_rec_hdr{}))

// drainLocked moves every record out of every ring into its session's
// encode buffer. Records of sessions that no longer exist (a call that raced
// with finish) are dropped.
func drainLocked() {
	var last *Session
	var lastHandle uint64
	dead := false
	for r := (*C.ct_ring)(atomic.LoadPointer((*unsafe.Pointer)(unsafe.Pointer(&C.ct__rings)))); r != nil; r = r.next {
		head := atomic.LoadUint64((*uint64)(unsafe.Pointer(&r.head)))
		tailp := (*uint64)(unsafe.Pointer(&r.tail))
		tail := *tailp
		if tail != head {
			mask := uint64(r.cap) - 1
			data := unsafe.Slice((*byte)(unsafe.Pointer(r.data)), uint64(r.cap))
			tid := int64(r.tid)
			for tail < head {
				off := tail & mask
				h := (*C.ct_rec_hdr)(unsafe.Pointer(&data[off]))
				size := uint64(h.size)
				switch h._type {
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
					handle := uint64(h.session)
					if handle != lastHandle {
						last, lastHandle = live[handle], handle
					}
					if last != nil && last.poison == nil {
						switch h._type {
						case C.CT_REC_SPAN_START:
							name := data[off+recHdrSize : off+recHdrSize+uint64(h.name_len)]
							last.onSpanStart(uint64(h.id), uint64(h.parent), name, uint64(h.ts),
								uint32(h.kind), uint32(h.step), h.measured != 0, tid)
						case C.CT_REC_SPAN_END:
							last.onSpanEnd(uint64(h.id), uint64(h.ts), h.measured != 0, uint64(h.parent))
						}
					}
				}
				tail += size
			}
			atomic.StoreUint64(tailp, tail)
		}
		if atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.dead))) != 0 {
			dead = true
		}
	}
	folder.done()
	if dead {
		C.ct__ring_unlink_dead()
	}
}

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
