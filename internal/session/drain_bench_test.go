package session

import (
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"
	"unsafe"
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

// BenchmarkDrainer is the drainer's own work per span pair, on one thread
// and without waiting: pairs made through the C fast path while mu is held
// (so no drain runs meanwhile), then drained, encoded and written as the
// drainer does. "discard" leaves the kernel out (a sink that keeps nothing),
// "file" writes the trace as ct_open's does. ns/op is per pair, the
// producing included; drain-ns/pair is the drainer's part alone, and
// drain-cpu-ns/pair its thread's CPU time (steadier on a loaded machine). For
// instruction counts: go test -c, then valgrind --tool=callgrind on
// -test.bench Drainer/discard -test.benchtime 200000x.
func BenchmarkDrainer(b *testing.B) {
	const batch = 2000 // pairs per drain: well inside a ring, so the producer never waits
	for _, sink := range []string{"discard", "file"} {
		b.Run(sink, func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var opts []Option
			if sink == "discard" {
				opts = append(opts, WithOpener(func(string) (Sink, error) { return discardSink{}, nil }))
			}
			s, err := Open(filepath.Join(b.TempDir(), "t.jsonl"), []byte(`{"entrypoint":"bench","phase":"infer","capture_step":1,"device":"cpu","measured_root":true}`), opts...)
			if err != nil {
				b.Fatal(err)
			}
			var drain time.Duration
			var drainCPU int64
			b.ResetTimer()
			for done := 0; done < b.N; {
				n := min(b.N-done, batch)
				mu.Lock()
				if err := spanPairsC(s.Handle(), n); err != nil {
					mu.Unlock()
					b.Fatal(err)
				}
				t0, c0 := time.Now(), threadCPU()
				drainerWrites = true
				drainLocked()
				s.maybeWrite()
				drainerWrites = false
				drain += time.Since(t0)
				drainCPU += threadCPU() - c0
				mu.Unlock()
				done += n
			}
			b.ReportMetric(float64(drain.Nanoseconds())/float64(b.N), "drain-ns/pair")
			b.ReportMetric(float64(drainCPU)/float64(b.N), "drain-cpu-ns/pair")
			b.StopTimer()
			if err := s.Finish(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// threadCPU is the calling thread's CPU time in ns.
func threadCPU() int64 {
	var ts syscall.Timespec
	const clockThreadCPUTime = 3 // CLOCK_THREAD_CPUTIME_ID
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Nano()
}
