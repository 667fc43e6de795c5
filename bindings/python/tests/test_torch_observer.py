"""The C++ op observer of candle_trace.torch (real torch, real compiler) and its fallback,
the Python dispatch mode."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
from conftest import REPO, candle_graph, observer_expected, read_trace, validate

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import candle_trace.torch as ctt  # noqa: E402
from candle_trace.torch import _observer  # noqa: E402

needs_observer = pytest.mark.skipif(
    not observer_expected(), reason="no C++ compiler, ninja or torch headers here")


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def capture(path, mechanism, monkeypatch, steps=3, capture_step=2, **kw):
    monkeypatch.setenv("CANDLE_TRACE_TORCH_OPS", mechanism)
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ctt.profile(model, opt, path, capture_step=capture_step, name="mlp", **kw) as prof:
        for _ in range(steps):
            x, y = torch.randn(8, 16), torch.randn(8, 4)
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            prof.step()
    return prof, read_trace(path)


def ops_by_span(lines):
    spans = {s["id"]: s for s in lines if s["kind"] == "span_start"}
    return spans, [(spans[o["span_id"]]["name"], spans[o["span_id"]].get("step"),
                    o["op_name"], tuple(o["shape"])) for o in lines if o["kind"] == "op"]


@needs_observer
def test_observer_is_the_default_and_its_trace_is_valid(tmp_path, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning where a compiler exists
        prof, lines = capture(tmp_path / "obs.jsonl", "auto", monkeypatch)
    assert prof.op_mechanism == "observer"
    assert lines[0]["capture_contract"]["operations"] == "complete"
    assert lines[-1]["outcome"] == "complete"
    summary = candle_graph(tmp_path / "obs.jsonl", tmp_path)
    assert summary["health"]["structurally_valid"] and summary["health"]["capture_complete"]
    assert "OK" in validate(tmp_path / "obs.jsonl")

    spans, ops = ops_by_span(lines)
    # forward: linear decomposes into t + addmm, in the module span that ran it
    fwd = [(m, op, shape) for m, step, op, shape in ops if step == "forward"]
    assert ("fc1", "aten::addmm", (8, 32)) in fwd and ("fc2", "aten::addmm", (8, 4)) in fwd
    assert ("act", "aten::relu", (8, 32)) in fwd
    assert ("fc1", "aten::t", (16, 32)) in fwd  # the weight (32, 16), transposed
    # backward ops land in the backward module spans, optimizer ops in the optimizer span
    bwd = {(m, op) for m, step, op, _ in ops if step == "backward"}
    assert ("fc1", "aten::mm") in bwd and ("act", "aten::threshold_backward") in bwd
    opt_ops = [o for o in lines if o["kind"] == "op"
               and spans[o["span_id"]].get("step") == "optimizer"]
    assert sorted(o["output"] for o in opt_ops if o["op_name"] == "aten::add_") == sorted(
        ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"])
    # none of the binding's own torch work (stats, gradient norms) is recorded
    assert not any(o["op_name"] in ("aten::isfinite", "aten::linalg_vector_norm", "aten::stack")
                   for o in lines if o["kind"] == "op")
    # op timestamps lie inside their spans (the library checks it; be explicit)
    ends = {s["id"]: s["duration_ns"] for s in lines if s["kind"] == "span_end"}
    for o in (o for o in lines if o["kind"] == "op"):
        s = spans[o["span_id"]]
        assert s["start_ns"] <= o["timestamp_ns"]
        assert o["timestamp_ns"] + o["duration_ns"] <= s["start_ns"] + ends[o["span_id"]]


@needs_observer
def test_observer_tensor_ids_edges_and_memory(tmp_path, monkeypatch):
    prof, lines = capture(tmp_path / "ids.jsonl", "auto", monkeypatch)
    ops = [o for o in lines if o["kind"] == "op"]
    addmm1 = next(o for o in ops if o["op_name"] == "aten::addmm" and o["shape"] == [8, 32])
    t1 = next(o for o in ops if o["op_name"] == "aten::t" and "fc1.weight" in o["inputs"])
    relu = next(o for o in ops if o["op_name"] == "aten::relu")
    # data flow by id: fc1.weight -> t -> addmm -> relu
    assert addmm1["inputs"][0] == "fc1.bias" and t1["output"] in addmm1["inputs"]
    assert relu["inputs"] == [addmm1["output"]]
    edges = {(e["from_tensor"], e["to_tensor"]) for e in lines if e["kind"] == "edge"}
    assert ("fc1.weight", t1["output"]) in edges and (addmm1["output"], relu["output"]) in edges
    # every op output id is produced once (in-place ops output their input)
    produced = [o["output"] for o in ops if o.get("output") and o["output"] not in o["inputs"]]
    assert len(produced) == len(set(produced))
    # memory: op outputs' allocations, frees of those that died, a consistent timeline
    mem = [m for m in lines if m["kind"] == "memory"]
    allocs = {m["tensor_id"]: m for m in mem if m["action"] == "alloc"}
    assert addmm1["output"] in allocs and allocs[addmm1["output"]]["bytes"] == 8 * 32 * 4
    assert allocs[addmm1["output"]]["op_name"] == "aten::addmm"
    assert any(m["action"] == "free" for m in mem)
    live = {}
    for m in sorted(mem, key=lambda m: m["timestamp_ns"]):
        if m["action"] == "alloc":
            assert m["storage_id"] not in live
            live[m["storage_id"]] = m["bytes"]
        else:
            assert live.pop(m["storage_id"]) == m["bytes"]
    assert prof.op_count == len(ops)


@needs_observer
def test_both_mechanisms_record_the_same_model_ops(tmp_path, monkeypatch):
    _, obs = capture(tmp_path / "a.jsonl", "observer", monkeypatch)
    _, disp = capture(tmp_path / "b.jsonl", "dispatch", monkeypatch)
    # The dispatch mode also sees autograd's internal aten::detach calls and the
    # profiler's record_function op; the observer reports the latter's aten::empty.
    # (torch 2.x names the latter profiler::_record_function_enter_new.)
    def kept(x):
        return x[2] not in ("aten::detach", "aten::empty") and not x[2].startswith("profiler::")
    a = [x for x in ops_by_span(obs)[1] if kept(x)]
    b = [x for x in ops_by_span(disp)[1] if kept(x)]
    assert a == b


def test_dispatch_mode_when_forced(tmp_path, monkeypatch):
    prof, lines = capture(tmp_path / "d.jsonl", "dispatch", monkeypatch)
    assert prof.op_mechanism == "dispatch"
    assert any(o["kind"] == "op" and o["op_name"] == "aten::addmm" for o in lines)
    candle_graph(tmp_path / "d.jsonl", tmp_path)
    validate(tmp_path / "d.jsonl")


@pytest.fixture
def broken_build(monkeypatch):
    """The observer as on a machine without a compiler: its build fails."""
    def fail(verbose=False):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(_observer, "_observer", None)
    monkeypatch.setattr(_observer, "build", fail)
    monkeypatch.setattr(_observer.get, "_warned", False, raising=False)
    yield
    monkeypatch.setattr(_observer, "_observer", None)  # rebuilt (cached) on next use


def test_fallback_warns_once_when_the_observer_cannot_be_built(tmp_path, monkeypatch,
                                                               broken_build):
    with pytest.warns(RuntimeWarning, match="Ninja is required") as rec:
        prof, lines = capture(tmp_path / "f1.jsonl", "auto", monkeypatch)
        prof2, _ = capture(tmp_path / "f2.jsonl", "auto", monkeypatch)
    assert len([w for w in rec if "observer is unavailable" in str(w.message)]) == 1
    assert prof.op_mechanism == prof2.op_mechanism == "dispatch"
    assert lines[-1]["outcome"] == "complete"
    assert any(o["kind"] == "op" for o in lines)
    candle_graph(tmp_path / "f1.jsonl", tmp_path)


def test_observer_required_but_unavailable_is_an_error(tmp_path, monkeypatch, broken_build):
    with pytest.raises(_observer.ObserverUnavailable, match="Ninja is required"):
        capture(tmp_path / "r.jsonl", "observer", monkeypatch)


def test_bad_mechanism_name(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="CANDLE_TRACE_TORCH_OPS"):
        capture(tmp_path / "x.jsonl", "fast", monkeypatch)


@needs_observer
def test_observer_released_after_a_failed_capture(tmp_path, monkeypatch):
    monkeypatch.setenv("CANDLE_TRACE_TORCH_OPS", "observer")
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="boom"):
        with ctt.profile(model, opt, tmp_path / "fail.jsonl", capture_step=1) as prof:
            ((model(torch.randn(2, 16)) ** 2).mean()).backward()
            raise RuntimeError("boom")
    assert read_trace(tmp_path / "fail.jsonl")[-1]["outcome"] == "failed"
    assert torch.autograd._profiler_enabled() is False
    # the next capture gets the observer again, with ops
    prof, lines = capture(tmp_path / "again.jsonl", "observer", monkeypatch)
    assert prof.op_mechanism == "observer" and prof.op_count > 0
    candle_graph(tmp_path / "again.jsonl", tmp_path)


def _updates(model, opt, prof, batches, obs, running, fail_at=None):
    for i, b in enumerate(batches):
        running.append(obs.running)  # as the update begins
        x, y = torch.randn(b, 16), torch.randn(b, 4)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        if i == fail_at:
            raise RuntimeError("boom in the rehearsed update")
        opt.step()
        prof.step()


@needs_observer
def test_the_update_before_the_captured_one_rehearses_the_observer(tmp_path, monkeypatch):
    """The update before the captured one runs with the observer on, so that torch's path
    to it is warm in the captured update; nothing it recorded reaches the trace."""
    monkeypatch.setenv("CANDLE_TRACE_TORCH_OPS", "observer")
    obs = _observer.get()
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    running: list = []
    path = tmp_path / "rehearsed.jsonl"
    # a batch size per update: an op's shape says which update it ran in
    with ctt.profile(model, opt, path, capture_step=3, name="mlp") as prof:
        _updates(model, opt, prof, [5, 6, 7, 9], obs, running)
    assert running == [False, True, False, False]
    assert obs.running is False
    lines = read_trace(path)
    assert lines[-1]["outcome"] == "complete"
    ops = [o for o in lines if o["kind"] == "op"]
    assert len(ops) == prof.op_count > 0
    addmm = sorted(tuple(o["shape"]) for o in ops if o["op_name"] == "aten::addmm")
    assert addmm == [(7, 4), (7, 32)]  # the captured update's alone, not the rehearsal's
    candle_graph(path, tmp_path)


@needs_observer
def test_a_rehearsed_update_that_raises_releases_the_observer(tmp_path, monkeypatch):
    monkeypatch.setenv("CANDLE_TRACE_TORCH_OPS", "observer")
    obs = _observer.get()
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    running: list = []
    with pytest.raises(RuntimeError, match="boom in the rehearsed update"):
        with ctt.profile(model, opt, tmp_path / "f.jsonl", capture_step=3) as prof:
            _updates(model, opt, prof, [5, 6, 7], obs, running, fail_at=1)
    assert running == [False, True]
    assert obs.running is False
    lines = read_trace(tmp_path / "f.jsonl")
    assert lines[-1]["outcome"] == "failed" and not [o for o in lines if o["kind"] == "op"]
    assert "boom in the rehearsed update" in lines[-1]["reason"]
    prof, lines = capture(tmp_path / "again.jsonl", "observer", monkeypatch)
    assert prof.op_count > 0 and lines[-1]["outcome"] == "complete"


@needs_observer
def test_an_op_is_recorded_alone_whether_its_kind_calls_other_ops_or_not(tmp_path, monkeypatch):
    """The observer leaves record functions on for an op whose kind has called no other op
    so far (turning them off and on again costs torch more than such an op's callbacks)
    and learns when it does: add_ of a tensor calls none, add_ of a Python number calls
    some. Either way the op alone is recorded, in order."""
    monkeypatch.setenv("CANDLE_TRACE_TORCH_OPS", "observer")
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.zeros(8)
    path = tmp_path / "nests.jsonl"
    with ctt.profile(model, opt, path, capture_step=1, name="mlp") as prof:
        opt.zero_grad()
        model(torch.randn(4, 16)).sum().backward()
        with torch.no_grad():
            for _ in range(3):
                x.add_(x)
                x.add_(1)
        opt.step()
        prof.step()
    assert x.tolist() == [7.0] * 8  # ((0*2+1)*2+1)*2+1
    ops = [(o["op_name"], o["shape"]) for o in read_trace(path) if o["kind"] == "op"]
    first = ops.index(("aten::add_", [8]))
    assert ops[first:first + 7] == [("aten::add_", [8])] * 6 + [ops[first + 6]]
    assert ops[first + 6] != ("aten::add_", [8]) and prof.op_count == len(ops)
    candle_graph(path, tmp_path)


@needs_observer
def test_ops_on_another_thread_go_to_that_threads_span(tmp_path, monkeypatch):
    """A thread with no span of its own records into the measured region; spans nest
    per thread."""
    monkeypatch.setenv("CANDLE_TRACE_TORCH_OPS", "observer")
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "thread.jsonl"
    with ctt.profile(model, opt, path, capture_step=1, name="mlp") as prof:
        opt.zero_grad()
        out = model(torch.randn(4, 16))
        t = threading.Thread(target=lambda: torch.ones(3, 5).sum())
        t.start()
        t.join()
        out.sum().backward()
        opt.step()
        prof.step()
    lines = read_trace(path)
    spans = {s["id"]: s for s in lines if s["kind"] == "span_start"}
    sums = [o for o in lines if o["kind"] == "op" and o["op_name"] == "aten::ones"]
    assert len(sums) == 1 and spans[sums[0]["span_id"]]["name"] == "update"
    candle_graph(path, tmp_path)
    validate(path)


@needs_observer
def test_under_an_active_torch_profiler_ops_are_still_captured(tmp_path, monkeypatch):
    with torch.profiler.profile(profile_memory=True):
        with pytest.warns(RuntimeWarning, match="op output memory is not captured"):
            prof, lines = capture(tmp_path / "tp.jsonl", "observer", monkeypatch)
    assert prof.op_mechanism == "observer" and prof.op_count > 0
    assert not [m for m in lines if m["kind"] == "memory"]
    candle_graph(tmp_path / "tp.jsonl", tmp_path)


@needs_observer
def test_observer_builds_into_the_cache_folder(tmp_path, monkeypatch):
    name, folder = _observer.build_dir()
    assert str(folder).startswith(str(_observer.cache_root()))
    assert torch.__version__.replace("+", "_") in str(folder)
    so = _observer.build()
    assert so.exists() and so.parent == folder



@needs_observer
def test_a_built_observer_loads_without_building_again(tmp_path):
    # torch 2.x's build lock is a file that stays (an advisory lock on it): taken for a
    # build under way, it sent every process through cpp_extension.load, which said
    # "compiling the PyTorch op observer" each time
    _observer.build()
    env = dict(os.environ, PYTHONPATH=str(REPO / "bindings" / "python"))
    r = subprocess.run([sys.executable, "-c", "import sys; from candle_trace.torch import "
                        "_observer; print(_observer.build()); "
                        "print('torch.utils.cpp_extension' in sys.modules)"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    path, imported = r.stdout.split()
    assert Path(path) == _observer.build()
    assert "compiling" not in r.stderr, r.stderr
    # nor the build tools' import (setuptools with it): the folder says it is built
    assert imported == "False"
    assert (Path(path).parent / "built").exists()


def test_a_build_is_under_way_while_torch_holds_its_lock(tmp_path):
    from torch.utils import cpp_extension
    assert not _observer.build_under_way(tmp_path)
    lock = tmp_path / "lock"
    lock.touch()
    advisory = hasattr(cpp_extension, "FileLock")  # else a FileBaton: the file is the lock
    assert _observer.build_under_way(tmp_path) is not advisory
    if advisory:
        with open(lock) as held:  # as a building process holds it
            fcntl.flock(held, fcntl.LOCK_EX)
            assert _observer.build_under_way(tmp_path)
        assert not _observer.build_under_way(tmp_path)


ASAN_SCRIPT = r"""
import sys, tempfile
from torch.utils import cpp_extension
orig = cpp_extension.load
def load(**kw):  # the observer, built with AddressSanitizer
    kw["extra_cflags"] = [f for f in kw["extra_cflags"] if f != "-O2"] + [
        "-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer"]
    kw["extra_ldflags"] = ["-fsanitize=address"]
    return orig(**kw)
cpp_extension.load = load
import torch
import candle_trace.torch as ctt
m = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
with ctt.profile(m, opt, sys.argv[1], capture_step=1, name="lin") as prof:
    y = m(torch.randn(2, 4))
    for _ in range(5):
        # a boxed call: 2.0 becomes a wrapped-number tensor that the call's stack alone
        # owns, freed (torch 2.x) before the op's RecordFunction ends
        y = torch.ops.aten.add.Tensor(y, 2.0)
    y.sum().backward()
    opt.step()
    prof.step()
print("ops", prof.op_mechanism, prof.op_count)
"""


@needs_observer
def test_observer_pins_inputs_that_a_boxed_call_frees_early(tmp_path):
    """Under AddressSanitizer: the observer pins an op's inputs when the op starts (an
    input may be gone by its end: that was a heap-use-after-free that corrupted the heap
    when torch.compile ran inside a captured update)."""
    cxx = shutil.which("g++") or shutil.which("c++")
    asan = cxx and subprocess.run([cxx, "-print-file-name=libasan.so"], capture_output=True,
                                  text=True).stdout.strip()
    stdcxx = cxx and subprocess.run([cxx, "-print-file-name=libstdc++.so.6"],
                                    capture_output=True, text=True).stdout.strip()
    if not (asan and Path(asan).is_absolute() and Path(asan).exists()):
        pytest.skip("no libasan for the C++ compiler here")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(CANDLE_TRACE_CACHE=str(tmp_path / "cache"), CANDLE_TRACE_TORCH_OPS="observer",
               PYTHONPATH=str(REPO / "bindings" / "python"),
               # libstdc++ too: ASan's __cxa_throw interceptor needs it loaded first
               LD_PRELOAD=" ".join(p for p in (asan, stdcxx) if p and Path(p).is_absolute()),
               ASAN_OPTIONS="detect_leaks=0:detect_odr_violation=0:abort_on_error=0")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")])
    r = subprocess.run([sys.executable, "-c", ASAN_SCRIPT, str(tmp_path / "t.jsonl")], env=env,
                       capture_output=True, text=True, timeout=600)
    assert "AddressSanitizer" not in r.stderr, r.stderr[-4000:]
    assert r.returncode == 0, r.stderr[-4000:]
    assert "ops observer" in r.stdout
