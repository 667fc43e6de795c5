package traces

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/testutil"

	"github.com/candle-trace/candle-trace/internal/otlp"
)

// benchConfig receives OTLP/HTTP and drops it (the nop exporter), so that
// the figure is the export and the collector's receiver, not a file
// exporter's JSON encoding.
const benchConfig = `receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:%d
exporters:
  nop:
service:
  telemetry:
    logs:
      level: warn
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [nop]
`

// writeBigTrace writes a trace of about events lines: a root, then layers
// of a span with 8 ops each (10 lines a layer), as a long training step
// with every op recorded would be.
func writeBigTrace(tb testing.TB, path string, events int) (spans int) {
	tb.Helper()
	meta, err := os.ReadFile(filepath.Join("testdata", "demo.jsonl"))
	require.NoError(tb, err)
	f, err := os.Create(path)
	require.NoError(tb, err)
	w := bufio.NewWriterSize(f, 1<<20)
	w.Write(meta[:strings.IndexByte(string(meta), '\n')+1])
	fmt.Fprintln(w, `{"kind":"span_start","id":"s1","name":"train::run","start_ns":0,"span_kind":"function","measured":true,"tid":1}`)
	layers := (events - 3) / 10
	ts := uint64(10)
	for i := 0; i < layers; i++ {
		id := i + 2
		fmt.Fprintf(w, `{"kind":"span_start","id":"s%d","parent_id":"s1","name":"layer%d/forward","start_ns":%d,"span_kind":"module","step":"forward","tid":1}`+"\n", id, i%48, ts)
		for k := 0; k < 8; k++ {
			fmt.Fprintf(w, `{"kind":"op","span_id":"s%d","op_name":"aten::linear","inputs":["t%d"],"output":"t%d","shape":[64,256],"dtype":"f32","device":"cpu","duration_ns":%d,"timestamp_ns":%d,"input_dense_bytes":65536}`+"\n", id, 8*i+k, 8*i+k+1, 900+k, ts+1+uint64(k)*1000)
		}
		ts += 9000
		fmt.Fprintf(w, `{"kind":"span_end","id":"s%d","duration_ns":8990}`+"\n", id)
	}
	fmt.Fprintf(w, `{"kind":"span_end","id":"s1","duration_ns":%d,"tracer_ns":0}`+"\n", ts)
	fmt.Fprintf(w, `{"kind":"terminal","outcome":"complete","timestamp_ns":%d}`+"\n", ts)
	require.NoError(tb, w.Flush())
	require.NoError(tb, f.Close())
	return 1 + layers*9
}

// BenchmarkExportTrace1M exports a trace of a million lines (900,001
// spans) to a local collector and reports spans/s and the largest heap
// seen while it ran.
func BenchmarkExportTrace1M(b *testing.B) {
	col := testutil.StartCollectorWith(b, func(port int, _, _ string) string { return fmt.Sprintf(benchConfig, port) })
	path := filepath.Join(b.TempDir(), "big.jsonl")
	want := writeBigTrace(b, path, 1_000_003)
	st, err := os.Stat(path)
	require.NoError(b, err)
	c, err := otlp.NewClient(col.Endpoint(), otlp.ClientOptions{})
	require.NoError(b, err)

	var peak atomic.Uint64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		for {
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		res, err := ExportFile(context.Background(), path, c, Options{})
		require.NoError(b, err)
		require.Equal(b, want, res.Spans)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	close(stop)
	<-done
	b.ReportMetric(float64(want*b.N)/elapsed.Seconds(), "spans/s")
	b.ReportMetric(float64(st.Size()*int64(b.N))/elapsed.Seconds()/1e6, "MB/s")
	b.ReportMetric(float64(peak.Load())/(1<<20), "peak-heap-MiB")
}
