// Package testutil holds what several packages' tests share: finding and
// running candle-graph, the reference reader every trace we write must pass.
package testutil

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// ModuleRoot walks up from the working directory to the folder with go.mod.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, parent, dir, "go.mod not found above the test")
		dir = parent
	}
}

// CandleGraph returns the candle-graph binary: $CANDLE_GRAPH, else
// build/tools/bin/candle-graph. Without it the test is skipped, except in CI
// (CI set), where it fails: CI installs it.
func CandleGraph(t testing.TB) string {
	t.Helper()
	return Tool(t, "candle-graph", os.Getenv("CANDLE_GRAPH"), filepath.Join("build", "tools", "bin", "candle-graph"), "make tools")
}

// Tool returns the first of path (an environment variable's value, may be
// "") and rel (below the module root) that is a file. Without one the test
// is skipped, except in CI (CI set), where it fails: CI builds every tool
// with make target.
func Tool(t testing.TB, name, path, rel, target string) string {
	t.Helper()
	candidates := []string{path, filepath.Join(ModuleRoot(t), rel)}
	for _, c := range candidates {
		if c == "" {
			continue
		}
		if st, err := os.Stat(c); err == nil && !st.IsDir() {
			return c
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s not found (tried %v); .ci/run builds it with %s", name, candidates, target)
	}
	t.Skipf("%s is not built; run `%s`", name, target)
	return ""
}

// Health is the part of candle-graph's summary the tests look at.
type Health struct {
	StructurallyValid bool `json:"structurally_valid"`
	CaptureComplete   bool `json:"capture_complete"`
	Issues            []struct {
		Code     string `json:"code"`
		Severity string `json:"severity"`
		Message  string `json:"message"`
	} `json:"issues"`
}

// Summarize runs `candle-graph summary` on a copy of the trace alone in a
// fresh folder (candle-graph looks at sibling files) and returns its exit
// error (nil = valid and complete under --require-valid), its health and output.
func Summarize(t testing.TB, trace string) (error, Health, string) {
	t.Helper()
	return summarize(t, trace, "--require-valid")
}

// RequireValidFailed fails the test unless candle-graph reads the trace as
// a structurally valid capture that failed (`summary` without
// --require-valid, whose output is then JSON alone).
func RequireValidFailed(t testing.TB, trace string) Health {
	t.Helper()
	err, h, out := summarize(t, trace)
	require.NoError(t, err, "candle-graph summary %s:\n%s", trace, out)
	require.True(t, h.StructurallyValid, out)
	require.False(t, h.CaptureComplete, out)
	return h
}

func summarize(t testing.TB, trace string, flags ...string) (error, Health, string) {
	t.Helper()
	bin := CandleGraph(t)
	dir := t.TempDir()
	data, err := os.ReadFile(trace)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "trace.jsonl"), data, 0o644))
	cmd := exec.Command(bin, append([]string{"summary", "trace.jsonl"}, flags...)...)
	cmd.Dir = dir
	out, runErr := cmd.CombinedOutput()
	var doc struct {
		Health Health `json:"health"`
	}
	_ = json.Unmarshal(out, &doc)
	return runErr, doc.Health, string(out)
}

// RequireValid fails the test unless candle-graph accepts the trace as a
// structurally valid, complete capture.
func RequireValid(t testing.TB, trace string) Health {
	t.Helper()
	err, h, out := Summarize(t, trace)
	if err != nil {
		n := len(out)
		if n > 4000 {
			out = out[n-4000:]
		}
		t.Fatalf("candle-graph rejected %s: %v\n%s", trace, err, out)
	}
	require.True(t, h.StructurallyValid)
	require.True(t, h.CaptureComplete)
	return h
}

// Lines decodes every line of a JSONL file.
func Lines(t testing.TB, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), "line %d: %s", len(out)+1, sc.Text())
		out = append(out, m)
	}
	require.NoError(t, sc.Err())
	return out
}

// OfKind keeps the lines whose "kind" is kind.
func OfKind(lines []map[string]any, kind string) []map[string]any {
	var out []map[string]any
	for _, l := range lines {
		if l["kind"] == kind {
			out = append(out, l)
		}
	}
	return out
}

// CorpusDir is the trace corpus every layer of internal/report tests
// against: one file per rule, named after the code it shows.
func CorpusDir(t testing.TB) string {
	t.Helper()
	return filepath.Join(ModuleRoot(t), "internal", "report", "testdata")
}

// Corpus reads one file of the corpus.
func Corpus(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(CorpusDir(t), name))
	require.NoError(t, err)
	return data
}
