"""Helpers the library-level Python tests share."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import terminal_signals

REPO = Path(__file__).resolve().parents[2]
CANDLE_GRAPH = Path(os.environ.get("CANDLE_GRAPH", REPO / "build" / "tools" / "bin" / "candle-graph"))


terminal_signals.restore()


def lines(path: Path) -> list[dict]:
    """Every line of a JSONL trace, decoded."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def require_valid(trace: Path, tmp: Path) -> None:
    """candle-graph must accept the trace (alone in a fresh folder) as valid and complete."""
    if not CANDLE_GRAPH.exists():
        if os.environ.get("CI"):
            pytest.fail(f"candle-graph missing at {CANDLE_GRAPH}")
        pytest.skip("candle-graph not installed (make tools)")
    alone = tmp / f"alone-{trace.stem}"
    alone.mkdir()
    shutil.copy(trace, alone / "trace.jsonl")
    r = subprocess.run([str(CANDLE_GRAPH), "summary", "trace.jsonl", "--require-valid"],
                       cwd=alone, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
