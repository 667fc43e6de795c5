package session

/*
#include "fastpath.h"
*/
import "C"

import (
	"sync"
	"sync/atomic"
	"unsafe"
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
				if h._type != C.CT_REC_PAD {
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
							last.onSpanEnd(uint64(h.id), uint64(h.ts))
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
	if dead {
		C.ct__ring_unlink_dead()
	}
}
