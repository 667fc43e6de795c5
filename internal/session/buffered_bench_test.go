package session

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// A flight recorder opens a buffered session for every update and drops it at
// the end: what that costs, with a contract of n parameters.
func BenchmarkBufferedOpenDiscard(b *testing.B) {
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("params=%d", n), func(b *testing.B) {
			var exp []string
			for i := 0; i < n; i++ {
				exp = append(exp, fmt.Sprintf(`{"root":"m","key":"layer%d.weight","family":"layer%d"}`, i, i))
			}
			var fams []string
			for i := 0; i < n; i++ {
				fams = append(fams, fmt.Sprintf(`{"family":"layer%d","expectation":"data_conditional","min_present":1}`, i))
			}
			run := []byte(`{"entrypoint":"m::train","phase":"train","capture_step":5,"device":"cpu","buffer":{"max_bytes":67108864},` +
				`"capture_contract":{"measurement_scope":"profiled_work","operations":"complete","logical_memory":"partial","physical_memory":"none","device_timing":"none","gradients":"complete",` +
				`"gradient_contract":{"expected":[` + strings.Join(exp, ",") + `],"families":[` + strings.Join(fams, ",") + `]}}}`)
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
