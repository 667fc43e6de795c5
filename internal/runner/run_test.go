package runner

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeInstall is a folder with (empty) libraries next to a fake
// candle-trace executable, for a Locator that finds them there.
func fakeInstall(t *testing.T) (Locator, string) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	require.NoError(t, os.MkdirAll(bin, 0o755))
	for _, f := range []string{LibName, PreloadName} {
		require.NoError(t, os.WriteFile(filepath.Join(bin, f), nil, 0o644))
	}
	pkg := filepath.Join(dir, "site-packages", "candle_trace") // an installed Python package
	return Locator{Getenv: func(string) string { return "" }, Exe: filepath.Join(bin, "candle-trace"),
		Cwd: dir, PackageDir: func(string) string { return pkg }}, bin
}

// asPython is the test binary under the name python3 (the runner takes it
// for a Python interpreter).
func asPython(t *testing.T) string {
	dir := t.TempDir()
	py := filepath.Join(dir, "python3")
	exe, err := os.Executable()
	require.NoError(t, err)
	require.NoError(t, os.Symlink(exe, py))
	return py
}

type fakeRun struct {
	runner         Runner
	stdout, stderr *bytes.Buffer
	out            string // FAKE_CHILD_OUT
	dir            string
}

func newFakeRun(t *testing.T, actions string) *fakeRun {
	loc, _ := fakeInstall(t)
	dir := t.TempDir()
	f := &fakeRun{stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}, out: filepath.Join(dir, "child.json"), dir: dir}
	f.runner = Runner{Locator: loc, Stdin: strings.NewReader(""), Stdout: f.stdout, Stderr: f.stderr,
		Environ: []string{"PATH=" + os.Getenv("PATH"), fakeChildEnv + "=1", "FAKE_CHILD=" + actions,
			"FAKE_CHILD_OUT=" + f.out, "PYTHONPATH=/user/site", "CANDLE_TRACE_PATH=/stale/%p.jsonl",
			EnvClaim + "=1:"},
		FromTerminal: func() bool { return false }}
	return f
}

func (f *fakeRun) dump(t *testing.T) fakeChildDump {
	b, err := os.ReadFile(f.out)
	require.NoError(t, err)
	var d fakeChildDump
	require.NoError(t, json.Unmarshal(b, &d))
	return d
}

func testBinary(t *testing.T) string {
	exe, err := os.Executable()
	require.NoError(t, err)
	return exe
}

func TestRunExitStatus(t *testing.T) {
	tests := []struct {
		name    string
		actions string
		want    int
		stderr  string
	}{
		{"the child's status is the runner's", "exit=7", 7, "no trace written"},
		{"success", "exit=0", 0, "no process matched --match"},
		{"killed by SIGKILL is 128+9", "kill=9", 128 + 9, ""},
		{"killed by SIGTERM is 128+15", "kill=15", 128 + 15, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeRun(t, tc.actions)
			code := f.runner.Run([]string{"--output", filepath.Join(f.dir, "t-%p.jsonl"), "--", testBinary(t)})
			assert.Equal(t, tc.want, code, f.stderr.String())
			assert.Contains(t, f.stderr.String(), tc.stderr)
		})
	}
}

func TestRunUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want int
		says string
	}{
		{"no command", []string{"--capture-step", "2"}, ExitUsage, "no command given"},
		{"unknown flag", []string{"--frobnicate", "--", "true"}, ExitUsage, "frobnicate"},
		{"missing command", []string{"--", "/no/such/program"}, ExitNotFound, "/no/such/program"},
		{"--aggregate needs python", []string{"--aggregate", "a.json", "--", "true"}, ExitUsage, "--aggregate needs a Python command"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeRun(t, "exit=0")
			assert.Equal(t, tc.want, f.runner.Run(tc.args))
			assert.Contains(t, f.stderr.String(), tc.says)
		})
	}
	f := newFakeRun(t, "exit=0")
	assert.Equal(t, 0, f.runner.Run([]string{"--help"}))
	assert.Equal(t, Usage, f.stdout.String())
}

func TestRunDropInEnvironment(t *testing.T) {
	f := newFakeRun(t, "env,trace")
	out := filepath.Join(f.dir, "t-%p.jsonl")
	code := f.runner.Run([]string{"--output", out, "--device-collect", "nvml", "--", testBinary(t), "a", "b"})
	require.Equal(t, 0, code, f.stderr.String())
	d := f.dump(t)
	bin := filepath.Dir(f.runner.Locator.Exe)
	assert.Equal(t, []string{testBinary(t), "a", "b"}, d.Args)
	assert.Equal(t, out, d.Env["CANDLE_TRACE_PATH"])
	assert.Equal(t, filepath.Base(testBinary(t)), d.Env["CANDLE_TRACE_MATCH"], "default: the command's name")
	assert.Equal(t, "nvml", d.Env["CANDLE_TRACE_DEVICE_COLLECT"])
	assert.Equal(t, filepath.Join(bin, PreloadName), d.Env["LD_PRELOAD"])
	assert.Equal(t, filepath.Join(bin, LibName), d.Env["CANDLE_TRACE_LIB"])
	assert.Empty(t, d.Env[EnvOutput], "no Python integration")
	trace := strings.ReplaceAll(out, "%p", strconv.Itoa(d.Pid))
	assert.Contains(t, f.stderr.String(), "candle-trace: trace "+trace+": valid, complete; fake::infer ")
	assert.Contains(t, f.stderr.String(), "top span model/forward")
}

func TestRunPythonEnvironment(t *testing.T) {
	f := newFakeRun(t, "env,trace")
	out := filepath.Join(f.dir, "t-%p.jsonl")
	agg := filepath.Join(f.dir, "agg-%p.json")
	code := f.runner.Run([]string{"--output", out, "--capture-step", "5", "--aggregate", agg,
		"--", asPython(t), "train.py"})
	require.Equal(t, 0, code, f.stderr.String())
	d := f.dump(t)
	py := strings.Split(d.Env["PYTHONPATH"], string(os.PathListSeparator))
	require.Len(t, py, 2, "the sitecustomize folder, then the user's PYTHONPATH")
	assert.Equal(t, "/user/site", py[1])
	assert.Contains(t, py[0], "candle-trace-run-")
	_, err := os.Stat(py[0])
	assert.True(t, os.IsNotExist(err), "the sitecustomize folder is removed after the run")
	assert.Equal(t, out, d.Env[EnvOutput])
	assert.Equal(t, "5", d.Env[EnvCaptureStep])
	assert.Equal(t, "auto", d.Env[EnvDeviceCollect])
	assert.Equal(t, agg, d.Env[EnvAggregate])
	assert.NotContains(t, d.Env, "CANDLE_TRACE_PATH", "the library must not open a whole-process session")
	assert.NotContains(t, d.Env, EnvClaim, "a run starts with no claim")
	assert.NotContains(t, d.Env, "LD_PRELOAD")
	assert.Contains(t, f.stderr.String(), ": valid, complete;")
}

func TestRunWatch(t *testing.T) {
	tests := []struct {
		name, actions string
		flags         []string
		want          []string // in the runner's lines
		wantMax       string
	}{
		{"a trigger fired", "env,watch-trace", []string{"--max-traces", "2"},
			[]string{"candle-trace: trace ", "update-000007-slow.jsonl: valid, complete;"}, "2"},
		{"nothing fired", "env", nil,
			[]string{"candle-trace: no trace written to ", ": no trigger fired (a watched run keeps only the updates that go wrong)"}, "3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeRun(t, tc.actions)
			folder := filepath.Join(f.dir, "traces")
			// An earlier run's trace in the folder is not this run's.
			require.NoError(t, os.MkdirAll(folder, 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(folder, "update-000002-slow.jsonl"), []byte("old\n"), 0o644))
			args := append([]string{"--watch", folder}, tc.flags...)
			code := f.runner.Run(append(args, "--", asPython(t), "train.py"))
			require.Equal(t, 0, code, f.stderr.String())
			d := f.dump(t)
			assert.Equal(t, folder, d.Env[EnvWatch])
			assert.Equal(t, tc.wantMax, d.Env[EnvMaxTraces])
			for _, w := range tc.want {
				assert.Contains(t, f.stderr.String(), w)
			}
			assert.NotContains(t, f.stderr.String(), "update-000002-slow.jsonl")
		})
	}
}

func TestRunFailedTraceVerdict(t *testing.T) {
	f := newFakeRun(t, "failed-trace,exit=3")
	code := f.runner.Run([]string{"--output", filepath.Join(f.dir, "t-%p.jsonl"), "--", testBinary(t)})
	assert.Equal(t, 3, code)
	assert.Contains(t, f.stderr.String(), "valid, FAILED (the fake child failed on purpose)")
}

func TestRunForwardsSignals(t *testing.T) {
	tests := []struct {
		name     string
		send     []syscall.Signal
		terminal bool
		want     int
	}{
		{"SIGTERM reaches the child", []syscall.Signal{syscall.SIGTERM}, false, 100 + 15},
		{"SIGINT sent to the runner alone is forwarded", []syscall.Signal{syscall.SIGINT}, false, 100 + 2},
		// The terminal sent Ctrl-C to the child too: forwarding it would make two.
		{"a terminal's SIGINT is not sent again", []syscall.Signal{syscall.SIGINT, syscall.SIGTERM}, true, 100 + 15},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeRun(t, "wait")
			f.runner.FromTerminal = func() bool { return tc.terminal }
			done := make(chan int, 1)
			go func() {
				done <- f.runner.Run([]string{"--output", filepath.Join(f.dir, "t-%p.jsonl"), "--", testBinary(t)})
			}()
			require.Eventually(t, func() bool { _, err := os.Stat(f.out + ".ready"); return err == nil },
				10*time.Second, 10*time.Millisecond)
			for _, s := range tc.send {
				require.NoError(t, syscall.Kill(os.Getpid(), s))
				time.Sleep(100 * time.Millisecond)
			}
			select {
			case code := <-done:
				assert.Equal(t, tc.want, code, f.stderr.String())
			case <-time.After(15 * time.Second):
				t.Fatal("the run did not end")
			}
		})
	}
}

func TestRunSaysWhenPythonSkipsTheSitecustomize(t *testing.T) {
	tests := []struct {
		args []string
		says bool
	}{
		{[]string{"-I", "train.py"}, true},
		{[]string{"train.py", "-I"}, false},
	}
	for _, tc := range tests {
		f := newFakeRun(t, "exit=0")
		code := f.runner.Run(append([]string{"--output", filepath.Join(f.dir, "t-%p.jsonl"), "--", asPython(t)}, tc.args...))
		require.Equal(t, 0, code, f.stderr.String())
		assert.Equal(t, tc.says, strings.Contains(f.stderr.String(), "python -I skips the sitecustomize"), "%v", tc.args)
	}
}
