package session

import (
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/testutil"
)

// spanC records one span of name in session h through the C fast path.
func spanC(t *testing.T, h uint64, name string) {
	t.Helper()
	id, err := beginSpanC(h, name, uint32(events.SpanModule), uint32(events.StepForward), false)
	require.NoError(t, err)
	require.NoError(t, endSpanC(h, id))
}

// reopenAsTheShim is ct_reopen: in C where it can be, else the Go way (a
// session Go is opening at that moment goes the Go way). *inC counts the
// first.
func reopenAsTheShim(t *testing.T, h uint64, path string, step uint64, inC *int) uint64 {
	t.Helper()
	if n := rearmC(h, path, step); n != 0 {
		*inC++
		return n
	}
	s, err := Lookup(h)
	require.NoError(t, err)
	n, err := s.Reopen(path, step)
	require.NoError(t, err)
	return n.Handle()
}

func isLive(h uint64) bool {
	mu.Lock()
	defer mu.Unlock()
	s := live[h]
	return s != nil && !s.rearmed()
}

// A re-arm in C is the next update's session as Reopen opens it: spans
// recorded before Go ever heard of it are in its trace, with the capture
// step, defaults and clock of the ct_reopen call; the one it replaced is gone
// unwritten, to C and to Go.
func TestRearmInCIsTheNextUpdatesSession(t *testing.T) {
	s, path := openBuffered(t, bufRun(1<<20, `,"tags":{"k":"v"}`))
	step(t, s)
	next := filepath.Join(filepath.Dir(path), "update-8.jsonl")
	before := time.Now()
	h := rearmC(s.Handle(), next, 8)
	require.NotZero(t, h, "the plain case is C's")
	assert.NotEqual(t, s.Handle(), h)
	assert.False(t, isLive(h), "Go has not run yet")
	_, err := beginSpanC(s.Handle(), "late", 0, 0, false)
	requireCode(t, err, InvalidHandle, "unknown or already finished")
	requireCode(t, s.Finish(), InvalidHandle, "unknown or already finished")
	spanC(t, h, "early") // before Go knows the session

	n, err := Lookup(h)
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Discard() })
	_, err = Lookup(s.Handle())
	requireCode(t, err, InvalidHandle, "")
	step(t, n)
	require.NoError(t, n.Finish())
	assert.NoFileExists(t, path, "the session before was discarded, not written")
	testutil.RequireValid(t, next)
	lines := testutil.Lines(t, next)
	meta := lines[0]
	assert.EqualValues(t, 8, meta["capture_step"])
	assert.EqualValues(t, 7, meta["warmup_steps"], "defaulted again from the new step")
	assert.Equal(t, "test::train/update-8", meta["correlation_id"])
	assert.Equal(t, map[string]any{"k": "v"}, meta["tags"])
	wall := int64(meta["clock"].(map[string]any)["wall_unix_ns_at_open"].(float64))
	assert.InDelta(t, before.UnixNano(), wall, float64(time.Second), "the wall clock of the ct_reopen call")
	assert.EqualValues(t, threadID(), lines[1]["tid"], "the root is the calling thread's")
	var names []string
	for _, l := range lines {
		if l["kind"] == "span_start" {
			names = append(names, l["name"].(string))
		}
	}
	assert.Equal(t, []string{"test::train", "early", "update", "forward"}, names)
}

// Re-armed again and again without Go in between, the sessions Go never saw
// give their slots back at once: far more updates than the registry's 255
// slots, and the last one's trace holds its own update only.
func TestRearmsWithoutGoReleaseTheirSlots(t *testing.T) {
	s, path := openBuffered(t, bufRun(1<<20, ""))
	dir := filepath.Dir(path)
	h, prev := s.Handle(), uint64(0)
	for i := uint64(3); i < 700; i++ {
		spanC(t, h, "layer")
		prev, h = h, rearmC(h, filepath.Join(dir, "u.jsonl"), i)
		require.NotZero(t, h, "update %d", i)
	}
	_, err := Lookup(prev)
	requireCode(t, err, InvalidHandle, "")
	spanC(t, h, "last")
	n, err := Lookup(h)
	require.NoError(t, err)
	step(t, n)
	require.NoError(t, n.Finish())
	lines := testutil.Lines(t, filepath.Join(dir, "u.jsonl"))
	assert.EqualValues(t, 699, lines[0]["capture_step"])
	assert.Equal(t, "last", lines[2]["name"], "no span of the updates before")
	_, err = Lookup(s.Handle())
	requireCode(t, err, InvalidHandle, "")
}

// The drainer meeting a re-armed session's records opens it in Go, so that
// nothing it recorded before anything else entered Go is lost; a discard
// then leaves nothing.
func TestTheDrainerTakesOverARearmedSession(t *testing.T) {
	s, path := openBuffered(t, bufRun(1<<20, ""))
	next := filepath.Join(filepath.Dir(path), "next.jsonl")
	h := rearmC(s.Handle(), next, 5)
	require.NotZero(t, h)
	for i := 0; i < 10; i++ {
		spanC(t, h, "layer")
	}
	drainAndWrite()
	assert.True(t, isLive(h), "the drainer opened it")
	n, err := Lookup(h)
	require.NoError(t, err)
	require.NoError(t, n.Discard())
	assert.NoFileExists(t, next)
	assert.NoFileExists(t, path)
}

// Whatever C cannot decide alone goes the Go way, which keeps every rule and
// message of ct_reopen.
func TestRearmLeavesToGoWhatCannotBeDecidedInC(t *testing.T) {
	s, path := openBuffered(t, bufRun(1<<20, `,"warmup_steps":1`))
	dir := filepath.Dir(path)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	exists := filepath.Join(dir, "exists.jsonl")
	require.NoError(t, os.WriteFile(exists, nil, 0o600))
	for _, tc := range []struct {
		name, path string
		step       uint64
	}{
		{"another folder", filepath.Join(t.TempDir(), "u.jsonl"), 5},
		{"a folder below", filepath.Join(dir, "sub", "u.jsonl"), 5},
		{"a path that exists", exists, 5},
		{"the folder itself", dir + "/", 5},
		{"not above warmup_steps", filepath.Join(dir, "u.jsonl"), 1},
		{"step 0", filepath.Join(dir, "u.jsonl"), 0},
		{"not UTF-8", filepath.Join(dir, "u\xff.jsonl"), 5},
	} {
		assert.Zero(t, rearmC(s.Handle(), tc.path, tc.step), tc.name)
	}
	assert.True(t, isLive(s.Handle()), "left as it was")

	stream, err := Open(filepath.Join(t.TempDir(), "s.jsonl"), []byte(`{"entrypoint":"x","phase":"train","capture_step":1,"device":"cpu"}`))
	require.NoError(t, err)
	t.Cleanup(func() { _ = stream.FinishFailed("test") })
	assert.Zero(t, rearmC(stream.Handle(), filepath.Join(dir, "u.jsonl"), 2), "a session that writes as it records")

	h := rearmC(s.Handle(), filepath.Join(dir, "u.jsonl"), 5)
	require.NotZero(t, h)
	assert.Zero(t, rearmC(s.Handle(), filepath.Join(dir, "v.jsonl"), 6), "a handle re-armed already")
	n, err := Lookup(h)
	require.NoError(t, err)
	n2, err := n.Reopen(filepath.Join(dir, "w.jsonl"), 7) // the Go way still, after C's
	require.NoError(t, err)
	require.NoError(t, n2.Discard())
}

// Re-arms on one thread while the drainer runs on another (and a record call
// drains all rings): every update's spans reach the session that holds
// them, and the last trace is whole. Run with -race.
func TestRearmsRaceTheDrainer(t *testing.T) {
	s, path := openBuffered(t, bufRun(1<<20, ""))
	dir := filepath.Dir(path)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				drainAndWrite()
				runtime.Gosched()
			}
		}
	}()
	h, inC := s.Handle(), 0
	for i := uint64(3); i < 400; i++ {
		for j := 0; j < 5; j++ {
			spanC(t, h, "layer")
		}
		if i%50 == 0 { // a Go call now and then, as a record call would
			_, err := Lookup(h)
			require.NoError(t, err)
		}
		h = reopenAsTheShim(t, h, filepath.Join(dir, "u.jsonl"), i, &inC)
	}
	assert.Greater(t, inC, 0, "re-armed in C")
	close(stop)
	wg.Wait()
	spanC(t, h, "last")
	n, err := Lookup(h)
	require.NoError(t, err)
	step(t, n)
	require.NoError(t, n.Finish())
	testutil.RequireValid(t, filepath.Join(dir, "u.jsonl"))
	lines := testutil.Lines(t, filepath.Join(dir, "u.jsonl"))
	assert.EqualValues(t, 399, lines[0]["capture_step"])
	assert.Equal(t, "last", lines[2]["name"])
}

// A session re-armed in C from one that ended before Go took it over (a
// finish racing the reopen on another thread) has nothing to take over from:
// its handle fails as a finished one's, and its slot does not leak.
func TestARearmWhoseSessionEndedFirstGivesItsSlotBack(t *testing.T) {
	s, path := openBuffered(t, bufRun(1<<20, ""))
	h := rearmC(s.Handle(), filepath.Join(filepath.Dir(path), "u.jsonl"), 5)
	require.NotZero(t, h)
	mu.Lock()
	live[s.Handle()].buffered().discardLocked() // as a racing end would
	mu.Unlock()
	require.NotNil(t, slotOf(h))
	_, err := Lookup(h)
	requireCode(t, err, InvalidHandle, "unknown or already finished")
	assert.Nil(t, slotOf(h), "its slot is free again")
}

// A run whose root span is its measured region has one from the start in a
// session re-armed in C too: a second is refused before Go ever sees it.
func TestARearmedSessionOfAMeasuredRootRunHasItsMeasuredRegion(t *testing.T) {
	s, path := openBuffered(t, bufRun(1<<20, `,"measured_root":true`))
	h := rearmC(s.Handle(), filepath.Join(filepath.Dir(path), "u.jsonl"), 5)
	require.NotZero(t, h)
	_, err := beginSpanC(h, "update", uint32(events.SpanFunction), uint32(events.StepNone), true)
	requireCode(t, err, State, "already has its measured region")
	spanC(t, h, "layer")
	n, err := Lookup(h)
	require.NoError(t, err)
	require.NoError(t, n.Finish())
	testutil.RequireValid(t, filepath.Join(filepath.Dir(path), "u.jsonl"))
}
