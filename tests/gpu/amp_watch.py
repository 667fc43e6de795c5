#!/usr/bin/env python3
"""Mixed precision under ``candle_trace.torch.watch``: tests/gpu/run.sh step 3d runs it on
CUDA (float16 autocast, a CUDA GradScaler), bindings/python/tests/test_torch_amp.py on the
CPU (bfloat16, a CPU GradScaler: torch >= 2.3), to know it works without a GPU.

    python3 tests/gpu/amp_watch.py OUT [--device cuda:0|cpu]

Twelve updates of an MLP; updates 1-3 run at a scale their gradients overflow at (as an
fp16 run's first iterations do), so the scaler skips their optimizer step; update 9's
loss is NaN. Checks: the scaler skipped exactly updates 1-3 and 9 (read from the
parameters); the watch fired exactly ``non_finite`` at update 9 (nothing for the
overflow, which is the scaler's business, and its value the loss, not the scaled
product) and wrote ``update-000009-non_finite.jsonl``, complete, its only errors the
non-finite gradient families (candle-graph, CANDLE_GRAPH, when present), with the ops
of the update; and the whole-run loss is the program's (unscaled). Prints one ok/FAIL
line per check; exits 1 when one failed, 2 when this torch has no GradScaler for the
device.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bindings" / "python"))

import candle_trace.torch as ctt  # noqa: E402

TRACE = "update-000009-non_finite.jsonl"


def train(out: Path, device: str) -> tuple:
    """(skipped updates, losses, the watch) of the loop."""
    kind = device.split(":")[0]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(kind, init_scale=2.0 ** 127)
    dtype = torch.float16 if kind == "cuda" else torch.bfloat16
    skipped, losses = [], []
    with ctt.watch(model, opt, str(out / "traces"), aggregate_path=str(out / "summary.json"),
                   triggers=ctt.Triggers(slow=None)) as w:
        for update in range(1, 13):
            x = torch.randn(128, 64, device=device)
            y = torch.randint(0, 8, (128,), device=device)
            with torch.autocast(kind, dtype=dtype):
                loss = F.cross_entropy(model(x).float(), y) * 1e3
            if update == 9:
                loss = loss * float("nan")
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            before = model[0].weight.detach().clone()
            scaler.step(opt)
            # then 2: at 1024 this loss's float16 gradients overflow on a GPU now and then
            # (update 7 did on an H200), a skip this check would take for the tracer's
            scaler.update(2.0 ** 127 if update < 3 else 2.0)
            if torch.equal(before, model[0].weight):
                skipped.append(update)
            losses.append(float(loss.detach()))
            w.step()
    return skipped, losses, w


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda:0")
    a = ap.parse_args()
    if not hasattr(getattr(torch, "amp", None), "GradScaler"):
        print(f"amp_watch: torch {torch.__version__} has no torch.amp.GradScaler")
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # update 9's trace: its NaN gradients, warned
        warnings.simplefilter("ignore", RuntimeWarning)
        skipped, losses, w = train(out, a.device)
    failed = 0

    def check(ok: bool, what: str) -> None:
        nonlocal failed
        print(f"{'ok   ' if ok else 'FAIL '} amp: {what}", flush=True)
        failed += not ok

    check(skipped == [1, 2, 3, 9], f"the scaler skipped updates 1-3 and 9 (got {skipped})")
    fired = [(f.update, f.trigger) for f in w.fired]
    check(fired == [(9, "non_finite")],
          f"the watch fired non_finite at update 9 only (got {fired})")
    check(bool(w.fired) and math.isnan(w.fired[0].value), "its value is the loss, NaN")
    trace = out / "traces" / TRACE
    check(trace.exists(), f"{TRACE} written")
    if trace.exists():
        lines = [json.loads(x) for x in trace.read_text().splitlines()]
        check(lines[-1].get("kind") == "terminal" and lines[-1].get("outcome") == "complete",
              "the trace is complete")
        check(any(x["kind"] == "op" and x["op_name"] == "aten::addmm" for x in lines),
              "it holds the update's ops")
        graph = os.environ.get("CANDLE_GRAPH") or str(ROOT / "build" / "tools" / "bin" /
                                                      "candle-graph")
        if shutil.which(graph) or os.access(graph, os.X_OK):
            with tempfile.TemporaryDirectory() as d:
                shutil.copy(trace, Path(d) / "trace.jsonl")
                r = subprocess.run([graph, "summary", "trace.jsonl"], cwd=d,
                                   capture_output=True, text=True, timeout=60)
                codes = set()
                if r.returncode == 0:
                    summary = json.loads(r.stdout)
                    codes = {i["code"] for i in summary["health"]["issues"]
                             if i["severity"] == "error"}
                check(r.returncode == 0 and codes <= {"gradient_family_non_finite"},
                      f"candle-graph reads it; errors only non-finite families ({sorted(codes)})")
        else:
            print(f"amp: candle-graph not found at {graph}: validity not checked")
    summary = json.loads((out / "summary.json").read_text())
    [loss] = [s for s in summary["scalars"] if s["label"] == "loss"]
    finite = [v for v in losses if math.isfinite(v)]
    check(loss["count"] == len(finite) and loss["non_finite"] == 1 and
          math.isclose(loss["mean"], sum(finite) / len(finite), rel_tol=1e-3),
          f"the whole-run loss is the program's, unscaled (mean {loss['mean']:.4g} vs "
          f"{sum(finite) / len(finite):.4g})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
