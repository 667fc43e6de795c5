"""Drives the fake libcupti (fake_cupti.c) from the Python tests and the
scripts they run in child processes.

The tests build the library with ``build``; a script, started with the
built path in $FAKE_CUPTI (and CANDLE_TRACE_CUPTI_LIB pointing at it too),
loads it with ``lib()``: dlopen of one path gives the one library, so the
script drives the very copy the collector subscribed to.
"""
from __future__ import annotations

import ctypes
import functools
import os
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_cupti.c")
HERE = str(Path(__file__).parent)  # for PYTHONPATH: the scripts import this module

DOMAIN_RUNTIME = 2
CBID_CUDA_LAUNCH_KERNEL = 211  # CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000


def build(out_dir: Path, cc: str = "cc") -> Path:
    """Compiles fake_cupti.c into out_dir/libcupti.so.12."""
    out = Path(out_dir) / "libcupti.so.12"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-o", str(out), str(SOURCE), "-lpthread"], check=True)
    return out


@functools.lru_cache(maxsize=None)
def lib() -> ctypes.CDLL:
    """The fake at $FAKE_CUPTI, with its test hooks' signatures."""
    f = ctypes.CDLL(os.environ["FAKE_CUPTI"])
    f.fake_cupti_api.restype = ctypes.c_uint32
    f.fake_cupti_api.argtypes = [ctypes.c_int, ctypes.c_uint32]
    f.fake_cupti_kernel.argtypes = [ctypes.c_uint32, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint32,
                                    ctypes.c_uint64, ctypes.c_uint64]
    f.fake_cupti_drop.argtypes = [ctypes.c_uint64]
    f.fake_cupti_hold.argtypes = [ctypes.c_int, ctypes.c_int]
    f.cuptiGetTimestamp.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
    return f


def now() -> int:
    """The fake's cuptiGetTimestamp."""
    t = ctypes.c_uint64(0)
    lib().cuptiGetTimestamp(ctypes.byref(t))
    return t.value


def launch(name: bytes, dur_ns: int = 5000, stream: int = 7, device: int = 0) -> tuple[int, int, int]:
    """One cudaLaunchKernel on the calling thread (the collector's callback
    runs there) and the record of its kernel, starting 1 µs later: returns
    (correlation id, start, end) on CUPTI's clock."""
    f = lib()
    cid = f.fake_cupti_api(DOMAIN_RUNTIME, CBID_CUDA_LAUNCH_KERNEL)
    start = now() + 1000
    f.fake_cupti_kernel(cid, name, device, stream, start, start + dur_ns)
    return cid, start, start + dur_ns
