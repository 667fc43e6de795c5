package events

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// appendUint must spell every value as strconv does, at every digit count
// and with or without room left in the buffer.
func TestAppendUintMatchesStrconv(t *testing.T) {
	values := []uint64{0, 1, 9, 10, 99, 100, 101, 999, 1000, 9999, 10000, 123456789, math.MaxUint32, math.MaxUint64, math.MaxUint64 - 1}
	for p := uint64(1); p < math.MaxUint64/10; p *= 10 {
		values = append(values, p-1, p, p+1)
	}
	for _, v := range values {
		for _, room := range []int{0, 3, 32} {
			b := append(make([]byte, 0, 2+room), "x:"...)
			assert.Equal(t, strconv.AppendUint([]byte("x:"), v, 10), appendUint(b, v), "v=%d room=%d", v, room)
		}
	}
}

// digits8 must spell every value below 10^8 with its leading zeros. Its
// lanes are independent, so every value of one 4-digit half beside the
// extremes of the other, and a million random values, cover it; the lane
// divisions themselves are checked over their whole ranges.
func TestDigits8SpellsValuesBelow1e8(t *testing.T) {
	for x := uint64(0); x < 10000; x++ {
		require.Equal(t, x/100, x*10486>>20, "x/100 for %d", x)
	}
	for x := uint64(0); x < 100; x++ {
		require.Equal(t, x/10, x*103>>10, "x/10 for %d", x)
	}
	check := func(v uint64) {
		var got [8]byte
		binary.LittleEndian.PutUint64(got[:], digits8(v))
		if want := fmt.Sprintf("%08d", v); string(got[:]) != want {
			t.Fatalf("digits8(%d) = %q, want %q", v, got[:], want)
		}
	}
	for x := uint64(0); x < 10000; x++ {
		for _, other := range []uint64{0, 1, 5000, 9999} {
			check(x*10000 + other)
			check(other*10000 + x)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 1_000_000; i++ {
		check(rng.Uint64N(1e8))
	}
}
