"""Device collectors through the C ABI: ct_device_start / ct_device_stop,
the drop-in's CANDLE_TRACE_DEVICE_COLLECT, and the library's loadability
with go-nvml linked in.

No GPU is needed: without a driver ct_device_start must answer
CT_ERR_UNAVAILABLE and the session go on; with the fake libnvidia-ml.so.1 of
internal/cuda/testdata/fakenvml (CANDLE_TRACE_NVML_LIB) the real go-nvml
path runs through the library's forwarding stubs and writes samples.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import lines, require_valid

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "internal" / "cuda" / "testdata" / "fakecupti"))
import fake_cupti as fake_cupti_helper  # noqa: E402 (the fake libcupti's driver, shared with the scripts)
LIB = Path(os.environ.get("CANDLE_TRACE_LIB", REPO / "build" / "libcandle_trace.so")).resolve()
FAKE_SRC = REPO / "internal" / "cuda" / "testdata" / "fakenvml" / "fake_nvml.c"
CT_ERR_INVALID_ARGUMENT, CT_ERR_STATE, CT_ERR_UNAVAILABLE = 1, 4, 7
GIB, MIB = 1 << 30, 1 << 20

pytestmark = pytest.mark.skipif(not LIB.exists(), reason=f"{LIB} is not built (make lib)")


def driver_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory) -> Path:
    cc = os.environ.get("CC", "cc")
    if not shutil.which(cc):
        pytest.skip("no C compiler for the fake NVML")
    out = tmp_path_factory.mktemp("fakenvml") / "libnvidia-ml.so.1"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-o", str(out), str(FAKE_SRC)], check=True)
    return out


PRELUDE = textwrap.dedent(
    """
    import ctypes, os, sys, time
    lib = ctypes.CDLL(os.environ["CANDLE_TRACE_LIB"])
    lib.ct_last_error.restype = ctypes.c_char_p
    lib.ct_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64)]
    lib.ct_device_start.argtypes = [ctypes.c_uint64, ctypes.c_char_p]
    lib.ct_device_stop.argtypes = [ctypes.c_uint64]
    lib.ct_finish.argtypes = [ctypes.c_uint64]
    lib.ct_span_begin.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                                  ctypes.POINTER(ctypes.c_uint64)]
    lib.ct_span_end.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    RUN = (b'{"entrypoint":"test_device","phase":"infer","capture_step":1,'
           b'"device":"cuda:0","measured_root":true}')
    s = ctypes.c_uint64(0)
    assert lib.ct_open(sys.argv[1].encode(), RUN, ctypes.byref(s)) == 0, lib.ct_last_error()

    def start(opts):
        rc = lib.ct_device_start(s, None if opts is None else opts.encode())
        print("start", rc, lib.ct_last_error().decode() if rc else "", flush=True)
        return rc

    def work():
        x = ctypes.c_uint64(0)
        assert lib.ct_span_begin(s, b"step", 0, 0, ctypes.byref(x)) == 0
        time.sleep(0.01)
        assert lib.ct_span_end(s, x) == 0
    """
)


def run(code: str, trace: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("CANDLE_TRACE_")}
    full["CANDLE_TRACE_LIB"] = str(LIB)
    full.update(env or {})
    r = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code), str(trace)],
                       env=full, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"rc={r.returncode} stdout={r.stdout!r} stderr={r.stderr!r}"
    return r


def test_no_nvml_symbol_is_undefined_or_exported():
    nm = shutil.which("nm")
    if not nm:
        pytest.skip("nm not installed")
    undefined = subprocess.run([nm, "-D", "--undefined-only", str(LIB)], capture_output=True, text=True, check=True).stdout
    assert [l for l in undefined.splitlines() if "nvml" in l] == []
    defined = subprocess.run([nm, "-D", "--defined-only", str(LIB)], capture_output=True, text=True, check=True).stdout
    # The stubs are hidden: a preloaded library must not interpose on the
    # process's own NVML (PyTorch, pynvml).
    assert [l for l in defined.splitlines() if l.split()[-1].startswith("nvml")] == []


@pytest.mark.skipif(driver_present(), reason="an NVIDIA driver is installed here")
def test_without_a_driver_device_start_is_unavailable_and_the_session_goes_on(tmp_path):
    trace = tmp_path / "nodriver.jsonl"
    r = run(
        """
        assert start(None) == 7
        assert start('{"collect":["nvml"],"interval_ms":10,"devices":[0]}') == 7
        work()
        print("stop", lib.ct_device_stop(s))
        print("finish", lib.ct_finish(s), flush=True)
        """,
        trace,
    )
    starts = [l for l in r.stdout.splitlines() if l.startswith("start")]
    assert len(starts) == 2
    for line in starts:
        assert line.startswith("start 7 ct_device_start: NVML is unavailable: libnvidia-ml.so.1 could not be loaded"), line
    assert "stop 0" in r.stdout and "finish 0" in r.stdout
    events = lines(trace)
    assert events[-1]["outcome"] == "complete"
    assert not any(e["kind"] == "device_memory" for e in events)
    require_valid(trace, tmp_path)


def test_options_are_strict_and_cupti_is_reported_missing(tmp_path, fake_nvml):
    r = run(
        """
        start('{"interval":10}')
        start('{"collect":["nvml"],"collect":["nvml"]}')
        start('{"interval_ms":0}')
        start('{"collect":["nvml","cupti"]}')
        start('{"collect":["nvml"],"devices":[5]}')
        print("finish", lib.ct_finish(s), flush=True)
        """,
        tmp_path / "opts.jsonl",
        env={"CANDLE_TRACE_NVML_LIB": str(fake_nvml), "CANDLE_TRACE_CUPTI_LIB": "/nonexistent/libcupti.so.12"},
    )
    got = [l for l in r.stdout.splitlines() if l.startswith("start")]
    # CUPTI's message goes on with the other places tried (the sonames, ...).
    got = [l.split(";")[0] if l.startswith("start 7 ct_device_start: CUPTI") else l for l in got]
    assert got == [
        'start 1 ct_device_start: options_json: unknown key "interval" (known: "collect", "interval_ms", "devices", "cupti_lib", "unspanned_launches")',
        'start 1 ct_device_start: options_json: duplicate key "collect"',
        'start 1 ct_device_start: options_json: "interval_ms" must be an integer from 1 to 60000, got 0',
        'start 7 ct_device_start: CUPTI is unavailable: no libcupti could be loaded (/nonexistent/libcupti.so.12: '
        'cannot open shared object file: No such file or directory',
        "start 1 ct_device_start: device 5 does not exist: 2 CUDA device(s) are visible (cuda:0 .. cuda:1)",
    ]
    assert "finish 0" in r.stdout


def test_fake_nvml_samples_land_in_the_trace(tmp_path, fake_nvml):
    trace = tmp_path / "fake.jsonl"
    r = run(
        """
        assert start('{"collect":["nvml"],"interval_ms":5,"devices":[1]}') == 0
        assert start('{"collect":["nvml"]}') == 4          # already running
        for _ in range(10):
            work()
        print("stop", lib.ct_device_stop(s), flush=True)
        print("stop again", lib.ct_device_stop(s), flush=True)
        assert start('{"interval_ms":1000}') == 0          # restart: both devices
        print("finish", lib.ct_finish(s), flush=True)      # stops them too
        """,
        trace,
        env={"CANDLE_TRACE_NVML_LIB": str(fake_nvml), "CUDA_VISIBLE_DEVICES": "0,1"},
    )
    assert "start 4 ct_device_start: device collectors already run on this session" in r.stdout
    assert "stop 0" in r.stdout and "stop again 0" in r.stdout and "finish 0" in r.stdout
    events = lines(trace)
    samples = [e for e in events if e["kind"] == "device_memory"]
    first = [e for e in samples if e["device"] == "cuda:1"]
    # 100 ms of work at 5 ms: about 20 samples; a loaded CI machine gets fewer.
    assert len(first) >= 5, len(first)
    for e in first:
        assert e["used_bytes"] == 2 * GIB
        assert e["reserved_bytes"] == 512 * MIB
        assert e["free_bytes"] == 80 * GIB - 512 * MIB - 2 * GIB
        assert e["capacity_bytes"] == 80 * GIB
        assert e["extra"]["gpu_utilization_pct"] == 41
        assert e["extra"]["memory_utilization_pct"] == 11
        assert e["extra"]["power_w"] == 150.001
        assert e["extra"]["nvml_query_ns"] > 0
    # The per-process query runs at most once a second per device.
    assert sum("process_used_bytes" in e["extra"] for e in first) <= 2
    assert first[0]["extra"]["process_used_bytes"] == 256 * MIB
    # The restart samples both devices at start and at finish (the loop's
    # first sample may lose the race with ct_finish).
    assert sum(e["device"] == "cuda:0" for e in samples) in (1, 2)
    ts = [e["timestamp_ns"] for e in samples]
    assert ts == sorted(ts)
    assert ts[-1] <= events[-1]["timestamp_ns"]
    assert events[-1]["outcome"] == "complete"
    require_valid(trace, tmp_path)


def test_dropin_starts_the_collectors_named_in_the_environment(tmp_path, fake_nvml):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANDLE_TRACE_")}
    env.update(LD_PRELOAD=str(LIB), CANDLE_TRACE_PATH=str(tmp_path / "run-%p.jsonl"),
               CANDLE_TRACE_DEVICE_COLLECT="nvml", CANDLE_TRACE_DEVICE_INTERVAL_MS="5",
               CANDLE_TRACE_NVML_LIB=str(fake_nvml))
    r = subprocess.run(["/bin/sleep", "0.2"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "device collectors not started" not in r.stderr
    (trace,) = tmp_path.glob("run-*.jsonl")
    events = lines(trace)
    samples = [e for e in events if e["kind"] == "device_memory"]
    # One round of both devices at least, the one before the terminal line;
    # how many more the 5 ms interval adds depends on the machine's load.
    assert len(samples) >= 2, len(samples)
    assert {e["device"] for e in samples} == {"cuda:0", "cuda:1"}
    assert events[-1]["outcome"] == "complete"
    require_valid(trace, tmp_path)


def test_dropin_without_nvml_says_so_and_still_traces(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANDLE_TRACE_")}
    env.update(LD_PRELOAD=str(LIB), CANDLE_TRACE_PATH=str(tmp_path / "run-%p.jsonl"),
               CANDLE_TRACE_DEVICE_COLLECT="nvml",
               CANDLE_TRACE_NVML_LIB="/nonexistent/libnvidia-ml.so.1")
    r = subprocess.run(["/bin/sleep", "0.1"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert ("candle-trace: device collectors not started: ct_device_start: NVML is unavailable: "
            "/nonexistent/libnvidia-ml.so.1 could not be loaded") in r.stderr
    (trace,) = tmp_path.glob("run-*.jsonl")
    assert lines(trace)[-1]["outcome"] == "complete"


@pytest.fixture(scope="module")
def fake_cupti(tmp_path_factory) -> Path:
    cc = os.environ.get("CC", "cc")
    if not shutil.which(cc):
        pytest.skip("no C compiler for the fake libcupti")
    return fake_cupti_helper.build(tmp_path_factory.mktemp("fakecupti"), cc)


def fake_cupti_env(lib: Path) -> dict:
    """What a script driving the fake libcupti needs: the library for the
    collector and for the script (one path, one library), and the helper."""
    return {"CANDLE_TRACE_CUPTI_LIB": str(lib), "FAKE_CUPTI": str(lib), "PYTHONPATH": fake_cupti_helper.HERE}


def test_dropin_keeps_the_kernels_launched_just_before_exit(tmp_path, fake_cupti):
    """Issue 14, defect 6: the exit's flush waits for every buffer CUPTI held,
    even one still on its way. The fake delivers each buffer 100 ms late from
    another thread, so a flush that only asks cuptiActivityFlushAll finds
    nothing and the trace ends with no device interval, every time. And the
    kernels come right at the start: under the shim the program starts once
    the collectors run (they start in the library's Go init, on its own
    thread; before, a loaded machine let the script launch first)."""
    shim = REPO / "build" / "libcandle_trace_preload.so"
    assert shim.exists(), f"{shim} is not built (make build/libcandle_trace_preload.so)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANDLE_TRACE_")}
    env.update(LD_PRELOAD=str(shim), CANDLE_TRACE_LIB=str(LIB), CANDLE_TRACE_PATH=str(tmp_path / "run-%p.jsonl"),
               CANDLE_TRACE_DEVICE_COLLECT="cupti", FAKE_CUPTI_DELIVERY_DELAY_MS="100",
               **fake_cupti_env(fake_cupti))
    script = "from fake_cupti import launch\nfor i in range(5): launch(b'_Z4lastv', 1000)\n"
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "device collectors not started" not in r.stderr, r.stderr
    (trace,) = tmp_path.glob("run-*.jsonl")
    events = lines(trace)
    assert [e["name"] for e in events if e["kind"] == "device_interval"] == ["last()"] * 5
    assert events[-1]["outcome"] == "complete"
    require_valid(trace, tmp_path)


CUPTI_PRELUDE = """
from fake_cupti import launch
import fake_cupti
fake = fake_cupti.lib()   # the same library the collector dlopens
"""


def test_cupti_intervals_through_the_abi_with_a_fake_libcupti(tmp_path, fake_cupti):
    trace = tmp_path / "cupti.jsonl"
    r = run(
        CUPTI_PRELUDE + """
fake.fake_cupti_hold(1, 0)                     # another profiler holds CUPTI
start('{"collect":["cupti"]}')
fake.fake_cupti_hold(0, 0)
assert start('{"collect":["cupti"]}') == 0
x = ctypes.c_uint64(0)
assert lib.ct_span_begin(s, b"forward", 0, 0, ctypes.byref(x)) == 0
launch(b"_Z5sgemmPfi", 5000, 7)                  # mangled: demangled in the trace
launch(b"relu_kernel", 700, 7)
assert lib.ct_span_end(s, x) == 0
launch(b"outside_any_span", 300, 13)
fake.fake_cupti_drop(2)
time.sleep(0.01)
print("span", x.value, flush=True)
print("finish", lib.ct_finish(s), flush=True)   # flushes CUPTI before the terminal line
""",
        trace,
        env=fake_cupti_env(fake_cupti),
    )
    assert ("start 7 ct_device_start: CUPTI is held by another profiler in this process "
            "(torch.profiler, Nsight Systems") in r.stdout
    assert "finish 0" in r.stdout
    span = int(next(l for l in r.stdout.splitlines() if l.startswith("span")).split()[1])
    events = lines(trace)
    ivs = [e for e in events if e["kind"] == "device_interval"]
    assert [(e["name"], e["stream_id"], e["duration_ns"], e["span_id"]) for e in ivs] == [
        ("sgemm(float*, int)", "7", 5000, f"s{span}"),
        ("relu_kernel", "7", 700, f"s{span}"),
        ("outside_any_span", "13", 300, "s1"),
    ]
    for e in ivs:
        assert e["device"] == "cuda:0" and e["backend"] == "cuda" and e["clock_id"] == "host-monotonic"
        assert 0 <= e["start_ns"] and e["start_ns"] + e["duration_ns"] <= events[-1]["timestamp_ns"]
    assert len({e["correlation_id"] for e in ivs}) == 3
    (dropped,) = [e for e in events if e["kind"] == "tensor_stats"]
    assert (dropped["label"], dropped["span_id"], dropped["mean"]) == ("cupti/dropped_records", "s1", 2)
    assert events[-1]["outcome"] == "complete"
    require_valid(trace, tmp_path)
