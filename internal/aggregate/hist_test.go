package aggregate

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBucketLayout(t *testing.T) {
	tests := []struct {
		v      uint64
		index  int
		lo, hi uint64
	}{
		{0, 0, 0, 0},
		{15, 15, 15, 15},
		{16, 16, 16, 16},
		{31, 31, 31, 31},
		{32, 32, 32, 33},
		{33, 32, 32, 33},
		{63, 47, 62, 63},
		{64, 48, 64, 67},
		{1000, 111, 992, 1023},               // e=9: (9-3)*16 + (1000>>5)&15 = 96 + 15
		{1_000_000, 270, 983_040, 1_015_807}, // e=19: 256 + (1e6>>15)&15 = 256 + 14
		{1 << 40, 37 * 16, 1 << 40, 1<<40 + 1<<36 - 1},
		{math.MaxUint64, NumBuckets - 1, 31 << 59, math.MaxUint64},
	}
	for _, tc := range tests {
		i := BucketIndex(tc.v)
		assert.Equal(t, tc.index, i, "index of %d", tc.v)
		lo, hi := BucketBounds(i)
		assert.Equal(t, tc.lo, lo, "lo of %d", tc.v)
		assert.Equal(t, tc.hi, hi, "hi of %d", tc.v)
	}
	assert.Equal(t, 976, NumBuckets)
}

// The buckets tile [0, 2^64) in order, each no wider than 1/16 of its
// lower bound.
func TestBucketsTile(t *testing.T) {
	var next uint64
	for i := range NumBuckets {
		lo, hi := BucketBounds(i)
		require.Equal(t, next, lo, "bucket %d", i)
		require.LessOrEqual(t, lo, hi)
		require.Equal(t, i, BucketIndex(lo))
		require.Equal(t, i, BucketIndex(hi))
		if lo >= 32 {
			require.LessOrEqual(t, float64(hi-lo+1), float64(lo)/SubBuckets, "bucket %d", i)
		}
		next = hi + 1
	}
	assert.Equal(t, uint64(0), next, "the last bucket ends at 2^64-1")
}

func TestRank(t *testing.T) {
	tests := []struct {
		count uint64
		p     float64
		want  uint64
	}{
		{1, 50, 1}, {1, 99, 1}, {2, 50, 1}, {3, 50, 2}, {100, 50, 50}, {100, 95, 95}, {101, 99, 100},
		{1000, 99, 990}, {1000, 99.9, 999}, {10, 0, 1}, {10, 100, 10},
		{math.MaxUint64, 50, 1 << 63}, // no overflow at any count
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, Rank(tc.count, tc.p), "rank(%d, %v)", tc.count, tc.p)
	}
}

// exactPercentile is the nearest-rank percentile of sorted values.
func exactPercentile(sorted []uint64, p float64) uint64 {
	return sorted[Rank(uint64(len(sorted)), p)-1]
}

func histOf(values []uint64) (buckets []Bucket, lo, hi uint64) {
	var h histogram
	lo = math.MaxUint64
	for _, v := range values {
		h.add(v)
		lo, hi = min(lo, v), max(hi, v)
	}
	return h.buckets(nil), lo, hi
}

// The estimate lies in the exact value's bucket, hence within
// MaxRelativeError of it, on distributions of several shapes.
func TestPercentileWithinOneBucket(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	shapes := map[string]func() uint64{
		"uniform 0..100":        func() uint64 { return rng.Uint64N(101) },
		"uniform 1µs..1ms":      func() uint64 { return 1000 + rng.Uint64N(999_000) },
		"log-uniform 10ns..10s": func() uint64 { return uint64(math.Pow(10, 1+9*rng.Float64())) },
		"bimodal":               func() uint64 { return []uint64{50_000, 2_000_000}[rng.IntN(2)] + rng.Uint64N(1000) },
		"constant":              func() uint64 { return 123_456 },
	}
	for name, gen := range shapes {
		for _, n := range []int{1, 2, 7, 100, 10_000} {
			values := make([]uint64, n)
			for i := range values {
				values[i] = gen()
			}
			buckets, lo, hi := histOf(values)
			slices.Sort(values)
			for _, p := range []float64{50, 95, 99} {
				exact := exactPercentile(values, p)
				got := Percentile(buckets, uint64(n), lo, hi, p)
				require.Equal(t, BucketIndex(exact), BucketIndex(got), "%s n=%d p%v: exact %d, got %d", name, n, p, exact, got)
				require.LessOrEqual(t, math.Abs(float64(got)-float64(exact)), MaxRelativeError*float64(exact)+0.5, "%s n=%d p%v", name, n, p)
			}
		}
	}
}

func TestHistogramChunksAllocatedOnUse(t *testing.T) {
	var h histogram
	for _, v := range []uint64{5, 1000, 1010, 1 << 40} {
		h.add(v)
	}
	chunks := 0
	for _, c := range h {
		if c != nil {
			chunks++
		}
	}
	assert.Equal(t, 3, chunks)
	assert.Equal(t, []Bucket{{5, 1}, {111, 2}, {37 * 16, 1}}, h.buckets(nil))
}
