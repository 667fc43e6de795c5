"""_compile.Compilations against a stand-in for dynamo's callback handler: what it
registers, when, and what it calls (any torch: the handler is faked in sys.modules;
test_torch_compile.py runs the real one on torch 2.x)."""

from __future__ import annotations

import sys
import threading
import types

import pytest

pytest.importorskip("torch")

from candle_trace.torch._compile import Compilations, RecompileReasons, span_name  # noqa: E402


class Handler:
    """dynamo's CompilationCallbackHandler, as far as Compilations uses it."""

    def __init__(self) -> None:
        self.start: list = []
        self.end: list = []

    def register_start_callback(self, fn):
        self.start.append(fn)
        return fn

    def register_end_callback(self, fn):
        self.end.append(fn)
        return fn

    def remove_start_callback(self, fn):
        self.start.remove(fn)

    def remove_end_callback(self, fn):
        self.end.remove(fn)

    def compile(self, trigger="DYNAMO"):
        args = types.SimpleNamespace(callback_trigger=types.SimpleNamespace(name=trigger),
                                     compile_id="0/1")
        for fn in list(self.start):
            fn(args)
        return lambda: [fn(args) for fn in list(self.end)]


@pytest.fixture
def dynamo(monkeypatch):
    """A fake torch._dynamo, put in place by calling the returned function."""
    handler = Handler()

    def imported():
        monkeypatch.setitem(sys.modules, "torch._dynamo", types.SimpleNamespace(
            callback=types.SimpleNamespace(callback_handler=handler)))
        return handler

    monkeypatch.delitem(sys.modules, "torch._dynamo", raising=False)
    return imported


class Recorder:
    def __init__(self, refuse: bool = False) -> None:
        self.calls: list = []
        self.refuse = refuse

    def begin(self, name):
        self.calls.append(("begin", name, threading.get_ident()))
        return None if self.refuse else name

    def end(self, token):
        self.calls.append(("end", token, threading.get_ident()))


@pytest.mark.parametrize("trigger,name", [("DYNAMO", "torch.compile"),
                                          ("LAZY_BACKWARD", "torch.compile (backward)"),
                                          ("CUDAGRAPH_RECORDING", "torch.compile (cudagraph recording)")])
def test_the_span_is_named_after_what_dynamo_compiles(trigger, name):
    args = types.SimpleNamespace(callback_trigger=types.SimpleNamespace(name=trigger))
    assert span_name(args) == name
    assert span_name(None) == "torch.compile"  # a torch whose callbacks take no argument


def test_it_registers_once_dynamo_is_imported_and_never_after_removal(dynamo):
    rec = Recorder()
    c = Compilations(rec.begin, rec.end)
    c.ensure()  # install() not called: nothing to ensure
    assert c.install() is False  # no dynamo imported yet
    handler = dynamo()
    c.ensure()  # now there is
    assert (len(handler.start), len(handler.end)) == (1, 1)
    c.ensure()  # once
    assert (len(handler.start), len(handler.end)) == (1, 1)
    done = handler.compile()
    done()
    me = threading.get_ident()
    assert rec.calls == [("begin", "torch.compile", me), ("end", "torch.compile", me)]
    c.remove()
    assert (handler.start, handler.end) == ([], [])
    c.ensure()  # removed for good
    assert handler.start == []
    c.remove()  # idempotent


def test_an_open_compilation_ends_at_removal_on_its_thread_only(dynamo):
    handler = dynamo()
    rec = Recorder()
    c = Compilations(rec.begin, rec.end)
    assert c.install() is True
    handler.compile("LAZY_BACKWARD")  # never ends: the capture fails inside it, say
    handler.compile()  # nested on the same thread: one span is enough
    assert [k for k, *_ in rec.calls] == ["begin"]
    other = threading.Thread(target=c.remove)  # another thread's removal ends nothing here
    other.start()
    other.join()
    assert [k for k, *_ in rec.calls] == ["begin"]
    c2 = Compilations(rec.begin, rec.end)
    c2.install()
    handler.compile()
    c2.remove()  # on the compiling thread: its span ends
    assert rec.calls[-1][:2] == ("end", "torch.compile")


def test_a_compilation_begin_declines_is_not_ended(dynamo):
    handler = dynamo()
    rec = Recorder(refuse=True)  # the capture is not recording
    c = Compilations(rec.begin, rec.end)
    c.install()
    handler.compile()()
    assert [k for k, *_ in rec.calls] == ["begin"]


def test_removal_after_dynamo_cleared_its_callbacks(dynamo):
    handler = dynamo()
    c = Compilations(Recorder().begin, Recorder().end)
    c.install()
    handler.start.clear()  # torch._dynamo.reset()
    handler.end.clear()
    c.remove()  # no ValueError


def test_the_reasons_are_those_recorded_since_the_last_look(monkeypatch):
    failures: dict = {}
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils",
                        types.SimpleNamespace(guard_failures=failures))
    a, b = object(), object()  # two compiled functions' code objects
    failures[a] = ["0/0: tensor 'idx' size mismatch at index 0. expected 8, actual 4\n"
                   "User stack trace:\n  ..."]
    r = RecompileReasons()
    assert r.take() == ["0/0: tensor 'idx' size mismatch at index 0. expected 8, actual 4"]
    assert r.take() == []  # nothing new
    failures[a].append("0/1: L['self'].calls == 3")
    failures[b] = ["1/0: ___check_type_id(L['x'], 1234)"]
    assert r.take() == ["0/1: L['self'].calls == 3", "1/0: ___check_type_id(L['x'], 1234)"]
    failures.clear()  # torch._dynamo.reset()
    failures[a] = ["0/0: again"]
    assert r.take() == ["0/0: again"]


def test_no_reasons_without_dynamo_or_its_record(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch._dynamo.utils", raising=False)
    assert RecompileReasons().take() == []
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", types.SimpleNamespace())
    assert RecompileReasons().take() == []
