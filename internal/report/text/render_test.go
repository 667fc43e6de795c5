package text

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/candle-trace/candle-trace/internal/report/analysis"
	"github.com/candle-trace/candle-trace/internal/report/trace"

	"github.com/candle-trace/candle-trace/internal/testutil"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Past MaxKernelRows names the tail folds into one row; intervals without a
// name are "(unnamed)"; spans of one name add up.
func TestReportKernelsFold(t *testing.T) {
	data := string(testutil.Corpus(t, "valid-train.jsonl"))
	var extra strings.Builder
	for i := 0; i < 60; i++ {
		name := fmt.Sprintf(`,"name":"k%02d"`, i)
		if i == 59 {
			name = "" // no name
		}
		fmt.Fprintf(&extra, `{"kind":"device_interval","span_id":"s3","device":"cuda:0","stream_id":"9","clock_id":"host-monotonic","backend":"cuda","start_ns":%d,"duration_ns":%d%s}`+"\n",
			300+i, 100+i, name)
	}
	at := strings.Index(data, `{"kind":"span_start","id":"s4"`)
	res := analyzeBytes(t, []byte(data[:at]+extra.String()+data[at:]), analysis.Options{Report: true})
	require.True(t, res.Health.OK(false), "%v", res.Health.Issues)
	d := res.Report.Device
	require.Len(t, d.Kernels, analysis.MaxKernelRows)
	assert.Equal(t, "sgemm_bwd", d.Kernels[0].Name)
	// 64 names: the top 49 kept, 15 folded (the four corpus kernels are the largest).
	rest := d.Kernels[analysis.MaxKernelRows-1]
	assert.Equal(t, "(other 15 names)", rest.Name)
	assert.Equal(t, uint64(15), rest.Count)
	var total, folded uint64
	for i := 0; i < 60; i++ {
		total += uint64(100 + i)
		if i < 15 {
			folded += uint64(100 + i)
		}
	}
	assert.Equal(t, folded, rest.TotalNS, "the 15 shortest")
	assert.Equal(t, uint64(114), rest.MaxNS)
	assert.Contains(t, names(d.Kernels), "(unnamed)")
	var sum float64
	for _, k := range d.Kernels {
		sum += k.Share
	}
	assert.InDelta(t, 1, sum, 1e-9, "the rows cover all device time")
	require.Len(t, d.BySpan, 3)
	assert.Equal(t, analysis.SpanDeviceStat{Name: "train/forward", Kernels: 62, TotalNS: 1460 + total, Share: float64(1460+total) / float64(4930+total)}, d.BySpan[0])

	var out bytes.Buffer
	WriteReport(&out, "t.jsonl", res)
	text := out.String()
	assert.Contains(t, text, "DEVICE TIME BY SPAN")
	assert.Contains(t, text, "(35 more names in --json)")
}

func names(ks []analysis.KernelStat) []string {
	var out []string
	for _, k := range ks {
		out = append(out, k.Name)
	}
	return out
}

func TestReportFlagsNonFinite(t *testing.T) {
	data := testutil.Corpus(t, "valid-train.jsonl")
	data = bytes.Replace(data, []byte(`"label":"train/loss","shape":[],"dtype":"f64","elements":1,"non_finite":0,"rms":0.693,"abs_max":0.693,"mean":0.693`),
		[]byte(`"label":"train/loss","shape":[],"dtype":"f64","elements":1,"non_finite":1,"rms":0,"abs_max":0,"mean":0`), 1)
	data = bytes.Replace(data, []byte(`"key":"head.weight","state":"present","norm":1.25`), []byte(`"key":"head.weight","state":"non_finite"`), 1)
	res := analyzeBytes(t, data, analysis.Options{Report: true})
	codes := res.Health.Codes()
	assert.Contains(t, codes, trace.CodeGradientFamilyNonFinite)
	ts := res.Report.TensorStats[1]
	assert.Equal(t, uint64(1), ts.NonFiniteElements)
	assert.Equal(t, uint64(1), ts.NonFiniteRecords)
	assert.Equal(t, 14, ts.FirstNonFiniteAt)
	g := res.Report.Gradients
	assert.Equal(t, 1, g.NonFinite)
	require.Len(t, g.Flagged, 2)
	assert.Equal(t, "non_finite", g.Flagged[0].State)

	var out bytes.Buffer
	WriteReport(&out, "t.jsonl", res)
	assert.Contains(t, out.String(), "! vb/head.weight is non_finite (line 27)")
	assert.Contains(t, out.String(), "! 1 (first line 14)")
}

func TestWriteReportHasUnits(t *testing.T) {
	res := analyzeBytes(t, testutil.Corpus(t, "valid-train.jsonl"), analysis.Options{Report: true})
	var out bytes.Buffer
	WriteReport(&out, "valid-train.jsonl", res)
	s := out.String()
	for _, want := range []string{
		"Run run-train-1: demo::train, phase train, capture step 3 (after 2 warm-up), device cuda:0",
		"producer: binding=go name=candle-trace version=0.1.0",
		"Measured region: train/step (s2), 9.80 µs",
		"peak live 1.5 KiB at 5.40 µs in train/backward (s4)",
		"by category: gradient 1.0 KiB, activation 512 B",
		"2.11 µs @ 5.40 µs",
		"verdict:    refuted",
	} {
		assert.Contains(t, s, want)
	}
	assert.Regexp(t, `(?m)^  demo::train +1 .* -$`, s, "the root around the region has no share")
	assert.Regexp(t, `(?m)^  train/step +1 .* 100\.0%$`, s)
}

// The tracer's own time, stated by the writer, is shown next to the measured
// region; a trace that does not state it shows nothing.
func TestReportShowsTheTracersOwnTime(t *testing.T) {
	base := string(testutil.Corpus(t, "valid-train.jsonl"))
	stated := strings.Replace(base, `{"kind":"span_end","id":"s2","duration_ns":9800}`,
		`{"kind":"span_end","id":"s2","duration_ns":9800,"tracer_ns":4200}`, 1)
	require.NotEqual(t, base, stated, "the corpus's measured span end changed: update this test")
	lines := strings.Split(strings.TrimRight(stated, "\n"), "\n")
	last := lines[len(lines)-1]
	require.Contains(t, last, `"kind":"terminal"`)
	lines[len(lines)-1] = strings.TrimSuffix(last, "}") + `,"tracer_ns":5100,"tracer_estimated_ns":1300}`
	tests := []struct {
		name, trace      string
		region, session  *uint64
		want, wantAbsent string
	}{
		{"stated", strings.Join(lines, "\n"), ptr(uint64(4200)), ptr(uint64(5100)),
			"Tracer's own time: 4.20 µs inside the region, left out of every span (5.10 µs in the whole session, 1.30 µs of it calibrated rather than measured)", ""},
		{"not stated", base, nil, nil, "", "Tracer's own time"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := analyzeBytes(t, []byte(tc.trace), analysis.Options{Report: true})
			require.True(t, res.Health.OK(false), "%v", res.Health.Issues)
			mr := res.Report.MeasuredRegion
			assert.Equal(t, tc.region, mr.TracerNS)
			assert.Equal(t, tc.session, mr.SessionTracerNS)
			var out bytes.Buffer
			WriteReport(&out, "t.jsonl", res)
			if tc.want != "" {
				assert.Contains(t, out.String(), tc.want)
			}
			if tc.wantAbsent != "" {
				assert.NotContains(t, out.String(), tc.wantAbsent)
			}
		})
	}
}

func analyzeBytes(t *testing.T, data []byte, opts analysis.Options) *analysis.Result {
	t.Helper()
	res, err := analysis.Analyze(bytes.NewReader(data), opts)
	require.NoError(t, err)
	return res
}

func ptr[T any](v T) *T { return &v }
