package htmlview

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestRowStore: the store keeps the region's rows, thins the others (the
// longer of each neighbouring pair stays, then one in stride), and counts
// what it left out. Rows are ops: their duration says which one each is.
func TestRowStore(t *testing.T) {
	type in struct {
		inside bool
		dur    uint64
	}
	out := func(durs ...uint64) []in {
		r := make([]in, len(durs))
		for i, d := range durs {
			r[i] = in{false, d}
		}
		return r
	}
	region := func(durs ...uint64) []in {
		r := out(durs...)
		for i := range r {
			r[i].inside = true
		}
		return r
	}
	cat := func(parts ...[]in) []in {
		var r []in
		for _, p := range parts {
			r = append(r, p...)
		}
		return r
	}
	for _, tc := range []struct {
		name             string
		limit            int
		rows             []in
		kept             []uint64
		dropped, outside int
		wantStride       int
	}{
		{"under the limit: all", 4, cat(out(1, 2), region(3)), []uint64{1, 2, 3}, 0, 0, 1},
		{"outside rows give way to the region", 4, cat(out(1, 5, 2, 6), region(10, 11)), []uint64{5, 6, 10, 11}, 2, 2, 2},
		{"the longer of each pair stays", 4, cat(out(9, 1, 2, 8), region(10)), []uint64{9, 8, 10}, 2, 2, 2},
		// 6 makes the thinning and is taken; then one in two: 7 passed, 8 taken.
		{"past a thinning, one outside row in stride", 5, out(1, 2, 3, 4, 5, 6, 7, 8), []uint64{2, 4, 5, 6, 8}, 3, 3, 2},
		{"the region alone over the limit: file order", 3, region(1, 2, 3, 4, 5), []uint64{1, 2, 3}, 2, 0, 1},
		{"one outside row cannot pair: the region's last is cut", 3, cat(out(7), region(1, 2, 3)), []uint64{7, 1, 2}, 1, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s rowStore[opRow]
			for _, r := range tc.rows {
				if admit(&s, r.inside, tc.limit) {
					s.rows = append(s.rows, opRow{dur: r.dur, inside: r.inside})
				}
			}
			var kept []uint64
			for _, r := range s.rows {
				kept = append(kept, r.dur)
			}
			assert.Equal(t, tc.kept, kept)
			assert.Equal(t, tc.dropped, s.dropped)
			assert.Equal(t, tc.outside, s.outside)
			assert.Equal(t, tc.wantStride, s.stride)
			assert.Equal(t, len(tc.rows), len(s.rows)+s.dropped, "every row is kept or counted")
		})
	}
}
