"""Drop-in mode: CANDLE_TRACE_PATH makes loading the library open a session
that process exit finishes, for programs nobody instrumented."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import lines, require_valid

REPO = Path(__file__).resolve().parents[2]
LIB = Path(os.environ.get("CANDLE_TRACE_LIB", REPO / "build" / "libcandle_trace.so"))


def test_preload_traces_an_uninstrumented_program(tmp_path: Path) -> None:
    env = dict(os.environ, LD_PRELOAD=str(LIB), CANDLE_TRACE_PATH=str(tmp_path / "run-%p.jsonl"),
               CANDLE_TRACE_TAGS="job=nightly,host=a", CANDLE_TRACE_PHASE="infer")
    proc = subprocess.run(["/bin/sleep", "0.2"], env=env, timeout=30)
    assert proc.returncode == 0
    traces = list(tmp_path.glob("run-*.jsonl"))
    assert len(traces) == 1, traces
    trace = traces[0]
    assert trace.name.removeprefix("run-").removesuffix(".jsonl").isdigit(), "%p expands to the pid"
    events = lines(trace)
    meta = events[0]
    assert meta["entrypoint"] == "sleep"
    assert meta["tags"] == {"mode": "drop-in", "job": "nightly", "host": "a"}
    assert meta["producer"]["binding"] == "drop-in"
    root = events[1]
    assert root["id"] == "s1" and root["measured"] is True
    assert events[-1]["kind"] == "terminal" and events[-1]["outcome"] == "complete"
    # The root lasts about as long as the program's 200 ms sleep (the session
    # opens while the Go runtime starts, a little after the program does). The
    # measured root states the tracer's time it left out: none, in a drop-in.
    assert events[-2] == {"kind": "span_end", "id": "s1", "duration_ns": events[-1]["timestamp_ns"],
                          "tracer_ns": 0}
    assert events[-1]["timestamp_ns"] >= 100_000_000
    require_valid(trace, tmp_path)


def test_bindings_join_the_ambient_session_and_open_spans_fail_it(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import ctypes
        lib = ctypes.CDLL({str(LIB)!r})
        lib.ct_ambient_session.restype = ctypes.c_uint64
        s = lib.ct_ambient_session()
        assert s != 0, "no ambient session"
        span = ctypes.c_uint64()
        lib.ct_span_begin.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]
        assert lib.ct_span_begin(s, b"left-open", 0, 0, ctypes.byref(span)) == 0
        print(s)
    """)
    env = dict(os.environ, CANDLE_TRACE_PATH=str(tmp_path / "r%r.jsonl"), RANK="3")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.strip()) > 0
    trace = tmp_path / "r3.jsonl"  # %r expands to $RANK
    events = lines(trace)
    assert any(e.get("name") == "left-open" for e in events)
    term = events[-1]
    assert term["outcome"] == "failed"
    assert "process exited before the capture completed" in term["reason"]
    assert "left-open" in term["reason"]


def test_a_rerun_at_a_fixed_path_replaces_its_own_trace_and_nothing_else(tmp_path: Path) -> None:
    trace = tmp_path / "run.jsonl"
    env = dict(os.environ, LD_PRELOAD=str(LIB), CANDLE_TRACE_PATH=str(trace))
    for tag in ("first", "second"):
        proc = subprocess.run(["/bin/true"], env=dict(env, CANDLE_TRACE_TAGS=f"run={tag}"), timeout=30)
        assert proc.returncode == 0
        events = lines(trace)
        assert events[0]["tags"]["run"] == tag, "the rerun replaced its previous trace"
        assert [e["kind"] for e in events].count("meta") == 1
        assert events[-1]["outcome"] == "complete"

    # Not ours: left alone, and stderr says why (the program still runs).
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(trace)
    before = trace.read_bytes()
    for path, why in ((script, "is not a candle-trace trace or summary"), (link, "is a symbolic link")):
        proc = subprocess.run(["/bin/true"], env=dict(env, CANDLE_TRACE_PATH=str(path)), capture_output=True,
                              text=True, timeout=30)
        assert proc.returncode == 0
        assert "drop-in session not started" in proc.stderr and why in proc.stderr and str(path) in proc.stderr
    assert script.read_text() == "import torch\n"
    assert trace.read_bytes() == before, "the link's target was not written"


def test_without_the_variable_there_is_no_ambient_session(tmp_path: Path) -> None:
    script = f"import ctypes; lib = ctypes.CDLL({str(LIB)!r}); lib.ct_ambient_session.restype = ctypes.c_uint64; print(lib.ct_ambient_session())"
    env = {k: v for k, v in os.environ.items() if k != "CANDLE_TRACE_PATH"}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0"


CRASHER = r"""
#include <signal.h>
#include <time.h>
int main(void) {
    struct timespec t = {0, 200 * 1000 * 1000};
    nanosleep(&t, 0);           /* longer than the flush interval */
    volatile int *p = 0;
    return *p;                  /* SIGSEGV in non-Go code */
}
"""


def test_a_crashing_program_leaves_a_readable_partial_trace(tmp_path: Path) -> None:
    cc = os.environ.get("CC", "cc")
    src, exe = tmp_path / "crash.c", tmp_path / "crash"
    src.write_text(CRASHER)
    subprocess.run([cc, "-O0", str(src), "-o", str(exe)], check=True, timeout=60)
    trace = tmp_path / "crash.jsonl"
    env = dict(os.environ, LD_PRELOAD=str(LIB), CANDLE_TRACE_PATH=str(trace))
    proc = subprocess.run([str(exe)], env=env, timeout=30)
    assert proc.returncode == -11, "the program still dies of its own SIGSEGV"
    data = trace.read_bytes()
    assert data.endswith(b"\n"), "only whole lines are on disk"
    events = lines(trace)
    assert [e["kind"] for e in events[:2]] == ["meta", "span_start"]
    assert events[-1]["kind"] != "terminal", "a crash is not a completed capture"
    cli = REPO / "build" / "candle-trace"
    if cli.exists():
        strict = subprocess.run([str(cli), "validate", str(trace)], capture_output=True, text=True, timeout=30)
        assert strict.returncode == 1
        partial = subprocess.run([str(cli), "validate", "--allow-partial", str(trace)],
                                 capture_output=True, text=True, timeout=30)
        assert partial.returncode == 0, partial.stdout + partial.stderr


PRELOAD = REPO / "build" / "libcandle_trace_preload.so"


def test_preload_shim_loads_the_library_only_into_matching_processes(tmp_path: Path) -> None:
    if not PRELOAD.exists():
        pytest.fail(f"{PRELOAD} is not built (make {PRELOAD.relative_to(REPO)})")
    env = dict(os.environ, LD_PRELOAD=str(PRELOAD), CANDLE_TRACE_PATH=str(tmp_path / "t-%p.jsonl"),
               CANDLE_TRACE_LIB=str(LIB), CANDLE_TRACE_MATCH="python*,other")
    # A shell and a sleep are not traced: no Go runtime is started in them.
    r = subprocess.run(["/bin/sh", "-c", "/bin/sleep 0.01"], env=env, timeout=30)
    assert r.returncode == 0
    assert list(tmp_path.glob("t-*.jsonl")) == []
    # The Python process is.
    r = subprocess.run([sys.executable, "-c", "print('hi')"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "hi\n", r.stderr
    (trace,) = tmp_path.glob("t-*.jsonl")
    events = lines(trace)
    assert events[0]["producer"]["binding"] == "drop-in"
    assert events[-1]["kind"] == "terminal" and events[-1]["outcome"] == "complete"
    require_valid(trace, tmp_path)


def test_preload_shim_default_matches_every_process(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CANDLE_TRACE_MATCH"}
    env.update(LD_PRELOAD=str(PRELOAD), CANDLE_TRACE_PATH=str(tmp_path / "all-%p.jsonl"), CANDLE_TRACE_LIB=str(LIB))
    r = subprocess.run(["/bin/sleep", "0.01"], env=env, timeout=30)
    assert r.returncode == 0
    (trace,) = tmp_path.glob("all-*.jsonl")
    assert lines(trace)[0]["entrypoint"] == "sleep"


def test_preload_shim_next_to_the_library_finds_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("CANDLE_TRACE_MATCH", "CANDLE_TRACE_LIB")}
    env.update(LD_PRELOAD=str(PRELOAD), CANDLE_TRACE_PATH=str(tmp_path / "near.jsonl"))
    r = subprocess.run(["/bin/sleep", "0.01"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert lines(tmp_path / "near.jsonl")[-1]["outcome"] == "complete"


# ---- a fatal signal under the drop-in shim flushes the trace -----------------
#
# The program finds the library the way an uninstrumented program's binding
# would (dlsym: the shim loaded it RTLD_GLOBAL), records N spans, each with an
# op inside (spans go through the per-thread C rings, ops straight into the
# Go-side buffer), then dies at once. The background flusher is slowed to a
# minute, so without the flush on the signal only the meta and root lines
# could be on disk; the default 50 ms interval is checked too.

DYING = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "candle_trace.h"

#define SYM(name) __typeof__(name) *p_##name = (__typeof__(name) *)dlsym(RTLD_DEFAULT, #name)

static ct_session s;
static int n;
static pthread_barrier_t both;

/* N spans named <prefix>/<i>, an op in each; returns 0 when all were accepted. */
static int record(const char *prefix) {
    SYM(ct_span_begin); SYM(ct_span_end); SYM(ct_record_op);
    static const int64_t shape[2] = {4, 8};
    for (int i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s/%d", prefix, i);
        ct_span sp;
        if (p_ct_span_begin(s, name, CT_SPAN_OP, CT_STEP_NONE, &sp)) return 1;
        ct_op op;
        memset(&op, 0, sizeof op);
        op.size = sizeof op; op.op_name = name; op.dtype = "f32"; op.device = "cpu";
        op.shape = shape; op.rank = 2; op.duration_ns = 1;
        if (p_ct_record_op(s, sp, &op) || p_ct_span_end(s, sp)) return 1;
    }
    return 0;
}

static void segv(void) { volatile int *p = 0; *p = 1; }

static void *second(void *arg) {
    (void)arg;
    if (record("other")) _exit(5);
    pthread_barrier_wait(&both);
    segv();
    return 0;
}

int main(int argc, char **argv) {
    const char *how = argv[1];
    n = atoi(argv[2]);
    SYM(ct_ambient_session); SYM(ct_span_begin);
    if (!p_ct_ambient_session || !(s = p_ct_ambient_session())) { fprintf(stderr, "no ambient session\n"); return 3; }
    ct_span outer; /* left open: the capture is not complete */
    if (p_ct_span_begin(s, "doomed", CT_SPAN_FUNCTION, CT_STEP_NONE, &outer)) return 4;
    pthread_t t;
    if (!strcmp(how, "threads")) {
        pthread_barrier_init(&both, 0, 2);
        pthread_create(&t, 0, second, 0);
    }
    if (record("work")) return 5;
    if (!strcmp(how, "segv")) segv();                 /* a fault in non-Go code */
    if (!strcmp(how, "abort")) abort();
    if (!strcmp(how, "threads")) { pthread_barrier_wait(&both); segv(); }
    if (!strcmp(how, "term")) {                       /* the test sends SIGTERM */
        printf("recorded\n");
        fflush(stdout);
        for (;;) pause();
    }
    if (!strcmp(how, "term-exit")) {                  /* ... and the program exits meanwhile */
        sigset_t term, before;                        /* as HOLDER: no lost wake-up */
        sigemptyset(&term);
        sigaddset(&term, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &term, &before);
        printf("recorded\n");
        fflush(stdout);
        sigsuspend(&before);                          /* the handler ran and returned */
        return 0;
    }
    if (!strcmp(how, "raise")) {                      /* a SIGTERM the program sends itself */
        raise(SIGTERM);
        printf("raise returned\n");
        return 7;
    }
    return 6;
}
"""

# A stand-in for the library in the shim's handshake (ct__preload_crash_*):
# its flush needs a lock that the program's main thread holds while it is
# "inside a library call", as a thread writing under the session lock does.
FAKE_FLUSHER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
static int (*begin_fn)(void), (*wait_fn)(void);
static void (*done_fn)(void);
static pthread_mutex_t started_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t started_cond = PTHREAD_COND_INITIALIZER;
static int started = -2;

static void *waiter(void *arg) {
    (void)arg;
    int r = begin_fn();
    pthread_mutex_lock(&started_lock);
    started = r;
    pthread_cond_signal(&started_cond);
    pthread_mutex_unlock(&started_lock);
    if (r != 0) return 0;
    int sig = wait_fn();
    if (sig == 0) return 0;
    pthread_mutex_lock(&fake_lock);
    FILE *f = fopen(getenv("FAKE_FLUSHED"), "w");
    if (f) { fprintf(f, "flushed %d\n", sig); fclose(f); }
    pthread_mutex_unlock(&fake_lock);
    done_fn();
    return 0;
}

/* What ct_ambient_session is to the real library: the waiter serves once it returns 0. */
int fake_start(void) {
    begin_fn = (int (*)(void))dlsym(RTLD_DEFAULT, "ct__preload_crash_waiter_begin");
    wait_fn = (int (*)(void))dlsym(RTLD_DEFAULT, "ct__preload_crash_wait");
    done_fn = (void (*)(void))dlsym(RTLD_DEFAULT, "ct__preload_crash_done");
    if (!begin_fn || !wait_fn || !done_fn) return -3;
    pthread_t t;
    if (pthread_create(&t, 0, waiter, 0)) return -4;
    pthread_mutex_lock(&started_lock);
    while (started == -2) pthread_cond_wait(&started_cond, &started_lock);
    pthread_mutex_unlock(&started_lock);
    return started;
}
"""

HOLDER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

int main(void) {
    int (*start)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "fake_start");
    pthread_mutex_t *lock = (pthread_mutex_t *)dlsym(RTLD_DEFAULT, "fake_lock");
    if (!start || !lock) { fprintf(stderr, "no fake library\n"); return 3; }
    int r = start();
    if (r) { fprintf(stderr, "fake_start: %d\n", r); return 4; }
    /* SIGTERM blocked until sigsuspend, which returns once the shim's
     * handler has run and returned, whenever the test sends it. */
    sigset_t term, before;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &term, &before);
    pthread_mutex_lock(lock);
    printf("holding\n");
    fflush(stdout);
    sigsuspend(&before);
    pthread_sigmask(SIG_SETMASK, &before, 0);
    struct timespec a_while = {0, 200 * 1000 * 1000};
    nanosleep(&a_while, 0);                   /* the rest of the "library call" */
    printf("released\n");                    /* before the flush can run and the kill land */
    fflush(stdout);
    pthread_mutex_unlock(lock);
    for (;;) pause();
}
"""

OWN_HANDLER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "candle_trace.h"

static volatile sig_atomic_t got;
static void on_term(int sig) { (void)sig; got = 1; }

/* .preinit_array runs before every shared object's constructor, so this
 * handler is in place before the preloaded shim looks. */
static void install(int argc, char **argv, char **envp) {
    (void)argc; (void)argv; (void)envp;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, 0);
}
__attribute__((section(".preinit_array"), used)) static void (*preinit)(int, char **, char **) = install;

int main(void) {
    __typeof__(ct_ambient_session) *amb = (__typeof__(ct_ambient_session) *)dlsym(RTLD_DEFAULT, "ct_ambient_session");
    if (!amb || !amb()) { fprintf(stderr, "no ambient session\n"); return 3; }
    struct sigaction now;
    sigaction(SIGTERM, 0, &now);
    printf("%s\n", now.sa_handler == on_term ? "mine" : "replaced");
    fflush(stdout);
    /* Polled: the signal may run the handler on another thread (the Go
     * runtime's), which would not wake a pause() here. */
    struct timespec ms = {0, 1000 * 1000};
    while (!got) nanosleep(&ms, 0);
    printf("caught\n");
    return 0;
}
"""


def build_c(tmp_path: Path, name: str, source: str, link: list[str] | None = None) -> Path:
    src, exe = tmp_path / f"{name}.c", tmp_path / name
    src.write_text(source)
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-O0", "-Wall", "-Werror", "-pthread", f"-I{REPO / 'include'}", str(src), "-o", str(exe), "-ldl",
                    *(link or [])], check=True, timeout=60)
    return exe


@pytest.fixture(scope="module")
def dying(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c(tmp_path_factory.mktemp("dying"), "dying", DYING)


@pytest.fixture(scope="module")
def dying_linked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DYING with libcandle_trace.so linked in (a DT_NEEDED entry): the
    library, and its Go runtime's signal handlers, initialise before the
    preloaded shim's constructor runs."""
    return build_c(tmp_path_factory.mktemp("dying-linked"), "dying", DYING,
                   ["-Wl,--no-as-needed", f"-L{LIB.parent}", f"-l:{LIB.name}", f"-Wl,-rpath,{LIB.parent}"])


def shim_env(trace: Path, flush_ms: str | None = "60000") -> dict:
    if not PRELOAD.exists():
        pytest.fail(f"{PRELOAD} is not built (make {PRELOAD.relative_to(REPO)})")
    env = {k: v for k, v in os.environ.items() if k not in ("CANDLE_TRACE_MATCH", "CANDLE_TRACE_FLUSH_MS")}
    env.update(LD_PRELOAD=str(PRELOAD), CANDLE_TRACE_LIB=str(LIB), CANDLE_TRACE_PATH=str(trace))
    if flush_ms:
        env["CANDLE_TRACE_FLUSH_MS"] = flush_ms
    return env


def check_flushed(trace: Path, tmp_path: Path, prefixes: list[str], n: int, signame: str) -> None:
    """Every span and op recorded before the signal, as whole lines, and a failed
    terminal naming the signal."""
    data = trace.read_bytes()
    assert data.endswith(b"\n"), "only whole lines are on disk"
    events = lines(trace)
    term = events[-1]
    assert term["kind"] == "terminal" and term["outcome"] == "failed", term
    assert term["reason"].startswith(f"killed by {signame} (signal "), term
    assert sum(e["kind"] == "terminal" for e in events) == 1
    names = {e["id"]: e["name"] for e in events if e["kind"] == "span_start"}
    assert "doomed" in names.values()
    for prefix in prefixes:
        want = {f"{prefix}/{i}" for i in range(n)}
        started = {i for i, nm in names.items() if nm in want}
        assert {names[i] for i in started} == want, f"{len(want - set(names.values()))} of {n} {prefix} spans missing"
        ended = {e["id"] for e in events if e["kind"] == "span_end"}
        assert started <= ended, f"{len(started - ended)} {prefix} spans have no end"
        ops = [e for e in events if e["kind"] == "op" and e["op_name"] in want]
        assert len(ops) == n and {o["span_id"] for o in ops} == started
    cli = REPO / "build" / "candle-trace"
    if cli.exists():
        strict = subprocess.run([str(cli), "validate", str(trace)], capture_output=True, text=True, timeout=30)
        assert strict.returncode == 1, "a crash is not a complete capture"
        assert "structurally valid, outcome failed; 0 errors" in strict.stdout, strict.stdout
    # candle-graph reads it: a failed capture, not a broken file
    d = tmp_path / f"cg-{trace.stem}"
    d.mkdir()
    (d / "trace.jsonl").write_bytes(data)
    cg = subprocess.run([os.environ.get("CANDLE_GRAPH", str(REPO / "build/tools/bin/candle-graph")),
                         "summary", "trace.jsonl"], cwd=d, capture_output=True, text=True, timeout=60)
    assert cg.returncode == 0, cg.stdout[-2000:] + cg.stderr
    health = json.loads(cg.stdout)["health"]
    assert health["structurally_valid"] and not health["capture_complete"]


@pytest.mark.parametrize("how,signum,flush_ms", [
    ("segv", signal.SIGSEGV, "60000"),
    ("segv", signal.SIGSEGV, None),  # the default 50 ms interval: the crash comes well inside it
    ("abort", signal.SIGABRT, "60000"),
])
def test_a_fatal_signal_under_the_shim_flushes_every_record(tmp_path: Path, dying: Path, how: str,
                                                             signum: int, flush_ms: str | None) -> None:
    trace, n = tmp_path / "dying.jsonl", 200
    start = time.monotonic()
    proc = subprocess.run([str(dying), how, str(n)], env=shim_env(trace, flush_ms), cwd=tmp_path,
                          capture_output=True, text=True, timeout=30)
    took = time.monotonic() - start
    assert proc.returncode == -signum, f"the program still dies of its own signal: {proc.returncode} {proc.stderr!r}"
    assert took < 3, f"dying took {took:.2f} s"
    check_flushed(trace, tmp_path, ["work"], n, signal.Signals(signum).name)


@pytest.mark.parametrize("how,signum", [("segv", signal.SIGSEGV), ("abort", signal.SIGABRT),
                                        ("threads", signal.SIGSEGV)])
def test_a_fatal_signal_in_a_program_linked_with_the_library_flushes_every_record(
        tmp_path: Path, dying_linked: Path, how: str, signum: int) -> None:
    # Issue 14, defect 7: linked in, the library's Go runtime installed its
    # SIGSEGV handler before the shim looked, the shim left it alone, and a
    # fault kept what the flusher had happened to write, with no terminal line.
    trace, n = tmp_path / "linked.jsonl", 1000
    proc = subprocess.run([str(dying_linked), how, str(n)], env=shim_env(trace), cwd=tmp_path,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == -signum, f"the program still dies of its own signal: {proc.returncode} {proc.stderr!r}"
    check_flushed(trace, tmp_path, ["work", "other"] if how == "threads" else ["work"], n,
                  signal.Signals(signum).name)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT])
def test_a_kill_under_the_shim_flushes_every_record(tmp_path: Path, dying: Path, signum: int) -> None:
    trace, n = tmp_path / "term.jsonl", 200
    proc = subprocess.Popen([str(dying), "term", str(n)], env=shim_env(trace), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "recorded\n", proc.stderr.read()
        proc.send_signal(signum)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signum
    check_flushed(trace, tmp_path, ["work"], n, signal.Signals(signum).name)


def test_a_kill_landing_on_a_thread_that_holds_the_librarys_lock_is_flushed(tmp_path: Path) -> None:
    # A SIGTERM delivered to a thread inside a library call that holds the
    # session lock: a handler that waited there for the flush waited on
    # itself until its bound ran out, and the trace lost its end (seen under
    # heavy disk writeback, where a write holds the lock for long). The kill
    # is deferred instead: the handler returns, the call finishes and
    # releases the lock, the flush is written, then the process dies of it.
    lib = tmp_path / "libfake_flusher.so"
    src = tmp_path / "fake_flusher.c"
    src.write_text(FAKE_FLUSHER)
    subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O0", "-Wall", "-Werror", "-pthread",
                    str(src), "-o", str(lib), "-ldl"], check=True, timeout=60)
    exe = build_c(tmp_path, "holder", HOLDER)
    flushed = tmp_path / "flushed"
    env = dict(shim_env(tmp_path / "unused.jsonl"), CANDLE_TRACE_LIB=str(lib), FAKE_FLUSHED=str(flushed))
    proc = subprocess.Popen([str(exe)], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline() == "holding\n", proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, err)
    assert out == "released\n", "the handler returned into the interrupted call, which went on"
    assert flushed.read_text() == f"flushed {int(signal.SIGTERM)}\n"


def test_a_kill_the_program_outlives_to_its_exit_still_kills_it(tmp_path: Path, dying: Path) -> None:
    # Deferred, the kill lets the program run on while the trace is written;
    # one that reaches its exit handlers meanwhile dies of the signal there,
    # not with its own exit status.
    trace, n = tmp_path / "exit.jsonl", 200
    proc = subprocess.Popen([str(dying), "term-exit", str(n)], env=shim_env(trace), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "recorded\n", proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == -signal.SIGTERM
    check_flushed(trace, tmp_path, ["work"], n, "SIGTERM")


def test_a_sigterm_the_program_raises_itself_never_returns(tmp_path: Path, dying: Path) -> None:
    # Only kills from outside are deferred: raise(SIGTERM) must not return
    # into the code after it, so its handler waits for the flush in place.
    trace, n = tmp_path / "raised.jsonl", 200
    proc = subprocess.run([str(dying), "raise", str(n)], env=shim_env(trace), cwd=tmp_path,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stderr)
    assert "raise returned" not in proc.stdout
    check_flushed(trace, tmp_path, ["work"], n, "SIGTERM")


def test_two_threads_crashing_share_one_flush(tmp_path: Path, dying: Path) -> None:
    # Both threads fault at once (a barrier): the first asks for the flush, the
    # second must wait for that same flush rather than kill the process while
    # it runs. 5000 spans each make the flush long enough to be caught.
    trace, n = tmp_path / "threads.jsonl", 5000
    proc = subprocess.run([str(dying), "threads", str(n)], env=shim_env(trace), cwd=tmp_path,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == -signal.SIGSEGV, proc.stderr
    check_flushed(trace, tmp_path, ["work", "other"], n, "SIGSEGV")


def test_the_shim_leaves_a_programs_own_sigterm_handler_alone(tmp_path: Path) -> None:
    exe = build_c(tmp_path, "own", OWN_HANDLER)
    trace = tmp_path / "own.jsonl"
    proc = subprocess.Popen([str(exe)], env=shim_env(trace), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "mine\n", "the shim replaced the program's SIGTERM handler"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0 and out == "caught\n", err
    events = lines(trace)
    assert events[-1]["kind"] == "terminal" and events[-1]["outcome"] == "complete"
