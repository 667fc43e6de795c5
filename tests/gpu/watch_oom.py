#!/usr/bin/env python3
"""A real out-of-memory inside an update under ``candle_trace.torch.watch`` (issue 13), and
its checks: tests/gpu/run.sh step 3c runs it on CUDA.

    python3 tests/gpu/watch_oom.py OUT [--device cuda:0|cpu]

Runs the ``alloc-oom`` loop of examples/python/watch_failures.py into OUT (traces/,
summary.json): the forward of update 15 asks for twice the GPU's memory (a batch too large
for it), and torch.cuda.OutOfMemoryError ends the loop. Checks that the watch kept exactly
``update-000015-exception.jsonl``: a failed trace whose reason names the OOM, with the ops
up to the failure (fc1's addmm and relu; fc2 never ran), a device_memory sample of torch's
caching allocator for the device (CUDA), judged structurally valid by candle-graph
(CANDLE_GRAPH, when present); and that the whole-run summary lists the exception firing
with that trace. With ``--device cpu`` the same loop meets the CPU allocator's refusal of
2^60 bytes instead (bindings/python/tests/test_torch_watch.py runs it so, to know this
script works without a GPU): there is no caching allocator to sample, which it says.
Prints one ok/FAIL line per check; exits 1 when one failed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "python"))

import watch_failures  # noqa: E402

TRACE = "update-000015-exception.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda:0")
    a = ap.parse_args()
    out = Path(a.out)
    cuda = a.device.startswith("cuda")
    failed = 0

    def check(ok: bool, what: str) -> None:
        nonlocal failed
        print(("ok    " if ok else "FAIL  ") + "watch OOM: " + what, flush=True)
        failed += not ok

    r = watch_failures.run("alloc-oom", str(out / "traces"), aggregate=str(out / "summary.json"),
                           device=a.device)
    oom = "CUDA out of memory" if cuda else "can't allocate memory"
    error = r["error"] or ""
    check(oom in error, f"the loop ended with the allocator's error ({error[:120]!r})")
    check(r["traces"] == [TRACE], f"exactly {TRACE} kept (got {r['traces']})")
    path = out / "traces" / TRACE
    if not path.exists():
        return 1
    ev = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    term = ev[-1]
    check(term.get("kind") == "terminal" and term.get("outcome") == "failed"
          and oom in term.get("reason", ""), f"failed, the reason names the OOM ({term.get('reason', '')[:120]!r})")
    check(ev[0].get("capture_step") == 15 and ev[0].get("device") == a.device,
          f"update 15 on {a.device} (meta: capture_step {ev[0].get('capture_step')}, device {ev[0].get('device')})")
    ops = {e["op_name"] for e in ev if e["kind"] == "op"}
    check({"aten::addmm", "aten::relu"} <= ops, f"the ops up to the failure: {sorted(ops)[:8]}")
    fwd = {e["name"] for e in ev if e["kind"] == "span_start" and e.get("step") == "forward"}
    check("fc1" in fwd and "fc2" not in fwd, f"forward reached fc1, never fc2 (modules {sorted(fwd)})")
    if cuda:
        mem = [e for e in ev if e["kind"] == "device_memory" and e["device"] == a.device]
        check(bool(mem) and all(e.get("used_bytes", 0) > 0 for e in mem),
              f"{len(mem)} sample(s) of torch's caching allocator for {a.device}, used "
              f"{[e.get('used_bytes') for e in mem][:3]} bytes")
    else:
        print("note  watch OOM: the caching allocator's sample is CUDA's; on cpu, the memory records:")
        check(any(e["kind"] == "memory" for e in ev), "memory records of the ops before the failure")
    summary = json.loads((out / "summary.json").read_text())
    fired = summary.get("triggers", {}).get("fired", [])
    check([(f["update"], f["trigger"], os.path.basename(f["trace"])) for f in fired] == [(15, "exception", TRACE)],
          f"the summary lists the exception at update 15 with its trace ({fired})")
    cg = os.environ.get("CANDLE_GRAPH", str(ROOT / "build" / "tools" / "bin" / "candle-graph"))
    if os.access(cg, os.X_OK):
        with tempfile.TemporaryDirectory() as d:
            shutil.copy(path, os.path.join(d, "trace.jsonl"))
            p = subprocess.run([cg, "summary", "trace.jsonl"], cwd=d, capture_output=True, text=True, timeout=120)
        try:
            h = json.loads(p.stdout)["health"]
            check(h["structurally_valid"] and not h["capture_complete"],
                  "candle-graph: structurally valid, capture failed")
        except (ValueError, KeyError) as e:
            check(False, f"candle-graph summary unreadable ({e}): {p.stderr[:300]}")
    else:
        print(f"note  watch OOM: candle-graph not found at {cg}: validity not checked")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
