package session

/*
#include "fastpath.h"
*/
import "C"

import "unsafe"

// openSpan is what the session needs of a span until it closes.
type openSpan struct {
	parent, start uint64
	tid           int64
	name          string // interned; "" when the intern table is full
	// line is the span_start a buffered session's bound dropped (nil: it
	// is in the trace), kept until the span ends in case a span the trace
	// needs opens under it (keepSpanStart).
	line []byte
}

// closedSpan keeps the bounds records are checked against.
type closedSpan struct {
	id, parent, start, dur uint64
	dropped                bool // left out of a buffered session's trace
}

// MaxClosedSpans bounds the closed-span table: records may be attached to any
// of the most recent MaxClosedSpans closed spans. Span ids are sequential, so a
// direct-mapped table keyed by id keeps exactly the newest ones without any
// eviction bookkeeping.
const MaxClosedSpans = 1 << 18

type closedTable struct {
	slots []closedSpan
}

func (t *closedTable) put(s closedSpan) {
	if s.id >= uint64(len(t.slots)) && len(t.slots) < MaxClosedSpans {
		n := len(t.slots) * 2
		if n == 0 {
			n = 1024
		}
		for uint64(n) <= s.id && n < MaxClosedSpans {
			n *= 2
		}
		grown := make([]closedSpan, n)
		for _, old := range t.slots {
			if old.id != 0 {
				grown[old.id&uint64(n-1)] = old
			}
		}
		t.slots = grown
	}
	t.slots[s.id&uint64(len(t.slots)-1)] = s
}

func (t *closedTable) get(id uint64) (closedSpan, bool) {
	if len(t.slots) == 0 {
		return closedSpan{}, false
	}
	s := t.slots[id&uint64(len(t.slots)-1)]
	return s, s.id == id && id != 0
}

// openSpans are a session's open spans. Spans nest per thread and a thread's
// records reach the drainer in order, so each thread's open spans are a
// stack, keyed by its ring: a span_start is a push and its span_end a pop of
// the top, with no map traffic per span (the drainer looks a thread's stack
// up once per session change in its ring). Spans opened in Go (the root,
// the naive benchmark path) live in other.
type openSpans struct {
	threads map[uintptr]*threadSpans
	other   map[uint64]openSpan
	n       int
}

// threadSpans is one thread's open spans in one session, innermost last.
type threadSpans struct {
	ring *C.ct_ring // the thread's ring: records may need it drained (recordSpan)
	open []stackSpan
}

type stackSpan struct {
	id uint64
	openSpan
}

// thread is the stack of the thread owning ring (created empty). A ring
// freed while a session is live held no open spans of it, so a new ring at
// the same address finds an empty stack.
func (t *openSpans) thread(ring *C.ct_ring) *threadSpans {
	key := uintptr(unsafe.Pointer(ring))
	ts := t.threads[key]
	if ts == nil {
		if t.threads == nil {
			t.threads = map[uintptr]*threadSpans{}
		}
		ts = &threadSpans{ring: ring}
		t.threads[key] = ts
	}
	return ts
}

func (t *openSpans) push(ts *threadSpans, id uint64, o openSpan) {
	ts.open = append(ts.open, stackSpan{id, o})
	t.n++
}

// pop ends span id of ts: the top, as the fast path only ends a thread's
// innermost span.
func (t *openSpans) pop(ts *threadSpans, id uint64) (openSpan, bool) {
	n := len(ts.open)
	if n == 0 || ts.open[n-1].id != id {
		return openSpan{}, false
	}
	o := ts.open[n-1].openSpan
	ts.open[n-1] = stackSpan{} // no stale name or line kept alive
	ts.open = ts.open[:n-1]
	t.n--
	return o, true
}

// begin and end are for spans opened in Go.
func (t *openSpans) begin(id uint64, o openSpan) {
	if t.other == nil {
		t.other = map[uint64]openSpan{}
	}
	t.other[id] = o
	t.n++
}

func (t *openSpans) end(id uint64) (openSpan, bool) {
	o, ok := t.other[id]
	if ok {
		delete(t.other, id)
		t.n--
	}
	return o, ok
}

// find is open span id's place, or nil (records and finish: rare next to spans).
func (t *openSpans) find(id uint64) *openSpan {
	_, p := t.locate(id)
	return p
}

// locate is open span id's place and its thread's stack (nil for a span
// opened in Go), or nil.
func (t *openSpans) locate(id uint64) (*threadSpans, *openSpan) {
	if o, ok := t.other[id]; ok {
		return nil, &o
	}
	for _, ts := range t.threads {
		for i := len(ts.open) - 1; i >= 0; i-- {
			if ts.open[i].id == id {
				return ts, &ts.open[i].openSpan
			}
		}
	}
	return nil, nil
}

func (t *openSpans) get(id uint64) (openSpan, bool) {
	if p := t.find(id); p != nil {
		return *p, true
	}
	return openSpan{}, false
}

// setLine replaces the dropped start line kept for open span id (nil: it is
// in the trace now).
func (t *openSpans) setLine(id uint64, line []byte) {
	if o, ok := t.other[id]; ok {
		o.line = line
		t.other[id] = o
	} else if p := t.find(id); p != nil {
		p.line = line
	}
}

// count is how many spans are open, the root included.
func (t *openSpans) count() int { return t.n }

// each calls f on every open span, in no particular order.
func (t *openSpans) each(f func(id uint64, o openSpan)) {
	for id, o := range t.other {
		f(id, o)
	}
	for _, ts := range t.threads {
		for _, sp := range ts.open {
			f(sp.id, sp.openSpan)
		}
	}
}

// maxInterned bounds the span-name table (names are kept for open spans only,
// to name them in errors); programs that make a new name per span stop
// being named in messages rather than growing memory.
const maxInterned = 4096

func (s *Session) intern(b []byte) string {
	// Most spans repeat the name before them: no map lookup for those.
	if string(b) == s.lastName {
		return s.lastName
	}
	if name, ok := s.names[string(b)]; ok {
		s.lastName = name
		return name
	}
	if len(s.names) >= maxInterned {
		return ""
	}
	name := string(b)
	s.names[name] = name
	s.lastName = name
	return name
}
