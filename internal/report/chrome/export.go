package chrome

import (
	"fmt"
	"hash/maphash"
	"io"
	"os"
	"sort"
	"strconv"

	"github.com/candle-trace/candle-trace/internal/report/trace"
	"github.com/candle-trace/candle-trace/internal/traceformat"
)

// ChromeOptions place one trace in a Chrome Trace Event document.
type ChromeOptions struct {
	// MaxLineBytes caps one line (DefaultMaxLineBytes when 0).
	MaxLineBytes int
	// HostPID is the process of the host spans and ops; 0 means
	// meta.process.pid, or 1 when the trace does not say.
	HostPID int64
	// DevicePIDBase is the first process id given to a device (one process
	// per device); 0 means DefaultDevicePIDBase.
	DevicePIDBase int64
	// OffsetNS is added to every timestamp (merge aligns ranks with it).
	OffsetNS uint64
	// Label prefixes process names (merge: "rank 1: ").
	Label string
	// SortIndex orders this trace's processes: the host gets SortIndex,
	// devices SortIndex+1+i.
	SortIndex int
}

// DefaultDevicePIDBase is above Linux's largest pid (2^22), so a device
// process never takes the id of a real one.
const DefaultDevicePIDBase = 1 << 24

// UntrackedTID is the synthetic thread of spans that carry no tid.
const UntrackedTID = 0

// ExportResult says what an export read and wrote.
type ExportResult struct {
	Meta         *trace.Meta
	Lines        int
	Events       int // trace events written for this trace
	Spans        int
	OpenSpans    int // exported up to the last timestamp, marked "open"
	LastNS       uint64
	Incomplete   bool         // no terminal record
	CutLine      int          // the cut last line of a partial trace
	Stop         *trace.Issue // the parse problem that ended the read early
	DroppedFlows int          // edges whose endpoints never appeared
}

// ExportChromeFile exports the trace at path; see ExportChrome.
func ExportChromeFile(path string, w *ChromeWriter, opts ChromeOptions) (*ExportResult, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ExportChrome(f, w, opts)
}

// ExportChrome reads one trace in a single pass and writes it as Chrome
// trace events: spans and ops as complete ("X") events on their thread,
// device intervals on one thread per stream of a process per device,
// logical live bytes and device memory as counters ("C"), call and data
// edges as flows ("s"/"f"), and process and thread names ("M"). It keeps
// one small record per span, the live storages, and the producing op of
// each tensor (for data-edge flows) — never the events.
//
// It does not judge the trace (validate does): it stops only where the
// file stops being readable, and a partial trace exports as far as it
// goes, open spans ending at the last timestamp seen. The error is for I/O
// and for a file without a meta record.
func ExportChrome(r io.Reader, w *ChromeWriter, opts ChromeOptions) (*ExportResult, error) {
	x := newExporter(w, opts)
	st := trace.NewStream(r, opts.MaxLineBytes)
	for {
		k, ok := st.Next()
		if !ok {
			break
		}
		if x.meta == nil && k != trace.KindMeta {
			return nil, fmt.Errorf("line %d: the first record is %s; a trace starts with a meta record", st.Line, k)
		}
		x.event(&st.Decoded, k)
	}
	if st.Err != nil {
		return nil, st.Err
	}
	if x.meta == nil {
		if st.Stop != nil {
			return nil, fmt.Errorf("line %d: %s: %s", st.Stop.Line, st.Stop.Code, st.Stop.Message)
		}
		return nil, fmt.Errorf("no meta record: not a candle-graph trace")
	}
	x.finish()
	res := &x.res
	res.Meta, res.Lines, res.Stop, res.CutLine = x.meta, st.Lines(), st.Stop, st.CutLine
	res.Incomplete = !x.terminal
	res.Events = w.events - x.startEvents
	res.LastNS = x.last
	return res, w.err
}

// xspan is what an export keeps of a span until the end: enough to place
// it, its ops and the flows that name it.
type xspan struct {
	id, name   string
	start      uint64
	tid        uint64
	kind, step int8
	measured   bool
	closed     bool
}

type opPos struct {
	start uint64
	tid   uint64
}

// producedBy is an op's output (hashed) and where the op is.
type producedBy struct {
	output uint64
	at     opPos
}

type pendingFlow struct {
	call     bool
	from, to string
}

type exporter struct {
	w           *ChromeWriter
	opts        ChromeOptions
	meta        *trace.Meta
	startEvents int
	res         ExportResult

	hostPID   int64
	spans     map[string]*xspan
	order     []*xspan // arrival order, for open spans at the end
	names     map[string]string
	threads   map[uint64]bool
	devices   map[string]int64  // device -> pid
	streams   map[string]uint64 // device \0 stream -> tid
	keyBuf    []byte
	storages  map[string]uint64  // device \0 storage -> bytes
	liveBytes map[string]*uint64 // device -> live logical bytes
	// The device of the last memory record, its live bytes and its process
	// (-1 until a counter asks): memory records come in long runs on one
	// device, and two small-map lookups per record cost more than its counter.
	memDev    []byte
	memLive   *uint64
	memPID    int64
	seed      maphash.Seed
	producers map[uint64]opPos // output tensor -> the op that wrote it; nil until a data edge asks
	outputs   []producedBy     // the ops' outputs in file order while producers is nil
	pending   []pendingFlow
	last      uint64
	terminal  bool
}

func newExporter(w *ChromeWriter, opts ChromeOptions) *exporter {
	if opts.DevicePIDBase == 0 {
		opts.DevicePIDBase = DefaultDevicePIDBase
	}
	return &exporter{
		w: w, opts: opts, startEvents: w.events,
		spans: map[string]*xspan{}, names: map[string]string{}, threads: map[uint64]bool{},
		devices: map[string]int64{}, streams: map[string]uint64{},
		storages: map[string]uint64{}, liveBytes: map[string]*uint64{},
		seed: maphash.MakeSeed(),
	}
}

func (x *exporter) ts(ns uint64) uint64 { return trace.SatAdd(ns, x.opts.OffsetNS) }

func (x *exporter) seen(ns uint64) {
	x.last = max(x.last, ns)
}

func (x *exporter) intern(b []byte) string {
	if s, ok := x.names[string(b)]; ok {
		return s
	}
	s := string(b)
	x.names[s] = s
	return s
}

func (x *exporter) event(d *trace.Decoder, k trace.Kind) {
	switch k {
	case trace.KindMeta:
		if x.meta == nil {
			x.onMeta(d.Meta)
		}
	case trace.KindSpanStart:
		x.onSpanStart(&d.SpanStart)
	case trace.KindSpanEnd:
		x.onSpanEnd(&d.SpanEnd)
	case trace.KindOp:
		x.onOp(&d.Op)
	case trace.KindMemory:
		x.onMemory(&d.Memory)
	case trace.KindDeviceMemory:
		x.onDeviceMemory(&d.DeviceMemory)
	case trace.KindDeviceInterval:
		x.onInterval(&d.DeviceInterval)
	case trace.KindEdge:
		x.onEdge(&d.Edge)
	case trace.KindTerminal:
		x.terminal = true
		x.seen(d.Terminal.Timestamp)
	}
}

func (x *exporter) onMeta(m *trace.Meta) {
	x.meta = m
	x.hostPID = x.opts.HostPID
	if x.hostPID == 0 {
		x.hostPID = 1
		if pid, err := strconv.ParseInt(m.Process["pid"], 10, 64); err == nil && pid > 0 {
			x.hostPID = pid
		}
	}
	name := fmt.Sprintf("%s%s (pid %s)", x.opts.Label, m.Entrypoint, orDash(m.Process["pid"]))
	if h := m.Process["hostname"]; h != "" {
		name = fmt.Sprintf("%s%s (pid %s on %s)", x.opts.Label, m.Entrypoint, orDash(m.Process["pid"]), h)
	}
	x.w.processName(x.hostPID, name, x.opts.SortIndex)
}

func orDash(s string) string {
	if s == "" {
		return "?"
	}
	return s
}

func (x *exporter) thread(tid uint64) {
	if x.threads[tid] {
		return
	}
	x.threads[tid] = true
	name := "thread " + strconv.FormatUint(tid, 10)
	if tid == UntrackedTID {
		name = "spans without tid"
	}
	x.w.threadName(x.hostPID, tid, name)
}

func (x *exporter) onSpanStart(e *trace.SpanStartEvent) {
	x.seen(e.Start)
	if _, dup := x.spans[string(e.ID)]; dup {
		return // a parse error for candle-graph; keep the first
	}
	s := &xspan{id: string(e.ID), name: x.intern(e.Name), start: e.Start, kind: int8(e.SpanKind), step: int8(e.Step), measured: e.Measured}
	if e.HasTID {
		s.tid = e.TID
	}
	x.spans[s.id] = s
	x.order = append(x.order, s)
	x.res.Spans++
}

func (x *exporter) onSpanEnd(e *trace.SpanEndEvent) {
	s, ok := x.spans[string(e.ID)]
	if !ok || s.closed {
		return
	}
	s.closed = true
	x.seen(trace.SatAdd(s.start, e.Duration))
	x.writeSpan(s, e.Duration, false)
}

func (x *exporter) writeSpan(s *xspan, dur uint64, open bool) {
	x.thread(s.tid)
	b := x.w.event("X", []byte(s.name), "span", x.ts(s.start), x.hostPID, s.tid)
	b = append(b, `,"dur":`...)
	b = appendMicros(b, dur)
	b = append(b, `,"args":{"id":`...)
	b = appendJSONString(b, s.id)
	b = append(b, `,"span_kind":"`...)
	b = append(b, traceformat.SpanKinds[s.kind]...)
	b = append(b, '"')
	if s.step >= 0 {
		b = append(b, `,"step":"`...)
		b = append(b, traceformat.Steps[s.step]...)
		b = append(b, '"')
	}
	if s.measured {
		b = append(b, `,"measured":true`...)
	}
	if open {
		b = append(b, `,"open":true,"note":"not closed: ends at the last timestamp in the trace"`...)
	}
	x.w.done(append(b, '}'))
}

func (x *exporter) onOp(e *trace.OpEvent) {
	x.seen(trace.SatAdd(e.Timestamp, e.Duration))
	tid := uint64(UntrackedTID)
	if s, ok := x.spans[string(e.SpanID)]; ok {
		tid = s.tid
	}
	x.thread(tid)
	b := x.w.event("X", e.OpName, "op", x.ts(e.Timestamp), x.hostPID, tid)
	b = append(b, `,"dur":`...)
	b = appendMicros(b, e.Duration)
	b = append(b, `,"args":{"span_id":`...)
	b = appendJSONString(b, e.SpanID)
	b = append(b, `,"dtype":`...)
	b = appendJSONString(b, e.Dtype)
	b = append(b, `,"device":`...)
	b = appendJSONString(b, e.Device)
	b = append(b, `,"input_dense_bytes":`...)
	b = strconv.AppendUint(b, e.InBytes, 10)
	if out, ok := trace.DenseBytes(e.OutBytes, e.HasOutBytes, e.Shape, e.Dtype); ok {
		b = append(b, `,"output_dense_bytes":`...)
		b = strconv.AppendUint(b, out, 10)
	}
	if e.HasOutput {
		b = append(b, `,"output":`...)
		b = appendJSONString(b, e.Output)
		x.produced(maphash.Bytes(x.seed, e.Output), opPos{start: e.Timestamp, tid: tid})
	}
	x.w.done(append(b, '}'))
}

// produced notes the op that wrote an output. Most traces have no data
// edges: until one asks (producer), the outputs are listed, not hashed
// into a map, which would cost more than decoding the op.
func (x *exporter) produced(output uint64, at opPos) {
	if x.producers == nil {
		x.outputs = append(x.outputs, producedBy{output, at})
		return
	}
	x.producers[output] = at
}

// producer is the op that last wrote an output, as of now.
func (x *exporter) producer(output []byte) (opPos, bool) {
	if x.producers == nil {
		x.producers = make(map[uint64]opPos, len(x.outputs))
		for _, p := range x.outputs {
			x.producers[p.output] = p.at
		}
		x.outputs = nil
	}
	at, ok := x.producers[maphash.Bytes(x.seed, output)]
	return at, ok
}

// device returns the process of a device, naming it on first use.
func (x *exporter) device(name []byte) int64 {
	if pid, ok := x.devices[string(name)]; ok {
		return pid
	}
	i := len(x.devices)
	pid := x.opts.DevicePIDBase + int64(i)
	x.devices[string(name)] = pid
	x.w.processName(pid, fmt.Sprintf("%sdevice %s", x.opts.Label, name), x.opts.SortIndex+1+i)
	return pid
}

func (x *exporter) onInterval(e *trace.DeviceIntervalEvent) {
	pid := x.device(e.Device)
	x.keyBuf = append(append(append(x.keyBuf[:0], e.Device...), 0), e.StreamID...)
	tid, ok := x.streams[string(x.keyBuf)]
	if !ok {
		tid = uint64(len(x.streams) + 1)
		x.streams[string(x.keyBuf)] = tid
		name := fmt.Sprintf("stream %s (%s)", e.StreamID, e.Backend)
		if string(e.ClockID) != trace.HostClock {
			name += fmt.Sprintf(" [clock %s: not aligned with the host]", e.ClockID)
		}
		x.w.threadName(pid, tid, name)
	}
	if string(e.ClockID) == trace.HostClock {
		x.seen(trace.SatAdd(e.Start, e.Duration))
	}
	name := e.Name
	if len(name) == 0 {
		name = e.Backend
	}
	b := x.w.event("X", name, "device", x.ts(e.Start), pid, tid)
	b = append(b, `,"dur":`...)
	b = appendMicros(b, e.Duration)
	b = append(b, `,"args":{"span_id":`...)
	b = appendJSONString(b, e.SpanID)
	b = append(b, `,"stream_id":`...)
	b = appendJSONString(b, e.StreamID)
	b = append(b, `,"clock_id":`...)
	b = appendJSONString(b, e.ClockID)
	if e.HasCorrelation {
		b = append(b, `,"correlation_id":`...)
		b = strconv.AppendUint(b, e.Correlation, 10)
	}
	x.w.done(append(b, '}'))
}

// onMemory keeps live logical bytes per device in file order (writers emit
// memory records in time order) and writes the counter.
func (x *exporter) onMemory(e *trace.MemoryEvent) {
	x.seen(e.Timestamp)
	x.keyBuf = append(append(append(x.keyBuf[:0], e.Device...), 0), e.StorageID...)
	live := x.liveOf(e.Device)
	bytes, isLive := x.storages[string(x.keyBuf)]
	switch {
	case e.Action == trace.ActionAlloc && !isLive:
		x.storages[string(x.keyBuf)] = e.Bytes
		*live = trace.SatAdd(*live, e.Bytes)
	case e.Action == trace.ActionFree && isLive:
		delete(x.storages, string(x.keyBuf))
		*live -= min(*live, bytes)
	default:
		return // an alias or an unpaired free: the live total is unchanged
	}
	if x.memPID < 0 {
		x.memPID = x.device(e.Device)
	}
	x.counter(x.memPID, "live logical bytes", e.Timestamp, *live)
}

// liveOf is the live logical bytes of a device, and makes it the memory
// records' current device.
func (x *exporter) liveOf(dev []byte) *uint64 {
	if x.memLive != nil && string(dev) == string(x.memDev) {
		return x.memLive
	}
	live, ok := x.liveBytes[string(dev)]
	if !ok {
		live = new(uint64)
		x.liveBytes[string(dev)] = live
	}
	x.memDev, x.memLive, x.memPID = append(x.memDev[:0], dev...), live, -1
	return live
}

func (x *exporter) counter(pid int64, name string, ns, value uint64) {
	b := x.w.event("C", []byte(name), "memory", x.ts(ns), pid, 0)
	b = append(b, `,"args":{"bytes":`...)
	b = strconv.AppendUint(b, value, 10)
	x.w.done(append(b, '}'))
}

func (x *exporter) onDeviceMemory(e *trace.DeviceMemoryEvent) {
	x.seen(e.Timestamp)
	pid := x.device(e.Device)
	if e.HasUsed {
		x.counter(pid, "device used bytes", e.Timestamp, e.Used)
	}
	if e.HasReserved {
		x.counter(pid, "device reserved bytes", e.Timestamp, e.Reserved)
	}
}

func (x *exporter) onEdge(e *trace.EdgeEvent) {
	if !x.flow(e.Call, e.From, e.To) {
		x.pending = append(x.pending, pendingFlow{call: e.Call, from: string(e.From), to: string(e.To)})
	}
}

// flow writes one edge as a flow from the slice of its source to the slice
// of its target: call edges from the caller span to the callee, data edges
// from the op that wrote the source tensor to the op that wrote the target.
// It returns false while an endpoint is unknown.
func (x *exporter) flow(call bool, from, to []byte) bool {
	var a, b opPos
	name, cat := "data", "data_edge"
	if call {
		name, cat = "call", "call_edge"
		f, ok1 := x.spans[string(from)]
		t, ok2 := x.spans[string(to)]
		if !ok1 || !ok2 {
			return false
		}
		a, b = opPos{f.start, f.tid}, opPos{t.start, t.tid}
	} else {
		var ok1, ok2 bool
		a, ok1 = x.producer(from)
		b, ok2 = x.producer(to)
		if !ok1 || !ok2 {
			return false
		}
	}
	x.w.flowID++
	id := x.w.flowID
	for _, end := range []struct {
		ph string
		at opPos
	}{{"s", a}, {"f", b}} {
		x.thread(end.at.tid)
		ev := x.w.event(end.ph, []byte(name), cat, x.ts(end.at.start), x.hostPID, end.at.tid)
		ev = append(ev, `,"id":`...)
		ev = strconv.AppendUint(ev, id, 10)
		if end.ph == "f" {
			ev = append(ev, `,"bp":"e"`...)
		}
		x.w.done(ev)
	}
	return true
}

// finish writes what needs the whole trace: flows whose endpoints came
// late, and spans never closed.
func (x *exporter) finish() {
	for _, p := range x.pending {
		if !x.flow(p.call, []byte(p.from), []byte(p.to)) {
			x.res.DroppedFlows++
		}
	}
	for _, s := range x.order {
		if !s.closed {
			x.res.OpenSpans++
			x.writeSpan(s, x.last-min(x.last, s.start), true)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
