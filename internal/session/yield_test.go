package session

import (
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/testutil"
)

func TestTheDrainerWaitsOnlyForThreadsThatOutnumberTheCPUs(t *testing.T) {
	// Ring addresses: outnumbered only compares them.
	a, b, c := uintptr(1), uintptr(2), uintptr(3)
	const mib = 1 << 20
	at := time.Unix(1000, 0)
	ago := func(d time.Duration) time.Time { return at.Add(-d) }
	moving := func(head uint64) ringLook { return ringLook{head: head, room: 4 * mib} }
	was := func(head uint64, moved time.Time) ringTrack { return ringTrack{head: head, moved: moved} }
	cases := []struct {
		name string
		now  map[uintptr]ringLook
		seen map[uintptr]ringTrack
		cpus int
		wait bool
	}{
		{"two threads moving on two CPUs", map[uintptr]ringLook{a: moving(100), b: moving(200)},
			map[uintptr]ringTrack{a: was(50, ago(time.Second)), b: was(150, ago(time.Second))}, 2, true},
		{"one thread moving on two CPUs: a CPU is free for the drainer", map[uintptr]ringLook{a: moving(100), b: moving(200)},
			map[uintptr]ringTrack{a: was(50, ago(time.Second)), b: was(200, ago(time.Second))}, 2, false},
		{"one moving now, another a step ago: both on a CPU lately", map[uintptr]ringLook{a: moving(100), b: moving(200)},
			map[uintptr]ringTrack{a: was(50, ago(time.Second)), b: was(200, ago(yieldStep))}, 2, true},
		{"one moving now, another not for longer than busyWindow", map[uintptr]ringLook{a: moving(100), b: moving(200)},
			map[uintptr]ringTrack{a: was(50, ago(time.Second)), b: was(200, ago(busyWindow+time.Millisecond))}, 2, false},
		{"none moving now: the burst is over", map[uintptr]ringLook{a: moving(100), b: moving(200)},
			map[uintptr]ringTrack{a: was(100, ago(yieldStep)), b: was(200, ago(yieldStep))}, 2, false},
		{"rings not looked at before count as moving now", map[uintptr]ringLook{a: moving(100), b: moving(200)},
			map[uintptr]ringTrack{}, 2, true},
		{"three of three moving on two CPUs", map[uintptr]ringLook{a: moving(1), b: moving(2), c: moving(3)},
			map[uintptr]ringTrack{a: was(0, ago(time.Second)), b: was(0, ago(time.Second)), c: was(0, ago(time.Second))}, 2, true},
		{"a producer waits for room", map[uintptr]ringLook{a: moving(100), b: {head: 200, room: 4 * mib, waiting: true}},
			map[uintptr]ringTrack{}, 2, false},
		{"a ring filled up to its room", map[uintptr]ringLook{a: moving(100), b: {head: 5 * mib, tail: 1 * mib, room: 4 * mib}},
			map[uintptr]ringTrack{}, 2, false},
		{"a ring filled just under its room", map[uintptr]ringLook{a: moving(100), b: {head: 5*mib - 1, tail: 1 * mib, room: 4 * mib}},
			map[uintptr]ringTrack{}, 2, true},
		{"a ring with no room (aggregate records)", map[uintptr]ringLook{a: moving(100), b: {head: 8, room: 0}},
			map[uintptr]ringTrack{}, 2, false},
		{"no rings", map[uintptr]ringLook{}, map[uintptr]ringTrack{}, 1, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wait, next := outnumbered(tc.now, tc.seen, at, tc.cpus)
			assert.Equal(t, tc.wait, wait)
			require.Len(t, next, len(tc.now))
			for r, l := range tc.now {
				assert.Equal(t, l.head, next[r].head)
				if old, ok := tc.seen[r]; ok && old.head == l.head {
					assert.Equal(t, old.moved, next[r].moved, "a ring that did not move keeps its time")
				} else {
					assert.Equal(t, at, next[r].moved)
				}
			}
		})
	}
}

// A burst of spans on more threads than CPUs (here: one, with the drainer
// told there is one CPU) makes the woken drainer wait, but not for good: it
// drains while the thread goes on making spans, its ring far from half full,
// and the trace holds every span.
func TestTheDrainerWaitsOutABurstButNotForGood(t *testing.T) {
	onCounter(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer yieldCPUs.Store(yieldCPUs.Load())
	yieldCPUs.Store(1)
	// No background flush: a drain must be the drainer's.
	s, path := openT(t, measuredRootRun, WithFlushInterval(time.Hour))
	require.NoError(t, spanPairsC(s.Handle(), 100))
	require.NoError(t, s.Flush())
	steps := yieldSteps.Load()
	// Past half the everyday size: the producer wakes the drainer. A wake
	// left from before may have it drain first, at the burst's start: the
	// thread goes on, and wakes it again.
	burst := int(ownRingProbe().soft/compactPairBytes) * 3 / 4
	require.NoError(t, spanPairsC(s.Handle(), burst))
	pairs := 100 + burst
	var waited bool
	var tail uint64 // where the drainer was when it was first seen waiting
	for deadline := time.Now().Add(40 * yieldMax); time.Now().Before(deadline); {
		if !waited && yieldSteps.Load() > steps {
			waited, tail = true, ownRingTail()
		}
		if waited && ownRingTail() > tail {
			break
		}
		require.NoError(t, spanPairsC(s.Handle(), 200))
		pairs += 200
		time.Sleep(20 * time.Microsecond)
	}
	require.True(t, waited, "the drainer never waited")
	assert.Greater(t, ownRingTail(), tail, "the drainer waited for good")
	assert.Less(t, ownRingProbe().head-ownRingTail(), ownRingProbe().cap/2)
	require.NoError(t, s.Finish())
	starts, ends := countSpanLines(t, path)
	assert.Equal(t, 1+pairs, starts)
	assert.Equal(t, 1+pairs, ends)
	testutil.RequireValid(t, path)
}

// The drainer lets a ring of trace spans fill up to half its address space
// (the ring stretches into it) before it stops waiting; it does not wait
// for a ring of aggregate records (its producer would wait at the everyday
// size, and they fold fast).
func TestTheDrainerWaitsForTraceRingsNotAggregateOnes(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	agg, err := Open(filepath.Join(t.TempDir(), "summary.json"), []byte(aggregateRun))
	require.NoError(t, err)
	defer agg.Finish()
	trace, _ := openT(t, measuredRootRun)
	for _, c := range []struct {
		name string
		s    *Session
		room func(ringProbe) uint64
	}{
		{"aggregate", agg, func(ringProbe) uint64 { return 0 }},
		{"trace", trace, func(p ringProbe) uint64 { return p.cap / 2 }},
		{"aggregate again", agg, func(ringProbe) uint64 { return 0 }},
	} {
		// The first pairs register the name (an aggregate session's, under mu).
		require.NoError(t, spanPairsC(c.s.Handle(), 10))
		require.NoError(t, c.s.Flush())
		release, stuck := holdDrainer(10 * time.Second)
		require.NoError(t, spanPairsC(c.s.Handle(), 10))
		look, probe := ownRingLook(), ownRingProbe()
		release()
		require.False(t, stuck())
		assert.Equal(t, c.room(probe), look.room, c.name)
		assert.Greater(t, look.head, look.tail, c.name)
	}
	require.NoError(t, trace.Finish())
}
