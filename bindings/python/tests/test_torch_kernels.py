"""_kernels: when a capture turns inductor's kernel record functions on, what it makes
resolvable for them, and that it puts the option back (the compiled model's kernels as
ops end to end: test_torch_compile.py)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import types
import warnings

import pytest

pytest.importorskip("torch")

from candle_trace.torch import _common, _kernels  # noqa: E402


@pytest.fixture
def fresh(monkeypatch):
    """The module's process-wide state as in a new process, and a stand-in for inductor's
    config module (loaded, as after a torch.compile call)."""
    monkeypatch.setattr(_kernels, "_resolvable", None)
    monkeypatch.setattr(_kernels, "_users", 0)
    monkeypatch.setattr(_kernels, "_was", None)
    monkeypatch.setattr(_common, "_warned", set())
    cfg = types.SimpleNamespace(cpp=types.SimpleNamespace(enable_kernel_profile=False))
    monkeypatch.setitem(sys.modules, "torch._inductor.config", cfg)
    return cfg


def test_nothing_is_done_where_no_model_was_compiled(fresh, monkeypatch, tmp_path):
    monkeypatch.delitem(sys.modules, "torch._inductor.config")
    k = _kernels.KernelRecords(tmp_path)
    assert k.acquire() is False and not k.held
    assert _kernels._resolvable is None  # not even looked at
    assert list(tmp_path.iterdir()) == []


def test_the_option_is_on_while_any_capture_holds_it_then_as_it_was(fresh, monkeypatch, tmp_path):
    monkeypatch.setattr(_kernels, "_global", lambda name: True)  # the kernels link libtorch
    a, b = _kernels.KernelRecords(tmp_path), _kernels.KernelRecords(tmp_path)
    assert a.acquire() and b.acquire() and a.acquire()  # a second acquire holds once
    assert fresh.cpp.enable_kernel_profile is True
    a.release()
    a.release()
    assert fresh.cpp.enable_kernel_profile is True  # b still holds it
    b.release()
    assert fresh.cpp.enable_kernel_profile is False
    fresh.cpp.enable_kernel_profile = True  # the user's own choice stays
    assert a.acquire()
    a.release()
    assert fresh.cpp.enable_kernel_profile is True


def test_without_a_compiler_the_kernels_go_unrecorded_and_the_option_stays_off(
        fresh, monkeypatch, tmp_path):
    monkeypatch.setattr(_kernels, "_global", lambda name: False)
    monkeypatch.setattr(_kernels, "_kernels_call_the_shim", lambda: True)
    monkeypatch.setattr(_kernels, "_libtorch_cpu", lambda: types.SimpleNamespace(
        aoti_record_function_start=None, aoti_record_function_end=None))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _kernels.KernelRecords(tmp_path).acquire() is False
        assert _kernels.KernelRecords(tmp_path).acquire() is False  # decided once
    assert fresh.cpp.enable_kernel_profile is False
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == 1 and "inductor's C++ kernels are not recorded as ops" in msgs[0]
    assert "no C compiler" in msgs[0]


def test_a_torch_whose_kernels_are_of_another_kind_is_left_alone(fresh, monkeypatch, tmp_path):
    monkeypatch.setattr(_kernels, "_global", lambda name: False)
    monkeypatch.setattr(_kernels, "_kernels_call_the_shim", lambda: False)
    assert _kernels.KernelRecords(tmp_path).acquire() is False
    assert fresh.cpp.enable_kernel_profile is False
    assert list(tmp_path.iterdir()) == []


def test_a_failing_compiler_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "ccache cc -m64")  # as a user spells it: every word is used
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "aoti.c:1: error: broken")
    with pytest.raises(RuntimeError, match="ccache cc -m64 failed: aoti.c:1: error: broken"):
        _kernels.build_shim(tmp_path, run=run)
    assert calls[0][:4] == ["ccache", "cc", "-m64", "-x"]
    assert not _kernels.shim_path(tmp_path).exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # its temporary folder went too


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                    reason="needs a C compiler")
def test_the_shim_exports_exactly_its_three_names_and_forwards(tmp_path):
    so = _kernels.build_shim(tmp_path)
    built = so.stat().st_mtime_ns
    assert _kernels.build_shim(tmp_path) == so and so.stat().st_mtime_ns == built  # once
    nm = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True,
                        text=True, check=True).stdout
    names = sorted(line.split()[-1] for line in nm.splitlines() if line.split()[-2:-1] == ["T"])
    assert names == ["aoti_record_function_end", "aoti_record_function_start",
                     "candle_trace_aoti_bind"]
    # the calls reach the functions bound (C callbacks standing in for libtorch's)
    seen = []
    START = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_uint64, ctypes.c_void_p)
    END = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)
    start = START(lambda name, kw, ins, n, guard: seen.append(("start", name, n)) or 0)
    end = END(lambda guard: seen.append(("end", guard)) or 7)
    lib = ctypes.CDLL(str(so))  # RTLD_LOCAL here: this test promotes nothing
    lib.candle_trace_aoti_bind(ctypes.cast(start, ctypes.c_void_p),
                               ctypes.cast(end, ctypes.c_void_p))
    lib.aoti_record_function_start.argtypes = [ctypes.c_char_p, ctypes.c_void_p,
                                               ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p]
    lib.aoti_record_function_end.argtypes = [ctypes.c_void_p]
    assert lib.aoti_record_function_start(b"cpp_fused_relu_0", None, None, 0, None) == 0
    assert lib.aoti_record_function_end(ctypes.c_void_p(42)) == 7
    assert seen == [("start", b"cpp_fused_relu_0", 0), ("end", 42)]
