package job

import (
	"os"
	"testing"

	"github.com/candle-trace/candle-trace/internal/job/jobtest"
	"github.com/candle-trace/candle-trace/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func writeJob(t *testing.T, m jobtest.Job) []string {
	paths, err := m.Write(t.TempDir())
	require.NoError(t, err)
	return paths
}

func analyzed(t *testing.T, m jobtest.Job) *Job {
	traces, err := ReadAll(writeJob(t, m), ForAnalysis)
	require.NoError(t, err)
	j, err := Analyze(traces, DefaultWaitThreshold)
	require.NoError(t, err)
	return j
}

// TestSyntheticRanksAreValidTraces: the jobs the tests analyse are traces
// candle-graph accepts, in every variant the tests use.
func TestSyntheticRanksAreValidTraces(t *testing.T) {
	m := jobtest.Even(4)
	m.Early = true
	m.Ranks[1].Fwd += 5_000_000
	m.Ranks[1].NoOps = true
	m.Ranks[2].NoWall = true
	m.Ranks[3].NoRank = true
	m.Ranks[3].AnchorErr = -300_000
	for _, p := range writeJob(t, m) {
		testutil.RequireValid(t, p)
	}
}

// TestLargeJob: the benchmarks' big synthetic job, small, is a job of
// valid traces whose collectives line the ranks up and whose straggler is
// the slow rank; OpsFor sizes a trace to within 2%.
func TestLargeJob(t *testing.T) {
	m := jobtest.Large{Ranks: 3, Ops: jobtest.OpsFor(2 << 20), Slow: 2, JobID: "j"}
	paths, err := m.Write(t.TempDir())
	require.NoError(t, err)
	for _, p := range paths {
		testutil.RequireValid(t, p)
		st, err := os.Stat(p)
		require.NoError(t, err)
		assert.InEpsilon(t, 2<<20, st.Size(), 0.02, p)
	}
	traces, err := ReadAll(paths, ForAnalysis)
	require.NoError(t, err)
	al := Align(traces)
	want := (m.Ops-m.Ops/3)/1000 + 1 // and the last bucket
	assert.Equal(t, want, al.Matched)
	for _, c := range al.Clocks { // session clocks open 1 ms apart, the wall anchors say so
		assert.Equal(t, int64(0), c.CorrectionNS, "rank %d", c.Rank)
	}
	j, err := Analyze(traces, DefaultWaitThreshold)
	require.NoError(t, err)
	require.NotNil(t, j.Analysis.Straggler, j.Analysis.Verdict)
	assert.Equal(t, int64(2), *j.Analysis.Straggler, j.Analysis.Verdict)
}
