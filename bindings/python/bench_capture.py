"""What a captured update costs, and whether its trace tells the truth (issue 12), on the
workloads of examples/python/workloads.py: the MLP, the GPT-style char model at batch 8
x 64 tokens and at batch 1 x 8 tokens, and the MNIST-style CNN at batch 64.

    PYTHONPATH=bindings/python /usr/bin/python3 bindings/python/bench_capture.py [ROUNDS] [WORKLOAD...]

One thread (torch.set_num_threads(1)). Per round, in an order that rotates between
rounds, one workload runs:

- untraced: three updates, timed (wall and process CPU);
- candle_trace.torch.profile(capture_step=3), default options: updates 1, 2 and 4 are
  the non-captured ones (update and prof.step(), CPU), update 3 the captured one: its
  in-step CPU (the update alone: forward, backward, optimizer) and its prof.step() (which
  closes the capture and writes its records), and from the trace the measured region's
  duration and the tracer time it left out;
- a profile whose capture is far ahead (the state of every update but the captured one
  in a real run): three updates with prof.step(), CPU;
- torch.profiler.profile(record_shapes=True, profile_memory=True) around one update:
  its in-step CPU, and its exit.

Figures are medians over the rounds:
- measured / untraced: the trace's measured update over the untraced update's wall time
  (the honesty of the timings; target within +-15%); paired: the median over rounds of
  each round's measured update over that round's untraced one (less sensitive to a
  loaded machine's drift);
- extra CPU ratio: (ours in-step CPU - untraced CPU) / (torch.profiler in-step CPU -
  untraced CPU) (target <= 1);
- all: the extra CPU of the update plus the closing after it (our prof.step() that
  ends the capture and writes it; torch.profiler's exit), what each costs in all;
- non-captured / untraced: CPU of the updates under a profile whose capture is ahead
  (target <= 1.02); next to the capture: the updates just before and after it, which pay
  for cold caches after the capture's writing.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

#: the checkout whose binding and workloads run (CANDLE_TRACE_BENCH_REPO: main's, for a
#: before/after with this script)
REPO = Path(os.environ.get("CANDLE_TRACE_BENCH_REPO") or Path(__file__).resolve().parents[2])
sys.path.insert(0, str(REPO / "bindings" / "python"))
sys.path.insert(0, str(REPO / "examples" / "python"))

WORKLOADS = ("mlp", "gpt-b8", "gpt-b1", "cnn")


def _timed(fn):
    w0, c0 = time.perf_counter_ns(), time.process_time_ns()
    fn()
    return time.perf_counter_ns() - w0, time.process_time_ns() - c0


def _untraced(w, out):
    walls = []
    for _ in range(3):
        x, y = w.batch()
        wall, cpu = _timed(lambda: w.update(x, y))
        walls.append(wall)
        out["untraced_cpu"].append(cpu)
    out["untraced_wall"].extend(walls)
    out["round_untraced_wall"].append(statistics.median(walls))


def _ours(ctt, w, out, tmp, r):
    path = os.path.join(tmp, f"{w.name.replace(' ', '-')}-{r}.jsonl")
    prof = ctt.profile(w.model, w.optimizer, path, capture_step=3)
    prof.start()
    for i in range(1, 5):
        x, y = w.batch()
        if i == 3:
            _, cpu = _timed(lambda: w.update(x, y))
            _, end = _timed(prof.step)
            out["ours_cpu"].append(cpu)
            out["ours_end_cpu"].append(end)
        elif i == 2:  # its prof.step() arms the capture: timed apart
            _, cpu = _timed(lambda: w.update(x, y))
            out["noncap_cpu"].append(cpu)
            prof.step()
        else:
            _, cpu = _timed(lambda: (w.update(x, y), prof.step()))
            out["noncap_cpu"].append(cpu)
    prof.stop()
    lines = [json.loads(s) for s in Path(path).read_text().splitlines()]
    measured = next(s["id"] for s in lines if s["kind"] == "span_start" and s.get("measured"))
    end = next(e for e in lines if e["kind"] == "span_end" and e["id"] == measured)
    out["measured_ns"].append(end["duration_ns"])
    out["tracer_ns"].append(end["tracer_ns"])
    out["ops"] = sum(1 for s in lines if s["kind"] == "op")
    out["mechanism"] = prof.op_mechanism
    os.unlink(path)


def _far(ctt, w, out, tmp, r):
    prof = ctt.profile(w.model, w.optimizer, os.path.join(tmp, f"far-{r}.jsonl"),
                       capture_step=10**9)
    prof.start()
    w.update(*w.batch())
    prof.step()
    for _ in range(3):
        x, y = w.batch()
        _, cpu = _timed(lambda: (w.update(x, y), prof.step()))
        out["far_cpu"].append(cpu)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "ended before capture step": the point here
        prof.stop()


def _torch_profiler(w, out):
    from torch.profiler import ProfilerActivity, profile

    x, y = w.batch()
    tp = profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True)
    tp.__enter__()
    _, cpu = _timed(lambda: w.update(x, y))
    _, exit_cpu = _timed(lambda: tp.__exit__(None, None, None))
    out["tp_cpu"].append(cpu)
    out["tp_exit_cpu"].append(exit_cpu)


def run(rounds: int = 20, names=WORKLOADS) -> dict:
    import torch

    import candle_trace.torch as ctt
    import workloads

    torch.set_num_threads(1)
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            w = workloads.WORKLOADS[name]()
            for _ in range(5):  # warm: allocator, caches, the observer's build
                w.update(*w.batch())
            out = {k: [] for k in ("untraced_wall", "round_untraced_wall", "untraced_cpu",
                                   "ours_cpu", "ours_end_cpu", "noncap_cpu", "measured_ns",
                                   "tracer_ns", "tp_cpu", "tp_exit_cpu", "far_cpu")}
            modes = [lambda r: _untraced(w, out), lambda r: _ours(ctt, w, out, tmp, r),
                     lambda r: _torch_profiler(w, out), lambda r: _far(ctt, w, out, tmp, r)]
            for r in range(rounds):
                for m in modes[r % 4:] + modes[:r % 4]:
                    m(r)
            res[name] = out
    return res


def summarize(out: dict) -> dict:
    med = statistics.median
    u_wall, u_cpu = med(out["untraced_wall"]), med(out["untraced_cpu"])
    ours, tp = med(out["ours_cpu"]), med(out["tp_cpu"])
    return {
        "untraced_ms": u_wall / 1e6, "untraced_cpu_ms": u_cpu / 1e6,
        "measured_ms": med(out["measured_ns"]) / 1e6,
        "measured_ratio": med(out["measured_ns"]) / u_wall,
        # each round's measured update over the same round's untraced one: what the load
        # of the minute does to both cancels
        "paired_ratio": med(m / u for m, u in zip(out["measured_ns"], out["round_untraced_wall"])),
        "tracer_ms": med(out["tracer_ns"]) / 1e6,
        "ours_cpu_ms": ours / 1e6, "tp_cpu_ms": tp / 1e6,
        "ours_extra_ms": (ours - u_cpu) / 1e6, "tp_extra_ms": (tp - u_cpu) / 1e6,
        # None where torch.profiler's extra is not above 0: inside the update's own
        # spread, no ratio to it means anything (a division by ~0 printed millions)
        "extra_ratio": (ours - u_cpu) / (tp - u_cpu) if tp > u_cpu else None,
        "ours_end_ms": med(out["ours_end_cpu"]) / 1e6, "tp_exit_ms": med(out["tp_exit_cpu"]) / 1e6,
        # what each costs in all: the update's extra CPU and the closing/exit after it
        "ours_total_ms": (ours - u_cpu + med(out["ours_end_cpu"])) / 1e6,
        "tp_total_ms": (tp - u_cpu + med(out["tp_exit_cpu"])) / 1e6,
        "noncap_ratio": med(out["far_cpu"]) / u_cpu,
        "adjacent_ratio": med(out["noncap_cpu"]) / u_cpu,
        "ops": out["ops"], "mechanism": out["mechanism"], "rounds": len(out["ours_cpu"]),
    }


def print_summary(res: dict) -> None:
    import torch

    print(f"\ncaptured update vs untraced vs torch.profiler(record_shapes, profile_memory) "
          f"(torch {torch.__version__}, 1 thread, medians)")
    print(f"  {'workload':10s} {'untraced':>9s} {'measured':>9s} {'meas/untr':>9s} {'paired':>7s} "
          f"{'tracer':>8s} {'ours+cpu':>9s} {'tp+cpu':>9s} {'extra ratio':>11s} "
          f"{'ours end':>9s} {'tp exit':>9s} {'ours all':>9s} {'tp all':>9s} {'noncap':>7s} "
          f"{'adjacent':>8s} {'ops':>5s}")
    for name, out in res.items():
        s = summarize(out)
        ratio = "n/a" if s["extra_ratio"] is None else f"{s['extra_ratio']:.2f}x"
        print(f"  {name:10s} {s['untraced_ms']:7.2f}ms {s['measured_ms']:7.2f}ms "
              f"{s['measured_ratio']:8.2f}x {s['paired_ratio']:6.2f}x {s['tracer_ms']:6.2f}ms "
              f"{s['ours_extra_ms']:7.2f}ms "
              f"{s['tp_extra_ms']:7.2f}ms {ratio:>11s} {s['ours_end_ms']:7.2f}ms "
              f"{s['tp_exit_ms']:7.2f}ms {s['ours_total_ms']:7.2f}ms {s['tp_total_ms']:7.2f}ms "
              f"{s['noncap_ratio']:6.3f}x {s['adjacent_ratio']:7.3f}x "
              f"{s['ops']:5d}")
    print("  (measured: the trace's update, tracer time left out; paired: the median of each "
          "round's measured / untraced; ours+cpu / tp+cpu: extra "
          "process CPU of the update over untraced; end/exit: closing and writing; all: the "
          "two together; noncap: "
          "updates under a profile whose capture is ahead; adjacent: the updates just before "
          "and after the captured one)")


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    names = sys.argv[2:] or WORKLOADS
    print_summary(run(rounds, names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
