"""The core binding against the real library (no torch)."""

from __future__ import annotations

import gc
import os
import statistics
import threading
import time

import pytest
from conftest import candle_graph, read_trace, validate

import candle_trace as ct
from candle_trace import CandleTraceError, Status
from candle_trace.session import DROPPED_REASON


def open_session(tmp_path, name="t.jsonl", **kw):
    kw.setdefault("capture_step", 1)
    return ct.Session(tmp_path / name, "test::session", **kw)


def test_complete_trace_with_every_record(tmp_path):
    path = tmp_path / "all.jsonl"
    contract = {"measurement_scope": "profiled_work", "operations": "complete",
                "gradients": "complete", "logical_memory": "partial",
                "physical_memory": "partial", "device_timing": "partial",
                "gradient_contract": ct.gradient_contract([("m", "w", "fc"), ("m", "b", "fc")])}
    with ct.Session(path, "test::all", capture_step=2, tags={"k": "v"}, contract=contract,
                    identity={"workload_id": "w", "model_id": "m", "config_id": "c",
                              "data_id": "d", "seed_policy": "s", "precision": "f32",
                              "device_state": "cpu", "physical_batch": 4,
                              "accumulation_steps": 1, "implementation_id": "pytorch"}) as s:
        with s.measure("update") as upd:
            with s.span("fwd", kind="module", step="forward") as fwd:
                t0 = s.now_ns()
                s.record_op(fwd, "matmul", dtype="f32", device="cpu", shape=[2, 3],
                            inputs=["x", "w"], output="y", duration_ns=5, timestamp_ns=t0,
                            input_dense_bytes=48)
                s.record_tensor(fwd, "x", dtype="f32", device="cpu", shape=[2, 2],
                                label="input", category="activation")
                s.record_data_edge("x", "y")
                s.record_tensor_stats(fwd, "y", dtype="f32", shape=[2, 3], non_finite=0,
                                      rms=1.0, abs_max=2.0, mean=0.5)
                s.record_tensor_stats_f32(fwd, "y32", [1.0, -3.0, float("inf"), 0.0], [2, 2])
                s.record_scalar(fwd, "loss", 0.25)
                s.record_memory(fwd, "alloc", storage_id="st", tensor_id="y", device="cpu",
                                dtype="f32", bytes=24, shape=[2, 3], op_name="matmul",
                                category="activation")
                s.record_memory(fwd, "free", storage_id="st", tensor_id="y", device="cpu",
                                dtype="f32", bytes=24, shape=[2, 3])
                s.record_device_interval(fwd, device="cpu", stream_id="0", backend="host",
                                         start_ns=s.now_ns(), duration_ns=10, name="k",
                                         correlation_id=7)
            s.record_call_edge(upd, fwd)
            s.record_gradient("m", "w", "present", 1.5)
            s.record_gradient("m", "b", ct.GradientState.CT_GRADIENT_ZERO, 0.0)
            s.record_device_memory("cpu", used_bytes=1, reserved_bytes=2)
        start = s.now_ns()
        time.sleep(0.001)
        s.record_completed_span("io", "function", start, s.now_ns() - start)
    lines = read_trace(path)
    kinds = {line["kind"] for line in lines}
    assert {"meta", "span_start", "span_end", "op", "tensor", "tensor_stats", "memory",
            "device_memory", "device_interval", "gradient", "edge", "terminal"} <= kinds
    assert lines[-1] == {"kind": "terminal", "outcome": "complete",
                         "timestamp_ns": lines[-1]["timestamp_ns"], "tracer_ns": 0,
                         "tracer_estimated_ns": 0}
    candle_graph(path, tmp_path)
    validate(path)


def test_exception_in_session_writes_failed_trace_and_propagates(tmp_path):
    path = tmp_path / "failed.jsonl"
    with pytest.raises(ZeroDivisionError):
        with ct.Session(path, "test::fail", capture_step=1) as s:
            with s.measure("update"):
                with s.span("inner"):
                    1 / 0
    term = read_trace(path)[-1]
    assert term["outcome"] == "failed"
    assert "ZeroDivisionError" in term["reason"] and "division by zero" in term["reason"]
    summary = candle_graph(path, tmp_path, require_valid=False)
    assert summary["health"]["structurally_valid"]


def test_bad_arguments_raise_with_library_message(tmp_path):
    with pytest.raises(CandleTraceError) as e:
        ct.Session(tmp_path / "x.jsonl", "e", capture_step=0)
    assert e.value.status is Status.CT_ERR_INVALID_ARGUMENT
    assert e.value.status.name == "CT_ERR_INVALID_ARGUMENT"
    assert '"capture_step"' in e.value.message and e.value.message.startswith("ct_open: run JSON")
    assert not (tmp_path / "x.jsonl").exists()

    with pytest.raises(CandleTraceError) as e:
        ct.Session(tmp_path / "y.jsonl", "e", run={"runid": "x"})
    assert 'unknown key "runid"' in e.value.message

    s = open_session(tmp_path, measured_root=True)
    with pytest.raises(CandleTraceError) as e:
        s.record_gradient("m", "k", "present", None)  # present needs a norm
    assert e.value.status is Status.CT_ERR_INVALID_ARGUMENT and "ct_record_gradient" in str(e.value)
    with pytest.raises(CandleTraceError) as e:
        s.record_data_edge("nope", "nada")
    assert e.value.status is Status.CT_ERR_INVALID_ARGUMENT
    with pytest.raises(CandleTraceError) as e:
        s.record_op(999999, "op", dtype="f32", device="cpu")  # unknown span
    assert e.value.status is Status.CT_ERR_INVALID_HANDLE
    with pytest.raises(CandleTraceError) as e:
        s.span("x", kind="bogus")
    assert e.value.status is Status.CT_ERR_INVALID_ARGUMENT
    with pytest.raises(CandleTraceError) as e:  # a second measured region
        with s.measure("again"):
            pass
    assert e.value.status is Status.CT_ERR_STATE
    outer = s.span("outer").__enter__()
    inner = s.span("inner").__enter__()
    with pytest.raises(CandleTraceError) as e:
        s.end_span(outer)  # not the innermost span of this thread
    assert e.value.status is Status.CT_ERR_SPAN_MISMATCH
    inner.__exit__(None, None, None)
    with pytest.raises(CandleTraceError) as e:
        s.finish()  # "outer" is still open: refused, session stays usable
    assert e.value.status is Status.CT_ERR_STATE
    outer.__exit__(None, None, None)
    s.finish()
    with pytest.raises(CandleTraceError) as e:
        with s.span("late"):
            pass
    assert e.value.status is Status.CT_ERR_INVALID_HANDLE
    with pytest.raises(CandleTraceError) as e:
        s.record_scalar(1, "x", 1.0)
    assert e.value.status is Status.CT_ERR_INVALID_HANDLE


def test_span_as_decorator_and_nesting(tmp_path):
    path = tmp_path / "deco.jsonl"
    s = open_session(tmp_path, "deco.jsonl", measured_root=True)

    @s.span("leaf", kind="op")
    def leaf(x):
        return x + 1

    @s.span("outer", step="forward")
    def outer(n):
        return sum(leaf(i) for i in range(n))

    assert outer(3) == 6
    assert leaf.__name__ == "leaf"
    with pytest.raises(KeyError):  # exceptions pass through the decorator untouched
        s.span("raises")(lambda: {}["k"])()
    s.finish()
    spans = [line for line in read_trace(path) if line["kind"] == "span_start"]
    by_id = {sp["id"]: sp for sp in spans}
    leaves = [sp for sp in spans if sp["name"] == "leaf"]
    assert len(leaves) == 3
    assert all(by_id[sp["parent_id"]]["name"] == "outer" for sp in leaves)
    assert all(sp["span_kind"] == "op" for sp in leaves)
    candle_graph(path, tmp_path)


def test_spans_nest_per_thread(tmp_path):
    path = tmp_path / "threads.jsonl"
    s = open_session(tmp_path, "threads.jsonl", measured_root=True)
    errors = []

    def work(i):
        try:
            for _ in range(200):
                with s.span(f"t{i}"):
                    with s.span(f"t{i}/child"):
                        pass
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    with s.span("main"):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    s.finish()
    assert not errors
    spans = {sp["id"]: sp for sp in read_trace(path) if sp["kind"] == "span_start"}
    for sp in spans.values():
        if sp["name"].endswith("/child"):
            assert spans[sp["parent_id"]]["name"] == sp["name"].split("/")[0]
        elif sp["name"] in ("t0", "t1", "t2", "t3"):
            assert sp["parent_id"] == "s1"  # threads have no open span: the root
    candle_graph(path, tmp_path)


def test_disabled_session_writes_nothing(tmp_path):
    path = tmp_path / "off.jsonl"
    with ct.Session(path, "test::off", enabled=False) as s:
        with s.measure("u"):
            with s.span("x", kind="module", step="forward") as sp:
                s.record_op(sp, "op", dtype="f32", device="cpu")
                s.record_gradient("m", "k", "present", 1.0)

        @s.span("f")
        def f():
            return 3

        assert f() == 3
        assert s.now_ns() == 0
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


def test_span_cost_is_small(tmp_path):
    """A span enter+exit through the context manager: median over batches. The
    1 us target is checked by bench.py; here only a loose bound (CI machines vary)."""
    s = open_session(tmp_path, measured_root=True)
    n = 50
    per = []
    for _ in range(400):
        t = time.perf_counter_ns()
        for _ in range(n):
            with s.span("hot"):
                pass
        per.append((time.perf_counter_ns() - t) / n)
    s.finish()
    assert statistics.median(per) < 5000


def test_version_and_abi():
    assert ct.abi_version() == ct.CT_ABI_VERSION
    assert ct.version().count(".") == 2


def test_trace_names_the_python_binding(tmp_path):
    path = tmp_path / "t.jsonl"
    with ct.Session(path, entrypoint="py::binding", phase="infer", measured_root=True):
        pass
    meta = read_trace(path)[0]
    assert meta["producer"]["binding"] == "python"
    assert meta["producer"]["name"] == "candle-trace"


def test_aggregate_session_counts_spans_and_scalars(tmp_path):
    import json

    path = tmp_path / "summary.json"
    with ct.Session(path, "py::agg", phase="train", run={"mode": "aggregate"}) as s:
        for i in range(300):
            if i == 100:
                s.aggregate_enable(False)
            if i == 200:
                s.aggregate_enable(True)
            with s.span("train/step") as sp:
                s.record_scalar(sp, "loss", float(i))
    summary = json.loads(path.read_text())
    assert summary["schema"] == "candle-trace/aggregate/1"
    (step,) = [x for x in summary["spans"] if x["name"] == "train/step"]
    assert step["count"] == 200  # steps 100..199 ran with statistics off
    (loss,) = summary["scalars"]
    assert loss["label"] == "loss" and loss["last"] == 299.0


def test_aggregate_session_lists_the_triggers_that_fired(tmp_path):
    import json

    path = tmp_path / "summary.json"
    with ct.Session(path, "py::agg", phase="train", run={"mode": "aggregate"}) as s:
        s.aggregate_trigger(20, "non_finite", float("nan"), detail="loss nan",
                            trace="update-000020-non_finite.jsonl")
        s.aggregate_trigger(37, "slow", 0.0685, 0.0521, no_trace="the run's cap of 3 traces was reached")
        with pytest.raises(CandleTraceError) as e:
            s.aggregate_trigger(38, "slow", 1.0, 0.5)  # neither a trace nor why none
        assert e.value.status == Status.CT_ERR_INVALID_ARGUMENT
        assert "ct_aggregate_trigger: give the trace written, or (no_trace) why none was" in str(e.value)
        with pytest.raises(CandleTraceError, match="update must be >= 1"):
            s.aggregate_trigger(0, "slow", 1.0, trace="t")
    fired = json.loads(path.read_text())["triggers"]
    assert fired["max"] == 256 and fired["refused"] == 0
    assert [(f["update"], f["trigger"], f["value"], f["threshold"], f["trace"], f["no_trace"])
            for f in fired["fired"]] == [
        (20, "non_finite", "NaN", 0, "update-000020-non_finite.jsonl", ""),
        (37, "slow", 0.0685, 0.0521, "", "the run's cap of 3 traces was reached")]


def test_aggregate_enable_on_a_trace_session_is_refused(tmp_path):
    with ct.Session(tmp_path / "t.jsonl", "py::t", phase="infer", measured_root=True) as s:
        with pytest.raises(CandleTraceError) as e:
            s.aggregate_enable(True)
    assert e.value.status == Status.CT_ERR_STATE
    assert "is a trace session" in str(e.value)


@pytest.mark.parametrize("layout,found", [
    ("nvidia/cuda_cupti/lib/libcupti.so.12", "nvidia/cuda_cupti/lib"),
    ("nvidia/cu13/lib/libcupti.so.13", "nvidia/cu13/lib"),
    ("nvidia/cuda_cupti/lib/README", None),       # the package without its library
    (None, None),                                  # no package at all
])
def test_pip_cupti_dir_follows_the_import_path(tmp_path, monkeypatch, layout, found):
    import sys

    from candle_trace.session import pip_cupti_dir

    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    for name in [m for m in sys.modules if m == "nvidia" or m.startswith("nvidia.")]:
        monkeypatch.delitem(sys.modules, name)
    if layout:
        (tmp_path / layout).parent.mkdir(parents=True)
        (tmp_path / layout).write_bytes(b"")
    assert pip_cupti_dir() == (str(tmp_path / found) if found else None)


def _busy(seconds: float) -> None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pass


@pytest.mark.parametrize("use", ["context manager", "decorator"])
def test_tracer_work_is_left_out_of_spans_and_stated(tmp_path, use):
    path = tmp_path / "tracer.jsonl"
    with open_session(tmp_path, "tracer.jsonl") as s:
        work = s.tracer_work()(lambda: _busy(0.05))
        with s.measure("update"):
            t0 = time.perf_counter_ns()
            with s.span("forward", kind="module", step="forward"):
                _busy(0.01)
                if use == "decorator":
                    work()
                else:
                    with s.tracer_work():
                        _busy(0.05)
            wall = time.perf_counter_ns() - t0
        assert s.tracer_ns() >= 50_000_000
    lines = read_trace(path)
    ends = {e["id"]: e for e in lines if e["kind"] == "span_end"}
    fwd, upd = ends["s3"], ends["s2"]
    assert upd["tracer_ns"] >= 50_000_000
    # Bounds from the wall time around the span, not constants (a loaded machine
    # stretches both): the span holds its 10 ms of work, and not the tracer's time,
    # which the wall time around it does hold (1 ms for the two clocks' difference).
    assert fwd["duration_ns"] >= 10_000_000
    assert fwd["duration_ns"] + upd["tracer_ns"] <= wall + 1_000_000, "the tracer's 50 ms is not the forward's"
    assert lines[-1]["tracer_ns"] >= upd["tracer_ns"]
    candle_graph(path, tmp_path)
    validate(path)


def test_tracer_work_refuses_an_end_without_begin(tmp_path):
    with open_session(tmp_path) as s:
        with s.measure("update"):
            with pytest.raises(CandleTraceError) as e:
                s._call(s._c.ct_tracer_end(s.handle))
            assert e.value.status == Status.CT_ERR_STATE
            assert "ct_tracer_end: no tracer interval is open" in str(e.value)


def test_buffered_session_writes_only_at_finish(tmp_path):
    path = tmp_path / "flight" / "t.jsonl"
    with open_session(tmp_path, "flight/t.jsonl", run={"buffer": {"max_bytes": 1 << 20}}) as s:
        with s.measure("update"):
            with s.span("fwd", kind="module", step="forward") as fwd:
                s.record_scalar(fwd, "loss", 0.5)
        s.flush()
        assert not path.parent.exists(), "a buffered session creates nothing before finish"
        assert s.dropped_records == 0
    lines = read_trace(path)
    assert lines[-1]["outcome"] == "complete"
    assert lines[-1]["dropped_records"] == 0
    candle_graph(path, tmp_path)


def test_buffered_session_discard_leaves_nothing(tmp_path):
    s = open_session(tmp_path, "flight/t.jsonl", run={"buffer": {"max_bytes": 1 << 12}})
    with s.measure("update"):
        with s.span("fwd") as fwd:
            for i in range(200):
                s.record_scalar(fwd, "loss", float(i))
    assert s.dropped_records > 0, "past max_bytes records are dropped, not refused"
    s.discard()
    assert s.finished
    assert not (tmp_path / "flight").exists()
    s.discard()  # ended already: nothing to do, no error
    assert s.dropped_records == 0


def test_discard_of_a_streaming_session_is_refused(tmp_path):
    with open_session(tmp_path, measured_root=True) as s:
        with pytest.raises(CandleTraceError) as e:
            s.discard()
        assert e.value.status == Status.CT_ERR_STATE
        assert "nothing to discard" in e.value.message
        assert not s.finished
    assert read_trace(tmp_path / "t.jsonl")[-1]["outcome"] == "complete"


def test_buffered_session_reopens_as_the_next_update(tmp_path):
    s = open_session(tmp_path, "flight/recording.jsonl", run={"buffer": {"max_bytes": 1 << 20}})
    first, hc = s.handle, s._hc
    for step in range(3, 40):  # each update recorded, then dropped for the next
        with s.measure("update"):
            with s.span("fwd", kind="module", step="forward") as fwd:
                s.record_scalar(fwd, "loss", float(step))
        s.reopen(tmp_path / "flight" / f"update-{step + 1}.jsonl", step + 1)
    assert s.handle != first and s._hc is hc and hc.value == s.handle
    with s.measure("update"):
        with s.span("fwd", kind="module", step="forward") as fwd:
            s.record_scalar(fwd, "loss", 40.0)
    assert not (tmp_path / "flight").exists(), "nothing written before finish"
    s.finish()
    assert os.listdir(tmp_path / "flight") == ["update-40.jsonl"]
    lines = read_trace(tmp_path / "flight" / "update-40.jsonl")
    assert (lines[0]["capture_step"], lines[0]["warmup_steps"]) == (40, 39)
    assert lines[0]["correlation_id"] == "test::session/update-40"
    # only update 40's records: the dropped updates left nothing
    assert [e["mean"] for e in lines if e["kind"] == "tensor_stats"] == [40.0]
    candle_graph(tmp_path / "flight" / "update-40.jsonl", tmp_path)


def test_a_reopened_session_dropped_unfinished_ends_at_its_latest_path(tmp_path):
    # The finalizer follows the handle a reopen changes in place (it holds the same
    # holder the span fast paths do), so the session it ends is the current one.
    s = open_session(tmp_path, "flight/u-2.jsonl", measured_root=True, run={"buffer": {}})
    for step in range(3, 6):
        with s.span("fwd"):
            pass
        s.reopen(tmp_path / "flight" / f"u-{step}.jsonl", step)
    with s.span("fwd"):
        pass
    del s
    gc.collect()
    assert os.listdir(tmp_path / "flight") == ["u-5.jsonl"]
    term = read_trace(tmp_path / "flight" / "u-5.jsonl")[-1]
    assert term["outcome"] == "failed" and term["reason"] == DROPPED_REASON


def test_reopen_refusals_leave_the_session_as_it_was(tmp_path):
    s = open_session(tmp_path, "flight/t.jsonl", run={"buffer": {}})
    with pytest.raises(CandleTraceError) as e:
        s.reopen(tmp_path / "flight" / "t.jsonl", 0)
    assert e.value.status == Status.CT_ERR_INVALID_ARGUMENT and "capture_step" in e.value.message
    assert not s.finished
    s.discard()
    with pytest.raises(CandleTraceError) as e:
        s.reopen(tmp_path / "t.jsonl", 2)
    assert e.value.status == Status.CT_ERR_INVALID_HANDLE
    with open_session(tmp_path, "streaming.jsonl", measured_root=True) as st:
        with pytest.raises(CandleTraceError) as e:
            st.reopen(tmp_path / "streaming.jsonl", 2)
        assert e.value.status == Status.CT_ERR_STATE and "only a buffered session" in e.value.message
        assert not st.finished
    assert read_trace(tmp_path / "streaming.jsonl")[-1]["outcome"] == "complete"


@pytest.mark.parametrize("buffer, message", [
    ({"max_bytes": 0}, '"buffer.max_bytes" must be >= 1, got 0'),
    ({"max_bytes": -1}, '"buffer.max_bytes" must be a non-negative integer, got -1'),
    ({"max_bytes": 1.5}, '"buffer.max_bytes" must be an integer literal'),
    ({"size": 1}, 'unknown key "buffer.size"'),
])
def test_buffered_session_refuses_a_bad_buffer(tmp_path, buffer, message):
    with pytest.raises(CandleTraceError) as e:
        open_session(tmp_path, run={"buffer": buffer})
    assert e.value.status == Status.CT_ERR_INVALID_ARGUMENT
    assert message in e.value.message
    assert not (tmp_path / "t.jsonl").exists()
