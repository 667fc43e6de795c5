#!/usr/bin/env python3
"""candle_trace.torch.profile around a torch.compile'd GPT-style model (torch >= 2.0).

    python compile_repro.py [--no-profile] [--no-compile] [--backend inductor|eager|aot_eager] [--steps N]
        [--capture-step N] [--trace PATH] [--rf-names] [--recompile-at N]
        [--watch FOLDER [--aggregate PATH]]

Trains a 2-block GPT (token embedding, causal self-attention, MLP, LayerNorm) compiled
with ``torch.compile`` for ``--steps`` AdamW updates under ``candle_trace.torch.profile``
(capture_step 3 by default), one thread, and prints one JSON line: the outcome (or the
exception and the profiler's frames dynamo was tracing), dynamo's counters (graph breaks
with their reasons, frames, unique graphs), the functions of candle_trace whose bytecode
dynamo traced (its trace_source log), the time of each update and, from the trace, the
spans and op names the op capture recorded in the captured update. ``--rf-names`` adds
every RecordFunction (name, count, scope) of one more update, as torch.profiler sees them.
test_torch_compile.py runs it.

The profiler keeps its own work out of dynamo's way (its wrappers and hooks under
torch.compiler.disable; one span for a compiled module, none inside it): the run must
compile once, with no graph break, and give a complete trace.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import logging
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import candle_trace.torch as ctt  # noqa: E402

# torch.compile as a script that wrote `from torch import compile` holds it: taken before
# any profile exists, so it is torch's own function, never the tracer's (--compile-by)
compile_taken_early = getattr(torch, "compile", None)


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int = 128, d: int = 64, heads: int = 4, layers: int = 2,
                 ctx: int = 32) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(1, ctx, d))
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[:, : idx.shape[1]]
        return self.head(self.ln_f(self.blocks(x)))


# -- which profiler functions dynamo traced -------------------------------------------

class _TraceSourceLog(logging.Handler):
    """Collects, from dynamo's trace_source log, the functions of candle_trace.torch
    whose bytecode dynamo symbolically ran (traced into a graph) and how many lines."""

    PAT = re.compile(r"TRACE starts_line (\S+):(\d+) in (\S+)")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.functions: collections.Counter = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        m = self.PAT.search(record.getMessage())
        if m and "candle_trace" in m.group(1):
            self.functions[f"{Path(m.group(1)).parent.name}/{Path(m.group(1)).name}:{m.group(3)}"] += 1


def watch_dynamo() -> _TraceSourceLog:
    torch._logging.set_logs(trace_source=True)
    h = _TraceSourceLog()
    from torch._logging._internal import log_registry
    for qname in log_registry.get_log_qnames():  # each has its own stderr handler
        lg = logging.getLogger(qname)
        for old in list(lg.handlers):  # keep the (long) log off stderr
            lg.removeHandler(old)
        lg.addHandler(h)
    return h


def summarize(trace: str) -> dict:
    """What a test checks of one trace: its outcome, ops, spans, gradients."""
    lines = [json.loads(ln) for ln in open(trace) if ln.strip()]
    spans = {e["id"]: e for e in lines if e["kind"] == "span_start"}
    ends = {e["id"]: e for e in lines if e["kind"] == "span_end"}
    ops = [e for e in lines if e["kind"] == "op"]
    names = collections.Counter(e["op_name"] for e in ops)
    compiles = [s for s in spans.values() if s["name"].startswith("torch.compile")]
    return {
        "path": trace,
        "outcome": lines[-1].get("outcome"),
        "ops": len(ops),
        "op_names": dict(names.most_common(40)),
        "op_counts": dict(names),
        "op_devices": dict(collections.Counter(e["device"] for e in ops)),
        # torch.compile's spans: name, duration, the ops recorded inside (ops name their
        # innermost span)
        "compiles": [[s["name"], ends[s["id"]]["duration_ns"],
                      sum(1 for e in ops if e["span_id"] == s["id"])] for s in compiles],
        "spans": collections.Counter(f'{s.get("step")}:{s["name"]}' for s in spans.values()
                                     ).most_common(),
        "gradients": collections.Counter(e["state"] for e in lines if e["kind"] == "gradient"),
        "alloc_bytes": sum(e["bytes"] for e in lines
                           if e["kind"] == "memory" and e["action"] == "alloc"),
        # storages no op allocated (a compiled graph's buffers): tensor, dtype, shape, bytes
        "opless_allocs": [[e["tensor_id"], e["dtype"], e.get("shape", []), e["bytes"]]
                          for e in lines if e["kind"] == "memory" and e["action"] == "alloc"
                          and "op_name" not in e],
    }


# -- the run ---------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--capture-step", type=int, default=3)
    ap.add_argument("--trace", default=None)
    ap.add_argument("--whole-step", action="store_true",
                    help="compile the whole update (zero_grad, forward, backward, the "
                         "optimizer's step), not the model: the capture's wrappers of "
                         "backward and the step are then called from compiled code")
    ap.add_argument("--rf-names", action="store_true",
                    help="after the loop, list every RecordFunction of one more update "
                         "(torch.profiler, all scopes)")
    ap.add_argument("--recompile-at", type=int, default=0,
                    help="from this update (1-based) on, batches of 4 instead of 8: dynamo "
                         "compiles the model again (a smaller last batch's recompilation)")
    ap.add_argument("--watch", default=None, metavar="FOLDER",
                    help="run the updates under candle_trace.torch.watch (into FOLDER) "
                         "instead of a profile")
    ap.add_argument("--aggregate", default=None, metavar="PATH",
                    help="with --watch: its whole-run summary, written to PATH")
    ap.add_argument("--profile-first", action="store_true",
                    help="make the profile of the plain model before it is compiled "
                         "(nanoGPT's order under candle-trace run: the optimizer, then "
                         "torch.compile)")
    ap.add_argument("--in-place", action="store_true",
                    help="compile with torch's method, model.compile(), which compiles the "
                         "module's call in place (no OptimizedModule)")
    ap.add_argument("--compile-by", default="torch.compile",
                    choices=["torch.compile", "taken-early", "dynamo.optimize"],
                    help="how the model is compiled: torch.compile looked up at the call; "
                         "the function taken at import (`from torch import compile`); "
                         "torch._dynamo.optimize(backend)(model)")
    ap.add_argument("--infer", action="store_true",
                    help="the profile, made first (as --profile-first), is for inference "
                         "(phase infer, no optimizer): made before anything imports "
                         "inductor's config")
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)  # 2 shared cores: OpenMP spinning makes timings erratic
    watch = watch_dynamo() if not os.environ.get("TORCH_LOGS") else _TraceSourceLog()

    model = GPT()
    trace = args.trace or os.path.join(tempfile.mkdtemp(prefix="compile-repro-"), "gpt.jsonl")
    early = None
    if args.infer:
        model.eval()
        opt = None
        out_early = {"inductor_config_at_profile": "torch._inductor.config" in sys.modules}
        early = ctt.profile(model, None, trace, capture_step=args.capture_step, phase="infer")
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        out_early = {}
        if args.profile_first:
            early = ctt.profile(model, opt, trace, capture_step=args.capture_step)
    if not args.no_compile and not args.whole_step:
        if args.in_place:
            model.compile(backend=args.backend)
        elif args.compile_by == "taken-early":
            model = compile_taken_early(model, backend=args.backend)
        elif args.compile_by == "dynamo.optimize":
            from torch import _dynamo
            model = _dynamo.optimize(args.backend)(model)
        else:
            model = torch.compile(model, backend=args.backend)

    from torch._dynamo.utils import counters
    counters.clear()
    times = []
    out = {"torch": torch.__version__, "backend": args.backend,
           "profile": not args.no_profile, "compiled": not args.no_compile, **out_early}

    def train_step(idx: torch.Tensor, tgt: torch.Tensor) -> None:
        if opt is None:  # --infer
            with torch.no_grad():
                model(idx)
            return
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(idx).flatten(0, 1), tgt.flatten())
        loss.backward()
        opt.step()

    if args.whole_step and not args.no_compile:
        train_step = torch.compile(train_step, backend=args.backend)

    def update(i: int) -> None:
        b = 4 if args.recompile_at and i + 1 >= args.recompile_at else 8
        train_step(torch.randint(0, 128, (b, 32)), torch.randint(0, 128, (b, 32)))

    try:
        if args.watch:
            with ctt.watch(model, opt, args.watch, max_traces=10,
                           aggregate_path=args.aggregate) as w:
                for i in range(args.steps):
                    update(i)
                    w.step()
            out["fired"] = [[f.update, f.trigger, f.detail] for f in w.fired]
            out["traces"] = {name: summarize(os.path.join(args.watch, name))
                             for name in sorted(os.listdir(args.watch))}
        elif args.no_profile:
            for i in range(args.steps):
                t0 = time.perf_counter()
                update(i)
                times.append(time.perf_counter() - t0)
        else:
            with early if early is not None else ctt.profile(
                    model, opt, trace, capture_step=args.capture_step) as prof:
                for i in range(args.steps):
                    t0 = time.perf_counter()
                    update(i)
                    prof.step()
                    times.append(time.perf_counter() - t0)
            out["op_mechanism"] = prof.op_mechanism
        out["outcome"] = "ok"
    except Exception as e:  # noqa: BLE001 - reported
        out["outcome"] = "error"
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        tb = traceback.extract_tb(e.__traceback__)
        out["where"] = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in tb][-6:]
        # the innermost user frames dynamo was tracing
        msg = str(e)
        out["from_user_code"] = [ln.strip() for ln in msg.splitlines()
                                 if "__init__.py" in ln or "candle_trace" in ln][:8]

    out["times_s"] = [round(t, 4) for t in times]
    out["dynamo"] = {
        "graph_breaks": sum(counters["graph_break"].values()),
        "graph_break_reasons": dict(collections.Counter(
            {k[:160]: v for k, v in counters["graph_break"].items()}).most_common(8)),
        "unique_graphs": counters["stats"].get("unique_graphs", 0),
        "frames_calls_captured": counters["stats"].get("calls_captured", 0),
        "frames_ok": counters["frames"].get("ok", 0),
        "frames_total": counters["frames"].get("total", 0),
        "recompiles": sum(v for k, v in counters["recompiles"].items()) if "recompiles" in counters else 0,
    }
    out["candle_trace_functions_traced_by_dynamo"] = dict(watch.functions)
    inductor_config = sys.modules.get("torch._inductor.config")
    if inductor_config is not None:  # the capture puts it back as it found it
        out["kernel_profile_after"] = inductor_config.cpp.enable_kernel_profile
    if out["outcome"] == "ok" and not args.no_profile and not args.watch and os.path.exists(trace):
        out["trace"] = summarize(trace)
    if args.rf_names and out["outcome"] == "ok":
        from torch.profiler import ProfilerActivity, profile as tprofile
        with tprofile(activities=[ProfilerActivity.CPU], profile_memory=True) as tp:
            update(args.steps)
        names = collections.Counter()
        scopes = {}
        for ev in tp.events():
            names[ev.name] += 1
            scopes[ev.name] = getattr(ev, "scope", None)
        # at::RecordScope: 0 FUNCTION (the observer's), 1 BACKWARD_FUNCTION,
        # 2 TORCHSCRIPT_FUNCTION, 3 KERNEL_FUNCTION_DTYPE, 4 CUSTOM_CLASS, 5 BUILD_FEATURE,
        # 6 LITE_INTERPRETER, 7 USER_SCOPE
        scope_names = {0: "FUNCTION", 1: "BACKWARD_FUNCTION", 7: "USER_SCOPE"}
        out["record_functions"] = {
            "aten": sum(v for k, v in names.items() if k.startswith("aten::")),
            "not_aten": {k: f"{v}x {scope_names.get(scopes[k], scopes[k])}"
                         for k, v in sorted(names.items()) if not k.startswith("aten::")},
            "aten_names": sorted(k for k in names if k.startswith("aten::")),
        }
        # every allocation torch.profiler saw (the op-less ones too), in bytes
        out["profiler_alloc_bytes"] = sum(
            e.nbytes() for e in tp.profiler.kineto_results.events()
            if e.name() == "[memory]" and e.nbytes() > 0)
    print(json.dumps(out, default=str))
    return 0 if out["outcome"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
