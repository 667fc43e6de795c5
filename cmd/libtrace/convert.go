package main

/*
#include <string.h>
#include "candle_trace.h"
*/
import "C"

import (
	"fmt"
	"math/bits"
	"unsafe"

	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/session"
)

// The converters copy C records into Go values; the strings are copied, so
// the caller's memory is only borrowed for the call.

// maxRank refuses shapes that are almost certainly a wrong length argument.
const maxRank = 64

func argErr(fn, format string, args ...any) error {
	return &session.Error{Code: session.InvalidArgument, Msg: fn + ": " + fmt.Sprintf(format, args...)}
}

// goString copies a C string that must not be NULL (it may be empty).
func goString(fn, field string, p *C.char) (string, error) {
	if p == nil {
		return "", argErr(fn, "%s is NULL", field)
	}
	return C.GoStringN(p, C.int(C.strlen(p))), nil
}

// reqString copies a required string: not NULL; emptiness and UTF-8 are
// checked by the validators, which know which fields may be blank.
func reqString(fn, field string, p *C.char) (string, error) { return goString(fn, field, p) }

// optString copies a string where NULL means absent.
func optString(p *C.char) (string, bool) {
	if p == nil {
		return "", false
	}
	return C.GoStringN(p, C.int(C.strlen(p))), true
}

func checkSize(fn, name string, got C.uint32_t, want uintptr) error {
	if uintptr(got) < want {
		return argErr(fn, "%s.size is %d; set it to sizeof(%s) (%d)", name, uint32(got), name, want)
	}
	return nil
}

func convertShape(fn, field string, p *C.int64_t, rank C.size_t) ([]uint64, error) {
	if rank == 0 {
		return []uint64{}, nil
	}
	if rank > maxRank {
		return nil, argErr(fn, "%s rank %d is larger than %d", field, uint64(rank), maxRank)
	}
	if p == nil {
		return nil, argErr(fn, "%s is NULL with rank %d", field, uint64(rank))
	}
	dims := unsafe.Slice((*int64)(unsafe.Pointer(p)), int(rank))
	out := make([]uint64, len(dims))
	for i, d := range dims {
		if d < 0 {
			return nil, argErr(fn, "%s[%d] is negative (%d)", field, i, d)
		}
		out[i] = uint64(d)
	}
	return out, nil
}

func elementCount(fn string, shape []uint64) (int, error) {
	n := uint64(1)
	for _, d := range shape {
		hi, lo := bits.Mul64(n, d)
		if hi != 0 {
			return 0, argErr(fn, "shape %v has more elements than fit in 64 bits", shape)
		}
		n = lo
	}
	if n > 1<<40 {
		return 0, argErr(fn, "shape %v has %d elements, more than a host buffer can hold", shape, n)
	}
	return int(n), nil
}

func convertOp(fn string, op *C.ct_op) (*events.Op, error) {
	if op == nil {
		return nil, argErr(fn, "op is NULL")
	}
	if err := checkSize(fn, "ct_op", op.size, unsafe.Sizeof(*op)); err != nil {
		return nil, err
	}
	var o events.Op
	var err error
	if o.OpName, err = reqString(fn, "op.op_name", op.op_name); err != nil {
		return nil, err
	}
	if o.Dtype, err = reqString(fn, "op.dtype", op.dtype); err != nil {
		return nil, err
	}
	if o.Device, err = reqString(fn, "op.device", op.device); err != nil {
		return nil, err
	}
	if op.n_inputs > 0 {
		if op.inputs == nil {
			return nil, argErr(fn, "op.inputs is NULL with n_inputs %d", uint64(op.n_inputs))
		}
		if op.n_inputs > 1<<16 {
			return nil, argErr(fn, "op.n_inputs %d is implausibly large", uint64(op.n_inputs))
		}
		ins := unsafe.Slice((**C.char)(unsafe.Pointer(op.inputs)), int(op.n_inputs))
		o.Inputs = make([]string, len(ins))
		for i, p := range ins {
			if o.Inputs[i], err = goString(fn, fmt.Sprintf("op.inputs[%d]", i), p); err != nil {
				return nil, err
			}
		}
	} else {
		o.Inputs = []string{}
	}
	o.Output, o.HasOutput = optString(op.output)
	if o.Shape, err = convertShape(fn, "op.shape", op.shape, op.rank); err != nil {
		return nil, err
	}
	o.DurationNs = uint64(op.duration_ns)
	o.TimestampNs = uint64(op.timestamp_ns)
	if op.flags&C.CT_HAS_OUTPUT_DENSE_BYTES != 0 {
		o.OutputDenseBytes, o.HasOutputDenseBytes = uint64(op.output_dense_bytes), true
	}
	o.InputDenseBytes = uint64(op.input_dense_bytes)
	return &o, nil
}

func convertTensor(fn string, t *C.ct_tensor) (*events.Tensor, error) {
	if t == nil {
		return nil, argErr(fn, "tensor is NULL")
	}
	if err := checkSize(fn, "ct_tensor", t.size, unsafe.Sizeof(*t)); err != nil {
		return nil, err
	}
	var x events.Tensor
	var err error
	if x.TensorID, err = reqString(fn, "tensor.tensor_id", t.tensor_id); err != nil {
		return nil, err
	}
	if x.Dtype, err = reqString(fn, "tensor.dtype", t.dtype); err != nil {
		return nil, err
	}
	if x.Device, err = reqString(fn, "tensor.device", t.device); err != nil {
		return nil, err
	}
	x.Label, _ = optString(t.label)
	if x.Shape, err = convertShape(fn, "tensor.shape", t.shape, t.rank); err != nil {
		return nil, err
	}
	switch t.requires_grad {
	case 0, 1:
		x.RequiresGrad = t.requires_grad == 1
	default:
		return nil, argErr(fn, "tensor.requires_grad must be 0 or 1, got %d", int32(t.requires_grad))
	}
	x.Category = events.Category(t.category)
	if t.flags&C.CT_HAS_DENSE_BYTES != 0 {
		x.DenseBytes, x.HasDenseBytes = uint64(t.dense_bytes), true
	}
	return &x, nil
}

func convertStats(fn string, st *C.ct_tensor_stats) (*events.TensorStats, error) {
	if st == nil {
		return nil, argErr(fn, "stats is NULL")
	}
	if err := checkSize(fn, "ct_tensor_stats", st.size, unsafe.Sizeof(*st)); err != nil {
		return nil, err
	}
	var x events.TensorStats
	var err error
	if x.Label, err = reqString(fn, "stats.label", st.label); err != nil {
		return nil, err
	}
	if x.Dtype, err = reqString(fn, "stats.dtype", st.dtype); err != nil {
		return nil, err
	}
	if x.Shape, err = convertShape(fn, "stats.shape", st.shape, st.rank); err != nil {
		return nil, err
	}
	x.Elements, x.NonFinite = uint64(st.elements), uint64(st.non_finite)
	x.RMS, x.AbsMax, x.Mean = float64(st.rms), float64(st.abs_max), float64(st.mean)
	return &x, nil
}

func convertMemory(fn string, action events.MemoryAction, m *C.ct_memory) (*events.Memory, error) {
	if !action.Valid() {
		return nil, argErr(fn, "unknown memory action %d", uint32(action))
	}
	if m == nil {
		return nil, argErr(fn, "memory is NULL")
	}
	if err := checkSize(fn, "ct_memory", m.size, unsafe.Sizeof(*m)); err != nil {
		return nil, err
	}
	x := events.Memory{Action: action, TimestampNs: uint64(m.timestamp_ns), Bytes: uint64(m.bytes), Category: events.Category(m.category)}
	var err error
	if x.StorageID, err = reqString(fn, "memory.storage_id", m.storage_id); err != nil {
		return nil, err
	}
	if x.TensorID, err = reqString(fn, "memory.tensor_id", m.tensor_id); err != nil {
		return nil, err
	}
	if x.Device, err = reqString(fn, "memory.device", m.device); err != nil {
		return nil, err
	}
	if x.Dtype, err = reqString(fn, "memory.dtype", m.dtype); err != nil {
		return nil, err
	}
	x.OpName, _ = optString(m.op_name)
	if x.Shape, err = convertShape(fn, "memory.shape", m.shape, m.rank); err != nil {
		return nil, err
	}
	return &x, nil
}

func convertDeviceMemory(fn string, m *C.ct_device_memory) (*events.DeviceMemory, error) {
	if m == nil {
		return nil, argErr(fn, "sample is NULL")
	}
	if err := checkSize(fn, "ct_device_memory", m.size, unsafe.Sizeof(*m)); err != nil {
		return nil, err
	}
	x := events.DeviceMemory{TimestampNs: uint64(m.timestamp_ns)}
	var err error
	if x.Device, err = reqString(fn, "sample.device", m.device); err != nil {
		return nil, err
	}
	f := m.flags
	x.Used, x.HasUsed = uint64(m.used_bytes), f&C.CT_HAS_USED_BYTES != 0
	x.Free, x.HasFree = uint64(m.free_bytes), f&C.CT_HAS_FREE_BYTES != 0
	x.Reserved, x.HasReserved = uint64(m.reserved_bytes), f&C.CT_HAS_RESERVED_BYTES != 0
	x.Capacity, x.HasCapacity = uint64(m.capacity_bytes), f&C.CT_HAS_CAPACITY_BYTES != 0
	return &x, nil
}

func convertDeviceInterval(fn string, d *C.ct_device_interval) (*events.DeviceInterval, error) {
	if d == nil {
		return nil, argErr(fn, "interval is NULL")
	}
	if err := checkSize(fn, "ct_device_interval", d.size, unsafe.Sizeof(*d)); err != nil {
		return nil, err
	}
	x := events.DeviceInterval{StartNs: uint64(d.start_ns), DurationNs: uint64(d.duration_ns)}
	var err error
	if x.Device, err = reqString(fn, "interval.device", d.device); err != nil {
		return nil, err
	}
	if x.StreamID, err = reqString(fn, "interval.stream_id", d.stream_id); err != nil {
		return nil, err
	}
	if x.Backend, err = reqString(fn, "interval.backend", d.backend); err != nil {
		return nil, err
	}
	x.ClockID, _ = optString(d.clock_id)
	x.Name, _ = optString(d.name)
	if d.flags&C.CT_HAS_CORRELATION_ID != 0 {
		x.CorrelationID, x.HasCorrelationID = uint64(d.correlation_id), true
	}
	return &x, nil
}
