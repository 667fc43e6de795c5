package main

/*
#include <stdlib.h>
#include "candle_trace.h"

*/
import "C"

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/candle-trace/candle-trace/internal/events"
	"github.com/candle-trace/candle-trace/internal/session"
)

// The drop-in mode: with CANDLE_TRACE_PATH set, loading the library (by
// LD_PRELOAD or a normal link) opens an ambient session whose root is the
// measured region, and process exit finishes it. It runs from a Go init,
// which runs once the Go runtime is up, never from a C constructor (an
// export called before the runtime starts would wait forever).

var ambient *session.Session

func init() {
	path := os.Getenv("CANDLE_TRACE_PATH")
	if path == "" {
		return
	}
	s, err := openAmbient(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "candle-trace: drop-in session not started: %v\n", err)
		return
	}
	ambient = s
	// Under the drop-in shim, a fatal signal flushes the trace (crashflush.go).
	startCrashFlush(s)
	opts, err := ambientDeviceOptions()
	if err == nil && opts != nil {
		err = deviceStart(s, opts)
	}
	if err != nil {
		// The session goes on without them, as after a failed ct_device_start.
		fmt.Fprintf(os.Stderr, "candle-trace: device collectors not started: %v\n", err)
	}
}

// ambientRun builds the run JSON from CANDLE_TRACE_* variables.
func ambientRun() ([]byte, error) {
	env := func(name, def string) string {
		if v := os.Getenv("CANDLE_TRACE_" + name); v != "" {
			return v
		}
		return def
	}
	step, err := strconv.ParseUint(env("CAPTURE_STEP", "1"), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("CANDLE_TRACE_CAPTURE_STEP: %v", err)
	}
	tags := map[string]string{"mode": "drop-in"}
	if t := os.Getenv("CANDLE_TRACE_TAGS"); t != "" {
		for _, kv := range strings.Split(t, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || strings.TrimSpace(k) == "" {
				return nil, fmt.Errorf("CANDLE_TRACE_TAGS: %q is not key=value", kv)
			}
			tags[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return json.Marshal(map[string]any{
		"entrypoint":    env("ENTRYPOINT", filepath.Base(os.Args[0])),
		"phase":         env("PHASE", "infer"),
		"capture_step":  step,
		"device":        env("DEVICE", "cpu"),
		"tags":          tags,
		"measured_root": true,
	})
}

// expandPath replaces %p with the pid and %r with $RANK (0 when unset), so
// each process of a multi-process job writes its own file.
func expandPath(p string) string {
	rank := os.Getenv("RANK")
	if rank == "" {
		rank = "0"
	}
	return strings.NewReplacer("%p", strconv.Itoa(os.Getpid()), "%r", rank, "%%", "%").Replace(p)
}

func openAmbient(path string) (*session.Session, error) {
	run, err := ambientRun()
	if err != nil {
		return nil, err
	}
	p := session.DefaultProducer
	p.Binding = "drop-in"
	return session.Open(expandPath(path), run, append(openOptions(), session.WithProducer(p))...)
}

// ctgo_ambient_handle is ct_ambient_session's answer (0 when none).
//
//export ctgo_ambient_handle
func ctgo_ambient_handle() C.ct_session {
	if ambient == nil {
		return 0
	}
	return C.ct_session(ambient.Handle())
}

// ctgo_ambient_exit finishes the drop-in session at process exit: complete
// when every span is closed, failed (with the reason) otherwise.
//
//export ctgo_ambient_exit
func ctgo_ambient_exit() {
	s := ambient
	if s == nil || session.Forked() {
		return
	}
	ambient = nil
	stopCrashFlush() // a signal from here on has nothing to wait for
	if err := s.Finish(); err != nil && session.CodeOf(err) == session.State {
		_ = s.FinishFailed(clipReason("process exited before the capture completed: " + err.Error()))
	}
}

// clipReason keeps a reason the library composes within what FinishFailed
// takes (events.MaxStringBytes): the refusal names up to five open spans,
// and a span name may be up to 262,096 bytes.
func clipReason(r string) string {
	const more = " ..."
	if len(r) <= events.MaxStringBytes {
		return r
	}
	return strings.ToValidUTF8(r[:events.MaxStringBytes-len(more)], "") + more
}
