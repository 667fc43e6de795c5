package runner

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/session"
)

// The fake child is this test binary started with fakeChildEnv set: it
// does what FAKE_CHILD says (comma-separated), so that the runner's tests
// need neither Python nor the library:
//
//	env           write its arguments and environment as JSON to $FAKE_CHILD_OUT
//	trace         write a valid, complete trace at the runner's output path
//	failed-trace  write a valid trace whose capture failed
//	watch-trace   write a valid, complete trace into the --watch folder, as
//	              update-000007-slow.jsonl
//	exit=N        exit with status N
//	kill=SIG      kill itself with SIG
//	wait          write $FAKE_CHILD_OUT.ready, then wait for SIGTERM or SIGINT
//	              and exit with 100 + the signal (after 10 s: exit 99)
const fakeChildEnv = "CANDLE_TRACE_RUNNER_FAKE_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(fakeChildEnv) == "1" {
		os.Exit(fakeChild(strings.Split(os.Getenv("FAKE_CHILD"), ",")))
	}
	os.Exit(m.Run())
}

// fakeChildDump is what the "env" action writes.
type fakeChildDump struct {
	Args []string          `json:"args"`
	Env  map[string]string `json:"env"`
	Pid  int               `json:"pid"`
}

func fakeChild(actions []string) int {
	out := os.Getenv("FAKE_CHILD_OUT")
	for _, a := range actions {
		name, arg, _ := strings.Cut(a, "=")
		switch name {
		case "env":
			d := fakeChildDump{Args: os.Args, Env: map[string]string{}, Pid: os.Getpid()}
			for _, kv := range os.Environ() {
				k, v, _ := strings.Cut(kv, "=")
				d.Env[k] = v
			}
			b, _ := json.Marshal(d)
			if err := os.WriteFile(out, b, 0o600); err != nil {
				return 90
			}
		case "trace", "failed-trace", "watch-trace":
			if err := writeFakeTrace(name); err != nil {
				fmt.Fprintln(os.Stderr, "fake child:", err)
				return 91
			}
		case "exit":
			n, _ := strconv.Atoi(arg)
			return n
		case "kill":
			n, _ := strconv.Atoi(arg)
			_ = syscall.Kill(os.Getpid(), syscall.Signal(n))
			time.Sleep(5 * time.Second)
			return 92
		case "wait":
			sigs := make(chan os.Signal, 2)
			signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
			if err := os.WriteFile(out+".ready", nil, 0o600); err != nil {
				return 90
			}
			select {
			case s := <-sigs:
				return 100 + int(s.(syscall.Signal))
			case <-time.After(10 * time.Second):
				return 99
			}
		}
	}
	return 0
}

// writeFakeTrace writes a trace at the path the runner asked for (the
// drop-in's or the Python integration's variable, %p expanded; in the
// --watch folder for "watch-trace").
func writeFakeTrace(action string) error {
	runtime.LockOSThread() // spans belong to a thread
	pattern := os.Getenv(EnvOutput)
	if pattern == "" {
		pattern = os.Getenv("CANDLE_TRACE_PATH")
	}
	if action == "watch-trace" {
		pattern = filepath.Join(os.Getenv(EnvWatch), "update-000007-slow.jsonl")
		if err := os.MkdirAll(filepath.Dir(pattern), 0o755); err != nil {
			return err
		}
	}
	path := strings.ReplaceAll(pattern, "%p", strconv.Itoa(os.Getpid()))
	s, err := session.Open(path, []byte(`{"entrypoint":"fake::infer","phase":"infer","capture_step":1,`+
		`"device":"cpu","measured_root":true}`))
	if err != nil {
		return err
	}
	id, err := s.BeginSpan("model/forward", events.SpanModule, events.StepForward)
	if err != nil {
		return err
	}
	time.Sleep(2 * time.Millisecond)
	if err := s.EndSpan(id); err != nil {
		return err
	}
	if action == "failed-trace" {
		return s.FinishFailed("the fake child failed on purpose")
	}
	return s.Finish()
}
