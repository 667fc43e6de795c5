package session

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/outfile"
)

// traceSession is the product of a trace session: the candle-graph/trace/10
// JSONL of one step, written to its sink as it is recorded (or kept in memory
// and written at the end: a buffered session, buffered.go). Records become
// lines in the Session's buf (records.go, and the drainer's span code from
// onSpanStart on), which the trace hands to the sink.
type traceSession struct {
	sess  *Session
	sink  Sink
	bound *bufferSink // the sink of a buffered session; nil otherwise
	// sameRun is what the next session of a flight recorder's run takes
	// from this one (Reopen).
	sameRun sameRun

	// Guarded by mu.
	names        map[string]string   // span names of open spans (intern)
	lastName     string              // the name intern returned last
	required     map[string]int      // required semantic label -> spans seen
	pendingEdges map[uint64][]uint64 // to -> from, written when `to` closes
}

// sameRun is what every session of one run shares, so a flight recorder's
// next session (Reopen, one per training update) takes it from the update
// before instead of asking the system again: the meta line's facts about
// the process (the host name is a file read, rank and world size two
// parses) and the folder its last path check found usable.
type sameRun struct {
	facts  *processFacts
	folder string
}

// processFacts are the meta line's facts about the process writing a trace.
type processFacts struct {
	producer        Producer
	pid             int
	hostname        string
	rank, worldSize int // -1: not set
}

func newProcessFacts(p Producer, run *events.Run) *processFacts {
	host, _ := os.Hostname()
	if run.Binding != "" {
		p.Binding = run.Binding
	}
	return &processFacts{producer: p, pid: os.Getpid(), hostname: host, rank: envInt("RANK"), worldSize: envInt("WORLD_SIZE")}
}

// extras are the meta line's extras of a trace opened at now.
func (f *processFacts) extras(now time.Time) events.MetaExtras {
	return events.MetaExtras{
		RunID:            "run-" + strconv.Itoa(f.pid) + "-" + strconv.FormatInt(now.UnixNano(), 10),
		Timestamp:        events.FormatTimestamp(now),
		ProducerName:     f.producer.Name,
		ProducerVersion:  f.producer.Version,
		ProducerBinding:  f.producer.Binding,
		WallUnixNsAtOpen: uint64(now.UnixNano()),
		PID:              f.pid,
		Hostname:         f.hostname,
		Rank:             f.rank,
		WorldSize:        f.worldSize,
	}
}

func envInt(name string) int {
	var v int
	if _, err := fmt.Sscanf(os.Getenv(name), "%d", &v); err != nil || v < 0 {
		return -1
	}
	return v
}

// openTrace makes s a trace session: it creates the sink (a buffered
// session's only checks its path, buffered.go) and writes the meta line and
// the root's span_start. prev is the session before in a flight recorder's
// run (Reopen; nil otherwise) and reuse the memory it kept its trace in.
func openTrace(s *Session, prev *sameRun, reuse []byte, at *rearmedAt) error {
	t := &traceSession{sess: s, names: map[string]string{}}
	if prev != nil {
		t.sameRun = *prev
	} else {
		t.sameRun.facts = newProcessFacts(s.opts.producer, s.run)
	}
	if labels := s.run.RequiredLabels(); len(labels) > 0 {
		t.required = make(map[string]int, len(labels))
		for _, l := range labels {
			t.required[l] = 0
		}
	}
	if b := s.run.Buffer; b != nil {
		if at == nil { // re-armed in C: checked there, in the same folder
			folder, err := outfile.CheckCreateIn(s.path, aggregate.OwnFile, t.sameRun.folder)
			if err != nil {
				return errorf(IO, "ct_open: buffered trace %s: %v (nothing was created)", s.path, err)
			}
			t.sameRun.folder = folder
		}
		t.bound = newBufferSink(s.path, b, s.opts.opener, reuse)
		t.sink = t.bound
	} else {
		sink, err := s.opts.opener(s.path)
		if err != nil {
			return errorf(IO, "ct_open: create %s: %v", s.path, err)
		}
		t.sink = sink
	}
	s.product, s.traceSession = t, t
	now := time.Now()
	if at != nil {
		now = at.wall
	}
	root, _ := s.open.get(1) // openRun's, on the opening thread
	s.buf = s.run.AppendMeta(s.buf, t.sameRun.facts.extras(now))
	s.buf = events.AppendSpanStart(s.buf, 1, 0, s.run.Entrypoint, 0, events.SpanFunction, s.run.MeasuredRoot, events.StepNone, root.tid)
	s.countLabel(s.run.Entrypoint)
	if err := s.writeOut(); err != nil {
		discard(t.sink)
		return errorf(IO, "ct_open: write %s: %v", s.path, err)
	}
	return nil
}

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

// A buffered session writes nothing until it ends: no flusher to run (the
// drainer still drains a ring that fills), which is most of what a flight
// recorder's session costs per update to open and drop.
func (t *traceSession) flushesInBackground() bool { return t.bound == nil }

func (t *traceSession) tickLocked() { t.sess.writeLocked() }

func (t *traceSession) flushLocked() error { return t.sess.writeLocked() }

// finishCheckLocked refuses a trace candle-graph would reject: no measured
// region, a required label not on exactly one span, a contract gradient
// never recorded.
func (t *traceSession) finishCheckLocked() error {
	s := t.sess
	if !slotMeasured(s.slot) {
		return errorf(State, "ct_finish: the capture has no measured region; wrap the step in ct_measurement_begin/ct_span_end or open with \"measured_root\": true")
	}
	for _, label := range sortedKeys(t.required) {
		if n := t.required[label]; n != 1 {
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

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// finishLocked closes the root and writes terminal complete.
func (t *traceSession) finishLocked() error {
	s := t.sess
	now, tracer := s.Now(), s.TracerNs()
	if s.run.MeasuredRoot {
		s.buf = events.AppendMeasuredSpanEnd(s.buf, 1, now, tracer)
	} else {
		s.buf = events.AppendSpanEnd(s.buf, 1, now)
	}
	t.appendTerminalLocked(true, now, "", tracer)
	err := s.writeLocked()
	note := " (the trace has no terminal line)"
	if cerr := t.sink.Close(); err == nil {
		err, note = cerr, ""
	}
	s.releaseLocked()
	if err != nil {
		return errorf(IO, "ct_finish: write %s: %v%s", s.path, err, note)
	}
	return nil
}

// finishFailedLocked writes terminal failed, also on a poisoned session:
// whatever its stream holds, it tries to say why it ends there.
func (t *traceSession) finishFailedLocked(reason string) error {
	s := t.sess
	var err error
	if s.poison == nil {
		drainLocked()
		t.appendTerminalLocked(false, s.Now(), reason, s.TracerNs())
		err = s.writeLocked()
	} else {
		reason = fmt.Sprintf("%s (events after the last successful write are lost: %v)", reason, s.poison)
		s.buf = s.buf[:0]
		t.appendTerminalLocked(false, s.Now(), reason, s.TracerNs())
		err = s.writeOut()
	}
	if cerr := t.sink.Close(); err == nil {
		err = cerr
	}
	s.releaseLocked()
	if err != nil {
		return errorf(IO, "ct_finish_failed: write %s: %v", s.path, err)
	}
	return nil
}

func (t *traceSession) keepLocked(c lineClass, mark int) { t.keepLine(c, mark) }

// scalarLocked: a trace's scalar is its stats line alone.
func (t *traceSession) scalarLocked(string, string, float64) error { return nil }

func (t *traceSession) completedSpanLocked(id uint64, name string, kind events.SpanKind, startNs, durNs uint64) bool {
	s := t.sess
	mark := len(s.buf)
	s.buf = events.AppendSpanStart(s.buf, id, 1, name, startNs, kind, false, events.StepNone, 0)
	s.buf = events.AppendSpanEnd(s.buf, id, durNs)
	s.countLabel(name)
	return !t.keepCompletedSpan(mark, name)
}

// callEdgeLocked checks to against the hierarchy (its parent must be from)
// and writes the edge, with to's duration once to has closed.
func (t *traceSession) callEdgeLocked(fn string, from, to, hostDurationNs uint64) error {
	s := t.sess
	var parent, dur uint64
	closed, dropped := false, false
	if o, open, c, isClosed := s.recordSpan(to); open {
		parent, dropped = o.parent, o.line != nil
	} else if isClosed {
		parent, dur, closed, dropped = c.parent, c.dur, true, c.dropped
	} else {
		return s.unknownSpan(fn, to)
	}
	if parent != from || to == 1 {
		return errorf(InvalidArgument, "%s: s%d's parent is s%d, not s%d (call_edge_hierarchy_mismatch)", fn, to, parent, from)
	}
	switch {
	case closed && hostDurationNs != 0 && hostDurationNs != dur:
		return errorf(InvalidArgument, "%s: host_duration_ns %d differs from s%d's duration %d ns (pass 0 to take it)", fn, hostDurationNs, to, dur)
	case closed:
		mark := len(s.buf)
		s.buf = events.AppendCallEdge(s.buf, from, to, dur)
		t.keepCallEdge(mark, dropped)
	case hostDurationNs != 0:
		return errorf(InvalidArgument, "%s: s%d is still open, so its duration is unknown; pass host_duration_ns 0 to take it when it closes", fn, to)
	default:
		if t.pendingEdges == nil {
			t.pendingEdges = map[uint64][]uint64{}
		}
		t.pendingEdges[to] = append(t.pendingEdges[to], from)
	}
	return nil
}

// untrackedSpan: every span of a trace reaches the Go tables.
func (t *traceSession) untrackedSpan(uint64) bool { return false }

func (t *traceSession) naiveBeginLocked(id, parent uint64, name string, kind events.SpanKind, step events.Step, start uint64) {
	s := t.sess
	s.buf = events.AppendSpanStart(s.buf, id, parent, name, start, kind, false, step, 0)
}

func (t *traceSession) naiveEndLocked(o openSpan, id, dur uint64) {
	t.sess.spanEnded(o, id, dur, false, 0)
}
