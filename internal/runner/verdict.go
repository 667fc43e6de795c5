package runner

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
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
	nonFinite := onlyNonFiniteGradients(h)
	if !h.StructurallyValid && nonFinite == 0 {
		b.WriteString("INVALID")
		if e := firstIssue(h, trace.SeverityError, ""); e != nil {
			fmt.Fprintf(&b, " (%s: %s)", e.Code, e.Message)
		}
		return b.String()
	}
	switch {
	case nonFinite > 0:
		// The update's own numbers, not a broken trace; candle-graph counts them
		// as errors all the same, so --require-valid refuses it.
		outcome, families := "complete", "families"
		if !h.CaptureComplete {
			outcome = "FAILED"
		}
		if nonFinite == 1 {
			families = "family"
		}
		first := firstIssue(h, trace.SeverityError, trace.CodeGradientFamilyNonFinite)
		fmt.Fprintf(&b, "well-formed, %s, NON-FINITE GRADIENTS in %d %s (%s: %s)",
			outcome, nonFinite, families, first.Code, first.Message)
		if f := firstIssue(h, "", "capture_failed"); f != nil && !h.CaptureComplete {
			fmt.Fprintf(&b, " (%s)", f.Message)
		}
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
		top := topSpan(r)
		if top != nil {
			fmt.Fprintf(&b, ", top span %s (%s self", top.Name, text.FormatNS(float64(top.SelfNS)))
			if region.DurationNS > 0 {
				fmt.Fprintf(&b, ", %s", text.FormatShare(float64(top.SelfNS)/float64(region.DurationNS)))
			}
			b.WriteString(")")
		}
		// Time in no span at all (a data step, a sleep, an I/O) that outweighs every
		// span: the first thing to know of a slow update.
		if own := regionSelf(r); own > 0 && region.DurationNS > 0 && (top == nil || own > top.SelfNS) {
			fmt.Fprintf(&b, ", %s (%s) in no span below it", text.FormatNS(float64(own)),
				text.FormatShare(float64(own)/float64(region.DurationNS)))
		}
		var ops uint64
		for _, o := range r.Ops {
			ops += o.Count
		}
		fmt.Fprintf(&b, "; %d ops, %d gradients", ops, r.Gradients.Total)
	}
	return b.String()
}

// onlyNonFiniteGradients is how many gradient families hold non-finite
// gradients when those are the trace's only errors (0 otherwise): a trace
// of the update whose gradients went NaN, whatever else is right. An
// active family left below its minimum by them (its NaN gradients are not
// present ones) is the same finding.
func onlyNonFiniteGradients(h *health.Health) int {
	nonFinite := map[string]bool{}
	for _, is := range h.Issues {
		if is.Severity == trace.SeverityError && is.Code == trace.CodeGradientFamilyNonFinite {
			nonFinite[quotedFamily(is.Message)] = true
		}
	}
	for _, is := range h.Issues {
		if is.Severity != trace.SeverityError || is.Code == trace.CodeGradientFamilyNonFinite {
			continue
		}
		if is.Code != trace.CodeGradientActiveBelowMinimum || !nonFinite[quotedFamily(is.Message)] {
			return 0
		}
	}
	return len(nonFinite)
}

// quotedFamily is the family a gradient family issue names: its message's
// first Go-quoted string (internal/report/health's %q).
func quotedFamily(msg string) string {
	i := strings.IndexByte(msg, '"')
	if i < 0 {
		return ""
	}
	q, err := strconv.QuotedPrefix(msg[i:])
	if err != nil {
		return ""
	}
	f, _ := strconv.Unquote(q)
	return f
}

func firstIssue(h *health.Health, sev trace.Severity, code string) *trace.Issue {
	for i := range h.Issues {
		if (sev == "" || h.Issues[i].Severity == sev) && (code == "" || h.Issues[i].Code == code) {
			return &h.Issues[i]
		}
	}
	return nil
}

// regionSelf is the measured region's own time: in none of its spans.
func regionSelf(r *analysis.Report) uint64 {
	for i := range r.Spans {
		if s := &r.Spans[i]; s.Name == r.MeasuredRegion.Name && s.Count == 1 {
			return s.SelfNS
		}
	}
	return 0
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
	var traces []string
	switch {
	case o.Watch != "":
		traces = Written(WatchPattern(o.Watch), before)
	case python && !strings.Contains(o.Output, "%r"):
		traces = union(Written(o.Output, before), Written(rankPattern(o.Output), before))
	default:
		traces = Written(o.Output, before)
	}
	cwd, _ := os.Getwd()
	for _, t := range traces {
		fmt.Fprintf(w, "candle-trace: trace %s\n", Verdict(relative(cwd, t)))
	}
	if len(traces) == 0 {
		where, why := o.Output, "no process matched --match"
		switch {
		case o.Watch != "":
			where = relative(cwd, o.Watch)
			why = "no trigger fired (a watched run keeps only the updates that go wrong), " +
				"or the program ran no torch training loop (no optimizer step, no backward)"
		case python:
			why = "the program stepped no torch optimizer, ran no backward and called no torch module " +
				"(or never imported torch)"
		}
		fmt.Fprintf(w, "candle-trace: no trace written to %s: %s\n", where, why)
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
