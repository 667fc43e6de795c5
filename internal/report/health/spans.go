package health

import (
	"fmt"

	"github.com/candle-trace/candle-trace/internal/report/trace"
)

// span is the compact per-span state the analysis keeps: everything else in
// a trace is folded into it or into bounded summaries as it streams by.
type Span struct {
	ID, Parent, Name string
	Start, Dur       uint64
	line, endLine    int32
	spanKind         int8
	step             int8
	HasParent        bool
	Measured         bool
	Closed           bool

	refs spanRefs

	// cycle walk state: 0 unvisited, 1 on the current walk, 2 clean, 3 reaches a cycle.
	walk int8
}

func (s *Span) End() uint64 { return trace.SatAdd(s.Start, s.Dur) }

// opTime is the host op time recorded directly in this span.
func (s *Span) OpTime() uint64 { return s.refs.opTotal }

// spanRefs folds the evidence that names a span: counts per evidence kind,
// and the earliest start / latest end of its operations and memory events,
// which is all "lies outside its span" needs once the span's bounds are
// known. It is kept for spans not seen yet as well, keyed by the missing id.
type spanRefs struct {
	firstLine [numRefKinds]int32
	count     [numRefKinds]int32

	opMin, opMax         uint64
	opMinLine, opMaxLine int32
	hasOps               bool
	opCount              uint32 // for graph node ids `<span>/op/<n>`
	opTotal              uint64 // report: host op time inside this span

	memMin, memMax         uint64
	memMinLine, memMaxLine int32
	hasMem                 bool
}

type refKind uint8

const (
	refOperation refKind = iota
	refTensor
	refTensorStats
	refMemory
	refDeviceInterval
	numRefKinds
)

var refKindNames = [numRefKinds]string{"operation", "tensor", "tensor stats", "memory", "device interval"}

func (r *spanRefs) note(k refKind, line int) {
	if r.count[k] == 0 {
		r.firstLine[k] = int32(line)
	}
	r.count[k]++
}

func (r *spanRefs) addOp(start, end uint64, line int, dur uint64) {
	if !r.hasOps || start < r.opMin {
		r.opMin, r.opMinLine = start, int32(line)
	}
	if !r.hasOps || end > r.opMax {
		r.opMax, r.opMaxLine = end, int32(line)
	}
	r.hasOps = true
	r.opCount++
	r.opTotal = trace.SatAdd(r.opTotal, dur)
}

func (r *spanRefs) addMem(ts uint64, line int) {
	if !r.hasMem || ts < r.memMin {
		r.memMin, r.memMinLine = ts, int32(line)
	}
	if !r.hasMem || ts > r.memMax {
		r.memMax, r.memMaxLine = ts, int32(line)
	}
	r.hasMem = true
}

// merge folds evidence recorded before the span started into its state.
func (r *spanRefs) merge(o *spanRefs) {
	for k := range r.count {
		if o.count[k] > 0 && (r.count[k] == 0 || o.firstLine[k] < r.firstLine[k]) {
			r.firstLine[k] = o.firstLine[k]
		}
		r.count[k] += o.count[k]
	}
	if o.hasOps {
		if !r.hasOps || o.opMin < r.opMin {
			r.opMin, r.opMinLine = o.opMin, o.opMinLine
		}
		if !r.hasOps || o.opMax > r.opMax {
			r.opMax, r.opMaxLine = o.opMax, o.opMaxLine
		}
		r.hasOps = true
	}
	r.opCount += o.opCount
	r.opTotal = trace.SatAdd(r.opTotal, o.opTotal)
	if o.hasMem {
		if !r.hasMem || o.memMin < r.memMin {
			r.memMin, r.memMinLine = o.memMin, o.memMinLine
		}
		if !r.hasMem || o.memMax > r.memMax {
			r.memMax, r.memMaxLine = o.memMax, o.memMaxLine
		}
		r.hasMem = true
	}
}

// checkBounds reports operations and memory events outside a closed span.
// Called when the span closes; evidence arriving later is checked at once.
func (a *Checker) checkBounds(s *Span) {
	r := &s.refs
	end := s.End()
	if r.hasOps {
		if r.opMin < s.Start {
			a.errorAt(int(r.opMinLine), trace.CodeOperationOutsideSpan, fmt.Sprintf("operation starting at %d ns lies before span `%s` (starts %d ns)", r.opMin, s.ID, s.Start))
		}
		if r.opMax > end {
			a.errorAt(int(r.opMaxLine), trace.CodeOperationOutsideSpan, fmt.Sprintf("operation ending at %d ns lies after span `%s` (ends %d ns)", r.opMax, s.ID, end))
		}
	}
	if r.hasMem {
		if r.memMin < s.Start {
			a.errorAt(int(r.memMinLine), trace.CodeMemoryOutsideSpan, fmt.Sprintf("memory event at %d ns lies before span `%s` (starts %d ns)", r.memMin, s.ID, s.Start))
		}
		if r.memMax > end {
			a.errorAt(int(r.memMaxLine), trace.CodeMemoryOutsideSpan, fmt.Sprintf("memory event at %d ns lies after span `%s` (ends %d ns)", r.memMax, s.ID, end))
		}
	}
}

// refsFor returns the evidence fold for a span id, known or not yet known.
func (a *Checker) refsFor(id []byte) (*spanRefs, *Span) {
	if s, ok := a.SpanByID[string(id)]; ok {
		return &s.refs, s
	}
	r, ok := a.pending[string(id)]
	if !ok {
		r = &spanRefs{}
		a.pending[string(id)] = r
	}
	return r, nil
}

// finishSpans runs the checks that need the whole span set.
func (a *Checker) finishSpans(failed bool) {
	roots, measured := 0, 0
	for _, s := range a.Spans {
		if !s.HasParent {
			roots++
		}
		if s.Measured {
			measured++
		}
	}
	if roots != 1 {
		a.errorAt(0, trace.CodeRootCount, fmt.Sprintf("expected exactly one root span, found %d", roots))
	}
	if measured != 1 && !failed {
		a.errorAt(0, trace.CodeMeasurementCount, fmt.Sprintf("expected exactly one measured region, found %d", measured))
	}
	a.coverage.RootSpans, a.coverage.MeasuredSpans = roots, measured

	for _, s := range a.Spans {
		if !s.Closed {
			if failed {
				a.warnAt(int(s.line), trace.CodeOpenSpan, fmt.Sprintf("span `%s` was interrupted", s.ID))
			} else {
				a.errorAt(int(s.line), trace.CodeOpenSpan, fmt.Sprintf("span `%s` was not closed", s.ID))
			}
		}
		if s.HasParent {
			p, ok := a.SpanByID[s.Parent]
			switch {
			case !ok:
				a.errorAt(int(s.line), trace.CodeUnknownParent, fmt.Sprintf("span `%s` refers to missing parent `%s`", s.ID, s.Parent))
			case s.Closed && p.Closed:
				if s.Start < p.Start || s.End() > p.End() {
					a.errorAt(int(s.line), trace.CodeChildOutsideParent, fmt.Sprintf("span `%s` [%d, %d] lies outside parent `%s` [%d, %d]", s.ID, s.Start, s.End(), s.Parent, p.Start, p.End()))
				}
			}
		}
	}
	a.findCycles()

	for id, r := range a.pending {
		for k := refKind(0); k < numRefKinds; k++ {
			if r.count[k] > 0 {
				a.issues = append(a.issues, trace.Issue{Severity: trace.SeverityError, Code: trace.CodeUnknownSpan, Line: int(r.firstLine[k]), Count: int(r.count[k]),
					Message: fmt.Sprintf("%s evidence refers to missing span `%s`", refKindNames[k], id)})
			}
		}
	}
}

// findCycles flags every span whose parent chain runs into a cycle, as
// candle-graph's per-span walk does, in linear time.
func (a *Checker) findCycles() {
	var path []*Span
	for _, s := range a.Spans {
		path = path[:0]
		cur := s
		result := int8(2)
		for cur != nil && cur.walk == 0 {
			cur.walk = 1
			path = append(path, cur)
			if !cur.HasParent {
				cur = nil
				break
			}
			cur = a.SpanByID[cur.Parent]
		}
		if cur != nil && (cur.walk == 1 || cur.walk == 3) {
			result = 3
		}
		for _, p := range path {
			p.walk = result
			if result == 3 {
				a.errorAt(int(p.line), trace.CodeSpanCycle, fmt.Sprintf("span `%s` participates in a parent cycle", p.ID))
			}
		}
	}
}
