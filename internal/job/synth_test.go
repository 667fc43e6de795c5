package job

import (
	"testing"

	"github.com/candle-trace/candle-trace/internal/job/jobtest"
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
