"""Loading tests: the library as a Python training process meets it.

The library must load with plain ctypes.CDLL (immediate binding too), keep the
host's signal handling (KeyboardInterrupt on SIGINT, death on SIGTERM) once its
Go runtime and background flusher run, and let a process that never opened a
session exit promptly.

The library is $CANDLE_TRACE_LIB (default <repo>/build/libcandle_trace.so).
Everything that could hang runs in a subprocess with a timeout.
"""

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIB = Path(os.environ.get("CANDLE_TRACE_LIB", REPO / "build" / "libcandle_trace.so")).resolve()
CT_ABI_VERSION = 1

pytestmark = pytest.mark.skipif(
    not LIB.exists(), reason=f"{LIB} is not built (make lib)"
)

# Shared prelude of the subprocess programs: load the library and declare the
# few functions they use.
PRELUDE = textwrap.dedent(
    """
    import ctypes, os, signal, sys, time
    lib = ctypes.CDLL(os.environ["CANDLE_TRACE_LIB"])
    lib.ct_abi_version.restype = ctypes.c_uint32
    lib.ct_version.restype = ctypes.c_char_p
    lib.ct_last_error.restype = ctypes.c_char_p
    lib.ct_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64)]
    lib.ct_open.restype = ctypes.c_int
    lib.ct_span_begin.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                                  ctypes.POINTER(ctypes.c_uint64)]
    lib.ct_span_begin.restype = ctypes.c_int
    lib.ct_span_end.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    lib.ct_span_end.restype = ctypes.c_int
    lib.ct_finish.argtypes = [ctypes.c_uint64]
    lib.ct_finish.restype = ctypes.c_int

    RUN = (b'{"entrypoint":"test_load","phase":"infer","capture_step":1,'
           b'"device":"cpu","measured_root":true}')

    def open_session(path):
        s = ctypes.c_uint64(0)
        st = lib.ct_open(path.encode(), RUN, ctypes.byref(s))
        if st != 0:
            print("ct_open failed:", st, lib.ct_last_error().decode(), flush=True)
            sys.exit(3)
        # Some spans, so the rings and the flusher have work.
        for _ in range(100):
            x = ctypes.c_uint64(0)
            assert lib.ct_span_begin(s, b"work", 0, 0, ctypes.byref(x)) == 0
            assert lib.ct_span_end(s, x) == 0
        return s
    """
)


def run_py(code, tmp_path, env=None, timeout=20):
    """Runs PRELUDE + code in a fresh interpreter; returns the CompletedProcess."""
    full_env = dict(os.environ)
    full_env["CANDLE_TRACE_LIB"] = str(LIB)
    full_env.pop("CANDLE_TRACE_PATH", None)  # no drop-in session
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        cwd=tmp_path,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_py(code, tmp_path, env=None):
    full_env = dict(os.environ)
    full_env["CANDLE_TRACE_LIB"] = str(LIB)
    full_env.pop("CANDLE_TRACE_PATH", None)
    full_env.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        cwd=tmp_path,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_ready(proc, timeout=10.0):
    """Reads stdout until a line "ready"; fails (and kills proc) otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.strip() == "ready":
            return
        if line == "" and proc.poll() is not None:
            break
    proc.kill()
    out, err = proc.communicate(timeout=10)
    pytest.fail(f"child never said ready (rc={proc.returncode}); stdout={out!r} stderr={err!r}")


def describe(p):
    return f"rc={p.returncode} stdout={p.stdout!r} stderr={p.stderr!r}"


# ---- loading -----------------------------------------------------------------


def test_cdll_loads_and_reports_abi_version():
    lib = ctypes.CDLL(str(LIB))
    lib.ct_abi_version.restype = ctypes.c_uint32
    lib.ct_version.restype = ctypes.c_char_p
    lib.ct_last_error.restype = ctypes.c_char_p
    assert lib.ct_abi_version() == CT_ABI_VERSION
    assert lib.ct_version()  # non-empty
    assert lib.ct_last_error() is not None


def test_cdll_rtld_now_in_a_fresh_process():
    # RTLD_NOW | RTLD_GLOBAL as the process's first load of the library (in
    # this process it may already be bound lazily).
    code = textwrap.dedent(
        """
        import ctypes, os
        lib = ctypes.CDLL(os.environ["CANDLE_TRACE_LIB"], mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        lib.ct_abi_version.restype = ctypes.c_uint32
        print("abi", lib.ct_abi_version())
        """
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "CANDLE_TRACE_LIB": str(LIB)},
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert p.returncode == 0, describe(p)
    assert "abi 1" in p.stdout, describe(p)


def test_ld_bind_now_subprocess_loads_and_traces(tmp_path):
    p = run_py(
        """
        print("abi", lib.ct_abi_version(), lib.ct_version().decode())
        s = open_session("bind-now.jsonl")
        print("finish", lib.ct_finish(s))
        """,
        tmp_path,
        env={"LD_BIND_NOW": "1"},
    )
    assert p.returncode == 0, describe(p)
    assert "abi 1 " in p.stdout, describe(p)
    assert "finish 0" in p.stdout, describe(p)
    text = (tmp_path / "bind-now.jsonl").read_text()
    assert text.endswith("\n")
    assert '"outcome":"complete"' in text.splitlines()[-1]


# ---- signals -------------------------------------------------------------------

SIGINT_SELF = """
s = open_session("sigint.jsonl")
try:
    os.kill(os.getpid(), signal.SIGINT)
    # The handler runs between bytecodes: at once, or within this sleep.
    time.sleep(5)
    print("no KeyboardInterrupt", flush=True)
    sys.exit(1)
except KeyboardInterrupt:
    print("KeyboardInterrupt caught", flush=True)
print("finish", lib.ct_finish(s), flush=True)
sys.exit(7)
"""


def test_sigint_raises_keyboard_interrupt_with_a_session_open(tmp_path):
    p = run_py(SIGINT_SELF, tmp_path, timeout=20)
    assert p.returncode == 7, describe(p)
    assert "KeyboardInterrupt caught" in p.stdout, describe(p)
    assert "finish 0" in p.stdout, describe(p)


def test_sigint_uncaught_ends_the_process_like_python_does(tmp_path):
    p = run_py(
        """
        s = open_session("sigint-uncaught.jsonl")
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        print("still alive", flush=True)
        """,
        tmp_path,
        timeout=20,
    )
    # Python reports an uncaught KeyboardInterrupt and then dies of SIGINT.
    assert "still alive" not in p.stdout, describe(p)
    assert "KeyboardInterrupt" in p.stderr, describe(p)
    assert p.returncode == -signal.SIGINT, describe(p)


def test_sigint_from_the_parent_while_spans_are_recorded(tmp_path):
    proc = start_py(
        """
        s = open_session("sigint-parent.jsonl")
        print("ready", flush=True)
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:   # busy in the library
                x = ctypes.c_uint64(0)
                lib.ct_span_begin(s, b"loop", 0, 0, ctypes.byref(x))
                lib.ct_span_end(s, x)
            print("no KeyboardInterrupt", flush=True)
            sys.exit(1)
        except KeyboardInterrupt:
            print("KeyboardInterrupt caught", flush=True)
        sys.exit(7)
        """,
        tmp_path,
    )
    try:
        wait_ready(proc)
        time.sleep(0.2)  # past a flush interval: the flusher is running
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 7, f"rc={proc.returncode} stdout={out!r} stderr={err!r}"
    assert "KeyboardInterrupt caught" in out


def test_sigterm_ends_the_process(tmp_path):
    proc = start_py(
        """
        s = open_session("sigterm.jsonl")
        print("ready", flush=True)
        time.sleep(30)
        print("survived SIGTERM", flush=True)
        """,
        tmp_path,
    )
    try:
        wait_ready(proc)
        time.sleep(0.2)  # past a flush interval: the flusher is running
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGTERM, f"rc={proc.returncode} stdout={out!r} stderr={err!r}"
    assert "survived" not in out
    assert took < 5, f"SIGTERM took {took:.1f} s to end the process"
    # Killed mid-session: what is on disk is whole lines.
    text = (tmp_path / "sigterm.jsonl").read_text()
    assert text.endswith("\n")
    assert all(line.startswith("{") and line.endswith("}") for line in text.splitlines())


# ---- exit ----------------------------------------------------------------------


def test_exit_without_a_session_is_prompt(tmp_path):
    start = time.monotonic()
    p = run_py('print("abi", lib.ct_abi_version())', tmp_path, timeout=10)
    took = time.monotonic() - start
    assert p.returncode == 0, describe(p)
    assert "abi 1" in p.stdout
    assert took < 2, f"a process that loaded the library took {took:.2f} s to exit"


def test_exit_with_an_unfinished_session_is_prompt(tmp_path):
    start = time.monotonic()
    p = run_py(
        """
        s = open_session("unfinished.jsonl")
        print("opened", flush=True)
        """,
        tmp_path,
        timeout=10,
    )
    took = time.monotonic() - start
    assert p.returncode == 0, describe(p)
    assert took < 2, f"exit with an open session took {took:.2f} s"
    text = (tmp_path / "unfinished.jsonl").read_text()
    assert text.startswith('{"kind":"meta"')
    assert text.endswith("\n")
