package report

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestZeroGradientWithNegativeZeroNormIsInconsistent(t *testing.T) {
	assert.False(t, normValid(gradZero, math.Copysign(0, -1), true), "-0.0 is not the +0.0 a zero gradient states")
	assert.True(t, normValid(gradZero, 0, true))
}
