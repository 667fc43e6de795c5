"""What loading the library does to the host process: the Go scheduler is
capped, and no goroutine of ours runs before the first ct_open."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The library with its test hooks (ctdebug_runtime) exported: the same code
# as build/libcandle_trace.so, which exports only the header's functions.
LIB = Path(os.environ.get("CANDLE_TRACE_BENCH_LIB", REPO / "build" / "bench" / "libcandle_trace.so"))

PROBE = textwrap.dedent("""
    import ctypes, json, sys
    lib = ctypes.CDLL(sys.argv[1])
    def state():
        procs, gs = ctypes.c_int(), ctypes.c_int()
        lib.ctdebug_runtime(ctypes.byref(procs), ctypes.byref(gs))
        return procs.value, gs.value
    loaded = state()
    s = ctypes.c_uint64()
    run = b'{"entrypoint":"probe","phase":"infer","capture_step":1,"device":"cpu","measured_root":true}'
    assert lib.ct_open(sys.argv[2].encode(), run, ctypes.byref(s)) == 0
    opened = state()
    assert lib.ct_finish(s) == 0
    print(json.dumps({"loaded": loaded, "opened": opened}))
""")


def run_probe(script: str, tmp_path: Path, **env: str):
    """What ``script`` printed as JSON, run with the library and a trace path,
    the variables that steer the scheduler as ``env`` says."""
    e = {k: v for k, v in os.environ.items() if k not in ("GOMAXPROCS", "CANDLE_TRACE_GOMAXPROCS", "CANDLE_TRACE_PATH")}
    e.update(env)
    r = subprocess.run([sys.executable, "-c", script, str(LIB), str(tmp_path / "t.jsonl")],
                       env=e, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def probe(tmp_path: Path, **env: str) -> dict:
    return run_probe(PROBE, tmp_path, **env)


def test_scheduler_is_capped_by_default(tmp_path: Path) -> None:
    got = probe(tmp_path)
    assert got["loaded"][0] == 1


def test_cap_is_configurable(tmp_path: Path) -> None:
    assert probe(tmp_path, CANDLE_TRACE_GOMAXPROCS="2")["loaded"][0] == min(2, os.cpu_count() or 1)
    # The standard variable wins: the user asked the Go runtime directly.
    assert probe(tmp_path, GOMAXPROCS="3", CANDLE_TRACE_GOMAXPROCS="1")["loaded"][0] == 3


def test_no_work_starts_before_the_first_open(tmp_path: Path) -> None:
    got = probe(tmp_path)
    # Opening starts the flusher and the ring waker; before it, nothing of ours ran.
    assert got["opened"][1] - got["loaded"][1] == 2, got
