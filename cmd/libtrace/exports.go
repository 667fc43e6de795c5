package main

/*
#cgo CFLAGS: -I${SRCDIR}/../../include -I${SRCDIR}/../../internal/session -I${SRCDIR}/../../internal/events -O2 -std=gnu11 -Wall
#cgo LDFLAGS: -lm
#include <stdlib.h>
#include <string.h>
#include "candle_trace.h"
#include "fastpath.h"
*/
import "C"

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/session"
)

// status reports err through the calling thread's ct_last_error buffer.
// Exports run on the C caller's thread, so the thread-local buffer is the
// caller's.
func status(err error) C.int {
	if err == nil {
		return C.CT_OK
	}
	return C.int(session.WriteCError(err))
}

// guard turns a panic into CT_ERR_INTERNAL: nothing panics across the C boundary.
func guard(fn string, rc *C.int) {
	if r := recover(); r != nil {
		*rc = status(&session.Error{Code: session.Internal, Msg: fmt.Sprintf("%s: internal error: %v", fn, r)})
	}
}

func openOptions() []session.Option {
	var opts []session.Option
	if ms, err := strconv.Atoi(os.Getenv("CANDLE_TRACE_FLUSH_MS")); err == nil && ms > 0 {
		opts = append(opts, session.WithFlushInterval(time.Duration(ms)*time.Millisecond))
	}
	binding := os.Getenv("CANDLE_TRACE_BINDING")
	if binding == "" {
		binding = "c"
	}
	p := session.DefaultProducer
	p.Binding = binding
	return append(opts, session.WithProducer(p))
}

//export ctgo_open
func ctgo_open(path, runJSON *C.char, out *C.ct_session) (rc C.int) {
	const fn = "ct_open"
	defer guard(fn, &rc)
	p, err := pathArg(fn, path, out)
	if err != nil {
		return status(err)
	}
	if runJSON == nil {
		return status(argErr(fn, "run_json is NULL"))
	}
	s, err := session.Open(p, []byte(C.GoString(runJSON)), openOptions()...)
	if err != nil {
		return status(err)
	}
	*out = C.ct_session(s.Handle())
	return C.CT_OK
}

// pathArg is the trace path argument of fn (ct_open, ct_reopen), checked
// with the out argument the new session's handle goes to.
func pathArg(fn string, path *C.char, out *C.ct_session) (string, error) {
	switch {
	case out == nil:
		return "", argErr(fn, "out is NULL")
	case path == nil:
		return "", argErr(fn, "path is NULL")
	}
	p, err := goString(fn, "path", path)
	if err != nil {
		return "", err
	}
	if !utf8.ValidString(p) {
		return "", argErr(fn, "path is not valid UTF-8")
	}
	return p, nil
}

// lookup finds the live session h for fn; a refusal names fn, as the C side's do.
func lookup(fn string, h C.ct_session) (*session.Session, error) {
	s, err := session.Lookup(uint64(h))
	if e, ok := err.(*session.Error); ok {
		return nil, &session.Error{Code: e.Code, Msg: fn + ": " + strings.TrimPrefix(e.Msg, "ct_*: ")}
	}
	return s, err
}

//export ctgo_record_completed_span
func ctgo_record_completed_span(h C.ct_session, name *C.char, kind C.uint32_t, start, dur C.uint64_t, out *C.ct_span) (rc C.int) {
	const fn = "ct_record_completed_span"
	defer guard(fn, &rc)
	s, err := lookup("ct_record_completed_span", h)
	if err != nil {
		return status(err)
	}
	n, err := reqString(fn, "name", name)
	if err != nil {
		return status(err)
	}
	id, err := s.RecordCompletedSpan(n, events.SpanKind(kind), uint64(start), uint64(dur))
	if err == nil && out != nil {
		*out = C.ct_span(id)
	}
	return status(err)
}

//export ctgo_record_op
func ctgo_record_op(h C.ct_session, span C.ct_span, op *C.ct_op) (rc C.int) {
	const fn = "ct_record_op"
	defer guard(fn, &rc)
	s, err := lookup("ct_record_op", h)
	if err != nil {
		return status(err)
	}
	o, err := convertOp(fn, op)
	if err != nil {
		return status(err)
	}
	return status(s.RecordOp(uint64(span), o))
}

//export ctgo_record_tensor
func ctgo_record_tensor(h C.ct_session, span C.ct_span, t *C.ct_tensor) (rc C.int) {
	const fn = "ct_record_tensor"
	defer guard(fn, &rc)
	s, err := lookup("ct_record_tensor", h)
	if err != nil {
		return status(err)
	}
	x, err := convertTensor(fn, t)
	if err != nil {
		return status(err)
	}
	return status(s.RecordTensor(uint64(span), x))
}

//export ctgo_record_tensor_stats
func ctgo_record_tensor_stats(h C.ct_session, span C.ct_span, st *C.ct_tensor_stats) (rc C.int) {
	const fn = "ct_record_tensor_stats"
	defer guard(fn, &rc)
	s, err := lookup("ct_record_tensor_stats", h)
	if err != nil {
		return status(err)
	}
	x, err := convertStats(fn, st)
	if err != nil {
		return status(err)
	}
	return status(s.RecordTensorStats(uint64(span), x))
}

//export ctgo_record_tensor_stats_f32
func ctgo_record_tensor_stats_f32(h C.ct_session, span C.ct_span, label *C.char, data *C.float, shape *C.int64_t, rank C.size_t) (rc C.int) {
	const fn = "ct_record_tensor_stats_f32"
	defer guard(fn, &rc)
	s, err := lookup("ct_record_tensor_stats_f32", h)
	if err != nil {
		return status(err)
	}
	l, err := reqString(fn, "label", label)
	if err != nil {
		return status(err)
	}
	dims, n, err := hostShape(fn, shape, rank)
	if err != nil {
		return status(err)
	}
	if data == nil && n > 0 {
		return status(argErr(fn, "data is NULL for a tensor of %d elements", n))
	}
	var vals []float32
	if n > 0 {
		vals = unsafe.Slice((*float32)(unsafe.Pointer(data)), n)
	}
	return status(s.RecordTensorStatsF32(uint64(span), l, vals, dims))
}

//export ctgo_record_scalar
func ctgo_record_scalar(h C.ct_session, span C.ct_span, label *C.char, v C.double) (rc C.int) {
	const fn = "ct_record_scalar"
	defer guard(fn, &rc)
	s, err := lookup("ct_record_scalar", h)
	if err != nil {
		return status(err)
	}
	l, err := reqString(fn, "label", label)
	if err != nil {
		return status(err)
	}
	return status(s.RecordScalar(uint64(span), l, float64(v)))
}

//export ctgo_record_memory
func ctgo_record_memory(h C.ct_session, span C.ct_span, action C.uint32_t, m *C.ct_memory) (rc C.int) {
	const fn = "ct_record_memory"
	defer guard(fn, &rc)
	s, err := lookup("ct_record_memory", h)
	if err != nil {
		return status(err)
	}
	x, err := convertMemory(fn, events.MemoryAction(action), m)
	if err != nil {
		return status(err)
	}
	return status(s.RecordMemory(uint64(span), x))
}

//export ctgo_record_device_memory
func ctgo_record_device_memory(h C.ct_session, m *C.ct_device_memory) (rc C.int) {
	const fn = "ct_record_device_memory"
	defer guard(fn, &rc)
	s, err := lookup("ct_record_device_memory", h)
	if err != nil {
		return status(err)
	}
	x, err := convertDeviceMemory(fn, m)
	if err != nil {
		return status(err)
	}
	return status(s.RecordDeviceMemory(x))
}

//export ctgo_record_device_interval
func ctgo_record_device_interval(h C.ct_session, span C.ct_span, d *C.ct_device_interval) (rc C.int) {
	const fn = "ct_record_device_interval"
	defer guard(fn, &rc)
	s, err := lookup("ct_record_device_interval", h)
	if err != nil {
		return status(err)
	}
	x, err := convertDeviceInterval(fn, d)
	if err != nil {
		return status(err)
	}
	return status(s.RecordDeviceInterval(uint64(span), x))
}

//export ctgo_record_call_edge
func ctgo_record_call_edge(h C.ct_session, from, to C.ct_span, dur C.uint64_t) (rc C.int) {
	defer guard("ct_record_call_edge", &rc)
	s, err := lookup("ct_record_call_edge", h)
	if err != nil {
		return status(err)
	}
	return status(s.RecordCallEdge(uint64(from), uint64(to), uint64(dur)))
}

//export ctgo_record_data_edge
func ctgo_record_data_edge(h C.ct_session, from, to *C.char) (rc C.int) {
	const fn = "ct_record_data_edge"
	defer guard(fn, &rc)
	s, err := lookup("ct_record_data_edge", h)
	if err != nil {
		return status(err)
	}
	f, err := reqString(fn, "from_tensor", from)
	if err != nil {
		return status(err)
	}
	t, err := reqString(fn, "to_tensor", to)
	if err != nil {
		return status(err)
	}
	return status(s.RecordDataEdge(f, t))
}

//export ctgo_record_gradient
func ctgo_record_gradient(h C.ct_session, root, key *C.char, state C.uint32_t, norm *C.double) (rc C.int) {
	const fn = "ct_record_gradient"
	defer guard(fn, &rc)
	s, err := lookup("ct_record_gradient", h)
	if err != nil {
		return status(err)
	}
	r, err := reqString(fn, "root", root)
	if err != nil {
		return status(err)
	}
	k, err := reqString(fn, "key", key)
	if err != nil {
		return status(err)
	}
	gs := events.GradientState(state)
	if !gs.Valid() {
		return status(argErr(fn, "unknown gradient state %d", uint32(state)))
	}
	var n *float64
	if norm != nil {
		v := float64(*norm)
		n = &v
	}
	return status(s.RecordGradient(r, k, gs, n))
}

//export ctgo_device_start
func ctgo_device_start(h C.ct_session, options *C.char) (rc C.int) {
	defer guard("ct_device_start", &rc)
	s, err := lookup("ct_device_start", h)
	if err != nil {
		return status(err)
	}
	var opts []byte
	if options != nil {
		opts = []byte(C.GoString(options))
	}
	return status(deviceStart(s, opts))
}

//export ctgo_device_stop
func ctgo_device_stop(h C.ct_session) (rc C.int) {
	defer guard("ct_device_stop", &rc)
	s, err := lookup("ct_device_stop", h)
	if err != nil {
		return status(err)
	}
	return status(s.StopDevices())
}

//export ctgo_flush
func ctgo_flush(h C.ct_session) (rc C.int) {
	defer guard("ct_flush", &rc)
	s, err := lookup("ct_flush", h)
	if err != nil {
		return status(err)
	}
	return status(s.Flush())
}

//export ctgo_finish
func ctgo_finish(h C.ct_session) (rc C.int) {
	defer guard("ct_finish", &rc)
	s, err := lookup("ct_finish", h)
	if err != nil {
		return status(err)
	}
	return status(s.Finish())
}

//export ctgo_finish_failed
func ctgo_finish_failed(h C.ct_session, reason *C.char) (rc C.int) {
	const fn = "ct_finish_failed"
	defer guard(fn, &rc)
	s, err := lookup("ct_finish_failed", h)
	if err != nil {
		return status(err)
	}
	r, err := reqString(fn, "reason", reason)
	if err != nil {
		return status(err)
	}
	return status(s.FinishFailed(r))
}

//export ctgo_discard
func ctgo_discard(h C.ct_session) (rc C.int) {
	defer guard("ct_discard", &rc)
	s, err := lookup("ct_discard", h)
	if err != nil {
		return status(err)
	}
	return status(s.Discard())
}

//export ctgo_reopen
func ctgo_reopen(h C.ct_session, path *C.char, step C.uint64_t, out *C.ct_session) (rc C.int) {
	const fn = "ct_reopen"
	defer guard(fn, &rc)
	p, err := pathArg(fn, path, out)
	if err != nil {
		return status(err)
	}
	s, err := lookup(fn, h)
	if err != nil {
		return status(err)
	}
	n, err := s.Reopen(p, uint64(step))
	if err != nil {
		return status(err)
	}
	*out = C.ct_session(n.Handle())
	return C.CT_OK
}

//export ctgo_dropped_records
func ctgo_dropped_records(h C.ct_session) (n C.uint64_t) {
	defer func() {
		if recover() != nil {
			n = 0
		}
	}()
	s, err := lookup("ct_dropped_records", h)
	if err != nil {
		return 0
	}
	return C.uint64_t(s.Dropped().Records)
}

//export ctgo_aggregate_enable
func ctgo_aggregate_enable(h C.ct_session, on C.int) (rc C.int) {
	const fn = "ct_aggregate_enable"
	defer guard(fn, &rc)
	s, err := lookup("ct_aggregate_enable", h)
	if err != nil {
		return status(err)
	}
	if on != 0 && on != 1 {
		return status(argErr(fn, "enabled must be 0 or 1, got %d", int(on)))
	}
	return status(s.SetAggregateEnabled(on == 1))
}

//export ctgo_aggregate_trigger
func ctgo_aggregate_trigger(h C.ct_session, update C.uint64_t, trigger *C.char, value, threshold C.double,
	detail, trace, noTrace *C.char) (rc C.int) {
	const fn = "ct_aggregate_trigger"
	defer guard(fn, &rc)
	s, err := lookup(fn, h)
	if err != nil {
		return status(err)
	}
	name, err := reqString(fn, "trigger", trigger)
	if err != nil {
		return status(err)
	}
	f := aggregate.Firing{Update: uint64(update), Trigger: name, Value: aggregate.TriggerValue(value), Threshold: float64(threshold)}
	for _, o := range []struct {
		field string
		p     *C.char
		out   *string
	}{{"detail", detail, &f.Detail}, {"trace", trace, &f.Trace}, {"no_trace", noTrace, &f.NoTrace}} {
		if *o.out, _, err = optString(fn, o.field, o.p); err != nil {
			return status(err)
		}
	}
	return status(s.AggregateTrigger(f))
}
