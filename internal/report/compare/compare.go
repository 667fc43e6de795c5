package compare

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/candle-trace/candle-trace/internal/report/analysis"
	"github.com/candle-trace/candle-trace/internal/report/trace"
)

// DefaultCompareThreshold is the relative change (5%) beyond which compare
// calls a time or gradient-norm difference significant.
const DefaultCompareThreshold = 0.05

// Comparison is what `candle-trace compare A B` shows: B against A. Deltas
// are B − A, ratios B / A.
type Comparison struct {
	A ComparedTrace `json:"a"`
	B ComparedTrace `json:"b"`
	// Identity: whether the two runs may be compared at all.
	IdentityComparable bool           `json:"identity_comparable"`
	IdentityProblem    string         `json:"identity_problem,omitempty"`
	IdentityDiffs      []IdentityDiff `json:"identity_diffs"`
	Forced             bool           `json:"forced,omitempty"`
	Threshold          float64        `json:"threshold"`

	MeasuredRegion *NameDelta     `json:"measured_region,omitempty"`
	Spans          []NameDelta    `json:"spans"`
	Ops            []NameDelta    `json:"ops"`
	OnlyInA        NamesOnly      `json:"only_in_a"`
	OnlyInB        NamesOnly      `json:"only_in_b"`
	Memory         MemoryDelta    `json:"memory"`
	Gradients      []GradientDiff `json:"gradients"`
	// Device time (device intervals) by launching span name and by kernel
	// name, as the report ranks it; absent on a side without intervals.
	DeviceBySpan []NameDelta `json:"device_by_span"`
	Kernels      []NameDelta `json:"kernels"`
}

// ComparedTrace names one side of a comparison.
type ComparedTrace struct {
	Path              string `json:"path"`
	RunID             string `json:"run_id"`
	ImplementationID  string `json:"implementation_id,omitempty"`
	StructurallyValid bool   `json:"structurally_valid"`
	CaptureComplete   bool   `json:"capture_complete"`
}

// IdentityDiff is one comparison_identity field that differs.
type IdentityDiff struct {
	Field string `json:"field"`
	A     string `json:"a"`
	B     string `json:"b"`
}

// NameDelta compares the spans (or ops) of one name. Ratio is absent when
// A's total is 0.
type NameDelta struct {
	Name        string   `json:"name"`
	CountA      uint64   `json:"count_a"`
	CountB      uint64   `json:"count_b"`
	TotalA      uint64   `json:"total_a_ns"`
	TotalB      uint64   `json:"total_b_ns"`
	DeltaNS     int64    `json:"delta_ns"`
	Ratio       *float64 `json:"ratio,omitempty"`
	Significant bool     `json:"significant"`
}

// NamesOnly lists what one side has and the other lacks.
type NamesOnly struct {
	Spans     []analysis.NameStats `json:"spans"`
	Ops       []analysis.NameStats `json:"ops"`
	Gradients []string             `json:"gradients"` // "root/key"
	// Kernels: interval names with device time on one side only (the
	// report's folded "(other N names)" row is never compared).
	Kernels []analysis.NameStats `json:"kernels"`
}

// MemoryDelta compares the logical-memory peaks and each device's peak
// used bytes (device_memory samples).
type MemoryDelta struct {
	PeakA      *uint64           `json:"peak_a_bytes,omitempty"`
	PeakB      *uint64           `json:"peak_b_bytes,omitempty"`
	DeltaBytes *int64            `json:"delta_bytes,omitempty"`
	Ratio      *float64          `json:"ratio,omitempty"`
	Devices    []DeviceUsedDelta `json:"devices"`
}

type DeviceUsedDelta struct {
	Device     string  `json:"device"`
	PeakUsedA  *uint64 `json:"peak_used_a_bytes,omitempty"`
	PeakUsedB  *uint64 `json:"peak_used_b_bytes,omitempty"`
	DeltaBytes *int64  `json:"delta_bytes,omitempty"`
}

// GradientDiff compares the gradient of one parameter present on both
// sides. RelError is |normB − normA| / |normA| (0 when both are 0), absent
// unless both sides carry a norm.
type GradientDiff struct {
	Root         string   `json:"root"`
	Key          string   `json:"key"`
	StateA       string   `json:"state_a"`
	StateB       string   `json:"state_b"`
	NormA        *float64 `json:"norm_a,omitempty"`
	NormB        *float64 `json:"norm_b,omitempty"`
	RelError     *float64 `json:"rel_error,omitempty"`
	StateChanged bool     `json:"state_changed"`
	Significant  bool     `json:"significant"`
}

// CheckIdentity tells whether two runs may be compared: both declare a
// comparison_identity and they agree on everything but implementation_id
// and pair_id. problem says why not when an identity is missing; diffs
// name each differing field.
func CheckIdentity(a, b *trace.Meta) (diffs []IdentityDiff, problem string) {
	diffs = []IdentityDiff{}
	ia, ib := identityOf(a), identityOf(b)
	switch {
	case ia == nil && ib == nil:
		return diffs, "neither trace declares a comparison_identity, so nothing shows they ran the same workload"
	case ia == nil:
		return diffs, "trace A declares no comparison_identity, so nothing shows it ran the same workload as B"
	case ib == nil:
		return diffs, "trace B declares no comparison_identity, so nothing shows it ran the same workload as A"
	}
	for _, f := range []struct{ name, a, b string }{
		{"workload_id", ia.WorkloadID, ib.WorkloadID},
		{"model_id", ia.ModelID, ib.ModelID},
		{"config_id", ia.ConfigID, ib.ConfigID},
		{"data_id", ia.DataID, ib.DataID},
		{"seed_policy", ia.SeedPolicy, ib.SeedPolicy},
		{"physical_batch", strconv.FormatUint(ia.PhysicalBatch, 10), strconv.FormatUint(ib.PhysicalBatch, 10)},
		{"accumulation_steps", strconv.FormatUint(ia.AccumulationSteps, 10), strconv.FormatUint(ib.AccumulationSteps, 10)},
		{"precision", ia.Precision, ib.Precision},
		{"device_state", ia.DeviceState, ib.DeviceState},
	} {
		if f.a != f.b {
			diffs = append(diffs, IdentityDiff{Field: f.name, A: f.a, B: f.b})
		}
	}
	if len(diffs) > 0 {
		return diffs, fmt.Sprintf("comparison identities differ in %d field(s)", len(diffs))
	}
	return diffs, ""
}

func identityOf(m *trace.Meta) *trace.ComparisonIdentity {
	if m == nil {
		return nil
	}
	return m.ComparisonIdentity
}

// Compare compares two read traces (Options.Report). threshold is the
// relative change counted as significant (DefaultCompareThreshold when
// <= 0). It never refuses: the caller decides what a failed identity
// check means (see CheckIdentity, and IdentityComparable).
func Compare(pathA string, a *analysis.Result, pathB string, b *analysis.Result, threshold float64) *Comparison {
	if threshold <= 0 {
		threshold = DefaultCompareThreshold
	}
	c := &Comparison{A: side(pathA, a), B: side(pathB, b), Threshold: threshold}
	c.IdentityDiffs, c.IdentityProblem = CheckIdentity(a.Meta, b.Meta)
	c.IdentityComparable = c.IdentityProblem == ""
	ra, rb := a.Report, b.Report
	if ra == nil || rb == nil {
		return c
	}
	if ma, mb := ra.MeasuredRegion, rb.MeasuredRegion; ma != nil && mb != nil && ma.Closed && mb.Closed {
		d := nameDelta(ma.Name, analysis.NameStats{Count: 1, TotalNS: ma.DurationNS}, analysis.NameStats{Count: 1, TotalNS: mb.DurationNS}, threshold)
		if ma.Name != mb.Name {
			d.Name = ma.Name + " / " + mb.Name
		}
		c.MeasuredRegion = &d
	}
	c.Spans, c.OnlyInA.Spans, c.OnlyInB.Spans = compareNames(ra.Spans, rb.Spans, threshold)
	c.Ops, c.OnlyInA.Ops, c.OnlyInB.Ops = compareNames(ra.Ops, rb.Ops, threshold)
	c.Memory = compareMemory(&ra.Memory, &rb.Memory)
	c.Gradients, c.OnlyInA.Gradients, c.OnlyInB.Gradients = compareGradients(ra.Gradients.All, rb.Gradients.All, threshold)
	c.DeviceBySpan, _, _ = compareNames(spanDeviceRows(ra.Device.BySpan), spanDeviceRows(rb.Device.BySpan), threshold)
	c.Kernels, c.OnlyInA.Kernels, c.OnlyInB.Kernels = compareNames(kernelRows(ra.Device.Kernels), kernelRows(rb.Device.Kernels), threshold)
	return c
}

func spanDeviceRows(in []analysis.SpanDeviceStat) []analysis.NameStats {
	out := make([]analysis.NameStats, 0, len(in))
	for _, s := range in {
		out = append(out, analysis.NameStats{Name: s.Name, Count: s.Kernels, TotalNS: s.TotalNS})
	}
	return out
}

func kernelRows(in []analysis.KernelStat) []analysis.NameStats {
	out := make([]analysis.NameStats, 0, len(in))
	for _, k := range in {
		if strings.HasPrefix(k.Name, "(other ") {
			continue // the folded tail: different names on each side
		}
		out = append(out, analysis.NameStats{Name: k.Name, Count: k.Count, TotalNS: k.TotalNS})
	}
	return out
}

func side(path string, r *analysis.Result) ComparedTrace {
	s := ComparedTrace{Path: path, StructurallyValid: r.Health.StructurallyValid, CaptureComplete: r.Health.CaptureComplete}
	if r.Meta != nil {
		s.RunID = r.Meta.RunID
		if id := r.Meta.ComparisonIdentity; id != nil {
			s.ImplementationID = id.ImplementationID
		}
	}
	return s
}

func nameDelta(name string, a, b analysis.NameStats, threshold float64) NameDelta {
	d := NameDelta{Name: name, CountA: a.Count, CountB: b.Count, TotalA: a.TotalNS, TotalB: b.TotalNS,
		DeltaNS: signedDelta(a.TotalNS, b.TotalNS)}
	if a.TotalNS > 0 {
		r := float64(b.TotalNS) / float64(a.TotalNS)
		d.Ratio = &r
		d.Significant = math.Abs(r-1) > threshold
	} else {
		d.Significant = b.TotalNS > 0
	}
	return d
}

// signedDelta is b − a, saturated to int64.
func signedDelta(a, b uint64) int64 {
	if b >= a {
		return int64(min(b-a, math.MaxInt64))
	}
	return -int64(min(a-b, math.MaxInt64))
}

// compareNames pairs rows by name. Rows present on both sides come back
// sorted by the size of the change, largest first.
func compareNames(a, b []analysis.NameStats, threshold float64) (both []NameDelta, onlyA, onlyB []analysis.NameStats) {
	both, onlyA, onlyB = []NameDelta{}, []analysis.NameStats{}, []analysis.NameStats{}
	inB := map[string]analysis.NameStats{}
	for _, r := range b {
		inB[r.Name] = r
	}
	inA := map[string]bool{}
	for _, r := range a {
		inA[r.Name] = true
		if rb, ok := inB[r.Name]; ok {
			both = append(both, nameDelta(r.Name, r, rb, threshold))
		} else {
			onlyA = append(onlyA, r)
		}
	}
	for _, r := range b {
		if !inA[r.Name] {
			onlyB = append(onlyB, r)
		}
	}
	sort.SliceStable(both, func(i, j int) bool { return abs64(both[i].DeltaNS) > abs64(both[j].DeltaNS) })
	return both, onlyA, onlyB
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

func compareMemory(a, b *analysis.MemoryReport) MemoryDelta {
	m := MemoryDelta{Devices: []DeviceUsedDelta{}}
	if a.Peak != nil {
		v := a.Peak.LiveBytes
		m.PeakA = &v
	}
	if b.Peak != nil {
		v := b.Peak.LiveBytes
		m.PeakB = &v
	}
	if m.PeakA != nil && m.PeakB != nil {
		d := signedDelta(*m.PeakA, *m.PeakB)
		m.DeltaBytes = &d
		if *m.PeakA > 0 {
			r := float64(*m.PeakB) / float64(*m.PeakA)
			m.Ratio = &r
		}
	}
	devs := map[string]*DeviceUsedDelta{}
	var order []string
	get := func(name string) *DeviceUsedDelta {
		if d, ok := devs[name]; ok {
			return d
		}
		d := &DeviceUsedDelta{Device: name}
		devs[name] = d
		order = append(order, name)
		return d
	}
	for _, d := range a.Devices {
		get(d.Device).PeakUsedA = d.PeakUsedBytes
	}
	for _, d := range b.Devices {
		get(d.Device).PeakUsedB = d.PeakUsedBytes
	}
	sort.Strings(order)
	for _, name := range order {
		d := devs[name]
		if d.PeakUsedA != nil && d.PeakUsedB != nil {
			v := signedDelta(*d.PeakUsedA, *d.PeakUsedB)
			d.DeltaBytes = &v
		}
		m.Devices = append(m.Devices, *d)
	}
	return m
}

// paramKey names one parameter: gradients are facts about parameters.
type paramKey struct{ root, key string }

func compareGradients(a, b []analysis.GradientFact, threshold float64) (both []GradientDiff, onlyA, onlyB []string) {
	both, onlyA, onlyB = []GradientDiff{}, []string{}, []string{}
	inB := map[paramKey]analysis.GradientFact{}
	for _, g := range b {
		inB[paramKey{g.Root, g.Key}] = g
	}
	inA := map[paramKey]bool{}
	for _, g := range a {
		k := paramKey{g.Root, g.Key}
		inA[k] = true
		gb, ok := inB[k]
		if !ok {
			onlyA = append(onlyA, g.Root+"/"+g.Key)
			continue
		}
		d := GradientDiff{Root: g.Root, Key: g.Key, StateA: g.State, StateB: gb.State, NormA: g.Norm, NormB: gb.Norm,
			StateChanged: g.State != gb.State}
		if g.Norm != nil && gb.Norm != nil {
			var e float64
			if *g.Norm != 0 {
				e = math.Abs(*gb.Norm-*g.Norm) / math.Abs(*g.Norm)
			} else if *gb.Norm != 0 {
				e = math.Inf(1)
			}
			if !math.IsInf(e, 0) {
				d.RelError = &e
			}
			d.Significant = math.IsInf(e, 0) || e > threshold
		}
		d.Significant = d.Significant || d.StateChanged
		both = append(both, d)
	}
	for _, g := range b {
		if !inA[paramKey{g.Root, g.Key}] {
			onlyB = append(onlyB, g.Root+"/"+g.Key)
		}
	}
	sort.SliceStable(both, func(i, j int) bool {
		if both[i].Root != both[j].Root {
			return both[i].Root < both[j].Root
		}
		return both[i].Key < both[j].Key
	})
	return both, onlyA, onlyB
}
