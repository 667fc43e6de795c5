package otlp

import (
	"math/rand"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pmetric"

	"github.com/candle-trace/candle-trace/internal/aggregate"
)

func TestExplicitBuckets(t *testing.T) {
	for _, tc := range []struct {
		name    string
		buckets []aggregate.Bucket
		bounds  []float64
		counts  []uint64
	}{
		{"zero", []aggregate.Bucket{{Index: 0, Count: 5}}, []float64{0}, []uint64{5, 0}},
		{"exact values", []aggregate.Bucket{{Index: 3, Count: 1}, {Index: 4, Count: 2}}, []float64{2, 3, 4}, []uint64{0, 1, 2, 0}},
		{"a gap", []aggregate.Bucket{{Index: 0, Count: 1}, {Index: 5, Count: 1}}, []float64{0, 4, 5}, []uint64{1, 0, 1, 0}},
		// Bucket 32 is [32, 33], 33 is [34, 35].
		{"wide buckets", []aggregate.Bucket{{Index: 32, Count: 7}, {Index: 33, Count: 1}}, []float64{31, 33, 35}, []uint64{0, 7, 1, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bounds, counts := explicitBuckets(tc.buckets)
			assert.Equal(t, tc.bounds, bounds)
			assert.Equal(t, tc.counts, counts)
		})
	}
}

// Every observed value falls, in OTLP's buckets, into the one that holds
// the summary's count for it.
func TestExplicitBucketsHoldEveryValue(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	agg := aggregate.New()
	k, err := agg.Intern("step", 0)
	require.NoError(t, err)
	var values []uint64
	for i := 0; i < 5000; i++ {
		v := uint64(rng.ExpFloat64() * 2e6)
		if i%50 == 0 {
			v = uint64(rng.Int63n(1 << 40))
		}
		values = append(values, v)
		agg.Observe(k, v)
	}
	s := agg.Snapshot()
	require.Len(t, s.Spans, 1)
	bounds, counts := explicitBuckets(s.Spans[0].HistBuckets())
	for i := 1; i < len(bounds); i++ {
		require.Less(t, bounds[i-1], bounds[i], "bounds increase")
	}
	got := make([]uint64, len(counts))
	for _, v := range values {
		i := 0
		for i < len(bounds) && float64(v) > bounds[i] {
			i++
		}
		got[i]++
	}
	assert.Equal(t, counts, got)
}

func TestSummaryMetricsOfAnEmptySummary(t *testing.T) {
	s := aggregate.New().Snapshot()
	s.Run = aggregate.Run{Entrypoint: "e", Phase: "train", Device: "cpu", Tags: map[string]string{"rank": "5"}}
	md := SummaryMetrics(s, MetricsOptions{})
	names := map[string]pmetric.MetricType{}
	ms := md.ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics()
	for i := 0; i < ms.Len(); i++ {
		names[ms.At(i).Name()] = ms.At(i).Type()
	}
	assert.Equal(t, map[string]pmetric.MetricType{
		MetricEnabled: pmetric.MetricTypeGauge, MetricEnabledTime: pmetric.MetricTypeSum, MetricSequence: pmetric.MetricTypeGauge,
		MetricKeysRefused: pmetric.MetricTypeSum, MetricScalarsRefused: pmetric.MetricTypeSum, MetricDropped: pmetric.MetricTypeSum,
	}, names, "no span or scalar metrics without observations, no otlp one without a push")
	res := md.ResourceMetrics().At(0).Resource().Attributes()
	assert.Equal(t, int64(5), attr(res, AttrRank), "rank from the run's tags")
	assert.Equal(t, DefaultServiceName, attr(res, AttrServiceName))
}
