package trace

import (
	"fmt"
	"io"

	"github.com/candle-trace/candle-trace/internal/traceformat"
)

// The records of a trace as the streaming decoder reads them, for readers
// outside this package that translate a trace into another format as it
// streams (internal/otlp): the timeline's records only, each handed over
// once, in file order, under the same end-of-file rules as every other
// command (a cut last line ends a partial trace, the first unreadable line
// stops the read). Nothing is kept between records.
//
// Byte-slice fields alias the line being decoded: they are valid only
// during the callback, which must copy what it keeps.

// SpanStartRecord is a span_start record.
type SpanStartRecord struct {
	ID, Name  []byte
	Parent    []byte // valid when HasParent
	HasParent bool
	StartNS   uint64
	Kind      string // function | op | module
	Step      string // forward | backward | optimizer; "" when absent
	Measured  bool
	TID       uint64 // valid when HasTID
	HasTID    bool
}

// SpanEndRecord is a span_end record.
type SpanEndRecord struct {
	ID         []byte
	DurationNS uint64
	// TracerNS is the tracer time left out of the duration (ours, on the
	// measured span), valid when HasTracer.
	TracerNS  uint64
	HasTracer bool
}

// OpRecord is an op record.
type OpRecord struct {
	SpanID, Name, DType, Device []byte
	Output                      []byte // valid when HasOutput
	HasOutput                   bool
	Shape                       []uint64
	TimestampNS, DurationNS     uint64
	InputBytes                  uint64
	// OutputBytes is the op's output footprint, explicit or derived from
	// shape × dtype; valid when HasOutputBytes.
	OutputBytes    uint64
	HasOutputBytes bool
}

// DeviceIntervalRecord is a device_interval record.
type DeviceIntervalRecord struct {
	SpanID, Device, StreamID, ClockID, Backend []byte
	Name                                       []byte // "" when the trace gives none
	StartNS, DurationNS                        uint64
	Correlation                                uint64 // valid when HasCorrelation
	HasCorrelation                             bool
}

// OnHostClock reports whether the interval is on the session's clock, and
// so aligned with the host spans.
func (r *DeviceIntervalRecord) OnHostClock() bool { return string(r.ClockID) == HostClock }

// TerminalRecord is the terminal record.
type TerminalRecord struct {
	Outcome     string // complete | failed
	TimestampNS uint64
	Reason      []byte // valid when HasReason
	HasReason   bool
	TracerNS    uint64 // the session's tracer time, valid when HasTracer
	HasTracer   bool
}

// RecordVisitor receives the records; a nil callback skips its kind. A
// callback's error ends the stream and is StreamRecords' error.
type RecordVisitor struct {
	Meta           func(*Meta) error
	SpanStart      func(*SpanStartRecord) error
	SpanEnd        func(*SpanEndRecord) error
	Op             func(*OpRecord) error
	DeviceInterval func(*DeviceIntervalRecord) error
	Terminal       func(*TerminalRecord) error

	// Skim passes over the lines of the kinds without a callback, once the
	// meta is read, neither decoded nor checked (Stream.Skip): for a reader
	// that wants a few records of a large trace and leaves judging it to
	// others. A line it cannot skim (SkimKind) is decoded as usual.
	Skim bool
	// OpNamed, with Skim and Op, picks the op lines to decode by their
	// op_name (SkimOpName); the others are passed over like the kinds
	// without a callback.
	OpNamed func(name []byte) bool
}

// skips tells whether a skimming read passes over a line of kind k.
func (v *RecordVisitor) skips(k Kind, line []byte) bool {
	switch k {
	case KindMeta, KindTerminal:
		return false // one line each; the terminal says whether the trace is complete
	case KindSpanStart:
		return v.SpanStart == nil
	case KindSpanEnd:
		return v.SpanEnd == nil
	case KindOp:
		if v.Op == nil {
			return true
		}
		if v.OpNamed == nil {
			return false
		}
		name, ok := SkimOpName(line)
		return ok && !v.OpNamed(name)
	case KindDeviceInterval:
		return v.DeviceInterval == nil
	}
	return true // kinds StreamRecords hands over to no callback
}

// StreamResult says how a StreamRecords read ended.
type StreamResult struct {
	Lines      int
	Incomplete bool   // no terminal record
	CutLine    int    // the cut last line of a partial trace
	Stop       *Issue // the parse problem that ended the read early
}

// StreamRecords reads one trace from r in a single pass and hands each
// record to v. Like ExportChrome it does not judge the trace: the error is
// for I/O, for a file without a meta record first, and for a callback's
// error; a parse problem ends the read and is StreamResult.Stop.
func StreamRecords(r io.Reader, v RecordVisitor, maxLineBytes int) (*StreamResult, error) {
	st := NewStream(r, maxLineBytes)
	sawMeta, terminal := false, false
	if v.Skim {
		st.Skip = func(k Kind, line []byte) bool { return sawMeta && v.skips(k, line) }
	}
	var (
		start SpanStartRecord
		end   SpanEndRecord
		op    OpRecord
		iv    DeviceIntervalRecord
		term  TerminalRecord
	)
	for {
		k, ok := st.Next()
		if !ok {
			break
		}
		if !sawMeta && k != KindMeta {
			return nil, fmt.Errorf("line %d: the first record is %s; a trace starts with a meta record", st.Line, k)
		}
		var err error
		d := &st.Decoded
		switch k {
		case KindMeta:
			if !sawMeta && v.Meta != nil {
				err = v.Meta(d.Meta)
			}
			sawMeta = true
		case KindSpanStart:
			if v.SpanStart != nil {
				e := &d.SpanStart
				start = SpanStartRecord{ID: e.ID, Name: e.Name, Parent: e.Parent, HasParent: e.HasParent, StartNS: e.Start,
					Kind: traceformat.SpanKinds[e.SpanKind], Measured: e.Measured, TID: e.TID, HasTID: e.HasTID}
				if e.Step != StepNone {
					start.Step = traceformat.Steps[e.Step]
				}
				err = v.SpanStart(&start)
			}
		case KindSpanEnd:
			if v.SpanEnd != nil {
				e := &d.SpanEnd
				end = SpanEndRecord{ID: e.ID, DurationNS: e.Duration, TracerNS: e.Tracer, HasTracer: e.HasTracer}
				err = v.SpanEnd(&end)
			}
		case KindOp:
			if v.Op != nil {
				e := &d.Op
				op = OpRecord{SpanID: e.SpanID, Name: e.OpName, DType: e.Dtype, Device: e.Device, Output: e.Output, HasOutput: e.HasOutput,
					Shape: e.Shape, TimestampNS: e.Timestamp, DurationNS: e.Duration, InputBytes: e.InBytes}
				op.OutputBytes, op.HasOutputBytes = DenseBytes(e.OutBytes, e.HasOutBytes, e.Shape, e.Dtype)
				err = v.Op(&op)
			}
		case KindDeviceInterval:
			if v.DeviceInterval != nil {
				e := &d.DeviceInterval
				iv = DeviceIntervalRecord{SpanID: e.SpanID, Device: e.Device, StreamID: e.StreamID, ClockID: e.ClockID, Backend: e.Backend,
					Name: e.Name, StartNS: e.Start, DurationNS: e.Duration, Correlation: e.Correlation, HasCorrelation: e.HasCorrelation}
				err = v.DeviceInterval(&iv)
			}
		case KindTerminal:
			terminal = true
			if v.Terminal != nil {
				e := &d.Terminal
				term = TerminalRecord{Outcome: traceformat.Outcomes[e.Outcome], TimestampNS: e.Timestamp, Reason: e.Reason, HasReason: e.HasReason,
					TracerNS: e.Tracer, HasTracer: e.HasTracer}
				err = v.Terminal(&term)
			}
		}
		if err != nil {
			return nil, err
		}
	}
	if st.Err != nil {
		return nil, st.Err
	}
	if !sawMeta {
		if st.Stop != nil {
			return nil, fmt.Errorf("line %d: %s: %s", st.Stop.Line, st.Stop.Code, st.Stop.Message)
		}
		return nil, fmt.Errorf("no meta record: not a candle-graph trace")
	}
	return &StreamResult{Lines: st.Lines(), Incomplete: !terminal, CutLine: st.CutLine, Stop: st.Stop}, nil
}
