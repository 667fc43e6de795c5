package events

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestElementSize(t *testing.T) {
	tests := []struct {
		dtype string
		size  uint64
		known bool
	}{
		{"u8", 1, true}, {"I8", 1, true}, {"bool", 1, true}, {"F8", 1, true},
		{"u16", 2, true}, {"i16", 2, true}, {"f16", 2, true}, {"BF16", 2, true},
		{"u32", 4, true}, {"i32", 4, true}, {"F32", 4, true}, {" f32 ", 4, true},
		{"u64", 8, true}, {"i64", 8, true}, {"f64", 8, true},
		{"f8e4m3", 0, false}, {"q4_0", 0, false}, {"", 0, false}, {"\u212a", 0, false}, {"f 32", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.dtype, func(t *testing.T) {
			size, known := ElementSize(tt.dtype)
			assert.Equal(t, tt.size, size)
			assert.Equal(t, tt.known, known)
		})
	}
}

func TestDenseBytes(t *testing.T) {
	tests := []struct {
		name    string
		shape   []uint64
		dtype   string
		bytes   uint64
		known   bool
		wantErr bool
	}{
		{"matrix f32", []uint64{2, 3}, "f32", 24, true, false},
		{"scalar f64", nil, "f64", 8, true, false},
		{"zero dim", []uint64{4, 0, 9}, "bf16", 0, true, false},
		{"unknown dtype", []uint64{2, 3}, "q8", 0, false, false},
		{"bytes overflow", []uint64{1 << 62}, "f32", 0, false, true},
		{"bytes exactly max elements u8", []uint64{math.MaxUint64}, "u8", math.MaxUint64, true, false},
		{"elements overflow unknown dtype", []uint64{1 << 32, 1 << 32}, "q8", 0, false, true},
		{"overflow then zero still refused", []uint64{1 << 40, 1 << 40, 0}, "f32", 0, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, known, err := DenseBytes(tt.shape, tt.dtype)
			if tt.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.bytes, b)
			assert.Equal(t, tt.known, known)
		})
	}
}

func TestOpValidate(t *testing.T) {
	good := func() Op {
		return Op{OpName: "matmul", Dtype: "f32", Device: "cpu", Inputs: []string{"t0"}, Shape: []uint64{2, 3}, DurationNs: 1, TimestampNs: 1}
	}
	tests := []struct {
		name   string
		mutate func(*Op)
		want   string
	}{
		{"good", func(*Op) {}, ""},
		{"empty op_name", func(o *Op) { o.OpName = "" }, `op: "op_name" must not be empty`},
		{"blank dtype", func(o *Op) { o.Dtype = " " }, `op: "dtype" must not be empty`},
		{"empty device", func(o *Op) { o.Device = "" }, `op: "device" must not be empty`},
		{"invalid UTF-8 device", func(o *Op) { o.Device = "cu\xffda" }, `op: "device" must be valid UTF-8`},
		{"empty input", func(o *Op) { o.Inputs = []string{"t0", ""} }, `op: "inputs[1]" must not be empty`},
		{"empty output", func(o *Op) { o.HasOutput = true }, `op: "output" must not be empty`},
		{"overflowing shape", func(o *Op) { o.Shape = []uint64{1 << 40, 1 << 40} }, `op: "shape"`},
		{"end overflows", func(o *Op) { o.TimestampNs = math.MaxUint64 }, `"timestamp_ns" + "duration_ns" overflows`},
		// Issue 14, defect 7: through Go no string had a bound, and a 64 MiB one made a
		// trace line the readers refuse.
		{"op_name of 1 MiB", func(o *Op) { o.OpName = strings.Repeat("a", MaxStringBytes) }, ""},
		{"op_name of 1 MiB + 1", func(o *Op) { o.OpName = strings.Repeat("a", MaxStringBytes+1) },
			`op: "op_name" is longer than 1 MiB (1048577 bytes)`},
		{"64 MiB op_name", func(o *Op) { o.OpName = strings.Repeat("a", 64<<20) }, `op: "op_name" is longer than 1 MiB (67108864 bytes)`},
		{"input of 1 MiB + 1", func(o *Op) { o.Inputs = []string{"t0", strings.Repeat("b", MaxStringBytes+1)} },
			`op: "inputs[1]" is longer than 1 MiB (1048577 bytes)`},
		{"strings of 8 MiB together", func(o *Op) { o.Inputs = inputsOf(MaxRecordStringBytes - len("matmulf32cpu")) }, ""},
		{"strings of 8 MiB + 1 together", func(o *Op) { o.Inputs = inputsOf(MaxRecordStringBytes - len("matmulf32cpu") + 1) },
			"op: its strings are 8388609 bytes together, more than the 8 MiB one record may carry"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := good()
			tt.mutate(&o)
			err := o.Validate()
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

// inputsOf is op inputs of total bytes together, none longer than MaxStringBytes.
func inputsOf(total int) []string {
	var ins []string
	for total > 0 {
		n := min(total, MaxStringBytes)
		ins = append(ins, strings.Repeat("i", n))
		total -= n
	}
	return ins
}

// The bound on a record's strings keeps its line within what the trace
// readers take, however the strings escape (at most 6 bytes a byte).
func TestRecordStringBoundFitsALine(t *testing.T) {
	o := Op{OpName: "m", Dtype: "f32", Device: "cpu", Shape: []uint64{1}, DurationNs: 1, TimestampNs: 1}
	for left := MaxRecordStringBytes - len("mf32cpu"); left > 0; left -= MaxStringBytes {
		o.Inputs = append(o.Inputs, strings.Repeat("\x01", min(left, MaxStringBytes))) // escapes to \u0001
	}
	require.NoError(t, o.Validate())
	line := AppendOp(nil, &o)
	assert.Greater(t, len(line), 5*MaxRecordStringBytes, "the worst escaping")
	assert.LessOrEqual(t, len(line), 64<<20, "internal/report/trace's DefaultMaxLineBytes")
}

func TestOpValidateDerivesDenseBytes(t *testing.T) {
	tests := []struct {
		name      string
		op        Op
		wantBytes uint64
		wantHas   bool
	}{
		{"derived from f32", Op{OpName: "a", Dtype: "F32", Device: "cpu", Shape: []uint64{2, 3}}, 24, true},
		{"explicit kept", Op{OpName: "a", Dtype: "f32", Device: "cpu", Shape: []uint64{2, 3}, OutputDenseBytes: 7, HasOutputDenseBytes: true}, 7, true},
		{"unknown dtype stays absent", Op{OpName: "a", Dtype: "q4", Device: "cpu", Shape: []uint64{2, 3}}, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.NoError(t, tt.op.Validate())
			assert.Equal(t, tt.wantBytes, tt.op.OutputDenseBytes)
			assert.Equal(t, tt.wantHas, tt.op.HasOutputDenseBytes)
		})
	}
}

func TestTensorValidate(t *testing.T) {
	good := func() Tensor { return Tensor{TensorID: "t2", Dtype: "bf16", Device: "cuda:0", Shape: []uint64{4}} }
	tests := []struct {
		name   string
		mutate func(*Tensor)
		want   string
	}{
		{"good", func(*Tensor) {}, ""},
		{"empty tensor_id", func(x *Tensor) { x.TensorID = "" }, `tensor: "tensor_id" must not be empty`},
		{"empty dtype", func(x *Tensor) { x.Dtype = "" }, `tensor: "dtype" must not be empty`},
		{"empty device", func(x *Tensor) { x.Device = "\n" }, `tensor: "device" must not be empty`},
		{"invalid label", func(x *Tensor) { x.Label = "\xc3" }, `tensor: "label" must be valid UTF-8`},
		{"bad category", func(x *Tensor) { x.Category = 9 }, `tensor: "category" must be one of`},
		{"overflow", func(x *Tensor) { x.Shape = []uint64{math.MaxUint64, 2} }, `tensor: "shape"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := good()
			tt.mutate(&x)
			err := x.Validate()
			if tt.want == "" {
				require.NoError(t, err)
				assert.True(t, x.HasDenseBytes)
				assert.Equal(t, uint64(8), x.DenseBytes, "4 bf16 elements")
				return
			}
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func TestTensorStatsValidate(t *testing.T) {
	good := func() TensorStats {
		return TensorStats{Label: "out", Dtype: "f32", Shape: []uint64{2, 3}, Elements: 6, NonFinite: 0, RMS: 1.5, AbsMax: 3, Mean: -0.25}
	}
	tests := []struct {
		name   string
		mutate func(*TensorStats)
		want   string
	}{
		{"good", func(*TensorStats) {}, ""},
		{"scalar", func(s *TensorStats) { s.Shape, s.Elements = nil, 1 }, ""},
		{"all non-finite", func(s *TensorStats) { s.NonFinite, s.RMS, s.AbsMax, s.Mean = 6, 0, 0, 0 }, ""},
		{"blank label", func(s *TensorStats) { s.Label = "  " }, `tensor_stats: "label" must not be empty`},
		{"empty dtype", func(s *TensorStats) { s.Dtype = "" }, `tensor_stats: "dtype" must not be empty`},
		{"elements mismatch", func(s *TensorStats) { s.Elements = 5 }, `"elements" must equal the product of "shape" [2 3] (6), got 5`},
		{"scalar elements 0", func(s *TensorStats) { s.Shape, s.Elements = []uint64{}, 0 }, `"elements" must equal the product`},
		{"shape overflow", func(s *TensorStats) { s.Shape = []uint64{1 << 32, 1 << 32} }, `tensor_stats: "shape"`},
		{"non_finite above elements", func(s *TensorStats) { s.NonFinite = 7 }, `"non_finite" (7) must not exceed "elements" (6)`},
		{"negative rms", func(s *TensorStats) { s.RMS = -1 }, `"rms" must be >= 0`},
		{"NaN rms", func(s *TensorStats) { s.RMS = math.NaN() }, `"rms" must be finite`},
		{"inf abs_max", func(s *TensorStats) { s.AbsMax = math.Inf(1) }, `"abs_max" must be finite`},
		{"negative abs_max", func(s *TensorStats) { s.AbsMax = -0.5 }, `"abs_max" must be >= 0`},
		{"NaN mean", func(s *TensorStats) { s.Mean = math.NaN() }, `"mean" must be finite`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := good()
			tt.mutate(&s)
			err := s.Validate()
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func TestMemoryValidate(t *testing.T) {
	good := func() Memory {
		return Memory{StorageID: "s", TensorID: "t", Device: "cpu", Dtype: "f32", Bytes: 4, Shape: []uint64{1}}
	}
	tests := []struct {
		name   string
		mutate func(*Memory)
		want   string
	}{
		{"good", func(*Memory) {}, ""},
		{"free", func(m *Memory) { m.Action = MemoryFree }, ""},
		{"empty storage", func(m *Memory) { m.StorageID = "" }, `memory: "storage_id" must not be empty`},
		{"empty tensor", func(m *Memory) { m.TensorID = "" }, `memory: "tensor_id" must not be empty`},
		{"empty device", func(m *Memory) { m.Device = "" }, `memory: "device" must not be empty`},
		{"empty dtype", func(m *Memory) { m.Dtype = "" }, `memory: "dtype" must not be empty`},
		{"invalid op_name", func(m *Memory) { m.OpName = "\xff" }, `memory: "op_name" must be valid UTF-8`},
		{"bad action", func(m *Memory) { m.Action = 2 }, `memory: "action" must be alloc or free`},
		{"bad category", func(m *Memory) { m.Category = 5 }, `memory: "category"`},
		{"overflow", func(m *Memory) { m.Shape = []uint64{1 << 63, 2} }, `memory: "shape"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := good()
			tt.mutate(&m)
			err := m.Validate()
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func TestDeviceMemoryValidate(t *testing.T) {
	tests := []struct {
		name string
		in   DeviceMemory
		want string
	}{
		{"used only", DeviceMemory{Device: "cuda:0", HasUsed: true}, ""},
		{"capacity only", DeviceMemory{Device: "cuda:0", HasCapacity: true}, ""},
		{"with extras", DeviceMemory{Device: "cuda:0", HasFree: true, Extra: map[string]float64{"power_w": 1}}, ""},
		{"no values", DeviceMemory{Device: "cuda:0", Used: 5}, `device_memory: at least one of "used_bytes"`},
		{"empty device", DeviceMemory{HasReserved: true}, `device_memory: "device" must not be empty`},
		{"NaN extra", DeviceMemory{Device: "d", HasUsed: true, Extra: map[string]float64{"util": math.NaN()}}, `device_memory: "extra.util" must be finite`},
		{"empty extra key", DeviceMemory{Device: "d", HasUsed: true, Extra: map[string]float64{"": 1}}, `device_memory: "extra key" must not be empty`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.in.Validate()
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func TestDeviceIntervalValidate(t *testing.T) {
	good := func() DeviceInterval {
		return DeviceInterval{Device: "cuda:0", StreamID: "7", ClockID: "host-monotonic", Backend: "cupti", StartNs: 5, DurationNs: 1}
	}
	tests := []struct {
		name   string
		mutate func(*DeviceInterval)
		want   string
	}{
		{"good", func(*DeviceInterval) {}, ""},
		{"zero duration", func(d *DeviceInterval) { d.DurationNs = 0 }, `device_interval: "duration_ns" must be > 0`},
		{"empty stream", func(d *DeviceInterval) { d.StreamID = "" }, `device_interval: "stream_id" must not be empty`},
		{"empty clock", func(d *DeviceInterval) { d.ClockID = "" }, `device_interval: "clock_id" must not be empty`},
		{"empty backend", func(d *DeviceInterval) { d.Backend = "" }, `device_interval: "backend" must not be empty`},
		{"empty device", func(d *DeviceInterval) { d.Device = "" }, `device_interval: "device" must not be empty`},
		{"invalid name", func(d *DeviceInterval) { d.Name = "\xff" }, `device_interval: "name" must be valid UTF-8`},
		{"end overflows", func(d *DeviceInterval) { d.StartNs = math.MaxUint64 }, `overflows u64`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := good()
			tt.mutate(&d)
			err := d.Validate()
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func TestValidateGradient(t *testing.T) {
	tests := []struct {
		name      string
		root, key string
		state     GradientState
		norm      float64
		hasNorm   bool
		want      string
	}{
		{"present", "vb", "w", GradientPresent, 0.3, true, ""},
		{"zero", "vb", "w", GradientZero, 0, true, ""},
		{"missing", "vb", "w", GradientMissing, 0, false, ""},
		{"non_finite", "vb", "w", GradientNonFinite, 0, false, ""},
		{"present without norm", "vb", "w", GradientPresent, 0, false, `state present needs a "norm"`},
		{"present zero norm", "vb", "w", GradientPresent, 0, true, `finite "norm" > 0, got 0`},
		{"present negative norm", "vb", "w", GradientPresent, -1, true, `finite "norm" > 0`},
		{"present NaN norm", "vb", "w", GradientPresent, math.NaN(), true, `finite "norm" > 0`},
		{"present inf norm", "vb", "w", GradientPresent, math.Inf(1), true, `finite "norm" > 0`},
		{"zero negative zero", "vb", "w", GradientZero, math.Copysign(0, -1), true, `state zero needs "norm" exactly +0.0`},
		{"zero nonzero norm", "vb", "w", GradientZero, 1e-30, true, `exactly +0.0`},
		{"zero without norm", "vb", "w", GradientZero, 0, false, `exactly +0.0`},
		{"missing with norm", "vb", "w", GradientMissing, 0, true, `state missing must not carry a "norm"`},
		{"non_finite with norm", "vb", "w", GradientNonFinite, 1, true, `state non_finite must not carry a "norm"`},
		{"bad state", "vb", "w", GradientState(4), 0, false, `"state" must be one of`},
		{"blank root", " ", "w", GradientPresent, 1, true, `gradient: "root" must not be empty`},
		{"empty key", "vb", "", GradientPresent, 1, true, `gradient: "key" must not be empty`},
		{"invalid key", "vb", "\xff", GradientPresent, 1, true, `gradient: "key" must be valid UTF-8`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateGradient(tt.root, tt.key, tt.state, tt.norm, tt.hasNorm)
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func TestValidateSmallRecords(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"data edge ok", ValidateDataEdge("t0", "t1"), ""},
		{"data edge empty from", ValidateDataEdge("", "t1"), `edge: "from_tensor" must not be empty`},
		{"data edge blank to", ValidateDataEdge("t0", " "), `edge: "to_tensor" must not be empty`},
		{"terminal complete", ValidateTerminal(true, ""), ""},
		{"terminal complete with reason", ValidateTerminal(true, "x"), `complete outcome must not carry a "reason"`},
		{"terminal failed", ValidateTerminal(false, "oom"), ""},
		{"terminal failed blank", ValidateTerminal(false, " "), `terminal: "reason" must not be empty`},
		{"span name ok", ValidateSpanName("fwd"), ""},
		{"span name empty", ValidateSpanName(""), `span: "name" must not be empty`},
		{"span name invalid", ValidateSpanName("\xff"), `span: "name" must be valid UTF-8`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.want == "" {
				assert.NoError(t, tt.err)
				return
			}
			assert.ErrorContains(t, tt.err, tt.want)
		})
	}
}

func TestNilRecords(t *testing.T) {
	// A nil record is a caller bug; it must be an error, never a panic.
	assert.ErrorContains(t, (*Op)(nil).Validate(), "op: record is nil")
	assert.ErrorContains(t, (*Tensor)(nil).Validate(), "tensor: record is nil")
	assert.ErrorContains(t, (*TensorStats)(nil).Validate(), "tensor_stats: record is nil")
	assert.ErrorContains(t, (*Memory)(nil).Validate(), "memory: record is nil")
	assert.ErrorContains(t, (*DeviceMemory)(nil).Validate(), "device_memory: record is nil")
	assert.ErrorContains(t, (*DeviceInterval)(nil).Validate(), "device_interval: record is nil")
	b := []byte("keep")
	assert.Equal(t, "keep", string(AppendOp(b, nil)))
	assert.Equal(t, "keep", string(AppendTensor(b, nil)))
	assert.Equal(t, "keep", string(AppendTensorStats(b, nil)))
	assert.Equal(t, "keep", string(AppendMemory(b, nil)))
	assert.Equal(t, "keep", string(AppendDeviceMemory(b, nil)))
	assert.Equal(t, "keep", string(AppendDeviceInterval(b, nil)))
}
