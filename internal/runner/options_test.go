package runner

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    Options
		collect []string
		err     string
	}{
		{"defaults", []string{"--", "python", "-m", "train"},
			Options{CaptureStep: 3, Output: DefaultOutput, DeviceCollect: "auto", MaxTraces: 3, Command: []string{"python", "-m", "train"}}, nil, ""},
		{"every flag", []string{"--capture-step", "7", "--output", "o-%r.jsonl", "--match", "a*,b", "--device-collect", "nvml, cupti",
			"--aggregate", "s.json", "--", "./bin", "--capture-step", "1"},
			Options{CaptureStep: 7, Output: "o-%r.jsonl", Match: "a*,b", DeviceCollect: "nvml, cupti", Aggregate: "s.json",
				MaxTraces: 3, Command: []string{"./bin", "--capture-step", "1"}}, []string{"nvml", "cupti"}, ""},
		{"the command's flags stay its own without --", []string{"python3", "--output", "x"},
			Options{CaptureStep: 3, Output: DefaultOutput, DeviceCollect: "auto", MaxTraces: 3, Command: []string{"python3", "--output", "x"}}, nil, ""},
		{"none collects nothing", []string{"--device-collect", "none", "x"},
			Options{CaptureStep: 3, Output: DefaultOutput, DeviceCollect: "none", MaxTraces: 3, Command: []string{"x"}}, []string{}, ""},
		{"watch", []string{"--watch", "traces", "--aggregate", "s.json", "--", "python", "train.py"},
			Options{CaptureStep: 3, Output: DefaultOutput, DeviceCollect: "auto", Aggregate: "s.json", Watch: "traces", MaxTraces: 3,
				Command: []string{"python", "train.py"}}, nil, ""},
		{"watch, max traces", []string{"--watch", "t/{rank}", "--max-traces", "0", "python"},
			Options{CaptureStep: 3, Output: DefaultOutput, DeviceCollect: "auto", Watch: "t/{rank}", MaxTraces: 0,
				Command: []string{"python"}}, nil, ""},
		{"watch with a capture step", []string{"--watch", "t", "--capture-step", "3", "x"}, Options{}, nil,
			"--capture-step and --watch: a watched run captures the updates its triggers pick"},
		{"watch with an output", []string{"--output", "o.jsonl", "--watch", "t", "x"}, Options{}, nil,
			"--output and --watch"},
		{"watch, no folder", []string{"--watch", " ", "x"}, Options{}, nil, "--watch must name a folder"},
		{"max traces without watch", []string{"--max-traces", "2", "x"}, Options{}, nil, "--max-traces is for --watch"},
		{"no flight recorder without watch", []string{"--no-flight-recorder", "x"}, Options{}, nil, "--no-flight-recorder is for --watch"},
		{"watch without a flight recorder", []string{"--watch", "t", "--no-flight-recorder", "python"},
			Options{CaptureStep: 3, Output: DefaultOutput, DeviceCollect: "auto", Watch: "t", MaxTraces: 3, NoFlightRecorder: true,
				Command: []string{"python"}}, nil, ""},
		{"max traces below 0", []string{"--watch", "t", "--max-traces", "-1", "x"}, Options{}, nil,
			"--max-traces must be >= 0, got -1"},
		{"no command", []string{"--capture-step", "2", "--"}, Options{}, nil, "no command given"},
		{"capture step 0", []string{"--capture-step", "0", "x"}, Options{}, nil, "--capture-step must be >= 1"},
		{"unknown collector", []string{"--device-collect", "perf", "x"}, Options{}, nil, `unknown collector "perf"`},
		{"empty output", []string{"--output", " ", "x"}, Options{}, nil, "--output must not be empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := Parse(tc.args)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, *o)
			c, err := o.Collectors()
			require.NoError(t, err)
			assert.Equal(t, tc.collect, c)
		})
	}
	_, err := Parse([]string{"--help"})
	assert.ErrorIs(t, err, ErrHelp)
}
