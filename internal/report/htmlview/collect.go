package htmlview

import (
	"fmt"
	"io"
	"sort"
	"unicode/utf8"

	"github.com/candle-trace/candle-trace/internal/report/trace"
	"github.com/candle-trace/candle-trace/internal/traceformat"
)

// Limits bound what the page carries, so that a huge trace still gives a
// file a browser opens: past a limit records are counted, not kept, and the
// page says how many were left out.
type Limits struct {
	Spans, Ops, Intervals, MemoryEvents int
	MemoryPoints                        int // points of the drawn memory curve
	DeviceSamples                       int // device-memory samples kept, all devices
	PeakStorages                        int // rows of the live-at-peak table
	GraphOps                            int // ops beyond which the page draws no execution graph
}

// DefaultLimits keep the embedded data of a trace of any size to a few tens
// of megabytes.
var DefaultLimits = Limits{Spans: 200_000, Ops: 300_000, Intervals: 200_000, MemoryEvents: 1_000_000, MemoryPoints: 4000, DeviceSamples: 200_000, PeakStorages: 100, GraphOps: 20_000}

// collector keeps what the page draws beyond the report's summaries: each
// span's place on its thread, the ops inside them, host-clock device
// intervals and the memory records (to draw the curve and list the live
// storages at the peak). It sees the records the checker accepted.
//
// Rows are kept as small structs (a page of 300,000 ops is 10 MB, not the
// 22 MB a slice per row costs, and the CLI's soft heap limit leaves the
// collector little room beside the checker's state) and turned into the
// page's number arrays once, at the end. Past a limit, rows outside the
// measured region give way first (see rowStore), so its detail stays whole.
type collector struct {
	lim   Limits
	names map[string]int
	tl    Timeline

	spans     rowStore[spanRow]
	ops       rowStore[opRow]
	intervals rowStore[intervalRow]
	spanInfo  map[string]spanInfo // span id -> what its ops and children need
	spansSeen uint32
	windows   []window       // the measured spans' time, to place ops and intervals
	threads   map[uint64]int // tid -> index into tl.Threads
	streams   map[string]int // device \0 stream -> index into tl.Streams
	latest    uint64         // latest timestamp seen: where open spans end
	curve     *memCurve      // the memory curve, applied as the records stream by
	buffer    bool           // keep the records too: the input cannot be re-read
	mem       []memRec       // the kept records, for a sorted replay when out of order
	keyBuf    []byte
	graph     Graph
	opSpan    []int32        // per graph op: its span's ordinal, -1 none
	tensors   map[string]int // tensor id -> index into graph.Tensors
	devices   map[string]int // device -> index into devSamples
	devNames  []string
	devUsed   [][][2]uint64 // per device: [timestamp, used bytes]
	devKept   int
}

// spanInfo is what is known of every span seen (up to spanInfoCap): its
// ordinal among the trace's spans, lane, depth, name, and whether it lies in
// the measured region. Its row may have been left out; this stays.
type spanInfo struct {
	start                    uint64
	ord, thread, depth, name uint32
	inside                   bool
}

// window is one measured span's stretch of time; open until its end comes.
type window struct {
	id         string
	start, end uint64
	open       bool
}

type spanRow struct {
	start, dur          uint64
	ord                 uint32
	parent              int32 // the parent's ordinal, -1 none
	thread, depth, name uint32
	flags               uint8
	inside              bool
}

type opRow struct {
	start, dur          uint64
	thread, depth, name uint32
	inside              bool
}

type intervalRow struct {
	start, dur   uint64
	stream, name uint32
	span         int32 // the launching span's ordinal, -1 none
	inside       bool
}

func (r *spanRow) key() (bool, uint64) {
	if r.flags&flagOpen != 0 {
		return r.inside, ^uint64(0) // open: it encloses what follows
	}
	return r.inside, r.dur
}
func (r *opRow) key() (bool, uint64)       { return r.inside, r.dur }
func (r *intervalRow) key() (bool, uint64) { return r.inside, r.dur }

// rowStore keeps at most limit rows. Rows inside the measured region are
// kept in file order until the limit; those outside are thinned as needed:
// when the store is full, each pair of neighbouring outside rows keeps the
// longer one (what a zoomed-out timeline shows anyway), and from then on
// only every stride-th outside row is taken, stride doubling at each
// thinning, so the outside rows stay evenly spread over the trace.
type rowStore[R any] struct {
	rows    []R
	stride  int // take every stride-th outside row (1: all)
	skipped int // outside rows passed since the last one taken
	// dropped: rows left out in all; outside: of them, outside the region.
	dropped, outside int
	outsideKept      int // outside rows in rows: none, nothing to thin
}

// admit says whether a new row (inside the region or not) goes in; when it
// returns false the row is counted as left out.
func admit[R any, P interface {
	*R
	key() (bool, uint64)
}](s *rowStore[R], inside bool, limit int) bool {
	if s.stride == 0 {
		s.stride = 1
	}
	if !inside {
		s.skipped++
		if s.skipped < s.stride {
			s.dropped++
			s.outside++
			return false
		}
		s.skipped = 0
	}
	if len(s.rows) < limit {
		if !inside {
			s.outsideKept++
		}
		return true
	}
	// Full. Thinning needs two outside rows to pair; without them (the
	// region alone fills the store) the row is left out at once.
	if s.outsideKept < 2 || thin[R, P](s) == 0 {
		s.dropped++
		if !inside {
			s.outside++
		}
		return false
	}
	if !inside {
		s.outsideKept++
	}
	return true
}

// thin halves the outside rows (the longer of each neighbouring pair stays)
// and returns how many it removed.
func thin[R any, P interface {
	*R
	key() (bool, uint64)
}](s *rowStore[R]) int {
	kept, pending := 0, -1 // pending: index in s.rows of an unpaired outside row
	removed := 0
	for i := range s.rows {
		in, dur := P(&s.rows[i]).key()
		if in {
			s.rows[kept] = s.rows[i]
			kept++
			continue
		}
		if pending < 0 {
			pending = kept
			s.rows[kept] = s.rows[i]
			kept++
			continue
		}
		if _, pd := P(&s.rows[pending]).key(); dur > pd {
			s.rows[pending] = s.rows[i]
		}
		pending = -1
		removed++
	}
	clear(s.rows[kept:])
	s.rows = s.rows[:kept]
	s.dropped += removed
	s.outside += removed
	s.outsideKept -= removed
	if removed > 0 {
		s.stride *= 2
	}
	return removed
}

// spanInfoCap bounds the spans remembered: past it a span is neither kept
// nor known, and its ops go to the thread-less lane. A span whose row is not
// kept is forgotten when it ends, so what is remembered is the kept rows,
// the open spans and the rows thinned out after their end (a few times the
// limit, the stride doubling at each thinning); the cap is a backstop.
func (c *collector) spanInfoCap() int { return 8 * c.lim.Spans }

func newCollector(lim Limits) *collector {
	return &collector{
		lim: lim, names: map[string]int{}, curve: newMemCurve(lim.MemoryPoints), spanInfo: map[string]spanInfo{}, threads: map[uint64]int{},
		streams: map[string]int{}, devices: map[string]int{}, tensors: map[string]int{},
		graph: Graph{Tensors: []string{}, SpanParent: []int{}, OpSpan: []int{}, OpIn: [][]int{}, OpOut: []int{}, Data: [][2]int{}},
		tl:    Timeline{Names: []string{}, Threads: []uint64{}, Streams: []string{}, Spans: [][6]uint64{}, Ops: [][5]uint64{}, Intervals: [][5]uint64{}},
	}
}

// MaxNameBytes cuts the names the page shows: a name is a label to read,
// and the cut keeps a page of made-up names inside the size the limits
// promise.
const MaxNameBytes = 256

func (c *collector) name(b []byte) int {
	if i, ok := c.names[string(b)]; ok {
		return i
	}
	i := len(c.tl.Names)
	s := string(b)
	if len(s) > MaxNameBytes {
		cut := MaxNameBytes
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	c.names[string(b)] = i
	c.tl.Names = append(c.tl.Names, s)
	return i
}

func (c *collector) note(ts uint64) { c.latest = max(c.latest, ts) }

func (c *collector) thread(tid uint64) int {
	if i, ok := c.threads[tid]; ok {
		return i
	}
	i := len(c.tl.Threads)
	c.threads[tid] = i
	c.tl.Threads = append(c.tl.Threads, tid)
	return i
}

func (c *collector) event(k trace.Kind, d *trace.Decoder, _ int) {
	switch k {
	case trace.KindSpanStart:
		c.spanStart(&d.SpanStart)
	case trace.KindSpanEnd:
		c.spanEnd(&d.SpanEnd)
	case trace.KindOp:
		c.op(&d.Op)
	case trace.KindDeviceInterval:
		c.interval(&d.DeviceInterval)
	case trace.KindMemory:
		c.memory(&d.Memory)
	case trace.KindDeviceMemory:
		c.deviceMemory(&d.DeviceMemory)
	case trace.KindEdge:
		c.edge(&d.Edge)
	}
}

// Span flags, the sixth field of a span row.
const (
	flagMeasured = 1 << iota
	flagOpen
)

// inWindow: ts falls in a measured span's time (an open one has no end yet).
func (c *collector) inWindow(ts uint64) bool {
	for _, w := range c.windows {
		if ts >= w.start && (w.open || ts <= w.end) {
			return true
		}
	}
	return false
}

func (c *collector) spanStart(e *trace.SpanStartEvent) {
	c.note(e.Start)
	ord := c.spansSeen
	c.spansSeen++
	if len(c.spanInfo) >= c.spanInfoCap() {
		c.spans.dropped++
		return
	}
	// Spans without a tid (completed spans, other writers) share thread 0.
	th := uint32(c.thread(e.TID))
	depth := uint32(0)
	parent := int32(-1)
	inside := e.Measured || c.inWindow(e.Start)
	if e.HasParent {
		if p, ok := c.spanInfo[string(e.Parent)]; ok {
			parent = int32(p.ord)
			inside = inside || p.inside
			if p.thread == th {
				depth = p.depth + 1
			}
		}
	}
	if e.Measured {
		c.windows = append(c.windows, window{id: string(e.ID), start: e.Start, open: true})
	}
	name := uint32(c.name(e.Name))
	c.spanInfo[string(e.ID)] = spanInfo{start: e.Start, ord: ord, thread: th, depth: depth, name: name, inside: inside}
	flags := uint8(flagOpen)
	if e.Measured {
		flags |= flagMeasured
	}
	if admit(&c.spans, inside, c.lim.Spans) {
		c.spans.rows = append(c.spans.rows, spanRow{start: e.Start, ord: ord, parent: parent, thread: th, depth: depth, name: name, flags: flags, inside: inside})
	}
}

// keptSpan finds the kept row of a span by its ordinal (rows stay in
// ordinal order), nil when it was left out.
func (c *collector) keptSpan(ord uint32) *spanRow {
	rows := c.spans.rows
	i := sort.Search(len(rows), func(i int) bool { return rows[i].ord >= ord })
	if i < len(rows) && rows[i].ord == ord {
		return &rows[i]
	}
	return nil
}

func (c *collector) spanEnd(e *trace.SpanEndEvent) {
	info, ok := c.spanInfo[string(e.ID)]
	if !ok {
		return
	}
	for i := range c.windows {
		if w := &c.windows[i]; w.open && w.id == string(e.ID) {
			w.open, w.end = false, trace.SatAdd(w.start, e.Duration)
		}
	}
	c.note(trace.SatAdd(info.start, e.Duration))
	s := c.keptSpan(info.ord)
	if s == nil {
		delete(c.spanInfo, string(e.ID))
		return
	}
	s.dur, s.flags = e.Duration, s.flags&^flagOpen
}

func (c *collector) op(e *trace.OpEvent) {
	c.note(trace.SatAdd(e.Timestamp, e.Duration))
	var th, depth uint32
	span := int32(-1)
	inside := c.inWindow(e.Timestamp)
	if info, ok := c.spanInfo[string(e.SpanID)]; ok {
		th, depth, span = info.thread, info.depth+1, int32(info.ord)
		inside = inside || info.inside
	} else {
		th = uint32(c.thread(0)) // a span not (yet) seen: the thread-less lane
	}
	before := c.ops.dropped
	if !admit(&c.ops, inside, c.lim.Ops) {
		return
	}
	if c.ops.dropped != before && c.graph.Omitted == "" {
		// Thinning moved ops: the graph's rows would no longer match.
		c.dropGraph(fmt.Sprintf("more than %d ops: too many to draw as a graph; the timeline has them", c.lim.Ops))
	}
	c.ops.rows = append(c.ops.rows, opRow{start: e.Timestamp, dur: e.Duration, thread: th, depth: depth, name: uint32(c.name(e.OpName)), inside: inside})
	if c.graph.Omitted != "" {
		return
	}
	if len(c.ops.rows) > c.lim.GraphOps {
		c.dropGraph(fmt.Sprintf("more than %d ops: too many to draw as a graph; the timeline has them", c.lim.GraphOps))
		return
	}
	in := make([]int, 0, len(e.Inputs))
	for _, t := range e.Inputs {
		in = append(in, c.tensor(t))
	}
	out := -1
	if e.HasOutput {
		out = c.tensor(e.Output)
	}
	c.opSpan = append(c.opSpan, span)
	c.graph.OpIn = append(c.graph.OpIn, in)
	c.graph.OpOut = append(c.graph.OpOut, out)
}

func (c *collector) tensor(id []byte) int {
	if i, ok := c.tensors[string(id)]; ok {
		return i
	}
	i := len(c.graph.Tensors)
	c.tensors[string(id)] = i
	c.graph.Tensors = append(c.graph.Tensors, string(id))
	return i
}

func (c *collector) edge(e *trace.EdgeEvent) {
	if e.Call || c.graph.Omitted != "" {
		return
	}
	if len(c.graph.Data) >= c.lim.GraphOps {
		c.dropGraph(fmt.Sprintf("more than %d data edges: too many to draw as a graph", c.lim.GraphOps))
		return
	}
	c.graph.Data = append(c.graph.Data, [2]int{c.tensor(e.From), c.tensor(e.To)})
}

// dropGraph gives the graph up (the page says why) and frees what it held.
func (c *collector) dropGraph(why string) {
	c.graph = Graph{Omitted: why, Tensors: []string{}, SpanParent: []int{}, OpSpan: []int{}, OpIn: [][]int{}, OpOut: []int{}, Data: [][2]int{}}
	c.tensors, c.opSpan = map[string]int{}, nil
}

func (c *collector) interval(e *trace.DeviceIntervalEvent) {
	// Only the host clock can be drawn under the host spans.
	if string(e.ClockID) != trace.HostClock {
		c.tl.Dropped.OtherClockIntervals++
		return
	}
	span := int32(-1)
	inside := c.inWindow(e.Start)
	if info, ok := c.spanInfo[string(e.SpanID)]; ok {
		span = int32(info.ord)
		inside = inside || info.inside
	}
	if !admit(&c.intervals, inside, c.lim.Intervals) {
		return
	}
	// Looked up through the reused buffer: a string is made only for a new
	// stream, not for each of the trace's intervals.
	c.keyBuf = append(append(append(c.keyBuf[:0], e.Device...), 0), e.StreamID...)
	st, ok := c.streams[string(c.keyBuf)]
	if !ok {
		st = len(c.tl.Streams)
		c.streams[string(c.keyBuf)] = st
		c.tl.Streams = append(c.tl.Streams, string(e.Device)+" stream "+string(e.StreamID))
	}
	name := e.Name
	if len(name) == 0 {
		name = []byte("(unnamed)")
	}
	c.intervals.rows = append(c.intervals.rows, intervalRow{start: e.Start, dur: e.Duration, stream: uint32(st), name: uint32(c.name(name)), span: span, inside: inside})
}

func (c *collector) memory(e *trace.MemoryEvent) {
	c.note(e.Timestamp)
	alloc := e.Action == trace.ActionAlloc
	op := int32(-1)
	if alloc {
		op = c.madeBy(e)
	}
	c.keyBuf = append(append(append(c.keyBuf[:0], e.Device...), 0), e.StorageID...)
	c.curve.add(e.Timestamp, c.keyBuf, alloc, e.Bytes, int8(e.Category), op)
	if !c.buffer {
		return
	}
	if len(c.mem) >= c.lim.MemoryEvents {
		c.tl.Dropped.MemoryEvents++
		return
	}
	c.mem = append(c.mem, memRec{ts: e.Timestamp, bytes: e.Bytes, key: string(c.keyBuf), alloc: alloc, category: int8(e.Category), op: op})
}

// madeBy names what allocated a storage: its op, else its span.
func (c *collector) madeBy(e *trace.MemoryEvent) int32 {
	if e.HasOpName && len(e.OpName) > 0 {
		return int32(c.name(e.OpName))
	}
	if info, ok := c.spanInfo[string(e.SpanID)]; ok {
		return int32(info.name)
	}
	return -1
}

// replayMemory re-reads a trace's memory records, for a sorted replay.
func (c *collector) replayMemory(r io.Reader, maxLine int) error {
	st := trace.NewStream(r, maxLine)
	c.mem = c.mem[:0]
	for {
		k, ok := st.Next()
		if !ok {
			break
		}
		if k != trace.KindMemory {
			continue
		}
		if len(c.mem) >= c.lim.MemoryEvents {
			c.tl.Dropped.MemoryEvents++
			continue
		}
		e := &st.Decoded.Memory
		alloc := e.Action == trace.ActionAlloc
		op := int32(-1)
		if alloc {
			op = c.madeBy(e)
		}
		c.mem = append(c.mem, memRec{ts: e.Timestamp, bytes: e.Bytes, key: string(e.Device) + "\x00" + string(e.StorageID), alloc: alloc, category: int8(e.Category), op: op})
	}
	return st.Err
}

func (c *collector) deviceMemory(e *trace.DeviceMemoryEvent) {
	c.note(e.Timestamp)
	if !e.HasUsed {
		return
	}
	if c.devKept >= c.lim.DeviceSamples {
		c.tl.Dropped.DeviceSamples++
		return
	}
	i, ok := c.devices[string(e.Device)]
	if !ok {
		i = len(c.devNames)
		c.devices[string(e.Device)] = i
		c.devNames = append(c.devNames, string(e.Device))
		c.devUsed = append(c.devUsed, nil)
	}
	c.devUsed[i] = append(c.devUsed[i], [2]uint64{e.Timestamp, e.Used})
	c.devKept++
}

// finish closes open spans at the latest timestamp seen, and gives the
// memory curve. When the memory records turned out to be out of timestamp
// order the curve applied as they streamed is void: they are replayed
// sorted, from the kept records or re-read from seeker.
func (c *collector) finish(seeker io.ReadSeeker, origin int64, maxLine int) (*Timeline, *MemoryView, *Graph, error) {
	c.rows()
	c.tl.End = c.latest
	curve := c.curve
	if curve.disordered {
		if !c.buffer {
			if _, err := seeker.Seek(origin, io.SeekStart); err != nil {
				return nil, nil, nil, fmt.Errorf("re-read memory records: %w", err)
			}
			if err := c.replayMemory(seeker, maxLine); err != nil {
				return nil, nil, nil, fmt.Errorf("re-read memory records: %w", err)
			}
		}
		sort.SliceStable(c.mem, func(i, j int) bool { return c.mem[i].ts < c.mem[j].ts })
		curve = newMemCurve(c.lim.MemoryPoints)
		for _, r := range c.mem {
			curve.add(r.ts, []byte(r.key), r.alloc, r.bytes, r.category, r.op)
		}
	}
	mv := c.memoryView(curve)
	for i, name := range c.devNames {
		pts := c.devUsed[i]
		sort.SliceStable(pts, func(a, b int) bool { return pts[a][0] < pts[b][0] })
		drawn := [][]uint64{}
		for _, k := range decimate(len(pts), c.lim.MemoryPoints, func(i int) uint64 { return pts[i][1] }) {
			drawn = append(drawn, []uint64{pts[k][0], pts[k][1]})
		}
		mv.Devices = append(mv.Devices, DeviceUsed{Device: name, Samples: len(pts), Points: drawn})
	}
	return &c.tl, mv, &c.graph, nil
}

// rows turns the kept rows into the page's number arrays, span ordinals
// into indices of the kept spans, closes open spans at the latest timestamp
// seen, and says what the limits left out.
func (c *collector) rows() {
	index := func(ord int32) int {
		if ord < 0 {
			return -1
		}
		rows := c.spans.rows
		i := sort.Search(len(rows), func(i int) bool { return rows[i].ord >= uint32(ord) })
		if i < len(rows) && rows[i].ord == uint32(ord) {
			return i
		}
		return -1
	}
	c.tl.Spans = make([][6]uint64, 0, len(c.spans.rows))
	c.graph.SpanParent = make([]int, 0, len(c.spans.rows))
	for _, s := range c.spans.rows {
		if s.flags&flagOpen != 0 && c.latest > s.start {
			s.dur = c.latest - s.start
		}
		c.tl.Spans = append(c.tl.Spans, [6]uint64{s.start, s.dur, uint64(s.thread), uint64(s.depth), uint64(s.name), uint64(s.flags)})
		c.graph.SpanParent = append(c.graph.SpanParent, index(s.parent))
	}
	c.tl.Ops = make([][5]uint64, 0, len(c.ops.rows))
	for _, o := range c.ops.rows {
		c.tl.Ops = append(c.tl.Ops, [5]uint64{o.start, o.dur, uint64(o.thread), uint64(o.depth), uint64(o.name)})
	}
	c.tl.Intervals = make([][5]uint64, 0, len(c.intervals.rows))
	for _, r := range c.intervals.rows {
		span := uint64(1<<53 - 1) // JavaScript's largest exact integer: no span
		if i := index(r.span); i >= 0 {
			span = uint64(i)
		}
		c.tl.Intervals = append(c.tl.Intervals, [5]uint64{r.start, r.dur, uint64(r.stream), uint64(r.name), span})
	}
	if c.graph.Omitted == "" {
		c.graph.OpSpan = make([]int, 0, len(c.opSpan))
		for _, o := range c.opSpan {
			c.graph.OpSpan = append(c.graph.OpSpan, index(o))
		}
	}
	d := &c.tl.Dropped
	d.Spans, d.SpansOutside = c.spans.dropped, c.spans.outside
	d.Ops, d.OpsOutside = c.ops.dropped, c.ops.outside
	d.Intervals, d.IntervalsOutside = c.intervals.dropped, c.intervals.outside
	d.MeasuredRegion = len(c.windows) > 0
	c.spans, c.ops, c.intervals, c.opSpan = rowStore[spanRow]{}, rowStore[opRow]{}, rowStore[intervalRow]{}, nil
}

// decimate picks at most n of count points: the largest (by value) of each
// stretch, so the drawn curve never hides how high it went.
func decimate(count, n int, value func(int) uint64) []int {
	out := make([]int, 0, min(count, n+1))
	if count <= n {
		for i := range count {
			out = append(out, i)
		}
		return out
	}
	per := (count + n - 1) / n
	for i := 0; i < count; i += per {
		best := i
		for j := i; j < min(i+per, count); j++ {
			if value(j) > value(best) {
				best = j
			}
		}
		out = append(out, best)
	}
	return out
}

func splitKey(k string) (string, string) {
	for i := 0; i < len(k); i++ {
		if k[i] == 0 {
			return k[:i], k[i+1:]
		}
	}
	return k, ""
}

func category(i int8) string {
	if int(i) < len(traceformat.Categories) && i >= 0 {
		return traceformat.Categories[i]
	}
	return "other"
}
