"""`candle-trace run -- python PROGRAM`: unmodified PyTorch programs traced through the
injected sitecustomize, under this test's interpreter (run_tests.sh runs it under each
torch: Debian's 1.13 and PyPI's 2.x). The traces are held to the programs' own truth:
their modules, their parameters and the gradient norms they print themselves."""

from __future__ import annotations

import io
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
from conftest import REPO, candle_graph, judged, read_trace, spans_of

torch = pytest.importorskip("torch")

RUNNER = REPO / "build" / "candle-trace"
PROGRAMS = REPO / "tests" / "python" / "programs"
sys.path.insert(0, str(PROGRAMS))


@pytest.mark.parametrize("pattern,rank,want", [
    ("t-%p.jsonl", None, "t-42.jsonl"),
    ("t-%p-%r.jsonl", None, "t-42-0.jsonl"),
    ("t-%p-%r.jsonl", "3", "t-42-3.jsonl"),
    ("t-%p.jsonl", "3", "t-42-rank3.jsonl"),       # a rank's name says whose it is
    ("dir.d/trace", "1", "dir.d/trace-rank1"),
    ("100%%-%p", None, "100%-42"),
])
def test_expand(pattern, rank, want):
    from candle_trace.torch._run import expand  # noqa: PLC0415

    assert expand(pattern, 42, rank) == want


def test_settings_from_the_runner_s_variables():
    from candle_trace.torch._run import Settings  # noqa: PLC0415

    s = Settings.from_env({"CANDLE_TRACE_RUN_OUTPUT": "/o-%p", "CANDLE_TRACE_RUN_CAPTURE_STEP": "5",
                           "CANDLE_TRACE_RUN_DEVICE_COLLECT": "cupti, nvml",
                           "CANDLE_TRACE_RUN_AGGREGATE": "/a.json",
                           "CANDLE_TRACE_RUN_WATCH": "/w", "CANDLE_TRACE_RUN_MAX_TRACES": "0",
                           "CANDLE_TRACE_RUN_FLIGHT_RECORDER": "0"})
    assert (s.output, s.capture_step, s.device_collect, s.aggregate, s.watch, s.max_traces,
            s.flight_recorder) == ("/o-%p", 5, ["cupti", "nvml"], "/a.json", "/w", 0, False)
    assert Settings.from_env({"CANDLE_TRACE_RUN_DEVICE_COLLECT": "none"}).device_collect is None
    assert Settings.from_env({}) == Settings()


def test_a_message_reaches_stderr_with_its_newline_in_one_write(tmp_path, monkeypatch):
    """torchrun's ranks share one stderr: a line and its newline written apart let another
    rank's line land between them (a CI run read 'rank1.jsonlcandle-trace: rank 0: ...')."""
    from candle_trace.torch._run import say  # noqa: PLC0415

    writes: List[Tuple[int, bytes]] = []
    real = os.write

    def spy(fd: int, data: bytes) -> int:
        writes.append((fd, bytes(data)))
        return real(fd, data)

    with open(tmp_path / "stderr", "w", encoding="utf-8") as f:
        monkeypatch.setattr(sys, "stderr", f)
        monkeypatch.setattr(os, "write", spy)
        f.write("before ")  # what the program left in the buffer comes first
        say("candle-trace: rank 1: watched 4 updates\ncandle-trace:   rank 1: update 3: é")
        fd = f.fileno()
    assert writes == [(fd, "candle-trace: rank 1: watched 4 updates\n"
                           "candle-trace:   rank 1: update 3: é\n".encode())]
    assert (tmp_path / "stderr").read_text(encoding="utf-8") == \
        "before candle-trace: rank 1: watched 4 updates\ncandle-trace:   rank 1: update 3: é\n"
    # a stderr the program replaced with one that has no descriptor still gets it
    buffer = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buffer)
    say("candle-trace: watched 2 updates")
    assert buffer.getvalue() == "candle-trace: watched 2 updates\n" and len(writes) == 1


def test_models_of_finds_the_outermost_holders():
    from candle_trace.torch._run import models_of  # noqa: PLC0415

    enc, head = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)
    model = torch.nn.Sequential(enc, torch.nn.ReLU(), head)
    critic = torch.nn.Linear(2, 1)
    ema = torch.nn.Linear(3, 3)  # a copy: other tensors
    ema.load_state_dict(enc.state_dict())
    assert models_of(list(model.parameters())) == [model]
    assert models_of(list(head.parameters())) == [model]  # the model holds the head
    found = models_of(list(model.parameters()) + list(critic.parameters()))
    assert sorted(map(id, found)) == sorted([id(model), id(critic)])
    assert models_of([torch.zeros(1, requires_grad=True)]) == []
    del ema


def test_loose_tensors_are_named_where_main_holds_them():
    from candle_trace.torch._run import loose_tensors  # noqa: PLC0415

    W1, b1, spare, lone = (torch.zeros(2, requires_grad=True) for _ in range(4))
    layer = torch.nn.Linear(2, 2)
    model = type("Net", (), {})()  # a model class that is no nn.Module
    model.head = [torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)]
    model.gain = torch.ones(2, requires_grad=True)
    p = model.gain  # a loop variable left bound to the model's tensor names nothing
    main = {"W1": W1, "b1": b1, "model": model, "layer": layer, "torch": torch,
            "parameters": [W1, b1, spare, model.gain], "p": p, "__name__": "__main__"}
    params = [W1, b1, *layer.parameters(), *model.head, model.gain, spare, lone]
    named = loose_tensors(params, [layer], main)
    assert list(named) == ["W1", "b1", "model.head.0", "model.head.1", "model.gain",
                           "parameters.2", "param8"]
    assert [id(t) for t in named.values()] == \
        [id(t) for t in (W1, b1, *model.head, model.gain, spare, lone)]
    # a graph's leaves, in no order of the program's: as the program bound their names
    leaves = [lone, spare, model.gain, b1, model.head[1], W1, model.head[0]]
    assert list(loose_tensors(leaves, [], main, in_main_order=True)) == \
        ["W1", "b1", "model.head.0", "model.head.1", "model.gain", "parameters.2", "param0"]


def test_several_models_are_named_where_main_holds_them():
    from candle_trace.torch._run import _model  # noqa: PLC0415

    netG, netD, other = (torch.nn.Sequential(torch.nn.Linear(2, 2)) for _ in range(3))
    holder = type("Trainer", (), {})()  # a trainer object that is no nn.Module
    holder.critic = torch.nn.Linear(2, 1)
    W = torch.zeros(2, requires_grad=True)
    main = {"netG": netG, "netD": netD, "trainer": holder, "__name__": "__main__"}
    model = _model([netG, netD, holder.critic, other], {"W": W}, main)
    # a global, an object's attribute, else the class (twice: numbered), then the tensors
    assert list(model) == ["netG", "netD", "trainer.critic", "Sequential", "W"]
    assert [id(v) for v in model.values()] == [id(netG), id(netD), id(holder.critic),
                                                id(other), id(W)]
    assert _model([netG], {}, main) is netG  # one module: the model itself


@pytest.mark.parametrize("steps, ends", [
    # one optimizer: each step ends an update
    ("A A A", "1 1 1"),
    # a GAN: the discriminator's step, then the generator's
    ("D G D G D G", "0 1 0 1 0 1"),
    # a WGAN's critic steps three times a generator step
    ("D D D G D D D G", "0 0 0 1 0 0 0 1"),
    # the generator's first: the order is the loop's, not the creation's
    ("G D G D", "0 1 0 1"),
])
def test_an_update_ends_once_each_optimizer_has_stepped(steps, ends):
    from candle_trace.torch._cycle import StepCycle  # noqa: PLC0415

    opts = {n: torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
            for n in sorted(set(steps.split()))}
    cycle = StepCycle()
    for opt in opts.values():
        cycle.join(opt)
    got = [cycle.ends(opts[n]) for n in steps.split()]
    assert got == [e == "1" for e in ends.split()]
    assert cycle.steps == len(got)


def sgd() -> "torch.optim.Optimizer":
    return torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


def test_an_optimizer_replaced_leaves_the_round():
    from candle_trace.torch._cycle import StepCycle  # noqa: PLC0415

    cycle = StepCycle()
    first, kept = sgd(), sgd()
    cycle.join(first)
    cycle.join(kept)
    assert [cycle.ends(first), cycle.ends(kept)] == [False, True]
    # a new optimizer in first's place (an epoch's), first still referenced: once it
    # steps, first -- whose last step came before it was made -- is out of the round
    second = sgd()
    cycle.join(second)
    assert [cycle.ends(kept), cycle.ends(second), cycle.ends(kept), cycle.ends(second)] == \
        [False, True, False, True]
    assert cycle.optimizers() == [kept, second]
    # one the program drops leaves with its last reference
    del second
    assert cycle.ends(kept)
    assert cycle.optimizers() == [kept]
    assert first is not None  # kept alive to the end


def test_an_optimizer_that_seldom_steps_holds_the_round_for_a_while_only():
    from candle_trace.torch._cycle import STALL, StepCycle  # noqa: PLC0415

    cycle = StepCycle()
    used, idle = sgd(), sgd()
    cycle.join(used)
    cycle.join(idle)
    got = [cycle.ends(used) for _ in range(STALL + 2)]
    assert got == [False] * (STALL - 1) + [True] * 3
    assert cycle.optimizers() == [used]
    # stepping after all (every few hundred updates): its step ends no update, and the
    # round does not wait for it again
    assert [cycle.ends(idle), cycle.ends(used), cycle.ends(used)] == [False, True, True]
    assert cycle.optimizers() == [used]


def test_trained_leaves_are_each_tensor_a_backward_accumulates_into():
    from candle_trace.torch._run import trained_leaves  # noqa: PLC0415

    W, b, frozen = torch.randn(3, 3, requires_grad=True), torch.zeros(3, requires_grad=True), \
        torch.randn(3, 3)
    x = torch.randn(2, 3)
    h = (x @ W).tanh()
    loss = (h + b).sum() + (h @ W).sum() + (x @ frozen).sum() + W.sum()  # W reached thrice
    assert [id(t) for t in trained_leaves(loss)] == [id(W), id(b)]
    assert [id(t) for t in trained_leaves([b])] == [id(b)]  # a leaf given itself
    assert trained_leaves((x @ frozen).sum()) == []


def test_a_module_trained_by_hand_is_no_inference_loop(tmp_path):
    prog = write(tmp_path, "by_hand.py", TINY + """
for step in range(5):
    loss = model(torch.randn(2, 4)).pow(2).mean()
    for p in model.parameters():
        p.grad = None
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
""")
    r = run(tmp_path, [str(prog)])
    assert r.returncode == 0, r.stderr
    [trace] = traces(tmp_path)
    lines = judged(trace, tmp_path)
    assert (lines[0]["phase"], lines[0]["capture_step"]) == ("train", 3)
    # a module: the update opens at its forward and ends at backward's return
    assert forward_span_names(lines)[0] == "Sequential"
    assert {g["key"]: g["state"] for g in lines if g["kind"] == "gradient"} == \
        {k: "present" for k in ("0.weight", "0.bias", "2.weight", "2.bias")}
    assert not [o for o in lines if o["kind"] == "op" and o["op_name"] == "aten::sub_"]


def clean_env(**extra: str) -> Dict[str, str]:
    """No CANDLE_TRACE_* variable and no PYTHONPATH: the runner finds everything
    itself. The interpreter's bin first (a virtualenv's ninja builds the observer)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CANDLE_TRACE_") and k != "PYTHONPATH"}
    if "CANDLE_TRACE_CACHE" in os.environ:  # the op observer's build cache may stay
        env["CANDLE_TRACE_CACHE"] = os.environ["CANDLE_TRACE_CACHE"]
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "/usr/bin:/bin")])
    env.update(extra)
    return env


def run(tmp_path: Path, program: List[str], *flags: str, env: Optional[Dict[str, str]] = None,
        timeout: int = 600) -> subprocess.CompletedProcess:
    if not RUNNER.exists():
        pytest.fail(f"{RUNNER} is not built (make cli)")
    return subprocess.run([str(RUNNER), "run", "--output", str(tmp_path / "t-%p.jsonl"), *flags,
                           "--", sys.executable, *program], cwd=tmp_path, capture_output=True,
                          text=True, timeout=timeout, env=env or clean_env())


def traces(tmp_path: Path) -> List[Path]:
    return sorted(tmp_path.glob("t-*.jsonl"))


def norms_at(path: Path, update: int) -> Dict[str, Optional[float]]:
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec["update"] == update:
            return rec["norms"]
    raise AssertionError(f"{path} has no update {update}")


def forward_span_names(lines: list) -> List[str]:
    return [s["name"] for s in lines if s["kind"] == "span_start"
            and s.get("span_kind") == "module" and s.get("step") == "forward"]


def assert_gradients_match(lines: list, root: str, model: torch.nn.Module,
                           norms: Dict[str, Optional[float]]) -> None:
    """One gradient per trainable parameter, state and norm as the program saw them."""
    grads = {g["key"]: g for g in lines if g["kind"] == "gradient"}
    assert {g["root"] for g in grads.values()} == {root}
    assert set(grads) == {n for n, p in model.named_parameters() if p.requires_grad}
    for key, g in grads.items():
        want = norms[key]
        if want is None:
            assert g["state"] == "missing", key
        else:
            assert g["state"] == "present", key
            assert math.isclose(g["norm"], want, rel_tol=1e-5), (key, g["norm"], want)


def verdict_line(r: subprocess.CompletedProcess) -> str:
    lines = [x for x in r.stderr.splitlines() if x.startswith("candle-trace: trace ")]
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_char_gpt_unmodified(tmp_path):
    import char_gpt  # noqa: PLC0415

    norms = tmp_path / "norms.jsonl"
    r = run(tmp_path, [str(PROGRAMS / "char_gpt.py"), "--updates", "5"],
            env=clean_env(CHAR_GPT_GRAD_NORMS=str(norms)))
    assert r.returncode == 0, r.stderr
    assert "trained 5 updates" in r.stdout
    plain = subprocess.run([sys.executable, str(PROGRAMS / "char_gpt.py"), "--updates", "5"],
                           capture_output=True, text=True, timeout=600, env=clean_env())
    assert plain.stdout == r.stdout  # the same losses: the capture changes no number
    [trace] = traces(tmp_path)
    line = verdict_line(r)
    assert f"{trace.name}: valid, complete; update " in line and "gradients" in line, line
    lines = judged(trace, tmp_path)
    meta = lines[0]
    assert (meta["entrypoint"], meta["phase"], meta["capture_step"]) == ("CharGPT::train", "train", 3)

    model = char_gpt.CharGPT(vocab=len(set(char_gpt.TEXT)), context=16)
    called = {q or "CharGPT" for q, m in model.named_modules()  # a ModuleList is not called
              if not isinstance(m, torch.nn.ModuleList)} - {"unused", "extra_mix"}
    fwd = forward_span_names(lines)
    # update 3 is odd: the mixing branch is not taken; the unused layer never runs; the
    # no_grad evaluation after update 2 comes before the update starts
    assert set(fwd) == called
    assert fwd.count("CharGPT") == 1
    assert not [s for s in lines if s["kind"] == "span_start" and "[no_grad]" in s["name"]]
    assert any(s["kind"] == "span_start" and s["name"] == "AdamW.step" for s in lines)
    ops = [o["op_name"] for o in lines if o["kind"] == "op"]
    assert "aten::layer_norm" in ops or "aten::native_layer_norm" in ops, sorted(set(ops))
    assert all(o.startswith("aten::") for o in ops)
    assert any(m["kind"] == "memory" for m in lines)
    assert any(s["kind"] == "tensor_stats" and s["label"] == "loss" for s in lines)
    assert_gradients_match(lines, "CharGPT", model, norms_at(norms, 3))
    params = [t for t in lines if t["kind"] == "tensor" and t.get("category") == "parameter"]
    assert sum(math.prod(t["shape"]) for t in params) == sum(p.numel() for p in model.parameters())


@pytest.mark.skipif(not hasattr(torch, "compile"),
                    reason=f"torch {torch.__version__} has no torch.compile (the torch 2.x venv runs it)")
def test_the_gpu_check_s_real_programs_pass_on_the_cpu(tmp_path):
    """tests/gpu/programs.py, step 3e of tests/gpu/run.sh on CUDA, here on the CPU: the
    unmodified char GPT under candle-trace run and a torch.compile'd model under profile
    pass every check that holds without a GPU (a GPU session is rare: a typo in its
    script must not be what it finds)."""
    r = subprocess.run([sys.executable, str(REPO / "tests" / "gpu" / "programs.py"), str(tmp_path),
                        "--device", "cpu"], capture_output=True, text=True, timeout=600, env=clean_env())
    assert r.returncode == 0, r.stdout + r.stderr
    oks = [x for x in r.stdout.splitlines() if x.startswith("ok ")]
    assert len(oks) == 11 and "FAIL" not in r.stdout, r.stdout
    assert "are inductor's C++ kernels" in r.stdout, r.stdout
    assert "its 32 gradients are the program's p.grad norms of update 3" in r.stdout


# fork: the workers inherit the patched torch and check the pid; spawn: they start anew
# and see the main process's claim
@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_cnn_with_dataloader_workers(tmp_path, start):
    import cnn_loader  # noqa: PLC0415

    norms, workers = tmp_path / "norms.jsonl", tmp_path / "workers.txt"
    r = run(tmp_path, [str(PROGRAMS / "cnn_loader.py"), "--updates", "4", "--workers", "2",
                       "--start-method", start],
            "--capture-step", "2",
            env=clean_env(CNN_GRAD_NORMS=str(norms), CNN_WORKER_PIDS=str(workers)))
    assert r.returncode == 0, r.stderr
    assert "with 2 workers" in r.stdout
    [trace] = traces(tmp_path)  # the workers wrote none
    lines = judged(trace, tmp_path)
    worker_pids = {int(x) for x in workers.read_text().split()}
    assert len(worker_pids) == 2
    assert lines[0]["process"]["pid"] not in worker_pids
    assert trace.name == f"t-{lines[0]['process']['pid']}.jsonl"
    assert lines[0]["capture_step"] == 2

    model = cnn_loader.Net()
    assert set(forward_span_names(lines)) == {q or "Net" for q, _ in model.named_modules()}
    assert any(o["kind"] == "op" and o["op_name"].startswith("aten::conv") or
               o["kind"] == "op" and o["op_name"] == "aten::mkldnn_convolution" for o in lines)
    assert_gradients_match(lines, "Net", model, norms_at(norms, 2))
    assert any(s["kind"] == "span_start" and s["name"] == "SGD.step" for s in lines)


@pytest.mark.parametrize("kind, optimizer", [("globals", "sgd"), ("class", "sgd"),
                                             ("globals", "none"), ("class", "none")])
def test_a_model_of_raw_tensors_unmodified(tmp_path, kind, optimizer):
    """makemore's shape: no nn.Module (or one LayerNorm among a class's tensors), and its
    parameters updated by hand or by SGD; they are named where the script holds them,
    their gradients the program's."""
    norms = tmp_path / "norms.jsonl"
    r = run(tmp_path, [str(PROGRAMS / "raw_mlp.py"), "--updates", "4", "--model", kind,
                       "--optimizer", optimizer], env=clean_env(RAW_MLP_GRAD_NORMS=str(norms)))
    assert r.returncode == 0, r.stderr
    assert "valid, complete" in verdict_line(r)
    [trace] = traces(tmp_path)
    lines = judged(trace, tmp_path)
    assert lines[0]["capture_step"] == 3
    want = norms_at(norms, 3)
    spare = "spare" if kind == "globals" else "model.spare"
    if optimizer == "none":
        # by hand, the model is what the backwards reach: a tensor they never do is
        # not known to be the model's
        assert want.pop(spare) is None
    grads = {g["key"]: g for g in lines if g["kind"] == "gradient"}
    assert set(grads) == set(want)
    assert {g["root"] for g in grads.values()} == {"model"}
    for key, norm in want.items():
        if norm is None:  # spare: trained, never used
            assert grads[key]["state"] == "missing" and key.endswith("spare"), key
        else:
            assert math.isclose(grads[key]["norm"], norm, rel_tol=1e-5), (key, grads[key], norm)
    assert optimizer == "none" or want[spare] is None
    ops = [o["op_name"] for o in lines if o["kind"] == "op"]
    assert "aten::mm" in ops and "aten::index" in ops, ops
    spans = [s["name"] for s in lines if s["kind"] == "span_start"]
    assert "backward" in spans and ("SGD.step" in spans) == (optimizer == "sgd"), spans
    if optimizer == "none":
        # the update runs from the return of one backward to that of the next: the
        # parameters' update by hand (a mul and an add_ per tensor) comes first in it
        assert ops.count("aten::add_") >= 7 and ops.index("aten::add_") < ops.index("aten::mm")
    assert forward_span_names(lines) == ([] if kind == "globals" else ["model.norm"])


@pytest.mark.parametrize("flags, d_steps", [([], 1), (["--critic", "3"], 3),
                                             (["--generator-first"], 1), (["--container"], 1)])
def test_a_gan_unmodified(tmp_path, flags, d_steps):
    """Two models, each with its optimizer: the update is the iteration -- every
    discriminator step and the generator's after them -- over both models, whichever
    optimizer was made first; the gradients are the program's once the generator
    stepped (the discriminator's then hold the generator loss's too, as p.grad does).
    Held in one module that is never called (``--container``), the model is that module
    and the update still opens at the generator's forward (until 2026-12-06 it waited for
    the module's own, and the trace was a "valid, complete" update of 0 ns and 0 ops)."""
    norms = tmp_path / "norms.jsonl"
    r = run(tmp_path, [str(PROGRAMS / "gan.py"), "--updates", "4", *flags],
            env=clean_env(GAN_GRAD_NORMS=str(norms)))
    assert r.returncode == 0, r.stderr
    assert "valid, complete" in verdict_line(r)
    [trace] = traces(tmp_path)  # the capture started again over both: one trace
    lines = judged(trace, tmp_path)
    model = "GAN" if "--container" in flags else "model"
    assert lines[0]["capture_step"] == 3 and lines[0]["entrypoint"] == f"{model}::train"
    want = norms_at(norms, 3)
    grads = {g["key"]: g for g in lines if g["kind"] == "gradient"}
    assert set(grads) == set(want) and len(want) == 8
    for key, norm in want.items():
        assert grads[key]["state"] == "present", key
        assert math.isclose(grads[key]["norm"], norm, rel_tol=1e-5), (key, grads[key], norm)
    spans = [s["name"] for s in lines if s["kind"] == "span_start"]
    # the update opens at the iteration's first forward (the generator's) and closes
    # after the generator's step: each critic step and the generator's inside it
    assert spans[spans.index("update") + 1] == "netG"
    assert spans.count("Adam.step") == d_steps + 1 and spans[-1] == "Adam.step"
    assert spans.count("backward") == d_steps + 1
    fwd = forward_span_names(lines)
    assert (fwd.count("netG"), fwd.count("netD")) == (d_steps, 2 * d_steps + 1)
    ops = [o["op_name"] for o in lines if o["kind"] == "op"]
    assert ops.count("aten::addmm") >= 2 * d_steps + 2 * (2 * d_steps + 1), ops  # two Linears each
    params = [t for t in lines if t["kind"] == "tensor" and t.get("category") == "parameter"]
    assert {t["label"].split(".")[0] for t in params} == {"netG", "netD"}


needs_cpu_grad_scaler = pytest.mark.skipif(
    not hasattr(getattr(torch, "amp", None), "GradScaler"),
    reason=f"torch {torch.__version__} has no torch.amp.GradScaler (a CPU one: torch >= 2.3)")


def amp_losses(stdout: str) -> List[Tuple[float, bool]]:
    """(loss, skipped) of each iteration amp_mlp.py printed."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("update "):
            words = line.split()
            out.append((float(words[3]), words[-1] == "skipped"))
    return out


@needs_cpu_grad_scaler
@pytest.mark.parametrize("capture_step", [3, 5])
def test_a_step_the_grad_scaler_skips_still_ends_the_iteration(tmp_path, capture_step):
    """Mixed precision: the first three iterations overflow and their optimizer step is
    skipped. Update N is still iteration N -- with no optimizer span and the
    overflowed gradients when it was skipped, with AdamW's step when not -- not the
    Nth optimizer step, three iterations later."""
    r = run(tmp_path, [str(PROGRAMS / "amp_mlp.py"), "--updates", "6"],
            "--capture-step", str(capture_step))
    assert r.returncode == 0, r.stderr
    assert [s for _, s in amp_losses(r.stdout)] == [True] * 3 + [False] * 3
    [trace] = traces(tmp_path)
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    summary = candle_graph(trace, tmp_path, require_valid=False)
    assert summary["health"]["capture_complete"]
    spans = [s["name"] for s in lines if s["kind"] == "span_start"]
    assert forward_span_names(lines).count("Sequential") == 1
    grads = [g["state"] for g in lines if g["kind"] == "gradient"]
    if capture_step == 3:  # skipped: its gradients are the overflow's
        assert "AdamW.step" not in spans
        assert "non_finite" in grads, grads
        assert "NON-FINITE GRADIENTS" in verdict_line(r)
    else:
        assert "AdamW.step" in spans and set(grads) == {"present"}
        assert "valid, complete" in verdict_line(r)


@needs_cpu_grad_scaler
def test_a_watched_mixed_precision_run_judges_the_loss_not_its_scaled_product(tmp_path):
    """The overflow of the scaled loss and its gradients, and the steps the scaler
    skips for them, are mixed precision at work: nothing fires for them. The loss
    turning NaN in update 6 fires, and the whole-run loss is the program's, unscaled."""
    agg = tmp_path / "agg.json"
    r = run_watched(tmp_path, [str(PROGRAMS / "amp_mlp.py"), "--updates", "8", "--nan-at", "6"],
                    "--aggregate", str(agg))
    assert r.returncode == 0, r.stderr
    losses = amp_losses(r.stdout)
    assert [s for _, s in losses] == [True] * 3 + [False] * 2 + [True] + [False] * 2
    assert "candle-trace: watched 8 updates; 1 trigger fired" in r.stderr, r.stderr
    assert fired_lines(r) == ["update 6: non_finite (value nan; loss nan) -> trace "
                              "update-000006-non_finite.jsonl"]
    assert watched(tmp_path, r) == ["update-000006-non_finite.jsonl",
                                    "update-000007-after-non_finite.jsonl"]
    [loss] = [s for s in json.loads(agg.read_text())["scalars"] if s["label"] == "loss"]
    finite = [v for v, _ in losses if math.isfinite(v)]
    assert (loss["count"], loss["non_finite"]) == (len(finite), 1)
    assert math.isclose(loss["mean"], sum(finite) / len(finite), rel_tol=1e-4)
    assert (loss["min"], loss["max"]) == pytest.approx((min(finite), max(finite)), rel=1e-4)


def test_a_loop_by_hand_asked_for_its_first_update_captures_its_second(tmp_path):
    # the first backward is what finds the model: as for an inference loop, update 2
    r = run(tmp_path, [str(PROGRAMS / "raw_mlp.py"), "--updates", "3", "--optimizer", "none"],
            "--capture-step", "1")
    assert r.returncode == 0, r.stderr
    assert "valid, complete" in verdict_line(r)
    [trace] = traces(tmp_path)
    assert judged(trace, tmp_path)[0]["capture_step"] == 2


@pytest.mark.parametrize("optimizer", ["sgd", "none"])
def test_a_watched_raw_tensor_model_keeps_the_update_whose_loss_turns_nan(tmp_path, optimizer):
    r = run_watched(tmp_path, [str(PROGRAMS / "raw_mlp.py"), "--updates", "8",
                               "--lr-spike-at", "4", "--optimizer", optimizer])
    assert r.returncode == 0, r.stderr
    assert watched(tmp_path, r) == ["update-000005-non_finite.jsonl",
                                    "update-000006-after-non_finite.jsonl"]
    # by hand, the first backward is what finds the model: its update is not watched,
    # and the next is the loop's second
    watched_n = 8 if optimizer == "sgd" else 7
    assert f"candle-trace: watched {watched_n} updates; " in r.stderr, r.stderr
    fired = fired_lines(r)
    assert fired[0] == "update 5: non_finite (value nan; loss nan) -> trace " \
                       "update-000005-non_finite.jsonl", r.stderr
    # the raw tensors are named where the script holds them
    assert fired[1].startswith("update 6: non_finite_grad (value nan; non-finite gradient norm "
                               "in C, W1, b1, bngain, bnbias, W2, b2 (7 of "), fired


def test_fewer_updates_than_the_capture_step_is_a_failed_trace(tmp_path):
    r = run(tmp_path, [str(PROGRAMS / "char_gpt.py"), "--updates", "2"], "--capture-step", "4")
    assert r.returncode == 0, r.stderr
    line = verdict_line(r)
    assert "valid, FAILED" in line and "before capture step 4" in line, line
    [trace] = traces(tmp_path)
    lines = judged(trace, tmp_path, complete=False)
    assert "after 2 updates" in lines[-1]["reason"]


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


TINY = """
import os, sys, torch
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
"""


EPOCHS = TINY + """
made = []  # every epoch's optimizer stays referenced, as a scheduler's list would keep it
for epoch in range(3):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    made.append(opt)
    for i in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
print("done", len(made))
"""


@pytest.mark.parametrize("watch", [False, True])
def test_an_optimizer_made_anew_each_epoch(tmp_path, watch):
    """The next epoch's optimizer replaces the last (which the program keeps): each of
    its steps ends an update from its first on -- the old one, no longer stepping, does
    not hold them open."""
    prog = write(tmp_path, "epochs.py", EPOCHS)
    if watch:
        r = run_watched(tmp_path, [str(prog)])
        assert r.returncode == 0, r.stderr
        assert "candle-trace: watched 9 updates; no triggers fired (the slow trigger arms " \
               "after 10 timed updates; this run timed " in r.stderr, r.stderr
        return
    r = run(tmp_path, [str(prog)], "--capture-step", "4")  # the second epoch's first
    assert r.returncode == 0, r.stderr
    assert "valid, complete" in verdict_line(r)
    [trace] = traces(tmp_path)
    lines = judged(trace, tmp_path)
    assert forward_span_names(lines).count("Sequential") == 1
    assert [s["name"] for s in lines if s["kind"] == "span_start"].count("Adam.step") == 1


EVERY_UPDATE = TINY + """
import gc, weakref
made = []
for i in range(20):  # a new SGD each update, as some tutorials write it
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    made.append(weakref.ref(opt))
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
del opt
gc.collect()
print("alive", sum(r() is not None for r in made))
"""


def test_an_optimizer_made_every_update(tmp_path):
    """Each replaces the last: one update each. The capture takes in the first 16 made
    after its start (it holds each for the run), and says so once past them."""
    r = run_watched(tmp_path, [str(write(tmp_path, "every.py", EVERY_UPDATE))])
    assert r.returncode == 0, r.stderr
    # 20 updates: past the slow trigger's warm-up, where a host stall may fire it
    assert "candle-trace: watched 20 updates; " in r.stderr, r.stderr
    assert fired_lines(r) == [], r.stderr
    note = "candle-trace run: the program has made 17 optimizers since its loop began"
    assert r.stderr.count(note) == 1, r.stderr
    # none of those past the capture's 16 is kept alive by the runner
    assert "alive 17\n" in r.stdout, r.stdout


def test_exit_status_and_an_exception_inside_the_capture(tmp_path):
    prog = write(tmp_path, "boom.py", TINY + """
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 5):
    opt.zero_grad()
    out = model(torch.randn(2, 4))
    if step == 3:
        raise RuntimeError("out of patience at step 3")
    out.sum().backward()
    opt.step()
""")
    r = run(tmp_path, [str(prog)])
    assert r.returncode == 1, r.stderr  # Python's status for an uncaught exception
    assert "RuntimeError: out of patience at step 3" in r.stderr
    [trace] = traces(tmp_path)
    lines = judged(trace, tmp_path, complete=False)
    assert lines[-1]["reason"] == "RuntimeError: out of patience at step 3"
    assert "valid, FAILED (RuntimeError: out of patience at step 3" in verdict_line(r)

    prog = write(tmp_path, "status.py", "import sys; sys.exit(7)\n")
    assert run(tmp_path, [str(prog)]).returncode == 7


def test_a_script_without_torch_pays_nothing_and_writes_nothing(tmp_path):
    prog = write(tmp_path, "plain.py", "import json, sys\nprint(json.dumps(sorted(sys.modules)))\n")
    r = run(tmp_path, [str(prog)])
    assert r.returncode == 0, r.stderr
    plain = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True,
                           timeout=60, env=clean_env())
    extra = set(json.loads(r.stdout)) - set(json.loads(plain.stdout))
    # no torch, no candle_trace, nothing of importlib's: only the injected file itself
    assert extra <= {"sitecustomize", "_candle_trace_run_site"}, extra
    assert traces(tmp_path) == []
    assert "no trace written" in r.stderr


def test_an_existing_sitecustomize_still_runs(tmp_path):
    site = tmp_path / "usersite"
    site.mkdir()
    write(site, "sitecustomize.py", "import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    prog = write(tmp_path, "train.py", TINY + """
print("user sitecustomize:", os.environ.get("USER_SITE_RAN"))
opt = torch.optim.Adam(model.parameters())
for _ in range(3):
    opt.zero_grad(); model(torch.randn(2, 4)).sum().backward(); opt.step()
""")
    r = run(tmp_path, [str(prog)], env=clean_env(PYTHONPATH=str(site)))
    assert r.returncode == 0, r.stderr
    assert "user sitecustomize: yes" in r.stdout
    [trace] = traces(tmp_path)
    judged(trace, tmp_path)


def test_children_stay_out_and_ranks_trace_their_own(tmp_path):
    child = write(tmp_path, "child.py", TINY + """
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    opt.zero_grad(); model(torch.randn(2, 4)).sum().backward(); opt.step()
print("child", os.getpid(), os.environ.get("RANK"))
""")
    parent = write(tmp_path, "parent.py", TINY + f"""
import subprocess
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    opt.zero_grad(); model(torch.randn(2, 4)).sum().backward(); opt.step()
subprocess.run([sys.executable, {str(child)!r}], check=True)      # a helper: no trace
env = dict(os.environ, RANK="1")                                    # as torchrun starts a rank
subprocess.run([sys.executable, {str(child)!r}], check=True, env=env)
print("parent", os.getpid())
""")
    r = run(tmp_path, [str(parent)])
    assert r.returncode == 0, r.stderr
    said = [ln.split() for ln in r.stdout.splitlines()]
    parent_pid = next(w[1] for w in said if w[0] == "parent")
    rank_pid = next(w[1] for w in said if w[0] == "child" and w[2] == "1")
    names = sorted(p.name for p in traces(tmp_path))
    assert names == sorted([f"t-{parent_pid}.jsonl", f"t-{rank_pid}-rank1.jsonl"])
    for t in traces(tmp_path):
        judged(t, tmp_path)
    assert r.stderr.count("candle-trace: trace ") == 2


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_inference_loop_without_optimizer(tmp_path, mode):
    # torch.inference_mode: the op observer's calibration runs a miniature training step
    # (its tensors made and its gradient taken outside inference mode); before, its
    # error went into the program's forward and ended it
    prog = write(tmp_path, "infer.py", TINY + f"""
loss = torch.nn.MSELoss()
model.eval()
with torch.{mode}():
    for _ in range(5):
        y = model(torch.randn(3, 4))
        loss(y, torch.zeros(3, 1))   # a module without parameters is no model
print("done")
""")
    r = run(tmp_path, [str(prog)])
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    [trace] = traces(tmp_path)
    lines = judged(trace, tmp_path)
    assert (lines[0]["phase"], lines[0]["capture_step"]) == ("infer", 3)
    names = [s["name"] for s in lines if s["kind"] == "span_start" and s.get("span_kind") == "module"]
    assert names.count("Sequential [no_grad]") == 1 and "0 [no_grad]" in names
    assert not [g for g in lines if g["kind"] == "gradient"]
    assert any(o["kind"] == "op" and o["op_name"] == "aten::addmm" for o in lines)


def test_ctrl_c_is_forwarded_and_a_finished_capture_stays_complete(tmp_path):
    ready = tmp_path / "ready"
    prog = write(tmp_path, "forever.py", TINY + f"""
import pathlib, time
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
while True:
    opt.zero_grad(); model(torch.randn(2, 4)).sum().backward(); opt.step()
    step += 1
    if step == 4:
        pathlib.Path({str(ready)!r}).write_text("go")
    time.sleep(0.01)
""")
    p = subprocess.Popen([str(RUNNER), "run", "--output", str(tmp_path / "t-%p.jsonl"), "--",
                          sys.executable, str(prog)], cwd=tmp_path, env=clean_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)  # no terminal: the runner must forward it
    deadline = time.time() + 300
    while not ready.exists():
        assert p.poll() is None and time.time() < deadline, p.communicate()
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert "KeyboardInterrupt" in err
    assert p.returncode in (1, 128 + signal.SIGINT), err  # Python >= 3.8 dies of SIGINT
    [trace] = traces(tmp_path)
    judged(trace, tmp_path)
    assert "valid, complete" in err


def test_sigterm_ends_the_trace_then_kills_as_before(tmp_path):
    ready = tmp_path / "ready"
    prog = write(tmp_path, "forever.py", TINY + f"""
import pathlib, time
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 10**9):
    opt.zero_grad(); model(torch.randn(2, 4)).sum().backward(); opt.step()
    if step == 4:
        pathlib.Path({str(ready)!r}).write_text("go")
    time.sleep(0.01)
""")
    p = subprocess.Popen([str(RUNNER), "run", "--capture-step", "100", "--output",
                          str(tmp_path / "t-%p.jsonl"), "--", sys.executable, str(prog)],
                         cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not ready.exists():
        assert p.poll() is None and time.time() < deadline, p.communicate()
        time.sleep(0.05)
    p.terminate()  # SIGTERM to the runner, which forwards it
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, err
    [trace] = traces(tmp_path)
    lines = judged(trace, tmp_path, complete=False)
    reason = lines[-1]["reason"]
    assert reason.startswith("the loop ended by Terminated: killed by SIGTERM (signal 15) after "), reason
    assert reason.endswith("before capture step 100 completed"), reason


def test_a_program_that_is_no_python_runs_under_the_drop_in(tmp_path):
    if not (REPO / "build" / "libcandle_trace_preload.so").exists():
        pytest.fail("build/libcandle_trace_preload.so is not built (make build/libcandle_trace_preload.so)")
    r = subprocess.run([str(RUNNER), "run", "--output", str(tmp_path / "t-%p.jsonl"), "--",
                        "sleep", "0.3"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=60, env=clean_env())
    assert r.returncode == 0, r.stderr
    [trace] = traces(tmp_path)
    lines = judged(trace, tmp_path)
    assert lines[0]["tags"]["mode"] == "drop-in"
    region = [s for s in lines if s["kind"] == "span_start" and s["name"] == "sleep"]
    assert len(region) == 1
    end = next(s for s in lines if s["kind"] == "span_end" and s["id"] == region[0]["id"])
    # the whole run but the few ms before the library's Go runtime has started
    assert 250_000_000 <= end["duration_ns"] < 2_000_000_000
    assert f"{trace.name}: valid, complete; sleep " in verdict_line(r)


def test_aggregate_counts_every_update_and_every_forward(tmp_path):
    r = run(tmp_path, [str(PROGRAMS / "char_gpt.py"), "--updates", "6", "--eval-every", "2"],
            "--aggregate", str(tmp_path / "agg-%p.json"))
    assert r.returncode == 0, r.stderr
    [trace] = traces(tmp_path)
    judged(trace, tmp_path)
    [summary] = tmp_path.glob("agg-*.json")
    assert f"whole-run summary {summary.name}" in r.stderr
    rep = subprocess.run([str(RUNNER), "report", "--json", str(summary)], capture_output=True,
                         text=True, timeout=60)
    assert rep.returncode == 0, rep.stderr
    counts = {s["name"]: s["count"] for s in json.loads(rep.stdout)["spans"]}
    # 6 updates, each one optimizer step and one backward; 6 training forwards and the
    # 3 evaluations after updates 2, 4 and 6
    assert (counts["train/step"], counts["train/optimizer"], counts["train/backward"]) == (6, 6, 6)
    assert counts["train/forward"] == 9


LAUNCH = """
import os, subprocess, sys
# What torchrun does for each rank: the rendezvous in the environment, one process each.
port, program = sys.argv[1], sys.argv[2]
env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2")
ranks = [subprocess.Popen([sys.executable, program], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
         for r in range(2)]
sys.exit(max(p.wait() for p in ranks))
"""


def free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_ranks_write_one_trace_each(tmp_path):
    port = str(free_port())
    if int(torch.__version__.split(".")[0]) >= 2:
        launcher = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port]
    else:  # Debian's torch 1.13 torchrun fails on Python 3.11 (elastic's to_map), traced or not
        launcher = [str(write(tmp_path, "launch.py", LAUNCH)), port]
    r = run(tmp_path, [*launcher, str(PROGRAMS / "ddp_ranks.py")], env=clean_env(OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr
    assert "rank 0 of 2 done" in r.stdout and "rank 1 of 2 done" in r.stdout
    found = traces(tmp_path)  # the launcher (it steps no optimizer) writes none
    assert [t.stem.rsplit("-", 1)[-1] for t in found] == ["rank0", "rank1"], found
    grads, jobs = [], set()
    for rank, t in enumerate(found):
        lines = judged(t, tmp_path)
        assert lines[0]["process"]["rank"] == rank and lines[0]["process"]["world_size"] == 2
        jobs.add(lines[0]["tags"].get("job_id"))
        assert t.name == f"t-{lines[0]['process']['pid']}-rank{rank}.jsonl"
        grads.append({g["key"]: g["norm"] for g in lines if g["kind"] == "gradient"})
    assert len(jobs) == 1 and None not in jobs and "" not in jobs, f"both ranks, one job id: {jobs}"
    assert set(grads[0]) == {"module.0.weight", "module.0.bias", "module.2.weight", "module.2.bias"}
    for key, norm in grads[0].items():  # all-reduced: the same mean gradient on each rank
        assert math.isclose(norm, grads[1][key], rel_tol=1e-6), key


# -- candle-trace run --watch: the updates that go wrong, with no capture step ---------


def run_watched(tmp_path: Path, program: List[str], *flags: str,
                timeout: int = 600) -> subprocess.CompletedProcess:
    if not RUNNER.exists():
        pytest.fail(f"{RUNNER} is not built (make cli)")
    return subprocess.run([str(RUNNER), "run", "--watch", "traces", *flags, "--", sys.executable,
                           *program], cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout, env=clean_env())


def watched(tmp_path: Path, r: subprocess.CompletedProcess) -> List[str]:
    """The traces in the watch's folder, less those of slow updates the machine made
    (a host stall can fire the slow trigger in any loop; no program here stalls): each
    one named in the runner's verdicts, and the program's own lines said what fired."""
    names = sorted(p.name for p in (tmp_path / "traces").glob("*.jsonl"))
    for n in names:
        assert f"candle-trace: trace traces/{n}: " in r.stderr, r.stderr
    return [n for n in names if not n.endswith(("-slow.jsonl", "-after-slow.jsonl"))]


def fired_lines(r: subprocess.CompletedProcess) -> List[str]:
    return [x.split(":", 1)[1].strip() for x in r.stderr.splitlines()
            if x.startswith("candle-trace:   ") and ": slow (" not in x]


def test_a_watched_run_keeps_the_update_whose_loss_turns_nan(tmp_path):
    # update 19's optimizer step runs at a learning rate of 1e30: update 20's loss is NaN
    r = run_watched(tmp_path, [str(PROGRAMS / "char_gpt.py"), "--updates", "25", "--eval-every",
                               "5", "--loader-ms", "5", "--lr-spike-at", "19"], "--max-traces", "10")
    assert r.returncode == 0, r.stderr
    assert "trained 25 updates" in r.stdout
    assert "candle-trace: watched 25 updates; " in r.stderr, r.stderr
    assert watched(tmp_path, r) == ["update-000020-non_finite.jsonl",
                                    "update-000021-after-non_finite.jsonl"]
    fired = fired_lines(r)
    assert fired[0] == "update 20: non_finite (value nan; loss nan) -> trace " \
                       "update-000020-non_finite.jsonl", r.stderr
    assert fired[1].startswith("update 21: non_finite_grad (value nan; non-finite gradient norm in ")
    # the contract's warning names the trace as the user finds it, not its working name
    assert "breaks the gradient contract (" + str(tmp_path / "traces" / "update-000020-non_finite.jsonl") \
        + "): family tokens: non-finite gradient in tokens.weight" in r.stderr, r.stderr
    assert "recording" not in r.stderr
    folder = tmp_path / "traces"
    for name in ("update-000020-non_finite.jsonl", "update-000021-after-non_finite.jsonl"):
        # the update's own numbers, not a broken trace: its only errors are the NaN gradients,
        # and the runner says so rather than INVALID
        cg = candle_graph(folder / name, tmp_path, require_valid=False)
        errors = {i["code"] for i in cg["health"]["issues"] if i["severity"] == "error"}
        assert errors == {"gradient_family_non_finite"}, cg["health"]["issues"]
        assert cg["health"]["capture_complete"]
        assert f"candle-trace: trace traces/{name}: well-formed, complete, NON-FINITE GRADIENTS in " \
               in r.stderr
    lines = read_trace(folder / "update-000020-non_finite.jsonl")
    meta = lines[0]
    assert (meta["entrypoint"], meta["capture_step"]) == ("CharGPT::train", 20)
    assert meta["tags"]["mode"] == "candle-trace run --watch"
    assert any(o["kind"] == "op" for o in lines)
    states = {g["key"]: g["state"] for g in lines if g["kind"] == "gradient"}
    assert {k for k, v in states.items() if v == "missing"} == {"unused.weight", "unused.bias"}
    assert {v for k, v in states.items() if not k.startswith("unused.")} == {"non_finite"}
    # update 20 is even: the mixing branch ran; the unused layer never does
    fwd = set(forward_span_names(lines))
    assert "extra_mix" in fwd and "unused" not in fwd


def test_a_watched_run_names_the_loader_that_stalled_its_update(tmp_path):
    # update 37's batch, from the program's DataLoader, waits 5x the median update: the
    # slow update's trace says that batch is where its time went
    r = run_watched(tmp_path, [str(PROGRAMS / "char_gpt.py"), "--updates", "40", "--eval-every",
                               "20", "--loader-ms", "20", "--stall-at", "37"], "--max-traces", "10")
    assert r.returncode == 0, r.stderr
    name = "update-000037-slow.jsonl"
    assert (tmp_path / "traces" / name).exists(), r.stderr
    verdict = next(x for x in r.stderr.splitlines() if x.startswith(f"candle-trace: trace traces/{name}: "))
    assert "top span DataLoader.__next__ (" in verdict, verdict
    lines = judged(tmp_path / "traces" / name, tmp_path)
    spans = spans_of(lines)
    measured = next(s for s in spans.values() if s.get("measured"))
    [load] = [s for s in spans.values() if s["name"] == "DataLoader.__next__"]
    assert load["parent_id"] == measured["id"]
    # the stall is 5x a median of at least the 20 ms every batch waits
    assert load["duration_ns"] >= 5 * 0.02e9 and load["duration_ns"] > measured["duration_ns"] / 2
    # the batch's own ops (its windows stacked) are the span's, the model's are not
    ops = [o for o in lines if o["kind"] == "op"]
    assert {o["op_name"] for o in ops if o["span_id"] == load["id"]} >= {"aten::stack"}
    assert "aten::addmm" not in {o["op_name"] for o in ops if o["span_id"] == load["id"]}


def test_a_watched_run_that_dies_of_an_exception_keeps_its_update(tmp_path):
    r = run_watched(tmp_path, [str(PROGRAMS / "char_gpt.py"), "--updates", "25", "--eval-every",
                               "5", "--oom-at", "15"], "--max-traces", "10")
    assert r.returncode == 1, r.stderr  # the program's own status, as without the runner
    assert "RuntimeError: CUDA out of memory. Tried to allocate 20.00 GiB" in r.stderr
    assert "candle-trace: watched 14 updates; " in r.stderr, r.stderr
    assert watched(tmp_path, r) == ["update-000015-exception.jsonl"]
    assert fired_lines(r) == [
        "update 15: exception (RuntimeError: CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; "
        "79.35 GiB total capacity; 71.20 GiB already allocated)) -> trace update-000015-exception.jsonl"]
    lines = judged(tmp_path / "traces" / "update-000015-exception.jsonl", tmp_path, complete=False)
    assert lines[-1]["reason"].startswith("RuntimeError: CUDA out of memory.")
    # what ran before the failure is kept: the forward, and backward's ops up to it
    assert "CharGPT" in forward_span_names(lines)
    assert any(s["kind"] == "span_start" and s["name"] == "backward" for s in lines)
    assert any(o["kind"] == "op" for o in lines)


def test_a_watched_run_with_nothing_wrong_writes_nothing(tmp_path):
    r = run_watched(tmp_path, [str(PROGRAMS / "char_gpt.py"), "--updates", "12", "--eval-every", "4"])
    assert r.returncode == 0, r.stderr
    assert watched(tmp_path, r) == []
    if not list((tmp_path / "traces").glob("*.jsonl")):  # no host stall fired the slow trigger
        assert "candle-trace: watched 12 updates; no triggers fired" in r.stderr, r.stderr
        assert "candle-trace: no trace written to traces: no trigger fired" in r.stderr, r.stderr


def test_a_watched_run_killed_with_its_process_group_keeps_the_update(tmp_path):
    """SIGTERM to the whole group (a job scheduler's way): the program gets it twice, from
    the sender and forwarded by the runner; the second must not kill it while the update's
    trace is written."""
    p = subprocess.Popen([str(RUNNER), "run", "--watch", "traces", "--", sys.executable,
                          str(PROGRAMS / "char_gpt.py"), "--updates", "1000000", "--eval-every",
                          "5", "--loader-ms", "2"], cwd=tmp_path,
                         env=clean_env(PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 300
    for line in p.stdout:  # noqa: B007 - read until the loop is well under way
        if line.startswith("update 10:") or time.time() > deadline:
            break
    assert p.poll() is None, p.communicate()
    os.killpg(p.pid, signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, err
    [name] = watched(tmp_path, subprocess.CompletedProcess([], p.returncode, out, err))
    assert name.endswith("-exception.jsonl"), name
    lines = judged(tmp_path / "traces" / name, tmp_path, complete=False)
    assert lines[-1]["reason"] == "Terminated: killed by SIGTERM (signal 15)"
    assert f"-> trace {name}" in err


def test_a_watched_torchrun_keeps_the_update_of_the_rank_that_went_wrong(tmp_path):
    port = str(free_port())
    if int(torch.__version__.split(".")[0]) >= 2:
        launcher = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port]
    else:  # Debian's torch 1.13 torchrun fails on Python 3.11 (see above)
        launcher = [str(write(tmp_path, "launch.py", LAUNCH)), port]
    r = subprocess.run([str(RUNNER), "run", "--watch", "traces", "--", sys.executable, *launcher,
                        str(PROGRAMS / "ddp_ranks.py")], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600,
                       env=clean_env(OMP_NUM_THREADS="1", DDP_RANKS_NAN_RANK="1"))
    assert r.returncode == 0, r.stderr
    # each rank says its own
    assert "candle-trace: rank 0: watched 4 updates; " in r.stderr, r.stderr
    assert "candle-trace: rank 1: watched 4 updates; " in r.stderr, r.stderr
    fired = fired_lines(r)
    # rank 1's loss of update 3 is NaN; its update 4, captured in full, reads the NaN
    # gradients the all-reduce gave both ranks, and rank 0's own loss turns NaN there
    # from the parameters they updated. Rank 0's update 5, armed after its trigger,
    # never began (the loop ended): no trace of it.
    ones = [f for f in fired if f.startswith("rank 1: ")]
    assert ones[0] == "rank 1: update 3: non_finite (value nan; loss nan) -> trace " \
                      "update-000003-non_finite-rank1.jsonl", fired
    assert ones[1].startswith("rank 1: update 4: non_finite_grad (value nan; non-finite gradient norm in ")
    assert ones[1].endswith("-> trace update-000004-after-non_finite-rank1.jsonl") and len(ones) == 2, fired
    assert [f for f in fired if f.startswith("rank 0: ")] == [
        "rank 0: update 4: non_finite (value nan; loss nan) -> trace update-000004-non_finite-rank0.jsonl"], fired
    assert watched(tmp_path, r) == ["update-000003-non_finite-rank1.jsonl",
                                    "update-000004-after-non_finite-rank1.jsonl",
                                    "update-000004-non_finite-rank0.jsonl"]
    lines = read_trace(tmp_path / "traces" / "update-000003-non_finite-rank1.jsonl")
    assert (lines[0]["process"]["rank"], lines[0]["process"]["world_size"]) == (1, 2)
    assert any(o["kind"] == "op" for o in lines)


def test_a_watched_run_without_its_flight_recorder_captures_the_update_after(tmp_path):
    r = run_watched(tmp_path, [str(PROGRAMS / "char_gpt.py"), "--updates", "25", "--eval-every",
                               "5", "--lr-spike-at", "19"], "--no-flight-recorder", "--max-traces", "10")
    assert r.returncode == 0, r.stderr
    fired = fired_lines(r)
    assert fired[0] == "update 20: non_finite (value nan; loss nan) -> no trace: not recorded: " \
                       "flight_recorder=False", r.stderr
    assert watched(tmp_path, r) == ["update-000021-after-non_finite.jsonl"]
