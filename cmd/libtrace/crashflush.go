package main

/*
#include <dlfcn.h>
#include <stddef.h>

// The drop-in shim's side of the fatal-signal flush (cmd/preload/preload.c).
// Found with dlsym(RTLD_DEFAULT): the shim is preloaded, so its symbols are
// global; a library linked normally or preloaded alone finds nothing and
// starts nothing. The shim's functions are called through these pointers
// only from C: Go cannot call a C function pointer.
typedef int (*ct_crash_int_fn)(void);
typedef void (*ct_crash_void_fn)(void);
static ct_crash_int_fn ct_crash_begin_fn, ct_crash_wait_fn;
static ct_crash_void_fn ct_crash_done_fn, ct_crash_stop_fn;

static int ct_crash_find(void) {
	ct_crash_begin_fn = (ct_crash_int_fn)dlsym(RTLD_DEFAULT, "ct__preload_crash_waiter_begin");
	ct_crash_wait_fn = (ct_crash_int_fn)dlsym(RTLD_DEFAULT, "ct__preload_crash_wait");
	ct_crash_done_fn = (ct_crash_void_fn)dlsym(RTLD_DEFAULT, "ct__preload_crash_done");
	ct_crash_stop_fn = (ct_crash_void_fn)dlsym(RTLD_DEFAULT, "ct__preload_crash_stop");
	return ct_crash_begin_fn && ct_crash_wait_fn && ct_crash_done_fn && ct_crash_stop_fn;
}
static int ct_crash_begin(void) { return ct_crash_begin_fn(); }
static int ct_crash_wait(void) { return ct_crash_wait_fn(); }
static void ct_crash_done(void) { ct_crash_done_fn(); }
static void ct_crash_stop(void) { ct_crash_stop_fn(); }
*/
import "C"

import (
	"fmt"
	"runtime"
	"syscall"

	"github.com/candle-trace/candle-trace/internal/session"
)

// The drop-in's flush on a fatal signal. The shim's signal handler cannot
// run Go code, so it wakes a goroutine that waits here, locked to its own OS
// thread and parked in C (a futex wait in the shim), and waits a bounded time
// for it: the goroutine drains the rings and writes the buffer (Flush, under
// the session lock) and says so. It exists only while the ambient session is
// open and only when the shim loaded the library; a fatal signal ends the
// process, so it serves at most one flush.

// crashServing is true while the goroutine serves the ambient session. Set
// by the package init, read by the exit handler (exports wait for the inits).
var crashServing bool

// startCrashFlush starts the waiter for s when the drop-in shim installed
// handlers. It returns once the waiter is serving, so that a program that
// got the session from ct_ambient_session is covered from its first record.
func startCrashFlush(s *session.Session) {
	if C.ct_crash_find() == 0 {
		return
	}
	serving := make(chan bool)
	go func() {
		// Never unlocked: the thread's signal mask (the shim blocks SIGTERM
		// and SIGABRT on it, so a kill never lands on the one thread that
		// must flush) goes away with the thread when the goroutine returns.
		runtime.LockOSThread()
		if C.ct_crash_begin() != 0 {
			serving <- false
			return
		}
		serving <- true
		sig := int(C.ct_crash_wait())
		if sig == 0 {
			return // the session ended
		}
		crashFlush(s, sig)
		C.ct_crash_done()
	}()
	crashServing = <-serving
}

// crashFlush writes what s has recorded and ends it failed, naming the
// signal (candle-graph reads no trace without a terminal line). The process
// is dying, so errors (a poisoned or already finishing session) are only
// skipped, and a panic is recovered: unrecovered on this goroutine it would
// end the process with Go's exit status instead of the signal, and done
// would never be said.
func crashFlush(s *session.Session, sig int) {
	defer func() { _ = recover() }()
	reason := fmt.Sprintf("killed by %s (signal %d) before the capture completed", signalName(sig), sig)
	if err := s.FinishFailed(reason); err != nil {
		_ = s.Flush()
	}
}

// signalName is the C name of a signal the shim handles.
func signalName(sig int) string {
	names := map[syscall.Signal]string{syscall.SIGHUP: "SIGHUP", syscall.SIGQUIT: "SIGQUIT",
		syscall.SIGILL: "SIGILL", syscall.SIGABRT: "SIGABRT", syscall.SIGBUS: "SIGBUS",
		syscall.SIGFPE: "SIGFPE", syscall.SIGSEGV: "SIGSEGV", syscall.SIGTERM: "SIGTERM"}
	if n, ok := names[syscall.Signal(sig)]; ok {
		return n
	}
	return "signal"
}

// stopCrashFlush tells the shim the session is ending: its handlers stop
// waiting and the waiter returns. Called before the ambient session
// finishes, from the exit handler.
func stopCrashFlush() {
	if !crashServing {
		return
	}
	crashServing = false
	C.ct_crash_stop()
}
