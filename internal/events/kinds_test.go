package events

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/traceformat"
)

// TestWriterKindsAreTraceformats: the writer spells record kinds, edge kinds
// and outcomes as literal JSON prefixes (they cost nothing at run time);
// every one of them must be a spelling of traceformat, and together they
// must cover all of its record kinds.
func TestWriterKindsAreTraceformats(t *testing.T) {
	r, err := ParseRun([]byte(`{"entrypoint":"demo::infer","phase":"infer","capture_step":1,"device":"cpu"}`))
	require.NoError(t, err)
	x := MetaExtras{RunID: "run-1", Timestamp: "2026-08-20T00:00:00.000Z", ProducerName: "candle-trace", ProducerVersion: "0.1.0",
		ProducerBinding: "c", PID: 1, Hostname: "h", Rank: -1, WorldSize: -1}
	lines := [][]byte{
		r.AppendMeta(nil, x),
		AppendSpanStart(nil, 2, 1, "fwd", 1, SpanModule, false, StepForward, 1),
		AppendSpanEnd(nil, 2, 5),
		AppendMeasuredSpanEnd(nil, 2, 5, 1),
		AppendOp(nil, &Op{SpanID: 2, OpName: "matmul", Dtype: "f32", Device: "cpu"}),
		AppendTensor(nil, &Tensor{SpanID: 2, TensorID: "t", Dtype: "f32", Device: "cpu"}),
		AppendTensorStats(nil, &TensorStats{SpanID: 2, Label: "l", Dtype: "f32", Elements: 1}),
		AppendMemory(nil, &Memory{SpanID: 2, StorageID: "s", TensorID: "t", Device: "cpu", Dtype: "f32", Action: MemoryFree}),
		AppendDeviceMemory(nil, &DeviceMemory{Device: "cuda:0"}),
		AppendDeviceInterval(nil, &DeviceInterval{SpanID: 2, Device: "cuda:0", StreamID: "7", ClockID: "c", Backend: "b", DurationNs: 1}),
		AppendGradient(nil, 1, "vb", "w", GradientNonFinite, 0, false),
		AppendCallEdge(nil, 1, 2, 5),
		AppendDataEdge(nil, "a", "b"),
		AppendTerminal(nil, true, 9, "", TracerTime{}),
		AppendTerminal(nil, false, 9, "why", TracerTime{}),
	}
	seen := map[string]bool{}
	for _, l := range lines {
		m := decodeLine(t, l)
		kind, _ := m["kind"].(string)
		assert.Contains(t, traceformat.Kinds, kind, "%s", l)
		seen[kind] = true
		fields := []struct {
			key    string
			values []string
		}{
			{"edge_kind", traceformat.EdgeKinds}, {"outcome", traceformat.Outcomes}, {"span_kind", traceformat.SpanKinds},
			{"step", traceformat.Steps}, {"action", traceformat.MemoryActions}, {"state", traceformat.GradientStates},
			{"category", traceformat.Categories}, {"phase", traceformat.Phases}, {"timing_mode", traceformat.TimingModes},
			{"schema", []string{traceformat.Schema}},
		}
		for _, f := range fields {
			if v, ok := m[f.key]; ok {
				assert.Contains(t, f.values, v, "%s of %s", f.key, l)
			}
		}
	}
	assert.Len(t, seen, len(traceformat.Kinds), "every record kind is written by some Append function")
}
