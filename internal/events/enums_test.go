package events

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestEnumSpellings(t *testing.T) {
	// The numeric values are the C ABI's; the spellings are candle-graph's serde names.
	tests := []struct {
		name  string
		value interface {
			String() string
			Valid() bool
		}
		want  string
		valid bool
	}{
		{"span function", SpanFunction, "function", true},
		{"span op", SpanOp, "op", true},
		{"span module", SpanModule, "module", true},
		{"span invalid", SpanKind(3), "SpanKind(3)", false},
		{"step none", StepNone, "none", true},
		{"step forward", StepForward, "forward", true},
		{"step backward", StepBackward, "backward", true},
		{"step optimizer", StepOptimizer, "optimizer", true},
		{"step invalid", Step(4), "Step(4)", false},
		{"memory alloc", MemoryAlloc, "alloc", true},
		{"memory free", MemoryFree, "free", true},
		{"memory invalid", MemoryAction(2), "MemoryAction(2)", false},
		{"gradient present", GradientPresent, "present", true},
		{"gradient zero", GradientZero, "zero", true},
		{"gradient missing", GradientMissing, "missing", true},
		{"gradient non_finite", GradientNonFinite, "non_finite", true},
		{"gradient invalid", GradientState(4), "GradientState(4)", false},
		{"category other", CategoryOther, "other", true},
		{"category parameter", CategoryParameter, "parameter", true},
		{"category activation", CategoryActivation, "activation", true},
		{"category gradient", CategoryGradient, "gradient", true},
		{"category optimizer", CategoryOptimizer, "optimizer", true},
		{"category invalid", Category(5), "Category(5)", false},
		{"coverage none", CoverageNone, "none", true},
		{"coverage partial", CoveragePartial, "partial", true},
		{"coverage complete", CoverageComplete, "complete", true},
		{"coverage invalid", Coverage(3), "Coverage(3)", false},
		{"scope unknown", ScopeUnknown, "unknown", true},
		{"scope profiled", ScopeProfiledWork, "profiled_work", true},
		{"scope production", ScopeProductionEquivalent, "production_equivalent", true},
		{"family active", FamilyActive, "active", true},
		{"family inactive", FamilyInactive, "inactive", true},
		{"family conditional", FamilyDataConditional, "data_conditional", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.value.String())
			assert.Equal(t, tt.valid, tt.value.Valid())
		})
	}
}

func TestEnumABIValues(t *testing.T) {
	// Fixed by include/candle_trace.h; a reorder here would silently remap every binding.
	assert.Equal(t, []uint32{0, 1, 2}, []uint32{uint32(SpanFunction), uint32(SpanOp), uint32(SpanModule)})
	assert.Equal(t, []uint32{0, 1, 2, 3}, []uint32{uint32(StepNone), uint32(StepForward), uint32(StepBackward), uint32(StepOptimizer)})
	assert.Equal(t, []uint32{0, 1}, []uint32{uint32(MemoryAlloc), uint32(MemoryFree)})
	assert.Equal(t, []uint32{0, 1, 2, 3}, []uint32{uint32(GradientPresent), uint32(GradientZero), uint32(GradientMissing), uint32(GradientNonFinite)})
	assert.Equal(t, []uint32{0, 1, 2, 3, 4}, []uint32{uint32(CategoryOther), uint32(CategoryParameter), uint32(CategoryActivation), uint32(CategoryGradient), uint32(CategoryOptimizer)})
}
