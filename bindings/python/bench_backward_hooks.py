"""What a backward module span's gradient hook costs, by where it sits
(``CANDLE_TRACE_BACKWARD_HOOKS``): on the autograd node that receives the gradient
(``node``, the default: autograd calls it in C++) or in the tensor's ``_backward_hooks``
(``tensor``: torch's Python hook path, and on torch 2.x the torch.compiler.disable wrapper
dynamo needs around a Python hook).

    PYTHONPATH=bindings/python /usr/bin/python3 bindings/python/bench_backward_hooks.py [ROUNDS] [DEPTH]

A deep, narrow model (DEPTH x (Linear(16, 16), Tanh), batch 4: each module's output is
the next one's input, so one hooked gradient a module) whose update is mostly the hooks'
work, one thread. Per round, in a rotating order: ``BLOCK`` untraced updates, and
``BLOCK`` under a ``watch`` with the flight recorder (which records every update, so every
update hooks its gradients) with each kind of hook; process CPU per update (update and
``step()``), the round's median. Printed: the medians over rounds, and per round the
tensor-hook updates' CPU less the node-hook ones', over the hooked gradients.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import torch
from torch import nn

import candle_trace.torch as ctt

BLOCK = 10


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    depth = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(16, 16), nn.Tanh())])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(4, 16), torch.randn(4, 16)

    def update() -> None:
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()

    def block(wt: object = None) -> float:
        cpu = []
        for _ in range(BLOCK):
            c0 = time.process_time_ns()
            update()
            if wt is not None:
                wt.step()  # type: ignore[attr-defined]
            cpu.append(time.process_time_ns() - c0)
        return statistics.median(cpu)

    out: dict = {"untraced": [], "tensor": [], "node": []}
    prev = os.environ.get("CANDLE_TRACE_BACKWARD_HOOKS")
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(5):
            update()
        for r in range(rounds):
            modes = list(out)
            for mode in modes[r % 3:] + modes[:r % 3]:
                if mode == "untraced":
                    out[mode].append(block())
                    continue
                os.environ["CANDLE_TRACE_BACKWARD_HOOKS"] = mode  # read as the watch opens
                folder = os.path.join(tmp, f"{mode}-{r}")
                with ctt.watch(model, opt, folder) as wt:
                    update()  # arms what follows
                    wt.step()
                    out[mode].append(block(wt))
                assert not os.listdir(folder), "a run without anomaly wrote a trace"
    if prev is None:
        os.environ.pop("CANDLE_TRACE_BACKWARD_HOOKS", None)
    hooked = 2 * depth  # the input's gradient needs none: one hooked gradient a module
    print(f"backward module spans' hooks, torch {torch.__version__}, {2 * depth} modules, "
          f"{rounds} rounds of {BLOCK} updates, CPU per update (medians)")
    u = statistics.median(out["untraced"])
    print(f"  untraced                     {u / 1e3:8.0f} us")
    for mode in ("tensor", "node"):
        extra = statistics.median(a - b for a, b in zip(out[mode], out["untraced"]))
        print(f"  flight recorder, {mode:6} hooks {statistics.median(out[mode]) / 1e3:8.0f} us"
              f"  (+{extra / 1e3:.0f} us over the round's untraced)")
    d = sorted(a - b for a, b in zip(out["tensor"], out["node"]))
    q = len(d) // 4
    print(f"  tensor - node hooks: {statistics.median(d) / 1e3:.0f} us an update "
          f"[{d[q] / 1e3:.0f}, {d[-q - 1] / 1e3:.0f}], "
          f"{statistics.median(d) / hooked / 1e3:.2f} us a hooked gradient")


if __name__ == "__main__":
    main()
