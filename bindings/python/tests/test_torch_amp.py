"""Mixed precision seen through: the loss a GradScaler scaled, and the optimizer steps it
skips on overflow, are the program's business, not anomalies (torch >= 2.3: a CPU
GradScaler)."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings

import pytest
from conftest import REPO, candle_graph, judged, read_trace

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import candle_trace.torch as ctt  # noqa: E402
from candle_trace.torch import _amp  # noqa: E402

pytestmark = pytest.mark.skipif(
    not hasattr(getattr(torch, "amp", None), "GradScaler"),
    reason=f"torch {torch.__version__} has no torch.amp.GradScaler (a CPU one: torch >= 2.3)")


def test_the_loss_behind_a_scaled_one_while_installed():
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    original = _amp.GRAD_SCALER.__dict__["scale"]
    loss = torch.tensor(2.5, requires_grad=True) * 1.0
    _amp.ScaledLosses.install()
    _amp.ScaledLosses.install()  # a second user
    try:
        scaled = scaler.scale(loss)
        assert float(scaled.detach()) == 2560.0
        assert float(_amp.unscaled(scaled)) == 2.5
        other = loss * 3
        assert _amp.unscaled(other) is other  # not what the scaler made
        _amp.ScaledLosses.remove()
        assert float(_amp.unscaled(scaled)) == 2.5  # the other user still holds it
    finally:
        _amp.ScaledLosses.remove()
    assert _amp.unscaled(scaled) is scaled
    assert _amp.GRAD_SCALER.__dict__["scale"] is original  # put back by the last user


def test_a_step_skipped_for_overflow_in_an_update_captured_in_full_fires_nothing(tmp_path):
    """A user trigger after update 3 captures update 4 in full; the scaler skips that
    update's step (its gradients overflow): the inf it read in them is the scaler's
    business, so no non_finite_grad fires for it. Update 6's NaN loss fires, judged on
    the loss, not on its scaled product."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    skipped = []
    # the full capture of update 4 says what its non-finite gradients were
    with pytest.warns(RuntimeWarning, match="no optimizer stepped in it") as said, \
            ctt.watch(model, opt, str(tmp_path / "w"), max_traces=4) as w:
        for update in range(1, 8):
            x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x).float(), y) * 1e3
            if update == 6:
                loss = loss * float("nan")
            opt.zero_grad()
            scaler.scale(loss).backward()
            before = model[0].weight.detach().clone()
            scaler.step(opt)
            skipped.append(torch.equal(before, model[0].weight))
            # update 4 runs at a scale its gradients overflow at
            scaler.update(2.0 ** 127 if update == 3 else 1024.0)
            if update == 3:
                w.trigger("look at the next one")
            w.step()
    assert skipped == [False, False, False, True, False, True, False]
    assert [(f.update, f.trigger) for f in w.fired] == [(3, "user"), (6, "non_finite")]
    assert math.isnan(w.fired[1].value)
    assert (tmp_path / "w" / "update-000004-after-user.jsonl").exists()
    assert any("update-000004-after-user.jsonl) (no optimizer stepped in it: a GradScaler "
               "skips the step" in str(m.message) for m in said)


@pytest.mark.parametrize("overflow,stats", [(False, True), (True, True), (True, False)])
def test_a_captured_update_records_the_program_s_loss_the_scale_and_a_skipped_step(tmp_path, overflow, stats):
    """Under a GradScaler, backward receives the loss times the scale: the captured
    update's ``loss`` statistic is the program's loss (it was the scaled product, 1024
    times it here), ``grad_scaler/scale`` says by what the scaler multiplied, and
    ``grad_scaler/step_skipped`` whether it skipped the optimizer's step -- 1 where the
    captured update runs at a scale its gradients overflow at (no optimizer span), with
    statistics off too (the loss and the scale are statistics; the skip is not)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scale = 2.0 ** 127 if overflow else 1024.0
    losses = []
    path = tmp_path / "amp.jsonl"
    with warnings.catch_warnings():  # the overflowing update's gradients break the contract
        warnings.simplefilter("ignore", RuntimeWarning)
        with ctt.profile(model, opt, str(path), capture_step=2, stats=stats) as prof:
            for _ in range(3):
                x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(x).float(), y) * 1e3  # 2 ** 127 times overflows
                opt.zero_grad()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update(scale if len(losses) == 0 else 1024.0)
                losses.append(loss.item())
                prof.step()
    assert _amp.ScaledLosses._users == 0  # the capture took its wrapper out
    if overflow:  # valid, its only errors the gradients' inf (what the scaler skipped for)
        issues = candle_graph(path, tmp_path, require_valid=False)["health"]["issues"]
        assert {i["code"] for i in issues if i["severity"] == "error"} == {"gradient_family_non_finite"}
        lines = read_trace(path)
    else:
        lines = judged(path, tmp_path)
    recorded = {s["label"]: s for s in lines if s["kind"] == "tensor_stats"}
    assert recorded["grad_scaler/step_skipped"]["mean"] == (1.0 if overflow else 0.0)
    if stats:
        assert math.isclose(recorded["loss"]["mean"], losses[1], rel_tol=1e-6), (recorded["loss"], losses)
        assert recorded["grad_scaler/scale"]["mean"] == scale
        assert recorded["grad_scaler/scale"]["elements"] == 1
    else:
        assert set(recorded) == {"grad_scaler/step_skipped"}
    stepped = [s for s in lines if s["kind"] == "span_start" and s["name"] == "SGD.step"]
    assert len(stepped) == (0 if overflow else 1)


def test_the_gpu_check_s_mixed_precision_script_passes_on_the_cpu(tmp_path):
    """tests/gpu/amp_watch.py, which tests/gpu/run.sh runs on CUDA (float16), here with
    bfloat16 and a CPU GradScaler: every one of its checks passes."""
    r = subprocess.run([sys.executable, str(REPO / "tests" / "gpu" / "amp_watch.py"),
                        str(tmp_path), "--device", "cpu"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    oks = [x for x in r.stdout.splitlines() if x.startswith("ok ")]
    assert len(oks) == 8 and "FAIL" not in r.stdout, r.stdout
