package aggregate

import (
	"bytes"
	"testing"
)

// FuzzParse: the strict reader never panics, and whatever it accepts is
// consistent (Check passes) and survives an encode/parse round trip
// unchanged.
func FuzzParse(f *testing.F) {
	f.Add(encode(f, sample(f)))
	f.Add(encode(f, withRun(New().Snapshot())))
	f.Add([]byte(`{"schema":"candle-trace/aggregate/1"}`))
	f.Add([]byte(`{"kind":"meta","schema":"candle-graph/trace/10"}`))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse(data)
		if err != nil {
			if s != nil {
				t.Fatal("a summary with an error")
			}
			return
		}
		if err := s.Check(); err != nil {
			t.Fatalf("accepted but inconsistent: %v", err)
		}
		var buf bytes.Buffer
		if err := s.Encode(&buf); err != nil {
			t.Fatalf("accepted but cannot encode: %v", err)
		}
		again, err := Parse(buf.Bytes())
		if err != nil {
			t.Fatalf("re-encoded summary refused: %v\n%s", err, buf.Bytes())
		}
		for i := range s.Spans {
			if s.Spans[i].Count != again.Spans[i].Count || s.Spans[i].P99NS != again.Spans[i].P99NS {
				t.Fatalf("round trip changed span %d", i)
			}
		}
	})
}
