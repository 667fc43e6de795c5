package cli

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func corpus(name string) string { return filepath.Join("..", "testdata", name) }

func run(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestValidateExitCodes(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want int
		out  []string
	}{
		{"valid", []string{"validate", corpus("valid-train.jsonl")}, ExitOK, []string{"valid-train.jsonl: OK (structurally valid, outcome complete; 0 errors, 0 warnings; 41 lines"}},
		{"warnings pass", []string{"validate", corpus("warn-retained_allocations.jsonl")}, ExitOK, []string{"warning retained_allocations"}},
		{"broken", []string{"validate", corpus("bad-unknown_span.jsonl")}, ExitProblem, []string{"FAIL", "line 6: error unknown_span: tensor evidence refers to missing span `s7`"}},
		{"partial fails by default", []string{"validate", corpus("partial-cut-line.jsonl")}, ExitProblem, []string{"incomplete, cut at line 34", "warning trace_incomplete"}},
		{"partial passes when allowed", []string{"validate", "--allow-partial", corpus("partial-cut-line.jsonl")}, ExitOK, []string{"OK (structurally valid, incomplete, cut at line 34"}},
		{"flag after the trace", []string{"validate", corpus("partial-no-terminal.jsonl"), "--allow-partial"}, ExitOK, nil},
		{"failed passes when partial allowed", []string{"validate", "--allow-partial", corpus("failed-capture_failed.jsonl")}, ExitOK, []string{"outcome failed"}},
		{"broken partial never passes", []string{"validate", "--allow-partial", corpus("bad-unknown_parent-partial.jsonl")}, ExitProblem, nil},
		{"one bad among several", []string{"validate", corpus("valid-infer.jsonl"), corpus("bad-duplicate_key.jsonl")}, ExitProblem, []string{"valid-infer.jsonl: OK", "bad-duplicate_key.jsonl: FAIL", "line 3: error duplicate_key"}},
		{"missing file", []string{"validate", corpus("no-such.jsonl")}, ExitProblem, []string{"no-such.jsonl: FAIL (open"}},
		{"no trace", []string{"validate"}, ExitUsage, nil},
		{"unknown flag", []string{"validate", "--strict", corpus("valid-infer.jsonl")}, ExitUsage, nil},
		{"unknown command", []string{"frobnicate"}, ExitUsage, nil},
		{"no command", nil, ExitUsage, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, _ := run(tc.args...)
			assert.Equal(t, tc.want, code, out)
			for _, s := range tc.out {
				assert.Contains(t, out, s)
			}
		})
	}
}

func TestValidateJSON(t *testing.T) {
	code, out, _ := run("validate", "--json", corpus("valid-infer.jsonl"), corpus("bad-span_cycle.jsonl"))
	assert.Equal(t, ExitProblem, code)
	var doc struct {
		OK     bool
		Traces []struct {
			Path   string
			OK     bool
			Health struct {
				StructurallyValid bool `json:"structurally_valid"`
				CaptureComplete   bool `json:"capture_complete"`
				Issues            []struct {
					Severity, Code string
					Line           int
				}
			}
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	assert.False(t, doc.OK)
	require.Len(t, doc.Traces, 2)
	assert.True(t, doc.Traces[0].OK)
	assert.Empty(t, doc.Traces[0].Health.Issues)
	assert.False(t, doc.Traces[1].OK)
	assert.False(t, doc.Traces[1].Health.StructurallyValid)
	require.NotEmpty(t, doc.Traces[1].Health.Issues)
	assert.Equal(t, "span_cycle", doc.Traces[1].Health.Issues[0].Code)
	assert.Equal(t, 5, doc.Traces[1].Health.Issues[0].Line)
}

func TestReport(t *testing.T) {
	code, out, _ := run("report", corpus("valid-train.jsonl"))
	assert.Equal(t, ExitOK, code)
	for _, s := range []string{"Spans by name", "train/backward", "Ops by name", "matmul_backward", "peak live 1.5 KiB", "Overhead analysis", "hypothesis:"} {
		assert.Contains(t, out, s)
	}

	code, out, _ = run("report", "--json", corpus("valid-train.jsonl"))
	require.Equal(t, ExitOK, code)
	var doc struct {
		Path string
		Meta struct {
			RunID string `json:"run_id"`
		}
		Report struct {
			Memory struct {
				Peak struct {
					LiveBytes uint64 `json:"live_bytes"`
				}
			}
			Overhead struct{ Verdict string }
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	assert.Equal(t, "run-train-1", doc.Meta.RunID)
	assert.Equal(t, uint64(1536), doc.Report.Memory.Peak.LiveBytes)
	assert.Equal(t, "refuted", doc.Report.Overhead.Verdict)

	code, out, _ = run("report", corpus("partial-no-terminal.jsonl"))
	assert.Equal(t, ExitOK, code, "a partial trace still reports what it has")
	assert.Contains(t, out, "incomplete, no terminal")

	code, out, _ = run("report", corpus("bad-invalid_utf8.jsonl"))
	assert.Equal(t, ExitProblem, code)
	assert.Contains(t, out, "line 5: error invalid_utf8")

	// Several traces are a job's ranks (job_test.go); two of one rank are refused.
	code, _, errOut := run("report", corpus("valid-infer.jsonl"), corpus("valid-train.jsonl"))
	assert.Equal(t, ExitProblem, code)
	assert.Contains(t, errOut, "both are rank 0")
}
