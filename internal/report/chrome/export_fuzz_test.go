package chrome

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/candle-trace/candle-trace/internal/testutil"
)

// FuzzExportChrome: the exporter never panics, and whatever it accepts it
// writes as valid JSON.
func FuzzExportChrome(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join(testutil.CorpusDir(f), "*.jsonl"))
	for _, file := range files {
		if data, err := os.ReadFile(file); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var out bytes.Buffer
		w := NewChromeWriter(&out)
		res, err := ExportChrome(bytes.NewReader(data), w, ChromeOptions{MaxLineBytes: 1 << 16})
		if err != nil {
			return // no meta record: nothing to export
		}
		if err := w.Close(map[string]string{"k": "v"}); err != nil {
			t.Fatal(err)
		}
		if !json.Valid(out.Bytes()) {
			t.Fatalf("invalid JSON for %q:\n%s", data, out.Bytes())
		}
		if res.OpenSpans > res.Spans {
			t.Fatalf("%d open spans of %d", res.OpenSpans, res.Spans)
		}
	})
}
