package analysis

import (
	"math"
	"sort"

	"github.com/candle-trace/candle-trace/internal/report/trace"
)

// ExactSamples is how many values a distribution keeps before it switches
// to a log-bucket sketch: small traces get exact percentiles, large ones
// bounded memory.
const ExactSamples = 4096

// sketchGamma bounds the relative error of sketched percentiles to about 1%.
const sketchGamma = 1.02

// dist summarises a stream of durations: count, sum, min, max and
// percentiles.
type dist struct {
	n, sum, min, max uint64
	exact            []uint64
	buckets          map[int32]uint64 // log-bucket index -> count; index -1 holds zeros
}

func (d *dist) add(v uint64) {
	if d.n == 0 || v < d.min {
		d.min = v
	}
	if v > d.max {
		d.max = v
	}
	d.n++
	d.sum = trace.SatAdd(d.sum, v)
	if d.buckets == nil {
		if len(d.exact) < ExactSamples {
			d.exact = append(d.exact, v)
			return
		}
		d.buckets = map[int32]uint64{}
		for _, x := range d.exact {
			d.buckets[bucketOf(x)]++
		}
		d.exact = nil
	}
	d.buckets[bucketOf(v)]++
}

func bucketOf(v uint64) int32 {
	if v == 0 {
		return -1
	}
	return int32(math.Ceil(math.Log(float64(v)) / math.Log(sketchGamma)))
}

// approximate tells whether quantiles come from the sketch.
func (d *dist) approximate() bool { return d.buckets != nil }

// quantile returns the nearest-rank q-quantile (0 < q <= 1).
func (d *dist) quantile(q float64) uint64 {
	if d.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(d.n)))
	rank = max(rank, 1)
	if d.buckets == nil {
		s := append([]uint64(nil), d.exact...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[rank-1]
	}
	idx := make([]int32, 0, len(d.buckets))
	for i := range d.buckets {
		idx = append(idx, i)
	}
	sort.Slice(idx, func(i, j int) bool { return idx[i] < idx[j] })
	var seen uint64
	for _, i := range idx {
		seen += d.buckets[i]
		if seen >= rank {
			if i < 0 {
				return 0
			}
			// The bucket (γ^(i-1), γ^i] is represented by its midpoint in
			// relative terms.
			v := 2 * math.Pow(sketchGamma, float64(i)) / (1 + sketchGamma)
			return min(max(uint64(math.Round(v)), d.min), d.max)
		}
	}
	return d.max
}

func (d *dist) mean() float64 {
	if d.n == 0 {
		return 0
	}
	return float64(d.sum) / float64(d.n)
}

// blockList is the union of half-open intervals [start, end) as sorted,
// disjoint blocks. Intervals that touch merge, as in candle-graph's union.
// Appending in start order is O(1); out-of-order inserts stay exact.
type blockList struct {
	b []block
}

type block struct{ start, end uint64 }

func (l *blockList) add(start, end uint64) {
	n := len(l.b)
	if n == 0 || start > l.b[n-1].end {
		l.b = append(l.b, block{start, end})
		return
	}
	if start >= l.b[n-1].start {
		l.b[n-1].end = max(l.b[n-1].end, end)
		return
	}
	// First block that ends at or after start: it and every later block
	// that begins at or before end merge with the new interval.
	i := sort.Search(n, func(i int) bool { return l.b[i].end >= start })
	j := i
	for j < n && l.b[j].start <= end {
		start = min(start, l.b[j].start)
		end = max(end, l.b[j].end)
		j++
	}
	if i == j {
		l.b = append(l.b, block{})
		copy(l.b[i+1:], l.b[i:])
		l.b[i] = block{start, end}
		return
	}
	l.b[i] = block{start, end}
	l.b = append(l.b[:i+1], l.b[j:]...)
}

func (l *blockList) total() uint64 {
	var t uint64
	for _, b := range l.b {
		t = trace.SatAdd(t, b.end-b.start)
	}
	return t
}

// gaps describes the idle time inside [from, to]: the parts of the window
// no block covers.
type gaps struct {
	busy, idle         uint64
	count              int
	largest, largestAt uint64
}

func (l *blockList) window(from, to uint64) gaps {
	var g gaps
	cursor := from
	note := func(s, e uint64) {
		if e > s {
			g.idle += e - s
			g.count++
			if e-s > g.largest {
				g.largest, g.largestAt = e-s, s
			}
		}
	}
	i := sort.Search(len(l.b), func(i int) bool { return l.b[i].end > from })
	for ; i < len(l.b) && l.b[i].start < to; i++ {
		s, e := max(l.b[i].start, from), min(l.b[i].end, to)
		note(cursor, s)
		if e > s {
			g.busy += e - s
		}
		cursor = max(cursor, e)
	}
	note(cursor, to)
	return g
}
