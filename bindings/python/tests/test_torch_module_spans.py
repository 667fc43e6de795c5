"""The module spans and span stacks in C++ (_module_spans.cpp: _spans.NativeSpans,
_modules.NativeModuleSpans) against their Python versions (_spans.Spans,
_modules.PyModuleSpans): the same traces from the same updates, the same answers and
errors from the same calls on the stacks, and what the C++ objects refuse."""

from __future__ import annotations

import dataclasses
import gc
import sys
import threading
import warnings
import weakref
from typing import Optional

import pytest
from conftest import REPO, judged, observer_expected, read_trace

sys.path.insert(0, str(REPO / "examples" / "python"))

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import candle_trace.torch as ctt  # noqa: E402
from candle_trace import CandleTraceError, CandleTraceValueError, Session, Status  # noqa: E402
from candle_trace.torch import Triggers, _capture, _observer  # noqa: E402
from candle_trace.torch import _modules  # noqa: E402
from candle_trace.torch._modules import NativeModuleSpans, PyModuleSpans  # noqa: E402
from candle_trace.torch._spans import NativeSpans, Spans  # noqa: E402

pytestmark = pytest.mark.skipif(
    not observer_expected(), reason="no C++ compiler, ninja or torch headers here")

IMPLEMENTATIONS = ["native", "python"]


def native():
    obs = _observer.get()
    assert obs is not None, _observer.failure()
    return obs.native


@pytest.fixture
def implementation(request, monkeypatch):
    """Captures use the module spans of request.param ("native" is the default where the
    observer is built; "python" is forced here, with the same op observer)."""
    if request.param == "python":
        monkeypatch.setattr(_capture, "spans_for", lambda session, native: Spans(session))
    return request.param


class Pair(nn.Module):
    """Returns a tuple holding a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        return self.a(x), {"b": self.b(x)}


@dataclasses.dataclass
class Head:
    """A model's output record (a dataclass, not a mapping): its first tensor field is
    what the module's statistics read."""

    note: Optional[str]
    logits: torch.Tensor


class HeadOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 2)

    def forward(self, y):
        return Head(note=None, logits=self.proj(y))


class Mix(nn.Module):
    """Takes a list of tensors."""

    def forward(self, xs):
        return torch.stack(xs).sum(0)


class Odd(nn.Module):
    """Module spans' harder cases: tuple, dict and dataclass outputs, a list input, a
    module called twice, a forward with gradients off inside the update, an input
    needing no gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.pair = Pair()
        self.mix = Mix()
        self.shared = nn.Linear(8, 8)
        self.probe = nn.Linear(8, 2)
        self.head = HeadOut()

    def forward(self, x):
        a, d = self.pair(x)
        y = self.mix([a, d["b"]])
        y = self.shared(torch.relu(self.shared(y)))
        with torch.no_grad():
            self.probe(y)
        return self.head(y).logits


class Block(nn.Module):
    """A residual block: the block's input feeds its norm and the residual sum, the norm's
    output feeds two modules."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        h = self.norm(x)
        return x + self.a(h) * torch.sigmoid(self.b(h))


class Residual(nn.Module):
    """Tensors shared between modules; ``kept`` holds the module outputs of the last
    forward (each, a non-leaf tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(8, 2)
        self.kept = []

    def forward(self, x):
        h = self.inp(x)
        y = self.blocks(h)
        out = self.head(y)
        self.kept = [h, y, out]
        return out


class Checkpointed(nn.Module):
    """Residual's blocks under activation checkpointing: their forwards run again inside
    the backward (reentrant: in a backward of their own)."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.inp = nn.Linear(8, 8)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        h = self.inp(x)
        for b in self.blocks:
            h = checkpoint(b, h, use_reentrant=self.reentrant)
        return self.head(h)


RESIDUAL_MODULES = ("m", "inp", "blocks", "head") + tuple(
    f"blocks.{i}{s}" for i in (0, 1) for s in ("", ".norm", ".a", ".b"))


VOLATILE = {"timestamp", "timestamp_ns", "start_ns", "duration_ns", "tid", "run_id",
            "storage_id", "tracer_ns", "tracer_estimated_ns"}


def normalized(lines):
    """A trace without what differs from run to run (times, thread and run ids, storage
    addresses); the meta line reduced to its capture contract."""
    out = []
    for rec in lines:
        if rec["kind"] == "meta":
            out.append(("meta", rec["capture_contract"]))
            continue
        out.append({k: v for k, v in rec.items() if k not in VOLATILE})
    return out


def odd_update(model, opt):
    x, y = torch.randn(4, 8), torch.randn(4, 2)
    opt.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    opt.step()


def gpt_update(w):
    w.update(*w.batch())


def profiled(path, workload):
    """Update 2 of 3 captured in full (statistics of module outputs included)."""
    torch.manual_seed(0)
    if workload == "gpt":
        import workloads
        w = workloads.gpt(2, 8)
        model, opt, update = w.model, w.optimizer, lambda: gpt_update(w)
    elif workload.startswith("checkpointed"):
        model = Checkpointed(reentrant=workload.endswith("reentrant"))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        update = lambda: odd_update(model, opt)  # noqa: E731
    elif workload == "residual":
        model = Residual()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        update = lambda: odd_update(model, opt)  # noqa: E731
    else:
        model = Odd()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        update = lambda: odd_update(model, opt)  # noqa: E731
    torch.manual_seed(1)
    with ctt.profile(model, opt, path, capture_step=2, name="m") as prof:
        for _ in range(3):
            update()
            prof.step()
    return prof


@pytest.mark.parametrize("workload", ["gpt", "odd", "residual"])
def test_native_module_spans_write_the_trace_the_python_ones_write(tmp_path, monkeypatch, workload):
    a = profiled(tmp_path / "native.jsonl", workload)
    assert isinstance(a.capture.spans, NativeSpans)  # the default where the observer is built
    monkeypatch.setattr(_capture, "spans_for", lambda session, native: Spans(session))
    b = profiled(tmp_path / "python.jsonl", workload)
    assert not isinstance(b.capture.spans, NativeSpans)
    native_lines = judged(tmp_path / "native.jsonl", tmp_path)
    python_lines = read_trace(tmp_path / "python.jsonl")
    assert normalized(native_lines) == normalized(python_lines)
    # ... and what both wrote is the module spans (not two equal empty traces)
    spans = {(s["name"], s.get("step")) for s in native_lines
             if s["kind"] == "span_start" and s["span_kind"] == "module"}
    if workload == "odd":
        assert spans == {(n, st) for n in ("m", "pair", "pair.a", "pair.b", "mix", "shared",
                                           "head", "head.proj")
                         for st in ("forward", "backward")} | {("probe [no_grad]", None)}
    elif workload == "residual":
        assert spans == {(n, st) for n in RESIDUAL_MODULES for st in ("forward", "backward")}
        got = backward_spans(native_lines)
        names = [n for n, _ in got]
        # outermost first, and each inside the module that holds it
        assert names.index("blocks") < names.index("blocks.1") < names.index("blocks.1.a")
        parents = dict(got)
        assert parents["blocks.0.a"] == "blocks.0" and parents["blocks.0.norm"] == "blocks.0"
        assert parents["blocks.1"] == "blocks"
    else:
        assert ("blocks.1.attn.qkv", "backward") in spans and ("head", "forward") in spans
    labels = {"odd": ["pair/output", "head/output"],
              "residual": ["blocks.0.norm/output"]}.get(workload, [])
    for label in labels:
        [stats] = [s for s in native_lines if s["kind"] == "tensor_stats" and s["label"] == label]
    if workload == "odd":  # the dataclass's tensor, the head's projection
        [proj] = [s for s in native_lines
                  if s["kind"] == "tensor_stats" and s["label"] == "head.proj/output"]
        assert {k: v for k, v in stats.items() if k not in VOLATILE | {"label", "span_id"}} == \
            {k: v for k, v in proj.items() if k not in VOLATILE | {"label", "span_id"}}


@pytest.mark.parametrize("workload", ["gpt", "odd", "residual", "checkpointed",
                                      "checkpointed-reentrant"])
def test_hooks_on_autograd_nodes_write_the_trace_tensor_hooks_write(tmp_path, monkeypatch, workload):
    monkeypatch.setenv("CANDLE_TRACE_BACKWARD_HOOKS", "tensor")
    profiled(tmp_path / "tensor.jsonl", workload)
    monkeypatch.setenv("CANDLE_TRACE_BACKWARD_HOOKS", "node")
    profiled(tmp_path / "node.jsonl", workload)
    node_lines = judged(tmp_path / "node.jsonl", tmp_path)
    assert normalized(node_lines) == normalized(read_trace(tmp_path / "tensor.jsonl"))
    assert any(s["kind"] == "span_start" and s.get("step") == "backward" and
               s["span_kind"] == "module" for s in node_lines)


@pytest.mark.parametrize("hooks", ["node", "tensor"])
def test_the_gradient_hooks_are_on_autograd_nodes_unless_told(tmp_path, monkeypatch, hooks):
    if hooks == "tensor":
        monkeypatch.setenv("CANDLE_TRACE_BACKWARD_HOOKS", hooks)
    torch.manual_seed(0)
    model = Residual()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ctt.profile(model, opt, tmp_path / "t.jsonl", capture_step=1, name="m") as prof:
        odd_update(model, opt)
        kept = model.kept
        prof.step()
    # the module outputs: no Python hook dict of ours where the node carries the hook
    assert [t._backward_hooks is None for t in kept] == [hooks == "node"] * len(kept)
    lines = judged(tmp_path / "t.jsonl", tmp_path)
    assert sorted(n for n, _ in backward_spans(lines)) == sorted(RESIDUAL_MODULES)


def test_a_backward_hooks_setting_of_neither_kind_is_refused(monkeypatch):
    monkeypatch.setenv("CANDLE_TRACE_BACKWARD_HOOKS", "python")
    with pytest.raises(ValueError, match="CANDLE_TRACE_BACKWARD_HOOKS='python': node or tensor"):
        _modules.backward_hooks()


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="compiled autograd is torch 2.x's")
def test_compiled_autograd_keeps_the_backward_spans_and_the_gradients(tmp_path):
    """Compiled autograd's graph runs in place of the nodes and calls only Python hooks:
    seen in the update before the captured one, the capture hooks the tensors."""
    from torch._dynamo import compiled_autograd

    def run(path):
        torch.manual_seed(0)
        model = Residual()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(1)

        def update():
            opt.zero_grad()
            loss = ((model(torch.randn(4, 8)) - torch.randn(4, 2)) ** 2).mean()
            with compiled_autograd._enable(torch.compile(backend="eager")):
                loss.backward()
            grads = [p.grad.clone() for p in model.parameters()]
            opt.step()
            return grads

        if path is None:
            return [update() for _ in range(3)]
        with ctt.profile(model, opt, path, capture_step=2, name="m") as prof:
            got = []
            for _ in range(3):
                got.append(update())
                prof.step()
        return got

    reference = run(None)
    traced = run(tmp_path / "t.jsonl")
    for want, got in zip(reference, traced):
        for a, b in zip(want, got):
            torch.testing.assert_close(b, a)
    lines = judged(tmp_path / "t.jsonl", tmp_path)
    assert sorted(n for n, _ in backward_spans(lines)) == sorted(RESIDUAL_MODULES)


def backward_spans(lines):
    """Each backward module span as (name, its parent's name), in trace order."""
    starts = {s["id"]: s for s in lines if s["kind"] == "span_start"}
    return [(s["name"], starts[s["parent_id"]]["name"] if s.get("parent_id") in starts else None)
            for s in starts.values() if s["span_kind"] == "module" and s.get("step") == "backward"]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, indirect=True)
@pytest.mark.parametrize("workload", ["checkpointed", "checkpointed-reentrant"])
def test_a_checkpointed_forward_run_again_in_the_backward_is_a_recompute_span(
        tmp_path, implementation, workload):
    """Activation checkpointing runs a block's forward again inside the backward: each such
    module span is ``<name> [recompute]``, with no step, inside the backward that holds its
    time -- not a second forward (before: ``blocks.0`` twice with step forward, the second
    under a backward span). The reentrant kind's first forward runs without gradients."""
    profiled(tmp_path / "c.jsonl", workload)
    lines = judged(tmp_path / "c.jsonl", tmp_path)
    starts = {s["id"]: s for s in lines if s["kind"] == "span_start"}
    blocks = [f"blocks.{i}{s}" for i in (0, 1) for s in ("", ".norm", ".a", ".b")]

    def named(suffix, step):
        return sorted(s["name"][:len(s["name"]) - len(suffix)] for s in starts.values()
                      if s["span_kind"] == "module" and s["name"].endswith(suffix)
                      and s.get("step") == step and s["name"][:len(s["name"]) - len(suffix)] in blocks)

    assert named(" [recompute]", None) == sorted(blocks)
    if workload == "checkpointed":
        assert named("", "forward") == sorted(blocks)
    else:
        assert named("", "forward") == [] and named(" [no_grad]", None) == sorted(blocks)

    def in_backward(s):
        while s.get("parent_id") in starts:
            s = starts[s["parent_id"]]
            if s.get("step") == "backward":
                return True
        return False

    recomputed = [s for s in starts.values() if s["name"].endswith(" [recompute]")]
    assert recomputed and all(in_backward(s) for s in recomputed)
    # the model's other modules ran once, forward
    assert {s["name"] for s in starts.values() if s["name"] in ("m", "inp", "head")
            and s.get("step") == "forward"} == {"m", "inp", "head"}


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, indirect=True)
def test_a_gradient_penalty_s_backward_is_a_span_and_the_forwards_after_it_forwards(
        tmp_path, implementation):
    """A WGAN-GP critic's update: ``torch.autograd.grad(..., create_graph=True)`` is a
    backward pass of its own, the span ``autograd.grad`` (step backward) holding the module
    backward spans it runs through, closed when it returns. Before, nothing spanned it and
    the module spans it opened stayed open: every forward after it in the update was
    written as a recomputation inside a backward (``critic [recompute]``, no forward)."""
    torch.manual_seed(0)
    critic = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt = torch.optim.Adam(critic.parameters(), lr=1e-3)

    def update():
        real, fake = torch.randn(8, 8), torch.randn(8, 8)
        a = torch.rand(8, 1)
        mixed = (a * real + (1 - a) * fake).requires_grad_(True)
        g, = torch.autograd.grad(critic(mixed).sum(), mixed, create_graph=True)
        penalty = ((g.norm(dim=1) - 1) ** 2).mean()
        loss = critic(fake).mean() - critic(real).mean() + 10 * penalty
        opt.zero_grad()
        loss.backward()
        opt.step()

    path = tmp_path / "gp.jsonl"
    with ctt.profile(critic, opt, str(path), capture_step=2, name="critic") as prof:
        for _ in range(3):
            update()
            prof.step()
    lines = judged(path, tmp_path)
    starts = {s["id"]: s for s in lines if s["kind"] == "span_start"}
    names = [s["name"] for s in starts.values()]
    assert not [n for n in names if n.endswith("[recompute]")], names
    assert [s["name"] for s in starts.values() if s.get("step") == "forward"
            and s["name"] == "critic"] == ["critic"] * 3
    [grad] = [s for s in starts.values() if s["name"] == "autograd.grad"]
    assert grad["step"] == "backward" and starts[grad["parent_id"]]["name"] == "update"
    inside = {s["name"] for s in starts.values() if s.get("parent_id") == grad["id"]}
    assert "critic" in inside, inside
    ends = {e["id"] for e in lines if e["kind"] == "span_end"}
    assert set(starts) <= ends  # each closed, the penalty's at its return
    # the program's loss.backward() is the other backward, after it
    assert [s["name"] for s in starts.values() if s.get("step") == "backward"
            and s["span_kind"] == "function"] == ["autograd.grad", "backward"]


def test_a_capture_gone_before_its_backward_runs_leaves_the_hooks_harmless(tmp_path):
    """The capture ends between the forward and the backward: the tensors' hooks write
    nothing and do not fail the backward; the next capture is whole."""
    torch.manual_seed(0)
    model = Residual()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ctt.profile(model, opt, tmp_path / "t.jsonl", capture_step=1, name="m") as prof:
        out = model(torch.randn(4, 8))
        prof.step()  # the captured update ends with the forward
    del prof
    gc.collect()
    before = (tmp_path / "t.jsonl").read_text()
    out.sum().backward()
    assert model.inp.weight.grad is not None
    assert (tmp_path / "t.jsonl").read_text() == before
    lines = read_trace(tmp_path / "t.jsonl")
    assert lines[-1]["kind"] == "terminal" and lines[-1]["outcome"] == "complete", lines[-1]
    assert backward_spans(lines) == []
    # the next capture, over tensors of the last one's graph, is whole
    with ctt.profile(model, opt, tmp_path / "u.jsonl", capture_step=1, name="m") as prof:
        odd_update(model, opt)
        prof.step()
    lines = judged(tmp_path / "u.jsonl", tmp_path)
    assert sorted(n for n, _ in backward_spans(lines)) == sorted(RESIDUAL_MODULES)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, indirect=True)
def test_the_flight_recorder_keeps_module_spans_of_the_update_a_trigger_keeps(tmp_path, implementation):
    torch.manual_seed(0)
    model = Odd()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ctt.watch(model, opt, tmp_path, triggers=Triggers(slow=None), capture_next=False) as w:
        for i in range(1, 5):
            odd_update(model, opt)
            if i == 3:
                w.trigger("why")
            w.step()
        kind = type(w._cap._module_spans)
    assert kind is (NativeModuleSpans if implementation == "native" else PyModuleSpans)
    assert [f.update for f in w.fired] == [3]
    lines = judged(w.traces[0], tmp_path)
    spans = {s["id"]: s for s in lines if s["kind"] == "span_start"}
    steps = {(s["name"], s.get("step")) for s in spans.values() if s["span_kind"] == "module"}
    assert ("pair.a", "backward") in steps and ("probe [no_grad]", None) in steps
    # the backward ops of a module land in its backward span
    bwd = {(spans[o["span_id"]]["name"], o["op_name"]) for o in lines
           if o["kind"] == "op" and spans[o["span_id"]].get("step") == "backward"}
    assert ("head.proj", "aten::mm") in bwd
    assert all("forward" not in m.__dict__ for m in model.modules())  # wrappers removed


class WithBadName(nn.Module):
    """A submodule whose name holds a NUL (nn.Module.add_module lets it through)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Odd()
        self.add_module("bad\0name", nn.Identity())

    def forward(self, x):
        return getattr(self, "bad\0name")(self.inner(x))


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, indirect=True)
def test_a_module_name_the_library_cannot_take_fails_the_capture_not_the_program(tmp_path, implementation):
    torch.manual_seed(0)
    model = WithBadName()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():  # (warned once per process: the other run may have)
        warnings.simplefilter("ignore")
        with ctt.profile(model, opt, tmp_path / "t.jsonl", capture_step=1, name="m") as prof:
            odd_update(model, opt)
            prof.step()
    lines = read_trace(tmp_path / "t.jsonl")
    assert lines[-1]["outcome"] == "failed"
    assert "CandleTraceValueError: candle_trace: Spans.push: name contains a NUL character" in \
        lines[-1]["reason"]


def test_a_capture_and_its_wrappers_are_collected_after_a_watch(tmp_path):
    """The wrappers, tables and hooks (C++ objects in reference cycles through the
    modules) go with the capture."""
    torch.manual_seed(0)
    model = Odd()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ctt.watch(model, opt, tmp_path, triggers=Triggers(slow=None)) as w:
        for _ in range(3):
            odd_update(model, opt)
            w.step()
        cap = weakref.ref(w._cap)
        assert isinstance(w._cap._module_spans, NativeModuleSpans)
        wrapper = model.head.forward  # (torch 2.x: behind torch.compiler.disable's wrapper)
        assert type(getattr(wrapper, "__wrapped__", wrapper)).__name__ == "ModuleForward"
        del wrapper
    del w
    gc.collect()
    assert cap() is None
    assert all("forward" not in m.__dict__ for m in model.modules())


# -- the span stacks, call for call ----------------------------------------------------


@pytest.fixture
def stack_session(tmp_path):
    s = Session(str(tmp_path / "spans.jsonl"), "test::spans", "train", 1, "cpu")
    yield s
    try:
        s.finish_failed("test over")
    except CandleTraceError:
        pass


def make_spans(kind, session):
    return NativeSpans(session, native()) if kind == "native" else Spans(session)


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_the_span_stacks_answer_alike(stack_session, kind):
    spans = make_spans(kind, stack_session)
    assert spans.current() == 1 and spans.stack == []
    m = spans.push_measured("update")
    a = spans.push("f:a", "a", "module", "forward")
    b = spans.push("b:a.b", "a.b", "module", "backward")
    assert spans.stack == [("update", m), ("f:a", a), ("b:a.b", b)]
    assert spans.current() == b
    assert spans.find("f:a") == a and spans.find("nobody") is None
    other = []
    t = threading.Thread(target=lambda: other.append((spans.current(), spans.stack)))
    t.start()
    t.join()
    assert other == [(1, [])]  # per thread
    spans.close_until(12345)  # not open: nothing closes
    assert len(spans.stack) == 3
    spans.close_until(a)  # a and what is inside it
    assert spans.stack == [("update", m)]
    spans.pop_top()
    assert spans.stack == []
    with pytest.raises(IndexError):
        spans.pop_top()
    spans.push("optimizer", "step", "function", "optimizer")
    spans.reset()
    assert spans.stack == [] and spans.current() == 1


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_the_span_stacks_count_the_spans_other_threads_hold_open(stack_session, kind):
    """What autograd's device threads leave open on CUDA (a module whose inputs need no
    gradient): the capture asks after the backward call, and closes them there
    (_autograd_threads). A thread that opens spans and closes them leaves none."""
    spans = make_spans(kind, stack_session)
    spans.push_measured("update")
    assert spans.open_elsewhere() == 0
    go, done, seen = threading.Event(), threading.Event(), []

    def device_thread():
        spans.push("b:model", "model", "module", "backward")
        spans.push("b:model.0", "model.0", "module", "backward")
        seen.append(spans.open_elsewhere())  # the main thread's measured region
        go.set()
        done.wait(10)
        while spans.stack:
            spans.pop_top()

    t = threading.Thread(target=device_thread)
    t.start()
    assert go.wait(10)
    assert seen == [1]
    assert spans.open_elsewhere() == 2
    assert len(spans.stack) == 1  # the calling thread's own are not counted
    done.set()
    t.join()
    assert spans.open_elsewhere() == 0
    spans.reset()
    assert spans.open_elsewhere() == 0


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_the_span_stacks_refuse_alike(stack_session, kind):
    spans = make_spans(kind, stack_session)
    spans.push_measured("update")
    # the binding's check
    with pytest.raises(CandleTraceValueError) as e:
        spans.push("f:x", "a\0b", "module", "forward")
    assert e.value.status == Status.CT_ERR_INVALID_ARGUMENT
    assert "candle_trace: Spans.push: name contains a NUL character ('a\\x00b')" in str(e.value)
    # the library's: a name that is not UTF-8, a span closed behind the stack's back
    with pytest.raises(CandleTraceError) as e:
        spans.push("f:x", b"\xff\xfe", "module", "forward")
    assert e.value.status == Status.CT_ERR_INVALID_ARGUMENT and "UTF-8" in str(e.value)
    inner = spans.push("f:y", "y", "module", "forward")
    stack_session.end_span(inner)
    with pytest.raises(CandleTraceError) as e:
        spans.pop_top()
    assert e.value.status != Status.CT_OK and str(e.value)
    assert len(spans.stack) == 1  # the refused span left the stack all the same


def test_the_native_objects_refuse_bad_arguments(stack_session):
    nat = native()
    hc = stack_session._hc
    with pytest.raises(ValueError, match="address"):
        nat.span_stack(hc, 0, lambda st: None)
    with pytest.raises(ValueError, match="callable"):
        nat.span_stack(hc, 8, "not callable")
    stack = nat.span_stack(hc, __import__("ctypes").addressof(hc), lambda st: None)
    with pytest.raises(TypeError):
        nat.module_table(object(), "not a stack", "k", print, None, "m", None)
    with pytest.raises(TypeError, match="StatsBuffer or None"):
        nat.module_table(object(), stack, "k", print, None, "m", "not a buffer")
    table = nat.module_table(object(), stack, "k", print, None, "m", nat.stats_buffer())
    with pytest.raises(IndexError, match="no such module"):
        table.wrapper(0, print)
    with pytest.raises(TypeError, match="bytes or the exception"):
        table.add(nn.Linear(1, 1), "m", "", "not bytes", b"m [no_grad]", b"m [recompute]",
                  b"m/output", True)
    with pytest.raises(TypeError):
        type(nat.stats_buffer())()
    with pytest.raises(ValueError, match="filled ct_tensor_stats"):
        nat.stats_buffer().add(1, 0)
    # the clock's brackets answer the library's status, as the ctypes calls they replace
    assert (stack.pause(), stack.resume()) == (0, 0)
    assert stack.resume() != 0  # no interval open: refused, not raised
    with pytest.raises(TypeError):
        type(stack)()
    with pytest.raises(TypeError):
        stack.find(3)
    # a status the raise callback does not raise on is still an error
    with pytest.raises(RuntimeError, match="status"):
        stack.push("f:x", b"\xff", 2, 1)
