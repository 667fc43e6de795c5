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
	sum, sumSq, absMax, finite := reduceF32(data)
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

// f32Lanes is the number of float64 accumulators of the statistics pass: element i
// goes into lane i % f32Lanes, and the lanes are combined by one fixed tree
// (combineLanes), so the result is the same on every CPU and every path (reduce_f32.c's
// AVX2 and portable loops, reduceF32Lanes below): many lanes also keep the pass from
// being bound by the latency of float64 adds.
const f32Lanes = 16

// reduceF32Lanes is the statistics pass in Go: the reference of reduce_f32.c (the tests
// compare them bit for bit) and the pass of a build without cgo. The finiteness test is
// on the float32's exponent bits, |x|'s maximum on its bits with the sign cleared (for
// finite floats the same order as the values); a non-finite element adds nothing.
func reduceF32Lanes(data []float32) (sum, sumSq, absMax float64, finite uint64) {
	const exp, abs = 0x7f800000, 0x7fffffff
	var s, q [f32Lanes]float64
	var m uint32
	var bad uint64
	for i, x := range data {
		b := math.Float32bits(x)
		if b&exp == exp {
			bad++
			continue
		}
		v := float64(x)
		l := i % f32Lanes
		s[l] += v
		q[l] += v * v
		m = max(m, b&abs)
	}
	sum, sumSq = combineLanes(&s), combineLanes(&q)
	return sum, sumSq, float64(math.Float32frombits(m)), uint64(len(data)) - bad
}

// combineLanes adds the lanes in reduce_f32.c's order: halves folded onto each other.
func combineLanes(l *[f32Lanes]float64) float64 {
	var h [8]float64
	for i := range h {
		h[i] = l[i] + l[i+8]
	}
	for i := 0; i < 4; i++ {
		h[i] += h[i+4]
	}
	for i := 0; i < 2; i++ {
		h[i] += h[i+2]
	}
	return h[0] + h[1]
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
