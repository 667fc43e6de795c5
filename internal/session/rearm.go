package session

/*
#include <stdlib.h>
#include "fastpath.h"
*/
import "C"

import (
	"time"
	"unsafe"
)

// A flight recorder's ct_reopen runs in C alone where it can (rearm.c): the
// next session takes a slot with its clock started and the one it replaces
// is marked re-armed, without entering Go. Go's tables catch up here, the
// first time Go meets either handle (Lookup, or the drainer meeting the new
// session's records): the session Go holds is discarded, and the re-armed
// one opened in its place as Reopen would have opened it then.

// rearmedAt is what a session re-armed in C was opened with: the handle C
// gave it, and the wall clock and thread of the ct_reopen call.
type rearmedAt struct {
	handle uint64
	wall   time.Time
	tid    int64
}

const slotRearmed = C.CT_SLOT_REARMED

// settleLocked brings Go's tables up to date with the re-arms in C that
// involve handle h (the new session's or the one it replaced); mu is held.
func settleLocked(h uint64) {
	var c C.ct_rearm_claim
	if C.ct__rearm_claim(C.uint64_t(h), &c) == 0 {
		return
	}
	next := uint64(c.next)
	root := live[uint64(c.root)]
	var t *traceSession
	if root != nil {
		t = root.buffered()
	}
	if t == nil { // cannot happen: only Go's buffered sessions are re-armable
		slotRelease(next)
		return
	}
	run, err := root.run.WithCaptureStep(uint64(c.step))
	if err != nil { // cannot happen either: C checked the step against the run's lowest
		slotRelease(next)
		return
	}
	k, same, o := t.discardLocked(), t.sameRun, root.opts
	at := &rearmedAt{handle: next, wall: time.Unix(0, int64(c.wall_ns)), tid: int64(c.tid)}
	// A failure (a buffered trace creates nothing at open: memory, if anything)
	// has released next already: its handle fails as a finished one's.
	_, _ = openRun(C.GoString(&c.path[0]), run, o, &same, k, at)
}

// allowRearm lets ct_reopen re-arm s in C (ok) or not; s is a buffered trace
// session whose path was found usable in folder.
func (s *Session) allowRearm(ok bool, folder string) {
	var dir *C.char
	if ok {
		dir = C.CString(folder)
		defer C.free(unsafe.Pointer(dir))
	}
	okC := C.int(0)
	if ok {
		okC = 1
	}
	root := C.int(0)
	if s.run.MeasuredRoot {
		root = 1
	}
	C.ct__rearm_allow(s.slot, okC, C.uint64_t(s.run.MinCaptureStep()), root, dir)
}

// rearmed reports whether C re-armed s in another session's place since Go
// last looked (its handle is no longer valid).
func (s *Session) rearmed() bool { return slotState(s.slot) == slotRearmed }

// rearmC is ct_reopen's C way alone, for tests: the new handle, or 0 where
// it would go the Go way.
func rearmC(h uint64, path string, step uint64) uint64 {
	p := C.CString(path)
	defer C.free(unsafe.Pointer(p))
	var out C.ct_session
	if C.ct__rearm(C.ct_session(h), p, C.uint64_t(step), &out) != C.CT_OK {
		return 0
	}
	return uint64(out)
}
