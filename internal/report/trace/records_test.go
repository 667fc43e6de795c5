package trace

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/testutil"
)

// recordCounts tallies what StreamRecords handed over.
type recordCounts struct {
	meta, starts, ends, ops, intervals, terminals int
	names                                         []string
	outcome                                       string
}

func countRecords(t *testing.T, path string) (*recordCounts, *StreamResult, error) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	c := &recordCounts{}
	res, err := StreamRecords(f, RecordVisitor{
		Meta: func(*Meta) error { c.meta++; return nil },
		SpanStart: func(r *SpanStartRecord) error {
			c.starts++
			c.names = append(c.names, string(r.Name))
			return nil
		},
		SpanEnd:        func(*SpanEndRecord) error { c.ends++; return nil },
		Op:             func(*OpRecord) error { c.ops++; return nil },
		DeviceInterval: func(*DeviceIntervalRecord) error { c.intervals++; return nil },
		Terminal: func(r *TerminalRecord) error {
			c.terminals++
			c.outcome = r.Outcome
			return nil
		},
	}, 0)
	return c, res, err
}

func TestStreamRecordsCounts(t *testing.T) {
	for _, tc := range []struct {
		file                                         string
		starts, ends, ops, intervals, terminals, cut int
		outcome                                      string
	}{
		{"valid-train.jsonl", 5, 5, 4, 4, 1, 0, "complete"},
		{"failed-capture_failed.jsonl", 5, 2, 4, 4, 1, 0, "failed"},
		{"partial-no-terminal.jsonl", 5, 2, 4, 3, 0, 0, ""},
		// The cut last line (a device interval) is not handed over.
		{"partial-cut-line.jsonl", 5, 2, 4, 3, 0, 34, ""},
	} {
		t.Run(tc.file, func(t *testing.T) {
			c, res, err := countRecords(t, filepath.Join(testutil.CorpusDir(t), tc.file))
			require.NoError(t, err)
			assert.Equal(t, 1, c.meta)
			assert.Equal(t, []int{tc.starts, tc.ends, tc.ops, tc.intervals, tc.terminals},
				[]int{c.starts, c.ends, c.ops, c.intervals, c.terminals})
			assert.Equal(t, tc.outcome, c.outcome)
			assert.Equal(t, tc.terminals == 0, res.Incomplete)
			assert.Equal(t, tc.cut, res.CutLine)
			assert.Nil(t, res.Stop)
		})
	}
}

func TestStreamRecordsFields(t *testing.T) {
	f, err := os.Open(filepath.Join(testutil.CorpusDir(t), "valid-train.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	var starts []SpanStartRecord
	var ops []OpRecord
	var hostIntervals int
	_, err = StreamRecords(f, RecordVisitor{
		SpanStart: func(r *SpanStartRecord) error {
			c := *r
			c.ID, c.Name, c.Parent = append([]byte(nil), r.ID...), append([]byte(nil), r.Name...), append([]byte(nil), r.Parent...)
			starts = append(starts, c)
			return nil
		},
		Op: func(r *OpRecord) error {
			c := *r
			c.Name = append([]byte(nil), r.Name...)
			ops = append(ops, c)
			return nil
		},
		DeviceInterval: func(r *DeviceIntervalRecord) error {
			if r.OnHostClock() {
				hostIntervals++
			}
			return nil
		},
	}, 0)
	require.NoError(t, err)
	require.Len(t, starts, 5)
	s3 := starts[2]
	assert.Equal(t, "train/forward", string(s3.Name))
	assert.True(t, s3.HasParent)
	assert.Equal(t, "s2", string(s3.Parent))
	assert.Equal(t, "module", s3.Kind)
	assert.Equal(t, "forward", s3.Step)
	assert.Equal(t, uint64(200), s3.StartNS)
	assert.Equal(t, uint64(100), s3.TID)
	assert.False(t, starts[0].HasParent)
	assert.Equal(t, "", starts[0].Step)
	assert.True(t, starts[1].Measured)
	// relu gives output_dense_bytes, matmul's is derived from [8,16] f32.
	require.Len(t, ops, 4)
	assert.Equal(t, "matmul", string(ops[0].Name))
	assert.Equal(t, []uint64{1000, 300, 1024, 512}, []uint64{ops[0].DurationNS, ops[0].TimestampNS, ops[0].InputBytes, ops[0].OutputBytes})
	assert.True(t, ops[0].HasOutputBytes)
	assert.Equal(t, 4, hostIntervals)
}

func TestStreamRecordsErrors(t *testing.T) {
	stop := errors.New("collector gone")
	f, err := os.Open(filepath.Join(testutil.CorpusDir(t), "valid-train.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	ops := 0
	_, err = StreamRecords(f, RecordVisitor{Op: func(*OpRecord) error {
		ops++
		return stop
	}}, 0)
	assert.ErrorIs(t, err, stop, "a callback's error ends the stream")
	assert.Equal(t, 1, ops)

	_, err = StreamRecords(strings.NewReader(`{"kind":"span_end","id":"s1","duration_ns":1}`+"\n"), RecordVisitor{}, 0)
	assert.ErrorContains(t, err, "line 1: the first record is span_end; a trace starts with a meta record")
	_, err = StreamRecords(strings.NewReader(""), RecordVisitor{}, 0)
	assert.ErrorContains(t, err, "no meta record")

	g, err := os.Open(filepath.Join(testutil.CorpusDir(t), "bad-invalid_json-trailing-garbage.jsonl"))
	require.NoError(t, err)
	defer g.Close()
	res, err := StreamRecords(g, RecordVisitor{}, 0)
	require.NoError(t, err)
	require.NotNil(t, res.Stop, "an unreadable line ends the read and says so")
	assert.Equal(t, CodeInvalidJSON, res.Stop.Code)
}
