package report

import (
	"fmt"
	"sort"
)

// candle-graph replays memory events sorted by timestamp (a stable sort, so
// ties keep file order). Writers almost always emit them in that order, so
// the tracker applies them as they stream by and keeps only live storages.
// If an event arrives out of order the online result is void: the events
// are gathered again (by re-reading the file, or from a buffer when the
// input cannot be re-read) and replayed sorted.

type memRecord struct {
	ts, bytes        uint64
	line             int32
	action, category int8
	device, storage  string
	tensor, span     string
}

type memoryTracker struct {
	buffer     bool // keep every record: the input cannot be re-read
	records    []memRecord
	lastTS     uint64
	seen       bool
	disordered bool
	lt         *lifetimes
}

func newMemoryTracker() *memoryTracker { return &memoryTracker{lt: newLifetimes()} }

func recordOf(e *memoryEvent, line int) memRecord {
	return memRecord{
		ts: e.timestamp, bytes: e.bytes, line: int32(line), action: int8(e.action), category: int8(e.category),
		device: string(e.device), storage: string(e.storageID), tensor: string(e.tensorID), span: string(e.spanID),
	}
}

func (m *memoryTracker) add(e *memoryEvent, line int) {
	if m.buffer {
		m.records = append(m.records, recordOf(e, line))
	}
	if m.disordered {
		return
	}
	if m.seen && e.timestamp < m.lastTS {
		m.disordered = true
		return
	}
	m.lastTS, m.seen = e.timestamp, true
	r := recordOf(e, line)
	m.lt.apply(&r)
}

// needsReplay tells whether the caller must gather the records again.
func (m *memoryTracker) needsReplay() bool { return m.disordered && !m.buffer }

// finish completes the analysis; records are the replayed events when
// needsReplay was true.
func (m *memoryTracker) finish(records []memRecord) *lifetimes {
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

type liveStorage struct {
	bytes    uint64
	tensors  []string
	category int8
}

// lifetimes follows storage lifetimes keyed by (device, storage_id), with
// candle-graph's health rules and its logical-memory peak.
type lifetimes struct {
	live   map[string]*liveStorage
	keyBuf []byte
	issues []Issue

	allocs, frees, totalAllocated uint64
	liveBytes                     uint64
	byDevice                      map[string]uint64
	byCategory                    [5]uint64

	inGroup   bool
	groupTS   uint64
	groupSpan string
	peak      *MemoryPeak
}

func newLifetimes() *lifetimes {
	return &lifetimes{live: map[string]*liveStorage{}, byDevice: map[string]uint64{}}
}

func (l *lifetimes) issue(line int32, code, msg string) {
	l.issues = append(l.issues, Issue{Severity: SeverityError, Code: code, Message: msg, Line: int(line)})
}

func (l *lifetimes) apply(r *memRecord) {
	if l.inGroup && r.ts != l.groupTS {
		l.closeGroup()
	}
	l.inGroup, l.groupTS = true, r.ts
	l.keyBuf = append(append(append(l.keyBuf[:0], r.device...), 0), r.storage...)
	st, live := l.live[string(l.keyBuf)]
	switch r.action {
	case actionAlloc:
		switch {
		case !live:
			l.live[string(l.keyBuf)] = &liveStorage{bytes: r.bytes, tensors: []string{r.tensor}, category: r.category}
			l.allocs++
			l.totalAllocated = satAdd(l.totalAllocated, r.bytes)
			l.liveBytes = satAdd(l.liveBytes, r.bytes)
			l.byDevice[r.device] = satAdd(l.byDevice[r.device], r.bytes)
			l.byCategory[r.category] = satAdd(l.byCategory[r.category], r.bytes)
			l.groupSpan = r.span
		case st.bytes != r.bytes:
			l.issue(r.line, CodeAllocationSizeMismatch, fmt.Sprintf("storage `%s` on `%s` has conflicting allocation sizes (%d live, %d allocated)", r.storage, r.device, st.bytes, r.bytes))
		case contains(st.tensors, r.tensor):
			l.issue(r.line, CodeDuplicateAllocation, fmt.Sprintf("tensor `%s` repeated an allocation for storage `%s` on `%s`", r.tensor, r.storage, r.device))
		default:
			st.tensors = append(st.tensors, r.tensor)
		}
	case actionFree:
		if !live {
			l.issue(r.line, CodeUnpairedFree, fmt.Sprintf("storage `%s` on `%s` was freed while not live", r.storage, r.device))
			return
		}
		delete(l.live, string(l.keyBuf))
		l.frees++
		l.liveBytes -= min(l.liveBytes, st.bytes)
		l.byDevice[r.device] -= min(l.byDevice[r.device], st.bytes)
		l.byCategory[st.category] -= min(l.byCategory[st.category], st.bytes)
		if st.bytes != r.bytes {
			l.issue(r.line, CodeAllocationSizeMismatch, fmt.Sprintf("storage `%s` allocated %d bytes but freed %d", r.storage, st.bytes, r.bytes))
		}
	}
}

// closeGroup evaluates the peak after all events of one timestamp, as
// candle-graph's timeline does (the first strictly greater point wins).
func (l *lifetimes) closeGroup() {
	if !l.inGroup {
		return
	}
	l.inGroup = false
	if l.allocs == 0 || (l.peak != nil && l.liveBytes <= l.peak.LiveBytes) {
		return
	}
	p := &MemoryPeak{TimestampNS: l.groupTS, LiveBytes: l.liveBytes, SpanID: l.groupSpan,
		ByDevice: map[string]uint64{}, ByCategory: map[string]uint64{}}
	for d, b := range l.byDevice {
		if b > 0 {
			p.ByDevice[d] = b
		}
	}
	for c, b := range l.byCategory {
		if b > 0 {
			p.ByCategory[categoryNames[c]] = b
		}
	}
	l.peak = p
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
