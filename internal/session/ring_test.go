package session

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/testutil"
)

// compactPairBytes is what a span pair of a cached name on the counter
// clock takes in a ring in a burst: an 8-byte begin and an 8-byte end
// (ct_rec_short, fastpath.h). A pair the thread was preempted inside takes
// more (a longer form), so a count of pairs from it is at least its bytes.
const compactPairBytes = 16

// holdDrainer keeps every drain out (it holds mu) until release is called
// or patience runs out; stuck reports whether it had to give up, which
// means a producer waited for a drain that could not come.
func holdDrainer(patience time.Duration) (release func(), stuck func() bool) {
	held, done := make(chan struct{}), make(chan struct{})
	var gaveUp bool
	finished := make(chan struct{})
	go func() {
		mu.Lock()
		close(held)
		select {
		case <-done:
		case <-time.After(patience):
			gaveUp = true
		}
		mu.Unlock()
		close(finished)
	}()
	<-held
	return func() { close(done); <-finished }, func() bool { return gaveUp }
}

// A burst the ring's address space holds never makes the producer wait,
// even with no drain at all while it runs: the ring stretches past its
// everyday size into pages it had not touched. A drain faults in pages
// ahead of the producer; once drained, the next time the producer reaches
// its limit it wraps back to the start and the pages past its everyday
// size, those ahead included, go back to the kernel.
func TestABurstStretchesTheRingAndItsPagesGoBackOnceDrained(t *testing.T) {
	s, path := openT(t, measuredRootRun, WithFlushInterval(time.Hour))
	// The thread's ring (a test before may have left it stretched) in the
	// first half of its everyday size, drained: after a wrap back, the
	// padding record to the end of its address space counts as written
	// until the drainer has read it, so a burst then has only the lap's
	// start to fill (a burst reaching the everyday size with the drainer an
	// eighth of it behind wraps back; with no drain at all here it would
	// wait); and a ring a test left full gives its stretched pages back at
	// its next wrap. Back at its everyday size, a ring that stretched keeps
	// ring_keep and what was unread at the wrap resident (the bound this
	// test asserts at its end), not ring_keep alone: the set-up took that
	// and never found it on a thread whose ring this test had stretched
	// before (go test -count=10: 3 everyday sizes + 24 KiB).
	setup := 0
	for p := ownRingProbe(); p.cap == 0 || p.offset >= p.soft/2 || p.resident > wrapBackBound(p); p = ownRingProbe() {
		require.Less(t, setup, 1_000_000, "the ring never came back to its everyday size: %+v", p)
		require.NoError(t, spanPairsC(s.Handle(), 2000))
		setup += 2000
		require.NoError(t, s.Flush())
	}
	before := ownRingProbe()
	require.Greater(t, before.cap, before.soft, "the ring has room to stretch into")
	require.GreaterOrEqual(t, before.cap, 4*before.soft)
	pairs := int(3 * before.soft / compactPairBytes) // twice past the everyday size, inside the address space

	release, stuck := holdDrainer(10 * time.Second)
	err := spanPairsC(s.Handle(), pairs)
	burst := ownRingProbe()
	release()
	require.NoError(t, err)
	require.False(t, stuck(), "the producer waited for a drain while its ring had room to stretch (before %+v, after %+v)", before, burst)
	assert.Equal(t, before.waits, burst.waits, "no wait for room")
	assert.Greater(t, burst.offset, before.soft, "records went past the everyday size")
	assert.GreaterOrEqual(t, burst.resident, uint64(pairs)*compactPairBytes*9/10, "the burst's pages are resident")

	require.NoError(t, s.Flush())
	drained := ownRingProbe()
	assert.GreaterOrEqual(t, drained.resident, burst.resident+(1<<20),
		"the drain faulted in pages ahead of the stretched producer (%d bytes resident, %d before)", drained.resident, burst.resident)
	// Small batches, each drained: at its next stretch step the producer
	// finds the drainer caught up and wraps back.
	after := 0
	for ownRingProbe().offset >= before.soft {
		require.Less(t, after, 200_000, "never wrapped back: %+v", ownRingProbe())
		require.NoError(t, spanPairsC(s.Handle(), 500))
		after += 500
		require.NoError(t, s.Flush())
	}
	back := ownRingProbe()
	assert.LessOrEqual(t, after, 5000, "wrapped back within a stretch step or two of the drain")
	assert.LessOrEqual(t, back.resident, wrapBackBound(back), "stretched pages past what a wrap back keeps went back to the kernel (%d bytes resident)", back.resident)

	require.NoError(t, s.Finish())
	starts, ends := countSpanLines(t, path)
	assert.Equal(t, 1+setup+pairs+after, starts)
	assert.Equal(t, 1+setup+pairs+after, ends)
	testutil.RequireValid(t, path)
}

// A ring that stretched only a little past its everyday size, drained with
// the drainer faulting pages in ahead of it, gives those pages back at its
// next wrap like a ring that stretched far: what it keeps resident is the
// bound of a wrap back (ring_keep and what was unread), not the 2 MiB the
// drainer faulted in ahead.
func TestPagesFaultedInAheadOfASmallStretchGoBackAtTheWrap(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s, _ := openT(t, measuredRootRun, WithFlushInterval(time.Hour))
	defer func() { assert.NoError(t, s.Finish()) }()
	// The thread's ring at the start of a lap, drained, back at its bound.
	for p := ownRingProbe(); p.cap == 0 || p.offset >= p.soft/8 || p.resident > wrapBackBound(p); p = ownRingProbe() {
		require.NoError(t, spanPairsC(s.Handle(), 500))
		require.NoError(t, s.Flush())
	}
	before := ownRingProbe()
	// A whole everyday size and a bit written with the drainer held: the
	// producer stretches one step or two, well within three everyday sizes.
	release, stuck := holdDrainer(10 * time.Second)
	err := spanPairsC(s.Handle(), int(before.soft*5/4/compactPairBytes))
	burst := ownRingProbe()
	release()
	require.NoError(t, err)
	require.False(t, stuck())
	require.Greater(t, burst.offset, burst.soft)
	require.Less(t, burst.offset, 2*burst.soft, "a small stretch")
	require.NoError(t, s.Flush())
	drained := ownRingProbe()
	require.Greater(t, ownRingResidentIn(drained.keep, drained.cap), uint64(0),
		"the drain faulted in pages ahead of the producer, past what a wrap back keeps (%d bytes resident)", drained.resident)
	for n := 0; ownRingProbe().offset >= before.soft; n += 500 {
		require.Less(t, n, 200_000, "never wrapped back: %+v", ownRingProbe())
		require.NoError(t, spanPairsC(s.Handle(), 500))
		require.NoError(t, s.Flush())
	}
	back := ownRingProbe()
	assert.LessOrEqual(t, back.resident, wrapBackBound(back),
		"pages faulted in ahead went back to the kernel at the wrap (%d bytes resident)", back.resident)
	assert.Zero(t, ownRingResidentIn(back.keep, back.cap), "nothing past what a wrap back keeps")
}

// wrapBackBound is what a ring keeps resident once back at its everyday
// size: ring_keep (three everyday sizes) and what was unread at the wrap,
// which these tests allow half an everyday size.
func wrapBackBound(p ringProbe) uint64 { return p.keep + p.soft/2 }

// countSpanLines counts a trace's span_start and span_end lines without
// decoding them (hundreds of thousands of lines).
func countSpanLines(t *testing.T, path string) (starts, ends int) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.True(t, bytes.HasSuffix(data, []byte("}\n")), "whole lines")
	return bytes.Count(data, []byte(`{"kind":"span_start",`)), bytes.Count(data, []byte(`{"kind":"span_end",`))
}

// Two sessions' spans interleaved on one thread: the compact records carry
// no session, the ring's session markers say whose they are, and each
// trace gets its own spans, nested as they were made.
func TestInterleavedSessionsOnOneThreadKeepTheirSpans(t *testing.T) {
	a, pathA := openT(t, measuredRootRun)
	dir := t.TempDir()
	pathB := filepath.Join(dir, "b.jsonl")
	b, err := Open(pathB, []byte(measuredRootRun))
	require.NoError(t, err)
	const iters = 3000 // a few ring laps' worth of markers, with drains in between
	for i := 0; i < iters; i++ {
		outerA := begin(t, a, "a/outer")
		outerB := begin(t, b, "b/outer")
		innerA := begin(t, a, fmt.Sprintf("a/inner%d", i%3))
		end(t, a, innerA)
		innerB := begin(t, b, "b/inner")
		end(t, b, innerB)
		end(t, a, outerA)
		end(t, b, outerB)
	}
	require.NoError(t, a.Finish())
	require.NoError(t, b.Finish())
	for _, tc := range []struct {
		path, outer, inner string
	}{{pathA, "a/outer", "a/inner"}, {pathB, "b/outer", "b/inner"}} {
		lines := testutil.Lines(t, tc.path)
		starts := testutil.OfKind(lines, "span_start")
		require.Len(t, starts, 1+2*iters)
		require.Len(t, testutil.OfKind(lines, "span_end"), 1+2*iters)
		byID := map[string]map[string]any{}
		for _, st := range starts {
			byID[st["id"].(string)] = st
		}
		for _, st := range starts[1:] {
			name := st["name"].(string)
			parent := byID[st["parent_id"].(string)]
			if name == tc.outer {
				assert.Equal(t, "s1", st["parent_id"])
			} else {
				require.Contains(t, name, tc.inner)
				assert.Equal(t, tc.outer, parent["name"], "%s nests in its session's outer span", name)
			}
		}
		testutil.RequireValid(t, tc.path)
	}
}

// The measured span, new names (their first record carries the bytes) and
// spans around a tracer interval take the long record form, the rest the
// compact one; in one trace, the two give the same lines.
func TestLongAndCompactRecordsMakeOneTrace(t *testing.T) {
	s, path := openT(t, trainRun)
	m, err := s.BeginMeasurement("update")
	require.NoError(t, err)
	for i := 0; i < 100; i++ {
		outer := begin(t, s, "step")
		inner, err := s.BeginSpan(fmt.Sprintf("op%d", i%7), events.SpanOp, events.StepForward)
		require.NoError(t, err)
		if i == 50 {
			require.NoError(t, s.TracerBegin())
			require.NoError(t, s.TracerEnd())
		}
		end(t, s, inner)
		end(t, s, outer)
	}
	end(t, s, m)
	require.NoError(t, s.Finish())
	lines := testutil.Lines(t, path)
	require.Len(t, testutil.OfKind(lines, "span_start"), 2+200)
	for _, st := range testutil.OfKind(lines, "span_start") {
		if st["span_kind"] == "op" {
			assert.Equal(t, "forward", st["step"])
		}
	}
	testutil.RequireValid(t, path)
}

// Closed-span tables are memory of their own (mapClosed): a finished
// session's is kept for the next one, and one more goes back to the kernel;
// a session that takes the kept one finds it empty.
func TestClosedTablesAreKeptForTheNextSessionOrGivenBack(t *testing.T) {
	mu.Lock()
	kept := len(closedMaps)
	if spareClosed != nil {
		kept--
	}
	mu.Unlock()
	a, _ := openT(t, measuredRootRun)
	b, pathB := openT(t, measuredRootRun)
	for _, s := range []*Session{a, b} {
		require.NoError(t, spanPairsC(s.Handle(), 2000))
		require.NoError(t, s.Flush())
	}
	require.NoError(t, a.Finish())
	require.NoError(t, b.Finish())
	mu.Lock()
	require.NotNil(t, spareClosed, "a finished session's table is kept")
	require.Equal(t, kept+1, len(closedMaps), "one kept, the other given back")
	mu.Unlock()
	testutil.RequireValid(t, pathB)

	c, pathC := openT(t, measuredRootRun)
	require.NoError(t, spanPairsC(c.Handle(), 100))
	id := begin(t, c, "late")
	end(t, c, id)
	require.NoError(t, c.Flush())
	require.NoError(t, c.RecordScalar(id, "loss", 1), "the kept table holds the new session's spans")
	requireCode(t, c.RecordScalar(1500, "loss", 1), InvalidHandle, "s1500") // closed in a and b, never in c
	require.NoError(t, c.Finish())
	testutil.RequireValid(t, pathC)
}

// A ring whose producer stands at the end of its everyday size, a whole
// lap of it behind the drainer, has not stretched: an aggregate session's
// ring never does (it wraps back there), and the drainer faults in nothing
// ahead of it. It did: 2 MiB of an aggregate ring became resident whenever
// a drain found it so (test_aggregate's flat-memory check, ~1 run in 4).
// Past the everyday size, the drainer faults pages in ahead.
func TestDrainerFaultsInAheadOnlyOfAStretchedRing(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s, err := Open(filepath.Join(t.TempDir(), "summary.json"), []byte(aggregateRun))
	require.NoError(t, err)
	defer func() { assert.NoError(t, s.Finish()) }()
	end(t, s, begin(t, s, "make/the/ring"))
	require.NoError(t, s.Flush()) // nothing unread: the pages past the everyday size hold nothing
	r := ownRingProbe()
	ahead := func() uint64 { return ownRingResidentIn(r.soft, r.soft+2<<20) }
	ownRingDrop(r.soft, r.soft+2<<20) // an earlier test on this thread may have stretched it
	// What this test faults in by hand goes back at the ring's next wrap back
	// (ct_ring.faulted), but the next test on this thread may look before
	// one: give it back now.
	// (Deferred, not t.Cleanup: this goroutine holds the ring's thread.)
	defer ownRingDrop(r.soft, r.cap)
	require.Zero(t, ahead())
	tail := ownRingTail()
	lap := (tail/r.cap + 1) * r.cap // a head a whole everyday size ahead of tail
	prefaultOwnRing(lap + r.soft)
	assert.Zero(t, ahead(), "nothing faulted in at the everyday size's end")
	prefaultOwnRing(lap + r.soft + 4096)
	assert.Greater(t, ahead(), r.soft, "pages faulted in ahead of a stretched ring")
}

// A producer that wrapped back early (its drainer caught up at the everyday
// size) goes on waking the drainer every half everyday size it writes. It
// did not: the padding record of an early wrap runs to the end of the
// address space (8 MiB), and the wake mark, set before it, was then that
// far behind head, so no record crossed a half-size mark again until the
// ring had stretched to its end and filled. A flight recorder's slow steady
// producer so stretched its ring to 8 MiB every ~2,000 updates and faulted
// in huge pages at ~4.6 ms apiece inside an update (a false "slow" trigger).
func TestAnEarlyWrapBackKeepsWakingTheDrainer(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s, _ := openT(t, measuredRootRun, WithFlushInterval(time.Hour))
	defer func() { assert.NoError(t, s.Finish()) }()
	// Drained, within an eighth of the everyday size before its end, with
	// the address space beyond it back at its bound.
	for p := ownRingProbe(); p.cap == 0 || p.offset < p.soft*7/8 || p.offset >= p.soft || p.resident > wrapBackBound(p); p = ownRingProbe() {
		require.NoError(t, spanPairsC(s.Handle(), 200))
		require.NoError(t, s.Flush())
	}
	before := ownRingProbe()
	// Past the everyday size with the drainer an eighth of it behind at
	// most: the producer wraps back early.
	require.NoError(t, spanPairsC(s.Handle(), int(before.soft/8/compactPairBytes)+100))
	wrapped := ownRingProbe()
	require.Less(t, wrapped.offset, before.offset, "wrapped back early: %+v", wrapped)
	assert.Less(t, wrapped.sinceWake, wrapped.soft/2, "the wake mark follows the wrap's padding (%+v)", wrapped)

	// An everyday size more, in small pieces with time between them: the
	// drainer, woken by the producer alone, reads at least half of it.
	for written := uint64(0); written < wrapped.soft; written += 100 * compactPairBytes {
		require.NoError(t, spanPairsC(s.Handle(), 100))
		time.Sleep(100 * time.Microsecond)
	}
	want := wrapped.head + wrapped.soft/2
	deadline := time.Now().Add(5 * time.Second)
	for ownRingTail() < want && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	assert.GreaterOrEqual(t, ownRingTail(), want, "the drainer was woken: %+v", ownRingProbe())
	after := ownRingProbe()
	assert.LessOrEqual(t, after.offset, after.soft+2*(after.soft/16), "the ring did not stretch past a step or two: %+v", after)
}

// A ring and the closed-span table are in small pages whatever the
// system's transparent huge page setting (VmFlags "nh"): a fresh huge page
// costs the thread that touches it up to ~30 ms at times on a VM whose host
// backs the guest's memory lazily, and the thread stretching a ring is the
// program's, inside its update. Before, a ring's stretch and the table
// asked for huge pages ("hg").
func TestRingsAndTheClosedSpanTableAreInSmallPages(t *testing.T) {
	s, _ := openT(t, measuredRootRun, WithFlushInterval(time.Hour))
	defer func() { assert.NoError(t, s.Finish()) }()
	require.NoError(t, spanPairsC(s.Handle(), 2000))
	require.NoError(t, s.Flush())
	mu.Lock()
	require.NotEmpty(t, s.closed.slots)
	table := uintptr(unsafe.Pointer(&s.closed.slots[0]))
	mu.Unlock()
	ring := ownRingData()
	require.NotZero(t, ring)
	for _, m := range []struct {
		what string
		addr uintptr
	}{{"the ring", ring}, {"the ring's stretch", ring + uintptr(ownRingProbe().cap) - 1}, {"the closed-span table", table}} {
		flags := vmFlags(t, m.addr)
		assert.Contains(t, flags, "nh", "%s at %#x: VmFlags %v", m.what, m.addr, flags)
		assert.NotContains(t, flags, "hg", "%s at %#x", m.what, m.addr)
	}
}

// vmFlags are the VmFlags of the mapping holding addr (/proc/self/smaps).
func vmFlags(t *testing.T, addr uintptr) []string {
	t.Helper()
	smaps, err := os.ReadFile("/proc/self/smaps")
	require.NoError(t, err)
	in := false
	for _, line := range strings.Split(string(smaps), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if lo, hi, ok := strings.Cut(fields[0], "-"); ok { // a mapping's header: lo-hi perms ...
			l, errLo := strconv.ParseUint(lo, 16, 64)
			h, errHi := strconv.ParseUint(hi, 16, 64)
			if errLo == nil && errHi == nil {
				in = uint64(addr) >= l && uint64(addr) < h
				continue
			}
		}
		if fields[0] == "VmFlags:" && in {
			return fields[1:]
		}
	}
	t.Fatalf("no mapping holds %#x", addr)
	return nil
}

// A burst of span pairs takes the 8-byte records (ct_rec_short): a third of
// the ring's bytes the 24- and 16-byte compact forms took, so a third of
// the fresh pages a stretching producer faults in.
func TestABurstOfSpanPairsTakesEightBytesARecord(t *testing.T) {
	onCounter(t)
	s, path := openT(t, measuredRootRun)
	// The thread's ring near the start of a lap, drained: the pairs below
	// (under 400 KB) end before its everyday size, so no padding record (a
	// wrap pads the rest of the address space, megabytes) counts in head.
	setup := 100 // the first ones put the name in the ring's cache
	require.NoError(t, spanPairsC(s.Handle(), setup))
	for p := ownRingProbe(); p.offset >= p.soft/8; p = ownRingProbe() {
		require.Less(t, setup, 1_000_000, "the ring never came back to the start of a lap: %+v", p)
		require.NoError(t, spanPairsC(s.Handle(), 500))
		setup += 500
		require.NoError(t, s.Flush())
	}
	const pairs = 20_000
	before := ownRingProbe()
	require.Less(t, before.offset+pairs*20, before.soft)
	require.NoError(t, spanPairsC(s.Handle(), pairs))
	written := ownRingProbe().head - before.head
	// A pair the thread was preempted inside takes more: most take 16 bytes.
	assert.GreaterOrEqual(t, written, uint64(pairs*16))
	assert.Less(t, written, uint64(pairs*20), "%.1f bytes a pair", float64(written)/pairs)
	require.NoError(t, s.Finish())
	starts, ends := countSpanLines(t, path)
	assert.Equal(t, 1+setup+pairs, starts)
	assert.Equal(t, 1+setup+pairs, ends)
	testutil.RequireValid(t, path)
}

// Records too far apart for a short record's delta take the long compact
// forms, and the short ones after them count from them: a begin 200 us
// after the ring's last record, an end 60 ms after it, and a burst after
// both, whose spans start after them. Every bound comes out as the thread
// made it.
func TestSpansFarApartTakeTheLongFormsAndTheShortOnesCountOnFromThem(t *testing.T) {
	onCounter(t)
	const beginGap, endGap = 200 * time.Microsecond, 60 * time.Millisecond
	// The trace's times are the counter converted at its calibrated rate,
	// the spins' Go's monotonic clock: they differ by up to ~0.1% (47 us of
	// 60 ms seen under load), so each spin goes 2% past its gap.
	const spinMargin = 102
	s, path := openT(t, measuredRootRun)
	names := newCNames("outer", "inner")
	defer names.free()
	h := s.Handle()
	type pair struct{ outer, inner uint64 }
	var rounds []pair
	for round := 0; round < 3; round++ { // the first one puts the names in the cache
		outer, err := names.begin(h, 0)
		require.NoError(t, err)
		spin(beginGap * spinMargin / 100)
		inner, err := names.begin(h, 1)
		require.NoError(t, err)
		require.NoError(t, s.EndSpan(inner))
		spin(endGap * spinMargin / 100)
		require.NoError(t, s.EndSpan(outer))
		rounds = append(rounds, pair{outer, inner})
		require.NoError(t, spanPairsC(h, 500))
	}
	require.NoError(t, s.Finish())
	testutil.RequireValid(t, path)

	lines := testutil.Lines(t, path)
	spans := spansOf(t, lines)
	require.Len(t, spans, 1+3*(2+500))
	for i, r := range rounds {
		outer, inner := spans[fmt.Sprintf("s%d", r.outer)], spans[fmt.Sprintf("s%d", r.inner)]
		require.NotNil(t, outer, "round %d", i)
		require.NotNil(t, inner, "round %d", i)
		assert.Equal(t, outer.id, inner.parent, "round %d", i)
		assert.GreaterOrEqual(t, inner.start-outer.start, uint64(beginGap), "round %d: the begin gap", i)
		assert.GreaterOrEqual(t, outer.end-inner.end, uint64(endGap), "round %d: the end gap", i)
		assert.Less(t, outer.end-outer.start, uint64(beginGap+endGap+50*time.Millisecond), "round %d", i)
		assert.LessOrEqual(t, inner.start, inner.end, "round %d", i)
	}
	// Every span of a burst starts after the round before it has ended, and
	// the bursts' spans follow one another.
	var last uint64
	for _, l := range testutil.OfKind(lines, "span_start") {
		sp := spans[l["id"].(string)]
		if sp.parent == "" {
			continue
		}
		assert.GreaterOrEqual(t, sp.start, last, "%s starts after the span before it", sp.id)
		if sp.parent == "s1" && sp.end-sp.start < uint64(endGap) { // a burst's pair
			last = sp.end
		} else {
			last = sp.start
		}
	}
}

// Two sessions' spans interleaved on one thread: the short records' ids and
// deltas run along the ring, whoever's session each record is, so each
// session gets exactly its own spans with their own ids.
func TestShortRecordsOfTwoSessionsOnOneThread(t *testing.T) {
	onCounter(t)
	a, pathA := openT(t, measuredRootRun)
	b, pathB := openT(t, measuredRootRun)
	const rounds, k = 200, 7
	for i := 0; i < rounds; i++ {
		require.NoError(t, spanPairsC(a.Handle(), k))
		require.NoError(t, spanPairsC(b.Handle(), k))
	}
	require.NoError(t, a.Finish())
	require.NoError(t, b.Finish())
	for _, path := range []string{pathA, pathB} {
		testutil.RequireValid(t, path)
		starts, ends := countSpanLines(t, path)
		assert.Equal(t, 1+rounds*k, starts)
		assert.Equal(t, 1+rounds*k, ends)
		spans := spansOf(t, testutil.Lines(t, path))
		var prev uint64
		for id := uint64(2); id < uint64(2+rounds*k); id++ {
			sp := spans[fmt.Sprintf("s%d", id)]
			require.NotNil(t, sp, "%s: span s%d", path, id)
			assert.Equal(t, "s1", sp.parent)
			assert.GreaterOrEqual(t, sp.start, prev, "s%d starts after the span before it", id)
			assert.LessOrEqual(t, sp.start, sp.end)
			prev = sp.end
		}
	}
}
