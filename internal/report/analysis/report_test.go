package analysis

import (
	"bytes"
	"strings"
	"testing"

	"github.com/candle-trace/candle-trace/internal/report/health"
	"github.com/candle-trace/candle-trace/internal/report/trace"

	"github.com/candle-trace/candle-trace/internal/testutil"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func trainReport(t *testing.T) *Report {
	t.Helper()
	res := analyzeBytes(t, testutil.Corpus(t, "valid-train.jsonl"), Options{Report: true})
	require.True(t, res.Health.OK(false))
	require.NotNil(t, res.Report)
	return res.Report
}

func statsByName(s []NameStats) map[string]NameStats {
	m := map[string]NameStats{}
	for _, x := range s {
		m[x.Name] = x
	}
	return m
}

func TestReportSpans(t *testing.T) {
	r := trainReport(t)
	assert.Equal(t, &Region{SpanID: "s2", Name: "train/step", StartNS: 100, DurationNS: 9800, Closed: true}, r.MeasuredRegion)
	require.Len(t, r.Spans, 5)
	assert.Equal(t, "demo::train", r.Spans[0].Name, "sorted by total time")
	spans := statsByName(r.Spans)
	tests := []struct {
		name        string
		total, self uint64
		encloses    bool // the measured region: no share of it
	}{
		{"demo::train", 10000, 200, true},
		{"train/step", 9800, 9800 - 3000 - 4000 - 2000, false},
		{"train/forward", 3000, 3000, false},
		{"train/backward", 4000, 4000, false},
		{"train/optimizer", 2000, 2000, false},
	}
	for _, tc := range tests {
		s := spans[tc.name]
		assert.Equal(t, uint64(1), s.Count, tc.name)
		assert.Equal(t, tc.total, s.TotalNS, tc.name)
		assert.Equal(t, tc.self, s.SelfNS, tc.name)
		assert.Equal(t, tc.total, s.P50NS, tc.name)
		assert.Equal(t, tc.total, s.MaxNS, tc.name)
		assert.Equal(t, tc.encloses, s.Encloses, tc.name)
		if tc.encloses {
			assert.Zero(t, s.Share, tc.name)
		} else {
			assert.InDelta(t, float64(tc.total)/9800, s.Share, 1e-12, tc.name)
		}
	}
}

func TestReportOps(t *testing.T) {
	ops := statsByName(trainReport(t).Ops)
	tests := []struct {
		name         string
		dur, in, out uint64
	}{
		{"matmul", 1000, 1024, 8 * 16 * 4}, // output bytes derived from shape × f32
		{"relu", 500, 512, 512},            // explicit output_dense_bytes
		{"matmul_backward", 2000, 1536, 16 * 16 * 4},
		{"adam", 1500, 1024, 16 * 16 * 4}, // no output tensor, footprint still derived
	}
	for _, tc := range tests {
		o := ops[tc.name]
		assert.Equal(t, uint64(1), o.Count, tc.name)
		assert.Equal(t, tc.dur, o.TotalNS, tc.name)
		assert.Equal(t, tc.dur, o.SelfNS, tc.name)
		assert.Equal(t, float64(tc.dur), o.MeanNS, tc.name)
		assert.Equal(t, tc.in, o.InputBytes, tc.name)
		assert.Equal(t, tc.out, o.OutputBytes, tc.name)
		assert.Equal(t, float64(tc.in+tc.out), o.BytesPerOp, tc.name)
		assert.InDelta(t, float64(tc.dur)/9800, o.Share, 1e-12, tc.name)
	}
}

func TestReportMemory(t *testing.T) {
	m := trainReport(t).Memory
	assert.Equal(t, uint64(3), m.Allocations)
	assert.Equal(t, uint64(3), m.Frees)
	assert.Equal(t, uint64(2048), m.TotalAllocatedBytes)
	assert.Equal(t, 0, m.RetainedStorages)
	require.NotNil(t, m.Peak)
	// 512 (t2, aliased as t2v) + 512 (t3) live until 3400; then t2 freed and
	// the 1024-byte gradient allocated at 5400 in the backward span.
	assert.Equal(t, &health.MemoryPeak{
		TimestampNS: 5400, LiveBytes: 1536, SpanID: "s4", SpanName: "train/backward",
		ByDevice: map[string]uint64{"cuda:0": 1536}, ByCategory: map[string]uint64{"activation": 512, "gradient": 1024},
	}, m.Peak)
	require.Len(t, m.Devices, 1)
	d := m.Devices[0]
	assert.Equal(t, "cuda:0", d.Device)
	assert.Equal(t, uint64(2), d.Samples)
	assert.Equal(t, uint64(2097152), *d.PeakUsedBytes)
	assert.Equal(t, uint64(6000), d.PeakUsedAtNS)
	assert.Equal(t, uint64(2097152), *d.PeakReservedBytes)
	assert.Equal(t, uint64(6291456), *d.MinFreeBytes)
	assert.Equal(t, uint64(8388608), *d.CapacityBytes)
}

func TestReportDevice(t *testing.T) {
	d := trainReport(t).Device
	assert.Equal(t, []StreamStat{
		{Device: "cuda:0", ClockID: trace.HostClock, StreamID: "7", Kernels: 3, KernelNS: 980 + 480 + 1480, MeanKernelNS: 980, BusyNS: 2940},
		{Device: "cuda:0", ClockID: trace.HostClock, StreamID: "8", Kernels: 1, KernelNS: 1990, MeanKernelNS: 1990, BusyNS: 1990},
	}, d.Streams)
	require.Len(t, d.Devices, 1)
	// Region [100, 9900]; busy [310,1290] [1410,1890] [3410,5400] [7510,8990].
	assert.Equal(t, DeviceBusy{
		Device: "cuda:0", ClockID: trace.HostClock, Kernels: 4, BusyNS: 4930, InRegion: true,
		RegionBusyNS: 4930, IdleNS: 9800 - 4930, IdleGaps: 5, LargestGapNS: 2110, LargestGapAt: 5400,
		Utilization: 4930.0 / 9800,
	}, d.Devices[0])
	assert.Equal(t, []KernelStat{
		{Name: "sgemm_bwd", Count: 1, TotalNS: 1990, MeanNS: 1990, MaxNS: 1990, Share: 1990.0 / 4930},
		{Name: "adam_kernel", Count: 1, TotalNS: 1480, MeanNS: 1480, MaxNS: 1480, Share: 1480.0 / 4930},
		{Name: "sgemm", Count: 1, TotalNS: 980, MeanNS: 980, MaxNS: 980, Share: 980.0 / 4930},
		{Name: "relu_kernel", Count: 1, TotalNS: 480, MeanNS: 480, MaxNS: 480, Share: 480.0 / 4930},
	}, d.Kernels)
	assert.Equal(t, []SpanDeviceStat{
		{Name: "train/backward", Kernels: 1, TotalNS: 1990, Share: 1990.0 / 4930},
		{Name: "train/optimizer", Kernels: 1, TotalNS: 1480, Share: 1480.0 / 4930},
		{Name: "train/forward", Kernels: 2, TotalNS: 980 + 480, Share: 1460.0 / 4930},
	}, d.BySpan)
}

func TestReportGradientsAndTensorStats(t *testing.T) {
	r := trainReport(t)
	g := r.Gradients
	assert.Equal(t, 3, g.Total)
	assert.Equal(t, 2, g.Present)
	assert.Equal(t, 1, g.Missing)
	require.Len(t, g.Flagged, 1)
	assert.Equal(t, GradientFact{Root: "vb", Key: "adapter.weight", State: "missing", Line: 28}, g.Flagged[0])
	require.NotNil(t, g.All[1].Norm)
	assert.Equal(t, 1.25, *g.All[1].Norm)

	require.Len(t, r.TensorStats, 2)
	assert.Equal(t, TensorSummary{Label: "train/hidden", Dtype: "f32", Shape: []uint64{8, 16}, Observations: 1, RMS: 0.75, AbsMax: 2.5, Mean: 0.125}, r.TensorStats[0])
	assert.Equal(t, "train/loss", r.TensorStats[1].Label)
	assert.Equal(t, []uint64{}, r.TensorStats[1].Shape)
}

func TestOverheadAnalysis(t *testing.T) {
	t.Run("device busy refutes", func(t *testing.T) {
		o := trainReport(t).Overhead
		assert.Equal(t, "device_busy", o.Basis)
		assert.Equal(t, uint64(9800), o.MeasuredNS)
		assert.Equal(t, uint64(4930), o.ComputeNS)
		assert.Equal(t, uint64(4870), o.OverheadNS)
		assert.InDelta(t, 4870.0/9800, o.OverheadShare, 1e-12)
		assert.Equal(t, OverheadThreshold, o.Threshold)
		assert.Equal(t, "refuted", o.Verdict)
		assert.Equal(t, OverheadHypothesis, o.Hypothesis)
	})
	t.Run("idle device supports", func(t *testing.T) {
		data := bytes.ReplaceAll(testutil.Corpus(t, "valid-train.jsonl"), []byte(`"duration_ns":1990,`), []byte(`"duration_ns":90,`))
		res := analyzeBytes(t, data, Options{Report: true})
		require.True(t, res.Health.OK(false), "%v", res.Health.Issues)
		o := res.Report.Overhead
		assert.Equal(t, uint64(3030), o.ComputeNS)
		assert.Equal(t, "supported", o.Verdict)
		assert.Contains(t, o.Explanation, "69.1%")
	})
	t.Run("host op time without device intervals", func(t *testing.T) {
		var kept []string
		for _, l := range strings.Split(string(testutil.Corpus(t, "valid-train.jsonl")), "\n") {
			if !strings.Contains(l, `"kind":"device_interval"`) {
				kept = append(kept, l)
			}
		}
		res := analyzeBytes(t, []byte(strings.Join(kept, "\n")), Options{Report: true})
		o := res.Report.Overhead
		assert.Equal(t, "host_op_time", o.Basis)
		assert.Equal(t, uint64(5000), o.ComputeNS, "all four ops lie under the measured span")
		assert.Equal(t, "refuted", o.Verdict)
	})
	t.Run("torch.compile inside the region", func(t *testing.T) {
		// a compilation in the forward's last 1.15 µs, after its ops
		var kept []string
		for _, l := range strings.Split(string(testutil.Corpus(t, "valid-train.jsonl")), "\n") {
			if strings.HasPrefix(l, `{"kind":"span_end","id":"s3"`) {
				kept = append(kept, `{"kind":"span_start","id":"s6","parent_id":"s3","name":"torch.compile","start_ns":2000,"span_kind":"function","tid":100}`,
					`{"kind":"span_end","id":"s6","duration_ns":1150}`)
			}
			if !strings.Contains(l, `"kind":"device_interval"`) {
				kept = append(kept, l)
			}
		}
		res := analyzeBytes(t, []byte(strings.Join(kept, "\n")), Options{Report: true})
		require.True(t, res.Health.OK(false), "%v", res.Health.Issues)
		o := res.Report.Overhead
		assert.Equal(t, uint64(1150), o.CompileNS)
		assert.Equal(t, "refuted", o.Verdict)
		assert.Equal(t, "time was spent outside recorded ops for 49.0% of the measured region (<= 50%): compute dominates; "+
			"torch.compile compiled for 1.15 µs of it (11.7% of the measured region)", o.Explanation)
	})
	t.Run("no measured region", func(t *testing.T) {
		res := analyzeBytes(t, testutil.Corpus(t, "bad-measurement_count.jsonl"), Options{Report: true})
		assert.Equal(t, "inconclusive", res.Report.Overhead.Verdict)
	})
}

// The advice follows what the overhead is: the compiler's when torch.compile
// took at least half of it.
func TestOverheadVerdictNamesTheCompiler(t *testing.T) {
	for _, tc := range []struct {
		name                         string
		measured, overhead, compiled uint64
		verdict, want, not           string
	}{
		{"no compilation", 100, 80, 0, "supported", "overhead-bound; fuse kernels, batch launches or capture a graph", "torch.compile"},
		{"a little compilation", 100, 80, 30, "supported",
			"overhead-bound; fuse kernels, batch launches or capture a graph; torch.compile compiled for 30 ns of it (30.0% of the measured region)", "most of it"},
		{"mostly compilation", 450, 445, 437, "supported",
			"overhead-bound; most of it torch.compile compiling -- a first compilation, or a recompile", "fuse kernels"},
		{"compute-bound with a compilation", 100, 40, 20, "refuted", "compute dominates; torch.compile compiled for 20 ns of it (20.0% of the measured region)", "most of it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := OverheadAnalysis{MeasuredNS: tc.measured, OverheadNS: tc.overhead, CompileNS: tc.compiled,
				OverheadShare: float64(tc.overhead) / float64(tc.measured)}
			o.decide("the busiest device was idle")
			assert.Equal(t, tc.verdict, o.Verdict)
			assert.Contains(t, o.Explanation, tc.want)
			assert.NotContains(t, o.Explanation, tc.not)
		})
	}
}

func ptr[T any](v T) *T { return &v }
