package text

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/candle-trace/candle-trace/internal/report/analysis"
	"github.com/candle-trace/candle-trace/internal/report/health"
	"github.com/candle-trace/candle-trace/internal/report/trace"
)

// WriteHealth writes the human verdict of one trace: a summary line, then
// one line per issue.
func WriteHealth(w io.Writer, name string, h *health.Health, allowPartial bool) {
	verdict := "OK"
	if !h.OK(allowPartial) {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "%s: %s (%s)\n", name, verdict, healthSummary(h))
	writeIssues(w, h)
}

func healthSummary(h *health.Health) string {
	errs, warns := 0, 0
	for _, i := range h.Issues {
		if i.Severity == trace.SeverityError {
			errs++
		} else {
			warns++
		}
	}
	return fmt.Sprintf("%s; %d errors, %d warnings; %d lines, %s", healthWords(h), errs, warns, h.Lines, FormatBytes(uint64(h.Bytes)))
}

func writeIssues(w io.Writer, h *health.Health) {
	for _, i := range h.Issues {
		fmt.Fprintf(w, "  %s\n", i)
	}
}

func healthWords(h *health.Health) string {
	var w []string
	if h.StructurallyValid {
		w = append(w, "structurally valid")
	} else {
		w = append(w, "structurally invalid")
	}
	switch {
	case h.Incomplete && h.CutLine > 0:
		w = append(w, fmt.Sprintf("incomplete, cut at line %d", h.CutLine))
	case h.Incomplete:
		w = append(w, "incomplete, no terminal")
	case h.Outcome != "":
		w = append(w, "outcome "+h.Outcome)
	}
	return strings.Join(w, ", ")
}

// WriteReport writes the human report: provenance, health, tables with
// units, memory, device, gradients, tensor stats and the overhead analysis.
func WriteReport(w io.Writer, name string, res *analysis.Result) {
	fmt.Fprintf(w, "Trace %s\n", name)
	if m := res.Meta; m != nil {
		writeProvenance(w, m)
	}
	fmt.Fprintf(w, "Health: %s\n", healthSummary(&res.Health))
	writeIssues(w, &res.Health)
	r := res.Report
	if r == nil {
		fmt.Fprintln(w, "\nNo report: the trace could not be read past its first problem.")
		return
	}
	if mr := r.MeasuredRegion; mr != nil {
		state := FormatNS(float64(mr.DurationNS))
		if !mr.Closed {
			state = "not closed"
		}
		fmt.Fprintf(w, "\nMeasured region: %s (%s), %s\n", mr.Name, mr.SpanID, state)
		if mr.TracerNS != nil {
			fmt.Fprintf(w, "Tracer's own time: %s inside the region, left out of every span", FormatNS(float64(*mr.TracerNS)))
			if mr.SessionTracerNS != nil {
				fmt.Fprintf(w, " (%s in the whole session", FormatNS(float64(*mr.SessionTracerNS)))
				if mr.SessionEstimatedNS > 0 {
					fmt.Fprintf(w, ", %s of it calibrated rather than measured", FormatNS(float64(mr.SessionEstimatedNS)))
				}
				fmt.Fprint(w, ")")
			}
			fmt.Fprintln(w)
		}
	} else {
		fmt.Fprintln(w, "\nMeasured region: none (shares are 0)")
	}

	Section(w, "Spans by name (total = sum of durations; self = less direct children)")
	writeStats(w, r.Spans, false)
	Section(w, "Ops by name")
	writeStats(w, r.Ops, true)
	writeMemory(w, &r.Memory)
	writeDevice(w, &r.Device)
	writeGradients(w, &r.Gradients)
	writeTensorStats(w, r.TensorStats)
	writeOverhead(w, &r.Overhead)
}

func Section(w io.Writer, title string) { fmt.Fprintf(w, "\n%s\n", title) }

func Table(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
}

func writeProvenance(w io.Writer, m *trace.Meta) {
	fmt.Fprintf(w, "Run %s: %s, phase %s, capture step %d (after %d warm-up), device %s\n",
		m.RunID, m.Entrypoint, m.Phase, m.CaptureStep, m.WarmupSteps, m.Device)
	fmt.Fprintf(w, "  correlation %s, captured %s, timing %s (region device-synchronized: %t), schema %s\n",
		m.CorrelationID, m.Timestamp, m.TimingMode, m.MeasuredRegionDeviceSynchronized, m.Schema)
	c := &m.CaptureContract
	fmt.Fprintf(w, "  contract: scope %s; operations %s, activations %s, tensors %s, gradients %s, logical memory %s, physical memory %s, device timing %s\n",
		c.MeasurementScope, c.Operations, c.Activations, c.Tensors, c.Gradients, c.LogicalMemory, c.PhysicalMemory, c.DeviceTiming)
	if id := m.ComparisonIdentity; id != nil {
		fmt.Fprintf(w, "  identity: workload %s, model %s, config %s, data %s, seed %s, precision %s, batch %d×%d, device state %s",
			id.WorkloadID, id.ModelID, id.ConfigID, id.DataID, id.SeedPolicy, id.Precision, id.PhysicalBatch, id.AccumulationSteps, id.DeviceState)
		if id.ImplementationID != "" {
			fmt.Fprintf(w, ", implementation %s", id.ImplementationID)
		}
		fmt.Fprintln(w)
	}
	for _, kv := range []struct {
		name string
		m    map[string]string
	}{{"producer", m.Producer}, {"process", m.Process}, {"clock", m.Clock}, {"tags", m.Tags}} {
		if len(kv.m) > 0 {
			fmt.Fprintf(w, "  %s: %s\n", kv.name, SortedPairs(kv.m))
		}
	}
	if m.CandleVersion != "" {
		fmt.Fprintf(w, "  candle %s\n", m.CandleVersion)
	}
}

func SortedPairs(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, " ")
}

func writeStats(w io.Writer, rows []analysis.NameStats, ops bool) {
	if len(rows) == 0 {
		fmt.Fprintln(w, "  (none)")
		return
	}
	t := Table(w)
	head := "%-*s\tCOUNT\tTOTAL\tSELF\tMEAN\tP50\tP95\tMAX\tSHARE\t"
	if ops {
		head = "%-*s\tCOUNT\tTOTAL\tMEAN\tP50\tP95\tMAX\tSHARE\tIN\tOUT\tBYTES/OP\t"
	}
	approx := false
	width := len("NAME")
	for _, r := range rows {
		width = max(width, len(displayName(r)))
	}
	fmt.Fprintf(t, head+"\n", width, "NAME")
	for _, r := range rows {
		approx = approx || r.Approximate
		if ops {
			fmt.Fprintf(t, "%-*s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", width, r.Name, r.Count, FormatNS(float64(r.TotalNS)),
				FormatNS(r.MeanNS), FormatNS(float64(r.P50NS)), FormatNS(float64(r.P95NS)), FormatNS(float64(r.MaxNS)),
				FormatShare(r.Share), FormatBytes(r.InputBytes), FormatBytes(r.OutputBytes), FormatBytes(uint64(r.BytesPerOp)))
			continue
		}
		share := FormatShare(r.Share)
		if r.Encloses {
			share = "-" // the session around the capture: no share of the region
		}
		fmt.Fprintf(t, "%-*s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", width, displayName(r), r.Count, FormatNS(float64(r.TotalNS)), FormatNS(float64(r.SelfNS)),
			FormatNS(r.MeanNS), FormatNS(float64(r.P50NS)), FormatNS(float64(r.P95NS)), FormatNS(float64(r.MaxNS)), share)
	}
	t.Flush()
	if approx {
		fmt.Fprintf(w, "  (percentiles of names seen more than %d times are within ~1%%)\n", analysis.ExactSamples)
	}
}

func displayName(r analysis.NameStats) string {
	if r.Open > 0 {
		return fmt.Sprintf("%s (+%d open)", r.Name, r.Open)
	}
	return r.Name
}

func writeMemory(w io.Writer, m *analysis.MemoryReport) {
	Section(w, "Memory")
	if p := m.Peak; p != nil {
		where := p.SpanID
		if p.SpanName != "" {
			where = fmt.Sprintf("%s (%s)", p.SpanName, p.SpanID)
		}
		fmt.Fprintf(w, "  peak live %s at %s in %s\n", FormatBytes(p.LiveBytes), FormatNS(float64(p.TimestampNS)), where)
		fmt.Fprintf(w, "    by category: %s\n", byteMap(p.ByCategory))
		fmt.Fprintf(w, "    by device:   %s\n", byteMap(p.ByDevice))
	} else {
		fmt.Fprintln(w, "  no logical allocations")
	}
	fmt.Fprintf(w, "  %d allocations, %d frees, %s allocated in all, %d storages still live at the end\n",
		m.Allocations, m.Frees, FormatBytes(m.TotalAllocatedBytes), m.RetainedStorages)
	for _, d := range m.Devices {
		fmt.Fprintf(w, "  device %s: %d samples", d.Device, d.Samples)
		if d.PeakUsedBytes != nil {
			fmt.Fprintf(w, ", peak used %s at %s", FormatBytes(*d.PeakUsedBytes), FormatNS(float64(d.PeakUsedAtNS)))
		}
		if d.PeakReservedBytes != nil {
			fmt.Fprintf(w, ", peak reserved %s", FormatBytes(*d.PeakReservedBytes))
		}
		if d.MinFreeBytes != nil {
			fmt.Fprintf(w, ", min free %s", FormatBytes(*d.MinFreeBytes))
		}
		if d.CapacityBytes != nil {
			fmt.Fprintf(w, ", capacity %s", FormatBytes(*d.CapacityBytes))
		}
		fmt.Fprintln(w)
	}
}

func byteMap(m map[string]uint64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || (m[keys[i]] == m[keys[j]] && keys[i] < keys[j]) })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + " " + FormatBytes(m[k])
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

func writeDevice(w io.Writer, d *analysis.DeviceReport) {
	Section(w, "Device")
	if len(d.Streams) == 0 {
		fmt.Fprintln(w, "  no device intervals")
		return
	}
	t := Table(w)
	fmt.Fprintln(t, "DEVICE\tCLOCK\tSTREAM\tKERNELS\tKERNEL TIME\tMEAN KERNEL\tBUSY\t")
	for _, s := range d.Streams {
		fmt.Fprintf(t, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t\n", s.Device, s.ClockID, s.StreamID, s.Kernels,
			FormatNS(float64(s.KernelNS)), FormatNS(s.MeanKernelNS), FormatNS(float64(s.BusyNS)))
	}
	t.Flush()
	fmt.Fprintln(w)
	t = Table(w)
	fmt.Fprintln(t, "DEVICE\tCLOCK\tKERNELS\tBUSY\tBUSY IN REGION\tIDLE IN REGION\tGAPS\tLARGEST GAP\tUTILIZATION\t")
	for _, b := range d.Devices {
		if !b.InRegion {
			fmt.Fprintf(t, "%s\t%s\t%d\t%s\t-\t-\t-\t-\t-\t\n", b.Device, b.ClockID, b.Kernels, FormatNS(float64(b.BusyNS)))
			continue
		}
		fmt.Fprintf(t, "%s\t%s\t%d\t%s\t%s\t%s\t%d\t%s @ %s\t%s\t\n", b.Device, b.ClockID, b.Kernels, FormatNS(float64(b.BusyNS)),
			FormatNS(float64(b.RegionBusyNS)), FormatNS(float64(b.IdleNS)), b.IdleGaps,
			FormatNS(float64(b.LargestGapNS)), FormatNS(float64(b.LargestGapAt)), FormatShare(b.Utilization))
	}
	t.Flush()
	writeKernels(w, d)
}

// TextKernelRows is how many kernel names the text report lists (the JSON
// report has up to MaxKernelRows).
const TextKernelRows = 15

func writeKernels(w io.Writer, d *analysis.DeviceReport) {
	fmt.Fprintln(w)
	t := Table(w)
	fmt.Fprintln(t, "DEVICE TIME BY SPAN\tINTERVALS\tTOTAL\tSHARE\t")
	for _, s := range d.BySpan {
		fmt.Fprintf(t, "%s\t%d\t%s\t%s\t\n", Clip(s.Name, 60), s.Kernels, FormatNS(float64(s.TotalNS)), FormatShare(s.Share))
	}
	t.Flush()
	fmt.Fprintln(w)
	t = Table(w)
	fmt.Fprintln(t, "KERNEL\tCOUNT\tTOTAL\tMEAN\tMAX\tSHARE\t")
	for i, k := range d.Kernels {
		if i == TextKernelRows {
			fmt.Fprintf(t, "(%d more names in --json)\t\t\t\t\t\t\n", len(d.Kernels)-i)
			break
		}
		fmt.Fprintf(t, "%s\t%d\t%s\t%s\t%s\t%s\t\n", Clip(k.Name, 80), k.Count, FormatNS(float64(k.TotalNS)),
			FormatNS(k.MeanNS), FormatNS(float64(k.MaxNS)), FormatShare(k.Share))
	}
	t.Flush()
}

// clip shortens s to at most n runes, marking the cut (demangled C++ kernel
// names run to hundreds of characters).
func Clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func writeGradients(w io.Writer, g *analysis.GradientReport) {
	Section(w, "Gradients")
	fmt.Fprintf(w, "  %d parameters: %d present, %d missing, %d zero, %d non-finite\n", g.Total, g.Present, g.Missing, g.Zero, g.NonFinite)
	for _, f := range g.Flagged {
		fmt.Fprintf(w, "  ! %s/%s is %s (line %d)\n", f.Root, f.Key, f.State, f.Line)
	}
}

func writeTensorStats(w io.Writer, stats []analysis.TensorSummary) {
	Section(w, "Tensor stats")
	if len(stats) == 0 {
		fmt.Fprintln(w, "  (none)")
		return
	}
	t := Table(w)
	fmt.Fprintln(t, "LABEL\tDTYPE\tSHAPE\tRECORDS\tNON-FINITE\tRMS\tABS MAX\tMEAN\t")
	for _, s := range stats {
		flag := "0"
		if s.NonFiniteElements > 0 {
			flag = fmt.Sprintf("! %d (first line %d)", s.NonFiniteElements, s.FirstNonFiniteAt)
		}
		fmt.Fprintf(t, "%s\t%s\t%v\t%d\t%s\t%.4g\t%.4g\t%.4g\t\n", s.Label, s.Dtype, s.Shape, s.Observations, flag, s.RMS, s.AbsMax, s.Mean)
	}
	t.Flush()
}

func writeOverhead(w io.Writer, o *analysis.OverheadAnalysis) {
	Section(w, "Overhead analysis")
	fmt.Fprintf(w, "  hypothesis: %s\n", o.Hypothesis)
	if o.Basis != "none" {
		fmt.Fprintf(w, "  numbers:    measured %s, compute %s (%s), overhead %s = %s\n", FormatNS(float64(o.MeasuredNS)),
			FormatNS(float64(o.ComputeNS)), o.Basis, FormatNS(float64(o.OverheadNS)), FormatShare(o.OverheadShare))
	}
	fmt.Fprintf(w, "  threshold:  overhead share > %s\n", FormatShare(o.Threshold))
	fmt.Fprintf(w, "  verdict:    %s: %s\n", o.Verdict, o.Explanation)
}
