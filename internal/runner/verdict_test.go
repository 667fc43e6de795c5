package runner

import (
	"os"
	"path/filepath"
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
