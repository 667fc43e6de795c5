package trace

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestScanObject(t *testing.T) {
	deep := func(n int) string { return `{"a":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}` }
	tests := []struct {
		name    string
		in      string
		cut     bool // ends inside a value
		invalid bool
	}{
		{"empty object", `{}`, false, false},
		{"whitespace inside", " {\t\"a\" :\r1 , \"b\":[ ] }\n", false, false},
		{"all value kinds", `{"s":"x","n":-1.5e-3,"t":true,"f":false,"z":null,"a":[1,{"b":[]}],"o":{}}`, false, false},
		{"escapes", `{"s":"\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00"}`, false, false},
		{"tiny float underflows to zero", `{"n":1e-400}`, false, false},
		{"integer past u64 is a float", `{"n":18446744073709551616}`, false, false},
		{"largest finite float", `{"n":1.7976931348623157e308}`, false, false},
		{"nesting at the limit", deep(maxJSONDepth - 1), false, false},
		{"nesting past the limit", deep(maxJSONDepth), false, true},
		{"float overflow", `{"n":2e308}`, false, true},
		{"negative float overflow", `{"n":-1e400}`, false, true},
		{"lone leading surrogate", `{"s":"\ud800x"}`, false, true},
		{"lone trailing surrogate", `{"s":"\udc00"}`, false, true},
		{"leading surrogate then other escape", `{"s":"\ud800\u0041"}`, false, true},
		{"control character", "{\"s\":\"a\x01\"}", false, true},
		{"raw tab in string", "{\"s\":\"a\tb\"}", false, true},
		{"bad escape", `{"s":"\x"}`, false, true},
		{"leading zero", `{"n":01}`, false, true},
		{"bare minus", `{"n":-}`, false, true},
		{"trailing dot", `{"n":1.}`, false, true},
		{"plus sign", `{"n":+1}`, false, true},
		{"NaN", `{"n":NaN}`, false, true},
		{"trailing comma", `{"a":1,}`, false, true},
		{"trailing characters", `{"a":1} x`, false, true},
		{"two objects", `{}{}`, false, true},
		{"not an object", `[1]`, false, true},
		{"single quotes", `{'a':1}`, false, true},
		{"cut in key", `{"ki`, true, false},
		{"cut after colon", `{"kind":`, true, false},
		{"cut in number", `{"n":12`, true, false},
		{"cut in exponent", `{"n":1e`, true, false},
		{"cut in literal", `{"t":tr`, true, false},
		{"cut in array", `{"a":[1,2`, true, false},
		{"cut in escape", `{"s":"\u00`, true, false},
		{"cut between surrogates", `{"s":"\ud83d`, true, false},
		{"empty", ``, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var sc jsonScanner
			_, err := sc.scanObject([]byte(tc.in), nil)
			switch {
			case tc.cut:
				assert.ErrorIs(t, err, errJSONEnd)
			case tc.invalid:
				var se *jsonSyntaxError
				assert.True(t, errors.As(err, &se), "want a syntax error, got %v", err)
			default:
				assert.NoError(t, err)
			}
		})
	}
}

func TestScanDecodesStrings(t *testing.T) {
	var sc jsonScanner
	ms, err := sc.scanObject([]byte(`{"k\u0069nd":"a\nb\u00e9\ud83d\ude00","plain":"x"}`), nil)
	require.NoError(t, err)
	require.Len(t, ms, 2)
	assert.Equal(t, "kind", string(ms[0].key))
	assert.Equal(t, "a\nbé😀", string(ms[0].val.raw))
	assert.Equal(t, "x", string(ms[1].val.raw))
}

func TestParseU64(t *testing.T) {
	tests := []struct {
		lit  string
		want uint64
		ok   bool
	}{
		{"0", 0, true},
		{"300", 300, true},
		{"18446744073709551615", math.MaxUint64, true},
		{"18446744073709551616", 0, false},
		{"300.0", 0, false},
		{"3e2", 0, false},
		{"-1", 0, false},
		{"-0", 0, false},
		{"", 0, false},
	}
	for _, tc := range tests {
		got, ok := ParseU64([]byte(tc.lit))
		assert.Equal(t, tc.ok, ok, tc.lit)
		assert.Equal(t, tc.want, got, tc.lit)
	}
}

func TestDecodeEvents(t *testing.T) {
	tests := []struct {
		name string
		line string
		code string // "" when the line decodes
	}{
		{"span_start minimal", `{"kind":"span_start","id":"s1","name":"n","start_ns":0,"span_kind":"op"}`, ""},
		{"enum as one-key map", `{"kind":"span_start","id":"s1","name":"n","start_ns":0,"span_kind":{"op":null}}`, ""},
		{"enum as one-key map with empty object", `{"kind":"span_start","id":"s1","name":"n","start_ns":0,"span_kind":{"op":{}}}`, ""},
		{"enum map with a value", `{"kind":"span_start","id":"s1","name":"n","start_ns":0,"span_kind":{"op":[]}}`, CodeWrongType},
		{"enum wrong case", `{"kind":"span_start","id":"s1","name":"n","start_ns":0,"span_kind":"Op"}`, CodeUnknownVariant},
		{"optional null", `{"kind":"span_start","id":"s1","name":"n","start_ns":0,"span_kind":"op","parent_id":null,"step":null}`, ""},
		{"defaulted null", `{"kind":"span_start","id":"s1","name":"n","start_ns":0,"span_kind":"op","measured":null}`, CodeNullField},
		{"required null", `{"kind":"span_end","id":null}`, CodeNullField},
		{"unknown fields repeat freely", `{"kind":"span_end","id":"s1","x":1,"x":2}`, ""},
		{"known field repeats", `{"kind":"span_end","id":"s1","id":"s1"}`, CodeDuplicateKey},
		{"known field repeats after null", `{"kind":"span_start","id":"s1","name":"n","start_ns":0,"span_kind":"op","step":"forward","step":null}`, CodeDuplicateKey},
		{"kind repeats", `{"kind":"span_end","kind":"span_end","id":"s1"}`, CodeDuplicateKey},
		{"missing kind", `{"id":"s1"}`, CodeMissingKind},
		{"unknown kind", `{"kind":"spam","id":"s1"}`, CodeUnknownKind},
		{"missing required", `{"kind":"op","span_id":"s","op_name":"o","shape":[],"dtype":"f32","device":"cpu","duration_ns":1}`, CodeMissingField},
		{"shape float", `{"kind":"op","span_id":"s","op_name":"o","shape":[1.0],"dtype":"f32","device":"cpu","duration_ns":1,"input_dense_bytes":0}`, CodeWrongType},
		{"inputs not strings", `{"kind":"op","span_id":"s","op_name":"o","shape":[],"dtype":"f32","device":"cpu","duration_ns":1,"input_dense_bytes":0,"inputs":[1]}`, CodeWrongType},
		{"edge without edge_kind", `{"kind":"edge","from_span":"a","to_span":"b","host_duration_ns":1}`, CodeMissingField},
		{"edge unknown edge_kind", `{"kind":"edge","edge_kind":"flow","from_span":"a","to_span":"b"}`, CodeUnknownVariant},
		{"data edge ignores call fields", `{"kind":"edge","edge_kind":"data","from_tensor":"a","to_tensor":"b","host_duration_ns":"x"}`, ""},
		{"gradient norm integer", `{"kind":"gradient","event_id":"g","root":"r","key":"k","state":"present","norm":1}`, ""},
		{"our interval name may be anything", `{"kind":"device_interval","span_id":"s","device":"d","stream_id":"0","clock_id":"c","backend":"b","start_ns":0,"duration_ns":1,"name":7}`, ""},
		{"tags duplicate keys", `{"kind":"meta","schema":"candle-graph/trace/10","run_id":"r","correlation_id":"c","entrypoint":"e","phase":"infer","timestamp":"t","capture_step":1,"warmup_steps":0,"device":"cpu","timing_mode":"host","capture_contract":{"measurement_scope":"unknown","operations":"none","logical_memory":"none","physical_memory":"none","device_timing":"none"},"tags":{"a":"1","a":"2"}}`, ""},
		{"meta without tags", `{"kind":"meta","schema":"candle-graph/trace/10","run_id":"r","correlation_id":"c","entrypoint":"e","phase":"infer","timestamp":"t","capture_step":1,"warmup_steps":0,"device":"cpu","timing_mode":"host","capture_contract":{"measurement_scope":"unknown","operations":"none","logical_memory":"none","physical_memory":"none","device_timing":"none"}}`, CodeMissingField},
		{"contract field repeats", `{"kind":"meta","schema":"candle-graph/trace/10","run_id":"r","correlation_id":"c","entrypoint":"e","phase":"infer","timestamp":"t","capture_step":1,"warmup_steps":0,"device":"cpu","timing_mode":"host","capture_contract":{"measurement_scope":"unknown","operations":"none","operations":"none","logical_memory":"none","physical_memory":"none","device_timing":"none"},"tags":{}}`, CodeDuplicateKey},
		{"our producer may be malformed", `{"kind":"meta","schema":"candle-graph/trace/10","run_id":"r","correlation_id":"c","entrypoint":"e","phase":"infer","timestamp":"t","capture_step":1,"warmup_steps":0,"device":"cpu","timing_mode":"host","capture_contract":{"measurement_scope":"unknown","operations":"none","logical_memory":"none","physical_memory":"none","device_timing":"none"},"tags":{},"producer":[1]}`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var d Decoder
			_, err := d.Decode([]byte(tc.line))
			if tc.code == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Equal(t, tc.code, codeOf(err), err.Error())
		})
	}
}

func TestDecodedValues(t *testing.T) {
	var d Decoder
	k, err := d.Decode([]byte(`{"kind":"op","span_id":"s3","op_name":"matmul","inputs":["t0","t1"],"output":"t2","shape":[2,3],"dtype":"BF16","device":"cpu","duration_ns":300,"timestamp_ns":250,"input_dense_bytes":48}`))
	require.NoError(t, err)
	require.Equal(t, KindOp, k)
	op := &d.Op
	assert.Equal(t, "s3", string(op.SpanID))
	assert.Equal(t, []uint64{2, 3}, op.Shape)
	assert.Len(t, op.Inputs, 2)
	assert.Equal(t, uint64(300), op.Duration)
	assert.False(t, op.HasOutBytes)
	out, ok := DenseBytes(op.OutBytes, op.HasOutBytes, op.Shape, op.Dtype)
	assert.True(t, ok)
	assert.Equal(t, uint64(12), out, "2×3 bf16 elements, dtype matched case-insensitively")

	_, err = d.Decode([]byte(`{"kind":"gradient","event_id":"g","root":"r","key":"k","state":"zero","norm":-0.0}`))
	require.NoError(t, err)
	assert.True(t, math.Signbit(d.Gradient.Norm), "-0.0 keeps its sign, as in serde_json")
}

func TestManifestDigestTestVector(t *testing.T) {
	got := ManifestDigest([]ExpectedGradient{{Root: "vb", Key: "encoder.weight", Family: "encoder"}, {Root: "vb", Key: "head.weight", Family: "head"}})
	assert.Equal(t, "sha256:1d8756f5fd6fb937fc1202b4f227989b2446f96965688cadae91572f7d930c1f", got)
}

func TestTrimSpaceMatchesRust(t *testing.T) {
	assert.Equal(t, "x", string(TrimSpace([]byte("\u00a0\u3000 x\t\u2028"))))
	assert.Equal(t, "\u200bx", string(TrimSpace([]byte("\u200bx"))), "zero-width space is not White_Space")
	assert.Equal(t, "\ufeffx", string(TrimSpace([]byte("\ufeffx"))), "BOM is not White_Space")
}
