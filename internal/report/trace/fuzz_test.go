package trace

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/candle-trace/candle-trace/internal/testutil"
)

// FuzzStream: the reader alone never panics, ends on any input, and a
// record it returns is one of the format's kinds on a line it counted.
func FuzzStream(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join(testutil.CorpusDir(f), "*.jsonl"))
	for _, file := range files {
		if data, err := os.ReadFile(file); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		st := NewStream(bytes.NewReader(data), 1<<16)
		last := 0
		for {
			k, ok := st.Next()
			if !ok {
				break
			}
			if int(k) >= int(KindTerminal)+1 || st.Line <= last || st.Line > st.Lines() {
				t.Fatalf("kind %d at line %d (previous %d, read %d)", k, st.Line, last, st.Lines())
			}
			last = st.Line
		}
		if st.Stop != nil && st.CutLine != 0 {
			t.Fatalf("stopped by %v and cut at line %d", st.Stop, st.CutLine)
		}
	})
}
