package cuda

import (
	"errors"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/session"
)

func newTestSampler(t *testing.T, lib Library, sink MemorySink, clock Clock, opts ...SamplerOption) *Sampler {
	t.Helper()
	base := []SamplerOption{WithPID(4242), WithVisibleDevices("", false), withWallClock(steppingWall(3 * time.Microsecond))}
	s, err := NewSampler(lib, sink, clock, append(base, opts...)...)
	require.NoError(t, err)
	return s
}

func TestSampleOnceWritesEveryDevice(t *testing.T) {
	d0, d1 := h100(0), h100(1)
	lib, _ := mockNVML(&d0, &d1)
	rec, clock := &recorder{}, &fakeClock{now: 5000}
	s := newTestSampler(t, lib, rec, clock)
	assert.Equal(t, []string{"cuda:0", "cuda:1"}, s.Devices())
	assert.Equal(t, DefaultInterval, s.Interval())

	require.NoError(t, s.SampleOnce())
	want := []events.DeviceMemory{
		{TimestampNs: 5000, Device: "cuda:0", Used: gib, Free: 80*gib - 512*mib - gib, Reserved: 512 * mib, Capacity: 80 * gib,
			HasUsed: true, HasFree: true, HasReserved: true, HasCapacity: true,
			Extra: map[string]float64{ExtraGPUUtilization: 40, ExtraMemoryUtilization: 10, ExtraPower: 150, ExtraProcessCount: 2, ExtraProcessUsed: float64(256 * mib), ExtraQueryNs: 3000}},
		{TimestampNs: 5000, Device: "cuda:1", Used: 2 * gib, Free: 80*gib - 512*mib - 2*gib, Reserved: 512 * mib, Capacity: 80 * gib,
			HasUsed: true, HasFree: true, HasReserved: true, HasCapacity: true,
			Extra: map[string]float64{ExtraGPUUtilization: 41, ExtraMemoryUtilization: 11, ExtraPower: 150.001, ExtraProcessCount: 2, ExtraProcessUsed: float64(256 * mib), ExtraQueryNs: 3000}},
	}
	assert.Equal(t, want, rec.got())
	st := s.Stats()
	assert.Equal(t, uint64(2), st.Samples)
	assert.Equal(t, uint64(0), st.Errors)
	assert.Equal(t, 6*time.Microsecond, st.QueryTime)
	assert.Equal(t, uint64(2), st.ProcQueries)
}

func TestHandlesAreCachedAndProcessQueriesRateLimited(t *testing.T) {
	d0 := h100(0)
	lib, mds := mockNVML(&d0)
	rec, clock := &recorder{}, &fakeClock{}
	s := newTestSampler(t, lib, rec, clock, WithInterval(10*time.Millisecond))
	// 2.5 s of samples every 10 ms: the per-process query runs at 0, 1 s and 2 s.
	for i := 0; i < 250; i++ {
		require.NoError(t, s.SampleOnce())
		clock.advance(10 * time.Millisecond)
	}
	assert.Len(t, lib.DeviceGetHandleByIndexCalls(), 1, "one handle lookup per device, ever")
	assert.Len(t, lib.InitCalls(), 1)
	assert.Len(t, mds[0].GetMemoryInfo_v2Calls(), 250)
	assert.Len(t, mds[0].GetComputeRunningProcessesCalls(), 3)
	assert.Equal(t, uint64(3), s.Stats().ProcQueries)
	var withProc []uint64
	for _, e := range rec.got() {
		if _, ok := e.Extra[ExtraProcessUsed]; ok {
			withProc = append(withProc, e.TimestampNs)
		}
	}
	assert.Equal(t, []uint64{0, uint64(time.Second), uint64(2 * time.Second)}, withProc)
}

func TestSamplerDegradesPerQuery(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*fakeDevice)
		want    events.DeviceMemory // of the second sample
		v2Calls int                 // after three samples
		errors  uint64
		samples uint64
	}{
		{
			name:   "no v2 memory query (old driver): v1 used includes reserved",
			mutate: func(f *fakeDevice) { f.memRet = nvml.ERROR_FUNCTION_NOT_FOUND },
			want: events.DeviceMemory{Used: gib + 512*mib, Free: 80*gib - 512*mib - gib, Capacity: 80 * gib, HasUsed: true, HasFree: true, HasCapacity: true,
				Extra: map[string]float64{ExtraGPUUtilization: 40, ExtraMemoryUtilization: 10, ExtraPower: 150, ExtraProcessCount: 2, ExtraProcessUsed: float64(256 * mib), ExtraQueryNs: 3000}},
			v2Calls: 1, samples: 3,
		},
		{
			name:   "v2 not supported by the GPU",
			mutate: func(f *fakeDevice) { f.memRet = nvml.ERROR_NOT_SUPPORTED },
			want: events.DeviceMemory{Used: gib + 512*mib, Free: 80*gib - 512*mib - gib, Capacity: 80 * gib, HasUsed: true, HasFree: true, HasCapacity: true,
				Extra: map[string]float64{ExtraGPUUtilization: 40, ExtraMemoryUtilization: 10, ExtraPower: 150, ExtraProcessCount: 2, ExtraProcessUsed: float64(256 * mib), ExtraQueryNs: 3000}},
			v2Calls: 1, samples: 3,
		},
		{
			name: "no utilisation, no power, no process list",
			mutate: func(f *fakeDevice) {
				f.utilRet, f.powerRet, f.procRet = nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NO_PERMISSION
			},
			want: events.DeviceMemory{Used: gib, Free: 80*gib - 512*mib - gib, Reserved: 512 * mib, Capacity: 80 * gib, HasUsed: true, HasFree: true, HasReserved: true, HasCapacity: true,
				Extra: map[string]float64{ExtraQueryNs: 3000}},
			v2Calls: 3, samples: 3,
		},
		{
			name:   "this process not on the device (or in another pid namespace)",
			mutate: func(f *fakeDevice) { f.procs = f.procs[1:] },
			want: events.DeviceMemory{Used: gib, Free: 80*gib - 512*mib - gib, Reserved: 512 * mib, Capacity: 80 * gib, HasUsed: true, HasFree: true, HasReserved: true, HasCapacity: true,
				Extra: map[string]float64{ExtraGPUUtilization: 40, ExtraMemoryUtilization: 10, ExtraPower: 150, ExtraProcessCount: 1, ExtraQueryNs: 3000}},
			v2Calls: 3, samples: 3,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := h100(0)
			tt.mutate(&d)
			lib, mds := mockNVML(&d)
			rec, clock := &recorder{}, &fakeClock{now: 7}
			// A process interval of 0 ns would query every time: 1 ns apart is enough here.
			s := newTestSampler(t, lib, rec, clock, WithProcessInterval(time.Nanosecond))
			for i := 0; i < 3; i++ {
				require.NoError(t, s.SampleOnce())
				clock.advance(time.Millisecond)
			}
			got := rec.got()
			require.Len(t, got, int(tt.samples))
			want := tt.want
			want.TimestampNs, want.Device = 7+uint64(time.Millisecond), "cuda:0"
			assert.Equal(t, want, got[1])
			assert.Len(t, mds[0].GetMemoryInfo_v2Calls(), tt.v2Calls)
			assert.Equal(t, tt.errors, s.Stats().Errors)
		})
	}
}

func TestSampleLostToAnNVMLErrorIsCounted(t *testing.T) {
	d0, d1 := h100(0), h100(1)
	lib, _ := mockNVML(&d0, &d1)
	rec := &recorder{}
	s := newTestSampler(t, lib, rec, &fakeClock{now: 1})
	require.NoError(t, s.SampleOnce())
	d1.memRet = nvml.ERROR_GPU_IS_LOST
	require.NoError(t, s.SampleOnce())
	got := rec.got()
	require.Len(t, got, 3)
	assert.Equal(t, []string{"cuda:0", "cuda:1", "cuda:0"}, []string{got[0].Device, got[1].Device, got[2].Device})
	st := s.Stats()
	assert.Equal(t, uint64(3), st.Samples)
	assert.Equal(t, uint64(1), st.Errors)
	assert.Contains(t, st.LastError, "cuda:1: nvmlDeviceGetMemoryInfo_v2: ")
	assert.Contains(t, st.LastError, "(nvmlReturn_t 15)")
}

func TestNewSamplerErrors(t *testing.T) {
	tests := []struct {
		name     string
		lib      func(l Library) Library
		opts     []SamplerOption
		code     session.Status
		msg      string
		shutdown int
	}{
		{name: "driver not loaded", code: session.Unavailable, msg: "NVML is unavailable: nvmlInit failed: ", shutdown: 0,
			lib: func(l Library) Library {
				m := l.(*mock.Interface)
				m.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
				return m
			}},
		{name: "count fails", code: session.Unavailable, msg: "nvmlDeviceGetCount failed: ", shutdown: 1,
			lib: func(l Library) Library {
				m := l.(*mock.Interface)
				m.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
				return m
			}},
		{name: "no GPU", code: session.Unavailable, msg: "the driver reports no GPU", shutdown: 1,
			lib: func(l Library) Library {
				m := l.(*mock.Interface)
				m.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
				return m
			}},
		{name: "handle fails", code: session.Unavailable, msg: "no handle for cuda:1 (NVML index 1): ", shutdown: 1,
			lib: func(l Library) Library {
				m := l.(*mock.Interface)
				inner := m.DeviceGetHandleByIndexFunc
				m.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
					if i == 1 {
						return nil, nvml.ERROR_GPU_IS_LOST
					}
					return inner(i)
				}
				return m
			}},
		{name: "device out of range", opts: []SamplerOption{WithDevices([]int{0, 2})}, code: session.InvalidArgument,
			msg: "ct_device_start: device 2 does not exist: 2 CUDA device(s) are visible (cuda:0 .. cuda:1)", shutdown: 1},
		{name: "MIG instance visible", opts: []SamplerOption{WithVisibleDevices("MIG-abc", true)}, code: session.Unavailable, msg: "names a MIG instance (MIG-abc)", shutdown: 1},
		{name: "nothing visible", opts: []SamplerOption{WithVisibleDevices("", true)}, code: session.Unavailable, msg: `CUDA_VISIBLE_DEVICES="" leaves no GPU visible`, shutdown: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d0, d1 := h100(0), h100(1)
			m, _ := mockNVML(&d0, &d1)
			var lib Library = m
			if tt.lib != nil {
				lib = tt.lib(m)
			}
			opts := append([]SamplerOption{WithVisibleDevices("", false)}, tt.opts...)
			s, err := NewSampler(lib, &recorder{}, &fakeClock{}, opts...)
			require.Error(t, err)
			assert.Nil(t, s)
			assert.Equal(t, tt.code, session.CodeOf(err))
			assert.Contains(t, err.Error(), tt.msg)
			assert.Len(t, m.ShutdownCalls(), tt.shutdown, "NVML is shut down when it was initialised")
		})
	}
}

func TestCUDAVisibleDevicesMapsOrdinals(t *testing.T) {
	tests := []struct {
		visible string
		devices []int
		want    map[string]uint64 // device -> used bytes (which NVML GPU it is)
	}{
		{"1", nil, map[string]uint64{"cuda:0": 2 * gib}},
		{"2,0", nil, map[string]uint64{"cuda:0": 3 * gib, "cuda:1": gib}},
		{"GPU-fake-1,0", []int{1}, map[string]uint64{"cuda:1": gib}},
		{"0,7,1", nil, map[string]uint64{"cuda:0": gib}}, // CUDA stops at the invalid 7
		{"1,1,2", nil, map[string]uint64{"cuda:0": 2 * gib}},
	}
	for _, tt := range tests {
		t.Run(tt.visible, func(t *testing.T) {
			d0, d1, d2 := h100(0), h100(1), h100(2)
			lib, _ := mockNVML(&d0, &d1, &d2)
			rec := &recorder{}
			s := newTestSampler(t, lib, rec, &fakeClock{}, WithVisibleDevices(tt.visible, true), WithDevices(tt.devices))
			require.NoError(t, s.SampleOnce())
			got := map[string]uint64{}
			for _, e := range rec.got() {
				got[e.Device] = e.Used
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestLoopSamplesUntilStop(t *testing.T) {
	d0 := h100(0)
	lib, _ := mockNVML(&d0)
	rec := &recorder{}
	s := newTestSampler(t, lib, rec, &fakeClock{}, WithInterval(time.Millisecond))
	s.Start()
	require.Eventually(t, func() bool { return len(rec.got()) >= 5 }, 5*time.Second, time.Millisecond)
	require.NoError(t, s.Stop())
	n := len(rec.got())
	require.NoError(t, s.Stop(), "a second Stop does nothing")
	time.Sleep(5 * time.Millisecond)
	assert.Len(t, rec.got(), n, "nothing is sampled after Stop")
	assert.Len(t, lib.ShutdownCalls(), 1)
}

func TestLoopEndsWhenTheSessionRefuses(t *testing.T) {
	d0 := h100(0)
	lib, _ := mockNVML(&d0)
	rec := &recorder{}
	s := newTestSampler(t, lib, rec, &fakeClock{}, WithInterval(time.Millisecond))
	s.Start()
	require.Eventually(t, func() bool { return len(rec.got()) >= 2 }, 5*time.Second, time.Millisecond)
	gone := &session.Error{Code: session.InvalidHandle, Msg: "session 1 is unknown or already finished"}
	rec.mu.Lock()
	rec.err = gone
	rec.mu.Unlock()
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the loop did not end after the session refused a sample")
	}
	assert.True(t, errors.Is(s.Stop(), gone))
	assert.Len(t, lib.ShutdownCalls(), 1)
}

// BenchmarkSample is the Go side of one device's sample against the mock
// (NVML's own cost on hardware comes on top; the trace states it per
// sample as extra.nvml_query_ns).
func BenchmarkSample(b *testing.B) {
	d0 := h100(0)
	lib, _ := mockNVML(&d0)
	s, err := NewSampler(lib, discard{}, &fakeClock{}, WithVisibleDevices("", false))
	require.NoError(b, err)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := s.SampleOnce(); err != nil {
			b.Fatal(err)
		}
	}
}

type discard struct{}

func (discard) RecordDeviceMemory(d *events.DeviceMemory) error { return nil }
