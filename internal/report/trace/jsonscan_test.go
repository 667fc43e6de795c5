package trace

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"testing"
)

// TestSpecialBytes: the eight-byte scan finds the first quote, backslash
// or control character wherever it sits among any bytes, as the byte loop
// does.
func TestSpecialBytes(t *testing.T) {
	naive := func(w [8]byte) int {
		for i, c := range w {
			if strSpecial[c] {
				return i
			}
		}
		return 8
	}
	fast := func(w [8]byte) int {
		m := specialBytes(binary.LittleEndian.Uint64(w[:]))
		if m == 0 {
			return 8
		}
		return bits.TrailingZeros64(m) / 8
	}
	fills := []byte{'a', 0x00, 0x1f, 0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xa2, 0xdc, 0xff}
	for _, fill := range fills {
		for p := range 8 {
			for c := range 256 {
				var w [8]byte
				for i := range w {
					w[i] = fill
				}
				w[p] = byte(c)
				if naive(w) != fast(w) {
					t.Fatalf("%q: first special byte at %d, the word test says %d", w[:], naive(w), fast(w))
				}
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20_000 {
		var w [8]byte
		for i := range w {
			w[i] = fills[r.IntN(len(fills))] + byte(r.IntN(3))
		}
		if naive(w) != fast(w) {
			t.Fatalf("%q: first special byte at %d, the word test says %d", w[:], naive(w), fast(w))
		}
	}
}
