package traces

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

// Whatever a trace file holds, the export neither panics nor sends a span
// OTLP would refuse: every span has a span id and the trace's id, ends no
// earlier than it starts, and is counted once.
func FuzzBuild(f *testing.F) {
	for _, name := range []string{"demo.jsonl"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		require.NoError(f, err)
		f.Add(data)
	}
	for _, name := range []string{"valid-train.jsonl", "failed-capture_failed.jsonl", "partial-cut-line.jsonl", "bad-duplicate_span_start.jsonl"} {
		data, err := os.ReadFile(corpus(name))
		require.NoError(f, err)
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		sent := 0
		b, _, err := build(bytes.NewReader(data), Options{ServiceName: "fuzz", BatchSpans: 3}, func(td ptrace.Traces) error {
			ss := td.ResourceSpans().At(0).ScopeSpans().At(0).Spans()
			require.LessOrEqual(t, ss.Len(), 3)
			for i := 0; i < ss.Len(); i++ {
				sp := ss.At(i)
				require.False(t, sp.SpanID().IsEmpty())
				require.False(t, sp.TraceID().IsEmpty())
				require.GreaterOrEqual(t, sp.EndTimestamp(), sp.StartTimestamp())
			}
			sent += ss.Len()
			var m ptrace.ProtoMarshaler
			_, err := m.MarshalTraces(td)
			require.NoError(t, err)
			return nil
		})
		if err == nil {
			require.Equal(t, b.res.Spans, sent)
			require.GreaterOrEqual(t, sent, b.res.Ops+b.res.DeviceIntervals+b.res.OpenSpans)
		}
	})
}
