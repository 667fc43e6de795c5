package aggregate

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/events"
)

// flatKeys is 10 K (name, step) keys: 2,500 names × 4 steps.
const flatKeys = 10_000

// flatLoad interns flatKeys keys and returns a function that makes
// observation i: key i mod flatKeys, with a duration in the power of two
// [base, 2·base), base = 1024 ns << ((i / flatKeys) mod 10). The first
// 10·flatKeys observations touch every (key, octave) pair, so they are the
// warm-up after which nothing new is allocated.
func flatLoad(tb testing.TB) (*Aggregator, func(i int)) {
	a := New(WithMaxKeys(flatKeys))
	keys := make([]Key, flatKeys)
	for i := range keys {
		k, err := a.Intern("layer"+itoa(i/4)+"/op", events.Step(i%4))
		require.NoError(tb, err)
		require.NotEqual(tb, OverflowKey, k)
		keys[i] = k
	}
	return a, func(i int) {
		base := uint64(1024) << ((i / flatKeys) % 10)
		x := uint64(i) * 0x9E3779B97F4A7C15 // a cheap scramble, deterministic
		a.Observe(keys[i%flatKeys], base+(x>>32)%base)
	}
}

const flatWarmup = 10 * flatKeys

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// Memory stays flat: after the warm-up, 1.9 M more observations over the
// same 10 K keys add nothing to the heap (within a small tolerance for the
// runtime's own bookkeeping).
func TestMemoryFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("2 M observations")
	}
	a, observe := flatLoad(t)
	const total = 2_000_000
	for i := range flatWarmup {
		observe(i)
	}
	warm := heapInUse()
	for i := flatWarmup; i < total; i++ {
		observe(i)
	}
	end := heapInUse()
	t.Logf("heap in use after %d observations (warm-up): %d B; after %d: %d B; growth %d B",
		flatWarmup, warm, total, end, int64(end)-int64(warm))
	require.LessOrEqual(t, end, warm+max(warm/100, 256<<10), "heap grew from %d to %d", warm, end)

	s := a.Snapshot()
	require.Len(t, s.Spans, flatKeys)
	var count uint64
	for _, sp := range s.Spans {
		count += sp.Count
	}
	require.Equal(t, uint64(total), count)
	runtime.KeepAlive(a)
}

// BenchmarkMemoryFlat10M runs the check at full size — 10 M
// observations over 10 K keys — and reports the heap in use after the
// warm-up and its growth by the end.
func BenchmarkMemoryFlat10M(b *testing.B) {
	const total = 10_000_000
	for b.Loop() {
		a, observe := flatLoad(b)
		for i := range flatWarmup {
			observe(i)
		}
		warm := heapInUse()
		for i := flatWarmup; i < total; i++ {
			observe(i)
		}
		end := heapInUse()
		b.ReportMetric(float64(warm), "heap-warm-B")
		b.ReportMetric(float64(int64(end)-int64(warm)), "heap-growth-B")
		runtime.KeepAlive(a)
	}
}
