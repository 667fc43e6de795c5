// Package session turns C ABI calls into a candle-graph/trace/10 JSONL file.
//
// The span hot path lives in C (fastpath.c): a per-OS-thread span stack and a
// per-thread ring. This package drains the rings, checks every other record
// against the trace format's rules as it arrives, encodes JSON with the
// appenders of internal/events, and writes whole lines from the drainer and
// a background flusher: a killed process leaves its events older than a
// flush on disk (a SIGKILL inside a write may cut its last line at a page
// boundary; our readers drop that line).
package session

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/events"
)

// Session is one trace being written. All methods are safe for concurrent use.
type Session struct {
	handle uint64
	slot   *cSlot
	path   string
	// measuredRoot: the root span is the measured region (its span_end
	// states the tracer's time).
	measuredRoot bool
	run          *events.Run
	opts         options
	sink         Sink
	bound        *bufferSink // the sink of a buffered session; nil otherwise

	aggr *aggState // aggregate sessions only

	devMu   sync.Mutex
	devices Devices // the device collectors (devices.go); guarded by devMu

	// Everything below is guarded by mu.
	buf          []byte
	poison       error
	open         openSpans
	closed       closedTable
	names        map[string]string
	lastName     string              // the name intern returned last
	writeAsked   bool                // the drainer was woken to write buf (maybeWrite)
	pendingEdges map[uint64][]uint64 // to -> from, written when `to` closes
	required     map[string]int      // required semantic label -> spans seen
	expected     map[gradKey]bool    // gradient contract keys -> recorded yet
	nextGradient uint64
	memory       lifetimes
	tensors      map[string]struct{}
	naiveStack   []uint64        // NaiveBeginSpan only
	naiveKeys    []aggregate.Key // NaiveBeginSpan in aggregate sessions
	done         chan struct{}
	stopped      chan struct{}
}

type gradKey struct{ root, key string }

// Open validates the run provenance (see events.ParseRun), creates the trace
// file (the opener's rules: DefaultOpener never follows a final symbolic
// link nor truncates a file that is not empty or candle-trace's own) and
// writes its meta line and root span s1. A buffered session (run.Buffer)
// creates nothing: it checks the path and keeps the trace in memory
// (buffered.go).
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
	return openRun(path, run, newOptions(opts), nil)
}

// openRun is Open once the run JSON is parsed (Reopen skips the parse, most
// of what opening a flight recorder's session costs); a buffered session
// keeps its trace in reuse's memory when given.
func openRun(path string, run *events.Run, o options, reuse []byte) (*Session, error) {
	var err error
	if run.Buffer != nil {
		if err := checkBuffered(path); err != nil {
			return nil, err
		}
	} else if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, errorf(IO, "ct_open: create folder for %s: %v", path, err)
		}
	}
	// The slot first: a full registry is refused before anything is written.
	h := slotAlloc()
	if h == 0 {
		return nil, errorf(State, "ct_open: too many sessions open at once")
	}
	var sink Sink
	var aggr *aggState
	if run.Mode == "aggregate" {
		p := o.producer
		if run.Binding != "" {
			p.Binding = run.Binding
		}
		if aggr, err = openAggregate(path, run, p); err != nil {
			slotRelease(h)
			return nil, errorf(IO, "ct_open: aggregate summary %s: %v", path, err)
		}
		sink = discardSink{}
	} else if run.Buffer != nil {
		sink = newBufferSink(path, run.Buffer, o.opener, reuse)
	} else if sink, err = o.opener(path); err != nil {
		slotRelease(h)
		return nil, errorf(IO, "ct_open: create %s: %v", path, err)
	}
	s := &Session{
		handle: h, slot: slotOf(h), path: path, run: run, opts: o, sink: sink, aggr: aggr,
		names:   map[string]string{},
		memory:  newLifetimes(),
		bound:   asBufferSink(sink),
		tensors: map[string]struct{}{},
		done:    make(chan struct{}),
		stopped: make(chan struct{}),
	}
	if labels := run.RequiredLabels(); len(labels) > 0 {
		s.required = make(map[string]int, len(labels))
		for _, l := range labels {
			s.required[l] = 0
		}
	}
	if exp := run.ExpectedGradients(); len(exp) > 0 {
		s.expected = make(map[gradKey]bool, len(exp))
		for _, e := range exp {
			s.expected[gradKey{e.Root, e.Key}] = false
		}
	}
	if run.MeasuredRoot {
		setSlotMeasured(s.slot)
		s.measuredRoot = true
	}
	if aggr != nil {
		setSlotAggregate(s.slot, aggr.agg.Enabled())
	}
	if aggr == nil {
		s.buf = run.AppendMeta(s.buf, s.metaExtras())
	}
	s.buf = events.AppendSpanStart(s.buf, 1, 0, run.Entrypoint, 0, events.SpanFunction, run.MeasuredRoot, events.StepNone, threadID())
	s.open.begin(1, openSpan{start: 0, tid: threadID(), name: run.Entrypoint})
	s.countLabel(run.Entrypoint)
	if err := s.writeOut(); err != nil {
		slotRelease(h)
		discard(sink)
		return nil, errorf(IO, "ct_open: write %s: %v", path, err)
	}
	mu.Lock()
	live[h] = s
	mu.Unlock()
	startWaker()
	if asBufferSink(sink) == nil {
		// A buffered session writes nothing until it ends: no flusher to run
		// (the waker still drains a ring that fills), which is most of what
		// a flight recorder's session costs per update to open and drop.
		go s.flushLoop()
	}
	return s, nil
}

// asBufferSink is sink when it is a buffered session's, else nil.
func asBufferSink(sink Sink) *bufferSink {
	b, _ := sink.(*bufferSink)
	return b
}

// discardSink stands in for the trace file of an aggregate session, whose
// output is the summary the aggregate writer rewrites.
type discardSink struct{}

func (discardSink) Write(b []byte) (int, error) { return len(b), nil }
func (discardSink) Close() error                { return nil }

// discard closes the sink of a trace that could not be started. A file the
// opener created goes too (outfile.File.Discard), so nothing claims to be a
// trace; what was there before, a device or a FIFO is left alone.
func discard(sink Sink) {
	if f, ok := sink.(interface{ Discard() }); ok {
		f.Discard()
		return
	}
	sink.Close()
}

func (s *Session) metaExtras() events.MetaExtras {
	host, _ := os.Hostname()
	now := time.Now()
	x := events.MetaExtras{
		RunID:            fmt.Sprintf("run-%d-%d", os.Getpid(), now.UnixNano()),
		Timestamp:        events.FormatTimestamp(now),
		ProducerName:     s.opts.producer.Name,
		ProducerVersion:  s.opts.producer.Version,
		ProducerBinding:  s.opts.producer.Binding,
		WallUnixNsAtOpen: uint64(now.UnixNano()),
		PID:              os.Getpid(),
		Hostname:         host,
		Rank:             envInt("RANK"),
		WorldSize:        envInt("WORLD_SIZE"),
	}
	if s.run.Binding != "" {
		x.ProducerBinding = s.run.Binding
	}
	return x
}

func envInt(name string) int {
	var v int
	if _, err := fmt.Sscanf(os.Getenv(name), "%d", &v); err != nil || v < 0 {
		return -1
	}
	return v
}

// Handle is the integer the C ABI hands out for this session.
func (s *Session) Handle() uint64 { return s.handle }

// Path is the trace file.
func (s *Session) Path() string { return s.path }

// Lookup finds an open session by handle.
func Lookup(h uint64) (*Session, error) {
	if Forked() {
		return nil, errForked("ct_*")
	}
	mu.Lock()
	s := live[h]
	mu.Unlock()
	if s == nil {
		if h == 0 {
			return nil, errorf(InvalidHandle, "session handle is 0 (never valid)")
		}
		return nil, errorf(InvalidHandle, "session %d is unknown or already finished", h)
	}
	return s, nil
}

func errForked(fn string) error {
	return errorf(State, "%s: this process is a fork() child; sessions belong to the parent and the library cannot run here", fn)
}

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

// usableLocked refuses calls on a poisoned or finishing session.
func (s *Session) usableLocked(fn string) error {
	if live[s.handle] != s {
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

func (s *Session) poisonedErr(fn string) error {
	return errorf(Poisoned, "%s: session %d is poisoned by an earlier write error (%v); only ct_finish_failed works now", fn, s.handle, s.poison)
}

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
		s.poison = err
		setPoison(s.slot, err.Error())
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

// flushLoop is the background flusher: every flushInterval it drains the
// rings and writes what is buffered, so nothing older than that is only in
// memory.
func (s *Session) flushLoop() {
	defer close(s.stopped)
	t := time.NewTicker(s.opts.flushInterval)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
			mu.Lock()
			drainerWrites = true
			if live[s.handle] == s {
				drainLocked()
				s.writeLocked()
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
	if s.aggr != nil {
		if err := s.aggr.writer.WriteNow(); err != nil {
			return errorf(IO, "ct_flush: write %s: %v", s.path, err)
		}
		return nil
	}
	if err := s.writeLocked(); err != nil {
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
	if err := s.finishCheckLocked(); err != nil {
		return err
	}
	// New fast-path calls are refused from here on; what reached the rings
	// since the check is drained and checked again (a span begun in between
	// still refuses the finish, and the session opens again).
	if s.poison == nil {
		setSlotState(s.slot, slotFinishing)
	}
	drainLocked()
	if err := s.finishCheckLocked(); err != nil {
		if s.poison == nil {
			setSlotState(s.slot, slotOpen)
		}
		return err
	}
	if s.aggr != nil {
		if err := s.finishAggregateLocked(); err != nil {
			return errorf(IO, "ct_finish: write %s: %v", s.path, err)
		}
		return nil
	}
	now, tracer := s.Now(), s.TracerNs()
	if s.measuredRoot {
		s.buf = events.AppendMeasuredSpanEnd(s.buf, 1, now, tracer)
	} else {
		s.buf = events.AppendSpanEnd(s.buf, 1, now)
	}
	s.appendTerminalLocked(true, now, "", tracer)
	err := s.writeLocked()
	note := " (the trace has no terminal line)"
	if cerr := s.sink.Close(); err == nil {
		err, note = cerr, ""
	}
	s.releaseLocked()
	if err != nil {
		return errorf(IO, "ct_finish: write %s: %v%s", s.path, err, note)
	}
	return nil
}

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
	if s.aggr != nil {
		// A summary of a whole run has no measured region or contract, but
		// a span never ended is a missing duration: refuse it as a trace
		// session does.
		return s.aggregateOpenSpans()
	}
	if !slotMeasured(s.slot) {
		return errorf(State, "ct_finish: the capture has no measured region; wrap the step in ct_measurement_begin/ct_span_end or open with \"measured_root\": true")
	}
	for _, label := range sortedKeys(s.required) {
		if n := s.required[label]; n != 1 {
			return errorf(State, "ct_finish: required semantic label %q must name exactly one span, saw %d", label, n)
		}
	}
	var missing []string
	for k, seen := range s.expected {
		if !seen {
			missing = append(missing, k.root+"/"+k.key)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		more := ""
		if len(missing) > 5 {
			more = fmt.Sprintf(" and %d more", len(missing)-5)
			missing = missing[:5]
		}
		return errorf(State, "ct_finish: the gradient contract expects gradients not recorded: %s%s; record them (state missing if absent) or call ct_finish_failed", strings.Join(missing, ", "), more)
	}
	return nil
}

// openSpansErr refuses ct_finish: n spans open, described by list (+ more).
func openSpansErr(n int, list []string, more string) error {
	return errorf(State, "ct_finish: %d spans still open: %s%s; end them or call ct_finish_failed", n, strings.Join(list, ", "), more)
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
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
	if live[s.handle] != s {
		return errorf(InvalidHandle, "ct_finish_failed: session %d is unknown or already finished", s.handle)
	}
	setSlotState(s.slot, slotFinishing)
	var err error
	if s.aggr != nil {
		// The summary has no outcome: what was folded so far is written.
		drainLocked()
		if err = s.finishAggregateLocked(); err != nil {
			return errorf(IO, "ct_finish_failed: write %s: %v", s.path, err)
		}
		return nil
	}
	if s.poison == nil {
		drainLocked()
		s.appendTerminalLocked(false, s.Now(), reason, s.TracerNs())
		err = s.writeLocked()
	} else {
		// Whatever the poisoned stream holds, try to say why it ends here.
		reason = fmt.Sprintf("%s (events after the last successful write are lost: %v)", reason, s.poison)
		s.buf = s.buf[:0]
		s.appendTerminalLocked(false, s.Now(), reason, s.TracerNs())
		err = s.writeOut()
	}
	if cerr := s.sink.Close(); err == nil {
		err = cerr
	}
	s.releaseLocked()
	if err != nil {
		return errorf(IO, "ct_finish_failed: write %s: %v", s.path, err)
	}
	return nil
}

// releaseLocked forgets the session and stops its flusher.
func (s *Session) releaseLocked() {
	s.closed.release()
	delete(live, s.handle)
	slotRelease(s.handle)
	close(s.done)
}
