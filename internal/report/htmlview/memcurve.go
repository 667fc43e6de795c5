package htmlview

import (
	"sort"

	"github.com/candle-trace/candle-trace/internal/traceformat"
)

// memRec is one memory record, kept to replay them sorted.
type memRec struct {
	ts, bytes uint64
	key       string // device \0 storage
	alloc     bool
	category  int8
	op        int32 // name index of the op (or span) that made it, -1 none
}

// live is one live storage: its size, what it is, and the ordinal of the
// record that allocated it.
type live struct {
	bytes    uint64
	category int8
	op       int32
	ord      int
}

type keyedLive struct {
	key string
	live
}

// memCurve follows logical live bytes with the lifetimes' rules (an alloc
// of a live storage is an alias and adds nothing, a free releases what the
// storage holds) as records arrive in timestamp order, keeping only the live
// storages and one point per timestamp: its memory is that of the live set,
// not of the records. The peak is candle-graph's: the first strictly
// greatest total after all records of one timestamp (with an allocation
// seen), so it is the report's.
//
// What was live at the peak is known without a snapshot: a storage was live
// there if it was allocated at or before the peak's last record and freed
// after it, or never. Frees are checked against the peak as it stands when
// they come; when a later peak replaces it, the storages noted for the old
// one were freed before the new one, so the notes start over.
type memCurve struct {
	live        map[string]live
	total       uint64
	byCategory  []uint64 // by index into traceformat.Categories
	ord, allocs int
	inGroup     bool
	groupTS     uint64
	// points: [timestamp, total, bytes per category]. Kept to at most twice
	// maxPoints by merging neighbours (the larger total stays) whenever full,
	// so a long update costs a few hundred kilobytes; allPoints counts them.
	points        []uint64 // flat, stride values a point
	stride        int
	maxPoints     int
	allPoints     int
	havePeak      bool
	peak, peakAt  uint64
	peakOrd       int
	freedFromPeak []keyedLive
	disordered    bool // a record came earlier than the one before: the curve is void
}

func newMemCurve(maxPoints int) *memCurve {
	n := len(traceformat.Categories)
	return &memCurve{live: map[string]live{}, maxPoints: max(maxPoints, 1), byCategory: make([]uint64, n), stride: 2 + n}
}

func (m *memCurve) numPoints() int { return len(m.points) / m.stride }

func (m *memCurve) point(i int) []uint64 { return m.points[i*m.stride : (i+1)*m.stride] }

func catIndex(c int8) int {
	if c < 0 || int(c) >= len(traceformat.Categories) {
		return 0 // other
	}
	return int(c)
}

func (m *memCurve) add(ts uint64, key []byte, alloc bool, bytes uint64, category int8, op int32) {
	if m.disordered {
		return
	}
	if m.inGroup && ts != m.groupTS {
		if ts < m.groupTS {
			m.disordered = true
			return
		}
		m.closeGroup()
	}
	m.inGroup, m.groupTS = true, ts
	m.ord++
	l, isLive := m.live[string(key)]
	switch {
	case alloc && !isLive:
		m.live[string(key)] = live{bytes: bytes, category: category, op: op, ord: m.ord}
		m.total += bytes
		m.byCategory[catIndex(category)] += bytes
		m.allocs++
	case !alloc && isLive:
		delete(m.live, string(key))
		m.total -= min(m.total, l.bytes)
		c := &m.byCategory[catIndex(l.category)]
		*c -= min(*c, l.bytes)
		if m.havePeak && l.ord <= m.peakOrd {
			m.freedFromPeak = append(m.freedFromPeak, keyedLive{string(key), l})
		}
	}
}

func (m *memCurve) closeGroup() {
	if !m.inGroup {
		return
	}
	m.inGroup = false
	if m.numPoints() >= 2*m.maxPoints {
		// Merge neighbours, the larger total staying, in place.
		kept := 0
		for i := 0; i+1 < m.numPoints(); i += 2 {
			a := m.point(i)
			if b := m.point(i + 1); b[1] > a[1] {
				a = b
			}
			copy(m.points[kept*m.stride:], a)
			kept++
		}
		m.points = m.points[:kept*m.stride]
	}
	m.points = append(append(m.points, m.groupTS, m.total), m.byCategory...)
	m.allPoints++
	if m.allocs > 0 && (!m.havePeak || m.total > m.peak) {
		m.havePeak, m.peak, m.peakAt, m.peakOrd = true, m.total, m.groupTS, m.ord
		m.freedFromPeak = m.freedFromPeak[:0]
	}
}

// atPeak lists the storages live at the peak, largest first.
func (m *memCurve) atPeak() []keyedLive {
	out := append([]keyedLive(nil), m.freedFromPeak...)
	for k, l := range m.live {
		if l.ord <= m.peakOrd {
			out = append(out, keyedLive{k, l})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].bytes != out[j].bytes {
			return out[i].bytes > out[j].bytes
		}
		return out[i].key < out[j].key
	})
	return out
}

// memoryView is the curve as the page draws it.
func (c *collector) memoryView(m *memCurve) *MemoryView {
	m.closeGroup()
	mv := &MemoryView{Points: [][]uint64{}, PeakStorages: []PeakStorage{}, Devices: []DeviceUsed{}, Dropped: c.tl.Dropped.MemoryEvents}
	if !m.havePeak {
		return mv
	}
	mv.PeakBytes, mv.PeakAtNS = m.peak, m.peakAt
	for _, k := range decimate(m.numPoints(), c.lim.MemoryPoints, func(i int) uint64 { return m.point(i)[1] }) {
		mv.Points = append(mv.Points, append([]uint64(nil), m.point(k)...))
	}
	mv.DrawnPoints, mv.AllPoints = len(mv.Points), m.allPoints
	mv.Categories = traceformat.Categories
	all := m.atPeak()
	mv.LiveAtPeak = len(all)
	for _, l := range all[:min(len(all), c.lim.PeakStorages)] {
		dev, storage := splitKey(l.key)
		ps := PeakStorage{Bytes: l.bytes, Category: category(l.category), Device: dev, Storage: storage}
		if l.op >= 0 {
			ps.MadeBy = c.tl.Names[l.op]
		}
		mv.PeakStorages = append(mv.PeakStorages, ps)
	}
	return mv
}
