"""The aggregate mode's OTLP push through the shipped library (the C ABI), to
the real OpenTelemetry Collector of the tests (make otelcol): the summaries
arrive with the library's counts, and a collector that is down costs
counted drops, never the run."""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otelcol import complete_lines, free_port, running

REPO = Path(__file__).resolve().parents[2]
LIB_PATH = str(os.environ.get("CANDLE_TRACE_LIB", REPO / "build" / "libcandle_trace.so"))

@pytest.fixture
def collector(tmp_path: Path):
    with running(tmp_path, "metrics") as c:
        yield c


# A run of the C ABI in a child process: its environment is its own (the Go
# runtime reads the environment once, at load), and a push it leaves behind
# cannot touch the next test.
CHILD = r"""
import ctypes, json, sys, time
lib = ctypes.CDLL(sys.argv[1])
lib.ct_last_error.restype = ctypes.c_char_p
run = json.loads(sys.argv[3])
s = ctypes.c_uint64()
assert lib.ct_open(sys.argv[2].encode(), json.dumps(run).encode(), ctypes.byref(s)) == 0, lib.ct_last_error()
sp, inner = ctypes.c_uint64(), ctypes.c_uint64()
n, t0 = 0, time.monotonic()
while time.monotonic() - t0 < float(sys.argv[4]):
    for _ in range(1000):
        lib.ct_span_begin(s, b"loop/step", 0, 0, ctypes.byref(sp))  # CT_SPAN_FUNCTION, CT_STEP_NONE
        lib.ct_span_begin(s, b"loop/forward", 2, 1, ctypes.byref(inner))  # CT_SPAN_MODULE, CT_STEP_FORWARD
        lib.ct_span_end(s, inner)
        lib.ct_span_end(s, sp)
    n += 1000
t1 = time.monotonic()
assert lib.ct_finish(s) == 0, lib.ct_last_error()
print(json.dumps({"updates": n, "finish_s": time.monotonic() - t1}))
"""


def run_child(tmp_path: Path, run: dict, seconds: float, env: dict | None = None) -> tuple[dict, dict]:
    summary = tmp_path / "stats.json"
    out = subprocess.run([sys.executable, "-c", CHILD, LIB_PATH, str(summary), json.dumps(run), str(seconds)],
                         env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), json.loads(summary.read_text())


RUN = {"entrypoint": "loop::train", "phase": "train", "device": "cpu", "mode": "aggregate", "aggregate_interval_ms": 50}


def test_summaries_reach_the_collector(tmp_path: Path, collector) -> None:
    endpoint, out = collector
    child, summary = run_child(tmp_path, {**RUN, "otlp_endpoint": endpoint}, 0.5, {"RANK": "3", "WORLD_SIZE": "4"})
    assert summary["otlp"]["endpoint"] == endpoint + "/v1/metrics"
    assert summary["otlp"]["pushed"] >= 3, summary["otlp"]
    assert summary["otlp"]["dropped"] == 0, summary["otlp"]
    counts = {s["name"]: s["count"] for s in summary["spans"]}
    assert counts["loop/step"] == child["updates"]

    # The final summary's push, as the collector wrote it.
    deadline = time.monotonic() + 10
    while True:
        lines = complete_lines(out)
        last = json.loads(lines[-1]) if lines else None
        got = {}
        if last:
            for m in last["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]:
                if m["name"] == "candle.span.duration":
                    for p in m["histogram"]["dataPoints"]:
                        name = next(a["value"]["stringValue"] for a in p["attributes"] if a["key"] == "candle.span.name")
                        got[name] = int(p["count"])
        if got == counts or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert got == counts, f"the collector's last histograms {got}, the final summary's {counts}"
    attrs = {a["key"]: a["value"] for a in last["resourceMetrics"][0]["resource"]["attributes"]}
    assert attrs["candle.rank"] == {"intValue": "3"}
    assert attrs["candle.world_size"] == {"intValue": "4"}
    assert attrs["process.pid"]["intValue"] != "0"


def test_a_collector_that_is_down_costs_drops_not_the_run(tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    child, summary = run_child(tmp_path, RUN, 0.5, {"CANDLE_TRACE_OTLP_ENDPOINT": down})
    assert summary["otlp"]["pushed"] == 0
    assert summary["otlp"]["dropped"] >= 3, summary["otlp"]
    assert "no collector reachable" in summary["otlp"]["last_error"]
    assert {s["name"]: s["count"] for s in summary["spans"]}["loop/step"] == child["updates"], "every update counted"
    assert child["finish_s"] < 1.0, "a refused connection costs ct_finish nothing"
