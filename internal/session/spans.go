package session

/*
#include "fastpath.h"
*/
import "C"

import (
	"syscall"
	"unsafe"

	"github.com/candle-trace/candle-trace/internal/events"
)

// openSpan is what the session needs of a span until it closes.
type openSpan struct {
	parent, start uint64
	tid           int64
	name          string // interned; "" when the intern table is full
	// line is the span_start a buffered session's bound dropped (nil: it
	// is in the trace), kept until the span ends in case a span the trace
	// needs opens under it (keepSpanStart).
	line []byte
	// ref is the id as spelled in the span_start, for its span_end and its
	// children's parent_id; zero for spans opened in Go.
	ref events.SpanRef
}

// closedSpan keeps the bounds records are checked against.
type closedSpan struct {
	id, parent, start, dur uint64
	dropped                bool // left out of a buffered session's trace
}

// closedSlot is a closedSpan as the table keeps it: 32 bytes, not 40, its
// dropped flag in the parent's top bit (span ids count up from 1, so a
// parent never reaches it). The table is written once per span ended and
// read by the rare record on a closed span: at full size it is 8 MiB a
// session, not 10.
type closedSlot struct {
	id, parentDropped, start, dur uint64
}

const slotDropped = uint64(1) << 63

func packClosed(s closedSpan) closedSlot {
	c := closedSlot{id: s.id, parentDropped: s.parent, start: s.start, dur: s.dur}
	if s.dropped {
		c.parentDropped |= slotDropped
	}
	return c
}

func (c closedSlot) span() closedSpan {
	return closedSpan{id: c.id, parent: c.parentDropped &^ slotDropped, start: c.start, dur: c.dur,
		dropped: c.parentDropped&slotDropped != 0}
}

// MaxClosedSpans bounds the closed-span table: records may be attached to any
// of the most recent MaxClosedSpans closed spans. Span ids are sequential, so a
// direct-mapped table keyed by id keeps exactly the newest ones without any
// eviction bookkeeping.
const MaxClosedSpans = 1 << 18

type closedTable struct {
	slots []closedSlot
	// fresh is where the array's never-written slots begin: they are zero
	// already, and in a mapping of ours not yet in memory.
	fresh int
}

// spareClosed is the slots of a finished session's table, kept (with its
// pages) for the next session: a session opened and finished again and
// again (a flight recorder's) grows its table into memory already mapped
// instead of faulting in up to 8 MiB each time; spareFresh is its fresh.
// Guarded by mu.
var (
	spareClosed []closedSlot
	spareFresh  int
)

func (t *closedTable) put(s closedSpan) {
	if s.id >= uint64(len(t.slots)) && len(t.slots) < MaxClosedSpans {
		t.grow(s.id)
	}
	t.slots[s.id&uint64(len(t.slots)-1)] = packClosed(s)
}

// grow doubles the table until id has a slot of its own or the table is
// full size. It grows in place, inside one array of the full size whose
// pages are touched only as the table reaches them: an entry at slot i of a
// table of n either stays or moves to slot i+n.
func (t *closedTable) grow(id uint64) {
	if cap(t.slots) < MaxClosedSpans {
		if cap(spareClosed) == MaxClosedSpans {
			t.slots, t.fresh, spareClosed = spareClosed[:0], spareFresh, nil
		} else {
			t.slots, t.fresh = mapClosed(), 0
		}
	}
	for uint64(len(t.slots)) <= id && len(t.slots) < MaxClosedSpans {
		n := len(t.slots)
		if n == 0 {
			t.extend(1024)
			continue
		}
		t.extend(2 * n)
		mask := uint64(2*n - 1)
		for i := 0; i < n; i++ {
			if e := t.slots[i]; e.id != 0 && e.id&mask != uint64(i) {
				t.slots[i+n] = e
				t.slots[i] = closedSlot{}
			}
		}
	}
}

// extend lengthens the table to n slots, all empty: slots written before
// are cleared, fresh ones are zero already. A mapping's fresh pages are
// faulted in with one madvise (MADV_POPULATE_WRITE, Linux 5.14; before it
// they fault in as they are written): a burst of spans grows the table by
// megabytes, and a page the clear faulted in one at a time cost ~2.2 us on
// the VMs we measured against ~1.45 us populated.
func (t *closedTable) extend(n int) {
	from := len(t.slots)
	t.slots = t.slots[:n]
	if from < t.fresh {
		clear(t.slots[from:min(n, t.fresh)])
	}
	if n > t.fresh {
		if _, mapped := closedMaps[&t.slots[0]]; mapped {
			lo := max(from, t.fresh)
			b := unsafe.Slice((*byte)(unsafe.Pointer(&t.slots[lo])), (n-lo)*int(unsafe.Sizeof(closedSlot{})))
			_ = syscall.Madvise(b, madvPopulateWrite)
		}
		t.fresh = n
	}
}

// madvPopulateWrite is MADV_POPULATE_WRITE, which package syscall lacks.
const madvPopulateWrite = 23

// release gives the table's memory to the next session, or back to the
// kernel when one is kept already; mu is held.
func (t *closedTable) release() {
	if cap(t.slots) == MaxClosedSpans {
		if spareClosed == nil {
			spareClosed, spareFresh = t.slots[:0], t.fresh
		} else {
			unmapClosed(t.slots)
		}
	}
	t.slots = nil
}

// closedMaps are the mappings mapClosed made, by their first slot.
var closedMaps = map[*closedSlot][]byte{}

// mapClosed is the memory of a full-size table: a mapping of its own, in
// small pages whatever the system's transparent huge page setting
// (MADV_NOHUGEPAGE), faulted in only as span ids reach it; Go memory where
// it cannot. A 4 KiB fault costs ~2 us on the VMs we measured; a huge page
// ~0.35 us per 4 KiB of it most of the time, but 11-65 us at times (a host
// backing the guest's memory lazily): milliseconds for one page, on the
// drainer or on a record call's thread, the program's. mu is held.
func mapClosed() []closedSlot {
	n := MaxClosedSpans * int(unsafe.Sizeof(closedSlot{}))
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return make([]closedSlot, 0, MaxClosedSpans)
	}
	_ = syscall.Madvise(b, syscall.MADV_NOHUGEPAGE)
	s := unsafe.Slice((*closedSlot)(unsafe.Pointer(&b[0])), MaxClosedSpans)
	closedMaps[&s[0]] = b
	return s[:0]
}

// unmapClosed gives a table mapClosed made back to the kernel (one in Go
// memory goes with the garbage). mu is held.
func unmapClosed(s []closedSlot) {
	first := &s[:1][0]
	if b, ok := closedMaps[first]; ok {
		delete(closedMaps, first)
		_ = syscall.Munmap(b)
	}
}

func (t *closedTable) get(id uint64) (closedSpan, bool) {
	if len(t.slots) == 0 {
		return closedSpan{}, false
	}
	s := t.slots[id&uint64(len(t.slots)-1)]
	if s.id != id || id == 0 {
		return closedSpan{}, false
	}
	return s.span(), true
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
	tail events.StartTail // the end of this thread's span_start lines
	// The id this thread began a span with last, spelled: its ids come in
	// runs (blocks of CT_ID_BLOCK), so the next is mostly a digit's step.
	lastID  uint64
	lastRef events.SpanRef
}

// spell spells id, a span this thread begins, into dst. The two refs are
// stepped on each on their own rather than one copied from the other just
// after it changed (a wide load of bytes just stored stalls the core).
func (ts *threadSpans) spell(id uint64, dst *events.SpanRef) {
	if id == ts.lastID+1 {
		*dst = ts.lastRef
		if dst.Next() {
			ts.lastRef.Next()
			ts.lastID = id
			return
		}
	}
	dst.Spell(id)
	ts.lastRef.Spell(id)
	ts.lastID = id
}

// innermost is the thread's innermost open span; nil when it has none.
func (ts *threadSpans) innermost() *stackSpan {
	if n := len(ts.open); n > 0 {
		return &ts.open[n-1]
	}
	return nil
}

// parentRef spells parent, the span under the one just pushed (the
// innermost before it) or the root; valid until the next push.
func (ts *threadSpans) parentRef(parent uint64) *events.SpanRef {
	if n := len(ts.open); n >= 2 {
		if p := &ts.open[n-2]; p.id == parent && !p.ref.IsZero() {
			return &p.ref
		}
	}
	if parent == 1 {
		return &events.RootRef
	}
	r := events.RefOf(parent)
	return &r
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

// pushed opens span id on ts and returns its entry to be filled in place
// (valid until ts's stack changes again): no openSpan is built and copied
// per span.
func (t *openSpans) pushed(ts *threadSpans, id uint64) *stackSpan {
	n := len(ts.open)
	if n == cap(ts.open) {
		ts.open = append(ts.open, stackSpan{})
	}
	// Entries past the top are zero: fresh from append, or cleared by pop.
	ts.open = ts.open[:n+1]
	sp := &ts.open[n]
	sp.id = id
	t.n++
	return sp
}

// pop ends ts's innermost span, the only one the fast path ends.
func (t *openSpans) pop(ts *threadSpans) {
	n := len(ts.open)
	ts.open[n-1] = stackSpan{} // no stale name or line kept alive
	ts.open = ts.open[:n-1]
	t.n--
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
