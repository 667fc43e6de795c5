"""The OpenTelemetry Collector of the tests (make otelcol) for the Python tests that
export to it (tests/python/test_otlp_push.py, bindings/python/tests/test_distributed.py):
started on a free port of 127.0.0.1 with a config of its otlp receiver and its file
exporter, which writes what it receives as OTLP JSON lines, one request a line."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
OTELCOL = Path(os.environ.get("CANDLE_TRACE_OTELCOL", REPO / "build" / "tools" / "otelcol" / "otelcol"))

#: the config; {signal} is the pipeline's ("traces" or "metrics")
CONFIG = """receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{port}
exporters:
  file:
    path: {out}
    flush_interval: 10ms
service:
  telemetry:
    logs:
      level: warn
    metrics:
      level: none
  pipelines:
    {signal}:
      receivers: [otlp]
      exporters: [file]
"""


def complete_lines(path: Path) -> List[str]:
    """The JSON lines the file exporter has finished: it writes a long line in pieces,
    so text after the last newline is a line still being written."""
    if not path.exists():
        return []
    text = path.read_text()
    return [line for line in text[:text.rfind("\n") + 1].splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(tmp_path: Path, signal: str) -> Iterator[Tuple[str, Path]]:
    """The collector receiving ``signal``: (its endpoint, the file it writes). Missing:
    a skip, under CI a failure (.ci/run builds it)."""
    if not OTELCOL.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{OTELCOL} missing: .ci/run builds it with make otelcol")
        pytest.skip("the OpenTelemetry Collector is not built; run `make otelcol`")
    port, out = free_port(), tmp_path / f"{signal}.jsonl"
    cfg = tmp_path / "otelcol.yaml"
    cfg.write_text(CONFIG.format(port=port, out=out, signal=signal))
    proc = subprocess.Popen([str(OTELCOL), "--config", f"file:{cfg}"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    pytest.fail(f"the collector did not start: {proc.stdout.read().decode()}")
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", out
    finally:
        proc.terminate()
        proc.wait(10)
