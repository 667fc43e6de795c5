package health

import (
	"fmt"
	"hash/maphash"
	"sort"

	"github.com/candle-trace/candle-trace/internal/traceformat"

	"github.com/candle-trace/candle-trace/internal/report/trace"
)

// candle-graph replays memory events sorted by timestamp (a stable sort, so
// ties keep file order). Writers almost always emit them in that order, so
// the tracker applies them as they stream by and keeps only live storages.
// If an event arrives out of order the online result is void: the events
// are gathered again (by re-reading the file, or from a buffer when the
// input cannot be re-read) and replayed sorted.

// memText is the text of a memory record: views of the current line on the
// streaming path (no copies), owned strings when records are kept for a
// sorted replay.
type memText interface{ ~string | ~[]byte }

type memFields[T memText] struct {
	ts, bytes        uint64
	tensorHash       uint64 // of tensor: lifetimes compare ids, never print them
	line             int32
	action, category int8
	device, storage  T
	tensor, span     T
}

// memRecord is a memory event kept beyond its line.
type memRecord = memFields[string]

// memSeed hashes tensor ids of memory records, kept or streamed alike.
var memSeed = maphash.MakeSeed()

func recordOf(e *trace.MemoryEvent, line int) memRecord {
	return memRecord{
		ts: e.Timestamp, bytes: e.Bytes, tensorHash: maphash.Bytes(memSeed, e.TensorID), line: int32(line),
		action: int8(e.Action), category: int8(e.Category),
		device: string(e.Device), storage: string(e.StorageID), tensor: string(e.TensorID), span: string(e.SpanID),
	}
}

// viewOf is recordOf without copies: valid until the next line is decoded.
func viewOf(e *trace.MemoryEvent, line int) memFields[[]byte] {
	return memFields[[]byte]{
		ts: e.Timestamp, bytes: e.Bytes, tensorHash: maphash.Bytes(memSeed, e.TensorID), line: int32(line),
		action: int8(e.Action), category: int8(e.Category),
		device: e.Device, storage: e.StorageID, tensor: e.TensorID, span: e.SpanID,
	}
}

type memoryTracker struct {
	buffer     bool // keep every record: the input cannot be re-read
	records    []memRecord
	lastTS     uint64
	seen       bool
	disordered bool
	lt         *Lifetimes
}

func newMemoryTracker() *memoryTracker { return &memoryTracker{lt: newLifetimes()} }

func (m *memoryTracker) add(e *trace.MemoryEvent, line int) {
	if m.buffer {
		m.records = append(m.records, recordOf(e, line))
	}
	if m.disordered {
		return
	}
	if m.seen && e.Timestamp < m.lastTS {
		m.disordered = true
		return
	}
	m.lastTS, m.seen = e.Timestamp, true
	v := viewOf(e, line)
	applyMem(m.lt, &v)
}

// needsReplay tells whether the caller must gather the records again.
func (m *memoryTracker) needsReplay() bool { return m.disordered && !m.buffer }

// finish completes the analysis; records are the replayed events when
// needsReplay was true.
func (m *memoryTracker) finish(records []memRecord) *Lifetimes {
	if !m.disordered {
		m.lt.closeGroup()
		return m.lt
	}
	if m.buffer {
		records = m.records
	}
	sort.SliceStable(records, func(i, j int) bool { return records[i].ts < records[j].ts })
	lt := newLifetimes()
	for i := range records {
		lt.apply(&records[i])
	}
	lt.closeGroup()
	return lt
}

// liveStorage is one live (device, storage_id). It is stored by value and
// keeps its own map key, so that a free deletes without converting the key
// again. Aliases are tensor-id hashes, as for the analyzer's known tensors.
type liveStorage struct {
	key      string
	bytes    uint64
	tensor   uint64
	aliases  []uint64
	category int8
}

func (s *liveStorage) has(tensor uint64) bool {
	if s.tensor == tensor {
		return true
	}
	for _, t := range s.aliases {
		if t == tensor {
			return true
		}
	}
	return false
}

// lifetimes follows storage lifetimes keyed by (device, storage_id), with
// candle-graph's health rules and its logical-memory peak.
type Lifetimes struct {
	Live   map[string]liveStorage
	keyBuf []byte
	issues []trace.Issue

	Allocs, Frees, TotalAllocated uint64
	liveBytes                     uint64
	byDevice                      map[string]*uint64
	byCategory                    [5]uint64

	inGroup   bool
	groupTS   uint64
	groupSpan string
	Peak      *MemoryPeak
}

func newLifetimes() *Lifetimes {
	return &Lifetimes{Live: map[string]liveStorage{}, byDevice: map[string]*uint64{}}
}

func (l *Lifetimes) issue(line int32, code, msg string) {
	l.issues = append(l.issues, trace.Issue{Severity: trace.SeverityError, Code: code, Message: msg, Line: int(line)})
}

func (l *Lifetimes) apply(r *memRecord) { applyMem(l, r) }

// deviceBytes returns the live-bytes counter of a device, creating it on
// first use (the only time the name is copied).
func deviceBytes[T memText](l *Lifetimes, device T) *uint64 {
	if p, ok := l.byDevice[string(device)]; ok {
		return p
	}
	p := new(uint64)
	l.byDevice[string(device)] = p
	return p
}

// applyMem applies one record. It copies text only for what it keeps: the
// key of a new live storage, a new device, a change of span.
func applyMem[T memText](l *Lifetimes, r *memFields[T]) {
	if l.inGroup && r.ts != l.groupTS {
		l.closeGroup()
	}
	l.inGroup, l.groupTS = true, r.ts
	l.keyBuf = append(append(append(l.keyBuf[:0], r.device...), 0), r.storage...)
	st, live := l.Live[string(l.keyBuf)]
	switch r.action {
	case trace.ActionAlloc:
		switch {
		case !live:
			key := string(l.keyBuf)
			l.Live[key] = liveStorage{key: key, bytes: r.bytes, tensor: r.tensorHash, category: r.category}
			l.Allocs++
			l.TotalAllocated = trace.SatAdd(l.TotalAllocated, r.bytes)
			l.liveBytes = trace.SatAdd(l.liveBytes, r.bytes)
			d := deviceBytes(l, r.device)
			*d = trace.SatAdd(*d, r.bytes)
			l.byCategory[r.category] = trace.SatAdd(l.byCategory[r.category], r.bytes)
			if l.groupSpan != string(r.span) {
				l.groupSpan = string(r.span)
			}
		case st.bytes != r.bytes:
			l.issue(r.line, trace.CodeAllocationSizeMismatch, fmt.Sprintf("storage `%s` on `%s` has conflicting allocation sizes (%d live, %d allocated)", r.storage, r.device, st.bytes, r.bytes))
		case st.has(r.tensorHash):
			l.issue(r.line, trace.CodeDuplicateAllocation, fmt.Sprintf("tensor `%s` repeated an allocation for storage `%s` on `%s`", r.tensor, r.storage, r.device))
		default:
			st.aliases = append(st.aliases, r.tensorHash)
			l.Live[st.key] = st
		}
	case trace.ActionFree:
		if !live {
			l.issue(r.line, trace.CodeUnpairedFree, fmt.Sprintf("storage `%s` on `%s` was freed while not live", r.storage, r.device))
			return
		}
		delete(l.Live, st.key)
		l.Frees++
		l.liveBytes -= min(l.liveBytes, st.bytes)
		d := deviceBytes(l, r.device)
		*d -= min(*d, st.bytes)
		l.byCategory[st.category] -= min(l.byCategory[st.category], st.bytes)
		if st.bytes != r.bytes {
			l.issue(r.line, trace.CodeAllocationSizeMismatch, fmt.Sprintf("storage `%s` allocated %d bytes but freed %d", r.storage, st.bytes, r.bytes))
		}
	}
}

// closeGroup evaluates the peak after all events of one timestamp, as
// candle-graph's timeline does (the first strictly greater point wins).
func (l *Lifetimes) closeGroup() {
	if !l.inGroup {
		return
	}
	l.inGroup = false
	if l.Allocs == 0 || (l.Peak != nil && l.liveBytes <= l.Peak.LiveBytes) {
		return
	}
	p := &MemoryPeak{TimestampNS: l.groupTS, LiveBytes: l.liveBytes, SpanID: l.groupSpan,
		ByDevice: map[string]uint64{}, ByCategory: map[string]uint64{}}
	for d, b := range l.byDevice {
		if *b > 0 {
			p.ByDevice[d] = *b
		}
	}
	for c, b := range l.byCategory {
		if b > 0 {
			p.ByCategory[traceformat.Categories[c]] = b
		}
	}
	l.Peak = p
}

// MemoryPeak is the simultaneous logical-memory peak.
type MemoryPeak struct {
	TimestampNS uint64            `json:"timestamp_ns"`
	LiveBytes   uint64            `json:"live_bytes"`
	SpanID      string            `json:"span_id"` // span of the allocation that reached it
	SpanName    string            `json:"span_name,omitempty"`
	ByDevice    map[string]uint64 `json:"by_device"`
	ByCategory  map[string]uint64 `json:"by_category"`
}
