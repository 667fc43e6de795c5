package otlp

import (
	"context"
	"fmt"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"

	"github.com/candle-trace/candle-trace/internal/aggregate"
)

// Metric names and data point attributes of a summary.
const (
	MetricSpanDuration   = "candle.span.duration"
	MetricScalarLast     = "candle.scalar.last"
	MetricScalarMean     = "candle.scalar.mean"
	MetricScalarMin      = "candle.scalar.min"
	MetricScalarMax      = "candle.scalar.max"
	MetricScalarCount    = "candle.scalar.count"
	MetricScalarNonFin   = "candle.scalar.non_finite"
	MetricEnabled        = "candle.aggregate.enabled"
	MetricEnabledTime    = "candle.aggregate.enabled_time"
	MetricSequence       = "candle.aggregate.sequence"
	MetricKeysRefused    = "candle.aggregate.keys_refused"
	MetricScalarsRefused = "candle.aggregate.scalars_refused"
	MetricDropped        = "candle.aggregate.dropped"
	MetricOTLPDropped    = "candle.otlp.dropped"

	attrSpanName    = "candle.span.name"
	attrStep        = "candle.step"
	attrScalarLabel = "candle.scalar.label"
	attrDropReason  = "candle.reason"
)

// MetricsOptions tune how a summary becomes metrics.
type MetricsOptions struct {
	ServiceName string // service.name; DefaultServiceName when ""
	// Rank and WorldSize, when set, name the process's place in a
	// multi-process job (a summary does not carry them).
	Rank, WorldSize string
}

// SummaryMetrics turns an aggregate summary into OTLP metrics, all over
// the summary's window (start_unix_ns to end_unix_ns), cumulative:
//
//   - candle.span.duration: a histogram per (span name, step), in ns, with
//     the summary's own buckets as explicit bounds — a bucket [lo, hi]
//     becomes (lo-1, hi], with an empty bucket for each gap — so counts,
//     sum, min and max are the summary's exactly and every percentile a
//     backend reads from it lies in the bucket the summary's does;
//   - per scalar label, gauges of its last, mean, min and max, and sums of
//     its finite and non-finite counts;
//   - the summary's own health: enabled (gauge 0/1), enabled time, sequence,
//     the keys and scalars the caps refused, the observations dropped, and
//     the OTLP pushes dropped before this one.
func SummaryMetrics(s *aggregate.Summary, opts MetricsOptions) pmetric.Metrics {
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	summaryResource(s, &opts).Put(rm.Resource())
	sm := rm.ScopeMetrics().AppendEmpty()
	sm.Scope().SetName(ScopeName)
	sm.Scope().SetVersion(s.Producer.Version)
	ms := sm.Metrics()
	start, now := pcommon.Timestamp(s.Window.StartUnixNS), pcommon.Timestamp(s.Window.EndUnixNS)

	if len(s.Spans) > 0 {
		m := ms.AppendEmpty()
		m.SetName(MetricSpanDuration)
		m.SetDescription("span durations by name and step, over the run so far")
		m.SetUnit("ns")
		h := m.SetEmptyHistogram()
		h.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
		pts := h.DataPoints()
		pts.EnsureCapacity(len(s.Spans))
		for i := range s.Spans {
			st := &s.Spans[i]
			p := pts.AppendEmpty()
			p.SetStartTimestamp(start)
			p.SetTimestamp(now)
			p.Attributes().PutStr(attrSpanName, st.Name)
			if st.Step != "" {
				p.Attributes().PutStr(attrStep, st.Step)
			}
			p.SetCount(st.Count)
			p.SetSum(float64(st.TotalNS))
			p.SetMin(float64(st.MinNS))
			p.SetMax(float64(st.MaxNS))
			bounds, counts := explicitBuckets(st.HistBuckets())
			p.ExplicitBounds().FromRaw(bounds)
			p.BucketCounts().FromRaw(counts)
		}
	}

	if len(s.Scalars) > 0 {
		gauge := func(name, desc string, v func(*aggregate.ScalarStats) float64) {
			m := ms.AppendEmpty()
			m.SetName(name)
			m.SetDescription(desc)
			pts := m.SetEmptyGauge().DataPoints()
			for i := range s.Scalars {
				sc := &s.Scalars[i]
				if sc.Count == 0 {
					continue // no finite value: nothing to state
				}
				p := pts.AppendEmpty()
				p.SetStartTimestamp(start)
				p.SetTimestamp(now)
				p.Attributes().PutStr(attrScalarLabel, sc.Label)
				p.SetDoubleValue(v(sc))
			}
		}
		gauge(MetricScalarLast, "the scalar's last finite value", func(s *aggregate.ScalarStats) float64 { return s.Last })
		gauge(MetricScalarMean, "the mean of the scalar's finite values", func(s *aggregate.ScalarStats) float64 { return s.Mean })
		gauge(MetricScalarMin, "the scalar's smallest finite value", func(s *aggregate.ScalarStats) float64 { return s.Min })
		gauge(MetricScalarMax, "the scalar's largest finite value", func(s *aggregate.ScalarStats) float64 { return s.Max })
		count := func(name, desc string, v func(*aggregate.ScalarStats) uint64) {
			m := ms.AppendEmpty()
			m.SetName(name)
			m.SetDescription(desc)
			sum := m.SetEmptySum()
			sum.SetIsMonotonic(true)
			sum.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
			for i := range s.Scalars {
				p := sum.DataPoints().AppendEmpty()
				p.SetStartTimestamp(start)
				p.SetTimestamp(now)
				p.Attributes().PutStr(attrScalarLabel, s.Scalars[i].Label)
				p.SetIntValue(int64(min(v(&s.Scalars[i]), 1<<63-1)))
			}
		}
		count(MetricScalarCount, "finite values recorded", func(s *aggregate.ScalarStats) uint64 { return s.Count })
		count(MetricScalarNonFin, "NaN and infinite values recorded", func(s *aggregate.ScalarStats) uint64 { return s.NonFinite })
	}

	intGauge := func(name, desc, unit string, v uint64) {
		m := ms.AppendEmpty()
		m.SetName(name)
		m.SetDescription(desc)
		m.SetUnit(unit)
		p := m.SetEmptyGauge().DataPoints().AppendEmpty()
		p.SetStartTimestamp(start)
		p.SetTimestamp(now)
		p.SetIntValue(int64(min(v, 1<<63-1)))
	}
	counter := func(name, desc, unit string, points ...reasonCount) {
		m := ms.AppendEmpty()
		m.SetName(name)
		m.SetDescription(desc)
		m.SetUnit(unit)
		sum := m.SetEmptySum()
		sum.SetIsMonotonic(true)
		sum.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
		for _, pt := range points {
			p := sum.DataPoints().AppendEmpty()
			p.SetStartTimestamp(start)
			p.SetTimestamp(now)
			if pt.reason != "" {
				p.Attributes().PutStr(attrDropReason, pt.reason)
			}
			p.SetIntValue(int64(min(pt.n, 1<<63-1)))
		}
	}
	enabled := uint64(0)
	if s.Enabled.Now {
		enabled = 1
	}
	intGauge(MetricEnabled, "1 while statistics are being folded", "1", enabled)
	counter(MetricEnabledTime, "time statistics were enabled", "ns", reasonCount{"", s.Enabled.EnabledNS})
	intGauge(MetricSequence, "the summary's sequence number", "1", s.Sequence)
	counter(MetricKeysRefused, "span keys the cap refused", "1", reasonCount{"", s.Overflow.KeysRefused})
	counter(MetricScalarsRefused, "scalar labels the cap refused", "1", reasonCount{"", s.Overflow.ScalarsRefused})
	counter(MetricDropped, "observations not folded", "1", reasonCount{"invalid_key", s.Dropped.InvalidKey}, reasonCount{"producer", s.Dropped.Producer})
	if s.OTLP != nil {
		counter(MetricOTLPDropped, "summaries the OTLP push dropped before this one", "1", reasonCount{"", s.OTLP.Dropped})
	}
	return md
}

// reasonCount is one point of a counter, with the reason it counts ("" for
// none).
type reasonCount struct {
	reason string
	n      uint64
}

// explicitBuckets turns the summary's non-empty buckets (ascending) into
// OTLP explicit bounds and counts: bucket k of OTLP covers (bounds[k-1],
// bounds[k]], the first (-inf, bounds[0]], the last (bounds[n-1], +inf).
// Durations are integers, so the summary's bucket [lo, hi] is exactly
// (lo-1, hi]; a gap between two non-empty buckets becomes one empty bucket.
func explicitBuckets(buckets []aggregate.Bucket) (bounds []float64, counts []uint64) {
	bounds = make([]float64, 0, 2*len(buckets))
	counts = make([]uint64, 0, 2*len(buckets)+1)
	var prevHi uint64
	for i, bk := range buckets {
		lo, hi := aggregate.BucketBounds(bk.Index)
		if (i == 0 && lo > 0) || (i > 0 && lo > prevHi+1) {
			bounds = append(bounds, float64(lo-1))
			counts = append(counts, 0)
		}
		bounds = append(bounds, float64(hi))
		counts = append(counts, bk.Count)
		prevHi = hi
	}
	return bounds, append(counts, 0)
}

// MetricsResult says what an export of a summary sent.
type MetricsResult struct {
	Metrics, DataPoints int
	Rejected            int64
	RejectedMessage     string
}

// ExportSummary sends a summary's metrics in one request.
func ExportSummary(ctx context.Context, s *aggregate.Summary, c *Client, opts MetricsOptions) (*MetricsResult, error) {
	md := SummaryMetrics(s, opts)
	var m pmetric.ProtoMarshaler
	body, err := m.MarshalMetrics(md)
	if err != nil {
		return nil, fmt.Errorf("encoding OTLP metrics: %w", err)
	}
	rep, err := c.Send(ctx, Metrics, body)
	if err != nil {
		return nil, err
	}
	return &MetricsResult{Metrics: md.MetricCount(), DataPoints: md.DataPointCount(), Rejected: rep.Rejected, RejectedMessage: rep.Message}, nil
}
