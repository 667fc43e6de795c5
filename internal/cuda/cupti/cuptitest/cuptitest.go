// Package cuptitest builds and drives the fake libcupti of
// internal/cuda/testdata/fakecupti for tests on machines without CUDA. Only
// tests import it.
package cuptitest

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

typedef uint32_t (*api_fn)(int, uint32_t);
typedef void (*kernel_fn)(uint32_t, const char *, uint32_t, uint32_t, uint64_t, uint64_t);
typedef void (*memcpy_fn)(uint32_t, uint32_t, uint32_t, uint64_t, uint32_t, uint32_t, uint64_t, uint64_t);
typedef void (*memset_fn)(uint32_t, uint64_t, uint32_t, uint32_t, uint64_t, uint64_t);
typedef void (*void_fn)(void);
typedef void (*u64_fn)(uint64_t);
typedef void (*u32_fn)(uint32_t);
typedef void (*hold_fn)(int, int);
typedef void (*clock_fn)(int64_t, uint32_t, uint32_t);
typedef int (*enabled_fn)(int, uint32_t);
typedef int (*int_int_fn)(int);
typedef int (*int_fn)(void);
typedef int (*ts_fn)(uint64_t *);

static uint32_t call_api(void *f, int d, uint32_t c) { return ((api_fn)f)(d, c); }
static void call_kernel(void *f, uint32_t cid, const char *n, uint32_t dev, uint32_t s, uint64_t a, uint64_t b) { ((kernel_fn)f)(cid, n, dev, s, a, b); }
static void call_memcpy(void *f, uint32_t cid, uint32_t rt, uint32_t k, uint64_t by, uint32_t dev, uint32_t s, uint64_t a, uint64_t b) { ((memcpy_fn)f)(cid, rt, k, by, dev, s, a, b); }
static void call_memset(void *f, uint32_t cid, uint64_t by, uint32_t dev, uint32_t s, uint64_t a, uint64_t b) { ((memset_fn)f)(cid, by, dev, s, a, b); }
static void call_void(void *f) { ((void_fn)f)(); }
static void call_u64(void *f, uint64_t v) { ((u64_fn)f)(v); }
static void call_u32(void *f, uint32_t v) { ((u32_fn)f)(v); }
static void call_hold(void *f, int h, int r) { ((hold_fn)f)(h, r); }
static void call_clock(void *f, int64_t o, uint32_t s, uint32_t e) { ((clock_fn)f)(o, s, e); }
static int call_enabled(void *f, int d, uint32_t c) { return ((enabled_fn)f)(d, c); }
static int call_int_int(void *f, int k) { return ((int_int_fn)f)(k); }
static int call_int(void *f) { return ((int_fn)f)(); }
static int call_ts(void *f, uint64_t *t) { return ((ts_fn)f)(t); }
*/
import "C"

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// CUPTI callback domains and callback ids the tests use.
const (
	DomainDriver  = 1
	DomainRuntime = 2

	CbidCudaLaunchKernel = 211 // CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000
	CbidCudaMemcpyAsync  = 41  // CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020
	CbidCudaMemsetAsync  = 51  // CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020
	CbidCuLaunchKernel   = 307 // CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel
	CbidCudaGetDevice    = 17  // CUPTI_RUNTIME_TRACE_CBID_cudaGetDevice_v3020: not watched

	KindConcurrentKernel = 10
	KindRuntime          = 5
	KindDriver           = 4

	CopyHtoD = 1 // CUPTI_ACTIVITY_MEMCPY_KIND_HTOD
	CopyDtoH = 2
)

var (
	once    sync.Once
	libPath string
	libErr  error
)

// Build compiles the fake into a temporary libcupti.so.12 (once per process)
// and returns its path.
func Build(t testing.TB) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the fake libcupti is built for Linux")
	}
	once.Do(func() {
		_, self, _, _ := runtime.Caller(0)
		src := filepath.Join(filepath.Dir(self), "..", "..", "testdata", "fakecupti", "fake_cupti.c")
		cc := os.Getenv("CC")
		if cc == "" {
			cc = "cc"
		}
		dir, err := os.MkdirTemp("", "fakecupti")
		if err != nil {
			libErr = err
			return
		}
		libPath = filepath.Join(dir, "libcupti.so.12")
		out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", libPath, src, "-lpthread").CombinedOutput()
		if err != nil {
			libErr = fmt.Errorf("%v: %s", err, out)
		}
	})
	if libErr != nil {
		t.Fatalf("building the fake libcupti: %v", libErr)
	}
	return libPath
}

// Fake drives a loaded fake libcupti.
type Fake struct {
	h unsafe.Pointer
}

// Open dlopens the fake at path (the collector's dlopen of the same path
// gets the same library).
func Open(t testing.TB, path string) *Fake {
	t.Helper()
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	h := C.dlopen(cp, C.RTLD_NOW|C.RTLD_LOCAL)
	if h == nil {
		t.Fatalf("dlopen %s: %s", path, C.GoString(C.dlerror()))
	}
	return &Fake{h: h}
}

func (f *Fake) sym(name string) unsafe.Pointer {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	p := C.dlsym(f.h, cn)
	if p == nil {
		panic("fake libcupti lacks " + name)
	}
	return p
}

// API simulates one call of the API (domain, cbid) on the calling OS thread
// and returns its correlation id.
func (f *Fake) API(domain int, cbid uint32) uint32 {
	return uint32(C.call_api(f.sym("fake_cupti_api"), C.int(domain), C.uint32_t(cbid)))
}

// Kernel appends a CONCURRENT_KERNEL record.
func (f *Fake) Kernel(cid uint32, name string, dev, stream uint32, start, end uint64) {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	C.call_kernel(f.sym("fake_cupti_kernel"), C.uint32_t(cid), cn, C.uint32_t(dev), C.uint32_t(stream), C.uint64_t(start), C.uint64_t(end))
}

// Memcpy appends a MEMCPY record.
func (f *Fake) Memcpy(cid, runtimeCid, copyKind uint32, bytes uint64, dev, stream uint32, start, end uint64) {
	C.call_memcpy(f.sym("fake_cupti_memcpy"), C.uint32_t(cid), C.uint32_t(runtimeCid), C.uint32_t(copyKind), C.uint64_t(bytes),
		C.uint32_t(dev), C.uint32_t(stream), C.uint64_t(start), C.uint64_t(end))
}

// Memset appends a MEMSET record.
func (f *Fake) Memset(cid uint32, bytes uint64, dev, stream uint32, start, end uint64) {
	C.call_memset(f.sym("fake_cupti_memset"), C.uint32_t(cid), C.uint64_t(bytes), C.uint32_t(dev), C.uint32_t(stream), C.uint64_t(start), C.uint64_t(end))
}

// Complete delivers the current buffer, as CUPTI does when one fills.
func (f *Fake) Complete() { C.call_void(f.sym("fake_cupti_complete")) }

// SetDeliveryDelay makes every buffer reach the completion callback from a
// detached thread d later, the call that took it out returning at once (0:
// delivered before that call returns, the default).
func (f *Fake) SetDeliveryDelay(d time.Duration) {
	C.call_u32(f.sym("fake_cupti_set_delivery_delay"), C.uint32_t(d/time.Microsecond))
}

// Drop makes CUPTI report n more dropped records.
func (f *Fake) Drop(n uint64) { C.call_u64(f.sym("fake_cupti_drop"), C.uint64_t(n)) }

// Hold simulates another CUPTI subscriber (held) or makes cuptiSubscribe
// answer result (0: normal behaviour).
func (f *Fake) Hold(held bool, result int) {
	h := 0
	if held {
		h = 1
	}
	C.call_hold(f.sym("fake_cupti_hold"), C.int(h), C.int(result))
}

// SetClock makes cuptiGetTimestamp = CLOCK_MONOTONIC + offset, with a busy
// wait of slowNs before reading on every call but each every-th.
func (f *Fake) SetClock(offset int64, slowNs, every uint32) {
	C.call_clock(f.sym("fake_cupti_set_clock"), C.int64_t(offset), C.uint32_t(slowNs), C.uint32_t(every))
}

// Now reads the fake's cuptiGetTimestamp.
func (f *Fake) Now() uint64 {
	var t C.uint64_t
	C.call_ts(f.sym("cuptiGetTimestamp"), &t)
	return uint64(t)
}

// CallbackEnabled reports whether the subscriber's callback is on for (domain, cbid).
func (f *Fake) CallbackEnabled(domain int, cbid uint32) bool {
	return C.call_enabled(f.sym("fake_cupti_enabled"), C.int(domain), C.uint32_t(cbid)) != 0
}

// KindEnabled reports whether an activity kind is enabled.
func (f *Fake) KindEnabled(kind int) bool {
	return C.call_int_int(f.sym("fake_cupti_kind_enabled"), C.int(kind)) != 0
}

// SetKind turns an activity kind's records on or off, whatever the client enabled.
func (f *Fake) SetKind(kind int, on bool) {
	v := 0
	if on {
		v = 1
	}
	C.call_hold(f.sym("fake_cupti_set_kind"), C.int(kind), C.int(v))
}

// Subscribed reports whether a subscriber holds the fake.
func (f *Fake) Subscribed() bool { return C.call_int(f.sym("fake_cupti_subscribed")) != 0 }
