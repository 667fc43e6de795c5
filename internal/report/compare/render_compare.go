package compare

import (
	"fmt"
	"io"
	"strings"

	"github.com/candle-trace/candle-trace/internal/report/text"
)

// WriteIdentityRefusal explains why compare refused two traces.
func WriteIdentityRefusal(w io.Writer, c *Comparison) {
	fmt.Fprintf(w, "refusing to compare %s with %s: %s\n", c.A.Path, c.B.Path, c.IdentityProblem)
	if len(c.IdentityDiffs) > 0 {
		t := text.Table(w)
		fmt.Fprintf(t, "%-18s\tA\tB\t\n", "FIELD")
		for _, d := range c.IdentityDiffs {
			fmt.Fprintf(t, "%-18s\t%s\t%s\t\n", d.Field, d.A, d.B)
		}
		t.Flush()
	}
	fmt.Fprintln(w, "comparison_identity must match in everything but implementation_id and pair_id; --force compares anyway")
}

// WriteComparison writes the human comparison: B against A.
func WriteComparison(w io.Writer, c *Comparison) {
	for _, s := range []struct {
		tag string
		t   ComparedTrace
	}{{"A", c.A}, {"B", c.B}} {
		impl := ""
		if s.t.ImplementationID != "" {
			impl = ", implementation " + s.t.ImplementationID
		}
		state := "structurally valid"
		if !s.t.StructurallyValid {
			state = "STRUCTURALLY INVALID"
		}
		if !s.t.CaptureComplete {
			state += ", capture not complete"
		}
		fmt.Fprintf(w, "%s: %s (run %s%s; %s)\n", s.tag, s.t.Path, s.t.RunID, impl, state)
	}
	switch {
	case c.IdentityComparable:
		fmt.Fprintln(w, "Identity: comparable (same comparison_identity but for implementation_id/pair_id)")
	default:
		fmt.Fprintf(w, "Identity: NOT comparable, compared because of --force: %s\n", c.IdentityProblem)
		for _, d := range c.IdentityDiffs {
			fmt.Fprintf(w, "  %s: A %s, B %s\n", d.Field, d.A, d.B)
		}
	}
	fmt.Fprintf(w, "Deltas are B − A, ratios B / A; ! marks a change beyond %s\n", text.FormatShare(c.Threshold))
	if m := c.MeasuredRegion; m != nil {
		fmt.Fprintf(w, "\nMeasured region %s: %s → %s, %s (%s)%s\n", m.Name, text.FormatNS(float64(m.TotalA)), text.FormatNS(float64(m.TotalB)),
			text.FormatDeltaNS(m.DeltaNS), formatRatio(m.Ratio), mark(m.Significant))
	}
	text.Section(w, "Spans by name")
	writeDeltas(w, c.Spans)
	text.Section(w, "Ops by name")
	writeDeltas(w, c.Ops)
	writeOnly(w, "A", &c.OnlyInA)
	writeOnly(w, "B", &c.OnlyInB)
	writeMemoryDelta(w, &c.Memory)
	if len(c.DeviceBySpan)+len(c.Kernels)+len(c.OnlyInA.Kernels)+len(c.OnlyInB.Kernels) > 0 {
		text.Section(w, "Device time by span")
		writeDeltas(w, c.DeviceBySpan)
		text.Section(w, "Kernels")
		rows := c.Kernels
		if len(rows) > text.TextKernelRows {
			rows = rows[:text.TextKernelRows]
		}
		writeDeltas(w, clipNames(rows))
		if n := len(c.Kernels) - len(rows); n > 0 {
			fmt.Fprintf(w, "  (%d more in --json)\n", n)
		}
	}
	writeGradientDiffs(w, c)
}

// clipNames shortens long (demangled C++) names for the text table.
func clipNames(rows []NameDelta) []NameDelta {
	out := make([]NameDelta, len(rows))
	for i, r := range rows {
		r.Name = text.Clip(r.Name, 80)
		out[i] = r
	}
	return out
}

func mark(significant bool) string {
	if significant {
		return " !"
	}
	return ""
}

func formatRatio(r *float64) string {
	if r == nil {
		return "n/a"
	}
	return fmt.Sprintf("×%.3f", *r)
}

func writeDeltas(w io.Writer, rows []NameDelta) {
	if len(rows) == 0 {
		fmt.Fprintln(w, "  (no names in common)")
		return
	}
	width := len("NAME")
	for _, r := range rows {
		width = max(width, len(r.Name))
	}
	t := text.Table(w)
	fmt.Fprintf(t, "%-*s\tCOUNT A\tCOUNT B\tTOTAL A\tTOTAL B\tDELTA\tRATIO\t \t\n", width, "NAME")
	for _, r := range rows {
		fmt.Fprintf(t, "%-*s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t\n", width, r.Name, r.CountA, r.CountB,
			text.FormatNS(float64(r.TotalA)), text.FormatNS(float64(r.TotalB)), text.FormatDeltaNS(r.DeltaNS), formatRatio(r.Ratio), strings.TrimSpace(mark(r.Significant)))
	}
	t.Flush()
}

func writeOnly(w io.Writer, tag string, o *NamesOnly) {
	if len(o.Spans)+len(o.Ops)+len(o.Gradients)+len(o.Kernels) == 0 {
		return
	}
	text.Section(w, "Only in "+tag)
	for _, s := range o.Spans {
		fmt.Fprintf(w, "  span %s: %d, %s\n", s.Name, s.Count, text.FormatNS(float64(s.TotalNS)))
	}
	for _, s := range o.Ops {
		fmt.Fprintf(w, "  op %s: %d, %s\n", s.Name, s.Count, text.FormatNS(float64(s.TotalNS)))
	}
	for _, g := range o.Gradients {
		fmt.Fprintf(w, "  gradient %s\n", g)
	}
	for _, k := range o.Kernels {
		fmt.Fprintf(w, "  kernel %s: %d, %s\n", text.Clip(k.Name, 80), k.Count, text.FormatNS(float64(k.TotalNS)))
	}
}

func writeMemoryDelta(w io.Writer, m *MemoryDelta) {
	text.Section(w, "Memory")
	bytesOr := func(p *uint64) string {
		if p == nil {
			return "-"
		}
		return text.FormatBytes(*p)
	}
	if m.PeakA != nil || m.PeakB != nil {
		fmt.Fprintf(w, "  logical peak: %s → %s", bytesOr(m.PeakA), bytesOr(m.PeakB))
		if m.DeltaBytes != nil {
			fmt.Fprintf(w, ", %s (%s)", text.FormatDeltaBytes(*m.DeltaBytes), formatRatio(m.Ratio))
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintln(w, "  no logical allocations on either side")
	}
	for _, d := range m.Devices {
		fmt.Fprintf(w, "  device %s peak used: %s → %s", d.Device, bytesOr(d.PeakUsedA), bytesOr(d.PeakUsedB))
		if d.DeltaBytes != nil {
			fmt.Fprintf(w, ", %s", text.FormatDeltaBytes(*d.DeltaBytes))
		}
		fmt.Fprintln(w)
	}
}

func writeGradientDiffs(w io.Writer, c *Comparison) {
	text.Section(w, "Gradients")
	if len(c.Gradients) == 0 {
		fmt.Fprintln(w, "  (no parameters in common)")
		return
	}
	norm := func(p *float64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprintf("%.6g", *p)
	}
	width := len("PARAMETER")
	for _, g := range c.Gradients {
		width = max(width, len(g.Root)+1+len(g.Key))
	}
	t := text.Table(w)
	fmt.Fprintf(t, "%-*s\tSTATE A\tSTATE B\tNORM A\tNORM B\tREL ERROR\t \t\n", width, "PARAMETER")
	for _, g := range c.Gradients {
		rel := "-"
		if g.RelError != nil {
			rel = fmt.Sprintf("%.3g", *g.RelError)
		} else if g.NormA != nil && g.NormB != nil {
			rel = "inf"
		}
		fmt.Fprintf(t, "%-*s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", width, g.Root+"/"+g.Key, g.StateA, g.StateB, norm(g.NormA), norm(g.NormB), rel, strings.TrimSpace(mark(g.Significant)))
	}
	t.Flush()
}
