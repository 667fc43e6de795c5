package job

import (
	"fmt"
	"runtime"
	"sort"
	"sync"

	"github.com/candle-trace/candle-trace/internal/report/text"
)

// DefaultWaitThreshold is the share of their update the other ranks must
// spend waiting for one rank before it is called a straggler.
const DefaultWaitThreshold = 5.0

// PhaseNames are the phases the analysis splits an update into: the step
// tags, and the rest of the measured region.
var PhaseNames = []string{"forward", "backward", "optimizer", Outside}

// Outside names the time of the update in no span with a step tag.
const Outside = "outside phases"

// PhaseTime is a rank's time in one phase of the captured update.
type PhaseTime struct {
	Phase  string `json:"phase"`
	SpanNS int64  `json:"span_ns"` // the phase's spans (the rest of the update for Outside)
	WaitNS int64  `json:"wait_ns"` // of it, waiting for a later rank in a collective
	BusyNS int64  `json:"busy_ns"` // SpanNS - WaitNS
}

// RankStat is one rank's captured update.
type RankStat struct {
	Rank int64  `json:"rank"`
	Path string `json:"path"`
	// StartNS is when its update began, on the job clock.
	StartNS  int64 `json:"start_ns"`
	UpdateNS int64 `json:"update_ns"`
	// CollectiveNS is the time it had a collective under way (their union).
	CollectiveNS int64 `json:"collective_ns"`
	// WaitNS is the part of that spent waiting for a later rank: between
	// its enter and the last rank's, in no op of its own (with no ops in the
	// trace, all of it).
	WaitNS int64       `json:"wait_ns"`
	BusyNS int64       `json:"busy_ns"` // UpdateNS - WaitNS
	Phases []PhaseTime `json:"phases"`
	// LastIn is how many collectives it entered last; HeldNS how long it
	// kept another rank waiting in those: the longest such wait of a rank.
	LastIn int   `json:"last_in"`
	HeldNS int64 `json:"held_ns"`
	// waitedFor is this rank's waiting per rank that was last in.
	waitedFor map[int64]int64
}

func (r *RankStat) phase(name string) *PhaseTime {
	for i := range r.Phases {
		if r.Phases[i].Phase == name {
			return &r.Phases[i]
		}
	}
	return nil
}

// CollectiveStat is one collective as all ranks saw it.
type CollectiveStat struct {
	Index int    `json:"index"` // 1-based, in the order the ranks entered them
	Name  string `json:"name"`
	Bytes uint64 `json:"bytes"`
	// EnterNS and EndNS are each rank's, on the job clock, in trace order.
	EnterNS  []int64 `json:"enter_ns"`
	EndNS    []int64 `json:"end_ns"`
	LastRank int64   `json:"last_rank"`
	// EnterSkewNS is the last enter less the first; EndSpreadNS the same
	// for the ends (near 0 when the clocks are aligned).
	EnterSkewNS int64 `json:"enter_skew_ns"`
	EndSpreadNS int64 `json:"end_spread_ns"`
}

// Analysis states the straggler hypothesis, its numbers and the verdict,
// as the overhead analysis of a single trace does.
type Analysis struct {
	Hypothesis string  `json:"hypothesis"`
	Numbers    string  `json:"numbers"`
	Threshold  string  `json:"threshold"`
	Verdict    string  `json:"verdict"`
	Straggler  *int64  `json:"straggler_rank"` // nil: no straggler
	Phase      string  `json:"phase,omitempty"`
	SlowerPct  float64 `json:"slower_pct,omitempty"`
	Kind       string  `json:"kind,omitempty"` // compute-bound, host-bound, input-bound
}

// Job is the straggler analysis of one job's traces.
type Job struct {
	Traces      []*Trace         `json:"traces"`
	CaptureStep uint64           `json:"capture_step"` // 0 when the ranks differ
	Alignment   *Alignment       `json:"alignment"`
	Ranks       []RankStat       `json:"ranks"`
	Collectives []CollectiveStat `json:"collectives"`
	Analysis    Analysis         `json:"analysis"`
	Warnings    []string         `json:"warnings,omitempty"`
}

// ReadAll reads the traces of a job, keeping detail of each, and orders them
// by rank (meta.process.rank, else their position); two traces of one rank
// are refused.
//
// The traces are read GOMAXPROCS at a time: each read is one core's work
// (the line scan), and merge reads the whole job this way before it
// exports, so on N cores the job clock costs 1/N of a pass. Each read holds
// its buffer and its rank's collectives, never the trace.
func ReadAll(paths []string, detail Detail) ([]*Trace, error) {
	read := make([]*Trace, len(paths))
	errs := make([]error, len(paths))
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i, p := range paths {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			read[i], errs[i] = ReadFile(p, i, detail)
		}()
	}
	wg.Wait()
	var out []*Trace
	seen := map[int64]string{}
	for i, p := range paths {
		t, err := read[i], errs[i]
		if err != nil {
			return nil, err // the first file's error, whichever read ended first
		}
		if prev, dup := seen[t.Rank]; dup {
			return nil, fmt.Errorf("%s and %s both are rank %d (meta.process.rank, else file order); give one trace per rank", prev, p, t.Rank)
		}
		seen[t.Rank] = p
		out = append(out, t)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Rank < out[j].Rank })
	return out, nil
}

// Analyze aligns the ranks' traces and looks for a straggler. waitPct is
// the threshold: the share of their update the others must wait for one rank.
func Analyze(traces []*Trace, waitPct float64) (*Job, error) {
	if len(traces) < 2 {
		return nil, fmt.Errorf("a job view needs the traces of at least two ranks, got %d", len(traces))
	}
	j := &Job{Traces: traces, Alignment: Align(traces), CaptureStep: traces[0].CaptureStep}
	var ided *Trace // the first rank with a job id
	for _, t := range traces {
		if t.Measured == nil {
			return nil, fmt.Errorf("%s has no measured region: nothing to compare", t.Path)
		}
		if t.CaptureStep != j.CaptureStep {
			j.Warnings = append(j.Warnings, fmt.Sprintf("the ranks captured different updates (rank %d: %d, rank %d: %d): their times are not of the same step", traces[0].Rank, traces[0].CaptureStep, t.Rank, t.CaptureStep))
			j.CaptureStep = 0
		}
		if !t.Complete {
			j.Warnings = append(j.Warnings, fmt.Sprintf("%s is not a complete capture", t.Path))
		}
		// Traces without a job id (another binding, an older trace) say nothing either way.
		if t.JobID != "" && ided != nil && t.JobID != ided.JobID {
			j.Warnings = append(j.Warnings, fmt.Sprintf("the traces are of different jobs (job_id %s on rank %d, %s on rank %d): their clocks and collectives are not one job's", ided.JobID, ided.Rank, t.JobID, t.Rank))
		}
		if ided == nil && t.JobID != "" {
			ided = t
		}
	}
	j.Warnings = append(j.Warnings, j.Alignment.Warnings...)
	j.collectives()
	for i := range traces {
		j.Ranks = append(j.Ranks, j.rankStat(i))
	}
	for i := range j.Ranks {
		for _, o := range j.Ranks {
			j.Ranks[i].HeldNS = max(j.Ranks[i].HeldNS, o.waitedFor[j.Ranks[i].Rank])
		}
	}
	j.Analysis = verdict(j, waitPct)
	return j, nil
}

// collectives lines up the matched collectives of every rank on the job clock.
func (j *Job) collectives() {
	clocks := j.Alignment.Clocks
	for k := 0; k < j.Alignment.Matched; k++ {
		c := CollectiveStat{Index: k + 1, Name: j.Traces[0].Collectives[k].Name, Bytes: j.Traces[0].Collectives[k].Bytes}
		last := 0
		for i, t := range j.Traces {
			x := t.Collectives[k]
			c.EnterNS = append(c.EnterNS, int64(x.EnterNS)+clocks[i].OffsetNS)
			c.EndNS = append(c.EndNS, int64(x.EndNS)+clocks[i].OffsetNS)
			if c.EnterNS[i] > c.EnterNS[last] {
				last = i
			}
		}
		c.LastRank = j.Traces[last].Rank
		c.EnterSkewNS = spread(c.EnterNS)
		c.EndSpreadNS = spread(c.EndNS)
		j.Collectives = append(j.Collectives, c)
	}
}

// rankStat is trace i's update: its collectives' time, the waiting in them,
// and the busy time per phase.
func (j *Job) rankStat(i int) RankStat {
	t, off := j.Traces[i], j.Alignment.Clocks[i].OffsetNS
	m := t.Measured
	r := RankStat{Rank: t.Rank, Path: t.Path, StartNS: int64(m.StartNS) + off, UpdateNS: int64(m.EndNS - m.StartNS)}
	var in, wait []interval
	waitFor := map[int64][]interval{} // the last rank -> this rank's waits for it
	for _, c := range t.Collectives {
		in = append(in, interval{int64(c.EnterNS), int64(c.EndNS)})
	}
	for _, c := range j.Collectives {
		enter := c.EnterNS[i]
		lastEnter := enter
		for _, e := range c.EnterNS {
			lastEnter = max(lastEnter, e)
		}
		// From entering until the last rank arrived (or its own end, if that
		// came first), back on this rank's clock. A collective may be under
		// way while the rank computes (DDP all-reduces buckets while backward
		// goes on): only the time in no op of the rank is waiting (waitIn).
		w := interval{enter - off, min(lastEnter, c.EndNS[i]) - off}
		wait = append(wait, w)
		waitFor[c.LastRank] = append(waitFor[c.LastRank], w)
		if c.LastRank == t.Rank {
			r.LastIn++
		}
	}
	lo, hi := int64(m.StartNS), int64(m.EndNS)
	r.CollectiveNS = unionLength(clip(in, lo, hi))
	waitIn := func(iv []interval, lo, hi int64) int64 {
		if t.Ops == 0 { // no ops recorded: all of it
			return unionLength(clip(iv, lo, hi))
		}
		return lengthOutside(clip(iv, lo, hi), t.Busy)
	}
	r.WaitNS = waitIn(wait, lo, hi)
	r.BusyNS = r.UpdateNS - r.WaitNS
	r.waitedFor = map[int64]int64{}
	for last, iv := range waitFor {
		if last != t.Rank {
			r.waitedFor[last] = waitIn(iv, lo, hi)
		}
	}
	var phaseSpan, phaseWait int64
	for _, name := range PhaseNames[:len(PhaseNames)-1] {
		p := PhaseTime{Phase: name}
		for _, s := range t.Phases {
			if s.Step == name {
				p.SpanNS += int64(s.EndNS - s.StartNS)
				p.WaitNS += waitIn(wait, int64(s.StartNS), int64(s.EndNS))
			}
		}
		p.BusyNS = p.SpanNS - p.WaitNS
		phaseSpan += p.SpanNS
		phaseWait += p.WaitNS
		r.Phases = append(r.Phases, p)
	}
	rest := PhaseTime{Phase: Outside, SpanNS: r.UpdateNS - phaseSpan, WaitNS: r.WaitNS - phaseWait}
	rest.BusyNS = rest.SpanNS - rest.WaitNS
	r.Phases = append(r.Phases, rest)
	return r
}

// verdict names the straggler, if any: the rank that held the others back
// longest in the collectives (by update time when there are none), and the
// phase where its busy time exceeds the other ranks' median most.
func verdict(j *Job, waitPct float64) Analysis {
	a := Analysis{
		Hypothesis: "one rank holds the job back: it enters the collectives last and the other ranks wait for it",
		Threshold:  fmt.Sprintf("the other ranks wait for it > %.1f%% of their update", waitPct),
	}
	s := 0
	for i, r := range j.Ranks {
		best := j.Ranks[s]
		if r.HeldNS > best.HeldNS || (r.HeldNS == best.HeldNS && r.LastIn > best.LastIn) {
			s = i
		}
	}
	others := func(f func(r *RankStat) int64) int64 {
		var v []int64
		for i := range j.Ranks {
			if i != s {
				v = append(v, f(&j.Ranks[i]))
			}
		}
		return median(v)
	}
	st := &j.Ranks[s]
	otherUpdate := others(func(r *RankStat) int64 { return r.UpdateNS })
	var evidence float64 // the share (percent) that is compared with the threshold
	if len(j.Collectives) > 0 {
		otherWait := others(func(r *RankStat) int64 { return r.WaitNS })
		evidence = pct(otherWait, otherUpdate)
		a.Numbers = fmt.Sprintf("rank %d was last into %d of %d collectives and kept a rank waiting up to %s there; the other ranks waited %s (median), %.1f%% of their %s update",
			st.Rank, st.LastIn, len(j.Collectives), text.FormatNS(float64(st.HeldNS)), text.FormatNS(float64(otherWait)), evidence, text.FormatNS(float64(otherUpdate)))
	} else {
		a.Hypothesis = "one rank holds the job back: its update takes longer than the others' (no collectives were recorded to show the waiting)"
		a.Threshold = fmt.Sprintf("its update exceeds the other ranks' median by > %.1f%%", waitPct)
		for i, r := range j.Ranks {
			if r.UpdateNS > j.Ranks[s].UpdateNS {
				s = i
			}
		}
		st = &j.Ranks[s]
		otherUpdate = others(func(r *RankStat) int64 { return r.UpdateNS })
		evidence = pct(st.UpdateNS-otherUpdate, otherUpdate)
		a.Numbers = fmt.Sprintf("rank %d's update took %s, the other ranks' median %s (+%.1f%%)", st.Rank, text.FormatNS(float64(st.UpdateNS)), text.FormatNS(float64(otherUpdate)), evidence)
	}
	if evidence <= waitPct {
		a.Verdict = fmt.Sprintf("no straggler: %.1f%% <= %.1f%%; the ranks are balanced", evidence, waitPct)
		return a
	}
	rank := st.Rank
	a.Straggler = &rank
	// Where its time went: the phase whose busy time exceeds the others' most.
	bestPhase, bestExcess, bestBase := "", int64(0), int64(0)
	for _, name := range PhaseNames {
		mine := st.phase(name).BusyNS
		base := others(func(r *RankStat) int64 { return r.phase(name).BusyNS })
		if excess := mine - base; excess > bestExcess {
			bestPhase, bestExcess, bestBase = name, excess, base
		}
	}
	late := st.StartNS - others(func(r *RankStat) int64 { return r.StartNS })
	if bestPhase == "" || late > bestExcess {
		a.Kind = "input-bound"
		a.Verdict = fmt.Sprintf("rank %d is a straggler that starts its update %s after the others and is no slower inside it: input-bound straggler (data loading or work before the forward)", rank, text.FormatNS(float64(late)))
		return a
	}
	a.Phase = bestPhase
	a.SlowerPct = pct(bestExcess, bestBase)
	a.Kind = "compute-bound"
	if bestPhase == Outside {
		a.Kind = "host-bound"
	}
	slower := fmt.Sprintf("%.0f%% slower", a.SlowerPct)
	if bestBase <= 0 {
		slower = fmt.Sprintf("%s slower", text.FormatNS(float64(bestExcess)))
	}
	where := "in " + bestPhase
	if bestPhase == Outside {
		where = "outside forward, backward and optimizer"
	}
	a.Verdict = fmt.Sprintf("rank %d is %s %s (%s busy against the others' median %s): %s straggler",
		rank, slower, where, text.FormatNS(float64(st.phase(bestPhase).BusyNS)), text.FormatNS(float64(bestBase)), a.Kind)
	return a
}

func pct(part, whole int64) float64 {
	if whole <= 0 {
		return 0
	}
	return 100 * float64(part) / float64(whole)
}

func spread(v []int64) int64 {
	lo, hi := v[0], v[0]
	for _, x := range v {
		lo, hi = min(lo, x), max(hi, x)
	}
	return hi - lo
}
