package events

import (
	"fmt"
	"math/bits"
	"strings"
)

// elementSizes mirrors candle-graph's dtype_size_bytes; any other dtype has no derived size.
var elementSizes = [...]struct {
	name string
	size uint64
}{
	{"u8", 1}, {"i8", 1}, {"bool", 1}, {"f8", 1},
	{"u16", 2}, {"i16", 2}, {"f16", 2}, {"bf16", 2},
	{"u32", 4}, {"i32", 4}, {"f32", 4},
	{"u64", 8}, {"i64", 8}, {"f64", 8},
}

// ElementSize returns the byte size of one element of dtype. Like candle-graph it trims
// surrounding white space and compares ASCII case-insensitively ("F32" = "f32").
func ElementSize(dtype string) (uint64, bool) {
	d := strings.TrimSpace(dtype)
	for _, e := range elementSizes {
		if asciiEqualFold(d, e.name) {
			return e.size, true
		}
	}
	return 0, false
}

// asciiEqualFold folds ASCII letters only: strings.EqualFold would also fold non-ASCII
// look-alikes (U+212A KELVIN SIGN = k), which candle-graph's to_ascii_lowercase does not.
func asciiEqualFold(s, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// ElementCount is the product of shape's dimensions (1 for an empty shape, a scalar). It
// fails when the product does not fit in a u64; candle-graph would saturate instead and
// silently record a wrong count.
func ElementCount(shape []uint64) (uint64, error) {
	n := uint64(1)
	for _, d := range shape {
		hi, lo := bits.Mul64(n, d)
		if hi != 0 {
			return 0, fmt.Errorf("shape %v has more elements than a u64 can count", shape)
		}
		n = lo
	}
	return n, nil
}

// DenseBytes is product(shape) × ElementSize(dtype). known is false when dtype has no
// derived size (bytes is then 0). err reports a shape whose element count or byte size does
// not fit in a u64, whether or not the dtype is known.
func DenseBytes(shape []uint64, dtype string) (bytes uint64, known bool, err error) {
	n, err := ElementCount(shape)
	if err != nil {
		return 0, false, err
	}
	size, ok := ElementSize(dtype)
	if !ok {
		return 0, false, nil
	}
	hi, lo := bits.Mul64(n, size)
	if hi != 0 {
		return 0, false, fmt.Errorf("shape %v of dtype %q has a dense byte size larger than a u64", shape, dtype)
	}
	return lo, true, nil
}
