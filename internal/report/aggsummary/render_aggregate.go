package aggsummary

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/candle-trace/candle-trace/internal/report/text"

	"github.com/candle-trace/candle-trace/internal/aggregate"
)

func aggregateName(name, step string) string {
	if step == "" {
		return name
	}
	return name + " [" + step + "]"
}

func formatUnixNS(ns uint64) string {
	return time.Unix(0, int64(ns)).UTC().Format("2006-01-02T15:04:05.000Z")
}

// WriteAggregateReport writes the human report of a summary.
func WriteAggregateReport(w io.Writer, r *AggregateReport) {
	state := "written while running (sequence " + strconv.FormatUint(r.Sequence, 10) + ")"
	if r.Final {
		state = "final (sequence " + strconv.FormatUint(r.Sequence, 10) + ")"
	}
	fmt.Fprintf(w, "Summary %s: %s, %s\n", r.Path, r.Schema, state)
	fmt.Fprintf(w, "Run: %s, phase %s, device %s", r.Run.Entrypoint, r.Run.Phase, r.Run.Device)
	if r.Run.CorrelationID != "" {
		fmt.Fprintf(w, ", correlation %s", r.Run.CorrelationID)
	}
	if r.Run.Binding != "" {
		fmt.Fprintf(w, ", binding %s", r.Run.Binding)
	}
	fmt.Fprintln(w)
	if len(r.Run.Tags) > 0 {
		fmt.Fprintf(w, "  tags: %s\n", text.SortedPairs(r.Run.Tags))
	}
	fmt.Fprintf(w, "Window: %s, from %s; enabled %s in %d period(s)", text.FormatNS(float64(r.Window.DurationNS)),
		formatUnixNS(r.Window.StartUnixNS), text.FormatNS(float64(r.Enabled.EnabledNS)), r.Enabled.Periods)
	if r.Enabled.Now {
		fmt.Fprint(w, ", enabled at the end")
	} else {
		fmt.Fprint(w, ", disabled at the end")
	}
	fmt.Fprintln(w)
	o, d := r.Overflow, r.Dropped
	if o.KeysRefused > 0 || o.ScalarsRefused > 0 {
		fmt.Fprintf(w, "! overflow: %d span name(s) beyond the cap of %d and %d scalar label(s) beyond %d are counted under %s\n",
			o.KeysRefused, o.MaxKeys, o.ScalarsRefused, o.MaxScalars, aggregate.OverflowName)
	}
	if d.InvalidKey > 0 || d.Producer > 0 {
		fmt.Fprintf(w, "! dropped: %d observation(s) with an invalid key, %d dropped by the producer\n", d.InvalidKey, d.Producer)
	}

	text.Section(w, "Spans by total time (share of the categorized time; percentiles within 3.1%)")
	writeAggregateRows(w, r.Spans)
	writeFirings(w, r.Fired, r.FiredRefused)
	writeTriggers(w, r.Triggers)
	writeScalars(w, r.Scalars)
	writeAggregateAnalysis(w, &r.Analysis)
}

func writeAggregateRows(w io.Writer, rows []AggregateRow) {
	if len(rows) == 0 {
		fmt.Fprintln(w, "  (none)")
		return
	}
	width := len("NAME")
	for _, r := range rows {
		width = max(width, len(aggregateName(r.Name, r.Step)))
	}
	t := text.Table(w)
	fmt.Fprintf(t, "%-*s\tCATEGORY\tCOUNT\tTOTAL\tMEAN\tP50\tP95\tP99\tMAX\tSHARE\t\n", width, "NAME")
	for _, r := range rows {
		share := text.FormatShare(r.Share)
		if r.Category == CategoryIgnore {
			share = "-"
		}
		fmt.Fprintf(t, "%-*s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", width, aggregateName(r.Name, r.Step), r.Category, r.Count,
			text.FormatNS(float64(r.TotalNS)), text.FormatNS(r.MeanNS), text.FormatNS(float64(r.P50NS)), text.FormatNS(float64(r.P95NS)),
			text.FormatNS(float64(r.P99NS)), text.FormatNS(float64(r.MaxNS)), share)
	}
	t.Flush()
}

// writeFirings lists each trigger that fired: the update, the trigger, its
// value against its threshold, its own line, and the trace written for it
// or why none was. A summary without the block has no section.
func writeFirings(w io.Writer, rows []Firing, refused uint64) {
	if len(rows) == 0 && refused == 0 {
		return
	}
	more := ""
	if refused > 0 {
		more = fmt.Sprintf("; %d more fired past the summary's cap, not listed", refused)
	}
	text.Section(w, fmt.Sprintf("Triggers fired (%d listed%s):", len(rows), more))
	for _, f := range rows {
		line := fmt.Sprintf("  update %d  %s  %s", f.Update, f.Trigger, f.Shown)
		if f.Detail != "" {
			line += "  " + f.Detail
		}
		if f.Trace != "" {
			line += "  -> " + f.Trace
		} else {
			line += "  (no trace: " + f.NoTrace + ")"
		}
		fmt.Fprintln(w, line)
	}
}

// FiringValue is a firing's value against its threshold, as a reader
// wants it: a slow update's seconds as a duration, a non-finite value by
// name, "-" for an exception (nothing is measured).
func FiringValue(f aggregate.Firing) string {
	v := float64(f.Value)
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "Infinity"
	case math.IsInf(v, -1):
		return "-Infinity"
	case f.Trigger == "exception" && v == 0 && f.Threshold == 0:
		return "-"
	}
	format := func(x float64) string { return fmt.Sprintf("%.6g", x) }
	if f.Trigger == "slow" {
		format = func(x float64) string { return text.FormatNS(x * 1e9) }
	}
	if f.Threshold == 0 {
		return format(v)
	}
	return format(v) + " > " + format(f.Threshold)
}

// writeTriggers lists the triggers that fired; a run without any (or
// without a watch) has no section.
func writeTriggers(w io.Writer, rows []Trigger) {
	if len(rows) == 0 {
		return
	}
	text.Section(w, "Triggers that fired (the watch's "+TriggerPrefix+"<name> scalars: the value each trigger measured)")
	width := len("TRIGGER")
	for _, tr := range rows {
		width = max(width, len(tr.Name))
	}
	t := text.Table(w)
	fmt.Fprintf(t, "%-*s\tFIRED\tMEAN\tMIN\tMAX\tLAST\tNON-FINITE\t\n", width, "TRIGGER")
	for _, tr := range rows {
		mean, lo, hi, last := "-", "-", "-", "-"
		if tr.Values {
			mean, lo, hi, last = fmt.Sprintf("%.6g", tr.Mean), fmt.Sprintf("%.6g", tr.Min), fmt.Sprintf("%.6g", tr.Max), fmt.Sprintf("%.6g", tr.Last)
		}
		nf := "0"
		if tr.NonFinite > 0 {
			nf = fmt.Sprintf("! %d", tr.NonFinite)
		}
		fmt.Fprintf(t, "%-*s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", width, tr.Name, tr.Fired, mean, lo, hi, last, nf)
	}
	t.Flush()
}

func writeScalars(w io.Writer, rows []aggregate.ScalarStats) {
	text.Section(w, "Scalars")
	if len(rows) == 0 {
		fmt.Fprintln(w, "  (none)")
		return
	}
	width := len("LABEL")
	for _, s := range rows {
		width = max(width, len(s.Label))
	}
	t := text.Table(w)
	fmt.Fprintf(t, "%-*s\tCOUNT\tMEAN\tMIN\tMAX\tLAST\tNON-FINITE\t\n", width, "LABEL")
	for _, s := range rows {
		nf := "0"
		if s.NonFinite > 0 {
			nf = fmt.Sprintf("! %d", s.NonFinite)
		}
		fmt.Fprintf(t, "%-*s\t%d\t%.6g\t%.6g\t%.6g\t%.6g\t%s\t\n", width, s.Label, s.Count, s.Mean, s.Min, s.Max, s.Last, nf)
	}
	t.Flush()
}

func writeAggregateAnalysis(w io.Writer, a *AggregateAnalysis) {
	text.Section(w, "Overhead analysis")
	fmt.Fprintf(w, "  hypothesis: %s\n", a.Hypothesis)
	if a.CategorizedNS > 0 {
		fmt.Fprintf(w, "  numbers:    categorized %s: compute %s = %s, overhead %s = %s", text.FormatNS(float64(a.CategorizedNS)),
			text.FormatNS(float64(a.ComputeNS)), text.FormatShare(a.ComputeShare), text.FormatNS(float64(a.OverheadNS)), text.FormatShare(a.OverheadShare))
		if a.IgnoredNS > 0 {
			fmt.Fprintf(w, " (%s ignored)", text.FormatNS(float64(a.IgnoredNS)))
		}
		fmt.Fprintln(w)
		for _, c := range a.Categories {
			fmt.Fprintf(w, "    %-10s %12s  %6s  (%d span name(s))\n", c.Category, text.FormatNS(float64(c.TotalNS)), text.FormatShare(c.Share), c.Spans)
		}
	}
	fmt.Fprintf(w, "  threshold:  compute share > %s\n", text.FormatShare(a.Threshold))
	fmt.Fprintf(w, "  verdict:    %s: %s\n", a.Verdict, a.Explanation)
	fmt.Fprintln(w, "  (shares add up span totals: a span that encloses others counts their time twice; map it to ignore)")
}

// WriteAggregateComparison writes the human comparison of two summaries.
func WriteAggregateComparison(w io.Writer, c *AggregateComparison) {
	for _, s := range []struct {
		tag string
		s   ComparedSummary
	}{{"A", c.A}, {"B", c.B}} {
		state := "final"
		if !s.s.Final {
			state = "not final"
		}
		fmt.Fprintf(w, "%s: %s (%s on %s; window %s; %s, sequence %d)\n", s.tag, s.s.Path, s.s.Entrypoint, s.s.Device,
			text.FormatNS(float64(s.s.WindowNS)), state, s.s.Sequence)
	}
	for _, n := range c.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	fmt.Fprintf(w, "Deltas are B − A; ! marks a p50 that rose by more than %s (regression), - one that fell by more\n", text.FormatShare(c.Threshold))
	fmt.Fprintf(w, "%d regression(s), %d improvement(s)\n", c.Regressions, c.Improvements)
	text.Section(w, "Spans")
	if len(c.Spans) == 0 {
		fmt.Fprintln(w, "  (none)")
		return
	}
	width := len("NAME")
	for _, d := range c.Spans {
		width = max(width, len(aggregateName(d.Name, d.Step)))
	}
	change := func(p *float64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprintf("%+.1f%%", 100**p)
	}
	t := text.Table(w)
	fmt.Fprintf(t, "%-*s\tCOUNT A\tCOUNT B\tTOTAL A\tTOTAL B\tΔ TOTAL\tP50 A\tP50 B\tΔ P50\tP95 A\tP95 B\tΔ P95\t \t\n", width, "NAME")
	for _, d := range c.Spans {
		flag := ""
		switch {
		case d.Regressed:
			flag = "!"
		case d.Improved:
			flag = "-"
		case d.Only != "":
			flag = "only " + d.Only
		}
		fmt.Fprintf(t, "%-*s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", width, aggregateName(d.Name, d.Step), d.CountA, d.CountB,
			text.FormatNS(float64(d.TotalA)), text.FormatNS(float64(d.TotalB)), text.FormatDeltaNS(d.TotalDelta),
			text.FormatNS(float64(d.P50A)), text.FormatNS(float64(d.P50B)), change(d.P50Change),
			text.FormatNS(float64(d.P95A)), text.FormatNS(float64(d.P95B)), change(d.P95Change), flag)
	}
	t.Flush()
}
