package trace

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// noSeek is a seeker that cannot say where it stands (a terminal, some pipes).
type noSeek struct{ io.Reader }

func (noSeek) Seek(int64, int) (int64, error) { return 0, errors.New("illegal seek") }

func TestRewindable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.jsonl")
	require.NoError(t, os.WriteFile(path, []byte("0123456789"), 0o644))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	_, err = f.Seek(4, io.SeekStart)
	require.NoError(t, err)

	tests := []struct {
		name       string
		r          io.Reader
		rewindable bool
		origin     int64
	}{
		{"a file, from where it stands", f, true, 4},
		{"a bytes reader", bytes.NewReader([]byte("abc")), true, 0},
		{"a pipe-like reader", io.MultiReader(strings.NewReader("abc")), false, 0},
		{"a seeker that cannot say where it is", noSeek{strings.NewReader("abc")}, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, origin := Rewindable(tt.r)
			assert.Equal(t, tt.rewindable, s != nil)
			assert.Equal(t, tt.origin, origin)
		})
	}
}
