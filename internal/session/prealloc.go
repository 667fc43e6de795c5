package session

import (
	"io"
	"os"
	"syscall"
	"unsafe"

	"github.com/candle-trace/candle-trace/internal/outfile"
)

// reservingFile is a trace file whose disk blocks are reserved ahead of its
// writes (fallocate with FALLOC_FL_KEEP_SIZE: the file's size still grows
// only by what is written, so neither a reader nor a killed process ever
// sees bytes that were not). ext4 then maps each 4 KiB a write brings to a
// block reserved already, where it would reserve one per page (delayed
// allocation): half the kernel's CPU per byte of trace on the machines we
// measured (BENCHMARKS.md, issue 14). Close gives back what was reserved
// past the end. Where the file cannot reserve (a FIFO, a device, a file
// system without fallocate) it writes as a plain file.
type reservingFile struct {
	*outfile.File
	written, reserved int64
	cannot            bool
	// raw is the descriptor of a regular file written with rawWrite, once
	// it is settled at its path (outfile.File's first write may rename it
	// there); -1 until then or for good (not a regular file).
	raw     int
	checked bool
	// Past dropFrom bytes the raw path drops pages behind its end
	// (dropBehind): started is where the last step ended, prev where the one
	// before it did, dropped where the oldest advised range begins.
	started, prev, dropped int64
	keepPages              bool // a call refused: the page cache keeps what it has
}

// A trace past dropFrom bytes has its pages written back and dropped from the
// page cache a step behind its end, so that a long trace neither evicts the
// program's own cached data (its dataset, its checkpoints) nor has the kernel
// find a new page for every 4 KiB it writes: pages freed a moment ago are
// taken again at once, where on a VM whose free memory goes back to its host
// each new page is a fault on the host (a 50 M-event trace of 4.5 GB took 23 s,
// 20 of them in the kernel's copy into such pages; BENCHMARKS.md, issue 14).
// The threshold is large enough that a trace of one update (megabytes) or a
// burst (tens of them) never reaches it: advising the kernel costs this
// thread the writeback it starts (~0.8 us a page), worth it only when the
// pages are taken again. Variables for the tests.
var (
	dropFrom int64 = 256 << 20
	dropStep int64 = 32 << 20
)

// Reservations grow with the file (half of what it holds, within these
// bounds): a small trace reserves little, a large one calls fallocate
// rarely, and what a killed process leaves reserved past its end is at
// most a third of its size or maxReserve.
const (
	minReserve = 1 << 20
	maxReserve = 16 << 20
)

func reserving(f *outfile.File) *reservingFile { return &reservingFile{File: f, raw: -1} }

func (f *reservingFile) Write(b []byte) (int, error) {
	if end := f.written + int64(len(b)); end > f.reserved && !f.cannot {
		f.reserve(end)
	}
	if f.raw >= 0 {
		n, err := rawWrite(f.raw, b)
		f.written += int64(n)
		if err != nil {
			return n, &os.PathError{Op: "write", Path: f.Name(), Err: err}
		}
		if f.written >= dropFrom && f.written-f.started >= dropStep && !f.keepPages {
			f.dropBehind()
		}
		return n, nil
	}
	n, err := f.File.Write(b)
	f.written += int64(n)
	if err == nil && !f.checked && f.File.Settled() {
		f.checked = true
		_ = f.control(func(fd int) {
			var st syscall.Stat_t
			if syscall.Fstat(fd, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFREG {
				f.raw = fd
			}
		})
	}
	return n, err
}

// rawWrite writes all of b to fd, a regular file, without telling Go's
// scheduler: a write of a chunk into the page cache takes 50-300 us, and a
// thread in a system call that long has its P taken away by the runtime's
// monitor (GOMAXPROCS is 1: DefaultMaxProcs), which wakes another thread to
// find nothing to run and keeps polling every 20 us while writes go on --
// about a fifth of the process's CPU in a burst of spans (BENCHMARKS.md,
// issue 14). A regular file's write does not wait on anything but the disk,
// and the drainer holds mu while it writes, so the goroutines this delays
// would wait for it anyway. A pipe or a device (which may block for good)
// is written through os.File.
func rawWrite(fd int, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&b[n])), uintptr(len(b)-n))
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return n, e
		}
		if r == 0 {
			return n, io.ErrShortWrite
		}
		n += int(r)
	}
	return n, nil
}

// dropBehind advises the kernel that the last three steps' pages are not
// needed: the oldest steps' pages, written back since an earlier call began
// their writeback, leave the page cache; the newest's writeback begins
// (POSIX_FADV_DONTNEED writes dirty pages back without waiting, and drops
// the clean ones). Nothing waits for the disk. Advice only: a refusal (a
// file system without it) leaves the page cache as it is, for good.
func (f *reservingFile) dropBehind() {
	const dontNeed = 4 // POSIX_FADV_DONTNEED
	if f.started == 0 {
		// The first step advises its own pages only: what came before is the
		// kernel's to write back, as a short trace's is. Advising it too would
		// have this thread start the writeback of dropFrom bytes at once (a
		// 72 MB burst spent 11% of its process's CPU in that call).
		f.dropped = max(f.written-dropStep, 0)
		f.prev, f.started = f.dropped, f.dropped
	}
	if fadvise(f.raw, f.dropped, f.written-f.dropped, dontNeed) != nil {
		f.keepPages = true
		return
	}
	f.dropped, f.prev, f.started = f.prev, f.started, f.written
}

// fadvise is a raw call, as rawWrite's write is (the drainer holds mu while
// it writes either way).
func fadvise(fd int, off, n int64, advice int) error {
	if _, _, e := syscall.RawSyscall6(syscall.SYS_FADVISE64, uintptr(fd), uintptr(off), uintptr(n), uintptr(advice), 0, 0); e != 0 {
		return e
	}
	return nil
}

// reserve reserves blocks up to at least end.
func (f *reservingFile) reserve(end int64) {
	step := min(max(f.written/2, minReserve), maxReserve)
	from := max(f.reserved, f.written)
	var err error
	if cerr := f.control(func(fd int) {
		err = syscall.Fallocate(fd, 1 /* FALLOC_FL_KEEP_SIZE */, from, end+step-from)
	}); cerr != nil || err != nil {
		f.cannot = true
		return
	}
	f.reserved = end + step
}

func (f *reservingFile) control(fn func(fd int)) error {
	raw, err := f.File.SyscallConn()
	if err != nil {
		return err
	}
	return raw.Control(func(fd uintptr) { fn(int(fd)) })
}

// Close gives back the blocks reserved past the end (a truncation to the
// size the file has), then closes it.
func (f *reservingFile) Close() error {
	if f.reserved > f.written {
		_ = f.control(func(fd int) {
			var st syscall.Stat_t
			if syscall.Fstat(fd, &st) == nil {
				_ = syscall.Ftruncate(fd, st.Size)
			}
		})
	}
	return f.File.Close()
}

// WriteString is Write of s (the embedded file's would not count it).
func (f *reservingFile) WriteString(s string) (int, error) { return f.Write([]byte(s)) }
