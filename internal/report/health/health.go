package health

import (
	"fmt"
	"sort"

	"github.com/candle-trace/candle-trace/internal/traceformat"

	"github.com/candle-trace/candle-trace/internal/report/trace"
)

// Health is the verdict on one trace: candle-graph's TraceHealth plus what a
// streaming reader knows about a trace that ends early.
type Health struct {
	// StructurallyValid: no issue of severity error.
	StructurallyValid bool `json:"structurally_valid"`
	// CaptureComplete: a terminal record with outcome complete was read.
	CaptureComplete bool `json:"capture_complete"`
	// Outcome of the terminal record: "complete", "failed", or "" if none.
	Outcome string `json:"outcome"`
	// Incomplete: no terminal record; the trace was read to its end or to
	// CutLine, a last line cut short by the writer's death.
	Incomplete bool `json:"incomplete"`
	CutLine    int  `json:"cut_line,omitempty"`
	// Parsed: candle-graph would accept the file as a document (no parse
	// issue and a terminal record).
	Parsed   bool          `json:"parsed"`
	Issues   []trace.Issue `json:"issues"`
	Coverage Coverage      `json:"coverage"`
	Lines    int           `json:"lines"`
	Bytes    int64         `json:"bytes"`
}

// OK is the verdict of `validate`: structurally valid and complete, or with
// allowPartial only structurally valid (a cut, unterminated or failed
// capture passes).
func (h *Health) OK(allowPartial bool) bool {
	if !h.StructurallyValid {
		return false
	}
	return allowPartial || h.CaptureComplete
}

// Codes returns the distinct issue codes, sorted.
func (h *Health) Codes() []string {
	seen := map[string]bool{}
	var out []string
	for _, i := range h.Issues {
		if !seen[i.Code] {
			seen[i.Code] = true
			out = append(out, i.Code)
		}
	}
	sort.Strings(out)
	return out
}

// Coverage counts the evidence read, as candle-graph's EvidenceCoverage.
type Coverage struct {
	Spans               int `json:"spans"`
	ClosedSpans         int `json:"closed_spans"`
	RootSpans           int `json:"root_spans"`
	MeasuredSpans       int `json:"measured_spans"`
	Operations          int `json:"operations"`
	Tensors             int `json:"tensors"`
	TensorStats         int `json:"tensor_stats"`
	MemoryEvents        int `json:"memory_events"`
	DeviceMemorySamples int `json:"device_memory_samples"`
	DeviceIntervals     int `json:"device_intervals"`
	Gradients           int `json:"gradients"`
	CallEdges           int `json:"call_edges"`
	DataEdges           int `json:"data_edges"`
	ForwardSpans        int `json:"forward_spans"`
	BackwardSpans       int `json:"backward_spans"`
	OptimizerSpans      int `json:"optimizer_spans"`
}

// finish runs the checks that need the whole trace, in candle-graph's
// order, and returns the verdict. lt is the memory lifetime analysis.
func (a *Checker) finish(lt *Lifetimes) Health {
	h := Health{}
	if a.Meta == nil && !a.Fatal {
		a.stop(0, trace.CodeMissingMeta, "the trace has no records; a trace must start with a meta record")
	}
	if a.Fatal {
		return a.verdict(h)
	}
	t := a.Terminal
	failed := t == nil || t.outcome == trace.OutcomeFailed
	if t != nil {
		h.Outcome = traceformat.Outcomes[t.outcome]
	}

	if msg := provenanceProblem(a.Meta); msg != "" {
		a.errorAt(1, trace.CodeRunProvenanceInvalid, msg)
	}
	latest, latestLine := a.latest, a.latestLine
	for _, s := range a.Spans {
		end, line := s.Start, s.line
		if s.Closed {
			end, line = s.End(), s.endLine
		}
		if end > latest {
			latest, latestLine = end, int(line)
		}
	}
	if t != nil {
		switch {
		case t.outcome == trace.OutcomeComplete && t.hasReason:
			a.issues = append(a.issues, trace.Issue{Severity: trace.SeverityError, Code: trace.CodeCompleteWithReason, Line: t.line, Parse: true,
				Message: "complete terminal outcome cannot contain a failure reason"})
		case t.outcome == trace.OutcomeFailed && len(trace.TrimSpace([]byte(t.reason))) == 0:
			a.issues = append(a.issues, trace.Issue{Severity: trace.SeverityError, Code: trace.CodeFailedWithoutReason, Line: t.line, Parse: true,
				Message: "failed terminal outcome requires a non-empty reason"})
		}
		if t.timestamp < latest {
			a.issues = append(a.issues, trace.Issue{Severity: trace.SeverityError, Code: trace.CodeTerminalPrecedesEvidence, Line: t.line, Parse: true,
				Message: fmt.Sprintf("terminal timestamp %d precedes host evidence ending at %d (line %d)", t.timestamp, latest, latestLine)})
		}
		if t.outcome == trace.OutcomeFailed {
			reason := t.reason
			if reason == "" {
				reason = "capture ended with a failed outcome"
			}
			a.warnAt(t.line, trace.CodeCaptureFailed, reason)
		}
		if a.hostMaxLine > 0 && a.hostMaxEnd > t.timestamp {
			a.warnAt(a.hostMaxLine, trace.CodeDeviceIntervalOutsideSession, fmt.Sprintf("host-clock device interval ends at %d ns, after the terminal at %d ns", a.hostMaxEnd, t.timestamp))
		}
	} else {
		msg := "no terminal record: the writer stopped before finishing; read to the end"
		if a.cutLine > 0 {
			msg = fmt.Sprintf("no terminal record and line %d is cut short: the writer stopped mid-record; read to the cut", a.cutLine)
		}
		a.warnAt(a.cutLine, trace.CodeTraceIncomplete, msg)
	}

	a.finishSpans(failed)
	a.finishCallEdges()
	a.resolveDataEdges(true)
	a.issues = append(a.issues, lt.issues...)
	if len(lt.Live) > 0 {
		a.warnAt(0, trace.CodeRetainedAllocations, fmt.Sprintf("%d storages remained live at capture end", len(lt.Live)))
	}
	a.Gradients.finish(a, failed)

	cv := &a.coverage
	cv.Spans = len(a.Spans)
	for _, s := range a.Spans {
		if s.Closed {
			cv.ClosedSpans++
		}
	}
	cv.ForwardSpans, cv.BackwardSpans, cv.OptimizerSpans = a.stepCounts[trace.StepForward], a.stepCounts[trace.StepBackward], a.stepCounts[trace.StepOptimizer]
	a.checkAbsent()
	a.checkLabels(failed)
	a.checkGraphIDs()

	h.Incomplete = t == nil
	h.CutLine = a.cutLine
	h.CaptureComplete = t != nil && t.outcome == trace.OutcomeComplete
	return a.verdict(h)
}

func (a *Checker) verdict(h Health) Health {
	h.StructurallyValid = true
	h.Parsed = a.Terminal != nil
	for _, i := range a.issues {
		if i.Severity == trace.SeverityError {
			h.StructurallyValid = false
		}
		if i.Parse {
			h.Parsed = false
		}
	}
	if a.Fatal {
		h.CaptureComplete = false
	}
	// Errors first, then warnings; within each, by line (whole-trace issues first).
	sort.SliceStable(a.issues, func(i, j int) bool {
		x, y := a.issues[i], a.issues[j]
		if x.Severity != y.Severity {
			return x.Severity == trace.SeverityError
		}
		return x.Line < y.Line
	})
	h.Issues = a.issues
	if h.Issues == nil {
		h.Issues = []trace.Issue{}
	}
	h.Coverage = a.coverage
	return h
}
