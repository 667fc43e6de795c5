package runner

import (
	"os"
	"path/filepath"
	"strings"
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
			Options{CaptureStep: 3, Output: DefaultOutput, DeviceCollect: "auto", Command: []string{"python", "-m", "train"}}, nil, ""},
		{"every flag", []string{"--capture-step", "7", "--output", "o-%r.jsonl", "--match", "a*,b", "--device-collect", "nvml, cupti",
			"--aggregate", "s.json", "--", "./bin", "--capture-step", "1"},
			Options{CaptureStep: 7, Output: "o-%r.jsonl", Match: "a*,b", DeviceCollect: "nvml, cupti", Aggregate: "s.json",
				Command: []string{"./bin", "--capture-step", "1"}}, []string{"nvml", "cupti"}, ""},
		{"the command's flags stay its own without --", []string{"python3", "--output", "x"},
			Options{CaptureStep: 3, Output: DefaultOutput, DeviceCollect: "auto", Command: []string{"python3", "--output", "x"}}, nil, ""},
		{"none collects nothing", []string{"--device-collect", "none", "x"},
			Options{CaptureStep: 3, Output: DefaultOutput, DeviceCollect: "none", Command: []string{"x"}}, []string{}, ""},
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

func TestPython(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o755))
		return p
	}
	venvPython := write("python3.11", "")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "venv", "bin"), 0o755))
	link := filepath.Join(dir, "venv", "bin", "py")
	require.NoError(t, os.Symlink(venvPython, link))
	tests := []struct {
		name   string
		cmd    string
		want   bool
		interp string
	}{
		{"by name", venvPython, true, venvPython},
		{"a link to a python", link, true, link},
		{"env shebang (torchrun, console scripts)", write("torchrun", "#!/usr/bin/env python3\nimport sys\n"), true, "python3"},
		{"env -S shebang", write("tool", "#!/usr/bin/env -S python3 -u\n"), true, "python3"},
		{"a venv's python in the shebang", write("train", "#!/opt/venv/bin/python\n"), true, "/opt/venv/bin/python"},
		{"a shell script", write("run.sh", "#!/bin/sh\nexec python3 x.py\n"), false, ""},
		{"a binary", write("a.out", "\x7fELF\x02\x01"), false, ""},
		{"not found", filepath.Join(dir, "missing"), false, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ok, interp := Python(tc.cmd)
			assert.Equal(t, tc.want, ok)
			assert.Equal(t, tc.interp, interp)
		})
	}
}

func TestEnviron(t *testing.T) {
	libs := &Libraries{Lib: "/l/libcandle_trace.so", Preload: "/l/libcandle_trace_preload.so", PythonPath: "/repo/bindings/python"}
	base := []string{"PATH=/bin", "LD_PRELOAD=/other.so", "PYTHONPATH=/mine", "CANDLE_TRACE_PATH=/x"}
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

func TestLocate(t *testing.T) {
	root := t.TempDir()
	touch := func(parts ...string) string {
		p := filepath.Join(append([]string{root}, parts...)...)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, nil, 0o644))
		return p
	}
	repoLib := touch("repo", "build", LibName)
	touch("repo", "build", PreloadName)
	touch("repo", "go.mod")
	touch("repo", "bindings", "python", "candle_trace", "__init__.py")
	pkgLib := touch("site", "candle_trace", LibName)
	exeLib := touch("bin", LibName)
	envLib := touch("env", LibName)
	none := func(string) string { return "" }
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "CANDLE_TRACE_LIB" {
				return v
			}
			return ""
		}
	}
	pkg := func(string) string { return filepath.Dir(pkgLib) }
	tests := []struct {
		name       string
		loc        Locator
		python     bool
		lib        string
		preload    bool
		pythonPath string
		err        string
	}{
		{"$CANDLE_TRACE_LIB first", Locator{Getenv: env(envLib), Exe: filepath.Join(root, "bin", "candle-trace"), PackageDir: pkg}, true, envLib, false, "", ""},
		{"next to the executable", Locator{Getenv: none, Exe: filepath.Join(root, "bin", "candle-trace"), PackageDir: pkg}, false, exeLib, false, "", ""},
		{"in the Python package", Locator{Getenv: none, Exe: filepath.Join(root, "nowhere", "candle-trace"), PackageDir: pkg}, true, pkgLib, false, "", ""},
		{"a checkout's build, with its bindings", Locator{Getenv: none, Exe: filepath.Join(root, "nowhere", "candle-trace"),
			Cwd: filepath.Join(root, "repo", "examples"), PackageDir: none}, true, repoLib, true, filepath.Join(root, "repo", "bindings", "python"), ""},
		{"the executable in a checkout's build", Locator{Getenv: none, Exe: filepath.Join(root, "repo", "build", "candle-trace"), PackageDir: pkg},
			true, repoLib, true, filepath.Join(root, "repo", "bindings", "python"), ""},
		{"a missing $CANDLE_TRACE_LIB", Locator{Getenv: env("/no/lib.so"), Exe: exeLib}, false, "", false, "", "CANDLE_TRACE_LIB=/no/lib.so: no such file"},
		{"nothing anywhere", Locator{Getenv: none, Exe: filepath.Join(root, "nowhere", "candle-trace"), PackageDir: none}, false, "", false, "",
			LibName + " not found: set CANDLE_TRACE_LIB, pip install bindings/python, or run `make lib`"},
		{"a library but no package", Locator{Getenv: none, Exe: filepath.Join(root, "bin", "candle-trace"), PackageDir: none}, true, "", false, "",
			"imports no candle_trace package: pip install bindings/python"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			libs, err := tc.loc.Locate("python3", tc.python)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.lib, libs.Lib)
			assert.Equal(t, tc.preload, libs.Preload != "", libs.Preload)
			assert.Equal(t, tc.pythonPath, libs.PythonPath)
			assert.True(t, strings.HasSuffix(libs.Lib, LibName))
		})
	}
}
