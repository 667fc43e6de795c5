package cuda

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/candle-trace/candle-trace/internal/cuda/cupti"
	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/session"
)

func TestParseStartOptions(t *testing.T) {
	tests := []struct {
		in   string
		want StartOptions
		err  string
	}{
		{in: "", want: StartOptions{Collect: []string{"nvml"}, Interval: 10 * time.Millisecond, UnspannedLaunches: "root"}},
		{in: " {} ", want: StartOptions{Collect: []string{"nvml"}, Interval: 10 * time.Millisecond, UnspannedLaunches: "root"}},
		{in: `{"collect":["nvml","cupti"],"interval_ms":10,"devices":[0]}`, want: StartOptions{Collect: []string{"nvml", "cupti"}, Interval: 10 * time.Millisecond, Devices: []int{0}, UnspannedLaunches: "root"}},
		{in: `{"interval_ms":250,"devices":[3,1]}`, want: StartOptions{Collect: []string{"nvml"}, Interval: 250 * time.Millisecond, Devices: []int{3, 1}, UnspannedLaunches: "root"}},
		{in: `{"interval_ms":60000}`, want: StartOptions{Collect: []string{"nvml"}, Interval: time.Minute, UnspannedLaunches: "root"}},
		{in: `{"collect":["cupti"],"cupti_lib":"/opt/cupti/lib64"}`, want: StartOptions{Collect: []string{"cupti"}, Interval: 10 * time.Millisecond, CUPTILib: "/opt/cupti/lib64", UnspannedLaunches: "root"}},
		{in: `{"collect":["cupti"],"unspanned_launches":"main_thread"}`, want: StartOptions{Collect: []string{"cupti"}, Interval: 10 * time.Millisecond, UnspannedLaunches: "main_thread"}},
		{in: `{"unspanned_launches":"root"}`, want: StartOptions{Collect: []string{"nvml"}, Interval: 10 * time.Millisecond, UnspannedLaunches: "root"}},
		{in: `{"unspanned_launches":"main"}`, err: `"unspanned_launches" must be "root" or "main_thread", got "main"`},
		{in: `{"unspanned_launches":true}`, err: `"unspanned_launches" must be "root" or "main_thread", got true`},
		{in: `{"cupti_lib":""}`, err: `"cupti_lib" must be a non-empty string`},
		{in: `{"cupti_lib":7}`, err: `"cupti_lib" must be a non-empty string`},
		{in: `{"interval":10}`, err: `unknown key "interval" (known: "collect", "interval_ms", "devices", "cupti_lib", "unspanned_launches")`},
		{in: `{"collect":["nvml"],"collect":["cupti"]}`, err: `duplicate key "collect"`},
		{in: `{"collect":[]}`, err: `"collect" is empty`},
		{in: `{"collect":"nvml"}`, err: `"collect" must be an array of strings`},
		{in: `{"collect":null}`, err: `"collect" must be an array of strings`},
		{in: `{"collect":["nvml","nsight"]}`, err: `unknown collector "nsight"`},
		{in: `{"collect":["nvml","nvml"]}`, err: `"nvml" is listed twice`},
		{in: `{"interval_ms":0}`, err: `"interval_ms" must be an integer from 1 to 60000, got 0`},
		{in: `{"interval_ms":60001}`, err: `got 60001`},
		{in: `{"interval_ms":10.0}`, err: `got 10.0`},
		{in: `{"interval_ms":"10"}`, err: `got "10"`},
		{in: `{"interval_ms":-5}`, err: `got -5`},
		{in: `{"devices":[]}`, err: `"devices" is empty`},
		{in: `{"devices":0}`, err: `"devices" must be an array`},
		{in: `{"devices":[-1]}`, err: `"devices": -1 is not a CUDA device ordinal`},
		{in: `{"devices":["0"]}`, err: `"devices": "0" is not a CUDA device ordinal`},
		{in: `{"devices":[1.5]}`, err: `"devices": 1.5 is not`},
		{in: `{"devices":[0,0]}`, err: `"devices": 0 is listed twice`},
		{in: `[]`, err: `must be a JSON object`},
		{in: `{"collect":["nvml"]} {}`, err: `unexpected data after the object`},
		{in: `{"collect":`, err: `invalid JSON`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseStartOptions([]byte(tt.in))
			if tt.err != "" {
				require.Error(t, err)
				assert.Equal(t, session.InvalidArgument, session.CodeOf(err))
				assert.Contains(t, err.Error(), "ct_device_start: options_json: ")
				assert.Contains(t, err.Error(), tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// target is a session stand-in for Start (NVML only: CUPTI needs a real
// session, whose C span stacks it reads).
type target struct {
	fakeClock
	recorder
}

func (*target) Handle() uint64 { return 0 }
func (*target) RecordDeviceInterval(uint64, *events.DeviceInterval) error {
	return errors.New("not a session")
}
func (*target) RecordScalar(uint64, string, float64) error { return errors.New("not a session") }

// fakeCUPTILoaded is set once start_cupti_test.go has loaded the fake
// libcupti, which no process can unload.
var fakeCUPTILoaded bool

func TestStart(t *testing.T) {
	noLib := func() (Library, error) {
		return nil, &session.Error{Code: session.Unavailable, Msg: "NVML is unavailable: libnvidia-ml.so.1 could not be loaded: libnvidia-ml.so.1: cannot open shared object file"}
	}
	tests := []struct {
		name    string
		opts    string
		open    func() (Library, error)
		code    session.Status
		msg     string
		devices []string
	}{
		{name: "no driver", opts: `{"collect":["nvml"]}`, open: noLib, code: session.Unavailable,
			msg: "ct_device_start: NVML is unavailable: libnvidia-ml.so.1 could not be loaded"},
		// Before start_cupti_test.go loads the fake libcupti: the first
		// libcupti loaded stays for the life of the process.
		{name: "cupti without libcupti: nvml is not left running", opts: `{"collect":["nvml","cupti"],"cupti_lib":"/nonexistent/libcupti.so.12"}`,
			code: session.Unavailable, msg: "ct_device_start: CUPTI is unavailable: no libcupti could be loaded (/nonexistent/libcupti.so.12: cannot open shared object file"},
		{name: "foreign error", opts: `{}`, open: func() (Library, error) { return nil, errors.New("boom") }, code: session.Internal, msg: "ct_device_start: boom"},
		{name: "nvml on two devices", opts: `{"interval_ms":1}`, devices: []string{"cuda:0", "cuda:1"}},
		{name: "nvml on one", opts: `{"devices":[1]}`, devices: []string{"cuda:1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if strings.HasPrefix(tt.name, "cupti without libcupti") && fakeCUPTILoaded {
				t.Skip("the fake libcupti stays loaded for the process (go test -count > 1); the first run covered this")
			}
			d0, d1 := h100(0), h100(1)
			lib, _ := mockNVML(&d0, &d1)
			open := tt.open
			if open == nil {
				open = func() (Library, error) { return lib, nil }
			}
			o, err := ParseStartOptions([]byte(tt.opts))
			require.NoError(t, err)
			tg := &target{}
			c, err := Start(tg, o, WithNVMLOpener(open), WithSamplerOptions(WithVisibleDevices("", false)),
				WithCUPTIOptions(cupti.Options{Sonames: []string{}, LookupEnv: func(string) (string, bool) { return "", false }}))
			if tt.msg != "" {
				require.Error(t, err)
				assert.Nil(t, c)
				assert.Equal(t, tt.code, session.CodeOf(err))
				assert.Contains(t, err.Error(), tt.msg)
				if tt.open == nil {
					assert.Len(t, lib.ShutdownCalls(), 1, "NVML was started and shut down")
					assert.Empty(t, tg.got(), "and never sampled")
				}
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.devices, c.Sampler().Devices())
			require.NoError(t, c.Flush())
			require.NoError(t, c.Stop())
			require.NoError(t, c.Stop())
			require.NoError(t, c.Flush(), "Flush after Stop does nothing")
			assert.GreaterOrEqual(t, len(tg.got()), 3*len(tt.devices), "first sample, flush and stop each write one per device")
			assert.Len(t, lib.ShutdownCalls(), 1)
		})
	}
}
