package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestViewCommand(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "page.html")
	tests := []struct {
		name   string
		args   []string
		want   int
		file   string // written, and holds the trace's name
		stdout []string
		stderr []string
	}{
		{"to a file", []string{"view", corpus("valid-train.jsonl"), "--output", out}, ExitOK, out, []string{"wrote " + out, "open it in a browser"}, nil},
		{"short flag", []string{"view", "-o", out, corpus("failed-capture_failed.jsonl")}, ExitOK, out, []string{"wrote " + out}, nil},
		{"no trace", []string{"view"}, ExitUsage, "", nil, []string{"give one trace, or two"}},
		{"three traces", []string{"view", "a", "b", "c"}, ExitUsage, "", nil, []string{"give one trace, or two"}},
		{"two traces", []string{"view", corpus("valid-train.jsonl"), corpus("failed-capture_failed.jsonl"), "-o", out}, ExitOK, out, []string{"wrote " + out}, nil},
		{"aggregate summary", []string{"view", corpus("aggregate-a.json"), "-o", out}, ExitOK, out, []string{"wrote " + out}, nil},
		{"bad threshold", []string{"view", "--threshold", "0", corpus("valid-train.jsonl"), corpus("valid-train.jsonl")}, ExitUsage, "", nil, []string{"positive percentage"}},
		{"stdin needs an output", []string{"view", "-"}, ExitUsage, "", nil, []string{"needs --output"}},
		{"missing trace", []string{"view", filepath.Join(dir, "none.jsonl"), "-o", out}, ExitProblem, "", nil, []string{"no such file"}},
		{"unwritable output", []string{"view", corpus("valid-train.jsonl"), "-o", filepath.Join(dir, "no", "dir.html")}, ExitProblem, "", nil, []string{"no such file or directory"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(out)
			code, stdout, stderr := run(tc.args...)
			assert.Equal(t, tc.want, code, "stdout: %s\nstderr: %s", stdout, stderr)
			for _, s := range tc.stdout {
				assert.Contains(t, stdout, s)
			}
			for _, s := range tc.stderr {
				assert.Contains(t, stderr, s)
			}
			if tc.file != "" {
				b, err := os.ReadFile(tc.file)
				require.NoError(t, err)
				assert.True(t, strings.HasPrefix(string(b), "<!DOCTYPE html>"))
				assert.Contains(t, string(b), `<script id="trace-data" type="application/json">`)
			}
		})
	}
}

func TestViewOutputSitsBesideTheTrace(t *testing.T) {
	assert.Equal(t, "runs/step.html", viewOutput([]string{"runs/step.jsonl"}))
	assert.Equal(t, "trace.txt.html", viewOutput([]string{"trace.txt"}))
	assert.Equal(t, "runs/b-vs-a.html", viewOutput([]string{"old/a.jsonl", "runs/b.jsonl"}))
}
