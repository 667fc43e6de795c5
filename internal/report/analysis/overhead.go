package analysis

import (
	"fmt"
	"strings"

	"github.com/candle-trace/candle-trace/internal/report/health"
	"github.com/candle-trace/candle-trace/internal/report/trace"
	"github.com/candle-trace/candle-trace/internal/report/units"
)

// OverheadThreshold is the share of the measured region above which host
// and launch overhead, not compute, is said to dominate (the entrenar
// tracer's falsification test used the same 50%).
const OverheadThreshold = 0.5

// OverheadHypothesis is the claim the analysis tests.
const OverheadHypothesis = "the measured step is dominated by host and launch overhead rather than compute"

// OverheadAnalysis states the hypothesis, the numbers, the threshold and
// the verdict. Basis names the evidence used for compute time:
// "device_busy" (union of host-clock device intervals inside the measured
// region), "host_op_time" (op durations inside the measured subtree) or
// "none".
type OverheadAnalysis struct {
	Hypothesis    string  `json:"hypothesis"`
	Basis         string  `json:"basis"`
	MeasuredNS    uint64  `json:"measured_ns"`
	ComputeNS     uint64  `json:"compute_ns"`
	OverheadNS    uint64  `json:"overhead_ns"`
	OverheadShare float64 `json:"overhead_share"`
	Threshold     float64 `json:"threshold"`
	// CompileNS is what torch.compile's spans ("torch.compile",
	// "torch.compile (backward)": dynamo compiling, with no op recorded)
	// took inside the region: overhead, and a first compilation's or a
	// recompile's, not the steady state's.
	CompileNS   uint64 `json:"compile_ns"`
	Verdict     string `json:"verdict"` // supported | refuted | inconclusive
	Explanation string `json:"explanation"`
}

func overheadAnalysis(a *health.Checker, measured *health.Span, dev DeviceReport) OverheadAnalysis {
	o := OverheadAnalysis{Hypothesis: OverheadHypothesis, Threshold: OverheadThreshold, Basis: "none", Verdict: "inconclusive"}
	if measured == nil || !measured.Closed || measured.Dur == 0 {
		o.Explanation = "no closed measured region with a duration: nothing to divide"
		return o
	}
	o.MeasuredNS = measured.Dur
	in := inside(a, measured) // which spans are the region's: for its op time and its compilations
	var deviceBusy uint64
	hostDevices := 0
	for _, d := range dev.Devices {
		if d.InRegion {
			hostDevices++
			deviceBusy = max(deviceBusy, d.RegionBusyNS)
		}
	}
	switch {
	case hostDevices > 0:
		// With several devices the busiest one bounds how much of the step
		// is compute; the others only add to it in parallel.
		o.Basis, o.ComputeNS = "device_busy", deviceBusy
	default:
		ops := opTimeUnder(a, in)
		if ops == 0 {
			o.Explanation = "no device intervals on the host clock and no op time inside the measured region"
			return o
		}
		o.Basis, o.ComputeNS = "host_op_time", min(ops, measured.Dur)
	}
	o.OverheadNS = o.MeasuredNS - min(o.ComputeNS, o.MeasuredNS)
	o.OverheadShare = float64(o.OverheadNS) / float64(o.MeasuredNS)
	o.CompileNS = compileTimeUnder(a, in)
	what := "the busiest device was idle"
	if o.Basis == "host_op_time" {
		what = "time was spent outside recorded ops"
		if a.Meta.TimingMode == "host" && a.Meta.Device != "cpu" {
			what += " (host-timed ops on an asynchronous device measure launches, not kernels)"
		}
	}
	o.decide(what)
	return o
}

// decide sets the verdict and its explanation from the numbers.
func (o *OverheadAnalysis) decide(what string) {
	pct := 100 * o.OverheadShare
	compiled := ""
	if o.CompileNS > 0 {
		compiled = fmt.Sprintf("; torch.compile compiled for %s of it (%.1f%% of the measured region)",
			units.NS(float64(o.CompileNS)), 100*float64(o.CompileNS)/float64(o.MeasuredNS))
	}
	if o.OverheadShare > OverheadThreshold {
		o.Verdict = "supported"
		advice := "fuse kernels, batch launches or capture a graph"
		if 2*min(o.CompileNS, o.OverheadNS) >= o.OverheadNS {
			// the overhead is the compiler's: no launch to batch
			advice = "most of it torch.compile compiling -- a first compilation, or a recompile when shapes, dtypes or " +
				"the Python values its guards check change (TORCH_LOGS=recompiles says which), not the steady state"
		}
		o.Explanation = fmt.Sprintf("%s for %.1f%% of the measured region (> %.0f%%): overhead-bound; %s%s", what, pct, 100*OverheadThreshold, advice, compiled)
	} else {
		o.Verdict = "refuted"
		o.Explanation = fmt.Sprintf("%s for %.1f%% of the measured region (<= %.0f%%): compute dominates%s", what, pct, 100*OverheadThreshold, compiled)
	}
}

// inside tells whether a span is root or one of its descendants.
func inside(a *health.Checker, root *health.Span) func(*health.Span) bool {
	// 1: inside, 2: outside; resolved per span along its parent chain.
	memo := map[*health.Span]int8{root: 1}
	var chain []*health.Span
	return func(s *health.Span) bool {
		chain = chain[:0]
		cur, verdict := s, int8(2)
		for cur != nil {
			if v, ok := memo[cur]; ok {
				verdict = v
				break
			}
			memo[cur] = 2 // provisional: breaks parent cycles
			chain = append(chain, cur)
			if !cur.HasParent {
				break
			}
			cur = a.SpanByID[cur.Parent]
		}
		for _, c := range chain {
			memo[c] = verdict
		}
		return verdict == 1
	}
}

// opTimeUnder sums the op durations recorded in the spans in says are inside.
func opTimeUnder(a *health.Checker, in func(*health.Span) bool) uint64 {
	var total uint64
	for _, s := range a.Spans {
		if in(s) {
			total = trace.SatAdd(total, s.OpTime())
		}
	}
	return total
}

// compileTimeUnder sums the durations of torch.compile's spans inside (the
// Python binding's names: "torch.compile", "torch.compile (backward)").
func compileTimeUnder(a *health.Checker, in func(*health.Span) bool) uint64 {
	var total uint64
	for _, s := range a.Spans {
		if s.Closed && (s.Name == "torch.compile" || strings.HasPrefix(s.Name, "torch.compile (")) && in(s) {
			total = trace.SatAdd(total, s.Dur)
		}
	}
	return total
}
