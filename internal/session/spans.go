package session

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

// maxInterned bounds the span-name table (names are kept for open spans only,
// to name them in errors); programs that make a new name per span stop
// being named in messages rather than growing memory.
const maxInterned = 4096

func (s *Session) intern(b []byte) string {
	if name, ok := s.names[string(b)]; ok {
		return name
	}
	if len(s.names) >= maxInterned {
		return ""
	}
	name := string(b)
	s.names[name] = name
	return name
}
