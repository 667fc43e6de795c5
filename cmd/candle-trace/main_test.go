package main

import (
	"errors"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBinary builds the command and checks its exit codes end to end.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "candle-trace")
	build := exec.Command("go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, string(out))

	testdata := filepath.Join("..", "..", "internal", "report", "testdata")
	tests := []struct {
		args []string
		want int
	}{
		{[]string{"validate", filepath.Join(testdata, "valid-infer.jsonl")}, 0},
		{[]string{"validate", filepath.Join(testdata, "bad-unknown_kind.jsonl")}, 1},
		{[]string{"report", filepath.Join(testdata, "valid-train.jsonl")}, 0},
		{[]string{"compare", filepath.Join(testdata, "valid-train.jsonl"), filepath.Join(testdata, "warn-retained_allocations.jsonl")}, 0},
		{[]string{"compare", filepath.Join(testdata, "valid-train.jsonl"), filepath.Join(testdata, "valid-infer.jsonl")}, 1},
		{[]string{"export", filepath.Join(testdata, "valid-train.jsonl"), "-o", filepath.Join(t.TempDir(), "out.json")}, 0},
		{[]string{"merge", filepath.Join(testdata, "valid-train.jsonl"), filepath.Join(testdata, "valid-infer.jsonl"), "-o", filepath.Join(t.TempDir(), "job.json")}, 0},
		{[]string{"export", "--format", "svg", filepath.Join(testdata, "valid-train.jsonl")}, 2},
		{[]string{}, 2},
	}
	for _, tc := range tests {
		err := exec.Command(bin, tc.args...).Run()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else {
			require.NoError(t, err)
		}
		assert.Equal(t, tc.want, code, "%v", tc.args)
	}
}
