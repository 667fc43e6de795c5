"""What inductor's kernel record functions cost a compiled model (torch >= 2.x, CPU):
the option a capture turns on (``_kernels.py``) stays in the kernels compiled meanwhile.

    PYTHONPATH=bindings/python python bindings/python/bench_kernels.py [ROUNDS] [UPDATES]

One process, one thread: the GPT-style model of examples/python/workloads.py (batch 8 x
64 tokens, AdamW) twice, the same weights, both ``torch.compile``d -- one with the
option off, one compiled while a capture held it on (the capture made its kernels
resolvable); then ROUNDS rounds (20) of UPDATES updates (10) each, the two models
alternating, order rotated per round, no capture open: process CPU per update. Prints
the medians, the kernels each update calls and the ratio on/off (median over rounds,
with its quartiles); then a one-kernel compiled function (relu(x * 2 + 1)) timed per
call the same way (2,000 calls a round): what one kernel's record function costs.
"""

from __future__ import annotations

import contextlib
import copy
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bindings" / "python"))
sys.path.insert(0, str(REPO / "examples" / "python"))
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # noqa: E402

import candle_trace.torch as ctt  # noqa: E402
import workloads  # noqa: E402


def compiled(w: workloads.Workload) -> workloads.Workload:
    """``w``'s model (a copy), compiled on its own: dynamo keeps compiled code per code
    object, so a second instance of the same class would run the first one's kernels --
    each copy gets a subclass of its own, whose forward only calls the model's."""
    cls = type(w.model)

    class Twin(cls):  # type: ignore[misc, valid-type]
        def forward(self, *a, **k):  # noqa: ANN002, ANN003
            return super().forward(*a, **k)

    m = copy.deepcopy(w.model)
    m.__class__ = Twin
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4)
    return workloads.Workload(w.name, torch.compile(m), opt, w.batch, w.loss)


def cpu_per_update(w: workloads.Workload, n: int) -> float:
    batches = [w.batch() for _ in range(n)]
    c0 = time.process_time_ns()
    for x, y in batches:
        w.update(x, y)
    return (time.process_time_ns() - c0) / n


def kernel_calls(w: workloads.Workload) -> int:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as p:
        w.update(*w.batch())
    return sum(1 for e in p.events() if "cpp_fused" in e.name)


@contextlib.contextmanager
def option_held(w: workloads.Workload) -> Iterator[bool]:
    """A profile whose capture is far ahead, open around the body: its capture holds the
    option on (yields whether it is)."""
    with tempfile.TemporaryDirectory() as tmp:
        prof = ctt.profile(w.model, w.optimizer, os.path.join(tmp, "t.jsonl"),
                           capture_step=10**9)
        prof.start()
        try:
            import torch._inductor.config as cfg
            yield bool(cfg.cpp.enable_kernel_profile)
        finally:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "ended before capture step": the point
                prof.stop()


def _tiny_off(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x * 2 + 1)


def _tiny_on(x: torch.Tensor) -> torch.Tensor:  # a code object of its own: compiled apart
    return torch.relu(x * 2 + 1)


def per_call_ns(fn, x: torch.Tensor, n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn(x)
    return (time.perf_counter_ns() - t0) / n


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    updates = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    torch.set_num_threads(1)
    base = workloads.gpt(8, 64)
    off = compiled(base)
    for _ in range(3):  # compiled with the option off
        off.update(*off.batch())
    on = compiled(base)
    tiny_off = torch.compile(_tiny_off)
    tiny_off(torch.ones(16))
    with option_held(on) as held:  # compiled while a capture holds the option on
        for _ in range(3):
            on.update(*on.batch())
        tiny_on = torch.compile(_tiny_on)
        tiny_on(torch.ones(16))
    if not held:
        print("the capture did not turn the option on (see its warning)")
        return 1
    calls_on, calls_off = kernel_calls(on), kernel_calls(off)
    per = {"off": [], "on": []}
    for r in range(rounds):
        order = [("off", off), ("on", on)] if r % 2 == 0 else [("on", on), ("off", off)]
        for name, w in order:
            per[name].append(cpu_per_update(w, updates))
    ratios = [a / b for a, b in zip(per["on"], per["off"])]
    q = statistics.quantiles(ratios, n=4)
    med_off, med_on = statistics.median(per["off"]), statistics.median(per["on"])
    print(f"torch {torch.__version__}, GPT b8x64 compiled (inductor), {rounds} rounds x "
          f"{updates} updates, CPU per update")
    print(f"  kernels without record functions: {med_off / 1e6:.3f} ms "
          f"({calls_off} recorded kernel calls an update)")
    print(f"  kernels with record functions:    {med_on / 1e6:.3f} ms "
          f"({calls_on} kernel calls an update)")
    print(f"  on / off: {statistics.median(ratios):.4f} [{q[0]:.4f}, {q[2]:.4f}] "
          f"(median over rounds [quartiles])")
    x = torch.ones(16)
    tiny = {"off": [], "on": []}
    for r in range(rounds):
        for name, fn in ([("off", tiny_off), ("on", tiny_on)] if r % 2 == 0 else
                         [("on", tiny_on), ("off", tiny_off)]):
            tiny[name].append(per_call_ns(fn, x, 2000))
    t_off, t_on = statistics.median(tiny["off"]), statistics.median(tiny["on"])
    print(f"  one fused kernel (relu(x * 2 + 1), 16 floats), compiled, wall per call over "
          f"{rounds} x 2000 calls: {t_off:.0f} ns without its record function, {t_on:.0f} "
          f"ns with it: {t_on - t_off:+.0f} ns a kernel call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
