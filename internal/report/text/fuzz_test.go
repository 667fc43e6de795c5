package text

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/candle-trace/candle-trace/internal/report/analysis"

	"github.com/candle-trace/candle-trace/internal/testutil"
)

// FuzzAnalyze feeds arbitrary bytes to the reader: it must never panic, and
// its verdicts must hang together.
func FuzzAnalyze(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join(testutil.CorpusDir(f), "*.jsonl"))
	for _, file := range files {
		if data, err := os.ReadFile(file); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte{})
	f.Add([]byte("\xff\xfe\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		res, err := analysis.Analyze(bytes.NewReader(data), analysis.Options{Report: true, MaxLineBytes: 1 << 16})
		if err != nil {
			t.Fatalf("I/O error from a bytes.Reader: %v", err)
		}
		h := res.Health
		if h.OK(false) && (!h.StructurallyValid || !h.CaptureComplete || h.Incomplete) {
			t.Fatalf("OK without validity and completeness: %+v", h)
		}
		if h.OK(false) != (h.StructurallyValid && h.CaptureComplete) {
			t.Fatalf("verdict disagrees with its parts: %+v", h)
		}
		for _, i := range h.Issues {
			if i.Line < 0 || i.Line > h.Lines {
				t.Fatalf("issue line %d outside the %d lines read: %v", i.Line, h.Lines, i)
			}
			if i.Code == "" || i.Message == "" {
				t.Fatalf("issue without code or message: %+v", i)
			}
		}
		if h.Parsed && h.Incomplete {
			t.Fatalf("an incomplete trace cannot be parsed by candle-graph")
		}
		var out bytes.Buffer
		WriteReport(&out, "fuzz", res)
		WriteHealth(&out, "fuzz", &h, true)
	})
}
