package events

import (
	"fmt"
	"math"
)

// StatsFromF32 reduces a host f32 buffer to a tensor_stats record (dtype "f32", SpanID
// left for the caller).
//
// rms, abs_max and mean are taken over the finite elements only, and the rest are counted
// in NonFinite. candle-graph's reference reduces all elements and zeroes a non-finite
// result, which turns one NaN into "all statistics 0"; reducing the finite part keeps the
// magnitude of the healthy values visible next to the count of bad ones. When no element is
// finite (or the tensor is empty) the three statistics are 0. Sums are accumulated in
// float64, so f32 overflow cannot occur.
//
// shape gives the element count (empty = scalar = 1) and must match len(data).
func StatsFromF32(label string, data []float32, shape []uint64) (TensorStats, error) {
	n, err := ElementCount(shape)
	if err != nil {
		return TensorStats{}, fmt.Errorf("tensor_stats: %q: %v", "shape", err)
	}
	if n != uint64(len(data)) {
		return TensorStats{}, fmt.Errorf("tensor_stats: %q %v has %d elements but the buffer holds %d", "shape", shape, n, len(data))
	}
	var sum, sumSq, absMax float64
	var finite uint64
	for _, x := range data {
		v := float64(x)
		if math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		finite++
		sum += v
		sumSq += v * v
		if a := math.Abs(v); a > absMax {
			absMax = a
		}
	}
	s := TensorStats{
		Label:     label,
		Dtype:     "f32",
		Shape:     append(make([]uint64, 0, len(shape)), shape...),
		Elements:  n,
		NonFinite: n - finite,
	}
	if finite > 0 {
		s.RMS = math.Sqrt(sumSq / float64(finite))
		s.AbsMax = absMax
		s.Mean = sum / float64(finite)
	}
	return s, nil
}

// ScalarStats is the tensor_stats form of one scalar observation (loss term, learning
// rate, ...): shape [], dtype f64, one element, rms = abs_max = |v|, mean = v. A non-finite
// v is recorded as all zeros with NonFinite 1, the wire format's rule.
func ScalarStats(label string, v float64) TensorStats {
	s := TensorStats{Label: label, Dtype: "f64", Shape: []uint64{}, Elements: 1}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		s.NonFinite = 1
		return s
	}
	s.RMS, s.AbsMax, s.Mean = math.Abs(v), math.Abs(v), v
	return s
}
