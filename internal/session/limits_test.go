package session

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/testutil"
)

// Issue 14, defect 7: strings recorded through Go had no bound; a 64 MiB name
// was accepted, finish said OK, and the trace's readers refused its line.
// Every string is bounded as at the C ABI (1 MiB), an op's strings together
// by 8 MiB, and a refused record writes nothing.
func TestGoStringsAreBounded(t *testing.T) {
	huge := strings.Repeat("a", 64<<20)
	mib := strings.Repeat("m", 1<<20)
	tests := []struct {
		name string
		call func(s *Session, span uint64) error
		want string // "" = accepted
	}{
		{"completed span name of 1 MiB", func(s *Session, _ uint64) error {
			_, err := s.RecordCompletedSpan(mib, events.SpanFunction, 0, 1)
			return err
		}, ""},
		{"completed span name of 64 MiB", func(s *Session, _ uint64) error {
			_, err := s.RecordCompletedSpan(huge, events.SpanFunction, 0, 1)
			return err
		}, "ct_record_completed_span: name is longer than 1 MiB (67108864 bytes)"},
		{"scalar label of 64 MiB", func(s *Session, span uint64) error { return s.RecordScalar(span, huge, 1) },
			`ct_record_scalar: tensor_stats: "label" is longer than 1 MiB (67108864 bytes)`},
		{"data edge of 64 MiB", func(s *Session, _ uint64) error { return s.RecordDataEdge(huge, "t") },
			`ct_record_data_edge: edge: "from_tensor" is longer than 1 MiB (67108864 bytes)`},
		{"op inputs of 9 MiB together", func(s *Session, span uint64) error {
			op := &events.Op{OpName: "cat", Dtype: "f32", Device: "cpu", Shape: []uint64{1}, DurationNs: 1,
				Inputs: []string{mib, mib, mib, mib, mib, mib, mib, mib, mib}}
			return s.RecordOp(span, op)
		}, "ct_record_op: op: its strings are 9437193 bytes together, more than the 8 MiB one record may carry"},
		{"finish failed reason of 64 MiB", func(s *Session, _ uint64) error { return s.FinishFailed(huge) },
			"ct_finish_failed: reason is longer than 1 MiB (67108864 bytes)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, path := openT(t, measuredRootRun)
			span := begin(t, s, "work")
			err := tt.call(s, span)
			if tt.want == "" {
				require.NoError(t, err)
			} else {
				requireCode(t, err, InvalidArgument, tt.want)
			}
			end(t, s, span)
			require.NoError(t, s.Finish(), "a refusal leaves the session usable")
			lines := testutil.Lines(t, path)
			assert.Equal(t, "complete", lines[len(lines)-1]["outcome"])
			for _, l := range lines {
				assert.NotEqual(t, "cat", l["op_name"], "a refused op writes nothing")
			}
			testutil.RequireValid(t, path)
		})
	}
}
