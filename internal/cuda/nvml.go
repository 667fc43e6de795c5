package cuda

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/candle-trace/candle-trace/internal/cterr"
	"github.com/candle-trace/candle-trace/internal/cuda/nvmlbind"
)

// Library is the part of NVML the sampler uses: the seam tests fill with
// go-nvml's mock (pkg/nvml/mock), which implements it, as does the real
// nvml.Interface.
type Library interface {
	Init() nvml.Return
	Shutdown() nvml.Return
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(int) (nvml.Device, nvml.Return)
	DeviceGetHandleByUUID(string) (nvml.Device, nvml.Return)
}

// Device is the part of an NVML device handle the sampler queries.
type Device interface {
	GetMemoryInfo() (nvml.Memory, nvml.Return)
	GetMemoryInfo_v2() (nvml.Memory_v2, nvml.Return)
	GetUtilizationRates() (nvml.Utilization, nvml.Return)
	GetPowerUsage() (uint32, nvml.Return)
	GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return)
}

// NVMLLibraryEnv overrides which NVML library is loaded (default
// nvmlbind.DefaultLibrary, found by the dynamic loader).
const NVMLLibraryEnv = "CANDLE_TRACE_NVML_LIB"

// OpenNVML loads the NVML library at path (nvmlbind.DefaultLibrary when
// empty) and returns go-nvml's interface to it, not yet initialised. A
// library that cannot be loaded is CT_ERR_UNAVAILABLE naming it.
func OpenNVML(path string) (Library, error) {
	if path == "" {
		path = nvmlbind.DefaultLibrary
	}
	if _, err := nvmlbind.Bind(path); err != nil {
		return nil, unavailable("NVML is unavailable: %v (no NVIDIA driver on this machine? %s names another library)", err, NVMLLibraryEnv)
	}
	return nvml.New(nvml.WithLibraryPath(path)), nil
}

// DefaultOpenNVML opens $CANDLE_TRACE_NVML_LIB or libnvidia-ml.so.1.
func DefaultOpenNVML() (Library, error) { return OpenNVML(os.Getenv(NVMLLibraryEnv)) }

func unavailable(format string, args ...any) error {
	return &cterr.Error{Code: cterr.Unavailable, Msg: fmt.Sprintf(format, args...)}
}

func invalidArg(format string, args ...any) error {
	return &cterr.Error{Code: cterr.InvalidArgument, Msg: fmt.Sprintf(format, args...)}
}

// retName spells an nvmlReturn_t as NVML_ERROR_* plus NVML's own message.
func retName(r nvml.Return) string {
	return fmt.Sprintf("%s (nvmlReturn_t %d)", r.Error(), int32(r))
}

// visibleDevice maps a CUDA ordinal (what PyTorch calls cuda:N) to NVML.
type visibleDevice struct {
	ordinal   int
	nvmlIndex int    // -1 when named by UUID
	uuid      string // CUDA_VISIBLE_DEVICES entry "GPU-..."
}

// parseVisible reads CUDA_VISIBLE_DEVICES the way the CUDA runtime does:
// a comma-separated list of NVML indices or GPU UUIDs; the list ends at the
// first entry that is neither. Empty env ("" unset) means every device in
// NVML order. MIG instances ("MIG-...") are refused: NVML samples whole GPUs.
func parseVisible(env string, set bool, count int) ([]visibleDevice, error) {
	if !set {
		out := make([]visibleDevice, count)
		for i := range out {
			out[i] = visibleDevice{ordinal: i, nvmlIndex: i}
		}
		return out, nil
	}
	var out []visibleDevice
	seen := map[string]bool{}
	for _, e := range strings.Split(env, ",") {
		e = strings.TrimSpace(e)
		if seen[e] {
			break // CUDA stops at a repeated device too
		}
		seen[e] = true
		switch {
		case strings.HasPrefix(e, "MIG-"):
			return nil, unavailable("NVML sampler: CUDA_VISIBLE_DEVICES names a MIG instance (%s); NVML memory sampling covers whole GPUs only", e)
		case strings.HasPrefix(e, "GPU-"):
			out = append(out, visibleDevice{ordinal: len(out), nvmlIndex: -1, uuid: e})
			continue
		}
		i, err := strconv.Atoi(e)
		if err != nil || i < 0 || i >= count {
			break
		}
		out = append(out, visibleDevice{ordinal: len(out), nvmlIndex: i})
	}
	return out, nil
}

func asCTError(err error) *cterr.Error {
	if e, ok := err.(*cterr.Error); ok {
		return e
	}
	return nil
}
