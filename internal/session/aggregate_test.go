package session

import (
	"fmt"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/events"
)

const aggregateRun = `{"entrypoint":"agg::train","phase":"train","device":"cpu","mode":"aggregate","aggregate_interval_ms":60000,"tags":{"job":"t"}}`

func TestAggregateSessionFoldsSpansPerNameAndStep(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	path := filepath.Join(t.TempDir(), "summary.json")
	s, err := Open(path, []byte(aggregateRun))
	require.NoError(t, err)
	const steps = 3000
	for i := 0; i < steps; i++ {
		step, err := s.BeginSpan("train/step", events.SpanFunction, events.StepNone)
		require.NoError(t, err)
		fwd, err := s.BeginSpan("forward", events.SpanModule, events.StepForward)
		require.NoError(t, err)
		require.NoError(t, s.EndSpan(fwd))
		if i%3 == 0 {
			opt, err := s.BeginSpan("optimizer", events.SpanFunction, events.StepOptimizer)
			require.NoError(t, err)
			require.NoError(t, s.EndSpan(opt))
		}
		require.NoError(t, s.RecordScalar(step, "loss", float64(i)))
		if i < 10 {
			_, err := s.RecordCompletedSpan("data/load", events.SpanFunction, 0, 1000+uint64(i))
			require.NoError(t, err)
		}
		require.NoError(t, s.EndSpan(step))
		if i == 999 {
			require.NoError(t, s.SetAggregateEnabled(false))
		}
		if i == 1999 {
			require.NoError(t, s.SetAggregateEnabled(true))
		}
	}
	require.NoError(t, s.Finish())

	sum, err := aggregate.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "agg::train", sum.Run.Entrypoint)
	assert.Equal(t, map[string]string{"job": "t"}, sum.Run.Tags)
	assert.True(t, sum.Final)
	counts := map[string]uint64{}
	for _, sp := range sum.Spans {
		counts[fmt.Sprintf("%s/%s", sp.Name, sp.Step)] = sp.Count
		assert.LessOrEqual(t, sp.MinNS, sp.MaxNS)
		assert.LessOrEqual(t, sp.P50NS, sp.P99NS)
	}
	// Steps 1000..1999 ran while statistics were off.
	assert.Equal(t, uint64(2000), counts["train/step/"], counts)
	assert.Equal(t, uint64(2000), counts["forward/forward"], counts)
	assert.Equal(t, uint64(667), counts["optimizer/optimizer"], counts) // i%3==0 for i in [0,1000) ∪ [2000,3000)
	assert.Equal(t, uint64(10), counts["data/load/"], "completed spans are folded too")
	require.Len(t, sum.Scalars, 1)
	assert.Equal(t, "loss", sum.Scalars[0].Label)
	assert.Equal(t, float64(2999), sum.Scalars[0].Last)
}

func TestAggregateSessionRefusesWhatTraceSessionsRefuse(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s, err := Open(filepath.Join(t.TempDir(), "summary.json"), []byte(aggregateRun))
	require.NoError(t, err)
	a, err := s.BeginSpan("a", events.SpanFunction, events.StepNone)
	require.NoError(t, err)
	requireCode(t, s.Finish(), State, "1 spans still open")
	requireCode(t, s.RecordScalar(a, " ", 1), InvalidArgument, "label")
	require.NoError(t, s.EndSpan(a))
	require.NoError(t, s.Finish())

	tr, _ := openT(t, trainRun)
	requireCode(t, tr.SetAggregateEnabled(true), State, "is a trace session")
}

// Aggregate spans are timed in ticks (the cycle counter where it runs at a
// constant rate, else CLOCK_MONOTONIC) and converted when folded: either way
// a span's duration lies between what it waited and what its caller saw.
func TestAggregateSpanDurationsOnEitherClock(t *testing.T) {
	t.Cleanup(func() { forceTicks(tickCounter) })
	for _, source := range []int{tickMonotonic, tickCounter} {
		got := forceTicks(source)
		t.Run(fmt.Sprintf("source-%d", got), func(t *testing.T) {
			runtime.LockOSThread() // spans nest per OS thread
			defer runtime.UnlockOSThread()
			path := filepath.Join(t.TempDir(), "summary.json")
			s, err := Open(path, []byte(aggregateRun))
			require.NoError(t, err)
			const n, wait = 20, 2 * time.Millisecond
			var outer []time.Duration
			for i := 0; i < n; i++ {
				t0 := time.Now()
				id, err := s.BeginSpan("sleep", events.SpanFunction, events.StepNone)
				require.NoError(t, err)
				time.Sleep(wait)
				require.NoError(t, s.EndSpan(id))
				outer = append(outer, time.Since(t0))
			}
			require.NoError(t, s.Finish())
			sum, err := aggregate.ReadFile(path)
			require.NoError(t, err)
			require.Len(t, sum.Spans, 1)
			sp := sum.Spans[0]
			assert.Equal(t, uint64(n), sp.Count)
			longest := outer[0]
			for _, d := range outer {
				longest = max(longest, d)
			}
			assert.GreaterOrEqual(t, float64(sp.MinNS), 0.999*float64(wait.Nanoseconds()))
			assert.LessOrEqual(t, float64(sp.MaxNS), 1.001*float64(longest.Nanoseconds())+1000)
		})
	}
}
