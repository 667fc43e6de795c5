package session

import (
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/testutil"
)

// spin busy-waits d on the session's raw clock: work the clock must see (or,
// inside a tracer interval, leave out).
func spin(d time.Duration) {
	for t0 := time.Now(); time.Since(t0) < d; {
	}
}

func u64(t *testing.T, v any) uint64 {
	t.Helper()
	n, ok := v.(float64)
	require.True(t, ok, "%v is not a JSON number", v)
	return uint64(n)
}

func spanEnd(t *testing.T, lines []map[string]any, id string) map[string]any {
	t.Helper()
	for _, l := range lines {
		if l["kind"] == "span_end" && l["id"] == id {
			return l
		}
	}
	t.Fatalf("no span_end of %s", id)
	return nil
}

// The tracer's own work inside a span is left out of its duration and
// stated on the measured span and the terminal. A loaded machine stretches
// the program's time between the calls, so the bound is the wall time
// measured around each span less the tracer time measured inside the
// intervals (the clock stood still for at least that), not a constant.
func TestTracerTimeIsLeftOutOfSpansAndStated(t *testing.T) {
	const work, tracer = 20 * time.Millisecond, 60 * time.Millisecond
	tests := []struct {
		name      string
		intervals int  // tracer intervals inside the inner span
		nested    bool // each interval opens a second one inside it
	}{
		{"one interval", 1, false},
		{"three intervals", 3, false},
		{"nested intervals", 2, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, path := openT(t, trainRun)
			updWall := time.Now()
			m, err := s.BeginMeasurement("update")
			require.NoError(t, err)
			fwdWall := time.Now()
			inner := begin(t, s, "forward")
			spin(work)
			var inside time.Duration // wall time inside the intervals, the clock frozen
			for i := 0; i < tc.intervals; i++ {
				require.NoError(t, s.TracerBegin())
				if tc.nested {
					require.NoError(t, s.TracerBegin())
				}
				t0 := time.Now()
				spin(tracer / time.Duration(tc.intervals))
				inside += time.Since(t0)
				if tc.nested {
					require.NoError(t, s.TracerEnd())
				}
				require.NoError(t, s.TracerEnd())
			}
			end(t, s, inner)
			fwdSpan := time.Since(fwdWall)
			end(t, s, m)
			updSpan := time.Since(updWall)
			require.NoError(t, s.Finish())

			lines := testutil.Lines(t, path)
			fwd := u64(t, spanEnd(t, lines, "s3")["duration_ns"])
			upd := spanEnd(t, lines, "s2")
			assert.GreaterOrEqual(t, fwd, uint64(work))
			assert.LessOrEqual(t, fwd, uint64(fwdSpan-inside), "the tracer's %v is not the forward's", inside)
			assert.GreaterOrEqual(t, u64(t, upd["tracer_ns"]), uint64(inside))
			assert.LessOrEqual(t, u64(t, upd["duration_ns"]), uint64(updSpan-inside))
			term := lines[len(lines)-1]
			require.Equal(t, "terminal", term["kind"])
			assert.GreaterOrEqual(t, u64(t, term["tracer_ns"]), u64(t, upd["tracer_ns"]))
			_, ok := spanEnd(t, lines, "s3")["tracer_ns"]
			assert.False(t, ok, "only the measured span states its tracer time")
		})
	}
}

// A span begun inside a tracer interval starts when the interval began, and
// the clock stands still until it ends.
func TestTracerIntervalFreezesTheClock(t *testing.T) {
	s, _ := openT(t, trainRun)
	before := s.Now()
	require.NoError(t, s.TracerBegin())
	frozen := s.Now()
	spin(5 * time.Millisecond)
	assert.Equal(t, frozen, s.Now(), "the clock stands still inside a tracer interval")
	assert.Less(t, frozen-before, uint64(5*time.Millisecond))
	assert.GreaterOrEqual(t, s.TracerNs(), uint64(5*time.Millisecond), "an open interval counts up to now")
	require.NoError(t, s.TracerEnd())
	spin(time.Millisecond)
	assert.Greater(t, s.Now(), frozen, "the clock goes on from where it stood")
	assert.Less(t, s.Now()-frozen, uint64(5*time.Millisecond))
}

// An interval begun earlier than its call takes the time back, but never past
// a clock value already read, and counts it as estimated. What it takes back
// is bounded by the program time since that read, which a loaded machine can
// stretch: the bound is the wall time measured around it, not a constant.
func TestTracerBeginEarlierNeverGoesBackPastARead(t *testing.T) {
	tests := []struct {
		name          string
		idle, earlier time.Duration // program time since the last read; the claim
	}{
		{"claim inside the idle time", 20 * time.Millisecond, 5 * time.Millisecond},
		{"claim beyond the last read", 2 * time.Millisecond, time.Second},
		{"no claim", 5 * time.Millisecond, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := openT(t, trainRun)
			require.NoError(t, s.TracerBegin()) // tracking of read values starts here
			require.NoError(t, s.TracerEnd())
			sinceRead := time.Now() // before the read, so that elapsed bounds what the session clock saw
			read := s.Now()
			spin(tc.idle)
			before := s.TracerEstimatedNs()
			require.NoError(t, s.TracerBeginEarlier(uint64(tc.earlier)))
			elapsed := time.Since(sinceRead)
			frozen := s.Now()
			require.NoError(t, s.TracerEnd())
			assert.GreaterOrEqual(t, frozen, read, "the clock went back past a value already read")
			back := time.Duration(s.TracerEstimatedNs() - before)
			assert.GreaterOrEqual(t, back, min(tc.earlier, tc.idle), "the claim is taken back as far as the idle time allows")
			assert.LessOrEqual(t, back, min(tc.earlier, elapsed), "never more than claimed, nor past the last read")
			assert.GreaterOrEqual(t, s.TracerNs(), uint64(back))
		})
	}
}

// On a session's first interval, values read before it bound the backdating.
func TestTracerBeginEarlierOnTheFirstInterval(t *testing.T) {
	s, _ := openT(t, trainRun)
	read := s.Now()
	require.NoError(t, s.TracerBeginEarlier(uint64(time.Hour)))
	assert.GreaterOrEqual(t, s.Now(), read)
	require.NoError(t, s.TracerEnd())
}

// Whatever other threads do with tracer intervals, the clock never runs
// backwards for a reader.
func TestTracerClockIsMonotonicAcrossThreads(t *testing.T) {
	s, _ := openT(t, trainRun)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Intervals begun as early as they may be: the bound is what is read.
				if s.TracerBeginEarlier(uint64(time.Millisecond)) == nil {
					spin(20 * time.Microsecond)
					_ = s.TracerEnd()
				}
			}
		}()
	}
	last := s.Now()
	for i := 0; i < 200000; i++ {
		now := s.Now()
		require.GreaterOrEqual(t, now, last, "read %d went backwards", i)
		last = now
	}
	close(stop)
	wg.Wait()
}

func TestTracerIntervalsRefuseBadUse(t *testing.T) {
	s, _ := openT(t, trainRun)
	agg, err := Open(filepath.Join(t.TempDir(), "summary.json"), []byte(aggregateRun))
	require.NoError(t, err)
	t.Cleanup(func() { _ = agg.FinishFailed("test cleanup") })
	done, _ := openT(t, trainRun)
	require.NoError(t, done.FinishFailed("finished"))
	tests := []struct {
		name string
		call func() error
		code Status
		msg  string
	}{
		{"end without begin", s.TracerEnd, State, "ct_tracer_end: no tracer interval is open"},
		{"aggregate session", agg.TracerBegin, State, "ct_tracer_begin: session"},
		{"finished session begin", done.TracerBegin, InvalidHandle, "ct_tracer_begin: session"},
		{"finished session end", done.TracerEnd, InvalidHandle, "ct_tracer_end: session"},
		{"handle 0", func() error { return tracerBeginC(0) }, InvalidHandle, "ct_tracer_begin: session handle is 0"},
		{"earlier, aggregate session", func() error { return agg.TracerBeginEarlier(5) }, State, "ct_tracer_begin_earlier: session"},
		{"earlier, finished session", func() error { return done.TracerBeginEarlier(5) }, InvalidHandle, "ct_tracer_begin_earlier: session"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			requireCode(t, tc.call(), tc.code, tc.msg)
		})
	}
	assert.Zero(t, s.TracerNs(), "refused calls leave no tracer time")
}
