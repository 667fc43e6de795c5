package events

import "strconv"

// The numeric values of these enums are the C ABI's (include/candle_trace.h) and must not
// change; String returns the wire spelling.

// SpanKind classifies a span.
type SpanKind uint32

const (
	SpanFunction SpanKind = 0
	SpanOp       SpanKind = 1
	SpanModule   SpanKind = 2
)

func (k SpanKind) String() string {
	switch k {
	case SpanFunction:
		return "function"
	case SpanOp:
		return "op"
	case SpanModule:
		return "module"
	}
	return "SpanKind(" + strconv.FormatUint(uint64(k), 10) + ")"
}

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
	switch s {
	case StepNone:
		return "none"
	case StepForward:
		return "forward"
	case StepBackward:
		return "backward"
	case StepOptimizer:
		return "optimizer"
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
	switch a {
	case MemoryAlloc:
		return "alloc"
	case MemoryFree:
		return "free"
	}
	return "MemoryAction(" + strconv.FormatUint(uint64(a), 10) + ")"
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
	switch g {
	case GradientPresent:
		return "present"
	case GradientZero:
		return "zero"
	case GradientMissing:
		return "missing"
	case GradientNonFinite:
		return "non_finite"
	}
	return "GradientState(" + strconv.FormatUint(uint64(g), 10) + ")"
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

func (c Category) String() string {
	switch c {
	case CategoryOther:
		return "other"
	case CategoryParameter:
		return "parameter"
	case CategoryActivation:
		return "activation"
	case CategoryGradient:
		return "gradient"
	case CategoryOptimizer:
		return "optimizer"
	}
	return "Category(" + strconv.FormatUint(uint64(c), 10) + ")"
}

// Valid reports whether c is one of the defined categories.
func (c Category) Valid() bool { return c <= CategoryOptimizer }
