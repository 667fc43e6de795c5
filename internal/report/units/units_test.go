package units

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestNS(t *testing.T) {
	for _, c := range []struct {
		ns   float64
		want string
	}{
		{0, "0 ns"},
		{166, "166 ns"},
		{6326.0 / 30, "210.9 ns"}, // a mean of 30 integer durations
		{999.94, "999.9 ns"},
		{999.96, "1.00 µs"},
		{1000, "1.00 µs"},
		{1_240, "1.24 µs"},
		{437_120_000, "437.12 ms"},
		{3_037_000_000, "3.037 s"},
	} {
		assert.Equal(t, c.want, NS(c.ns), "NS(%v)", c.ns)
	}
}
