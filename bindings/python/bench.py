"""Benchmarks of the Python binding (figures for BENCHMARKS.md).

    PYTHONPATH=bindings/python /usr/bin/python3 bindings/python/bench.py

1. span enter+exit: ``with session.span(...)`` vs ``torch.profiler.record_function``
   inside an active ``torch.profiler.profile``, same loop, same run (median of batches);
2. one update of the 64-64-10 MLP (examples/python/train_mlp.py): untraced, captured by
   candle_trace.torch.profile (full op capture), and under torch.profiler with
   record_shapes=True, profile_memory=True; per-op cost = (traced - untraced) / events.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bindings" / "python"))
sys.path.insert(0, str(REPO / "examples" / "python"))

import candle_trace as ct  # noqa: E402


def batch_median(fn, batches: int, n: int) -> float:
    per = []
    for _ in range(batches):
        t = time.perf_counter_ns()
        fn(n)
        per.append((time.perf_counter_ns() - t) / n)
    return statistics.median(per)


def bench_spans(tmp: str) -> dict:
    s = ct.Session(os.path.join(tmp, "spans.jsonl"), "bench::spans", capture_step=1,
                   measured_root=True)

    def ours(n):
        span = s.span
        for _ in range(n):
            with span("hot"):
                pass

    def empty(n):
        for _ in range(n):
            pass

    res = {"ours_ns": batch_median(ours, 2000, 50), "loop_ns": batch_median(empty, 2000, 50)}
    s.finish()
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile, record_function
    except ImportError:
        return res

    def rf(n):
        for _ in range(n):
            with record_function("hot"):
                pass

    res["record_function_off_ns"] = batch_median(rf, 400, 50)
    with profile(activities=[ProfilerActivity.CPU]):
        res["record_function_on_ns"] = batch_median(rf, 400, 50)
    # ours again, interleaved with the profiler run, for a same-run ratio
    s = ct.Session(os.path.join(tmp, "spans2.jsonl"), "bench::spans", capture_step=1,
                   measured_root=True)
    res["ours2_ns"] = batch_median(ours, 2000, 50)
    s.finish()
    del torch
    return res


def bench_step(tmp: str, reps: int = 30) -> dict:
    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile

    import candle_trace.torch as ctt
    from train_mlp import MLP

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(32, 64)
    y = torch.randint(0, 10, (32,))

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(50):
        step()
    untraced = []
    for _ in range(300):
        t = time.perf_counter_ns()
        step()
        untraced.append(time.perf_counter_ns() - t)

    ours_in, ours_total, ops = [], [], 0
    for i in range(reps):
        with ctt.profile(model, opt, os.path.join(tmp, f"mlp{i}.jsonl"), capture_step=1) as p:
            t = time.perf_counter_ns()
            step()
            t1 = time.perf_counter_ns()
            p.step()  # closes the update and writes its buffered records
            t2 = time.perf_counter_ns()
        ours_in.append(t1 - t)
        ours_total.append(t2 - t)
        ops = p.op_count

    tp_in, tp_total, events = [], [], 0
    for _ in range(reps):
        t = time.perf_counter_ns()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                     profile_memory=True) as tp:
            t0 = time.perf_counter_ns()
            step()
            t1 = time.perf_counter_ns()
        t2 = time.perf_counter_ns()
        tp_in.append(t1 - t0)
        tp_total.append(t2 - t)
        events = len(tp.events())

    med = statistics.median
    base = med(untraced)
    return {
        "untraced_us": base / 1e3,
        "ours_in_us": med(ours_in) / 1e3, "ours_total_us": med(ours_total) / 1e3, "ops": ops,
        "tp_in_us": med(tp_in) / 1e3, "tp_total_us": med(tp_total) / 1e3, "events": events,
        "ours_per_op_in_ns": (med(ours_in) - base) / max(ops, 1),
        "ours_per_op_total_ns": (med(ours_total) - base) / max(ops, 1),
        "tp_per_ev_in_ns": (med(tp_in) - base) / max(events, 1),
        "tp_per_ev_total_ns": (med(tp_total) - base) / max(events, 1),
    }


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        sp = bench_spans(tmp)
        print(f"python {sys.version.split()[0]}, candle-trace {ct.version()}")
        print("\nspan enter+exit (median of 50-span batches)")
        print(f"  {'candle_trace Session.span':46s} {sp['ours_ns']:8.0f} ns"
              f"  (loop overhead {sp['loop_ns']:.0f} ns)")
        if "record_function_on_ns" in sp:
            import torch
            print(f"  {'torch record_function, profiler off':46s} "
                  f"{sp['record_function_off_ns']:8.0f} ns")
            print(f"  {'torch record_function, inside profile()':46s} "
                  f"{sp['record_function_on_ns']:8.0f} ns")
            print(f"  {'candle_trace Session.span (again)':46s} {sp['ours2_ns']:8.0f} ns")
            ours = min(sp["ours_ns"], sp["ours2_ns"])
            print(f"  ratio record_function(in profile) / ours: "
                  f"{sp['record_function_on_ns'] / ours:.1f}x   (torch {torch.__version__})")
            st = bench_step(tmp)
            print("\none update of the 64-64-10 MLP, batch 32, f32, 1 thread (median of 30)")
            print(f"  {'':34s} {'step us':>9s} {'+finish us':>11s} {'events':>7s} "
                  f"{'ns/event':>9s} {'ns/event incl. finish':>22s}")
            print(f"  {'untraced':34s} {st['untraced_us']:9.0f}")
            print(f"  {'candle_trace.torch (full capture)':34s} {st['ours_in_us']:9.0f} "
                  f"{st['ours_total_us']:11.0f} {st['ops']:7d} {st['ours_per_op_in_ns']:9.0f} "
                  f"{st['ours_per_op_total_ns']:22.0f}")
            print(f"  {'torch.profiler shapes+memory':34s} {st['tp_in_us']:9.0f} "
                  f"{st['tp_total_us']:11.0f} {st['events']:7d} {st['tp_per_ev_in_ns']:9.0f} "
                  f"{st['tp_per_ev_total_ns']:22.0f}")
            print(f"  slowdown of the captured step: ours {st['ours_in_us'] / st['untraced_us']:.2f}x"
                  f" ({st['ours_total_us'] / st['untraced_us']:.2f}x with writing), torch.profiler "
                  f"{st['tp_in_us'] / st['untraced_us']:.2f}x "
                  f"({st['tp_total_us'] / st['untraced_us']:.2f}x with start/stop)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
