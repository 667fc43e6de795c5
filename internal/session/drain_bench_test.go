package session

import (
	"path/filepath"
	"runtime"
	"testing"
)

// BenchmarkSpanPairsDrained is a burst of span pairs from C through the
// ring, the drainer and the file, ns per pair including the finish that
// waits for the drainer: run with -cpuprofile to see the drainer's share
// (make bench-core; perf is not on every machine).
func BenchmarkSpanPairsDrained(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s, err := Open(filepath.Join(b.TempDir(), "t.jsonl"), []byte(`{"entrypoint":"bench","phase":"infer","capture_step":1,"device":"cpu","measured_root":true}`))
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(b.N-done, 100000)
		if err := spanPairsC(s.Handle(), n); err != nil {
			b.Fatal(err)
		}
		done += n
	}
	if err := s.Finish(); err != nil {
		b.Fatal(err)
	}
}
