package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// variant writes valid-train.jsonl with replacements into dir.
func variant(t *testing.T, dir, name string, repl ...string) string {
	t.Helper()
	data, err := os.ReadFile(corpus("valid-train.jsonl"))
	require.NoError(t, err)
	s := string(data)
	for i := 0; i < len(repl); i += 2 {
		require.Contains(t, s, repl[i])
		s = strings.Replace(s, repl[i], repl[i+1], 1)
	}
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(s), 0o644))
	return p
}

func TestCompareCommand(t *testing.T) {
	dir := t.TempDir()
	pytorch := variant(t, dir, "pytorch.jsonl", `"implementation_id":"candle-trace-go"`, `"implementation_id":"pytorch"`,
		`"duration_ns":500`, `"duration_ns":1000`)
	otherModel := variant(t, dir, "other-model.jsonl", `"model_id":"mlp-2"`, `"model_id":"mlp-3"`, `"precision":"f32"`, `"precision":"bf16"`)
	train := corpus("valid-train.jsonl")
	tests := []struct {
		name   string
		args   []string
		want   int
		stdout []string
		stderr []string
	}{
		{"comparable", []string{"compare", train, pytorch}, ExitOK,
			[]string{"Identity: comparable", "implementation pytorch", "relu", "+500 ns", "×2.000  !"}, nil},
		{"identity differs", []string{"compare", train, otherModel}, ExitProblem, nil,
			[]string{"refusing to compare", "differ in 2 field(s)", "model_id", "mlp-3", "precision", "bf16", "--force"}},
		{"forced", []string{"compare", "--force", train, otherModel}, ExitOK,
			[]string{"NOT comparable, compared because of --force", "model_id: A mlp-2, B mlp-3"}, nil},
		{"no identity", []string{"compare", train, corpus("valid-infer.jsonl")}, ExitProblem, nil,
			[]string{"trace B declares no comparison_identity"}},
		{"no identity forced", []string{"compare", corpus("valid-infer.jsonl"), train, "--force"}, ExitOK,
			[]string{"trace A declares no comparison_identity", "Only in B"}, nil},
		{"threshold", []string{"compare", "--threshold", "150", train, pytorch}, ExitOK, []string{"beyond 150.0%"}, nil},
		{"unreadable", []string{"compare", train, corpus("bad-invalid_utf8.jsonl")}, ExitProblem, nil, []string{"cannot be read", "invalid_utf8"}},
		{"one trace", []string{"compare", train}, ExitUsage, nil, []string{"give two traces"}},
		{"bad threshold", []string{"compare", "--threshold", "0", train, pytorch}, ExitUsage, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := run(tc.args...)
			assert.Equal(t, tc.want, code, "stdout: %s\nstderr: %s", out, errOut)
			for _, s := range tc.stdout {
				assert.Contains(t, out, s)
			}
			for _, s := range tc.stderr {
				assert.Contains(t, errOut, s)
			}
		})
	}
}

func TestCompareJSON(t *testing.T) {
	dir := t.TempDir()
	otherModel := variant(t, dir, "other.jsonl", `"model_id":"mlp-2"`, `"model_id":"mlp-3"`, `"norm":0.5`, `"norm":0.55`)
	var doc struct {
		Refused            bool                           `json:"refused"`
		IdentityComparable bool                           `json:"identity_comparable"`
		IdentityDiffs      []struct{ Field, A, B string } `json:"identity_diffs"`
		Forced             bool
		Gradients          []struct {
			Key      string
			RelError *float64 `json:"rel_error"`
		}
	}
	code, out, _ := run("compare", "--json", corpus("valid-train.jsonl"), otherModel)
	assert.Equal(t, ExitProblem, code)
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	assert.True(t, doc.Refused)
	assert.Equal(t, "model_id", doc.IdentityDiffs[0].Field)

	code, out, _ = run("compare", "--json", "--force", corpus("valid-train.jsonl"), otherModel)
	assert.Equal(t, ExitOK, code)
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	assert.False(t, doc.Refused)
	assert.True(t, doc.Forced)
	for _, g := range doc.Gradients {
		if g.Key == "encoder.weight" {
			require.NotNil(t, g.RelError)
			assert.InDelta(t, 0.1, *g.RelError, 1e-9)
		}
	}
}

func TestExportCommand(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "train.json")
	code, _, errOut := run("export", "--format", "chrome", corpus("valid-train.jsonl"), "-o", out)
	require.Equal(t, ExitOK, code, errOut)
	assert.Contains(t, errOut, "train.json: 39 trace events (C 9, M 7, X 13, f 5, s 5) from 41 lines, 5 spans")
	assert.Contains(t, errOut, "1 edges left out")
	var doc struct {
		TraceEvents []map[string]any `json:"traceEvents"`
		OtherData   map[string]string
	}
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &doc))
	assert.Len(t, doc.TraceEvents, 39)
	assert.Equal(t, "run-train-1", doc.OtherData["run_id"])

	code, _, errOut = run("export", corpus("partial-no-terminal.jsonl"), "-o", filepath.Join(dir, "partial.json"))
	assert.Equal(t, ExitOK, code)
	assert.Contains(t, errOut, "partial trace (no terminal record)")
	assert.Contains(t, errOut, "3 open spans end at the last timestamp, 9.00 µs")

	// A broken line: what came before is exported, and the exit says so.
	code, _, errOut = run("export", corpus("bad-invalid_utf8.jsonl"), "-o", filepath.Join(dir, "bad.json"))
	assert.Equal(t, ExitProblem, code)
	assert.Contains(t, errOut, "stopped at line 5: invalid_utf8")
	_, err = os.Stat(filepath.Join(dir, "bad.json"))
	assert.NoError(t, err)

	code, _, errOut = run("export", corpus("bad-missing_meta.jsonl"), "-o", filepath.Join(dir, "nometa.json"))
	assert.Equal(t, ExitProblem, code)
	assert.Contains(t, errOut, "a trace starts with a meta record")
	_, err = os.Stat(filepath.Join(dir, "nometa.json"))
	assert.True(t, os.IsNotExist(err), "no half-written file is left behind")
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		assert.False(t, strings.HasPrefix(e.Name(), "."), "temporary file %s left behind", e.Name())
	}

	code, stdout, _ := run("export", corpus("valid-infer.jsonl"))
	assert.Equal(t, ExitOK, code)
	assert.True(t, json.Valid([]byte(stdout)), "no -o: standard output")

	code, _, _ = run("export", "--format", "perfetto", corpus("valid-infer.jsonl"))
	assert.Equal(t, ExitUsage, code)
	code, _, _ = run("export")
	assert.Equal(t, ExitUsage, code)
}

func TestMergeCommand(t *testing.T) {
	dir := t.TempDir()
	clock := `"clock":{"host":"monotonic","wall_unix_ns_at_open":1786000000000000000},"process":{"pid":4242,"hostname":"box","rank":0,"world_size":1}`
	rank1 := variant(t, dir, "rank1.jsonl", clock,
		`"clock":{"host":"monotonic","wall_unix_ns_at_open":1786000000001000000},"process":{"pid":4243,"hostname":"box","rank":1,"world_size":2}`)
	out := filepath.Join(dir, "job.json")
	code, _, errOut := run("merge", rank1, corpus("valid-train.jsonl"), "-o", out)
	require.Equal(t, ExitOK, code, errOut)
	assert.Contains(t, errOut, "from 2 ranks")
	assert.Contains(t, errOut, "rank 1 (meta.process.rank): "+rank1+", pid 2, +1.00 ms")
	var doc struct {
		TraceEvents []struct {
			Ph, Name string
			TS       float64
			PID      int64
		} `json:"traceEvents"`
	}
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &doc))
	starts := map[int64]float64{}
	for _, e := range doc.TraceEvents {
		if e.Ph == "X" && e.Name == "train/forward" {
			starts[e.PID] = e.TS
		}
	}
	assert.Equal(t, map[int64]float64{1: 0.2, 2: 1000.2}, starts)

	code, _, errOut = run("merge", corpus("valid-train.jsonl"), corpus("valid-train.jsonl"), "-o", filepath.Join(dir, "dup.json"))
	assert.Equal(t, ExitProblem, code)
	assert.Contains(t, errOut, "both are rank 0")
	code, _, _ = run("merge", "-o", out)
	assert.Equal(t, ExitUsage, code)
}
