//go:build cgo

package events

import (
	"encoding/binary"
	"math"
	"math/big"
	"math/rand"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type f32Reduction struct {
	sum, sumSq, absMax float64
	finite             uint64
}

func reductionOf(sum, sumSq, absMax float64, finite uint64) f32Reduction {
	return f32Reduction{sum, sumSq, absMax, finite}
}

// f32Cases are buffers with what the statistics pass treats apart: NaN, +-Inf, -0,
// denormals, float32's extremes, at lengths around the 16 lanes and the 1024-element
// blocks of reduce_f32.c (a non-finite element in some blocks only sends those down the
// masked loop).
func f32Cases() map[string][]float32 {
	rng := rand.New(rand.NewSource(11))
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	denorm := math.Float32frombits(1) // the smallest denormal
	out := map[string][]float32{
		"empty":       {},
		"one NaN":     {nan},
		"all Inf":     {inf, -inf, inf},
		"negative 0":  {float32(math.Copysign(0, -1))},
		"denormals":   {denorm, -denorm, math.Float32frombits(0x007fffff)},
		"extremes":    {math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32},
		"NaN payload": {math.Float32frombits(0xffc00001), 1, math.Float32frombits(0x7f800001)},
	}
	for _, n := range []int{1, 15, 16, 17, 1023, 1024, 1025, 2048 + 31, 3*1024 + 16, 10000} {
		clean := make([]float32, n)
		mixed := make([]float32, n)
		for i := range clean {
			clean[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.Intn(20)-10)))
			mixed[i] = clean[i]
			switch rng.Intn(400) {
			case 0:
				mixed[i] = nan
			case 1:
				mixed[i] = float32(math.Inf(1 - 2*rng.Intn(2)))
			case 2:
				mixed[i] = math.Float32frombits(uint32(rng.Intn(1 << 23))) // denormal
			}
		}
		out["clean/"+itoa(n)] = clean
		out["mixed/"+itoa(n)] = mixed
		if n > 1024+3 {
			onlyLast := append([]float32(nil), clean...)
			onlyLast[n-1] = nan // the tail
			out["NaN in the tail/"+itoa(n)] = onlyLast
			second := append([]float32(nil), clean...)
			second[1024+3] = -inf // the second block only
			out["Inf in block 2/"+itoa(n)] = second
		}
	}
	return out
}

func itoa(n int) string { return strconv.Itoa(n) }

// The AVX2 loop, the portable C loop and the Go reference give the same bits: a trace's
// statistics do not depend on the CPU or the build.
func TestReduceF32PathsAgreeBitForBit(t *testing.T) {
	for name, data := range f32Cases() {
		t.Run(name, func(t *testing.T) {
			want := reductionOf(reduceF32Lanes(data))
			assert.Equal(t, want, reductionOf(reduceF32C(data, false)), "AVX2 (where present)")
			assert.Equal(t, want, reductionOf(reduceF32C(data, true)), "portable C")
		})
	}
}

// Against exact arithmetic (math/big): the count and |x|'s maximum are exact, the sums
// within float64 rounding of their exact values.
func TestReduceF32AgainstExactArithmetic(t *testing.T) {
	for name, data := range f32Cases() {
		t.Run(name, func(t *testing.T) {
			sum, sq := new(big.Float).SetPrec(2000), new(big.Float).SetPrec(2000)
			var finite uint64
			var amax, absSum float64
			for _, x := range data {
				v := float64(x)
				if math.IsNaN(v) || math.IsInf(v, 0) {
					continue
				}
				finite++
				bv := new(big.Float).SetPrec(2000).SetFloat64(v)
				sum.Add(sum, bv)
				sq.Add(sq, new(big.Float).SetPrec(2000).Mul(bv, bv))
				amax = math.Max(amax, math.Abs(v))
				absSum += math.Abs(v)
			}
			got := reductionOf(reduceF32(data))
			require.Equal(t, finite, got.finite)
			assert.Equal(t, amax, got.absMax)
			// |error| <= (n-1) u sum|x| for any order of float64 additions.
			u := math.Ldexp(1, -53) * float64(len(data))
			exactSum, _ := sum.Float64()
			exactSq, _ := sq.Float64()
			assert.InDelta(t, exactSum, got.sum, u*absSum+math.SmallestNonzeroFloat64)
			assert.InDelta(t, exactSq, got.sumSq, u*exactSq+math.SmallestNonzeroFloat64)
		})
	}
}

// A count float32 accumulation could not hold (2^24 + 17 ones: float32 stops at 2^24).
func TestReduceF32LargeCount(t *testing.T) {
	if testing.Short() {
		t.Skip("64 MiB buffer; run without -short")
	}
	n := 1<<24 + 17
	data := make([]float32, n)
	for i := range data {
		data[i] = 1
	}
	data[n/2] = float32(math.NaN())
	s, err := StatsFromF32("x", data, []uint64{uint64(n)})
	require.NoError(t, err)
	assert.Equal(t, uint64(1), s.NonFinite)
	assert.Equal(t, 1.0, s.Mean)
	assert.Equal(t, 1.0, s.RMS)
	assert.Equal(t, 1.0, s.AbsMax)
}

func FuzzReduceF32(f *testing.F) {
	f.Add([]byte{0, 0, 0x80, 0x7f, 0, 0, 0x80, 0x3f})
	f.Add(make([]byte, 4*1030))
	f.Fuzz(func(t *testing.T, raw []byte) {
		data := make([]float32, len(raw)/4)
		for i := range data {
			data[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		want := reductionOf(reduceF32Lanes(data))
		// NaN sums cannot happen (non-finite elements are skipped); Equal compares bits.
		require.Equal(t, want, reductionOf(reduceF32C(data, false)))
		require.Equal(t, want, reductionOf(reduceF32C(data, true)))
		s, err := StatsFromF32("x", data, []uint64{uint64(len(data))})
		require.NoError(t, err)
		require.NoError(t, s.Validate())
	})
}

// The pass over buffers from L1-sized to beyond the caches, each path: bytes/s is the
// figure (memory bandwidth is its ceiling).
func BenchmarkReduceF32(b *testing.B) {
	for _, n := range []int{1 << 12, 1 << 18, 1 << 20, 1 << 24} {
		data := make([]float32, n)
		for i := range data {
			data[i] = float32(i%1000) - 500
		}
		for _, p := range []struct {
			name string
			fn   func([]float32) (float64, float64, float64, uint64)
		}{
			{"simd", func(d []float32) (float64, float64, float64, uint64) { return reduceF32C(d, false) }},
			{"portable", func(d []float32) (float64, float64, float64, uint64) { return reduceF32C(d, true) }},
			{"go", reduceF32Lanes},
		} {
			b.Run(p.name+"/"+itoa(n), func(b *testing.B) {
				b.SetBytes(int64(4 * n))
				for i := 0; i < b.N; i++ {
					p.fn(data)
				}
			})
		}
	}
}
