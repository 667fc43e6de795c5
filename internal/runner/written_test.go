package runner

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWritten(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
	}
	write("t-1.jsonl", "old")
	write("t-2.jsonl", "old")
	write("other.txt", "x")
	pattern := filepath.Join(dir, "t-%p.jsonl")
	before := Snapshot(pattern)
	assert.Len(t, before, 2)
	assert.Empty(t, Written(pattern, before), "nothing changed")

	write("t-3.jsonl", "new")
	write("t-2.jsonl", "rewritten, longer")
	assert.Equal(t, []string{filepath.Join(dir, "t-2.jsonl"), filepath.Join(dir, "t-3.jsonl")}, Written(pattern, before))
	assert.Equal(t, []string{filepath.Join(dir, "t-3.jsonl")}, Written(filepath.Join(dir, "t-3.json%r"), Files{}),
		"%r is a wildcard too")
	assert.Equal(t, filepath.Join(dir, "t-rank%r.jsonl"), rankPattern(filepath.Join(dir, "t.jsonl")))
}
