#!/usr/bin/env python3
"""Real programs on CUDA: tests/gpu/run.sh step 3e. Two of them, each judged against its
own truth:

1. ``candle-trace run -- python tests/python/programs/char_gpt.py --device cuda:0`` --
   the char GPT nobody instrumented (embeddings, attention, a layer it never calls, a
   branch taken on even updates, no_grad evaluations): the trace of update 3 is complete
   and valid for candle-graph, its gradients are the program's own (``p.grad`` norms,
   written by the program), its backward module spans -- opened on autograd's CUDA
   thread -- are there with kernels on them, and CUPTI's warm-up span precedes the
   update.
2. a ``torch.compile``'d MLP under ``candle_trace.torch.profile`` on CUDA: the training
   loop runs as it does without the profiler, the trace is complete and valid, and the
   compiled graph's generated kernels are in it (Triton's as device intervals; on the
   CPU, the C++ ones as ops).

    python3 tests/gpu/programs.py OUT [--device cuda:0|cpu]

(``--device cpu`` runs the same programs and the checks that hold there -- no kernels,
no CUPTI -- to try this script without a GPU.)

Prints one ok/FAIL line per check; exits 1 when one failed. The same GPT runs on the CPU
in bindings/python/tests/test_run.py.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "build" / "candle-trace"
GRAPH = os.environ.get("CANDLE_GRAPH") or str(ROOT / "build" / "tools" / "bin" / "candle-graph")
failed = 0


def check(ok: bool, what: str) -> None:
    global failed
    print(f"{'ok   ' if ok else 'FAIL '} programs: {what}", flush=True)
    failed += not ok


def valid(trace: Path) -> str:
    """candle-graph's verdict on the trace alone in a fresh folder ('' when valid)."""
    if not (shutil.which(GRAPH) or os.access(GRAPH, os.X_OK)):
        return ""
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(trace, Path(d) / "trace.jsonl")
        r = subprocess.run([GRAPH, "summary", "trace.jsonl", "--require-valid"], cwd=d,
                           capture_output=True, text=True, timeout=120)
        return "" if r.returncode == 0 else (r.stderr or r.stdout)[:300]


def spans_by_id(lines: list) -> dict:
    return {e["id"]: e for e in lines if e["kind"] == "span_start"}


def char_gpt(out: Path, device: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANDLE_TRACE_") and k != "PYTHONPATH"}
    norms = out / "norms.jsonl"
    env["CHAR_GPT_GRAD_NORMS"] = str(norms)
    r = subprocess.run([str(RUNNER), "run", "--output", str(out / "gpt-%p.jsonl"), "--", sys.executable,
                        str(ROOT / "tests" / "python" / "programs" / "char_gpt.py"), "--device", device,
                        "--updates", "6"], capture_output=True, text=True, timeout=240, env=env, cwd=out)
    check(r.returncode == 0 and "trained 6 updates" in r.stdout,
          f"candle-trace run on the char GPT ({device}) exits 0 (rc {r.returncode}; {r.stderr[-300:]!r})")
    traces = sorted(out.glob("gpt-*.jsonl"))
    check(len(traces) == 1, f"one trace ({[t.name for t in traces]})")
    if len(traces) != 1:
        return
    lines = [json.loads(x) for x in traces[0].read_text().splitlines()]
    term = lines[-1]
    check(term.get("outcome") == "complete", f"the GPT's trace is complete ({term})")
    why = valid(traces[0])
    check(why == "", f"the GPT's trace: candle-graph --require-valid {why}")
    want = {}
    for line in norms.read_text().splitlines():
        rec = json.loads(line)
        if rec["update"] == lines[0].get("capture_step"):
            want = rec["norms"]
    grads = {g["key"]: g for g in lines if g["kind"] == "gradient"}
    wrong = [k for k, v in want.items()
             if (v is None and grads.get(k, {}).get("state") != "missing") or
             (v is not None and not (grads.get(k, {}).get("state") == "present" and
                                     math.isclose(grads[k]["norm"], v, rel_tol=1e-5)))]
    check(bool(want) and set(grads) == set(want) and not wrong,
          f"its {len(grads)} gradients are the program's p.grad norms of update "
          f"{lines[0].get('capture_step')} (differ: {wrong[:4]})")
    spans = spans_by_id(lines)
    bwd = {i for i, s in spans.items() if s.get("span_kind") == "module" and s.get("step") == "backward"}
    kernels = [e for e in lines if e["kind"] == "device_interval" and e.get("name")]
    on_bwd = sum(1 for e in kernels if e["span_id"] in bwd)
    cuda = device.startswith("cuda")
    check(len(bwd) >= 5 and (on_bwd > 0 or not cuda),
          f"{len(bwd)} backward module spans (on CUDA autograd's thread), {on_bwd} of {len(kernels)} kernels on them")
    threads = {spans[i].get("tid") for i in bwd} - {None}
    fwd_threads = {s.get("tid") for s in spans.values()
                   if s.get("span_kind") == "module" and s.get("step") == "forward"} - {None}
    print(f"      programs: backward module spans on threads {sorted(threads)}, forward on {sorted(fwd_threads)}")
    warm = [s for s in spans.values() if s.get("name") == "candle_trace/cupti_warmup"]
    upd = next((s for s in spans.values() if s.get("name") == "update"), None)
    if cuda:
        check(len(warm) == 1 and upd is not None and warm[0]["start_ns"] < upd["start_ns"],
              "CUPTI's warm-up span precedes the update")
        samples = [e for e in lines if e["kind"] == "device_memory" and e.get("device") == device]
        check(len(samples) >= 2, f"{len(samples)} samples of torch's caching allocator on {device}")


COMPILED = r"""
import sys, torch
from torch import nn
sys.path.insert(0, sys.argv[2])
import candle_trace.torch as ctt
torch.manual_seed(0)
dev = sys.argv[3]
model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256), nn.LayerNorm(256)).to(dev)
cm = torch.compile(model)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(64, 256, device=dev)
losses = []
with ctt.profile(cm, opt, sys.argv[1], capture_step=3) as prof:
    for _ in range(4):
        opt.zero_grad(set_to_none=True)
        loss = cm(x).square().mean()
        loss.backward()
        opt.step()
        prof.step()
        losses.append(loss.item())
print("losses", losses, prof.op_mechanism, flush=True)
"""


def compiled(out: Path, device: str) -> None:
    trace = out / "compiled.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "bindings" / "python"))
    r = subprocess.run([sys.executable, "-c", COMPILED, str(trace), str(ROOT / "bindings" / "python"),
                        device],
                       capture_output=True, text=True, timeout=240, env=env)
    check(r.returncode == 0 and "losses" in r.stdout,
          f"a torch.compile'd model's loop under profile ({device}) exits 0 (rc {r.returncode}; {r.stderr[-300:]!r})")
    if not trace.exists():
        check(False, "the compiled model's trace written")
        return
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    check(lines[-1].get("outcome") == "complete", f"the compiled model's trace is complete ({lines[-1]})")
    why = valid(trace)
    check(why == "", f"the compiled model's trace: candle-graph --require-valid {why}")
    kernels = [e["name"] for e in lines if e["kind"] == "device_interval" and e.get("name")]
    triton = [k for k in kernels if "triton" in k]
    ops = sorted({e["op_name"] for e in lines if e["kind"] == "op"})
    opless = [e for e in lines if e["kind"] == "memory" and e["action"] == "alloc"
              and e["tensor_id"].startswith("m") and e["device"].startswith(device.split(":")[0])]
    check(len(opless) > 0, f"{len(opless)} buffers the compiled graphs allocated with no op are in "
                           f"the trace's memory ({sum(e['bytes'] for e in opless)} bytes)")
    if device.startswith("cuda"):
        check(len(triton) > 0, f"{len(triton)} of {len(kernels)} kernels generated by inductor (e.g. {triton[:2]})")
    else:
        cpp = [o for o in ops if "cpp_fused" in o]
        check(len(cpp) > 0, f"{len(cpp)} of {len(ops)} distinct ops are inductor's C++ kernels (e.g. {cpp[:2]})")
    print(f"      programs: compiled model: {len(ops)} distinct ops, e.g. {ops[:6]}")


def main() -> int:
    out = Path(sys.argv[1])
    device = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--device" else "cuda:0"
    out.mkdir(parents=True, exist_ok=True)
    char_gpt(out, device)
    compiled(out, device)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
