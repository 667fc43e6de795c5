// Package cupti is candle-trace's CUPTI activity collector: every kernel,
// memcpy and memset the GPU runs while it collects becomes a device_interval
// event, attributed to the span that was innermost on the launching thread
// when the work was launched.
//
// The C half (collector.c) dlopens libcupti (nothing of CUDA is needed to
// build or link), records correlation id -> span at the entry of every
// launching CUDA API call, and queues the activity buffers CUPTI completes.
// This Go half decodes them on its own goroutine, maps CUPTI's timestamps to
// the session clock (clock.go) and writes the events through the session.
package cupti

/*
#cgo CFLAGS: -O2 -std=gnu11 -Wall
#cgo LDFLAGS: -ldl -lpthread
#include <stdlib.h>
#include <string.h>
#include "collector.h"

typedef int (*ct_callback_name_fn)(int, uint32_t, const char **);
static const char *ct_cupti_callback_name(int domain, uint32_t cbid) {
    ct_callback_name_fn f = (ct_callback_name_fn)ct_cupti_sym("cuptiGetCallbackName");
    const char *name = NULL;
    return f && f(domain, cbid, &name) == 0 && name ? name : "";
}
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/candle-trace/candle-trace/internal/cterr"
	"github.com/candle-trace/candle-trace/internal/events"
)

// LibraryEnv names a libcupti to load first (a file, or a folder holding one).
const LibraryEnv = "CANDLE_TRACE_CUPTI_LIB"

// Sonames are tried, after LibraryEnv and Options.Library, through the
// dynamic loader's search path.
var Sonames = []string{"libcupti.so.12", "libcupti.so.13", "libcupti.so"}

// Buffer sizes handed to CUPTI.
const (
	MinBufferBytes     = 1 << 20
	MaxBufferBytes     = 10 << 20
	DefaultBufferBytes = 4 << 20
	// DefaultMaxBuffers bounds the buffers CUPTI and the decoder hold at
	// once (DefaultMaxBuffers x the buffer size of memory); past it CUPTI
	// drops records, and counts them.
	DefaultMaxBuffers = 64
	// DefaultDrainInterval is how often completed buffers are asked for
	// (cuptiActivityFlushAll(0)), decoded and written.
	DefaultDrainInterval = 200 * time.Millisecond
	// DefaultClockTries is how many clock readings each clock anchor takes
	// the best of.
	DefaultClockTries = 32
)

// Labels of what the collector states in the trace, as scalar tensor_stats
// on the root span s1.
const (
	// LabelDropped is the number of activity records CUPTI dropped
	// (cuptiActivityGetNumDroppedRecords, summed): device work the trace
	// lacks. Written at stop (and before a finish), 0 included; the last one
	// is the total.
	LabelDropped = "cupti/dropped_records"
)

// Sink is what the collector writes into: the session.
type Sink interface {
	Handle() uint64
	Now() uint64
	RecordDeviceInterval(span uint64, d *events.DeviceInterval) error
	RecordScalar(span uint64, label string, v float64) error
}

// Options configures Start. The zero value takes every default.
type Options struct {
	// Library is a libcupti path (a file, or a folder holding one), tried
	// right after LibraryEnv: ct_device_start's "cupti_lib".
	Library string
	// BufferBytes is the size of each activity buffer, clamped to
	// [MinBufferBytes, MaxBufferBytes].
	BufferBytes int
	// MaxBuffers bounds the buffers allocated at once.
	MaxBuffers int
	// DrainInterval is the period of the decoding goroutine.
	DrainInterval time.Duration
	// ClockTries is how many readings each clock anchor takes the best of.
	ClockTries int
	// Sonames replaces the package's Sonames (tests); nil keeps them.
	Sonames []string
	// LookupEnv replaces os.LookupEnv (tests).
	LookupEnv func(string) (string, bool)
	// Executable replaces os.Executable (tests).
	Executable func() (string, error)
	// Argv0 replaces reading the process's argv[0] (tests).
	Argv0 func() string
	// MainThreadFallback attributes work launched from a thread with no open
	// span to the session's main thread's innermost span (counted in
	// Stats.Borrowed) instead of the root s1.
	MainThreadFallback bool
}

func (o *Options) defaults() {
	if o.BufferBytes == 0 {
		o.BufferBytes = DefaultBufferBytes
	}
	o.BufferBytes = min(max(o.BufferBytes, MinBufferBytes), MaxBufferBytes)
	if o.MaxBuffers <= 1 {
		o.MaxBuffers = DefaultMaxBuffers
	}
	if o.DrainInterval <= 0 {
		o.DrainInterval = DefaultDrainInterval
	}
	if o.ClockTries <= 0 {
		o.ClockTries = DefaultClockTries
	}
	if o.LookupEnv == nil {
		o.LookupEnv = os.LookupEnv
	}
	if o.Executable == nil {
		o.Executable = os.Executable
	}
	if o.Argv0 == nil {
		o.Argv0 = procArgv0
	}
	if o.Sonames == nil {
		o.Sonames = Sonames
	}
}

// Stats counts what the collector did.
type Stats struct {
	Library        string // the libcupti loaded
	Intervals      uint64 // device_interval events written
	Kernels        uint64
	Memcpys        uint64
	Memsets        uint64
	Launches       uint64 // launching API entries whose span was recorded
	Borrowed       uint64 // of those, from a thread with no open span, given the main thread's innermost (MainThreadFallback)
	Unattributed   uint64 // records whose launch was not recorded: written on s1
	Reattributed   uint64 // records whose span the session no longer knew: written on s1
	Dropped        uint64 // records CUPTI dropped (cuptiActivityGetNumDroppedRecords)
	Incomplete     uint64 // device records without timestamps: not written
	APIRecords     uint64 // runtime/driver API records: not written
	OtherRecords   uint64 // records of other kinds: not written
	BadRecords     uint64 // cuptiActivityGetNextRecord errors (the rest of that buffer is lost)
	Buffers        uint64 // buffers completed
	BuffersRefused uint64 // buffer requests refused (too many outstanding)
	BuffersFresh   uint64 // buffers handed to CUPTI newly allocated, not from the pool of buffers already written
	FlushTimeouts  uint64 // forced flushes that gave up waiting for a buffer CUPTI kept (its records may be lost)
	ClockAnchors   int
	ClockBoundNs   uint64 // the largest error bound of a written interval's start
	Refused        uint64 // records the session refused (InvalidArgument): not written
	LastError      string // the last write the session refused
}

// Collector is the running CUPTI collector of one session.
type Collector struct {
	sink Sink
	opts Options

	mu          sync.Mutex // decoding and stating (the loop, Flush, Stop)
	clock       clockMap
	names       map[uintptr]string
	labels      map[uint64]string     // "cuda:N" and stream ids, spelled once
	iv          events.DeviceInterval // the interval being written (reused: the session encodes at once)
	stats       Stats
	stated      bool
	statedValue uint64
	stop, done  chan struct{}
	stopped     bool
	final       *Stats // the counters at Stop (the C ones restart with the next Start)
	recs        []C.ct_cupti_rec
}

var startMu sync.Mutex // one Start at a time (the C side holds the subscriber)

// Start loads libcupti, subscribes, enables the activity kinds and starts the
// decoding goroutine. Errors are CT_ERR_UNAVAILABLE naming what is missing:
// no libcupti, another CUPTI subscriber (a profiler) in the process, another
// session collecting, or CUPTI refusing (no driver, no permission).
func Start(sink Sink, o Options) (*Collector, error) {
	o.defaults()
	startMu.Lock()
	defer startMu.Unlock()
	path, adopted, err := load(o)
	if err != nil {
		return nil, err
	}
	if adopted {
		// A libcupti the process loaded itself (PyPI's torch 2.x loads one into every
		// process) is used as it is, and some crash without a driver at their first
		// call (CUDA 13.2's cuptiGetTimestamp): the driver is asked first.
		var buf [512]C.char
		if C.ct_cuda_probe(&buf[0], C.size_t(len(buf))) != 0 {
			return nil, unavailable("CUPTI could not start: CUDA is not usable here: %s (the process had already loaded %s, so no other libcupti is tried)", C.GoString(&buf[0]), path)
		}
	}
	c := newCollector(sink, o)
	c.stats.Library = path
	// The first anchor precedes every record: CUPTI is enabled after it.
	a, err := bestAnchor(o.ClockTries, c.readClock)
	if err != nil {
		return nil, unavailable("CUPTI could not start: %v: CUDA is not usable here: %s (%s was loaded)", err, cudaProblem(), path)
	}
	c.clock.add(a)
	var res C.CUptiResult
	var kind C.int
	borrow := C.int(0)
	if o.MainThreadFallback {
		borrow = 1
	}
	stage := C.ct_cupti_start(C.uint64_t(sink.Handle()), C.size_t(o.BufferBytes), C.int(o.MaxBuffers), borrow, &res, &kind)
	if stage != C.CT_CUPTI_STAGE_OK {
		return nil, startError(int(stage), int(res), int(kind), path)
	}
	c.stop, c.done = make(chan struct{}), make(chan struct{})
	go c.loop()
	return c, nil
}

func newCollector(sink Sink, o Options) *Collector {
	return &Collector{sink: sink, opts: o, names: map[uintptr]string{}, labels: map[uint64]string{},
		recs: make([]C.ct_cupti_rec, 256)}
}

func (c *Collector) readClock() (h0, cu, h1 uint64, err error) {
	var a, b, x C.uint64_t
	r := C.ct_cupti_clock_read(C.uint64_t(c.sink.Handle()), &a, &x, &b)
	if r != C.CUPTI_SUCCESS {
		return 0, 0, 0, fmt.Errorf("cuptiGetTimestamp returned %s", resultName(int(r)))
	}
	return uint64(a), uint64(x), uint64(b), nil
}

func (c *Collector) loop() {
	defer close(c.done)
	t := time.NewTicker(c.opts.DrainInterval)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		C.ct_cupti_flush(0)
		if err := c.process(); err != nil {
			return // the session is gone: Stop still releases CUPTI
		}
	}
}

// Flush forces every buffer out of CUPTI (records of work still running come
// out incomplete and are counted, not written), waits until every buffer
// CUPTI held is back (one another thread was still delivering included),
// writes what they hold and states the dropped records so far: what a finish
// needs before its terminal line. The collector keeps running.
func (c *Collector) Flush() error {
	c.mu.Lock()
	stopped := c.stopped
	c.mu.Unlock()
	if stopped {
		return nil
	}
	C.ct_cupti_flush(1)
	if err := c.process(); err != nil {
		return err
	}
	return c.stateDropped()
}

// Stop flushes, disables CUPTI, writes what is left and states the dropped
// records. Safe to call more than once; later calls do nothing. Work still
// running on the device at Stop is not traced: synchronize first.
func (c *Collector) Stop() error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	c.mu.Unlock()
	close(c.stop)
	<-c.done
	// Under startMu: no other session may take CUPTI (and reset the
	// correlation table) before the last records are decoded.
	startMu.Lock()
	defer startMu.Unlock()
	C.ct_cupti_stop()
	err := c.process() // takes the stop anchor
	if serr := c.stateDropped(); err == nil {
		err = serr
	}
	c.mu.Lock()
	final := c.statsLocked()
	c.final = &final
	c.mu.Unlock()
	return err
}

// Stats returns the counters so far (after Stop: the final ones).
func (c *Collector) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.final != nil {
		return *c.final
	}
	return c.statsLocked()
}

func (c *Collector) statsLocked() Stats {
	var k C.ct_cupti_counters
	C.ct_cupti_read_counters(&k)
	s := c.stats
	s.Launches = uint64(k.launches)
	s.Borrowed = uint64(k.borrowed)
	s.Unattributed = uint64(k.unattributed)
	s.Dropped = uint64(k.dropped)
	s.Incomplete = uint64(k.incomplete)
	s.APIRecords = uint64(k.api_records)
	s.OtherRecords = uint64(k.other_records)
	s.BadRecords = uint64(k.bad_records)
	s.Buffers = uint64(k.buffers)
	s.BuffersRefused = uint64(k.buffers_refused)
	s.BuffersFresh = uint64(k.buffers_fresh)
	s.FlushTimeouts = uint64(k.flush_timeouts)
	s.ClockAnchors = len(c.clock.anchors)
	return s
}

// stateDropped writes LabelDropped on s1 unless the same total was stated.
func (c *Collector) stateDropped() error {
	C.ct_cupti_poll_dropped()
	var k C.ct_cupti_counters
	C.ct_cupti_read_counters(&k)
	total := uint64(k.dropped)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stated && c.statedValue == total {
		return nil
	}
	if err := c.sink.RecordScalar(1, LabelDropped, float64(total)); err != nil {
		return err
	}
	c.stated, c.statedValue = true, total
	return nil
}

// process decodes and writes every completed buffer. A refusal by the
// session (finished, poisoned) ends writing; the buffers are freed anyway.
func (c *Collector) process() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := C.ct_cupti_take()
	if b == nil {
		return nil
	}
	// Every record of a taken buffer ended before the buffer was handed
	// over, so before this anchor: its timestamps interpolate, never
	// extrapolate.
	if a, err := bestAnchor(c.opts.ClockTries, c.readClock); err == nil {
		c.clock.add(a)
	}
	var werr error
	for b != nil {
		next := b.next
		if werr == nil {
			werr = c.writeBuffer(b)
		}
		C.ct_cupti_buf_free(b)
		b = next
	}
	return werr
}

// writeBuffer decodes one buffer and writes its intervals; c.mu is held.
func (c *Collector) writeBuffer(b *C.ct_cupti_buf) error {
	for {
		n := int(C.ct_cupti_decode(b, &c.recs[0], C.int(len(c.recs))))
		if n == 0 {
			return nil
		}
		for i := 0; i < n; i++ {
			if err := c.write(&c.recs[i]); err != nil {
				return err
			}
		}
	}
}

// writeRecords decodes data, laid out as CUPTI lays out an activity
// buffer, with the loaded libcupti's own record walker, and writes what it
// holds, as process does with a buffer CUPTI completed. Tests use it to run
// NVIDIA's walker on a machine without a GPU.
func (c *Collector) writeRecords(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	p := C.aligned_alloc(8, C.size_t((len(data)+7)&^7)) // CUPTI's record alignment
	if p == nil {
		return &cterr.Error{Code: cterr.Internal, Msg: "no memory for an activity buffer"}
	}
	defer C.free(p)
	C.memcpy(p, unsafe.Pointer(&data[0]), C.size_t(len(data)))
	b := C.ct_cupti_buf{data: (*C.uint8_t)(p), valid: C.size_t(len(data))}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writeBuffer(&b)
}

// Names of CUpti_ActivityMemcpyKind, as Nsight shows them.
var copyKinds = [...]string{"", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"}

func (c *Collector) name(r *C.ct_cupti_rec) string {
	switch r.kind {
	case C.CT_CUPTI_REC_KERNEL:
		p := uintptr(unsafe.Pointer(r.name))
		if p == 0 {
			return ""
		}
		if n, ok := c.names[p]; ok {
			return n
		}
		var n string
		if d := C.ct_cupti_demangle(r.name); d != nil {
			n = C.GoString(d)
			C.free(unsafe.Pointer(d))
		} else {
			n = C.GoString(r.name)
		}
		if !utf8.ValidString(n) {
			n = strings.ToValidUTF8(n, "\uFFFD")
		}
		if len(c.names) < 1<<16 {
			c.names[p] = n
		}
		return n
	case C.CT_CUPTI_REC_MEMCPY:
		if k := int(r.copy_kind); k > 0 && k < len(copyKinds) {
			return "memcpy " + copyKinds[k]
		}
		return "memcpy"
	default:
		return "memset"
	}
}

// label spells a device ("cuda:N") or a stream id once and reuses it: a
// step launches thousands of kernels on a handful of devices and streams.
func (c *Collector) label(id uint32, device bool) string {
	key := uint64(id)
	if device {
		key |= 1 << 32
	}
	if l, ok := c.labels[key]; ok {
		return l
	}
	l := strconv.FormatUint(uint64(id), 10)
	if device {
		l = "cuda:" + l
	}
	if len(c.labels) < 4096 {
		c.labels[key] = l
	}
	return l
}

// write maps r onto the session clock and records it on its span (s1 when
// the launch was not seen, or when the session no longer knows the span).
func (c *Collector) write(r *C.ct_cupti_rec) error {
	start, bound := c.clock.toSession(uint64(r.start))
	dur := uint64(r.end - r.start)
	if dur == 0 {
		dur = 1 // shorter than the GPU timer's tick
	}
	// Keep the interval inside [0, now]: only the mapping error (bound) can
	// push it out.
	if now := c.sink.Now(); start+int64(dur) > int64(now) {
		start = int64(now) - int64(dur)
	}
	if start < 0 {
		start = 0
	}
	c.stats.ClockBoundNs = max(c.stats.ClockBoundNs, bound)
	c.iv = events.DeviceInterval{
		Device:           c.label(uint32(r.device_id), true),
		StreamID:         c.label(uint32(r.stream_id), false),
		ClockID:          "host-monotonic",
		Backend:          "cuda",
		Name:             c.name(r),
		StartNs:          uint64(start),
		DurationNs:       dur,
		CorrelationID:    uint64(r.correlation_id),
		HasCorrelationID: true,
	}
	span := uint64(r.span)
	if span == 0 {
		span = 1
	}
	err := c.sink.RecordDeviceInterval(span, &c.iv)
	if err != nil && span != 1 && cterr.CodeOf(err) == cterr.InvalidHandle {
		// The span closed too long ago for the session to check against.
		c.stats.Reattributed++
		err = c.sink.RecordDeviceInterval(1, &c.iv)
	}
	if err != nil {
		c.stats.LastError = err.Error()
		if cterr.CodeOf(err) == cterr.InvalidArgument {
			c.stats.Refused++ // this record only: go on with the others
			return nil
		}
		return err // the session is finished or poisoned: stop writing
	}
	c.stats.Intervals++
	switch r.kind {
	case C.CT_CUPTI_REC_KERNEL:
		c.stats.Kernels++
	case C.CT_CUPTI_REC_MEMCPY:
		c.stats.Memcpys++
	default:
		c.stats.Memsets++
	}
	return nil
}

// ---- watched API functions -------------------------------------------------

// Callback domains of the CUDA API functions the collector watches.
const (
	domainDriver  = int(C.CUPTI_CB_DOMAIN_DRIVER_API)
	domainRuntime = int(C.CUPTI_CB_DOMAIN_RUNTIME_API)
)

// watchedCallbacks lists the callback ids (CUpti_CallbackId) whose entry
// the collector watches, with their header names, by domain.
func watchedCallbacks() map[int]map[uint32]string {
	out := map[int]map[uint32]string{domainDriver: {}, domainRuntime: {}}
	rt := unsafe.Slice((*C.ct_cupti_cbid)(unsafe.Pointer(&C.ct_cupti_runtime_cbids)), int(C.ct_cupti_n_runtime_cbids))
	for _, c := range rt {
		out[domainRuntime][uint32(c.cbid)] = C.GoString(c.name)
	}
	drv := unsafe.Slice((*C.ct_cupti_cbid)(unsafe.Pointer(&C.ct_cupti_driver_cbids)), int(C.ct_cupti_n_driver_cbids))
	for _, c := range drv {
		out[domainDriver][uint32(c.cbid)] = C.GoString(c.name)
	}
	return out
}

// callbackName is the loaded libcupti's name for a callback id
// (cuptiGetCallbackName), "" when it does not know the id.
func callbackName(domain int, cbid uint32) string {
	return C.GoString(C.ct_cupti_callback_name(C.int(domain), C.uint32_t(cbid)))
}

// ---- loading ---------------------------------------------------------------

// Candidates lists the libcupti paths Start tries, in order: LibraryEnv,
// o.Library, the Sonames (the dynamic loader's search), then the copies the
// nvidia-cuda-cupti(-cu12) Python packages install
// (site-packages/nvidia/cuda_cupti/lib, .../nvidia/cu13/lib) under every
// site-packages folder the environment names (PYTHONPATH, VIRTUAL_ENV,
// CONDA_PREFIX) and, when this process is a Python, under its own
// (pythonSites), then the CUDA toolkit's (CUDA_HOME, CUDA_PATH,
// /usr/local/cuda: extras/CUPTI/lib64).
func Candidates(o Options) []string {
	o.defaults()
	var out []string
	seen := map[string]bool{}
	add := func(p string) {
		if p != "" && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	addPath := func(p string) {
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			found := false
			for _, n := range Sonames {
				if fileExists(filepath.Join(p, n)) {
					add(filepath.Join(p, n))
					found = true
				}
			}
			if !found {
				add(filepath.Join(p, Sonames[0])) // so that the error names the folder
			}
			return
		}
		add(p)
	}
	if v, ok := o.LookupEnv(LibraryEnv); ok {
		addPath(strings.TrimSpace(v))
	}
	addPath(o.Library)
	for _, n := range o.Sonames {
		add(n)
	}
	var sites []string
	if v, ok := o.LookupEnv("PYTHONPATH"); ok {
		sites = append(sites, filepath.SplitList(v)...)
	}
	for _, env := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if v, ok := o.LookupEnv(env); ok && v != "" {
			m, _ := filepath.Glob(filepath.Join(v, "lib", "python3*", "site-packages"))
			newestPythonFirst(m)
			sites = append(sites, m...)
		}
	}
	sites = append(sites, pythonSites(o)...)
	for _, s := range sites {
		for _, rel := range []string{"nvidia/cuda_cupti/lib/libcupti.so.12", "nvidia/cu13/lib/libcupti.so.13"} {
			if p := filepath.Join(s, rel); fileExists(p) {
				add(p)
			}
		}
	}
	var homes []string
	for _, env := range []string{"CUDA_HOME", "CUDA_PATH"} {
		if v, ok := o.LookupEnv(env); ok && v != "" {
			homes = append(homes, v)
		}
	}
	for _, h := range append(homes, "/usr/local/cuda") {
		if p := filepath.Join(h, "extras", "CUPTI", "lib64", "libcupti.so"); fileExists(p) {
			add(p)
		}
	}
	return out
}

// pythonSites are the site-packages folders of the Python running this
// process, when it is one, in the order Python searches them (its
// virtualenv's, then the user site): where `pip install
// nvidia-cuda-cupti-cu12` puts libcupti without an activated virtualenv.
// The drop-in starts CUPTI before the script imports torch, so it must find
// that copy by itself.
func pythonSites(o Options) []string {
	exe, err := o.Executable()
	base := filepath.Base(exe)
	if err != nil || !strings.HasPrefix(base, "python") {
		return nil
	}
	version := "python3*"
	if v := strings.TrimPrefix(base, "python"); strings.HasPrefix(v, "3.") {
		version = base // the resolved interpreter names its version: python3.11
	}
	prefix := filepath.Dir(filepath.Dir(exe))
	var patterns []string
	if venv := virtualenvOf(o); venv != "" {
		patterns = append(patterns, filepath.Join(venv, "lib", version, "site-packages"))
	}
	if home, ok := o.LookupEnv("HOME"); ok && home != "" {
		patterns = append(patterns, filepath.Join(home, ".local", "lib", version, "site-packages"))
	}
	patterns = append(patterns,
		filepath.Join(prefix, "local", "lib", version, "dist-packages"), // Debian and Ubuntu: pip's system installs
		filepath.Join(prefix, "lib", version, "dist-packages"),
		filepath.Join(prefix, "lib", version, "site-packages"))
	var out []string
	for _, p := range patterns {
		m, _ := filepath.Glob(p)
		newestPythonFirst(m)
		out = append(out, m...)
	}
	return out
}

// virtualenvOf finds the virtualenv this Python runs in, as Python itself
// does: a venv's python is a link to the base interpreter (which is all the
// executable's path shows), so the venv is found from the path the process
// was started by (argv[0], looked up in PATH) and the pyvenv.cfg above it.
// "" when there is none: no VIRTUAL_ENV is needed for an unactivated venv.
func virtualenvOf(o Options) string {
	a := o.Argv0()
	if a == "" {
		return ""
	}
	if !strings.ContainsRune(a, '/') {
		path, _ := o.LookupEnv("PATH")
		found := ""
		for _, d := range filepath.SplitList(path) {
			if d == "" {
				d = "."
			}
			if p := filepath.Join(d, a); fileExists(p) {
				found = p
				break
			}
		}
		if found == "" {
			return ""
		}
		a = found
	}
	root := filepath.Dir(filepath.Dir(a)) // argv[0] as given: its links not followed
	if fileExists(filepath.Join(root, "pyvenv.cfg")) {
		return root
	}
	return ""
}

// procArgv0 is this process's argv[0] ("" when /proc cannot tell).
func procArgv0() string {
	b, err := os.ReadFile("/proc/self/cmdline")
	if err != nil {
		return ""
	}
	a, _, _ := strings.Cut(string(b), "\x00")
	return a
}

var pythonVersion = regexp.MustCompile(`python3\.(\d+)`)

// newestPythonFirst orders site-packages folders of several Pythons by
// version, newest first (3.11 before 3.9, which a string sort gets wrong).
func newestPythonFirst(dirs []string) {
	minor := func(p string) int {
		if m := pythonVersion.FindStringSubmatch(p); m != nil {
			n, _ := strconv.Atoi(m[1])
			return n
		}
		return -1
	}
	sort.SliceStable(dirs, func(i, j int) bool { return minor(dirs[i]) > minor(dirs[j]) })
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// load loads the first candidate that works: first one already in the
// process (PyTorch loads its libcupti.so.12; a second CUPTI in one process
// would fight the first), then the first that loads.
// load finds libcupti: the one loaded before, else the first candidate the
// process has already loaded (a second CUPTI would fight it; adopted unless the
// user named it), else the first that loads.
func load(o Options) (path string, adopted bool, err error) {
	if p := C.GoString(C.ct_cupti_loaded_path()); p != "" {
		return p, false, nil
	}
	cands := Candidates(o)
	var errbuf [1024]C.char
	try := func(p string, noload bool) (bool, string) {
		cp := C.CString(p)
		defer C.free(unsafe.Pointer(cp))
		nl := C.int(0)
		if noload {
			nl = 1
		}
		rc := C.ct_cupti_load(cp, nl, &errbuf[0], C.size_t(len(errbuf)))
		return rc == 0, C.GoString(&errbuf[0])
	}
	for _, p := range cands {
		if ok, _ := try(p, true); ok {
			return p, !named(o, p), nil
		}
	}
	var why []string
	for _, p := range cands {
		ok, msg := try(p, false)
		if ok {
			return p, false, nil
		}
		why = append(why, msg)
	}
	msg := strings.Join(why, "; ")
	if len(msg) > 700 {
		msg = msg[:700] + " ..."
	}
	return "", false, unavailable("CUPTI is unavailable: no libcupti could be loaded (%s). Set %s to libcupti.so's path, install the CUDA toolkit's CUPTI, or pip install nvidia-cuda-cupti-cu12", msg, LibraryEnv)
}

// named reports whether p is the library (or in the folder) that LibraryEnv or
// Options.Library names: the user's choice, not one the process happened to load.
func named(o Options, p string) bool {
	var names []string
	if v, ok := o.LookupEnv(LibraryEnv); ok {
		names = append(names, strings.TrimSpace(v))
	}
	names = append(names, o.Library)
	for _, n := range names {
		if n != "" && (p == n || filepath.Dir(p) == filepath.Clean(n)) {
			return true
		}
	}
	return false
}

// ---- errors ----------------------------------------------------------------------

var resultNames = map[int]string{
	0: "CUPTI_SUCCESS", 1: "CUPTI_ERROR_INVALID_PARAMETER", 2: "CUPTI_ERROR_INVALID_DEVICE",
	3: "CUPTI_ERROR_INVALID_CONTEXT", 7: "CUPTI_ERROR_INVALID_OPERATION", 8: "CUPTI_ERROR_OUT_OF_MEMORY",
	11: "CUPTI_ERROR_API_NOT_IMPLEMENTED", 12: "CUPTI_ERROR_MAX_LIMIT_REACHED",
	14: "CUPTI_ERROR_NOT_COMPATIBLE", 15: "CUPTI_ERROR_NOT_INITIALIZED", 21: "CUPTI_ERROR_INVALID_KIND",
	27: "CUPTI_ERROR_NOT_SUPPORTED", 33: "CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED",
	35: "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES", 36: "CUPTI_ERROR_OLD_PROFILER_API_INITIALIZED",
	39: "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED", 999: "CUPTI_ERROR_UNKNOWN",
}

// resultName spells a CUptiResult with its number and CUPTI's own text.
func resultName(r int) string {
	n, ok := resultNames[r]
	if !ok {
		n = "CUPTI error"
	}
	s := fmt.Sprintf("%s (%d)", n, r)
	if text := C.GoString(C.ct_cupti_result_string(C.CUptiResult(r))); text != "" && text != n {
		s += ": " + text
	}
	return s
}

var kindNames = map[int]string{1: "MEMCPY", 2: "MEMSET", 4: "DRIVER", 5: "RUNTIME", 10: "CONCURRENT_KERNEL"}

func startError(stage, res, kind int, path string) error {
	switch stage {
	case C.CT_CUPTI_STAGE_BUSY:
		return unavailable("CUPTI already collects for another session in this process (CUPTI allows one subscriber per process); ct_device_stop that session's collectors first")
	case C.CT_CUPTI_STAGE_SUBSCRIBE:
		switch res {
		case C.CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
			return unavailable("CUPTI is held by another profiler in this process (torch.profiler, Nsight Systems, Nsight Compute or another CUPTI tool): cuptiSubscribe returned %s; only one CUPTI subscriber may exist per process, so stop that profiler or start with {\"collect\":[\"nvml\"]}", resultName(res))
		case C.CUPTI_ERROR_INSUFFICIENT_PRIVILEGES:
			return unavailable("CUPTI refuses this user: cuptiSubscribe returned %s (the driver restricts GPU profiling to admin users: NVreg_RestrictProfilingToAdminUsers=0, or run as root)", resultName(res))
		case C.CUPTI_ERROR_NOT_INITIALIZED:
			return unavailable("CUPTI could not start: cuptiSubscribe returned %s: CUDA is not usable here: %s (%s was loaded)", resultName(res), cudaProblem(), path)
		}
		return unavailable("CUPTI could not start: cuptiSubscribe returned %s (%s)", resultName(res), path)
	case C.CT_CUPTI_STAGE_CALLBACKS:
		return unavailable("CUPTI could not start: cuptiEnableCallback refused every CUDA launch function (%s)", path)
	case C.CT_CUPTI_STAGE_BUFFERS:
		return unavailable("CUPTI could not start: cuptiActivityRegisterCallbacks returned %s (%s)", resultName(res), path)
	case C.CT_CUPTI_STAGE_ENABLE:
		return unavailable("CUPTI could not start: cuptiActivityEnable(CUPTI_ACTIVITY_KIND_%s) returned %s (%s)", kindNames[kind], resultName(res), path)
	case C.CT_CUPTI_STAGE_MEMORY:
		return &cterr.Error{Code: cterr.Internal, Msg: "CUPTI could not start: no memory for the correlation table"}
	}
	return unavailable("CUPTI could not start (stage %d)", stage)
}

// cudaProblem says what keeps CUDA from starting, for errors that only know
// CUPTI found none.
func cudaProblem() string {
	var buf [512]C.char
	if C.ct_cuda_probe(&buf[0], C.size_t(len(buf))) == 0 {
		return "the driver initialises, yet CUPTI saw no CUDA (a CUPTI older than the driver, or one from another CUDA major version?)"
	}
	return C.GoString(&buf[0])
}

func unavailable(format string, args ...any) error {
	return &cterr.Error{Code: cterr.Unavailable, Msg: fmt.Sprintf(format, args...)}
}
