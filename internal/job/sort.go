package job

import (
	"slices"
	"sort"
)

// sortSpans orders spans by start, the enclosing one first when two start
// together.
func sortSpans(s []Span) {
	sort.SliceStable(s, func(i, j int) bool {
		if s[i].StartNS != s[j].StartNS {
			return s[i].StartNS < s[j].StartNS
		}
		return s[i].EndNS > s[j].EndNS
	})
}

func sortCollectives(c []Collective) {
	sort.SliceStable(c, func(i, j int) bool { return c[i].EnterNS < c[j].EnterNS })
}

// median of the values (0 for none); the lower middle for an even count,
// so that it is always one of the values.
func median(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// interval is [lo, hi) on one clock.
type interval struct{ lo, hi int64 }

// merge returns the union of the intervals as disjoint intervals in order.
func merge(iv []interval) []interval {
	s := slices.Clone(iv)
	sort.Slice(s, func(i, j int) bool { return s[i].lo < s[j].lo })
	out := s[:0]
	for _, x := range s {
		if x.hi <= x.lo {
			continue
		}
		if n := len(out); n > 0 && x.lo <= out[n-1].hi {
			out[n-1].hi = max(out[n-1].hi, x.hi)
			continue
		}
		out = append(out, x)
	}
	return out
}

// unionLength is the total length covered by the intervals.
func unionLength(iv []interval) int64 {
	var total int64
	for _, x := range merge(iv) {
		total += x.hi - x.lo
	}
	return total
}

// lengthOutside is how much of the union of iv lies outside the disjoint,
// ordered intervals busy.
func lengthOutside(iv []interval, busy []interval) int64 {
	var out int64
	for _, x := range merge(iv) {
		covered := int64(0)
		k := sort.Search(len(busy), func(i int) bool { return busy[i].hi > x.lo })
		for ; k < len(busy) && busy[k].lo < x.hi; k++ {
			covered += min(busy[k].hi, x.hi) - max(busy[k].lo, x.lo)
		}
		out += x.hi - x.lo - covered
	}
	return out
}

// clip returns the parts of the intervals inside [lo, hi).
func clip(iv []interval, lo, hi int64) []interval {
	var out []interval
	for _, x := range iv {
		a, b := max(x.lo, lo), min(x.hi, hi)
		if b > a {
			out = append(out, interval{a, b})
		}
	}
	return out
}
