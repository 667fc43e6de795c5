"""candle_trace.torch against real torch (no mocks) and the real library."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, observer_expected, candle_graph, read_trace, validate

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import candle_trace.torch as ctt  # noqa: E402

EXAMPLE = REPO / "examples" / "python" / "train_mlp.py"


def by_kind(lines, kind):
    return [line for line in lines if line["kind"] == kind]


def example_env(**extra):
    # The interpreter's own bin first: a virtualenv's ninja builds the observer.
    env = {"PYTHONPATH": str(REPO / "bindings" / "python"),
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/bin", "/bin"])}
    for k in ("HOME", "CANDLE_TRACE_CACHE", "CANDLE_TRACE_LIB", "XDG_CACHE_HOME"):
        if k in os.environ:
            env[k] = os.environ[k]
    env.update(extra)
    return env


# Both op capture mechanisms: the C++ observer (the default; the dispatch mode stands in
# where no compiler is available, which test_torch_observer.py checks) and the Python
# dispatch mode (forced).
@pytest.fixture(scope="module", params=["auto", "dispatch"])
def example_trace(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"example-{request.param}")
    path = d / "mlp.jsonl"
    r = subprocess.run([sys.executable, str(EXAMPLE), str(path)], capture_output=True,
                       text=True, timeout=600,
                       env=example_env(CANDLE_TRACE_TORCH_OPS=request.param))
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout
    if request.param == "dispatch":
        assert "via dispatch" in r.stdout
    elif observer_expected():
        assert "via observer" in r.stdout, r.stdout + r.stderr
        assert "Warning" not in r.stderr, r.stderr
        # c10's "[W ... CPUAllocator.cpp] Memory block of unknown size was allocated
        # before the profiling started" is held back during the capture
        assert "Memory block" not in r.stderr, r.stderr
    return path


def test_example_trace_is_valid_and_complete(example_trace, tmp_path):
    summary = candle_graph(example_trace, tmp_path)
    assert summary["health"]["structurally_valid"] and summary["health"]["capture_complete"]
    assert "OK" in validate(example_trace)
    lines = read_trace(example_trace)
    assert lines[-1]["outcome"] == "complete"
    meta = lines[0]
    assert meta["comparison_identity"]["implementation_id"] == "pytorch"
    assert meta["comparison_identity"]["model_id"] == "mlp-64-64-10"
    assert meta["capture_step"] == 3 and meta["warmup_steps"] == 2


def test_example_trace_matches_the_model(example_trace):
    sys.path.insert(0, str(EXAMPLE.parent))
    import train_mlp  # noqa: PLC0415

    model = train_mlp.MLP()
    params = dict(model.named_parameters())
    lines = read_trace(example_trace)
    spans = {s["id"]: s for s in by_kind(lines, "span_start")}

    # one gradient per parameter, in the contract, with a norm
    grads = by_kind(lines, "gradient")
    assert sorted(g["key"] for g in grads) == sorted(params)
    assert all(g["root"] == "mlp" and g["state"] == "present" and g["norm"] > 0 for g in grads)
    expected = lines[0]["capture_contract"]["gradient_contract"]["expected"]
    assert [e["key"] for e in expected] == list(params)

    # parameter tensors with the model's shapes
    tensors = {t["tensor_id"]: t for t in by_kind(lines, "tensor")}
    for name, p in params.items():
        assert tensors[name]["shape"] == list(p.shape) and tensors[name]["category"] == "parameter"

    # module spans in forward and backward, the optimizer, one measured region
    mods = {(s["name"], s.get("step")) for s in spans.values() if s["span_kind"] == "module"}
    for m in ("mlp", "fc1", "act", "fc2"):
        assert (m, "forward") in mods and (m, "backward") in mods
    assert [s["name"] for s in spans.values() if s.get("measured")] == ["update"]
    assert any(s.get("step") == "optimizer" for s in spans.values())

    # ops: the linear layers' addmm with the right output shapes, in their module span
    ops = by_kind(lines, "op")
    fwd_addmm = [o for o in ops if o["op_name"] == "aten::addmm"
                 and spans[o["span_id"]].get("step") == "forward"]
    assert sorted((spans[o["span_id"]]["name"], tuple(o["shape"])) for o in fwd_addmm) == [
        ("fc1", (32, 64)), ("fc2", (32, 10))]
    assert all(o["device"] == "cpu" and o["duration_ns"] >= 0 for o in ops)
    assert all(o["dtype"] == "f32" for o in ops if o["op_name"] in ("aten::addmm", "aten::mm"))
    assert any(spans[o["span_id"]].get("step") == "backward" for o in ops)
    assert any("fc1.weight" in o["inputs"] for o in ops)
    assert by_kind(lines, "edge")

    # memory: allocations of op outputs, frees of the ones that died during the step
    mem = by_kind(lines, "memory")
    assert any(m["action"] == "alloc" for m in mem) and any(m["action"] == "free" for m in mem)
    live = {}  # addresses are reused: replay the lifetimes in time order
    for m in sorted(mem, key=lambda m: m["timestamp_ns"]):
        if m["action"] == "alloc":
            assert m["storage_id"] not in live
            live[m["storage_id"]] = m["bytes"]
        else:
            assert live.pop(m["storage_id"]) == m["bytes"]

    # stats of the loss and each module's output
    stats = {s["label"]: s for s in by_kind(lines, "tensor_stats")}
    assert stats["loss"]["shape"] == [] and stats["loss"]["mean"] > 0
    assert stats["fc1/output"]["shape"] == [32, 64] and stats["mlp/output"]["shape"] == [32, 10]
    assert stats["act/output"]["mean"] >= 0  # after a ReLU


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 2)
        self.unused = nn.Linear(8, 8)
        self.frozen = nn.Parameter(torch.ones(2), requires_grad=False)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) * self.frozen


def train(prof, model, opt, steps=4, fail_at=None, loader=None):
    data = loader if loader is not None else [
        (torch.randn(4, 8), torch.randn(4, 2)) for _ in range(steps)]
    for i, (x, y) in enumerate(data, start=1):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        if i == fail_at:
            raise RuntimeError(f"boom in update {i}")
        loss.backward()
        opt.step()
        prof.step()


def test_gradient_contract_states(tmp_path):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "net.jsonl"
    with ctt.profile(model, opt, path, capture_step=2,
                     gradient_families={"unused": ("inactive", 0)}) as prof:
        train(prof, model, opt)
    lines = read_trace(path)
    grads = {g["key"]: g for g in by_kind(lines, "gradient")}
    assert "frozen" not in grads  # only parameters that require grad
    assert grads["unused.weight"]["state"] == "missing" and "norm" not in grads["unused.weight"]
    assert grads["fc1.weight"]["state"] == "present"
    candle_graph(path, tmp_path)
    validate(path)
    # hooks are gone after the captured update
    assert not model._forward_hooks and not model.fc1._forward_pre_hooks
    assert torch.autograd.backward.__module__ == "torch.autograd"
    assert "step" not in opt.__dict__


def test_exception_in_captured_step_gives_failed_trace(tmp_path):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "fail.jsonl"
    with pytest.raises(RuntimeError, match="boom in update 3"):
        with ctt.profile(model, opt, path, capture_step=3) as prof:
            train(prof, model, opt, fail_at=3)
    term = read_trace(path)[-1]
    assert term["outcome"] == "failed"
    assert term["reason"] == "RuntimeError: boom in update 3"
    summary = candle_graph(path, tmp_path, require_valid=False)
    assert summary["health"]["structurally_valid"]
    assert torch.autograd.backward.__module__ == "torch.autograd"


def test_loop_shorter_than_capture_step(tmp_path):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "short.jsonl"
    with pytest.warns(RuntimeWarning, match="before capture step 9"):
        with ctt.profile(model, opt, path, capture_step=9) as prof:
            train(prof, model, opt, steps=2)
    assert read_trace(path)[-1]["outcome"] == "failed"


class Synthetic(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, generator=g), torch.randn(2, generator=g)


def test_dataloader_with_forked_workers(tmp_path):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(Synthetic(), batch_size=4, num_workers=2,
                                         multiprocessing_context="fork")
    path = tmp_path / "loader.jsonl"
    with ctt.profile(model, opt, path, capture_step=3,
                     gradient_families={"unused": ("inactive", 0)}) as prof:
        train(prof, model, opt, loader=loader)
    assert read_trace(path)[-1]["outcome"] == "complete"
    candle_graph(path, tmp_path)
    validate(path)


def test_disabled_profile_writes_nothing(tmp_path):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "off.jsonl"
    with ctt.profile(model, opt, path, capture_step=2, enabled=False) as prof:
        train(prof, model, opt)
    assert not path.exists()


def test_tensor_stats_on_device():
    t = torch.tensor([1.0, -3.0, float("nan"), float("inf")])
    nf, rms, amax, mean = ctt.tensor_stats(t)
    assert nf == 2 and amax == 3.0 and mean == -1.0 and abs(rms - (5.0 ** 0.5)) < 1e-12


# -- both modes in one run: aggregate statistics over every update + the capture ----------

def _agg_loop(prof, model, opt, steps, x, y):
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        prof.step()


def _agg_setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    return model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(4, 8), \
        torch.randint(0, 3, (4,))


def _spans(summary):
    return {(s["name"], s.get("step")): s for s in summary["spans"]}


def test_aggregate_counts_every_update_and_the_capture_stays_valid(tmp_path):
    import json
    model, opt, x, y = _agg_setup()
    trace, agg = tmp_path / "t.jsonl", tmp_path / "agg.json"
    backward = torch.autograd.backward
    with ctt.profile(model, opt, str(trace), capture_step=3, aggregate_path=str(agg),
                     aggregate_interval_ms=50) as prof:
        _agg_loop(prof, model, opt, 200, x, y)
    summary = json.loads(agg.read_text())
    assert summary["schema"] == "candle-trace/aggregate/1" and summary["final"]
    spans = _spans(summary)
    for key in [("train/forward", "forward"), ("train/backward", "backward"),
                ("train/optimizer", "optimizer"), ("train/step", None), ("train/data", None)]:
        assert spans[key]["count"] == 200, (key, spans[key])
    assert len(spans) == 5, sorted(spans)
    (loss,) = summary["scalars"]
    assert loss["label"] == "loss" and loss["count"] == 200 and loss["non_finite"] == 0
    # the capture of update 3 is taken exactly as without the aggregate session
    cg = candle_graph(trace, tmp_path)
    assert cg["health"]["structurally_valid"] and cg["health"]["capture_complete"]
    lines = read_trace(trace)
    assert lines[-1]["outcome"] == "complete"
    assert any(s["name"] == "backward" for s in by_kind(lines, "span_start"))
    # every whole-run wrapper is gone
    assert "forward" not in model.__dict__ and "step" not in opt.__dict__
    assert torch.autograd.backward is backward
    r = subprocess.run([str(REPO / "build" / "candle-trace"), "report", str(agg)],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "train/forward" in r.stdout, r.stdout + r.stderr
    assert re.search(r"train/step +ignore", r.stdout), "the enclosing update span is ignored by default"


def test_aggregate_is_finished_when_the_capture_fails(tmp_path):
    import json
    model, opt, x, y = _agg_setup()
    trace, agg = tmp_path / "t.jsonl", tmp_path / "agg.json"
    with pytest.warns(RuntimeWarning, match="before capture step"):
        with ctt.profile(model, opt, str(trace), capture_step=10,
                         aggregate_path=str(agg)) as prof:
            _agg_loop(prof, model, opt, 4, x, y)
    assert read_trace(trace)[-1]["outcome"] == "failed"
    summary = json.loads(agg.read_text())
    assert summary["final"] and _spans(summary)[("train/forward", "forward")]["count"] == 4


def test_aggregate_is_finished_when_the_loop_raises(tmp_path):
    import json
    model, opt, x, y = _agg_setup()
    trace, agg = tmp_path / "t.jsonl", tmp_path / "agg.json"
    with pytest.raises(RuntimeError, match="shapes"):
        with ctt.profile(model, opt, str(trace), capture_step=2,
                         aggregate_path=str(agg)) as prof:
            _agg_loop(prof, model, opt, 5, x, y)
            model(torch.randn(4, 5))  # wrong shape: raises inside forward
    summary = json.loads(agg.read_text())
    assert summary["final"]
    spans = _spans(summary)
    assert spans[("train/backward", "backward")]["count"] == 5
    assert spans[("train/step", None)]["count"] == 5  # the failed update is not counted
    assert "forward" not in model.__dict__


def test_aggregate_path_without_a_writable_folder_is_refused(tmp_path):
    # The library creates missing folders; a regular file where the folder should be
    # cannot be one (and, unlike permissions, stops root too).
    model, opt, x, y = _agg_setup()
    trace = tmp_path / "t.jsonl"
    (tmp_path / "file").write_text("")
    backward = torch.autograd.backward
    with pytest.raises(ctt.CandleTraceError):
        with ctt.profile(model, opt, str(trace),
                         aggregate_path=str(tmp_path / "file" / "a.json")):
            pass
    assert torch.autograd.backward is backward and "forward" not in model.__dict__
    assert read_trace(trace)[-1]["outcome"] == "failed"


sys.path.insert(0, str(REPO / "internal" / "cuda" / "testdata" / "fakecupti"))
import fake_cupti as fake_cupti_helper  # noqa: E402 (the fake libcupti's driver, shared with the scripts)

COLLECT_SCRIPT = r"""
import json, sys, warnings
import torch
from torch import nn
import candle_trace.torch as ctt
from fake_cupti import launch   # on the libcupti the collector loads

class Launch(torch.autograd.Function):     # a "CUDA" op: one kernel each way
    @staticmethod
    def forward(ctx, x):
        launch(b"_Z10fwd_kernelv")
        return x * 2
    @staticmethod
    def backward(ctx, g):
        launch(b"_Z10bwd_kernelv")
        return g * 2

class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
    def forward(self, x):
        return Launch.apply(self.fc(x))

torch.manual_seed(0)
m = M()
opt = torch.optim.SGD(m.parameters(), lr=0.1)
collect = json.loads(sys.argv[2])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with ctt.profile(m, opt, sys.argv[1], capture_step=2, ops=False, device_collect=collect) as prof:
        for _ in range(3):
            loss = m(torch.randn(8, 4)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
print(json.dumps({"asked": prof.device_collect, "warnings": [str(w.message) for w in caught]}))
"""


@pytest.fixture(scope="module")
def fake_cupti(tmp_path_factory):
    return fake_cupti_helper.build(tmp_path_factory.mktemp("fakecupti"))


def run_collect(tmp_path, fake_cupti, collect, cupti_lib):
    path = tmp_path / "collect.jsonl"
    r = subprocess.run([sys.executable, "-c", COLLECT_SCRIPT, str(path), json.dumps(collect)],
                       capture_output=True, text=True, timeout=300,
                       env=example_env(FAKE_CUPTI=str(fake_cupti), CANDLE_TRACE_CUPTI_LIB=str(cupti_lib),
                                       CANDLE_TRACE_TORCH_OPS="dispatch",
                                       PYTHONPATH=os.pathsep.join([str(REPO / "bindings" / "python"),
                                                                   fake_cupti_helper.HERE])))
    assert r.returncode == 0, r.stderr
    return path, json.loads(r.stdout.splitlines()[-1])


def test_profile_collects_the_captured_updates_kernels(tmp_path, fake_cupti):
    path, out = run_collect(tmp_path, fake_cupti, ["cupti"], fake_cupti)
    assert out == {"asked": ["cupti"], "warnings": []}
    lines = read_trace(path)
    assert lines[0]["capture_contract"]["device_timing"] == "partial"
    spans = {e["id"]: e for e in by_kind(lines, "span_start")}
    ivs = by_kind(lines, "device_interval")
    # Only the captured update's two kernels: the collector runs around it alone.
    assert [e["name"] for e in ivs] == ["fwd_kernel()", "bwd_kernel()"]
    fwd, bwd = (spans[e["span_id"]] for e in ivs)
    assert (fwd["name"], fwd.get("step")) == ("M", "forward")
    assert bwd.get("step") == "backward"
    stats = {e["label"]: e for e in by_kind(lines, "tensor_stats")}
    assert stats["cupti/dropped_records"]["mean"] == 0
    assert lines[-1]["outcome"] == "complete"
    candle_graph(path, tmp_path)


def torch_loads_a_libcupti() -> str:
    """The libcupti that importing torch loaded into this process ("" for none): PyPI's
    CUDA wheels of torch 2.x link libtorch_cpu.so against libcupti.so.13."""
    try:
        with open("/proc/self/maps") as f:
            return next((ln.split()[-1] for ln in f if "/libcupti.so" in ln), "")
    except OSError:
        return ""


# The collector prefers a libcupti already in the process over CANDLE_TRACE_CUPTI_LIB's
# (a second CUPTI would fight the first): under a torch that loads one (PyPI's 2.x), it
# asks the driver first -- without one, CUDA 13.2's cuptiGetTimestamp would crash -- and
# goes on without CUPTI, as it does where no libcupti loads at all.
def test_profile_goes_on_without_cupti(tmp_path, fake_cupti):
    path, out = run_collect(tmp_path, fake_cupti, ["cupti"], "/nonexistent/libcupti.so.12")
    assert len(out["warnings"]) == 1, out
    prefix = "candle_trace.torch: device collectors ['cupti'] not started: ct_device_start: "
    if torch_loads_a_libcupti():
        assert out["warnings"][0].startswith(
            prefix + "CUPTI could not start: CUDA is not usable here: the NVIDIA driver's "
            "libcuda.so.1 could not be loaded"), out
        assert "the process had already loaded" in out["warnings"][0]
    else:
        assert out["warnings"][0].startswith(
            prefix + "CUPTI is unavailable: no libcupti could be loaded "
            "(/nonexistent/libcupti.so.12: cannot open shared object file"), out
    lines = read_trace(path)
    assert by_kind(lines, "device_interval") == []
    assert lines[-1]["outcome"] == "complete"
    candle_graph(path, tmp_path)


def test_profile_device_collect_defaults_to_nothing_on_cpu():
    m = nn.Linear(2, 2)
    assert ctt.profile(m, None, "/dev/null").device_collect == []
    assert ctt.profile(m, None, "/dev/null", device="cuda:0").device_collect == ["cupti"]
    assert ctt.profile(m, None, "/dev/null", device_collect=None).device_collect == []
    with pytest.raises(ctt.CandleTraceError, match='device_collect must be "auto", a list'):
        ctt.profile(m, None, "/dev/null", device_collect="cupti")


class _Tagged(torch.Tensor):
    """A tensor subclass with its own __torch_function__ (has_torch_function: the
    backward span hooks go through its register_hook)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


class _TagNet(nn.Module):
    def __init__(self, seen):
        super().__init__()
        self.fc1, self.tag, self.fc2 = nn.Linear(4, 4), _TagOut(), nn.Linear(4, 2)
        self.seen = seen

    def forward(self, x):
        h = self.fc1(x)
        h.register_hook(lambda g: self.seen.append(float(g.abs().sum())) or g * 2)
        return self.fc2(self.tag(h))


class _TagOut(nn.Module):
    def forward(self, x):
        return x.as_subclass(_Tagged)


def test_backward_module_spans_share_a_tensors_hooks_with_the_programs(tmp_path):
    # The module spans' tensor hooks sit in the tensor's own hook dict, beside the
    # program's: each runs once per gradient, the program's gradient change included,
    # and every module -- the one whose output is a tensor subclass too -- gets its
    # backward span.
    torch.manual_seed(0)
    seen = []
    model = _TagNet(seen)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(3, 4), torch.randint(0, 2, (3,))
    path = tmp_path / "t.jsonl"
    with ctt.profile(model, opt, str(path), capture_step=2) as prof:
        for _ in range(3):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            prof.step()
    assert len(seen) == 3  # the program's hook ran once per update, captured or not
    lines = read_trace(path)
    spans = {s["id"]: s for s in by_kind(lines, "span_start")}
    bwd = {s["name"] for s in spans.values()
           if s["span_kind"] == "module" and s.get("step") == "backward"}
    assert {"fc1", "tag", "fc2"} <= bwd, sorted(bwd)
    assert lines[-1]["outcome"] == "complete"
    candle_graph(path, tmp_path)
