package session

// A session's state and the functions that change it, all under mu:
//
//	open ──ct_finish's checks pass──▶ finishing ──the end is written──▶ gone
//	  ▲ └──────── a span begun meanwhile: refused, open again ◀───┘
//	  └─ a write fails (writeLocked) ──▶ poisoned ──ct_finish_failed──▶ gone
//
// ct_finish_failed and ct_discard go to finishing from any state. Go owns the
// state; the C slot publishes it to the span fast path, which reads the state
// word and the poison's text without a lock and writes neither (fastpath.c
// check_slot). The poison's Go error is the whole message (the slot's copy
// is cut to CT_POISON_CAP bytes); poisonLocked sets both, called by
// writeLocked alone: nothing but a failed write poisons.
//
// Who writes what of a session, then (the C slot, fastpath.h ct_slot, and
// the Go Session):
//
//	handle, generation     C's slot_alloc/release, called by registry.go and releaseLocked only
//	state, poison text     Go, here; C reads them
//	measured               C (ct_measurement_begin's CAS); Go once at open for measured_root
//	next_span              one counter: C's per-thread id blocks, Go's nextSpanID (atomic adds)
//	agg, agg_on            Go (at open, SetAggregateEnabled); C reads them
//	clock, tracer fields   C (ct_tracer_*, the session clock); Go reads them
//	everything else        Go: the span tables, the record checks, the product

// usableLocked refuses calls on a gone, poisoned or finishing session.
func (s *Session) usableLocked(fn string) error {
	if !s.liveLocked() {
		return errorf(InvalidHandle, "%s: session %d is unknown or already finished", fn, s.handle)
	}
	if s.poison != nil {
		return s.poisonedErr(fn)
	}
	if slotState(s.slot) == slotFinishing {
		return errorf(State, "%s: session %d is finishing", fn, s.handle)
	}
	return nil
}

// endableLocked refuses fn (an end: ct_finish_failed, ct_discard, ct_reopen)
// only on a session that is gone: a poisoned or finishing one may still end.
func (s *Session) endableLocked(fn string) error {
	if !s.liveLocked() {
		return errorf(InvalidHandle, "%s: session %d is unknown or already finished", fn, s.handle)
	}
	return nil
}

// poisonLocked poisons the session for good with write error err.
func (s *Session) poisonLocked(err error) {
	s.poison = err
	setPoison(s.slot, err.Error())
}

func (s *Session) poisonedErr(fn string) error {
	return errorf(Poisoned, "%s: session %d is poisoned by an earlier write error (%v); only ct_finish_failed works now", fn, s.handle, s.poison)
}

// finishingLocked refuses new fast-path calls while ct_finish decides; a
// poisoned session stays poisoned (its calls keep naming the write error).
// False when a re-arm in C replaced the session since its checks (rearm.go:
// the re-arm won the race, and the session is gone to the caller).
func (s *Session) finishingLocked() bool {
	if s.poison == nil {
		return casSlotState(s.slot, slotOpen, slotFinishing)
	}
	return true
}

// reopenLocked takes back finishingLocked: ct_finish refused after all, and
// the session goes on as it was, other threads' span calls included.
func (s *Session) reopenLocked() {
	if s.poison == nil {
		setSlotState(s.slot, slotOpen)
	}
}

// endingLocked refuses every new call for good: the session is ending
// whatever its state (ct_finish_failed, ct_discard).
func (s *Session) endingLocked() { setSlotState(s.slot, slotFinishing) }

// releaseLocked ends the session: its handle is released (both halves of
// the registry) and its flusher stops.
func (s *Session) releaseLocked() {
	s.released = true
	s.closed.release()
	delete(live, s.handle)
	slotRelease(s.handle)
	close(s.done)
}

func errForked(fn string) error {
	return errorf(State, "%s: this process is a fork() child; sessions belong to the parent and the library cannot run here", fn)
}
