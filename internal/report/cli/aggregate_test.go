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

func TestPositional(t *testing.T) {
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"a.json"}, []string{"a.json"}},
		{[]string{"--json", "a.json", "--threshold", "20", "b.json"}, []string{"a.json", "b.json"}},
		{[]string{"--threshold=20", "a", "-category", "x=ignore", "--categories", "f", "b"}, []string{"a", "b"}},
		{[]string{"-", "--", "--odd"}, []string{"-", "--odd"}},
		{[]string{"-o", "out.json", "t.jsonl"}, []string{"t.jsonl"}},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, positional(tc.args), "%q", tc.args)
	}
}

func TestAggregateReportCommand(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "cats.txt")
	require.NoError(t, os.WriteFile(rules, []byte("# enclosing span\ntrain_step=ignore\n"), 0o644))
	badRules := filepath.Join(dir, "bad.txt")
	require.NoError(t, os.WriteFile(badRules, []byte("nonsense\n"), 0o644))
	broken := filepath.Join(dir, "broken.json")
	data, err := os.ReadFile(corpus("aggregate-a.json"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(broken, []byte(strings.Replace(string(data), `"p50_ns":1000000,`, `"p50_ns":1000001,`, 1)), 0o644))
	a := corpus("aggregate-a.json")
	tests := []struct {
		name   string
		args   []string
		want   int
		stdout []string
		stderr []string
	}{
		{"defaults", []string{"report", a}, ExitOK, []string{"Summary " + a, "verdict:    corroborated: compute took 75.0%", "(10.000 s ignored)"}, nil},
		{"step as other", []string{"report", "--category", "train_step=other", a}, ExitOK, []string{"verdict:    falsified: compute took 37.5%", "led by other at 51.0%"}, nil},
		{"flag", []string{"report", "--category", "train_step=ignore", a}, ExitOK, []string{"verdict:    corroborated: compute took 75.0%"}, nil},
		{"file", []string{"report", a, "--categories", rules}, ExitOK, []string{"corroborated", "(10.000 s ignored)"}, nil},
		{"pattern", []string{"report", "--category", "train_*=ignore", "--category", "mlp/*=other", a}, ExitOK, []string{"falsified: compute took 5.0%"}, nil},
		{"threshold", []string{"report", "--categories", rules, "--threshold", "80", a}, ExitOK, []string{"threshold:  compute share > 80.0%", "falsified"}, nil},
		{"bad rule", []string{"report", "--category", "nonsense", a}, ExitUsage, nil, []string{"want NAME=CATEGORY"}},
		{"bad rules file", []string{"report", "--categories", badRules, a}, ExitUsage, nil, []string{"line 1"}},
		{"missing rules file", []string{"report", "--categories", filepath.Join(dir, "none"), a}, ExitUsage, nil, []string{"no such file"}},
		{"bad threshold", []string{"report", "--threshold", "100", a}, ExitUsage, nil, []string{"between 0 and 100"}},
		{"inconsistent", []string{"report", broken}, ExitProblem, nil, []string{"p50_ns 1000001, the buckets give 1000000"}},
		// A trace still goes to the trace report.
		{"trace", []string{"report", corpus("valid-train.jsonl")}, ExitOK, []string{"Trace ", "Spans by name"}, nil},
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

func TestAggregateReportJSON(t *testing.T) {
	code, out, errOut := run("report", "--json", "--category", "train_step=ignore", corpus("aggregate-a.json"))
	require.Equal(t, ExitOK, code, errOut)
	var doc struct {
		Schema   string `json:"schema"`
		TotalNS  uint64 `json:"total_ns"`
		Spans    []struct{ Name, Category string }
		Overhead struct {
			Verdict      string  `json:"verdict"`
			ComputeShare float64 `json:"compute_share"`
			Threshold    float64 `json:"threshold"`
		} `json:"overhead"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	assert.Equal(t, "candle-trace/aggregate/1", doc.Schema)
	assert.Equal(t, uint64(10e9), doc.TotalNS)
	assert.Equal(t, "corroborated", doc.Overhead.Verdict)
	assert.Equal(t, 0.75, doc.Overhead.ComputeShare)
	assert.Equal(t, 0.5, doc.Overhead.Threshold)
	assert.Equal(t, "ignore", doc.Spans[0].Category)
}

func TestAggregateCompareCommand(t *testing.T) {
	a, b := corpus("aggregate-a.json"), corpus("aggregate-b.json")
	tests := []struct {
		name   string
		args   []string
		want   int
		stdout []string
		stderr []string
	}{
		{"default", []string{"compare", a, b}, ExitOK, []string{"1 regression(s), 1 improvement(s)", "more than 10.0%"}, nil},
		{"threshold", []string{"compare", "--threshold", "20", a, b}, ExitOK, []string{"0 regression(s), 1 improvement(s)"}, nil},
		{"fail on regression", []string{"compare", "--fail-on-regression", a, b}, ExitProblem, []string{"1 regression(s)"}, nil},
		{"fail, none", []string{"compare", "--fail-on-regression", b, b}, ExitOK, []string{"0 regression(s), 0 improvement(s)"}, nil},
		{"mixed", []string{"compare", a, corpus("valid-train.jsonl")}, ExitUsage, nil, []string{"compare two of a kind"}},
		{"bad threshold", []string{"compare", "--threshold", "-1", a, b}, ExitUsage, nil, []string{"positive"}},
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
	code, out, _ := run("compare", "--json", a, b)
	require.Equal(t, ExitOK, code)
	var doc struct {
		Regressions int `json:"regressions"`
		Spans       []struct {
			Name      string   `json:"name"`
			P50Change *float64 `json:"p50_change"`
			Regressed bool     `json:"regressed"`
		} `json:"spans"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	assert.Equal(t, 1, doc.Regressions)
	assert.Equal(t, "mlp/forward", doc.Spans[2].Name)
	assert.True(t, doc.Spans[2].Regressed)
}

// "-" reads a summary from standard input, a redirected file or a pipe.
func TestAggregateFromStdin(t *testing.T) {
	data, err := os.ReadFile(corpus("aggregate-a.json"))
	require.NoError(t, err)
	old := os.Stdin
	defer func() { os.Stdin, stdin = old, nil }()

	f, err := os.Open(corpus("aggregate-a.json"))
	require.NoError(t, err)
	defer f.Close()
	os.Stdin, stdin = f, nil
	code, out, errOut := run("report", "-")
	require.Equal(t, ExitOK, code, errOut)
	assert.Contains(t, out, "Summary -: candle-trace/aggregate/1")
	assert.Nil(t, stdin, "a seekable stdin is read in place")

	r, w, err := os.Pipe()
	require.NoError(t, err)
	go func(w *os.File) { w.Write(data); w.Close() }(w)
	os.Stdin, stdin = r, nil
	code, out, errOut = run("report", "--json", "-")
	require.Equal(t, ExitOK, code, errOut)
	assert.Contains(t, out, `"verdict": "corroborated"`)
	r.Close()

	// A trace through a pipe still reaches the trace reader whole.
	trace, err := os.ReadFile(corpus("valid-train.jsonl"))
	require.NoError(t, err)
	r, w, err = os.Pipe()
	require.NoError(t, err)
	go func(w *os.File) { w.Write(trace); w.Close() }(w)
	os.Stdin, stdin = r, nil
	code, out, errOut = run("report", "-")
	require.Equal(t, ExitOK, code, errOut)
	assert.Contains(t, out, "Trace -")
	r.Close()
}
