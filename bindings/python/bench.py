"""Benchmarks of the Python binding (figures for BENCHMARKS.md).

    PYTHONPATH=bindings/python /usr/bin/python3 bindings/python/bench.py

1. span enter+exit: ``with session.span(...)`` vs ``torch.profiler.record_function``
   inside an active ``torch.profiler.profile``, same loop, same run (median of batches);
2. one update of the 64-64-10 MLP (examples/python/train_mlp.py): untraced; captured by
   candle_trace.torch.profile with the C++ op observer and with the Python dispatch
   mode (CANDLE_TRACE_TORCH_OPS), and with ops=False (the same capture without op
   capture: the baseline that isolates the per-op cost); under torch.profiler with
   record_shapes=True, profile_memory=True. Per-op cost = (step - step with ops=False) /
   ops for ours, (step - untraced) / events for torch.profiler;
3. a run of 2000 small ops in one forward, where op capture dominates: ns added per op;
4. the aggregate schedule (``profile(..., aggregate_path=...)``): the per-update cost of
   the whole-run statistics (5 spans and the loss) beside the untraced update, outside the
   captured one. ``bench.py --aggregate`` runs this one alone;
5. bench_capture.py: on the MLP, the GPT-style model (batch 8 x 64 and 1 x 8) and the
   MNIST-style CNN, the trace's measured update against the untraced one, the captured
   update's extra CPU against torch.profiler's, and the updates around the capture.
   ``bench.py --capture`` runs this one alone.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

import candle_trace as ct  # noqa: E402


SETTLE_STEPS = 10  # untraced steps between two timed captures


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


def _median_step(step, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter_ns()
        step()
        times.append(time.perf_counter_ns() - t)
    return statistics.median(times)


def _ours(ctt, model, opt, step, tmp: str, reps: int, mechanism: str, **kw) -> dict:
    """Median in-step and in-step+writing times of a capture_step=1 profile of step()."""
    os.environ["CANDLE_TRACE_TORCH_OPS"] = mechanism
    ins, totals, ops, mech = [], [], 0, None
    try:
        for i in range(reps):
            path = os.path.join(tmp, f"cap-{mechanism}-{i}.jsonl")
            with ctt.profile(model, opt, path, capture_step=1, **kw) as p:
                t = time.perf_counter_ns()
                step()
                t1 = time.perf_counter_ns()
                p.step()  # closes the update and writes its buffered records
                t2 = time.perf_counter_ns()
            ins.append(t1 - t)
            totals.append(t2 - t)
            ops, mech = p.op_count, p.op_mechanism
            # A real run captures one update among untraced ones: run some between two
            # timed captures (warm caches; the library's background flush and the Go
            # collector of the last capture get their time, as in a training loop).
            for _ in range(SETTLE_STEPS):
                step()
    finally:
        os.environ.pop("CANDLE_TRACE_TORCH_OPS", None)
    med = statistics.median
    kinds = _trace_events(path)
    return {"in": med(ins), "total": med(totals), "ops": kinds.get("op", 0),
            "memory": kinds.get("memory", 0), "mechanism": mech}


def _torch_profiler(step, reps: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    ins, totals, events = [], [], 0
    for _ in range(reps):
        t = time.perf_counter_ns()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                     profile_memory=True) as tp:
            t0 = time.perf_counter_ns()
            step()
            t1 = time.perf_counter_ns()
        t2 = time.perf_counter_ns()
        ins.append(t1 - t0)
        totals.append(t2 - t)
        events = len(tp.events())
        for _ in range(SETTLE_STEPS):  # as between our captures
            step()
    med = statistics.median
    return {"in": med(ins), "total": med(totals), "ops": events}


def _mlp_update():
    """The benchmarked update: the example's 64-64-10 MLP, batch 32, SGD, one
    thread, seeded. Returns (model, optimizer, step)."""
    import torch
    from torch import nn

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

    return model, opt, step


def bench_step(tmp: str, reps: int = 40) -> dict:
    """One update of the MLP: untraced; candle_trace with the C++ observer, with the
    Python dispatch mode, and with ops off (spans, stats, gradients only: the baseline
    that isolates the per-op cost); torch.profiler with shapes and memory."""
    import candle_trace.torch as ctt
    from candle_trace.torch import _observer

    model, opt, step = _mlp_update()

    t = time.perf_counter()
    have_observer = _observer.get() is not None  # the first build happens here, once
    build_s = time.perf_counter() - t
    for _ in range(50):
        step()
    res = {"untraced": {"in": _median_step(step, 300)}, "build_s": build_s}
    if have_observer:
        res["observer"] = _ours(ctt, model, opt, step, tmp, reps, "observer")
    res["dispatch"] = _ours(ctt, model, opt, step, tmp, reps, "dispatch")
    res["no_ops"] = _ours(ctt, model, opt, step, tmp, reps, "dispatch", ops=False)
    res["bare"] = _ours(ctt, model, opt, step, tmp, reps, "dispatch", ops=False, stats=False)
    res["torch.profiler"] = _torch_profiler(step, reps)
    res["untraced2"] = {"in": _median_step(step, 300)}
    return res


def bench_ops(tmp: str, n_ops: int = 2000, reps: int = 15) -> dict:
    """Per-op cost on a long run of small ops (one module whose forward adds 1 to a 4x4
    tensor n_ops times; no backward): ops dominate, so the figures are per op."""
    import torch
    from torch import nn

    import candle_trace.torch as ctt
    from candle_trace.torch import _observer

    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(4, 4))

        def forward(self, x):
            for _ in range(n_ops):
                x = x + 1
            return x

    torch.set_num_threads(1)
    model = Chain()
    x = torch.zeros(4, 4)

    def step():
        with torch.no_grad():
            model(x)

    step()
    res = {"untraced": {"in": _median_step(step, 30)}}
    # an inference step (no_grad): the update of phase train starts at a forward with
    # gradients on
    kw = {"stats": False, "phase": "infer"}
    if _observer.get() is not None:
        res["observer"] = _ours(ctt, model, None, step, tmp, reps, "observer", **kw)
    res["dispatch"] = _ours(ctt, model, None, step, tmp, max(reps // 3, 3), "dispatch", **kw)
    res["no_ops"] = _ours(ctt, model, None, step, tmp, reps, "dispatch", ops=False, **kw)
    res["torch.profiler"] = _torch_profiler(step, reps)
    return res


def _trace_events(path: str) -> dict:
    import json

    kinds: dict = {}
    with open(path) as f:
        for line in f:
            k = json.loads(line)["kind"]
            kinds[k] = kinds.get(k, 0) + 1
    return kinds


def print_step(st: dict) -> None:
    base = min(st["untraced"]["in"], st["untraced2"]["in"])
    ops = st.get("observer", st["dispatch"])["ops"]  # the aten ops of one update
    print("\none update of the 64-64-10 MLP, batch 32, f32, 1 thread (median of 40)")
    print(f"  {'':40s} {'step us':>8s} {'+write us':>10s} {'slowdown':>9s} {'events':>7s} "
          f"{'op capture us':>14s} {'ns/event':>9s} {'ns/aten op':>11s}")
    print(f"  {'untraced':40s} {base / 1e3:8.0f}")
    rows = [("observer", "candle_trace, C++ observer (default)"),
            ("dispatch", "candle_trace, dispatch mode (fallback)"),
            ("no_ops", "candle_trace, ops=False"),
            ("bare", "candle_trace, ops=False, stats=False"),
            ("torch.profiler", "torch.profiler shapes+memory")]
    for key, label in rows:
        r = st.get(key)
        if r is None:
            continue
        cols = ""
        if key in ("observer", "dispatch", "torch.profiler"):
            # ours: the op capture's own cost = step - the same capture with ops=False;
            # events = op + memory records. torch.profiler: all it adds, per event.
            ref = base if key == "torch.profiler" else st["no_ops"]["in"]
            added = r["in"] - ref
            events = r["ops"] if key == "torch.profiler" else r["ops"] + r.get("memory", 0)
            cols = (f"{events:7d} {added / 1e3:14.0f} {added / max(events, 1):9.0f} "
                    f"{added / max(ops, 1):11.0f}")
        print(f"  {label:40s} {r['in'] / 1e3:8.0f} {r['total'] / 1e3:10.0f} "
              f"{r['in'] / base:8.2f}x {cols}")
    print(f"  (aten ops of the update: {ops}; events: op + memory records for candle_trace, "
          "profiler events for torch.profiler;\n   op capture us: step minus the same "
          "capture with ops=False for candle_trace, minus untraced for torch.profiler;\n"
          "   +write: the step plus writing the trace / stopping the profiler)")


def print_ops(r: dict, n_ops: int = 2000) -> None:
    base = r["untraced"]["in"]
    print(f"\n{n_ops} small ops (x + 1 on a 4x4 tensor) in one module forward, 1 thread")
    print(f"  {'':40s} {'step us':>8s} {'+write us':>10s} {'ops':>6s} {'ns/op added':>12s}")
    print(f"  {'untraced':40s} {base / 1e3:8.0f} {'':10s} {n_ops:6d} {base / n_ops:12.0f}"
          f"  (the op itself)")
    for key, label in (("observer", "candle_trace, C++ observer"),
                       ("dispatch", "candle_trace, dispatch mode"),
                       ("torch.profiler", "torch.profiler shapes+memory")):
        x = r.get(key)
        if x is None:
            continue
        ref = r["no_ops"]["in"] if key != "torch.profiler" else base
        print(f"  {label:40s} {x['in'] / 1e3:8.0f} {x['total'] / 1e3:10.0f} {x['ops']:6d} "
              f"{(x['in'] - ref) / max(x['ops'], 1):12.0f}")


def bench_aggregate(tmp: str, blocks: int = 20, per_block: int = 200) -> dict:
    """Median update time of the MLP untraced vs under the aggregate schedule (after its
    capture, capture_step=1), in alternating blocks of ``per_block`` updates."""
    import candle_trace.torch as ctt

    model, opt, step = _mlp_update()

    for _ in range(100):
        step()
    plain, agg = [], []
    summary = os.path.join(tmp, "agg.json")
    for b in range(blocks):
        plain.extend(_timed_steps(step, None, per_block))
        with ctt.profile(model, opt, os.path.join(tmp, f"agg-{b}.jsonl"), capture_step=1,
                         ops=False, aggregate_path=summary) as p:
            step()
            p.step()  # the captured update, not timed
            agg.extend(_timed_steps(step, p, per_block))
    med = statistics.median
    return {"untraced": med(plain), "aggregate": med(agg), "updates": len(agg)}


def _timed_steps(step, prof, n: int) -> list:
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        step()
        if prof is not None:
            prof.step()
        out.append(time.perf_counter_ns() - t)
    return out


def print_aggregate(r: dict) -> None:
    u, a = r["untraced"], r["aggregate"]
    print(f"\naggregate schedule, MLP 64-64-10 update (median of {r['updates']} updates, "
          "1 thread)")
    print(f"  {'untraced update':40s} {u / 1e3:8.1f} us")
    print(f"  {'with aggregate statistics':40s} {a / 1e3:8.1f} us   "
          f"(+{(a - u) / 1e3:.1f} us = +{(a - u) / u * 100:.1f}% per update; 5 spans + loss)")


def main() -> int:
    if "--capture" in sys.argv[1:]:
        import bench_capture

        print(f"python {sys.version.split()[0]}, candle-trace {ct.version()}")
        bench_capture.print_summary(bench_capture.run())
        return 0
    if "--aggregate" in sys.argv[1:]:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"python {sys.version.split()[0]}, candle-trace {ct.version()}")
            print_aggregate(bench_aggregate(tmp))
        return 0
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
            if st["build_s"] > 1:
                print(f"\n(the C++ observer was built first: {st['build_s']:.1f} s)")
            print_step(st)
            print_ops(bench_ops(tmp))
            print_aggregate(bench_aggregate(tmp))
            import bench_capture

            bench_capture.print_summary(bench_capture.run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
