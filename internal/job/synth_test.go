package job

import (
	"testing"

	"github.com/candle-trace/candle-trace/internal/job/jobtest"
	"github.com/candle-trace/candle-trace/internal/testutil"
	"github.com/stretchr/testify/require"
)

func writeJob(t *testing.T, m jobtest.Job) []string {
	paths, err := m.Write(t.TempDir())
	require.NoError(t, err)
	return paths
}

func analyzed(t *testing.T, m jobtest.Job) *Job {
	traces, err := ReadAll(writeJob(t, m))
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
