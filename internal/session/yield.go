package session

/*
#include "fastpath.h"
*/
import "C"

import (
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"
)

// The drainer's work per span (decoding, encoding, writing: ~180 ns a pair)
// is several times the program's (~30 ns). While the program's own threads
// keep every CPU busy with spans, each slice of CPU the drainer takes is one
// a program thread waits for: with four threads on two CPUs a burst of spans
// took ~1.15 times as long with the drainer running beside it (its share of
// five runnable threads) as with it waiting until the burst ends. So, woken,
// the drainer first waits while the program's threads outnumber the CPUs,
// for as long as every ring has room: the work is the same, done once the
// CPUs are free. It waits at most yieldMax at a time (the trace stays that
// current), never while a producer waits for room, never past half of a
// ring's address space (a producer that went on would soon wait), and not
// for aggregate records (stretches).
const (
	yieldStep = 250 * time.Microsecond
	yieldMax  = 50 * time.Millisecond
)

// yieldCPUs is how many CPUs the program's threads must keep busy before the
// drainer waits for them (a test sets it).
var yieldCPUs atomic.Int32

func init() { yieldCPUs.Store(int32(runtime.NumCPU())) }

// ringLook is what the drainer's wait looks at in one ring (by its address:
// the rings' list can lose one between two looks, so none is dereferenced
// from it). room: how far the drainer lets the ring fill before it drains.
type ringLook struct {
	head, tail, room uint64
	waiting          bool
}

// ringTrack is a ring's head at the drainer's last look, and when the drainer
// last saw it move.
type ringTrack struct {
	head  uint64
	moved time.Time
}

// busyWindow: a ring seen moving this recently is a thread the CPUs are busy
// with. The scheduler shares the CPUs among more threads in slices of a few
// ms, so in one step only the threads on a CPU right then move (four threads
// on two CPUs: one or two a step, and all four within a few).
const busyWindow = 5 * time.Millisecond

// outnumbered says whether the drainer should wait, from a look at the rings
// at time at and what it saw before (seen): every ring has room (is filled
// less than its look's room), one moved on since the look before, and at
// least cpus of them did within busyWindow. A ring not looked at before
// counts as moving now. It returns what to compare the next look with.
func outnumbered(now map[uintptr]ringLook, seen map[uintptr]ringTrack, at time.Time, cpus int) (bool, map[uintptr]ringTrack) {
	next := make(map[uintptr]ringTrack, len(now))
	busy, moving, roomy := 0, false, true
	for r, l := range now {
		t, ok := seen[r]
		if !ok || t.head != l.head {
			t, moving = ringTrack{head: l.head, moved: at}, true
		}
		next[r] = t
		if at.Sub(t.moved) <= busyWindow {
			busy++
		}
		if l.waiting || l.head-l.tail >= l.room {
			roomy = false
		}
	}
	return roomy && moving && busy >= cpus, next
}

// yieldSeen is what the drainer saw of each ring at its last look (drainer
// only).
var yieldSeen = map[uintptr]ringTrack{}

// yieldSteps counts the steps the drainer has waited (tests).
var yieldSteps atomic.Int64

// yieldToProducers waits while outnumbered says to, up to yieldMax. Run by
// the drainer goroutine only, before it drains.
func yieldToProducers() {
	start := time.Now()
	for {
		var wait bool
		wait, yieldSeen = outnumbered(lookAtRings(), yieldSeen, time.Now(), int(yieldCPUs.Load()))
		if !wait || time.Since(start) >= yieldMax {
			return
		}
		time.Sleep(yieldStep)
		yieldSteps.Add(1)
	}
}

// lookAtRings reads every ring's positions; mu keeps the list from losing a
// ring under it.
func lookAtRings() map[uintptr]ringLook {
	mu.Lock()
	defer mu.Unlock()
	now := map[uintptr]ringLook{}
	for r := firstRing(); r != nil; r = r.next {
		now[uintptr(unsafe.Pointer(r))] = lookAt(r)
	}
	return now
}

// lookAt reads one ring's positions, and how far the drainer lets it fill.
func lookAt(r *C.ct_ring) ringLook {
	l := ringLook{
		head:    atomic.LoadUint64((*uint64)(unsafe.Pointer(&r.head))),
		tail:    atomic.LoadUint64((*uint64)(unsafe.Pointer(&r.tail))),
		room:    uint64(r.cap) / 2,
		waiting: atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.waiting))) != 0,
	}
	if l.head != l.tail && !stretches(r, l.tail, l.head) {
		l.room = 0
	}
	return l
}

// stretches says whether the first record in [tail, head) may stretch the
// ring: a trace record, past a padding record. An aggregate record never does: its
// producer waits once the everyday size is full (fastpath.c: ring_reserve),
// and the drainer folds it in a few ns -- so a ring of them has no room to
// wait in (four threads' aggregate burst: 1.17x its mean and CPU with the
// drainer waiting up to half the everyday size). A record's type is its
// fifth byte in every form (ct_rec_hdr, ct_rec_agg, ct_rec_short).
func stretches(r *C.ct_ring, tail, head uint64) bool {
	mask := uint64(r.cap) - 1
	h := (*C.ct_rec_hdr)(unsafe.Add(unsafe.Pointer(r.data), tail&mask))
	if h._type == C.CT_REC_PAD {
		// The ring's end: the records go on at its start.
		if tail += uint64(h.size); tail == head {
			return true
		}
		h = (*C.ct_rec_hdr)(unsafe.Add(unsafe.Pointer(r.data), tail&mask))
	}
	switch h._type {
	case C.CT_REC_AGG_SESSION, C.CT_REC_AGG, C.CT_REC_AGG_SCALAR:
		return false
	}
	return true
}
