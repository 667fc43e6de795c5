package events

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"unicode/utf8"
)

// Record validation, run by the session before a record is written. A record candle-graph
// would reject (a parse error, or a health error that can be seen from the record alone)
// is refused here with a message naming the record and the field, so the caller learns
// about it at the call instead of from a broken trace. Span ids are not checked here: they
// are session handles, resolved by the session.

// Every string a record carries is bounded, and so are an op's strings together: a trace
// line longer than the readers take (internal/report/trace's DefaultMaxLineBytes, 64 MiB)
// would make a trace the session accepted unreadable. Escaped for JSON a byte takes at most
// 6 bytes (\u00XX), so MaxRecordStringBytes of strings stay within such a line. The C ABI
// refuses a string over MaxStringBytes before it reaches Go; these bounds hold for Go callers
// too.
const (
	MaxStringBytes       = 1 << 20
	MaxRecordStringBytes = 8 << 20
)

func tooLong(record, field string, n int) error {
	return fmt.Errorf("%s: %q is longer than 1 MiB (%d bytes)", record, field, n)
}

// requireText checks a required string: valid UTF-8, not blank, at most MaxStringBytes.
// Blank is refused even where candle-graph only needs the key present, because an empty id
// or name joins nothing.
func requireText(record, field, v string) error {
	if len(v) > MaxStringBytes {
		return tooLong(record, field, len(v))
	}
	if !utf8.ValidString(v) {
		return fmt.Errorf("%s: %q must be valid UTF-8", record, field)
	}
	if strings.TrimSpace(v) == "" {
		return fmt.Errorf("%s: %q must not be empty", record, field)
	}
	return nil
}

// optionalText checks an optional string: valid UTF-8 ("" is fine, it means absent), at
// most MaxStringBytes.
func optionalText(record, field, v string) error {
	if len(v) > MaxStringBytes {
		return tooLong(record, field, len(v))
	}
	if !utf8.ValidString(v) {
		return fmt.Errorf("%s: %q must be valid UTF-8", record, field)
	}
	return nil
}

func checkFinite(record, field string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Errorf("%s: %q must be finite, got %v", record, field, v)
	}
	return nil
}

// errNilRecord: a nil record is a caller bug, reported rather than dereferenced.
func errNilRecord(record string) error { return fmt.Errorf("%s: record is nil", record) }

// ValidateSpanName checks a span name: valid UTF-8, not blank, at most MaxStringBytes.
func ValidateSpanName(name string) error { return requireText("span", "name", name) }

// resolveDense checks shape against dtype and, when the caller gave no explicit size and the
// dtype has one, fills the derived dense byte size (what candle-graph would derive on read).
func resolveDense(record string, shape []uint64, dtype string, bytes *uint64, has *bool) error {
	n, known, err := DenseBytes(shape, dtype)
	if err != nil {
		return fmt.Errorf("%s: %q: %v", record, "shape", err)
	}
	if !*has && known {
		*bytes, *has = n, true
	}
	return nil
}

// Validate checks an op and fills OutputDenseBytes when it can be derived.
func (o *Op) Validate() error {
	const rec = "op"
	if o == nil {
		return errNilRecord(rec)
	}
	if err := requireText(rec, "op_name", o.OpName); err != nil {
		return err
	}
	if err := requireText(rec, "dtype", o.Dtype); err != nil {
		return err
	}
	if err := requireText(rec, "device", o.Device); err != nil {
		return err
	}
	total := len(o.OpName) + len(o.Dtype) + len(o.Device) + len(o.Output)
	for i, in := range o.Inputs {
		if err := requireText(rec, fmt.Sprintf("inputs[%d]", i), in); err != nil {
			return err
		}
		total += len(in)
	}
	if total > MaxRecordStringBytes {
		return fmt.Errorf("%s: its strings are %d bytes together, more than the 8 MiB one record may carry (a longer trace line is refused by its readers)", rec, total)
	}
	if o.HasOutput {
		if err := requireText(rec, "output", o.Output); err != nil {
			return err
		}
	}
	if o.TimestampNs > math.MaxUint64-o.DurationNs {
		return fmt.Errorf("%s: %q + %q overflows u64", rec, "timestamp_ns", "duration_ns")
	}
	return resolveDense(rec, o.Shape, o.Dtype, &o.OutputDenseBytes, &o.HasOutputDenseBytes)
}

// Validate checks a tensor snapshot and fills DenseBytes when it can be derived.
func (t *Tensor) Validate() error {
	const rec = "tensor"
	if t == nil {
		return errNilRecord(rec)
	}
	if err := requireText(rec, "tensor_id", t.TensorID); err != nil {
		return err
	}
	if err := requireText(rec, "dtype", t.Dtype); err != nil {
		return err
	}
	if err := requireText(rec, "device", t.Device); err != nil {
		return err
	}
	if err := optionalText(rec, "label", t.Label); err != nil {
		return err
	}
	if !t.Category.Valid() {
		return fmt.Errorf("%s: %q must be one of other|parameter|activation|gradient|optimizer (0..4), got %d", rec, "category", uint32(t.Category))
	}
	return resolveDense(rec, t.Shape, t.Dtype, &t.DenseBytes, &t.HasDenseBytes)
}

// Validate checks the invariants candle-graph enforces on tensor_stats at parse time (a
// violation there makes the whole trace unreadable).
func (s *TensorStats) Validate() error {
	const rec = "tensor_stats"
	if s == nil {
		return errNilRecord(rec)
	}
	if err := requireText(rec, "label", s.Label); err != nil {
		return err
	}
	if err := requireText(rec, "dtype", s.Dtype); err != nil {
		return err
	}
	n, err := ElementCount(s.Shape)
	if err != nil {
		return fmt.Errorf("%s: %q: %v", rec, "shape", err)
	}
	if s.Elements != n {
		return fmt.Errorf("%s: %q must equal the product of %q %v (%d), got %d", rec, "elements", "shape", s.Shape, n, s.Elements)
	}
	if s.NonFinite > s.Elements {
		return fmt.Errorf("%s: %q (%d) must not exceed %q (%d)", rec, "non_finite", s.NonFinite, "elements", s.Elements)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"rms", s.RMS}, {"abs_max", s.AbsMax}} {
		if err := checkFinite(rec, f.name, f.v); err != nil {
			return err
		}
		if f.v < 0 {
			return fmt.Errorf("%s: %q must be >= 0, got %v", rec, f.name, f.v)
		}
	}
	return checkFinite(rec, "mean", s.Mean)
}

// Validate checks a memory event.
func (m *Memory) Validate() error {
	const rec = "memory"
	if m == nil {
		return errNilRecord(rec)
	}
	for _, f := range []struct{ name, v string }{
		{"storage_id", m.StorageID}, {"tensor_id", m.TensorID}, {"device", m.Device}, {"dtype", m.Dtype},
	} {
		if err := requireText(rec, f.name, f.v); err != nil {
			return err
		}
	}
	if err := optionalText(rec, "op_name", m.OpName); err != nil {
		return err
	}
	if !m.Action.Valid() {
		return fmt.Errorf("%s: %q must be alloc or free (0..1), got %d", rec, "action", uint32(m.Action))
	}
	if !m.Category.Valid() {
		return fmt.Errorf("%s: %q must be one of other|parameter|activation|gradient|optimizer (0..4), got %d", rec, "category", uint32(m.Category))
	}
	if _, _, err := DenseBytes(m.Shape, m.Dtype); err != nil {
		return fmt.Errorf("%s: %q: %v", rec, "shape", err)
	}
	return nil
}

// Validate checks a device_memory sample: candle-graph reports a sample without any value
// as a structural error (empty_device_memory_sample).
func (d *DeviceMemory) Validate() error {
	const rec = "device_memory"
	if d == nil {
		return errNilRecord(rec)
	}
	if err := requireText(rec, "device", d.Device); err != nil {
		return err
	}
	if !d.HasUsed && !d.HasFree && !d.HasReserved && !d.HasCapacity {
		return fmt.Errorf("%s: at least one of %q, %q, %q, %q must be present", rec, "used_bytes", "free_bytes", "reserved_bytes", "capacity_bytes")
	}
	keys := make([]string, 0, len(d.Extra))
	for k := range d.Extra {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the first bad key reported is the same on every run
	for _, k := range keys {
		if err := requireText(rec, "extra key", k); err != nil {
			return err
		}
		if err := checkFinite(rec, "extra."+k, d.Extra[k]); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks a device interval; a zero duration is candle-graph's
// empty_device_interval error.
func (d *DeviceInterval) Validate() error {
	const rec = "device_interval"
	if d == nil {
		return errNilRecord(rec)
	}
	for _, f := range []struct{ name, v string }{
		{"device", d.Device}, {"stream_id", d.StreamID}, {"clock_id", d.ClockID}, {"backend", d.Backend},
	} {
		if err := requireText(rec, f.name, f.v); err != nil {
			return err
		}
	}
	if err := optionalText(rec, "name", d.Name); err != nil {
		return err
	}
	if d.DurationNs == 0 {
		return fmt.Errorf("%s: %q must be > 0", rec, "duration_ns")
	}
	if d.StartNs > math.MaxUint64-d.DurationNs {
		return fmt.Errorf("%s: %q + %q overflows u64", rec, "start_ns", "duration_ns")
	}
	return nil
}

// ValidateGradient checks a gradient fact, including candle-graph's state/norm rule:
// present needs a finite norm > 0, zero needs exactly +0.0, missing and non_finite need no
// norm.
func ValidateGradient(root, key string, state GradientState, norm float64, hasNorm bool) error {
	const rec = "gradient"
	if err := requireText(rec, "root", root); err != nil {
		return err
	}
	if err := requireText(rec, "key", key); err != nil {
		return err
	}
	switch state {
	case GradientPresent:
		if !hasNorm {
			return fmt.Errorf("%s: state present needs a %q", rec, "norm")
		}
		if math.IsNaN(norm) || math.IsInf(norm, 0) || norm <= 0 {
			return fmt.Errorf("%s: state present needs a finite %q > 0, got %v (use state zero or non_finite)", rec, "norm", norm)
		}
	case GradientZero:
		if !hasNorm || norm != 0 || math.Signbit(norm) {
			return fmt.Errorf("%s: state zero needs %q exactly +0.0", rec, "norm")
		}
	case GradientMissing, GradientNonFinite:
		if hasNorm {
			return fmt.Errorf("%s: state %s must not carry a %q", rec, state, "norm")
		}
	default:
		return fmt.Errorf("%s: %q must be one of present|zero|missing|non_finite (0..3), got %d", rec, "state", uint32(state))
	}
	return nil
}

// ValidateDataEdge checks a data edge's endpoints (tensor ids).
func ValidateDataEdge(from, to string) error {
	if err := requireText("edge", "from_tensor", from); err != nil {
		return err
	}
	return requireText("edge", "to_tensor", to)
}

// ValidateTerminal checks a terminal's reason: a failed terminal needs a non-blank reason
// (candle-graph refuses to parse one without), a complete one carries none.
func ValidateTerminal(complete bool, reason string) error {
	if complete {
		if reason != "" {
			return fmt.Errorf("terminal: a complete outcome must not carry a %q", "reason")
		}
		return nil
	}
	return requireText("terminal", "reason", reason)
}
