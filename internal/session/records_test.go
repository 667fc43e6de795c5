package session

import (
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/testutil"
)

func op(name string, ts, dur uint64) *events.Op {
	return &events.Op{OpName: name, Dtype: "f32", Device: "cpu", Inputs: []string{"a", "b"}, Output: "c", HasOutput: true,
		Shape: []uint64{4, 4}, TimestampNs: ts, DurationNs: dur, InputDenseBytes: 128}
}

func TestOpMustLieInsideItsSpan(t *testing.T) {
	s, path := openT(t, measuredRootRun)
	span := begin(t, s, "forward")
	time.Sleep(200 * time.Microsecond)
	require.NoError(t, s.RecordOp(span, op("matmul", 0, 100_000)), "a zero timestamp means it just ended")
	bounds, _ := s.open.get(span)
	requireCode(t, s.RecordOp(span, op("early", bounds.start-1, 1)), InvalidArgument, "lies outside span")
	requireCode(t, s.RecordOp(span, op("future", s.Now()+1e9, 1)), InvalidArgument, "the span is open: records must not end in the future")
	requireCode(t, s.RecordOp(span, op("overflow", math.MaxUint64, 2)), InvalidArgument, "overflows")
	requireCode(t, s.RecordOp(span, op("too long", 0, s.Now()+1e12)), InvalidArgument, "longer than the session has existed")
	end(t, s, span)
	require.NoError(t, s.Flush()) // drains the rings into the span tables
	closed, ok := s.closed.get(span)
	require.True(t, ok)
	require.NoError(t, s.RecordOp(span, op("late but inside", closed.start, closed.dur)), "records may come after their span closed")
	requireCode(t, s.RecordOp(span, op("after end", closed.start+1, closed.dur)), InvalidArgument, "lies outside span")
	requireCode(t, s.RecordOp(999999, op("x", 0, 1)), InvalidHandle, "span s999999 does not exist")
	requireCode(t, s.RecordOp(0, op("x", 0, 1)), InvalidHandle, "span 0 is never valid")
	bad := op("", 0, 1)
	requireCode(t, s.RecordOp(span, bad), InvalidArgument, "op_name")
	huge := op("huge", 0, 1)
	huge.Shape = []uint64{1 << 62, 8}
	requireCode(t, s.RecordOp(span, huge), InvalidArgument, "more elements than a u64 can count")
	huge.Shape = []uint64{1 << 61, 4} // the count fits, its f32 byte size does not
	requireCode(t, s.RecordOp(span, huge), InvalidArgument, "dense byte size larger than a u64")
	require.NoError(t, s.Finish())

	lines := testutil.Lines(t, path)
	ops := testutil.OfKind(lines, "op")
	require.Len(t, ops, 2, "refused ops write nothing")
	assert.Equal(t, float64(64), ops[0]["output_dense_bytes"], "derived from shape x f32")
	testutil.RequireValid(t, path)
}

func TestMemoryLifetimesAreCheckedOnArrival(t *testing.T) {
	s, path := openT(t, measuredRootRun)
	span := begin(t, s, "step")
	mem := func(action events.MemoryAction, storage, tensor string, bytes uint64) *events.Memory {
		return &events.Memory{Action: action, StorageID: storage, TensorID: tensor, Device: "cpu", Dtype: "f32",
			Bytes: bytes, Shape: []uint64{bytes / 4}, Category: events.CategoryActivation}
	}
	require.NoError(t, s.RecordMemory(span, mem(events.MemoryAlloc, "st-1", "t1", 64)))
	require.NoError(t, s.RecordMemory(span, mem(events.MemoryAlloc, "st-1", "t2", 64)), "an alias of a live storage")
	requireCode(t, s.RecordMemory(span, mem(events.MemoryAlloc, "st-1", "t3", 32)), InvalidArgument, "allocation_size_mismatch")
	requireCode(t, s.RecordMemory(span, mem(events.MemoryAlloc, "st-1", "t1", 64)), InvalidArgument, "duplicate_allocation")
	requireCode(t, s.RecordMemory(span, mem(events.MemoryFree, "st-1", "t1", 32)), InvalidArgument, "freed with 32")
	require.NoError(t, s.RecordMemory(span, mem(events.MemoryFree, "st-1", "t2", 64)), "any alias may free")
	requireCode(t, s.RecordMemory(span, mem(events.MemoryFree, "st-1", "t1", 64)), InvalidArgument, "unpaired_free")
	requireCode(t, s.RecordMemory(span, mem(events.MemoryFree, "never", "t9", 64)), InvalidArgument, "unpaired_free")
	other := mem(events.MemoryAlloc, "st-1", "t1", 64)
	other.Device = "cuda:0"
	require.NoError(t, s.RecordMemory(span, other), "lifetimes are keyed by device too")
	late := mem(events.MemoryAlloc, "st-2", "t1", 4)
	late.TimestampNs = s.Now() + 1e9
	requireCode(t, s.RecordMemory(span, late), InvalidArgument, "lies outside span")
	end(t, s, span)
	require.NoError(t, s.Finish())
	assert.Len(t, testutil.OfKind(testutil.Lines(t, path), "memory"), 4)
	h := testutil.RequireValid(t, path)
	var codes []string
	for _, i := range h.Issues {
		codes = append(codes, i.Code)
	}
	assert.Contains(t, codes, "retained_allocations", "the cuda storage was never freed: a warning, not an error")
}

func TestCallEdgesFollowTheHierarchy(t *testing.T) {
	s, path := openT(t, trainRun)
	m, err := s.BeginMeasurement("update")
	require.NoError(t, err)
	fwd := begin(t, s, "forward")
	require.NoError(t, s.RecordCallEdge(m, fwd, 0), "pending until forward closes")
	requireCode(t, s.RecordCallEdge(m, fwd, 5), InvalidArgument, "still open")
	requireCode(t, s.RecordCallEdge(1, fwd, 0), InvalidArgument, "call_edge_hierarchy_mismatch")
	end(t, s, fwd)
	require.NoError(t, s.Flush())
	c, _ := s.closed.get(fwd)
	require.NoError(t, s.RecordCallEdge(m, fwd, c.dur), "the exact duration is accepted")
	requireCode(t, s.RecordCallEdge(m, fwd, c.dur+1), InvalidArgument, "differs from")
	requireCode(t, s.RecordCallEdge(m, 12345, 0), InvalidHandle, "does not exist")
	requireCode(t, s.RecordCallEdge(0, m, 0), InvalidHandle, "span 0")
	end(t, s, m)
	require.NoError(t, s.Finish())
	edges := testutil.OfKind(testutil.Lines(t, path), "edge")
	require.Len(t, edges, 2)
	for _, e := range edges {
		assert.Equal(t, float64(c.dur), e["host_duration_ns"])
	}
	testutil.RequireValid(t, path)
}

func TestDataEdgesNeedKnownTensors(t *testing.T) {
	s, path := openT(t, measuredRootRun)
	span := begin(t, s, "f")
	requireCode(t, s.RecordDataEdge("a", "c"), InvalidArgument, `tensor "a" is unknown`)
	require.NoError(t, s.RecordOp(span, op("matmul", 0, 1)))
	require.NoError(t, s.RecordDataEdge("a", "c"))
	requireCode(t, s.RecordDataEdge("", "c"), InvalidArgument, "")
	end(t, s, span)
	require.NoError(t, s.Finish())
	testutil.RequireValid(t, path)
}

func TestGradientsUnderAnExactContract(t *testing.T) {
	run := `{"entrypoint":"g","phase":"train","capture_step":1,"device":"cpu","measured_root":true,
	  "capture_contract":{"measurement_scope":"profiled_work","operations":"partial","logical_memory":"none",
	    "physical_memory":"none","device_timing":"none","gradients":"complete",
	    "gradient_contract":{"expected":[{"root":"vb","key":"w1","family":"enc"},{"root":"vb","key":"w2","family":"enc"}],
	      "families":[{"family":"enc","expectation":"active","min_present":1}]}}}`
	s, path := openT(t, run)
	norm := 0.5
	zero := 0.0
	negZero := math.Copysign(0, -1)
	nan := math.NaN()
	tests := []struct {
		name      string
		key       string
		state     events.GradientState
		norm      *float64
		code      Status
		substring string
	}{
		{"present without norm", "w1", events.GradientPresent, nil, InvalidArgument, "norm"},
		{"present with zero norm", "w1", events.GradientPresent, &zero, InvalidArgument, "norm"},
		{"present with NaN", "w1", events.GradientPresent, &nan, InvalidArgument, "norm"},
		{"zero with -0.0", "w1", events.GradientZero, &negZero, InvalidArgument, "norm"},
		{"zero with 0.5", "w1", events.GradientZero, &norm, InvalidArgument, "norm"},
		{"missing with a norm", "w1", events.GradientMissing, &norm, InvalidArgument, "norm"},
		{"undeclared key", "w3", events.GradientPresent, &norm, InvalidArgument, "gradient_manifest_undeclared_key"},
		{"blank key", " ", events.GradientPresent, &norm, InvalidArgument, "key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			requireCode(t, s.RecordGradient("vb", tc.key, tc.state, tc.norm), tc.code, tc.substring)
		})
	}
	require.NoError(t, s.RecordGradient("vb", "w1", events.GradientPresent, &norm))
	requireCode(t, s.RecordGradient("vb", "w1", events.GradientPresent, &norm), InvalidArgument, "gradient_manifest_duplicate_key")
	requireCode(t, s.Finish(), State, "gradient contract expects gradients not recorded: vb/w2")
	require.NoError(t, s.RecordGradient("vb", "w2", events.GradientZero, &zero))
	require.NoError(t, s.Finish())
	grads := testutil.OfKind(testutil.Lines(t, path), "gradient")
	require.Len(t, grads, 2)
	assert.Equal(t, "gradient-1", grads[0]["event_id"])
	assert.Equal(t, "gradient-2", grads[1]["event_id"])
	testutil.RequireValid(t, path)
}

func TestRequiredLabelsMustOccurOnce(t *testing.T) {
	run := `{"entrypoint":"l","phase":"infer","capture_step":1,"device":"cpu","measured_root":true,
	  "capture_contract":{"measurement_scope":"profiled_work","operations":"none","logical_memory":"none",
	    "physical_memory":"none","device_timing":"none","required_semantic_labels":["model/forward"]}}`
	s, path := openT(t, run)
	requireCode(t, s.Finish(), State, `required semantic label "model/forward" must name exactly one span, saw 0`)
	a := begin(t, s, "model/forward")
	end(t, s, a)
	b := begin(t, s, "model/forward")
	end(t, s, b)
	requireCode(t, s.Finish(), State, "saw 2")
	require.NoError(t, s.FinishFailed("label seen twice"))
	_ = path
}

func TestStatsAndScalars(t *testing.T) {
	s, path := openT(t, measuredRootRun)
	span := begin(t, s, "f")
	require.NoError(t, s.RecordTensorStatsF32(span, "act", []float32{3, -4, float32(math.NaN()), float32(math.Inf(1))}, []uint64{2, 2}))
	require.NoError(t, s.RecordScalar(span, "loss", math.Inf(-1)))
	requireCode(t, s.RecordTensorStatsF32(span, "bad", []float32{1, 2, 3}, []uint64{2, 2}), InvalidArgument, "")
	requireCode(t, s.RecordScalar(span, "  ", 1), InvalidArgument, "label")
	st := &events.TensorStats{Label: "x", Dtype: "f32", Shape: []uint64{3}, Elements: 4, RMS: 1, AbsMax: 1}
	requireCode(t, s.RecordTensorStats(span, st), InvalidArgument, "elements")
	st = &events.TensorStats{Label: "x", Dtype: "f32", Shape: []uint64{3}, Elements: 3, NonFinite: 4}
	requireCode(t, s.RecordTensorStats(span, st), InvalidArgument, "non_finite")
	st = &events.TensorStats{Label: "x", Dtype: "f32", Shape: []uint64{3}, Elements: 3, RMS: -1}
	requireCode(t, s.RecordTensorStats(span, st), InvalidArgument, "rms")
	st = &events.TensorStats{Label: "x", Dtype: "f32", Shape: []uint64{3}, Elements: 3, Mean: math.NaN()}
	requireCode(t, s.RecordTensorStats(span, st), InvalidArgument, "mean")
	end(t, s, span)
	require.NoError(t, s.Finish())
	stats := testutil.OfKind(testutil.Lines(t, path), "tensor_stats")
	require.Len(t, stats, 2)
	assert.Equal(t, float64(2), stats[0]["non_finite"])
	assert.Equal(t, float64(4), stats[0]["abs_max"])
	assert.InDelta(t, math.Sqrt(12.5), stats[0]["rms"], 1e-9, "rms over the finite elements")
	assert.Equal(t, -0.5, stats[0]["mean"])
	assert.Equal(t, float64(1), stats[1]["non_finite"])
	assert.Equal(t, float64(0), stats[1]["mean"])
	testutil.RequireValid(t, path)
}

func TestDeviceRecords(t *testing.T) {
	s, path := openT(t, measuredRootRun)
	span := begin(t, s, "launch")
	require.NoError(t, s.RecordDeviceMemory(&events.DeviceMemory{Device: "cuda:0", Used: 10, HasUsed: true, Capacity: 100, HasCapacity: true}))
	requireCode(t, s.RecordDeviceMemory(&events.DeviceMemory{Device: "cuda:0"}), InvalidArgument, "at least one")
	requireCode(t, s.RecordDeviceMemory(&events.DeviceMemory{Device: "cuda:0", Used: 1, HasUsed: true, TimestampNs: s.Now() + 1e9}), InvalidArgument, "in the future")
	require.NoError(t, s.RecordDeviceInterval(span, &events.DeviceInterval{Device: "cuda:0", StreamID: "7", Backend: "cuda", Name: "gemm", StartNs: 10, DurationNs: 5}))
	requireCode(t, s.RecordDeviceInterval(span, &events.DeviceInterval{Device: "cuda:0", StreamID: "7", Backend: "cuda", StartNs: 10}), InvalidArgument, "duration")
	requireCode(t, s.RecordDeviceInterval(span, &events.DeviceInterval{Device: "cuda:0", StreamID: "7", Backend: "cuda", StartNs: math.MaxUint64, DurationNs: 5}), InvalidArgument, "overflows")
	end(t, s, span)
	require.NoError(t, s.Finish())
	lines := testutil.Lines(t, path)
	iv := testutil.OfKind(lines, "device_interval")
	require.Len(t, iv, 1)
	assert.Equal(t, "host-monotonic", iv[0]["clock_id"])
	assert.Len(t, testutil.OfKind(lines, "device_memory"), 1)
	testutil.RequireValid(t, path)
}

func TestMemoryMustBeInTimeOrderPerStorage(t *testing.T) {
	s, path := openT(t, measuredRootRun)
	span := begin(t, s, "step")
	at := func(action events.MemoryAction, tensor string, ts uint64) *events.Memory {
		return &events.Memory{Action: action, StorageID: "st", TensorID: tensor, Device: "cpu", Dtype: "f32", Bytes: 16, TimestampNs: ts}
	}
	base := s.Now()
	time.Sleep(50 * time.Microsecond)
	require.NoError(t, s.RecordMemory(span, at(events.MemoryAlloc, "t1", base+10)))
	requireCode(t, s.RecordMemory(span, at(events.MemoryFree, "t1", base+5)), InvalidArgument, "precedes its alloc")
	require.NoError(t, s.RecordMemory(span, at(events.MemoryFree, "t1", base+20)))
	// Sorted by time this alloc would fall inside the lifetime that just
	// ended: candle-graph would report duplicate_allocation and unpaired_free.
	requireCode(t, s.RecordMemory(span, at(events.MemoryAlloc, "t1", base+15)), InvalidArgument, "precedes its previous free at")
	require.NoError(t, s.RecordMemory(span, at(events.MemoryAlloc, "t1", base+20)), "a tie keeps arrival order")
	require.NoError(t, s.RecordMemory(span, at(events.MemoryFree, "t1", base+30)))
	end(t, s, span)
	require.NoError(t, s.Finish())
	testutil.RequireValid(t, path)
}

// On a disk that fills up, the first error a record call gets is
// CT_ERR_POISONED: the write that fails never runs inside a record call's
// drain, where it used to poison the session halfway and leave the
// record's own span undrained ("span sN ... never opened").
func TestFullDiskPoisonsBeforeAnyOtherError(t *testing.T) {
	sink := &failingSink{budget: 1 << 20}
	s, _ := openT(t, measuredRootRun, WithWriteChunk(1), WithFlushInterval(time.Hour),
		WithOpener(func(string) (Sink, error) { return sink, nil }))
	sink.mu.Lock()
	sink.budget = 0 // the meta line and the root are on disk; now the disk is full
	sink.mu.Unlock()
	begin(t, s, "outer")
	for i := 0; i < 10; i++ {
		end(t, s, begin(t, s, "child"))
	}
	inner := begin(t, s, "inner")
	err := s.RecordOp(inner, op("matmul", 0, 1))
	if err != nil {
		requireCode(t, err, Poisoned, "poisoned by an earlier write error")
	}
	drainAndWrite() // the drainer writes what is buffered, and fails
	requireCode(t, s.RecordOp(inner, op("matmul", 0, 1)), Poisoned, "disk full (fake)")
	requireCode(t, s.EndSpan(inner), Poisoned, "disk full (fake)")
	requireCode(t, s.FinishFailed("disk full"), IO, "disk full (fake)")
}

// A record call drains its own thread's ring only: another thread's spans
// stay in that thread's ring for the drainer, until a record names one of
// them (then that ring is drained, so the record sees it).
func TestRecordCallsDrainOnlyTheirOwnThreadsRing(t *testing.T) {
	s, _ := openT(t, measuredRootRun, WithFlushInterval(time.Hour))
	mu.Lock()
	others := len(live) - 1
	mu.Unlock()
	// Another live session's flusher drains every ring on its tick.
	require.Zero(t, others, "sessions of earlier tests still open")
	type report struct {
		span    uint64
		backlog uint64
	}
	reports, ask := make(chan report), make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		id, err := s.BeginSpan("other thread", events.SpanFunction, events.StepNone)
		if err != nil {
			close(reports)
			return
		}
		reports <- report{id, ownRingBacklog()}
		<-ask
		reports <- report{id, ownRingBacklog()}
		<-ask
		reports <- report{id, ownRingBacklog()}
		<-ask
		s.EndSpan(id)
		close(reports)
	}()
	first, ok := <-reports
	require.True(t, ok, "the other thread's span did not begin")
	require.NotZero(t, first.backlog)

	mine := begin(t, s, "mine")
	require.NoError(t, s.RecordOp(mine, op("matmul", 0, 1)))
	assert.Zero(t, ownRingBacklog(), "the calling thread's ring is drained")
	ask <- struct{}{}
	assert.Equal(t, first.backlog, (<-reports).backlog, "the other thread's ring is left to the drainer")

	require.NoError(t, s.RecordOp(first.span, op("on the other thread's span", 0, 1)))
	ask <- struct{}{}
	assert.Zero(t, (<-reports).backlog, "a record naming its span drains that ring")
	ask <- struct{}{}
	<-reports
	end(t, s, mine)
}
