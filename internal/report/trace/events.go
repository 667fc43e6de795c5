package trace

import (
	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/traceformat"
)

// Event records as candle-graph's serde types define them. Byte-slice fields
// alias the current line (or the scanner arena) and are only valid until the
// next line is decoded: the analysis copies what it keeps.

type Kind uint8

const (
	KindMeta Kind = iota
	KindSpanStart
	KindSpanEnd
	KindOp
	KindTensor
	KindTensorStats
	KindMemory
	KindDeviceMemory
	KindDeviceInterval
	KindGradient
	KindEdge
	KindTerminal
)

func (k Kind) String() string { return traceformat.Kinds[k] }

// Enum values are indexes into traceformat's lists (the C ABI's values
// where it has the enum): the decoders return the index of the spelling.
const (
	StepNone      = -1 // no "step" field; Step is an index into traceformat.Steps
	StepForward   = 0
	StepBackward  = 1
	StepOptimizer = 2

	categoryOther = 0

	ActionAlloc = 0
	ActionFree  = 1

	GradPresent   = 0
	GradZero      = 1
	GradMissing   = 2
	GradNonFinite = 3

	OutcomeComplete = 0
	OutcomeFailed   = 1
)

type SpanStartEvent struct {
	ID, Parent, Name []byte
	HasParent        bool
	Start            uint64
	SpanKind         int
	Measured         bool
	Step             int // stepNone when absent
	TID              uint64
	HasTID           bool // ours, best effort: candle-graph ignores it
}

type SpanEndEvent struct {
	ID       []byte
	Duration uint64
	// tracer_ns (ours, on the measured span): tracer time left out of duration.
	Tracer    uint64
	HasTracer bool
}

type OpEvent struct {
	SpanID, OpName, Dtype, Device []byte
	Inputs                        [][]byte
	Output                        []byte
	HasOutput                     bool
	Shape                         []uint64
	Duration, Timestamp           uint64
	OutBytes                      uint64
	HasOutBytes                   bool
	InBytes                       uint64
}

type TensorEvent struct {
	SpanID, TensorID, dtype, device, label []byte
	hasLabel                               bool
	shape                                  []uint64
	requiresGrad                           bool
	denseBytes                             uint64
	hasDenseBytes                          bool
	category                               int
}

type TensorStatsEvent struct {
	SpanID, Label, Dtype []byte
	Shape                []uint64
	Elements, NonFinite  uint64
	RMS, AbsMax, Mean    float64
}

type MemoryEvent struct {
	Timestamp                                  uint64
	StorageID, TensorID, SpanID, Device, dtype []byte
	OpName                                     []byte
	HasOpName                                  bool
	Bytes                                      uint64
	Action                                     int
	shape                                      []uint64
	Category                                   int
}

type DeviceMemoryEvent struct {
	Timestamp                                  uint64
	Device                                     []byte
	Used, Free, Reserved, Capacity             uint64
	HasUsed, HasFree, HasReserved, HasCapacity bool
}

type DeviceIntervalEvent struct {
	SpanID, Device, StreamID, ClockID, Backend []byte
	Start, Duration                            uint64
	Name                                       []byte // ours, best effort
	Correlation                                uint64 // ours, best effort: CUPTI's correlation id
	HasCorrelation                             bool
}

type GradientEvent struct {
	EventID, Root, Key []byte
	State              int
	Norm               float64
	HasNorm            bool
}

type EdgeEvent struct {
	Call         bool
	From, To     []byte // spans for call edges, tensors for data edges
	HostDuration uint64
}

type terminalEvent struct {
	Outcome   int
	Timestamp uint64
	Reason    []byte
	HasReason bool
	Tracer    uint64 // tracer_ns (ours): the session's tracer time
	HasTracer bool
	Estimated uint64 // tracer_estimated_ns (ours): the calibrated part of it
}

// dtypeSize is events.ElementSize on a line's bytes; the conversion of a
// short non-escaping slice stays on the stack, so reading allocates nothing.
func dtypeSize(dtype []byte) (uint64, bool) {
	return events.ElementSize(string(TrimSpace(dtype)))
}

// denseBytes resolves an explicit footprint or derives it from shape × dtype,
// saturating like candle-graph.
func DenseBytes(explicit uint64, hasExplicit bool, shape []uint64, dtype []byte) (uint64, bool) {
	if hasExplicit {
		return explicit, true
	}
	size, ok := dtypeSize(dtype)
	if !ok {
		return 0, false
	}
	return satMul(elemCount(shape), size), true
}

func elemCount(shape []uint64) uint64 {
	n := uint64(1)
	for _, d := range shape {
		n = satMul(n, d)
	}
	return n
}

func satMul(a, b uint64) uint64 {
	if a != 0 && b > (1<<64-1)/a {
		return 1<<64 - 1
	}
	return a * b
}

func SatAdd(a, b uint64) uint64 {
	if a+b < a {
		return 1<<64 - 1
	}
	return a + b
}

// HostClock is the clock_id of device intervals placed on the session's
// monotonic host clock.
const HostClock = "host-monotonic"
