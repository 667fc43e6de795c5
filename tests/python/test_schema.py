"""docs/trace-format.schema.json against real traces of the library.

Nothing is built here. The library comes from $CANDLE_TRACE_LIB (default
build/libcandle_trace.so) and the C demo from build/train_step (`make lib
build/train_step`). The demo is linked with RUNPATH $ORIGIN; it is run with
LD_LIBRARY_PATH set to the folder of $CANDLE_TRACE_LIB, which takes precedence.

Lines are read the way candle-graph reads them: duplicate keys, NaN and
Infinity are refused, and a number written with a fraction or an exponent is
kept as a Decimal, so that `3.0` in an integer field fails the schema's
"integer" (Python's json would hand jsonschema the float 3.0, which counts as
an integer in JSON Schema).

Outside CI (env CI unset) the module is skipped when jsonschema or the build
outputs are missing; in CI their absence is a failure.
"""

import ctypes
import decimal
import json
import os
import subprocess
from pathlib import Path

import pytest

IN_CI = bool(os.environ.get("CI"))

if IN_CI:
    import jsonschema
else:
    jsonschema = pytest.importorskip("jsonschema")

REPO = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO / "docs" / "trace-format.schema.json"
LIB = Path(os.environ.get("CANDLE_TRACE_LIB") or REPO / "build" / "libcandle_trace.so")
DEMO = REPO / "build" / "train_step"

# What the demo's trace is expected to contain; device_memory and
# device_interval are covered by the ctypes session below instead.
DEMO_KINDS = {"meta", "span_start", "span_end", "op", "tensor", "tensor_stats", "memory",
              "gradient", "edge", "terminal"}


def _missing(what):
    msg = f"{what}; build it with `make lib build/train_step`"
    if IN_CI:
        pytest.fail(msg)
    pytest.skip(msg)


# ---- reading lines strictly ---------------------------------------------------

def _no_duplicate_keys(pairs):
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def load_line(text):
    return json.loads(text, parse_float=decimal.Decimal, parse_constant=_no_constant,
                      object_pairs_hook=_no_duplicate_keys)


# ---- schema -------------------------------------------------------------------

@pytest.fixture(scope="module")
def schema():
    with open(SCHEMA_PATH, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def validator(schema):
    cls = getattr(jsonschema, "Draft202012Validator", None)
    if cls is None:
        pytest.fail(f"jsonschema {getattr(jsonschema, '__version__', '?')} has no draft 2020-12 "
                    "validator; version 4 or later is needed")
    cls.check_schema(schema)
    return cls(schema)


def _defs_by_kind(schema):
    """(kind, edge_kind or None) -> the $defs name of its subschema, read off the oneOf."""
    out = {}
    for branch in schema["oneOf"]:
        name = branch["$ref"].rsplit("/", 1)[1]
        props = schema["$defs"][name]["properties"]
        edge_kind = props.get("edge_kind", {}).get("const")
        out[(props["kind"]["const"], edge_kind)] = name
    return out


def _sub_validator(schema, name):
    """A validator for one kind's subschema alone, for errors that name the field."""
    sub = {"$schema": schema["$schema"], "$defs": schema["$defs"], "$ref": f"#/$defs/{name}"}
    return jsonschema.Draft202012Validator(sub)


def _explain(schema, obj):
    """The errors of obj against its own kind's subschema (or the top level)."""
    defs = _defs_by_kind(schema)
    name = defs.get((obj.get("kind"), obj.get("edge_kind"))) if isinstance(obj, dict) else None
    v = _sub_validator(schema, name) if name else jsonschema.Draft202012Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path)) or '<line>'}: {e.message}"
            for e in v.iter_errors(obj)]


def check_lines(schema, validator, lines, source):
    bad = []
    for n, text in enumerate(lines, 1):
        try:
            obj = load_line(text)
        except ValueError as e:
            bad.append(f"{source}:{n}: not strict JSON: {e}")
            continue
        if not validator.is_valid(obj):
            bad.append(f"{source}:{n}: {'; '.join(_explain(schema, obj)) or 'invalid'}\n    {text}")
    assert not bad, "lines that fail the schema:\n" + "\n".join(bad)


def test_schema_is_a_valid_draft_2020_12_schema(schema, validator):
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    kinds = {k for k, _ in _defs_by_kind(schema)}
    assert kinds == set(schema["properties"]["kind"]["enum"]), \
        "the kind enum and the oneOf branches must name the same kinds"


# ---- the demo's trace -----------------------------------------------------------

def _env_for_lib():
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(LIB.resolve().parent), env.get("LD_LIBRARY_PATH", "")) if p)
    return env


@pytest.fixture(scope="module")
def demo_lines(tmp_path_factory):
    if not LIB.is_file():
        _missing(f"library {LIB} not found")
    if not DEMO.is_file():
        _missing(f"demo {DEMO} not found")
    out = tmp_path_factory.mktemp("demo") / "demo.jsonl"
    proc = subprocess.run([str(DEMO), str(out)], env=_env_for_lib(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"{DEMO} failed ({proc.returncode}):\n{proc.stderr}"
    data = out.read_bytes()
    assert data.endswith(b"\n"), "the trace must end with a newline"
    text = data.decode("utf-8")
    lines = text[:-1].split("\n")
    assert all(line.strip() for line in lines), "writers write no blank lines"
    assert "\r" not in text
    return lines


def test_demo_trace_matches_schema(schema, validator, demo_lines):
    check_lines(schema, validator, demo_lines, "demo.jsonl")


def test_demo_kinds_are_covered(schema, demo_lines):
    covered = _defs_by_kind(schema)
    written = {(o["kind"], o.get("edge_kind")) for o in map(load_line, demo_lines)}
    uncovered = written - set(covered)
    assert not uncovered, f"kinds the demo writes that the schema has no subschema for: {uncovered}"
    assert {k for k, _ in written} >= DEMO_KINDS, \
        f"the demo no longer writes {DEMO_KINDS - {k for k, _ in written}}"
    assert {e for k, e in written if k == "edge"} == {"call", "data"}


def test_demo_framing_and_our_meta_fields(demo_lines):
    objs = [load_line(line) for line in demo_lines]
    assert objs[0]["kind"] == "meta" and objs[-1]["kind"] == "terminal"
    assert sum(o["kind"] == "meta" for o in objs) == 1
    assert sum(o["kind"] == "terminal" for o in objs) == 1
    meta = objs[0]
    # Optional in the schema (other writers lack them); candle-trace always writes them.
    for field in ("producer", "clock", "process"):
        assert field in meta, f"meta lacks our {field!r}"
    assert meta["producer"]["name"] == "candle-trace"
    # Defaulted fields are always written, never null.
    assert meta["capture_contract"]["required_semantic_labels"] == \
        ["mlp/forward", "mlp/backward", "sgd/step"]
    assert isinstance(meta["tags"], dict)
    root = objs[1]
    assert root["kind"] == "span_start" and root["id"] == "s1" and "parent_id" not in root
    assert sum(o.get("measured") is True for o in objs if o["kind"] == "span_start") == 1


# ---- device records and a failed capture, through the C ABI ------------------------

class CtDeviceMemory(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("timestamp_ns", ctypes.c_uint64), ("device", ctypes.c_char_p),
                ("used_bytes", ctypes.c_uint64), ("free_bytes", ctypes.c_uint64),
                ("reserved_bytes", ctypes.c_uint64), ("capacity_bytes", ctypes.c_uint64)]


class CtDeviceInterval(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("device", ctypes.c_char_p), ("stream_id", ctypes.c_char_p),
                ("clock_id", ctypes.c_char_p), ("backend", ctypes.c_char_p),
                ("name", ctypes.c_char_p), ("start_ns", ctypes.c_uint64),
                ("duration_ns", ctypes.c_uint64), ("correlation_id", ctypes.c_uint64)]


CT_HAS_USED_BYTES, CT_HAS_CAPACITY_BYTES, CT_HAS_CORRELATION_ID = 1 << 0, 1 << 3, 1 << 0
CT_SPAN_FUNCTION, CT_SPAN_OP, CT_STEP_NONE = 0, 1, 0


@pytest.fixture(scope="module")
def lib():
    if not LIB.is_file():
        _missing(f"library {LIB} not found")
    so = ctypes.CDLL(str(LIB))
    u64, p_u64, s = ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64), ctypes.c_char_p
    so.ct_open.argtypes = [s, s, p_u64]
    so.ct_span_begin.argtypes = [u64, s, ctypes.c_int, ctypes.c_int, p_u64]
    so.ct_measurement_begin.argtypes = [u64, s, p_u64]
    so.ct_span_end.argtypes = [u64, u64]
    so.ct_now_ns.argtypes = [u64]
    so.ct_now_ns.restype = u64
    so.ct_record_device_memory.argtypes = [u64, ctypes.POINTER(CtDeviceMemory)]
    so.ct_record_device_interval.argtypes = [u64, u64, ctypes.POINTER(CtDeviceInterval)]
    so.ct_record_completed_span.argtypes = [u64, s, ctypes.c_int, u64, u64, p_u64]
    so.ct_finish_failed.argtypes = [u64, s]
    so.ct_last_error.restype = s
    return so


def test_device_records_and_failed_terminal_match_schema(schema, validator, lib, tmp_path):
    def ok(rc):
        assert rc == 0, f"status {rc}: {lib.ct_last_error().decode()}"

    path = tmp_path / "device.jsonl"
    run = {"entrypoint": "schema::device", "phase": "infer", "capture_step": 1,
           "device": "cuda:0", "capture_contract": {"measurement_scope": "profiled_work",
                                                    "physical_memory": "partial",
                                                    "device_timing": "partial"}}
    sess, region, launch, done = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64(), \
        ctypes.c_uint64()
    ok(lib.ct_open(str(path).encode(), json.dumps(run).encode(), ctypes.byref(sess)))
    s = sess.value
    ok(lib.ct_measurement_begin(s, b"schema/measured", ctypes.byref(region)))
    ok(lib.ct_span_begin(s, b"schema/launch", CT_SPAN_OP, CT_STEP_NONE, ctypes.byref(launch)))
    sample = CtDeviceMemory(size=ctypes.sizeof(CtDeviceMemory),
                            flags=CT_HAS_USED_BYTES | CT_HAS_CAPACITY_BYTES, device=b"cuda:0",
                            used_bytes=1 << 20, capacity_bytes=80 << 30)
    ok(lib.ct_record_device_memory(s, ctypes.byref(sample)))
    interval = CtDeviceInterval(size=ctypes.sizeof(CtDeviceInterval),
                                flags=CT_HAS_CORRELATION_ID, device=b"cuda:0", stream_id=b"7",
                                backend=b"cuda", name=b"gemm_kernel",
                                start_ns=lib.ct_now_ns(s), duration_ns=1500, correlation_id=42)
    ok(lib.ct_record_device_interval(s, launch.value, ctypes.byref(interval)))
    ok(lib.ct_span_end(s, launch.value))
    ok(lib.ct_span_end(s, region.value))
    now = lib.ct_now_ns(s)
    ok(lib.ct_record_completed_span(s, b"schema/host-work", CT_SPAN_FUNCTION, now - 100, 50,
                                    ctypes.byref(done)))
    ok(lib.ct_finish_failed(s, b"schema test: stopped on purpose"))

    lines = path.read_text(encoding="utf-8").splitlines()
    check_lines(schema, validator, lines, path.name)
    by_kind = {}
    for o in map(load_line, lines):
        by_kind.setdefault(o["kind"], []).append(o)
    (dm,) = by_kind["device_memory"]
    assert dm["used_bytes"] == 1 << 20 and "free_bytes" not in dm
    (di,) = by_kind["device_interval"]
    assert di["clock_id"] == "host-monotonic"
    assert di["name"] == "gemm_kernel" and di["correlation_id"] == 42
    (term,) = by_kind["terminal"]
    assert term["outcome"] == "failed" and term["reason"].startswith("schema test")


# ---- negative cases ----------------------------------------------------------------

def _pick(lines, pred):
    for text in lines:
        obj = load_line(text)
        if pred(obj):
            return obj
    pytest.fail("the demo trace has no line to build this case from")


NEGATIVE = [
    # (case, which demo line, field, bad value)
    ("span_start with measured null",
     lambda o: o["kind"] == "span_start" and o.get("measured") is True, "measured", None),
    ("u64 written as 1.5",
     lambda o: o["kind"] == "op", "duration_ns", decimal.Decimal("1.5")),
    ("u64 written as 3.0",
     lambda o: o["kind"] == "op", "input_dense_bytes", decimal.Decimal("3.0")),
    ("negative u64",
     lambda o: o["kind"] == "memory", "bytes", -1),
    ("gradient with state ok",
     lambda o: o["kind"] == "gradient", "state", "ok"),
    ("gradient present without a norm",
     lambda o: o["kind"] == "gradient" and o["state"] == "present", "norm", "<delete>"),
    ("defaulted tags null",
     lambda o: o["kind"] == "meta", "tags", None),
    ("complete terminal with a reason",
     lambda o: o["kind"] == "terminal", "reason", "nothing failed"),
]


@pytest.mark.parametrize("case,pred,field,bad", NEGATIVE, ids=[c[0] for c in NEGATIVE])
def test_bad_field_is_rejected(schema, validator, demo_lines, case, pred, field, bad):
    obj = _pick(demo_lines, pred)
    assert validator.is_valid(obj), f"{case}: the untouched line must be valid"
    if bad == "<delete>":
        del obj[field]
    else:
        obj[field] = bad
    assert not validator.is_valid(obj), f"{case}: accepted {obj}"
    # The kind's own subschema names the field at fault.
    paths = {tuple(e.absolute_path) for e in
             _sub_validator(schema, _defs_by_kind(schema)[(obj["kind"], obj.get("edge_kind"))])
             .iter_errors(obj)}
    assert (field,) in paths or () in paths, f"{case}: errors at {paths}, not at {field!r}"


def test_unknown_kind_is_rejected(validator, demo_lines):
    obj = _pick(demo_lines, lambda o: o["kind"] == "tensor")
    obj["kind"] = "tensor_snapshot"
    assert not validator.is_valid(obj)
    assert any(list(e.absolute_path) == ["kind"] for e in validator.iter_errors(obj))


def test_unknown_fields_are_allowed(validator, demo_lines):
    for text in demo_lines:
        obj = load_line(text)
        obj["x_extension"] = {"anything": [1, "two"]}
        assert validator.is_valid(obj), text


@pytest.mark.parametrize("text", [
    '{"kind":"span_end","id":"s2","duration_ns":5,"duration_ns":6}',
    '{"kind":"tensor_stats","span_id":"s1","label":"l","shape":[],"dtype":"f64",'
    '"elements":1,"non_finite":0,"rms":NaN,"abs_max":0,"mean":0}',
], ids=["duplicate key", "NaN"])
def test_strict_reading_refuses_what_candle_graph_refuses(text):
    with pytest.raises(ValueError):
        load_line(text)
