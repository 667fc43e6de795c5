package session

/*
#include "fastpath.h"
*/
import "C"

import (
	"sync/atomic"
	"unsafe"
)

// ringProbe is what tests see of the calling thread's ring (fastpath.h):
// its sizes, how far it stretched and how much of it is resident.
type ringProbe struct {
	soft, cap uint64 // everyday size, address space
	offset    uint64 // where the next record goes
	waits     uint64 // times the producer waited for room
	resident  uint64 // bytes of the address space in memory
}

// ownRingProbe probes the calling thread's ring (zero before its first span).
func ownRingProbe() ringProbe {
	r := C.ct__own_ring()
	if r == nil {
		return ringProbe{}
	}
	head := atomic.LoadUint64((*uint64)(unsafe.Pointer(&r.head)))
	return ringProbe{
		soft: uint64(r.soft), cap: uint64(r.cap),
		offset:   head & (uint64(r.cap) - 1),
		waits:    atomic.LoadUint64((*uint64)(unsafe.Pointer(&r.waits))),
		resident: uint64(C.ct__ring_resident(r)),
	}
}

// prefaultOwnRing runs the drainer's prefault of the calling thread's ring
// as if its producer had written up to head (tests).
func prefaultOwnRing(head uint64) { C.ct__ring_prefault(C.ct__own_ring(), C.uint64_t(head)) }

// ownRingTail is the drainer's position in the calling thread's ring (tests).
func ownRingTail() uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&C.ct__own_ring().tail)))
}
