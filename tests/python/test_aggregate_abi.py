"""ct_aggregate_enable through the raw C ABI: statuses and messages."""
from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

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
