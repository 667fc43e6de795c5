"""Misuse of the core Session API (issue 12): the binding must never crash the
interpreter, read foreign memory, leak spans or sessions, or fail with an error that is
not a CandleTraceError naming the function and the argument.

Calls that could crash (a pointer to too little memory) run in a child process, so a
crash fails the test instead of killing pytest. Asynchronous exceptions are injected
deterministically by a tracer, at the points where CPython runs signal handlers.
"""

from __future__ import annotations

import array
import contextlib
import dis
import gc
import itertools
import json
import math
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO, read_trace

import candle_trace as ct
from candle_trace import CandleTraceError, CandleTraceTypeError, CandleTraceValueError, Status
from candle_trace.session import DROPPED_REASON, EMPTY_REASON

PACKAGE = str(Path(ct.__file__).resolve().parent)
MISUSE = "candle_trace: "


def open_session(tmp_path, name="t.jsonl", **kw):
    kw.setdefault("capture_step", 1)
    kw.setdefault("measured_root", True)
    return ct.Session(tmp_path / name, "test::misuse", **kw)


def run_child(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Runs ``code`` under this Python with the binding importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "bindings" / "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                              else []))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def terminal(path) -> dict:
    return read_trace(path)[-1]


def assert_refused(excinfo, kind: type, message: str) -> None:
    """The exception is a CandleTraceError of the subclass ``kind`` with ``message``."""
    e = excinfo.value
    assert isinstance(e, CandleTraceError) and isinstance(e, kind), repr(e)
    assert e.status is Status.CT_ERR_INVALID_ARGUMENT
    assert e.message == message


def test_the_new_exceptions_are_candle_trace_errors_and_builtin_ones():
    assert issubclass(CandleTraceTypeError, CandleTraceError)
    assert issubclass(CandleTraceTypeError, TypeError)
    assert issubclass(CandleTraceValueError, CandleTraceError)
    assert issubclass(CandleTraceValueError, ValueError)
    e = CandleTraceValueError(Status.CT_ERR_INVALID_ARGUMENT, "m")
    assert str(e) == "m [CT_ERR_INVALID_ARGUMENT]" and e.message == "m"


# -- 1. data against the shape, whatever its type (in a child: a crash fails the test) ------

F32 = "candle_trace: Session.record_tensor_stats_f32: "

DATA_CASES = [
    # (id, data expression, shape, exception class, message)
    ("list-short-huge-shape", "[1.0]", (50_000_000,), "CandleTraceValueError",
     F32 + "data holds 1 elements, but shape [50000000] has 50000000"),
    ("list-short", "[1.0]", (4,), "CandleTraceValueError",
     F32 + "data holds 1 elements, but shape [4] has 4"),
    ("list-long", "[1.0] * 5", (2, 2), "CandleTraceValueError",
     F32 + "data holds 5 elements, but shape [2, 2] has 4"),
    ("tuple-short", "(1.0, 2.0)", (3,), "CandleTraceValueError",
     F32 + "data holds 2 elements, but shape [3] has 3"),
    ("array-f-short", "array.array('f', [1, 2])", (1 << 20,), "CandleTraceValueError",
     F32 + "data holds 2 float32 elements, but shape [1048576] has 1048576"),
    ("array-d", "array.array('d', [1, 2])", (4,), "CandleTraceTypeError",
     F32 + "data must be float32 (buffer format 'f') or raw bytes, not a buffer of format "
           "'d'; convert it first (numpy: .astype('float32'))"),
    ("memoryview-strided", "memoryview(array.array('f', range(6)))[::2]", (6,),
     "CandleTraceValueError", F32 + "data holds 3 float32 elements, but shape [6] has 6"),
    ("buffer-2d", "memoryview(array.array('f', range(6))).cast('B').cast('f', (2, 3))",
     (3, 3), "CandleTraceValueError", F32 + "data holds 6 float32 elements, but shape "
                                            "[3, 3] has 9"),
    ("bytes-short", "bytes(8)", (3,), "CandleTraceValueError",
     F32 + "data holds 2 float32 elements, but shape [3] has 3"),
    ("bytes-ragged", "bytes(7)", (2,), "CandleTraceValueError",
     F32 + "data has 7 bytes, not a whole number of float32 (4 bytes each)"),
    ("bytearray-short", "bytearray(4)", (1 << 30,), "CandleTraceValueError",
     F32 + "data holds 1 float32 elements, but shape [1073741824] has 1073741824"),
    ("generator-short", "(x for x in [1.0])", (2,), "CandleTraceValueError",
     F32 + "data holds 1 elements, but shape [2] has 2"),
    ("iterator-endless", "itertools.count()", (3,), "CandleTraceValueError",
     F32 + "data holds more than the 3 elements of shape [3]"),
    ("str", "'abcd'", (4,), "CandleTraceTypeError",
     F32 + "data must be a float32 buffer or a sequence of real numbers, not str 'abcd'"),
    ("none", "None", (1,), "CandleTraceTypeError",
     F32 + "data must be a float32 buffer or a sequence of real numbers, not None"),
    ("element-str", "['x', 1.0]", (2,), "CandleTraceTypeError",
     F32 + "data[0] must be a real number, not str 'x'"),
    ("element-nested", "[[1.0], [2.0]]", (2,), "CandleTraceTypeError",
     F32 + "data[0] must be a real number, not list [1.0]"),
    ("scalar-empty", "[]", (), "CandleTraceValueError",
     F32 + "data holds 0 elements, but shape [] has 1"),
]

DATA_CHILD = """
    import array, itertools, json, sys
    import candle_trace as ct
    s = ct.Session(sys.argv[1], "test::misuse", capture_step=1, measured_root=True)
    try:
        s.record_tensor_stats_f32(1, "short", eval(sys.argv[2]), json.loads(sys.argv[3]))
        print(json.dumps({"ok": True}))
    except ct.CandleTraceError as e:
        print(json.dumps({"type": type(e).__name__, "message": e.message}))
    s.finish()
"""


@pytest.mark.parametrize("data,shape,kind,message",
                         [c[1:] for c in DATA_CASES], ids=[c[0] for c in DATA_CASES])
def test_f32_data_must_hold_the_shapes_elements(tmp_path, data, shape, kind, message):
    r = run_child(DATA_CHILD, str(tmp_path / "t.jsonl"), data, json.dumps(list(shape)))
    assert r.returncode == 0, f"the child died ({r.returncode}):\n{r.stderr[-3000:]}"
    assert json.loads(r.stdout.splitlines()[-1]) == {"type": kind, "message": message}
    stats = [line for line in read_trace(tmp_path / "t.jsonl") if line["kind"] == "tensor_stats"]
    assert stats == []  # refused before anything reached the library
    assert terminal(tmp_path / "t.jsonl")["outcome"] == "complete"


@pytest.mark.parametrize("data,shape,values", [
    (array.array("f", [1, -3, 2, 0]), (2, 2), [1, -3, 2, 0]),
    (memoryview(array.array("f", [1, 9, -3, 9])).cast("B").cast("f")[::2], (2,), [1, -3]),
    (memoryview(array.array("f", range(6))).cast("B").cast("f", (2, 3)), (6,), range(6)),
    (struct.pack("3f", 1.5, -2.0, 4.0), (3,), [1.5, -2.0, 4.0]),
    (bytearray(struct.pack("1f", 7.0)), (), [7.0]),
    ((x for x in (1, 2, 3)), (3, 1), [1, 2, 3]),
    ([], (0, 5), []),
], ids=["array-f", "strided", "2d-buffer", "bytes", "bytearray-scalar", "generator",
        "empty"])
def test_f32_data_of_every_kind_is_reduced_from_its_own_elements(tmp_path, data, shape,
                                                                  values):
    s = open_session(tmp_path)
    s.record_tensor_stats_f32(1, "x", data, shape)
    s.finish()
    (st,) = [line for line in read_trace(tmp_path / "t.jsonl") if line["kind"] == "tensor_stats"]
    values = list(values)
    assert st["elements"] == len(values) and st["shape"] == list(shape)
    if values:
        assert st["mean"] == pytest.approx(sum(values) / len(values))
        assert st["abs_max"] == pytest.approx(max(abs(v) for v in values))


# -- 7. shapes -----------------------------------------------------------------------------

SHAPE_CALLS = {
    "record_op": lambda s, shape: s.record_op(1, "op", dtype="f32", device="cpu", shape=shape),
    "record_tensor": lambda s, shape: s.record_tensor(1, "t", dtype="f32", device="cpu",
                                                      shape=shape),
    "record_tensor_stats": lambda s, shape: s.record_tensor_stats(
        1, "t", dtype="f32", shape=shape, non_finite=0, rms=0, abs_max=0, mean=0),
    "record_tensor_stats_f32": lambda s, shape: s.record_tensor_stats_f32(1, "t", [], shape),
    "record_memory": lambda s, shape: s.record_memory(
        1, "alloc", storage_id="st", tensor_id="t", device="cpu", dtype="f32", bytes=4,
        shape=shape),
}

SHAPE_CASES = [
    ((2**63,), CandleTraceValueError, "shape[0] is 9223372036854775808, outside 0..2**63 - 1"),
    ((3, -1), CandleTraceValueError, "shape[1] is -1, outside 0..2**63 - 1"),
    ((2**40, 2**40), CandleTraceValueError,
     "shape [1099511627776, 1099511627776] has 1208925819614629174706176 elements, more "
     "than a uint64 counts"),
    ((2.0,), CandleTraceTypeError, "shape[0] must be an integer, not float 2.0"),
    ((True,), CandleTraceTypeError, "shape[0] must be an integer, not bool True"),
    ((None,), CandleTraceTypeError, "shape[0] must be an integer, not None"),
    ("23", CandleTraceTypeError, "shape must be a sequence of non-negative integers, not str '23'"),
    (5, CandleTraceTypeError, "shape must be a sequence of non-negative integers, not int 5"),
]


@pytest.mark.parametrize("call", SHAPE_CALLS)
@pytest.mark.parametrize("shape,kind,message", SHAPE_CASES,
                         ids=["2**63", "negative", "overflow", "float", "bool", "none", "str",
                              "int"])
def test_shapes_are_checked_in_python(tmp_path, call, shape, kind, message):
    s = open_session(tmp_path)
    with pytest.raises(kind) as e:
        SHAPE_CALLS[call](s, shape)
    assert_refused(e, kind, f"{MISUSE}Session.{call}: {message}")
    s.finish()


def test_large_but_valid_shapes_reach_the_library(tmp_path):
    s = open_session(tmp_path)
    s.record_tensor(1, "t", dtype="f32", device="cpu", shape=(0, 2**62, 2**62))  # 0 elements
    s.record_tensor_stats(1, "st", dtype="f32", shape=(2**63 - 1, 2), non_finite=0, rms=0,
                          abs_max=0, mean=0)
    with pytest.raises(CandleTraceError) as e:  # the library's own limit, its message
        s.record_tensor(1, "t2", dtype="f32", device="cpu", shape=[1] * 65)
    assert type(e.value) is CandleTraceError and "rank 65 is larger than 64" in e.value.message
    s.finish()


# -- 5. a str where a sequence of ids is expected ------------------------------------------

@pytest.mark.parametrize("inputs,kind,message", [
    ("abc", CandleTraceTypeError,
     "inputs must be a sequence of str (one id is a list of one: [id]), not str 'abc'"),
    (b"abc", CandleTraceTypeError,
     "inputs must be a sequence of str (one id is a list of one: [id]), not bytes b'abc'"),
    (bytearray(b"ab"), CandleTraceTypeError,
     "inputs must be a sequence of str (one id is a list of one: [id]), not bytearray "
     "bytearray(b'ab')"),
    (5, CandleTraceTypeError,
     "inputs must be a sequence of str (one id is a list of one: [id]), not int 5"),
    (["x", 2], CandleTraceTypeError, "inputs[1] must be a str, not int 2"),
    (["x", None], CandleTraceTypeError, "inputs[1] must be a str, not None"),
    (["x\0y"], CandleTraceValueError, "inputs[0] contains a NUL character ('x\\x00y')"),
], ids=["str", "bytes", "bytearray", "int", "int-element", "none-element", "nul"])
def test_op_inputs_must_be_a_sequence_of_ids(tmp_path, inputs, kind, message):
    s = open_session(tmp_path)
    with pytest.raises(kind) as e:
        s.record_op(1, "op", dtype="f32", device="cpu", inputs=inputs)
    assert_refused(e, kind, f"{MISUSE}Session.record_op: {message}")
    s.record_op(1, "op", dtype="f32", device="cpu", inputs=("x", b"y"))  # tuples, bytes ids
    s.finish()
    (op,) = [line for line in read_trace(tmp_path / "t.jsonl") if line["kind"] == "op"]
    assert op["inputs"] == ["x", "y"]


# -- 6. wrong types, bad values: CandleTraceError subclasses naming function and argument --

BAD_CALLS = [
    ("span-name", lambda s: s.span(5), CandleTraceTypeError,
     "Session.span: name must be a str, not int 5"),
    ("span-name-list", lambda s: s.span(["x"]), CandleTraceTypeError,
     "Session.span: name must be a str, not list ['x']"),
    ("span-kind-type", lambda s: s.span("x", kind=[1]), CandleTraceTypeError,
     "Session.span: kind must be a span kind name or number, not list [1]"),
    ("span-kind-value", lambda s: s.span("x", kind=7), CandleTraceValueError,
     "Session.span: kind 7 is not a span kind (one of: 'function', 'op', 'module')"),
    ("span-kind-huge", lambda s: s.span("x", kind=2**70), CandleTraceValueError,
     "Session.span: kind 1180591620717411303424 is not a span kind (one of: 'function', 'op', "
     "'module')"),
    ("span-step", lambda s: s.span("x", step="sideways"), CandleTraceValueError,
     "Session.span: step 'sideways' is not a step (one of: 'none', 'forward', 'backward', "
     "'optimizer')"),
    ("measure-name", lambda s: s.measure(None), CandleTraceTypeError,
     "Session.measure: name must be a str, not None"),
    ("begin-span-nul", lambda s: s.begin_span("a\0b"), CandleTraceValueError,
     "Session.begin_span: name contains a NUL character ('a\\x00b')"),
    ("begin-span-surrogate", lambda s: s.begin_span("\udc80"), CandleTraceValueError,
     "Session.begin_span: name is not valid UTF-8: 'utf-8' codec can't encode character '\\udc80' "
     "in position 0: surrogates not allowed"),
    ("end-span", lambda s: s.end_span("s1"), CandleTraceTypeError,
     "Session.end_span: span must be a Span or a span id (an int), not str 's1'"),
    ("end-span-negative", lambda s: s.end_span(-1), CandleTraceValueError,
     "Session.end_span: span is -1, outside 0..2**64 - 1"),
    ("completed-span-start", lambda s: s.record_completed_span("x", "function", -1, 5),
     CandleTraceValueError, "Session.record_completed_span: start_ns is -1, outside 0..2**64 - 1"),
    ("completed-span-duration",
     lambda s: s.record_completed_span("x", "function", 0, 2**64), CandleTraceValueError,
     "Session.record_completed_span: duration_ns is 18446744073709551616, outside 0..2**64 - 1"),
    ("op-span", lambda s: s.record_op(None, "op", dtype="f32", device="cpu"),
     CandleTraceTypeError,
     "Session.record_op: span must be a Span or a span id (an int), not None"),
    ("op-span-bool", lambda s: s.record_op(True, "op", dtype="f32", device="cpu"),
     CandleTraceTypeError, "Session.record_op: span must be a Span or a span id (an int), not bool "
                           "True"),
    ("op-dtype", lambda s: s.record_op(1, "op", dtype=5, device="cpu"), CandleTraceTypeError,
     "Session.record_op: dtype must be a str, not int 5"),
    ("op-output", lambda s: s.record_op(1, "op", dtype="f32", device="cpu", output=3),
     CandleTraceTypeError, "Session.record_op: output must be a str or None, not int 3"),
    ("op-duration-negative",
     lambda s: s.record_op(1, "op", dtype="f32", device="cpu", duration_ns=-1),
     CandleTraceValueError, "Session.record_op: duration_ns is -1, outside 0..2**64 - 1"),
    ("op-duration-float",
     lambda s: s.record_op(1, "op", dtype="f32", device="cpu", duration_ns=1.5),
     CandleTraceTypeError, "Session.record_op: duration_ns must be an integer, not float 1.5"),
    ("op-dense-bytes",
     lambda s: s.record_op(1, "op", dtype="f32", device="cpu", output_dense_bytes="8"),
     CandleTraceTypeError, "Session.record_op: output_dense_bytes must be an integer, not str '8'"),
    ("tensor-requires-grad",
     lambda s: s.record_tensor(1, "t", dtype="f32", device="cpu", requires_grad="yes"),
     CandleTraceTypeError, "Session.record_tensor: requires_grad must be a bool, not str 'yes'"),
    ("tensor-category",
     lambda s: s.record_tensor(1, "t", dtype="f32", device="cpu", category="weights"),
     CandleTraceValueError, "Session.record_tensor: category 'weights' is not a category (one of: "
                            "'other', 'parameter', 'activation', 'gradient', 'optimizer')"),
    ("stats-rms", lambda s: s.record_tensor_stats(1, "t", dtype="f32", shape=(), non_finite=0,
                                                  rms="0", abs_max=0, mean=0),
     CandleTraceTypeError, "Session.record_tensor_stats: rms must be a real number, not str '0'"),
    ("stats-non-finite",
     lambda s: s.record_tensor_stats(1, "t", dtype="f32", shape=(), non_finite=-1, rms=0,
                                     abs_max=0, mean=0),
     CandleTraceValueError, "Session.record_tensor_stats: non_finite is -1, outside 0..2**64 - 1"),
    ("stats-elements",
     lambda s: s.record_tensor_stats(1, "t", dtype="f32", shape=(), non_finite=0, rms=0,
                                     abs_max=0, mean=0, elements=1.0),
     CandleTraceTypeError,
     "Session.record_tensor_stats: elements must be an integer, not float 1.0"),
    ("stats-mean-huge",
     lambda s: s.record_tensor_stats(1, "t", dtype="f32", shape=(), non_finite=0, rms=0,
                                     abs_max=0, mean=10**400),
     CandleTraceValueError, "Session.record_tensor_stats: mean is too large for a double "
                            "(100000000000000000...0000000000000000000)"),
    ("f32-label", lambda s: s.record_tensor_stats_f32(1, None, [1.0], (1,)),
     CandleTraceTypeError, "Session.record_tensor_stats_f32: label must be a str, not None"),
    ("scalar-value", lambda s: s.record_scalar(1, "loss", "1.5"), CandleTraceTypeError,
     "Session.record_scalar: value must be a real number, not str '1.5'"),
    ("scalar-label", lambda s: s.record_scalar(1, 2, 1.0), CandleTraceTypeError,
     "Session.record_scalar: label must be a str, not int 2"),
    ("memory-action", lambda s: s.record_memory(1, "allocate", storage_id="st", tensor_id="t",
                                                device="cpu", dtype="f32", bytes=4),
     CandleTraceValueError, "Session.record_memory: action 'allocate' is not a memory action (one "
                            "of: 'alloc', 'free')"),
    ("memory-bytes", lambda s: s.record_memory(1, "alloc", storage_id="st", tensor_id="t",
                                               device="cpu", dtype="f32", bytes=-4),
     CandleTraceValueError, "Session.record_memory: bytes is -4, outside 0..2**64 - 1"),
    ("device-memory-device", lambda s: s.record_device_memory(5, used_bytes=1),
     CandleTraceTypeError, "Session.record_device_memory: device must be a str, not int 5"),
    ("device-memory-used", lambda s: s.record_device_memory("cpu", used_bytes="1"),
     CandleTraceTypeError,
     "Session.record_device_memory: used_bytes must be an integer, not str '1'"),
    ("interval-stream", lambda s: s.record_device_interval(
        1, device="cpu", stream_id=0, backend="host", start_ns=0, duration_ns=1),
     CandleTraceTypeError, "Session.record_device_interval: stream_id must be a str, not int 0"),
    ("interval-correlation", lambda s: s.record_device_interval(
        1, device="cpu", stream_id="0", backend="host", start_ns=0, duration_ns=1,
        correlation_id=-2),
     CandleTraceValueError, "Session.record_device_interval: correlation_id is -2, outside "
                            "0..2**64 - 1"),
    ("call-edge", lambda s: s.record_call_edge("s1", 2), CandleTraceTypeError,
     "Session.record_call_edge: from_span must be a Span or a span id (an int), not str 's1'"),
    ("data-edge", lambda s: s.record_data_edge(["x"], "y"), CandleTraceTypeError,
     "Session.record_data_edge: from_tensor must be a str, not list ['x']"),
    ("gradient-norm", lambda s: s.record_gradient("m", "w", "present", "1.0"),
     CandleTraceTypeError, "Session.record_gradient: norm must be a real number or None, not str "
                           "'1.0'"),
    ("gradient-state", lambda s: s.record_gradient("m", "w", 1.5, 1.0), CandleTraceTypeError,
     "Session.record_gradient: state must be a gradient state name or number, not float 1.5"),
    ("aggregate-enable", lambda s: s.aggregate_enable("yes"), CandleTraceTypeError,
     "Session.aggregate_enable: on must be a bool, not str 'yes'"),
    ("aggregate-trigger-update", lambda s: s.aggregate_trigger("37", "slow", 1.0, trace="t"),
     CandleTraceTypeError, "Session.aggregate_trigger: update must be an integer, not str '37'"),
    ("aggregate-trigger-name", lambda s: s.aggregate_trigger(37, None, 1.0, trace="t"),
     CandleTraceTypeError, "Session.aggregate_trigger: trigger must be a str, not None"),
    ("device-start-options", lambda s: s.device_start(["nvml"]), CandleTraceTypeError,
     "Session.device_start: options must be a mapping (a dict) or None, not list ['nvml']"),
    ("device-start-json", lambda s: s.device_start({"collect": {"nvml"}}),
     CandleTraceTypeError, "Session.device_start: options: Object of type set is not JSON "
                           "serializable"),
    ("decorator", lambda s: s.span("x")(5), CandleTraceTypeError,
     "Span: the decorated object must be callable, not int 5"),
]


@pytest.mark.parametrize("call,kind,message", [c[1:] for c in BAD_CALLS],
                         ids=[c[0] for c in BAD_CALLS])
def test_bad_arguments_raise_a_subclass_naming_function_and_argument(tmp_path, call, kind,
                                                                     message):
    s = open_session(tmp_path)
    with pytest.raises(kind) as e:
        call(s)
    assert_refused(e, kind, MISUSE + message)
    s.finish()  # nothing was left half done
    assert terminal(tmp_path / "t.jsonl")["outcome"] == "complete"


OPEN_CASES = [
    ("path", dict(path=5), CandleTraceTypeError,
     "Session: path must be a str or an os.PathLike, not int 5"),
    ("entrypoint", dict(entrypoint=5), CandleTraceTypeError,
     "Session: entrypoint must be a str, not int 5"),
    ("phase", dict(phase=None), CandleTraceTypeError, "Session: phase must be a str, not None"),
    ("capture-step", dict(capture_step="3"), CandleTraceTypeError,
     "Session: capture_step must be an integer, not str '3'"),
    ("capture-step-bool", dict(capture_step=True), CandleTraceTypeError,
     "Session: capture_step must be an integer, not bool True"),
    ("tags", dict(tags=["a"]), CandleTraceTypeError,
     "Session: tags must be a mapping (a dict) or None, not list ['a']"),
    ("measured-root", dict(measured_root="yes"), CandleTraceTypeError,
     "Session: measured_root must be a bool, not str 'yes'"),
    ("enabled", dict(enabled="no"), CandleTraceTypeError,
     "Session: enabled must be a bool, not str 'no'"),
    ("run-json-type", dict(run={"x": object}), CandleTraceTypeError,
     "Session: run JSON: Object of type type is not JSON serializable"),
    ("run-json-nan", dict(run={"warmup_steps": math.nan}), CandleTraceValueError,
     "Session: run JSON: Out of range float values are not JSON compliant"),
]


@pytest.mark.parametrize("kw,kind,message", [c[1:] for c in OPEN_CASES],
                         ids=[c[0] for c in OPEN_CASES])
def test_bad_session_arguments_raise_before_anything_is_opened(tmp_path, kw, kind, message):
    args = dict(path=tmp_path / "t.jsonl", entrypoint="test::misuse")
    args.update(kw)
    with pytest.raises(kind) as e:
        ct.Session(args.pop("path"), args.pop("entrypoint"), **args)
    assert_refused(e, kind, MISUSE + message)
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.parametrize("call,kind,message", [
    (lambda: ct.gradient_contract("abc"), CandleTraceTypeError,
     "gradient_contract: expected must be a sequence, not str 'abc'"),
    (lambda: ct.gradient_contract([("m", "w")]), CandleTraceTypeError,
     "gradient_contract: expected[0] must be a (root, key, family) tuple of str, not tuple "
     "('m', 'w')"),
    (lambda: ct.gradient_contract([("m", "w", 3)]), CandleTraceTypeError,
     "gradient_contract: expected[0][2] must be a str, not int 3"),
    (lambda: ct.gradient_contract([("m", "w", "f")], {"f": "active"}), CandleTraceTypeError,
     "gradient_contract: families['f'] must be an (expectation, min_present) pair, not str "
     "'active'"),
], ids=["str", "pair", "family-int", "families-spec"])
def test_gradient_contract_checks_its_arguments(call, kind, message):
    with pytest.raises(kind) as e:
        call()
    assert_refused(e, kind, MISUSE + message)


# -- 3. finish_failed always ends the session ------------------------------------------------

@pytest.mark.parametrize("reason,kind,written", [
    ("", None, EMPTY_REASON),
    ("  \t", None, EMPTY_REASON),
    ("\u3000", None, EMPTY_REASON),
    (5, CandleTraceTypeError, "finish_failed() was given int 5 as its reason"),
    (None, CandleTraceTypeError, "finish_failed() was given None as its reason"),
    ("bad\0reason", CandleTraceValueError, "bad\\0reason"),
    ("\udc80x", CandleTraceValueError, "\\udc80x"),
    (b"\xffx", CandleTraceValueError, "\\xffx"),
], ids=["empty", "blank", "unicode-blank", "int", "none", "nul", "surrogate", "bad-utf8"])
def test_finish_failed_inside_with_always_ends_the_session(tmp_path, reason, kind, written):
    path = tmp_path / "t.jsonl"
    with ct.Session(path, "test::misuse", measured_root=True) as s:
        with s.span("open"):
            if kind is None:
                s.finish_failed(reason)  # no exception: the library gets a reason
            else:
                with pytest.raises(kind) as e:
                    s.finish_failed(reason)
                assert e.value.message.startswith("candle_trace: Session.finish_failed: ")
                assert e.value.message.endswith("; the session was ended as failed anyway")
            assert s.finished
    assert terminal(path)["outcome"] == "failed" and terminal(path)["reason"] == written
    assert [line["kind"] for line in read_trace(path)].count("terminal") == 1
    with pytest.raises(CandleTraceError) as e2:  # the handle is gone, not half open
        s.finish()
    assert e2.value.status is Status.CT_ERR_INVALID_HANDLE


# -- 4. dropped sessions are finished, their slots freed -------------------------------------

def test_dropped_sessions_are_finished_and_free_their_slots(tmp_path):
    for i in range(300):  # more than the 255 sessions the library holds at once
        s = ct.Session(tmp_path / f"d{i}.jsonl", "test::misuse", measured_root=True)
        s.record_scalar(1, "i", i)
        del s
    for i in (0, 254, 299):
        term = terminal(tmp_path / f"d{i}.jsonl")
        assert term["outcome"] == "failed" and term["reason"] == DROPPED_REASON


def test_a_session_in_a_reference_cycle_is_finished_by_the_collector(tmp_path):
    s = open_session(tmp_path)
    s.me = s
    del s
    gc.collect()
    assert terminal(tmp_path / "t.jsonl")["reason"] == DROPPED_REASON


def test_a_finished_session_is_not_touched_when_dropped(tmp_path):
    s = open_session(tmp_path)
    s.finish()
    del s
    gc.collect()
    lines = read_trace(tmp_path / "t.jsonl")
    assert [line["kind"] for line in lines].count("terminal") == 1
    assert lines[-1]["outcome"] == "complete"


def test_a_session_left_open_at_interpreter_exit_is_finished(tmp_path):
    path = tmp_path / "t.jsonl"
    r = run_child("""
        import sys
        import candle_trace as ct
        s = ct.Session(sys.argv[1], "test::misuse", measured_root=True)
        sp = s.span("still-open").__enter__()
        print("exiting")
    """, str(path))
    assert r.returncode == 0 and r.stdout == "exiting\n", r.stderr
    term = terminal(path)
    assert term["outcome"] == "failed" and term["reason"] == DROPPED_REASON


# -- 2. asynchronous exceptions never leave a span open --------------------------------------

CALL_OPS = {"CALL", "CALL_FUNCTION", "CALL_FUNCTION_KW", "CALL_FUNCTION_EX", "CALL_METHOD",
            "CALL_KW", "JUMP_BACKWARD", "JUMP_ABSOLUTE"}


def _handlers(code) -> list:
    """(start, end, target) of the code's exception table (CPython 3.11+; [] before)."""
    entries = getattr(dis.Bytecode(code), "exception_entries", [])
    return [(e.start, e.end, e.target) for e in entries]


def _handler(table: list, offset: int):
    return next((t for start, end, t in table if start <= offset < end), None)


class Interrupter:
    """A sys.settrace tracer that raises KeyboardInterrupt at the ``k``-th point of the
    binding's code where CPython can run a signal handler: the start of a function, and
    the end of a call or a backward jump (where the interpreter checks for pending
    signals; between other instructions it does not). The exception raised at the end of
    a call belongs to the call's instruction; it is raised at the next instruction, which
    the same exception handler covers (a point where it does not cannot be emulated and
    is listed in ``unemulated``). Deterministic: the same ``k`` is the same point."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.points = 0
        self.fired_at = None
        self.unemulated: list = []
        self.prev: dict = {}
        self.code: dict = {}

    def _point(self, frame, what: str) -> None:
        if self.fired_at is None:
            if self.points == self.k:
                self.fired_at = f"{frame.f_code.co_name} {what}"
                raise KeyboardInterrupt(self.fired_at)
            self.points += 1

    def __call__(self, frame, event, arg):
        if not frame.f_code.co_filename.startswith(PACKAGE):
            return None
        frame.f_trace_lines = False
        frame.f_trace_opcodes = True
        self.prev[frame] = None
        self._point(frame, "start")
        return self._local

    def _local(self, frame, event, arg):
        if event == "opcode":
            code = frame.f_code
            if code not in self.code:
                self.code[code] = ({i.offset: i.opname for i in dis.get_instructions(code)},
                                   _handlers(code))
            ops, table = self.code[code]
            prev, self.prev[frame] = self.prev.get(frame), frame.f_lasti
            if prev is not None and ops.get(prev) in CALL_OPS:
                if _handler(table, prev) == _handler(table, frame.f_lasti):
                    self._point(frame, f"after offset {prev}")
                else:
                    self.unemulated.append(f"{code.co_name} after offset {prev}")
        elif event == "return":
            self.prev.pop(frame, None)
        return self._local

    def run(self, fn):
        sys.settrace(self)
        try:
            return fn()
        finally:
            sys.settrace(None)


def _with_span(s, k):
    with s.span(f"victim{k}"):
        return True


def _decorated(s, k):
    @s.span(f"victim{k}")
    def f():
        return True

    return f()


def _measured(s, k):
    with s.measure(f"victim{k}"):
        return True


def _begin_span(s, k):
    sid = s.begin_span(f"victim{k}")
    sys.settrace(None)  # end_span is the caller's cleanup, not under test
    s.end_span(sid)
    return True


@pytest.mark.parametrize("scenario", [_with_span, _decorated, _measured, _begin_span],
                         ids=["with-span", "decorator", "measure", "begin-span"])
def test_a_keyboard_interrupt_at_any_signal_point_never_leaks_a_span(tmp_path, scenario):
    measured = scenario is _measured
    s = None
    outcomes = {}
    for k in itertools.count():
        if s is None or measured:  # one measured region per session
            s = ct.Session(tmp_path / f"t{k}.jsonl", "test::misuse", measured_root=not measured)
        tracer = Interrupter(k)
        try:
            body_ran = tracer.run(lambda: scenario(s, k))
        except KeyboardInterrupt:
            body_ran = False
        if tracer.fired_at is None:
            break  # every point was interrupted once
        outcomes[k] = (tracer.fired_at, bool(body_ran))
        assert not tracer.unemulated, tracer.unemulated
        with s.span(f"probe{k}"):  # its parent is the root: nothing was left open
            pass
        if measured:
            s.finish_failed("probe")
    assert len(outcomes) > 5
    if not measured:
        s.finish()  # refused while any span is open
    spans, ended = {}, set()
    for trace in tmp_path.glob("t*.jsonl"):
        for line in read_trace(trace):
            if line["kind"] == "span_start":
                spans[(trace.name, line["id"])] = line
            elif line["kind"] == "span_end":
                ended.add((trace.name, line["id"]))
    names = {sp["name"]: (key, sp) for key, sp in spans.items()}
    for k, (where, body_ran) in outcomes.items():
        key, probe = names[f"probe{k}"]
        assert probe["parent_id"] == "s1", f"interrupted at {where}: a span stayed open"
        if f"victim{k}" in names:
            assert names[f"victim{k}"][0] in ended, f"interrupted at {where}: victim not ended"
    # The dangerous windows were hit: right after ct_span_begin (the span began, the body
    # never ran) and in the exit (the body ran, then the interrupt).
    began_not_run = [k for k, (_, ran) in outcomes.items() if f"victim{k}" in names and not ran]
    assert began_not_run, outcomes


def test_spans_work_through_exit_stack_and_explicit_exit_calls(tmp_path):
    s = open_session(tmp_path)
    with contextlib.ExitStack() as stack:  # calls type(cm).__exit__(cm, ...)
        outer = stack.enter_context(s.span("outer"))
        inner = s.span("inner").__enter__()
        assert inner.__exit__(None, None, None) is False
    with pytest.raises(KeyError):
        with contextlib.ExitStack() as stack:
            stack.enter_context(s.span("raises"))
            {}["k"]
    with pytest.raises(CandleTraceError) as e:  # a failed end is reported ...
        with s.span("a"):
            s.begin_span("left-open")
    assert e.value.status is Status.CT_ERR_SPAN_MISMATCH
    with pytest.raises(ZeroDivisionError):  # ... unless the block raised: that one wins
        with s.span("b"):
            1 / 0
    s.finish_failed("spans left open on purpose")
    spans = {line["name"]: line for line in read_trace(tmp_path / "t.jsonl")
             if line["kind"] == "span_start"}
    assert spans["inner"]["parent_id"] == f"s{outer.id}"


SIGINT_CHILD = """
    import os, signal, sys, threading, time
    import candle_trace as ct
    N = int(sys.argv[2])
    sys.setswitchinterval(1e-4)  # the sender thread gets the GIL often
    s = ct.Session(sys.argv[1], "test::misuse", measured_root=True)
    state = {"armed": False, "got": 0}

    def sender():
        for i in range(N):
            while not state["armed"]:
                time.sleep(0.0002)
            state["armed"] = False
            time.sleep((i % 5) * 0.0001)
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=sender, daemon=True).start()
    while state["got"] < N:
        try:
            state["armed"] = True  # inside the try: the interrupt lands in the loop below
            while True:
                with s.span("hot"):
                    pass
        except KeyboardInterrupt:
            state["got"] += 1
    s.finish()  # refused if any Ctrl-C left a span open
    print("finished", state["got"])
"""


def test_real_sigints_during_spans_leak_nothing(tmp_path):
    """The report's reproduction: Ctrl-C (SIGINT) hundreds of times during a span loop."""
    path = tmp_path / "t.jsonl"
    r = run_child(SIGINT_CHILD, str(path), "300", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["finished", "300"]
    lines = read_trace(path)
    starts = sum(1 for line in lines if line["kind"] == "span_start")
    ends = sum(1 for line in lines if line["kind"] == "span_end")
    assert starts == ends and lines[-1]["outcome"] == "complete"
