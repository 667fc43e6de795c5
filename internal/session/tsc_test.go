package session

import (
	"os"
	"os/exec"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/testutil"
)

// onCounter switches trace sessions opened in the test to the counter
// clock, skipping (loudly) where the machine has no constant-rate counter.
func onCounter(t *testing.T) {
	t.Helper()
	if traceClockForce(tickCounter) != tickCounter {
		traceClockForce(tickMonotonic)
		t.Skip("no constant-rate cycle counter on this machine: trace sessions run on CLOCK_MONOTONIC")
	}
	t.Cleanup(func() { traceClockForce(tickCounter) })
}

// The drainer's conversion (Go) and the C one agree to the nanosecond on
// every segment, at and around its start, and the function never decreases.
func TestCounterClockGoAndCAgree(t *testing.T) {
	onCounter(t)
	var ticks []uint64
	for i := 0; i < tscSegs+2; i++ {
		spin(100 * time.Microsecond)
		tscPublish()
		ticks = append(ticks, tscCounter())
	}
	var snap tscSnap
	snap.take()
	require.Equal(t, tscSegs, snap.n)
	for i := 0; i < snap.n; i++ {
		a := uint64(snap.segs[i].tick)
		ticks = append(ticks, a-1, a, a+1, a+1000, a+1<<20)
	}
	ticks = append(ticks, tscCounter())
	sort.Slice(ticks, func(i, j int) bool { return ticks[i] < ticks[j] })
	var last uint64
	for _, tk := range ticks {
		got := snap.ns(tk)
		assert.Equal(t, tscNsC(tk), got, "tick %d", tk)
		assert.GreaterOrEqual(t, got, last, "the conversion went back at tick %d", tk)
		last = got
	}
}

// Readings of the converted counter never go back, also across segments
// published between them.
func TestCounterClockNowIsMonotonic(t *testing.T) {
	onCounter(t)
	last := tscNowC()
	for i := 0; i < 200; i++ {
		if i%10 == 0 {
			tscPublish()
		}
		now := tscNowC()
		require.GreaterOrEqual(t, now, last, "reading %d", i)
		last = now
	}
}

type tracedSpan struct {
	id, parent string
	start, end uint64
}

// spansOf reads the spans of a trace by id, with their parents and bounds.
func spansOf(t *testing.T, lines []map[string]any) map[string]*tracedSpan {
	t.Helper()
	spans := map[string]*tracedSpan{}
	for _, l := range lines {
		switch l["kind"] {
		case "span_start":
			id := l["id"].(string)
			parent, _ := l["parent_id"].(string) // absent on the root
			spans[id] = &tracedSpan{id: id, parent: parent, start: u64(t, l["start_ns"])}
		case "span_end":
			sp := spans[l["id"].(string)]
			require.NotNil(t, sp, "span_end of %v before its start", l["id"])
			sp.end = sp.start + u64(t, l["duration_ns"])
		}
	}
	return spans
}

// Nested spans made by the C fast path stay inside their parents and start
// in the order they began, whichever clock the session runs on.
func TestSpansNestOnEitherClock(t *testing.T) {
	for _, tc := range []struct {
		name    string
		source  int
		counter bool
	}{
		{"counter", tickCounter, true},
		{"CLOCK_MONOTONIC", tickMonotonic, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.counter {
				onCounter(t)
			} else {
				traceClockForce(tc.source)
				t.Cleanup(func() { traceClockForce(tickCounter) })
			}
			s, path := openT(t, measuredRootRun)
			assert.Equal(t, tc.counter, slotOnCounter(s.slot))
			outer := begin(t, s, "outer")
			require.NoError(t, spanNestC(s.handle, 4, 500))
			tscPublish() // a segment boundary among the spans
			require.NoError(t, spanNestC(s.handle, 4, 500))
			end(t, s, outer)
			require.NoError(t, s.Finish())
			testutil.RequireValid(t, path)

			lines := testutil.Lines(t, path)
			spans := spansOf(t, lines)
			require.Equal(t, 2+2*4*500, len(spans), "the root, outer and the nested spans")
			var starts []uint64
			for _, l := range testutil.OfKind(lines, "span_start") {
				starts = append(starts, spans[l["id"].(string)].start)
			}
			assert.True(t, sort.SliceIsSorted(starts, func(i, j int) bool { return starts[i] < starts[j] }),
				"spans of one thread start in the order they began")
			for _, sp := range spans {
				p := spans[sp.parent]
				if p == nil {
					continue // the root
				}
				assert.GreaterOrEqual(t, sp.start, p.start, "%s starts inside its parent %s", sp.id, p.id)
				assert.LessOrEqual(t, sp.end, p.end, "%s ends inside its parent %s", sp.id, p.id)
			}
		})
	}
}

// On the counter clock a tracer interval still stops the session clock: a
// span begun on the raw counter and ended after the interval (on the session
// clock) leaves the interval out, and spans begun after it run on the
// session clock, inside their parents.
func TestCounterClockLeavesTracerTimeOut(t *testing.T) {
	onCounter(t)
	const work, tracer = 10 * time.Millisecond, 40 * time.Millisecond
	s, path := openT(t, measuredRootRun)
	outer := begin(t, s, "outer") // on the raw counter
	spin(work)
	require.NoError(t, s.TracerBegin())
	spin(tracer)
	require.NoError(t, s.TracerEnd())
	inner := begin(t, s, "inner") // on the session clock from here on
	require.NoError(t, spanNestC(s.handle, 2, 10))
	end(t, s, inner)
	end(t, s, outer)
	require.NoError(t, s.Finish())
	testutil.RequireValid(t, path)

	spans := spansOf(t, testutil.Lines(t, path))
	o, in := spans["s2"], spans["s3"]
	require.NotNil(t, o)
	require.NotNil(t, in)
	assert.GreaterOrEqual(t, o.end-o.start, uint64(work))
	assert.Less(t, o.end-o.start, uint64(work+tracer/2), "the tracer's %v is not the outer span's", tracer)
	assert.GreaterOrEqual(t, in.start, o.start)
	assert.LessOrEqual(t, in.end, o.end)
	for _, sp := range spans {
		if p := spans[sp.parent]; p != nil {
			assert.GreaterOrEqual(t, sp.start, p.start, "%s inside %s", sp.id, p.id)
			assert.LessOrEqual(t, sp.end, p.end, "%s inside %s", sp.id, p.id)
		}
	}
}

// CANDLE_TRACE_CLOCK=monotonic keeps trace sessions on CLOCK_MONOTONIC (the
// fallback where the counter is not usable), read once at the first open:
// checked in a child process.
func TestTraceClockEnvSelectsMonotonic(t *testing.T) {
	if os.Getenv("CT_TEST_TRACE_CLOCK_CHILD") == "1" {
		s, path := openT(t, measuredRootRun)
		if slotOnCounter(s.slot) {
			t.Fatal("CANDLE_TRACE_CLOCK=monotonic, yet the session is on the counter")
		}
		require.NoError(t, spanNestC(s.handle, 3, 100))
		require.NoError(t, s.Finish())
		testutil.RequireValid(t, path)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestTraceClockEnvSelectsMonotonic$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "CT_TEST_TRACE_CLOCK_CHILD=1", "CANDLE_TRACE_CLOCK=monotonic")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "--- PASS: TestTraceClockEnvSelectsMonotonic", "%s", out)
}

// A span open across more counter segments than the clock keeps (~5 s of
// them in use; here published back to back) ends where its children end or
// later, and lasts as long as measured: its start is the one its span_start
// was written with, not its ticks converted again through another segment.
// With a tracer interval before its end, the end comes on the session clock
// (CT_RECF_END_AT) and the drainer subtracts the written start. (Converted
// again, a start here differs by nanoseconds at most, the segments' rates
// being steady: fastpath_sanitize compares the start's ticks exactly.)
func TestLongSpanKeepsItsWrittenStart(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tracer bool
	}{
		{"both ends on the counter", false},
		{"a tracer interval before the end", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			onCounter(t)
			s, path := openT(t, trainRun)
			wall := time.Now()
			m, err := s.BeginMeasurement("update")
			require.NoError(t, err)
			child := begin(t, s, "child")
			require.NoError(t, s.Flush()) // both starts drained before the segments change
			for i := 0; i < 2*256; i++ {
				tscPublish()
				spin(time.Duration(i%7) * 10 * time.Microsecond)
			}
			end(t, s, child)
			if tc.tracer {
				require.NoError(t, s.TracerBegin())
				require.NoError(t, s.TracerEnd())
			}
			end(t, s, m)
			elapsed := time.Since(wall)
			require.NoError(t, s.Finish())
			testutil.RequireValid(t, path)

			spans := spansOf(t, testutil.Lines(t, path))
			var mid, cid string
			for id, sp := range spans {
				if sp.parent == "" {
					continue
				}
				if spans[sp.parent].parent == "" {
					mid = id
				} else {
					cid = id
				}
			}
			require.NotEmpty(t, mid)
			require.NotEmpty(t, cid)
			ms, cs := spans[mid], spans[cid]
			assert.LessOrEqual(t, cs.end, ms.end, "the child ends inside the update")
			assert.LessOrEqual(t, ms.end-ms.start, uint64(elapsed+100*time.Microsecond), "the update lasts no longer than measured")
			assert.GreaterOrEqual(t, ms.end-ms.start, cs.end-cs.start, "the update lasts at least as long as its child")
		})
	}
}
