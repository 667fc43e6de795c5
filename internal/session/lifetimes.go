package session

import (
	"fmt"

	"github.com/candle-trace/candle-trace/internal/events"
)

// lifetimes checks logical memory events the way candle-graph replays them:
// sorted by timestamp (ties keep file order, which is arrival order here),
// keyed by (device, storage). Checking in arrival order is only the same
// thing when one storage's events arrive in time order, so that is required
// too: an event may not precede what its storage already saw.
type lifetimes struct {
	live    map[storageKey]*storage
	freedAt map[storageKey]uint64 // when each dead storage was last freed
	// forgotten is the latest free dropped from freedAt to bound memory; a
	// storage not in freedAt may not go back before it.
	forgotten uint64
}

type storageKey struct{ device, storage string }

type storage struct {
	bytes   uint64
	floor   uint64 // no event of this lifetime may precede the previous free
	lastNs  uint64 // latest event of this lifetime; the free may not precede it
	tensors []string
}

// maxFreed bounds the per-storage free times kept after a storage dies.
const maxFreed = 1 << 16

func newLifetimes() lifetimes {
	return lifetimes{live: map[storageKey]*storage{}, freedAt: map[storageKey]uint64{}}
}

func (l *lifetimes) floor(k storageKey) uint64 {
	if f, ok := l.freedAt[k]; ok && f > l.forgotten {
		return f
	}
	return l.forgotten
}

// apply checks m against the storage's lifetime and records it; an error
// names the candle-graph health code it would otherwise cause.
func (l *lifetimes) apply(m *events.Memory) error {
	k := storageKey{m.Device, m.StorageID}
	live := l.live[k]
	ts := m.TimestampNs
	switch m.Action {
	case events.MemoryAlloc:
		if live == nil {
			if f := l.floor(k); ts < f {
				return fmt.Errorf("alloc of storage %q on %q at %d ns precedes its previous free at %d ns; record one storage's events in time order", m.StorageID, m.Device, ts, f)
			}
			l.live[k] = &storage{bytes: m.Bytes, floor: l.floor(k), lastNs: ts, tensors: []string{m.TensorID}}
			return nil
		}
		if ts < live.floor {
			return fmt.Errorf("alloc of storage %q on %q at %d ns precedes its previous free at %d ns; record one storage's events in time order", m.StorageID, m.Device, ts, live.floor)
		}
		if live.bytes != m.Bytes {
			return fmt.Errorf("storage %q on %q is live with %d bytes; an alloc of %d bytes conflicts (allocation_size_mismatch)", m.StorageID, m.Device, live.bytes, m.Bytes)
		}
		for _, t := range live.tensors {
			if t == m.TensorID {
				return fmt.Errorf("tensor %q already holds storage %q on %q (duplicate_allocation)", m.TensorID, m.StorageID, m.Device)
			}
		}
		live.tensors = append(live.tensors, m.TensorID)
		live.lastNs = max(live.lastNs, ts)
	case events.MemoryFree:
		if live == nil {
			return fmt.Errorf("storage %q on %q is not live (unpaired_free)", m.StorageID, m.Device)
		}
		if live.bytes != m.Bytes {
			return fmt.Errorf("storage %q on %q was allocated with %d bytes, freed with %d (allocation_size_mismatch)", m.StorageID, m.Device, live.bytes, m.Bytes)
		}
		if ts < live.lastNs {
			return fmt.Errorf("free of storage %q on %q at %d ns precedes its alloc at %d ns", m.StorageID, m.Device, ts, live.lastNs)
		}
		delete(l.live, k)
		if len(l.freedAt) >= maxFreed {
			for _, f := range l.freedAt {
				l.forgotten = max(l.forgotten, f)
			}
			clear(l.freedAt)
		}
		l.freedAt[k] = ts
	}
	return nil
}
