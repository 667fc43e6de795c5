package events

import (
	"encoding/json"
	"testing"

	gojson "github.com/goccy/go-json"
)

// The same events through a reflection-based encoder (goccy/go-json, one of the fastest),
// so the cost of the hand-written appenders can be read as a ratio.

type spanStartJSON struct {
	Kind     string `json:"kind"`
	ID       string `json:"id"`
	ParentID string `json:"parent_id,omitempty"`
	Name     string `json:"name"`
	StartNs  uint64 `json:"start_ns"`
	SpanKind string `json:"span_kind"`
	Measured bool   `json:"measured,omitempty"`
	Step     string `json:"step,omitempty"`
	Tid      int64  `json:"tid,omitempty"`
}

type opJSON struct {
	Kind             string   `json:"kind"`
	SpanID           string   `json:"span_id"`
	OpName           string   `json:"op_name"`
	Inputs           []string `json:"inputs"`
	Output           *string  `json:"output,omitempty"`
	Shape            []uint64 `json:"shape"`
	Dtype            string   `json:"dtype"`
	Device           string   `json:"device"`
	DurationNs       uint64   `json:"duration_ns"`
	TimestampNs      uint64   `json:"timestamp_ns"`
	OutputDenseBytes *uint64  `json:"output_dense_bytes,omitempty"`
	InputDenseBytes  uint64   `json:"input_dense_bytes"`
}

var benchOp = Op{SpanID: 42, OpName: "matmul", Dtype: "f32", Device: "cuda:0", Inputs: []string{"t0", "t1"}, Output: "t2", HasOutput: true,
	Shape: []uint64{128, 4096}, DurationNs: 123456, TimestampNs: 987654321, OutputDenseBytes: 2097152, HasOutputDenseBytes: true, InputDenseBytes: 4194304}

func BenchmarkAppendSpanStart(b *testing.B) {
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 4096)
		for i := 0; i < b.N; i++ {
			buf = AppendSpanStart(buf[:0], 1234, 17, "model/encoder/layer.3/attention", 987654321, SpanModule, false, StepForward, 31337)
		}
	})
	ev := spanStartJSON{Kind: "span_start", ID: "s1234", ParentID: "s17", Name: "model/encoder/layer.3/attention", StartNs: 987654321,
		SpanKind: "module", Step: "forward", Tid: 31337}
	b.Run("goccy", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 4096)
		for i := 0; i < b.N; i++ {
			out, err := gojson.Marshal(&ev)
			if err != nil {
				b.Fatal(err)
			}
			buf = append(append(buf[:0], out...), '\n')
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 4096)
		for i := 0; i < b.N; i++ {
			out, err := json.Marshal(&ev)
			if err != nil {
				b.Fatal(err)
			}
			buf = append(append(buf[:0], out...), '\n')
		}
	})
}

func BenchmarkAppendOp(b *testing.B) {
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 4096)
		for i := 0; i < b.N; i++ {
			buf = AppendOp(buf[:0], &benchOp)
		}
	})
	out, dense := benchOp.Output, benchOp.OutputDenseBytes
	ev := opJSON{Kind: "op", SpanID: "s42", OpName: benchOp.OpName, Inputs: benchOp.Inputs, Output: &out, Shape: benchOp.Shape,
		Dtype: benchOp.Dtype, Device: benchOp.Device, DurationNs: benchOp.DurationNs, TimestampNs: benchOp.TimestampNs,
		OutputDenseBytes: &dense, InputDenseBytes: benchOp.InputDenseBytes}
	b.Run("goccy", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 4096)
		for i := 0; i < b.N; i++ {
			o, err := gojson.Marshal(&ev)
			if err != nil {
				b.Fatal(err)
			}
			buf = append(append(buf[:0], o...), '\n')
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 4096)
		for i := 0; i < b.N; i++ {
			o, err := json.Marshal(&ev)
			if err != nil {
				b.Fatal(err)
			}
			buf = append(append(buf[:0], o...), '\n')
		}
	})
}

// TestBenchmarkEventsMatch keeps the comparison honest: both encoders must write the same
// object, or the ratio compares different work.
func TestBenchmarkEventsMatch(t *testing.T) {
	out, dense := benchOp.Output, benchOp.OutputDenseBytes
	ev := opJSON{Kind: "op", SpanID: "s42", OpName: benchOp.OpName, Inputs: benchOp.Inputs, Output: &out, Shape: benchOp.Shape,
		Dtype: benchOp.Dtype, Device: benchOp.Device, DurationNs: benchOp.DurationNs, TimestampNs: benchOp.TimestampNs,
		OutputDenseBytes: &dense, InputDenseBytes: benchOp.InputDenseBytes}
	g, err := gojson.Marshal(&ev)
	if err != nil {
		t.Fatal(err)
	}
	hand := AppendOp(nil, &benchOp)
	if string(g)+"\n" != string(hand) {
		t.Fatalf("op differs:\ngoccy %s\nhand  %s", g, hand)
	}
	sev := spanStartJSON{Kind: "span_start", ID: "s1234", ParentID: "s17", Name: "model/encoder/layer.3/attention", StartNs: 987654321,
		SpanKind: "module", Step: "forward", Tid: 31337}
	g, err = gojson.Marshal(&sev)
	if err != nil {
		t.Fatal(err)
	}
	hand = AppendSpanStart(nil, 1234, 17, "model/encoder/layer.3/attention", 987654321, SpanModule, false, StepForward, 31337)
	if string(g)+"\n" != string(hand) {
		t.Fatalf("span_start differs:\ngoccy %s\nhand  %s", g, hand)
	}
}

// The drainer's span lines: AppendSpanStart + AppendSpanEnd, against the
// same lines from cached pieces (spanlines.go) as the drainer builds them.
func BenchmarkSpanPairLines(b *testing.B) {
	const name = "layer/forward"
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 4096)
		for i := 0; i < b.N; i++ {
			id := uint64(1000 + i)
			buf = AppendSpanStart(buf[:0], id, 17, name, 987654321+uint64(i)*40, SpanFunction, false, StepNone, 31337)
			buf = AppendSpanEnd(buf, id, 430)
		}
	})
	b.Run("pieces", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 4096)
		parent := RefOf(17)
		quoted := AppendName(nil, []byte(name))
		var tail StartTail
		for i := 0; i < b.N; i++ {
			ref := RefOf(uint64(1000 + i))
			buf = AppendSpanStartRef(buf[:0], &ref, &parent, quoted, 987654321+uint64(i)*40, tail.For(SpanFunction, false, StepNone, 31337))
			buf = AppendSpanEndRef(buf, &ref, 430)
		}
	})
}
