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
type collector struct {
	lim   Limits
	names map[string]int
	tl    Timeline

	spanIdx  map[string]int // span id -> index into tl.Spans
	threads  map[uint64]int // tid -> index into tl.Threads
	streams  map[string]int // device \0 stream -> index into tl.Streams
	depth    []int32        // per kept span
	latest   uint64         // latest timestamp seen: where open spans end
	curve    *memCurve      // the memory curve, applied as the records stream by
	buffer   bool           // keep the records too: the input cannot be re-read
	mem      []memRec       // the kept records, for a sorted replay when out of order
	keyBuf   []byte
	graph    Graph
	tensors  map[string]int // tensor id -> index into graph.Tensors
	devices  map[string]int // device -> index into devSamples
	devNames []string
	devUsed  [][][2]uint64 // per device: [timestamp, used bytes]
	devKept  int
}

func newCollector(lim Limits) *collector {
	return &collector{
		lim: lim, names: map[string]int{}, curve: newMemCurve(lim.MemoryPoints), spanIdx: map[string]int{}, threads: map[uint64]int{},
		streams: map[string]int{}, devices: map[string]int{}, tensors: map[string]int{},
		graph: Graph{Tensors: []string{}, SpanParent: []int{}, OpSpan: []int{}, OpIn: [][]int{}, OpOut: []int{}, Data: [][2]int{}},
		tl:    Timeline{Names: []string{}, Threads: []uint64{}, Streams: []string{}, Spans: [][]uint64{}, Ops: [][]uint64{}, Intervals: [][]uint64{}},
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

func (c *collector) spanStart(e *trace.SpanStartEvent) {
	c.note(e.Start)
	if len(c.tl.Spans) >= c.lim.Spans {
		c.tl.Dropped.Spans++
		return
	}
	// Spans without a tid (completed spans, other writers) share thread 0.
	th := c.thread(e.TID)
	depth := int32(0)
	if e.HasParent {
		if p, ok := c.spanIdx[string(e.Parent)]; ok && c.tl.Spans[p][2] == uint64(th) {
			depth = c.depth[p] + 1
		}
	}
	parent := -1
	if e.HasParent {
		if p, ok := c.spanIdx[string(e.Parent)]; ok {
			parent = p
		}
	}
	c.graph.SpanParent = append(c.graph.SpanParent, parent)
	flags := uint64(flagOpen)
	if e.Measured {
		flags |= flagMeasured
	}
	c.spanIdx[string(e.ID)] = len(c.tl.Spans)
	c.depth = append(c.depth, depth)
	c.tl.Spans = append(c.tl.Spans, []uint64{e.Start, 0, uint64(th), uint64(depth), uint64(c.name(e.Name)), flags})
}

func (c *collector) spanEnd(e *trace.SpanEndEvent) {
	i, ok := c.spanIdx[string(e.ID)]
	if !ok {
		return
	}
	s := c.tl.Spans[i]
	s[1], s[5] = e.Duration, s[5]&^flagOpen
	c.note(trace.SatAdd(s[0], e.Duration))
}

func (c *collector) op(e *trace.OpEvent) {
	c.note(trace.SatAdd(e.Timestamp, e.Duration))
	if len(c.tl.Ops) >= c.lim.Ops {
		c.tl.Dropped.Ops++
		return
	}
	var th, depth uint64
	span := -1
	if i, ok := c.spanIdx[string(e.SpanID)]; ok {
		th, depth, span = c.tl.Spans[i][2], c.tl.Spans[i][3]+1, i
	} else {
		th = uint64(c.thread(0)) // a span not (yet) seen: the thread-less lane
	}
	c.tl.Ops = append(c.tl.Ops, []uint64{e.Timestamp, e.Duration, th, depth, uint64(c.name(e.OpName))})
	if c.graph.Omitted != "" {
		return
	}
	if len(c.tl.Ops) > c.lim.GraphOps {
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
	c.graph.OpSpan = append(c.graph.OpSpan, span)
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
	c.graph = Graph{Omitted: why, Tensors: []string{}, SpanParent: c.graph.SpanParent, OpSpan: []int{}, OpIn: [][]int{}, OpOut: []int{}, Data: [][2]int{}}
	c.tensors = map[string]int{}
}

func (c *collector) interval(e *trace.DeviceIntervalEvent) {
	// Only the host clock can be drawn under the host spans.
	if string(e.ClockID) != trace.HostClock {
		c.tl.Dropped.OtherClockIntervals++
		return
	}
	if len(c.tl.Intervals) >= c.lim.Intervals {
		c.tl.Dropped.Intervals++
		return
	}
	key := string(e.Device) + "\x00" + string(e.StreamID)
	st, ok := c.streams[key]
	if !ok {
		st = len(c.tl.Streams)
		c.streams[key] = st
		c.tl.Streams = append(c.tl.Streams, string(e.Device)+" stream "+string(e.StreamID))
	}
	span := uint64(1<<53 - 1) // JavaScript's largest exact integer: no span
	if i, ok := c.spanIdx[string(e.SpanID)]; ok {
		span = uint64(i)
	}
	name := e.Name
	if len(name) == 0 {
		name = []byte("(unnamed)")
	}
	c.tl.Intervals = append(c.tl.Intervals, []uint64{e.Start, e.Duration, uint64(st), uint64(c.name(name)), span})
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
	if i, ok := c.spanIdx[string(e.SpanID)]; ok {
		return int32(c.tl.Spans[i][4])
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
	for _, s := range c.tl.Spans {
		if s[5]&flagOpen != 0 && c.latest > s[0] {
			s[1] = c.latest - s[0]
		}
	}
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
