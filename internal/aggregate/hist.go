package aggregate

import "math/bits"

// The histogram is log-linear (the HdrHistogram idea with 4 bits of
// precision): every power of two is split into SubBuckets equal buckets, so
// a bucket is never wider than 1/16 of its lower bound, and values below 32
// each get a bucket of their own. The layout is fixed — it is part of the
// summary format — so that two summaries can be compared bucket by bucket
// and percentiles recomputed from either.
//
//	index i < 32:   the value i exactly
//	index i >= 32:  octave o = i/16 (1..60), sub s = i%16,
//	                lower bound (16+s) << (o-1), width 1 << (o-1)
//
// Equivalently, for v >= 16 with e = floor(log2 v):
// index = (e-3)*16 + (v >> (e-4)) & 15. Index 975 ends at 2^64-1, so every
// uint64 has a bucket and nothing is clamped.
//
// Relative error: a percentile is reported as the midpoint of its bucket
// (clamped to the observed min and max), which is within half a bucket,
// at most 1/32 ≈ 3.1%, of every value in that bucket.
const (
	// SubBucketBits is the precision of the histogram: 2^SubBucketBits
	// buckets per power of two.
	SubBucketBits = 4
	// SubBuckets is the number of buckets per power of two.
	SubBuckets = 1 << SubBucketBits
	// Octaves is the number of groups of SubBuckets: one linear group for
	// values 0..15, then one per power of two from 2^4 to 2^63.
	Octaves = 64 - SubBucketBits + 1
	// NumBuckets is the number of buckets of every histogram.
	NumBuckets = Octaves * SubBuckets
	// MaxRelativeError bounds |reported - exact| / exact for a percentile
	// whose exact value is at least 32 (below, it is exact).
	MaxRelativeError = 1.0 / (2 * SubBuckets)
)

// BucketIndex returns the bucket that holds v.
func BucketIndex(v uint64) int {
	if v < SubBuckets {
		return int(v)
	}
	e := bits.Len64(v) - 1 // 4..63
	return (e-SubBucketBits+1)*SubBuckets + int(v>>(e-SubBucketBits))&(SubBuckets-1)
}

// BucketBounds returns the smallest and largest value of bucket i
// (inclusive); i must be in [0, NumBuckets).
func BucketBounds(i int) (lo, hi uint64) {
	if i < 2*SubBuckets {
		return uint64(i), uint64(i)
	}
	o, s := i/SubBuckets, i%SubBuckets
	width := uint64(1) << (o - 1)
	lo = uint64(SubBuckets+s) << (o - 1)
	return lo, lo + (width - 1)
}

// Bucket is one non-empty histogram bucket.
type Bucket struct {
	Index int
	Count uint64
}

// Percentile returns the p-th percentile (0 < p <= 100) by nearest rank —
// the smallest observed value with at least p% of the observations at or
// below it — estimated as the midpoint of the bucket that holds it, clamped
// to [min, max]. The estimate always lies in the same bucket as the exact
// value. buckets must be in ascending index order and sum to count; 0 when
// count is 0.
func Percentile(buckets []Bucket, count, min, max uint64, p float64) uint64 {
	if count == 0 {
		return 0
	}
	rank := Rank(count, p)
	// The extreme ranks are known exactly.
	switch rank {
	case 1:
		return min
	case count:
		return max
	}
	var seen uint64
	for _, b := range buckets {
		seen += b.Count
		if seen >= rank {
			lo, hi := BucketBounds(b.Index)
			return clamp(lo+(hi-lo)/2, min, max)
		}
	}
	return max
}

// Rank is the 1-based nearest rank of the p-th percentile of count values:
// ceil(count·p/100), at least 1.
func Rank(count uint64, p float64) uint64 {
	if p <= 0 {
		return 1
	}
	if p >= 100 {
		return count
	}
	// Integer arithmetic for whole percentages keeps ranks exact at any
	// count; float for the rest.
	if ip := uint64(p); float64(ip) == p {
		r := (count/100)*ip + ((count%100)*ip+99)/100
		return max(r, 1)
	}
	r := uint64(float64(count)*p/100 + 0.999999999)
	return min(max(r, 1), count)
}

func clamp(v, lo, hi uint64) uint64 {
	return min(max(v, lo), hi)
}

// histogram stores bucket counts in octave chunks allocated on first use:
// a name whose durations span a few powers of two costs a few 128-byte
// chunks plus the 488-byte table, not all 976 counters (7.6 KiB).
type histogram [Octaves]*[SubBuckets]uint64

func (h *histogram) add(v uint64) {
	i := BucketIndex(v)
	c := h[i/SubBuckets]
	if c == nil {
		c = new([SubBuckets]uint64)
		h[i/SubBuckets] = c
	}
	c[i%SubBuckets]++
}

// buckets appends the non-empty buckets in index order.
func (h *histogram) buckets(dst []Bucket) []Bucket {
	for o, c := range h {
		if c == nil {
			continue
		}
		for s, n := range c {
			if n > 0 {
				dst = append(dst, Bucket{Index: o*SubBuckets + s, Count: n})
			}
		}
	}
	return dst
}
