package report

import (
	"fmt"
	"hash/maphash"
	"io"
	"os"
	"sort"
	"strconv"
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
	Meta         *Meta
	Lines        int
	Events       int // trace events written for this trace
	Spans        int
	OpenSpans    int // exported up to the last timestamp, marked "open"
	LastNS       uint64
	Incomplete   bool   // no terminal record
	CutLine      int    // the cut last line of a partial trace
	Stop         *Issue // the parse problem that ended the read early
	DroppedFlows int    // edges whose endpoints never appeared
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
	st := newEventStream(r, opts.MaxLineBytes)
	for {
		k, ok := st.next()
		if !ok {
			break
		}
		if x.meta == nil && k != kindMeta {
			return nil, fmt.Errorf("line %d: the first record is %s; a trace starts with a meta record", st.line, k)
		}
		x.event(&st.d, k)
	}
	if st.err != nil {
		return nil, st.err
	}
	if x.meta == nil {
		if st.stop != nil {
			return nil, fmt.Errorf("line %d: %s: %s", st.stop.Line, st.stop.Code, st.stop.Message)
		}
		return nil, fmt.Errorf("no meta record: not a candle-graph trace")
	}
	x.finish()
	res := &x.res
	res.Meta, res.Lines, res.Stop, res.CutLine = x.meta, st.lines(), st.stop, st.cutLine
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

type pendingFlow struct {
	call     bool
	from, to string
}

type exporter struct {
	w           *ChromeWriter
	opts        ChromeOptions
	meta        *Meta
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
	seed      maphash.Seed
	producers map[uint64]opPos // output tensor -> the op that wrote it
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
		seed: maphash.MakeSeed(), producers: map[uint64]opPos{},
	}
}

func (x *exporter) ts(ns uint64) uint64 { return satAdd(ns, x.opts.OffsetNS) }

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

func (x *exporter) event(d *lineDecoder, k eventKind) {
	switch k {
	case kindMeta:
		if x.meta == nil {
			x.onMeta(d.meta)
		}
	case kindSpanStart:
		x.onSpanStart(&d.spanStart)
	case kindSpanEnd:
		x.onSpanEnd(&d.spanEnd)
	case kindOp:
		x.onOp(&d.op)
	case kindMemory:
		x.onMemory(&d.memory)
	case kindDeviceMemory:
		x.onDeviceMemory(&d.devMem)
	case kindDeviceInterval:
		x.onInterval(&d.interval)
	case kindEdge:
		x.onEdge(&d.edge)
	case kindTerminal:
		x.terminal = true
		x.seen(d.terminal.timestamp)
	}
}

func (x *exporter) onMeta(m *Meta) {
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

func (x *exporter) onSpanStart(e *spanStartEvent) {
	x.seen(e.start)
	if _, dup := x.spans[string(e.id)]; dup {
		return // a parse error for candle-graph; keep the first
	}
	s := &xspan{id: string(e.id), name: x.intern(e.name), start: e.start, kind: int8(e.spanKind), step: int8(e.step), measured: e.measured}
	if e.hasTID {
		s.tid = e.tid
	}
	x.spans[s.id] = s
	x.order = append(x.order, s)
	x.res.Spans++
}

func (x *exporter) onSpanEnd(e *spanEndEvent) {
	s, ok := x.spans[string(e.id)]
	if !ok || s.closed {
		return
	}
	s.closed = true
	x.seen(satAdd(s.start, e.duration))
	x.writeSpan(s, e.duration, false)
}

func (x *exporter) writeSpan(s *xspan, dur uint64, open bool) {
	x.thread(s.tid)
	b := x.w.event("X", []byte(s.name), "span", x.ts(s.start), x.hostPID, s.tid)
	b = append(b, `,"dur":`...)
	b = appendMicros(b, dur)
	b = append(b, `,"args":{"id":`...)
	b = appendJSONString(b, s.id)
	b = append(b, `,"span_kind":"`...)
	b = append(b, spanKindNames[s.kind]...)
	b = append(b, '"')
	if s.step >= 0 {
		b = append(b, `,"step":"`...)
		b = append(b, stepNames[s.step]...)
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

func (x *exporter) onOp(e *opEvent) {
	x.seen(satAdd(e.timestamp, e.duration))
	tid := uint64(UntrackedTID)
	if s, ok := x.spans[string(e.spanID)]; ok {
		tid = s.tid
	}
	x.thread(tid)
	b := x.w.event("X", e.opName, "op", x.ts(e.timestamp), x.hostPID, tid)
	b = append(b, `,"dur":`...)
	b = appendMicros(b, e.duration)
	b = append(b, `,"args":{"span_id":`...)
	b = appendJSONString(b, e.spanID)
	b = append(b, `,"dtype":`...)
	b = appendJSONString(b, e.dtype)
	b = append(b, `,"device":`...)
	b = appendJSONString(b, e.device)
	b = append(b, `,"input_dense_bytes":`...)
	b = strconv.AppendUint(b, e.inBytes, 10)
	if out, ok := denseBytes(e.outBytes, e.hasOutBytes, e.shape, e.dtype); ok {
		b = append(b, `,"output_dense_bytes":`...)
		b = strconv.AppendUint(b, out, 10)
	}
	if e.hasOutput {
		b = append(b, `,"output":`...)
		b = appendJSONString(b, e.output)
		x.producers[maphash.Bytes(x.seed, e.output)] = opPos{start: e.timestamp, tid: tid}
	}
	x.w.done(append(b, '}'))
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

func (x *exporter) onInterval(e *deviceIntervalEvent) {
	pid := x.device(e.device)
	x.keyBuf = append(append(append(x.keyBuf[:0], e.device...), 0), e.streamID...)
	tid, ok := x.streams[string(x.keyBuf)]
	if !ok {
		tid = uint64(len(x.streams) + 1)
		x.streams[string(x.keyBuf)] = tid
		name := fmt.Sprintf("stream %s (%s)", e.streamID, e.backend)
		if string(e.clockID) != HostClock {
			name += fmt.Sprintf(" [clock %s: not aligned with the host]", e.clockID)
		}
		x.w.threadName(pid, tid, name)
	}
	if string(e.clockID) == HostClock {
		x.seen(satAdd(e.start, e.duration))
	}
	name := e.name
	if len(name) == 0 {
		name = e.backend
	}
	b := x.w.event("X", name, "device", x.ts(e.start), pid, tid)
	b = append(b, `,"dur":`...)
	b = appendMicros(b, e.duration)
	b = append(b, `,"args":{"span_id":`...)
	b = appendJSONString(b, e.spanID)
	b = append(b, `,"stream_id":`...)
	b = appendJSONString(b, e.streamID)
	b = append(b, `,"clock_id":`...)
	b = appendJSONString(b, e.clockID)
	if e.hasCorrelation {
		b = append(b, `,"correlation_id":`...)
		b = strconv.AppendUint(b, e.correlation, 10)
	}
	x.w.done(append(b, '}'))
}

// onMemory keeps live logical bytes per device in file order (writers emit
// memory records in time order) and writes the counter.
func (x *exporter) onMemory(e *memoryEvent) {
	x.seen(e.timestamp)
	x.keyBuf = append(append(append(x.keyBuf[:0], e.device...), 0), e.storageID...)
	live, ok := x.liveBytes[string(e.device)]
	if !ok {
		live = new(uint64)
		x.liveBytes[string(e.device)] = live
	}
	bytes, isLive := x.storages[string(x.keyBuf)]
	switch {
	case e.action == actionAlloc && !isLive:
		x.storages[string(x.keyBuf)] = e.bytes
		*live = satAdd(*live, e.bytes)
	case e.action == actionFree && isLive:
		delete(x.storages, string(x.keyBuf))
		*live -= min(*live, bytes)
	default:
		return // an alias or an unpaired free: the live total is unchanged
	}
	x.counter(x.device(e.device), "live logical bytes", e.timestamp, *live)
}

func (x *exporter) counter(pid int64, name string, ns, value uint64) {
	b := x.w.event("C", []byte(name), "memory", x.ts(ns), pid, 0)
	b = append(b, `,"args":{"bytes":`...)
	b = strconv.AppendUint(b, value, 10)
	x.w.done(append(b, '}'))
}

func (x *exporter) onDeviceMemory(e *deviceMemoryEvent) {
	x.seen(e.timestamp)
	pid := x.device(e.device)
	if e.hasUsed {
		x.counter(pid, "device used bytes", e.timestamp, e.used)
	}
	if e.hasReserved {
		x.counter(pid, "device reserved bytes", e.timestamp, e.reserved)
	}
}

func (x *exporter) onEdge(e *edgeEvent) {
	if !x.flow(e.call, e.from, e.to) {
		x.pending = append(x.pending, pendingFlow{call: e.call, from: string(e.from), to: string(e.to)})
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
		a, ok1 = x.producers[maphash.Bytes(x.seed, from)]
		b, ok2 = x.producers[maphash.Bytes(x.seed, to)]
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
