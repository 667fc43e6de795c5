"""Shared helpers: the repository, the reference reader and our validator."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bindings" / "python"))
sys.path.insert(0, str(REPO / "tests" / "python"))
import terminal_signals  # noqa: E402 - SIGINT & co. as a terminal gives them, for the children

terminal_signals.restore()


@functools.lru_cache(maxsize=None)
def observer_expected() -> bool:
    """Whether this machine can build the C++ op observer (a C++ compiler, ninja and
    torch's headers): then the observer must be what captures ops. CI sets
    CANDLE_TRACE_REQUIRE_OBSERVER=1 to make its absence a failure, not a fallback."""
    if os.environ.get("CANDLE_TRACE_REQUIRE_OBSERVER") == "1":
        return True
    if not (shutil.which("ninja") and (shutil.which("c++") or shutil.which("g++"))):
        return False
    try:
        from torch.utils.cpp_extension import include_paths
    except ImportError:
        return False
    return any((Path(p) / "ATen" / "record_function.h").exists() for p in include_paths())

CANDLE_GRAPH = Path(os.environ.get("CANDLE_GRAPH", REPO / "build/tools/bin/candle-graph"))
VALIDATOR = REPO / "build" / "candle-trace"


def read_trace(path) -> list:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def spans_of(lines: list) -> dict:
    """id -> span_start, with "duration_ns" (None while open) from its span_end."""
    spans = {s["id"]: dict(s, duration_ns=None) for s in lines if s["kind"] == "span_start"}
    for e in lines:
        if e["kind"] == "span_end":
            spans[e["id"]]["duration_ns"] = e["duration_ns"]
    return spans


def candle_graph(trace, tmp_path: Path, require_valid: bool = True) -> dict:
    """Runs candle-graph summary on a copy of the trace alone in a fresh folder;
    returns the parsed summary. With require_valid, asserts exit 0."""
    if not CANDLE_GRAPH.exists():
        pytest.skip(f"{CANDLE_GRAPH} is not installed (make tools)")
    d = tmp_path / f"cg-{Path(trace).stem}"
    d.mkdir()
    shutil.copy(trace, d / "trace.jsonl")
    args = [str(CANDLE_GRAPH), "summary", "trace.jsonl"] + (
        ["--require-valid"] if require_valid else [])
    r = subprocess.run(args, cwd=d, capture_output=True, text=True, timeout=60)
    if require_valid:
        assert r.returncode == 0, f"candle-graph refused {trace}:\n{r.stdout[-3000:]}\n{r.stderr}"
    return json.loads(r.stdout)


def validate(trace) -> str:
    """Our own validator (build/candle-trace validate); asserts exit 0."""
    if not VALIDATOR.exists():
        pytest.skip(f"{VALIDATOR} is not built (make cli)")
    r = subprocess.run([str(VALIDATOR), "validate", str(trace)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, f"candle-trace validate refused {trace}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def judged(trace, tmp_path: Path, complete: bool = True) -> list:
    """The trace read back, once candle-graph (alone in a fresh folder) found it
    structurally valid and complete (or failed), and our validator agreed."""
    summary = candle_graph(trace, tmp_path, require_valid=complete)
    h = summary["health"]
    assert h["structurally_valid"], [i for i in h["issues"] if i["severity"] == "error"]
    assert h["capture_complete"] == complete
    if complete:
        validate(trace)
    else:  # our validator fails a failed capture, and says it is structurally valid
        if not VALIDATOR.exists():
            pytest.skip(f"{VALIDATOR} is not built (make cli)")
        r = subprocess.run([str(VALIDATOR), "validate", str(trace)], capture_output=True,
                           text=True, timeout=60)
        assert "structurally valid, outcome failed; 0 errors" in r.stdout, r.stdout + r.stderr
    return read_trace(trace)
