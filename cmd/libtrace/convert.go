package main

/*
#include <string.h>
#include "candle_trace.h"
#include "fastpath.h"
#include "shape.h"

// ct__check_shape for Go's strings, passed without a copy.
static ct_status check_shape(_GoString_ fn, _GoString_ field, const int64_t *shape, size_t rank,
                             uint64_t *elements) {
    return ct__check_shape(_GoStringPtr(fn), _GoStringLen(fn), _GoStringPtr(field), _GoStringLen(field),
                           shape, rank, elements);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/session"
)

// The converters copy C records into Go values; the strings are copied, so
// the caller's memory is only borrowed for the call.

func argErr(fn, format string, args ...any) error {
	return &session.Error{Code: session.InvalidArgument, Msg: fn + ": " + fmt.Sprintf(format, args...)}
}

// goString copies a C string that must not be NULL (it may be empty).
func goString(fn, field string, p *C.char) (string, error) {
	if p == nil {
		return "", argErr(fn, "%s is NULL", field)
	}
	return boundedString(fn, field, p)
}

// maxStringBytes bounds every string a record carries, as the C fast path
// bounds span names: a trace line holding a larger one would be refused by
// the trace's readers (line_too_long) after the call said OK.
const maxStringBytes = 1 << 20

func boundedString(fn, field string, p *C.char) (string, error) {
	n := C.strlen(p)
	if n > maxStringBytes {
		return "", argErr(fn, "%s is longer than 1 MiB (%d bytes)", field, uint64(n))
	}
	return C.GoStringN(p, C.int(n)), nil
}

// reqString copies a required string: not NULL; emptiness and UTF-8 are
// checked by the validators, which know which fields may be blank.
func reqString(fn, field string, p *C.char) (string, error) { return goString(fn, field, p) }

// optString copies a string where NULL means absent.
func optString(fn, field string, p *C.char) (string, bool, error) {
	if p == nil {
		return "", false, nil
	}
	s, err := boundedString(fn, field, p)
	return s, err == nil, err
}

// maxRecordSize bounds a record's size: a larger one is garbage, not the
// struct of a later ABI.
const maxRecordSize = 4096

// record reads the caller's versioned struct *p (its field names prefixed
// field, its C type named name) by the rule of the header: size is at least
// 8 (size and flags/reserved) and a multiple of the struct's alignment; a
// smaller struct than this library's (an older caller's) is read as far as
// it goes, the fields past it zero (their defaults); a larger one (a newer
// caller's) is accepted only when every byte past this library's struct is
// zero. The second field, flags (known: its known bits) or reserved (known
// 0), may have no other bit set. The returned hint adds to a later error of
// a smaller struct that its missing fields read as 0/NULL.
func record[T any](fn, field, name string, p *T, known uint32) (rec T, hint func(*error), err error) {
	hint = func(*error) {}
	if p == nil {
		return rec, hint, argErr(fn, "%s is NULL", field)
	}
	sizeof, align := unsafe.Sizeof(rec), unsafe.Alignof(rec)
	size := uintptr(*(*uint32)(unsafe.Pointer(p)))
	if size < 8 || size%align != 0 || size > maxRecordSize {
		return rec, hint, argErr(fn, "%s.size is %d; set it to sizeof(%s) (%d)", field, size, name, sizeof)
	}
	src := unsafe.Slice((*byte)(unsafe.Pointer(p)), size)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&rec)), sizeof), src)
	if size > sizeof {
		for i, b := range src[sizeof:] {
			if b != 0 {
				return rec, hint, argErr(fn, "%s.size is %d, larger than this library's sizeof(%s) (%d, ABI %d), and byte %d past it is not zero: a field this library does not know; leave it 0 or use a newer library",
					field, size, name, sizeof, C.CT_ABI_VERSION, sizeof+uintptr(i))
			}
		}
	}
	second := *(*uint32)(unsafe.Add(unsafe.Pointer(&rec), 4))
	switch unknown := second &^ known; {
	case unknown != 0 && known == 0:
		return rec, hint, argErr(fn, "%s.reserved is %#x; it must be 0", field, second)
	case unknown != 0:
		return rec, hint, argErr(fn, "%s.flags has unknown bits %#x (this library knows %#x)", field, unknown, known)
	}
	if size < sizeof {
		hint = func(err *error) {
			var e *session.Error
			if errors.As(*err, &e) {
				*err = &session.Error{Code: e.Code, Msg: fmt.Sprintf("%s (%s.size is %d, smaller than sizeof(%s) %d: the fields past it read as 0 or NULL)", e.Msg, field, size, name, sizeof)}
			}
		}
	}
	return rec, hint, nil
}

// convertShape is the shape argument field of fn, checked by the C checker
// ct_reduce_tensor_stats_f32 uses too (shape.c).
func convertShape(fn, field string, p *C.int64_t, rank C.size_t) ([]uint64, error) {
	dims, _, err := checkShape(fn, field, p, rank, false)
	return dims, err
}

// hostShape is the shape of a host float32 buffer (ct_record_tensor_stats_f32)
// with its element count, checked to fit the buffer (shape.c).
func hostShape(fn string, p *C.int64_t, rank C.size_t) ([]uint64, int, error) {
	return checkShape(fn, "shape", p, rank, true)
}

func checkShape(fn, field string, p *C.int64_t, rank C.size_t, count bool) ([]uint64, int, error) {
	if rank == 0 {
		return []uint64{}, 1, nil
	}
	var n C.uint64_t
	var elements *C.uint64_t
	if count {
		elements = &n
	}
	if st := C.check_shape(fn, field, p, rank, elements); st != C.CT_OK {
		return nil, 0, &session.Error{Code: session.Status(st), Msg: C.GoString(C.ct__errbuf())}
	}
	dims := unsafe.Slice((*int64)(unsafe.Pointer(p)), int(rank))
	out := make([]uint64, len(dims))
	for i, d := range dims {
		out[i] = uint64(d)
	}
	return out, int(n), nil
}

func convertOp(fn string, p *C.ct_op) (_ *events.Op, err error) {
	op, hint, err := record(fn, "op", "ct_op", p, C.CT_HAS_OUTPUT_DENSE_BYTES)
	if err != nil {
		return nil, err
	}
	defer hint(&err)
	var o events.Op
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
	if o.Output, o.HasOutput, err = optString(fn, "op.output", op.output); err != nil {
		return nil, err
	}
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

func convertTensor(fn string, p *C.ct_tensor) (_ *events.Tensor, err error) {
	t, hint, err := record(fn, "tensor", "ct_tensor", p, C.CT_HAS_DENSE_BYTES)
	if err != nil {
		return nil, err
	}
	defer hint(&err)
	var x events.Tensor
	if x.TensorID, err = reqString(fn, "tensor.tensor_id", t.tensor_id); err != nil {
		return nil, err
	}
	if x.Dtype, err = reqString(fn, "tensor.dtype", t.dtype); err != nil {
		return nil, err
	}
	if x.Device, err = reqString(fn, "tensor.device", t.device); err != nil {
		return nil, err
	}
	if x.Label, _, err = optString(fn, "tensor.label", t.label); err != nil {
		return nil, err
	}
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

func convertStats(fn string, p *C.ct_tensor_stats) (_ *events.TensorStats, err error) {
	st, hint, err := record(fn, "stats", "ct_tensor_stats", p, 0)
	if err != nil {
		return nil, err
	}
	defer hint(&err)
	var x events.TensorStats
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

func convertMemory(fn string, action events.MemoryAction, p *C.ct_memory) (_ *events.Memory, err error) {
	if !action.Valid() {
		return nil, argErr(fn, "unknown memory action %d", uint32(action))
	}
	m, hint, err := record(fn, "memory", "ct_memory", p, 0)
	if err != nil {
		return nil, err
	}
	defer hint(&err)
	x := events.Memory{Action: action, TimestampNs: uint64(m.timestamp_ns), Bytes: uint64(m.bytes), Category: events.Category(m.category)}
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
	if x.OpName, _, err = optString(fn, "memory.op_name", m.op_name); err != nil {
		return nil, err
	}
	if x.Shape, err = convertShape(fn, "memory.shape", m.shape, m.rank); err != nil {
		return nil, err
	}
	return &x, nil
}

func convertDeviceMemory(fn string, p *C.ct_device_memory) (_ *events.DeviceMemory, err error) {
	m, hint, err := record(fn, "sample", "ct_device_memory", p, C.CT_HAS_USED_BYTES|C.CT_HAS_FREE_BYTES|C.CT_HAS_RESERVED_BYTES|C.CT_HAS_CAPACITY_BYTES)
	if err != nil {
		return nil, err
	}
	defer hint(&err)
	x := events.DeviceMemory{TimestampNs: uint64(m.timestamp_ns)}
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

func convertDeviceInterval(fn string, p *C.ct_device_interval) (_ *events.DeviceInterval, err error) {
	d, hint, err := record(fn, "interval", "ct_device_interval", p, C.CT_HAS_CORRELATION_ID)
	if err != nil {
		return nil, err
	}
	defer hint(&err)
	x := events.DeviceInterval{StartNs: uint64(d.start_ns), DurationNs: uint64(d.duration_ns)}
	if x.Device, err = reqString(fn, "interval.device", d.device); err != nil {
		return nil, err
	}
	if x.StreamID, err = reqString(fn, "interval.stream_id", d.stream_id); err != nil {
		return nil, err
	}
	if x.Backend, err = reqString(fn, "interval.backend", d.backend); err != nil {
		return nil, err
	}
	if x.ClockID, _, err = optString(fn, "interval.clock_id", d.clock_id); err != nil {
		return nil, err
	}
	if x.Name, _, err = optString(fn, "interval.name", d.name); err != nil {
		return nil, err
	}
	if d.flags&C.CT_HAS_CORRELATION_ID != 0 {
		x.CorrelationID, x.HasCorrelationID = uint64(d.correlation_id), true
	}
	return &x, nil
}
