package events

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// The span lines built from cached pieces are AppendSpanStart's and
// AppendSpanEnd's, byte for byte, whatever the fields.
func TestSpanLinesFromPiecesMatchTheAppenders(t *testing.T) {
	tests := []struct {
		name            string
		id, parent      uint64
		span            string
		start, duration uint64
		kind            SpanKind
		measured        bool
		step            Step
		tid             int64
	}{
		{"leaf under the root", 2, 1, "layer/forward", 15485207, 430, SpanFunction, false, StepNone, 21557},
		{"the root itself", 1, 0, "bench", 0, 176623930, SpanFunction, true, StepNone, 21557},
		{"nested op with a step", 123456, 98765, "matmul", 1e12, 7, SpanOp, false, StepBackward, 1},
		{"module, optimizer, no tid", 99999999, 100000000, "model.layers[0]", 1e16 - 1, 1e16, SpanModule, false, StepOptimizer, 0},
		{"largest values", math.MaxUint64, math.MaxUint64 - 1, "x", math.MaxUint64, math.MaxUint64, SpanFunction, true, StepForward, math.MaxInt64},
		{"name that needs escaping", 7, 3, "a\"b\\c\n\x00é\xff", 0, 0, SpanOp, false, StepNone, -5},
		{"unknown kind and step spelled as the appender does", 8, 1, "y", 1, 1, SpanKind(9), false, Step(7), 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var tail StartTail
			id := RefOf(tc.id)
			var parent *SpanRef
			if tc.parent != 0 {
				p := RefOf(tc.parent)
				parent = &p
			}
			want := AppendSpanStart([]byte("x"), tc.id, tc.parent, tc.span, tc.start, tc.kind, tc.measured, tc.step, tc.tid)
			got := AppendSpanStartRef([]byte("x"), &id, parent, AppendName(nil, []byte(tc.span)), tc.start,
				tail.For(tc.kind, tc.measured, tc.step, tc.tid))
			require.Equal(t, string(want), string(got))
			// The same into a buffer without room: it grows by what the
			// line may write.
			fresh := AppendSpanStartRef(nil, &id, parent, AppendName(nil, []byte(tc.span)), tc.start, &tail)
			require.Equal(t, string(want[1:]), string(fresh))
			require.Equal(t, string(AppendSpanEnd([]byte("x"), tc.id, tc.duration)),
				string(AppendSpanEndRef([]byte("x"), &id, tc.duration)))
		})
	}
}

// A StartTail spells its bytes again when any field changes, and only then.
func TestStartTailFollowsItsFields(t *testing.T) {
	var tail StartTail
	require.Equal(t, `,"span_kind":"function","tid":42}`+"\n", string(tail.For(SpanFunction, false, StepNone, 42).Bytes()))
	require.Equal(t, `,"span_kind":"function","tid":42}`+"\n", string(tail.For(SpanFunction, false, StepNone, 42).Bytes()))
	for _, tc := range []struct {
		kind     SpanKind
		measured bool
		step     Step
		tid      int64
		want     string
	}{
		{SpanOp, false, StepNone, 42, `,"span_kind":"op","tid":42}`},
		{SpanOp, true, StepNone, 42, `,"span_kind":"op","measured":true,"tid":42}`},
		{SpanOp, true, StepForward, 42, `,"span_kind":"op","measured":true,"step":"forward","tid":42}`},
		{SpanOp, true, StepForward, 0, `,"span_kind":"op","measured":true,"step":"forward"}`},
		{SpanFunction, false, StepNone, 42, `,"span_kind":"function","tid":42}`},
	} {
		require.Equal(t, tc.want+"\n", string(tail.For(tc.kind, tc.measured, tc.step, tc.tid).Bytes()))
	}
}

func TestRefOfSpellsTheWireId(t *testing.T) {
	for _, tc := range []struct {
		id   uint64
		want string
	}{{1, "s1"}, {10, "s10"}, {12345678, "s12345678"}, {123456789, "s123456789"}, {math.MaxUint64, "s18446744073709551615"}} {
		r := RefOf(tc.id)
		require.Equal(t, tc.want, string(r.Bytes()))
	}
	require.Equal(t, "s1", string(RootRef.Bytes()))
}

// The longest tail fits its array.
func TestStartTailHoldsTheLongestTail(t *testing.T) {
	var tail StartTail
	longest := appendStartTail(nil, SpanKind(math.MaxUint32), true, Step(math.MaxUint32), math.MaxInt64)
	require.LessOrEqual(t, len(longest), tailRoom)
	require.Equal(t, string(longest), string(tail.For(SpanKind(math.MaxUint32), true, Step(math.MaxUint32), math.MaxInt64).Bytes()))
}

// Next spells the following id, carries included; at a new digit it says so
// and leaves the ref alone.
func TestSpanRefNextCountsInDecimal(t *testing.T) {
	for _, id := range []uint64{1, 8, 10, 19, 100, 109, 199, 1299, 123456, 99999998, math.MaxUint64 - 1} {
		r := RefOf(id)
		require.True(t, r.Next(), "after %d", id)
		want := RefOf(id + 1)
		require.Equal(t, string(want.Bytes()), string(r.Bytes()), "after %d", id)
	}
	for _, id := range []uint64{9, 99, 999999, 9999999999999999999} {
		r := RefOf(id)
		require.False(t, r.Next(), "after %d: one digit more", id)
		want := RefOf(id)
		require.Equal(t, want, r)
	}
}
