package cli

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/job/jobtest"
	"github.com/candle-trace/candle-trace/internal/testutil"
)

// mergeJob is the job BenchmarkMerge8x100MB merges: 8 ranks of 100 MB,
// rank 5 the straggler. Bump mergeJobVersion when jobtest.Large changes:
// the traces are written once, under build/, and kept.
var mergeJob = jobtest.Large{Ranks: 8, Ops: jobtest.OpsFor(100_000_000), Slow: 5, JobID: "bench-job"}

const mergeJobVersion = "1"

// mergeJobTraces writes the job's traces into build/bench/merge-job once
// (a stamp names what wrote them) and returns them.
func mergeJobTraces(b *testing.B) []string {
	dir := filepath.Join(testutil.ModuleRoot(b), "build", "bench", "merge-job")
	stamp := filepath.Join(dir, "stamp")
	want := fmt.Sprintf("jobtest.Large %+v v%s\n", mergeJob, mergeJobVersion)
	var paths []string
	for r := range mergeJob.Ranks {
		paths = append(paths, filepath.Join(dir, fmt.Sprintf("trace-%d.jsonl", r)))
	}
	if got, err := os.ReadFile(stamp); err == nil && string(got) == want {
		return paths
	}
	require.NoError(b, os.MkdirAll(dir, 0o755))
	start := time.Now()
	written, err := mergeJob.Write(dir)
	require.NoError(b, err)
	require.Equal(b, paths, written)
	require.NoError(b, os.WriteFile(stamp, []byte(want), 0o644))
	b.Logf("wrote %s in %s", dir, time.Since(start).Round(time.Millisecond))
	return paths
}

// BenchmarkMerge8x100MB runs `candle-trace merge` (built from this tree)
// on 8 rank traces of 100 MB with collectives, writing the Chrome JSON to a
// pipe that discards it (the figure is the merge, not a disk), and reports
// the input's MB/s and the process's peak RSS. The target: >= 100 MB/s in
// <= 256 MiB. Merge reads every trace twice: once for the job clock
// (package job: the meta and the collectives, the other lines skimmed),
// once to export it.
//
//	go test -run '^$' -bench BenchmarkMerge8x100MB -benchtime 1x ./internal/report/cli/
func BenchmarkMerge8x100MB(b *testing.B) {
	paths := mergeJobTraces(b)
	var size int64
	for _, p := range paths {
		st, err := os.Stat(p)
		require.NoError(b, err)
		size += st.Size()
	}
	bin := filepath.Join(b.TempDir(), "candle-trace")
	build := exec.Command("go", "build", "-o", bin, "./cmd/candle-trace")
	build.Dir = testutil.ModuleRoot(b)
	out, err := build.CombinedOutput()
	require.NoError(b, err, "%s", out)
	b.SetBytes(size)
	b.ResetTimer()
	var peak int64
	var wall time.Duration
	for b.Loop() {
		cmd := exec.Command(bin, append([]string{"merge"}, paths...)...)
		cmd.Stdout = io.Discard
		stderr, err := os.CreateTemp(b.TempDir(), "stderr")
		require.NoError(b, err)
		cmd.Stderr = stderr
		start := time.Now()
		require.NoError(b, cmd.Run())
		wall += time.Since(start)
		peak = max(peak, cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss) // KiB on Linux
		msg, _ := os.ReadFile(stderr.Name())
		b.Logf("%s", msg)
	}
	b.ReportMetric(float64(peak)/1024, "peak-RSS-MiB")
	b.ReportMetric(float64(size)/1e6/(wall.Seconds()/float64(b.N)), "input-MB/s")
}
