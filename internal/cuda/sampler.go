package cuda

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/candle-trace/candle-trace/internal/events"
)

// DefaultInterval is the NVML sampling period.
//
// Cost: one sample of one device is 3 NVML calls (memory, utilisation,
// power) plus, at most once per DefaultProcessInterval, the per-process
// query. NVML serialises calls in the driver (a process-wide lock and an
// ioctl each), so the sampler's calls and those of any other NVML user in
// the process (nvidia-smi runs in its own process and is unaffected) queue
// behind one another. The sampler runs on its own goroutine, never on the
// traced threads. Each sample records what its NVML calls took as
// extra.nvml_query_ns, so a trace states its own sampling cost;
// BenchmarkSample measures the Go side against the mock.
const DefaultInterval = 10 * time.Millisecond

// MinInterval and MaxInterval bound interval_ms.
const (
	MinInterval = time.Millisecond
	MaxInterval = time.Minute
)

// DefaultProcessInterval bounds the per-process query
// (nvmlDeviceGetComputeRunningProcesses): it walks every process on the
// device in the driver and is much dearer than the others.
const DefaultProcessInterval = time.Second

// Extra field names of the device_memory samples the sampler writes.
const (
	ExtraGPUUtilization    = "gpu_utilization_pct"    // % of the last NVML sample period a kernel ran
	ExtraMemoryUtilization = "memory_utilization_pct" // % of it device memory was read or written
	ExtraPower             = "power_w"                // board power draw, watts
	ExtraProcessUsed       = "process_used_bytes"     // this process's device memory (per-process query)
	ExtraProcessCount      = "compute_processes"      // compute processes on the device (per-process query)
	ExtraQueryNs           = "nvml_query_ns"          // wall time of this sample's NVML calls
)

// notAvailable is NVML_VALUE_NOT_AVAILABLE for a process's used memory.
const notAvailable = ^uint64(0)

// Clock is the session clock (nanoseconds since the session opened).
type Clock interface{ Now() uint64 }

// MemorySink receives device_memory samples (the session).
type MemorySink interface {
	RecordDeviceMemory(*events.DeviceMemory) error
}

// SamplerOption configures NewSampler.
type SamplerOption func(*samplerOptions)

type samplerOptions struct {
	interval, procInterval time.Duration
	ordinals               []int // nil = every visible device
	visible                string
	visibleSet             bool
	pid                    int
	wallClock              func() time.Time
}

// WithInterval sets the sampling period (clamped to [MinInterval, MaxInterval]).
func WithInterval(d time.Duration) SamplerOption {
	return func(o *samplerOptions) { o.interval = min(max(d, MinInterval), MaxInterval) }
}

// WithProcessInterval sets the minimum period of the per-process query.
func WithProcessInterval(d time.Duration) SamplerOption {
	return func(o *samplerOptions) {
		if d > 0 {
			o.procInterval = d
		}
	}
}

// WithDevices selects devices by CUDA ordinal (cuda:N); nil means all.
func WithDevices(ordinals []int) SamplerOption {
	return func(o *samplerOptions) { o.ordinals = append([]int(nil), ordinals...) }
}

// WithVisibleDevices sets what CUDA_VISIBLE_DEVICES is taken to be (default:
// the environment). set false means unset.
func WithVisibleDevices(value string, set bool) SamplerOption {
	return func(o *samplerOptions) { o.visible, o.visibleSet = value, set }
}

// WithPID sets the process whose own device memory is reported (default: this one).
func WithPID(pid int) SamplerOption { return func(o *samplerOptions) { o.pid = pid } }

// withWallClock replaces time.Now for measuring NVML call durations (tests).
func withWallClock(f func() time.Time) SamplerOption {
	return func(o *samplerOptions) { o.wallClock = f }
}

// sampledDevice is one device's cached handle and what it turned out to support.
type sampledDevice struct {
	name     string // "cuda:<ordinal>"
	dev      Device
	memV2    bool // nvmlDeviceGetMemoryInfo_v2 works (reserved_bytes)
	probed   bool
	util     bool
	power    bool
	procs    bool
	lastProc uint64 // session ns of the last per-process query; 0 = never
	procDone bool
}

// SamplerStats counts what the sampler did.
type SamplerStats struct {
	Samples     uint64        // device_memory events written
	Errors      uint64        // samples lost to NVML errors
	QueryTime   time.Duration // total time in NVML calls
	ProcQueries uint64        // per-process queries made
	LastError   string
}

// Sampler samples NVML device memory into a session.
type Sampler struct {
	lib   Library
	sink  MemorySink
	clock Clock
	opts  samplerOptions
	devs  []*sampledDevice

	mu    sync.Mutex // one sample at a time (the loop, Flush)
	stats SamplerStats
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

// NewSampler initialises NVML and caches a handle per selected device.
// Errors: CT_ERR_UNAVAILABLE when NVML cannot start or sees no GPU,
// CT_ERR_INVALID_ARGUMENT for a device that does not exist.
func NewSampler(lib Library, sink MemorySink, clock Clock, opts ...SamplerOption) (*Sampler, error) {
	o := samplerOptions{interval: DefaultInterval, procInterval: DefaultProcessInterval, pid: os.Getpid(), wallClock: time.Now}
	o.visible, o.visibleSet = os.LookupEnv("CUDA_VISIBLE_DEVICES")
	for _, f := range opts {
		f(&o)
	}
	if r := lib.Init(); r != nvml.SUCCESS {
		return nil, unavailable("NVML is unavailable: nvmlInit failed: %s%s", retName(r), initHint[r])
	}
	s := &Sampler{lib: lib, sink: sink, clock: clock, opts: o}
	if err := s.openDevices(); err != nil {
		lib.Shutdown()
		return nil, err
	}
	return s, nil
}

// initHint says what an nvmlInit failure most often means on the user's side.
var initHint = map[nvml.Return]string{
	nvml.ERROR_DRIVER_NOT_LOADED: ": the NVIDIA kernel driver is not running (no NVIDIA GPU here, or its driver is not installed)",
	nvml.ERROR_NO_PERMISSION:     ": this user may not open the GPU's device files (/dev/nvidia*)",
}

func (s *Sampler) openDevices() error {
	n, r := s.lib.DeviceGetCount()
	if r != nvml.SUCCESS {
		return unavailable("NVML is unavailable: nvmlDeviceGetCount failed: %s", retName(r))
	}
	if n == 0 {
		return unavailable("NVML is unavailable: the driver reports no GPU")
	}
	visible, err := parseVisible(s.opts.visible, s.opts.visibleSet, n)
	if err != nil {
		return err
	}
	if len(visible) == 0 {
		return unavailable("NVML sampler: CUDA_VISIBLE_DEVICES=%q leaves no GPU visible", s.opts.visible)
	}
	ordinals := s.opts.ordinals
	if ordinals == nil {
		for _, v := range visible {
			ordinals = append(ordinals, v.ordinal)
		}
	}
	for _, ord := range ordinals {
		if ord < 0 || ord >= len(visible) {
			return invalidArg("ct_device_start: device %d does not exist: %d CUDA device(s) are visible (cuda:0 .. cuda:%d)", ord, len(visible), len(visible)-1)
		}
		v := visible[ord]
		var h nvml.Device
		if v.uuid != "" {
			h, r = s.lib.DeviceGetHandleByUUID(v.uuid)
		} else {
			h, r = s.lib.DeviceGetHandleByIndex(v.nvmlIndex)
		}
		if r != nvml.SUCCESS {
			what := fmt.Sprintf("index %d", v.nvmlIndex)
			if v.uuid != "" {
				what = v.uuid
			}
			return unavailable("NVML sampler: no handle for cuda:%d (NVML %s): %s", ord, what, retName(r))
		}
		s.devs = append(s.devs, &sampledDevice{name: fmt.Sprintf("cuda:%d", ord), dev: h})
	}
	return nil
}

// Devices lists the sampled devices ("cuda:0", ...).
func (s *Sampler) Devices() []string {
	out := make([]string, len(s.devs))
	for i, d := range s.devs {
		out[i] = d.name
	}
	return out
}

// Interval is the sampling period in use.
func (s *Sampler) Interval() time.Duration { return s.opts.interval }

// Stats returns the counters so far.
func (s *Sampler) Stats() SamplerStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Start samples once now and then every interval on a goroutine, until Stop
// or until the session refuses a sample (it finished).
func (s *Sampler) Start() {
	s.stop = make(chan struct{})
	s.done = make(chan struct{})
	go s.loop()
}

func (s *Sampler) loop() {
	defer close(s.done)
	t := time.NewTicker(s.opts.interval)
	defer t.Stop()
	for {
		if err := s.SampleOnce(); err != nil {
			return // the session is gone or poisoned: nothing more can be written
		}
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
	}
}

// Stop ends the loop, takes a last sample (so the trace holds the state at
// stop) and shuts NVML down. Safe to call more than once.
func (s *Sampler) Stop() error {
	var err error
	s.once.Do(func() {
		if s.stop != nil {
			close(s.stop)
			<-s.done
		}
		err = s.SampleOnce()
		s.lib.Shutdown()
	})
	return err
}

// SampleOnce samples every device and records one device_memory event per
// device. NVML errors lose that device's sample (counted in Stats); the
// returned error is the session's refusal of a record, which ends sampling.
func (s *Sampler) SampleOnce() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.devs {
		ev, ok := s.sample(d)
		if !ok {
			continue
		}
		if err := s.sink.RecordDeviceMemory(ev); err != nil {
			return err
		}
		s.stats.Samples++
	}
	return nil
}

// unsupported is what NVML answers for a query this driver or GPU lacks.
func unsupported(r nvml.Return) bool {
	return r == nvml.ERROR_NOT_SUPPORTED || r == nvml.ERROR_FUNCTION_NOT_FOUND ||
		r == nvml.ERROR_ARGUMENT_VERSION_MISMATCH || r == nvml.ERROR_NO_PERMISSION
}

func (s *Sampler) fail(d *sampledDevice, what string, r nvml.Return) (*events.DeviceMemory, bool) {
	s.stats.Errors++
	s.stats.LastError = fmt.Sprintf("%s: %s: %s", d.name, what, retName(r))
	return nil, false
}

// sample queries one device. The first sample probes which queries work and
// later samples skip the unsupported ones.
func (s *Sampler) sample(d *sampledDevice) (*events.DeviceMemory, bool) {
	began := s.opts.wallClock()
	ev := &events.DeviceMemory{Device: d.name, Extra: map[string]float64{}}
	if !d.probed || d.memV2 {
		m, r := d.dev.GetMemoryInfo_v2()
		switch {
		case r == nvml.SUCCESS:
			d.memV2 = true
			ev.Used, ev.Free, ev.Reserved, ev.Capacity = m.Used, m.Free, m.Reserved, m.Total
			ev.HasReserved = true
		case !d.probed && unsupported(r):
			d.memV2 = false
		default:
			return s.fail(d, "nvmlDeviceGetMemoryInfo_v2", r)
		}
	}
	if !d.memV2 {
		m, r := d.dev.GetMemoryInfo()
		if r != nvml.SUCCESS {
			return s.fail(d, "nvmlDeviceGetMemoryInfo", r)
		}
		ev.Used, ev.Free, ev.Capacity = m.Used, m.Free, m.Total
	}
	ev.HasUsed, ev.HasFree, ev.HasCapacity = true, true, true
	ev.TimestampNs = s.clock.Now()

	if !d.probed || d.util {
		u, r := d.dev.GetUtilizationRates()
		d.util = r == nvml.SUCCESS
		if d.util {
			ev.Extra[ExtraGPUUtilization] = float64(u.Gpu)
			ev.Extra[ExtraMemoryUtilization] = float64(u.Memory)
		}
	}
	if !d.probed || d.power {
		mw, r := d.dev.GetPowerUsage()
		d.power = r == nvml.SUCCESS
		if d.power {
			ev.Extra[ExtraPower] = float64(mw) / 1000
		}
	}
	if (!d.probed || d.procs) && (!d.procDone || ev.TimestampNs-d.lastProc >= uint64(s.opts.procInterval)) {
		procs, r := d.dev.GetComputeRunningProcesses()
		d.procs = r == nvml.SUCCESS
		d.lastProc, d.procDone = ev.TimestampNs, true
		if d.procs {
			s.stats.ProcQueries++
			ev.Extra[ExtraProcessCount] = float64(len(procs))
			for _, p := range procs {
				if int(p.Pid) == s.opts.pid && p.UsedGpuMemory != notAvailable {
					ev.Extra[ExtraProcessUsed] = float64(p.UsedGpuMemory)
				}
			}
		}
	}
	d.probed = true
	took := s.opts.wallClock().Sub(began)
	s.stats.QueryTime += took
	ev.Extra[ExtraQueryNs] = float64(took.Nanoseconds())
	return ev, true
}
