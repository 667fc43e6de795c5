package events

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/testutil"
)

// summarize runs `candle-graph summary --require-valid` on trace, alone in a fresh folder.
func summarize(t *testing.T, bin string, trace []byte) (map[string]any, string, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	require.NoError(t, os.WriteFile(path, trace, 0o644))
	cmd := exec.Command(bin, "summary", path, "--require-valid")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var out map[string]any
	_ = json.Unmarshal([]byte(stdout.String()), &out)
	return out, stderr.String(), err
}

const e2eRunJSON = `{
 "entrypoint":"demo::train_step","phase":"train","capture_step":3,"device":"cpu",
 "candle_version":"0.9.1","tags":{"producer":"go","note":"quote \" and\nnewline, ünïcode"},
 "capture_contract":{"measurement_scope":"profiled_work","operations":"complete","activations":"partial","tensors":"partial",
  "gradients":"complete","logical_memory":"complete","physical_memory":"partial","device_timing":"partial",
  "required_semantic_labels":["train/forward","train/backward","train/optimizer"],
  "gpu_expected_semantic_labels":["train/forward","train/backward"],"cpu_only_semantic_labels":["train/optimizer"],
  "gradient_contract":{
   "expected":[{"root":"vb","key":"encoder.weight","family":"encoder"},{"root":"vb","key":"head.weight","family":"head"},{"root":"vb","key":"adapter.weight","family":"adapter"}],
   "families":[{"family":"encoder","expectation":"active","min_present":1},{"family":"head","expectation":"data_conditional","min_present":1},{"family":"adapter","expectation":"inactive","min_present":0}]}},
 "comparison_identity":{"workload_id":"w","model_id":"m","config_id":"c","data_id":"d","seed_policy":"fixed","precision":"f32",
  "device_state":"idle","physical_batch":2,"accumulation_steps":1,"pair_id":"p"}
}`

// buildTrace writes a small complete training capture with every record kind, checking each
// record with its validator first, as the session does.
func buildTrace(t *testing.T) []byte {
	t.Helper()
	r, err := ParseRun([]byte(e2eRunJSON))
	require.NoError(t, err)
	x := MetaExtras{RunID: "run-e2e", Timestamp: "2026-08-20T00:00:00.000Z", ProducerName: "candle-trace", ProducerVersion: "0.0.0-test",
		ProducerBinding: "go", WallUnixNsAtOpen: 1, PID: os.Getpid(), Hostname: "test", Rank: 0, WorldSize: 1}
	require.NoError(t, x.Validate())
	b := r.AppendMeta(nil, x)

	b = AppendSpanStart(b, 1, 0, r.Entrypoint, 0, SpanFunction, false, StepNone, 11)
	b = AppendSpanStart(b, 2, 1, "train/measured", 100, SpanFunction, true, StepNone, 11)
	b = AppendSpanStart(b, 3, 2, "train/forward", 200, SpanModule, false, StepForward, 11)

	op := Op{SpanID: 3, OpName: "matmul", Dtype: "f32", Device: "cpu", Inputs: []string{"t0", "t1"}, Output: "t2", HasOutput: true,
		Shape: []uint64{2, 3}, DurationNs: 300, TimestampNs: 250, InputDenseBytes: 48}
	require.NoError(t, op.Validate())
	require.True(t, op.HasOutputDenseBytes)
	b = AppendOp(b, &op)
	tensor := Tensor{SpanID: 3, TensorID: "t2", Dtype: "f32", Device: "cpu", Label: "demo/out", Shape: []uint64{2, 3}, Category: CategoryActivation}
	require.NoError(t, tensor.Validate())
	b = AppendTensor(b, &tensor)
	stats, err := StatsFromF32("demo/out", []float32{-3, 1.5, 0, 0, float32(nanF64()), 0}, []uint64{2, 3})
	require.NoError(t, err)
	stats.SpanID = 3
	require.NoError(t, stats.Validate())
	b = AppendTensorStats(b, &stats)
	for _, m := range []Memory{
		{SpanID: 3, TimestampNs: 550, StorageID: "cpu-storage-7", TensorID: "t2", Device: "cpu", Dtype: "f32", OpName: "matmul", Bytes: 24, Action: MemoryAlloc, Shape: []uint64{2, 3}, Category: CategoryActivation},
		{SpanID: 3, TimestampNs: 560, StorageID: "cpu-storage-7", TensorID: "t3", Device: "cpu", Dtype: "f32", OpName: "t", Bytes: 24, Action: MemoryAlloc, Shape: []uint64{3, 2}, Category: CategoryActivation},
		{SpanID: 3, TimestampNs: 580, StorageID: "cpu-storage-7", TensorID: "t2", Device: "cpu", Dtype: "f32", Bytes: 24, Action: MemoryFree, Shape: []uint64{2, 3}, Category: CategoryActivation},
	} {
		require.NoError(t, m.Validate())
		b = AppendMemory(b, &m)
	}
	di := DeviceInterval{SpanID: 3, Device: "cpu", StreamID: "0", ClockID: "host-monotonic", Backend: "cpu", Name: "matmul", StartNs: 250, DurationNs: 300, CorrelationID: 9, HasCorrelationID: true}
	require.NoError(t, di.Validate())
	b = AppendDeviceInterval(b, &di)
	b = AppendSpanEnd(b, 3, 400) // 200..600

	b = AppendSpanStart(b, 4, 2, "train/backward", 700, SpanFunction, false, StepBackward, 12)
	loss := ScalarStats("loss", 0.693)
	loss.SpanID = 4
	require.NoError(t, loss.Validate())
	b = AppendTensorStats(b, &loss)
	for i, g := range []struct {
		key     string
		state   GradientState
		norm    float64
		hasNorm bool
	}{
		{"encoder.weight", GradientPresent, 0.42, true},
		{"head.weight", GradientZero, 0, true},
		{"adapter.weight", GradientMissing, 0, false},
	} {
		require.NoError(t, ValidateGradient("vb", g.key, g.state, g.norm, g.hasNorm))
		b = AppendGradient(b, uint64(i+1), "vb", g.key, g.state, g.norm, g.hasNorm)
	}
	b = AppendSpanEnd(b, 4, 200) // 700..900

	b = AppendSpanStart(b, 5, 2, "train/optimizer", 1000, SpanFunction, false, StepOptimizer, 11)
	b = AppendSpanEnd(b, 5, 100)  // 1000..1100
	b = AppendSpanEnd(b, 2, 1100) // 100..1200

	dm := DeviceMemory{TimestampNs: 1250, Device: "cpu", Used: 1024, HasUsed: true, Capacity: 65536, HasCapacity: true, Extra: map[string]float64{"utilization": 0.5}}
	require.NoError(t, dm.Validate())
	b = AppendDeviceMemory(b, &dm)
	b = AppendCallEdge(b, 2, 3, 400)
	require.NoError(t, ValidateDataEdge("t0", "t2"))
	b = AppendDataEdge(b, "t0", "t2")
	b = AppendSpanEnd(b, 1, 1300)
	require.NoError(t, ValidateTerminal(true, ""))
	return AppendTerminal(b, true, 1300, "", TracerTime{})
}

func nanF64() float64 { var z float64; return z / z }

func TestEndToEndCandleGraphAcceptsTrace(t *testing.T) {
	bin := testutil.CandleGraph(t)
	trace := buildTrace(t)
	out, stderr, err := summarize(t, bin, trace)
	require.NoError(t, err, "candle-graph rejected the trace:\n%s\ntrace:\n%s", stderr, trace)

	health, _ := out["health"].(map[string]any)
	require.NotNil(t, health, "summary has a health section")
	assert.Equal(t, true, health["structurally_valid"])
	assert.Equal(t, true, health["capture_complete"])
	issues, _ := health["issues"].([]any)
	for _, i := range issues {
		issue := i.(map[string]any)
		assert.NotEqual(t, "error", issue["severity"], "issue %v", issue)
		// Every evidence kind was written, so none of the *_absent warnings may appear.
		assert.False(t, strings.HasSuffix(issue["code"].(string), "_absent"), "issue %v", issue)
	}
	ts, _ := out["tensor_stats"].(map[string]any)
	assert.Equal(t, float64(2), ts["events"], "both tensor_stats lines were read")
	assert.Equal(t, float64(1), ts["non_finite_events"], "the NaN element was counted")
}

func TestEndToEndCandleGraphRejectsBrokenTrace(t *testing.T) {
	// The oracle must be able to say no, or the test above proves nothing.
	bin := testutil.CandleGraph(t)
	trace := buildTrace(t)
	tests := []struct {
		name   string
		mutate func([]byte) []byte
	}{
		{"no terminal", func(b []byte) []byte {
			lines := strings.SplitAfter(strings.TrimSuffix(string(b), "\n"), "\n")
			return []byte(strings.Join(lines[:len(lines)-1], ""))
		}},
		{"second measured span", func(b []byte) []byte {
			return []byte(strings.Replace(string(b), `"name":"train/optimizer","start_ns":1000,"span_kind":"function"`,
				`"name":"train/optimizer","start_ns":1000,"span_kind":"function","measured":true`, 1))
		}},
		{"gradient missing from manifest", func(b []byte) []byte {
			var keep []string
			for _, l := range strings.SplitAfter(string(b), "\n") {
				if !strings.Contains(l, `"key":"encoder.weight","state"`) {
					keep = append(keep, l)
				}
			}
			return []byte(strings.Join(keep, ""))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			broken := tt.mutate(trace)
			require.NotEqual(t, string(trace), string(broken), "the mutation applied")
			_, _, err := summarize(t, bin, broken)
			var exit *exec.ExitError
			require.True(t, errors.As(err, &exit), "candle-graph must reject it, got %v", err)
		})
	}
}
