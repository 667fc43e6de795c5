package session

import (
	"errors"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/events"
)

const trainRun = `{"entrypoint":"test::train","phase":"train","capture_step":2,"device":"cpu"}`
const measuredRootRun = `{"entrypoint":"test::infer","phase":"infer","capture_step":1,"device":"cpu","measured_root":true}`

// openT opens a session in a temp folder. Spans nest per OS thread, so
// the test goroutine is pinned to its thread for the test's duration.
func openT(t *testing.T, run string, opts ...Option) (*Session, string) {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	s, err := Open(path, []byte(run), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.FinishFailed("test cleanup") })
	return s, path
}

func requireCode(t *testing.T, err error, code Status, substr string) {
	t.Helper()
	require.Error(t, err)
	var e *Error
	require.True(t, errors.As(err, &e), "not a session error: %v", err)
	require.Equal(t, code, e.Code, "message: %s", e.Msg)
	require.Contains(t, e.Msg, substr)
}

func begin(t *testing.T, s *Session, name string) uint64 {
	t.Helper()
	id, err := s.BeginSpan(name, events.SpanFunction, events.StepNone)
	require.NoError(t, err)
	return id
}

func end(t *testing.T, s *Session, id uint64) {
	t.Helper()
	require.NoError(t, s.EndSpan(id))
}

// failingSink accepts `budget` bytes, then fails every write.
type failingSink struct {
	mu     sync.Mutex
	budget int
	data   []byte
	closed bool
}

func (f *failingSink) Write(b []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(b) > f.budget {
		return 0, errors.New("disk full (fake)")
	}
	f.budget -= len(b)
	f.data = append(f.data, b...)
	return len(b), nil
}

func (f *failingSink) Close() error { f.closed = true; return nil }

func (f *failingSink) bytes() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]byte(nil), f.data...)
}

// discardSink is a trace sink that keeps nothing: benchmarks of the encoding
// without the kernel's copy.
type discardSink struct{}

func (discardSink) Write(b []byte) (int, error) { return len(b), nil }
func (discardSink) Close() error                { return nil }
