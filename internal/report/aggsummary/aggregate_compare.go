package aggsummary

import (
	"sort"

	"github.com/candle-trace/candle-trace/internal/aggregate"
)

// DefaultRegressionThreshold is the relative p50 change (10%) beyond which
// compare flags a span of two summaries. It is wider than the histogram's
// resolution (a p50 is within 3.1% of the exact value), so bucket noise
// alone cannot raise the flag.
const DefaultRegressionThreshold = 0.10

// AggregateComparison is `candle-trace compare A.json B.json` on two
// summaries: B against A, per (name, step). Totals and counts depend on
// how long each run was; the p50 does not, so it carries the flag.
type AggregateComparison struct {
	A            ComparedSummary  `json:"a"`
	B            ComparedSummary  `json:"b"`
	Threshold    float64          `json:"threshold"`
	Spans        []AggregateDelta `json:"spans"`
	Regressions  int              `json:"regressions"`
	Improvements int              `json:"improvements"`
	// Notes are differences in provenance worth knowing (other device,
	// entrypoint or phase); they do not stop the comparison.
	Notes []string `json:"notes"`
}

// ComparedSummary names one side.
type ComparedSummary struct {
	Path       string `json:"path"`
	Entrypoint string `json:"entrypoint"`
	Device     string `json:"device"`
	Final      bool   `json:"final"`
	Sequence   uint64 `json:"sequence"`
	WindowNS   uint64 `json:"window_ns"`
}

// AggregateDelta compares one (name, step). Only is "a" or "b" for a span
// in one summary only (its other side is zeros). P50Change and P95Change
// are (B − A) / A, absent when A's is 0.
type AggregateDelta struct {
	Name       string   `json:"name"`
	Step       string   `json:"step,omitempty"`
	Only       string   `json:"only,omitempty"`
	CountA     uint64   `json:"count_a"`
	CountB     uint64   `json:"count_b"`
	CountDelta int64    `json:"count_delta"`
	TotalA     uint64   `json:"total_a_ns"`
	TotalB     uint64   `json:"total_b_ns"`
	TotalDelta int64    `json:"total_delta_ns"`
	P50A       uint64   `json:"p50_a_ns"`
	P50B       uint64   `json:"p50_b_ns"`
	P50Change  *float64 `json:"p50_change,omitempty"`
	P95A       uint64   `json:"p95_a_ns"`
	P95B       uint64   `json:"p95_b_ns"`
	P95Change  *float64 `json:"p95_change,omitempty"`
	Regressed  bool     `json:"regressed"` // p50 rose by more than the threshold
	Improved   bool     `json:"improved"`  // p50 fell by more than the threshold
}

func compared(path string, s *aggregate.Summary) ComparedSummary {
	return ComparedSummary{Path: path, Entrypoint: s.Run.Entrypoint, Device: s.Run.Device, Final: s.Final, Sequence: s.Sequence, WindowNS: s.Window.DurationNS}
}

// CompareAggregate sets B against A. threshold is relative (0.1 = 10%; 0:
// the default).
func CompareAggregate(pathA string, a *aggregate.Summary, pathB string, b *aggregate.Summary, threshold float64) *AggregateComparison {
	if threshold <= 0 {
		threshold = DefaultRegressionThreshold
	}
	c := &AggregateComparison{A: compared(pathA, a), B: compared(pathB, b), Threshold: threshold, Spans: []AggregateDelta{}, Notes: []string{}}
	for _, f := range []struct{ what, a, b string }{
		{"entrypoint", a.Run.Entrypoint, b.Run.Entrypoint}, {"device", a.Run.Device, b.Run.Device}, {"phase", a.Run.Phase, b.Run.Phase},
	} {
		if f.a != f.b {
			c.Notes = append(c.Notes, f.what+" differs: A "+f.a+", B "+f.b)
		}
	}
	type key struct{ name, step string }
	index := map[key]int{}
	side := func(s *aggregate.Summary, isB bool) {
		for _, sp := range s.Spans {
			k := key{sp.Name, sp.Step}
			i, ok := index[k]
			if !ok {
				i = len(c.Spans)
				index[k] = i
				c.Spans = append(c.Spans, AggregateDelta{Name: sp.Name, Step: sp.Step})
			}
			d := &c.Spans[i]
			if isB {
				d.CountB, d.TotalB, d.P50B, d.P95B = sp.Count, sp.TotalNS, sp.P50NS, sp.P95NS
			} else {
				d.CountA, d.TotalA, d.P50A, d.P95A = sp.Count, sp.TotalNS, sp.P50NS, sp.P95NS
			}
		}
	}
	side(a, false)
	side(b, true)
	for i := range c.Spans {
		d := &c.Spans[i]
		switch {
		case d.CountA == 0:
			d.Only = "b"
		case d.CountB == 0:
			d.Only = "a"
		}
		d.CountDelta = diff(d.CountB, d.CountA)
		d.TotalDelta = diff(d.TotalB, d.TotalA)
		if d.Only != "" {
			continue
		}
		d.P50Change = relChange(d.P50A, d.P50B)
		d.P95Change = relChange(d.P95A, d.P95B)
		if d.P50Change != nil {
			d.Regressed = *d.P50Change > threshold
			d.Improved = *d.P50Change < -threshold
		} else {
			d.Regressed = d.P50B > 0 // from 0 to anything is a rise beyond any threshold
		}
		if d.Regressed {
			c.Regressions++
		}
		if d.Improved {
			c.Improvements++
		}
	}
	sort.SliceStable(c.Spans, func(i, j int) bool {
		x, y := &c.Spans[i], &c.Spans[j]
		mx, my := max(x.TotalA, x.TotalB), max(y.TotalA, y.TotalB)
		if mx != my {
			return mx > my
		}
		if x.Name != y.Name {
			return x.Name < y.Name
		}
		return x.Step < y.Step
	})
	return c
}

func relChange(a, b uint64) *float64 {
	if a == 0 {
		return nil
	}
	r := (float64(b) - float64(a)) / float64(a)
	return &r
}

// diff is b − a, saturated to the int64 range.
func diff(b, a uint64) int64 {
	if b >= a {
		return int64(min(b-a, 1<<63-1))
	}
	return -int64(min(a-b, 1<<63))
}
