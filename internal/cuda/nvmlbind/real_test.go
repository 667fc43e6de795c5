package nvmlbind_test

import (
	"debug/elf"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/cuda"
	"github.com/candle-trace/candle-trace/internal/cuda/nvmlbind"
	"github.com/candle-trace/candle-trace/internal/session"
	"github.com/candle-trace/candle-trace/internal/testutil"
)

// samplerSymbols are the C functions the sampler reaches through go-nvml
// (the versioned names go-nvml picks when the library has them).
var samplerSymbols = []string{
	"nvmlInit_v2", "nvmlShutdown", "nvmlErrorString",
	"nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByUUID",
	"nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2",
	"nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage",
	"nvmlDeviceGetComputeRunningProcesses_v3",
}

// The stubs bound against NVIDIA's own libnvidia-ml.so.1 (Debian's
// libnvidia-ml1, fetched by `make real-libs`), which loads without a GPU:
// every go-nvml function the library exports is bound and no other, the
// sampler's are all there, and a machine without the driver gets NVML's
// real "driver not loaded" through go-nvml and the stubs. In a child process:
// a bound library stays for the process's life.
func TestRealNVMLWithoutAGPU(t *testing.T) {
	libs := testutil.RealLibraries(t)
	if !testutil.InChild(t) {
		return
	}
	f, err := elf.Open(libs.NVML)
	require.NoError(t, err)
	syms, err := f.DynamicSymbols()
	require.NoError(t, err)
	f.Close()
	exported := map[string]bool{}
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF {
			exported[s.Name] = true
		}
	}
	want := 0
	for _, s := range nvmlbind.Symbols {
		if exported[s] {
			want++
		}
	}

	n, err := nvmlbind.Bind(libs.NVML)
	require.NoError(t, err)
	assert.Equal(t, want, n, "every exported go-nvml function is bound")
	assert.Greater(t, n, 300, "a 535 driver has most of go-nvml's functions")
	for _, s := range nvmlbind.Symbols {
		assert.Equal(t, exported[s], nvmlbind.Bound(s), s)
	}
	for _, s := range samplerSymbols {
		assert.True(t, nvmlbind.Bound(s), "the sampler needs %s", s)
	}
	t.Logf("%s: %d of go-nvml's %d functions bound", libs.NVML, n, len(nvmlbind.Symbols))

	lib, err := cuda.OpenNVML(libs.NVML)
	require.NoError(t, err)
	s, err := cuda.NewSampler(lib, &sink{}, clock{})
	if testutil.NVIDIADriverLoaded() {
		require.NoError(t, err)
		require.NoError(t, s.Stop())
		return
	}
	require.Error(t, err)
	assert.Equal(t, session.Unavailable, session.CodeOf(err))
	assert.Equal(t, "NVML is unavailable: nvmlInit failed: Driver Not Loaded (nvmlReturn_t 9): the NVIDIA kernel driver is not running (no NVIDIA GPU here, or its driver is not installed)", err.Error())
}
