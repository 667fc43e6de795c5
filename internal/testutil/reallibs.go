package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// RealLibs are NVIDIA's shipped libraries, fetched by `make real-libs`
// (tests/reallibs/fetch.py). Both load without a GPU; the tests that use
// them check what no fake can: the real symbol tables, the real clock,
// the real errors of a machine without a driver.
type RealLibs struct {
	CUPTISite string // a site-packages folder holding nvidia/cuda_cupti/lib/libcupti.so.12
	CUPTI     string // the libcupti.so.12 in it
	CUPTI13   string // CUDA 13's libcupti.so.13, in another site-packages folder
	NVML      string // libnvidia-ml.so.1 from Debian's libnvidia-ml1
}

// RealLibraries finds them under $CANDLE_TRACE_REAL_LIBS, else
// build/reallibs. Without them the test is skipped, except in CI (CI set),
// where it fails: .ci/run fetches them.
func RealLibraries(t testing.TB) RealLibs {
	t.Helper()
	dir := os.Getenv("CANDLE_TRACE_REAL_LIBS")
	if dir == "" {
		dir = filepath.Join(ModuleRoot(t), "build", "reallibs")
	}
	r := RealLibs{
		CUPTISite: filepath.Join(dir, "site"),
		CUPTI:     filepath.Join(dir, "site", "nvidia", "cuda_cupti", "lib", "libcupti.so.12"),
		CUPTI13:   filepath.Join(dir, "site13", "nvidia", "cu13", "lib", "libcupti.so.13"),
		NVML:      filepath.Join(dir, "nvml", "libnvidia-ml.so.1"),
	}
	for _, p := range []string{r.CUPTI, r.CUPTI13, r.NVML} {
		if _, err := os.Stat(p); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is missing; .ci/run fetches it with make real-libs", p)
			}
			t.Skipf("%s is missing; run `make real-libs`", p)
		}
	}
	return r
}

// NVIDIADriverLoaded reports whether this machine runs the NVIDIA kernel
// driver: the tests that expect the errors of a machine without one skip
// those checks where it does.
func NVIDIADriverLoaded() bool {
	_, err := os.Stat("/proc/driver/nvidia/version")
	return err == nil
}

const childEnv = "CANDLE_TRACE_TEST_CHILD"

// IsChild reports whether this process is the child InChild started for t:
// what only the parent prepares (a library to put on LD_LIBRARY_PATH) is
// skipped there.
func IsChild(t *testing.T) bool { return os.Getenv(childEnv) == t.Name() }

// InChild runs t again, alone, in a child process of the test binary, with
// this process's environment, and reports false after checking that it
// passed; in that child it reports true. For tests that load a library for
// the rest of the process (CUPTI, NVML), next to tests that load a fake of
// it, and for what the loader reads once per process (LD_LIBRARY_PATH).
func InChild(t *testing.T) bool {
	t.Helper()
	if IsChild(t) {
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"="+t.Name())
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child test failed:\n%s", out)
	require.Contains(t, string(out), "--- PASS: "+t.Name(), "child test did not pass:\n%s", out)
	t.Logf("child:\n%s", out)
	return false
}
