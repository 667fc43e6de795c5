"""The captured update's tensor statistics: the library's float32 pass
(ct_reduce_tensor_stats_f32, through StatsRecorder) against float64 references on the
buffers it treats apart -- NaN, +-Inf, -0, denormals, float32's extremes, empty and
non-contiguous tensors, a count float32 cannot hold -- and what the trace records
(after the update: StatsRecorder.flush) being what it reduced; and the argument check
StatsRecorder and the module spans share with the rest of the binding."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import observer_expected, read_trace

torch = pytest.importorskip("torch")

from candle_trace import CandleTraceError, Session  # noqa: E402
from candle_trace.torch._stats import StatsRecorder  # noqa: E402

DENORM = np.float32(np.finfo(np.float32).smallest_subnormal)
F32MAX = float(np.finfo(np.float32).max)


def reference(a: np.ndarray):
    """(elements, non_finite, rms, abs_max, mean) in float64 over the finite elements."""
    v = a.astype(np.float64).ravel()
    fin = v[np.isfinite(v)]
    if fin.size == 0:
        return v.size, v.size, 0.0, 0.0, 0.0
    return (v.size, v.size - fin.size, math.sqrt(float(np.sum(fin * fin)) / fin.size),
            float(np.max(np.abs(fin))), float(np.sum(fin)) / fin.size)


def _cases():
    rng = np.random.default_rng(5)
    big = rng.standard_normal(5000).astype(np.float32) * 1e3
    mixed = big.copy()
    mixed[[3, 1024 + 7, 4999]] = [np.nan, np.inf, -np.inf]
    return {
        "plain": np.array([1, -2, 3, -4], np.float32),
        "NaN and Inf": np.array([2, np.nan, 4, np.inf, -np.inf], np.float32),
        "all NaN": np.full(33, np.nan, np.float32),
        "negative zero": np.array([-0.0, -0.0], np.float32),
        "denormals": np.array([DENORM, -DENORM, DENORM * 7], np.float32),
        "extremes": np.array([F32MAX, -F32MAX, 1e-38], np.float32),
        "one element": np.array([-2.5], np.float32),
        "lanes and blocks": big,
        "non-finite in some blocks": mixed,
        "matrix": rng.standard_normal((17, 61)).astype(np.float32),
    }


@pytest.fixture
def session(tmp_path):
    s = Session(str(tmp_path / "stats.jsonl"), "test::stats", "infer", 1, "cpu")
    yield s
    try:  # a test that failed before its finish()
        s.finish_failed("test over")
    except CandleTraceError:
        pass


def _native():
    """The op observer's library's module (its StatsBuffer), built here."""
    from candle_trace.torch import _observer
    obs = _observer.get()
    assert obs is not None, _observer.failure()
    return obs.native


needs_native = pytest.mark.skipif(not observer_expected(),
                                  reason="no C++ compiler, ninja or torch headers here")


def _recorded(session, tmp_path, tensors, native=None):
    """Records each tensor through a StatsRecorder (its statistics kept in C++ with
    ``native``), flushes, and returns the trace's tensor_stats records in order."""
    rec = StatsRecorder(session, native=native)
    with session.measure("m") as m:
        for label, t in tensors:
            rec.record(m.id, label, t)
        rec.flush()
    session.finish()
    return [r for r in read_trace(tmp_path / "stats.jsonl") if r["kind"] == "tensor_stats"]


def test_float32_statistics_match_a_float64_reference(session, tmp_path):
    cases = _cases()
    got = _recorded(session, tmp_path, [(k, torch.from_numpy(v)) for k, v in cases.items()])
    assert [g["label"] for g in got] == list(cases)
    for g, (name, a) in zip(got, cases.items()):
        n, nf, rms, amax, mean = reference(a)
        assert (g["dtype"], g["shape"], g["elements"], g["non_finite"]) == \
            ("f32", list(a.shape), n, nf), name
        assert g["abs_max"] == amax, name  # exact: the largest |x| is one of the values
        assert g["rms"] == pytest.approx(rms, rel=1e-13, abs=1e-300), name
        # a sum's rounding is relative to the sum of |x|, not to the (cancelling) sum
        scale = float(np.sum(np.abs(a[np.isfinite(a)]).astype(np.float64))) / max(n - nf, 1)
        assert g["mean"] == pytest.approx(mean, abs=1e-13 * scale + 1e-300), name


def test_float32_statistics_equal_the_record_path_bit_for_bit(session, tmp_path):
    """ct_reduce_tensor_stats_f32 (the capture's path) and ct_record_tensor_stats_f32
    (the session API's) are one pass: the same numbers."""
    cases = _cases()
    other = Session(str(tmp_path / "f32.jsonl"), "test::f32", "infer", 1, "cpu")
    with other.measure("m") as m:
        for name, a in cases.items():
            other.record_tensor_stats_f32(m, name, a, a.shape)
    other.finish()
    want = [r for r in read_trace(tmp_path / "f32.jsonl") if r["kind"] == "tensor_stats"]
    got = _recorded(session, tmp_path, [(k, torch.from_numpy(v)) for k, v in cases.items()])
    strip = ("span_id", "ts_ns")
    assert [{k: v for k, v in g.items() if k not in strip} for g in got] == \
        [{k: v for k, v in w.items() if k not in strip} for w in want]


def test_empty_non_contiguous_and_other_dtypes(session, tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    base[1, 1] = float("nan")
    cases = [
        ("empty", torch.zeros(0, 3)),
        ("transposed", base.t()),           # copied contiguous first
        ("strided", base[:, ::2]),
        ("float64", base.double() * 1e150),  # the torch path: beyond float32
        ("int64", torch.tensor([3, -7, 2])),
    ]
    got = _recorded(session, tmp_path, cases)
    for g, (name, t) in zip(got, cases):
        n, nf, rms, amax, mean = reference(t.double().numpy())
        assert (g["elements"], g["non_finite"], list(g["shape"])) == (n, nf, list(t.shape)), name
        assert g["abs_max"] == pytest.approx(amax, rel=1e-15), name
        assert g["rms"] == pytest.approx(rms, rel=1e-13), name
        assert g["mean"] == pytest.approx(mean, rel=1e-13, abs=1e-300), name
    assert [g["dtype"] for g in got] == ["f32", "f32", "f32", "f64", "i64"]


@pytest.mark.parametrize("name, make, pauses", [
    ("float32", lambda b: b, 0),                # the library's pass: no torch op
    ("empty", lambda b: b[:0], 2),              # torch's reduction
    ("transposed", lambda b: b.t(), 2),         # torch's copy, then the library's pass
    ("float64", lambda b: b.double(), 2),       # torch's reduction
])
def test_op_recording_pauses_only_around_torch_ops(session, name, make, pauses):
    """Pausing the capture's op recording costs two rebuilds of torch's record-function
    cache: only a reduction that runs torch ops pauses it (and resumes it)."""
    calls = []
    rec = StatsRecorder(session, calls.append)
    calls.clear()  # the construction's own warm-up
    rec.record(1, name, make(torch.arange(6, dtype=torch.float32).reshape(2, 3)))
    assert calls == [True, False] * (pauses // 2)
    rec.drop()


def test_a_count_float32_cannot_hold(session, tmp_path):
    """2^24 + 17 ones and one NaN: a float32 accumulator stops at 2^24; the float64
    lanes count every one."""
    t = torch.ones(2 ** 24 + 18)
    t[12345] = float("nan")
    (g,) = _recorded(session, tmp_path, [("ones", t)])
    assert (g["elements"], g["non_finite"]) == (2 ** 24 + 18, 1)
    assert (g["mean"], g["rms"], g["abs_max"]) == (1.0, 1.0, 1.0)


def test_nothing_is_recorded_before_flush_and_drop_forgets(session, tmp_path):
    rec = StatsRecorder(session)
    with session.measure("m") as m:
        rec.record(m.id, "kept", torch.ones(3))
        rec.drop()
        rec.record(m.id, "written", torch.full((2,), -2.0))
        rec.flush()
        rec.flush()  # nothing twice
    session.finish()
    got = [r for r in read_trace(tmp_path / "stats.jsonl") if r["kind"] == "tensor_stats"]
    assert [(g["label"], g["mean"]) for g in got] == [("written", -2.0)]


def test_a_refused_record_raises_the_librarys_message(session):
    """A span that does not exist is refused at flush, with the library's message."""
    rec = StatsRecorder(session)
    rec.record(999, "orphan", torch.ones(2))
    with pytest.raises(CandleTraceError, match="span"):
        rec.flush()


def test_a_label_holding_a_nul_is_refused_before_anything_is_reduced(session):
    """The binding's own argument check (_args.text), as every other string argument."""
    from candle_trace import CandleTraceValueError, Status
    rec = StatsRecorder(session)
    with pytest.raises(CandleTraceValueError) as e:
        rec.record(1, "a\0b", torch.ones(2))
    assert e.value.status == Status.CT_ERR_INVALID_ARGUMENT
    assert "candle_trace: StatsRecorder.record: label contains a NUL character ('a\\x00b')" in str(e.value)
    rec.flush()  # nothing was kept


def test_a_module_span_name_holding_a_nul_is_refused_with_the_same_check(session):
    """Module spans (torch._spans.Spans) take the same argument check for their names."""
    from candle_trace import CandleTraceValueError, Status
    from candle_trace.torch._spans import Spans
    spans = Spans(session)
    with pytest.raises(CandleTraceValueError) as e:
        spans.push("model", "a\0b", "module", "forward")
    assert e.value.status == Status.CT_ERR_INVALID_ARGUMENT
    assert "candle_trace: Spans.push: name contains a NUL character ('a\\x00b')" in str(e.value)


def _cases_of_every_path():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    base[1, 1] = float("nan")
    return [
        ("plain", torch.tensor([1.0, -2.0, 3.0, -4.0])),
        ("matrix", torch.from_numpy(_cases()["non-finite in some blocks"]).reshape(50, 100)),
        ("empty", torch.zeros(0, 3)),
        ("transposed", base.t()),
        ("float64", base.double() * 1e150),
        ("int64", torch.tensor([3, -7, 2])),
        ("scalar", torch.tensor(2.5)),
        ("parameter", torch.nn.Parameter(base.clone())),  # a subclass: Python's path
    ]


@needs_native
def test_statistics_kept_in_cpp_are_the_python_paths_records_in_the_same_order(tmp_path):
    """StatsRecorder with the observer's StatsBuffer (float32 reduced in C++, the rest
    by Python and copied in) writes exactly the records of the Python-only recorder."""
    cases = _cases_of_every_path()
    out = {}
    for which, native in (("python", None), ("cpp", _native())):
        folder = tmp_path / which
        folder.mkdir()
        s = Session(str(folder / "stats.jsonl"), "test::stats", "infer", 1, "cpu")
        out[which] = _recorded(s, folder, cases, native=native)
    py, cpp = out["python"], out["cpp"]
    strip = ("span_id", "ts_ns")
    assert [g["label"] for g in cpp] == [k for k, _ in cases]
    assert [{k: v for k, v in g.items() if k not in strip} for g in cpp] == \
        [{k: v for k, v in g.items() if k not in strip} for g in py]


@needs_native
def test_the_buffer_reduces_only_what_the_librarys_float32_pass_takes(session):
    buf = _native().stats_buffer()
    taken = {name: buf.reduce(1, name.encode(), t) for name, t in _cases_of_every_path()}
    assert taken == {"plain": True, "matrix": True, "scalar": True, "empty": False,
                     "transposed": False, "float64": False, "int64": False, "parameter": False}
    assert buf.count() == 3
    buf.drop()
    assert buf.count() == 0
    with pytest.raises(TypeError):
        buf.reduce(1, "a str label", torch.ones(2))


@needs_native
def test_a_refused_record_kept_in_cpp_raises_the_librarys_message(session):
    rec = StatsRecorder(session, native=_native())
    rec.record(999, "orphan", torch.ones(2))
    assert rec.buffer.count() == 1
    with pytest.raises(CandleTraceError, match="span"):
        rec.flush()
    assert rec.buffer.count() == 0  # dropped with the refusal, as Python's path does


@needs_native
def test_drop_forgets_what_cpp_kept(session, tmp_path):
    rec = StatsRecorder(session, native=_native())
    with session.measure("m") as m:
        rec.record(m.id, "kept", torch.ones(3))
        rec.record(m.id, "kept too", torch.ones(3, dtype=torch.float64))
        rec.drop()
        rec.record(m.id, "written", torch.full((2,), -2.0))
        rec.flush()
    session.finish()
    got = [r for r in read_trace(tmp_path / "stats.jsonl") if r["kind"] == "tensor_stats"]
    assert [(g["label"], g["mean"]) for g in got] == [("written", -2.0)]
