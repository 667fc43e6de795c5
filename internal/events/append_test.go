package events

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Each case states the whole expected object: assert.Equal on maps also proves that every
// absent optional field is absent and that nothing extra is written.

func TestAppendSpanStart(t *testing.T) {
	tests := []struct {
		name string
		line []byte
		want map[string]any
	}{
		{
			name: "root, no step, no tid",
			line: AppendSpanStart(nil, 1, 0, "demo::train", 0, SpanFunction, false, StepNone, 0),
			want: map[string]any{"kind": "span_start", "id": "s1", "name": "demo::train", "start_ns": num("0"), "span_kind": "function"},
		},
		{
			name: "child with step and tid",
			line: AppendSpanStart(nil, 42, 7, "fwd", 18446744073709551615, SpanModule, true, StepBackward, 12345),
			want: map[string]any{"kind": "span_start", "id": "s42", "parent_id": "s7", "name": "fwd", "start_ns": num("18446744073709551615"),
				"span_kind": "module", "measured": true, "step": "backward", "tid": num("12345")},
		},
		{
			name: "negative tid omitted, op kind, optimizer step",
			line: AppendSpanStart(nil, 3, 1, "x", 5, SpanOp, false, StepOptimizer, -4),
			want: map[string]any{"kind": "span_start", "id": "s3", "parent_id": "s1", "name": "x", "start_ns": num("5"), "span_kind": "op", "step": "optimizer"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, decodeLine(t, tt.line))
		})
	}
}

func TestAppendSpanEndAndEdges(t *testing.T) {
	tests := []struct {
		name string
		line []byte
		want map[string]any
	}{
		{"span_end", AppendSpanEnd(nil, 9, 1500), map[string]any{"kind": "span_end", "id": "s9", "duration_ns": num("1500")}},
		{"call edge", AppendCallEdge(nil, 2, 3, 400), map[string]any{"kind": "edge", "edge_kind": "call", "from_span": "s2", "to_span": "s3", "host_duration_ns": num("400")}},
		{"data edge", AppendDataEdge(nil, "t0", "t\"2"), map[string]any{"kind": "edge", "edge_kind": "data", "from_tensor": "t0", "to_tensor": "t\"2"}},
		{"terminal complete drops reason", AppendTerminal(nil, true, 800, "ignored", TracerTime{}), map[string]any{"kind": "terminal", "outcome": "complete", "timestamp_ns": num("800"), "tracer_ns": num("0"), "tracer_estimated_ns": num("0")}},
		{"terminal failed", AppendTerminal(nil, false, 90, "oom\nat step 3", TracerTime{12, 5}), map[string]any{"kind": "terminal", "outcome": "failed", "timestamp_ns": num("90"), "reason": "oom\nat step 3", "tracer_ns": num("12"), "tracer_estimated_ns": num("5")}},
		{"terminal failed without reason", AppendTerminal(nil, false, 90, "", TracerTime{}), map[string]any{"kind": "terminal", "outcome": "failed", "timestamp_ns": num("90"), "tracer_ns": num("0"), "tracer_estimated_ns": num("0")}},
		{"buffered terminal states what was dropped", AppendBufferedTerminal(nil, false, 90, "nan loss", TracerTime{12, 5}, Dropped{Records: 7, Bytes: 1234}), map[string]any{"kind": "terminal", "outcome": "failed", "timestamp_ns": num("90"), "reason": "nan loss", "tracer_ns": num("12"), "tracer_estimated_ns": num("5"), "dropped_records": num("7"), "dropped_bytes": num("1234")}},
		{"buffered terminal with nothing dropped", AppendBufferedTerminal(nil, true, 800, "", TracerTime{}, Dropped{}), map[string]any{"kind": "terminal", "outcome": "complete", "timestamp_ns": num("800"), "tracer_ns": num("0"), "tracer_estimated_ns": num("0"), "dropped_records": num("0"), "dropped_bytes": num("0")}},
		{"measured span end states the tracer's time", AppendMeasuredSpanEnd(nil, 2, 600, 45), map[string]any{"kind": "span_end", "id": "s2", "duration_ns": num("600"), "tracer_ns": num("45")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, decodeLine(t, tt.line))
		})
	}
}

func TestAppendOp(t *testing.T) {
	tests := []struct {
		name string
		op   Op
		want map[string]any
	}{
		{
			name: "all fields",
			op: Op{SpanID: 3, OpName: "matmul", Dtype: "f32", Device: "cpu", Inputs: []string{"t0", "t1"}, Output: "t2", HasOutput: true,
				Shape: []uint64{2, 3}, DurationNs: 300, TimestampNs: 250, OutputDenseBytes: 24, HasOutputDenseBytes: true, InputDenseBytes: 48},
			want: map[string]any{"kind": "op", "span_id": "s3", "op_name": "matmul", "inputs": []any{"t0", "t1"}, "output": "t2",
				"shape": []any{num("2"), num("3")}, "dtype": "f32", "device": "cpu", "duration_ns": num("300"), "timestamp_ns": num("250"),
				"output_dense_bytes": num("24"), "input_dense_bytes": num("48")},
		},
		{
			name: "nil slices are [] and optional fields absent",
			op:   Op{SpanID: 1, OpName: "relu", Dtype: "x", Device: "cpu", Output: "ignored without HasOutput"},
			want: map[string]any{"kind": "op", "span_id": "s1", "op_name": "relu", "inputs": []any{}, "shape": []any{},
				"dtype": "x", "device": "cpu", "duration_ns": num("0"), "timestamp_ns": num("0"), "input_dense_bytes": num("0")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, decodeLine(t, AppendOp(nil, &tt.op)))
		})
	}
}

func TestAppendTensor(t *testing.T) {
	tests := []struct {
		name string
		in   Tensor
		want map[string]any
	}{
		{
			name: "all fields",
			in: Tensor{SpanID: 3, TensorID: "t2", Dtype: "f32", Device: "cpu", Label: "demo/out", Shape: []uint64{2, 3},
				RequiresGrad: true, DenseBytes: 24, HasDenseBytes: true, Category: CategoryParameter},
			want: map[string]any{"kind": "tensor", "span_id": "s3", "tensor_id": "t2", "label": "demo/out", "shape": []any{num("2"), num("3")},
				"dtype": "f32", "device": "cpu", "requires_grad": true, "dense_bytes": num("24"), "category": "parameter"},
		},
		{
			name: "no label, no dense bytes, scalar shape",
			in:   Tensor{SpanID: 1, TensorID: "t", Dtype: "q4", Device: "cuda:0"},
			want: map[string]any{"kind": "tensor", "span_id": "s1", "tensor_id": "t", "shape": []any{}, "dtype": "q4", "device": "cuda:0",
				"requires_grad": false, "category": "other"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, decodeLine(t, AppendTensor(nil, &tt.in)))
		})
	}
}

func TestAppendTensorStats(t *testing.T) {
	s := TensorStats{SpanID: 3, Label: "demo/out", Dtype: "f32", Shape: []uint64{2, 3}, Elements: 6, NonFinite: 1, RMS: 1.5, AbsMax: 3, Mean: -0.25}
	assert.Equal(t, map[string]any{"kind": "tensor_stats", "span_id": "s3", "label": "demo/out", "shape": []any{num("2"), num("3")},
		"dtype": "f32", "elements": num("6"), "non_finite": num("1"), "rms": num("1.5"), "abs_max": num("3"), "mean": num("-0.25")},
		decodeLine(t, AppendTensorStats(nil, &s)))
	sc := ScalarStats("loss", 0.1)
	m := decodeLine(t, AppendTensorStats(nil, &sc))
	assert.Equal(t, []any{}, m["shape"], "a scalar's shape is [] not null")
}

func TestAppendMemory(t *testing.T) {
	tests := []struct {
		name string
		in   Memory
		want map[string]any
	}{
		{
			name: "alloc with op name",
			in: Memory{SpanID: 3, TimestampNs: 550, StorageID: "cpu-storage-7", TensorID: "t2", Device: "cpu", Dtype: "f32", OpName: "matmul",
				Bytes: 24, Action: MemoryAlloc, Shape: []uint64{2, 3}, Category: CategoryActivation},
			want: map[string]any{"kind": "memory", "timestamp_ns": num("550"), "storage_id": "cpu-storage-7", "tensor_id": "t2", "span_id": "s3",
				"op_name": "matmul", "device": "cpu", "bytes": num("24"), "action": "alloc", "shape": []any{num("2"), num("3")}, "dtype": "f32", "category": "activation"},
		},
		{
			name: "free without op name or shape",
			in:   Memory{SpanID: 3, TimestampNs: 580, StorageID: "s", TensorID: "t", Device: "cpu", Dtype: "f32", Bytes: 24, Action: MemoryFree},
			want: map[string]any{"kind": "memory", "timestamp_ns": num("580"), "storage_id": "s", "tensor_id": "t", "span_id": "s3",
				"device": "cpu", "bytes": num("24"), "action": "free", "shape": []any{}, "dtype": "f32", "category": "other"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, decodeLine(t, AppendMemory(nil, &tt.in)))
		})
	}
}

func TestAppendDeviceMemory(t *testing.T) {
	tests := []struct {
		name string
		in   DeviceMemory
		want map[string]any
	}{
		{
			name: "used and capacity only",
			in:   DeviceMemory{TimestampNs: 590, Device: "cpu", Used: 1024, HasUsed: true, Free: 99, Capacity: 65536, HasCapacity: true},
			want: map[string]any{"kind": "device_memory", "timestamp_ns": num("590"), "device": "cpu", "used_bytes": num("1024"), "capacity_bytes": num("65536")},
		},
		{
			name: "all values and extras",
			in: DeviceMemory{TimestampNs: 1, Device: "cuda:0", Used: 1, Free: 2, Reserved: 3, Capacity: 4, HasUsed: true, HasFree: true, HasReserved: true, HasCapacity: true,
				Extra: map[string]float64{"utilization": 0.75, "power_w": 310}},
			want: map[string]any{"kind": "device_memory", "timestamp_ns": num("1"), "device": "cuda:0", "used_bytes": num("1"), "free_bytes": num("2"),
				"reserved_bytes": num("3"), "capacity_bytes": num("4"), "extra": map[string]any{"utilization": num("0.75"), "power_w": num("310")}},
		},
		{
			name: "empty extra map omitted",
			in:   DeviceMemory{Device: "d", Free: 5, HasFree: true, Extra: map[string]float64{}},
			want: map[string]any{"kind": "device_memory", "timestamp_ns": num("0"), "device": "d", "free_bytes": num("5")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, decodeLine(t, AppendDeviceMemory(nil, &tt.in)))
		})
	}
}

func TestAppendDeviceInterval(t *testing.T) {
	tests := []struct {
		name string
		in   DeviceInterval
		want map[string]any
	}{
		{
			name: "ours present",
			in: DeviceInterval{SpanID: 3, Device: "cuda:0", StreamID: "7", ClockID: "host-monotonic", Backend: "cupti", Name: "sgemm_kernel",
				StartNs: 250, DurationNs: 300, CorrelationID: 0, HasCorrelationID: true},
			want: map[string]any{"kind": "device_interval", "span_id": "s3", "device": "cuda:0", "stream_id": "7", "clock_id": "host-monotonic",
				"backend": "cupti", "start_ns": num("250"), "duration_ns": num("300"), "name": "sgemm_kernel", "correlation_id": num("0")},
		},
		{
			name: "ours absent",
			in:   DeviceInterval{SpanID: 3, Device: "cpu", StreamID: "0", ClockID: "c", Backend: "cpu", StartNs: 1, DurationNs: 2, CorrelationID: 5},
			want: map[string]any{"kind": "device_interval", "span_id": "s3", "device": "cpu", "stream_id": "0", "clock_id": "c",
				"backend": "cpu", "start_ns": num("1"), "duration_ns": num("2")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, decodeLine(t, AppendDeviceInterval(nil, &tt.in)))
		})
	}
}

func TestAppendGradient(t *testing.T) {
	tests := []struct {
		name    string
		state   GradientState
		norm    float64
		hasNorm bool
		want    map[string]any
	}{
		{"present", GradientPresent, 0.5, true, map[string]any{"norm": num("0.5"), "state": "present"}},
		{"zero", GradientZero, 0, true, map[string]any{"norm": num("0"), "state": "zero"}},
		{"missing", GradientMissing, 0, false, map[string]any{"state": "missing"}},
		{"non_finite", GradientNonFinite, 0, false, map[string]any{"state": "non_finite"}},
		{"tiny norm uses exponent", GradientPresent, 1e-9, true, map[string]any{"norm": num("1e-9"), "state": "present"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := map[string]any{"kind": "gradient", "event_id": "gradient-12", "root": "vb", "key": "enc.w"}
			for k, v := range tt.want {
				want[k] = v
			}
			assert.Equal(t, want, decodeLine(t, AppendGradient(nil, 12, "vb", "enc.w", tt.state, tt.norm, tt.hasNorm)))
		})
	}
}

func TestAppendStringRoundTrip(t *testing.T) {
	tests := []struct {
		name, in string
		raw      string // how it must appear on the wire, "" = not checked
	}{
		{"plain", "demo/forward", `"demo/forward"`},
		{"quotes and backslash", `say "hi" \ bye`, `"say \"hi\" \\ bye"`},
		{"newline tab cr", "a\nb\tc\r", `"a\u000ab\u0009c\u000d"`},
		{"control chars", "\x00\x01\x1f\x7f", `"\u0000\u0001\u001f` + "\x7f" + `"`},
		{"unicode raw", "héllo 世界 🚀", `"héllo 世界 🚀"`},
		{"line separators", "a\u2028b\u2029c", "\"a\u2028b\u2029c\""},
		{"empty", "", `""`},
		{"html stays raw", "<a>&</a>", `"<a>&</a>"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			line := AppendDataEdge(nil, tt.in, "x")
			m := decodeLine(t, line)
			assert.Equal(t, tt.in, m["from_tensor"])
			if tt.raw != "" {
				assert.Contains(t, string(line), `"from_tensor":`+tt.raw+`,`)
			}
		})
	}
}

func TestAppendStringInvalidUTF8StaysValidJSON(t *testing.T) {
	// Validation refuses invalid UTF-8, but an appender must still never emit invalid JSON.
	out := appendString(nil, "a\xffb\xc3")
	assert.Equal(t, `"a\ufffdb\ufffd"`, string(out))
	var s string
	require.NoError(t, json.Unmarshal(out, &s))
	assert.Equal(t, "a\uFFFDb\uFFFD", s)
}

func TestAppendFloat(t *testing.T) {
	tests := []struct {
		name string
		in   float64
		want string
	}{
		{"integer", 3, "3"},
		{"fraction", -0.25, "-0.25"},
		{"small", 1e-7, "1e-7"},
		{"large", 1e21, "1e+21"},
		{"below large threshold", 1e20, "100000000000000000000"},
		{"NaN written as 0", math.NaN(), "0"},
		{"Inf written as 0", math.Inf(-1), "0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, string(appendFloat(nil, tt.in)))
		})
	}
}

func TestAppendersAppend(t *testing.T) {
	// Appenders extend b rather than overwrite it: the session batches lines in one buffer.
	b := AppendSpanEnd([]byte("prefix\n"), 1, 2)
	assert.True(t, strings.HasPrefix(string(b), "prefix\n{"))
}

func TestFormatTimestamp(t *testing.T) {
	ts := time.Date(2026, 8, 20, 1, 2, 3, 456789000, time.FixedZone("X", 3600))
	assert.Equal(t, "2026-08-20T00:02:03.456Z", FormatTimestamp(ts))
	assert.Equal(t, "2026-01-01T00:00:00.000Z", FormatTimestamp(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)))
}

func TestAppendMeta(t *testing.T) {
	r, err := ParseRun([]byte(`{"entrypoint":"demo::infer","phase":"infer","capture_step":1,"device":"cpu","tags":{"producer":"go"}}`))
	require.NoError(t, err)
	x := MetaExtras{RunID: "run-1", Timestamp: "2026-08-20T00:00:00.000Z", ProducerName: "candle-trace", ProducerVersion: "0.1.0",
		ProducerBinding: "c", WallUnixNsAtOpen: 1700000000000000000, PID: 42, Hostname: "h", Rank: -1, WorldSize: -1}
	require.NoError(t, x.Validate())
	m := decodeLine(t, r.AppendMeta(nil, x))
	want := map[string]any{
		"kind": "meta", "schema": "candle-graph/trace/10", "run_id": "run-1", "correlation_id": "demo::infer/inference-1",
		"entrypoint": "demo::infer", "phase": "infer", "timestamp": "2026-08-20T00:00:00.000Z", "capture_step": num("1"),
		"warmup_steps": num("0"), "device": "cpu", "measured_region_device_synchronized": false, "timing_mode": "host",
		"capture_contract": map[string]any{"measurement_scope": "unknown", "operations": "none", "activations": "none", "tensors": "none",
			"gradients": "none", "logical_memory": "none", "physical_memory": "none", "device_timing": "none", "required_semantic_labels": []any{}},
		"tags":     map[string]any{"producer": "go"},
		"producer": map[string]any{"name": "candle-trace", "version": "0.1.0", "binding": "c"},
		"clock":    map[string]any{"host": "monotonic", "wall_unix_ns_at_open": num("1700000000000000000")},
		"process":  map[string]any{"pid": num("42"), "hostname": "h"},
	}
	assert.Equal(t, want, m)

	x.Rank, x.WorldSize = 0, 8
	m = decodeLine(t, r.AppendMeta(nil, x))
	assert.Equal(t, map[string]any{"pid": num("42"), "hostname": "h", "rank": num("0"), "world_size": num("8")}, m["process"])
}

func TestAppendMetaFullRunRoundTrips(t *testing.T) {
	r, err := ParseRun([]byte(fullRunJSON))
	require.NoError(t, err)
	line := r.AppendMeta(nil, MetaExtras{RunID: "r", Timestamp: "t", Rank: -1, WorldSize: -1})
	m := decodeLine(t, line)
	cc := m["capture_contract"].(map[string]any)
	assert.Equal(t, []any{"fwd"}, cc["gpu_expected_semantic_labels"])
	assert.Equal(t, []any{"opt"}, cc["cpu_only_semantic_labels"])
	assert.Equal(t, "complete", cc["activations"])
	gc := cc["gradient_contract"].(map[string]any)
	assert.Equal(t, "sha256:1d8756f5fd6fb937fc1202b4f227989b2446f96965688cadae91572f7d930c1f", gc["manifest_sha256"])
	assert.Equal(t, []any{
		map[string]any{"family": "encoder", "expectation": "active", "min_present": num("1")},
		map[string]any{"family": "head", "expectation": "inactive", "min_present": num("0")},
	}, gc["families"])
	id := m["comparison_identity"].(map[string]any)
	assert.Equal(t, "impl-a", id["implementation_id"])
	assert.Equal(t, num("8"), id["physical_batch"])
	assert.Equal(t, "0.9.1", m["candle_version"])
	assert.NotContains(t, m, "measured_root", "measured_root is a session setting, not meta")

	// Everything ParseRun read comes back: feed the meta's run fields to ParseRun again.
	back, err := ParseRun(runJSONFromMeta(t, line, r.MeasuredRoot))
	require.NoError(t, err)
	assert.Equal(t, r, back)
}

// runJSONFromMeta strips a meta line down to the keys ParseRun accepts.
func runJSONFromMeta(t testing.TB, line []byte, measuredRoot bool) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(line, &m))
	for _, k := range []string{"kind", "schema", "run_id", "timestamp", "producer", "clock", "process"} {
		delete(m, k)
	}
	if measuredRoot {
		m["measured_root"] = json.RawMessage("true")
	}
	out, err := json.Marshal(m)
	require.NoError(t, err)
	return out
}

func TestMetaExtrasValidate(t *testing.T) {
	assert.ErrorContains(t, MetaExtras{Timestamp: "t"}.Validate(), `"run_id"`)
	assert.ErrorContains(t, MetaExtras{RunID: "r", Timestamp: " "}.Validate(), `"timestamp"`)
	assert.NoError(t, MetaExtras{RunID: "r", Timestamp: "t"}.Validate())
}
