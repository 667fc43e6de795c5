package analysis

import (
	"fmt"
	"math"
	"sort"

	"github.com/candle-trace/candle-trace/internal/traceformat"

	"github.com/candle-trace/candle-trace/internal/report/health"
	"github.com/candle-trace/candle-trace/internal/report/trace"
)

// Report is what `candle-trace report` shows: where the captured step spent
// its time, whether the device sat idle, the memory peak, gradients, tensor
// statistics and an overhead analysis. Durations are nanoseconds.
type Report struct {
	MeasuredRegion *Region          `json:"measured_region,omitempty"`
	Spans          []NameStats      `json:"spans"`
	Ops            []NameStats      `json:"ops"`
	Memory         MemoryReport     `json:"memory"`
	Device         DeviceReport     `json:"device"`
	Gradients      GradientReport   `json:"gradients"`
	TensorStats    []TensorSummary  `json:"tensor_stats"`
	Overhead       OverheadAnalysis `json:"overhead"`
}

// Region is the single measured span.
type Region struct {
	SpanID     string `json:"span_id"`
	Name       string `json:"name"`
	StartNS    uint64 `json:"start_ns"`
	DurationNS uint64 `json:"duration_ns"`
	Closed     bool   `json:"closed"`
	// TracerNS is the tracer's own time inside the region, which DurationNS
	// leaves out; SessionTracerNS the whole session's. Nil when the trace
	// does not say (an older writer, or another one).
	TracerNS        *uint64 `json:"tracer_ns,omitempty"`
	SessionTracerNS *uint64 `json:"session_tracer_ns,omitempty"`
	// SessionEstimatedNS: the calibrated part of SessionTracerNS (work the
	// tracer could not bracket, such as a framework's per-op callback setup).
	SessionEstimatedNS uint64 `json:"session_tracer_estimated_ns,omitempty"`
}

// NameStats aggregates the spans or ops sharing one name. Share is Total
// over the measured region's duration (spans enclosing the region exceed 1).
type NameStats struct {
	Name        string  `json:"name"`
	Count       uint64  `json:"count"`
	TotalNS     uint64  `json:"total_ns"`
	SelfNS      uint64  `json:"self_ns"`
	MeanNS      float64 `json:"mean_ns"`
	P50NS       uint64  `json:"p50_ns"`
	P95NS       uint64  `json:"p95_ns"`
	MaxNS       uint64  `json:"max_ns"`
	Share       float64 `json:"share"`
	Approximate bool    `json:"approximate,omitempty"` // percentiles from a ~1% sketch
	// Ops only: dense bytes read and written.
	InputBytes  uint64  `json:"input_bytes,omitempty"`
	OutputBytes uint64  `json:"output_bytes,omitempty"`
	BytesPerOp  float64 `json:"bytes_per_op,omitempty"`
	// Spans only: closed spans (only these have a duration).
	Open uint64 `json:"open,omitempty"`
	// Spans only: every span of the name encloses the measured region (the
	// session's root around a capture): a share of it would say nothing, so
	// Share is 0 and the table shows "-".
	Encloses bool `json:"encloses_measured_region,omitempty"`
}

type MemoryReport struct {
	Allocations         uint64             `json:"allocations"`
	Frees               uint64             `json:"frees"`
	TotalAllocatedBytes uint64             `json:"total_allocated_bytes"`
	RetainedStorages    int                `json:"retained_storages"`
	Peak                *health.MemoryPeak `json:"peak,omitempty"`
	Devices             []DeviceMemoryStat `json:"devices"`
}

// DeviceMemoryStat summarises device_memory samples of one device.
type DeviceMemoryStat struct {
	Device            string  `json:"device"`
	Samples           uint64  `json:"samples"`
	PeakUsedBytes     *uint64 `json:"peak_used_bytes,omitempty"`
	PeakUsedAtNS      uint64  `json:"peak_used_at_ns,omitempty"`
	PeakReservedBytes *uint64 `json:"peak_reserved_bytes,omitempty"`
	MinFreeBytes      *uint64 `json:"min_free_bytes,omitempty"`
	CapacityBytes     *uint64 `json:"capacity_bytes,omitempty"`
}

type DeviceReport struct {
	Streams []StreamStat `json:"streams"`
	Devices []DeviceBusy `json:"devices"`
	// Kernels: device intervals by name, most device time first (the top
	// MaxKernelRows; the rest summed into one "(other N names)" row).
	Kernels []KernelStat `json:"kernels"`
	// BySpan: device time by the name of the span that launched the work,
	// most first: where a phase's device time went, not only its host time.
	BySpan []SpanDeviceStat `json:"by_span"`
}

// MaxKernelRows bounds DeviceReport.Kernels.
const MaxKernelRows = 50

// KernelStat is the device intervals of one name (a kernel, "memcpy HtoD",
// "memset"; "(unnamed)" for intervals without one).
type KernelStat struct {
	Name    string  `json:"name"`
	Count   uint64  `json:"count"`
	TotalNS uint64  `json:"total_ns"`
	MeanNS  float64 `json:"mean_ns"`
	MaxNS   uint64  `json:"max_ns"`
	Share   float64 `json:"share"` // of all device intervals' time
}

// SpanDeviceStat is the device work attributed to the spans of one name.
type SpanDeviceStat struct {
	Name    string  `json:"name"`
	Kernels uint64  `json:"kernels"`
	TotalNS uint64  `json:"total_ns"`
	Share   float64 `json:"share"` // of all device intervals' time
}

// StreamStat is the device work on one stream. Kernels are device intervals.
type StreamStat struct {
	Device       string  `json:"device"`
	ClockID      string  `json:"clock_id"`
	StreamID     string  `json:"stream_id"`
	Kernels      uint64  `json:"kernels"`
	KernelNS     uint64  `json:"kernel_ns"`
	MeanKernelNS float64 `json:"mean_kernel_ns"`
	BusyNS       uint64  `json:"busy_ns"` // union: overlapping kernels count once
}

// DeviceBusy is the union of all streams of one device clock, and for the
// host clock its idle gaps inside the measured region.
type DeviceBusy struct {
	Device       string  `json:"device"`
	ClockID      string  `json:"clock_id"`
	Kernels      uint64  `json:"kernels"`
	BusyNS       uint64  `json:"busy_ns"`
	InRegion     bool    `json:"in_region"` // the fields below are set
	RegionBusyNS uint64  `json:"region_busy_ns,omitempty"`
	IdleNS       uint64  `json:"idle_ns,omitempty"`
	IdleGaps     int     `json:"idle_gaps,omitempty"`
	LargestGapNS uint64  `json:"largest_gap_ns,omitempty"`
	LargestGapAt uint64  `json:"largest_gap_at_ns,omitempty"`
	Utilization  float64 `json:"utilization,omitempty"`
}

type GradientReport struct {
	Total     int            `json:"total"`
	Present   int            `json:"present"`
	Missing   int            `json:"missing"`
	Zero      int            `json:"zero"`
	NonFinite int            `json:"non_finite"`
	Flagged   []GradientFact `json:"flagged"`
	All       []GradientFact `json:"all"`
}

// GradientFact is the first gradient record of one parameter.
type GradientFact struct {
	Root  string   `json:"root"`
	Key   string   `json:"key"`
	State string   `json:"state"`
	Norm  *float64 `json:"norm,omitempty"`
	Line  int      `json:"line"`
}

// TensorSummary folds the tensor_stats records of one label; the values
// are those of the last record.
type TensorSummary struct {
	Label             string   `json:"label"`
	Dtype             string   `json:"dtype"`
	Shape             []uint64 `json:"shape"`
	Observations      uint64   `json:"observations"`
	NonFiniteRecords  uint64   `json:"non_finite_records"`
	NonFiniteElements uint64   `json:"non_finite_elements"`
	FirstNonFiniteAt  int      `json:"first_non_finite_line,omitempty"`
	RMS               float64  `json:"rms"`
	AbsMax            float64  `json:"abs_max"`
	Mean              float64  `json:"mean"`
}

// reportBuilder accumulates what the report needs beyond the health state.
type reportBuilder struct {
	keyBuf  []byte
	ops     map[string]*opAcc
	opOrder []string
	streams map[string]*streamAcc // device \0 clock \0 stream
	devices map[string]*deviceAcc // device \0 clock
	kernels map[string]*kernelAcc // by interval name
	bySpan  map[string]*kernelAcc // by attributed span id
	allNS   uint64                // every interval's duration, summed
	devMem  map[string]*DeviceMemoryStat
	stats   map[string]*TensorSummary
	labels  []string
	names   map[string]string // interned op, device and kernel names
}

type opAcc struct {
	d       dist
	in, out uint64
}

type streamAcc struct {
	device, clock, stream string
	kernels, kernelNS     uint64
	blocks                blockList
}

type deviceAcc struct {
	device, clock string
	kernels       uint64
	blocks        blockList
}

type kernelAcc struct {
	count, total, max uint64
}

func (k *kernelAcc) add(d uint64) {
	k.count++
	k.total = trace.SatAdd(k.total, d)
	k.max = max(k.max, d)
}

func newReportBuilder() *reportBuilder {
	return &reportBuilder{
		ops: map[string]*opAcc{}, streams: map[string]*streamAcc{}, devices: map[string]*deviceAcc{},
		kernels: map[string]*kernelAcc{}, bySpan: map[string]*kernelAcc{},
		devMem: map[string]*DeviceMemoryStat{}, stats: map[string]*TensorSummary{},
		names: map[string]string{},
	}
}

// event folds one event the checker accepted.
func (b *reportBuilder) event(k trace.Kind, d *trace.Decoder, line int) {
	switch k {
	case trace.KindOp:
		b.op(&d.Op)
	case trace.KindTensorStats:
		b.tensorStats(&d.TensorStats, line)
	case trace.KindDeviceMemory:
		b.deviceMemory(&d.DeviceMemory)
	case trace.KindDeviceInterval:
		b.interval(&d.DeviceInterval)
	}
}

func (b *reportBuilder) intern(s []byte) string {
	if n, ok := b.names[string(s)]; ok {
		return n
	}
	n := string(s)
	b.names[n] = n
	return n
}

func (b *reportBuilder) op(e *trace.OpEvent) {
	acc, ok := b.ops[string(e.OpName)]
	if !ok {
		name := b.intern(e.OpName)
		acc = &opAcc{}
		b.ops[name] = acc
		b.opOrder = append(b.opOrder, name)
	}
	acc.d.add(e.Duration)
	acc.in = trace.SatAdd(acc.in, e.InBytes)
	if out, ok := trace.DenseBytes(e.OutBytes, e.HasOutBytes, e.Shape, e.Dtype); ok {
		acc.out = trace.SatAdd(acc.out, out)
	}
}

func (b *reportBuilder) interval(e *trace.DeviceIntervalEvent) {
	end := trace.SatAdd(e.Start, e.Duration)
	b.keyBuf = append(append(append(b.keyBuf[:0], e.Device...), 0), e.ClockID...)
	devKey := len(b.keyBuf)
	b.keyBuf = append(append(b.keyBuf, 0), e.StreamID...)
	st, ok := b.streams[string(b.keyBuf)]
	if !ok {
		st = &streamAcc{device: b.intern(e.Device), clock: b.intern(e.ClockID), stream: b.intern(e.StreamID)}
		b.streams[string(b.keyBuf)] = st
	}
	st.kernels++
	st.kernelNS = trace.SatAdd(st.kernelNS, e.Duration)
	st.blocks.add(e.Start, end)
	dv, ok := b.devices[string(b.keyBuf[:devKey])]
	if !ok {
		dv = &deviceAcc{device: st.device, clock: st.clock}
		b.devices[string(b.keyBuf[:devKey])] = dv
	}
	dv.kernels++
	dv.blocks.add(e.Start, end)
	b.allNS = trace.SatAdd(b.allNS, e.Duration)
	k, ok := b.kernels[string(e.Name)]
	if !ok {
		k = &kernelAcc{}
		b.kernels[b.intern(e.Name)] = k
	}
	k.add(e.Duration)
	k, ok = b.bySpan[string(e.SpanID)]
	if !ok {
		k = &kernelAcc{}
		b.bySpan[b.intern(e.SpanID)] = k
	}
	k.add(e.Duration)
}

func (b *reportBuilder) deviceMemory(e *trace.DeviceMemoryEvent) {
	s, ok := b.devMem[string(e.Device)]
	if !ok {
		s = &DeviceMemoryStat{Device: b.intern(e.Device)}
		b.devMem[s.Device] = s
	}
	s.Samples++
	// Ties keep the earliest sample, as candle-graph does.
	if e.HasUsed && (s.PeakUsedBytes == nil || e.Used > *s.PeakUsedBytes || (e.Used == *s.PeakUsedBytes && e.Timestamp < s.PeakUsedAtNS)) {
		v := e.Used
		s.PeakUsedBytes, s.PeakUsedAtNS = &v, e.Timestamp
	}
	if e.HasReserved && (s.PeakReservedBytes == nil || e.Reserved > *s.PeakReservedBytes) {
		v := e.Reserved
		s.PeakReservedBytes = &v
	}
	if e.HasFree && (s.MinFreeBytes == nil || e.Free < *s.MinFreeBytes) {
		v := e.Free
		s.MinFreeBytes = &v
	}
	if e.HasCapacity && (s.CapacityBytes == nil || e.Capacity > *s.CapacityBytes) {
		v := e.Capacity
		s.CapacityBytes = &v
	}
}

func (b *reportBuilder) tensorStats(e *trace.TensorStatsEvent, line int) {
	s, ok := b.stats[string(e.Label)]
	if !ok {
		s = &TensorSummary{Label: string(e.Label), Shape: []uint64{}}
		b.stats[s.Label] = s
		b.labels = append(b.labels, s.Label)
	}
	s.Observations++
	s.Dtype, s.Shape = string(e.Dtype), append(s.Shape[:0], e.Shape...)
	s.RMS, s.AbsMax, s.Mean = e.RMS, e.AbsMax, e.Mean
	if e.NonFinite > 0 {
		if s.NonFiniteRecords == 0 {
			s.FirstNonFiniteAt = line
		}
		s.NonFiniteRecords++
		s.NonFiniteElements = trace.SatAdd(s.NonFiniteElements, e.NonFinite)
	}
}

// build assembles the report once the whole trace is read.
func (b *reportBuilder) build(a *health.Checker, lt *health.Lifetimes) *Report {
	r := &Report{}
	var measured *health.Span
	for _, s := range a.Spans {
		if s.Measured {
			measured = s
			break
		}
	}
	if measured != nil {
		r.MeasuredRegion = &Region{SpanID: measured.ID, Name: measured.Name, StartNS: measured.Start, DurationNS: measured.Dur, Closed: measured.Closed, TracerNS: a.MeasuredTracerNS}
		if a.Terminal != nil {
			r.MeasuredRegion.SessionTracerNS = a.Terminal.TracerNS
			r.MeasuredRegion.SessionEstimatedNS = a.Terminal.EstimatedNS
		}
	}
	share := func(ns uint64) float64 {
		if measured == nil || !measured.Closed || measured.Dur == 0 {
			return 0
		}
		return float64(ns) / float64(measured.Dur)
	}

	r.Spans = b.spanStats(a, share, measured)
	for _, name := range b.opOrder {
		acc := b.ops[name]
		st := statsOf(name, &acc.d, share)
		st.SelfNS = st.TotalNS // ops are leaves
		st.InputBytes, st.OutputBytes = acc.in, acc.out
		if acc.d.n > 0 {
			st.BytesPerOp = float64(trace.SatAdd(acc.in, acc.out)) / float64(acc.d.n)
		}
		r.Ops = append(r.Ops, st)
	}
	sortStats(r.Ops)

	r.Memory = b.memoryReport(a, lt)
	r.Device = b.deviceReport(measured)
	r.Device.Kernels, r.Device.BySpan = b.kernelReport(a)
	r.Gradients = gradientReport(a.Gradients)
	r.TensorStats = []TensorSummary{}
	for _, l := range b.labels {
		r.TensorStats = append(r.TensorStats, *b.stats[l])
	}
	r.Overhead = overheadAnalysis(a, measured, r.Device)
	return r
}

func statsOf(name string, d *dist, share func(uint64) float64) NameStats {
	return NameStats{
		Name: name, Count: d.n, TotalNS: d.sum, MeanNS: d.mean(),
		P50NS: d.quantile(0.5), P95NS: d.quantile(0.95), MaxNS: d.max,
		Share: share(d.sum), Approximate: d.approximate(),
	}
}

func sortStats(s []NameStats) {
	sort.SliceStable(s, func(i, j int) bool { return s[i].TotalNS > s[j].TotalNS })
}

// spanStats groups closed spans by name. Self time is the span's duration
// less its closed direct children's.
func (b *reportBuilder) spanStats(a *health.Checker, share func(uint64) float64, measured *health.Span) []NameStats {
	childDur := make(map[*health.Span]uint64, len(a.Spans)) // closed direct children, summed
	for _, s := range a.Spans {
		if s.Closed && s.HasParent {
			if p, ok := a.SpanByID[s.Parent]; ok {
				childDur[p] = trace.SatAdd(childDur[p], s.Dur)
			}
		}
	}
	type acc struct {
		d          dist
		self, open uint64
	}
	byName := map[string]*acc{}
	var order []string
	for _, s := range a.Spans {
		x, ok := byName[s.Name]
		if !ok {
			x = &acc{}
			byName[s.Name] = x
			order = append(order, s.Name)
		}
		if !s.Closed {
			x.open++
			continue
		}
		x.d.add(s.Dur)
		x.self = trace.SatAdd(x.self, s.Dur-min(s.Dur, childDur[s]))
	}
	enclosing := enclosingNames(a, measured)
	out := []NameStats{}
	for _, name := range order {
		x := byName[name]
		st := statsOf(name, &x.d, share)
		st.SelfNS, st.Open = x.self, x.open
		if enclosing[name] == x.d.n+x.open {
			st.Encloses, st.Share = true, 0
		}
		out = append(out, st)
	}
	sortStats(out)
	return out
}

// enclosingNames counts, per span name, the spans that are ancestors of the
// measured span (none when it is nil).
func enclosingNames(a *health.Checker, measured *health.Span) map[string]uint64 {
	out := map[string]uint64{}
	// At most one step per span: a parent cycle (an invalid trace) ends the walk.
	for s, steps := measured, 0; s != nil && s.HasParent && steps < len(a.Spans); steps++ {
		p, ok := a.SpanByID[s.Parent]
		if !ok {
			break
		}
		out[p.Name]++
		s = p
	}
	return out
}

func (b *reportBuilder) memoryReport(a *health.Checker, lt *health.Lifetimes) MemoryReport {
	m := MemoryReport{Devices: []DeviceMemoryStat{}}
	if lt != nil {
		m.Allocations, m.Frees, m.TotalAllocatedBytes = lt.Allocs, lt.Frees, lt.TotalAllocated
		m.RetainedStorages = len(lt.Live)
		if lt.Peak != nil {
			p := *lt.Peak
			if s, ok := a.SpanByID[p.SpanID]; ok {
				p.SpanName = s.Name
			}
			m.Peak = &p
		}
	}
	for _, s := range b.devMem {
		m.Devices = append(m.Devices, *s)
	}
	sort.Slice(m.Devices, func(i, j int) bool { return m.Devices[i].Device < m.Devices[j].Device })
	return m
}

// kernelReport ranks device time by interval name and by launching span name.
func (b *reportBuilder) kernelReport(a *health.Checker) ([]KernelStat, []SpanDeviceStat) {
	share := func(ns uint64) float64 {
		if b.allNS == 0 {
			return 0
		}
		return float64(ns) / float64(b.allNS)
	}
	kernels := make([]KernelStat, 0, len(b.kernels))
	for name, k := range b.kernels {
		if name == "" {
			name = "(unnamed)"
		}
		kernels = append(kernels, KernelStat{Name: name, Count: k.count, TotalNS: k.total,
			MeanNS: float64(k.total) / float64(k.count), MaxNS: k.max, Share: share(k.total)})
	}
	sort.Slice(kernels, func(i, j int) bool {
		if kernels[i].TotalNS != kernels[j].TotalNS {
			return kernels[i].TotalNS > kernels[j].TotalNS
		}
		return kernels[i].Name < kernels[j].Name
	})
	if len(kernels) > MaxKernelRows {
		rest := KernelStat{Name: fmt.Sprintf("(other %d names)", len(kernels)-MaxKernelRows+1)}
		for _, k := range kernels[MaxKernelRows-1:] {
			rest.Count += k.Count
			rest.TotalNS = trace.SatAdd(rest.TotalNS, k.TotalNS)
			rest.MaxNS = max(rest.MaxNS, k.MaxNS)
		}
		rest.MeanNS, rest.Share = float64(rest.TotalNS)/float64(rest.Count), share(rest.TotalNS)
		kernels = append(kernels[:MaxKernelRows-1], rest)
	}
	byName := map[string]*SpanDeviceStat{}
	for id, k := range b.bySpan {
		name := "(unknown span " + id + ")"
		if s, ok := a.SpanByID[id]; ok {
			name = s.Name
		}
		st, ok := byName[name]
		if !ok {
			st = &SpanDeviceStat{Name: name}
			byName[name] = st
		}
		st.Kernels += k.count
		st.TotalNS = trace.SatAdd(st.TotalNS, k.total)
	}
	spans := make([]SpanDeviceStat, 0, len(byName))
	for _, st := range byName {
		st.Share = share(st.TotalNS)
		spans = append(spans, *st)
	}
	sort.Slice(spans, func(i, j int) bool {
		if spans[i].TotalNS != spans[j].TotalNS {
			return spans[i].TotalNS > spans[j].TotalNS
		}
		return spans[i].Name < spans[j].Name
	})
	return kernels, spans
}

func (b *reportBuilder) deviceReport(measured *health.Span) DeviceReport {
	d := DeviceReport{Streams: []StreamStat{}, Devices: []DeviceBusy{}}
	for _, st := range b.streams {
		s := StreamStat{Device: st.device, ClockID: st.clock, StreamID: st.stream, Kernels: st.kernels,
			KernelNS: st.kernelNS, BusyNS: st.blocks.total()}
		if st.kernels > 0 {
			s.MeanKernelNS = float64(st.kernelNS) / float64(st.kernels)
		}
		d.Streams = append(d.Streams, s)
	}
	sort.Slice(d.Streams, func(i, j int) bool {
		x, y := d.Streams[i], d.Streams[j]
		if x.Device != y.Device {
			return x.Device < y.Device
		}
		if x.ClockID != y.ClockID {
			return x.ClockID < y.ClockID
		}
		return x.StreamID < y.StreamID
	})
	for _, dv := range b.devices {
		busy := DeviceBusy{Device: dv.device, ClockID: dv.clock, Kernels: dv.kernels, BusyNS: dv.blocks.total()}
		// Only host-clock intervals can be placed against the host-timed region.
		if dv.clock == trace.HostClock && measured != nil && measured.Closed && measured.Dur > 0 {
			g := dv.blocks.window(measured.Start, measured.End())
			busy.InRegion = true
			busy.RegionBusyNS, busy.IdleNS, busy.IdleGaps = g.busy, g.idle, g.count
			busy.LargestGapNS, busy.LargestGapAt = g.largest, g.largestAt
			busy.Utilization = float64(g.busy) / float64(measured.Dur)
		}
		d.Devices = append(d.Devices, busy)
	}
	sort.Slice(d.Devices, func(i, j int) bool {
		x, y := d.Devices[i], d.Devices[j]
		if x.Device != y.Device {
			return x.Device < y.Device
		}
		return x.ClockID < y.ClockID
	})
	return d
}

func gradientReport(g *health.GradientState) GradientReport {
	r := GradientReport{Flagged: []GradientFact{}, All: []GradientFact{}}
	for _, k := range g.Order {
		e := g.ByKey[k]
		f := GradientFact{Root: k.Root, Key: k.Key, State: traceformat.GradientStates[e.State], Line: e.Line}
		if e.HasNorm && !math.IsNaN(e.Norm) {
			n := e.Norm
			f.Norm = &n
		}
		r.Total++
		switch e.State {
		case trace.GradPresent:
			r.Present++
		case trace.GradMissing:
			r.Missing++
		case trace.GradZero:
			r.Zero++
		case trace.GradNonFinite:
			r.NonFinite++
		}
		if e.State != trace.GradPresent {
			r.Flagged = append(r.Flagged, f)
		}
		r.All = append(r.All, f)
	}
	return r
}
