package cupti

import (
	"runtime"
	"testing"

	"github.com/candle-trace/candle-trace/internal/cuda/cupti/cuptitest"
	"github.com/candle-trace/candle-trace/internal/events"
)

// The collector's two hot paths, against the fake libcupti (no GPU here):
// the callback CUPTI runs on the launching thread at every watched CUDA
// call, and the decoding of each activity record into a device_interval.

// BenchmarkLaunch is one cudaLaunchKernel as the fake libcupti runs it,
// inside a span, in one run: with nobody subscribed; with the collector
// subscribed but the fake's RUNTIME activity records muted, so that the
// difference is the collector's callback alone (it reads the thread's
// innermost span and stores correlation id -> span); and with everything
// on, which adds the API record CUPTI writes for an enabled RUNTIME kind
// (here the fake's cost for it, not CUPTI's).
func BenchmarkLaunch(b *testing.B) {
	o, f := fakeOptions(b)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	launch := func(b *testing.B) {
		s, _ := openSession(b)
		sp, err := s.BeginSpan("forward", events.SpanFunction, events.StepForward)
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			f.API(cuptitest.DomainRuntime, cuptitest.CbidCudaLaunchKernel)
		}
		b.StopTimer()
		_ = s.EndSpan(sp)
	}
	b.Run("unsubscribed", launch)
	for _, records := range []bool{false, true} {
		name := "collector-callback"
		if records {
			name = "collector-with-api-records"
		}
		b.Run(name, func(b *testing.B) {
			s, _ := openSession(b)
			c, err := Start(s, o)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Stop()
			f.SetKind(cuptitest.KindRuntime, records)
			launch(b)
			if got := c.Stats().Launches; got < uint64(b.N) {
				b.Fatalf("%d launches recorded, want %d", got, b.N)
			}
		})
	}
}

// BenchmarkRecord is one kernel record, from CUPTI's buffer to a line of the
// trace: the fake fills and delivers the buffer, the collector walks it,
// attributes the record, maps its time and writes it. The peer, in the same
// run, is the same interval written straight through the session (what any
// device_interval costs): the difference is the decoder's own share.
func BenchmarkRecord(b *testing.B) {
	o, f := fakeOptions(b)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	const batch = 1000
	b.Run("session-write", func(b *testing.B) {
		s, _ := openSession(b)
		d := events.DeviceInterval{Device: "cuda:0", StreamID: "7", ClockID: "host-monotonic", Backend: "cuda",
			Name: "void at::native::vectorized_elementwise_kernel<4>", DurationNs: 1000, HasCorrelationID: true}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			d.StartNs = s.Now()
			d.CorrelationID = uint64(i)
			if err := s.RecordDeviceInterval(1, &d); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("collector", func(b *testing.B) {
		s, _ := openSession(b)
		c, err := Start(s, o)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Stop()
		cid := f.API(cuptitest.DomainRuntime, cuptitest.CbidCudaLaunchKernel)
		b.ResetTimer()
		for done := 0; done < b.N; done += batch {
			now := f.Now()
			for i := 0; i < min(batch, b.N-done); i++ {
				f.Kernel(cid, "_ZN2at6native29vectorized_elementwise_kernelILi4EEEvv", 0, 7, now, now+1000)
			}
			if err := c.Flush(); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		if got := c.Stats().Kernels; got < uint64(b.N) {
			b.Fatalf("%d kernels written, want %d", got, b.N)
		}
	})
}
