package session

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// contractRun is a buffered run JSON whose gradient contract has n parameters
// (the size of what ct_open parses for a flight recorder).
func contractRun(n int) []byte {
	var exp, fams []string
	for i := 0; i < n; i++ {
		exp = append(exp, fmt.Sprintf(`{"root":"m","key":"layer%d.weight","family":"layer%d"}`, i, i))
		fams = append(fams, fmt.Sprintf(`{"family":"layer%d","expectation":"data_conditional","min_present":1}`, i))
	}
	return []byte(`{"entrypoint":"m::train","phase":"train","capture_step":5,"device":"cpu","buffer":{"max_bytes":67108864},` +
		`"capture_contract":{"measurement_scope":"profiled_work","operations":"complete","logical_memory":"partial","physical_memory":"none","device_timing":"none","gradients":"complete",` +
		`"gradient_contract":{"expected":[` + strings.Join(exp, ",") + `],"families":[` + strings.Join(fams, ",") + `]}}}`)
}

// A flight recorder opens a buffered session for every update and drops it at
// the end: what that costs, with a contract of n parameters.
func BenchmarkBufferedOpenDiscard(b *testing.B) {
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("params=%d", n), func(b *testing.B) {
			run := contractRun(n)
			path := filepath.Join(b.TempDir(), "update.jsonl")
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				s, err := Open(path, run)
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Discard(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// The same cycle through Reopen (ct_reopen), which parses the run JSON once.
func BenchmarkBufferedReopen(b *testing.B) {
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("params=%d", n), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "update.jsonl")
			s, err := Open(path, contractRun(n))
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if s, err = s.Reopen(path, uint64(6+i)); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			_ = s.Discard()
		})
	}
}

// The same through Reopen as a flight recorder calls it: once per update,
// after the update's own work has evicted the caches (a walk over 64 MiB).
// Back to back, Reopen's caches stay warm and it looks several times cheaper
// than it is in a training loop. reopen-ns/op is Reopen's own time; ns/op
// includes the walk, timed too so that the iteration count follows the
// whole loop (with the walk outside the timer, a fast Reopen made the
// benchmark run ~20,000 walks of 10 ms each).
func BenchmarkBufferedReopenAfterAnUpdate(b *testing.B) {
	evict := make([]byte, 64<<20)
	path := filepath.Join(b.TempDir(), "update.jsonl")
	s, err := Open(path, contractRun(8))
	if err != nil {
		b.Fatal(err)
	}
	var reopen time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := 0; j < len(evict); j += 64 {
			evict[j]++
		}
		t0 := time.Now()
		if s, err = s.Reopen(path, uint64(6+i)); err != nil {
			b.Fatal(err)
		}
		reopen += time.Since(t0)
	}
	b.StopTimer()
	b.ReportMetric(float64(reopen.Nanoseconds())/float64(b.N), "reopen-ns/op")
	_ = s.Discard()
}
