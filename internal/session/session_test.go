package session

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/testutil"
)

func TestOpenWritesMetaAndRootImmediately(t *testing.T) {
	s, path := openT(t, trainRun)
	lines := testutil.Lines(t, path) // on disk before any flush
	require.Len(t, lines, 2)
	assert.Equal(t, "meta", lines[0]["kind"])
	assert.Equal(t, "test::train/update-2", lines[0]["correlation_id"])
	assert.Equal(t, "span_start", lines[1]["kind"])
	assert.Equal(t, "s1", lines[1]["id"])
	assert.Equal(t, "test::train", lines[1]["name"])
	assert.NotContains(t, lines[1], "parent_id")
	assert.NotContains(t, lines[1], "measured", "measured defaults to false and is omitted")
	assert.NotZero(t, s.Handle())
}

func TestOpenRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	notDir := dir + "/file"
	require.NoError(t, os.WriteFile(notDir, []byte("x"), 0o644))
	tests := []struct {
		name, path, run string
		code            Status
		msg             string
	}{
		{"empty path", "", trainRun, InvalidArgument, "path is empty"},
		{"not json", dir + "/a.jsonl", `{"entrypoint":`, InvalidArgument, "ct_open"},
		{"missing device", dir + "/b.jsonl", `{"entrypoint":"e","phase":"train","capture_step":1}`, InvalidArgument, "device"},
		{"capture_step 0", dir + "/c.jsonl", `{"entrypoint":"e","phase":"train","capture_step":0,"device":"cpu"}`, InvalidArgument, "capture_step"},
		{"unknown key", dir + "/d.jsonl", `{"entrypoint":"e","phase":"train","capture_step":1,"device":"cpu","capture_stpe":2}`, InvalidArgument, "capture_stpe"},
		{"parent is a file", notDir + "/t.jsonl", trainRun, IO, "create folder"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Open(tc.path, []byte(tc.run))
			requireCode(t, err, tc.code, tc.msg)
			if tc.path != "" {
				_, statErr := os.Stat(tc.path)
				assert.Error(t, statErr, "nothing that claims to be a trace is left")
			}
		})
	}
}

func TestSpansNestAndCloseWithDurations(t *testing.T) {
	s, path := openT(t, trainRun)
	m, err := s.BeginMeasurement("update")
	require.NoError(t, err)
	fwd, err := s.BeginSpan("forward", events.SpanModule, events.StepForward)
	require.NoError(t, err)
	op := begin(t, s, "matmul")
	time.Sleep(time.Millisecond)
	end(t, s, op)
	end(t, s, fwd)
	end(t, s, m)
	require.NoError(t, s.Finish())

	lines := testutil.Lines(t, path)
	starts := testutil.OfKind(lines, "span_start")
	require.Len(t, starts, 4)
	parents := map[string]any{}
	for _, st := range starts {
		parents[st["name"].(string)] = st["parent_id"]
	}
	assert.Equal(t, map[string]any{"test::train": nil, "update": "s2", "forward": fmt.Sprint("s", m), "matmul": fmt.Sprint("s", fwd)}, map[string]any{
		"test::train": parents["test::train"], "update": fmt.Sprint("s", m), "forward": parents["forward"], "matmul": parents["matmul"]})
	ends := testutil.OfKind(lines, "span_end")
	require.Len(t, ends, 4)
	assert.Equal(t, fmt.Sprint("s", op), ends[0]["id"])
	assert.GreaterOrEqual(t, ends[0]["duration_ns"].(float64), float64(time.Millisecond))
	assert.Equal(t, "s1", ends[3]["id"])
	term := lines[len(lines)-1]
	assert.Equal(t, "terminal", term["kind"])
	assert.Equal(t, "complete", term["outcome"])
	assert.Equal(t, ends[3]["duration_ns"], term["timestamp_ns"])
	testutil.RequireValid(t, path)
}

func TestSpanEndMustBeInnermostOfThisThread(t *testing.T) {
	s, path := openT(t, trainRun)
	a := begin(t, s, "a")
	b := begin(t, s, "b")
	requireCode(t, s.EndSpan(a), SpanMismatch, fmt.Sprintf("s%d is not the innermost open span of this thread (s%d is)", a, b))
	requireCode(t, s.EndSpan(1), SpanMismatch, "not the innermost")

	// Another OS thread has no open spans at all.
	var other error
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		other = s.EndSpan(b)
		close(done)
	}()
	<-done
	requireCode(t, other, SpanMismatch, "is not open on this thread")
	end(t, s, b)
	end(t, s, a)
	require.NoError(t, s.Flush())
	assert.Len(t, testutil.OfKind(testutil.Lines(t, path), "span_end"), 2, "refused ends write nothing")
}

func TestRootCannotBeEnded(t *testing.T) {
	s, _ := openT(t, trainRun)
	requireCode(t, s.EndSpan(1), SpanMismatch, "s1 is the root span; ct_finish closes it")
}

func TestMeasuredRegionAtMostOnce(t *testing.T) {
	s, _ := openT(t, trainRun)
	m, err := s.BeginMeasurement("update")
	require.NoError(t, err)
	_, err = s.BeginMeasurement("again")
	requireCode(t, err, State, "already has its measured region")
	end(t, s, m)
	_, err = s.BeginMeasurement("after")
	requireCode(t, err, State, "already has its measured region")

	root, _ := openT(t, measuredRootRun)
	_, err = root.BeginMeasurement("m")
	requireCode(t, err, State, "already has its measured region")
}

func TestFinishRefusesIncompleteCapture(t *testing.T) {
	s, path := openT(t, trainRun)
	requireCode(t, s.Finish(), State, "no measured region")
	m, err := s.BeginMeasurement("update")
	require.NoError(t, err)
	inner := begin(t, s, "inner")
	requireCode(t, s.Finish(), State, fmt.Sprintf(`2 spans still open: s%d "update"`, m))
	end(t, s, inner)
	end(t, s, m)
	require.NoError(t, s.Finish(), "the session stayed usable")
	testutil.RequireValid(t, path)
	requireCode(t, s.Finish(), InvalidHandle, "unknown or already finished")
	_, err = s.BeginSpan("late", events.SpanFunction, events.StepNone)
	requireCode(t, err, InvalidHandle, "unknown or already finished")
}

func TestSpanBeginRefusesBadArguments(t *testing.T) {
	s, _ := openT(t, trainRun)
	tests := []struct {
		name     string
		span     string
		kind     events.SpanKind
		step     events.Step
		code     Status
		contains string
	}{
		{"empty name", "", events.SpanFunction, events.StepNone, InvalidArgument, "name is empty"},
		{"blank name", " \t\n", events.SpanFunction, events.StepNone, InvalidArgument, "name is empty"},
		{"invalid utf-8", "bad\xff", events.SpanFunction, events.StepNone, InvalidArgument, "not valid UTF-8"},
		{"overlong encoding", "\xc0\xaf", events.SpanFunction, events.StepNone, InvalidArgument, "not valid UTF-8"},
		{"surrogate", "\xed\xa0\x80", events.SpanFunction, events.StepNone, InvalidArgument, "not valid UTF-8"},
		{"unknown kind", "x", 7, events.StepNone, InvalidArgument, "unknown span kind 7"},
		{"unknown step", "x", events.SpanFunction, 9, InvalidArgument, "unknown step 9"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.BeginSpan(tc.span, tc.kind, tc.step)
			requireCode(t, err, tc.code, tc.contains)
		})
	}
	_, err := beginSpanC(0, "x", 0, 0, false)
	requireCode(t, err, InvalidHandle, "handle is 0")
	_, err = beginSpanC(s.Handle()+256, "x", 0, 0, false)
	requireCode(t, err, InvalidHandle, "unknown or already finished")
}

func TestCompletedSpanIsRootAttachedAndStackNeutral(t *testing.T) {
	s, path := openT(t, measuredRootRun)
	live := begin(t, s, "live")
	start := s.Now()
	time.Sleep(100 * time.Microsecond)
	dur := s.Now() - start
	id, err := s.RecordCompletedSpan("background", events.SpanFunction, start, dur)
	require.NoError(t, err)
	end(t, s, live) // the live span is still this thread's innermost
	require.NoError(t, s.Finish())

	lines := testutil.Lines(t, path)
	var found bool
	for _, l := range testutil.OfKind(lines, "span_start") {
		if l["id"] == fmt.Sprint("s", id) {
			found = true
			assert.Equal(t, "s1", l["parent_id"])
			assert.Equal(t, float64(start), l["start_ns"])
		}
	}
	require.True(t, found)
	testutil.RequireValid(t, path)

	s2, _ := openT(t, measuredRootRun)
	for _, tc := range []struct {
		start, dur uint64
		msg        string
	}{
		{0, 0, "duration must be positive"},
		{math.MaxUint64, 1, "overflows"},
		{s2.Now() + 60e9, 1, "in the future"},
	} {
		_, err := s2.RecordCompletedSpan("x", events.SpanFunction, tc.start, tc.dur)
		requireCode(t, err, InvalidArgument, tc.msg)
	}
	_, err = s2.RecordCompletedSpan(" ", events.SpanFunction, 0, 1)
	requireCode(t, err, InvalidArgument, "name is empty")
}

func TestConcurrentThreadsNestIndependently(t *testing.T) {
	s, path := openT(t, measuredRootRun)
	const threads, iters = 6, 3000
	var wg sync.WaitGroup
	errs := make(chan error, threads)
	for i := 0; i < threads; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for j := 0; j < iters; j++ {
				outer, err := s.BeginSpan(fmt.Sprintf("t%d/outer", i), events.SpanFunction, events.StepNone)
				if err != nil {
					errs <- err
					return
				}
				inner, err := s.BeginSpan(fmt.Sprintf("t%d/inner", i), events.SpanOp, events.StepNone)
				if err == nil {
					err = s.RecordScalar(inner, "x", float64(j))
				}
				if err == nil {
					err = s.EndSpan(inner)
				}
				if err == nil {
					err = s.EndSpan(outer)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, s.Finish())
	lines := testutil.Lines(t, path)
	starts := testutil.OfKind(lines, "span_start")
	require.Len(t, starts, 1+threads*iters*2)
	byID := map[string]map[string]any{}
	for _, st := range starts {
		byID[st["id"].(string)] = st
	}
	for _, st := range starts {
		name := st["name"].(string)
		if strings.HasSuffix(name, "/inner") {
			parent := byID[st["parent_id"].(string)]
			assert.Equal(t, strings.TrimSuffix(name, "/inner")+"/outer", parent["name"], "inner spans nest under their own thread's outer span")
			assert.Equal(t, parent["tid"], st["tid"])
		}
	}
	assert.Len(t, testutil.OfKind(lines, "tensor_stats"), threads*iters)
	testutil.RequireValid(t, path)
}

func TestRingOverflowLosesNothing(t *testing.T) {
	s, path := openT(t, measuredRootRun, WithFlushInterval(time.Hour))
	require.NoError(t, spanPairsC(s.Handle(), 1))
	ring := ownRingProbe()
	// Several times the ring's whole address space, stretched included,
	// with no background flush to help: the producer must wait for room.
	n := 1 + int(3*ring.cap/compactPairBytes)
	require.NoError(t, spanPairsC(s.Handle(), n-1))
	assert.Greater(t, ownRingProbe().waits, ring.waits, "the producer waited for room")
	require.NoError(t, s.Finish())
	starts, ends := countSpanLines(t, path)
	assert.Equal(t, n+1, starts)
	assert.Equal(t, n+1, ends)
}

func TestBackgroundFlushBoundsWhatIsOnlyInMemory(t *testing.T) {
	s, path := openT(t, measuredRootRun, WithFlushInterval(20*time.Millisecond))
	id := begin(t, s, "visible-soon")
	end(t, s, id)
	require.NoError(t, s.RecordScalar(id, "loss", 1.5))
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		if strings.Contains(string(data), `"loss"`) && strings.Contains(string(data), `"visible-soon"`) {
			assert.True(t, strings.HasSuffix(string(data), "\n"), "only whole lines are written")
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("events were not flushed by the background flusher")
}

func TestWriteErrorPoisonsTheSession(t *testing.T) {
	sink := &failingSink{budget: 4096}
	s, _ := openT(t, trainRun, WithOpener(func(string) (Sink, error) { return sink, nil }), WithFlushInterval(time.Hour))
	m, err := s.BeginMeasurement("update")
	require.NoError(t, err)
	for i := 0; i < 100; i++ {
		require.NoError(t, s.RecordScalar(m, "a-scalar-label-that-takes-room", float64(i)))
	}
	requireCode(t, s.Flush(), IO, "disk full (fake)")
	_, err = s.BeginSpan("later", events.SpanFunction, events.StepNone)
	requireCode(t, err, Poisoned, "poisoned by an earlier write error (disk full (fake))")
	requireCode(t, s.RecordScalar(m, "x", 1), Poisoned, "only ct_finish_failed works")
	requireCode(t, s.EndSpan(m), Poisoned, "poisoned")
	requireCode(t, s.Finish(), Poisoned, "poisoned")
	requireCode(t, s.Flush(), Poisoned, "poisoned")
	// The small terminal line still fits: the trace ends failed and says why
	// events are missing.
	require.NoError(t, s.FinishFailed("disk filled up"))
	out := string(sink.bytes())
	assert.NotContains(t, out, `"complete"`)
	assert.Contains(t, out, `"reason":"disk filled up (events after the last successful write are lost: disk full (fake))"`)
	assert.NotContains(t, out, "a-scalar-label", "the failed buffer was not half-written")
	assert.True(t, sink.closed)
	requireCode(t, s.FinishFailed("again"), InvalidHandle, "already finished")

	// When even the terminal cannot be written, finish_failed says so and
	// still releases the handle.
	dead := &failingSink{budget: 1 << 20}
	s2, _ := openT(t, trainRun, WithOpener(func(string) (Sink, error) { return dead, nil }))
	dead.budget = 0
	require.NoError(t, s2.RecordScalar(1, "buffered", 1))
	requireCode(t, s2.Flush(), IO, "disk full")
	requireCode(t, s2.FinishFailed("x"), IO, "disk full (fake)")
	requireCode(t, s2.Flush(), InvalidHandle, "already finished")
}

func TestDevFullNeverCompletes(t *testing.T) {
	// Some sandboxes have no /dev/full; opening it would then create a
	// regular file there. .ci/run creates the device.
	if st, err := os.Stat("/dev/full"); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		t.Fatalf("/dev/full is not the full device (create it: mknod -m 666 /dev/full c 1 7)")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s, err := Open("/dev/full", []byte(measuredRootRun))
	requireCode(t, err, IO, "no space left on device")
	assert.Nil(t, s)
}

func TestFinishFailedLeavesSpansOpenAndStatesReason(t *testing.T) {
	s, path := openT(t, trainRun)
	m, err := s.BeginMeasurement("update")
	require.NoError(t, err)
	_ = m
	requireCode(t, s.FinishFailed("  "), InvalidArgument, "reason is empty")
	require.NoError(t, s.FinishFailed("loss became NaN at step 2"))
	lines := testutil.Lines(t, path)
	term := lines[len(lines)-1]
	assert.Equal(t, "failed", term["outcome"])
	assert.Equal(t, "loss became NaN at step 2", term["reason"])
	assert.Empty(t, testutil.OfKind(lines, "span_end"), "open spans stay open")
	err, h, _ := testutil.Summarize(t, path)
	assert.Error(t, err, "--require-valid refuses a failed capture")
	assert.False(t, h.CaptureComplete)
}

func TestRunJSONNamesTheBinding(t *testing.T) {
	_, path := openT(t, `{"entrypoint":"b","phase":"infer","capture_step":1,"device":"cpu","binding":"python"}`)
	meta := testutil.Lines(t, path)[0]
	assert.Equal(t, "python", meta["producer"].(map[string]any)["binding"])
	_, err := Open(t.TempDir()+"/x.jsonl", []byte(`{"entrypoint":"b","phase":"infer","capture_step":1,"device":"cpu","binding":" "}`))
	requireCode(t, err, InvalidArgument, `"binding" must not be empty`)
}

// InnermostSpan reads the calling thread's own span stack: what the CUPTI
// collector records for a launch from that thread.
func TestInnermostSpanPerThread(t *testing.T) {
	s, _ := openT(t, measuredRootRun)
	assert.Equal(t, uint64(1), s.InnermostSpan(), "no span open on this thread: the root")
	outer := begin(t, s, "outer")
	inner := begin(t, s, "inner")
	assert.Equal(t, inner, s.InnermostSpan())

	got := make(chan [2]uint64)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		before := s.InnermostSpan()
		id, err := s.BeginSpan("other thread", events.SpanFunction, events.StepNone)
		if err != nil {
			got <- [2]uint64{0, 0}
			return
		}
		in := s.InnermostSpan()
		_ = s.EndSpan(id)
		got <- [2]uint64{before, in}
	}()
	g := <-got
	assert.Equal(t, uint64(1), g[0], "another thread's stack is its own")
	assert.NotZero(t, g[1])
	assert.NotEqual(t, inner, g[1])

	end(t, s, inner)
	assert.Equal(t, outer, s.InnermostSpan())
	end(t, s, outer)
	assert.Equal(t, uint64(1), s.InnermostSpan())
	require.NoError(t, s.Finish())
	assert.Equal(t, uint64(1), s.InnermostSpan(), "a finished session: the root")
	assert.NotZero(t, s.MonotonicStart())
}

// A refused ct_finish leaves the session as it was: another thread's spans
// go on without a single refusal while finish is refused over and over.
// The worker makes a batch of pairs as each Finish begins, not as many as it
// can: a refused Finish drains all the worker made, and a thread's ring holds
// megabytes of them (it stretches), so an unbounded worker made this test
// as slow as the drainer (past the test timeout under -race).
func TestRefusedFinishLeavesOtherThreadsUnhindered(t *testing.T) {
	const batch = 100
	tests := []struct {
		name, file, run string
	}{
		{"trace", "trace.jsonl", measuredRootRun},
		{"aggregate", "summary.json", aggregateRun},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			s, err := Open(filepath.Join(t.TempDir(), tc.file), []byte(tc.run))
			require.NoError(t, err)
			open := begin(t, s, "held/open")

			type result struct {
				pairs, refused int
				first          error
			}
			next, began := make(chan bool), make(chan struct{})
			done := make(chan result)
			go func() {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				var r result
				for <-next { // a batch per Finish, begun as it begins
					began <- struct{}{}
					for k := 0; k < batch; k++ {
						id, err := s.BeginSpan("worker/span", events.SpanFunction, events.StepNone)
						if err == nil {
							err = s.EndSpan(id)
						}
						if err != nil {
							if r.first == nil {
								r.first = err
							}
							r.refused++
						} else {
							r.pairs++
						}
					}
				}
				done <- r
			}()
			for i := 0; i < 2000; i++ {
				next <- true
				<-began
				requireCode(t, s.Finish(), State, "spans still open")
			}
			next <- false
			r := <-done
			assert.Zero(t, r.refused, "the worker's span calls were refused %d times (first: %v)", r.refused, r.first)
			assert.NotZero(t, r.pairs)
			end(t, s, open)
			require.NoError(t, s.Finish(), "the session stayed usable")
		})
	}
}

// ct_open never follows a final symbolic link and never truncates a file
// that is not empty, a trace or a summary: such a path is refused with the
// file left as it was. A rerun over its own previous output goes on.
func TestOpenNeverOverwritesSomeoneElsesFile(t *testing.T) {
	writeFile := func(content string) func(t *testing.T, dir, path string) {
		return func(t *testing.T, _, path string) { require.NoError(t, os.WriteFile(path, []byte(content), 0o644)) }
	}
	previousTrace := func(t *testing.T, _, path string) {
		s, err := Open(path, []byte(measuredRootRun))
		require.NoError(t, err)
		require.NoError(t, s.FinishFailed("the previous run"))
	}
	previousSummary := func(t *testing.T, _, path string) {
		s, err := Open(path, []byte(aggregateRun))
		require.NoError(t, err)
		require.NoError(t, s.Finish())
	}
	tests := []struct {
		name  string
		run   string
		make  func(t *testing.T, dir, path string)
		code  Status // OK: opened and written
		msg   string
		check func(t *testing.T, path string) // after a successful open and finish
	}{
		{"trace over a symlink to a file", measuredRootRun, func(t *testing.T, dir, path string) {
			victim := filepath.Join(dir, "victim.txt")
			require.NoError(t, os.WriteFile(victim, []byte("victim\n"), 0o644))
			require.NoError(t, os.Symlink(victim, path))
		}, IO, "is a symbolic link, which candle-trace does not follow", nil},
		{"trace over a dangling symlink", measuredRootRun, func(t *testing.T, dir, path string) {
			require.NoError(t, os.Symlink(filepath.Join(dir, "nowhere.jsonl"), path))
		}, IO, "symbolic link", nil},
		{"trace over a script", measuredRootRun, writeFile("import torch\nprint('train')\n"),
			IO, `is not a candle-trace trace or summary (it starts with "import torch\nprint('train')\n"); refusing to overwrite it`, nil},
		{"trace over JSONL that is not ours", measuredRootRun, writeFile(`{"kind":"span_start","id":"s1"}` + "\n"),
			IO, "is not a candle-trace trace or summary", nil},
		{"trace over another schema's meta", measuredRootRun, writeFile(`{"kind":"meta","schema":"candle-graph/trace/9"}` + "\n"),
			IO, "is not a candle-trace trace or summary", nil},
		{"trace over an empty file", measuredRootRun, writeFile(""), OK, "", nil},
		{"trace over its previous trace", measuredRootRun, previousTrace, OK, "", func(t *testing.T, path string) {
			lines := testutil.Lines(t, path)
			assert.Len(t, testutil.OfKind(lines, "meta"), 1, "the previous trace was truncated")
			assert.Equal(t, "complete", lines[len(lines)-1]["outcome"])
		}},
		{"trace over a summary", measuredRootRun, previousSummary, OK, "", nil},
		{"summary over a script", aggregateRun, writeFile("#!/bin/sh\nexit 0\n"),
			IO, "is not a candle-trace trace or summary", nil},
		{"summary over a trace", aggregateRun, previousTrace, OK, "", func(t *testing.T, path string) {
			sum, err := aggregate.ReadFile(path)
			require.NoError(t, err)
			assert.True(t, sum.Final)
		}},
		{"summary over its previous summary", aggregateRun, previousSummary, OK, "", nil},
		{"summary over an empty file", aggregateRun, writeFile(""), OK, "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			dir := t.TempDir()
			path := filepath.Join(dir, "out.jsonl")
			tc.make(t, dir, path)
			before := snapshotDir(t, dir)
			s, err := Open(path, []byte(tc.run))
			if tc.code != OK {
				requireCode(t, err, tc.code, tc.msg)
				assert.Contains(t, err.Error(), path)
				assert.Equal(t, before, snapshotDir(t, dir), "nothing was changed")
				return
			}
			require.NoError(t, err)
			require.NoError(t, s.Finish())
			if tc.check != nil {
				tc.check(t, path)
			}
		})
	}
}
