package compare

import (
	"bytes"
	"strings"
	"testing"

	"github.com/candle-trace/candle-trace/internal/report/analysis"

	"github.com/candle-trace/candle-trace/internal/testutil"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// trainVariant is valid-train.jsonl as another implementation would record
// it: relu twice as slow, adam replaced by sgd, a bigger gradient storage,
// other gradient norms.
func trainVariant(t *testing.T, extra ...string) []byte {
	t.Helper()
	s := string(testutil.Corpus(t, "valid-train.jsonl"))
	repl := append([]string{
		`"implementation_id":"candle-trace-go"`, `"implementation_id":"pytorch","pair_id":"p-1"`,
		`"op_name":"relu","inputs":["t2"],"output":"t3","shape":[8,16],"dtype":"f32","device":"cuda:0","duration_ns":500`,
		`"op_name":"relu","inputs":["t2"],"output":"t3","shape":[8,16],"dtype":"f32","device":"cuda:0","duration_ns":1000`,
		`"op_name":"adam"`, `"op_name":"sgd"`,
		`"storage_id":"cuda-storage-3","tensor_id":"g1","span_id":"s4","op_name":"matmul_backward","device":"cuda:0","bytes":1024`,
		`"storage_id":"cuda-storage-3","tensor_id":"g1","span_id":"s4","op_name":"matmul_backward","device":"cuda:0","bytes":2048`,
		`"storage_id":"cuda-storage-3","tensor_id":"g1","span_id":"s5","device":"cuda:0","bytes":1024`,
		`"storage_id":"cuda-storage-3","tensor_id":"g1","span_id":"s5","device":"cuda:0","bytes":2048`,
		`"key":"encoder.weight","state":"present","norm":0.5`, `"key":"encoder.weight","state":"present","norm":0.6`,
		`"key":"head.weight","state":"present","norm":1.25`, `"key":"head.weight","state":"present","norm":1.3`,
		`"key":"adapter.weight","state":"missing"`, `"key":"adapter.weight","state":"zero","norm":0.0`,
	}, extra...)
	for i := 0; i < len(repl); i += 2 {
		require.Contains(t, s, repl[i])
		s = strings.Replace(s, repl[i], repl[i+1], 1)
	}
	return []byte(s)
}

func analyzeReport(t *testing.T, data []byte) *analysis.Result {
	t.Helper()
	res, err := analysis.Analyze(bytes.NewReader(data), analysis.Options{Report: true})
	require.NoError(t, err)
	require.NotNil(t, res.Report)
	return res
}

func TestCompareNumbers(t *testing.T) {
	a := analyzeReport(t, testutil.Corpus(t, "valid-train.jsonl"))
	b := analyzeReport(t, trainVariant(t))
	c := Compare("a.jsonl", a, "b.jsonl", b, 0.05)

	assert.True(t, c.IdentityComparable, "implementation_id and pair_id may differ: %s", c.IdentityProblem)
	assert.Empty(t, c.IdentityDiffs)
	assert.Equal(t, "pytorch", c.B.ImplementationID)
	require.NotNil(t, c.MeasuredRegion)
	assert.Equal(t, int64(0), c.MeasuredRegion.DeltaNS)
	assert.False(t, c.MeasuredRegion.Significant)

	ops := map[string]NameDelta{}
	for _, d := range c.Ops {
		ops[d.Name] = d
	}
	require.Contains(t, ops, "relu")
	relu := ops["relu"]
	assert.Equal(t, uint64(500), relu.TotalA)
	assert.Equal(t, uint64(1000), relu.TotalB)
	assert.Equal(t, int64(500), relu.DeltaNS)
	require.NotNil(t, relu.Ratio)
	assert.InDelta(t, 2.0, *relu.Ratio, 1e-12)
	assert.True(t, relu.Significant)
	assert.Equal(t, "relu", c.Ops[0].Name, "the largest change comes first")
	assert.False(t, ops["matmul"].Significant)
	assert.Equal(t, 1.0, *ops["matmul"].Ratio)
	require.Len(t, c.OnlyInA.Ops, 1)
	assert.Equal(t, "adam", c.OnlyInA.Ops[0].Name)
	assert.Equal(t, uint64(1500), c.OnlyInA.Ops[0].TotalNS)
	require.Len(t, c.OnlyInB.Ops, 1)
	assert.Equal(t, "sgd", c.OnlyInB.Ops[0].Name)
	assert.Len(t, c.Spans, 5)
	assert.Empty(t, c.OnlyInA.Spans)

	require.NotNil(t, c.Memory.DeltaBytes)
	assert.Equal(t, uint64(1536), *c.Memory.PeakA)
	assert.Equal(t, uint64(2560), *c.Memory.PeakB)
	assert.Equal(t, int64(1024), *c.Memory.DeltaBytes)
	require.Len(t, c.Memory.Devices, 1)
	assert.Equal(t, int64(0), *c.Memory.Devices[0].DeltaBytes)

	grads := map[string]GradientDiff{}
	for _, g := range c.Gradients {
		grads[g.Key] = g
	}
	require.Len(t, grads, 3)
	enc := grads["encoder.weight"]
	require.NotNil(t, enc.RelError)
	assert.InDelta(t, 0.2, *enc.RelError, 1e-12)
	assert.True(t, enc.Significant)
	head := grads["head.weight"]
	assert.InDelta(t, 0.04, *head.RelError, 1e-12)
	assert.False(t, head.Significant, "4% is within the 5% threshold")
	adapter := grads["adapter.weight"]
	assert.True(t, adapter.StateChanged)
	assert.Equal(t, "missing", adapter.StateA)
	assert.Equal(t, "zero", adapter.StateB)
	assert.Nil(t, adapter.RelError, "A has no norm")
	assert.True(t, adapter.Significant)

	// A looser threshold: head's 4% and encoder's 20% both pass at 25%.
	loose := Compare("a", a, "b", b, 0.25)
	for _, g := range loose.Gradients {
		assert.Equal(t, g.StateChanged, g.Significant, g.Key)
	}

	var out bytes.Buffer
	WriteComparison(&out, c)
	for _, s := range []string{"Identity: comparable", "relu", "+500 ns", "×2.000", "Only in A", "op adam: 1, 1.50 µs",
		"Only in B", "op sgd", "logical peak: 1.5 KiB → 2.5 KiB, +1.0 KiB (×1.667)", "vb/encoder.weight", "0.2"} {
		assert.Contains(t, out.String(), s)
	}
}

func TestCheckIdentity(t *testing.T) {
	train := analyzeReport(t, testutil.Corpus(t, "valid-train.jsonl"))
	infer := analyzeReport(t, testutil.Corpus(t, "valid-infer.jsonl"))
	other := analyzeReport(t, trainVariant(t, `"model_id":"mlp-2"`, `"model_id":"mlp-3"`, `"physical_batch":8`, `"physical_batch":16`))

	diffs, problem := CheckIdentity(train.Meta, other.Meta)
	assert.Equal(t, []IdentityDiff{{"model_id", "mlp-2", "mlp-3"}, {"physical_batch", "8", "16"}}, diffs)
	assert.Equal(t, "comparison identities differ in 2 field(s)", problem)

	_, problem = CheckIdentity(train.Meta, infer.Meta)
	assert.Contains(t, problem, "trace B declares no comparison_identity")
	_, problem = CheckIdentity(infer.Meta, train.Meta)
	assert.Contains(t, problem, "trace A declares no comparison_identity")
	_, problem = CheckIdentity(infer.Meta, infer.Meta)
	assert.Contains(t, problem, "neither trace")

	c := Compare("a", train, "b", other, 0)
	assert.False(t, c.IdentityComparable)
	assert.Equal(t, DefaultCompareThreshold, c.Threshold)
	var out bytes.Buffer
	WriteIdentityRefusal(&out, c)
	assert.Contains(t, out.String(), "refusing to compare a with b: comparison identities differ in 2 field(s)")
	assert.Contains(t, out.String(), "model_id")
	assert.Contains(t, out.String(), "physical_batch")
}

// Device time is compared by launching span and by kernel name: backward's
// kernel twice as long, adam's kernel replaced by a fused one.
func TestCompareDeviceTime(t *testing.T) {
	a := analyzeReport(t, testutil.Corpus(t, "valid-train.jsonl"))
	b := analyzeReport(t, trainVariant(t,
		`"start_ns":3410,"duration_ns":1990,"name":"sgemm_bwd"`, `"start_ns":3410,"duration_ns":3980,"name":"sgemm_bwd"`,
		`"name":"adam_kernel"`, `"name":"fused_adam"`))
	c := Compare("a", a, "b", b, 0.05)

	require.Len(t, c.DeviceBySpan, 3)
	bwd := c.DeviceBySpan[0]
	assert.Equal(t, "train/backward", bwd.Name, "the largest change first")
	assert.Equal(t, int64(1990), bwd.DeltaNS)
	assert.InDelta(t, 2.0, *bwd.Ratio, 1e-12)
	assert.True(t, bwd.Significant)
	for _, d := range c.DeviceBySpan[1:] {
		assert.Equal(t, int64(0), d.DeltaNS, d.Name)
		assert.False(t, d.Significant, d.Name)
	}

	var kernels []string
	for _, k := range c.Kernels {
		kernels = append(kernels, k.Name)
	}
	assert.ElementsMatch(t, []string{"sgemm_bwd", "sgemm", "relu_kernel"}, kernels)
	assert.Equal(t, "sgemm_bwd", kernels[0], "the largest change first")
	require.Len(t, c.OnlyInA.Kernels, 1)
	assert.Equal(t, analysis.NameStats{Name: "adam_kernel", Count: 1, TotalNS: 1480}, c.OnlyInA.Kernels[0])
	require.Len(t, c.OnlyInB.Kernels, 1)
	assert.Equal(t, "fused_adam", c.OnlyInB.Kernels[0].Name)

	var out bytes.Buffer
	WriteComparison(&out, c)
	for _, s := range []string{"Device time by span", "train/backward", "+1.99 µs", "Kernels", "sgemm_bwd",
		"kernel adam_kernel: 1, 1.48 µs", "kernel fused_adam: 1, 1.48 µs"} {
		assert.Contains(t, out.String(), s)
	}
}
