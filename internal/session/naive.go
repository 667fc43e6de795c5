package session

import (
	"github.com/candle-trace/candle-trace/internal/events"
)

// NaiveBeginSpan and NaiveEndSpan are the straightforward design — every
// event crosses into Go, takes the lock and is handed to the product on the
// spot — kept only so `make bench` can show what the C fast path saves.
// Spans nest per session here, not per thread; do not use them for tracing.
func (s *Session) NaiveBeginSpan(name string, kind events.SpanKind, step events.Step) (uint64, error) {
	mu.Lock()
	defer mu.Unlock()
	defer naiveWrites()()
	if err := s.usableLocked("naive_span_begin"); err != nil {
		return 0, err
	}
	id := nextSpanID(s.slot)
	parent := uint64(1)
	if n := len(s.naiveStack); n > 0 {
		parent = s.naiveStack[n-1]
	}
	s.naiveStack = append(s.naiveStack, id)
	start := s.Now()
	s.product.naiveBeginLocked(id, parent, name, kind, step, start)
	s.open.begin(id, openSpan{parent: parent, start: start})
	s.maybeWrite()
	return id, nil
}

func (s *Session) NaiveEndSpan(id uint64) error {
	mu.Lock()
	defer mu.Unlock()
	defer naiveWrites()()
	if err := s.usableLocked("naive_span_end"); err != nil {
		return err
	}
	n := len(s.naiveStack)
	if n == 0 || s.naiveStack[n-1] != id {
		return errorf(SpanMismatch, "naive_span_end: s%d is not the innermost span", id)
	}
	s.naiveStack = s.naiveStack[:n-1]
	o, _ := s.open.end(id)
	s.product.naiveEndLocked(o, id, s.Now()-o.start)
	return nil
}

// naiveWrites lets the naive design write on the calling thread, as it
// always did (the fast path's callers never do: maybeWrite); it returns the
// undo. mu is held.
func naiveWrites() func() {
	drainerWrites = true
	return func() { drainerWrites = false }
}
