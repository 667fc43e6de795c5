package runner

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestVerdictOfABrokenTrace(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, content, want string
	}{
		{"not JSON", "this is no trace\n", "INVALID (invalid_json"},
		{"empty", "", "INVALID"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name+".jsonl")
			require.NoError(t, os.WriteFile(p, []byte(tc.content), 0o644))
			assert.Contains(t, Verdict(p), p+": "+tc.want)
		})
	}
	assert.Contains(t, Verdict(filepath.Join(dir, "missing.jsonl")), "unreadable")
}

// A trace of the update whose gradients went NaN is well-formed: its one
// kind of error is the finding itself, which the verdict says as such.
func TestVerdictOfNonFiniteGradients(t *testing.T) {
	p := filepath.Join("..", "report", "testdata", "bad-gradient_family_non_finite.jsonl")
	v := Verdict(p)
	assert.Contains(t, v, p+": well-formed, complete, NON-FINITE GRADIENTS in 1 family "+
		`(gradient_family_non_finite: gradient family "encoder" contains 1 non-finite gradients)`)
	assert.NotContains(t, v, "INVALID")
	// A family below its minimum for want of gradients, not for NaN ones, is
	// another error: the trace is invalid.
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	missingHead := filepath.Join(t.TempDir(), "missing-head.jsonl")
	require.NoError(t, os.WriteFile(missingHead, []byte(strings.Replace(string(b),
		`"key":"head.weight","state":"present","norm":1.25`, `"key":"head.weight","state":"missing"`, 1)), 0o644))
	assert.Contains(t, Verdict(missingHead), ": INVALID (gradient_family_non_finite")
	// A failed capture whose gradients went NaN says both.
	failed := filepath.Join(t.TempDir(), "failed.jsonl")
	require.NoError(t, os.WriteFile(failed, []byte(strings.Replace(string(b),
		`{"kind":"terminal","outcome":"complete","timestamp_ns":10000}`,
		`{"kind":"terminal","outcome":"failed","timestamp_ns":10000,"reason":"RuntimeError: out of memory"}`, 1)), 0o644))
	assert.Contains(t, Verdict(failed), ": well-formed, FAILED, NON-FINITE GRADIENTS in 1 family "+
		`(gradient_family_non_finite: gradient family "encoder" contains 1 non-finite gradients) (RuntimeError: out of memory)`)
	// Beside another error it is an invalid trace like any other.
	other := filepath.Join("..", "report", "testdata", "bad-unknown_parent.jsonl")
	assert.Contains(t, Verdict(other), ": INVALID (unknown_parent")
}

// The measured region's time in none of its spans is said where it outweighs
// every span (a slow update's stall in its data step).
func TestVerdictOfTimeInNoSpan(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "stall.jsonl")
	lines := `{"kind":"meta","schema":"candle-graph/trace/10","run_id":"r","correlation_id":"m::infer/inference-1","entrypoint":"m::infer","phase":"infer","timestamp":"2026-08-20T00:00:00.000Z","capture_step":1,"warmup_steps":0,"device":"cpu","measured_region_device_synchronized":false,"timing_mode":"host","capture_contract":{"measurement_scope":"profiled_work","operations":"none","activations":"none","tensors":"none","gradients":"none","logical_memory":"none","physical_memory":"none","device_timing":"none","required_semantic_labels":[]},"tags":{}}
{"kind":"span_start","id":"s1","name":"m::infer","start_ns":0,"span_kind":"function","measured":false,"tid":1}
{"kind":"span_start","id":"s2","parent_id":"s1","name":"update","start_ns":0,"span_kind":"function","measured":true,"tid":1}
{"kind":"span_start","id":"s3","parent_id":"s2","name":"model","start_ns":90000000,"span_kind":"module","tid":1}
{"kind":"span_end","id":"s3","duration_ns":10000000}
{"kind":"span_end","id":"s2","duration_ns":100000000}
{"kind":"span_end","id":"s1","duration_ns":100000000}
{"kind":"terminal","outcome":"complete","timestamp_ns":100000000}
`
	require.NoError(t, os.WriteFile(p, []byte(lines), 0o644))
	assert.Contains(t, Verdict(p), "valid, complete; update 100.00 ms, top span model (10.00 ms self, 10.0%), "+
		"90.00 ms (90.0%) in no span below it")
}
