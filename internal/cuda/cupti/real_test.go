package cupti

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/session"
	"github.com/candle-trace/candle-trace/internal/testutil"
)

// NVIDIA's own libcupti (the nvidia-cuda-cupti-cu12 wheel, fetched by `make
// real-libs`) needs no GPU to load, to tell time or to refuse a subscriber.
// This runs it where the fake stands in elsewhere: its symbol table, its
// place in a site-packages folder, the error a machine without a driver
// gives, and the clock alignment against its real cuptiGetTimestamp. In a
// child process: the first libcupti loaded stays for the process's life.
func TestRealCUPTIWithoutAGPU(t *testing.T) {
	libs := testutil.RealLibraries(t)
	if !testutil.InChild(t) {
		return
	}
	// Found where pip puts it, through PYTHONPATH alone.
	o := Options{Sonames: []string{}, LookupEnv: func(k string) (string, bool) {
		if k == "PYTHONPATH" {
			return "/nonexistent:" + libs.CUPTISite, true
		}
		return "", false
	}}
	require.Equal(t, []string{libs.CUPTI}, Candidates(o))
	path, err := load(o)
	require.NoError(t, err, "every function the collector binds must exist in the shipped libcupti")
	require.Equal(t, libs.CUPTI, path)

	s, _ := openSession(t)
	t.Run("start", func(t *testing.T) {
		c, err := Start(s, o)
		if testutil.NVIDIADriverLoaded() {
			require.NoError(t, err)
			require.NoError(t, c.Stop())
			return
		}
		assert.Nil(t, c)
		requireCode(t, err, session.Unavailable,
			"CUPTI could not start: cuptiSubscribe returned CUPTI_ERROR_NOT_INITIALIZED (15)",
			"CUDA is not usable here: ", "("+libs.CUPTI+" was loaded)")
		msg := err.Error()
		assert.True(t, strings.Contains(msg, "the NVIDIA driver's libcuda.so.1 could not be loaded: ") || strings.Contains(msg, "cuInit returned CUDA_ERROR_"), msg)
	})

	t.Run("clock", func(t *testing.T) {
		// Anchors as the collector takes them, 20 ms apart.
		c := &Collector{sink: s}
		var m clockMap
		var brackets []uint64
		for i := 0; i < 11; i++ {
			a, err := bestAnchor(DefaultClockTries, c.readClock)
			require.NoError(t, err)
			m.add(a)
			brackets = append(brackets, a.bracket)
			if i < 10 {
				time.Sleep(20 * time.Millisecond)
			}
		}
		require.Len(t, m.anchors, 11, "CUPTI's clock advances")
		first, last := m.anchors[0], m.anchors[len(m.anchors)-1]
		rate := float64(last.host-first.host) / float64(last.cupti-first.cupti)
		assert.InDelta(t, 1.0, rate, 500e-6, "CUPTI's clock and the session's run at one rate")

		// Each interior anchor, left out, is a reading the map never saw:
		// the map must put it where its own bracket says it happened.
		var worst int64
		for i := 1; i < len(m.anchors)-1; i++ {
			var rest clockMap
			for j, a := range m.anchors {
				if j != i {
					rest.add(a)
				}
			}
			a := m.anchors[i]
			got, bound := rest.toSession(a.cupti)
			seg := m.anchors[i+1].host - m.anchors[i-1].host
			slack := int64(bound) + int64(a.bound()) + int64(float64(seg)*500e-6)
			err := got - int64(a.host)
			assert.LessOrEqual(t, abs64(err), slack, "anchor %d maps %d ns off (bound %d + own %d)", i, err, bound, a.bound())
			worst = max(worst, abs64(err))
		}
		sort.Slice(brackets, func(i, j int) bool { return brackets[i] < brackets[j] })
		t.Logf("real cuptiGetTimestamp: best-of-%d brackets %d..%d ns (median %d), rate %.9f, worst left-out error %d ns",
			DefaultClockTries, brackets[0], brackets[len(brackets)-1], brackets[len(brackets)/2], rate, worst)
		assert.Less(t, brackets[len(brackets)/2], uint64(20_000), "a best-of-32 bracket is a few hundred ns at most, unless the machine is badly oversubscribed")
	})
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// fakeLibcuda answers cuInit with CUDA_ERROR_NO_DEVICE, as the driver's
// library does on a machine whose GPU is gone or hidden.
const fakeLibcuda = `
int cuInit(unsigned flags) { (void)flags; return 100; }
int cuGetErrorName(int e, const char **s) { *s = e == 100 ? "CUDA_ERROR_NO_DEVICE" : 0; return *s ? 0 : 1; }
`

// What a CUPTI_ERROR_NOT_INITIALIZED is blamed on: the missing driver
// library, or the driver's own answer to cuInit.
func TestCUDAProblem(t *testing.T) {
	if testutil.NVIDIADriverLoaded() {
		t.Skip("this machine runs the NVIDIA driver: CUDA may well start")
	}
	tests := []struct {
		name    string
		libcuda string // fake libcuda.so.1 source; "" for none
		want    string
	}{
		{name: "no libcuda", want: "^the NVIDIA driver's libcuda\\.so\\.1 could not be loaded: libcuda\\.so\\.1: cannot open shared object file"},
		{name: "cuInit fails", libcuda: fakeLibcuda, want: `^cuInit returned CUDA_ERROR_NO_DEVICE \(100\)$`},
		{name: "not a libcuda", libcuda: "int cuda_nothing;", want: `^libcuda\.so\.1 has no cuInit$`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.libcuda != "" {
				src := filepath.Join(dir, "fake.c")
				require.NoError(t, os.WriteFile(src, []byte(tt.libcuda), 0o644))
				out, err := exec.Command("cc", "-shared", "-fPIC", "-o", filepath.Join(dir, "libcuda.so.1"), src).CombinedOutput()
				require.NoError(t, err, "%s", out)
			}
			// The loader reads LD_LIBRARY_PATH once per process: probe in a child.
			cmd := exec.Command(os.Args[0], "-test.run=^TestCUDAProblemChild$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+dir, "CT_CUDA_PROBE_CHILD=1")
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			m := regexp.MustCompile(`(?m)^\s*real_test\.go:\d+: problem: (.*)$`).FindSubmatch(out)
			require.NotNil(t, m, "%s", out)
			assert.Regexp(t, tt.want, string(m[1]))
		})
	}
}

func TestCUDAProblemChild(t *testing.T) {
	if os.Getenv("CT_CUDA_PROBE_CHILD") == "" {
		t.Skip("run by TestCUDAProblem")
	}
	t.Logf("problem: %s", cudaProblem())
}
