package runner

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEnviron(t *testing.T) {
	libs := &Libraries{Lib: "/l/libcandle_trace.so", Preload: "/l/libcandle_trace_preload.so", PythonPath: "/repo/bindings/python"}
	// A run inside a watched run's program does not watch unless told to.
	base := []string{"PATH=/bin", "LD_PRELOAD=/other.so", "PYTHONPATH=/mine", "CANDLE_TRACE_PATH=/x",
		EnvWatch + "=/outer", EnvMaxTraces + "=9", EnvFlightRecord + "=0"}
	tests := []struct {
		name   string
		o      Options
		python bool
		want   map[string]string // "" means unset
		err    string
	}{
		{"python", Options{CaptureStep: 4, Output: "/t/%p.jsonl", DeviceCollect: "none", Command: []string{"python"}}, true,
			map[string]string{"PYTHONPATH": "/site:/repo/bindings/python:/mine", EnvOutput: "/t/%p.jsonl", EnvCaptureStep: "4",
				EnvDeviceCollect: "none", "CANDLE_TRACE_PATH": "", "LD_PRELOAD": "/other.so", "CANDLE_TRACE_LIB": libs.Lib, EnvAggregate: ""}, ""},
		{"python, collectors", Options{CaptureStep: 3, Output: "/t", DeviceCollect: "cupti,nvml", Command: []string{"python"}}, true,
			map[string]string{EnvDeviceCollect: "cupti,nvml"}, ""},
		{"drop-in", Options{CaptureStep: 3, Output: "/t/%p.jsonl", DeviceCollect: "auto", Command: []string{"/opt/bin/train"}}, false,
			map[string]string{"CANDLE_TRACE_PATH": "/t/%p.jsonl", "CANDLE_TRACE_MATCH": "train", "LD_PRELOAD": libs.Preload + ":/other.so",
				"CANDLE_TRACE_DEVICE_COLLECT": "", "PYTHONPATH": "/mine", EnvOutput: ""}, ""},
		{"drop-in, match and nvml", Options{Output: "/t", Match: "w*", DeviceCollect: "nvml", Command: []string{"train"}}, false,
			map[string]string{"CANDLE_TRACE_MATCH": "w*", "CANDLE_TRACE_DEVICE_COLLECT": "nvml"}, ""},
		{"python, watch", Options{Output: "/t", DeviceCollect: "auto", Watch: "/w/{rank}", MaxTraces: 5, Command: []string{"python"}}, true,
			map[string]string{EnvWatch: "/w/{rank}", EnvMaxTraces: "5", EnvFlightRecord: ""}, ""},
		{"python, watch, no flight recorder", Options{Output: "/t", DeviceCollect: "auto", Watch: "/w", MaxTraces: 3, NoFlightRecorder: true,
			Command: []string{"python"}}, true, map[string]string{EnvFlightRecord: "0"}, ""},
		{"python, no watch", Options{Output: "/t", DeviceCollect: "auto", Command: []string{"python"}}, true,
			map[string]string{EnvWatch: "", EnvMaxTraces: "", EnvFlightRecord: ""}, ""},
		{"--watch without python", Options{Output: "/t", Watch: "/w", DeviceCollect: "auto", Command: []string{"train"}}, false, nil,
			"--watch needs a Python command"},
		{"--match with python", Options{Output: "/t", Match: "w*", DeviceCollect: "auto", Command: []string{"python"}}, true, nil,
			"--match is for the drop-in"},
		{"--aggregate without python", Options{Output: "/t", Aggregate: "/a", DeviceCollect: "auto", Command: []string{"train"}}, false, nil,
			"--aggregate needs a Python command"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Environ(base, &tc.o, libs, tc.python, "/site")
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			e := env(got)
			for k, v := range tc.want {
				assert.Equal(t, v, e.get(k), k)
			}
			assert.Equal(t, "/bin", e.get("PATH"))
		})
	}
	_, err := Environ(base, &Options{Output: "/t", DeviceCollect: "auto", Command: []string{"x"}},
		&Libraries{Lib: libs.Lib}, false, "")
	require.Error(t, err)
	assert.Contains(t, err.Error(), PreloadName+" not found")
}
