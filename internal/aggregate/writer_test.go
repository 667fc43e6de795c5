package aggregate

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/events"
)

var testRun = Run{Entrypoint: "mlp::train", Phase: "train", Device: "cpu"}

// A reader polling the file while it is rewritten never sees a partial or
// inconsistent summary, and sequence numbers only grow.
func TestAtomicRewriteWhileReading(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "summary.json")
	a := New()
	w, err := NewWriter(path, a, testRun, WithInterval(0))
	require.NoError(t, err)
	require.NoError(t, w.Start())

	var stop atomic.Bool
	var reads atomic.Int64
	readErr := make(chan error, 1)
	go func() {
		defer close(readErr)
		var last uint64
		for !stop.Load() {
			s, err := ReadFile(path)
			if err != nil {
				readErr <- err
				return
			}
			if s.Sequence < last {
				readErr <- errors.New("sequence went backwards")
				return
			}
			last = s.Sequence
			reads.Add(1)
		}
	}()
	// Each write is larger than the last (more names), so a torn read
	// would be caught by the parser.
	const writes = 60
	for i := range writes {
		for j := range 20 {
			require.NoError(t, a.ObserveSpan("span-"+itoa(i*20+j), events.StepNone, uint64(i*j+1)))
		}
		require.NoError(t, w.WriteNow())
	}
	require.NoError(t, w.Finish())
	stop.Store(true)
	require.NoError(t, <-readErr)
	assert.Positive(t, reads.Load())
	t.Logf("%d complete reads during %d rewrites", reads.Load(), writes+2)

	s, err := ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, uint64(writes+2), s.Sequence)
	assert.True(t, s.Final)
	assert.Len(t, s.Spans, writes*20)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "temporary files left behind")
	assert.ErrorIs(t, w.WriteNow(), ErrFinished)
}

func itoa(i int) string { return string(appendInt(nil, i)) }

func appendInt(b []byte, i int) []byte {
	if i >= 10 {
		b = appendInt(b, i/10)
	}
	return append(b, byte('0'+i%10))
}

// failFS is the real filesystem with one step made to fail.
type failFS struct {
	OSFS
	mu     sync.Mutex
	failAt string // create | write | sync | close | rename | syncdir
	temps  []string
}

var errInjected = errors.New("injected")

func (f *failFS) fail(step string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failAt == step
}

func (f *failFS) CreateTemp(dir, pattern string) (File, error) {
	if f.fail("create") {
		return nil, errInjected
	}
	file, err := f.OSFS.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.temps = append(f.temps, file.Name())
	f.mu.Unlock()
	return &failFile{File: file, fs: f}, nil
}

func (f *failFS) Rename(o, n string) error {
	if f.fail("rename") {
		return errInjected
	}
	return f.OSFS.Rename(o, n)
}

func (f *failFS) SyncDir(dir string) error {
	if f.fail("syncdir") {
		return errInjected
	}
	return f.OSFS.SyncDir(dir)
}

type failFile struct {
	File
	fs *failFS
}

func (f *failFile) Write(p []byte) (int, error) {
	if f.fs.fail("write") {
		return f.File.Write(p[:len(p)/2]) // a partial write
	}
	return f.File.Write(p)
}

func (f *failFile) Sync() error {
	if f.fs.fail("sync") {
		return errInjected
	}
	return f.File.Sync()
}

func (f *failFile) Close() error {
	err := f.File.Close()
	if f.fs.fail("close") {
		return errInjected
	}
	return err
}

// A failed write leaves the previous summary whole and no temporary file;
// the next write succeeds.
func TestFailedWriteKeepsPrevious(t *testing.T) {
	for _, step := range []string{"create", "write", "sync", "close", "rename"} {
		t.Run(step, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "s.json")
			fs := &failFS{}
			a := New()
			w, err := NewWriter(path, a, testRun, WithFS(fs), WithInterval(0))
			require.NoError(t, err)
			require.NoError(t, w.WriteNow())
			before, err := os.ReadFile(path)
			require.NoError(t, err)

			fs.failAt = step
			require.NoError(t, a.ObserveSpan("x", events.StepNone, 5))
			err = w.WriteNow()
			require.Error(t, err)
			assert.Contains(t, err.Error(), "aggregate: summary "+path)
			assert.Equal(t, err, w.Err())
			after, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, before, after)
			entries, _ := os.ReadDir(dir)
			assert.Len(t, entries, 1)
			assert.Equal(t, uint64(1), w.Sequence())

			fs.failAt = ""
			require.NoError(t, w.WriteNow())
			assert.NoError(t, w.Err())
			s, err := ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, uint64(2), s.Sequence)
			assert.Len(t, s.Spans, 1)
		})
	}
}

// The rename happened, so the summary counts as written even when the
// folder sync fails; the error is still reported.
func TestSyncDirFailure(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.json")
	fs := &failFS{failAt: "syncdir"}
	w, err := NewWriter(path, New(), testRun, WithFS(fs), WithInterval(0))
	require.NoError(t, err)
	require.ErrorIs(t, w.WriteNow(), errInjected)
	assert.Equal(t, uint64(1), w.Sequence())
	s, err := ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), s.Sequence)
}

type manualTicker struct {
	c       chan time.Time
	d       time.Duration
	stopped atomic.Bool
}

func (m *manualTicker) C() <-chan time.Time { return m.c }
func (m *manualTicker) Stop()               { m.stopped.Store(true) }

func TestPeriodicWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.json")
	tick := &manualTicker{c: make(chan time.Time)}
	clock := newFakeClock()
	a := New(WithClock(clock))
	w, err := NewWriter(path, a, Run{Entrypoint: "e", Phase: "infer", Device: "cuda:0", Tags: map[string]string{"t": "1"}},
		WithTicker(func(d time.Duration) Ticker { tick.d = d; return tick }),
		WithProducer(Producer{Name: "test", Version: "9", PID: 1, Hostname: "h"}))
	require.NoError(t, err)
	require.NoError(t, w.Start())
	assert.Equal(t, DefaultInterval, tick.d)
	assert.Error(t, w.Start(), "already started")
	s, err := ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), s.Sequence)

	for range 2 {
		clock.Advance(time.Second)
		tick.c <- time.Time{}
	}
	// An unbuffered send returns once the loop has taken the tick; Finish
	// waits for the loop to end, so both ticks' writes are done.
	require.NoError(t, w.Finish())
	assert.True(t, tick.stopped.Load())
	s, err = ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, uint64(4), s.Sequence)
	assert.True(t, s.Final)
	assert.Equal(t, Producer{Name: "test", Version: "9", PID: 1, Hostname: "h"}, s.Producer)
	assert.Equal(t, Run{Entrypoint: "e", Phase: "infer", Device: "cuda:0", Tags: map[string]string{"t": "1"}}, s.Run)
	assert.Equal(t, uint64(2e9), s.Window.DurationNS)
	assert.ErrorIs(t, w.Finish(), ErrFinished)
}

func TestNewWriterRefusesRun(t *testing.T) {
	_, err := NewWriter("x", New(), Run{Entrypoint: "e", Phase: "eval", Device: "cpu"})
	assert.ErrorContains(t, err, "phase")
	_, err = NewWriter("x", New(), Run{Phase: "train", Device: "cpu"})
	assert.ErrorContains(t, err, "entrypoint")
	// A folder that does not exist fails at Start, leaving nothing.
	w, err := NewWriter(filepath.Join(t.TempDir(), "missing", "s.json"), New(), testRun)
	require.NoError(t, err)
	assert.Error(t, w.Start())
}

// What takes the summary's place while the run goes on is not renamed over
// either: each write fails, the FIFO stays, and no temporary file is left.
func TestRewriteNeverReplacesANonRegularFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.json")
	w, err := NewWriter(path, New(), testRun, WithInterval(0))
	require.NoError(t, err)
	require.NoError(t, w.Start())
	require.NoError(t, os.Remove(path))
	require.NoError(t, syscall.Mkfifo(path, 0o644))

	err = w.WriteNow()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "aggregate: summary "+path+": it is a named pipe (FIFO), not a regular file")
	require.Error(t, w.Finish())
	st, err := os.Lstat(path)
	require.NoError(t, err)
	assert.Equal(t, os.ModeNamedPipe, st.Mode().Type())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "temporary files left behind")
}
