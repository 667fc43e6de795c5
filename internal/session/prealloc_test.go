package session

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/aggregate"
	"github.com/candle-trace/candle-trace/internal/outfile"
)

func blocksOf(t *testing.T, path string) (size, allocated int64) {
	t.Helper()
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(path, &st))
	return st.Size, st.Blocks * 512
}

// A trace file reserves disk blocks ahead of its writes, never shows them
// (its size is what was written, at every moment), and gives back what it
// reserved past its end when it closes.
func TestReservingFileReservesAheadAndGivesBackAtClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.jsonl")
	f, err := outfile.Create(path, aggregate.OwnFile)
	require.NoError(t, err)
	w := reserving(f)
	require.NoError(t, w.reserveCheck(), "the test folder's file system reserves blocks (fallocate)")
	line := bytes.Repeat([]byte("x"), 999)
	line = append(line, '\n')
	var want int64
	for _, tc := range []struct {
		name  string
		lines int
	}{{"one line", 1}, {"past the first reservation", 2000}, {"past the next", 3000}} {
		for i := 0; i < tc.lines; i++ {
			n, err := w.Write(line)
			require.NoError(t, err)
			require.Equal(t, len(line), n)
		}
		want += int64(tc.lines * len(line))
		size, allocated := blocksOf(t, path)
		require.Equal(t, want, size, "%s: the size is what was written", tc.name)
		require.Greater(t, allocated, size, "%s: blocks reserved past the end", tc.name)
		require.GreaterOrEqual(t, w.reserved, want)
	}
	require.NoError(t, w.Close())
	size, allocated := blocksOf(t, path)
	require.Equal(t, want, size)
	require.Less(t, allocated, size+64<<10, "what was reserved past the end is given back")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, want, int64(len(data)))
	require.Equal(t, int64(len(data)), int64(bytes.Count(data, []byte("\n")))*int64(len(line)), "whole lines, nothing else")
}

// Where nothing can be reserved (a character device), writes go through
// as to a plain file and closing it truncates nothing.
func TestReservingFileWritesWhereItCannotReserve(t *testing.T) {
	f, err := outfile.Create(os.DevNull, aggregate.OwnFile)
	require.NoError(t, err)
	w := reserving(f)
	for i := 0; i < 3; i++ {
		n, err := w.Write(make([]byte, 1<<20))
		require.NoError(t, err)
		require.Equal(t, 1<<20, n)
	}
	require.True(t, w.cannot, "a device takes no reservation")
	require.NoError(t, w.Close())
	st, err := os.Stat(os.DevNull)
	require.NoError(t, err)
	require.NotZero(t, st.Mode()&os.ModeCharDevice, "/dev/null is still a device")
}

// reserveCheck reports whether f's file system takes a reservation: one of
// a block past its end, given back at once.
func (f *reservingFile) reserveCheck() error {
	var err error
	if cerr := f.control(func(fd int) {
		if err = syscall.Fallocate(fd, 1, 0, 4096); err == nil {
			err = syscall.Ftruncate(fd, 0)
		}
	}); cerr != nil {
		return cerr
	}
	return err
}

// A regular file is written with raw write(2) from its second write on --
// after the first, which may put it in the place of the own file it
// replaces -- and every byte lands, in order; a device keeps os.File's
// writes (a pipe's or a device's write may block for good).
func TestReservingFileWritesRawOnlyToSettledRegularFiles(t *testing.T) {
	dir := t.TempDir()
	own := filepath.Join(dir, "own.jsonl")
	require.NoError(t, os.WriteFile(own, []byte(`{"kind":"meta","schema":"candle-graph/trace/10"}`+"\n"), 0o644))
	for _, tc := range []struct {
		name    string
		path    string
		regular bool
	}{
		{"a new file", filepath.Join(dir, "new.jsonl"), true},
		{"an own file it replaces at its first write", own, true},
		{"a character device", os.DevNull, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := outfile.Create(tc.path, aggregate.OwnFile)
			require.NoError(t, err)
			w := reserving(f)
			var want []byte
			for i := 0; i < 4; i++ {
				chunk := bytes.Repeat([]byte{byte('a' + i)}, 70_000+i)
				n, err := w.Write(chunk)
				require.NoError(t, err)
				require.Equal(t, len(chunk), n)
				want = append(want, chunk...)
				require.Equal(t, tc.regular, w.raw >= 0, "after write %d", i+1)
			}
			require.Equal(t, int64(len(want)), w.written)
			require.NoError(t, w.Close())
			if !tc.regular {
				return
			}
			got, err := os.ReadFile(tc.path)
			require.NoError(t, err)
			require.Equal(t, want, got)
		})
	}
}

// A raw write that fails says so, with the file's path, and counts only
// what was written.
func TestReservingFileRawWriteFailureNamesThePath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.jsonl")
	f, err := outfile.Create(path, aggregate.OwnFile)
	require.NoError(t, err)
	w := reserving(f)
	_, err = w.Write([]byte("{}\n"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, w.raw, 0)
	ro, err := os.Open(path) // read-only: write(2) fails with EBADF
	require.NoError(t, err)
	defer ro.Close()
	good := w.raw
	w.raw = int(ro.Fd())
	n, err := w.Write([]byte("more\n"))
	w.raw = good
	require.Zero(t, n)
	require.ErrorIs(t, err, syscall.EBADF)
	require.ErrorContains(t, err, path)
	require.Equal(t, int64(3), w.written)
	require.NoError(t, w.Close())
}

// resident says, page by page, which of path's first n bytes are in the page
// cache (mincore over a read-only mapping).
func resident(t *testing.T, path string, n int) []bool {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	m, err := syscall.Mmap(int(f.Fd()), 0, n, syscall.PROT_READ, syscall.MAP_SHARED)
	require.NoError(t, err)
	defer func() { require.NoError(t, syscall.Munmap(m)) }()
	page := os.Getpagesize()
	vec := make([]byte, (n+page-1)/page)
	_, _, e := syscall.Syscall(syscall.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(n), uintptr(unsafe.Pointer(&vec[0])))
	require.Zero(t, e, "mincore")
	out := make([]bool, len(vec))
	for i, v := range vec {
		out[i] = v&1 != 0
	}
	return out
}

// diskDir is a fresh folder on a file system with a page cache of its own
// (tmpfs's pages are the file: nothing to drop), removed after the test.
func diskDir(t *testing.T) string {
	dir := t.TempDir()
	var st syscall.Statfs_t
	require.NoError(t, syscall.Statfs(dir, &st))
	if st.Type == 0x01021994 { // TMPFS_MAGIC
		d, err := os.MkdirTemp(".", "drop-behind-")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(d) })
		dir = d
	}
	return dir
}

// smallDropSteps makes the page-cache steps test-sized (1 MiB, then every
// 256 KiB) until t ends.
func smallDropSteps(t *testing.T) {
	from, step := dropFrom, dropStep
	dropFrom, dropStep = 1<<20, 256<<10
	t.Cleanup(func() { dropFrom, dropStep = from, step })
}

// A long trace leaves the page cache behind its end (a step at a time, past
// dropFrom), every byte still in the file; a short one keeps its pages.
func TestReservingFileDropsItsPagesBehindALongTrace(t *testing.T) {
	smallDropSteps(t)
	page := os.Getpagesize()
	line := append(bytes.Repeat([]byte("y"), page-1), '\n') // a page a line
	for _, tc := range []struct {
		name  string
		pages int // written before the file is synced
		drops bool
	}{
		{"short of dropFrom", 100, false},
		{"a long trace", 1200, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(diskDir(t), "t.jsonl")
			f, err := outfile.Create(path, aggregate.OwnFile)
			require.NoError(t, err)
			w := reserving(f)
			for i := 0; i < tc.pages; i++ {
				_, err := w.Write(line)
				require.NoError(t, err)
			}
			require.GreaterOrEqual(t, w.raw, 0)
			// Written back now: the next step's advice finds the pages it covers clean.
			require.NoError(t, syscall.Fdatasync(w.raw))
			window := w.dropped // where the next advice begins
			more := int(dropStep) / page
			for i := 0; i < more; i++ {
				_, err := w.Write(line)
				require.NoError(t, err)
			}
			require.False(t, w.keepPages)
			total := tc.pages + more
			in := resident(t, path, total*page)
			cached := 0
			for _, r := range in {
				if r {
					cached++
				}
			}
			if !tc.drops {
				require.Zero(t, w.dropped+w.started, "no step taken")
				require.Equal(t, total, cached, "every page kept")
			} else {
				first, last := int(window)/page, tc.pages
				for p := first; p < last; p++ {
					require.False(t, in[p], "page %d of the advised range, clean, is dropped", p)
				}
				require.Less(t, cached, total-(last-first)+1)
			}
			require.NoError(t, w.Close())
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			require.Equal(t, bytes.Repeat(line, total), data, "every byte in the file")
		})
	}
}

// The first step advises its own pages only: a trace just past dropFrom
// does not have its writer start the writeback of everything before (the
// kernel's to write back, as a short trace's is), and those pages stay
// cached. Before, the first step advised the file from its start.
func TestReservingFilesFirstStepAdvisesItsOwnPagesOnly(t *testing.T) {
	smallDropSteps(t)
	page := os.Getpagesize()
	line := append(bytes.Repeat([]byte("z"), page-1), '\n')
	path := filepath.Join(diskDir(t), "t.jsonl")
	f, err := outfile.Create(path, aggregate.OwnFile)
	require.NoError(t, err)
	w := reserving(f)
	write := func(pages int) {
		for i := 0; i < pages; i++ {
			_, err := w.Write(line)
			require.NoError(t, err)
		}
	}
	write(int(dropFrom) / page) // the first step is taken at the last of these
	require.Equal(t, dropFrom, w.started, "one step taken")
	first := int(dropFrom-dropStep) / page       // where the first step's advice began
	require.NoError(t, syscall.Fdatasync(w.raw)) // every page clean: advice now drops it
	write(int(dropStep) / page)                  // the second step
	require.False(t, w.keepPages)
	in := resident(t, path, int(dropFrom+dropStep))
	for p := 0; p < first; p++ {
		require.True(t, in[p], "page %d, before the first step, is the kernel's and stays", p)
	}
	for p := first; p < int(dropFrom)/page; p++ {
		require.False(t, in[p], "page %d of the first step's range is dropped", p)
	}
	require.NoError(t, w.Close())
}
