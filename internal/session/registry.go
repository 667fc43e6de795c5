package session

// The handle registry. A handle names one C slot (fastpath.c: generation << 8
// | index + 1), which the span fast path finds in O(1) without a lock, and,
// for the rest of the library, the *Session that live (drain.go) holds under
// the same handle. A handle is reserved here before its session is built,
// registered once the session can take calls, and released by state.go's
// releaseLocked; nothing else changes either half, so the two cannot
// disagree about which handles exist.

// reserveHandle takes a free slot: a full registry is refused before
// anything is created or written.
func reserveHandle() (uint64, error) {
	h := slotAlloc()
	if h == 0 {
		return 0, errorf(State, "ct_open: too many sessions open at once")
	}
	return h, nil
}

// register makes s reachable by its handle: the last step of opening it.
func (s *Session) register() {
	mu.Lock()
	live[s.handle] = s
	mu.Unlock()
}

// Lookup finds an open session by handle.
func Lookup(h uint64) (*Session, error) {
	if Forked() {
		return nil, errForked("ct_*")
	}
	mu.Lock()
	s := live[h]
	if s == nil || s.rearmed() {
		settleLocked(h) // re-armed in C since Go last looked (rearm.go)
		s = live[h]
	}
	mu.Unlock()
	if s == nil {
		if h == 0 {
			return nil, errorf(InvalidHandle, "session handle is 0 (never valid)")
		}
		return nil, errorf(InvalidHandle, "session %d is unknown or already finished", h)
	}
	return s, nil
}

// liveLocked reports whether s still holds its handle, not replaced by a
// re-arm in C; mu is held.
func (s *Session) liveLocked() bool { return live[s.handle] == s && !s.rearmed() }

// isLive is liveLocked taking mu.
func (s *Session) isLive() bool {
	mu.Lock()
	defer mu.Unlock()
	return s.liveLocked()
}
