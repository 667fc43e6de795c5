"""NVIDIA's own libcupti and libnvidia-ml on a machine without a GPU.

`make real-libs` fetches them (tests/reallibs/fetch.py): libcupti from the
nvidia-cuda-cupti-cu12 wheel, laid out as pip installs it, and libnvidia-ml
from Debian's libnvidia-ml1. Both load without a GPU, so what a user without
a driver sees, and how the Python binding and the drop-in find a pip-installed
libcupti, are tested against the real libraries, not only the fakes.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import lines, require_valid

REPO = Path(__file__).resolve().parents[2]
LIB = Path(os.environ.get("CANDLE_TRACE_LIB", REPO / "build" / "libcandle_trace.so")).resolve()
REAL = Path(os.environ.get("CANDLE_TRACE_REAL_LIBS", REPO / "build" / "reallibs")).resolve()
SITE = REAL / "site"
CUPTI = SITE / "nvidia" / "cuda_cupti" / "lib" / "libcupti.so.12"
SITE13 = REAL / "site13"
CUPTI13 = SITE13 / "nvidia" / "cu13" / "lib" / "libcupti.so.13"
NVML = REAL / "nvml" / "libnvidia-ml.so.1"
DRIVER = Path("/proc/driver/nvidia/version").exists()

pytestmark = [
    pytest.mark.skipif(not LIB.exists(), reason=f"{LIB} is not built (make lib)"),
    pytest.mark.skipif(DRIVER, reason="this machine runs the NVIDIA driver: these are the no-driver errors"),
]


@pytest.fixture(scope="module", autouse=True)
def real_libs() -> None:
    missing = [str(p) for p in (CUPTI, CUPTI13, NVML) if not p.exists()]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{missing} missing; .ci/run fetches them with make real-libs")
        pytest.skip(f"{missing} missing; run `make real-libs`")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CANDLE_TRACE_") and k not in ("PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX")}
    env["CANDLE_TRACE_LIB"] = str(LIB)
    env.update(extra)
    return env


BINDING_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {binding!r})
    if {site!r}:
        sys.path.append({site!r})   # as a pip install would: on sys.path, not in any variable
    import candle_trace as ct
    s = ct.Session({trace!r}, entrypoint="real_cupti", phase="infer", capture_step=1,
                   device="cuda:0", measured_root=True)
    with s.span("step"):
        pass
    try:
        s.device_start({{"collect": ["cupti"]}})
        print("started")
    except ct.CandleTraceError as e:
        print("code", int(e.status))
        print("message", e.message)
    s.finish()
    print("finished")
    """
)


@pytest.mark.parametrize("cuda", [12, 13, None], ids=["cuda12-pip-installed", "cuda13-pip-installed", "absent"])
def test_binding_finds_pip_installed_cupti_and_reports_the_missing_driver(tmp_path, cuda):
    trace = tmp_path / "t.jsonl"
    site = {12: SITE, 13: SITE13}.get(cuda)
    script = BINDING_SCRIPT.format(binding=str(REPO / "bindings" / "python"),
                                   site=str(site) if site else "", trace=str(trace))
    r = subprocess.run([sys.executable, "-c", script], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    assert out["code"] == "7", r.stdout
    no_libcuda = ("CUDA is not usable here: the NVIDIA driver's libcuda.so.1 could not be loaded: libcuda.so.1: "
                  "cannot open shared object file: No such file or directory")
    if cuda == 12:
        assert out["message"] == (
            "ct_device_start: CUPTI could not start: cuptiSubscribe returned CUPTI_ERROR_NOT_INITIALIZED (15): "
            f"{no_libcuda} ({CUPTI} was loaded)"), out["message"]
    elif cuda == 13:
        # CUDA 13's CUPTI answers CUPTI_ERROR_UNKNOWN to everything without a driver, its clock first.
        assert out["message"] == (
            "ct_device_start: CUPTI could not start: cuptiGetTimestamp returned CUPTI_ERROR_UNKNOWN (999): "
            f"{no_libcuda} ({CUPTI13} was loaded)"), out["message"]
    else:
        assert out["message"].startswith("ct_device_start: CUPTI is unavailable: no libcupti could be loaded ("), out
        assert "pip install nvidia-cuda-cupti-cu12" in out["message"]
    assert "finished" in r.stdout
    events = lines(trace)
    assert events[-1]["outcome"] == "complete"
    assert not any(e["kind"] == "device_interval" for e in events)
    require_valid(trace, tmp_path)


def test_real_nvml_without_a_driver(tmp_path):
    trace = tmp_path / "nvml.jsonl"
    script = BINDING_SCRIPT.format(binding=str(REPO / "bindings" / "python"), site="", trace=str(trace)) \
        .replace('{"collect": ["cupti"]}', '{"collect": ["nvml"]}')
    r = subprocess.run([sys.executable, "-c", script], env=clean_env(CANDLE_TRACE_NVML_LIB=str(NVML)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert ("message ct_device_start: NVML is unavailable: nvmlInit failed: Driver Not Loaded (nvmlReturn_t 9): "
            "the NVIDIA kernel driver is not running (no NVIDIA GPU here, or its driver is not installed)\n") in r.stdout
    assert lines(trace)[-1]["outcome"] == "complete"


@pytest.mark.parametrize("collect,expect", [
    ("cupti", "cuptiSubscribe returned CUPTI_ERROR_NOT_INITIALIZED (15): CUDA is not usable here: "
              "the NVIDIA driver's libcuda.so.1 could not be loaded"),
    ("nvml", "nvmlInit failed: Driver Not Loaded (nvmlReturn_t 9)"),
])
def test_dropin_with_real_libraries_says_why_and_still_traces(tmp_path, collect, expect):
    """An uninstrumented Python under the drop-in, libcupti found through
    PYTHONPATH where pip put it, NVML the driver's own: the collector cannot
    start, stderr says why in one line, the program and its trace are whole."""
    env = clean_env(LD_PRELOAD=str(LIB), CANDLE_TRACE_PATH=str(tmp_path / "run-%p.jsonl"),
                    CANDLE_TRACE_DEVICE_COLLECT=collect, CANDLE_TRACE_NVML_LIB=str(NVML),
                    PYTHONPATH=str(SITE))
    r = subprocess.run([sys.executable, "-c", "print(sum(range(10)))"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "45\n"
    notes = [l for l in r.stderr.splitlines() if l.startswith("candle-trace: device collectors not started: ")]
    assert len(notes) == 1, r.stderr
    assert expect in notes[0]
    (trace,) = tmp_path.glob("run-*.jsonl")
    assert lines(trace)[-1]["outcome"] == "complete"
    require_valid(trace, tmp_path)


def test_dropin_finds_cupti_in_an_unactivated_virtualenv(tmp_path):
    """`pip install nvidia-cuda-cupti-cu12` in a venv whose python is run by
    its path, without activation (no VIRTUAL_ENV, no PYTHONPATH): the drop-in
    starts CUPTI before the script imports anything, and finds it there."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    lib = venv / "lib" / ver / "site-packages" / "nvidia" / "cuda_cupti" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcupti.so.12").symlink_to(CUPTI)
    env = clean_env(LD_PRELOAD=str(LIB), CANDLE_TRACE_PATH=str(tmp_path / "run-%p.jsonl"),
                    CANDLE_TRACE_DEVICE_COLLECT="cupti", HOME=str(tmp_path))
    r = subprocess.run([str(venv / "bin" / "python3"), "-c", "print('ok')"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ok\n"
    assert (f"cuptiSubscribe returned CUPTI_ERROR_NOT_INITIALIZED (15): CUDA is not usable here: "
            f"the NVIDIA driver's libcuda.so.1 could not be loaded") in r.stderr, r.stderr
    assert f"({lib / 'libcupti.so.12'} was loaded)" in r.stderr, r.stderr
