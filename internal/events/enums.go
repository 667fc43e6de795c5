package events

import (
	"strconv"

	"github.com/candle-trace/candle-trace/internal/traceformat"
)

// The numeric values of these enums are the C ABI's (include/candle_trace.h) and must not
// change; String returns the wire spelling.

// SpanKind classifies a span.
type SpanKind uint32

const (
	SpanFunction SpanKind = 0
	SpanOp       SpanKind = 1
	SpanModule   SpanKind = 2
)

func (k SpanKind) String() string { return spell(traceformat.SpanKinds, uint64(k), "SpanKind") }

// Valid reports whether k is one of the defined kinds.
func (k SpanKind) Valid() bool { return k <= SpanModule }

// Step is the training step a span belongs to. StepNone means the span carries no step,
// and the "step" field is omitted; "none" is never written.
type Step uint32

const (
	StepNone      Step = 0
	StepForward   Step = 1
	StepBackward  Step = 2
	StepOptimizer Step = 3
)

func (s Step) String() string {
	if s == StepNone {
		return "none"
	}
	if int(s) <= len(traceformat.Steps) {
		return traceformat.Steps[s-1]
	}
	return "Step(" + strconv.FormatUint(uint64(s), 10) + ")"
}

// Valid reports whether s is one of the defined steps (StepNone included).
func (s Step) Valid() bool { return s <= StepOptimizer }

// MemoryAction says whether a memory event allocates or frees a storage.
type MemoryAction uint32

const (
	MemoryAlloc MemoryAction = 0
	MemoryFree  MemoryAction = 1
)

func (a MemoryAction) String() string {
	return spell(traceformat.MemoryActions, uint64(a), "MemoryAction")
}

// Valid reports whether a is alloc or free.
func (a MemoryAction) Valid() bool { return a <= MemoryFree }

// GradientState is the observed state of one parameter's gradient.
type GradientState uint32

const (
	GradientPresent   GradientState = 0
	GradientZero      GradientState = 1
	GradientMissing   GradientState = 2
	GradientNonFinite GradientState = 3
)

func (g GradientState) String() string {
	return spell(traceformat.GradientStates, uint64(g), "GradientState")
}

// Valid reports whether g is one of the defined states.
func (g GradientState) Valid() bool { return g <= GradientNonFinite }

// Category is the semantic memory category of a tensor or storage.
type Category uint32

const (
	CategoryOther      Category = 0
	CategoryParameter  Category = 1
	CategoryActivation Category = 2
	CategoryGradient   Category = 3
	CategoryOptimizer  Category = 4
)

func (c Category) String() string { return spell(traceformat.Categories, uint64(c), "Category") }

// Valid reports whether c is one of the defined categories.
func (c Category) Valid() bool { return c <= CategoryOptimizer }

// spell is the wire spelling of an enum value, from the one definition in
// traceformat; a value outside it prints as TYPE(N), as fmt would.
func spell(values []string, i uint64, typ string) string {
	if i < uint64(len(values)) {
		return values[i]
	}
	return typ + "(" + strconv.FormatUint(i, 10) + ")"
}
