// Package session turns C ABI calls into a candle-graph/trace/10 JSONL file
// (a trace session) or a candle-trace/aggregate/1 summary of a whole run (an
// aggregate session).
//
// The span hot path lives in C (fastpath.c): a per-OS-thread span stack and a
// per-thread ring. This package drains the rings, checks every other record
// against the trace format's rules as it arrives, and hands what it checked
// to the session's product: a trace encodes JSON with the appenders of
// internal/events and writes whole lines from the drainer and a background
// flusher (a killed process leaves its events older than a flush on disk; a
// SIGKILL inside a write may cut its last line at a page boundary, and our
// readers drop that line); a summary folds spans and scalars into
// internal/aggregate.
//
// Who owns what: registry.go the handles, state.go a session's lifecycle,
// product.go the line between what both kinds of session share (Session)
// and what each makes (trace.go, buffered.go; aggregate.go).
package session

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/candle-trace/candle-trace/internal/events"
)

// Session is what a session handle names (ct_session): the part every
// session has — the handle and its C slot, the session clock, the lifecycle
// (state.go), the device collectors (devices.go), the record checks
// (records.go) and the span bounds they are checked against — and its
// product, a trace or a summary (product.go). All methods are safe for
// concurrent use.
type Session struct {
	handle uint64
	slot   *cSlot
	path   string
	run    *events.Run
	opts   options

	// product is the trace or the summary. Exactly one of the two fields
	// after it is the same object, the other nil: they are the drainer's
	// view, whose span code (drain.go, onSpanStart and the functions after
	// it) reads a trace's state as s.<field> and folds aggregate records
	// into aggr.agg. Nothing else reaches a trace through the embedding.
	product product
	*traceSession
	aggr *aggregateSession

	devMu   sync.Mutex
	devices Devices // the device collectors (devices.go); guarded by devMu

	// Everything below is guarded by mu.
	poison       error  // the write error that poisoned the session (state.go)
	buf          []byte // record lines the trace has not written yet; a summary's stays empty
	writeAsked   bool   // the drainer was woken to write buf (maybeWrite)
	open         openSpans
	closed       closedTable
	expected     map[gradKey]bool // gradient contract keys -> recorded yet
	nextGradient uint64
	memory       lifetimes
	tensors      map[string]struct{}
	naiveStack   []uint64 // NaiveBeginSpan only
	done         chan struct{}
	// released: the handle is gone (releaseLocked); a drain that still
	// holds s (a re-arm settled in its middle, rearm.go) drops its records.
	released bool
}

type gradKey struct{ root, key string }

// Open validates the run provenance (see events.ParseRun) and opens a trace
// session (the default: its file created by the opener's rules, which never
// follow a final symbolic link nor truncate a file that is not empty or
// candle-trace's own, and its meta line and root span s1 written; a buffered
// one creates nothing yet, buffered.go) or an aggregate session ("mode":
// "aggregate": its summary written once).
func Open(path string, runJSON []byte, opts ...Option) (*Session, error) {
	if Forked() {
		return nil, errForked("ct_open")
	}
	if strings.TrimSpace(path) == "" {
		return nil, errorf(InvalidArgument, "ct_open: path is empty")
	}
	run, err := events.ParseRun(runJSON)
	if err != nil {
		return nil, errorf(InvalidArgument, "ct_open: %v", err)
	}
	return openRun(path, run, newOptions(opts), nil, kept{}, nil)
}

// expectedKeys is the gradient contract's keys of run, none recorded yet
// (nil: no contract): reuse's, reset, where the session before in a flight
// recorder's run had them.
func expectedKeys(run *events.Run, reuse map[gradKey]bool) map[gradKey]bool {
	if reuse != nil {
		for k := range reuse {
			reuse[k] = false
		}
		return reuse
	}
	exp := run.ExpectedGradients()
	if len(exp) == 0 {
		return nil
	}
	keys := make(map[gradKey]bool, len(exp))
	for _, e := range exp {
		keys[gradKey{e.Root, e.Key}] = false
	}
	return keys
}

// openRun is Open once the run JSON is parsed (Reopen skips the parse, most
// of what opening a flight recorder's session costs); a reopened trace
// takes prev, what the run's session before found out, and reuse, the
// memory that session kept its trace, encoding and contract keys in. at is
// a session re-armed in C (rearm.go), which has its handle and clock already
// and is opened with mu held; nil for every other.
func openRun(path string, run *events.Run, o options, prev *sameRun, reuse kept, at *rearmedAt) (*Session, error) {
	if dir := filepath.Dir(path); run.Buffer == nil && dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, errorf(IO, "ct_open: create folder for %s: %v", path, err)
		}
	}
	var h uint64
	var tid int64
	if at != nil {
		h, tid = at.handle, at.tid
	} else {
		var err error
		if h, err = reserveHandle(); err != nil {
			return nil, err
		}
		tid = threadID()
	}
	s := &Session{
		handle: h, slot: slotOf(h), path: path, run: run, opts: o,
		memory:  newLifetimes(),
		tensors: map[string]struct{}{},
		done:    make(chan struct{}),
		buf:     reuse.enc,
	}
	s.expected = expectedKeys(run, reuse.expected)
	if run.MeasuredRoot {
		setSlotMeasured(s.slot)
	}
	s.open.begin(1, openSpan{start: 0, tid: tid, name: run.Entrypoint})
	var err error
	if run.Mode == "aggregate" {
		err = openAggregate(s)
	} else {
		err = openTrace(s, prev, reuse.data, at)
	}
	if err != nil {
		slotRelease(h)
		return nil, err
	}
	if at != nil {
		live[s.handle] = s
	} else {
		s.register()
	}
	if t := s.buffered(); t != nil {
		s.allowRearm(true, t.sameRun.folder)
	}
	startWaker()
	if s.product.flushesInBackground() {
		go s.flushLoop()
	}
	return s, nil
}

// Handle is the integer the C ABI hands out for this session.
func (s *Session) Handle() uint64 { return s.handle }

// Path is the trace file.
func (s *Session) Path() string { return s.path }

// Now is the session clock in nanoseconds since Open.
// It stands still while the tracer's own work runs (TracerBegin).
func (s *Session) Now() uint64 { return slotNow(s.slot) }

// TracerNs is the tracer's own time so far, left out of the session clock.
func (s *Session) TracerNs() uint64 { return slotTracerNs(s.slot) }

// TracerBegin and TracerEnd bracket the tracer's own work (ct_tracer_begin
// and ct_tracer_end): the session clock stands still in between.
func (s *Session) TracerBegin() error { return tracerBeginC(s.handle) }

// TracerBeginEarlier opens an interval that began up to earlierNs before the
// call (ct_tracer_begin_earlier): never before a clock value already read.
func (s *Session) TracerBeginEarlier(earlierNs uint64) error {
	return tracerBeginEarlierC(s.handle, earlierNs)
}

// TracerEstimatedNs is the part of TracerNs that backdated intervals added.
func (s *Session) TracerEstimatedNs() uint64 { return slotTracerEstimated(s.slot) }

func (s *Session) tracerTime(ns uint64) events.TracerTime {
	return events.TracerTime{Ns: ns, EstimatedNs: s.TracerEstimatedNs()}
}

// TracerEnd closes an interval of TracerBegin.
func (s *Session) TracerEnd() error { return tracerEndC(s.handle) }

// BeginSpan opens a span on the calling OS thread through the C fast path.
// Go callers must keep the goroutine on one thread (runtime.LockOSThread)
// for as long as they hold spans, since spans nest per OS thread.
func (s *Session) BeginSpan(name string, kind events.SpanKind, step events.Step) (uint64, error) {
	return beginSpanC(s.handle, name, uint32(kind), uint32(step), false)
}

// BeginMeasurement opens the single measured region on the calling thread.
func (s *Session) BeginMeasurement(name string) (uint64, error) {
	return beginSpanC(s.handle, name, uint32(events.SpanFunction), uint32(events.StepNone), true)
}

// EndSpan closes the calling thread's innermost span.
func (s *Session) EndSpan(id uint64) error { return endSpanC(s.handle, id) }

// onSpanStart and onSpanEnd apply a drained ring record of the thread whose
// open spans are ts; mu is held. nameJSON is name as a JSON string when the
// ring's name cache holds it (nil: spelled here).
func (s *Session) onSpanStart(ts *threadSpans, id, parent uint64, name, nameJSON []byte, start uint64, kind, step uint32, measured bool, tid int64) {
	o := &s.open.pushed(ts, id).openSpan
	o.parent, o.start, o.tid, o.name = parent, start, tid, s.intern(name)
	ts.spell(id, &o.ref)
	mark := len(s.buf)
	if nameJSON != nil {
		tail := ts.tail.For(events.SpanKind(kind), measured, events.Step(step), tid)
		s.buf = events.AppendSpanStartRef(s.buf, &o.ref, ts.parentRef(parent), nameJSON, start, tail)
	} else {
		str := o.name // interned: no string made per span
		if str == "" {
			str = string(name)
		}
		s.buf = events.AppendSpanStart(s.buf, id, parent, str, start, events.SpanKind(kind), measured, events.Step(step), tid)
	}
	if s.required != nil {
		if _, ok := s.required[string(name)]; ok {
			s.required[string(name)]++
		}
	}
	s.keepSpanStart(o, mark, name, measured)
	s.maybeWrite()
}

func (s *Session) onSpanEnd(ts *threadSpans, id, dur uint64, measured bool, tracer uint64) {
	top := ts.innermost()
	if top == nil || top.id != id {
		return
	}
	s.spanEndedAt(&top.openSpan, id, dur, measured, tracer)
	s.open.pop(ts)
}

// spanEnded writes the end of open span o (id) after dur ns; mu is held.
func (s *Session) spanEnded(o openSpan, id, dur uint64, measured bool, tracer uint64) {
	s.spanEndedAt(&o, id, dur, measured, tracer)
}

// spanEndedAt is spanEnded of the span at o, which stays where it is (the
// drainer's spans end in place on their thread's stack).
func (s *Session) spanEndedAt(o *openSpan, id, dur uint64, measured bool, tracer uint64) {
	s.closed.put(closedSpan{id: id, parent: o.parent, start: o.start, dur: dur, dropped: o.line != nil})
	mark := len(s.buf)
	switch {
	case measured:
		s.buf = events.AppendMeasuredSpanEnd(s.buf, id, dur, tracer)
	case !o.ref.IsZero():
		s.buf = events.AppendSpanEndRef(s.buf, &o.ref, dur)
	default:
		s.buf = events.AppendSpanEnd(s.buf, id, dur)
	}
	var froms []uint64
	if len(s.pendingEdges) > 0 {
		froms = s.pendingEdges[id]
	}
	if froms != nil {
		for _, from := range froms {
			m := len(s.buf)
			s.buf = events.AppendCallEdge(s.buf, from, id, dur)
			if o.line == nil {
				s.keepLine(lineStructure, m)
			}
		}
		delete(s.pendingEdges, id)
	}
	if o.line != nil {
		s.dropEndedLocked(o.line, mark, 1+len(froms))
	}
	s.maybeWrite()
}

func (s *Session) countLabel(name string) {
	if s.required != nil {
		if _, ok := s.required[name]; ok {
			s.required[name]++
		}
	}
}

// maybeWrite writes once enough output is buffered; mu is held. Only the
// drainer and the flushers write here (drainerWrites); on an application
// thread (a record call, a drain of its own ring, ct_finish's) the drainer
// is woken to write instead, unless the buffer has grown to maxBufferedChunks
// chunks: a ring that absorbed a burst holds megabytes of records, which
// the thread draining them (the drainer waiting for it) must not turn into
// a buffer of ten times that.
func (s *Session) maybeWrite() {
	if len(s.buf) < s.opts.writeChunk {
		return
	}
	if drainerWrites || len(s.buf) >= maxBufferedChunks*s.opts.writeChunk {
		s.writeLocked()
	} else if !s.writeAsked {
		s.writeAsked = true
		wakeDrainer()
	}
}

// drainerWrites is true while the drainer or a flusher holds mu.
var drainerWrites bool

// maxBufferedChunks bounds what maybeWrite leaves to the drainer.
const maxBufferedChunks = 2

// writeLocked writes the buffer; a failure poisons the session for good.
func (s *Session) writeLocked() error {
	if s.poison != nil {
		s.buf = s.buf[:0]
		return s.poison
	}
	if err := s.writeOut(); err != nil {
		s.poisonLocked(err)
		return err
	}
	return nil
}

func (s *Session) writeOut() error {
	if len(s.buf) == 0 {
		return nil
	}
	n, err := s.sink.Write(s.buf)
	if err == nil && n != len(s.buf) {
		err = errors.New("short write")
	}
	s.buf = s.buf[:0]
	s.writeAsked = false
	if cap(s.buf) > 4*s.opts.writeChunk {
		s.buf = make([]byte, 0, s.opts.writeChunk)
	}
	return err
}
