package cupti

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/cuda/cupti/cuptitest"
	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/session"
	"github.com/candle-trace/candle-trace/internal/testutil"
)

// The fake libcupti and the collector are both one per process, so these
// tests run one after another, each on its own session.

const run = `{"entrypoint":"test::cupti","phase":"train","capture_step":1,"device":"cuda:0","measured_root":true}`

func noEnv(string) (string, bool) { return "", false }

func fakeOptions(t testing.TB) (Options, *cuptitest.Fake) {
	path := cuptitest.Build(t)
	f := cuptitest.Open(t, path)
	f.Hold(false, 0)
	f.SetClock(0, 0, 0)
	f.SetDeliveryDelay(0)
	return Options{Library: path, Sonames: []string{}, LookupEnv: noEnv, DrainInterval: time.Hour}, f
}

func openSession(t testing.TB) (*session.Session, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	s, err := session.Open(path, []byte(run))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.FinishFailed("test cleanup") })
	return s, path
}

func num(t *testing.T, v any) uint64 {
	t.Helper()
	f, ok := v.(float64)
	require.True(t, ok, "%v is not a number", v)
	return uint64(f)
}

func requireCode(t *testing.T, err error, code session.Status, substr ...string) {
	t.Helper()
	require.Error(t, err)
	assert.Equal(t, code, session.CodeOf(err), err.Error())
	for _, s := range substr {
		assert.Contains(t, err.Error(), s)
	}
}

// launch is one simulated launch and the record it produces.
type launch struct {
	thread  int    // 0 or 1: which traced thread; -1: the test thread, no span
	kind    string // kernel, memcpy, memset
	name    string
	shown   string // the name in the trace when it is not name (kernels are demangled)
	stream  uint32
	dev     uint32
	startUs uint64 // after the launch, on CUPTI's clock
	durNs   uint64
	bytes   uint64
}

func TestCollectorDecodesAndAttributes(t *testing.T) {
	o, f := fakeOptions(t)
	const offset = int64(1_700_000_000_000_000_000) // CUPTI's clock: wall-clock-like
	// 3 readings in 4 wait 20 µs before reading: brackets that only the
	// smallest-bracket choice keeps out of the mapping.
	f.SetClock(offset, 20_000, 4)
	s, path := openSession(t)
	c, err := Start(s, o)
	require.NoError(t, err)
	assert.Equal(t, o.Library, c.Stats().Library)

	// Watched: the launch APIs, in both domains; not the others.
	assert.True(t, f.CallbackEnabled(cuptitest.DomainRuntime, cuptitest.CbidCudaLaunchKernel))
	assert.True(t, f.CallbackEnabled(cuptitest.DomainRuntime, cuptitest.CbidCudaMemcpyAsync))
	assert.True(t, f.CallbackEnabled(cuptitest.DomainDriver, cuptitest.CbidCuLaunchKernel))
	assert.False(t, f.CallbackEnabled(cuptitest.DomainRuntime, cuptitest.CbidCudaGetDevice))
	for _, k := range []int{cuptitest.KindConcurrentKernel, 1, 2, cuptitest.KindRuntime, cuptitest.KindDriver} {
		assert.True(t, f.KindEnabled(k), "kind %d", k)
	}

	launches := []launch{
		{thread: 0, kind: "kernel", name: "_Z5sgemmiiiPKfS0_Pf", shown: "sgemm(int, int, int, float const*, float const*, float*)", stream: 7, startUs: 5, durNs: 12_345},
		{thread: 0, kind: "kernel", name: "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_",
			shown:  "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)",
			stream: 7, startUs: 6, durNs: 2_000},
		{thread: 0, kind: "kernel", name: "_Z6sgemmPfS_S_", stream: 7, startUs: 7, durNs: 100}, // not a valid mangling: kept as it came
		{thread: 0, kind: "memcpy", name: "memcpy HtoD", stream: 7, startUs: 20, durNs: 4_000, bytes: 1 << 20},
		{thread: 1, kind: "kernel", name: "void at::native::vectorized_elementwise_kernel<4>", stream: 13, dev: 1, startUs: 8, durNs: 999},
		{thread: 1, kind: "memset", name: "memset", stream: 13, dev: 1, startUs: 30, durNs: 250, bytes: 4096},
		{thread: 1, kind: "kernel", name: "tiny", stream: 13, dev: 1, startUs: 40, durNs: 0}, // shorter than a GPU tick
	}
	type expect struct {
		launch
		cid, span, start uint64
	}
	var mu sync.Mutex
	var want []expect
	var inner [2]uint64
	var wg sync.WaitGroup
	for th := 0; th < 2; th++ {
		wg.Add(1)
		go func(th int) {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			outer, err := s.BeginSpan([]string{"forward", "backward"}[th], events.SpanFunction, events.StepNone)
			if !assert.NoError(t, err) {
				return
			}
			in, err := s.BeginSpan([]string{"matmul", "relu"}[th], events.SpanOp, events.StepNone)
			if !assert.NoError(t, err) {
				return
			}
			inner[th] = in
			for _, l := range launches {
				if l.thread != th {
					continue
				}
				var cid uint32
				start := f.Now() + l.startUs*1000
				switch l.kind {
				case "kernel":
					cid = f.API(cuptitest.DomainRuntime, cuptitest.CbidCudaLaunchKernel)
					f.Kernel(cid, l.name, l.dev, l.stream, start, start+l.durNs)
				case "memcpy":
					// The record carries the id of the driver call, which the
					// collector does not watch, and of the runtime call, which it does.
					rt := f.API(cuptitest.DomainRuntime, cuptitest.CbidCudaMemcpyAsync)
					cid = f.API(cuptitest.DomainDriver, 9999)
					f.Memcpy(cid, rt, cuptitest.CopyHtoD, l.bytes, l.dev, l.stream, start, start+l.durNs)
				case "memset":
					cid = f.API(cuptitest.DomainRuntime, cuptitest.CbidCudaMemsetAsync)
					f.Memset(cid, l.bytes, l.dev, l.stream, start, start+l.durNs)
				}
				mu.Lock()
				want = append(want, expect{l, uint64(cid), in, start})
				mu.Unlock()
			}
			assert.NoError(t, s.EndSpan(in))
			assert.NoError(t, s.EndSpan(outer))
		}(th)
	}
	wg.Wait()

	// On a thread with no open span: the root s1. Through an unwatched API:
	// unattributed, s1 too. Without timestamps: not written.
	runtime.LockOSThread()
	rootCid := f.API(cuptitest.DomainDriver, cuptitest.CbidCuLaunchKernel)
	start := f.Now() + 1000
	f.Kernel(rootCid, "root_kernel", 0, 0, start, start+100)
	unwatched := f.API(cuptitest.DomainRuntime, cuptitest.CbidCudaGetDevice)
	f.Kernel(unwatched, "unwatched_kernel", 0, 3, start, start+200)
	f.Kernel(f.API(cuptitest.DomainRuntime, cuptitest.CbidCudaLaunchKernel), "still_running", 0, 3, start, 0)
	runtime.UnlockOSThread()
	f.Drop(3)

	time.Sleep(2 * time.Millisecond) // every record ends before "now"
	require.NoError(t, c.Flush())
	require.NoError(t, c.Stop())
	require.NoError(t, c.Stop(), "Stop twice does nothing")
	require.NoError(t, c.Flush(), "Flush after Stop does nothing")
	assert.False(t, f.Subscribed())
	assert.False(t, f.KindEnabled(cuptitest.KindConcurrentKernel))
	st := c.Stats()
	require.NoError(t, s.Finish())

	evs := testutil.Lines(t, path)
	ivs := testutil.OfKind(evs, "device_interval")
	require.Len(t, ivs, len(launches)+2)
	assert.Equal(t, uint64(len(launches)+2), st.Intervals)
	kernels := 2 // root_kernel and unwatched_kernel
	for _, l := range launches {
		if l.kind == "kernel" {
			kernels++
		}
	}
	assert.Equal(t, uint64(kernels), st.Kernels)
	assert.Equal(t, uint64(1), st.Memcpys)
	assert.Equal(t, uint64(1), st.Memsets)
	assert.Equal(t, uint64(1), st.Incomplete)
	assert.Equal(t, uint64(3), st.Dropped)
	assert.Equal(t, uint64(1), st.Unattributed, "the unwatched launch (the memcpy is found by its runtime id)")
	assert.Equal(t, uint64(len(launches)+4), st.APIRecords, "one per simulated API call")
	assert.Zero(t, st.BadRecords)
	assert.GreaterOrEqual(t, st.Buffers, uint64(1))
	assert.Less(t, st.ClockBoundNs, uint64(10_000), "the 20 µs readings are never the anchors")

	byCid := map[uint64]map[string]any{}
	for _, iv := range ivs {
		assert.Equal(t, "host-monotonic", iv["clock_id"])
		assert.Equal(t, "cuda", iv["backend"])
		byCid[num(t, iv["correlation_id"])] = iv
	}
	t0 := s.MonotonicStart()
	for _, w := range want {
		iv := byCid[w.cid]
		require.NotNil(t, iv, "correlation id %d", w.cid)
		shown := w.name
		if w.shown != "" {
			shown = w.shown
		}
		assert.Equal(t, shown, iv["name"])
		assert.Equal(t, "cuda:"+strconv.FormatUint(uint64(w.dev), 10), iv["device"])
		assert.Equal(t, strconv.FormatUint(uint64(w.stream), 10), iv["stream_id"])
		assert.Equal(t, "s"+strconv.FormatUint(w.span, 10), iv["span_id"], "%s launched inside span s%d", w.name, w.span)
		assert.Equal(t, max(w.durNs, 1), num(t, iv["duration_ns"]))
		{
			truth := int64(w.start) - offset - int64(t0)
			got := int64(num(t, iv["start_ns"]))
			d := got - truth
			if d < 0 {
				d = -d
			}
			assert.LessOrEqual(t, uint64(d), st.ClockBoundNs+1, "%s: start %d, truth %d", w.name, got, truth)
		}
	}
	assert.Equal(t, "s1", byCid[uint64(rootCid)]["span_id"])
	assert.Equal(t, "root_kernel", byCid[uint64(rootCid)]["name"])
	assert.Equal(t, "s1", byCid[uint64(unwatched)]["span_id"])
	assert.NotEqual(t, inner[0], inner[1], "each thread's launches went to its own span")

	var dropped []map[string]any
	for _, e := range testutil.OfKind(evs, "tensor_stats") {
		if e["label"] == LabelDropped {
			dropped = append(dropped, e)
		}
	}
	require.Len(t, dropped, 1, "stated once: Flush and Stop saw the same total")
	assert.Equal(t, "s1", dropped[0]["span_id"])
	assert.Equal(t, float64(3), dropped[0]["mean"])
}

func TestCollectorBuffersAndDrops(t *testing.T) {
	tests := []struct {
		name       string
		maxBuffers int
		kernels    int
		written    int
		minBuffers uint64
	}{
		// A launch is an API record (40 bytes) and a kernel record (208):
		// a 1 MiB buffer holds 4228 launches.
		{name: "full buffers are delivered from CUPTI's thread", maxBuffers: 64, kernels: 10000, written: 10000, minBuffers: 3},
		{name: "past the buffer bound CUPTI drops, and the trace says so", maxBuffers: 2, kernels: 10000, written: 2 * 4228, minBuffers: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, f := fakeOptions(t)
			o.BufferBytes = 1 // clamped to MinBufferBytes
			o.MaxBuffers = tt.maxBuffers
			s, path := openSession(t)
			c, err := Start(s, o)
			require.NoError(t, err)
			runtime.LockOSThread()
			span, err := s.BeginSpan("step", events.SpanFunction, events.StepNone)
			require.NoError(t, err)
			base := f.Now()
			for i := 0; i < tt.kernels; i++ {
				cid := f.API(cuptitest.DomainRuntime, cuptitest.CbidCudaLaunchKernel)
				f.Kernel(cid, "k", 0, 7, base+uint64(i)*10, base+uint64(i)*10+5)
			}
			require.NoError(t, s.EndSpan(span))
			runtime.UnlockOSThread()
			time.Sleep(time.Millisecond)
			require.NoError(t, c.Stop())
			st := c.Stats()
			require.NoError(t, s.Finish())

			evs := testutil.Lines(t, path)
			ivs := testutil.OfKind(evs, "device_interval")
			assert.Len(t, ivs, tt.written)
			assert.Equal(t, uint64(tt.written), st.Kernels)
			assert.GreaterOrEqual(t, st.Buffers, tt.minBuffers)
			// Every record CUPTI could not place is a dropped kernel or API record.
			lost := uint64(2*tt.kernels) - st.Kernels - st.APIRecords
			assert.Equal(t, lost, st.Dropped)
			if tt.maxBuffers == 2 {
				assert.Positive(t, st.BuffersRefused)
				assert.Positive(t, st.Dropped)
			}
			for _, iv := range ivs {
				require.Equal(t, "s"+strconv.FormatUint(span, 10), iv["span_id"])
			}
			var stated float64 = -1
			for _, e := range testutil.OfKind(evs, "tensor_stats") {
				if e["label"] == LabelDropped {
					stated = e["mean"].(float64)
				}
			}
			assert.Equal(t, float64(st.Dropped), stated)
		})
	}
}

func TestCollectorRefusals(t *testing.T) {
	tests := []struct {
		name  string
		setup func(f *cuptitest.Fake)
		msg   []string
	}{
		{
			name:  "another profiler holds CUPTI",
			setup: func(f *cuptitest.Fake) { f.Hold(true, 0) },
			msg: []string{"CUPTI is held by another profiler in this process (torch.profiler, Nsight Systems",
				"cuptiSubscribe returned CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39)", `{"collect":["nvml"]}`},
		},
		{
			name:  "no driver",
			setup: func(f *cuptitest.Fake) { f.Hold(false, 15) },
			msg:   []string{"CUPTI could not start: cuptiSubscribe returned CUPTI_ERROR_NOT_INITIALIZED (15): CUDA is not usable here: "},
		},
		{
			name:  "no permission",
			setup: func(f *cuptitest.Fake) { f.Hold(false, 35) },
			msg:   []string{"CUPTI_ERROR_INSUFFICIENT_PRIVILEGES (35)", "NVreg_RestrictProfilingToAdminUsers=0"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, f := fakeOptions(t)
			tt.setup(f)
			defer f.Hold(false, 0)
			s, _ := openSession(t)
			c, err := Start(s, o)
			assert.Nil(t, c)
			requireCode(t, err, session.Unavailable, tt.msg...)
			assert.False(t, f.KindEnabled(cuptitest.KindConcurrentKernel), "nothing stays enabled")
		})
	}

	t.Run("a second session while one collects", func(t *testing.T) {
		o, f := fakeOptions(t)
		s1, _ := openSession(t)
		s2, _ := openSession(t)
		c, err := Start(s1, o)
		require.NoError(t, err)
		c2, err := Start(s2, o)
		assert.Nil(t, c2)
		requireCode(t, err, session.Unavailable, "CUPTI already collects for another session in this process")
		require.NoError(t, c.Stop())
		assert.False(t, f.Subscribed())
		c2, err = Start(s2, o)
		require.NoError(t, err, "free again once the first stopped")
		require.NoError(t, c2.Stop())
	})
}

func TestCollectorDrainsPeriodically(t *testing.T) {
	o, f := fakeOptions(t)
	o.DrainInterval = 5 * time.Millisecond
	s, path := openSession(t)
	c, err := Start(s, o)
	require.NoError(t, err)
	runtime.LockOSThread()
	cid := f.API(cuptitest.DomainRuntime, cuptitest.CbidCudaLaunchKernel)
	runtime.UnlockOSThread()
	now := f.Now()
	f.Kernel(cid, "k", 0, 7, now, now+10)
	require.Eventually(t, func() bool { return c.Stats().Intervals == 1 }, 5*time.Second, 5*time.Millisecond,
		"the loop flushes (cuptiActivityFlushAll(0)) and writes without Flush")
	assert.GreaterOrEqual(t, c.Stats().ClockAnchors, 2)
	require.NoError(t, c.Stop())
	require.NoError(t, s.Finish())
	assert.Len(t, testutil.OfKind(testutil.Lines(t, path), "device_interval"), 1)
}

// CUPTI fills a buffer on the thread whose call makes a record, so a buffer
// malloc'd when CUPTI asks for it has its pages faulted in on the program's
// launching thread: on an H200 VM the first launch of each thread cost 2.8 ms
// with CUPTI on, and a traced 2.2 ms step measured 5.4. The buffers CUPTI gets
// come from a pool written at Start and return to it once decoded: sessions
// that need no more than the pool allocate none on a launching thread.
func TestBuffersComeFromThePoolWrittenAtStart(t *testing.T) {
	for round := 0; round < 3; round++ {
		o, f := fakeOptions(t)
		s, path := openSession(t)
		c, err := Start(s, o)
		require.NoError(t, err)
		launch := func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for i := 0; i < 3; i++ {
				cid := f.API(cuptitest.DomainRuntime, cuptitest.CbidCudaLaunchKernel)
				now := f.Now()
				f.Kernel(cid, "k", 0, 7, now, now+10)
			}
		}
		launch()
		done := make(chan struct{})
		go func() { launch(); close(done) }() // another OS thread
		<-done
		require.NoError(t, c.Stop())
		st := c.Stats()
		require.NoError(t, s.Finish())
		assert.Len(t, testutil.OfKind(testutil.Lines(t, path), "device_interval"), 6, "round %d", round)
		assert.Positive(t, st.Buffers, "round %d", round)
		assert.Zero(t, st.BuffersFresh, "round %d: buffers allocated while the program launched", round)
	}
}

// Records launched just before a finish are in the trace even when their
// buffers are still on their way to the collector as it flushes: one taken
// out by an unforced flush (the drain loop's, or CUPTI's own thread with a
// full buffer) and one the forced flush takes out, both delivered late from
// another thread. Flush waits for every buffer CUPTI held to come back; a
// collector that only calls cuptiActivityFlushAll and takes the queue finds
// it empty and the finish writes its terminal line without them (issue 14,
// defect 6: a drop-in trace with 0 device intervals).
func TestFlushWaitsForBuffersStillBeingDelivered(t *testing.T) {
	o, f := fakeOptions(t)
	s, path := openSession(t)
	c, err := Start(s, o)
	require.NoError(t, err)
	f.SetDeliveryDelay(200 * time.Millisecond)
	defer f.SetDeliveryDelay(0)

	runtime.LockOSThread()
	first := f.API(cuptitest.DomainRuntime, cuptitest.CbidCudaLaunchKernel)
	second := f.API(cuptitest.DomainRuntime, cuptitest.CbidCudaLaunchKernel)
	runtime.UnlockOSThread()
	now := f.Now()
	f.Kernel(first, "in_the_buffer_being_delivered", 0, 7, now, now+10)
	f.Complete() // taken out by an unforced flush: on its way
	f.Kernel(second, "in_the_buffer_the_flush_forces_out", 0, 7, now+20, now+30)
	time.Sleep(time.Millisecond) // every record ends before the session's "now"

	require.NoError(t, c.Flush())
	st := c.Stats()
	assert.Equal(t, uint64(2), st.Kernels, "both buffers were back and written when Flush returned")
	assert.Zero(t, st.FlushTimeouts)
	require.NoError(t, s.Finish())
	require.NoError(t, c.Stop())

	testutil.RequireValid(t, path)
	var names []string
	for _, iv := range testutil.OfKind(testutil.Lines(t, path), "device_interval") {
		names = append(names, iv["name"].(string))
	}
	assert.ElementsMatch(t, []string{"in_the_buffer_being_delivered", "in_the_buffer_the_flush_forces_out"}, names,
		"in any order: the two deliveries race")
}

func TestCandidates(t *testing.T) {
	venv := t.TempDir()
	site := filepath.Join(venv, "lib", "python3.11", "site-packages")
	for _, rel := range []string{"nvidia/cuda_cupti/lib/libcupti.so.12", "nvidia/cu13/lib/libcupti.so.13"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(site, rel)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(site, rel), nil, 0o644))
	}
	libdir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(libdir, "libcupti.so.13"), nil, 0o644))
	env := map[string]string{LibraryEnv: "/opt/cupti/libcupti.so", "VIRTUAL_ENV": venv}
	got := Candidates(Options{Library: libdir, LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }})
	want := []string{
		"/opt/cupti/libcupti.so",
		filepath.Join(libdir, "libcupti.so.13"),
		"libcupti.so.12", "libcupti.so.13", "libcupti.so",
		filepath.Join(site, "nvidia/cuda_cupti/lib/libcupti.so.12"),
		filepath.Join(site, "nvidia/cu13/lib/libcupti.so.13"),
	}
	if fileExists("/usr/local/cuda/extras/CUPTI/lib64/libcupti.so") {
		want = append(want, "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so")
	}
	assert.Equal(t, want, got)
}

// TestNoLibcupti runs in a child process: the first libcupti loaded stays
// for the life of a process.
func TestNoLibcupti(t *testing.T) {
	if !testutil.InChild(t) {
		return
	}
	tests := []struct {
		name string
		o    Options
		msg  []string
	}{
		{
			name: "nothing to load",
			o: Options{Library: "/nonexistent/libcupti.so.12", Sonames: []string{"libcupti-missing.so.12"},
				LookupEnv: func(k string) (string, bool) {
					if k == LibraryEnv {
						return "/also/missing/libcupti.so", true
					}
					return "", false
				}},
			msg: []string{"CUPTI is unavailable: no libcupti could be loaded (",
				"/also/missing/libcupti.so: cannot open shared object file",
				"/nonexistent/libcupti.so.12: cannot open shared object file",
				"libcupti-missing.so.12: cannot open shared object file",
				"Set CANDLE_TRACE_CUPTI_LIB to libcupti.so's path", "pip install nvidia-cuda-cupti-cu12"},
		},
		{
			name: "not a CUPTI",
			o:    Options{Library: "libm.so.6", Sonames: []string{}, LookupEnv: noEnv},
			msg:  []string{"libm.so.6 has no cuptiActivityEnable (not a CUPTI library"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := openSession(t)
			c, err := Start(s, tt.o)
			assert.Nil(t, c)
			requireCode(t, err, session.Unavailable, tt.msg...)
		})
	}
}

// A Python with no virtualenv: libcupti from `pip install --user` and from a
// system-wide pip install are found through the interpreter's own prefix.
func TestCandidatesOfThisPython(t *testing.T) {
	root, home := t.TempDir(), t.TempDir()
	put := func(dir string) string {
		p := filepath.Join(dir, "nvidia", "cuda_cupti", "lib", "libcupti.so.12")
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, nil, 0o644))
		return p
	}
	user := put(filepath.Join(home, ".local", "lib", "python3.11", "site-packages"))
	debian := put(filepath.Join(root, "usr", "local", "lib", "python3.11", "dist-packages"))
	conda := put(filepath.Join(root, "usr", "lib", "python3.11", "site-packages"))
	put(filepath.Join(root, "usr", "lib", "python3.9", "site-packages")) // another Python's
	// An unactivated virtualenv: bin/python3 links to the base interpreter.
	require.NoError(t, os.MkdirAll(filepath.Join(root, "usr", "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "usr", "bin", "python3.11"), nil, 0o755))
	venv := filepath.Join(root, "work", ".venv")
	require.NoError(t, os.MkdirAll(filepath.Join(venv, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(venv, "pyvenv.cfg"), []byte("home = /usr/bin\n"), 0o644))
	require.NoError(t, os.Symlink(filepath.Join(root, "usr", "bin", "python3.11"), filepath.Join(venv, "bin", "python3")))
	inVenv := put(filepath.Join(venv, "lib", "python3.11", "site-packages"))
	env := map[string]string{"HOME": home, "PATH": "/nonexistent:" + filepath.Join(venv, "bin") + ":" + filepath.Join(root, "usr", "bin")}
	tests := []struct {
		name  string
		exe   string
		argv0 string
		err   error
		want  []string
	}{
		{name: "python3.11", exe: filepath.Join(root, "usr", "bin", "python3.11"), want: []string{user, debian, conda}},
		{name: "a virtualenv's python, by PATH", exe: filepath.Join(root, "usr", "bin", "python3.11"), argv0: "python3",
			want: []string{inVenv, user, debian, conda}},
		{name: "a virtualenv's python, by path", exe: filepath.Join(root, "usr", "bin", "python3.11"), argv0: filepath.Join(venv, "bin", "python3"),
			want: []string{inVenv, user, debian, conda}},
		{name: "a python on PATH outside any virtualenv", exe: filepath.Join(root, "usr", "bin", "python3.11"), argv0: "python3.11",
			want: []string{user, debian, conda}},
		{name: "no version in the name", exe: filepath.Join(root, "usr", "bin", "python"),
			want: []string{user, debian, conda, filepath.Join(root, "usr", "lib", "python3.9", "site-packages", "nvidia", "cuda_cupti", "lib", "libcupti.so.12")}},
		{name: "not a Python", exe: filepath.Join(root, "usr", "bin", "train_step")},
		{name: "unknown executable", err: os.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Candidates(Options{Sonames: []string{},
				LookupEnv:  func(k string) (string, bool) { v, ok := env[k]; return v, ok },
				Executable: func() (string, error) { return tt.exe, tt.err },
				Argv0:      func() string { return tt.argv0 }})
			if fileExists("/usr/local/cuda/extras/CUPTI/lib64/libcupti.so") {
				got = got[:len(got)-1]
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

// onThread runs functions one after another on one locked OS thread: a
// thread of its own, as autograd's device thread is.
type onThread chan func()

func newThread(t *testing.T) onThread {
	th := make(onThread)
	go func() {
		runtime.LockOSThread()
		for f := range th {
			f()
		}
	}()
	t.Cleanup(func() { close(th) })
	return th
}

func (th onThread) do(f func()) {
	done := make(chan struct{})
	th <- func() { f(); close(done) }
	<-done
}

// Work launched from a thread with no open span: by default the root s1 (the
// span innermost on the launching thread, as the trace format has it); with
// "unspanned_launches":"main_thread" the span innermost at that moment on the
// session's main thread (the one that began the measured region, else the
// first to open a span: PyTorch's autograd launches backward kernels from
// its own thread while the main thread waits in backward). A thread's own
// span always wins; with nothing open on the main thread it is s1.
func TestLaunchesFromAThreadWithoutSpans(t *testing.T) {
	for _, fallback := range []bool{true, false} {
		t.Run(map[bool]string{true: "main_thread", false: "root"}[fallback], func(t *testing.T) {
			launchesFromAThreadWithoutSpans(t, fallback)
		})
	}
}

func launchesFromAThreadWithoutSpans(t *testing.T, fallback bool) {
	o, f := fakeOptions(t)
	o.MainThreadFallback = fallback
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	s, err := session.Open(path, []byte(`{"entrypoint":"test::cupti","phase":"train","capture_step":1,"device":"cuda:0"}`))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.FinishFailed("test cleanup") })
	c, err := Start(s, o)
	require.NoError(t, err)
	main, helper := newThread(t), newThread(t)
	var cids []uint32
	launch := func() {
		cid := f.API(cuptitest.DomainRuntime, cuptitest.CbidCudaLaunchKernel)
		now := f.Now()
		f.Kernel(cid, "k", 0, 7, now, now+100)
		cids = append(cids, cid)
	}
	spanOf := map[uint32]uint64{}
	var before, upd, bwd, opt, own uint64
	// assert, not require: these run on the threads' own goroutines.
	begin := func(name string, measured bool) uint64 {
		var id uint64
		var err error
		if measured {
			id, err = s.BeginMeasurement(name)
		} else {
			id, err = s.BeginSpan(name, events.SpanFunction, events.StepNone)
		}
		assert.NoError(t, err)
		return id
	}
	end := func(id uint64) { assert.NoError(t, s.EndSpan(id)) }

	helper.do(launch) // no span open anywhere: s1
	spanOf[cids[len(cids)-1]] = 1
	main.do(func() { before = begin("setup", false) }) // the first thread to open a span: the main thread
	helper.do(launch)
	spanOf[cids[len(cids)-1]] = before
	main.do(func() { end(before); upd = begin("update", true); bwd = begin("backward", false) })
	helper.do(launch)
	spanOf[cids[len(cids)-1]] = bwd
	main.do(func() { end(bwd); opt = begin("optimizer", false) })
	helper.do(launch)
	spanOf[cids[len(cids)-1]] = opt
	helper.do(func() { own = begin("helper_work", false); launch(); end(own) })
	spanOf[cids[len(cids)-1]] = own
	main.do(func() { end(opt) })
	helper.do(launch) // main is in the measured region itself
	spanOf[cids[len(cids)-1]] = upd
	main.do(func() { end(upd) })
	helper.do(launch) // nothing open on main any more
	spanOf[cids[len(cids)-1]] = 1

	time.Sleep(time.Millisecond)
	require.NoError(t, c.Stop())
	st := c.Stats()
	require.NoError(t, s.Finish())
	assert.Equal(t, uint64(7), st.Launches)
	ivs := testutil.OfKind(testutil.Lines(t, path), "device_interval")
	require.Len(t, ivs, len(cids))
	if !fallback {
		// The trace format's rule: the span innermost on the launching thread.
		assert.Zero(t, st.Borrowed)
		for _, e := range ivs {
			want := "s1"
			if uint32(num(t, e["correlation_id"])) == cids[4] {
				want = "s" + strconv.FormatUint(own, 10)
			}
			assert.Equal(t, want, e["span_id"])
		}
		return
	}
	assert.Equal(t, uint64(4), st.Borrowed)
	for _, e := range ivs {
		cid := uint32(num(t, e["correlation_id"]))
		assert.Equal(t, "s"+strconv.FormatUint(spanOf[cid], 10), e["span_id"], "launch %d", cid)
	}
}

// A libcupti the process loaded itself is adopted (and the driver asked before
// its first call) unless the user named it.
func TestNamedLibrary(t *testing.T) {
	env := func(v string) func(string) (string, bool) {
		return func(k string) (string, bool) {
			if k == LibraryEnv && v != "" {
				return v, true
			}
			return "", false
		}
	}
	tests := []struct {
		name, env, library, path string
		want                     bool
	}{
		{"named by the env", "/opt/cupti/libcupti.so.12", "", "/opt/cupti/libcupti.so.12", true},
		{"in the env's folder", "/opt/cupti/", "", "/opt/cupti/libcupti.so.13", true},
		{"named by the options", "", "/x/libcupti.so", "/x/libcupti.so", true},
		{"torch's own", "/opt/cupti/libcupti.so.12", "", "/venv/nvidia/cu13/lib/libcupti.so.13", false},
		{"nothing named", "", "", "libcupti.so.12", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, named(Options{Library: tc.library, LookupEnv: env(tc.env)}, tc.path))
		})
	}
}
