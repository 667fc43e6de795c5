package analysis

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// The generated trace is valid: the benchmarks measure the full path, not
// an early exit.
func TestGeneratedTraceIsValid(t *testing.T) {
	data := genTrace(256 << 10)
	res, err := Analyze(bytes.NewReader(data), Options{Report: true})
	require.NoError(t, err)
	require.True(t, res.Health.OK(false), "%v", res.Health.Issues)
	require.Empty(t, res.Health.Issues)
	require.NotNil(t, res.Report.Memory.Peak)
}

func benchmarkAnalyze(b *testing.B, opts Options) {
	data := genTrace(32 << 20)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		res, err := Analyze(bytes.NewReader(data), opts)
		if err != nil || !res.Health.OK(false) {
			b.Fatalf("analyze: %v %v", err, res.Health.Issues)
		}
	}
}

// BenchmarkValidate reports validate throughput (MB/s) on a 32 MiB trace.
func BenchmarkValidate(b *testing.B) { benchmarkAnalyze(b, Options{}) }

// BenchmarkReport reports report throughput (MB/s) on a 32 MiB trace.
func BenchmarkReport(b *testing.B) { benchmarkAnalyze(b, Options{Report: true}) }
