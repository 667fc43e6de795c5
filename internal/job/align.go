package job

import (
	"fmt"
	"math"
)

// RankClock puts one rank's session clock on the job's: a time t of the
// rank's trace is t + OffsetNS on the job clock.
type RankClock struct {
	Rank int64 `json:"rank"`
	// WallOffsetNS is how much later than the earliest rank the trace was
	// opened, by meta.clock.wall_unix_ns_at_open (0 without a wall clock).
	WallOffsetNS int64 `json:"wall_offset_ns"`
	// CorrectionNS is what the collectives' end times add: the median, over
	// the collectives matched with the reference rank, of how much earlier
	// this rank's end was.
	CorrectionNS int64 `json:"correction_ns"`
	// OffsetNS is WallOffsetNS + CorrectionNS, shifted so that the smallest
	// offset of the job is 0.
	OffsetNS int64 `json:"offset_ns"`
	// ResidualNS is the largest difference, after the correction, between
	// this rank's end of a matched collective and the reference rank's.
	ResidualNS int64 `json:"residual_ns"`
}

// Alignment is how the ranks were put on one clock.
type Alignment struct {
	Clocks []RankClock `json:"clocks"` // in the order of the traces
	// Reference is the rank the others are corrected to (the lowest).
	Reference int64 `json:"reference_rank"`
	// Matched is how many collectives every rank has in the same order
	// (same name and bytes): the ones that refine the clocks and that the
	// straggler analysis compares.
	Matched  int      `json:"matched_collectives"`
	Warnings []string `json:"warnings,omitempty"`
}

// Align puts the traces (sorted by rank) on one clock: wall clocks at open
// first, then the collectives' end times, which every rank shares.
func Align(traces []*Trace) *Alignment {
	a := &Alignment{Clocks: make([]RankClock, len(traces))}
	if len(traces) == 0 {
		return a
	}
	var earliest uint64
	first := true
	for _, t := range traces {
		if t.HasWall && (first || t.WallNS < earliest) {
			earliest, first = t.WallNS, false
		}
	}
	for i, t := range traces {
		a.Clocks[i].Rank = t.Rank
		if t.HasWall {
			a.Clocks[i].WallOffsetNS = int64(t.WallNS - earliest)
		} else {
			a.Warnings = append(a.Warnings, fmt.Sprintf("%s has no meta.clock.wall_unix_ns_at_open: its clock starts at 0 until collectives place it", t.Path))
		}
	}
	a.Reference = traces[0].Rank
	a.Matched = matched(traces, &a.Warnings)
	ref := traces[0]
	for i := 1; i < len(traces) && a.Matched > 0; i++ {
		t, c := traces[i], &a.Clocks[i]
		d := make([]int64, a.Matched)
		for k := range d {
			refEnd := int64(ref.Collectives[k].EndNS) + a.Clocks[0].WallOffsetNS
			end := int64(t.Collectives[k].EndNS) + c.WallOffsetNS
			d[k] = refEnd - end
		}
		c.CorrectionNS = median(d)
		for _, x := range d {
			c.ResidualNS = max(c.ResidualNS, abs(x-c.CorrectionNS))
		}
	}
	lowest := int64(math.MaxInt64)
	for _, c := range a.Clocks {
		lowest = min(lowest, c.WallOffsetNS+c.CorrectionNS)
	}
	for i := range a.Clocks {
		a.Clocks[i].OffsetNS = a.Clocks[i].WallOffsetNS + a.Clocks[i].CorrectionNS - lowest
	}
	return a
}

// matched is the length of the run of collectives that every trace has in
// the same order with the same name and bytes as the first trace's, once
// each trace's collectives are paired with the reference's (pairByKey).
func matched(traces []*Trace, warnings *[]string) int {
	ref := traces[0].Collectives
	n := len(ref)
	for _, t := range traces[1:] {
		pairByKey(t.Collectives, ref)
		if len(t.Collectives) != len(ref) {
			*warnings = append(*warnings, fmt.Sprintf("rank %d took part in %d collectives, rank %d in %d: only the first common ones are matched", t.Rank, len(t.Collectives), traces[0].Rank, len(ref)))
		}
		k := 0
		for k < min(n, len(t.Collectives)) && t.Collectives[k].Name == ref[k].Name && t.Collectives[k].Bytes == ref[k].Bytes {
			k++
		}
		if k < min(len(ref), len(t.Collectives)) {
			c, r := t.Collectives[k], ref[k]
			*warnings = append(*warnings, fmt.Sprintf("collective %d differs: rank %d %s of %d bytes, rank %d %s of %d bytes; matched up to it", k+1, t.Rank, c.Name, c.Bytes, traces[0].Rank, r.Name, r.Bytes))
		}
		n = min(n, k)
	}
	return n
}

// pairByKey reorders c so that its k-th collective is the one of the same
// name and bytes as ref's k-th: the n-th occurrence of a (name, bytes) pair
// on one rank is the n-th on the other. The order a rank enters collectives
// in is the order a backend's worker threads pick them up, and with two
// workers gloo can start DDP's two buckets in either order on each rank: in
// entry order, bucket 1 on one rank would be paired with bucket 2 on the
// other. Collectives with no partner keep their entry order after the
// paired ones, where the first of them ends the matched run.
func pairByKey(c, ref []Collective) {
	type key struct {
		name  string
		bytes uint64
	}
	queued := map[key][]int{} // indexes into c, in entry order, by key
	for i, x := range c {
		k := key{x.Name, x.Bytes}
		queued[k] = append(queued[k], i)
	}
	out := make([]Collective, 0, len(c))
	used := make([]bool, len(c))
	for _, r := range ref {
		k := key{r.Name, r.Bytes}
		q := queued[k]
		if len(q) == 0 {
			break
		}
		out = append(out, c[q[0]])
		used[q[0]] = true
		queued[k] = q[1:]
	}
	for i, x := range c {
		if !used[i] {
			out = append(out, x)
		}
	}
	copy(c, out)
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
