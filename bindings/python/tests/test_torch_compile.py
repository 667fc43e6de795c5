"""candle_trace.torch.profile around a torch.compile'd model (torch >= 2.0): compile_repro.py
in a child process, which prints one JSON line (outcome, dynamo's counters, the trace)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import candle_graph, observer_expected, validate

torch = pytest.importorskip("torch")
if not hasattr(torch, "compile"):
    pytest.skip("torch.compile needs torch >= 2.0", allow_module_level=True)

REPRO = Path(__file__).resolve().parent / "compile_repro.py"


def repro(tmp_path, *args: str) -> dict:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no worker pool on 2 cores
    r = subprocess.run([sys.executable, str(REPRO), "--trace", str(tmp_path / "gpt.jsonl"),
                        *args], capture_output=True, text=True, timeout=600, env=env)
    assert r.stdout.strip(), f"compile_repro.py {args} printed nothing (rc {r.returncode}):\n" \
                             f"{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def check_compiled_capture(out: dict, tmp_path) -> None:
    assert out["outcome"] == "ok", out
    # compiled once, and the profiler's hooks split nothing
    assert out["dynamo"]["graph_breaks"] == 0, out["dynamo"]
    assert out["dynamo"]["unique_graphs"] == 1, out["dynamo"]
    assert out["candle_trace_functions_traced_by_dynamo"] == {}
    t = out["trace"]
    assert t["outcome"] == "complete"
    spans = dict((k, v) for k, v in t["spans"])
    assert spans.get("forward:GPT") == 1 and spans.get("backward:GPT") == 1, spans
    assert not any("_orig_mod" in k or "OptimizedModule" in k for k in spans), spans
    assert t["gradients"] == {"present": 30}
    candle_graph(t["path"], tmp_path)
    assert "OK" in validate(t["path"])


@pytest.mark.parametrize("backend,capture_step", [("eager", 3), ("inductor", 1), ("inductor", 3)])
def test_profile_of_a_compiled_model(tmp_path, backend, capture_step):
    """The profiler's wrappers and hooks run outside dynamo, and none sits inside the
    compiled module: one graph, no break, the trace complete. With inductor the observer
    sees the graph's extern kernels (its fused C++ kernels run no RecordFunction); at
    capture step 1 the compilation itself runs inside the captured update."""
    out = repro(tmp_path, "--backend", backend, "--capture-step", str(capture_step))
    check_compiled_capture(out, tmp_path)
    if backend == "inductor" and observer_expected():
        assert out["op_mechanism"] == "observer"
        ops = out["trace"]["op_names"]
        assert "aten::addmm" in ops and "aten::_scaled_dot_product_flash_attention_for_cpu" in ops


def test_profile_of_a_compiled_training_step(tmp_path):
    """The whole update compiled (``torch.compile(train_step)``, its zero_grad, backward and
    optimizer step inside): the capture's wrappers of those are called from compiled code,
    and dynamo must break its graph there, never trace into them (the tracer's state is
    no graph's). The trace keeps the backward and the optimizer's span."""
    out = repro(tmp_path, "--backend", "eager", "--whole-step")
    assert out["outcome"] == "ok", out
    assert out["candle_trace_functions_traced_by_dynamo"] == {}, out
    t = out["trace"]
    assert t["outcome"] == "complete"
    spans = dict((k, v) for k, v in t["spans"])
    assert spans.get("forward:GPT") == 1 and spans.get("backward:backward") == 1, spans
    assert spans.get("optimizer:AdamW.step") == 1, spans
    assert t["gradients"] == {"present": 30}
    candle_graph(t["path"], tmp_path)
    assert "OK" in validate(t["path"])
