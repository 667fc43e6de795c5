package events

import (
	"sort"
	"strconv"
)

// Hand-written appenders, one per record kind. They are the hot path of every
// instrumented call, so they write constant fragments and never reflect or allocate beyond
// growing b. A nil record pointer appends nothing (Validate reports it). Field order follows candle-graph's own writer so traces diff cleanly against
// its output. Each appends exactly one line ending in '\n'.

// AppendSpanStart appends a span_start. parent 0 means the span is the root (no
// parent_id); measured false and step StepNone are omitted (both default);
// tid <= 0 omits our "tid".
func AppendSpanStart(b []byte, id, parent uint64, name string, startNs uint64, kind SpanKind, measured bool, step Step, tid int64) []byte {
	b = append(b, `{"kind":"span_start","id":`...)
	b = appendSpanRef(b, id)
	if parent != 0 {
		b = append(b, `,"parent_id":`...)
		b = appendSpanRef(b, parent)
	}
	b = append(b, `,"name":`...)
	b = appendString(b, name)
	b = append(b, `,"start_ns":`...)
	b = appendUint(b, startNs)
	return appendStartTail(b, kind, measured, step, tid)
}

// appendStartTail ends a span_start from "span_kind" on (StartTail keeps it
// per thread).
func appendStartTail(b []byte, kind SpanKind, measured bool, step Step, tid int64) []byte {
	b = append(b, `,"span_kind":"`...)
	b = append(b, kind.String()...)
	b = append(b, '"')
	// measured defaults to false in the format; writing it only when true
	// saves 17 bytes on nearly every span, and spans dominate trace volume.
	if measured {
		b = append(b, `,"measured":true`...)
	}
	if step != StepNone {
		b = append(b, `,"step":"`...)
		b = append(b, step.String()...)
		b = append(b, '"')
	}
	if tid > 0 {
		b = append(b, `,"tid":`...)
		b = appendUint(b, uint64(tid))
	}
	return append(b, "}\n"...)
}

// AppendSpanEnd appends a span_end.
func AppendSpanEnd(b []byte, id, durationNs uint64) []byte {
	b = append(b, `{"kind":"span_end","id":`...)
	b = appendSpanRef(b, id)
	b = append(b, `,"duration_ns":`...)
	b = appendUint(b, durationNs)
	return append(b, "}\n"...)
}

// AppendMeasuredSpanEnd appends the measured span's span_end with "tracer_ns"
// (ours): the tracer's own time inside it, which the session clock left out
// of its duration.
func AppendMeasuredSpanEnd(b []byte, id, durationNs, tracerNs uint64) []byte {
	b = AppendSpanEnd(b, id, durationNs)
	b = append(b[:len(b)-2], `,"tracer_ns":`...)
	b = strconv.AppendUint(b, tracerNs, 10)
	return append(b, "}\n"...)
}

// Op is one timed operation inside a span. Inputs and Output are tensor ids.
type Op struct {
	SpanID              uint64
	OpName, Dtype       string
	Device              string
	Inputs              []string
	Output              string
	HasOutput           bool
	Shape               []uint64
	DurationNs          uint64
	TimestampNs         uint64 // the op's start; must lie inside its span
	OutputDenseBytes    uint64
	HasOutputDenseBytes bool
	InputDenseBytes     uint64
}

// AppendOp appends an op. "output" and "output_dense_bytes" are written only when flagged
// present; "inputs" and "shape" are always written, as [] when empty.
func AppendOp(b []byte, o *Op) []byte {
	if o == nil {
		return b
	}
	b = append(b, `{"kind":"op","span_id":`...)
	b = appendSpanRef(b, o.SpanID)
	b = append(b, `,"op_name":`...)
	b = appendString(b, o.OpName)
	b = append(b, `,"inputs":`...)
	b = appendStrings(b, o.Inputs)
	if o.HasOutput {
		b = append(b, `,"output":`...)
		b = appendString(b, o.Output)
	}
	b = append(b, `,"shape":`...)
	b = appendShape(b, o.Shape)
	b = append(b, `,"dtype":`...)
	b = appendString(b, o.Dtype)
	b = append(b, `,"device":`...)
	b = appendString(b, o.Device)
	b = append(b, `,"duration_ns":`...)
	b = strconv.AppendUint(b, o.DurationNs, 10)
	b = append(b, `,"timestamp_ns":`...)
	b = strconv.AppendUint(b, o.TimestampNs, 10)
	if o.HasOutputDenseBytes {
		b = append(b, `,"output_dense_bytes":`...)
		b = strconv.AppendUint(b, o.OutputDenseBytes, 10)
	}
	b = append(b, `,"input_dense_bytes":`...)
	b = strconv.AppendUint(b, o.InputDenseBytes, 10)
	return append(b, "}\n"...)
}

// Tensor is a tensor snapshot. TensorID is the backend identity; Label is an optional
// caller-owned name ("" = absent) and never an identity.
type Tensor struct {
	SpanID        uint64
	TensorID      string
	Dtype, Device string
	Label         string
	Shape         []uint64
	RequiresGrad  bool
	DenseBytes    uint64
	HasDenseBytes bool
	Category      Category
}

// AppendTensor appends a tensor.
func AppendTensor(b []byte, t *Tensor) []byte {
	if t == nil {
		return b
	}
	b = append(b, `{"kind":"tensor","span_id":`...)
	b = appendSpanRef(b, t.SpanID)
	b = append(b, `,"tensor_id":`...)
	b = appendString(b, t.TensorID)
	if t.Label != "" {
		b = append(b, `,"label":`...)
		b = appendString(b, t.Label)
	}
	b = append(b, `,"shape":`...)
	b = appendShape(b, t.Shape)
	b = append(b, `,"dtype":`...)
	b = appendString(b, t.Dtype)
	b = append(b, `,"device":`...)
	b = appendString(b, t.Device)
	b = append(b, `,"requires_grad":`...)
	b = appendBool(b, t.RequiresGrad)
	if t.HasDenseBytes {
		b = append(b, `,"dense_bytes":`...)
		b = strconv.AppendUint(b, t.DenseBytes, 10)
	}
	b = append(b, `,"category":"`...)
	b = append(b, t.Category.String()...)
	return append(b, "\"}\n"...)
}

// TensorStats is a numerical summary of a labelled tensor (or a scalar observation).
type TensorStats struct {
	SpanID    uint64
	Label     string
	Dtype     string
	Shape     []uint64
	Elements  uint64
	NonFinite uint64
	RMS       float64
	AbsMax    float64
	Mean      float64
}

// AppendTensorStats appends a tensor_stats.
func AppendTensorStats(b []byte, s *TensorStats) []byte {
	if s == nil {
		return b
	}
	b = append(b, `{"kind":"tensor_stats","span_id":`...)
	b = appendSpanRef(b, s.SpanID)
	b = append(b, `,"label":`...)
	b = appendString(b, s.Label)
	b = append(b, `,"shape":`...)
	b = appendShape(b, s.Shape)
	b = append(b, `,"dtype":`...)
	b = appendString(b, s.Dtype)
	b = append(b, `,"elements":`...)
	b = strconv.AppendUint(b, s.Elements, 10)
	b = append(b, `,"non_finite":`...)
	b = strconv.AppendUint(b, s.NonFinite, 10)
	b = append(b, `,"rms":`...)
	b = appendFloat(b, s.RMS)
	b = append(b, `,"abs_max":`...)
	b = appendFloat(b, s.AbsMax)
	b = append(b, `,"mean":`...)
	b = appendFloat(b, s.Mean)
	return append(b, "}\n"...)
}

// Memory is one logical allocation or free of a backend storage. OpName "" = absent.
type Memory struct {
	SpanID      uint64
	TimestampNs uint64
	StorageID   string
	TensorID    string
	Device      string
	Dtype       string
	OpName      string
	Bytes       uint64
	Action      MemoryAction
	Shape       []uint64
	Category    Category
}

// AppendMemory appends a memory event.
func AppendMemory(b []byte, m *Memory) []byte {
	if m == nil {
		return b
	}
	b = append(b, `{"kind":"memory","timestamp_ns":`...)
	b = strconv.AppendUint(b, m.TimestampNs, 10)
	b = append(b, `,"storage_id":`...)
	b = appendString(b, m.StorageID)
	b = append(b, `,"tensor_id":`...)
	b = appendString(b, m.TensorID)
	b = append(b, `,"span_id":`...)
	b = appendSpanRef(b, m.SpanID)
	if m.OpName != "" {
		b = append(b, `,"op_name":`...)
		b = appendString(b, m.OpName)
	}
	b = append(b, `,"device":`...)
	b = appendString(b, m.Device)
	b = append(b, `,"bytes":`...)
	b = strconv.AppendUint(b, m.Bytes, 10)
	b = append(b, `,"action":"`...)
	b = append(b, m.Action.String()...)
	b = append(b, `","shape":`...)
	b = appendShape(b, m.Shape)
	b = append(b, `,"dtype":`...)
	b = appendString(b, m.Dtype)
	b = append(b, `,"category":"`...)
	b = append(b, m.Category.String()...)
	return append(b, "\"}\n"...)
}

// DeviceMemory is a device-level memory sample. Each value is written only when its Has
// flag is set; Extra (ours: utilization, power, ...) is written as a nested "extra" object
// so its keys can never collide with candle-graph's fields.
type DeviceMemory struct {
	TimestampNs                                uint64
	Device                                     string
	Used, Free, Reserved, Capacity             uint64
	HasUsed, HasFree, HasReserved, HasCapacity bool
	Extra                                      map[string]float64
}

// AppendDeviceMemory appends a device_memory sample. Extra keys are written sorted so the
// output is deterministic.
func AppendDeviceMemory(b []byte, d *DeviceMemory) []byte {
	if d == nil {
		return b
	}
	b = append(b, `{"kind":"device_memory","timestamp_ns":`...)
	b = strconv.AppendUint(b, d.TimestampNs, 10)
	b = append(b, `,"device":`...)
	b = appendString(b, d.Device)
	if d.HasUsed {
		b = append(b, `,"used_bytes":`...)
		b = strconv.AppendUint(b, d.Used, 10)
	}
	if d.HasFree {
		b = append(b, `,"free_bytes":`...)
		b = strconv.AppendUint(b, d.Free, 10)
	}
	if d.HasReserved {
		b = append(b, `,"reserved_bytes":`...)
		b = strconv.AppendUint(b, d.Reserved, 10)
	}
	if d.HasCapacity {
		b = append(b, `,"capacity_bytes":`...)
		b = strconv.AppendUint(b, d.Capacity, 10)
	}
	if len(d.Extra) > 0 {
		keys := make([]string, 0, len(d.Extra))
		for k := range d.Extra {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b = append(b, `,"extra":{`...)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			b = appendFloat(b, d.Extra[k])
		}
		b = append(b, '}')
	}
	return append(b, "}\n"...)
}

// DeviceInterval is one interval of device work. Name "" and !HasCorrelationID omit our
// fields "name" and "correlation_id".
type DeviceInterval struct {
	SpanID           uint64
	Device           string
	StreamID         string
	ClockID          string
	Backend          string
	Name             string
	StartNs          uint64
	DurationNs       uint64
	CorrelationID    uint64
	HasCorrelationID bool
}

// AppendDeviceInterval appends a device_interval.
func AppendDeviceInterval(b []byte, d *DeviceInterval) []byte {
	if d == nil {
		return b
	}
	b = append(b, `{"kind":"device_interval","span_id":`...)
	b = appendSpanRef(b, d.SpanID)
	b = append(b, `,"device":`...)
	b = appendString(b, d.Device)
	b = append(b, `,"stream_id":`...)
	b = appendString(b, d.StreamID)
	b = append(b, `,"clock_id":`...)
	b = appendString(b, d.ClockID)
	b = append(b, `,"backend":`...)
	b = appendString(b, d.Backend)
	b = append(b, `,"start_ns":`...)
	b = strconv.AppendUint(b, d.StartNs, 10)
	b = append(b, `,"duration_ns":`...)
	b = strconv.AppendUint(b, d.DurationNs, 10)
	if d.Name != "" {
		b = append(b, `,"name":`...)
		b = appendString(b, d.Name)
	}
	if d.HasCorrelationID {
		b = append(b, `,"correlation_id":`...)
		b = strconv.AppendUint(b, d.CorrelationID, 10)
	}
	return append(b, "}\n"...)
}

// AppendGradient appends a gradient fact with event_id "gradient-<eventID>".
func AppendGradient(b []byte, eventID uint64, root, key string, state GradientState, norm float64, hasNorm bool) []byte {
	b = append(b, `{"kind":"gradient","event_id":"gradient-`...)
	b = strconv.AppendUint(b, eventID, 10)
	b = append(b, `","root":`...)
	b = appendString(b, root)
	b = append(b, `,"key":`...)
	b = appendString(b, key)
	b = append(b, `,"state":"`...)
	b = append(b, state.String()...)
	b = append(b, '"')
	if hasNorm {
		b = append(b, `,"norm":`...)
		b = appendFloat(b, norm)
	}
	return append(b, "}\n"...)
}

// AppendCallEdge appends a call edge; hostDurationNs must equal to's duration.
func AppendCallEdge(b []byte, from, to, hostDurationNs uint64) []byte {
	b = append(b, `{"kind":"edge","edge_kind":"call","from_span":`...)
	b = appendSpanRef(b, from)
	b = append(b, `,"to_span":`...)
	b = appendSpanRef(b, to)
	b = append(b, `,"host_duration_ns":`...)
	b = strconv.AppendUint(b, hostDurationNs, 10)
	return append(b, "}\n"...)
}

// AppendDataEdge appends a data edge between two tensor ids.
func AppendDataEdge(b []byte, fromTensor, toTensor string) []byte {
	b = append(b, `{"kind":"edge","edge_kind":"data","from_tensor":`...)
	b = appendString(b, fromTensor)
	b = append(b, `,"to_tensor":`...)
	b = appendString(b, toTensor)
	return append(b, "}\n"...)
}

// AppendTerminal appends the terminal record, with "tracer_ns" and
// "tracer_estimated_ns" (ours): the tracer's own time over the whole session,
// left out of the session clock, and the calibrated part of it. A
// complete terminal never carries a reason
// (candle-graph rejects the trace if it does), so reason is written only when !complete;
// see ValidateTerminal for the failed case.
// TracerTime is the tracer's own time a session left out of its clock: Ns in
// all, EstimatedNs of it calibrated rather than measured (intervals begun
// earlier than their call).
type TracerTime struct{ Ns, EstimatedNs uint64 }

func AppendTerminal(b []byte, complete bool, timestampNs uint64, reason string, tracer TracerTime) []byte {
	return append(appendTerminalFields(b, complete, timestampNs, reason, tracer), "}\n"...)
}

// Dropped counts the lines a buffered session left out of its trace to stay
// within its bound.
type Dropped struct{ Records, Bytes uint64 }

// AppendBufferedTerminal is the terminal of a buffered session: that of
// AppendTerminal plus "dropped_records" and "dropped_bytes" (ours), what its
// bound left out (0 when nothing was).
func AppendBufferedTerminal(b []byte, complete bool, timestampNs uint64, reason string, tracer TracerTime, d Dropped) []byte {
	b = appendTerminalFields(b, complete, timestampNs, reason, tracer)
	b = append(b, `,"dropped_records":`...)
	b = strconv.AppendUint(b, d.Records, 10)
	b = append(b, `,"dropped_bytes":`...)
	b = strconv.AppendUint(b, d.Bytes, 10)
	return append(b, "}\n"...)
}

func appendTerminalFields(b []byte, complete bool, timestampNs uint64, reason string, tracer TracerTime) []byte {
	if complete {
		b = append(b, `{"kind":"terminal","outcome":"complete","timestamp_ns":`...)
	} else {
		b = append(b, `{"kind":"terminal","outcome":"failed","timestamp_ns":`...)
	}
	b = strconv.AppendUint(b, timestampNs, 10)
	if !complete && reason != "" {
		b = append(b, `,"reason":`...)
		b = appendString(b, reason)
	}
	b = append(b, `,"tracer_ns":`...)
	b = strconv.AppendUint(b, tracer.Ns, 10)
	b = append(b, `,"tracer_estimated_ns":`...)
	return strconv.AppendUint(b, tracer.EstimatedNs, 10)
}
