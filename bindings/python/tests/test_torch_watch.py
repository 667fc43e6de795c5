"""candle_trace.torch.watch on training loops that go wrong by themselves (issue 13): a
data step that stalls, a loss that turns NaN after a learning-rate spike, an
out-of-memory error inside backward -- each must leave exactly the expected traces, with
no capture step given, every trace judged by the real candle-graph and our validator."""

from __future__ import annotations

import gc
import json
import os
import re
import statistics
import subprocess
import sys
import time
import warnings

import pytest
from conftest import REPO, candle_graph, judged, read_trace

sys.path.insert(0, str(REPO / "examples" / "python"))

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import candle_trace.torch as ctt  # noqa: E402
from candle_trace.torch import Triggers  # noqa: E402
from candle_trace.torch._triggers import held_up  # noqa: E402


class Slow(nn.Module):
    """A model whose update takes about 20 ms: 20 ms of work on the CPU in forward, as a
    real model's are. Not a sleep: an update that blocks keeps all its time off the CPU
    as the program's (a data loader's wait is), so a VM's host stalling the vCPU
    while the thread slept fired the slow trigger in CI (68.1 ms against a 64.5 ms bar,
    1.9 ms of run-queue wait), while the same stall in work on the CPU is the machine's
    and left out (``CpuWait``)."""

    def __init__(self, work_s: float = 0.02) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)
        self.work_s = work_s

    def forward(self, x):
        until = time.perf_counter() + self.work_s
        while time.perf_counter() < until:
            pass
        return self.fc2(torch.relu(self.fc1(x)))


# Tests whose point is not the slow trigger turn it off.
NO_SLOW = Triggers(slow=None)


def kinds(lines, kind):
    return [e for e in lines if e["kind"] == kind]


def watched(tmp_path, steps, before=None, work_s=0.02, **kw):
    model = Slow(work_s)
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    folder = tmp_path / "traces"
    # A full collection of the interpreter's heap can pause an update for tens of
    # milliseconds: a real slow update, but not the one these tests make. Off here.
    gc.collect()
    gc.disable()
    try:
        with ctt.watch(model, opt, folder, **kw) as w:
            for i in range(1, steps + 1):
                if before is not None:
                    before(i, model, opt)
                x, y = torch.randn(8, 16), torch.randn(8, 4)
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                opt.step()
                w.step()
    finally:
        gc.enable()
    return w, folder


def failure(scenario, tmp_path, **kw):
    """One loop of examples/python/watch_failures.py (the issue's failure programs) under
    watch at its default triggers, with whole-run statistics beside it; a full
    collection of the interpreter's heap is a real pause, but not the one they make."""
    import watch_failures

    gc.collect()
    gc.disable()
    try:
        r = watch_failures.run(scenario, str(tmp_path / "traces"),
                               aggregate=str(tmp_path / "summary.json"), **kw)
    finally:
        gc.enable()
    return r, tmp_path / "traces", json.loads((tmp_path / "summary.json").read_text())


def slow_traces(updates):
    """The traces the slow trigger writes for firings on ``updates``: the update's and
    the full capture of the one after it."""
    return {n for u in updates for n in (f"update-{u:06d}-slow.jsonl",
                                         f"update-{u + 1:06d}-after-slow.jsonl")}


def host_stalls(w, anomaly):
    """The slow firings at updates other than the program's ``anomaly`` (a set of update
    numbers), and the traces written for them: the failure programs' loader waits block,
    and a blocked update keeps its time off the CPU as the program's (a data loader's
    wait is), so a stall of the VM's host during one fires the slow trigger, rightly by
    its rule (68.1 ms against a 64.5 ms bar in one CI run; see Slow)."""
    noise = [f.update for f in w.fired if f.trigger == "slow" and f.update not in anomaly]
    return noise, slow_traces(noise)


def report(summary_path):
    r = subprocess.run([str(REPO / "build" / "candle-trace"), "report", str(summary_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_a_stalled_data_step_is_kept_with_the_update_after_it(tmp_path):
    # Update 37's data step stalls. A stall of the machine before it may fire the slow
    # trigger too, with its traces: a page fault's I/O on a busy machine is a block,
    # which the slow rule rightly keeps (74.0 ms against a 64.2 ms bar at update 13 of
    # one CI run, the test suites beside it), as test_a_full_captures_own_cost_is_not_a_
    # slow_update allows. Nothing but slow ones, none after the stall; room for their
    # traces beside the stall's two (the run's cap is 3 by default).
    r, folder, summary = failure("stall", tmp_path, max_traces=12)
    w = r["watch"]
    fired = [(f.update, f.trigger) for f in w.fired]
    before = [(u, t) for u, t in fired if t == "slow" and u < 37]
    assert fired == before + [(37, "slow")], [(f.update, f.trigger, f.detail) for f in w.fired]
    noise = slow_traces(u for u, _ in before)
    assert set(os.listdir(folder)) - noise == {"update-000037-slow.jsonl",
                                               "update-000038-after-slow.jsonl"}
    stall = w.fired[-1]
    lines = judged(folder / "update-000037-slow.jsonl", tmp_path)
    assert lines[0]["capture_step"] == 37
    stats = {s["label"]: s for s in kinds(lines, "tensor_stats")}
    assert stats["candle_trace/trigger/slow"]["mean"] == pytest.approx(stall.value)
    assert stats["candle_trace/trigger/slow/threshold"]["mean"] == pytest.approx(stall.threshold)
    assert stall.value > stall.threshold
    assert {"aten::addmm", "aten::relu"} <= {o["op_name"] for o in kinds(lines, "op")}
    # the measured region starts at the step() before the update: the stall is in it
    spans = {s["id"]: s for s in kinds(lines, "span_start")}
    ends = {e["id"]: e["duration_ns"] for e in kinds(lines, "span_end")}
    measured = next(s for s in spans.values() if s.get("measured"))
    assert ends[measured["id"]] >= 5 * watch_failures_loader_s() * 1e9
    after = judged(folder / "update-000038-after-slow.jsonl", tmp_path)
    assert kinds(after, "tensor_stats") and kinds(after, "gradient")
    # the whole run's summary: the update counts, the trigger's scalar, and the firing
    spans = {s["name"]: s for s in summary["spans"]}
    assert spans["train/step"]["count"] == 40 and spans["train/forward"]["count"] == 40
    scalars = {s["label"]: s for s in summary["scalars"]}
    assert scalars["trigger/slow"]["count"] == len(fired) and scalars["loss"]["count"] == 40
    firing = summary["triggers"]["fired"][-1]
    assert [f["update"] for f in summary["triggers"]["fired"]] == [u for u, _ in fired]
    assert (firing["update"], firing["trigger"], firing["no_trace"]) == (37, "slow", "")
    assert firing["value"] == pytest.approx(stall.value)
    assert firing["threshold"] == pytest.approx(stall.threshold)
    assert firing["trace"] == str(folder / "update-000037-slow.jsonl")
    assert firing["detail"] == stall.detail
    text = report(tmp_path / "summary.json")
    assert f"Triggers fired ({len(fired)} listed):" in text
    assert (f"update 37  slow  {stall.value * 1e3:.2f} ms > {stall.threshold * 1e3:.2f} ms  "
            f"{stall.detail}  -> {folder / 'update-000037-slow.jsonl'}") in text
    assert f"-> {folder / 'update-000037-slow.jsonl'}" in text


def watch_failures_loader_s():
    import watch_failures

    return watch_failures.LOADER_S


def test_a_loss_that_turns_nan_is_kept_once(tmp_path):
    with pytest.warns(RuntimeWarning, match="non-finite gradient in fc1.weight"):
        r, folder, summary = failure("nan", tmp_path, max_traces=12)
    w = r["watch"]
    stalls, noise = host_stalls(w, {20, 21})
    # 21, captured in full, reads its gradients: still NaN (its loss too, but non_finite
    # fires when the loss turns so, not again)
    fired = [f for f in w.fired if f.update not in stalls]
    assert [(f.update, f.trigger) for f in fired] == [(20, "non_finite"), (21, "non_finite_grad")], [
        (f.update, f.trigger, f.detail) for f in w.fired]
    assert sorted(set(os.listdir(folder)) - noise) == ["update-000020-non_finite.jsonl",
                                                       "update-000021-after-non_finite.jsonl"]
    assert fired[1].trace == str(folder / "update-000021-after-non_finite.jsonl")
    assert re.fullmatch(r"non-finite gradient norm in fc1\.weight.* \([1-4] of 4\)", fired[1].detail)
    for name in ("update-000020-non_finite.jsonl", "update-000021-after-non_finite.jsonl"):
        # the model's own finding, not a broken trace: its one error is the NaN gradients
        cg = candle_graph(folder / name, tmp_path, require_valid=False)
        errors = {i["code"] for i in cg["health"]["issues"] if i["severity"] == "error"}
        assert errors == {"gradient_family_non_finite"}, cg["health"]["issues"]
        assert cg["health"]["capture_complete"]
    lines = read_trace(folder / "update-000020-non_finite.jsonl")
    assert kinds(lines, "op") and {g["state"] for g in kinds(lines, "gradient")} == {"non_finite"}
    stats = {s["label"]: s for s in kinds(lines, "tensor_stats")}
    assert stats["candle_trace/trigger/non_finite"]["non_finite"] == 1
    after = read_trace(folder / "update-000021-after-non_finite.jsonl")
    assert any(s["non_finite"] > 0 for s in kinds(after, "tensor_stats"))
    # NaN under torch 1.13, an overflow to inf under 2.x: either is listed as such
    shown = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
    firing, grad = [f for f in summary["triggers"]["fired"] if f["update"] not in stalls]
    loss = str(fired[0].value)
    assert (firing["update"], firing["trigger"], firing["value"], firing["detail"]) == (
        20, "non_finite", shown[loss], f"loss {loss}")
    assert (grad["update"], grad["trigger"], grad["value"]) == (
        21, "non_finite_grad", shown[str(fired[1].value)])
    text = report(tmp_path / "summary.json")
    assert f"update 20  non_finite  {shown[loss]}  loss {loss}  -> " in text
    assert (f"update 21  non_finite_grad  {shown[str(fired[1].value)]}  {fired[1].detail}  "
            f"-> {fired[1].trace}") in text


def test_an_out_of_memory_error_in_backward_is_kept_as_a_failed_trace(tmp_path):
    r, folder, summary = failure("oom", tmp_path, max_traces=12)
    reason = ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 GiB "
              "(GPU 0; 79.35 GiB total capacity; 71.20 GiB already allocated)")
    assert r["error"] == reason  # the program still sees its exception
    stalls, noise = host_stalls(r["watch"], {15})
    assert set(os.listdir(folder)) - noise == {"update-000015-exception.jsonl"}
    lines = judged(folder / "update-000015-exception.jsonl", tmp_path, complete=False)
    assert lines[-1]["reason"] == reason
    assert {"aten::addmm", "aten::relu"} <= {o["op_name"] for o in kinds(lines, "op")}
    assert kinds(lines, "memory")
    assert torch.autograd.backward.__module__ == "torch.autograd"
    (firing,) = [f for f in summary["triggers"]["fired"] if f["update"] not in stalls]
    assert (firing["update"], firing["trigger"], firing["detail"]) == (15, "exception", reason)
    assert firing["trace"] == str(folder / "update-000015-exception.jsonl")


def test_a_real_allocation_failure_in_forward_is_kept_as_a_failed_trace(tmp_path):
    # tests/gpu/watch_oom.py, which tests/gpu/run.sh runs on CUDA (a real
    # torch.cuda.OutOfMemoryError, with the caching allocator's sample), on the CPU:
    # the CPU allocator refuses 2^60 bytes in the forward of update 15
    env = dict(os.environ, PYTHONPATH=str(REPO / "bindings" / "python"))
    r = subprocess.run([sys.executable, str(REPO / "tests" / "gpu" / "watch_oom.py"), str(tmp_path),
                        "--device", "cpu"], capture_output=True, text=True, timeout=300, env=env)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and not [l for l in lines if l.startswith("FAIL")], r.stdout + r.stderr
    assert sum(l.startswith("ok    watch OOM: ") for l in lines) == 9, r.stdout
    assert "ok    watch OOM: forward reached fc1, never fc2 (modules ['Net', 'fc1'])" in lines
    trace = judged(tmp_path / "traces" / "update-000015-exception.jsonl", tmp_path, complete=False)
    assert "DefaultCPUAllocator: can't allocate memory" in trace[-1]["reason"]


def test_a_non_finite_gradient_in_an_update_read_in_full_fires(tmp_path):
    hooks = []

    def before(i, model, opt):
        if i == 10:
            running[0].trigger("look at 10")
        if i == 11:  # the update captured in full: fc1's gradient overflows, the loss does not
            hooks.append(model.fc1.weight.register_hook(lambda g: g * float("inf")))
        if i == 12:
            hooks.pop().remove()

    running = []
    start = ctt.watch.start
    ctt.watch.start = lambda self: running.append(self) or start(self)
    try:
        with pytest.warns(RuntimeWarning, match="non-finite gradient in fc1.weight"):
            w, folder = watched(tmp_path, 14, before, triggers=NO_SLOW)
    finally:
        ctt.watch.start = start
    # the inf gradient's step turns the weights, then update 12's loss, non-finite: the
    # cap of 3 traces is reached there
    assert [(f.update, f.trigger) for f in w.fired] == [(10, "user"), (11, "non_finite_grad"),
                                                        (12, "non_finite")]
    grad = w.fired[1]
    assert grad.value == float("inf") and grad.threshold == 0.0
    assert grad.detail == "non-finite gradient norm in fc1.weight (1 of 4)"
    # its trace is the full capture it was read in; no capture of its own follows it
    assert grad.trace == str(folder / "update-000011-after-user.jsonl")
    assert sorted(os.listdir(folder)) == ["update-000010-user.jsonl", "update-000011-after-user.jsonl",
                                          "update-000012-non_finite.jsonl"]
    off = ctt.Triggers(slow=None, non_finite_grad=False)
    running.clear()
    ctt.watch.start = lambda self: running.append(self) or start(self)
    try:
        with pytest.warns(RuntimeWarning, match="non-finite gradient in fc1.weight"):
            w, _ = watched(tmp_path / "off", 14, before, triggers=off)
    finally:
        ctt.watch.start = start
    assert [(f.update, f.trigger) for f in w.fired] == [(10, "user"), (12, "non_finite")]


def stolen_s():
    """Each CPU's time stolen by the VM's host so far (/proc/stat, seconds)."""
    tick = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        return [int(line.split()[8]) / tick for line in f if line.startswith("cpu") and line[3].isdigit()]


def test_a_run_shorter_than_the_slow_triggers_warm_up_says_it_never_armed(tmp_path):
    """A stall in a run's first updates cannot fire: the window has no median yet. The
    watch says so (``candle-trace run`` prints it), rather than a bare "no triggers
    fired" that reads as "nothing was slow"."""
    w, _ = watched(tmp_path, 4, work_s=0.001, triggers=Triggers(warmup=5), flight_recorder=False)
    m = re.fullmatch(r"the slow trigger arms after 5 timed updates; this run timed (\d+)",
                     w.slow_unarmed or "")
    assert m and int(m.group(1)) < 5, w.slow_unarmed
    timed = int(m.group(1))
    # the same run one update per missing one longer: armed, nothing to say
    w, _ = watched(tmp_path / "longer", 4 + 5 - timed, work_s=0.001,
                   triggers=Triggers(warmup=5), flight_recorder=False)
    assert w.slow_unarmed is None
    w, _ = watched(tmp_path / "off", 3, work_s=0.001, triggers=NO_SLOW, flight_recorder=False)
    assert w.slow_unarmed is None  # off: nothing to arm


def test_a_run_without_anomaly_writes_nothing(tmp_path):
    # the slow trigger at its defaults: the machine's stalls are not the program's
    # (a 10,000-update run of this machine's: test_torch_triggers.py). Where the VM's
    # kernel charges a vCPU the host took away to the thread that was running (a CI run:
    # 75.7 ms against a 63.5 ms bar, in work on the CPU, with 0.9 ms of run-queue wait),
    # no rule can tell it from the program's own time; a firing is excused only where the
    # host stole time from the CPUs during that update, at least its excess over the bar
    # in all (the thread may have run on either vCPU while the host held it) up to the
    # counters' tick on each (/proc/stat counts steal in ticks: a CI run's 104.4 ms update
    # against a 67.3 ms bar read 2 ticks of 10 ms on each CPU).
    stolen = {}

    def before(i, model, opt):
        stolen[i] = stolen_s()

    w, folder = watched(tmp_path, 60, before)
    stolen[61] = stolen_s()

    def stolen_in(u):
        return [b - a for a, b in zip(stolen[u], stolen[u + 1])]

    tick = 1 / os.sysconf("SC_CLK_TCK")

    def host_took(u):
        st = stolen_in(u)
        return sum(st) + tick * len(st) if sum(st) > 0 else 0.0

    excused = {f.update for f in w.fired
               if f.trigger == "slow" and host_took(f.update) >= f.value - f.threshold}
    unexcused = [f for f in w.fired if f.update not in excused]
    # A firing's own trace is the evidence of where the update's time went: its report
    # goes into the failure's message (a CI run's temporary folder is gone by the time
    # anyone reads the log).
    assert unexcused == [], "\n".join(
        [repr(([(f.update, f.detail) for f in w.fired],
               {f.update: stolen_in(f.update) for f in w.fired}))] +
        [report(folder / n)[:6000] for f in unexcused for n in sorted(slow_traces([f.update]))
         if (folder / n).exists()])
    assert set(os.listdir(folder)) <= slow_traces(excused)
    assert w.updates == 60
    assert torch.autograd.backward.__module__ == "torch.autograd"


@pytest.fixture
def gc_thresholds():
    """Sets Python's GC thresholds for the test (and turns GC on), restoring both."""
    was, on = gc.get_threshold(), gc.isenabled()
    gc.enable()
    yield gc.set_threshold
    gc.set_threshold(*was)
    if not on:
        gc.disable()


@pytest.mark.parametrize("young, middle, want", [
    (5, 0, -1),    # next to nothing allocated since the last collection
    (29, 0, -1),   # under half the threshold: the update will not reach it
    (30, 0, 0),    # half: the youngest generation now
    (30, 4, 1),    # the next young collection makes the middle one due: both now
])
def test_collect_ahead_runs_the_collection_the_next_update_would(gc_thresholds, young, middle, want):
    from candle_trace.torch._common import collect_ahead

    gc_thresholds(60, 5, 1000)
    gc.collect()
    for _ in range(middle):  # young collections, each counted in the middle generation
        gc.collect(0)
    assert gc.get_count()[1] == middle
    keep = []
    while gc.get_count()[0] < young:
        keep.append([])  # GC-tracked, alive
    assert gc.get_count()[0] == young
    assert collect_ahead() == want
    if want >= 0:
        assert gc.get_count()[0] == 0
    gc.disable()
    assert collect_ahead() == -1  # the program's choice stands
    del keep


def test_the_watch_collects_between_updates_not_inside_them(tmp_path, gc_thresholds):
    """Objects left between two updates (here 190, against a young-generation threshold
    of 200: the next update's first allocations would collect) are collected inside
    step(), in its time, not the update's; an update's own allocations (tens of objects
    here, on either torch) stay under the threshold from there."""
    gc_thresholds(200, 10, 10)
    model = Slow()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    where, inside = [], [False]

    def note(phase, info):
        if phase == "start":
            where.append("update" if inside[0] else "step")

    gc.callbacks.append(note)
    try:
        with ctt.watch(model, opt, tmp_path / "traces") as w:
            left = []
            for _ in range(20):
                inside[0] = True
                x, y = torch.randn(8, 16), torch.randn(8, 4)
                opt.zero_grad()
                ((model(x) - y) ** 2).mean().backward()
                opt.step()
                inside[0] = False
                left = []
                while gc.get_count()[0] < 190:
                    left.append([])
                w.step()
    finally:
        gc.callbacks.remove(note)
    assert where.count("step") >= 19, where
    assert "update" not in where, (where.index("update"), len(where))


@pytest.mark.parametrize("updates, warned, share", [
    # (tracer s, wall s, step() s) per update; the first three are warm-up: left out
    ([(0.5, 1.0, 0.5)] * 3 + [(0.0, 0.01, 0.0001)] * 20, False, 0.01),
    # the median of 0.04 and 0.08 (tracer time over the update's own, step() on top)
    ([(0.0, 1.0, 0.0)] * 3 + [(0.02, 0.52, 0.0)] * 10 + [(0.04, 0.54, 0.0)] * 10, True, 0.06),
    ([(0.0, 1.0, 0.0)] * 3 + [(0.0, 0.01, 0.002)] * 20, True, 0.2),  # step()'s work alone
    ([(0.0, 1.0, 0.0)] * 3 + [(0.2, 0.1, 0.0)] * 20, True, 1e3),  # a skewed clock: bounded
    ([(0.0, 1.0, 0.0)] * 3 + [(0.2, 1.0, 0.0)] * 19, False, None),  # not measured yet: 20 updates
])
def test_the_recorders_cost_is_measured_once_and_told(monkeypatch, updates, warned, share):
    from candle_trace.torch import _common
    from candle_trace.torch._watch import RecorderCost

    monkeypatch.setattr(_common, "_warned", set())
    cost = RecorderCost()
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        for tracer, wall, step in updates:
            cost.add(tracer, wall, step)
        if share is not None:  # measured once: what comes after does not change it
            for _ in range(30):
                cost.add(0.009, 0.01, 0.001)
    told = [w for w in got if "flight recorder adds at least" in str(w.message)]
    assert bool(told) == warned, [str(w.message) for w in got]
    if warned:
        assert "watch(..., flight_recorder=False) keeps every trigger" in str(told[0].message)
        assert f"{share:.0%}" in str(told[0].message)
    if share is None:
        assert cost.share is None
    else:
        assert cost.share == pytest.approx(share)


def test_the_recorders_cost_warning_names_the_way_out_it_is_given(monkeypatch):
    """`candle-trace run --watch` has no code to change: its warning names its flag."""
    from candle_trace.torch import _common
    from candle_trace.torch._watch import RecorderCost

    monkeypatch.setattr(_common, "_warned", set())
    cost = RecorderCost()
    cost.way_out = "candle-trace run --watch ... --no-flight-recorder"
    with pytest.warns(RuntimeWarning) as got:
        for _ in range(23):
            cost.add(0.0, 0.01, 0.002)
    assert "candle-trace run --watch ... --no-flight-recorder keeps every trigger" in str(got[0].message)
    assert "watch(..." not in str(got[0].message)


class Tiny(nn.Module):
    """An op-bound update: 24 small layers at batch 2."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(12)])

    def forward(self, x):
        return self.layers(x)


def test_the_watch_tells_an_op_bound_loop_what_its_recorder_costs(tmp_path, monkeypatch):
    from candle_trace.torch import _common

    monkeypatch.setattr(_common, "_warned", set())
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        with ctt.watch(model, opt, tmp_path / "tiny", aggregate_path=tmp_path / "tiny.json") as w:
            for _ in range(25):
                opt.zero_grad()
                model(torch.randn(2, 8)).sum().backward()
                opt.step()
                w.step()
    told = [x for x in got if "flight recorder adds at least" in str(x.message)]
    assert w.recorder_cost.share is not None and w.recorder_cost.share >= 0.05, w.recorder_cost.share
    assert len(told) == 1 and told[0].filename == __file__, [str(x.message) for x in got]
    # stated once in the whole-run summary too
    summary = json.loads((tmp_path / "tiny.json").read_text())
    scalars = {s["label"]: s for s in summary["scalars"]}
    share = scalars["flight_recorder/share"]
    assert share["count"] == 1 and share["last"] == pytest.approx(w.recorder_cost.share, rel=1e-12)
    # A compute-bound update (100 ms of work in forward): measured, and not told.
    # What step() spends arming the next update's recording counts (ct_reopen, with
    # the library's Go runtime and the kernel's paths cold after the update: 0.3-2 ms
    # on a 2-vCPU VM), which is 2-9% of a 20 ms update there.
    monkeypatch.setattr(_common, "_warned", set())
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        w2, _ = watched(tmp_path, 25, work_s=0.1)
    assert w2.recorder_cost.share is not None and w2.recorder_cost.share < 0.05, w2.recorder_cost.share
    assert not [x for x in got if "flight recorder adds at least" in str(x.message)]


def test_the_flight_recorder_keeps_one_session_and_its_wrappers_for_the_run(tmp_path, monkeypatch):
    import candle_trace.torch._watch as _watch
    from candle_trace.torch import _capture

    opened, wrappers, running = [], [], []

    class Counted(_capture.Session):
        def __init__(self, *a, **k):
            opened.append(os.path.basename(a[0]))
            super().__init__(*a, **k)

    monkeypatch.setattr(_capture, "Session", Counted)
    start = _watch.watch.start
    monkeypatch.setattr(_watch.watch, "start", lambda self: running.append(self) or start(self))

    def before(i, model, opt):
        if i <= 30:
            wrappers.append(model.fc1.__dict__.get("forward"))
        if i == 30:
            running[0].trigger("look at update 30")

    w, folder = watched(tmp_path, 32, before, triggers=NO_SLOW)
    assert [(f.update, f.trigger) for f in w.fired] == [(30, "user")]
    # one session for updates 1-30 (29 of them dropped, reopened in place), one for
    # the full capture of 31, one more flight recorder for 32 (dropped at the end)
    assert opened == ["update-000001-recording.jsonl", "update-000031-after-user.jsonl",
                      "update-000032-recording.jsonl"]
    assert len(set(wrappers)) == 1 and wrappers[0] is not None, "one wrapper, installed once"
    assert "forward" not in w.model.fc1.__dict__, "the wrappers go with the watch"
    lines = judged(folder / "update-000030-user.jsonl", tmp_path)
    assert lines[0]["capture_step"] == 30 and lines[0]["warmup_steps"] == 29
    # update 30's records only: one forward span per module, nothing of the updates dropped
    names = [s["name"] for s in kinds(lines, "span_start") if s.get("step") == "forward"]
    assert sorted(names) == ["Slow", "fc1", "fc2"], names
    assert len([o for o in kinds(lines, "op") if o["op_name"] == "aten::relu"]) == 1


def test_a_full_captures_own_cost_is_not_a_slow_update(tmp_path):
    # Sub-millisecond updates: the full capture after a trigger (statistics, gradient
    # norms) costs the tracer several times the update, and the fresh flight recorder
    # after it opens a session and wraps the modules. Neither is the program's time: the
    # update captured in full is not timed, and the time the slow rule judges for the
    # ones after it leaves the tracer's work out.
    #
    # Judged on the times the rule receives, not on whether it fires: a stall of this
    # 2-vCPU VM inside the few updates after a capture fired it in CI (3.2 ms against a
    # 2.6 ms bar at update 22, nothing held up), and this test failed as often at the
    # commit before as after under a CPU hog. Six captures in one loop: a leak of the
    # tracer's work lands on the update after every one of them, a stall on one; the
    # median over the six against the median of the others tells them apart. The slow
    # trigger is off, so that a stall writes no trace of its own.
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    folder = tmp_path / "fast"
    captures = [20, 40, 60, 80, 100, 120]  # the user's triggers: their next update is captured
    times: dict = {}
    gc.collect()
    gc.disable()  # a full collection is a real pause, but not the one this test makes
    try:
        with ctt.watch(model, opt, folder, max_traces=2 * len(captures),
                       triggers=Triggers(slow=None)) as w:
            evaluate = w._eval.end_of_update

            def spy(update, timed, loss, waited):
                # what the rule judges: the update's time less the time the machine held
                # its thread up (CpuWait) -- beside CPU hogs, the thread waits for a CPU
                # while the library's drainer writes the capture, up to 44 ms here
                times[update] = None if timed is None else timed - held_up(timed, waited)
                return evaluate(update, timed, loss, waited)

            w._eval.end_of_update = spy
            for i in range(1, 131):
                opt.zero_grad()
                model(torch.randn(8, 16)).pow(2).mean().backward()
                opt.step()
                if i in captures:
                    w.trigger("look")
                w.step()
    finally:
        gc.enable()
    assert [(f.update, f.trigger) for f in w.fired] == [(u, "user") for u in captures]
    assert all(times[u + 1] is None for u in captures), "an update captured in full is not timed"
    after = [times[u + d] for u in captures for d in (2, 3)]  # the fresh recorder's first two
    others = [t for u, t in times.items() if t is not None and u > 10 and
              not any(c < u <= c + 3 for c in captures)]
    assert None not in after
    base = statistics.median(others)
    # 0.13 ms over the others' 0.50 ms on this VM (its caches, after the capture's writing)
    assert statistics.median(after) < base + 1e-3, (statistics.median(after), base, after)
    expected = {f"update-{u:06d}-user.jsonl" for u in captures} | \
        {f"update-{u + 1:06d}-after-user.jsonl" for u in captures}
    assert set(os.listdir(folder)) == expected


def test_the_programs_own_trigger_and_the_cap(tmp_path):
    model = Slow()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    folder = tmp_path / "asked"
    with ctt.watch(model, opt, folder, max_traces=3, triggers=Triggers(slow=None)) as w:
        for i in range(1, 9):
            opt.zero_grad()
            model(torch.randn(8, 16)).pow(2).mean().backward()
            opt.step()
            if i in (2, 5, 6):
                w.trigger(f"checkpoint at {i}")
            w.step()
    assert [(f.update, f.trigger, f.detail) for f in w.fired] == [
        (2, "user", "checkpoint at 2"), (5, "user", "checkpoint at 5"), (6, "user", "checkpoint at 6")]
    # three traces at most: update 2, the one after it, update 5; none for update 6
    assert sorted(os.listdir(folder)) == ["update-000002-user.jsonl", "update-000003-after-user.jsonl",
                                          "update-000005-user.jsonl"]
    assert w.fired[2].trace is None
    for name in os.listdir(folder):
        judged(folder / name, tmp_path)


@pytest.mark.parametrize("kw,msg", [
    ({"max_traces": -1}, "max_traces must be an integer >= 0"),
    ({"recorder_bytes": 0}, "recorder_bytes must be an integer >= 1"),
    ({"triggers": Triggers(slow=0.5)}, "triggers.slow must be a factor > 1"),
    ({"triggers": Triggers(window=0)}, "triggers.window must be an integer >= 1"),
    ({"first_update": 0}, "first_update must be an integer >= 1, got 0"),
    ({"first_update": True}, "first_update must be an integer >= 1, got True"),
])
def test_bad_options_are_refused(kw, msg):
    with pytest.raises(ctt.CandleTraceError, match=msg.replace(".", r"\.")):
        ctt.watch(nn.Linear(2, 2), None, "never", **kw)


def test_wrappers_put_on_after_the_watch_started_stay(tmp_path):
    """An LR scheduler wraps ``optimizer.step`` when it is made (``candle-trace run`` too,
    to count updates), often after the watch started: dropping a flight capture whose
    wrappers lie under it must not put back what was there before them (that took the
    later wrapper out with them), and neither must the watch's end."""
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    orig_backward = torch.autograd.backward
    steps, backwards = [], []
    try:
        with ctt.watch(model, opt, tmp_path / "t", triggers=NO_SLOW) as w:
            inner_step, inner_backward = opt.step, torch.autograd.backward

            def counted_step(*a, **k):
                steps.append(1)
                return inner_step(*a, **k)

            def counted_backward(*a, **k):
                backwards.append(1)
                return inner_backward(*a, **k)

            opt.step, torch.autograd.backward = counted_step, counted_backward
            for i in range(1, 8):
                if i == 3:  # update 4 is then captured in full: the flight capture is dropped
                    w.trigger("look")
                opt.zero_grad()
                model(torch.randn(3, 4)).sum().backward()
                opt.step()
                w.step()
        assert opt.step is counted_step and torch.autograd.backward is counted_backward
        assert (len(steps), len(backwards)) == (7, 7)
        assert [(f.update, f.trigger) for f in w.fired] == [(3, "user")]
        assert sorted(os.listdir(tmp_path / "t")) == ["update-000003-user.jsonl",
                                                      "update-000004-after-user.jsonl"]
        # what is left beneath them calls straight through once the watch is over
        opt.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        assert (len(steps), len(backwards)) == (8, 8)
    finally:
        torch.autograd.backward = orig_backward


def test_a_loop_that_ends_just_after_a_trigger_leaves_no_trace_of_the_update_after(tmp_path):
    """The update after a trigger is armed for a full capture at the trigger's step(); a
    loop that ends there never begins it, and a failed trace of nothing of the
    program's would only be noise."""
    model = Slow(0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    folder = tmp_path / "traces"
    with ctt.watch(model, opt, folder, triggers=NO_SLOW) as w:
        for i in range(1, 5):
            if i == 4:
                w.trigger("look")
            opt.zero_grad()
            ((model(torch.randn(8, 16)) - torch.randn(8, 4)) ** 2).mean().backward()
            opt.step()
            w.step()
    assert [(f.update, f.trigger) for f in w.fired] == [(4, "user")]
    assert sorted(os.listdir(folder)) == ["update-000004-user.jsonl"]
    assert w.traces == [str(folder / "update-000004-user.jsonl")]


def test_a_watch_started_part_way_says_the_loops_numbers(tmp_path):
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ctt.watch(model, opt, str(tmp_path / "w"), first_update=11) as w:
        for i in range(11, 14):
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
            if i == 12:
                w.trigger("the program's own reason")
            w.step()
    assert w.updates == 13
    assert [(f.update, f.trigger) for f in w.fired] == [(12, "user")]
    assert sorted(os.listdir(tmp_path / "w")) == ["update-000012-user.jsonl",
                                                  "update-000013-after-user.jsonl"]
    lines = judged(tmp_path / "w" / "update-000012-user.jsonl", tmp_path)
    assert lines[0]["capture_step"] == 12
