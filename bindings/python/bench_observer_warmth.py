"""What an observed update pays per record function when the updates before it ran
without the op observer, and what the rehearsal (``Capture.prepare``: the update before
the captured one runs with the observer on, its records dropped) gives back.

    PYTHONPATH=bindings/python /usr/bin/python3 bindings/python/bench_observer_warmth.py [ROUNDS] [WORKLOAD...]

WORKLOAD: one of examples/python/workloads.py's (default mlp and gpt-b1), or
``calibration``, the miniature step the calibration times twenty in a row.

One thread. Per round, for each K in 0, 1, 5 (unobserved updates before the observed one,
run untimed), in a rotating order: K updates without the observer, then

- ``off``: one update timed without the observer (the workload's own time);
- ``cold``: K more updates without it, then one update observed, timed on the clock of a
  private session of the library that leaves the observer's intervals out (as a capture's
  measured region does; no calibrated backdating);
- ``rehearsed``: K more updates without it, one update observed and dropped, then one
  observed and timed as ``cold``.

Per record function: (observed - off) / record functions the observer saw, medians over
the rounds. The calibration the capture backdates by (``Observer.calibrate``) is printed
beside it: what is left above it is counted as the model's time in a capture.
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

import torch  # noqa: E402

from candle_trace.session import Session  # noqa: E402
from candle_trace.torch import _observer  # noqa: E402

import workloads  # noqa: E402

KS = (0, 1, 5)


def _workload(name: str):
    w = workloads.WORKLOADS[name]()
    x, y = w.batch()
    return lambda: w.update(x, y)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    names = sys.argv[2:] or ["mlp", "gpt-b1"]
    torch.set_num_threads(1)
    obs = _observer.get()
    if obs is None:
        sys.exit("bench_observer_warmth: the C++ op observer is unavailable here")
    calibrated = obs.calibrate()
    nobody = obs.named([])
    count = obs._dll.ct_obs_count_intervals
    print(f"torch {torch.__version__}, calibration {calibrated} ns per record function")
    print(f"  {'workload':8s} {'K':>2s} {'RFs':>5s} {'off':>9s} {'cold/RF':>8s} {'rehearsed/RF':>12s}")
    with tempfile.TemporaryDirectory(prefix="candle_trace-warmth-") as tmp:
        s = Session(os.path.join(tmp, "w.jsonl"), "warmth", "train", 1, "cpu",
                    run={"buffer": {"max_bytes": 1 << 24}})
        now, hc = s._lib.raw.ct_now_ns, s._hc
        try:
            for name in names:
                update = _observer.miniature_step() if name == "calibration" else _workload(name)

                def observed(clock, *arg) -> tuple:
                    obs.begin(s.handle, 1, True, nobody, earlier_ns=0)
                    try:
                        count(1)
                        t = clock(*arg)
                        update()
                        dt = clock(*arg) - t
                        seen = count(0)
                    finally:
                        obs.stop()
                        obs.discard()
                    return dt, seen

                for _ in range(5):
                    update()
                per = {k: {"off": [], "cold": [], "rehearsed": []} for k in KS}
                rfs = 0
                for r in range(rounds):
                    for k in KS[r % len(KS):] + KS[:r % len(KS)]:
                        for _ in range(k):
                            update()
                        t = time.perf_counter_ns()
                        update()
                        per[k]["off"].append(time.perf_counter_ns() - t)
                        for _ in range(k):
                            update()
                        dt, seen = observed(now, hc)
                        per[k]["cold"].append(dt)
                        for _ in range(k):
                            update()
                        observed(now, hc)  # the rehearsal, dropped
                        dt, seen = observed(now, hc)
                        per[k]["rehearsed"].append(dt)
                        rfs = seen // 2  # two intervals per record function
                for k in KS:
                    off = statistics.median(per[k]["off"])
                    cold = (statistics.median(per[k]["cold"]) - off) / max(rfs, 1)
                    warm = (statistics.median(per[k]["rehearsed"]) - off) / max(rfs, 1)
                    print(f"  {name:8s} {k:2d} {rfs:5d} {off / 1e3:7.1f}us {cold:6.0f}ns {warm:10.0f}ns")
        finally:
            s.discard()


if __name__ == "__main__":
    main()
