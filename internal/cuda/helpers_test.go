package cuda

import (
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/candle-trace/candle-trace/internal/events"
)

const (
	gib = uint64(1) << 30
	mib = uint64(1) << 20
)

// fakeDevice is one GPU of the mock: what each NVML query answers.
type fakeDevice struct {
	mem      nvml.Memory_v2
	memRet   nvml.Return // of GetMemoryInfo_v2
	v1Ret    nvml.Return // of GetMemoryInfo
	util     nvml.Utilization
	utilRet  nvml.Return
	powerMW  uint32
	powerRet nvml.Return
	procs    []nvml.ProcessInfo
	procRet  nvml.Return
}

func h100(i int) fakeDevice {
	return fakeDevice{
		mem:     nvml.Memory_v2{Total: 80 * gib, Reserved: 512 * mib, Used: uint64(i+1) * gib, Free: 80*gib - 512*mib - uint64(i+1)*gib},
		util:    nvml.Utilization{Gpu: uint32(40 + i), Memory: uint32(10 + i)},
		powerMW: 150000 + uint32(i),
		procs:   []nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 256 * mib}, {Pid: 7, UsedGpuMemory: gib}},
	}
}

// mockDevice builds go-nvml's mock.Device answering from f.
func mockDevice(f *fakeDevice) *mock.Device {
	return &mock.Device{
		GetMemoryInfo_v2Func: func() (nvml.Memory_v2, nvml.Return) {
			if f.memRet != nvml.SUCCESS {
				return nvml.Memory_v2{}, f.memRet
			}
			return f.mem, nvml.SUCCESS
		},
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			if f.v1Ret != nvml.SUCCESS {
				return nvml.Memory{}, f.v1Ret
			}
			// v1 counts the driver's reservation as used.
			return nvml.Memory{Total: f.mem.Total, Used: f.mem.Used + f.mem.Reserved, Free: f.mem.Free}, nvml.SUCCESS
		},
		GetUtilizationRatesFunc: func() (nvml.Utilization, nvml.Return) { return f.util, f.utilRet },
		GetPowerUsageFunc:       func() (uint32, nvml.Return) { return f.powerMW, f.powerRet },
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			if f.procRet != nvml.SUCCESS {
				return nil, f.procRet
			}
			return f.procs, nvml.SUCCESS
		},
	}
}

// mockNVML is go-nvml's mock.Interface over devs (by NVML index).
func mockNVML(devs ...*fakeDevice) (*mock.Interface, []*mock.Device) {
	mds := make([]*mock.Device, len(devs))
	for i, d := range devs {
		mds[i] = mockDevice(d)
	}
	m := &mock.Interface{
		InitFunc:           func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(mds), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(mds) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return mds[i], nvml.SUCCESS
		},
		DeviceGetHandleByUUIDFunc: func(uuid string) (nvml.Device, nvml.Return) {
			var i int
			if _, err := fmt.Sscanf(uuid, "GPU-fake-%d", &i); err != nil || i >= len(mds) {
				return nil, nvml.ERROR_NOT_FOUND
			}
			return mds[i], nvml.SUCCESS
		},
	}
	return m, mds
}

// fakeClock is a session clock the test moves.
type fakeClock struct {
	mu  sync.Mutex
	now uint64
}

func (c *fakeClock) Now() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now += uint64(d)
	c.mu.Unlock()
}

// recorder is a MemorySink that keeps what it is given.
type recorder struct {
	mu     sync.Mutex
	events []events.DeviceMemory
	err    error
}

func (r *recorder) RecordDeviceMemory(d *events.DeviceMemory) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	if err := d.Validate(); err != nil {
		return err
	}
	r.events = append(r.events, *d)
	return nil
}

func (r *recorder) got() []events.DeviceMemory {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]events.DeviceMemory(nil), r.events...)
}

// steppingWall is a wall clock that advances step on every read, so each
// sample's NVML time is exactly step.
func steppingWall(step time.Duration) func() time.Time {
	var mu sync.Mutex
	t := time.Unix(0, 0)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		t = t.Add(step)
		return t
	}
}
