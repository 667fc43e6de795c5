package session

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/events"
)

const aggregateRun = `{"entrypoint":"agg::train","phase":"train","device":"cpu","mode":"aggregate","aggregate_interval_ms":60000,"tags":{"job":"t"}}`

func TestAggregateSessionFoldsSpansPerNameAndStep(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	path := filepath.Join(t.TempDir(), "summary.json")
	s, err := Open(path, []byte(aggregateRun))
	require.NoError(t, err)
	const steps = 3000
	for i := 0; i < steps; i++ {
		step, err := s.BeginSpan("train/step", events.SpanFunction, events.StepNone)
		require.NoError(t, err)
		fwd, err := s.BeginSpan("forward", events.SpanModule, events.StepForward)
		require.NoError(t, err)
		require.NoError(t, s.EndSpan(fwd))
		if i%3 == 0 {
			opt, err := s.BeginSpan("optimizer", events.SpanFunction, events.StepOptimizer)
			require.NoError(t, err)
			require.NoError(t, s.EndSpan(opt))
		}
		require.NoError(t, s.RecordScalar(step, "loss", float64(i)))
		if i < 10 {
			_, err := s.RecordCompletedSpan("data/load", events.SpanFunction, 0, 1000+uint64(i))
			require.NoError(t, err)
		}
		require.NoError(t, s.EndSpan(step))
		if i == 999 {
			require.NoError(t, s.SetAggregateEnabled(false))
		}
		if i == 1999 {
			require.NoError(t, s.SetAggregateEnabled(true))
		}
	}
	require.NoError(t, s.Finish())

	sum, err := aggregate.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "agg::train", sum.Run.Entrypoint)
	assert.Equal(t, map[string]string{"job": "t"}, sum.Run.Tags)
	assert.True(t, sum.Final)
	counts := map[string]uint64{}
	for _, sp := range sum.Spans {
		counts[fmt.Sprintf("%s/%s", sp.Name, sp.Step)] = sp.Count
		assert.LessOrEqual(t, sp.MinNS, sp.MaxNS)
		assert.LessOrEqual(t, sp.P50NS, sp.P99NS)
	}
	// Steps 1000..1999 ran while statistics were off.
	assert.Equal(t, uint64(2000), counts["train/step/"], counts)
	assert.Equal(t, uint64(2000), counts["forward/forward"], counts)
	assert.Equal(t, uint64(667), counts["optimizer/optimizer"], counts) // i%3==0 for i in [0,1000) ∪ [2000,3000)
	assert.Equal(t, uint64(10), counts["data/load/"], "completed spans are folded too")
	require.Len(t, sum.Scalars, 1)
	assert.Equal(t, "loss", sum.Scalars[0].Label)
	assert.Equal(t, float64(2999), sum.Scalars[0].Last)
}

func TestAggregateSessionRefusesWhatTraceSessionsRefuse(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s, err := Open(filepath.Join(t.TempDir(), "summary.json"), []byte(aggregateRun))
	require.NoError(t, err)
	a, err := s.BeginSpan("a", events.SpanFunction, events.StepNone)
	require.NoError(t, err)
	requireCode(t, s.Finish(), State, "1 spans still open")
	requireCode(t, s.RecordScalar(a, " ", 1), InvalidArgument, "label")
	require.NoError(t, s.EndSpan(a))
	require.NoError(t, s.Finish())

	tr, _ := openT(t, trainRun)
	requireCode(t, tr.SetAggregateEnabled(true), State, "is a trace session")
}

// Aggregate spans are timed in ticks (the cycle counter where it runs at a
// constant rate, else CLOCK_MONOTONIC) and converted when folded: either way
// a span's duration lies between what it waited and what its caller saw.
func TestAggregateSpanDurationsOnEitherClock(t *testing.T) {
	t.Cleanup(func() { forceTicks(tickCounter) })
	for _, source := range []int{tickMonotonic, tickCounter} {
		got := forceTicks(source)
		t.Run(fmt.Sprintf("source-%d", got), func(t *testing.T) {
			runtime.LockOSThread() // spans nest per OS thread
			defer runtime.UnlockOSThread()
			path := filepath.Join(t.TempDir(), "summary.json")
			s, err := Open(path, []byte(aggregateRun))
			require.NoError(t, err)
			const n, wait = 20, 2 * time.Millisecond
			var outer []time.Duration
			for i := 0; i < n; i++ {
				t0 := time.Now()
				id, err := s.BeginSpan("sleep", events.SpanFunction, events.StepNone)
				require.NoError(t, err)
				time.Sleep(wait)
				require.NoError(t, s.EndSpan(id))
				outer = append(outer, time.Since(t0))
			}
			require.NoError(t, s.Finish())
			sum, err := aggregate.ReadFile(path)
			require.NoError(t, err)
			require.Len(t, sum.Spans, 1)
			sp := sum.Spans[0]
			assert.Equal(t, uint64(n), sp.Count)
			longest := outer[0]
			for _, d := range outer {
				longest = max(longest, d)
			}
			assert.GreaterOrEqual(t, float64(sp.MinNS), 0.999*float64(wait.Nanoseconds()))
			assert.LessOrEqual(t, float64(sp.MaxNS), 1.001*float64(longest.Nanoseconds())+1000)
		})
	}
}

// The summary is renamed over its path, so what stands there must be a
// regular file or nothing: a device, a FIFO, a socket, a directory or a
// symbolic link is refused at open and left as it was.
func TestAggregateRefusesTargetsItWouldReplace(t *testing.T) {
	tests := []struct {
		name string
		make func(t *testing.T, dir, path string)
		msg  string
	}{
		{"fifo", func(t *testing.T, _, path string) { require.NoError(t, syscall.Mkfifo(path, 0o644)) }, "a named pipe (FIFO)"},
		{"symlink to a file", func(t *testing.T, dir, path string) {
			victim := filepath.Join(dir, "victim.txt")
			require.NoError(t, os.WriteFile(victim, []byte("victim\n"), 0o644))
			require.NoError(t, os.Symlink(victim, path))
		}, "a symbolic link"},
		{"dangling symlink", func(t *testing.T, dir, path string) {
			require.NoError(t, os.Symlink(filepath.Join(dir, "nowhere.json"), path))
		}, "a symbolic link"},
		{"directory", func(t *testing.T, _, path string) { require.NoError(t, os.Mkdir(path, 0o755)) }, "a directory"},
		{"socket", func(t *testing.T, _, path string) {
			l, err := net.Listen("unix", path)
			require.NoError(t, err)
			l.(*net.UnixListener).SetUnlinkOnClose(false)
			t.Cleanup(func() { l.Close() })
		}, "a socket"},
		{"character device", func(t *testing.T, _, path string) {
			// A private /dev/null (1, 3); only root may make one.
			if err := syscall.Mknod(path, syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
				t.Skipf("mknod: %v", err)
			}
		}, "a character device"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "summary.json")
			tc.make(t, dir, path)
			before := snapshotDir(t, dir)
			_, err := Open(path, []byte(aggregateRun))
			requireCode(t, err, IO, tc.msg)
			assert.Contains(t, err.Error(), path)
			assert.Contains(t, err.Error(), "not a regular file")
			assert.Equal(t, before, snapshotDir(t, dir), "what stood at the path (and beside it) is unchanged, no temporary file is left")
		})
	}
}

// snapshotDir describes every entry of dir: its type, a link's target, a
// regular file's content.
func snapshotDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	out := map[string]string{}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		st, err := os.Lstat(p)
		require.NoError(t, err)
		desc := st.Mode().Type().String()
		switch {
		case st.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			require.NoError(t, err)
			desc += " -> " + target
		case st.Mode().IsRegular():
			data, err := os.ReadFile(p)
			require.NoError(t, err)
			desc += " " + string(data)
		}
		out[e.Name()] = desc
	}
	return out
}
