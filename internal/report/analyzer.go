package report

import (
	"fmt"
	"hash/maphash"
	"math"
	"strings"
)

// analyzer consumes decoded events in file order and keeps only compact
// state: one record per span, folds of the evidence that names each span,
// hashes of known tensor ids, live storages, gradients (one per parameter)
// and the report's bounded summaries. It never holds the events themselves.
type analyzer struct {
	opts checkOptions

	meta       *Meta
	schemaPrev bool
	events     int
	terminal   *terminalInfo
	// measuredTracer: the tracer time the measured span's end states.
	measuredTracer *uint64
	fatal          bool // reading stopped: candle-graph would have no document
	cutLine        int  // the last line, cut short by a dying writer (0: none)
	issues         []Issue

	spans    map[string]*span
	spanList []*span // arrival order, for deterministic output
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
	callChecks  map[*span][]callCheck
	hostMaxEnd  uint64 // latest end of a host-clock device interval
	hostMaxLine int

	grads *gradientState
	mem   *memoryTracker

	// Set once the read is done: the memory lifetimes and the verdict.
	lt     *lifetimes
	health Health
}

type terminalInfo struct {
	outcome   int
	timestamp uint64
	reason    string
	hasReason bool
	line      int
	tracer    *uint64 // the session's tracer time, when the trace states it
	estimated uint64  // the calibrated part of it
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

func newAnalyzer(opts checkOptions) *analyzer {
	a := &analyzer{
		opts:           opts,
		spans:          map[string]*span{},
		pending:        map[string]*spanRefs{},
		names:          map[string]string{},
		requiredLabels: map[string]int{},
		seed:           maphash.MakeSeed(),
		tensors:        map[uint64]struct{}{},
		callChecks:     map[*span][]callCheck{},
		grads:          newGradientState(),
		mem:            newMemoryTracker(),
	}
	return a
}

func (a *analyzer) intern(b []byte) string {
	if s, ok := a.names[string(b)]; ok {
		return s
	}
	s := string(b)
	a.names[s] = s
	return s
}

func (a *analyzer) errorAt(line int, code, msg string) {
	a.issues = append(a.issues, Issue{Severity: SeverityError, Code: code, Message: msg, Line: line})
}

func (a *analyzer) warnAt(line int, code, msg string) {
	a.issues = append(a.issues, Issue{Severity: SeverityWarning, Code: code, Message: msg, Line: line})
}

// stop records a problem that makes candle-graph refuse the whole file.
func (a *analyzer) stop(line int, code, msg string) {
	a.issues = append(a.issues, Issue{Severity: SeverityError, Code: code, Message: msg, Line: line, Parse: true})
	a.fatal = true
}

func (a *analyzer) noteLatest(ts uint64, line int) {
	if ts > a.latest || a.latestLine == 0 {
		a.latest, a.latestLine = ts, line
	}
}

func (a *analyzer) tensorHash(b []byte) uint64 { return maphash.Bytes(a.seed, b) }

// event applies the stream rules of candle-graph's parser and folds the
// event into the analysis state.
func (a *analyzer) event(d *lineDecoder, k eventKind, line int) {
	if a.terminal != nil {
		a.stop(line, CodeEventAfterTerminal, fmt.Sprintf("%s record after the terminal record (line %d); terminal must be last", k, a.terminal.line))
		return
	}
	if a.events == 0 && k != kindMeta {
		a.stop(line, CodeMissingMeta, fmt.Sprintf("the first record is %s; a trace must start with a meta record", k))
		return
	}
	a.events++
	switch k {
	case kindMeta:
		if a.events != 1 {
			a.stop(line, CodeMetaNotFirst, "meta record must be the first record; only one is allowed")
			return
		}
		a.onMeta(d.meta, line)
	case kindSpanStart:
		a.onSpanStart(&d.spanStart, line)
	case kindSpanEnd:
		a.onSpanEnd(&d.spanEnd, line)
	case kindOp:
		a.onOp(&d.op, line)
	case kindTensor:
		a.onTensor(&d.tensor, line)
	case kindTensorStats:
		a.onTensorStats(&d.stats, line)
	case kindMemory:
		a.onMemory(&d.memory, line)
	case kindDeviceMemory:
		a.onDeviceMemory(&d.devMem, line)
	case kindDeviceInterval:
		a.onDeviceInterval(&d.interval, line)
	case kindGradient:
		a.coverage.Gradients++
		a.grads.add(&d.gradient, line, a)
	case kindEdge:
		a.onEdge(&d.edge, line)
	case kindTerminal:
		t := &d.terminal
		a.terminal = &terminalInfo{outcome: t.outcome, timestamp: t.timestamp, reason: string(t.reason), hasReason: t.hasReason, line: line}
		if t.hasTracer {
			v := t.tracer
			a.terminal.tracer, a.terminal.estimated = &v, t.estimated
		}
	}
}

func (a *analyzer) onMeta(m *Meta, line int) {
	a.meta = m
	switch m.Schema {
	case Schema:
	case PreviousSchema:
		a.schemaPrev = true
	default:
		a.stop(line, CodeUnsupportedSchema, fmt.Sprintf("unsupported trace schema %q; expected %q or %q", m.Schema, Schema, PreviousSchema))
		return
	}
	for _, l := range m.CaptureContract.RequiredSemanticLabels {
		a.requiredLabels[l] = 0
	}
}

func (a *analyzer) onSpanStart(e *spanStartEvent, line int) {
	if _, dup := a.spans[string(e.id)]; dup {
		a.stop(line, CodeDuplicateSpanStart, fmt.Sprintf("duplicate span_start id `%s`", e.id))
		return
	}
	s := &span{
		id: string(e.id), name: a.intern(e.name), start: e.start, line: int32(line),
		spanKind: int8(e.spanKind), step: int8(e.step), hasParent: e.hasParent, measured: e.measured,
	}
	if e.hasParent {
		// Parents usually started earlier: share their id instead of a copy.
		if p, ok := a.spans[string(e.parent)]; ok {
			s.parent = p.id
		} else {
			s.parent = string(e.parent)
		}
	}
	if r, ok := a.pending[s.id]; ok {
		s.refs.merge(r)
		delete(a.pending, s.id)
	}
	a.spans[s.id] = s
	a.spanList = append(a.spanList, s)
	if n, ok := a.requiredLabels[s.name]; ok {
		a.requiredLabels[s.name] = n + 1
	}
	if e.step != stepNone {
		a.stepCounts[e.step]++
	}
}

func (a *analyzer) onSpanEnd(e *spanEndEvent, line int) {
	s, ok := a.spans[string(e.id)]
	if !ok {
		a.stop(line, CodeSpanEndUnknown, fmt.Sprintf("span_end for unknown span `%s`", e.id))
		return
	}
	if s.closed {
		a.stop(line, CodeDuplicateSpanEnd, fmt.Sprintf("duplicate span_end for `%s` (first at line %d)", e.id, s.endLine))
		return
	}
	s.closed, s.dur, s.endLine = true, e.duration, int32(line)
	if s.measured && e.hasTracer {
		v := e.tracer // e is the decoder's, reused by the next line
		a.measuredTracer = &v
	}
	a.checkBounds(s)
	for _, c := range a.callChecks[s] {
		a.checkCallDuration(c.from, s, c.dur, c.line)
	}
	delete(a.callChecks, s)
}

func (a *analyzer) onOp(e *opEvent, line int) {
	a.coverage.Operations++
	end := satAdd(e.timestamp, e.duration)
	a.noteLatest(end, line)
	r, s := a.refsFor(e.spanID)
	r.note(refOperation, line)
	if s != nil && s.closed {
		if e.timestamp < s.start || end > s.end() {
			a.errorAt(line, CodeOperationOutsideSpan, fmt.Sprintf("operation `%s` [%d, %d] lies outside span `%s` [%d, %d]", e.opName, e.timestamp, end, s.id, s.start, s.end()))
		}
	}
	r.addOp(e.timestamp, end, line, e.duration)
	for _, in := range e.inputs {
		a.tensors[a.tensorHash(in)] = struct{}{}
	}
	if e.hasOutput {
		a.tensors[a.tensorHash(e.output)] = struct{}{}
	}
}

func (a *analyzer) onTensor(e *tensorEvent, line int) {
	a.coverage.Tensors++
	r, _ := a.refsFor(e.spanID)
	r.note(refTensor, line)
	a.tensors[a.tensorHash(e.tensorID)] = struct{}{}
}

func (a *analyzer) onTensorStats(e *tensorStatsEvent, line int) {
	if a.schemaPrev {
		a.stop(line, CodeTensorStatsOldSchema, fmt.Sprintf("trace schema %q does not define tensor_stats records; declare %q", PreviousSchema, Schema))
		return
	}
	if msg := tensorStatsProblem(e); msg != "" {
		a.stop(line, CodeInvalidTensorStats, "invalid tensor_stats record: "+msg)
		return
	}
	a.coverage.TensorStats++
	r, _ := a.refsFor(e.spanID)
	r.note(refTensorStats, line)
}

// tensorStatsProblem mirrors the invariants candle-graph's parser enforces.
func tensorStatsProblem(e *tensorStatsEvent) string {
	if strings.TrimSpace(string(e.label)) == "" {
		return "label must not be empty"
	}
	n := uint64(1)
	for _, d := range e.shape {
		if d != 0 && n > math.MaxUint64/d {
			return "element count of shape overflows u64"
		}
		n *= d
	}
	switch {
	case n != e.elements:
		return fmt.Sprintf("elements %d != product of shape %v (%d)", e.elements, e.shape, n)
	case e.nonFinite > e.elements:
		return fmt.Sprintf("non_finite %d exceeds elements %d", e.nonFinite, e.elements)
	case e.rms < 0:
		return "rms must be finite and >= 0"
	case e.absMax < 0:
		return "abs_max must be finite and >= 0"
	}
	return ""
}

func (a *analyzer) onMemory(e *memoryEvent, line int) {
	a.coverage.MemoryEvents++
	a.noteLatest(e.timestamp, line)
	r, s := a.refsFor(e.spanID)
	r.note(refMemory, line)
	if s != nil && s.closed && (e.timestamp < s.start || e.timestamp > s.end()) {
		a.errorAt(line, CodeMemoryOutsideSpan, fmt.Sprintf("memory event for storage `%s` at %d ns lies outside span `%s` [%d, %d]", e.storageID, e.timestamp, s.id, s.start, s.end()))
	}
	r.addMem(e.timestamp, line)
	a.mem.add(e, line)
}

func (a *analyzer) onDeviceMemory(e *deviceMemoryEvent, line int) {
	a.coverage.DeviceMemorySamples++
	a.noteLatest(e.timestamp, line)
	if !e.hasUsed && !e.hasFree && !e.hasReserved && !e.hasCapacity {
		a.errorAt(line, CodeEmptyDeviceMemorySample, fmt.Sprintf("device-memory sample for `%s` contains no measurements", e.device))
	}
}

func (a *analyzer) onDeviceInterval(e *deviceIntervalEvent, line int) {
	a.coverage.DeviceIntervals++
	r, _ := a.refsFor(e.spanID)
	r.note(refDeviceInterval, line)
	if e.duration == 0 {
		a.errorAt(line, CodeEmptyDeviceInterval, fmt.Sprintf("device interval for `%s` has zero duration", e.spanID))
	}
	if string(e.clockID) == HostClock {
		if end := satAdd(e.start, e.duration); end > a.hostMaxEnd || a.hostMaxLine == 0 {
			a.hostMaxEnd, a.hostMaxLine = end, line
		}
	}
}

func (a *analyzer) onEdge(e *edgeEvent, line int) {
	if !e.call {
		a.coverage.DataEdges++
		if len(e.from) == 0 || len(e.to) == 0 {
			a.errorAt(line, CodeEmptyDataEdgeEndpoint, "data-edge tensor ids cannot be empty")
			return
		}
		// Known tensors only ever grow, so an edge whose tensors are known
		// now is settled; only the others are kept (and copied).
		_, f := a.tensors[a.tensorHash(e.from)]
		_, t := a.tensors[a.tensorHash(e.to)]
		if f && t {
			return
		}
		a.dataEdges = append(a.dataEdges, pendingDataEdge{from: string(e.from), to: string(e.to), line: line})
		if len(a.dataEdges) >= max(a.edgeCheckAt, 4096) {
			a.resolveDataEdges(false)
			a.edgeCheckAt = 2 * len(a.dataEdges)
		}
		return
	}
	a.coverage.CallEdges++
	from, fromOK := a.spans[string(e.from)]
	to, toOK := a.spans[string(e.to)]
	if !fromOK || !toOK {
		a.callEdges = append(a.callEdges, pendingCallEdge{from: string(e.from), to: string(e.to), dur: e.hostDuration, line: line})
		return
	}
	a.checkCallEdge(from.id, to, e.hostDuration, line)
}

func (a *analyzer) checkCallEdge(from string, to *span, dur uint64, line int) {
	if !to.hasParent || to.parent != from {
		a.errorAt(line, CodeCallEdgeHierarchyMismatch, fmt.Sprintf("call edge `%s` -> `%s` does not match the span hierarchy", from, to.id))
	}
	if to.closed {
		a.checkCallDuration(from, to, dur, line)
	} else {
		a.callChecks[to] = append(a.callChecks[to], callCheck{from: from, dur: dur, line: line})
	}
}

func (a *analyzer) checkCallDuration(from string, to *span, dur uint64, line int) {
	if dur != to.dur {
		a.errorAt(line, CodeCallEdgeDurationMismatch, fmt.Sprintf("call edge `%s` -> `%s` reports %d ns but the span reports %d ns", from, to.id, dur, to.dur))
	}
}

// resolveDataEdges drops pending data edges whose tensors are known by now;
// at the end (final) the rest are errors. Edges usually follow the ops that
// name their tensors, so the pending list stays short.
func (a *analyzer) resolveDataEdges(final bool) {
	kept := a.dataEdges[:0]
	for _, e := range a.dataEdges {
		_, f := a.tensors[maphash.String(a.seed, e.from)]
		_, t := a.tensors[maphash.String(a.seed, e.to)]
		switch {
		case f && t:
		case final:
			a.errorAt(e.line, CodeUnknownDataEdgeTensor, fmt.Sprintf("data edge `%s` -> `%s` refers to unknown tensor evidence", e.from, e.to))
		default:
			kept = append(kept, e)
		}
	}
	a.dataEdges = kept
}

func (a *analyzer) finishCallEdges() {
	for _, e := range a.callEdges {
		to, toOK := a.spans[e.to]
		if _, fromOK := a.spans[e.from]; !fromOK || !toOK {
			a.errorAt(e.line, CodeUnknownCallEdgeSpan, fmt.Sprintf("call edge `%s` -> `%s` refers to a missing span", e.from, e.to))
			continue
		}
		a.checkCallEdge(e.from, to, e.dur, e.line)
	}
	a.callEdges = nil
	a.callChecks = nil // spans still open: candle-graph checks closed ones only
}
