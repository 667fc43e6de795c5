package session

import (
	"strings"
	"unicode/utf8"

	"github.com/candle-trace/candle-trace/internal/events"
)

// The record methods check what the trace format's rules allow them to check
// at the moment a record arrives, so a program cannot produce a trace that
// candle-graph rejects; a refused record writes nothing. The checks are the
// same for both products; what a checked record becomes is the product's
// (keepLocked and the others of product.go).

// beginRecord locks, checks the session is usable and drains the calling
// thread's ring, so its own spans are current (recordSpan looks further only
// for a span of another thread): a record call never drains every thread's
// rings. On success the caller holds mu and must unlock it; on failure mu is
// already released.
func (s *Session) beginRecord(fn string) error {
	mu.Lock()
	if err := s.usableLocked(fn); err != nil {
		mu.Unlock()
		return err
	}
	drainOwnRingLocked()
	return nil
}

// spanBounds returns the interval a record on span must lie in: [start, end]
// for a closed span, [start, now] for an open one.
func (s *Session) spanBounds(fn string, span uint64) (start, end uint64, closed bool, err error) {
	o, open, c, closed := s.recordSpan(span)
	if open {
		return o.start, s.Now(), false, nil
	}
	if closed {
		return c.start, c.start + c.dur, true, nil
	}
	if s.product.untrackedSpan(span) {
		return 0, s.Now(), false, nil
	}
	return 0, 0, false, s.unknownSpan(fn, span)
}

func (s *Session) unknownSpan(fn string, span uint64) error {
	if s.poison != nil {
		// Records drained after the failed write were dropped: the span
		// may well exist, and the write error is the one to report.
		return s.poisonedErr(fn)
	}
	if span == 0 {
		return errorf(InvalidHandle, "%s: span 0 is never valid", fn)
	}
	if span <= lastSpanID(s.slot) {
		// Ids come in per-thread blocks, so an id below the counter is either
		// a span that closed too long ago or one never handed out.
		return errorf(InvalidHandle, "%s: span s%d is not open and not among the newest %d closed spans (closed too long ago, or never opened)", fn, span, MaxClosedSpans)
	}
	return errorf(InvalidHandle, "%s: span s%d does not exist in session %d", fn, span, s.handle)
}

func (s *Session) spanExists(fn string, span uint64) error {
	_, _, _, err := s.spanBounds(fn, span)
	return err
}

func invalid(fn string, err error) error {
	return errorf(InvalidArgument, "%s: %v", fn, err)
}

// RecordOp records one operation on span. A zero TimestampNs means it ended now.
func (s *Session) RecordOp(span uint64, op *events.Op) error {
	const fn = "ct_record_op"
	if err := op.Validate(); err != nil {
		return invalid(fn, err)
	}
	if err := s.beginRecord(fn); err != nil {
		return err
	}
	defer mu.Unlock()
	// Default times are taken before the span's bounds, so an open span's
	// "now" bound is never earlier than them.
	if op.TimestampNs == 0 {
		now := s.Now()
		if op.DurationNs > now {
			return errorf(InvalidArgument, "%s: duration_ns %d is longer than the session has existed (%d ns)", fn, op.DurationNs, now)
		}
		op.TimestampNs = now - op.DurationNs
	}
	start, end, closed, err := s.spanBounds(fn, span)
	if err != nil {
		return err
	}
	opEnd := op.TimestampNs + op.DurationNs
	if opEnd < op.TimestampNs {
		return errorf(InvalidArgument, "%s: timestamp_ns + duration_ns overflows", fn)
	}
	if op.TimestampNs < start || opEnd > end {
		return errorf(InvalidArgument, "%s: op %q [%d, %d] ns lies outside span s%d [%d, %d]%s", fn, op.OpName, op.TimestampNs, opEnd, span, start, end, openNote(closed))
	}
	op.SpanID = span
	mark := len(s.buf)
	s.buf = events.AppendOp(s.buf, op)
	s.product.keepLocked(lineDetail, mark)
	for _, in := range op.Inputs {
		s.knowTensor(in)
	}
	if op.HasOutput {
		s.knowTensor(op.Output)
	}
	s.maybeWrite()
	return nil
}

func openNote(closed bool) string {
	if closed {
		return ""
	}
	return " (the span is open: records must not end in the future)"
}

// maxKnownTensors bounds the tensor-id set data edges are checked against.
const maxKnownTensors = 1 << 20

func (s *Session) knowTensor(id string) {
	if len(s.tensors) < maxKnownTensors {
		s.tensors[id] = struct{}{}
	}
}

// RecordTensor records tensor metadata on span.
func (s *Session) RecordTensor(span uint64, t *events.Tensor) error {
	const fn = "ct_record_tensor"
	if err := t.Validate(); err != nil {
		return invalid(fn, err)
	}
	if err := s.beginRecord(fn); err != nil {
		return err
	}
	defer mu.Unlock()
	if err := s.spanExists(fn, span); err != nil {
		return err
	}
	t.SpanID = span
	mark := len(s.buf)
	s.buf = events.AppendTensor(s.buf, t)
	s.product.keepLocked(lineDetail, mark)
	s.knowTensor(t.TensorID)
	s.maybeWrite()
	return nil
}

// RecordTensorStats records already-reduced statistics on span.
func (s *Session) RecordTensorStats(span uint64, st *events.TensorStats) error {
	return s.recordStats("ct_record_tensor_stats", span, st, nil)
}

// RecordTensorStatsF32 reduces a host float32 buffer and records it.
func (s *Session) RecordTensorStatsF32(span uint64, label string, data []float32, shape []uint64) error {
	st, err := events.StatsFromF32(label, data, shape)
	if err != nil {
		return invalid("ct_record_tensor_stats_f32", err)
	}
	return s.recordStats("ct_record_tensor_stats_f32", span, &st, nil)
}

// RecordScalar records one scalar observation as single-element stats (in
// an aggregate session: into the label's running statistics).
func (s *Session) RecordScalar(span uint64, label string, v float64) error {
	st := events.ScalarStats(label, v)
	return s.recordStats("ct_record_scalar", span, &st, &v)
}

// recordStats writes st; scalar is the raw value when st came from a scalar.
func (s *Session) recordStats(fn string, span uint64, st *events.TensorStats, scalar *float64) error {
	if err := st.Validate(); err != nil {
		return invalid(fn, err)
	}
	if err := s.beginRecord(fn); err != nil {
		return err
	}
	defer mu.Unlock()
	if err := s.spanExists(fn, span); err != nil {
		return err
	}
	if scalar != nil {
		if err := s.product.scalarLocked(fn, st.Label, *scalar); err != nil {
			return err
		}
	}
	st.SpanID = span
	mark := len(s.buf)
	s.buf = events.AppendTensorStats(s.buf, st)
	s.product.keepLocked(lineDetail, mark)
	s.maybeWrite()
	return nil
}

// RecordMemory records a logical alloc or free on span and checks the
// storage's lifetime the way candle-graph's health analysis does.
func (s *Session) RecordMemory(span uint64, m *events.Memory) error {
	const fn = "ct_record_memory"
	if err := m.Validate(); err != nil {
		return invalid(fn, err)
	}
	if err := s.beginRecord(fn); err != nil {
		return err
	}
	defer mu.Unlock()
	if m.TimestampNs == 0 {
		m.TimestampNs = s.Now()
	}
	start, end, closed, err := s.spanBounds(fn, span)
	if err != nil {
		return err
	}
	if m.TimestampNs < start || m.TimestampNs > end {
		return errorf(InvalidArgument, "%s: timestamp %d ns lies outside span s%d [%d, %d]%s", fn, m.TimestampNs, span, start, end, openNote(closed))
	}
	if err := s.memory.apply(m); err != nil {
		return invalid(fn, err)
	}
	m.SpanID = span
	mark := len(s.buf)
	s.buf = events.AppendMemory(s.buf, m)
	s.product.keepLocked(lineDetail, mark)
	s.maybeWrite()
	return nil
}

// RecordDeviceMemory records a physical device-memory sample.
func (s *Session) RecordDeviceMemory(d *events.DeviceMemory) error {
	const fn = "ct_record_device_memory"
	if err := d.Validate(); err != nil {
		return invalid(fn, err)
	}
	if err := s.beginRecord(fn); err != nil {
		return err
	}
	defer mu.Unlock()
	now := s.Now()
	if d.TimestampNs == 0 {
		d.TimestampNs = now
	}
	if d.TimestampNs > now {
		return errorf(InvalidArgument, "%s: timestamp %d ns is in the future (now %d ns)", fn, d.TimestampNs, now)
	}
	mark := len(s.buf)
	s.buf = events.AppendDeviceMemory(s.buf, d)
	s.product.keepLocked(lineDetail, mark)
	s.maybeWrite()
	return nil
}

// RecordDeviceInterval records device work attributed to span.
func (s *Session) RecordDeviceInterval(span uint64, d *events.DeviceInterval) error {
	const fn = "ct_record_device_interval"
	if d.ClockID == "" {
		d.ClockID = "host-monotonic"
	}
	if err := d.Validate(); err != nil {
		return invalid(fn, err)
	}
	if d.StartNs+d.DurationNs < d.StartNs {
		return errorf(InvalidArgument, "%s: start_ns + duration_ns overflows", fn)
	}
	if err := s.beginRecord(fn); err != nil {
		return err
	}
	defer mu.Unlock()
	if err := s.spanExists(fn, span); err != nil {
		return err
	}
	d.SpanID = span
	mark := len(s.buf)
	s.buf = events.AppendDeviceInterval(s.buf, d)
	s.product.keepLocked(lineDetail, mark)
	s.maybeWrite()
	return nil
}

// RecordCompletedSpan records finished host work as a closed span under the
// root; no thread's span stack changes.
func (s *Session) RecordCompletedSpan(name string, kind events.SpanKind, startNs, durNs uint64) (uint64, error) {
	const fn = "ct_record_completed_span"
	switch {
	case strings.TrimSpace(name) == "":
		return 0, errorf(InvalidArgument, "%s: name is empty", fn)
	case len(name) > events.MaxStringBytes:
		return 0, errorf(InvalidArgument, "%s: name is longer than 1 MiB (%d bytes)", fn, len(name))
	case !utf8.ValidString(name):
		return 0, errorf(InvalidArgument, "%s: name is not valid UTF-8", fn)
	case !kind.Valid():
		return 0, errorf(InvalidArgument, "%s: unknown span kind %d", fn, uint32(kind))
	case durNs == 0:
		return 0, errorf(InvalidArgument, "%s: duration must be positive", fn)
	case startNs+durNs < startNs:
		return 0, errorf(InvalidArgument, "%s: start_ns + duration_ns overflows", fn)
	}
	if err := s.beginRecord(fn); err != nil {
		return 0, err
	}
	defer mu.Unlock()
	if now := s.Now(); startNs+durNs > now {
		return 0, errorf(InvalidArgument, "%s: the span ends at %d ns, in the future (now %d ns)", fn, startNs+durNs, now)
	}
	id := nextSpanID(s.slot)
	c := closedSpan{id: id, parent: 1, start: startNs, dur: durNs}
	c.dropped = s.product.completedSpanLocked(id, name, kind, startNs, durNs)
	s.closed.put(c)
	s.maybeWrite()
	return id, nil
}

// RecordCallEdge records that from called to (to's parent must be from).
// hostDurationNs 0 takes to's duration, written when to closes.
func (s *Session) RecordCallEdge(from, to, hostDurationNs uint64) error {
	const fn = "ct_record_call_edge"
	if err := s.beginRecord(fn); err != nil {
		return err
	}
	defer mu.Unlock()
	if err := s.spanExists(fn, from); err != nil {
		return err
	}
	if err := s.product.callEdgeLocked(fn, from, to, hostDurationNs); err != nil {
		return err
	}
	s.maybeWrite()
	return nil
}

// RecordDataEdge records a data dependency between two known tensors.
func (s *Session) RecordDataEdge(from, to string) error {
	const fn = "ct_record_data_edge"
	if err := events.ValidateDataEdge(from, to); err != nil {
		return invalid(fn, err)
	}
	if err := s.beginRecord(fn); err != nil {
		return err
	}
	defer mu.Unlock()
	for _, t := range []string{from, to} {
		if _, ok := s.tensors[t]; !ok {
			return errorf(InvalidArgument, "%s: tensor %q is unknown: record it with ct_record_tensor or as an op input/output first (unknown_data_edge_tensor)", fn, t)
		}
	}
	mark := len(s.buf)
	s.buf = events.AppendDataEdge(s.buf, from, to)
	s.product.keepLocked(lineDetail, mark)
	s.maybeWrite()
	return nil
}

// RecordGradient records one gradient fact; norm is nil when absent.
func (s *Session) RecordGradient(root, key string, state events.GradientState, norm *float64) error {
	const fn = "ct_record_gradient"
	n, has := 0.0, norm != nil
	if has {
		n = *norm
	}
	if err := events.ValidateGradient(root, key, state, n, has); err != nil {
		return invalid(fn, err)
	}
	if err := s.beginRecord(fn); err != nil {
		return err
	}
	defer mu.Unlock()
	if s.expected != nil {
		k := gradKey{root, key}
		seen, ok := s.expected[k]
		if !ok {
			return errorf(InvalidArgument, "%s: gradient (%q, %q) is not in the gradient contract's manifest (gradient_manifest_undeclared_key)", fn, root, key)
		}
		if seen {
			return errorf(InvalidArgument, "%s: gradient (%q, %q) was already recorded (gradient_manifest_duplicate_key)", fn, root, key)
		}
		s.expected[k] = true
	}
	s.nextGradient++
	mark := len(s.buf)
	s.buf = events.AppendGradient(s.buf, s.nextGradient, root, key, state, n, has)
	// A contract's gradients are bounded by it, and the trace needs them.
	class := lineNeeded
	if s.expected == nil {
		class = lineStructure
	}
	s.product.keepLocked(class, mark)
	s.maybeWrite()
	return nil
}
