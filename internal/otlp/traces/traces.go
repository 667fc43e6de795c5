// Package traces sends a candle-graph/trace/10 trace to an OpenTelemetry
// Collector as OTLP spans (see Export), over internal/otlp's Client. It
// reads the trace only through trace.StreamRecords.
package traces

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/candle-trace/candle-trace/internal/otlp"
	"github.com/candle-trace/candle-trace/internal/report/trace"
)

// Span attribute keys. thread.id is OpenTelemetry's; the rest are ours.
const (
	attrRecord       = "candle.record" // span | op | device_interval
	attrSpanID       = "candle.span.id"
	attrSpanKind     = "candle.span.kind"
	attrStep         = "candle.step"
	attrMeasured     = "candle.measured"
	attrTracerNS     = "candle.tracer_ns"
	attrThreadID     = "thread.id"
	attrOpen         = "candle.open"
	attrOutcome      = "candle.outcome"
	attrReason       = "candle.failure_reason"
	attrSessionTrNS  = "candle.session_tracer_ns"
	attrDType        = "candle.op.dtype"
	attrOpDevice     = "candle.op.device"
	attrInputBytes   = "candle.op.input_bytes"
	attrOutputBytes  = "candle.op.output_bytes"
	attrOutput       = "candle.op.output"
	attrIvDevice     = "candle.device_interval.device"
	attrIvStream     = "candle.device_interval.stream"
	attrIvBackend    = "candle.device_interval.backend"
	attrIvCorrelated = "candle.device_interval.correlation_id"
)

// TagJobID is the run tag (meta.tags) that names the job a rank's trace
// belongs to: the Python binding writes it under torch.distributed
// (TORCHELASTIC_RUN_ID, else an id agreed through the process group's
// store). Ranks of one job that captured one update share a correlation id,
// so with it they share a trace id: one job, one trace.
const TagJobID = "job_id"

// DefaultBatchSpans is how many spans go into one request: enough that the
// cost of a request vanishes, few enough (a few MB of protobuf) to stay far
// below the 20 MiB body the collector's HTTP receiver accepts by default.
const DefaultBatchSpans = 8192

// DefaultConcurrency is how many requests are in flight at once: one being
// built while others are on the wire keeps the reader busy; more only
// queues at the collector.
const DefaultConcurrency = 2

// Options tune Export. The zero value exports with the defaults.
type Options struct {
	ServiceName  string // service.name; otlp.DefaultServiceName when ""
	BatchSpans   int    // spans per request; DefaultBatchSpans when 0
	Concurrency  int    // requests in flight; DefaultConcurrency when 0
	MaxLineBytes int    // trace.DefaultMaxLineBytes when 0
}

// Result says what an export read and sent.
type Result struct {
	Meta    *trace.Meta
	Stream  *trace.StreamResult
	TraceID string // hex
	// JobID is the trace's job_id tag when it has one: then TraceID is the
	// job's, not the run's.
	JobID string
	// Anchor says where the absolute times come from: the trace's wall
	// clock at open (meta.clock.wall_unix_ns_at_open), meta.timestamp
	// (millisecond precision), or nothing (times start at the epoch).
	Anchor string
	// Spans counts every OTLP span sent; of them, Ops and DeviceIntervals
	// came from those records and OpenSpans were never closed (they end at
	// the last timestamp and carry candle.open).
	Spans, Ops, DeviceIntervals, OpenSpans int
	// UnalignedIntervals are device intervals on a device clock, left out:
	// their times do not line up with the host's.
	UnalignedIntervals int
	Requests           int
	Rejected           int64 // spans the collector accepted but did not keep
	RejectedMessage    string
}

// Anchors of Result.Anchor.
const (
	AnchorWallClock = "meta.clock.wall_unix_ns_at_open"
	AnchorTimestamp = "meta.timestamp"
	AnchorNone      = "none"
)

// ExportFile exports the trace at path; see Export.
func ExportFile(ctx context.Context, path string, c *otlp.Client, opts Options) (*Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Export(ctx, f, c, opts)
}

// Export reads one trace as it streams and sends it as OTLP spans,
// BatchSpans to a request:
//
//   - each span_start/span_end pair is a span, child of its parent_id;
//   - each op is a child span of the span it names (not a span event: an
//     event has no duration, and events would have to be held until their
//     span ends — a child span is sent as soon as its line is read, so a
//     measured span of a million ops costs no memory);
//   - each device interval on the host clock is a child span of its
//     launching span;
//   - spans without a parent are held to the end, to carry the capture's
//     outcome (candle.outcome, and an error status with the reason when it
//     failed); spans never closed end at the last timestamp, with
//     candle.open and an error status.
//
// Ids are derived, not random: the trace id from run_id and
// correlation_id (from the job_id tag and correlation_id when the trace
// has one: every rank of the job in one trace), a span id from the trace
// id and the span's id (an op's from its place in the file; with a job id,
// the run id and rank too, since the ranks' span ids repeat), so a parent
// link needs no lookup and exporting a trace twice gives the same ids. Times are the trace's
// session clock plus its wall clock at open.
//
// The reader keeps only the open spans; a trace of any size streams. The
// first request the collector refuses ends the export with its error.
func Export(ctx context.Context, r io.Reader, c *otlp.Client, opts Options) (*Result, error) {
	if opts.ServiceName == "" {
		opts.ServiceName = otlp.DefaultServiceName
	}
	if opts.BatchSpans <= 0 {
		opts.BatchSpans = DefaultBatchSpans
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultConcurrency
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := newSender(ctx, cancel, c, opts.Concurrency)
	b, stream, err := build(r, opts, s.enqueue)
	sendErr := s.wait()
	if sendErr != nil {
		// The collector's refusal is the cause; a read stopped by it
		// only echoes it.
		return nil, sendErr
	}
	if err != nil {
		return nil, err
	}
	res := &b.res
	res.Meta, res.Stream = b.meta, stream
	res.TraceID = hex.EncodeToString(b.traceID[:])
	res.Requests, res.Rejected, res.RejectedMessage = s.requests, s.rejected, s.rejectedMsg
	return res, nil
}

// build reads the trace and hands each full batch to send.
func build(r io.Reader, opts Options, send func(ptrace.Traces) error) (*traceBuilder, *trace.StreamResult, error) {
	b := &traceBuilder{opts: opts, send: send, open: map[string]*openSpan{}}
	stream, err := trace.StreamRecords(r, trace.RecordVisitor{
		Meta:           b.onMeta,
		SpanStart:      b.onSpanStart,
		SpanEnd:        b.onSpanEnd,
		Op:             b.onOp,
		DeviceInterval: b.onInterval,
		Terminal:       b.onTerminal,
	}, opts.MaxLineBytes)
	if err == nil {
		err = b.finish()
	}
	return b, stream, err
}

type openSpan struct {
	id, name string
	parent   pcommon.SpanID
	root     bool
	start    uint64
	kind     string
	step     string
	measured bool
	tid      uint64
	hasTID   bool
}

// closedRoot is a span without a parent, held to the end.
type closedRoot struct {
	*openSpan
	dur       uint64
	tracer    uint64
	hasTracer bool
	open      bool
}

type traceBuilder struct {
	opts Options
	send func(ptrace.Traces) error
	res  Result

	meta     *trace.Meta
	traceID  pcommon.TraceID
	salt     []byte // what else tells this trace's span ids apart: the rank's run, in a job's shared trace
	anchor   uint64
	resource pcommon.Resource
	version  string

	open  map[string]*openSpan
	order []*openSpan // arrival order of the open spans, for the end
	roots []*closedRoot
	seq   uint64 // ops and intervals so far: their span ids
	last  uint64

	terminal *trace.TerminalRecord
	reason   string

	batch ptrace.Traces
	spans ptrace.SpanSlice
	n     int
}

func (b *traceBuilder) onMeta(m *trace.Meta) error {
	b.meta = m
	sum := sha256.Sum256([]byte(m.RunID + "\x00" + m.CorrelationID))
	if job := m.Tags[TagJobID]; job != "" {
		// A domain prefix, so that a job id never gives the trace id of a
		// run whose run_id happens to be the same string.
		sum = sha256.Sum256([]byte("job\x00" + job + "\x00" + m.CorrelationID))
		b.salt = []byte(m.RunID + "\x00" + m.Process["rank"])
		b.res.JobID = job
	}
	copy(b.traceID[:], sum[:16])
	b.res.Anchor = AnchorNone
	if v, err := strconv.ParseUint(m.Clock["wall_unix_ns_at_open"], 10, 64); err == nil && v > 0 {
		b.anchor, b.res.Anchor = v, AnchorWallClock
	} else if t, err := time.Parse(time.RFC3339Nano, m.Timestamp); err == nil && t.UnixNano() > 0 {
		b.anchor, b.res.Anchor = uint64(t.UnixNano()), AnchorTimestamp
	}
	b.resource = pcommon.NewResource()
	res := otlp.Resource{ServiceName: b.opts.ServiceName, RunID: m.RunID, CorrelationID: m.CorrelationID, Entrypoint: m.Entrypoint,
		Phase: m.Phase, CaptureStep: m.CaptureStep, Device: m.Device, Rank: m.Process["rank"], WorldSize: m.Process["world_size"],
		Host: m.Process["hostname"], PID: m.Process["pid"], Binding: m.Producer["binding"], Schema: m.Schema, Tags: m.Tags}
	res.Put(b.resource)
	b.version = m.Producer["version"]
	return nil
}

// spanID derives a span id: FNV-1a over the trace id, the salt, a record
// tag and the record's identity. Never zero (zero means "no span" in OTLP).
// Without a salt the ids are those of the exports before job ids.
func (b *traceBuilder) spanID(tag byte, id []byte, seq uint64) pcommon.SpanID {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for _, c := range b.traceID {
		h = (h ^ uint64(c)) * prime
	}
	for _, c := range b.salt {
		h = (h ^ uint64(c)) * prime
	}
	h = (h ^ uint64(tag)) * prime
	for _, c := range id {
		h = (h ^ uint64(c)) * prime
	}
	for i := 0; i < 8; i++ {
		h = (h ^ (seq >> (8 * i) & 0xff)) * prime
	}
	if h == 0 {
		h = 1
	}
	var out pcommon.SpanID
	binary.BigEndian.PutUint64(out[:], h)
	return out
}

func (b *traceBuilder) ts(ns uint64) pcommon.Timestamp {
	return pcommon.Timestamp(satAdd(b.anchor, ns))
}

func satAdd(a, b uint64) uint64 {
	if a+b < a {
		return 1<<64 - 1
	}
	return a + b
}

func (b *traceBuilder) seen(ns uint64) { b.last = max(b.last, ns) }

// next returns a fresh span in the current batch.
func (b *traceBuilder) next() ptrace.Span {
	if b.n == 0 {
		b.batch = ptrace.NewTraces()
		rs := b.batch.ResourceSpans().AppendEmpty()
		b.resource.CopyTo(rs.Resource())
		ss := rs.ScopeSpans().AppendEmpty()
		ss.Scope().SetName(otlp.ScopeName)
		ss.Scope().SetVersion(b.version)
		b.spans = ss.Spans()
		b.spans.EnsureCapacity(b.opts.BatchSpans)
	}
	b.n++
	b.res.Spans++
	sp := b.spans.AppendEmpty()
	sp.SetTraceID(b.traceID)
	sp.SetKind(ptrace.SpanKindInternal)
	return sp
}

// done sends the batch once it is full.
func (b *traceBuilder) done() error {
	if b.n < b.opts.BatchSpans {
		return nil
	}
	return b.flush()
}

func (b *traceBuilder) flush() error {
	if b.n == 0 {
		return nil
	}
	batch := b.batch
	b.n, b.batch, b.spans = 0, ptrace.Traces{}, ptrace.SpanSlice{}
	return b.send(batch)
}

func (b *traceBuilder) onSpanStart(r *trace.SpanStartRecord) error {
	b.seen(r.StartNS)
	if _, dup := b.open[string(r.ID)]; dup {
		return nil // a parse error for candle-graph; the first one counts
	}
	s := &openSpan{id: string(r.ID), name: string(r.Name), root: !r.HasParent, start: r.StartNS,
		kind: r.Kind, step: r.Step, measured: r.Measured, tid: r.TID, hasTID: r.HasTID}
	if r.HasParent {
		s.parent = b.spanID('s', r.Parent, 0)
	}
	b.open[s.id] = s
	b.order = append(b.order, s)
	return nil
}

func (b *traceBuilder) onSpanEnd(r *trace.SpanEndRecord) error {
	s, ok := b.open[string(r.ID)]
	if !ok {
		return nil
	}
	delete(b.open, s.id)
	b.seen(satAdd(s.start, r.DurationNS))
	if s.root {
		b.roots = append(b.roots, &closedRoot{openSpan: s, dur: r.DurationNS, tracer: r.TracerNS, hasTracer: r.HasTracer})
		return nil
	}
	b.writeSpan(s, r.DurationNS, r.TracerNS, r.HasTracer)
	return b.done()
}

func (b *traceBuilder) writeSpan(s *openSpan, dur, tracer uint64, hasTracer bool) ptrace.Span {
	sp := b.next()
	sp.SetSpanID(b.spanID('s', []byte(s.id), 0))
	if !s.root {
		sp.SetParentSpanID(s.parent)
	}
	sp.SetName(s.name)
	sp.SetStartTimestamp(b.ts(s.start))
	sp.SetEndTimestamp(b.ts(satAdd(s.start, dur)))
	a := sp.Attributes()
	a.EnsureCapacity(7)
	a.PutStr(attrRecord, "span")
	a.PutStr(attrSpanID, s.id)
	a.PutStr(attrSpanKind, s.kind)
	if s.step != "" {
		a.PutStr(attrStep, s.step)
	}
	if s.measured {
		a.PutBool(attrMeasured, true)
	}
	if hasTracer {
		a.PutInt(attrTracerNS, int64(min(tracer, 1<<63-1)))
	}
	if s.hasTID {
		a.PutInt(attrThreadID, int64(min(s.tid, 1<<63-1)))
	}
	return sp
}

// child writes the span of an op (tag 'o') or device interval ('d'),
// child of the span it names, and returns its attributes, sized for n.
func (b *traceBuilder) child(tag byte, parent, name []byte, start, dur uint64, n int) pcommon.Map {
	b.seq++
	sp := b.next()
	sp.SetSpanID(b.spanID(tag, nil, b.seq))
	sp.SetParentSpanID(b.spanID('s', parent, 0))
	sp.SetName(string(name))
	sp.SetStartTimestamp(b.ts(start))
	sp.SetEndTimestamp(b.ts(satAdd(start, dur)))
	a := sp.Attributes()
	a.EnsureCapacity(n)
	return a
}

func (b *traceBuilder) onOp(r *trace.OpRecord) error {
	b.seen(satAdd(r.TimestampNS, r.DurationNS))
	a := b.child('o', r.SpanID, r.Name, r.TimestampNS, r.DurationNS, 6)
	a.PutStr(attrRecord, "op")
	a.PutStr(attrDType, string(r.DType))
	a.PutStr(attrOpDevice, string(r.Device))
	a.PutInt(attrInputBytes, int64(min(r.InputBytes, 1<<63-1)))
	if r.HasOutputBytes {
		a.PutInt(attrOutputBytes, int64(min(r.OutputBytes, 1<<63-1)))
	}
	if r.HasOutput {
		a.PutStr(attrOutput, string(r.Output))
	}
	b.res.Ops++
	return b.done()
}

func (b *traceBuilder) onInterval(r *trace.DeviceIntervalRecord) error {
	if !r.OnHostClock() {
		b.res.UnalignedIntervals++
		return nil
	}
	b.seen(satAdd(r.StartNS, r.DurationNS))
	name := r.Name
	if len(name) == 0 {
		name = r.Backend
	}
	a := b.child('d', r.SpanID, name, r.StartNS, r.DurationNS, 5)
	a.PutStr(attrRecord, "device_interval")
	a.PutStr(attrIvDevice, string(r.Device))
	a.PutStr(attrIvStream, string(r.StreamID))
	a.PutStr(attrIvBackend, string(r.Backend))
	if r.HasCorrelation {
		a.PutInt(attrIvCorrelated, int64(min(r.Correlation, 1<<63-1)))
	}
	b.res.DeviceIntervals++
	return b.done()
}

func (b *traceBuilder) onTerminal(r *trace.TerminalRecord) error {
	b.seen(r.TimestampNS)
	t := *r
	b.terminal = &t
	b.reason = string(r.Reason)
	return nil
}

// finish writes what needed the whole trace: spans never closed (end at
// the last timestamp), then the roots with the outcome, and sends the rest.
func (b *traceBuilder) finish() error {
	for _, s := range b.order {
		if _, open := b.open[s.id]; !open {
			continue
		}
		b.res.OpenSpans++
		dur := b.last - min(b.last, s.start)
		if s.root {
			b.roots = append(b.roots, &closedRoot{openSpan: s, dur: dur, open: true})
			continue
		}
		b.markOpen(b.writeSpan(s, dur, 0, false))
		if err := b.done(); err != nil {
			return err
		}
	}
	for _, r := range b.roots {
		sp := b.writeSpan(r.openSpan, r.dur, r.tracer, r.hasTracer)
		if r.open {
			b.markOpen(sp)
		}
		a := sp.Attributes()
		switch {
		case b.terminal == nil:
			a.PutStr(attrOutcome, "incomplete")
		default:
			a.PutStr(attrOutcome, b.terminal.Outcome)
			if b.terminal.HasTracer {
				a.PutInt(attrSessionTrNS, int64(min(b.terminal.TracerNS, 1<<63-1)))
			}
			if b.terminal.Outcome == "failed" {
				a.PutStr(attrReason, b.reason)
				sp.Status().SetCode(ptrace.StatusCodeError)
				sp.Status().SetMessage("capture failed: " + b.reason)
			}
		}
		if err := b.done(); err != nil {
			return err
		}
	}
	return b.flush()
}

func (b *traceBuilder) markOpen(sp ptrace.Span) {
	sp.Attributes().PutBool(attrOpen, true)
	sp.Status().SetCode(ptrace.StatusCodeError)
	sp.Status().SetMessage("not closed: the trace ends before the span does; it ends at the last timestamp in the trace")
}

// sender marshals and posts batches from a few goroutines, so that the
// reader builds the next batch while the last ones are on the wire. The
// first error cancels the export.
type sender struct {
	ctx    context.Context
	cancel context.CancelFunc
	client *otlp.Client
	queue  chan ptrace.Traces
	wg     sync.WaitGroup

	mu          sync.Mutex
	err         error
	requests    int
	rejected    int64
	rejectedMsg string
}

func newSender(ctx context.Context, cancel context.CancelFunc, c *otlp.Client, workers int) *sender {
	s := &sender{ctx: ctx, cancel: cancel, client: c, queue: make(chan ptrace.Traces, workers)}
	for range workers {
		s.wg.Add(1)
		go s.work()
	}
	return s
}

func (s *sender) enqueue(t ptrace.Traces) error {
	select {
	case s.queue <- t:
		return nil
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

func (s *sender) work() {
	defer s.wg.Done()
	var m ptrace.ProtoMarshaler
	for t := range s.queue {
		if s.ctx.Err() != nil {
			continue // drain: the export is over
		}
		body, err := m.MarshalTraces(t)
		if err != nil {
			s.fail(fmt.Errorf("encoding OTLP traces: %w", err))
			continue
		}
		rep, err := s.client.Send(s.ctx, otlp.Traces, body)
		if err != nil {
			s.fail(err)
			continue
		}
		s.mu.Lock()
		s.requests++
		if rep.Rejected > 0 {
			s.rejected += rep.Rejected
			s.rejectedMsg = rep.Message
		}
		s.mu.Unlock()
	}
}

func (s *sender) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	s.cancel()
}

// wait closes the queue and returns the first error once every request
// has ended.
func (s *sender) wait() error {
	close(s.queue)
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil && s.ctx.Err() != nil {
		// Cancelled from outside (the caller's context).
		return s.ctx.Err()
	}
	return s.err
}
