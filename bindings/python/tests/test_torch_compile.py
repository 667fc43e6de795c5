"""candle_trace.torch.profile around a torch.compile'd model (torch >= 2.0): compile_repro.py
in a child process, which prints one JSON line (outcome, dynamo's counters, the trace)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, candle_graph, observer_expected, validate

torch = pytest.importorskip("torch")
if not hasattr(torch, "compile"):
    pytest.skip("torch.compile needs torch >= 2.0", allow_module_level=True)

REPRO = Path(__file__).resolve().parent / "compile_repro.py"


def child_env(**extra: str) -> dict:
    """This environment for a child Python: the interpreter's bin first (the C compiler
    inductor finds beside it), no inductor worker pool on 2 cores."""
    env = dict(os.environ, **extra)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    return env


def repro(tmp_path, *args: str, cold: bool = False) -> dict:
    """compile_repro.py's JSON line. ``cold``: with an inductor cache of its own, empty
    (what a first compile on a fresh machine does does not depend on earlier runs)."""
    env = child_env(**({"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor-cache")} if cold else {}))
    r = subprocess.run([sys.executable, str(REPRO), "--trace", str(tmp_path / "gpt.jsonl"),
                        *args], capture_output=True, text=True, timeout=600, env=env)
    assert r.stdout.strip(), f"compile_repro.py {args} printed nothing (rc {r.returncode}):\n" \
                             f"{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def check_compiled_capture(out: dict, tmp_path) -> None:
    assert out["outcome"] == "ok", out
    # compiled once, and the profiler's hooks split nothing
    assert out["dynamo"]["graph_breaks"] == 0, out["dynamo"]
    assert out["dynamo"]["unique_graphs"] == 1, out["dynamo"]
    assert out["candle_trace_functions_traced_by_dynamo"] == {}
    t = out["trace"]
    assert t["outcome"] == "complete"
    spans = dict((k, v) for k, v in t["spans"])
    assert spans.get("forward:GPT") == 1 and spans.get("backward:GPT") == 1, spans
    assert not any("_orig_mod" in k or "OptimizedModule" in k for k in spans), spans
    assert t["gradients"] == {"present": 30}
    candle_graph(t["path"], tmp_path)
    assert "OK" in validate(t["path"])


@pytest.mark.parametrize("backend,capture_step", [("eager", 3), ("inductor", 1), ("inductor", 3)])
def test_profile_of_a_compiled_model(tmp_path, backend, capture_step):
    """The profiler's wrappers and hooks run outside dynamo, and none sits inside the
    compiled module: one graph, no break, the trace complete. With inductor the observer
    sees the graph's extern kernels (and its fused C++ kernels: the test below); at
    capture step 1 the compilation itself runs inside the captured update."""
    out = repro(tmp_path, "--backend", backend, "--capture-step", str(capture_step),
                cold=capture_step == 1)
    check_compiled_capture(out, tmp_path)
    t = out["trace"]
    # dynamo's compilation is a span of its own where it ran in the update, with no op
    # inside it (its fake tensors' ops are not the model's), and none on "meta"
    assert "meta" not in t["op_devices"], t["op_devices"]
    if capture_step == 1:
        # the forward compiled at the model's first call; a backward inductor has not
        # compiled before (nothing in its cache) is compiled at its first run, a span too
        want = ["torch.compile"] + (["torch.compile (backward)"] if backend == "inductor" else [])
        assert [c[0] for c in t["compiles"]] == want, t["compiles"]
        assert all(dur > 0 and ops == 0 for _, dur, ops in t["compiles"]), t["compiles"]
    else:
        assert t["compiles"] == [], t["compiles"]
    if backend == "inductor" and observer_expected():
        assert out["op_mechanism"] == "observer"
        ops = out["trace"]["op_names"]
        assert "aten::addmm" in ops and "aten::_scaled_dot_product_flash_attention_for_cpu" in ops


#: an inductor C++ kernel's record function (torch._inductor.config.cpp.enable_kernel_profile)
KERNEL = re.compile(r"^(graph_\d+_)?cpp_")


def test_inductors_fused_kernels_are_ops_of_the_captured_update(tmp_path):
    """Inductor's generated C++ kernels (the fused layer norms, GELUs and their backwards:
    most of a compiled CPU model's work) are ops of the captured update, each as often as
    torch.profiler sees its record function in an update after the loop; the compiled
    region's wrappers are not ops. The capture sets the option that gives the kernels
    their record functions (and makes the functions they call resolvable) and puts it
    back when it ends. The buffers the compiled graphs allocate with no op are in the
    trace's memory: as many bytes allocated as torch.profiler counts, within 15%, each
    the tensor of the first op that writes its output into it where one does."""
    out = repro(tmp_path, "--backend", "inductor", "--rf-names")
    check_compiled_capture(out, tmp_path)
    # inductor needs the C++ compiler the observer is built with
    assert out["op_mechanism"] == "observer", out
    ours = {k: v for k, v in out["trace"]["op_counts"].items() if KERNEL.match(k)}
    seen = {k: int(v.split("x", 1)[0]) for k, v in out["record_functions"]["not_aten"].items()
            if KERNEL.match(k)}
    assert len(seen) >= 6, out["record_functions"]["not_aten"]  # forward and backward kernels
    assert ours == seen
    assert any("layer_norm" in k and "backward" not in k for k in ours), ours
    assert not any(k.startswith(("Torch-Compiled Region", "CompiledFunction", "##"))
                   for k in out["trace"]["op_counts"]), out["trace"]["op_counts"]
    assert out["kernel_profile_after"] is False
    # the compiled graphs' buffers, which no op allocates, are the update's memory too:
    # before, the trace held 30% of the bytes torch.profiler saw allocated
    t = out["trace"]
    assert 0.85 * out["profiler_alloc_bytes"] <= t["alloc_bytes"] <= 1.05 * out["profiler_alloc_bytes"], \
        (t["alloc_bytes"], out["profiler_alloc_bytes"])
    # a buffer an extern kernel wrote into (mm's out=) is that output's tensor; the rest
    # (the C++ kernels' buffers: no op shows their tensors) are storages of their own
    named = [a for a in t["opless_allocs"] if not a[0].startswith("m")]
    unnamed = [a for a in t["opless_allocs"] if a[0].startswith("m")]
    assert named and unnamed, t["opless_allocs"]
    assert all(d == "f32" and b >= 4 * math.prod(shape) > 0 for _, d, shape, b in named), named
    assert all(d == "unknown" and shape == [] for _, d, shape, _ in unnamed), unnamed


@pytest.mark.parametrize("phase,how", [
    ("train", ["--profile-first"]),
    ("infer", ["--profile-first", "--infer"]),
    ("train", ["--in-place"]),
    ("train", ["--in-place", "--profile-first"]),
    ("train", ["--profile-first", "--compile-by", "taken-early"]),
    ("train", ["--profile-first", "--compile-by", "dynamo.optimize"]),
], ids=["train-compiled-after", "infer-compiled-after", "module.compile", "module.compile-after",
        "from-torch-import-compile", "dynamo.optimize"])
def test_a_model_compiled_after_the_profile_is_captured_as_it_runs(tmp_path, phase, how):
    """nanoGPT's order (the optimizer, then ``model = torch.compile(model)``; what
    ``candle-trace run`` meets, opening at the first optimizer), or any profile made of
    the plain model before it is compiled: the capture stands the compiled module in for
    the plain one -- whichever way the program reached the compiler: torch.compile, a
    ``compile`` it imported before the profile existed, ``torch._dynamo.optimize``.
    Before, it wrapped the plain model's submodules for their spans, and
    their wrappers (outside dynamo) made the captured update alone run eagerly: module
    spans of every submodule, 0 inductor kernels and 5 eager layer norms where the
    program runs 14 fused kernels. For inference (no optimizer: nothing has imported
    inductor's config when the profile is made), the kernels' records are turned on at
    the compile, before their code is generated. ``module.compile()`` (compiled in place,
    no OptimizedModule) before or after the profile: its span wraps the compiled call."""
    out = repro(tmp_path, "--backend", "inductor", "--rf-names", *how)
    assert out["outcome"] == "ok", out
    assert out["dynamo"]["graph_breaks"] == 0 and out["dynamo"]["unique_graphs"] == 1, out["dynamo"]
    t = out["trace"]
    spans = dict((k, v) for k, v in t["spans"])
    if phase == "train":
        check_compiled_capture(out, tmp_path)
    else:
        assert out["inductor_config_at_profile"] is False
        assert t["outcome"] == "complete"
        assert spans.get("None:GPT [no_grad]") == 1, spans
        candle_graph(t["path"], tmp_path)
        assert "OK" in validate(t["path"])
    assert not any(k.startswith("forward:") and k != "forward:GPT" for k in spans), spans
    ours = {k: v for k, v in t["op_counts"].items() if KERNEL.match(k)}
    seen = {k: int(v.split("x", 1)[0]) for k, v in out["record_functions"]["not_aten"].items()
            if KERNEL.match(k)}
    assert len(seen) >= (6 if phase == "train" else 3), out["record_functions"]["not_aten"]
    assert ours == seen
    assert "aten::native_layer_norm" not in t["op_counts"], t["op_counts"]  # fused, not eager
    assert out["kernel_profile_after"] is False


def test_candle_trace_run_captures_a_model_compiled_after_its_optimizer(tmp_path):
    """The same order under ``candle-trace run`` (nanoGPT's: the optimizer, then
    torch.compile; the runner's capture opens at the optimizer, with the plain model):
    the captured update runs the compiled graph -- inductor's kernels, one forward span
    of the model and none inside it -- as every other update does."""
    runner = REPO / "build" / "candle-trace"
    if not runner.exists():
        pytest.fail(f"{runner} is not built (make cli)")
    env = {k: v for k, v in child_env().items() if not k.startswith("CANDLE_TRACE_")}
    r = subprocess.run([str(runner), "run", "--output", str(tmp_path / "t-%p.jsonl"), "--",
                        sys.executable, str(REPRO), "--no-profile", "--steps", "5"],
                       capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    [trace] = sorted(tmp_path.glob("t-*.jsonl"))
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    ops = [o["op_name"] for o in lines if o["kind"] == "op"]
    assert len({k for k in ops if KERNEL.match(k)}) >= 6, sorted(set(ops))
    assert "aten::native_layer_norm" not in ops
    forwards = [s["name"] for s in lines if s["kind"] == "span_start" and s.get("step") == "forward"]
    assert forwards == ["GPT"], forwards
    assert lines[-1]["outcome"] == "complete"
    candle_graph(str(trace), tmp_path)


def test_profile_of_a_compiled_training_step(tmp_path):
    """The whole update compiled (``torch.compile(train_step)``, its zero_grad, backward and
    optimizer step inside): the capture's wrappers of those are called from compiled code,
    and dynamo must break its graph there, never trace into them (the tracer's state is
    no graph's). The trace keeps the backward and the optimizer's span."""
    out = repro(tmp_path, "--backend", "eager", "--whole-step")
    assert out["outcome"] == "ok", out
    assert out["candle_trace_functions_traced_by_dynamo"] == {}, out
    t = out["trace"]
    assert t["outcome"] == "complete"
    spans = dict((k, v) for k, v in t["spans"])
    assert spans.get("forward:GPT") == 1 and spans.get("backward:backward") == 1, spans
    assert spans.get("optimizer:AdamW.step") == 1, spans
    assert t["gradients"] == {"present": 30}
    candle_graph(t["path"], tmp_path)
    assert "OK" in validate(t["path"])


def test_a_recompilation_in_the_captured_update_is_a_span_of_its_own(tmp_path):
    """A smaller batch at the captured update (an epoch's last) makes dynamo compile the
    model again inside it: the trace says so with a ``torch.compile`` span holding the
    compilation's time, and its ops are the model's alone -- the same ops, as many, as
    in a capture of an update that compiles nothing; before, the ops dynamo ran on its
    fake tensors while compiling (63 on "meta" among 133) were recorded as the model's."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "again").mkdir()
    plain = repro(tmp_path / "plain", "--backend", "eager", "--capture-step", "3")
    again = repro(tmp_path / "again", "--backend", "eager", "--capture-step", "3",
                  "--recompile-at", "3")
    assert plain["outcome"] == again["outcome"] == "ok", (plain, again)
    assert (plain["dynamo"]["unique_graphs"], again["dynamo"]["unique_graphs"]) == (1, 2)
    assert again["dynamo"]["graph_breaks"] == 0, again["dynamo"]
    assert again["candle_trace_functions_traced_by_dynamo"] == {}
    p, a = plain["trace"], again["trace"]
    assert p["compiles"] == [], p["compiles"]
    assert len(a["compiles"]) == 1, a["compiles"]
    name, dur, ops_inside = a["compiles"][0]
    assert (name, ops_inside) == ("torch.compile", 0)
    assert dur > 1_000_000, dur  # a recompilation takes milliseconds at the least
    assert a["op_counts"] == p["op_counts"]
    assert "meta" not in a["op_devices"], a["op_devices"]
    assert a["outcome"] == "complete" and a["gradients"] == {"present": 30}
    candle_graph(a["path"], tmp_path)
    assert "OK" in validate(a["path"])


def test_a_watched_run_catches_a_recompilation_as_a_slow_update(tmp_path):
    """Under ``watch`` (no capture step given), the update that compiles the model again
    (batches of 4 from update 20 on) is slow, and says why: the trigger's detail gives the
    compilation's time and dynamo's reason for it, and the flight recorder's trace holds a
    ``torch.compile`` span of as long, with no op inside. The update after it (captured in
    full) compiles nothing."""
    folder = tmp_path / "watched"
    folder.mkdir()
    summary = tmp_path / "summary.json"
    out = repro(tmp_path, "--backend", "eager", "--steps", "24", "--recompile-at", "20",
                "--watch", str(folder), "--aggregate", str(summary))
    assert out["outcome"] == "ok", out
    assert out["dynamo"]["unique_graphs"] == 2, out["dynamo"]
    detail = next(d for u, t, d in out["fired"] if (u, t) == (20, "slow"))
    traces = out["traces"]
    slow = traces["update-000020-slow.jsonl"]
    assert [c[0] for c in slow["compiles"]] == ["torch.compile"], slow["compiles"]
    (_, dur, ops_inside), = slow["compiles"]
    said = re.search(r"; torch\.compile ran ([0-9.]+) ms of it \(recompiled: (.*)\)$", detail)
    assert said, detail
    # dynamo's own reason: the batch dimension of the model's input changed
    assert "'idx'" in said.group(2) and "expected 8, actual 4" in said.group(2), detail
    assert abs(float(said.group(1)) - dur / 1e6) <= 0.1 * dur / 1e6 + 2, (detail, dur)
    assert not any("torch.compile" in d for u, _, d in out["fired"] if u != 20), out["fired"]
    assert ops_inside == 0 and "meta" not in slow["op_devices"], slow
    assert slow["outcome"] == "complete" and slow["ops"] > 0, slow
    after = traces["update-000021-after-slow.jsonl"]
    assert after["compiles"] == [], after["compiles"]
    # the same model ops, as many (the recorder's region also holds the batch's making:
    # it opens at the step() before the update)
    assert all(slow["op_counts"].get(k) == v for k, v in after["op_counts"].items()), \
        (slow["op_counts"], after["op_counts"])
    # the whole-run statistics count both compilations (the first, and update 20's), and
    # the report moves their time out of compute
    spans = {sp["name"]: sp for sp in json.loads(summary.read_text())["spans"]}
    assert spans["train/compile"]["count"] == 2, spans
    assert spans["train/compile"]["total_ns"] >= dur, (spans["train/compile"], dur)
    r = subprocess.run([str(Path(__file__).resolve().parents[3] / "build" / "candle-trace"),
                        "report", "--json", str(summary)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    cats = {c["category"]: c["total_ns"] for c in json.loads(r.stdout)["overhead"]["categories"]}
    assert cats["compile"] == spans["train/compile"]["total_ns"], cats
    assert cats["compute"] == sum(spans[n]["total_ns"] for n in
                                  ("train/forward", "train/backward", "train/optimizer")) - cats["compile"]
    for name, t in traces.items():
        if name != "update-000020-slow.jsonl":
            assert t["compiles"] == [], (name, t["compiles"])
        candle_graph(t["path"], tmp_path)
