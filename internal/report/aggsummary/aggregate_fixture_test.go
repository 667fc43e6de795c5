package aggsummary

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/candle-trace/candle-trace/internal/testutil"

	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/events"
)

// The summaries testdata/aggregate-{a,b}.json hold hand-chosen inputs, so
// that the report tests can assert numbers worked out by hand. They are
// written by this generator (CANDLE_TRACE_UPDATE_FIXTURES=1 go test -run
// TestAggregateFixtures ./internal/report) and otherwise only checked to be
// what it would write.

type fixedClock struct{ t time.Time }

func (c *fixedClock) Now() time.Time { return c.t }

// observeN observes n spans of d.
func observeN(t *testing.T, a *aggregate.Aggregator, name string, step events.Step, n int, d time.Duration) {
	k, err := a.Intern(name, step)
	require.NoError(t, err)
	for range n {
		a.Observe(k, uint64(d))
	}
}

// fixtureA is 1,000 training steps of 10 ms:
//
//	train_step           1000 × 10 ms   = 10 s   (encloses the rest)
//	mlp/forward  [fwd]   1000 × 3 ms    =  3 s
//	mlp/backward [bwd]   1000 × 4 ms    =  4 s
//	sgd/step     [opt]   1000 × 0.5 ms  =  0.5 s
//	dataloader/next       900 × 1 ms + 100 × 10 ms = 1.9 s
//	batch.to             1000 × 0.4 ms  =  0.4 s
//	log_metrics            10 × 20 ms   =  0.2 s
//
// and scalars loss (1, 2, 1, 2, ...: mean 1.5, last 2) and grad_norm
// (999 × 0.5 and one NaN).
func fixtureA(t *testing.T) *aggregate.Summary {
	clock := &fixedClock{time.Unix(1_800_000_000, 0)}
	a := aggregate.New(aggregate.WithClock(clock))
	observeN(t, a, "train_step", events.StepNone, 1000, 10*time.Millisecond)
	observeN(t, a, "mlp/forward", events.StepForward, 1000, 3*time.Millisecond)
	observeN(t, a, "mlp/backward", events.StepBackward, 1000, 4*time.Millisecond)
	observeN(t, a, "sgd/step", events.StepOptimizer, 1000, 500*time.Microsecond)
	observeN(t, a, "dataloader/next", events.StepNone, 900, time.Millisecond)
	observeN(t, a, "dataloader/next", events.StepNone, 100, 10*time.Millisecond)
	observeN(t, a, "batch.to", events.StepNone, 1000, 400*time.Microsecond)
	observeN(t, a, "log_metrics", events.StepNone, 10, 20*time.Millisecond)
	for i := range 1000 {
		require.NoError(t, a.ScalarByLabel("loss", float64(1+i%2)))
		v := 0.5
		if i == 500 {
			v = math.NaN()
		}
		require.NoError(t, a.ScalarByLabel("grad_norm", v))
	}
	clock.t = clock.t.Add(25 * time.Second)
	return finishFixture(a, "mlp::train", 7)
}

// fixtureB is fixtureA after a change: forward 3.5 ms (p50 +16.7%:
// regression), the loader at 0.5 ms for 900 steps (p50 −50%: improvement),
// batch.to 0.42 ms (+5%: within 10%), no log_metrics, a new checkpoint.
func fixtureB(t *testing.T) *aggregate.Summary {
	clock := &fixedClock{time.Unix(1_800_000_100, 0)}
	a := aggregate.New(aggregate.WithClock(clock))
	observeN(t, a, "train_step", events.StepNone, 1000, 10*time.Millisecond)
	observeN(t, a, "mlp/forward", events.StepForward, 1000, 3500*time.Microsecond)
	observeN(t, a, "mlp/backward", events.StepBackward, 1000, 4*time.Millisecond)
	observeN(t, a, "sgd/step", events.StepOptimizer, 1000, 500*time.Microsecond)
	observeN(t, a, "dataloader/next", events.StepNone, 900, 500*time.Microsecond)
	observeN(t, a, "dataloader/next", events.StepNone, 100, 10*time.Millisecond)
	observeN(t, a, "batch.to", events.StepNone, 1000, 420*time.Microsecond)
	observeN(t, a, "checkpoint", events.StepNone, 1, time.Second)
	clock.t = clock.t.Add(24 * time.Second)
	return finishFixture(a, "mlp::train", 9)
}

func finishFixture(a *aggregate.Aggregator, entrypoint string, seq uint64) *aggregate.Summary {
	s := a.Snapshot()
	s.Run = aggregate.Run{Entrypoint: entrypoint, Phase: "train", Device: "cuda:0", Binding: "python", Tags: map[string]string{"model": "mlp"}}
	s.Producer = aggregate.Producer{Name: "candle-trace", Version: "0.1.0", PID: 4242, Hostname: "gpu-1"}
	s.Sequence, s.Final = seq, true
	return s
}

func TestAggregateFixtures(t *testing.T) {
	for name, build := range map[string]func(*testing.T) *aggregate.Summary{"aggregate-a.json": fixtureA, "aggregate-b.json": fixtureB} {
		var buf bytes.Buffer
		require.NoError(t, build(t).Encode(&buf))
		p := filepath.Join(testutil.CorpusDir(t), name)
		if os.Getenv("CANDLE_TRACE_UPDATE_FIXTURES") != "" {
			require.NoError(t, os.WriteFile(p, buf.Bytes(), 0o644))
		}
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		require.Equal(t, buf.String(), string(data), "%s is stale: CANDLE_TRACE_UPDATE_FIXTURES=1 go test -run TestAggregateFixtures", p)
	}
}
