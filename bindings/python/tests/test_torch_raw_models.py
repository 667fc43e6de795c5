"""candle_trace.torch on models that are no ``nn.Module``: trainable tensors in a
mapping, a list, or a plain class (with a module among them), as tutorials and
hand-written models hold them. Every trace is judged by the real candle-graph, alone in
a fresh folder, and by our own validator; gradients are held to ``p.grad``."""

from __future__ import annotations

import json
import math
import types

import pytest
from conftest import candle_graph, judged

torch = pytest.importorskip("torch")
from torch.nn import functional as F  # noqa: E402

import candle_trace.torch as ctt  # noqa: E402


def by_kind(lines, kind):
    return [line for line in lines if line["kind"] == kind]


def tensors(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    t = {"C": torch.randn(27, 10, generator=g), "W1": torch.randn(30, 32, generator=g) * 0.2,
         "b1": torch.zeros(32), "W2": torch.randn(32, 27, generator=g) * 0.01,
         "b2": torch.zeros(27), "spare": torch.randn(4, 4, generator=g)}
    for v in t.values():
        v.requires_grad_(True)
    return t


def forward(t, x):
    h = torch.tanh(t["C"][x].view(-1, 30) @ t["W1"] + t["b1"])
    return h @ t["W2"] + t["b2"]


def train(prof, params, fwd, updates, snapshot_at=None):
    """SGD over ``params``; the gradient norms at update ``snapshot_at`` (after backward)."""
    g = torch.Generator().manual_seed(1)
    opt = prof.optimizer
    seen = {}
    for update in range(1, updates + 1):
        x = torch.randint(0, 27, (16, 3), generator=g)
        y = torch.randint(0, 27, (16,), generator=g)
        loss = F.cross_entropy(fwd(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if update == snapshot_at:
            seen = {n: None if p.grad is None else float(p.grad.norm()) for n, p in params}
        opt.step()
        prof.step()
    return seen


def assert_gradients(lines, root, want):
    grads = {g["key"]: g for g in by_kind(lines, "gradient")}
    assert {g["root"] for g in grads.values()} == {root}
    assert set(grads) == set(want)
    for key, norm in want.items():
        if norm is None:
            assert grads[key]["state"] == "missing", key
        else:
            assert grads[key]["state"] == "present", key
            assert math.isclose(grads[key]["norm"], norm, rel_tol=1e-6), (key, grads[key], norm)


def test_a_mapping_of_tensors_is_a_model(tmp_path):
    t = tensors()
    opt = torch.optim.SGD(list(t.values()), lr=0.1)
    trace = tmp_path / "t.jsonl"
    with ctt.profile(t, opt, str(trace), capture_step=3) as prof:
        want = train(prof, list(t.items()), lambda x: forward(t, x), 4, snapshot_at=3)
    assert prof.state == "done"
    lines = judged(trace, tmp_path)
    meta = lines[0]
    assert meta["entrypoint"] == "model::train"
    assert [e["key"] for e in meta["capture_contract"]["gradient_contract"]["expected"]] == list(t)
    assert_gradients(lines, "model", want)
    assert want["spare"] is None  # trained, never used: no gradient, and the trace is valid
    params = {r["tensor_id"]: r for r in by_kind(lines, "tensor") if r.get("category") == "parameter"}
    assert set(params) == set(t)
    assert params["W1"]["shape"] == [30, 32] and params["W1"]["requires_grad"]
    names = [s["name"] for s in by_kind(lines, "span_start")]
    assert names[:2] == ["model::train", "update"]
    assert "backward" in names and "SGD.step" in names
    # no module: the update opens at the step() before it, so its forward's ops --
    # the embedding lookup, the matmuls -- are inside it
    ops = [o["op_name"] for o in by_kind(lines, "op")]
    assert "aten::index" in ops and ops.count("aten::mm") >= 2, ops


def test_a_plain_class_holding_tensors_and_a_module(tmp_path):
    class Net:  # no nn.Module
        def __init__(self) -> None:
            t = tensors(2)
            self.C, self.W1, self.b1 = t["C"], t["W1"], t["b1"]
            self.head = [t["W2"], t["b2"]]
            self.norm = torch.nn.LayerNorm(32)
            self.steps = 0  # not a tensor: not the model's
            self.cache = torch.zeros(3)  # a tensor that is not trained: data, not a parameter

        def __call__(self, x):
            h = torch.tanh(self.norm(self.C[x].view(-1, 30) @ self.W1 + self.b1))
            return h @ self.head[0] + self.head[1]

    net = Net()
    named = [("C", net.C), ("W1", net.W1), ("b1", net.b1), ("head.0", net.head[0]),
             ("head.1", net.head[1]), ("norm.weight", net.norm.weight),
             ("norm.bias", net.norm.bias)]
    opt = torch.optim.Adam([p for _, p in named], lr=1e-3)
    trace = tmp_path / "t.jsonl"
    with ctt.profile(net, opt, str(trace), capture_step=2) as prof:
        want = train(prof, named, net, 3, snapshot_at=2)
    lines = judged(trace, tmp_path)
    assert lines[0]["entrypoint"] == "Net::train"
    assert_gradients(lines, "Net", want)
    families = {e["key"]: e["family"] for e in
                lines[0]["capture_contract"]["gradient_contract"]["expected"]}
    assert families["head.0"] == "head" and families["norm.weight"] == "norm"
    assert families["W1"] == "Net"
    # the module among the tensors keeps its spans, but its forward is not where the
    # update starts: the lookup and the matmul before it are the update's
    forwards = [s["name"] for s in by_kind(lines, "span_start") if s.get("step") == "forward"]
    assert forwards == ["norm"]
    ops = [o["op_name"] for o in by_kind(lines, "op")]
    assert ops.index("aten::index") < ops.index("aten::native_layer_norm"), ops


def test_a_list_of_tensors_is_named_by_place(tmp_path):
    t = tensors(3)
    params = list(t.values())
    opt = torch.optim.SGD(params, lr=0.1)
    trace = tmp_path / "t.jsonl"
    with ctt.profile(params, opt, str(trace), capture_step=2, name="makemore") as prof:
        want = train(prof, [(str(i), p) for i, p in enumerate(params)],
                     lambda x: forward(t, x), 2, snapshot_at=2)
    lines = judged(trace, tmp_path)
    assert lines[0]["entrypoint"] == "makemore::train"
    assert_gradients(lines, "makemore", want)


@pytest.mark.parametrize("model, what", [
    (types.SimpleNamespace(lr=0.1, data=torch.zeros(3)), "SimpleNamespace with none"),
    ({"steps": 3}, "dict with none"),
    ([], "list with none"),
    (42, "int with none"),
])
def test_a_model_with_nothing_to_trace_is_refused(tmp_path, model, what):
    with pytest.raises(TypeError, match=f"candle_trace.torch.profile: model must be a "
                                        f"torch.nn.Module.*got {what}"):
        ctt.profile(model, None, str(tmp_path / "t.jsonl"))
    with pytest.raises(TypeError, match=f"candle_trace.torch.watch: model must be.*{what}"):
        ctt.watch(model, None, str(tmp_path / "w"))
    assert not list(tmp_path.iterdir())


def test_the_whole_run_counts_the_updates_of_a_model_of_tensors(tmp_path):
    t = tensors(4)
    opt = torch.optim.SGD(list(t.values()), lr=0.1)
    trace, agg = tmp_path / "t.jsonl", tmp_path / "agg.json"
    with ctt.profile(t, opt, str(trace), capture_step=3, aggregate_path=str(agg)) as prof:
        train(prof, list(t.items()), lambda x: forward(t, x), 12)
    judged(trace, tmp_path)
    summary = json.loads(agg.read_text())
    spans = {s["name"]: s for s in summary["spans"]}
    # no forward to wrap: each update opens at its backward, and the data span runs
    # from the step() to it (the forward's work included)
    assert "train/forward" not in spans
    for name in ("train/step", "train/backward", "train/optimizer", "train/data"):
        assert spans[name]["count"] == 12, (name, spans[name])
    (loss,) = summary["scalars"]
    assert loss["count"] == 12 and loss["non_finite"] == 0


def test_a_watch_over_tensors_keeps_the_update_whose_loss_turns_nan(tmp_path):
    t = tensors(5)
    opt = torch.optim.SGD(list(t.values()), lr=0.1)
    g = torch.Generator().manual_seed(1)
    with pytest.warns(RuntimeWarning, match="non-finite gradient"):
        with ctt.watch(t, opt, str(tmp_path / "w")) as w:
            for update in range(1, 9):
                x = torch.randint(0, 27, (16, 3), generator=g)
                loss = F.cross_entropy(forward(t, x), torch.randint(0, 27, (16,), generator=g))
                opt.zero_grad()
                loss.backward()
                opt.step()
                if update == 4:  # a weight gone bad: update 5's loss is NaN
                    with torch.no_grad():
                        t["W2"][0, 0] = float("nan")
                w.step()
    assert [(f.update, f.trigger) for f in w.fired] == [(5, "non_finite"), (6, "non_finite_grad")]
    trace = tmp_path / "w" / "update-000005-non_finite.jsonl"
    assert w.fired[0].trace == str(trace)
    # NaN gradients: well-formed and complete, its only errors the non-finite family's
    summary = candle_graph(trace, tmp_path, require_valid=False)
    codes = {i["code"] for i in summary["health"]["issues"] if i["severity"] == "error"}
    assert codes <= {"gradient_family_non_finite", "gradient_active_family_below_minimum"}, codes
    assert summary["health"]["capture_complete"]
    ops = [json.loads(x) for x in trace.read_text().splitlines()]
    assert any(o["kind"] == "op" and o["op_name"] == "aten::mm" for o in ops)


def test_a_hand_written_update_with_no_optimizer(tmp_path):
    """makemore's own loop: ``p.grad = None``, backward, ``p.data += -lr * p.grad``."""
    t = tensors(6)
    params = list(t.values())
    g = torch.Generator().manual_seed(1)
    trace = tmp_path / "t.jsonl"
    with ctt.profile(t, None, str(trace), capture_step=2) as prof:
        for update in range(1, 4):
            x = torch.randint(0, 27, (16, 3), generator=g)
            loss = F.cross_entropy(forward(t, x), torch.randint(0, 27, (16,), generator=g))
            for p in params:
                p.grad = None
            loss.backward()
            if update == 2:
                want = {n: None if p.grad is None else float(p.grad.norm()) for n, p in t.items()}
            for p in params:
                if p.grad is not None:
                    p.data += -0.1 * p.grad
            prof.step()
    lines = judged(trace, tmp_path)
    assert_gradients(lines, "model", want)
    # the hand-written update is the update's: 5 tensors with a gradient, one mul and one
    # add_ each, after the backward
    ops = [o["op_name"] for o in by_kind(lines, "op")]
    assert ops.count("aten::add_") >= 5 and ops.count("aten::mul") >= 5, ops
