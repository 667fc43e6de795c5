package session

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/testutil"
)

// bufRun is trainRun, buffered within maxBytes, plus extra keys (",k":v...).
func bufRun(maxBytes int, extra string) string {
	return fmt.Sprintf(`{"entrypoint":"test::train","phase":"train","capture_step":2,"device":"cpu","buffer":{"max_bytes":%d}%s}`, maxBytes, extra)
}

// openBuffered opens a buffered session at a path two folders deep in a temp
// folder, so the test sees that not even the folders are made.
func openBuffered(t *testing.T, run string, opts ...Option) (*Session, string) {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	path := filepath.Join(t.TempDir(), "flight", "update-7", "trace.jsonl")
	s, err := Open(path, []byte(run), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Discard() })
	return s, path
}

// terminalDropped reads dropped_records and dropped_bytes off the terminal.
func terminalDropped(t *testing.T, lines []map[string]any) events.Dropped {
	t.Helper()
	term := lines[len(lines)-1]
	require.Equal(t, "terminal", term["kind"])
	require.Contains(t, term, "dropped_records")
	require.Contains(t, term, "dropped_bytes")
	return events.Dropped{Records: uint64(term["dropped_records"].(float64)), Bytes: uint64(term["dropped_bytes"].(float64))}
}

// step records a small update: a measured region with a forward span, an
// op, a tensor, stats, memory and a gradient.
func step(t *testing.T, s *Session) {
	t.Helper()
	m, err := s.BeginMeasurement("update")
	require.NoError(t, err)
	fwd, err := s.BeginSpan("forward", events.SpanModule, events.StepForward)
	require.NoError(t, err)
	spin(20_000)
	require.NoError(t, s.RecordOp(fwd, op("matmul", 0, 1000)))
	require.NoError(t, s.RecordTensor(fwd, &events.Tensor{TensorID: "c", Dtype: "f32", Device: "cpu", Shape: []uint64{4, 4}}))
	require.NoError(t, s.RecordScalar(fwd, "loss", 0.25))
	require.NoError(t, s.RecordDataEdge("a", "c"))
	end(t, s, fwd)
	require.NoError(t, s.RecordCallEdge(m, fwd, 0))
	norm := 1.5
	require.NoError(t, s.RecordGradient("mlp", "fc1.weight", events.GradientPresent, &norm))
	end(t, s, m)
}

func TestBufferedOpenCreatesNothingAndDiscardLeavesNothing(t *testing.T) {
	s, path := openBuffered(t, bufRun(1<<20, ""))
	folder := filepath.Dir(filepath.Dir(path))
	assert.NoDirExists(t, folder, "ct_open made no folder")
	step(t, s)
	require.NoError(t, s.Flush(), "a flush of a buffered session writes nothing and succeeds")
	assert.NoDirExists(t, folder)
	assert.Zero(t, s.Dropped())

	begin(t, s, "left/open") // discard does not care about open spans
	require.NoError(t, s.Discard())
	assert.NoDirExists(t, folder, "a discarded session leaves nothing")
	_, err := Lookup(s.Handle())
	requireCode(t, err, InvalidHandle, "unknown or already finished")
	requireCode(t, s.Discard(), InvalidHandle, "ct_discard: session")
	requireCode(t, s.Finish(), InvalidHandle, "unknown or already finished")
	requireCode(t, s.FinishFailed("late"), InvalidHandle, "unknown or already finished")
	_, err = s.BeginSpan("late", events.SpanFunction, events.StepNone)
	requireCode(t, err, InvalidHandle, "")
}

func TestBufferedFinishWritesTheTraceThen(t *testing.T) {
	tests := []struct {
		name     string
		end      func(*Session) error
		outcome  string
		complete bool
	}{
		{"finish", func(s *Session) error { return s.Finish() }, "complete", true},
		{"finish failed", func(s *Session) error { return s.FinishFailed("loss is NaN at update 7") }, "failed", false},
		{"finish failed with a span open", func(s *Session) error {
			_, err := s.BeginSpan("optimizer", events.SpanModule, events.StepOptimizer)
			if err != nil {
				return err
			}
			return s.FinishFailed("exception in the optimizer")
		}, "failed", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, path := openBuffered(t, bufRun(1<<20, ""))
			step(t, s)
			assert.NoFileExists(t, path)
			require.NoError(t, tc.end(s))
			lines := testutil.Lines(t, path)
			assert.Equal(t, "meta", lines[0]["kind"])
			assert.Equal(t, tc.outcome, lines[len(lines)-1]["outcome"])
			assert.Equal(t, events.Dropped{}, terminalDropped(t, lines), "nothing dropped within the bound")
			for _, kind := range []string{"op", "tensor", "tensor_stats", "gradient", "edge"} {
				assert.NotEmpty(t, testutil.OfKind(lines, kind), kind)
			}
			if tc.complete {
				testutil.RequireValid(t, path)
				return
			}
			testutil.RequireValidFailed(t, path)
		})
	}
}

// What ct_open refuses for a streaming session it refuses for a buffered one
// too, changing nothing; what it would reuse is left untouched until finish.
func TestBufferedOpenChecksThePath(t *testing.T) {
	tests := []struct {
		name string
		make func(t *testing.T, path string) // what stands at path before
		msg  string                          // "" = accepted
	}{
		{"nothing there", nil, ""},
		{"an empty file", func(t *testing.T, p string) { require.NoError(t, os.WriteFile(p, nil, 0o644)) }, ""},
		{"someone else's file", func(t *testing.T, p string) { require.NoError(t, os.WriteFile(p, []byte("import torch\n"), 0o644)) },
			"is not a candle-trace trace or summary"},
		{"a symbolic link", func(t *testing.T, p string) { require.NoError(t, os.Symlink("elsewhere.jsonl", p)) },
			"is a symbolic link, which candle-trace does not follow"},
		{"a folder", func(t *testing.T, p string) { require.NoError(t, os.Mkdir(p, 0o755)) }, "it is a directory"},
		{"parent is a file", func(t *testing.T, p string) {
			require.NoError(t, os.WriteFile(filepath.Dir(p), []byte("x"), 0o644))
		}, "not a directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "sub", "trace.jsonl")
			require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
			if tc.name == "parent is a file" {
				require.NoError(t, os.Remove(filepath.Dir(path)))
			}
			if tc.make != nil {
				tc.make(t, path)
			}
			top := filepath.Dir(filepath.Dir(path))
			before := snapshotTree(t, top)
			s, err := Open(path, []byte(bufRun(4096, "")))
			if tc.msg != "" {
				requireCode(t, err, IO, tc.msg)
				assert.Contains(t, err.Error(), "ct_open: buffered trace "+path)
				assert.Equal(t, before, snapshotTree(t, top), "a refused ct_open changed nothing")
				return
			}
			require.NoError(t, err)
			require.NoError(t, s.Discard())
			assert.Equal(t, before, snapshotTree(t, top), "open and discard changed nothing")
		})
	}
}

// A previous trace at the path stays as it was through open and discard,
// and is replaced only by a finish.
func TestBufferedSessionLeavesAPreviousTraceUntilFinish(t *testing.T) {
	prev, path := openT(t, measuredRootRun)
	require.NoError(t, prev.Finish())
	old, err := os.ReadFile(path)
	require.NoError(t, err)

	s, err := Open(path, []byte(bufRun(1<<20, "")))
	require.NoError(t, err)
	step(t, s)
	require.NoError(t, s.Discard())
	now, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, old, now, "discard left the previous trace alone")

	s, err = Open(path, []byte(bufRun(1<<20, "")))
	require.NoError(t, err)
	step(t, s)
	require.NoError(t, s.Finish())
	testutil.RequireValid(t, path)
	assert.Equal(t, "test::train", testutil.Lines(t, path)[0]["entrypoint"])
}

func TestBufferedFinishThatCannotWriteLeavesNothing(t *testing.T) {
	tests := []struct {
		name   string
		opts   []Option
		before func(t *testing.T, path string) // between open and finish
		left   string                          // what must be at path after ("" = nothing)
		msg    string
	}{
		{"the disk fails", []Option{WithOpener(func(string) (Sink, error) { return &failingSink{budget: 100}, nil })}, nil, "",
			"disk full (fake); nothing that claims to be a trace is left"},
		{"someone else's file appeared", nil, func(t *testing.T, p string) {
			require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
			require.NoError(t, os.WriteFile(p, []byte("import torch\n"), 0o644))
		}, "import torch\n", "is not a candle-trace trace or summary"},
		{"the folder became a file", nil, func(t *testing.T, p string) {
			require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Dir(p)), 0o755))
			require.NoError(t, os.WriteFile(filepath.Dir(p), []byte("x"), 0o644))
		}, "", "create folder"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, path := openBuffered(t, bufRun(1<<20, ""), tc.opts...)
			step(t, s)
			if tc.before != nil {
				tc.before(t, path)
			}
			err := s.Finish()
			requireCode(t, err, IO, tc.msg)
			assert.Contains(t, err.Error(), "ct_finish: write "+path)
			if tc.left == "" {
				assert.NoFileExists(t, path)
			} else {
				data, rerr := os.ReadFile(path)
				require.NoError(t, rerr)
				assert.Equal(t, tc.left, string(data))
			}
			_, lerr := Lookup(s.Handle())
			assert.Error(t, lerr, "the handle is released either way")
		})
	}
}

func TestBufferedFinishToDevFullFails(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s, err := Open("/dev/full", []byte(bufRun(1<<20, "")))
	require.NoError(t, err, "a character device is checked, not opened, at ct_open")
	step(t, s)
	requireCode(t, s.Finish(), IO, "nothing that claims to be a trace is left")
}

func TestDiscardOfAStreamingSessionIsRefused(t *testing.T) {
	s, path := openT(t, trainRun)
	requireCode(t, s.Discard(), State, "writes its trace as it records, so there is nothing to discard")
	step(t, s) // still usable
	require.NoError(t, s.Finish())
	testutil.RequireValid(t, path)
	lines := testutil.Lines(t, path)
	assert.NotContains(t, lines[len(lines)-1], "dropped_records", "only a buffered session states drops")
	assert.Zero(t, s.Dropped())
}

func TestBufferedRunJSONIsChecked(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ buffer, msg string }{
		{`{"max_bytes":0}`, `"buffer.max_bytes" must be >= 1, got 0`},
		{`{"max_bytes":-5}`, `"buffer.max_bytes" must be a non-negative integer, got -5`},
		{`{"max_bytes":10.5}`, `"buffer.max_bytes" must be an integer literal`},
		{`{"max_bytes":1,"ring":2}`, `unknown key "buffer.ring"`},
	} {
		path := filepath.Join(dir, "t.jsonl")
		_, err := Open(path, []byte(`{"entrypoint":"e","phase":"train","capture_step":1,"device":"cpu","buffer":`+tc.buffer+`}`))
		requireCode(t, err, InvalidArgument, tc.msg)
		assert.NoFileExists(t, path)
	}
}

// Past max_bytes the detail records go (counted, CT_OK), spans and
// gradients stay, and candle-graph still takes the trace.
func TestBufferedOverflowKeepsTheTraceValid(t *testing.T) {
	const maxBytes = 24 << 10
	s, path := openBuffered(t, bufRun(maxBytes, `,"capture_contract":{"required_semantic_labels":["update"]}`))
	m, err := s.BeginMeasurement("update")
	require.NoError(t, err)
	const steps = 100
	for i := 0; i < steps; i++ {
		layer, err := s.BeginSpan(fmt.Sprintf("layer.%d", i), events.SpanModule, events.StepForward)
		require.NoError(t, err)
		spin(2_000)
		require.NoError(t, s.RecordOp(layer, op("matmul", 0, 500)), "a dropped record is not an error")
		require.NoError(t, s.RecordMemory(layer, &events.Memory{Action: events.MemoryAlloc, StorageID: fmt.Sprint("st-", i), TensorID: fmt.Sprint("t-", i),
			Device: "cpu", Dtype: "f32", Bytes: 64, Shape: []uint64{16}}))
		require.NoError(t, s.RecordScalar(layer, "loss", float64(i)))
		require.NoError(t, s.RecordMemory(layer, &events.Memory{Action: events.MemoryFree, StorageID: fmt.Sprint("st-", i), TensorID: fmt.Sprint("t-", i),
			Device: "cpu", Dtype: "f32", Bytes: 64, Shape: []uint64{16}}))
		end(t, s, layer)
	}
	end(t, s, m)
	norm := 2.0
	require.NoError(t, s.RecordGradient("mlp", "w", events.GradientPresent, &norm))
	dropped := s.Dropped()
	assert.NotZero(t, dropped.Records)
	require.NoError(t, s.Finish())

	lines := testutil.Lines(t, path)
	assert.Equal(t, dropped, terminalDropped(t, lines), "the terminal states what ct_dropped_records said")
	assert.Len(t, testutil.OfKind(lines, "span_start"), steps+2, "every span is kept below the hard cap")
	assert.Len(t, testutil.OfKind(lines, "gradient"), 1)
	kept := len(testutil.OfKind(lines, "op")) + len(testutil.OfKind(lines, "memory")) + len(testutil.OfKind(lines, "tensor_stats"))
	assert.Equal(t, uint64(4*steps), uint64(kept)+dropped.Records, "each detail record is kept or counted")
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.LessOrEqual(t, st.Size(), int64(2*maxBytes+1024), "the hard cap bounds the trace")
	h := testutil.RequireValid(t, path)
	for _, i := range h.Issues {
		assert.NotEqual(t, "error", i.Severity, i.Code)
	}
}

// Past twice max_bytes spans go too, but the measured region and a required
// label's span stay, with the dropped spans they open under.
func TestBufferedHardCapKeepsWhatTheTraceNeeds(t *testing.T) {
	const maxBytes = 1 << 10 // less than the meta line: every detail record goes
	s, path := openBuffered(t, bufRun(maxBytes, `,"capture_contract":{"required_semantic_labels":["mlp/forward"]}`))
	for i := 0; i < 40; i++ { // outgrow the hard cap with closed spans
		end(t, s, begin(t, s, fmt.Sprintf("warmup.%d", i)))
	}
	require.NoError(t, s.Flush())
	outer := begin(t, s, "outer")          // dropped: past the hard cap
	middle := begin(t, s, "middle")        // dropped too
	m, err := s.BeginMeasurement("update") // needed: revives outer and middle
	require.NoError(t, err)
	fwd, err := s.BeginSpan("mlp/forward", events.SpanModule, events.StepForward) // needed
	require.NoError(t, err)
	inner := begin(t, s, "inner") // dropped
	spin(5_000)
	require.NoError(t, s.RecordOp(inner, op("matmul", 0, 100)))
	end(t, s, inner)
	require.NoError(t, s.RecordCallEdge(fwd, inner, 0), "an edge to a dropped span goes with it")
	end(t, s, fwd)
	end(t, s, m)
	end(t, s, middle)
	end(t, s, outer)
	late, err := s.RecordCompletedSpan("completed", events.SpanFunction, 0, 1)
	require.NoError(t, err)
	require.NoError(t, s.RecordCallEdge(1, late, 0))
	require.NoError(t, s.Finish())

	lines := testutil.Lines(t, path)
	names := map[string]bool{}
	for _, l := range testutil.OfKind(lines, "span_start") {
		names[l["name"].(string)] = true
	}
	for _, want := range []string{"test::train", "outer", "middle", "update", "mlp/forward"} {
		assert.True(t, names[want], "%s is in the trace", want)
	}
	for _, gone := range []string{"inner", "completed"} {
		assert.False(t, names[gone], "%s was dropped", gone)
	}
	assert.Less(t, len(testutil.OfKind(lines, "span_start")), 40+6, "spans past the hard cap were dropped")
	assert.Empty(t, testutil.OfKind(lines, "op"))
	assert.Empty(t, testutil.OfKind(lines, "edge"))
	d := terminalDropped(t, lines)
	assert.Equal(t, s.Dropped(), d, "Dropped still answers after the finish")
	assert.GreaterOrEqual(t, d.Records, uint64(2+2+1+1+1), "inner (2), completed (2), its edge, the op, fwd->inner")
	testutil.RequireValid(t, path)
}

// A dropped span still open at ct_finish_failed counts as one line.
func TestBufferedFinishFailedCountsDroppedOpenSpans(t *testing.T) {
	s, path := openBuffered(t, bufRun(1<<9, ""))
	for i := 0; i < 20; i++ {
		end(t, s, begin(t, s, "filler"))
	}
	require.NoError(t, s.Flush())
	before := s.Dropped().Records
	begin(t, s, "open/dropped")
	require.NoError(t, s.FinishFailed("exception"))
	lines := testutil.Lines(t, path)
	d := terminalDropped(t, lines)
	assert.Equal(t, before+1, d.Records)
	for _, l := range testutil.OfKind(lines, "span_start") {
		assert.NotEqual(t, "open/dropped", l["name"])
	}
	testutil.RequireValidFailed(t, path)
}

// 10,000 flight recordings discarded: memory stays flat and every session's
// goroutine and slot go.
func TestBufferedDiscardCyclesKeepMemoryFlat(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	dir := t.TempDir()
	run := []byte(bufRun(64<<10, ""))
	cycle := func(i int) {
		s, err := Open(filepath.Join(dir, "flight", "trace.jsonl"), run)
		require.NoError(t, err)
		m, err := s.BeginMeasurement("update")
		require.NoError(t, err)
		fwd, err := s.BeginSpan("forward", events.SpanModule, events.StepForward)
		require.NoError(t, err)
		for j := 0; j < 20; j++ {
			require.NoError(t, s.RecordOp(fwd, op("matmul", 0, 1)))
			require.NoError(t, s.RecordScalar(fwd, "loss", float64(j)))
		}
		end(t, s, fwd)
		if i%2 == 0 {
			end(t, s, m) // and every other one discarded with a span open
		}
		require.NoError(t, s.Discard())
	}
	for i := 0; i < 500; i++ {
		cycle(i)
	}
	base, goroutines := settledRSS(t), runtime.NumGoroutine()
	heapBase := heapInuse()
	for i := 0; i < 10_000; i++ {
		cycle(i)
	}
	after, heapAfter := settledRSS(t), heapInuse()
	t.Logf("RSS %d KiB after warm-up, %d KiB after 10,000 cycles (Go heap in use %d -> %d KiB)",
		base>>10, after>>10, heapBase>>10, heapAfter>>10)
	// A leaked buffer alone would be 10,000 x 64 KiB = 625 MiB. Without the
	// race detector RSS moves by about 1 MiB; with it, by about 30 MiB of
	// the detector's own bookkeeping (10,000 flusher goroutines).
	limit := int64(32 << 20)
	if raceEnabled {
		limit = 96 << 20
	}
	assert.Less(t, after-base, limit, "RSS grew by %d KiB over 10,000 discarded sessions", (after-base)>>10)
	assert.Less(t, heapAfter-heapBase, int64(8<<20), "the Go heap grew by %d KiB", (heapAfter-heapBase)>>10)
	assert.LessOrEqual(t, runtime.NumGoroutine(), goroutines+2, "the flushers ended")
	mu.Lock()
	n := len(live)
	mu.Unlock()
	assert.Zero(t, n, "no session is left registered")
	assert.NoDirExists(t, filepath.Join(dir, "flight"))
}

// snapshotTree is snapshotDir of dir and of each folder in it.
func snapshotTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := snapshotDir(t, dir)
	for name, desc := range snapshotDir(t, dir) {
		if strings.HasPrefix(desc, "d") {
			for sub, d := range snapshotDir(t, filepath.Join(dir, name)) {
				out[name+"/"+sub] = d
			}
		}
	}
	return out
}

// heapInuse is the Go heap in use after a collection.
func heapInuse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// settledRSS is the resident set after the garbage is collected and returned.
func settledRSS(t *testing.T) int64 {
	t.Helper()
	runtime.GC()
	debug.FreeOSMemory()
	data, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Skip("no /proc/self/statm")
	}
	f := strings.Fields(string(data))
	require.GreaterOrEqual(t, len(f), 2)
	pages, err := strconv.ParseInt(f[1], 10, 64)
	require.NoError(t, err)
	return pages * int64(os.Getpagesize())
}

// ct_reopen: the next update's session is the one ct_open would open with the
// run JSON's capture_step changed, and the one before it is gone unwritten.
func TestBufferedReopenIsTheNextUpdatesSession(t *testing.T) {
	s, path := openBuffered(t, bufRun(1<<20, `,"tags":{"k":"v"}`))
	step(t, s)
	next := filepath.Join(filepath.Dir(path), "update-8.jsonl")
	n, err := s.Reopen(next, 8)
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Discard() })
	assert.NotEqual(t, s.Handle(), n.Handle())
	_, err = Lookup(s.Handle())
	requireCode(t, err, InvalidHandle, "")
	assert.NoFileExists(t, path, "the session before was discarded, not written")
	assert.NoFileExists(t, next, "the new one is buffered: nothing yet")
	step(t, n)
	require.NoError(t, n.Finish())
	testutil.RequireValid(t, next)
	meta := testutil.Lines(t, next)[0]
	assert.EqualValues(t, 8, meta["capture_step"])
	assert.EqualValues(t, 7, meta["warmup_steps"], "defaulted again from the new step")
	assert.Equal(t, "test::train/update-8", meta["correlation_id"])
	assert.Equal(t, map[string]any{"k": "v"}, meta["tags"])
}

// A reopened session takes the memory of the one before (its encode buffer,
// its contract's keys) but none of what it recorded: a gradient recorded in
// the update before is expected again, and the trace starts at its meta line.
func TestBufferedReopenStartsTheContractAfresh(t *testing.T) {
	s, path := openBuffered(t, bufRun(1<<20, `,"capture_contract":{"measurement_scope":"profiled_work","gradients":"complete",`+
		`"gradient_contract":{"expected":[{"root":"mlp","key":"fc1.weight","family":"fc1"},{"root":"mlp","key":"fc2.weight","family":"fc2"}],`+
		`"families":[{"family":"fc1","expectation":"active","min_present":1},{"family":"fc2","expectation":"active","min_present":1}]}}`))
	one := 1.0
	step(t, s) // fc1.weight present
	require.NoError(t, s.RecordGradient("mlp", "fc2.weight", events.GradientPresent, &one))
	n, err := s.Reopen(path, 3)
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Discard() })
	step(t, n)
	requireCode(t, n.Finish(), State, "expects gradients not recorded: mlp/fc2.weight;")
	require.NoError(t, n.RecordGradient("mlp", "fc2.weight", events.GradientPresent, &one))
	require.NoError(t, n.Finish())
	testutil.RequireValid(t, path)
	lines := testutil.Lines(t, path)
	assert.Equal(t, "meta", lines[0]["kind"])
	assert.EqualValues(t, 3, lines[0]["capture_step"])
	var grads []string
	for _, l := range lines {
		if l["kind"] == "gradient" {
			grads = append(grads, fmt.Sprint(l["key"], " ", l["state"]))
		}
	}
	assert.Equal(t, []string{"fc1.weight present", "fc2.weight present"}, grads, "only this update's")
}

func TestBufferedReopenKeepsWhatTheRunJSONGave(t *testing.T) {
	s, path := openBuffered(t, bufRun(1<<20, `,"warmup_steps":1,"correlation_id":"mine"`))
	n, err := s.Reopen(path, 9)
	require.NoError(t, err)
	step(t, n)
	require.NoError(t, n.Finish())
	meta := testutil.Lines(t, path)[0]
	assert.EqualValues(t, 9, meta["capture_step"])
	assert.EqualValues(t, 1, meta["warmup_steps"])
	assert.Equal(t, "mine", meta["correlation_id"])
}

// The caller's mistakes leave the session as it was; a streaming session is
// refused and stays usable.
func TestBufferedReopenRefusals(t *testing.T) {
	s, path := openBuffered(t, bufRun(1<<20, `,"warmup_steps":1`))
	_, err := s.Reopen(path, 0)
	requireCode(t, err, InvalidArgument, "ct_reopen: ")
	_, err = s.Reopen(path, 1)
	requireCode(t, err, InvalidArgument, "warmup_steps")
	_, err = s.Reopen(" ", 6)
	requireCode(t, err, InvalidArgument, "path is empty")
	_, err = Lookup(s.Handle())
	require.NoError(t, err, "still open")
	step(t, s)
	require.NoError(t, s.Finish())
	testutil.RequireValid(t, path)
	_, err = s.Reopen(path, 6)
	requireCode(t, err, InvalidHandle, "ct_reopen: ")

	st, stPath := openT(t, trainRun)
	_, err = st.Reopen(stPath, 3)
	requireCode(t, err, State, "only a buffered session")
	step(t, st)
	require.NoError(t, st.Finish())
	testutil.RequireValid(t, stPath)
}

// The sessions of one run share the meta line's facts about the process:
// a reopened session takes them from the one before (they are not read
// again), a new run reads them afresh. Each trace still has its own run id.
func TestBufferedReopenTakesTheProcessFactsOfTheRun(t *testing.T) {
	t.Setenv("RANK", "3")
	t.Setenv("WORLD_SIZE", "4")
	s, path := openBuffered(t, bufRun(1<<20, ""))
	t.Setenv("RANK", "5")
	t.Setenv("WORLD_SIZE", "8")
	next := filepath.Join(filepath.Dir(path), "update-8.jsonl")
	n, err := s.Reopen(next, 8)
	require.NoError(t, err)
	step(t, n)
	require.NoError(t, n.Finish())
	fresh, freshPath := openT(t, trainRun)
	step(t, fresh)
	require.NoError(t, fresh.Finish())

	reopened, opened := testutil.Lines(t, next)[0], testutil.Lines(t, freshPath)[0]
	proc := reopened["process"].(map[string]any)
	assert.EqualValues(t, 3, proc["rank"], "the run's, not read again")
	assert.EqualValues(t, 4, proc["world_size"])
	assert.EqualValues(t, os.Getpid(), proc["pid"])
	host, _ := os.Hostname()
	assert.Equal(t, host, proc["hostname"])
	freshProc := opened["process"].(map[string]any)
	assert.EqualValues(t, 5, freshProc["rank"], "a new run reads the environment")
	assert.EqualValues(t, 8, freshProc["world_size"])
	assert.NotEqual(t, opened["run_id"], reopened["run_id"])
}

// A reopened session's path in the folder the one before checked costs no
// second look at the folder: a folder made unusable in between is found at
// ct_finish, which then writes nothing and says why.
func TestBufferedReopenTrustsTheFolderCheckedBefore(t *testing.T) {
	s, path := openBuffered(t, bufRun(1<<20, ""))
	dir := filepath.Dir(path)
	require.NoError(t, os.MkdirAll(filepath.Dir(dir), 0o755))
	require.NoError(t, os.WriteFile(dir, []byte("a file now"), 0o600))
	n, err := s.Reopen(filepath.Join(dir, "update-8.jsonl"), 8)
	require.NoError(t, err, "the folder was found usable for the update before")
	step(t, n)
	requireCode(t, n.Finish(), IO, "nothing was written")

	fresh := filepath.Join(dir, "other.jsonl")
	_, err = Open(fresh, []byte(bufRun(1<<20, "")))
	requireCode(t, err, IO, "is not a directory")
}

// Reopened over and over, a recorder's sessions keep memory flat, as
// open/discard cycles do.
func TestBufferedReopenCyclesReleaseTheirSlots(t *testing.T) {
	s, path := openBuffered(t, bufRun(1<<20, ""))
	for i := uint64(3); i < 600; i++ { // more than the 255 slots
		step(t, s)
		n, err := s.Reopen(path, i)
		require.NoError(t, err)
		s = n
	}
	require.NoError(t, s.Discard())
	assert.NoFileExists(t, path)
}
