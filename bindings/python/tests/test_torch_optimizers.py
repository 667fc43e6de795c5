"""candle_trace.torch over an update that steps several optimizers -- a GAN's
discriminator and generator, a sparse embedding's SparseAdam beside a dense Adam: each
step is a span of the update, and the gradients are read once every one has stepped.
Every trace is judged by the real candle-graph, alone in a fresh folder; gradients are
held to ``p.grad``."""

from __future__ import annotations

import json
import math
import time

import pytest
from conftest import candle_graph, judged

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import candle_trace.torch as ctt  # noqa: E402
from candle_trace import CandleTraceError  # noqa: E402


def by_kind(lines, kind):
    return [line for line in lines if line["kind"] == kind]


def gan():
    torch.manual_seed(0)
    netG = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
    netD = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4)
    optG = torch.optim.SGD(netG.parameters(), lr=0.01)
    return netG, netD, optD, optG


def iteration(netG, netD, optD, optG, nan_in_g=False):
    """One DCGAN iteration; the gradient norms once the generator has stepped."""
    ones, zeros = torch.ones(8, 1), torch.zeros(8, 1)
    fake = netG(torch.randn(8, 4))
    optD.zero_grad()
    loss_d = F.binary_cross_entropy_with_logits(netD(torch.randn(8, 8)), ones) + \
        F.binary_cross_entropy_with_logits(netD(fake.detach()), zeros)
    loss_d.backward()
    optD.step()
    optG.zero_grad()
    loss_g = F.binary_cross_entropy_with_logits(netD(fake), ones)
    if nan_in_g:
        loss_g = loss_g * float("nan")
    loss_g.backward()
    optG.step()
    return {f"{name}.{n}": float(p.grad.norm())
            for name, net in (("G", netG), ("D", netD)) for n, p in net.named_parameters()}


def test_a_gan_s_update_holds_both_optimizers_steps(tmp_path):
    netG, netD, optD, optG = gan()
    path = tmp_path / "gan.jsonl"
    with ctt.profile({"G": netG, "D": netD}, [optD, optG], str(path), capture_step=2) as prof:
        for update in range(1, 4):
            norms = iteration(netG, netD, optD, optG)
            if update == 2:
                want = norms
            prof.step()
    assert prof.state == "done" and prof.optimizers == [optD, optG]
    lines = judged(path, tmp_path)
    starts = [s["name"] for s in by_kind(lines, "span_start")]
    update = starts[starts.index("update"):]
    # the discriminator's Adam mid-update, the generator's SGD at its end
    assert [s for s in update if s.endswith(".step")] == ["Adam.step", "SGD.step"]
    assert update.count("backward") == 2 and update[1] == "G"
    # read after the generator's step, not at its zero_grad between the two steps
    # (which would give the generator's gradients of the update before)
    grads = {g["key"]: g for g in by_kind(lines, "gradient")}
    assert set(grads) == set(want)
    for key, norm in want.items():
        assert math.isclose(grads[key]["norm"], norm, rel_tol=1e-6), (key, grads[key], norm)


def test_a_sparse_embedding_s_optimizer_beside_a_dense_one(tmp_path):
    torch.manual_seed(0)
    emb, head = nn.Embedding(20, 8, sparse=True), nn.Linear(8, 20)
    model = nn.Sequential(emb, head)
    sparse, dense = torch.optim.SparseAdam(emb.parameters()), torch.optim.Adam(head.parameters())
    path = tmp_path / "sparse.jsonl"
    with ctt.profile(model, (sparse, dense), str(path), capture_step=2) as prof:
        for update in range(1, 3):
            x = torch.randint(0, 20, (4, 6))
            loss = F.cross_entropy(model(x).view(-1, 20), x.view(-1))
            sparse.zero_grad()
            dense.zero_grad()
            loss.backward()
            sparse.step()
            dense.step()
            if update == 2:
                want = {n: float(p.grad.coalesce().norm() if p.grad.is_sparse
                                                  else p.grad.norm())
                        for n, p in model.named_parameters()}
            prof.step()
    lines = judged(path, tmp_path)
    starts = [s["name"] for s in by_kind(lines, "span_start")]
    assert [s for s in starts if s.endswith(".step")] == ["SparseAdam.step", "Adam.step"]
    grads = {g["key"]: g for g in by_kind(lines, "gradient")}
    assert set(grads) == set(want)  # the embedding's sparse gradient among them
    for key, norm in want.items():
        assert math.isclose(grads[key]["norm"], norm, rel_tol=1e-5), (key, grads[key], norm)


def test_a_watched_gan_keeps_the_iteration_whose_generator_loss_turns_nan(tmp_path):
    netG, netD, optD, optG = gan()
    with pytest.warns(RuntimeWarning, match="non-finite"):
        with ctt.watch({"G": netG, "D": netD}, [optD, optG], str(tmp_path / "w"),
                       max_traces=1) as w:
            for update in range(1, 6):
                iteration(netG, netD, optD, optG, nan_in_g=update == 4)
                w.step()
    # the generator's loss, the iteration's last: that iteration is the update kept
    assert [(f.update, f.trigger) for f in w.fired] == [(4, "non_finite")]
    trace = tmp_path / "w" / "update-000004-non_finite.jsonl"
    summary = candle_graph(trace, tmp_path, require_valid=False)
    # NaN gradients: complete, its only errors the non-finite families
    codes = {i["code"] for i in summary["health"]["issues"] if i["severity"] == "error"}
    assert codes == {"gradient_family_non_finite"}, codes
    assert summary["health"]["capture_complete"]
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    starts = [s["name"] for s in by_kind(lines, "span_start")]
    assert [s for s in starts if s.endswith(".step")] == ["Adam.step", "SGD.step"]


class GAN(nn.Module):
    """A GAN as many programs hold one: a module with the two networks, never called
    itself -- the loop calls its generator and discriminator in turn."""

    def __init__(self, netG, netD):
        super().__init__()
        self.G, self.D = netG, netD


def test_a_gan_held_in_a_module_never_called_is_captured(tmp_path):
    netG, netD, optD, optG = gan()
    path = tmp_path / "gan.jsonl"
    with ctt.profile(GAN(netG, netD), [optD, optG], str(path), capture_step=2) as prof:
        for update in range(1, 4):
            norms = iteration(netG, netD, optD, optG)
            if update == 2:
                want = norms
            prof.step()
    assert prof.state == "done"
    lines = judged(path, tmp_path)
    starts = by_kind(lines, "span_start")
    first = [s["name"] for s in starts].index("update")
    update = [s["name"] for s in starts[first:]]
    forwards = [s["name"] for s in starts[first:] if s.get("step") == "forward"]
    # the update opens at its first forward, the generator's (until this was mended it
    # waited for the GAN module's own forward, and the trace was an empty update)
    assert update[1] == "G" and forwards.count("G") == 1 and forwards.count("D") == 3, update
    assert [s for s in update if s.endswith(".step")] == ["Adam.step", "SGD.step"]
    ops = [o["op_name"] for o in by_kind(lines, "op")]
    # three forwards of the discriminator's two Linear layers, one of the generator's
    assert ops.count("aten::addmm") >= 8, ops
    assert by_kind(lines, "memory")
    grads = {g["key"]: g for g in by_kind(lines, "gradient")}
    assert set(grads) == set(want)
    for key, norm in want.items():
        assert math.isclose(grads[key]["norm"], norm, rel_tol=1e-6), (key, grads[key], norm)


class Slow(nn.Module):
    """Sleeps in its forward: an update's time no machine's load can shorten."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def forward(self, x):
        time.sleep(self.seconds)
        return x


def test_a_gan_held_in_a_module_never_called_times_its_updates(tmp_path):
    netG, netD, optD, optG = gan()
    netG.append(Slow(0.004))
    agg = tmp_path / "agg.json"
    updates = 8
    with ctt.profile(GAN(netG, netD), [optD, optG], str(tmp_path / "t.jsonl"),
                     capture_step=2, aggregate_path=str(agg)) as prof:
        for _ in range(updates):
            iteration(netG, netD, optD, optG)
            prof.step()
    spans = {s["name"]: s for s in json.loads(agg.read_text())["spans"]}
    # Every update but the first (which shows the GAN module is never called) opens at
    # its first forward: its update span holds the generator's 4 ms. Until this was
    # mended the update span opened at step() and held nothing, the data span it all.
    step = spans["train/step"]
    assert step["count"] == updates
    assert step["total_ns"] >= (updates - 1) * 4_000_000, step
    assert step["p50_ns"] >= 4_000_000, step


@pytest.mark.parametrize("optimizer", [[torch.nn.Linear(1, 1)], "adam", [None]])
def test_what_is_no_optimizer_is_refused(tmp_path, optimizer):
    model = nn.Linear(2, 2)
    for make in (lambda: ctt.profile(model, optimizer, str(tmp_path / "t.jsonl")),
                 lambda: ctt.watch(model, optimizer, str(tmp_path / "w"))):
        with pytest.raises(TypeError, match="optimizer must be a torch optimizer, a list of "
                                            "them or None; got "):
            make()
    assert not list(tmp_path.iterdir())  # nothing written


def test_one_optimizer_given_twice_is_one(tmp_path):
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prof = ctt.profile(model, [opt, opt], str(tmp_path / "t.jsonl"))
    assert prof.optimizers == [opt]
    with pytest.raises(CandleTraceError):
        ctt.profile(model, opt, str(tmp_path / "t.jsonl"), capture_step=0)


def test_an_optimizer_added_after_the_start_is_spanned_and_counted(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    first = torch.optim.SGD(model.parameters(), lr=0.1)
    agg = tmp_path / "agg.json"
    with ctt.profile(model, first, str(tmp_path / "t.jsonl"), capture_step=3,
                     aggregate_path=str(agg)) as prof:
        opt = first
        for update in range(1, 5):
            if update == 2:  # a second phase's optimizer, made while the profile runs
                opt = torch.optim.Adam(model.parameters(), lr=1e-3)
                prof.add_optimizer(opt)
                prof.add_optimizer(opt)  # once is enough
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    assert prof.optimizers == [first, opt]
    lines = judged(tmp_path / "t.jsonl", tmp_path)
    assert [s["name"] for s in by_kind(lines, "span_start") if s["name"].endswith(".step")] == \
        ["Adam.step"]
    spans = {s["name"]: s for s in json.loads(agg.read_text())["spans"]}
    assert spans["train/optimizer"]["count"] == 4  # SGD's one and Adam's three
