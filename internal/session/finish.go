package session

import (
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/candle-trace/candle-trace/internal/events"
)

// How a session writes what it holds and ends: the background flusher,
// ct_flush, ct_finish and ct_finish_failed (devices.go wraps the ends with
// the device collectors' flush). The Session checks and moves the state
// (state.go); the product writes.

// flushLoop is the background flusher: every flushInterval it drains the
// rings and lets the product write, so nothing older than that is only in
// memory.
func (s *Session) flushLoop() {
	t := time.NewTicker(s.opts.flushInterval)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
			mu.Lock()
			drainerWrites = true
			if s.liveLocked() {
				drainLocked()
				s.product.tickLocked()
			}
			drainerWrites = false
			mu.Unlock()
		}
	}
}

// Flush writes everything recorded so far (CT_ERR_IO when it fails).
func (s *Session) Flush() error {
	mu.Lock()
	defer mu.Unlock()
	if err := s.usableLocked("ct_flush"); err != nil {
		return err
	}
	drainLocked()
	if err := s.product.flushLocked(); err != nil {
		return errorf(IO, "ct_flush: write %s: %v", s.path, err)
	}
	return nil
}

// finish is Finish (devices.go) once the device collectors are flushed.
func (s *Session) finish() error {
	mu.Lock()
	defer mu.Unlock()
	if err := s.usableLocked("ct_finish"); err != nil {
		return err
	}
	// Check before refusing anyone: a refused ct_finish must leave the
	// session as it was, other threads' span calls included.
	drainLocked()
	if err := s.usableLocked("ct_finish"); err != nil {
		return err // re-armed in C on another thread meanwhile, and taken over by that drain
	}
	if err := s.finishCheckLocked(); err != nil {
		return err
	}
	// New fast-path calls are refused from here on; what reached the rings
	// since the check is drained and checked again (a span begun in between
	// still refuses the finish, and the session opens again).
	if !s.finishingLocked() {
		return errorf(InvalidHandle, "ct_finish: session %d is unknown or already finished", s.handle)
	}
	drainLocked()
	if err := s.finishCheckLocked(); err != nil {
		s.reopenLocked()
		return err
	}
	return s.product.finishLocked()
}

// finishCheckLocked refuses ct_finish while spans are open in the Go
// tables, then asks the product.
func (s *Session) finishCheckLocked() error {
	if s.open.count() > 1 {
		var list []string
		s.open.each(func(id uint64, o openSpan) {
			if id != 1 {
				list = append(list, fmt.Sprintf("s%d %q (thread %d)", id, o.name, o.tid))
			}
		})
		sort.Strings(list)
		more := ""
		if len(list) > 5 {
			more = fmt.Sprintf(" and %d more", len(list)-5)
			list = list[:5]
		}
		return openSpansErr(s.open.count()-1, list, more)
	}
	return s.product.finishCheckLocked()
}

// openSpansErr refuses ct_finish: n spans open, described by list (+ more).
func openSpansErr(n int, list []string, more string) error {
	return errorf(State, "ct_finish: %d spans still open: %s%s; end them or call ct_finish_failed", n, strings.Join(list, ", "), more)
}

// finishFailed is FinishFailed (devices.go) once the device collectors are
// flushed.
func (s *Session) finishFailed(reason string) error {
	if strings.TrimSpace(reason) == "" {
		return errorf(InvalidArgument, "ct_finish_failed: reason is empty")
	}
	if len(reason) > events.MaxStringBytes {
		return errorf(InvalidArgument, "ct_finish_failed: reason is longer than 1 MiB (%d bytes)", len(reason))
	}
	if !utf8.ValidString(reason) {
		return errorf(InvalidArgument, "ct_finish_failed: reason is not valid UTF-8")
	}
	mu.Lock()
	defer mu.Unlock()
	if err := s.endableLocked("ct_finish_failed"); err != nil {
		return err
	}
	s.endingLocked()
	return s.product.finishFailedLocked(reason)
}
