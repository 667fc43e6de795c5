"""Training loops that go wrong, each under ``candle_trace.torch.watch`` at its default
triggers and with no capture step given (issue 13): the watch keeps the trace of the
update that went wrong on its own. Synthetic data, no downloads.

    PYTHONPATH=bindings/python python examples/python/watch_failures.py SCENARIO FOLDER \\
        [--updates N] [--aggregate SUMMARY.json] [--device cpu|cuda]

Scenarios (what the watch writes into FOLDER):

- ``stall``: the data step of update 37 sleeps 5x the median update (a loader stall):
  ``update-000037-slow.jsonl`` and the update after it captured in full,
  ``update-000038-after-slow.jsonl``;
- ``nan``: the learning rate spikes in update 19's optimizer step, update 20's loss is
  not finite: ``update-000020-non_finite.jsonl``, ``update-000021-after-non_finite.jsonl``;
- ``oom``: backward raises an out-of-memory RuntimeError at update 15 (the message of
  CUDA's, on any device): ``update-000015-exception.jsonl``, failed with it;
- ``alloc-oom``: forward of update 15 really allocates more than the device has (CUDA:
  twice its memory, ``torch.cuda.OutOfMemoryError``; CPU: 2^60 bytes, the CPU
  allocator's error): ``update-000015-exception.jsonl``, failed with the allocator's
  message, the ops before it and, on CUDA, a sample of torch's caching allocator;
- ``steady``: ``--updates`` (default 10,000) updates of the 64-64-10 MLP, nothing wrong:
  no trace at all; the process's RSS every 1,000 updates shows the flight recorder's
  memory staying bounded.

The other loops have a data step that waits 20 ms (a loader), so that "5x the
median" is well above the machine's noise. Prints one JSON object: the scenario, the
updates run, the triggers fired (update, trigger, value, threshold, trace), the traces
written, the RSS samples, and the error that ended the loop (or null).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bindings" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import candle_trace.torch as ctt  # noqa: E402

LOADER_S = 0.02  # the data step's wait for its batch, every update
STALL_AT, NAN_AT, OOM_AT = 37, 20, 15


class Net(nn.Module):
    def __init__(self, oom_at: Optional[int] = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)
        self.update = 0
        self.oom_at = oom_at

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        if self.update == self.oom_at:
            # more than the device holds, as a batch too large for it would ask
            if x.is_cuda:
                n = 2 * torch.cuda.get_device_properties(x.device).total_memory
            else:
                n = 1 << 60
            h = h + torch.empty(n, dtype=torch.uint8, device=x.device)[:1]
        return self.fc2(h)


class FailingBackward(torch.autograd.Function):
    """Identity whose backward raises CUDA's out-of-memory message when armed."""

    armed = False

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if FailingBackward.armed:
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB "
                               "(GPU 0; 79.35 GiB total capacity; 71.20 GiB already allocated)")
        return g


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024


def run(scenario: str, folder: str, updates: Optional[int] = None,
        aggregate: Optional[str] = None, device: str = "cpu", **watch_kw: Any) -> Dict[str, Any]:
    """Runs one scenario (see the module's doc); returns what main() prints, plus the
    watch itself under ``"watch"``."""
    if scenario == "steady":
        return _steady(folder, updates or 10_000, aggregate, **watch_kw)
    n = updates or {"stall": 40, "nan": 25}.get(scenario, 30)
    torch.manual_seed(0)
    dev = torch.device(device)
    model = Net(OOM_AT if scenario == "alloc-oom" else None).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    times: List[float] = []
    error = None
    w = ctt.watch(model, opt, folder, aggregate_path=aggregate, **watch_kw)
    t0 = time.perf_counter()
    try:
        with w:
            for i in range(1, n + 1):
                model.update = i
                FailingBackward.armed = scenario == "oom" and i == OOM_AT
                # the data step: the loader's wait, 5x the median update at the stall
                stall = 5 * sorted(times)[len(times) // 2] if scenario == "stall" and i == STALL_AT else 0
                time.sleep(LOADER_S + stall)
                x, y = torch.randn(8, 16, device=dev), torch.randn(8, 4, device=dev)
                opt.zero_grad()
                ((FailingBackward.apply(model(x)) - y) ** 2).mean().backward()
                if scenario == "nan" and i == NAN_AT - 1:
                    for g in opt.param_groups:
                        g["lr"] = 1e38  # the spike: update 20's loss is not finite
                opt.step()
                w.step()
                t1 = time.perf_counter()
                times.append(t1 - t0)
                t0 = t1
    except RuntimeError as e:  # the failure the scenario makes: the program ends with it
        error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    finally:
        FailingBackward.armed = False
    return _result(scenario, w, error, [])


def _steady(folder: str, n: int, aggregate: Optional[str], **watch_kw: Any) -> Dict[str, Any]:
    import workloads

    torch.set_num_threads(1)
    wl = workloads.mlp()
    rss: List[float] = []
    with ctt.watch(wl.model, wl.optimizer, folder, aggregate_path=aggregate, **watch_kw) as w:
        for i in range(1, n + 1):
            wl.update(*wl.batch())
            w.step()
            if i % 1000 == 0:
                rss.append(round(_rss_mib(), 1))
    return _result("steady", w, None, rss)


def _result(scenario: str, w: "ctt.watch", error: Optional[str], rss: List[float]) -> Dict[str, Any]:
    return {
        "scenario": scenario, "updates": w.updates, "error": error,
        "fired": [{"update": f.update, "trigger": f.trigger, "value": f.value,
                   "threshold": f.threshold, "detail": f.detail,
                   "trace": os.path.basename(f.trace) if f.trace else None} for f in w.fired],
        "traces": sorted(os.path.basename(t) for t in w.traces),
        "rss_mib": rss, "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "watch": w,
    }


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", choices=["stall", "nan", "oom", "alloc-oom", "steady"])
    ap.add_argument("folder")
    ap.add_argument("--updates", type=int)
    ap.add_argument("--aggregate")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args(argv)
    r = run(a.scenario, a.folder, a.updates, a.aggregate, a.device)
    del r["watch"]
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
