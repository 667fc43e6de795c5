package job

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/candle-trace/candle-trace/internal/job/jobtest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStragglerVerdict(t *testing.T) {
	slow := func(m jobtest.Job, rank int, f func(r *jobtest.Rank)) jobtest.Job {
		f(&m.Ranks[rank])
		return m
	}
	const delay = 12_000_000
	tests := []struct {
		name      string
		model     jobtest.Job
		straggler int // -1: none
		phase     string
		kind      string
		// the straggler's excess busy time in its phase, and the others' busy time there
		excess, base int64
	}{
		{"rank 1 of 2 slow in forward", slow(jobtest.Even(2), 1, func(r *jobtest.Rank) { r.Fwd += delay }), 1, "forward", "compute-bound", delay, 10_000_000},
		{"rank 3 of 4 slow in forward, with a late wall anchor", slow(slow(jobtest.Even(4), 3, func(r *jobtest.Rank) { r.Fwd += delay }), 3, func(r *jobtest.Rank) { r.AnchorErr = 2_000_000 }), 3, "forward", "compute-bound", delay, 10_000_000},
		// backward returns once the last bucket is all-reduced: the others' busy
		// backward is its compute and the transfer after the last enter.
		{"rank 2 of 4 slow in backward", slow(jobtest.Even(4), 2, func(r *jobtest.Rank) { r.Bwd += 3 * delay }), 2, "backward", "compute-bound", 3 * delay, 20_000_000 + jobtest.Even(1).Xfer},
		{"rank 0 starts late: input-bound", slow(jobtest.Even(3), 0, func(r *jobtest.Rank) { r.Start += delay }), 0, "", "input-bound", 0, 0},
		{"balanced ranks", jobtest.Even(4), -1, "", "", 0, 0},
		{"a 1% slower rank is within the threshold", slow(jobtest.Even(2), 1, func(r *jobtest.Rank) { r.Fwd += 300_000 }), -1, "", "", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := analyzed(t, tt.model)
			a := j.Analysis
			if tt.straggler < 0 {
				assert.Nil(t, a.Straggler, a.Verdict)
				assert.Contains(t, a.Verdict, "no straggler")
				return
			}
			require.NotNil(t, a.Straggler, a.Verdict)
			assert.Equal(t, int64(tt.straggler), *a.Straggler)
			assert.Equal(t, tt.kind, a.Kind)
			assert.Equal(t, tt.phase, a.Phase)
			assert.Contains(t, a.Verdict, fmt.Sprintf("rank %d ", tt.straggler))
			assert.Contains(t, a.Verdict, tt.kind+" straggler")
			if tt.phase != "" {
				assert.InDelta(t, 100*float64(tt.excess)/float64(tt.base), a.SlowerPct, 1e-9)
				assert.Contains(t, a.Verdict, fmt.Sprintf("%.0f%% slower in %s", a.SlowerPct, tt.phase))
			}
			// Every collective was entered last by the straggler.
			for _, c := range j.Collectives {
				assert.Equal(t, int64(tt.straggler), c.LastRank, "collective %d", c.Index)
				assert.Zero(t, c.EndSpreadNS, "aligned ends")
			}
		})
	}
}

// TestRankTimes checks the per-rank numbers against the model: the others
// wait in the collectives exactly as long as the straggler is late into
// them, and the waiting is taken out of their backward.
func TestRankTimes(t *testing.T) {
	const delay = 7_000_000
	m := jobtest.Even(3)
	m.Collectives = m.Collectives[:1] // one bucket: the wait is one interval
	m.Ranks[1].Fwd += delay
	j := analyzed(t, m)
	require.Len(t, j.Ranks, 3)
	for i, r := range j.Ranks {
		mr := m.Ranks[i]
		enter := m.Enter(mr, 0)
		wait := m.Enter(m.Ranks[1], 0) - enter
		assert.Equal(t, wait, r.WaitNS, "rank %d", r.Rank)
		assert.Equal(t, m.End(0)-enter, r.CollectiveNS, "rank %d", r.Rank)
		bwd := r.phase("backward")
		assert.Equal(t, wait, bwd.WaitNS, "rank %d: the wait lies in backward", r.Rank)
		assert.Equal(t, r.UpdateNS-r.WaitNS, r.BusyNS)
		assert.Equal(t, mr.Fwd, r.phase("forward").BusyNS, "rank %d", r.Rank)
		assert.Equal(t, mr.Opt, r.phase("optimizer").BusyNS, "rank %d", r.Rank)
		var sum int64
		for _, p := range r.Phases {
			sum += p.SpanNS
		}
		assert.Equal(t, r.UpdateNS, sum, "the phases and the rest make up the update")
		if i == 1 {
			assert.Equal(t, 1, r.LastIn)
			assert.Equal(t, int64(delay), r.HeldNS)
		} else {
			assert.Zero(t, r.LastIn)
		}
	}
	c := j.Collectives[0]
	assert.Equal(t, int64(delay), c.EnterSkewNS)
	assert.Equal(t, m.Collectives[0], c.Bytes)
}

// TestWaitingIsTimeWithoutOps: DDP all-reduces a bucket while backward goes
// on; the rank waits only once its compute is done, and with no ops in the
// trace all of the time before the last rank's enter counts.
func TestWaitingIsTimeWithoutOps(t *testing.T) {
	const delay = 15_000_000 // more than the 10 ms of backward after the enter
	for _, noOps := range []bool{false, true} {
		t.Run(fmt.Sprintf("no ops %v", noOps), func(t *testing.T) {
			m := jobtest.Even(2)
			m.Collectives = m.Collectives[:1]
			m.Early = true // entered half-way through backward
			m.Ranks[1].Fwd += delay
			for i := range m.Ranks {
				m.Ranks[i].NoOps = noOps
			}
			j := analyzed(t, m)
			r0, late := m.Ranks[0], m.Enter(m.Ranks[1], 0)
			want := late - (r0.Start + r0.Fwd + r0.Bwd) // from the end of its compute
			if noOps {
				want = late - m.Enter(r0, 0) // from its enter
			}
			assert.Equal(t, want, j.Ranks[0].WaitNS)
			assert.Equal(t, want, j.Ranks[0].phase("backward").WaitNS)
			require.NotNil(t, j.Analysis.Straggler)
			assert.Equal(t, int64(1), *j.Analysis.Straggler)
		})
	}
}

func TestNoCollectives(t *testing.T) {
	m := jobtest.Even(3)
	m.Collectives = nil
	m.Ranks[2].Opt += 20_000_000
	j := analyzed(t, m)
	require.NotNil(t, j.Analysis.Straggler, j.Analysis.Verdict)
	assert.Equal(t, int64(2), *j.Analysis.Straggler)
	assert.Equal(t, "optimizer", j.Analysis.Phase)
	assert.Contains(t, j.Analysis.Hypothesis, "no collectives")
	assert.InDelta(t, 1000.0, j.Analysis.SlowerPct, 1e-9) // 20 ms more than 2 ms
}

func TestAnalyzeRefuses(t *testing.T) {
	m := jobtest.Even(2)
	paths := writeJob(t, m)
	one, err := ReadAll(paths[:1], ForAnalysis)
	require.NoError(t, err)
	_, err = Analyze(one, DefaultWaitThreshold)
	assert.ErrorContains(t, err, "at least two ranks")
	_, err = ReadAll([]string{paths[0], paths[0]}, ForAnalysis)
	assert.ErrorContains(t, err, "both are rank 0")
}

// TestReadAllOrder: the traces are read concurrently, yet come back by rank
// whatever the order of the files, and a bad file's error is the first bad
// file's in the order given, as when they were read one by one.
func TestReadAllOrder(t *testing.T) {
	paths := writeJob(t, jobtest.Even(6))
	dir := filepath.Dir(paths[0])
	missing, empty := filepath.Join(dir, "missing.jsonl"), filepath.Join(dir, "empty.jsonl")
	require.NoError(t, os.WriteFile(empty, nil, 0o644))
	for _, tc := range []struct {
		name  string
		paths []string
		err   string
	}{
		{"reversed", []string{paths[5], paths[4], paths[3], paths[2], paths[1], paths[0]}, ""},
		{"shuffled", []string{paths[3], paths[0], paths[5], paths[1], paths[4], paths[2]}, ""},
		{"missing before empty", []string{paths[0], missing, paths[1], empty}, "missing.jsonl: no such file"},
		{"empty before missing", []string{paths[0], empty, paths[1], missing}, "empty.jsonl: no meta record"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			traces, err := ReadAll(tc.paths, ForAnalysis)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			for r, tr := range traces {
				assert.Equal(t, int64(r), tr.Rank)
				assert.Equal(t, paths[r], tr.Path)
			}
		})
	}
}

// TestAnalyzeWarnsOfAnotherJob: ranks whose job_id tags differ are not one
// job; ranks without one are taken as they come.
func TestAnalyzeWarnsOfAnotherJob(t *testing.T) {
	for _, tc := range []struct {
		name string
		jobs []string // per rank: its job_id
		warn bool
	}{
		{"one job", []string{"j1", "j1", "j1"}, false},
		{"no job ids", []string{"", "", ""}, false},
		{"one rank without", []string{"j1", "", "j1"}, false},
		{"another job", []string{"j1", "j1", "j2"}, true},
		{"another job after one without", []string{"", "j1", "j2"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var paths []string
			for r, id := range tc.jobs {
				m := jobtest.Even(3)
				m.JobID = id
				all := writeJob(t, m)
				paths = append(paths, all[r])
			}
			traces, err := ReadAll(paths, ForAnalysis)
			require.NoError(t, err)
			for r, tr := range traces {
				assert.Equal(t, tc.jobs[r], tr.JobID)
			}
			j, err := Analyze(traces, DefaultWaitThreshold)
			require.NoError(t, err)
			var warned []string
			for _, w := range j.Warnings {
				if strings.Contains(w, "different jobs") {
					warned = append(warned, w)
				}
			}
			if tc.warn {
				first := 0
				if tc.jobs[0] == "" {
					first = 1
				}
				assert.Equal(t, []string{fmt.Sprintf("the traces are of different jobs (job_id j1 on rank %d, j2 on rank 2): their clocks and collectives are not one job's", first)}, warned)
			} else {
				assert.Empty(t, warned)
			}
		})
	}
}
