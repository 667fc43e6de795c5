package health

import (
	"fmt"
	"hash/maphash"
	"math"
	"strings"

	"github.com/candle-trace/candle-trace/internal/report/trace"
)

// analyzer consumes decoded events in file order and keeps only compact
// state: one record per span, folds of the evidence that names each span,
// hashes of known tensor ids, live storages, gradients (one per parameter)
// and the report's bounded summaries. It never holds the events themselves.
type Checker struct {
	opts Options

	Meta       *trace.Meta
	schemaPrev bool
	events     int
	Terminal   *terminalInfo
	// measuredTracer: the tracer time the measured span's end states.
	MeasuredTracerNS *uint64
	Fatal            bool // reading stopped: candle-graph would have no document
	cutLine          int  // the last line, cut short by a dying writer (0: none)
	issues           []trace.Issue

	SpanByID map[string]*Span
	Spans    []*Span // arrival order, for deterministic output
	pending  map[string]*spanRefs
	names    map[string]string // interned span and op names

	requiredLabels map[string]int // required semantic label -> spans so named
	stepCounts     [3]int

	latest     uint64 // latest host evidence except spans (added at the end)
	latestLine int

	coverage Coverage

	seed        maphash.Seed
	tensors     map[uint64]struct{}
	dataEdges   []pendingDataEdge
	edgeCheckAt int // pending data edges that trigger the next resolve pass
	callEdges   []pendingCallEdge
	callChecks  map[*Span][]callCheck
	hostMaxEnd  uint64 // latest end of a host-clock device interval
	hostMaxLine int

	Gradients *GradientState
	mem       *memoryTracker

	// Set once the read is done: the memory lifetimes and the verdict.
	Memory *Lifetimes
	Health Health
}

type terminalInfo struct {
	outcome     int
	timestamp   uint64
	reason      string
	hasReason   bool
	line        int
	TracerNS    *uint64 // the session's tracer time, when the trace states it
	EstimatedNS uint64  // the calibrated part of it
}

type pendingDataEdge struct {
	from, to string
	line     int
}

type pendingCallEdge struct {
	from, to string
	dur      uint64
	line     int
}

type callCheck struct {
	from string
	dur  uint64
	line int
}

func newAnalyzer(opts Options) *Checker {
	a := &Checker{
		opts:           opts,
		SpanByID:       map[string]*Span{},
		pending:        map[string]*spanRefs{},
		names:          map[string]string{},
		requiredLabels: map[string]int{},
		seed:           maphash.MakeSeed(),
		tensors:        map[uint64]struct{}{},
		callChecks:     map[*Span][]callCheck{},
		Gradients:      newGradientState(),
		mem:            newMemoryTracker(),
	}
	return a
}

func (a *Checker) intern(b []byte) string {
	if s, ok := a.names[string(b)]; ok {
		return s
	}
	s := string(b)
	a.names[s] = s
	return s
}

func (a *Checker) errorAt(line int, code, msg string) {
	a.issues = append(a.issues, trace.Issue{Severity: trace.SeverityError, Code: code, Message: msg, Line: line})
}

func (a *Checker) warnAt(line int, code, msg string) {
	a.issues = append(a.issues, trace.Issue{Severity: trace.SeverityWarning, Code: code, Message: msg, Line: line})
}

// stop records a problem that makes candle-graph refuse the whole file.
func (a *Checker) stop(line int, code, msg string) {
	a.issues = append(a.issues, trace.Issue{Severity: trace.SeverityError, Code: code, Message: msg, Line: line, Parse: true})
	a.Fatal = true
}

func (a *Checker) noteLatest(ts uint64, line int) {
	if ts > a.latest || a.latestLine == 0 {
		a.latest, a.latestLine = ts, line
	}
}

func (a *Checker) tensorHash(b []byte) uint64 { return maphash.Bytes(a.seed, b) }

// event applies the stream rules of candle-graph's parser and folds the
// event into the analysis state.
func (a *Checker) event(d *trace.Decoder, k trace.Kind, line int) {
	if a.Terminal != nil {
		a.stop(line, trace.CodeEventAfterTerminal, fmt.Sprintf("%s record after the terminal record (line %d); terminal must be last", k, a.Terminal.line))
		return
	}
	if a.events == 0 && k != trace.KindMeta {
		a.stop(line, trace.CodeMissingMeta, fmt.Sprintf("the first record is %s; a trace must start with a meta record", k))
		return
	}
	a.events++
	switch k {
	case trace.KindMeta:
		if a.events != 1 {
			a.stop(line, trace.CodeMetaNotFirst, "meta record must be the first record; only one is allowed")
			return
		}
		a.onMeta(d.Meta, line)
	case trace.KindSpanStart:
		a.onSpanStart(&d.SpanStart, line)
	case trace.KindSpanEnd:
		a.onSpanEnd(&d.SpanEnd, line)
	case trace.KindOp:
		a.onOp(&d.Op, line)
	case trace.KindTensor:
		a.onTensor(&d.Tensor, line)
	case trace.KindTensorStats:
		a.onTensorStats(&d.TensorStats, line)
	case trace.KindMemory:
		a.onMemory(&d.Memory, line)
	case trace.KindDeviceMemory:
		a.onDeviceMemory(&d.DeviceMemory, line)
	case trace.KindDeviceInterval:
		a.onDeviceInterval(&d.DeviceInterval, line)
	case trace.KindGradient:
		a.coverage.Gradients++
		a.Gradients.add(&d.Gradient, line, a)
	case trace.KindEdge:
		a.onEdge(&d.Edge, line)
	case trace.KindTerminal:
		t := &d.Terminal
		a.Terminal = &terminalInfo{outcome: t.Outcome, timestamp: t.Timestamp, reason: string(t.Reason), hasReason: t.HasReason, line: line}
		if t.HasTracer {
			v := t.Tracer
			a.Terminal.TracerNS, a.Terminal.EstimatedNS = &v, t.Estimated
		}
	}
}

func (a *Checker) onMeta(m *trace.Meta, line int) {
	a.Meta = m
	switch m.Schema {
	case trace.Schema:
	case trace.PreviousSchema:
		a.schemaPrev = true
	default:
		a.stop(line, trace.CodeUnsupportedSchema, fmt.Sprintf("unsupported trace schema %q; expected %q or %q", m.Schema, trace.Schema, trace.PreviousSchema))
		return
	}
	for _, l := range m.CaptureContract.RequiredSemanticLabels {
		a.requiredLabels[l] = 0
	}
}

func (a *Checker) onSpanStart(e *trace.SpanStartEvent, line int) {
	if _, dup := a.SpanByID[string(e.ID)]; dup {
		a.stop(line, trace.CodeDuplicateSpanStart, fmt.Sprintf("duplicate span_start id `%s`", e.ID))
		return
	}
	s := &Span{
		ID: string(e.ID), Name: a.intern(e.Name), Start: e.Start, line: int32(line),
		spanKind: int8(e.SpanKind), step: int8(e.Step), HasParent: e.HasParent, Measured: e.Measured,
	}
	if e.HasParent {
		// Parents usually started earlier: share their id instead of a copy.
		if p, ok := a.SpanByID[string(e.Parent)]; ok {
			s.Parent = p.ID
		} else {
			s.Parent = string(e.Parent)
		}
	}
	if r, ok := a.pending[s.ID]; ok {
		s.refs.merge(r)
		delete(a.pending, s.ID)
	}
	a.SpanByID[s.ID] = s
	a.Spans = append(a.Spans, s)
	if n, ok := a.requiredLabels[s.Name]; ok {
		a.requiredLabels[s.Name] = n + 1
	}
	if e.Step != trace.StepNone {
		a.stepCounts[e.Step]++
	}
}

func (a *Checker) onSpanEnd(e *trace.SpanEndEvent, line int) {
	s, ok := a.SpanByID[string(e.ID)]
	if !ok {
		a.stop(line, trace.CodeSpanEndUnknown, fmt.Sprintf("span_end for unknown span `%s`", e.ID))
		return
	}
	if s.Closed {
		a.stop(line, trace.CodeDuplicateSpanEnd, fmt.Sprintf("duplicate span_end for `%s` (first at line %d)", e.ID, s.endLine))
		return
	}
	s.Closed, s.Dur, s.endLine = true, e.Duration, int32(line)
	if s.Measured && e.HasTracer {
		v := e.Tracer // e is the decoder's, reused by the next line
		a.MeasuredTracerNS = &v
	}
	a.checkBounds(s)
	for _, c := range a.callChecks[s] {
		a.checkCallDuration(c.from, s, c.dur, c.line)
	}
	delete(a.callChecks, s)
}

func (a *Checker) onOp(e *trace.OpEvent, line int) {
	a.coverage.Operations++
	end := trace.SatAdd(e.Timestamp, e.Duration)
	a.noteLatest(end, line)
	r, s := a.refsFor(e.SpanID)
	r.note(refOperation, line)
	if s != nil && s.Closed {
		if e.Timestamp < s.Start || end > s.End() {
			a.errorAt(line, trace.CodeOperationOutsideSpan, fmt.Sprintf("operation `%s` [%d, %d] lies outside span `%s` [%d, %d]", e.OpName, e.Timestamp, end, s.ID, s.Start, s.End()))
		}
	}
	r.addOp(e.Timestamp, end, line, e.Duration)
	for _, in := range e.Inputs {
		a.tensors[a.tensorHash(in)] = struct{}{}
	}
	if e.HasOutput {
		a.tensors[a.tensorHash(e.Output)] = struct{}{}
	}
}

func (a *Checker) onTensor(e *trace.TensorEvent, line int) {
	a.coverage.Tensors++
	r, _ := a.refsFor(e.SpanID)
	r.note(refTensor, line)
	a.tensors[a.tensorHash(e.TensorID)] = struct{}{}
}

func (a *Checker) onTensorStats(e *trace.TensorStatsEvent, line int) {
	if a.schemaPrev {
		a.stop(line, trace.CodeTensorStatsOldSchema, fmt.Sprintf("trace schema %q does not define tensor_stats records; declare %q", trace.PreviousSchema, trace.Schema))
		return
	}
	if msg := tensorStatsProblem(e); msg != "" {
		a.stop(line, trace.CodeInvalidTensorStats, "invalid tensor_stats record: "+msg)
		return
	}
	a.coverage.TensorStats++
	r, _ := a.refsFor(e.SpanID)
	r.note(refTensorStats, line)
}

// tensorStatsProblem mirrors the invariants candle-graph's parser enforces.
func tensorStatsProblem(e *trace.TensorStatsEvent) string {
	if strings.TrimSpace(string(e.Label)) == "" {
		return "label must not be empty"
	}
	n := uint64(1)
	for _, d := range e.Shape {
		if d != 0 && n > math.MaxUint64/d {
			return "element count of shape overflows u64"
		}
		n *= d
	}
	switch {
	case n != e.Elements:
		return fmt.Sprintf("elements %d != product of shape %v (%d)", e.Elements, e.Shape, n)
	case e.NonFinite > e.Elements:
		return fmt.Sprintf("non_finite %d exceeds elements %d", e.NonFinite, e.Elements)
	case e.RMS < 0:
		return "rms must be finite and >= 0"
	case e.AbsMax < 0:
		return "abs_max must be finite and >= 0"
	}
	return ""
}

func (a *Checker) onMemory(e *trace.MemoryEvent, line int) {
	a.coverage.MemoryEvents++
	a.noteLatest(e.Timestamp, line)
	r, s := a.refsFor(e.SpanID)
	r.note(refMemory, line)
	if s != nil && s.Closed && (e.Timestamp < s.Start || e.Timestamp > s.End()) {
		a.errorAt(line, trace.CodeMemoryOutsideSpan, fmt.Sprintf("memory event for storage `%s` at %d ns lies outside span `%s` [%d, %d]", e.StorageID, e.Timestamp, s.ID, s.Start, s.End()))
	}
	r.addMem(e.Timestamp, line)
	a.mem.add(e, line)
}

func (a *Checker) onDeviceMemory(e *trace.DeviceMemoryEvent, line int) {
	a.coverage.DeviceMemorySamples++
	a.noteLatest(e.Timestamp, line)
	if !e.HasUsed && !e.HasFree && !e.HasReserved && !e.HasCapacity {
		a.errorAt(line, trace.CodeEmptyDeviceMemorySample, fmt.Sprintf("device-memory sample for `%s` contains no measurements", e.Device))
	}
}

func (a *Checker) onDeviceInterval(e *trace.DeviceIntervalEvent, line int) {
	a.coverage.DeviceIntervals++
	r, _ := a.refsFor(e.SpanID)
	r.note(refDeviceInterval, line)
	if e.Duration == 0 {
		a.errorAt(line, trace.CodeEmptyDeviceInterval, fmt.Sprintf("device interval for `%s` has zero duration", e.SpanID))
	}
	if string(e.ClockID) == trace.HostClock {
		if end := trace.SatAdd(e.Start, e.Duration); end > a.hostMaxEnd || a.hostMaxLine == 0 {
			a.hostMaxEnd, a.hostMaxLine = end, line
		}
	}
}

func (a *Checker) onEdge(e *trace.EdgeEvent, line int) {
	if !e.Call {
		a.coverage.DataEdges++
		if len(e.From) == 0 || len(e.To) == 0 {
			a.errorAt(line, trace.CodeEmptyDataEdgeEndpoint, "data-edge tensor ids cannot be empty")
			return
		}
		// Known tensors only ever grow, so an edge whose tensors are known
		// now is settled; only the others are kept (and copied).
		_, f := a.tensors[a.tensorHash(e.From)]
		_, t := a.tensors[a.tensorHash(e.To)]
		if f && t {
			return
		}
		a.dataEdges = append(a.dataEdges, pendingDataEdge{from: string(e.From), to: string(e.To), line: line})
		if len(a.dataEdges) >= max(a.edgeCheckAt, 4096) {
			a.resolveDataEdges(false)
			a.edgeCheckAt = 2 * len(a.dataEdges)
		}
		return
	}
	a.coverage.CallEdges++
	from, fromOK := a.SpanByID[string(e.From)]
	to, toOK := a.SpanByID[string(e.To)]
	if !fromOK || !toOK {
		a.callEdges = append(a.callEdges, pendingCallEdge{from: string(e.From), to: string(e.To), dur: e.HostDuration, line: line})
		return
	}
	a.checkCallEdge(from.ID, to, e.HostDuration, line)
}

func (a *Checker) checkCallEdge(from string, to *Span, dur uint64, line int) {
	if !to.HasParent || to.Parent != from {
		a.errorAt(line, trace.CodeCallEdgeHierarchyMismatch, fmt.Sprintf("call edge `%s` -> `%s` does not match the span hierarchy", from, to.ID))
	}
	if to.Closed {
		a.checkCallDuration(from, to, dur, line)
	} else {
		a.callChecks[to] = append(a.callChecks[to], callCheck{from: from, dur: dur, line: line})
	}
}

func (a *Checker) checkCallDuration(from string, to *Span, dur uint64, line int) {
	if dur != to.Dur {
		a.errorAt(line, trace.CodeCallEdgeDurationMismatch, fmt.Sprintf("call edge `%s` -> `%s` reports %d ns but the span reports %d ns", from, to.ID, dur, to.Dur))
	}
}

// resolveDataEdges drops pending data edges whose tensors are known by now;
// at the end (final) the rest are errors. Edges usually follow the ops that
// name their tensors, so the pending list stays short.
func (a *Checker) resolveDataEdges(final bool) {
	kept := a.dataEdges[:0]
	for _, e := range a.dataEdges {
		_, f := a.tensors[maphash.String(a.seed, e.from)]
		_, t := a.tensors[maphash.String(a.seed, e.to)]
		switch {
		case f && t:
		case final:
			a.errorAt(e.line, trace.CodeUnknownDataEdgeTensor, fmt.Sprintf("data edge `%s` -> `%s` refers to unknown tensor evidence", e.from, e.to))
		default:
			kept = append(kept, e)
		}
	}
	a.dataEdges = kept
}

func (a *Checker) finishCallEdges() {
	for _, e := range a.callEdges {
		to, toOK := a.SpanByID[e.to]
		if _, fromOK := a.SpanByID[e.from]; !fromOK || !toOK {
			a.errorAt(e.line, trace.CodeUnknownCallEdgeSpan, fmt.Sprintf("call edge `%s` -> `%s` refers to a missing span", e.from, e.to))
			continue
		}
		a.checkCallEdge(e.from, to, e.dur, e.line)
	}
	a.callEdges = nil
	a.callChecks = nil // spans still open: candle-graph checks closed ones only
}
