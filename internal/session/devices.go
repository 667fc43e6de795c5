package session

// Device collectors (ct_device_start) belong to the session they write into:
// it holds them, flushes them before its terminal line (their last samples
// and intervals precede it) and stops them once it is gone. A refused
// ct_finish leaves them running with the session.

// Devices are the device collectors running on a session (internal/cuda's
// Collectors). Flush writes what they hold now and keeps them running; Stop
// stops them and writes what is left (refused once the session is gone);
// both may be called more than once.
type Devices interface {
	Flush() error
	Stop() error
}

// StartDevices runs start and keeps the collectors it returns; a session runs
// at most one set at a time (CT_ERR_STATE while one runs, start not called).
func (s *Session) StartDevices(start func() (Devices, error)) error {
	s.devMu.Lock()
	defer s.devMu.Unlock()
	if s.devices != nil {
		return errorf(State, "ct_device_start: device collectors already run on this session; ct_device_stop them first")
	}
	// Reopened the Go way from now on: Reopen flushes and stops collectors.
	s.allowRearm(false, "")
	d, err := start()
	if err != nil {
		return err
	}
	s.devices = d
	return nil
}

// StopDevices stops the session's collectors and writes what they hold;
// without collectors it does nothing.
func (s *Session) StopDevices() error {
	d := s.takeDevices(nil)
	if d == nil {
		return nil
	}
	return d.Stop()
}

// takeDevices forgets the session's collectors and returns them: any when
// want is nil, else only when they are want (not a set started since).
func (s *Session) takeDevices(want Devices) Devices {
	s.devMu.Lock()
	defer s.devMu.Unlock()
	d := s.devices
	if d == nil || (want != nil && d != want) {
		return nil
	}
	s.devices = nil
	return d
}

// ending runs end (the finish, the failed finish, the discard) with the
// collectors flushed first, and stops them when end has released the session.
func (s *Session) ending(end func() error) error {
	s.devMu.Lock()
	d := s.devices
	s.devMu.Unlock()
	if d != nil {
		_ = d.Flush() // a refusal here is the session's, and end reports it
	}
	err := end()
	if d != nil && !s.isLive() {
		if d = s.takeDevices(d); d != nil {
			_ = d.Stop() // what they write now is refused: the session is gone
		}
	}
	return err
}

// Finish closes the root, writes terminal complete and releases the handle,
// the device collectors flushed first and stopped after. It refuses
// (leaving the session open, its collectors running) when the capture is
// not complete.
func (s *Session) Finish() error { return s.ending(s.finish) }

// FinishFailed writes terminal failed with reason and releases the handle,
// also on a poisoned session; the device collectors are flushed first and
// stopped after.
func (s *Session) FinishFailed(reason string) error {
	return s.ending(func() error { return s.finishFailed(reason) })
}

// Discard drops a buffered session's trace (ct_discard) and stops its
// device collectors.
func (s *Session) Discard() error { return s.ending(s.discard) }

// Reopen is ct_reopen (reopen): the collectors of s are flushed and stopped
// with it; the next session starts with none.
func (s *Session) Reopen(path string, step uint64) (*Session, error) {
	var n *Session
	err := s.ending(func() error {
		var err error
		n, err = s.reopen(path, step)
		return err
	})
	return n, err
}
