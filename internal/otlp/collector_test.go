package otlp

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/testutil"
)

// These tests export to a real OpenTelemetry Collector (tools/otelcol:
// otlp receiver, file exporter) and read back what its file exporter
// wrote: what a backend behind a collector would get.

func attr(m pcommon.Map, k string) any {
	v, ok := m.Get(k)
	if !ok {
		return nil
	}
	return v.AsRaw()
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
	assert.Equal(t, int64(1), attr(ra, AttrRank))
	assert.Equal(t, int64(2), attr(ra, AttrWorldSize))
	assert.Equal(t, "gpu-1", attr(ra, AttrHostName))
	assert.Equal(t, "run-4242-1800000000000000000", attr(ra, AttrRunID))
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
