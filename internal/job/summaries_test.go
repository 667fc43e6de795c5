package job

import (
	"fmt"
	"testing"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rankSummary is a rank's whole-run summary of n updates: forward takes
// fwd each, backward 20 ms; the rank tag as the binding writes it.
func rankSummary(t *testing.T, rank string, n int, fwd uint64) *aggregate.Summary {
	a := aggregate.New()
	for i := 0; i < n; i++ {
		require.NoError(t, a.ObserveSpan("train/forward", events.StepForward, fwd))
		require.NoError(t, a.ObserveSpan("train/backward", events.StepBackward, 20_000_000))
	}
	s := a.Snapshot()
	s.Run = aggregate.Run{Entrypoint: "m::train", Phase: "train", Device: "cpu", Tags: map[string]string{}}
	if rank != "" {
		s.Run.Tags["rank"] = rank
	}
	return s
}

func TestMergeSummaries(t *testing.T) {
	// Given in another order than their ranks: the tags decide.
	sums := []*aggregate.Summary{rankSummary(t, "2", 10, 12_000_000), rankSummary(t, "0", 10, 8_000_000), rankSummary(t, "1", 5, 8_000_000)}
	r, err := MergeSummaries([]string{"c.json", "a.json", "b.json"}, sums)
	require.NoError(t, err)
	assert.Equal(t, []int64{0, 1, 2}, r.Ranks)
	assert.Equal(t, []string{"a.json", "b.json", "c.json"}, r.Paths)
	require.Len(t, r.Rows, 2)
	bwd, fwd := r.Rows[0], r.Rows[1] // by the job's total: 25 x 20 ms, then 10x12 + 15x8 ms
	assert.Equal(t, "train/backward", bwd.Name)
	assert.Equal(t, uint64(25), bwd.Count)
	assert.Equal(t, uint64(25*20_000_000), bwd.TotalNS)
	assert.Equal(t, "train/forward", fwd.Name)
	assert.Equal(t, []uint64{10, 5, 10}, fwd.Counts)
	assert.Equal(t, uint64(10*12_000_000+15*8_000_000), fwd.TotalNS)
	assert.Equal(t, int64(2), fwd.SlowestRank)
	// Each rank's p50 is its own summary's; the spread is theirs.
	p50 := []uint64{sums[1].Spans[1].P50NS, sums[2].Spans[1].P50NS, sums[0].Spans[1].P50NS}
	require.Equal(t, "train/forward", sums[1].Spans[1].Name)
	assert.Equal(t, p50, fwd.P50s)
	assert.InDelta(t, 100*(float64(p50[2])-float64(p50[0]))/float64(p50[0]), fwd.SpreadPct, 1e-9)
	// The job's p50 comes from the added histograms: 15 of 25 observations are 8 ms.
	assert.Equal(t, p50[0], fwd.P50NS)
	assert.Equal(t, uint64(12_000_000), fwd.MaxNS)
	assert.Equal(t, []uint64{8_000_000, 8_000_000, 12_000_000}, fwd.Maxes)
}

func TestMergeSummariesRanks(t *testing.T) {
	untagged := []*aggregate.Summary{rankSummary(t, "", 1, 1), rankSummary(t, "", 1, 1)}
	r, err := MergeSummaries([]string{"x", "y"}, untagged)
	require.NoError(t, err)
	assert.Equal(t, []int64{0, 1}, r.Ranks, "no rank tag: the file order")
	_, err = MergeSummaries([]string{"x", "y"}, []*aggregate.Summary{rankSummary(t, "3", 1, 1), rankSummary(t, "3", 1, 1)})
	assert.ErrorContains(t, err, fmt.Sprintf("both are rank %d", 3))
}
