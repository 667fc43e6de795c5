package aggregate

import (
	"bytes"
	"sync/atomic"
	"testing"

	"github.com/candle-trace/candle-trace/internal/events"
)

func benchKeys(b *testing.B, a *Aggregator, n int) []Key {
	keys := make([]Key, n)
	for i := range keys {
		var err error
		if keys[i], err = a.Intern("span"+itoa(i), events.StepForward); err != nil {
			b.Fatal(err)
		}
	}
	return keys
}

// BenchmarkObserve is the cost of one span through the locked path, one
// producer.
func BenchmarkObserve(b *testing.B) {
	a := New()
	keys := benchKeys(b, a, 16)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		a.Observe(keys[i&15], uint64(1000+i&1023))
		i++
	}
}

// BenchmarkObserveDisabled is the cost while switched off.
func BenchmarkObserveDisabled(b *testing.B) {
	a := New(WithEnabled(false))
	k := benchKeys(b, a, 1)[0]
	b.ReportAllocs()
	for b.Loop() {
		a.Observe(k, 1000)
	}
}

// BenchmarkObserveParallel: every producer through the one mutex — the
// contention a per-thread buffer avoids.
func BenchmarkObserveParallel(b *testing.B) {
	a := New()
	keys := benchKeys(b, a, 16)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			a.Observe(keys[i&15], uint64(1000+i&1023))
			i++
		}
	})
}

// BenchmarkBufferParallel: one Buffer per producer, flushed every 1024.
func BenchmarkBufferParallel(b *testing.B) {
	a := New()
	keys := benchKeys(b, a, 16)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		buf := a.NewBuffer(0)
		i := 0
		for pb.Next() {
			buf.Observe(keys[i&15], uint64(1000+i&1023))
			i++
		}
		buf.Flush()
	})
}

// BenchmarkObserveBatch is the per-observation cost of folding a batch of
// 1024, as a C per-thread buffer would hand over (ns/op is per
// observation).
func BenchmarkObserveBatch(b *testing.B) {
	a := New()
	keys := benchKeys(b, a, 16)
	batch := make([]Observation, 1024)
	for i := range batch {
		batch[i] = Observation{Key: keys[i&15], DurationNS: uint64(1000 + i)}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n += len(batch) {
		a.ObserveBatch(batch[:min(len(batch), b.N-n)])
	}
}

// BenchmarkObserveSpan interns by name on every call (a map lookup).
func BenchmarkObserveSpan(b *testing.B) {
	a := New()
	b.ReportAllocs()
	for b.Loop() {
		_ = a.ObserveSpan("mlp/forward", events.StepForward, 1000)
	}
}

// BenchmarkSnapshotEncode: a summary of 256 keys, each with durations over
// three octaves, built and encoded (what a periodic rewrite costs before
// the file system).
func BenchmarkSnapshotEncode(b *testing.B) {
	a := New()
	keys := benchKeys(b, a, 256)
	for i := range 256 * 1000 {
		a.Observe(keys[i%256], uint64(1000+i%7000))
	}
	var buf bytes.Buffer
	var size atomic.Int64
	b.ReportAllocs()
	for b.Loop() {
		buf.Reset()
		s := a.Snapshot()
		s.Run = testRun
		if err := s.Encode(&buf); err != nil {
			b.Fatal(err)
		}
		size.Store(int64(buf.Len()))
	}
	b.ReportMetric(float64(size.Load()), "summary-B")
}
