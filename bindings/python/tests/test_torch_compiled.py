"""_compiled: the modules torch.compile wrapped after the tracer was given them, and the
layout that stands the compiled module in for the plain one (torch >= 2.0; the eager
backend: nothing is compiled until a call, and none is made here)."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch, "compile"):
    pytest.skip("torch.compile needs torch >= 2.0", allow_module_level=True)

from candle_trace.torch import _compiled  # noqa: E402
from candle_trace.torch._capture import Config, Layout  # noqa: E402
from candle_trace.torch._model import Parts  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(4)
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.ln(x))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Block()
        self.b = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


@pytest.fixture(autouse=True)
def tracked():
    _compiled.track()


@pytest.mark.parametrize("how", ["call", "decorator"])
def test_a_compiled_module_is_known_by_its_plain_one(how):
    m = Net()
    before = _compiled.generation()
    om = torch.compile(m, backend="eager") if how == "call" else torch.compile(backend="eager")(m)
    assert _compiled.compiled_as(m) is om
    assert _compiled.generation() == before + 1
    assert _compiled.compiled_as(Net()) is None


def test_a_compiled_function_or_a_dead_module_is_not_a_module_s():
    m = Net()
    before = _compiled.generation()
    torch.compile(lambda x: x + 1, backend="eager")
    assert _compiled.generation() == before
    om = torch.compile(m, backend="eager")
    assert _compiled.compiled_as(m) is om
    del om
    gc.collect()
    assert _compiled.compiled_as(m) is None  # weakly held: the program dropped it


@pytest.mark.parametrize("how", ["taken-early", "dynamo.optimize"])
def test_a_module_compiled_around_torch_compile_is_known_too(how):
    """``from torch import compile`` taken before the tracer wrapped it (torch's own
    function), or ``torch._dynamo.optimize``: the OptimizedModule made is noted all the
    same, once."""
    m = Net()
    heard = []
    remove = _compiled.on_compile(lambda: heard.append(1))
    before = _compiled.generation()
    if how == "taken-early":
        om = torch.compile.__wrapped__(m, backend="eager")  # what the script holds
    else:
        from torch import _dynamo
        om = _dynamo.optimize("eager")(m)
    remove()
    assert _compiled.compiled_as(m) is om
    assert _compiled.generation() == before + 1 and heard == [1]


def test_a_failure_noting_a_compiled_module_leaves_the_compile_alone(monkeypatch):
    def broken(*_):
        raise RuntimeError("noting broke")
    monkeypatch.setattr(_compiled, "_made_of", broken)
    monkeypatch.setattr(_compiled, "warn_once", lambda key, msg: warned.append(msg))
    warned = []
    from torch import _dynamo
    m = Net()
    om = _dynamo.optimize("eager")(m)
    assert om._orig_mod is m
    assert warned and "RuntimeError: noting broke" in warned[0], warned


def test_listeners_hear_each_compile_until_removed():
    heard = []
    remove = _compiled.on_compile(lambda: heard.append(1))
    torch.compile(Net(), backend="eager")
    torch.compile(lambda x: x, backend="eager")  # no module: not heard
    assert heard == [1]
    remove()
    torch.compile(Net(), backend="eager")
    assert heard == [1]


def test_a_layout_stands_the_compiled_module_in_for_the_plain_one():
    m = Net()
    layout = Layout(Parts(m, [("", m)], []), Config(path="unused.jsonl", name="Net", entrypoint="t", phase="train",
                                               capture_step=1, device="cpu"))
    names = [q for q, _ in layout.modules]
    assert names == ["", "a", "a.ln", "a.fc", "b", "b.ln", "b.fc"]
    params = [q for q, _ in layout.params]
    oma = torch.compile(m.a, backend="eager")  # one block compiled after the layout
    layout.refresh()
    assert [(q, x) for q, x in layout.modules] == [("", m), ("a", oma), ("b", m.b),
                                                   ("b.ln", m.b.ln), ("b.fc", m.b.fc)]
    assert layout.tops == [m]
    om = torch.compile(m, backend="eager")  # then the whole model
    layout.refresh()
    assert layout.modules == [("", om)] and layout.tops == [om]
    assert [q for q, _ in layout.params] == params  # the same tensors, the same names


def test_a_module_compiled_in_place_keeps_its_span_and_none_inside():
    """``module.compile()`` compiles the module's call in place (no OptimizedModule): a
    layout looks again, lists the module and nothing inside it, and its span wraps the
    compiled call (``_modules.entry``), never its forward."""
    from candle_trace.torch._modules import entry  # noqa: PLC0415

    m = Net()
    layout = Layout(Parts(m, [("", m)], []), Config(path="unused.jsonl", name="Net", entrypoint="t",
                                                    phase="train", capture_step=1, device="cpu"))
    assert entry(m.a) == "forward"
    before = _compiled.generation()
    m.a.compile(backend="eager")
    assert _compiled.generation() == before + 1
    assert _compiled.compiled_as(m.a) is None
    layout.refresh()
    assert [q for q, _ in layout.modules] == ["", "a", "b", "b.ln", "b.fc"]
    assert entry(m.a) == "_compiled_call_impl" and entry(m.b) == "forward"
