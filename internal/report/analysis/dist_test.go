package analysis

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDistExact(t *testing.T) {
	var d dist
	for _, v := range []uint64{50, 10, 40, 20, 30, 100, 60, 70, 80, 90} {
		d.add(v)
	}
	assert.Equal(t, uint64(10), d.n)
	assert.Equal(t, uint64(550), d.sum)
	assert.Equal(t, uint64(10), d.min)
	assert.Equal(t, uint64(100), d.max)
	assert.Equal(t, 55.0, d.mean())
	assert.Equal(t, uint64(50), d.quantile(0.5), "nearest rank: 5th of 10")
	assert.Equal(t, uint64(100), d.quantile(0.95), "nearest rank: 10th of 10")
	assert.False(t, d.approximate())

	var empty dist
	assert.Equal(t, uint64(0), empty.quantile(0.5))
	assert.Equal(t, 0.0, empty.mean())
}

func TestDistSketchStaysWithinOnePercent(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var d dist
	var all []uint64
	for i := 0; i < 50*ExactSamples; i++ {
		v := uint64(math.Exp(rng.NormFloat64()*1.5 + 10)) // log-normal durations around 22 µs
		if i%1000 == 0 {
			v = 0
		}
		d.add(v)
		all = append(all, v)
	}
	require.True(t, d.approximate())
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	for _, q := range []float64{0.5, 0.9, 0.95, 0.99} {
		exact := float64(all[int(math.Ceil(q*float64(len(all))))-1])
		assert.InEpsilon(t, exact, float64(d.quantile(q)), 0.011, "q=%v", q)
	}
	assert.Equal(t, all[len(all)-1], d.max)
	assert.Equal(t, uint64(0), d.min)
}

func TestBlockListMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := 0; round < 200; round++ {
		var l blockList
		covered := make([]bool, 400)
		for i := 0; i < 30; i++ {
			s := rng.Uint64N(350)
			e := s + 1 + rng.Uint64N(40)
			l.add(s, e)
			for x := s; x < e; x++ {
				covered[x] = true
			}
		}
		var want uint64
		for _, c := range covered {
			if c {
				want++
			}
		}
		assert.Equal(t, want, l.total())
		for i := 1; i < len(l.b); i++ {
			require.Less(t, l.b[i-1].end, l.b[i].start, "blocks stay sorted, disjoint and non-touching")
		}
		from, to := uint64(rng.IntN(200)), uint64(200+rng.IntN(200))
		g := l.window(from, to)
		var busy uint64
		for x := from; x < to; x++ {
			if covered[x] {
				busy++
			}
		}
		assert.Equal(t, busy, g.busy)
		assert.Equal(t, (to-from)-busy, g.idle)
	}
}

func TestBlockListTouchingIntervalsMerge(t *testing.T) {
	var l blockList
	l.add(10, 20)
	l.add(20, 30) // touches: one block, as candle-graph's union
	l.add(40, 50)
	l.add(0, 5)
	assert.Equal(t, []block{{0, 5}, {10, 30}, {40, 50}}, l.b)
	g := l.window(0, 60)
	assert.Equal(t, gaps{busy: 35, idle: 25, count: 3, largest: 10, largestAt: 30}, g)
}
