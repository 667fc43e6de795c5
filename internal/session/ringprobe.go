package session

/*
#include <stdint.h>
#include <sys/mman.h>
#include "fastpath.h"

// Bytes of [from, to) of the calling thread's ring in memory (tests).
static uint64_t own_ring_resident_in(uint64_t from, uint64_t to) {
    const ct_ring *r = ct__own_ring();
    return r ? ct__ring_resident_in(r, from, to) : 0;
}

// Gives [from, to) of the calling thread's ring back to the kernel (tests;
// only where no record is unread).
static void own_ring_drop(uint64_t from, uint64_t to) {
    const ct_ring *r = ct__own_ring();
    if (r && to <= r->cap && from < to) madvise(r->data + from, to - from, MADV_DONTNEED);
}
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
	keep      uint64 // what stays resident past a wrap back (ct__ring_keep)
	offset    uint64 // where the next record goes
	head      uint64 // bytes written, padding included, since the ring began
	sinceWake uint64 // bytes written since the producer last woke the drainer
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
		soft: uint64(r.soft), cap: uint64(r.cap), keep: uint64(C.ct__ring_keep(r)),
		offset: head & (uint64(r.cap) - 1),
		head:   head,
		// wake_mark is the producer's own: read on its thread, it is exact.
		sinceWake: head - uint64(r.wake_mark),
		waits:     atomic.LoadUint64((*uint64)(unsafe.Pointer(&r.waits))),
		resident:  uint64(C.ct__ring_resident_in(r, 0, C.uint64_t(r.cap))),
	}
}

// prefaultOwnRing runs the drainer's prefault of the calling thread's ring
// as if its producer had written up to head (tests).
func prefaultOwnRing(head uint64) { C.ct__ring_prefault(C.ct__own_ring(), C.uint64_t(head)) }

// ownRingResidentIn is how many bytes of [from, to) of the calling thread's
// ring are in memory; ownRingDrop gives them back (page-aligned bounds).
func ownRingResidentIn(from, to uint64) uint64 {
	return uint64(C.own_ring_resident_in(C.uint64_t(from), C.uint64_t(to)))
}
func ownRingDrop(from, to uint64) { C.own_ring_drop(C.uint64_t(from), C.uint64_t(to)) }

// ownRingData is the address of the calling thread's ring's memory (0
// before its first span).
func ownRingData() uintptr {
	if r := C.ct__own_ring(); r != nil {
		return uintptr(unsafe.Pointer(r.data))
	}
	return 0
}

// ownRingTail is the drainer's position in the calling thread's ring (tests).
func ownRingTail() uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&C.ct__own_ring().tail)))
}

// ownRingLook is what the drainer's wait sees of the calling thread's ring
// (tests; while the drainer is held, holdDrainer).
func ownRingLook() ringLook { return lookAt(C.ct__own_ring()) }
