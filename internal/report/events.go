package report

import "github.com/candle-trace/candle-trace/internal/events"

// Event records as candle-graph's serde types define them. Byte-slice fields
// alias the current line (or the scanner arena) and are only valid until the
// next line is decoded: the analysis copies what it keeps.

type eventKind uint8

const (
	kindMeta eventKind = iota
	kindSpanStart
	kindSpanEnd
	kindOp
	kindTensor
	kindTensorStats
	kindMemory
	kindDeviceMemory
	kindDeviceInterval
	kindGradient
	kindEdge
	kindTerminal
)

var kindNames = []string{
	"meta", "span_start", "span_end", "op", "tensor", "tensor_stats", "memory",
	"device_memory", "device_interval", "gradient", "edge", "terminal",
}

func (k eventKind) String() string { return kindNames[k] }

// Enum variants, in the order the decoders return their indexes.
var (
	spanKindNames  = []string{"function", "op", "module"}
	stepNames      = []string{"forward", "backward", "optimizer"}
	categoryNames  = []string{"parameter", "activation", "gradient", "optimizer", "other"}
	actionNames    = []string{"alloc", "free"}
	gradStateNames = []string{"present", "missing", "zero", "non_finite"}
	outcomeNames   = []string{"complete", "failed"}
	edgeKindNames  = []string{"call", "data"}
	phaseNames     = []string{"train", "infer"}
	timingNames    = []string{"host", "device_synchronized"}
	scopeNames     = []string{"unknown", "profiled_work", "production_equivalent"}
	coverageNames  = []string{"none", "partial", "complete"}
	expectNames    = []string{"active", "inactive", "data_conditional"}
)

const (
	stepNone      = -1
	stepForward   = 0
	stepBackward  = 1
	stepOptimizer = 2

	categoryOther = 4

	actionAlloc = 0
	actionFree  = 1

	gradPresent   = 0
	gradMissing   = 1
	gradZero      = 2
	gradNonFinite = 3

	outcomeComplete = 0
	outcomeFailed   = 1
)

type spanStartEvent struct {
	id, parent, name []byte
	hasParent        bool
	start            uint64
	spanKind         int
	measured         bool
	step             int // stepNone when absent
	tid              uint64
	hasTID           bool // ours, best effort: candle-graph ignores it
}

type spanEndEvent struct {
	id       []byte
	duration uint64
	// tracer_ns (ours, on the measured span): tracer time left out of duration.
	tracer    uint64
	hasTracer bool
}

type opEvent struct {
	spanID, opName, dtype, device []byte
	inputs                        [][]byte
	output                        []byte
	hasOutput                     bool
	shape                         []uint64
	duration, timestamp           uint64
	outBytes                      uint64
	hasOutBytes                   bool
	inBytes                       uint64
}

type tensorEvent struct {
	spanID, tensorID, dtype, device, label []byte
	hasLabel                               bool
	shape                                  []uint64
	requiresGrad                           bool
	denseBytes                             uint64
	hasDenseBytes                          bool
	category                               int
}

type tensorStatsEvent struct {
	spanID, label, dtype []byte
	shape                []uint64
	elements, nonFinite  uint64
	rms, absMax, mean    float64
}

type memoryEvent struct {
	timestamp                                  uint64
	storageID, tensorID, spanID, device, dtype []byte
	opName                                     []byte
	hasOpName                                  bool
	bytes                                      uint64
	action                                     int
	shape                                      []uint64
	category                                   int
}

type deviceMemoryEvent struct {
	timestamp                                  uint64
	device                                     []byte
	used, free, reserved, capacity             uint64
	hasUsed, hasFree, hasReserved, hasCapacity bool
}

type deviceIntervalEvent struct {
	spanID, device, streamID, clockID, backend []byte
	start, duration                            uint64
	name                                       []byte // ours, best effort
	correlation                                uint64 // ours, best effort: CUPTI's correlation id
	hasCorrelation                             bool
}

type gradientEvent struct {
	eventID, root, key []byte
	state              int
	norm               float64
	hasNorm            bool
}

type edgeEvent struct {
	call         bool
	from, to     []byte // spans for call edges, tensors for data edges
	hostDuration uint64
}

type terminalEvent struct {
	outcome   int
	timestamp uint64
	reason    []byte
	hasReason bool
	tracer    uint64 // tracer_ns (ours): the session's tracer time
	hasTracer bool
	estimated uint64 // tracer_estimated_ns (ours): the calibrated part of it
}

// dtypeSize is events.ElementSize on a line's bytes; the conversion of a
// short non-escaping slice stays on the stack, so reading allocates nothing.
func dtypeSize(dtype []byte) (uint64, bool) {
	return events.ElementSize(string(trimSpace(dtype)))
}

// denseBytes resolves an explicit footprint or derives it from shape × dtype,
// saturating like candle-graph.
func denseBytes(explicit uint64, hasExplicit bool, shape []uint64, dtype []byte) (uint64, bool) {
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

func satAdd(a, b uint64) uint64 {
	if a+b < a {
		return 1<<64 - 1
	}
	return a + b
}

// HostClock is the clock_id of device intervals placed on the session's
// monotonic host clock.
const HostClock = "host-monotonic"
