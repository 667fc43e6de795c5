"""The GPU check's own checks (tests/gpu/check.py), run here on traces made
with the fake NVML and the fake libcupti, as tests/gpu/run.sh makes them on a
GPU: through the Python binding and under the drop-in. A GPU session is rare;
a typo in its checks must not be what it finds.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_device import LIB, REPO, fake_cupti, fake_cupti_env, fake_nvml  # noqa: F401 (fixtures)

CHECK = REPO / "tests" / "gpu" / "check.py"
PRELOAD = REPO / "build" / "libcandle_trace_preload.so"

pytestmark = pytest.mark.skipif(not LIB.exists() or not PRELOAD.exists(),
                                reason="build/libcandle_trace.so and the preload shim are not built")

FAKE_LAUNCH = """
import os, threading, time
from fake_cupti import launch   # on the library the collector dlopened
"""

STEP = FAKE_LAUNCH + """
import json, sys
sys.path.insert(0, os.environ["BINDING"])
import candle_trace as ct
trace, report, name = sys.argv[1], sys.argv[2], sys.argv[3].encode()
s = ct.Session(trace, "gpu_check::step", phase="train", capture_step=6, device="cuda:0",
               run={"warmup_steps": 5})
s.device_start({"collect": ["nvml", "cupti"], "interval_ms": 10, "unspanned_launches": "main_thread"})
time.sleep(0.05)
spans = []
with s.measure("update"):
    with s.span("forward", step="forward"):
        spans.append(launch(name, 400_000))
        time.sleep(0.002)
        spans.append(launch(name, 300_000))
    with s.span("backward", step="backward"):
        # as autograd does: from its own thread, where no span is open
        th = threading.Thread(target=lambda: spans.append(launch(name, 500_000, 13)))
        th.start(); th.join()
    with s.span("optimizer", step="optimizer"):
        time.sleep(0.002)
        spans.append(launch(name, 200_000))
    time.sleep(0.003)                        # "synchronize": the last kernel ends inside the update
time.sleep(0.05)
s.device_stop()
s.finish()
truth_ms = (max(e for _, _, e in spans) - min(b for _, b, _ in spans)) / 1e6
json.dump({"event_ms": truth_ms, "first_event_ms": truth_ms, "traced_event_ms": truth_ms,
           "cupti": True, "cupti_error": ""}, open(report, "w"))
"""

# What candle_trace.torch.profile writes, in the shape check.py reads: module spans,
# backward's kernels from autograd's thread, the optimizer's.
PROFILE = FAKE_LAUNCH + """
import sys
sys.path.insert(0, os.environ["BINDING"])
import candle_trace as ct
s = ct.Session(sys.argv[1], "Sequential::train", phase="train", capture_step=3, device="cuda:0")
s.device_start({"collect": ["cupti"], "unspanned_launches": "main_thread"})
with s.span("candle_trace/cupti_warmup"):   # the binding's CUPTI warm-up (_device.Device.warm)
    launch(b"_Z4fillv", 100)
with s.measure("update"):
    with s.span("Sequential", kind="module", step="forward"):
        with s.span("0", kind="module", step="forward"):
            launch(b"_Z4gemmv", 1000)
    with s.span("backward", step="backward"):
        th = threading.Thread(target=lambda: launch(b"_Z8gemm_bwdv", 1000))
        th.start(); th.join()
    with s.span("SGD.step", step="optimizer"):
        launch(b"_Z4axpyv", 500)
time.sleep(0.002)
s.finish()
"""

DROPIN = FAKE_LAUNCH + """
for i in range(20):
    launch(b"_ZN2at6native29vectorized_elementwise_kernelILi4EEEvv", 10_000)
time.sleep(0.06)
print("plain done")
"""


def make_gpu_check_output(out: Path, fake_nvml: Path, fake_cupti: Path, kernel: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANDLE_TRACE_")}
    # Every buffer reaches the collector 50 ms late, from another thread: the
    # window a kernel launched just before exit (or a device_stop) falls
    # into, held open, so the checks never depend on how fast delivery is.
    env.update(CANDLE_TRACE_LIB=str(LIB), CANDLE_TRACE_NVML_LIB=str(fake_nvml),
               BINDING=str(REPO / "bindings" / "python"), FAKE_CUPTI_DELIVERY_DELAY_MS="50",
               **fake_cupti_env(fake_cupti))
    r = subprocess.run([sys.executable, "-c", STEP, str(out / "step.jsonl"), str(out / "step.json"), kernel],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-c", PROFILE, str(out / "profile.jsonl")],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    env.update(LD_PRELOAD=str(PRELOAD), CANDLE_TRACE_MATCH="python*",
               CANDLE_TRACE_PATH=str(out / "dropin-%p.jsonl"),
               CANDLE_TRACE_DEVICE_COLLECT="nvml,cupti", CANDLE_TRACE_DEVICE_INTERVAL_MS="10")
    r = subprocess.run([sys.executable, "-c", DROPIN], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "plain done\n", r.stderr
    assert "device collectors not started" not in r.stderr, r.stderr


def run_check(out: Path) -> tuple[int, list[str]]:
    r = subprocess.run([sys.executable, str(CHECK), str(out)], capture_output=True, text=True, timeout=60)
    assert r.stderr == ""
    return r.returncode, r.stdout.splitlines()


def test_the_checks_pass_on_a_good_run(tmp_path, fake_nvml, fake_cupti):
    make_gpu_check_output(tmp_path, fake_nvml, fake_cupti, "_Z5sgemmPfi")
    rc, out = run_check(tmp_path)
    assert rc == 0, "\n".join(out)
    fails = [line for line in out if line.startswith("FAIL")]
    assert fails == []
    oks = [line for line in out if line.startswith("ok")]
    for want in ["ok    1 drop-in trace(s)",
                 "ok    step.jsonl: complete",
                 "ok    step.jsonl: 4 named device intervals",
                 "ok    step.jsonl: every device interval inside the session",
                 "ok    step.jsonl: every device interval attributed to an existing span",
                 "ok    step.jsonl: dropped records stated (0)",
                 "ok    step.jsonl: kernel names demangled (4 of 4; e.g. sgemm(float*, int))",
                 "ok    step: 2 kernels attributed to the forward span",
                 "ok    step: 1 kernels attributed to the backward span",   # launched from another thread
                 "ok    step: 1 kernels attributed to the optimizer span"]:
        assert want in oks, "\n".join(out)
    assert "      kernels on the root s1: 0" in out
    for want in ["ok    profile.jsonl: complete",
                 "ok    profile: 4 named device intervals",
                 "ok    profile: every device interval attributed to an existing span",
                 "ok    profile: 1 kernels on forward spans",
                 "ok    profile: 1 kernels on backward spans",
                 "ok    profile: 1 kernels on optimizer spans",
                 "ok    profile: CUPTI's warm-up span before the update, 1 kernels on it"]:
        assert want in oks, "\n".join(out)
    assert "      profile: 1 of 4 kernels on module spans, 0 on the root s1" in out
    timing = next(line for line in oks if line.startswith("ok    step: device time"))
    assert "(±10%)" in timing
    dropin = [line for line in oks if line.startswith("ok    dropin-")]
    assert any(line.endswith(": 20 named device intervals") for line in dropin), "\n".join(out)
    assert any("NVML cost per sample" in line for line in out)


def test_the_checks_catch_a_wrong_timing_and_mangled_names(tmp_path, fake_nvml, fake_cupti):
    make_gpu_check_output(tmp_path, fake_nvml, fake_cupti, "_Zbad")   # not a mangling: kept as it came
    report = tmp_path / "step.json"
    rep = json.loads(report.read_text())
    rep["traced_event_ms"] *= 1.5                # torch.cuda.Event says the step took longer
    report.write_text(json.dumps(rep))
    rc, out = run_check(tmp_path)
    assert rc == 1
    fails = [line for line in out if line.startswith("FAIL")]
    assert len(fails) == 2, "\n".join(out)
    assert fails[0].startswith("FAIL  step.jsonl: kernel names demangled (0 of 4; e.g. _Zbad)")
    assert fails[1].startswith("FAIL  step: device time ") and "(±10%)" in fails[1]


def test_without_cupti_only_the_memory_checks_run(tmp_path, fake_nvml, fake_cupti):
    make_gpu_check_output(tmp_path, fake_nvml, fake_cupti, "_Z5sgemmPfi")
    (tmp_path / "step.json").write_text(json.dumps({"event_ms": 1.0, "first_event_ms": 1.0, "traced_event_ms": 1.0,
                                                    "cupti": False, "cupti_error": "held"}))
    rc, out = run_check(tmp_path)
    assert rc == 0, "\n".join(out)
    assert not any("device interval" in line for line in out)
    assert sum(line.startswith("ok") and "device_memory samples of cuda:0" in line for line in out) == 2


@pytest.mark.parametrize("used_late,fails", [(5 << 20, False), (0, True)])
def test_memory_is_checked_from_the_first_device_interval_on(used_late, fails):
    """Before the process has a CUDA context the device may truthfully hold nothing (the
    drop-in samples from the interpreter's start: on the H200, 394 of 462 samples were
    taken during `import torch`, used 0): those are not failures; one after the first
    device interval is."""
    sys.path.insert(0, str(CHECK.parent))
    import check  # noqa: E402 - tests/gpu/check.py

    def mem(ts, used):
        return {"kind": "device_memory", "timestamp_ns": ts, "device": "cuda:0",
                "used_bytes": used, "capacity_bytes": 1 << 30}

    ev = [{"kind": "span_start", "id": "s1", "start_ns": 0}, mem(10, 0), mem(20, 0),
          {"kind": "device_interval", "span_id": "s1", "start_ns": 30, "duration_ns": 5,
           "name": "k", "stream_id": "7"},
          mem(40, 4 << 20), mem(50, used_late), {"kind": "terminal", "outcome": "complete", "timestamp_ns": 60}]
    lines = []
    check.check_trace("dropin-1.jsonl", ev, {"cupti": False}, lambda ok, what: lines.append((ok, what)))
    [(ok, what)] = [(ok, w) for ok, w in lines if "capacity > 0" in w]
    assert ok is not fails, what
    assert "(2 samples; 2 before it)" in what
