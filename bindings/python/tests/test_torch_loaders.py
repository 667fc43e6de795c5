"""The batches a DataLoader hands out inside a captured update are spans of it
(``DataLoader.__next__``): a loader that stalls an update is named in its trace, not
left as the update's own time. Each trace judged by the real candle-graph and our
validator."""

from __future__ import annotations

import gc
import time

import pytest
from conftest import judged, spans_of

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import candle_trace.torch as ctt  # noqa: E402
from candle_trace.torch import Triggers  # noqa: E402
from candle_trace.torch._loaders import SPAN_NAME, installed  # noqa: E402


class Samples(Dataset):
    """16-feature samples; fetching one of ``slow`` (indices) sleeps ``stall_s`` -- a
    loader's slow disk."""

    def __init__(self, n: int, slow=(), stall_s: float = 0.0) -> None:
        self.n, self.slow, self.stall_s = n, set(slow), stall_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i in self.slow:
            time.sleep(self.stall_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(16, generator=g), torch.randn(4, generator=g)


def model_and_opt():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "2-workers"])
def test_a_batch_fetched_inside_the_captured_update_is_its_span(tmp_path, workers):
    # Gradient accumulation over two batches: the second batch of each update is fetched
    # between its forwards, inside the captured update (the update begins at its first
    # forward). Batch 7 (samples 28-31, update 4's second) is slow: 4 x 15 ms -- all of
    # it the update's wait without workers; with them, what their prefetch did not hide.
    model, opt = model_and_opt()
    data = DataLoader(Samples(64, slow=range(28, 32), stall_s=0.015), batch_size=4,
                      num_workers=workers)
    path = tmp_path / "accumulate.jsonl"
    batches = iter(data)
    on = []
    with ctt.profile(model, opt, str(path), capture_step=4) as prof:
        for _ in range(5):
            on.append(installed())
            opt.zero_grad()
            for _ in range(2):
                x, y = next(batches)
                ((model(x) - y) ** 2).mean().backward()
            opt.step()
            prof.step()
    assert on == [False, False, True, True, False], "on from the update before the captured one"
    assert not installed(), "the wrapper is taken off with the capture"
    lines = judged(path, tmp_path)
    spans = spans_of(lines)
    measured = next(s for s in spans.values() if s.get("measured"))
    loads = [s for s in spans.values() if s["name"] == SPAN_NAME]
    assert len(loads) == 1, loads  # the first batch came before the update began
    load = loads[0]
    assert load["span_kind"] == "function" and load["parent_id"] == measured["id"]
    assert 0 < load["duration_ns"] < measured["duration_ns"]
    stacks = [o for o in lines if o["kind"] == "op" and o["op_name"] == "aten::stack"]
    if workers == 0:
        assert load["duration_ns"] >= 4 * 0.015e9
        # the collate of a loader without workers runs here: its ops are the span's
        assert stacks and all(o["span_id"] == load["id"] for o in stacks), stacks
    else:
        assert not stacks, "the workers collate, in their own processes"
    # and the model's forward spans are not inside it
    forwards = [s for s in spans.values() if s["name"] == "Sequential"
                and s.get("step") == "forward"]
    assert len(forwards) == 2 and all(f["parent_id"] == measured["id"] for f in forwards)


def test_a_stalled_loader_is_named_in_the_slow_updates_trace(tmp_path):
    # The flight recorder's update runs from one step() to the next, the data step
    # included: update 13's batch stalls (150 ms against ~20 ms updates), and its trace
    # says where the time went.
    model, opt = model_and_opt()

    class Busy(nn.Module):  # 20 ms of CPU work an update, as a real model's
        def forward(self, x):
            until = time.perf_counter() + 0.02
            while time.perf_counter() < until:
                pass
            return x

    busy = Busy()
    # (no workers: a worker's prefetch would hide part of the stall, by as much as the
    # updates before it took, and the slow trigger then depends on the machine's load)
    data = DataLoader(Samples(8 * 14, slow=[8 * 12], stall_s=0.15), batch_size=8)
    folder = tmp_path / "traces"
    gc.collect()
    gc.disable()  # a full collection's pause is a slow update too, not this test's
    try:
        # room for traces of slow updates the machine makes before 13 (the cap is 3)
        with ctt.watch(model, opt, folder, triggers=Triggers(slow=3.0), max_traces=12) as w:
            for x, y in data:
                opt.zero_grad()
                ((model(busy(x)) - y) ** 2).mean().backward()
                opt.step()
                w.step()
    finally:
        gc.enable()
    assert not installed()
    slow = [f for f in w.fired if f.trigger == "slow"]
    assert 13 in [f.update for f in slow], [(f.update, f.detail) for f in w.fired]
    lines = judged(folder / "update-000013-slow.jsonl", tmp_path)
    spans = spans_of(lines)
    measured = next(s for s in spans.values() if s.get("measured"))
    loads = [s for s in spans.values() if s["name"] == SPAN_NAME]
    assert len(loads) == 1 and loads[0]["parent_id"] == measured["id"], loads
    assert loads[0]["duration_ns"] >= 0.15e9
    assert loads[0]["duration_ns"] > measured["duration_ns"] / 2, "most of the slow update"


def test_the_end_of_an_epoch_inside_the_update_closes_the_span(tmp_path):
    # A loop that runs out of batches mid-update (StopIteration from the loader): the
    # span ends with it and the update goes on; nothing fails.
    model, opt = model_and_opt()
    data = DataLoader(Samples(8), batch_size=4)
    path = tmp_path / "epoch.jsonl"
    with ctt.profile(model, opt, str(path), capture_step=1) as prof:
        batches = iter(data)
        x, y = next(batches)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        for x, y in batches:  # the last batch, then StopIteration, inside the update
            ((model(x) - y) ** 2).mean().backward()
        with pytest.raises(StopIteration):
            next(batches)
        opt.step()
        prof.step()
    lines = judged(path, tmp_path)
    spans = spans_of(lines)
    loads = [s for s in spans.values() if s["name"] == SPAN_NAME]
    assert len(loads) == 3 and all(s["duration_ns"] is not None for s in loads)

