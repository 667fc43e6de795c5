package session

import (
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"github.com/candle-trace/candle-trace/internal/testutil"
)

// BenchmarkAggregateUpdate is one training update of an aggregate session
// (a step span around a forward span, and the loss) without a push,
// pushing every 5 ms to a real collector, and to a collector that is down:
// the push must cost the update nothing.
func BenchmarkAggregateUpdate(b *testing.B) {
	col := testutil.StartCollector(b)
	down := "http://127.0.0.1:" + strconv.Itoa(testutil.FreePort(b))
	for _, bc := range []struct{ name, run string }{
		{"no-push", `{"entrypoint":"agg::train","phase":"train","device":"cpu","mode":"aggregate","aggregate_interval_ms":5}`},
		{"push-collector", string(pushRun(col.Endpoint(), 5))},
		{"push-down", string(pushRun(down, 5))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			// Span stacks are per thread, and b.Run runs b on a goroutine
			// of its own.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			s, err := Open(filepath.Join(b.TempDir(), "summary.json"), []byte(bc.run))
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				update(b, s, i)
			}
			b.StopTimer()
			if err := s.Finish(); err != nil {
				b.Fatal(err)
			}
			if s.aggr.push != nil {
				st := s.aggr.push.Stats()
				b.ReportMetric(float64(st.Pushed), "pushed")
				b.ReportMetric(float64(st.Dropped), "dropped")
			}
		})
	}
}
