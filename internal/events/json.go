package events

import (
	"encoding/binary"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"unicode/utf8"
)

// Low-level JSON writing shared by every appender. These helpers never fail: input that
// JSON cannot carry (invalid UTF-8, non-finite floats) is replaced, so a line is always
// valid JSON even when a caller skipped validation.

const hexDigits = "0123456789abcdef"

// plainASCII[c] is true for ASCII bytes that go into a JSON string unchanged.
var plainASCII = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// appendString appends s as a quoted JSON string. Quote and backslash are escaped with a
// backslash, every other control character as \u00XX; valid UTF-8 passes through raw and each
// invalid byte becomes \ufffd.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if plainASCII[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			if c == '"' || c == '\\' {
				b = append(b, '\\', c)
			} else {
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendFloat writes f the way encoding/json does (shortest round-trip form, exponent only
// outside [1e-6, 1e21)). A non-finite value, which JSON cannot hold, is written as 0; the
// validators refuse such values before anything is written.
func appendFloat(b []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(b, '0')
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// Turn e-07 into e-7, as encoding/json does.
		n := len(b)
		if n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, "true"...)
	}
	return append(b, "false"...)
}

// appendSpanRef writes a span handle as its wire id, "s<N>", quoted.
func appendSpanRef(b []byte, id uint64) []byte {
	b = append(b, `"s`...)
	b = appendUint(b, id)
	return append(b, '"')
}

// appendUint is strconv.AppendUint(b, v, 10) spelling eight digits at a
// time (putUint) straight into b's spare room: span lines carry up to five
// integers each and the drainer encodes millions of them a second.
func appendUint(b []byte, v uint64) []byte {
	l := len(b)
	b = slices.Grow(b, uintRoom)
	return b[:l+putUint(b[l:cap(b)], v)]
}

// uintRoom is what putUint may write: the digits and the spare bytes of its
// eight-byte stores.
const uintRoom = maxUintLen + 8

// putUint spells v at the start of d, which has room for uintRoom bytes,
// and returns how many digits it has. Each digits8 store writes eight
// bytes; the last one may run past the number.
func putUint(d []byte, v uint64) int {
	d = d[:uintRoom]
	switch {
	case v < 1e8:
		n := decimalLen(v)
		binary.LittleEndian.PutUint64(d, digits8(v)>>(8*(8-n)))
		return n
	case v < 1e16:
		hi := v / 1e8
		n := decimalLen(hi)
		binary.LittleEndian.PutUint64(d, digits8(hi)>>(8*(8-n)))
		binary.LittleEndian.PutUint64(d[n:], digits8(v-hi*1e8))
		return n + 8
	default:
		hi, lo := v/1e16, v%1e16
		mid := lo / 1e8
		n := decimalLen(hi)
		binary.LittleEndian.PutUint64(d, digits8(hi)>>(8*(8-n)))
		binary.LittleEndian.PutUint64(d[n:], digits8(mid))
		binary.LittleEndian.PutUint64(d[n+8:], digits8(lo-mid*1e8))
		return n + 16
	}
}

// maxUintLen is the most digits a uint64 has.
const maxUintLen = 20

// digits8 is v (< 1e8) as eight ASCII digits with leading zeros, the most
// significant in the lowest byte (a little-endian store writes them in
// order). The divisions run on all lanes of one register at once: by 10^4
// into two 32-bit lanes, by 100 into four 16-bit lanes, by 10 into eight
// bytes, each division a multiply and shift that is exact for the lane's
// range (x*10486>>20 = x/100 below 10^4, x*103>>10 = x/10 below 100).
func digits8(v uint64) uint64 {
	hi := v / 10000
	y := hi | (v-hi*10000)<<32
	q := (y * 10486 >> 20) & 0x0000007F_0000007F
	z := q | (y-q*100)<<16
	t := (z * 103 >> 10) & 0x000F000F_000F000F
	return t | (z-t*10)<<8 | 0x30303030_30303030
}

// decimalLen is how many digits v has in base 10.
func decimalLen(v uint64) int {
	// log10(2) ~ 1233/4096: a guess from the bit length, off by at most one.
	n := (bits.Len64(v) * 1233) >> 12
	if n < len(pow10) && v >= pow10[n] {
		n++
	}
	if n == 0 {
		return 1
	}
	return n
}

var pow10 = [...]uint64{1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19}

// appendShape writes a [u64] array; a nil shape is written as [] because null is rejected.
func appendShape(b []byte, shape []uint64) []byte {
	b = append(b, '[')
	for i, d := range shape {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, d, 10)
	}
	return append(b, ']')
}

// appendStrings writes a [str] array; nil is written as [].
func appendStrings(b []byte, ss []string) []byte {
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, s)
	}
	return append(b, ']')
}
