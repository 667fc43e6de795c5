"""Inductor's C++ kernels as ops of a captured update (torch 2.x on the CPU).

A ``torch.compile``d model on the CPU runs most of its work in kernels inductor generated
and compiled (``cpp_fused_gelu_native_layer_norm_0``): plain C++ loops that run no record
function, so no observer sees them, and a captured update showed only the aten ops the
compiled graph calls out to (``aten::mm``, ``aten::addmm``) with the fused kernels' time
unaccounted for. Inductor can give each kernel a record function of its own
(``torch._inductor.config.cpp.enable_kernel_profile``, what torch.profiler users set), named
as the kernel (``graph_0_cpp_fused_gelu_native_layer_norm_0``); the op observer records
those as ops (``_observer.cpp``, ``inductor_kernel``).

On the torches whose kernels reach the record function through the AOTInductor shim
(``aoti_record_function_start``/``_end``, in libtorch_cpu), the kernel's library does not
link libtorch, and libtorch's symbols are not global (torch loads it RTLD_LOCAL, on
purpose): with the option alone, loading the first kernel fails ("undefined symbol:
aoti_record_function_end") and the compile raises. So the option is set only once the
two symbols resolve: here through a small library of our own (built once with the C
compiler inductor needs anyway, into the observer's cache) that exports exactly those two
names, loaded RTLD_GLOBAL, and forwards each call to libtorch's own function -- where
making libtorch global instead would let its thousands of symbols interpose on every
library loaded after it.

Nothing is done unless inductor is in use when a capture with ops opens (its config
module is imported once ``torch.compile`` has been called: importing it here would cost
a second), nor where torch's kernel code is not the kind known here; a failure to build
or load the library leaves the option off (the kernels unrecorded, with one warning),
never the program's compile broken. Kernels compiled while the option is on keep their
record function (~0.1 µs a call when nothing records); the option is put back when the
last capture that set it ends.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, List, Optional

import torch

from ._common import warn_once

__all__ = ["KernelRecords", "SHIM_SOURCE"]

#: the library that makes the two shim functions global: each forwards to the function
#: candle_trace_aoti_bind handed it (libtorch_cpu's, found through its own handle)
SHIM_SOURCE = r"""
#include <stdint.h>
typedef int32_t (*ct_start_fn)(const char *, void *, const void *, uint64_t, void **);
typedef int32_t (*ct_end_fn)(void *);
static ct_start_fn start_fn;
static ct_end_fn end_fn;
#define EXPORT __attribute__((visibility("default")))
EXPORT int32_t aoti_record_function_start(const char *name, void *kwargs, const void *inputs,
                                          uint64_t n_inputs, void **guard) {
    return start_fn(name, kwargs, inputs, n_inputs, guard);
}
EXPORT int32_t aoti_record_function_end(void *guard) { return end_fn(guard); }
EXPORT void candle_trace_aoti_bind(void *start, void *end) {
    start_fn = (ct_start_fn)start;
    end_fn = (ct_end_fn)end;
}
"""

_SYMBOLS = ("aoti_record_function_start", "aoti_record_function_end")
_COMPILERS = ("cc", "gcc", "clang")

_lock = threading.Lock()
_users = 0  # captures holding the option on
_was: Optional[bool] = None  # the option's value before the first of them set it
_resolvable: Optional[bool] = None  # the two symbols resolve globally (decided once)


def _inductor_config() -> Any:
    """Inductor's config module when ``torch.compile`` has loaded it, else None."""
    cfg = sys.modules.get("torch._inductor.config")
    cpp = getattr(cfg, "cpp", None)
    return cfg if cpp is not None and hasattr(cpp, "enable_kernel_profile") else None


def _torch_dir() -> Path:
    return Path(torch.__file__).resolve().parent


def _kernels_call_the_shim() -> bool:
    """Whether this torch's kernel code reaches the record function through the shim
    (``RAIIAtenRecordFunctionHandle``, torch >= 2.6 or so): the kind of kernel the
    library here is made for. Read from the source of inductor's C++ code generator,
    which is not imported before the first compilation."""
    gen = _torch_dir() / "_inductor" / "codegen" / "cpp.py"
    try:
        return "RAIIAtenRecordFunctionHandle" in gen.read_text(errors="replace")
    except OSError:
        return False


def _global(name: str) -> bool:
    try:
        getattr(ctypes.CDLL(None), name)
        return True
    except AttributeError:
        return False


def _libtorch_cpu() -> Optional[ctypes.CDLL]:
    """libtorch_cpu, already loaded by torch: dlopen hands back its handle (RTLD_LOCAL
    stays: nothing is promoted)."""
    lib = _torch_dir() / "lib" / "libtorch_cpu.so"
    if not lib.exists():
        return None
    try:
        return ctypes.CDLL(str(lib))
    except OSError:
        return None


def shim_path(cache: Path) -> Path:
    digest = hashlib.sha256(SHIM_SOURCE.encode()).hexdigest()[:12]
    return cache / f"candle_trace_aoti_{digest}.so"


def _compiler() -> Optional[List[str]]:
    """$CC as the user spells it ("ccache gcc" included), else the first of _COMPILERS."""
    cc = shlex.split(os.environ.get("CC") or "")
    if cc and shutil.which(cc[0]):
        return cc
    found = next((p for p in map(shutil.which, _COMPILERS) if p), None)
    return [found] if found else None


def build_shim(cache: Path, run: Callable[..., Any] = subprocess.run) -> Path:
    """The shim library in ``cache`` (built there once: a temporary file renamed into
    place, so a concurrent process never loads half of one)."""
    so = shim_path(cache)
    if so.exists():
        return so
    cc = _compiler()
    if cc is None:
        raise RuntimeError(f"no C compiler ($CC, {', '.join(_COMPILERS)}) on PATH")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        src, out = Path(tmp) / "aoti.c", Path(tmp) / so.name
        src.write_text(SHIM_SOURCE)
        r = run(cc + ["-x", "c", "-shared", "-fPIC", "-O2", "-fvisibility=hidden",
                      "-o", str(out), str(src)], capture_output=True, text=True)
        if r.returncode != 0 or not out.exists():
            raise RuntimeError(f"{' '.join(cc)} failed: {(r.stderr or r.stdout).strip()[-400:]}")
        os.replace(out, so)
    return so


def _make_resolvable(cache: Path) -> None:
    """Makes the two symbols global (the shim), bound to libtorch's functions."""
    torch_cpu = _libtorch_cpu()
    if torch_cpu is None or not all(hasattr(torch_cpu, s) for s in _SYMBOLS):
        raise RuntimeError("libtorch_cpu.so has no aoti_record_function_start/_end")
    shim = ctypes.CDLL(str(build_shim(cache)), mode=ctypes.RTLD_GLOBAL)
    addr = [ctypes.cast(getattr(torch_cpu, s), ctypes.c_void_p).value for s in _SYMBOLS]
    shim.candle_trace_aoti_bind.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    shim.candle_trace_aoti_bind.restype = None
    shim.candle_trace_aoti_bind(*addr)
    if not all(_global(s) for s in _SYMBOLS):
        raise RuntimeError("the shim's symbols did not become global")


class KernelRecords:
    """Inductor's kernels recorded while a capture is open: :meth:`acquire` when it
    opens (True where the option is now on), :meth:`release` when it ends."""

    def __init__(self, cache: Path) -> None:
        self._cache = cache
        self.held = False

    def acquire(self) -> bool:
        global _users, _was, _resolvable
        if self.held:
            return True
        cfg = _inductor_config()
        if cfg is None or sys.platform != "linux":
            return False
        with _lock:
            if _resolvable is None:
                _resolvable = self._resolve()
            if not _resolvable:
                return False
            if _users == 0:
                _was = bool(cfg.cpp.enable_kernel_profile)
                cfg.cpp.enable_kernel_profile = True
            _users += 1
            self.held = True
            return True

    def _resolve(self) -> bool:
        if all(_global(s) for s in _SYMBOLS):
            return True  # the kernels link libtorch here, or it is global already
        if not _kernels_call_the_shim():
            return False
        try:
            _make_resolvable(self._cache)
            return True
        except Exception as e:  # noqa: BLE001 - the kernels go unrecorded, the compile works
            warn_once("inductor-kernels", f"inductor's C++ kernels are not recorded as ops "
                                          f"({e})")
            return False

    def release(self) -> None:
        global _users
        if not self.held:
            return
        self.held = False
        with _lock:
            _users -= 1
            cfg = _inductor_config()
            if _users == 0 and cfg is not None and _was is not None:
                cfg.cpp.enable_kernel_profile = _was
