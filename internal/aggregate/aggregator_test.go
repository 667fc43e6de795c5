package aggregate

import (
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/events"
)

// fakeClock is a clock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

const t0 = uint64(1_800_000_000) * 1e9

func spanByName(t *testing.T, s *Summary, name, step string) SpanStats {
	t.Helper()
	for _, sp := range s.Spans {
		if sp.Name == name && sp.Step == step {
			return sp
		}
	}
	t.Fatalf("no span %q step %q in %+v", name, step, s.Spans)
	return SpanStats{}
}

func TestStatisticsOfKnownInputs(t *testing.T) {
	tests := []struct {
		name                  string
		durations             []uint64
		count, total, min, mx uint64
		p50, p95, p99         uint64
		buckets               [][2]uint64
	}{
		{"one", []uint64{7}, 1, 7, 7, 7, 7, 7, 7, [][2]uint64{{7, 1}}},
		{"small exact values", []uint64{3, 1, 2, 5, 4}, 5, 15, 1, 5, 3, 5, 5, [][2]uint64{{1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}}},
		// 1000 and 1010 share bucket 111 [992, 1023]: the midpoint 1007;
		// the last rank is the max, exactly.
		{"one bucket", []uint64{1000, 1010, 1000, 1000}, 4, 4010, 1000, 1010, 1007, 1010, 1010, [][2]uint64{{111, 4}}},
		{"first and last rank", []uint64{993, 1022}, 2, 2015, 993, 1022, 993, 1022, 1022, [][2]uint64{{111, 2}}},
		// The midpoint 1007 of [992, 1023] is clamped to the min 1015.
		{"clamped", []uint64{1015, 1015, 1016, 1020}, 4, 4066, 1015, 1020, 1015, 1020, 1020, [][2]uint64{{111, 4}}},
		{"two modes", []uint64{100, 100, 100, 100, 100, 100, 100, 100, 100, 1_000_000}, 10, 1_000_900, 100, 1_000_000,
			// 100 is in [100, 103] → 101; p95 and p99 are the 10th value, the max.
			101, 1_000_000, 1_000_000, [][2]uint64{{57, 9}, {270, 1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := New()
			k, err := a.Intern("fwd", events.StepForward)
			require.NoError(t, err)
			for _, d := range tc.durations {
				a.Observe(k, d)
			}
			sp := spanByName(t, a.Snapshot(), "fwd", "forward")
			assert.Equal(t, SpanStats{
				Name: "fwd", Step: "forward", Count: tc.count, TotalNS: tc.total, MinNS: tc.min, MaxNS: tc.mx,
				MeanNS: float64(tc.total) / float64(tc.count), P50NS: tc.p50, P95NS: tc.p95, P99NS: tc.p99, Buckets: tc.buckets,
			}, sp)
			sorted := slices.Clone(tc.durations)
			slices.Sort(sorted)
			for _, p := range []struct {
				pct float64
				got uint64
			}{{50, sp.P50NS}, {95, sp.P95NS}, {99, sp.P99NS}} {
				assert.Equal(t, BucketIndex(exactPercentile(sorted, p.pct)), BucketIndex(p.got), "p%v", p.pct)
			}
		})
	}
}

func TestKeysPerNameAndStep(t *testing.T) {
	a := New()
	for _, st := range []events.Step{events.StepNone, events.StepForward, events.StepBackward} {
		require.NoError(t, a.ObserveSpan("linear", st, 10*uint64(st+1)))
	}
	require.NoError(t, a.ObserveSpan("linear", events.StepForward, 30))
	k1, _ := a.Intern("linear", events.StepForward)
	k2, _ := a.Intern("linear", events.StepForward)
	assert.Equal(t, k1, k2)
	s := a.Snapshot()
	require.Len(t, s.Spans, 3)
	// Sorted by total: forward 50, backward 30, none 10.
	assert.Equal(t, []string{"forward", "backward", ""}, []string{s.Spans[0].Step, s.Spans[1].Step, s.Spans[2].Step})
	assert.Equal(t, uint64(2), s.Spans[0].Count)
	assert.Equal(t, uint64(50), s.Spans[0].TotalNS)
}

func TestInternRefuses(t *testing.T) {
	a := New()
	for _, tc := range []struct {
		name string
		step events.Step
		err  string
	}{
		{OverflowName, events.StepNone, "reserved"},
		{"  ", events.StepNone, "blank"},
		{"\xff", events.StepNone, "UTF-8"},
		{strings.Repeat("x", MaxNameBytes+1), events.StepNone, "more than 1024"},
		{"ok", events.Step(4), "invalid step 4"},
	} {
		_, err := a.Intern(tc.name, tc.step)
		assert.ErrorContains(t, err, tc.err)
	}
	_, err := a.InternScalar(OverflowName)
	assert.ErrorIs(t, err, ErrReservedName)
}

func TestOverflowAndDropped(t *testing.T) {
	a := New(WithMaxKeys(2), WithMaxScalars(1))
	names := []string{"a", "b", "c", "d"}
	for i, n := range names {
		k, err := a.Intern(n, events.StepNone)
		require.NoError(t, err)
		if i >= 2 {
			assert.Equal(t, OverflowKey, k)
		}
		a.Observe(k, 100)
	}
	// The same refused name is refused (and counted) again.
	k, _ := a.Intern("c", events.StepNone)
	assert.Equal(t, OverflowKey, k)
	a.Observe(Key(99), 5)
	a.ObserveBatch([]Observation{{Key: 1, DurationNS: 1}, {Key: 1000, DurationNS: 1}})
	a.AddDropped(7)
	require.NoError(t, a.ScalarByLabel("loss", 1))
	require.NoError(t, a.ScalarByLabel("lr", 0.1))

	s := a.Snapshot()
	assert.Equal(t, Overflow{MaxKeys: 2, KeysRefused: 3, MaxScalars: 1, ScalarsRefused: 1}, s.Overflow)
	assert.Equal(t, Dropped{InvalidKey: 2, Producer: 7}, s.Dropped)
	ov := spanByName(t, s, OverflowName, "")
	assert.Equal(t, uint64(2), ov.Count)
	assert.Equal(t, uint64(2), spanByName(t, s, "a", "").Count)
	assert.Equal(t, []ScalarStats{
		{Label: OverflowName, Count: 1, Mean: 0.1, Min: 0.1, Max: 0.1, Last: 0.1},
		{Label: "loss", Count: 1, Mean: 1, Min: 1, Max: 1, Last: 1},
	}, s.Scalars)
}

func TestScalars(t *testing.T) {
	a := New()
	k, err := a.InternScalar("loss")
	require.NoError(t, err)
	for _, v := range []float64{4, 2, math.NaN(), 3, math.Inf(1), 1} {
		a.Scalar(k, v)
	}
	require.NoError(t, a.ScalarByLabel("only-nan", math.NaN()))
	s := a.Snapshot()
	assert.Equal(t, []ScalarStats{
		{Label: "loss", Count: 4, Mean: 2.5, Min: 1, Max: 4, Last: 1, NonFinite: 2},
		{Label: "only-nan", NonFinite: 1},
	}, s.Scalars)
}

func TestEnableDisablePeriods(t *testing.T) {
	clock := newFakeClock()
	a := New(WithClock(clock), WithEnabled(false), WithMaxPeriods(2))
	k, _ := a.Intern("step", events.StepNone)
	sk, _ := a.InternScalar("loss")
	a.Observe(k, 1) // disabled: ignored
	a.Scalar(sk, 1)
	buf := a.NewBuffer(4)
	buf.Observe(k, 1)
	buf.Flush()

	for i := range 3 { // three windows of 10 s enabled, 5 s apart
		clock.Advance(5 * time.Second)
		a.SetEnabled(true)
		a.SetEnabled(true) // no new period
		a.Observe(k, uint64(i+1))
		clock.Advance(10 * time.Second)
		a.SetEnabled(false)
	}
	clock.Advance(5 * time.Second)
	a.SetEnabled(true)
	clock.Advance(2 * time.Second)
	a.Observe(k, 10)

	s := a.Snapshot()
	assert.Equal(t, Window{StartUnixNS: t0, EndUnixNS: t0 + 52e9, DurationNS: 52e9}, s.Window)
	assert.Equal(t, Enabled{Now: true, Periods: 4, EnabledNS: 32e9, Recent: []Period{
		{StartUnixNS: t0 + 35e9, EndUnixNS: t0 + 45e9},
		{StartUnixNS: t0 + 50e9, EndUnixNS: t0 + 52e9, Open: true},
	}}, s.Enabled)
	sp := spanByName(t, s, "step", "")
	assert.Equal(t, uint64(4), sp.Count)
	assert.Equal(t, uint64(16), sp.TotalNS)
	assert.Empty(t, s.Scalars)
	require.NoError(t, withRun(s).Check())
}

// A batch was gated when produced: switching off does not lose it.
func TestBatchFoldedAfterDisable(t *testing.T) {
	a := New()
	k, _ := a.Intern("x", events.StepNone)
	buf := a.NewBuffer(8)
	buf.Observe(k, 5)
	a.SetEnabled(false)
	buf.Observe(k, 6) // ignored
	buf.Flush()
	assert.Equal(t, uint64(1), spanByName(t, a.Snapshot(), "x", "").Count)
}

// Many producers, through every path, while snapshots are taken: the
// totals are exact and every snapshot is consistent.
func TestConcurrentProducers(t *testing.T) {
	a := New()
	const producers, per = 8, 5000
	keys := make([]Key, 4)
	for i := range keys {
		keys[i], _ = a.Intern(string(rune('a'+i)), events.StepNone)
	}
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := a.NewBuffer(64)
			for i := range per {
				k := keys[(p+i)%len(keys)]
				switch p % 3 {
				case 0:
					a.Observe(k, uint64(i%100+1))
				case 1:
					buf.Observe(k, uint64(i%100+1))
				default:
					_ = a.ObserveSpan(string(rune('a'+(p+i)%len(keys))), events.StepNone, uint64(i%100+1))
				}
			}
			buf.Flush()
		}()
	}
	stop := make(chan struct{})
	snapErr := make(chan error, 1)
	go func() {
		defer close(snapErr)
		for {
			select {
			case <-stop:
				return
			default:
				if err := withRun(a.Snapshot()).Check(); err != nil {
					snapErr <- err
					return
				}
			}
		}
	}()
	wg.Wait()
	close(stop)
	require.NoError(t, <-snapErr)
	s := a.Snapshot()
	var count, total uint64
	for _, sp := range s.Spans {
		count += sp.Count
		total += sp.TotalNS
		assert.Equal(t, uint64(1), sp.MinNS)
		assert.Equal(t, uint64(100), sp.MaxNS)
	}
	assert.Equal(t, uint64(producers*per), count)
	assert.Equal(t, uint64(producers*per/100*5050), total)
}

func withRun(s *Summary) *Summary {
	s.Run = Run{Entrypoint: "e", Phase: "train", Device: "cpu", Tags: map[string]string{}}
	return s
}

// Observation matches the C record {uint32_t key; uint32_t pad; uint64_t
// duration_ns}, so a C buffer can be handed over as it is.
func TestObservationLayout(t *testing.T) {
	var o Observation
	assert.Equal(t, uintptr(16), unsafe.Sizeof(o))
	assert.Equal(t, uintptr(0), unsafe.Offsetof(o.Key))
	assert.Equal(t, uintptr(8), unsafe.Offsetof(o.DurationNS))
}
