package otlp

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/testutil"
)

// These tests export to a real OpenTelemetry Collector (tools/otelcol:
// otlp receiver, file exporter) and read back what its file exporter
// wrote: what a backend behind a collector would get.

// collectedSpans waits until the collector has written want spans and
// returns them with their resources.
func collectedSpans(t *testing.T, c *testutil.Collector, want int) []collectedSpan {
	t.Helper()
	var got []collectedSpan
	deadline := time.Now().Add(15 * time.Second)
	for {
		got = got[:0]
		var u ptrace.JSONUnmarshaler
		for _, line := range c.Lines(c.TracesOut) {
			td, err := u.UnmarshalTraces(line)
			require.NoError(t, err, "the file exporter wrote a line that is not OTLP JSON: %s", line)
			for i := 0; i < td.ResourceSpans().Len(); i++ {
				rs := td.ResourceSpans().At(i)
				for j := 0; j < rs.ScopeSpans().Len(); j++ {
					ss := rs.ScopeSpans().At(j)
					for k := 0; k < ss.Spans().Len(); k++ {
						got = append(got, collectedSpan{Span: ss.Spans().At(k), Resource: rs.Resource(), Scope: ss.Scope()})
					}
				}
			}
		}
		if len(got) >= want || time.Now().After(deadline) {
			require.Len(t, got, want, "spans in the collector's output; its log:\n%s", c.Log())
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type collectedSpan struct {
	ptrace.Span
	Resource pcommon.Resource
	Scope    pcommon.InstrumentationScope
}

func attr(m pcommon.Map, k string) any {
	v, ok := m.Get(k)
	if !ok {
		return nil
	}
	return v.AsRaw()
}

// rankedDemo is the demo trace as rank 3 of 4 wrote it.
func rankedDemo(t *testing.T) string {
	data, err := os.ReadFile(filepath.Join("testdata", "demo.jsonl"))
	require.NoError(t, err)
	ranked := strings.Replace(string(data), `"process":{"pid":9375,"hostname":"vm"}`, `"process":{"pid":9375,"hostname":"vm","rank":3,"world_size":4}`, 1)
	require.NotEqual(t, string(data), ranked)
	path := filepath.Join(t.TempDir(), "demo-rank3.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(ranked), 0o644))
	return path
}

func TestCollectorReceivesTheDemoTrace(t *testing.T) {
	col := testutil.StartCollector(t)
	c, err := NewClient(col.Endpoint(), ClientOptions{})
	require.NoError(t, err)
	res, err := ExportTraceFile(context.Background(), rankedDemo(t), c, TraceOptions{ServiceName: "demo-test"})
	require.NoError(t, err)
	// 5 spans, 4 ops, no device intervals.
	assert.Equal(t, []int{9, 4, 0, 0, 1}, []int{res.Spans, res.Ops, res.DeviceIntervals, res.OpenSpans, res.Requests})
	assert.Equal(t, AnchorWallClock, res.Anchor)

	got := collectedSpans(t, col, 9)
	const wall = 1796145237194390758 // meta.clock.wall_unix_ns_at_open
	byName := map[string]collectedSpan{}
	for _, s := range got {
		byName[s.Name()] = s
		assert.Equal(t, res.TraceID, s.TraceID().String(), "one trace")
	}
	// Spans: name, parent, start (session clock + wall clock at open), duration.
	for _, tc := range []struct {
		name, parent string
		start, dur   uint64
	}{
		{"demo::train_step", "", 0, 410199},
		{"train/update", "demo::train_step", 263083, 144078},
		{"mlp/forward", "train/update", 264079, 80151},
		{"mlp/backward", "train/update", 352409, 14261},
		{"sgd/step", "train/update", 397460, 9665},
		{"matmul_relu", "mlp/forward", 264321, 8781},
		{"matmul", "mlp/forward", 326405, 1979},
		{"matmul_backward", "mlp/backward", 352482, 9415},
	} {
		s, ok := byName[tc.name]
		require.True(t, ok, tc.name)
		if tc.parent == "" {
			assert.True(t, s.ParentSpanID().IsEmpty(), "%s is a root", tc.name)
		} else {
			assert.Equal(t, byName[tc.parent].SpanID(), s.ParentSpanID(), "%s's parent is %s", tc.name, tc.parent)
		}
		assert.Equal(t, uint64(wall+tc.start), uint64(s.StartTimestamp()), tc.name)
		assert.Equal(t, tc.dur, uint64(s.EndTimestamp()-s.StartTimestamp()), tc.name)
	}
	// Attributes.
	fwd := byName["mlp/forward"].Attributes()
	assert.Equal(t, map[string]any{"candle.record": "span", "candle.span.id": "s3", "candle.span.kind": "module", "candle.step": "forward", "thread.id": int64(9375)}, fwd.AsRaw())
	upd := byName["train/update"].Attributes()
	assert.Equal(t, true, attr(upd, attrMeasured))
	assert.Equal(t, int64(0), attr(upd, attrTracerNS))
	root := byName["demo::train_step"]
	assert.Equal(t, "complete", attr(root.Attributes(), attrOutcome))
	assert.Equal(t, ptrace.StatusCodeUnset, root.Status().Code())
	op := byName["matmul"].Attributes()
	assert.Equal(t, "op", attr(op, attrRecord))
	assert.Equal(t, "f32", attr(op, attrDType))
	assert.Equal(t, int64(512), attr(op, attrOutputBytes))
	// Resource: service, run, rank, world size, host, device.
	r := root.Resource.Attributes()
	for k, v := range map[string]any{
		"service.name": "demo-test", "candle.run_id": "run-9375-1796145237194390758", "candle.rank": int64(3), "candle.world_size": int64(4),
		"host.name": "vm", "process.pid": int64(9375), "candle.device": "cpu", "candle.phase": "train", "candle.entrypoint": "demo::train_step",
		"candle.capture_step": int64(3), "candle.tag.example": "c",
	} {
		assert.Equal(t, v, attr(r, k), k)
	}
	assert.Equal(t, "candle-trace", root.Scope.Name())
	assert.Equal(t, "0.1.0", root.Scope.Version())
}

func TestCollectorReceivesTheSummaryHistograms(t *testing.T) {
	col := testutil.StartCollector(t)
	c, err := NewClient(col.Endpoint(), ClientOptions{})
	require.NoError(t, err)
	s, err := aggregate.ReadFile(filepath.Join("..", "report", "testdata", "aggregate-a.json"))
	require.NoError(t, err)
	res, err := ExportSummary(context.Background(), s, c, MetricsOptions{Rank: "1", WorldSize: "2"})
	require.NoError(t, err)
	assert.Zero(t, res.Rejected)

	var md pmetric.Metrics
	deadline := time.Now().Add(15 * time.Second)
	for {
		lines := col.Lines(col.MetricsOut)
		if len(lines) > 0 {
			var u pmetric.JSONUnmarshaler
			md, err = u.UnmarshalMetrics(lines[0])
			require.NoError(t, err)
			break
		}
		require.True(t, time.Now().Before(deadline), "no metrics in the collector's output; its log:\n%s", col.Log())
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, 1, md.ResourceMetrics().Len())
	rm := md.ResourceMetrics().At(0)
	ra := rm.Resource().Attributes()
	assert.Equal(t, int64(1), attr(ra, attrRank))
	assert.Equal(t, int64(2), attr(ra, attrWorldSize))
	assert.Equal(t, "gpu-1", attr(ra, attrHostName))
	assert.Equal(t, "run-4242-1800000000000000000", attr(ra, attrRunID))
	metrics := map[string]pmetric.Metric{}
	ms := rm.ScopeMetrics().At(0).Metrics()
	for i := 0; i < ms.Len(); i++ {
		metrics[ms.At(i).Name()] = ms.At(i)
	}
	assert.Equal(t, res.Metrics, len(metrics))
	h := metrics[MetricSpanDuration].Histogram()
	require.Equal(t, len(s.Spans), h.DataPoints().Len(), "one histogram point per span name")
	for i := range s.Spans {
		st, p := &s.Spans[i], h.DataPoints().At(i)
		assert.Equal(t, st.Name, attr(p.Attributes(), attrSpanName))
		assert.Equal(t, st.Count, p.Count(), st.Name)
		assert.Equal(t, float64(st.TotalNS), p.Sum(), st.Name)
		assert.Equal(t, []float64{float64(st.MinNS), float64(st.MaxNS)}, []float64{p.Min(), p.Max()}, st.Name)
		var sum uint64
		for _, n := range p.BucketCounts().AsRaw() {
			sum += n
		}
		assert.Equal(t, st.Count, sum, "%s: bucket counts add up to the count", st.Name)
		assert.Equal(t, s.Window.StartUnixNS, uint64(p.StartTimestamp()))
		assert.Equal(t, s.Window.EndUnixNS, uint64(p.Timestamp()))
	}
	// dataloader/next: 900 in bucket 270, [983040, 1015807], and 100 in 323, [9961472, 10485759].
	dl := h.DataPoints().At(3)
	assert.Equal(t, []float64{983039, 1015807, 9961471, 10485759}, dl.ExplicitBounds().AsRaw())
	assert.Equal(t, []uint64{0, 900, 0, 100, 0}, dl.BucketCounts().AsRaw())
	last := metrics[MetricScalarLast].Gauge().DataPoints()
	require.Equal(t, 2, last.Len())
	assert.Equal(t, "grad_norm", attr(last.At(0).Attributes(), attrScalarLabel))
	assert.Equal(t, 2.0, last.At(1).DoubleValue(), "loss's last value")
	nonFinite := metrics[MetricScalarNonFin].Sum().DataPoints()
	assert.Equal(t, int64(1), nonFinite.At(0).IntValue(), "grad_norm's NaN")
}
