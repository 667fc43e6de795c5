"""GPU overhead of the device collectors, side by side with torch.profiler.

    python tests/gpu/bench.py [--device cuda:0] [--steps 30] [--rounds 4]

The GPU check's training step (tests/gpu/run.sh: 4096-wide MLP, batch 512),
timed per step (wall time to torch.cuda.synchronize()) in three
configurations, each against untraced steps in alternating blocks of the same
run:

  collectors  a candle-trace session with ct_device_start nvml + cupti and the
              forward / backward / optimizer spans of each step;
  profiler    torch.profiler.profile(activities=[CPU, CUDA]) around the block
              (its trace processing at exit is not timed).

candle-trace's blocks run first: torch.profiler (Kineto) keeps CUPTI once it
has used it, and only one CUPTI subscriber may exist per process. Prints one
line per configuration: median step, ratio to the untraced median of its own
phase. Exit 0; 2 when there is no CUDA (on CPU, --device cpu runs the same
code without CUPTI, to check the script itself).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

import candle_trace as ct


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per block")
    ap.add_argument("--rounds", type=int, default=4, help="blocks of each configuration")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        print("bench: no CUDA", file=sys.stderr)
        return 2
    width = 4096 if cuda else 256
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(512 if cuda else 64, width, device=dev)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def step(sess: "ct.Session | None" = None) -> None:
        if sess is None:
            opt.zero_grad(set_to_none=True)
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            return
        with sess.span("forward", step="forward"):
            opt.zero_grad(set_to_none=True)
            loss = model(x).square().mean()
        with sess.span("backward", step="backward"):
            loss.backward()
        with sess.span("optimizer", step="optimizer"):
            opt.step()

    def block(n: int, sess: "ct.Session | None" = None) -> list:
        out = []
        for _ in range(n):
            t = time.perf_counter_ns()
            step(sess)
            sync()
            out.append(time.perf_counter_ns() - t)
        return out

    for _ in range(5):
        step()
    sync()
    tmp = tempfile.mkdtemp(prefix="candle-trace-gpu-bench-")
    results = {}

    # Phase 1: untraced vs candle-trace collectors.
    plain, traced, collect, why = [], [], ["nvml", "cupti"] if cuda else [], ""
    for r in range(args.rounds):
        plain += block(args.steps)
        s = ct.Session(os.path.join(tmp, f"ct-{r}.jsonl"), "gpu_bench::step", phase="train",
                       capture_step=1, device=str(dev), run={"measured_root": True})
        if collect:
            try:
                s.device_start({"collect": collect, "interval_ms": 10})
            except ct.CandleTraceError as e:
                why = e.message
                collect = ["nvml"]
                s.device_start({"collect": collect, "interval_ms": 10})
        traced += block(args.steps, s)
        if collect:
            s.device_stop()
        s.finish()
    results["untraced (phase 1)"] = plain
    label = "candle-trace spans + " + ("+".join(collect) if collect else "no collectors (cpu)")
    results[label] = traced
    base1 = statistics.median(plain)

    # Phase 2: untraced vs torch.profiler with CUDA activities.
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    plain2, prof = [], []
    for _ in range(args.rounds):
        plain2 += block(args.steps)
        with profile(activities=acts) as p:
            t = block(args.steps)
        prof += t
        del p
    results["untraced (phase 2)"] = plain2
    results["torch.profiler " + "+".join(a.name for a in acts)] = prof
    base2 = statistics.median(plain2)

    print(f"bench: {args.device}, {args.rounds} blocks x {args.steps} steps per configuration, "
          f"MLP {width}x{width}x2, torch {torch.__version__}")
    if why:
        print(f"bench: CUPTI not started ({why}); the collectors row is NVML only")
    for i, (name, v) in enumerate(results.items()):
        base = base1 if i < 2 else base2
        m = statistics.median(v)
        print(f"  {name:44s} median {m / 1e3:9.1f} us   x{m / base:.3f} of untraced")
    return 0


if __name__ == "__main__":
    sys.exit(main())
