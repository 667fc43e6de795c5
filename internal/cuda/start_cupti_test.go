package cuda

// This file sorts after options_test.go on purpose: it loads the fake
// libcupti, and the first libcupti loaded stays for the life of the process
// (TestStart checks the error of a process without one).

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/cuda/cupti"
	"github.com/candle-trace/candle-trace/internal/cuda/cupti/cuptitest"
	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/session"
)

func TestStartCUPTI(t *testing.T) {
	lib := cuptitest.Build(t)
	fake := cuptitest.Open(t, lib)
	fakeCUPTILoaded = true
	noEnv := func(string) (string, bool) { return "", false }
	tests := []struct {
		name    string
		opts    string
		held    bool
		msg     string
		kernels int
		samples bool
	}{
		{name: "cupti alone", opts: `{"collect":["cupti"],"cupti_lib":"` + lib + `"}`, kernels: 3},
		{name: "nvml and cupti", opts: `{"collect":["nvml","cupti"],"interval_ms":1,"cupti_lib":"` + lib + `"}`, kernels: 2, samples: true},
		{name: "another profiler holds CUPTI: none starts", opts: `{"collect":["nvml","cupti"],"cupti_lib":"` + lib + `"}`, held: true,
			msg: "ct_device_start: CUPTI is held by another profiler in this process"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake.Hold(tt.held, 0)
			defer fake.Hold(false, 0)
			path := filepath.Join(t.TempDir(), "trace.jsonl")
			s, err := session.Open(path, []byte(`{"entrypoint":"test::device","phase":"train","capture_step":1,"device":"cuda:0","measured_root":true}`))
			require.NoError(t, err)
			defer func() { _ = s.FinishFailed("cleanup") }()
			d0, d1 := h100(0), h100(1)
			nv, _ := mockNVML(&d0, &d1)
			o, err := ParseStartOptions([]byte(tt.opts))
			require.NoError(t, err)
			c, err := Start(s, o, WithNVMLOpener(func() (Library, error) { return nv, nil }),
				WithSamplerOptions(WithVisibleDevices("", false)),
				WithCUPTIOptions(cupti.Options{Sonames: []string{}, LookupEnv: noEnv, DrainInterval: time.Hour}))
			if tt.msg != "" {
				require.Error(t, err)
				assert.Equal(t, session.Unavailable, session.CodeOf(err))
				assert.Contains(t, err.Error(), tt.msg)
				assert.Len(t, nv.ShutdownCalls(), 1, "the NVML sampler is not left running")
				return
			}
			require.NoError(t, err)
			require.NotNil(t, c.CUPTI())

			runtime.LockOSThread()
			span, err := s.BeginSpan("step", events.SpanFunction, events.StepNone)
			require.NoError(t, err)
			for i := 0; i < tt.kernels; i++ {
				cid := fake.API(cuptitest.DomainRuntime, cuptitest.CbidCudaLaunchKernel)
				now := fake.Now()
				fake.Kernel(cid, "k", 0, 7, now, now+100)
			}
			require.NoError(t, s.EndSpan(span))
			runtime.UnlockOSThread()

			// finish flushes the collectors before the terminal line, as
			// cmd/libtrace's finishing does.
			require.NoError(t, c.Flush())
			require.NoError(t, s.Finish())
			_ = c.Stop() // the session is gone: its last NVML sample is refused

			f, err := os.Open(path)
			require.NoError(t, err)
			defer f.Close()
			counts := map[string]int{}
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				var e map[string]any
				require.NoError(t, json.Unmarshal(sc.Bytes(), &e))
				counts[e["kind"].(string)]++
				if e["kind"] == "device_interval" {
					assert.Equal(t, "s2", e["span_id"])
					assert.Equal(t, "cuda", e["backend"])
				}
				if e["kind"] == "tensor_stats" {
					assert.Equal(t, cupti.LabelDropped, e["label"])
					assert.Equal(t, float64(0), e["mean"])
				}
			}
			assert.Equal(t, tt.kernels, counts["device_interval"])
			assert.Equal(t, 1, counts["tensor_stats"], "dropped records stated once, 0 included")
			if tt.samples {
				assert.GreaterOrEqual(t, counts["device_memory"], 2)
			} else {
				assert.Zero(t, counts["device_memory"])
			}
		})
	}
}
