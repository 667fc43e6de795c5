package events

import (
	"math"
	"math/rand"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStatsFromF32(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	tests := []struct {
		name      string
		data      []float32
		shape     []uint64
		nonFinite uint64
		rms       float64
		absMax    float64
		mean      float64
	}{
		// [1,-2,3,-4]: sum -2 → mean -0.5; squares 1+4+9+16=30 → rms sqrt(7.5); |max| 4.
		{"plain", []float32{1, -2, 3, -4}, []uint64{2, 2}, 0, math.Sqrt(7.5), 4, -0.5},
		// [-3, 1.5, 0, 0, 0, 0]: sum -1.5 → mean -0.25; squares 9+2.25 = 11.25, /6 = 1.875 →
		// rms sqrt(1.875); the zeros are finite and count in the denominators.
		{"zeros count as finite", []float32{-3, 1.5, 0, 0, 0, 0}, []uint64{2, 3}, 0, math.Sqrt(1.875), 3, -0.25},
		// Non-finite elements are counted and left out: finite part [2, 4] → mean 3, rms sqrt(10).
		{"NaN and Inf skipped", []float32{2, nan, 4, inf}, []uint64{4}, 2, math.Sqrt(10), 4, 3},
		{"-Inf skipped", []float32{float32(math.Inf(-1)), -5}, []uint64{2}, 1, 5, 5, -5},
		{"all non-finite", []float32{nan, inf}, []uint64{2}, 2, 0, 0, 0},
		{"empty tensor", []float32{}, []uint64{0, 3}, 0, 0, 0, 0},
		{"scalar", []float32{-2.5}, nil, 0, 2.5, 2.5, -2.5},
		// f32 max squared overflows f32 but not the float64 accumulator.
		{"large values", []float32{math.MaxFloat32, -math.MaxFloat32}, []uint64{2}, 0, float64(math.MaxFloat32), float64(math.MaxFloat32), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := StatsFromF32("lbl", tt.data, tt.shape)
			require.NoError(t, err)
			assert.Equal(t, "lbl", s.Label)
			assert.Equal(t, "f32", s.Dtype)
			assert.Equal(t, uint64(len(tt.data)), s.Elements)
			assert.Equal(t, tt.nonFinite, s.NonFinite)
			assert.InDelta(t, tt.rms, s.RMS, 1e-9*math.Max(1, tt.rms))
			assert.InDelta(t, tt.absMax, s.AbsMax, 1e-9*math.Max(1, tt.absMax))
			assert.InDelta(t, tt.mean, s.Mean, 1e-9*math.Max(1, math.Abs(tt.mean)))
			assert.NotNil(t, s.Shape)
			assert.NoError(t, s.Validate(), "a reduction always yields a valid record")
		})
	}
}

func TestStatsFromF32CopiesShape(t *testing.T) {
	shape := []uint64{2}
	s, err := StatsFromF32("x", []float32{1, 2}, shape)
	require.NoError(t, err)
	shape[0] = 99
	assert.Equal(t, []uint64{2}, s.Shape, "the caller's shape buffer is borrowed, not kept")
}

func TestStatsFromF32Errors(t *testing.T) {
	tests := []struct {
		name  string
		data  []float32
		shape []uint64
		want  string
	}{
		{"length mismatch", []float32{1, 2, 3}, []uint64{2, 2}, `"shape" [2 2] has 4 elements but the buffer holds 3`},
		{"scalar shape with two values", []float32{1, 2}, nil, `has 1 elements but the buffer holds 2`},
		{"overflow", []float32{1}, []uint64{1 << 32, 1 << 32}, `tensor_stats: "shape"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := StatsFromF32("x", tt.data, tt.shape)
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func TestScalarStats(t *testing.T) {
	tests := []struct {
		name      string
		v         float64
		rms, mean float64
		nonFinite uint64
	}{
		{"positive", 0.75, 0.75, 0.75, 0},
		{"negative", -2, 2, -2, 0},
		{"zero", 0, 0, 0, 0},
		{"NaN", math.NaN(), 0, 0, 1},
		{"+Inf", math.Inf(1), 0, 0, 1},
		{"-Inf", math.Inf(-1), 0, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := ScalarStats("loss", tt.v)
			assert.Equal(t, TensorStats{Label: "loss", Dtype: "f64", Shape: []uint64{}, Elements: 1, NonFinite: tt.nonFinite,
				RMS: tt.rms, AbsMax: tt.rms, Mean: tt.mean}, s)
			assert.NoError(t, s.Validate())
		})
	}
}

// The four-lane pass agrees with a plain float64 reduction on every length
// (the tail), sign and non-finite mix.
func TestStatsFromF32MatchesAPlainReduction(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	for _, n := range []int{1, 2, 3, 4, 5, 7, 8, 9, 63, 1000, 4097} {
		data := make([]float32, n)
		for i := range data {
			switch rng.Intn(20) {
			case 0:
				data[i] = float32(math.NaN())
			case 1:
				data[i] = float32(math.Inf(1 - 2*rng.Intn(2)))
			default:
				data[i] = float32(rng.NormFloat64() * 1e3)
			}
		}
		var sum, sq, amax float64
		var finite uint64
		for _, x := range data {
			v := float64(x)
			if math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			finite++
			sum, sq = sum+v, sq+v*v
			amax = math.Max(amax, math.Abs(v))
		}
		s, err := StatsFromF32("x", data, []uint64{uint64(n)})
		require.NoError(t, err)
		require.Equal(t, uint64(n)-finite, s.NonFinite, "n=%d", n)
		if finite == 0 {
			continue
		}
		assert.Equal(t, amax, s.AbsMax, "n=%d", n)
		assert.InEpsilon(t, math.Sqrt(sq/float64(finite)), s.RMS, 1e-12, "n=%d", n)
		assert.InDelta(t, sum/float64(finite), s.Mean, 1e-9*amax, "n=%d", n)
	}
}

func BenchmarkStatsFromF32(b *testing.B) {
	data := make([]float32, 1<<20)
	for i := range data {
		data[i] = float32(i%1000) - 500
	}
	shape := []uint64{uint64(len(data))}
	b.SetBytes(int64(4 * len(data)))
	for i := 0; i < b.N; i++ {
		if _, err := StatsFromF32("x", data, shape); err != nil {
			b.Fatal(err)
		}
	}
}
