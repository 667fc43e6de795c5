package events

import (
	"math"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
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
