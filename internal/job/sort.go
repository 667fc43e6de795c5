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

// unionLength is the total length covered by the intervals.
func unionLength(iv []interval) int64 {
	s := slices.Clone(iv)
	sort.Slice(s, func(i, j int) bool { return s[i].lo < s[j].lo })
	var total, curLo, curHi int64
	open := false
	for _, x := range s {
		if x.hi <= x.lo {
			continue
		}
		if !open || x.lo > curHi {
			if open {
				total += curHi - curLo
			}
			curLo, curHi, open = x.lo, x.hi, true
		} else if x.hi > curHi {
			curHi = x.hi
		}
	}
	if open {
		total += curHi - curLo
	}
	return total
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
