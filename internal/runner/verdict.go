package runner

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/candle-trace/candle-trace/internal/report/analysis"
	"github.com/candle-trace/candle-trace/internal/report/health"
	"github.com/candle-trace/candle-trace/internal/report/text"
	"github.com/candle-trace/candle-trace/internal/report/trace"
)

// Verdict is the one line said about a trace at the end of a run: where it
// is, whether candle-graph would accept it (valid, complete), and the
// measured region with the span that took the most of it.
func Verdict(path string) string {
	res, err := analysis.AnalyzeFile(path, analysis.Options{Report: true})
	if err != nil {
		return fmt.Sprintf("%s: unreadable (%v)", path, err)
	}
	h := &res.Health
	var b strings.Builder
	fmt.Fprintf(&b, "%s: ", path)
	if !h.StructurallyValid {
		b.WriteString("INVALID")
		if e := firstIssue(h, trace.SeverityError, ""); e != nil {
			fmt.Fprintf(&b, " (%s: %s)", e.Code, e.Message)
		}
		return b.String()
	}
	switch {
	case h.CaptureComplete:
		b.WriteString("valid, complete")
	case h.Outcome == "failed":
		b.WriteString("valid, FAILED")
		if f := firstIssue(h, "", "capture_failed"); f != nil {
			fmt.Fprintf(&b, " (%s)", f.Message)
		}
	default:
		b.WriteString("valid, INCOMPLETE (no terminal record)")
	}
	if r := res.Report; r != nil && r.MeasuredRegion != nil && r.MeasuredRegion.Closed {
		region := r.MeasuredRegion
		fmt.Fprintf(&b, "; %s %s", region.Name, text.FormatNS(float64(region.DurationNS)))
		if top := topSpan(r); top != nil {
			fmt.Fprintf(&b, ", top span %s (%s self", top.Name, text.FormatNS(float64(top.SelfNS)))
			if region.DurationNS > 0 {
				fmt.Fprintf(&b, ", %s", text.FormatShare(float64(top.SelfNS)/float64(region.DurationNS)))
			}
			b.WriteString(")")
		}
		var ops uint64
		for _, o := range r.Ops {
			ops += o.Count
		}
		fmt.Fprintf(&b, "; %d ops, %d gradients", ops, r.Gradients.Total)
	}
	return b.String()
}

func firstIssue(h *health.Health, sev trace.Severity, code string) *trace.Issue {
	for i := range h.Issues {
		if (sev == "" || h.Issues[i].Severity == sev) && (code == "" || h.Issues[i].Code == code) {
			return &h.Issues[i]
		}
	}
	return nil
}

// topSpan is the span name with the most self time inside the measured
// region: neither the region itself nor a span around it.
func topSpan(r *analysis.Report) *analysis.NameStats {
	var top *analysis.NameStats
	for i := range r.Spans {
		s := &r.Spans[i]
		if s.Encloses || s.Name == r.MeasuredRegion.Name {
			continue
		}
		if top == nil || s.SelfNS > top.SelfNS {
			top = s
		}
	}
	return top
}

// Summarize writes the end-of-run lines: a verdict per trace written, the
// summaries written, or why there is none.
func Summarize(w io.Writer, o *Options, python bool, before Files) {
	traces := Written(o.Output, before)
	if python && !strings.Contains(o.Output, "%r") {
		traces = union(traces, Written(rankPattern(o.Output), before))
	}
	cwd, _ := os.Getwd()
	for _, t := range traces {
		fmt.Fprintf(w, "candle-trace: trace %s\n", Verdict(relative(cwd, t)))
	}
	if len(traces) == 0 {
		why := "no process matched --match"
		if python {
			why = "the program stepped no torch optimizer and called no torch module (or never imported torch)"
		}
		fmt.Fprintf(w, "candle-trace: no trace written to %s: %s\n", o.Output, why)
	}
	if o.Aggregate != "" {
		for _, a := range Written(o.Aggregate, before) {
			fmt.Fprintf(w, "candle-trace: whole-run summary %s (candle-trace report %s)\n",
				relative(cwd, a), relative(cwd, a))
		}
	}
}

func relative(base, p string) string {
	if r, err := filepath.Rel(base, p); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return p
}
