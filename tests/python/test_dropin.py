"""Drop-in mode: CANDLE_TRACE_PATH makes loading the library open a session
that process exit finishes, for programs nobody instrumented."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
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
    # opens while the Go runtime starts, a little after the program does).
    assert events[-2] == {"kind": "span_end", "id": "s1", "duration_ns": events[-1]["timestamp_ns"]}
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
