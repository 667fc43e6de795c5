package analysis

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/candle-trace/candle-trace/internal/report/health"
	"github.com/candle-trace/candle-trace/internal/report/trace"

	"github.com/candle-trace/candle-trace/internal/testutil"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// onlyReader hides io.Seeker: the reader must then buffer memory records.
type onlyReader struct{ io.Reader }

func analyzeBytes(t *testing.T, data []byte, opts Options) *Result {
	t.Helper()
	res, err := Analyze(bytes.NewReader(data), opts)
	require.NoError(t, err)
	return res
}

func issueWith(h *health.Health, code string) *trace.Issue {
	for i := range h.Issues {
		if h.Issues[i].Code == code {
			return &h.Issues[i]
		}
	}
	return nil
}

func TestPartialTraces(t *testing.T) {
	full := testutil.Corpus(t, "valid-infer.jsonl")
	lines := strings.SplitAfter(string(full), "\n")
	lines = lines[:len(lines)-1] // trailing empty element
	tests := []struct {
		name        string
		data        string
		wantCutLine int
		wantValid   bool
		wantCode    string
	}{
		{"unterminated, last line whole", strings.Join(lines[:12], ""), 0, true, ""},
		{"last line whole without newline", strings.TrimSuffix(strings.Join(lines[:12], ""), "\n"), 0, true, ""},
		{"cut inside a string", strings.Join(lines[:12], "") + lines[12][:20], 13, true, ""},
		{"cut inside a number", strings.Join(lines[:12], "") + `{"kind":"span_end","id":"s3","duration_ns":4`, 13, true, ""},
		{"cut inside a \\u escape", strings.Join(lines[:12], "") + `{"kind":"span_end","id":"\u00`, 13, true, ""},
		{"cut after blank lines", strings.Join(lines[:12], "") + "\n\n" + lines[12][:5], 15, true, ""},
		{"broken last line is not a cut", strings.Join(lines[:12], "") + `{"kind":"span_end",x`, 0, false, trace.CodeInvalidJSON},
		{"cut line that is not last", strings.Join(lines[:12], "") + lines[12][:20] + "\n" + lines[13], 0, false, trace.CodeInvalidJSON},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := analyzeBytes(t, []byte(tc.data), Options{}).Health
			assert.False(t, h.OK(false), "a partial trace never passes plain validate")
			if tc.wantCode != "" {
				assert.NotNil(t, issueWith(&h, tc.wantCode), "%v", h.Issues)
				assert.False(t, h.Parsed)
				return
			}
			assert.True(t, h.Incomplete)
			assert.Equal(t, tc.wantCutLine, h.CutLine)
			assert.Equal(t, tc.wantValid, h.OK(true), "%v", h.Issues)
			inc := issueWith(&h, trace.CodeTraceIncomplete)
			require.NotNil(t, inc)
			assert.Equal(t, trace.SeverityWarning, inc.Severity)
			assert.Equal(t, tc.wantCutLine, inc.Line)
			// Spans left open by the dead writer are warnings, as on a failed capture.
			open := issueWith(&h, trace.CodeOpenSpan)
			require.NotNil(t, open)
			assert.Equal(t, trace.SeverityWarning, open.Severity)
		})
	}
}

func TestCutLineAfterTerminalIsAnError(t *testing.T) {
	data := append(testutil.Corpus(t, "valid-infer.jsonl"), `{"kind":"op"`...)
	h := analyzeBytes(t, data, Options{}).Health
	assert.False(t, h.StructurallyValid)
	i := issueWith(&h, trace.CodeInvalidJSON)
	require.NotNil(t, i)
	assert.Equal(t, 19, i.Line)
}

func TestCutInsideMultiByteCharacter(t *testing.T) {
	h := analyzeBytes(t, testutil.Corpus(t, "partial-cut-utf8.jsonl"), Options{}).Health
	assert.True(t, h.Incomplete)
	assert.Equal(t, 11, h.CutLine)
	assert.True(t, h.OK(true), "%v", h.Issues)
}

func TestIssueLinesCountPhysicalLines(t *testing.T) {
	data := testutil.Corpus(t, "bad-unknown_span.jsonl")
	// Blank and whitespace-only lines are skipped but still numbered.
	data = bytes.Replace(data, []byte("\n"), []byte("\n\n \r\n"), 2)
	h := analyzeBytes(t, data, Options{}).Health
	i := issueWith(&h, trace.CodeUnknownSpan)
	require.NotNil(t, i)
	assert.Equal(t, 6+4, i.Line, "tensor record is line 6 plus four inserted lines")
	assert.Equal(t, 1, i.Count)
	assert.Contains(t, i.Message, "`s7`")
}

func TestBadInputNeverPanics(t *testing.T) {
	tests := []struct {
		name string
		data string
		code string
		line int
	}{
		{"empty file", "", trace.CodeMissingMeta, 0},
		{"only blank lines", "\n \n\t\r\n", trace.CodeMissingMeta, 0},
		{"binary junk", "\x00\x01\x02\xff\xfe\n", trace.CodeInvalidUTF8, 1},
		{"junk without newline", "\x7fELF\x02\x01", trace.CodeInvalidJSON, 1},
		{"json array", "[1,2,3]\n", trace.CodeInvalidJSON, 1},
		{"json scalar", "42\n", trace.CodeInvalidJSON, 1},
		{"object without kind", "{}\n", trace.CodeMissingKind, 1},
		{"kind not a string", `{"kind":7}` + "\n", trace.CodeWrongType, 1},
		{"wrong schema", strings.Replace(string(testutil.Corpus(t, "valid-infer.jsonl")), "candle-graph/trace/10", "chrome-trace", 1), trace.CodeUnsupportedSchema, 1},
		{"BOM", "\ufeff" + string(testutil.Corpus(t, "valid-infer.jsonl")), trace.CodeInvalidJSON, 1},
		{"NUL in line", "{\"kind\":\"meta\"\x00}\n", trace.CodeInvalidJSON, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := analyzeBytes(t, []byte(tc.data), Options{Report: true}).Health
			assert.False(t, h.OK(true))
			i := issueWith(&h, tc.code)
			require.NotNil(t, i, "%v", h.Issues)
			assert.Equal(t, tc.line, i.Line)
			assert.True(t, i.Parse)
		})
	}
}

func TestLineCap(t *testing.T) {
	data := testutil.Corpus(t, "valid-infer.jsonl")
	h := analyzeBytes(t, data, Options{MaxLineBytes: 256}).Health
	i := issueWith(&h, trace.CodeLineTooLong)
	require.NotNil(t, i, "the meta line is longer than 256 bytes")
	assert.Equal(t, 1, i.Line)

	big := bytes.Replace(data, []byte(`"producer":"go"`), []byte(`"producer":"`+strings.Repeat("x", 3<<20)+`"`), 1)
	h = analyzeBytes(t, big, Options{}).Health
	assert.True(t, h.OK(false), "a line of several MB under the default cap is fine: %v", h.Issues)
}

func TestMemoryOutOfOrderIsReplayedSorted(t *testing.T) {
	sorted := testutil.Corpus(t, "valid-infer.jsonl")
	shuffled := testutil.Corpus(t, "valid-memory-out-of-order.jsonl")
	want := analyzeBytes(t, sorted, Options{Report: true})
	for name, r := range map[string]io.Reader{
		"seekable (second pass)":  bytes.NewReader(shuffled),
		"not seekable (buffered)": onlyReader{bytes.NewReader(shuffled)},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Analyze(r, Options{Report: true})
			require.NoError(t, err)
			assert.Empty(t, got.Health.Issues, "in file order the free precedes its alloc; sorted it does not")
			assert.Equal(t, want.Report.Memory, got.Report.Memory)
		})
	}
}

func TestProgressIsReported(t *testing.T) {
	data := genTrace(health.ProgressEvery + 1<<20)
	var calls []int64
	res := analyzeBytes(t, data, Options{Progress: func(n int64) { calls = append(calls, n) }})
	require.True(t, res.Health.OK(false))
	require.Len(t, calls, 1)
	assert.GreaterOrEqual(t, calls[0], int64(health.ProgressEvery))
}

func TestVerdict(t *testing.T) {
	tests := []struct {
		file                 string
		strict, allowPartial bool
		outcome              string
		incomplete, parsed   bool
	}{
		{"valid-infer.jsonl", true, true, "complete", false, true},
		{"warn-retained_allocations.jsonl", true, true, "complete", false, true},
		{"failed-capture_failed.jsonl", false, true, "failed", false, true},
		{"partial-no-terminal.jsonl", false, true, "", true, false},
		{"bad-unknown_parent-partial.jsonl", false, false, "", true, false},
		{"bad-unknown_span.jsonl", false, false, "complete", false, true},
		{"bad-duplicate_key.jsonl", false, false, "", false, false},
		{"bad-terminal_precedes_evidence.jsonl", false, false, "complete", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			h := analyzeBytes(t, testutil.Corpus(t, tc.file), Options{}).Health
			assert.Equal(t, tc.strict, h.OK(false))
			assert.Equal(t, tc.allowPartial, h.OK(true))
			assert.Equal(t, tc.outcome, h.Outcome)
			assert.Equal(t, tc.incomplete, h.Incomplete)
			assert.Equal(t, tc.parsed, h.Parsed)
		})
	}
}

func TestCoverageCounts(t *testing.T) {
	h := analyzeBytes(t, testutil.Corpus(t, "valid-train.jsonl"), Options{}).Health
	assert.Equal(t, health.Coverage{
		Spans: 5, ClosedSpans: 5, RootSpans: 1, MeasuredSpans: 1, Operations: 4, Tensors: 1, TensorStats: 2,
		MemoryEvents: 7, DeviceMemorySamples: 2, DeviceIntervals: 4, Gradients: 3, CallEdges: 4, DataEdges: 2,
		ForwardSpans: 1, BackwardSpans: 1, OptimizerSpans: 1,
	}, h.Coverage)
	assert.Equal(t, 41, h.Lines)
}

// A SIGKILL can cut the trace's last write at a page boundary (the kernel
// stops copying a write between pages for a fatal signal), so a killed
// trace may end in a cut line. Our reader drops it and reads the trace as
// incomplete; the real candle-graph refuses the file, naming the cut line
// as unparsable (it refuses a trace with no terminal in any case).
func TestAKilledTraceCutAtAPageBoundary(t *testing.T) {
	data := testutil.Corpus(t, "valid-train.jsonl")
	require.Greater(t, len(data), 4096)
	cut := data[:4096]
	require.NotEqual(t, byte('\n'), cut[len(cut)-1], "the cut falls inside a line")
	cutLine := bytes.Count(cut, []byte("\n")) + 1

	h := analyzeBytes(t, cut, Options{}).Health
	assert.True(t, h.Incomplete)
	assert.Equal(t, cutLine, h.CutLine)
	assert.True(t, h.OK(true), "read tolerantly, the whole lines before the cut are a valid partial trace: %v", h.Issues)

	path := filepath.Join(t.TempDir(), "killed.jsonl")
	require.NoError(t, os.WriteFile(path, cut, 0o644))
	err, _, out := testutil.Summarize(t, path)
	require.Error(t, err, "candle-graph accepts no cut trace")
	assert.Contains(t, out, fmt.Sprintf("parse trace JSONL line %d", cutLine))
	assert.Contains(t, out, "EOF while parsing")
}
