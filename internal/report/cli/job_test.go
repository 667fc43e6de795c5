package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/candle-trace/candle-trace/internal/job/jobtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slowJob writes a 3-rank job whose rank 1 is 8 ms slower in forward and
// whose rank 2 opened its trace with a wall clock 2 ms off.
func slowJob(t *testing.T) (jobtest.Job, []string) {
	m := jobtest.Even(3)
	m.Ranks[1].Fwd += 8_000_000
	m.Ranks[2].AnchorErr = 2_000_000
	paths, err := m.Write(t.TempDir())
	require.NoError(t, err)
	return m, paths
}

func TestJobReport(t *testing.T) {
	_, paths := slowJob(t)
	code, out, errOut := run(append([]string{"validate"}, paths...)...)
	require.Equal(t, ExitOK, code, "the synthetic ranks are valid traces:\n%s%s", out, errOut)
	code, out, errOut = run(append([]string{"report"}, paths...)...)
	require.Equal(t, ExitOK, code, errOut)
	assert.Contains(t, out, "Job: 3 ranks, capture step 3 on every rank (m::train)")
	assert.Contains(t, out, "refined by the ends of 2 collectives")
	assert.Contains(t, out, "verdict:    rank 1 is 80% slower in forward")
	assert.Contains(t, out, "compute-bound straggler")

	code, out, _ = run(append([]string{"report", "--json", "--threshold", "95"}, paths...)...)
	require.Equal(t, ExitOK, code)
	var doc struct {
		Analysis struct {
			Straggler *int64 `json:"straggler_rank"`
			Verdict   string
		}
		Ranks []struct{ Rank int64 }
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	assert.Nil(t, doc.Analysis.Straggler, "the others wait 8 ms of ~40: under a 95%% threshold")
	assert.Contains(t, doc.Analysis.Verdict, "no straggler")
	assert.Len(t, doc.Ranks, 3)
}

func TestMergeUsesTheJobClock(t *testing.T) {
	m, paths := slowJob(t)
	out := filepath.Join(t.TempDir(), "job.json")
	code, _, errOut := run(append([]string{"merge", "-o", out}, paths...)...)
	require.Equal(t, ExitOK, code, errOut)
	assert.Contains(t, errOut, "clocks refined by the ends of 2 collectives every rank shares")
	// Rank 2's wall clock said 2 ms later than it opened; the merge places it
	// where it opened: its offset is its true open time.
	assert.Contains(t, errOut, "rank 2 (meta.process.rank)")
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	var doc struct {
		TraceEvents []struct {
			Name string
			Ph   string
			Pid  int64
			Ts   float64
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(data, &doc))
	starts := map[int64]float64{}
	for _, e := range doc.TraceEvents {
		if e.Ph == "X" && e.Name == "update" {
			starts[e.Pid] = e.Ts
		}
	}
	require.Len(t, starts, 3)
	for _, r := range m.Ranks { // every update starts at the same true instant
		assert.InDelta(t, float64(r.Start)/1e3, starts[int64(r.Rank)+1], 1e-6, "rank %d", r.Rank)
	}
}
