package trace

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/testutil"
)

func TestSkimKind(t *testing.T) {
	tests := []struct {
		line string
		want Kind
		ok   bool
	}{
		{`{"kind":"op","op_name":"aten::mm"}`, KindOp, true},
		{`{"kind":"device_interval","x":1}`, KindDeviceInterval, true},
		{`{"kind":"memory"`, KindMemory, true}, // a cut line: the kind is all it reads
		{`{"kind":"operation"}`, 0, false},
		{`{"kind":"device_intervals_x"}`, 0, false}, // no quote within the longest kind's length
		{`{ "kind":"op"}`, 0, false},                // laid out otherwise: decoded, not skimmed
		{`{"op_name":"a","kind":"op"}`, 0, false},
		{`{"kind":"op`, 0, false},
		{``, 0, false},
	}
	for _, tt := range tests {
		got, ok := SkimKind([]byte(tt.line))
		assert.Equal(t, tt.ok, ok, tt.line)
		assert.Equal(t, tt.want, got, tt.line)
	}
}

func TestSkimOpName(t *testing.T) {
	tests := []struct {
		line, want string
		ok         bool
	}{
		{`{"kind":"op","span_id":"s1","op_name":"gloo:all_reduce","x":1}`, "gloo:all_reduce", true},
		{`{"kind":"op","inputs":["\"op_name\":\"gloo:x"],"op_name":"aten::mm"}`, "aten::mm", true}, // escaped inside a string: no match
		{`{"kind":"op","op_name":"a\"b"}`, "", false},                                              // escapes: left to the decoder
		{`{"kind":"op","op_name" : "aten::mm"}`, "", false},
		{`{"kind":"op","op_name":"aten::mm`, "", false},
		{`{"kind":"op"}`, "", false},
	}
	for _, tt := range tests {
		got, ok := SkimOpName([]byte(tt.line))
		assert.Equal(t, tt.ok, ok, tt.line)
		assert.Equal(t, tt.want, string(got), tt.line)
	}
}

// recordLog writes down what StreamRecords handed over, one line a record.
func recordLog(r io.Reader, skim bool, opNamed func([]byte) bool) (string, *StreamResult, error) {
	var b strings.Builder
	res, err := StreamRecords(r, RecordVisitor{
		Meta: func(m *Meta) error { fmt.Fprintf(&b, "meta %s\n", m.RunID); return nil },
		SpanStart: func(s *SpanStartRecord) error {
			fmt.Fprintf(&b, "start %s %s %d\n", s.ID, s.Name, s.StartNS)
			return nil
		},
		Op: func(o *OpRecord) error {
			fmt.Fprintf(&b, "op %s %d %d %d\n", o.Name, o.TimestampNS, o.DurationNS, o.InputBytes)
			return nil
		},
		Terminal: func(e *TerminalRecord) error { fmt.Fprintf(&b, "terminal %s\n", e.Outcome); return nil },
		Skim:     skim,
		OpNamed:  opNamed,
	}, 0)
	return b.String(), res, err
}

// TestStreamRecordsSkim: on the corpus's readable traces, skimming hands
// over what a full read does for the kinds with a callback (the ops
// OpNamed picks), and ends the same way; it does not check the rest.
func TestStreamRecordsSkim(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(testutil.CorpusDir(t), "*.jsonl"))
	require.NoError(t, err)
	picked := func(name []byte) bool { return bytes.HasPrefix(name, []byte("mat")) }
	compared := 0
	for _, file := range files {
		data, err := os.ReadFile(file)
		require.NoError(t, err)
		full, fres, ferr := recordLog(bytes.NewReader(data), false, nil)
		if ferr != nil || fres.Stop != nil {
			continue // a trace the full read refuses: skimming may read further
		}
		compared++
		t.Run(filepath.Base(file), func(t *testing.T) {
			skimmed, sres, serr := recordLog(bytes.NewReader(data), true, nil)
			require.NoError(t, serr)
			assert.Equal(t, full, skimmed)
			assert.Equal(t, fres.Incomplete, sres.Incomplete)
			assert.Equal(t, fres.Lines, sres.Lines)

			var want strings.Builder
			for _, l := range strings.SplitAfter(full, "\n") {
				if !strings.HasPrefix(l, "op ") || strings.HasPrefix(l, "op mat") {
					want.WriteString(l)
				}
			}
			named, _, err := recordLog(bytes.NewReader(data), true, picked)
			require.NoError(t, err)
			assert.Equal(t, want.String(), named)
		})
	}
	assert.Greater(t, compared, 5, "the corpus has readable traces to compare")

	// A broken record of a kind nobody asked for ends a full read, not a skim.
	trace := string(testutil.Corpus(t, "valid-train.jsonl"))
	nl := strings.Index(trace, "\n") + 1
	broken := trace[:nl] + `{"kind":"tensor","id":}` + "\n" + trace[nl:]
	_, res, err := recordLog(strings.NewReader(broken), false, nil)
	require.NoError(t, err)
	require.NotNil(t, res.Stop)
	assert.Equal(t, 2, res.Stop.Line)
	log, res, err := recordLog(strings.NewReader(broken), true, nil)
	require.NoError(t, err)
	assert.Nil(t, res.Stop)
	assert.Contains(t, log, "terminal complete")
}
