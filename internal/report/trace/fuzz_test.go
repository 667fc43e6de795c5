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

// FuzzSkim: skimming never panics, and on any input the full read accepts
// it hands over what the full read does. A line's skimmed kind is the one
// the decoder reads, and its skimmed op_name the op's, unless a nested
// object comes first (which SkimOpName says it does not handle).
func FuzzSkim(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join(testutil.CorpusDir(f), "*.jsonl"))
	for _, file := range files {
		if data, err := os.ReadFile(file); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(`{"kind":"op","x":{"op_name":"b"},"op_name":"a"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		for line := range bytes.SplitSeq(data, []byte("\n")) {
			var d Decoder
			k, err := d.Decode(TrimSpace(line))
			sk, ok := SkimKind(line)
			if err == nil && ok && sk != k {
				t.Fatalf("skimmed %s, decoded %s: %q", sk, k, line)
			}
			name, ok := SkimOpName(line)
			if err == nil && k == KindOp && ok && !bytes.Equal(name, d.Op.OpName) &&
				!bytes.Contains(line[1:bytes.Index(line, opNameKey)], []byte("{")) {
				t.Fatalf("skimmed op_name %q, decoded %q: %q", name, d.Op.OpName, line)
			}
		}
		full, fres, ferr := recordLog(bytes.NewReader(data), false, nil)
		skimmed, _, serr := recordLog(bytes.NewReader(data), true, nil)
		if ferr == nil && fres.Stop == nil && (serr != nil || skimmed != full) {
			t.Fatalf("full read:\n%s\nskimmed (%v):\n%s", full, serr, skimmed)
		}
	})
}
