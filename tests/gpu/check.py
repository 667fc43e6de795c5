#!/usr/bin/env python3
"""The checks of the GPU check (tests/gpu/run.sh, step 5), on its output folder.

    python3 tests/gpu/check.py OUT

OUT holds step.jsonl (one CUDA training step traced through the Python
binding with ct_device_start), step.json ({"event_ms": the same step timed by
torch.cuda.Event, "cupti": whether the CUPTI collector ran, "cupti_error"})
and dropin-*.jsonl (an uninstrumented script under the drop-in). Prints one
"ok"/"FAIL" line per check and the figures worth reporting; exits 1 when a
check failed. A separate file so that the checks themselves are tested on
machines without a GPU (tests/python/test_gpu_check.py, with the fakes).
"""
from __future__ import annotations

import glob
import json
import os
import statistics
import sys
from typing import Any, Callable

Event = dict[str, Any]


def check_trace(name: str, ev: list[Event], rep: dict[str, Any], check: Callable[[bool, str], None]) -> None:
    term = ev[-1]
    check(term.get("kind") == "terminal" and term.get("outcome") == "complete", f"{name}: complete")
    if name == "profile.jsonl":
        check_profile(ev, rep, check)
        return
    mem = [e for e in ev if e["kind"] == "device_memory" and e["device"] == "cuda:0"]
    check(len(mem) >= 3, f"{name}: {len(mem)} device_memory samples of cuda:0 (>= 3)")
    # Before the process has a CUDA context the device may hold nothing: NVML's v2 "used"
    # excludes what the driver reserves, and the drop-in samples from the interpreter's
    # start, seconds before `import torch` ends (0 there, truthfully). From the first
    # device interval on, the process's context is in it.
    ivs_all = [e for e in ev if e["kind"] == "device_interval"]
    since = min((e["start_ns"] for e in ivs_all), default=0)
    bad = [e for e in mem if not e.get("capacity_bytes", 0) > 0 or
           (e["timestamp_ns"] >= since and not e.get("used_bytes", 0) > 0)]
    early = sum(1 for e in mem if e["timestamp_ns"] < since)
    check(not bad, f"{name}: capacity > 0, used > 0 from the first kernel on "
          f"({len(mem) - early} samples; {early} before it)" +
          (f": {len(bad)} not, e.g. {bad[:2]}" if bad else ""))
    q = sorted(e["extra"]["nvml_query_ns"] for e in mem if "nvml_query_ns" in e.get("extra", {}))
    if q:
        print(f"      NVML cost per sample (one device): median {statistics.median(q) / 1000:.1f} us, "
              f"max {q[-1] / 1000:.1f} us over {len(q)} samples")
    if not rep["cupti"]:
        return
    spans = {e["id"] for e in ev if e["kind"] == "span_start"}
    ivs = [e for e in ev if e["kind"] == "device_interval"]
    kernels = [e for e in ivs if e.get("name")]
    check(len(kernels) > 0, f"{name}: {len(kernels)} named device intervals")
    check(all(0 <= e["start_ns"] and e["start_ns"] + e["duration_ns"] <= term["timestamp_ns"] for e in ivs),
          f"{name}: every device interval inside the session")
    check(all(e["span_id"] in spans for e in ivs), f"{name}: every device interval attributed to an existing span")
    dropped = [e for e in ev if e["kind"] == "tensor_stats" and e.get("label") == "cupti/dropped_records"]
    check(len(dropped) >= 1, f"{name}: dropped records stated ({dropped[-1]['mean'] if dropped else 'none'})")
    mangled = [e["name"] for e in kernels if e["name"].startswith("_Z")]
    example = kernels[0]["name"][:80] if kernels else "-"
    check(len(mangled) <= len(kernels) // 10,
          f"{name}: kernel names demangled ({len(kernels) - len(mangled)} of {len(kernels)}; e.g. {example})")
    streams = sorted({e["stream_id"] for e in ivs})
    print(f"      {len(ivs)} device intervals ({len(kernels)} named) on streams {streams[:8]}")
    if name != "step.jsonl":
        return
    by_name = {e["name"]: e["id"] for e in ev if e["kind"] == "span_start"}
    # Autograd launches CUDA backward kernels from its own device thread,
    # where no span is open: with "unspanned_launches":"main_thread" (run.sh
    # asks for it) they go to the main thread's innermost span, backward.
    for phase in ("forward", "backward", "optimizer"):
        n = sum(1 for e in kernels if e["span_id"] == by_name.get(phase))
        check(n > 0, f"step: {n} kernels attributed to the {phase} span")
    n_root = sum(1 for e in kernels if e["span_id"] == "s1")
    print(f"      kernels on the root s1: {n_root}")
    upd = next((e for e in ev if e["kind"] == "span_start" and e.get("name") == "update"), None)
    end = next((e for e in ev if upd and e["kind"] == "span_end" and e["id"] == upd["id"]), None)
    if upd is None or end is None:
        check(False, "step: the measured region update is in the trace")
        return
    lo, hi = upd["start_ns"], upd["start_ns"] + end["duration_ns"]
    inside = [e for e in ivs if lo <= e["start_ns"] < hi]
    if not inside:
        check(False, "step: device intervals inside the update")
        return
    first = min(e["start_ns"] for e in inside)
    last = max(e["start_ns"] + e["duration_ns"] for e in inside)
    dev_ms = (last - first) / 1e6
    ev_ms = rep["traced_event_ms"]
    check(abs(dev_ms - ev_ms) <= 0.10 * ev_ms,
          f"step: device time {dev_ms:.3f} ms vs torch.cuda.Event {ev_ms:.3f} ms on that step (±10%)")
    print(f"      step: untraced {rep['event_ms']:.3f} ms, traced {ev_ms:.3f} ms "
          f"({ev_ms / rep['event_ms']:.2f}x), the first after ct_device_start "
          f"{rep['first_event_ms']:.3f} ms ({rep['first_event_ms'] / rep['event_ms']:.2f}x: "
          f"CUPTI's first launch per thread), by CUDA events")


def check_profile(ev: list[Event], rep: dict[str, Any], check: Callable[[bool, str], None]) -> None:
    """profile.jsonl: candle_trace.torch.profile's captured update with its default
    device_collect (CUPTI on CUDA): the update's kernels on the module spans that
    launched them, backward's too (autograd's thread, main-thread fallback)."""
    if not rep["cupti"]:
        return
    spans = {e["id"]: e for e in ev if e["kind"] == "span_start"}
    kernels = [e for e in ev if e["kind"] == "device_interval" and e.get("name")]
    check(len(kernels) > 0, f"profile: {len(kernels)} named device intervals")
    check(all(e["span_id"] in spans for e in kernels), "profile: every device interval attributed to an existing span")
    for step in ("forward", "backward", "optimizer"):
        n = sum(1 for e in kernels if spans.get(e["span_id"], {}).get("step") == step)
        check(n > 0, f"profile: {n} kernels on {step} spans")
    warm = [e for e in spans.values() if e.get("name") == "candle_trace/cupti_warmup"]
    upd = next((e for e in spans.values() if e.get("name") == "update"), None)
    n_warm = sum(1 for e in kernels if warm and e["span_id"] == warm[0]["id"])
    check(len(warm) == 1 and n_warm > 0 and upd is not None and warm[0]["start_ns"] < upd["start_ns"],
          f"profile: CUPTI's warm-up span before the update, {n_warm} kernels on it")
    on_modules = sum(1 for e in kernels if spans.get(e["span_id"], {}).get("span_kind") == "module")
    n_root = sum(1 for e in kernels if e["span_id"] == "s1")
    print(f"      profile: {on_modules} of {len(kernels)} kernels on module spans, {n_root} on the root s1")


def main(out: str) -> int:
    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        print(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    with open(os.path.join(out, "step.json")) as f:
        rep = json.load(f)
    paths = [os.path.join(out, "step.jsonl")] + sorted(glob.glob(os.path.join(out, "dropin-*.jsonl")))
    check(len(paths) >= 2, f"{len(paths) - 1} drop-in trace(s)")
    if os.path.exists(os.path.join(out, "profile.jsonl")):
        paths.append(os.path.join(out, "profile.jsonl"))
    for path in paths:
        with open(path) as f:
            ev = [json.loads(line) for line in f]
        check_trace(os.path.basename(path), ev, rep, check)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
