package cupti

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/session"
	"github.com/candle-trace/candle-trace/internal/testutil"
)

// NVIDIA's own libcupti (the nvidia-cuda-cupti-cu12 wheel, fetched by `make
// real-libs`) needs no GPU to load, to tell time or to refuse a subscriber.
// This runs it where the fake stands in elsewhere: its symbol table, its
// place in a site-packages folder, the error a machine without a driver
// gives, and the clock alignment against its real cuptiGetTimestamp. In a
// child process: the first libcupti loaded stays for the process's life.
func TestRealCUPTIWithoutAGPU(t *testing.T) {
	libs := testutil.RealLibraries(t)
	if !testutil.InChild(t) {
		return
	}
	// Found where pip puts it, through PYTHONPATH alone.
	o := Options{Sonames: []string{}, LookupEnv: func(k string) (string, bool) {
		if k == "PYTHONPATH" {
			return "/nonexistent:" + libs.CUPTISite, true
		}
		return "", false
	}}
	require.Equal(t, []string{libs.CUPTI}, Candidates(o))
	path, _, err := load(o)
	require.NoError(t, err, "every function the collector binds must exist in the shipped libcupti")
	require.Equal(t, libs.CUPTI, path)

	s, _ := openSession(t)
	t.Run("start", func(t *testing.T) {
		c, err := Start(s, o)
		if testutil.NVIDIADriverLoaded() {
			require.NoError(t, err)
			require.NoError(t, c.Stop())
			return
		}
		assert.Nil(t, c)
		requireCode(t, err, session.Unavailable,
			"CUPTI could not start: cuptiSubscribe returned CUPTI_ERROR_NOT_INITIALIZED (15)",
			"CUDA is not usable here: ", "("+libs.CUPTI+" was loaded)")
		msg := err.Error()
		assert.True(t, strings.Contains(msg, "the NVIDIA driver's libcuda.so.1 could not be loaded: ") || strings.Contains(msg, "cuInit returned CUDA_ERROR_"), msg)
	})

	t.Run("record walker", func(t *testing.T) {
		// A buffer as CUPTI 12.9 fills one, written at the header's offsets
		// (by hand, as the fake does, not through abi.h), walked by NVIDIA's
		// cuptiActivityGetNextRecord: it steps by its own record sizes, so a
		// struct size or kind our decoder got wrong shows up here.
		s, tracePath := openSession(t)
		time.Sleep(20 * time.Millisecond) // so that the records fall after the session's zero
		c := newCollector(s, o)
		a, err := bestAnchor(DefaultClockTries, c.readClock)
		require.NoError(t, err)
		c.clock.add(a)
		t0 := a.cupti - 10_000_000 // 10 ms before the anchor
		var buf []byte
		buf = append(buf, apiRecord(5, 211, t0-2000, t0-1000, 41)...)             // RUNTIME cudaLaunchKernel
		buf = append(buf, kernelRecord(10, t0, t0+1500, 0, 7, 41, kernelName)...) // CONCURRENT_KERNEL
		buf = append(buf, apiRecord(4, 307, t0, t0+10, 42)...)                    // DRIVER cuLaunchKernel
		buf = append(buf, memcpyRecord(1, t0+2000, t0+2600, 1, 13, 1<<20, 43, 44)...)
		buf = append(buf, memsetRecord(t0+3000, t0+3100, 0, 7, 4096, 45)...)
		buf = append(buf, kernelRecord(10, t0+4000, 0, 0, 7, 46, kernelName)...)      // still running at a forced flush
		buf = append(buf, kernelRecord(3, t0+5000, t0+5000, 1, 0, 47, kernelName)...) // serial KERNEL kind, shorter than a tick
		before := c.Stats()
		require.NoError(t, c.writeRecords(buf))
		st := c.Stats()
		assert.Equal(t, uint64(2), st.Kernels-before.Kernels)
		assert.Equal(t, uint64(1), st.Memcpys-before.Memcpys)
		assert.Equal(t, uint64(1), st.Memsets-before.Memsets)
		assert.Equal(t, uint64(2), st.APIRecords-before.APIRecords)
		assert.Equal(t, uint64(1), st.Incomplete-before.Incomplete)
		assert.Equal(t, uint64(0), st.BadRecords-before.BadRecords, "the walker reached the end cleanly")

		// A record cut short by the buffer's end: NVIDIA's walker takes it as
		// the end of the buffer (MAX_LIMIT_REACHED, not an error).
		cut := kernelRecord(10, t0, t0+10, 0, 7, 48, kernelName)
		require.NoError(t, c.writeRecords(append(memsetRecord(t0, t0+1, 0, 7, 1, 49), cut[:100]...)))
		st2 := c.Stats()
		assert.Equal(t, uint64(1), st2.Memsets-st.Memsets)
		assert.Equal(t, uint64(0), st2.Kernels-st.Kernels)
		assert.Equal(t, uint64(0), st2.BadRecords-st.BadRecords)

		// A kind it does not know is an error (INVALID_KIND): counted, and
		// the rest of the buffer is lost with it, as documented.
		unknown := memsetRecord(t0, t0+1, 0, 7, 1, 50)
		binary.LittleEndian.PutUint32(unknown, 9999)
		buf = append(append(memsetRecord(t0, t0+1, 0, 7, 1, 49), unknown...), memsetRecord(t0, t0+1, 0, 7, 1, 51)...)
		require.NoError(t, c.writeRecords(buf))
		st3 := c.Stats()
		assert.Equal(t, uint64(1), st3.Memsets-st2.Memsets)
		assert.Equal(t, uint64(1), st3.BadRecords-st2.BadRecords)

		require.NoError(t, s.Finish())
		var got []map[string]any
		for _, e := range testutil.OfKind(testutil.Lines(t, tracePath), "device_interval") {
			got = append(got, e)
		}
		require.Len(t, got, 6)
		want := []struct {
			name, device, stream string
			corr, dur            uint64
			at                   uint64 // CUPTI start
		}{
			{"my_kernel(int)", "cuda:0", "7", 41, 1500, t0},
			{"memcpy HtoD", "cuda:1", "13", 43, 600, t0 + 2000},
			{"memset", "cuda:0", "7", 45, 100, t0 + 3000},
			{"my_kernel(int)", "cuda:1", "0", 47, 1, t0 + 5000},
			{"memset", "cuda:0", "7", 49, 1, t0},
			{"memset", "cuda:0", "7", 49, 1, t0},
		}
		for i, w := range want {
			e := got[i]
			assert.Equal(t, w.name, e["name"], i)
			assert.Equal(t, w.device, e["device"], i)
			assert.Equal(t, w.stream, e["stream_id"], i)
			assert.Equal(t, w.corr, num(t, e["correlation_id"]), i)
			assert.Equal(t, w.dur, num(t, e["duration_ns"]), i)
			host := int64(a.host) - int64(a.cupti-w.at)
			assert.InDelta(t, host, int64(num(t, e["start_ns"])), float64(a.bound()+1), "%d: on the session clock", i)
			assert.Equal(t, "s1", e["span_id"], "%d: no launch was seen: the root span", i)
		}
	})

	t.Run("callback ids", func(t *testing.T) {
		// cbids.c was written from the 12.9 and 13.x headers; the shipped
		// library names its callback ids itself (cuptiGetCallbackName).
		launches := regexp.MustCompile(`Launch|Memcpy|Memset`)
		watched := watchedCallbacks()
		for _, d := range []struct {
			domain int
			name   string
		}{{domainRuntime, "runtime"}, {domainDriver, "driver"}} {
			known := 0
			for id, name := range watched[d.domain] {
				got := callbackName(d.domain, id)
				if got == "" {
					continue // an id of a newer CUDA: cuptiEnableCallback refuses it, and it is skipped
				}
				known++
				assert.Equal(t, name, got, "%s callback id %d", d.name, id)
			}
			// And every function of this CUPTI that launches device work is watched.
			var missing []string
			total := 0
			for id := uint32(1); id < 4096; id++ {
				if n := callbackName(d.domain, id); n != "" {
					total++
					if _, ok := watched[d.domain][id]; launches.MatchString(n) && !ok {
						missing = append(missing, fmt.Sprintf("%d %s", id, n))
					}
				}
			}
			assert.Empty(t, missing, "%s functions that launch work but are not watched", d.name)
			assert.Greater(t, known, 50, d.name)
			t.Logf("%s: %d of the %d watched ids named alike by libcupti 12.9 (which knows %d %s ids)",
				d.name, known, len(watched[d.domain]), total, d.name)
		}
	})

	t.Run("clock", func(t *testing.T) {
		// Anchors as the collector takes them, 20 ms apart. Without a GPU
		// the real cuptiGetTimestamp reads the wall clock (CLOCK_REALTIME),
		// which the machine may adjust while they are taken: a CI run saw it
		// stepped forward twice by ~0.49 ms within 200 ms (rate 0.9951, four
		// anchors ±245 µs off). What is checked here is the map, not the
		// machine's time keeping, so anchors taken while the wall clock was
		// stepped against the monotonic one are taken again, and a machine
		// that steps it in each of five tries fails the test.
		c := &Collector{sink: s}
		var m clockMap
		var brackets []uint64
		for try := 1; ; try++ {
			m, brackets = clockMap{}, nil
			ref := time.Now()
			before := wallOffset(ref)
			for i := 0; i < 11; i++ {
				a, err := bestAnchor(DefaultClockTries, c.readClock)
				require.NoError(t, err)
				m.add(a)
				brackets = append(brackets, a.bracket)
				if i < 10 {
					time.Sleep(20 * time.Millisecond)
				}
			}
			moved := wallOffset(ref) - before
			if abs64(moved) <= maxWallMove {
				break
			}
			require.Less(t, try, 5, "the wall clock was stepped %d ns against the monotonic clock in 200 ms, five times running", moved)
			t.Logf("try %d: the wall clock was stepped %d ns against the monotonic clock while the anchors were taken; again", try, moved)
		}
		require.Len(t, m.anchors, 11, "CUPTI's clock advances")
		first, last := m.anchors[0], m.anchors[len(m.anchors)-1]
		rate := float64(last.host-first.host) / float64(last.cupti-first.cupti)
		assert.InDelta(t, 1.0, rate, 500e-6, "CUPTI's clock and the session's run at one rate")

		// Each interior anchor, left out, is a reading the map never saw:
		// the map must put it where its own bracket says it happened.
		var worst int64
		for i := 1; i < len(m.anchors)-1; i++ {
			var rest clockMap
			for j, a := range m.anchors {
				if j != i {
					rest.add(a)
				}
			}
			a := m.anchors[i]
			got, bound := rest.toSession(a.cupti)
			seg := m.anchors[i+1].host - m.anchors[i-1].host
			slack := int64(bound) + int64(a.bound()) + int64(float64(seg)*500e-6)
			err := got - int64(a.host)
			assert.LessOrEqual(t, abs64(err), slack, "anchor %d maps %d ns off (bound %d + own %d)", i, err, bound, a.bound())
			worst = max(worst, abs64(err))
		}
		sort.Slice(brackets, func(i, j int) bool { return brackets[i] < brackets[j] })
		t.Logf("real cuptiGetTimestamp: best-of-%d brackets %d..%d ns (median %d), rate %.9f, worst left-out error %d ns",
			DefaultClockTries, brackets[0], brackets[len(brackets)-1], brackets[len(brackets)/2], rate, worst)
		assert.Less(t, brackets[len(brackets)/2], uint64(20_000), "a best-of-32 bracket is a few hundred ns at most, unless the machine is badly oversubscribed")
	})
}

// maxWallMove is how far the wall clock may move against the monotonic one
// while the clock subtest takes its anchors. Slewing (NTP) moves both alike;
// only a step moves one against the other, so the bound is the readings' own
// error, far under a microsecond.
const maxWallMove = 5_000

// wallOffset is how far the wall clock has moved against the monotonic one
// since ref: the median of five time.Now readings (each reads both clocks),
// as a thread preempted between a reading's two clocks skews that one.
func wallOffset(ref time.Time) int64 {
	var o [5]int64
	for i := range o {
		n := time.Now()
		o[i] = (n.UnixNano() - ref.UnixNano()) - int64(n.Sub(ref))
	}
	slices.Sort(o[:])
	return o[2]
}

// kernelName is a C string for the records' name pointer: a global, so the
// collector may read it through the pointer for the life of the test.
var kernelName = []byte("_Z9my_kerneli\x00")

// CUPTI 12.9's record layouts (cupti_activity.h), at the header's offsets.
func record(size int, kind uint32) []byte {
	r := make([]byte, size)
	binary.LittleEndian.PutUint32(r[0:], kind)
	return r
}

// CUpti_ActivityAPI: RUNTIME (5) or DRIVER (4), 40 bytes.
func apiRecord(kind, cbid uint32, start, end uint64, corr uint32) []byte {
	r := record(40, kind)
	le := binary.LittleEndian
	le.PutUint32(r[4:], cbid)
	le.PutUint64(r[8:], start)
	le.PutUint64(r[16:], end)
	le.PutUint32(r[24:], uint32(os.Getpid()))
	le.PutUint32(r[32:], corr)
	return r
}

// CUpti_ActivityKernel9: KERNEL (3) or CONCURRENT_KERNEL (10), 208 bytes.
func kernelRecord(kind uint32, start, end uint64, dev, stream, corr uint32, name []byte) []byte {
	r := record(208, kind)
	le := binary.LittleEndian
	le.PutUint64(r[16:], start)
	le.PutUint64(r[24:], end)
	le.PutUint64(r[32:], end) // completed
	le.PutUint32(r[40:], dev)
	le.PutUint32(r[44:], 1) // contextId
	le.PutUint32(r[48:], stream)
	le.PutUint32(r[92:], corr)
	le.PutUint64(r[104:], uint64(uintptr(unsafe.Pointer(&name[0]))))
	return r
}

// CUpti_ActivityMemcpy6: MEMCPY (1), 96 bytes.
func memcpyRecord(copyKind uint8, start, end uint64, dev, stream uint32, bytes uint64, corr, rtCorr uint32) []byte {
	r := record(96, 1)
	le := binary.LittleEndian
	r[4] = copyKind
	le.PutUint64(r[8:], bytes)
	le.PutUint64(r[16:], start)
	le.PutUint64(r[24:], end)
	le.PutUint32(r[32:], dev)
	le.PutUint32(r[36:], 1)
	le.PutUint32(r[40:], stream)
	le.PutUint32(r[44:], corr)
	le.PutUint32(r[48:], rtCorr)
	return r
}

// CUpti_ActivityMemset4: MEMSET (2), 88 bytes.
func memsetRecord(start, end uint64, dev, stream uint32, bytes uint64, corr uint32) []byte {
	r := record(88, 2)
	le := binary.LittleEndian
	le.PutUint64(r[8:], bytes)
	le.PutUint64(r[16:], start)
	le.PutUint64(r[24:], end)
	le.PutUint32(r[32:], dev)
	le.PutUint32(r[36:], 1)
	le.PutUint32(r[40:], stream)
	le.PutUint32(r[44:], corr)
	return r
}

// CUDA 13's libcupti answers CUPTI_ERROR_UNKNOWN to everything, its clock
// included, when there is no driver: the collector must still load it (every
// function it binds is there), find it where pip puts it, and say why it
// cannot start.
func TestRealCUPTI13WithoutAGPU(t *testing.T) {
	libs := testutil.RealLibraries(t)
	if !testutil.InChild(t) {
		return
	}
	o := Options{Sonames: []string{}, LookupEnv: func(k string) (string, bool) {
		if k == "PYTHONPATH" {
			return filepath.Dir(filepath.Dir(filepath.Dir(filepath.Dir(libs.CUPTI13)))), true
		}
		return "", false
	}}
	require.Equal(t, []string{libs.CUPTI13}, Candidates(o))
	s, _ := openSession(t)
	c, err := Start(s, o)
	if testutil.NVIDIADriverLoaded() {
		require.NoError(t, err)
		require.NoError(t, c.Stop())
		return
	}
	assert.Nil(t, c)
	requireCode(t, err, session.Unavailable,
		"CUPTI could not start: cuptiGetTimestamp returned CUPTI_ERROR_UNKNOWN (999)",
		": CUDA is not usable here: ", "("+libs.CUPTI13+" was loaded)")
	path, _, err := load(o)
	require.NoError(t, err, "every function the collector binds must exist in CUDA 13's libcupti")
	assert.Equal(t, libs.CUPTI13, path)
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// fakeLibcuda answers cuInit with CUDA_ERROR_NO_DEVICE, as the driver's
// library does on a machine whose GPU is gone or hidden.
const fakeLibcuda = `
int cuInit(unsigned flags) { (void)flags; return 100; }
int cuGetErrorName(int e, const char **s) { *s = e == 100 ? "CUDA_ERROR_NO_DEVICE" : 0; return *s ? 0 : 1; }
`

// What a CUPTI_ERROR_NOT_INITIALIZED is blamed on: the missing driver
// library, or the driver's own answer to cuInit.
func TestCUDAProblem(t *testing.T) {
	if testutil.NVIDIADriverLoaded() {
		t.Skip("this machine runs the NVIDIA driver: CUDA may well start")
	}
	tests := []struct {
		name    string
		libcuda string // fake libcuda.so.1 source; "" for none
		want    string
	}{
		{name: "no libcuda", want: "^the NVIDIA driver's libcuda\\.so\\.1 could not be loaded: libcuda\\.so\\.1: cannot open shared object file"},
		{name: "cuInit fails", libcuda: fakeLibcuda, want: `^cuInit returned CUDA_ERROR_NO_DEVICE \(100\)$`},
		{name: "not a libcuda", libcuda: "int cuda_nothing;", want: `^libcuda\.so\.1 has no cuInit$`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The loader reads LD_LIBRARY_PATH once per process: probe in a child.
			if !testutil.IsChild(t) {
				dir := t.TempDir()
				if tt.libcuda != "" {
					src := filepath.Join(dir, "fake.c")
					require.NoError(t, os.WriteFile(src, []byte(tt.libcuda), 0o644))
					out, err := exec.Command("cc", "-shared", "-fPIC", "-o", filepath.Join(dir, "libcuda.so.1"), src).CombinedOutput()
					require.NoError(t, err, "%s", out)
				}
				t.Setenv("LD_LIBRARY_PATH", dir)
			}
			if !testutil.InChild(t) {
				return
			}
			assert.Regexp(t, tt.want, cudaProblem())
		})
	}
}
