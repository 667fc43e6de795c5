package health

import (
	"math"
	"testing"

	"github.com/candle-trace/candle-trace/internal/report/trace"

	"github.com/stretchr/testify/assert"
)

func TestZeroGradientWithNegativeZeroNormIsInconsistent(t *testing.T) {
	assert.False(t, normValid(trace.GradZero, math.Copysign(0, -1), true), "-0.0 is not the +0.0 a zero gradient states")
	assert.True(t, normValid(trace.GradZero, 0, true))
}
