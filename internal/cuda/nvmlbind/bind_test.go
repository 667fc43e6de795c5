package nvmlbind_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/cuda"
	"github.com/candle-trace/candle-trace/internal/cuda/nvmlbind"
	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/session"
)

// The stub list must cover every NVML function the go-nvml in go.mod calls;
// after a go-nvml upgrade, `go generate ./internal/cuda/nvmlbind`.
func TestSymbolsMatchGoNVML(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	files, err := filepath.Glob(filepath.Join(strings.TrimSpace(string(out)), "pkg", "nvml", "*.go"))
	require.NoError(t, err)
	re := regexp.MustCompile(`C\.(nvml[A-Za-z0-9_]+)\(`)
	seen := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range re.FindAllSubmatch(b, -1) {
			seen[string(m[1])] = true
		}
	}
	var want []string
	for n := range seen {
		want = append(want, n)
	}
	sort.Strings(want)
	assert.Equal(t, want, nvmlbind.Symbols[:], "stale stubs: run go generate ./internal/cuda/nvmlbind")
	assert.Len(t, nvmlbind.Symbols, 428)
}

func TestBindMissingLibrary(t *testing.T) {
	n, err := nvmlbind.Bind("/nonexistent/libnvidia-ml.so.1")
	require.Error(t, err)
	assert.Equal(t, 0, n)
	assert.Contains(t, err.Error(), "/nonexistent/libnvidia-ml.so.1 could not be loaded: ")
	assert.Contains(t, err.Error(), "No such file or directory")

	_, err = cuda.OpenNVML("/nonexistent/libnvidia-ml.so.1")
	assert.Equal(t, session.Unavailable, session.CodeOf(err))
	assert.Contains(t, err.Error(), "NVML is unavailable: /nonexistent/libnvidia-ml.so.1 could not be loaded")
}

var (
	fakeOnce sync.Once
	fakePath string
	fakeErr  error
)

// fakeNVML compiles testdata/fakenvml/fake_nvml.c into a libnvidia-ml.so.1.
func fakeNVML(t *testing.T) string { return fakeNVMLB(t) }

func fakeNVMLB(t testing.TB) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the stubs are built for Linux")
	}
	fakeOnce.Do(func() {
		cc := os.Getenv("CC")
		if cc == "" {
			cc = "cc"
		}
		dir, err := os.MkdirTemp("", "fakenvml")
		if err != nil {
			fakeErr = err
			return
		}
		fakePath = filepath.Join(dir, "libnvidia-ml.so.1")
		out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-Wall", "-o", fakePath, "../testdata/fakenvml/fake_nvml.c").CombinedOutput()
		if err != nil {
			fakeErr = &buildError{err, string(out)}
		}
	})
	if fakeErr != nil {
		t.Fatalf("building the fake NVML: %v", fakeErr)
	}
	return fakePath
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.out }

type sink struct {
	mu  sync.Mutex
	got []events.DeviceMemory
}

func (s *sink) RecordDeviceMemory(d *events.DeviceMemory) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, *d)
	return d.Validate()
}

type clock struct{}

func (clock) Now() uint64 { return 1234 }

const (
	gib = uint64(1) << 30
	mib = uint64(1) << 20
)

// The real go-nvml (its cgo calls, versioned symbol choice, struct
// decoding) through the stubs, against a fake libnvidia-ml.so.1.
func TestGoNVMLThroughTheStubs(t *testing.T) {
	path := fakeNVML(t)
	tests := []struct {
		name string
		env  map[string]string
		want []events.DeviceMemory
		err  string
	}{
		{
			name: "v2 memory query",
			want: []events.DeviceMemory{
				{TimestampNs: 1234, Device: "cuda:0", Used: gib, Reserved: 512 * mib, Free: 80*gib - 512*mib - gib, Capacity: 80 * gib, HasUsed: true, HasFree: true, HasReserved: true, HasCapacity: true,
					Extra: map[string]float64{cuda.ExtraGPUUtilization: 40, cuda.ExtraMemoryUtilization: 10, cuda.ExtraPower: 150, cuda.ExtraProcessCount: 1, cuda.ExtraProcessUsed: float64(256 * mib)}},
				{TimestampNs: 1234, Device: "cuda:1", Used: 2 * gib, Reserved: 512 * mib, Free: 80*gib - 512*mib - 2*gib, Capacity: 80 * gib, HasUsed: true, HasFree: true, HasReserved: true, HasCapacity: true,
					Extra: map[string]float64{cuda.ExtraGPUUtilization: 41, cuda.ExtraMemoryUtilization: 11, cuda.ExtraPower: 150.001, cuda.ExtraProcessCount: 1, cuda.ExtraProcessUsed: float64(256 * mib)}},
			},
		},
		{
			name: "v1 memory query only",
			env:  map[string]string{"FAKE_NVML_NO_V2": "1", "FAKE_NVML_DEVICES": "1"},
			want: []events.DeviceMemory{
				{TimestampNs: 1234, Device: "cuda:0", Used: gib + 512*mib, Free: 80*gib - 512*mib - gib, Capacity: 80 * gib, HasUsed: true, HasFree: true, HasCapacity: true,
					Extra: map[string]float64{cuda.ExtraGPUUtilization: 40, cuda.ExtraMemoryUtilization: 10, cuda.ExtraPower: 150, cuda.ExtraProcessCount: 1, cuda.ExtraProcessUsed: float64(256 * mib)}},
			},
		},
		{name: "driver not loaded", env: map[string]string{"FAKE_NVML_INIT_ERROR": "9"}, err: "NVML is unavailable: nvmlInit failed: Driver Not Loaded (nvmlReturn_t 9)"},
		{name: "no GPU", env: map[string]string{"FAKE_NVML_DEVICES": "0"}, err: "NVML is unavailable: the driver reports no GPU"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			lib, err := cuda.OpenNVML(path)
			require.NoError(t, err)
			assert.True(t, nvmlbind.Bound("nvmlInit_v2"))
			assert.True(t, nvmlbind.Bound("nvmlDeviceGetMemoryInfo_v2"))
			assert.False(t, nvmlbind.Bound("nvmlDeviceGetFanSpeed"), "the fake has no fan")
			out := &sink{}
			s, err := cuda.NewSampler(lib, out, clock{}, cuda.WithVisibleDevices("", false))
			if tt.err != "" {
				require.Error(t, err)
				assert.Equal(t, session.Unavailable, session.CodeOf(err))
				assert.Contains(t, err.Error(), tt.err)
				return
			}
			require.NoError(t, err)
			require.NoError(t, s.SampleOnce())
			require.NoError(t, s.Stop())
			require.Len(t, out.got, 2*len(tt.want))
			for i := range out.got {
				assert.Greater(t, out.got[i].Extra[cuda.ExtraQueryNs], 0.0)
				delete(out.got[i].Extra, cuda.ExtraQueryNs)
			}
			assert.Equal(t, tt.want, out.got[:len(tt.want)])
		})
	}
}

// A function the loaded library lacks answers NVML_ERROR_FUNCTION_NOT_FOUND
// through its stub instead of jumping to address 0.
func TestUnboundStubReturnsFunctionNotFound(t *testing.T) {
	path := fakeNVML(t)
	_, err := nvmlbind.Bind(path)
	require.NoError(t, err)
	lib := nvml.New(nvml.WithLibraryPath(path))
	require.Equal(t, nvml.SUCCESS, lib.Init())
	defer lib.Shutdown()
	dev, r := lib.DeviceGetHandleByIndex(0)
	require.Equal(t, nvml.SUCCESS, r)
	_, r = dev.GetFanSpeed()
	assert.Equal(t, nvml.ERROR_FUNCTION_NOT_FOUND, r)
	_, r = dev.GetTemperatureThreshold(nvml.TEMPERATURE_THRESHOLD_SHUTDOWN)
	assert.Equal(t, nvml.ERROR_FUNCTION_NOT_FOUND, r)
}

type nopSink struct{}

func (nopSink) RecordDeviceMemory(*events.DeviceMemory) error { return nil }

// BenchmarkSampleThroughStubs is one device's sample through go-nvml's cgo
// calls and the stubs into the fake library: the library's own overhead per
// sample, without the driver's (the fake answers at once).
func BenchmarkSampleThroughStubs(b *testing.B) {
	b.Setenv("FAKE_NVML_DEVICES", "1")
	path := fakeNVMLB(b)
	lib, err := cuda.OpenNVML(path)
	require.NoError(b, err)
	s, err := cuda.NewSampler(lib, nopSink{}, clock{}, cuda.WithVisibleDevices("", false))
	require.NoError(b, err)
	defer s.Stop()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := s.SampleOnce(); err != nil {
			b.Fatal(err)
		}
	}
}
