package analysis

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// genTrace writes a valid, complete inference trace with a demo-like event
// mix: per step a module span, and per op an op record, a tensor, a device
// interval, and an alloc/free pair; plus device-memory samples and data
// edges. It grows until it holds at least minBytes.
func genTrace(minBytes int) []byte {
	b := make([]byte, 0, minBytes+64<<10)
	b = append(b, `{"kind":"meta","schema":"candle-graph/trace/10","run_id":"bench-1","correlation_id":"bench::infer/inference-1","entrypoint":"bench::infer","phase":"infer","timestamp":"2026-08-20T00:00:00.000Z","capture_step":1,"warmup_steps":0,"device":"cuda:0","measured_region_device_synchronized":true,"timing_mode":"host","capture_contract":{"measurement_scope":"profiled_work","operations":"complete","activations":"partial","tensors":"partial","gradients":"none","logical_memory":"complete","physical_memory":"partial","device_timing":"partial","required_semantic_labels":[]},"tags":{"producer":"go"},"producer":{"name":"candle-trace","version":"0.1.0","binding":"go"}}`+"\n"...)
	b = append(b, `{"kind":"span_start","id":"s1","name":"bench::infer","start_ns":0,"span_kind":"function","measured":false,"tid":1}`+"\n"...)
	b = append(b, `{"kind":"span_start","id":"s2","parent_id":"s1","name":"bench/measured","start_ns":10,"span_kind":"function","measured":true,"tid":1}`+"\n"...)
	ops := []string{"matmul", "add", "relu", "softmax", "layer_norm", "gelu"}
	ts := uint64(100)
	spanN, tensorN := 2, 0
	for len(b) < minBytes {
		spanN++
		span := spanN
		start := ts
		b = fmt.Appendf(b, `{"kind":"span_start","id":"s%d","parent_id":"s2","name":"bench/layer","start_ns":%d,"span_kind":"module","measured":false,"step":"forward","tid":1}`+"\n", span, ts)
		for i, op := range ops {
			tensorN++
			in, out := tensorN-1, tensorN
			ts += 10
			b = fmt.Appendf(b, `{"kind":"op","span_id":"s%d","op_name":"%s","inputs":["t%d","w%d"],"output":"t%d","shape":[32,128],"dtype":"f32","device":"cuda:0","duration_ns":%d,"timestamp_ns":%d,"input_dense_bytes":32768}`+"\n", span, op, in, i, out, 40+i, ts)
			b = fmt.Appendf(b, `{"kind":"device_interval","span_id":"s%d","device":"cuda:0","stream_id":"7","clock_id":"host-monotonic","backend":"cuda","start_ns":%d,"duration_ns":%d,"name":"%s_kernel"}`+"\n", span, ts+5, 30+i, op)
			b = fmt.Appendf(b, `{"kind":"memory","timestamp_ns":%d,"storage_id":"cuda-%d","tensor_id":"t%d","span_id":"s%d","op_name":"%s","device":"cuda:0","bytes":16384,"action":"alloc","shape":[32,128],"dtype":"f32","category":"activation"}`+"\n", ts+50, out, out, span, op)
			b = fmt.Appendf(b, `{"kind":"tensor","span_id":"s%d","tensor_id":"t%d","shape":[32,128],"dtype":"f32","device":"cuda:0","requires_grad":false,"category":"activation"}`+"\n", span, out)
			if i > 0 {
				b = fmt.Appendf(b, `{"kind":"memory","timestamp_ns":%d,"storage_id":"cuda-%d","tensor_id":"t%d","span_id":"s%d","device":"cuda:0","bytes":16384,"action":"free","shape":[32,128],"dtype":"f32","category":"activation"}`+"\n", ts+60, in, in, span)
				b = fmt.Appendf(b, `{"kind":"edge","edge_kind":"data","from_tensor":"t%d","to_tensor":"t%d"}`+"\n", in, out)
			}
			ts += 60
		}
		b = fmt.Appendf(b, `{"kind":"memory","timestamp_ns":%d,"storage_id":"cuda-%d","tensor_id":"t%d","span_id":"s%d","device":"cuda:0","bytes":16384,"action":"free","shape":[32,128],"dtype":"f32","category":"activation"}`+"\n", ts, tensorN, tensorN, span)
		b = fmt.Appendf(b, `{"kind":"device_memory","timestamp_ns":%d,"device":"cuda:0","used_bytes":%d,"reserved_bytes":67108864}`+"\n", ts, 1<<20+span)
		ts += 10
		b = fmt.Appendf(b, `{"kind":"span_end","id":"s%d","duration_ns":%d}`+"\n", span, ts-start)
		b = fmt.Appendf(b, `{"kind":"edge","edge_kind":"call","from_span":"s2","to_span":"s%d","host_duration_ns":%d}`+"\n", span, ts-start)
		ts += 5
	}
	b = fmt.Appendf(b, `{"kind":"span_end","id":"s2","duration_ns":%d}`+"\n", ts-10)
	b = fmt.Appendf(b, `{"kind":"span_end","id":"s1","duration_ns":%d}`+"\n", ts+5)
	b = fmt.Appendf(b, `{"kind":"terminal","outcome":"complete","timestamp_ns":%d}`+"\n", ts+5)
	return b
}

// TestWriteBenchTrace writes a generated trace of $CANDLE_TRACE_BENCH_BYTES
// (default 1 GiB) to $CANDLE_TRACE_BENCH_OUT, for measuring the built
// command on a real file (BENCHMARKS.md, "Report tool"). Skipped otherwise.
func TestWriteBenchTrace(t *testing.T) {
	out := os.Getenv("CANDLE_TRACE_BENCH_OUT")
	if out == "" {
		t.Skip("set CANDLE_TRACE_BENCH_OUT to write a benchmark trace")
	}
	size := 1 << 30
	if s := os.Getenv("CANDLE_TRACE_BENCH_BYTES"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		size = n
	}
	require.NoError(t, os.WriteFile(out, genTrace(size), 0o644))
}
