package session

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The closed-span table keeps every span through its in-place growth, and
// a table built in the memory a finished session gave back sees none of
// that session's spans.
func TestClosedTableGrowsInPlaceAndForgetsTheLastSession(t *testing.T) {
	mu.Lock()
	defer mu.Unlock()
	var a closedTable
	for id := uint64(1); id <= 5000; id += 3 {
		a.put(closedSpan{id: id, parent: id - 1, start: id * 10, dur: 7})
	}
	for id := uint64(1); id <= 5000; id++ {
		c, ok := a.get(id)
		require.Equal(t, id%3 == 1, ok, "s%d", id)
		if ok {
			assert.Equal(t, closedSpan{id: id, parent: id - 1, start: id * 10, dur: 7}, c)
		}
	}
	a.release()

	var b closedTable
	b.put(closedSpan{id: 2, start: 1, dur: 1})
	b.put(closedSpan{id: 6000, start: 1, dur: 1})
	for id := uint64(1); id <= 5000; id++ {
		_, ok := b.get(id)
		assert.Equal(t, id == 2, ok, "s%d of the earlier session must be gone", id)
	}
	// Past where the first table reached: slots never written before (zero,
	// faulted in, not cleared), which the next table must clear all the same.
	b.put(closedSpan{id: 12000, start: 1, dur: 1})
	b.release()

	var c closedTable
	c.put(closedSpan{id: 13000, start: 1, dur: 1})
	for _, id := range []uint64{2, 6000, 12000} {
		_, ok := c.get(id)
		assert.False(t, ok, "s%d of an earlier session must be gone", id)
	}
	_, ok := c.get(13000)
	assert.True(t, ok)
	c.release()
}

// The table keeps a span in 32 bytes, the dropped flag in its parent's top
// bit: every field comes back as it went in, dropped or not.
func TestClosedTableKeepsEveryFieldIn32Bytes(t *testing.T) {
	mu.Lock()
	defer mu.Unlock()
	assert.EqualValues(t, 32, unsafe.Sizeof(closedSlot{}))
	var tab closedTable
	defer tab.release()
	want := []closedSpan{
		{id: 1, parent: 0, start: 0, dur: 0},
		{id: 2, parent: 1, start: 5, dur: 9, dropped: true},
		{id: 3, parent: 1<<63 - 1, start: 1<<64 - 1, dur: 1<<64 - 1, dropped: true},
		{id: 4, parent: 1<<63 - 1, start: 7, dur: 3},
	}
	for _, c := range want {
		tab.put(c)
	}
	for _, c := range want {
		got, ok := tab.get(c.id)
		require.True(t, ok, "s%d", c.id)
		assert.Equal(t, c, got)
	}
	_, ok := tab.get(5)
	assert.False(t, ok)
}
