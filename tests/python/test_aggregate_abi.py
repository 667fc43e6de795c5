"""ct_aggregate_enable through the raw C ABI: statuses and messages."""
from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIB = ctypes.CDLL(str(os.environ.get("CANDLE_TRACE_LIB", REPO / "build" / "libcandle_trace.so")))
LIB.ct_last_error.restype = ctypes.c_char_p
LIB.ct_aggregate_enable.argtypes = [ctypes.c_uint64, ctypes.c_int]


def open_session(path: Path, run: dict) -> int:
    s = ctypes.c_uint64()
    assert LIB.ct_open(str(path).encode(), json.dumps(run).encode(), ctypes.byref(s)) == 0, LIB.ct_last_error()
    return s.value


def test_bad_inputs_return_code_and_message(tmp_path: Path) -> None:
    assert LIB.ct_aggregate_enable(0, 1) == 2  # CT_ERR_INVALID_HANDLE
    assert b"handle is 0" in LIB.ct_last_error()
    s = open_session(tmp_path / "a.json", {"entrypoint": "e", "phase": "train", "device": "cpu", "mode": "aggregate"})
    assert LIB.ct_aggregate_enable(s, 2) == 1  # CT_ERR_INVALID_ARGUMENT
    assert b"enabled must be 0 or 1, got 2" in LIB.ct_last_error()
    assert LIB.ct_aggregate_enable(s, 0) == 0
    assert LIB.ct_finish(ctypes.c_uint64(s)) == 0
    assert LIB.ct_aggregate_enable(s, 1) == 2
    assert b"unknown or already finished" in LIB.ct_last_error()
    assert json.loads((tmp_path / "a.json").read_text())["final"] is True


def test_trace_sessions_refuse_it(tmp_path: Path) -> None:
    s = open_session(tmp_path / "t.jsonl", {"entrypoint": "e", "phase": "infer", "capture_step": 1,
                                             "device": "cpu", "measured_root": True})
    assert LIB.ct_aggregate_enable(s, 1) == 4  # CT_ERR_STATE
    assert b"is a trace session" in LIB.ct_last_error()
    assert LIB.ct_finish(ctypes.c_uint64(s)) == 0


CHILD = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
s = ctypes.c_uint64()
run = b'{"entrypoint":"e","phase":"train","device":"cpu","mode":"aggregate","aggregate_interval_ms":20}'
assert lib.ct_open(sys.argv[2].encode(), run, ctypes.byref(s)) == 0
sp = ctypes.c_uint64()
name = b"loop/step"
while True:
    for _ in range(1000):
        lib.ct_span_begin(s, name, 0, 0, ctypes.byref(sp))
        lib.ct_span_end(s, sp)
"""


def test_a_killed_run_leaves_its_last_complete_summary(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    summary = tmp_path / "stats.json"
    child = subprocess.Popen([sys.executable, "-c", CHILD, LIB._name, str(summary)])
    try:
        deadline = time.monotonic() + 20
        seq = 0
        while seq < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
            if seq == 0 and not summary.exists():
                continue  # the child has not opened its session yet
            try:
                seq = json.loads(summary.read_text())["sequence"]
            except (FileNotFoundError, json.JSONDecodeError) as e:
                pytest.fail(f"a reader saw a missing or torn summary while it was rewritten: {e}")
        assert seq >= 5, "the summary was not rewritten every 20 ms"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    doc = json.loads(summary.read_text())
    assert doc["final"] is False and doc["sequence"] >= 5
    (span,) = doc["spans"]
    assert span["name"] == "loop/step" and span["count"] > 0
    assert span["count"] == sum(c for _, c in span["buckets"])
    report = subprocess.run([str(REPO / "build" / "candle-trace"), "report", str(summary)],
                            capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    assert "loop/step" in report.stdout
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "stats.json"]
    assert len(leftovers) <= 1, f"temporary files left: {leftovers}"
