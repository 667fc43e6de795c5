package runner

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/candle-trace/candle-trace/internal/report"
)

// Files is what a path pattern matches now (%p and %r as wildcards), with
// each file's modification time and size.
type Files map[string]fileState

type fileState struct {
	mod  time.Time
	size int64
}

// Snapshot lists the files pattern matches.
func Snapshot(pattern string) Files {
	glob := strings.NewReplacer("%p", "*", "%r", "*", "%%", "%").Replace(pattern)
	matches, _ := filepath.Glob(glob)
	out := Files{}
	for _, m := range matches {
		if st, err := os.Stat(m); err == nil && st.Mode().IsRegular() {
			out[m] = fileState{st.ModTime(), st.Size()}
		}
	}
	return out
}

// Written lists, sorted, the files pattern matches that are new or changed
// since before: an earlier run's traces under the same pattern are not this
// run's. (A comparison of times with the start would not do: file times
// come from a coarse clock, a few milliseconds behind time.Now.)
func Written(pattern string, before Files) []string {
	var out []string
	for p, st := range Snapshot(pattern) {
		if old, ok := before[p]; !ok || old != st {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// Verdict is the one line said about a trace at the end of a run: where it
// is, whether candle-graph would accept it (valid, complete), and the
// measured region with the span that took the most of it.
func Verdict(path string) string {
	res, err := report.AnalyzeFile(path, report.Options{Report: true})
	if err != nil {
		return fmt.Sprintf("%s: unreadable (%v)", path, err)
	}
	h := &res.Health
	var b strings.Builder
	fmt.Fprintf(&b, "%s: ", path)
	if !h.StructurallyValid {
		b.WriteString("INVALID")
		if e := firstIssue(h, report.SeverityError, ""); e != nil {
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
		fmt.Fprintf(&b, "; %s %s", region.Name, report.FormatNS(float64(region.DurationNS)))
		if top := topSpan(r); top != nil {
			fmt.Fprintf(&b, ", top span %s (%s self", top.Name, report.FormatNS(float64(top.SelfNS)))
			if region.DurationNS > 0 {
				fmt.Fprintf(&b, ", %s", report.FormatShare(float64(top.SelfNS)/float64(region.DurationNS)))
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

func firstIssue(h *report.Health, sev report.Severity, code string) *report.Issue {
	for i := range h.Issues {
		if (sev == "" || h.Issues[i].Severity == sev) && (code == "" || h.Issues[i].Code == code) {
			return &h.Issues[i]
		}
	}
	return nil
}

// topSpan is the span name with the most self time inside the measured
// region: neither the region itself nor a span around it.
func topSpan(r *report.Report) *report.NameStats {
	var top *report.NameStats
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

// Patterns are the path patterns a run's files may match, absolute: the
// traces, a torchrun rank's traces (.rank%r before the extension, added by
// candle_trace/torch/_run.py when the pattern has no %r) and the summary.
func Patterns(o *Options, python bool) []string {
	out := []string{o.Output}
	if python && !strings.Contains(o.Output, "%r") {
		out = append(out, rankPattern(o.Output))
	}
	if o.Aggregate != "" {
		out = append(out, o.Aggregate)
	}
	return out
}

// SnapshotAll is Snapshot of each pattern, in one set.
func SnapshotAll(patterns []string) Files {
	out := Files{}
	for _, p := range patterns {
		for k, v := range Snapshot(p) {
			out[k] = v
		}
	}
	return out
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

// rankPattern is what a torchrun rank writes under a pattern without %r:
// .rank%r before the extension.
func rankPattern(p string) string {
	ext := filepath.Ext(p)
	return strings.TrimSuffix(p, ext) + ".rank%r" + ext
}

// union is a and b sorted, each name once (a rank's file can match both
// patterns).
func union(a, b []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range append(a, b...) {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}

func relative(base, p string) string {
	if r, err := filepath.Rel(base, p); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return p
}
