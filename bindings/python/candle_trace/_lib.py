"""Loading libcandle_trace.so and declaring its C ABI (include/candle_trace.h) for ctypes.

Everything here mirrors the header one to one; ``tests/test_abi_mirror.py`` parses the
header and compares it with these declarations so the two cannot drift apart.
"""

from __future__ import annotations

import ctypes
import enum
import os
from pathlib import Path
from typing import Optional

#: The ABI version these declarations describe (CT_ABI_VERSION of the header).
CT_ABI_VERSION = 1
CT_DEFAULT_FLUSH_INTERVAL_MS = 50

LIBRARY_NAME = "libcandle_trace.so"

c_session = ctypes.c_uint64
c_span = ctypes.c_uint64


class Status(enum.IntEnum):
    """ct_status: the result of every fallible call."""

    CT_OK = 0
    CT_ERR_INVALID_ARGUMENT = 1
    CT_ERR_INVALID_HANDLE = 2
    CT_ERR_SPAN_MISMATCH = 3
    CT_ERR_STATE = 4
    CT_ERR_IO = 5
    CT_ERR_POISONED = 6
    CT_ERR_UNAVAILABLE = 7
    CT_ERR_INTERNAL = 8


class SpanKind(enum.IntEnum):
    """ct_span_kind."""

    CT_SPAN_FUNCTION = 0
    CT_SPAN_OP = 1
    CT_SPAN_MODULE = 2


class Step(enum.IntEnum):
    """ct_step: the training phase a span covers."""

    CT_STEP_NONE = 0
    CT_STEP_FORWARD = 1
    CT_STEP_BACKWARD = 2
    CT_STEP_OPTIMIZER = 3


class MemoryAction(enum.IntEnum):
    """ct_memory_action."""

    CT_MEMORY_ALLOC = 0
    CT_MEMORY_FREE = 1


class GradientState(enum.IntEnum):
    """ct_gradient_state."""

    CT_GRADIENT_PRESENT = 0
    CT_GRADIENT_ZERO = 1
    CT_GRADIENT_MISSING = 2
    CT_GRADIENT_NON_FINITE = 3


class Category(enum.IntEnum):
    """ct_category: the memory category of a tensor."""

    CT_CATEGORY_OTHER = 0
    CT_CATEGORY_PARAMETER = 1
    CT_CATEGORY_ACTIVATION = 2
    CT_CATEGORY_GRADIENT = 3
    CT_CATEGORY_OPTIMIZER = 4


# Presence flags of optional record fields.
CT_HAS_OUTPUT_DENSE_BYTES = 1 << 0
CT_HAS_DENSE_BYTES = 1 << 0
CT_HAS_USED_BYTES = 1 << 0
CT_HAS_FREE_BYTES = 1 << 1
CT_HAS_RESERVED_BYTES = 1 << 2
CT_HAS_CAPACITY_BYTES = 1 << 3
CT_HAS_CORRELATION_ID = 1 << 0

_p_char = ctypes.c_char_p
_p_i64 = ctypes.POINTER(ctypes.c_int64)
_enum = ctypes.c_int  # C enums are int-sized on every ABI we target


class Op(ctypes.Structure):
    """struct ct_op."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("op_name", _p_char),
        ("dtype", _p_char),
        ("device", _p_char),
        ("inputs", ctypes.POINTER(_p_char)),
        ("n_inputs", ctypes.c_size_t),
        ("output", _p_char),
        ("shape", _p_i64),
        ("rank", ctypes.c_size_t),
        ("duration_ns", ctypes.c_uint64),
        ("timestamp_ns", ctypes.c_uint64),
        ("output_dense_bytes", ctypes.c_uint64),
        ("input_dense_bytes", ctypes.c_uint64),
    ]


class Tensor(ctypes.Structure):
    """struct ct_tensor."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("tensor_id", _p_char),
        ("dtype", _p_char),
        ("device", _p_char),
        ("label", _p_char),
        ("shape", _p_i64),
        ("rank", ctypes.c_size_t),
        ("requires_grad", ctypes.c_int32),
        ("category", _enum),
        ("dense_bytes", ctypes.c_uint64),
    ]


class TensorStats(ctypes.Structure):
    """struct ct_tensor_stats."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("label", _p_char),
        ("dtype", _p_char),
        ("shape", _p_i64),
        ("rank", ctypes.c_size_t),
        ("elements", ctypes.c_uint64),
        ("non_finite", ctypes.c_uint64),
        ("rms", ctypes.c_double),
        ("abs_max", ctypes.c_double),
        ("mean", ctypes.c_double),
    ]


class Memory(ctypes.Structure):
    """struct ct_memory."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
        ("timestamp_ns", ctypes.c_uint64),
        ("storage_id", _p_char),
        ("tensor_id", _p_char),
        ("device", _p_char),
        ("dtype", _p_char),
        ("op_name", _p_char),
        ("bytes", ctypes.c_uint64),
        ("shape", _p_i64),
        ("rank", ctypes.c_size_t),
        ("category", _enum),
    ]


class DeviceMemory(ctypes.Structure):
    """struct ct_device_memory."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("timestamp_ns", ctypes.c_uint64),
        ("device", _p_char),
        ("used_bytes", ctypes.c_uint64),
        ("free_bytes", ctypes.c_uint64),
        ("reserved_bytes", ctypes.c_uint64),
        ("capacity_bytes", ctypes.c_uint64),
    ]


class DeviceInterval(ctypes.Structure):
    """struct ct_device_interval."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("device", _p_char),
        ("stream_id", _p_char),
        ("clock_id", _p_char),
        ("backend", _p_char),
        ("name", _p_char),
        ("start_ns", ctypes.c_uint64),
        ("duration_ns", ctypes.c_uint64),
        ("correlation_id", ctypes.c_uint64),
    ]


#: Struct name in the header -> ctypes mirror.
STRUCTS = {
    "ct_op": Op,
    "ct_tensor": Tensor,
    "ct_tensor_stats": TensorStats,
    "ct_memory": Memory,
    "ct_device_memory": DeviceMemory,
    "ct_device_interval": DeviceInterval,
}

#: Enum name in the header -> Python mirror.
ENUMS = {
    "ct_status": Status,
    "ct_span_kind": SpanKind,
    "ct_step": Step,
    "ct_memory_action": MemoryAction,
    "ct_gradient_state": GradientState,
    "ct_category": Category,
}

_u64 = ctypes.c_uint64
_st = ctypes.c_int
_P = ctypes.POINTER

#: Every function of the header: name -> (restype, argtypes).
PROTOTYPES = {
    "ct_open": (_st, [_p_char, _p_char, _P(c_session)]),
    "ct_span_begin": (_st, [c_session, _p_char, _enum, _enum, _P(c_span)]),
    "ct_measurement_begin": (_st, [c_session, _p_char, _P(c_span)]),
    "ct_span_end": (_st, [c_session, c_span]),
    "ct_record_completed_span": (_st, [c_session, _p_char, _enum, _u64, _u64, _P(c_span)]),
    "ct_now_ns": (_u64, [c_session]),
    "ct_tracer_begin": (_st, [c_session]),
    "ct_tracer_begin_earlier": (_st, [c_session, _u64]),
    "ct_tracer_begin_at": (_st, [c_session, _u64, _P(_u64)]),
    "ct_tracer_exclude_earlier": (_st, [c_session, _u64]),
    "ct_tracer_end": (_st, [c_session]),
    "ct_tracer_ns": (_u64, [c_session]),
    "ct_tracer_estimated_ns": (_u64, [c_session]),
    "ct_record_op": (_st, [c_session, c_span, _P(Op)]),
    "ct_record_tensor": (_st, [c_session, c_span, _P(Tensor)]),
    "ct_record_tensor_stats": (_st, [c_session, c_span, _P(TensorStats)]),
    "ct_record_tensor_stats_f32": (
        _st,
        [c_session, c_span, _p_char, _P(ctypes.c_float), _p_i64, ctypes.c_size_t],
    ),
    "ct_reduce_tensor_stats_f32": (
        _st, [_P(ctypes.c_float), _p_i64, ctypes.c_size_t, _P(TensorStats)]),
    "ct_record_scalar": (_st, [c_session, c_span, _p_char, ctypes.c_double]),
    "ct_record_memory": (_st, [c_session, c_span, _enum, _P(Memory)]),
    "ct_record_device_memory": (_st, [c_session, _P(DeviceMemory)]),
    "ct_record_device_interval": (_st, [c_session, c_span, _P(DeviceInterval)]),
    "ct_record_call_edge": (_st, [c_session, c_span, c_span, _u64]),
    "ct_record_data_edge": (_st, [c_session, _p_char, _p_char]),
    "ct_record_gradient": (
        _st,
        [c_session, _p_char, _p_char, _enum, _P(ctypes.c_double)],
    ),
    "ct_device_start": (_st, [c_session, _p_char]),
    "ct_device_stop": (_st, [c_session]),
    "ct_flush": (_st, [c_session]),
    "ct_aggregate_enable": (_st, [c_session, ctypes.c_int]),
    "ct_aggregate_trigger": (
        _st,
        [c_session, _u64, _p_char, ctypes.c_double, ctypes.c_double, _p_char, _p_char, _p_char],
    ),
    "ct_finish": (_st, [c_session]),
    "ct_finish_failed": (_st, [c_session, _p_char]),
    "ct_discard": (_st, [c_session]),
    "ct_reopen": (_st, [c_session, _p_char, _u64, _P(c_session)]),
    "ct_dropped_records": (_u64, [c_session]),
    "ct_last_error": (_p_char, []),
    "ct_version": (_p_char, []),
    "ct_abi_version": (ctypes.c_uint32, []),
    "ct_ambient_session": (c_session, []),
}


class LibraryNotFound(OSError):
    """No libcandle_trace.so where the binding looks for it."""


def candidate_paths() -> list[Path]:
    """Where the library is looked for, in order: $CANDLE_TRACE_LIB (an override), the
    copy bundled in this package (pip install bindings/python puts it there), the
    repository's build/ folder (a source checkout used through PYTHONPATH)."""
    env = os.environ.get("CANDLE_TRACE_LIB")
    if env:
        return [Path(env)]
    here = Path(__file__).resolve().parent
    paths = [here / LIBRARY_NAME]
    # <repo>/bindings/python/candle_trace/_lib.py -> <repo>/build/
    for parent in here.parents:
        if (parent / "include" / "candle_trace.h").exists():
            paths.append(parent / "build" / LIBRARY_NAME)
            break
    return paths


class Library:
    """The loaded library with every prototype declared.

    Three handles to the same shared object: ``c`` (ctypes.CDLL: releases the GIL
    during calls, for calls that enter Go and may take microseconds), ``py``
    (ctypes.PyDLL with the same prototypes: keeps the GIL) and ``raw`` (PyDLL without
    prototypes: the span fast path, whose calls cost tens of nanoseconds and never block
    on I/O, so converting arguments and releasing the GIL would cost more than the call).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.c = ctypes.CDLL(str(path))
        except OSError as e:
            raise LibraryNotFound(f"candle_trace: cannot load {path}: {e}") from e
        self.py = ctypes.PyDLL(str(path))
        for name, (restype, argtypes) in PROTOTYPES.items():
            for handle in (self.c, self.py):
                fn = getattr(handle, name)
                fn.restype = restype
                fn.argtypes = argtypes
        abi = self.c.ct_abi_version()
        if abi != CT_ABI_VERSION:
            raise ImportError(
                f"candle_trace: {path} implements C ABI version {abi}, but this binding "
                f"was written for version {CT_ABI_VERSION}; install matching versions "
                f"(library {self.version()})"
            )
        # The span fast path calls these without argtypes: ctypes then converts
        # nothing (the caller passes c_uint64 objects, bytes and small ints), which
        # halves the cost of a call. They keep the GIL (PyDLL).
        self.raw = ctypes.PyDLL(str(path))
        self.raw.ct_now_ns.restype = ctypes.c_uint64
        self.raw.ct_tracer_ns.restype = ctypes.c_uint64
        self.raw.ct_tracer_estimated_ns.restype = ctypes.c_uint64

    def last_error(self) -> str:
        msg = self.c.ct_last_error()
        return msg.decode("utf-8", "replace") if msg else ""

    def version(self) -> str:
        return self.c.ct_version().decode()


_LIB: Optional[Library] = None


def load() -> Library:
    """Loads the library once per process (the first call decides which file)."""
    global _LIB
    if _LIB is not None:
        return _LIB
    tried = []
    for path in candidate_paths():
        if path.exists():
            _LIB = Library(path)
            return _LIB
        tried.append(str(path))
    raise LibraryNotFound(
        "candle_trace: libcandle_trace.so not found; looked at "
        + ", ".join(tried)
        + ". Install the package from the repository (pip install bindings/python builds "
        "and bundles it), or in a checkout run make lib, or point CANDLE_TRACE_LIB at it."
    )
