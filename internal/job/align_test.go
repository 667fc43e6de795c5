package job

import (
	"testing"

	"github.com/candle-trace/candle-trace/internal/job/jobtest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAlign(t *testing.T) {
	withErr := func(m jobtest.Job, rank int, err int64) jobtest.Job {
		m.Ranks[rank].AnchorErr = err
		return m
	}
	tests := []struct {
		name    string
		model   jobtest.Job
		matched int
		warns   int
	}{
		{"exact wall clocks need no correction", jobtest.Even(2), 2, 0},
		{"a wall anchor 3 ms late is corrected by the collectives", withErr(jobtest.Even(2), 1, 3_000_000), 2, 0},
		{"anchor errors on three of four ranks", withErr(withErr(withErr(jobtest.Even(4), 1, -700_000), 2, 2_500_000), 3, 41_000), 2, 0},
		{"a slow rank does not move the clocks", func() jobtest.Job { m := jobtest.Even(3); m.Ranks[2].Fwd += 40_000_000; return m }(), 2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			traces, err := ReadAll(writeJob(t, tt.model), ForAnalysis)
			require.NoError(t, err)
			al := Align(traces)
			assert.Equal(t, tt.matched, al.Matched)
			assert.Len(t, al.Warnings, tt.warns)
			// On the job clock every rank's true instants coincide: the
			// offset of rank r is its true open time less the earliest
			// rank's, whatever its wall anchor said.
			for i, r := range tt.model.Ranks {
				c := al.Clocks[i]
				assert.Equal(t, int64(r.Rank), c.Rank)
				assert.Equal(t, r.Open-tt.model.Ranks[0].Open, c.OffsetNS, "rank %d", r.Rank)
				assert.Equal(t, -r.AnchorErr+tt.model.Ranks[0].AnchorErr, c.CorrectionNS, "rank %d", r.Rank)
				assert.Zero(t, c.ResidualNS)
			}
		})
	}
}

func TestAlignPartialEvidence(t *testing.T) {
	t.Run("no collectives: the wall clocks alone", func(t *testing.T) {
		m := jobtest.Even(2)
		m.Collectives = nil
		m.Ranks[1].AnchorErr = 3_000_000
		traces, err := ReadAll(writeJob(t, m), ForAnalysis)
		require.NoError(t, err)
		al := Align(traces)
		assert.Zero(t, al.Matched)
		assert.Equal(t, m.Ranks[1].Open+m.Ranks[1].AnchorErr, al.Clocks[1].OffsetNS)
	})
	t.Run("collectives that differ are matched up to the first difference", func(t *testing.T) {
		m := jobtest.Even(2)
		m.Ranks[1].AnchorErr = 250_000
		paths := writeJob(t, m)
		traces, err := ReadAll(paths, ForAnalysis)
		require.NoError(t, err)
		traces[1].Collectives[1].Bytes++ // rank 1's second bucket is another size
		al := Align(traces)
		assert.Equal(t, 1, al.Matched)
		require.Len(t, al.Warnings, 1)
		assert.Contains(t, al.Warnings[0], "collective 2 differs")
		assert.Equal(t, m.Ranks[1].Open, al.Clocks[1].OffsetNS, "one shared end still corrects the anchor")
	})
	t.Run("buckets a rank entered in the other order are paired by name and bytes", func(t *testing.T) {
		m := jobtest.Even(2)
		m.Ranks[1].AnchorErr = 250_000
		traces, err := ReadAll(writeJob(t, m), ForAnalysis)
		require.NoError(t, err)
		require.Len(t, traces[1].Collectives, 2)
		require.NotEqual(t, traces[1].Collectives[0].Bytes, traces[1].Collectives[1].Bytes, "the job's buckets differ in size")
		want := traces[1].Collectives[0]
		c := traces[1].Collectives
		c[0], c[1] = c[1], c[0] // gloo's workers started rank 1's buckets the other way round
		al := Align(traces)
		assert.Equal(t, 2, al.Matched)
		assert.Empty(t, al.Warnings)
		assert.Equal(t, want, traces[1].Collectives[0], "rank 1's first collective is again the reference's first bucket")
		assert.Equal(t, m.Ranks[1].Open, al.Clocks[1].OffsetNS)
	})
	t.Run("a trace without a wall clock is placed by the collectives", func(t *testing.T) {
		m := jobtest.Even(2)
		m.Ranks[1].NoWall = true
		traces, err := ReadAll(writeJob(t, m), ForAnalysis)
		require.NoError(t, err)
		al := Align(traces)
		require.Len(t, al.Warnings, 1)
		assert.Contains(t, al.Warnings[0], "no meta.clock.wall_unix_ns_at_open")
		assert.Equal(t, m.Ranks[1].Open, al.Clocks[1].OffsetNS)
	})
}
