"""Tensor statistics of the captured update (non-finite count, rms, abs max, mean).

A non-empty float32 tensor on the CPU is reduced by the library itself, straight from
the tensor's memory (``ct_reduce_tensor_stats_f32``: one pass at memory bandwidth, C
alone, no session); everything else (CUDA tensors, float64, complex) is reduced with
torch on the tensor's own device into five numbers and one host copy. Either way the
reduction runs where the values are, inside the update; the numbers are recorded
(``ct_record_tensor_stats``, which enters the library's Go runtime and encodes the
record, tens of microseconds a call) by :meth:`StatsRecorder.flush` once the update is
over, as the observer's ops are.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Tuple

import torch

from .._lib import TensorStats as _TensorStats
from .. import _args
from ..session import Session
from ._common import dtype_name

__all__ = ["tensor_stats", "StatsRecorder"]

def tensor_stats(t: torch.Tensor) -> Tuple[int, float, float, float]:
    """(non_finite, rms, abs_max, mean) of ``t`` over its finite elements, reduced with
    torch on the tensor's device; one small host copy (5 numbers)."""
    with torch.no_grad():
        x = t.detach()
        if not x.is_floating_point():
            x = x.double()
        finite = torch.isfinite(x)
        n_finite = finite.sum()
        xf = torch.where(finite, x, torch.zeros((), dtype=x.dtype, device=x.device)).double()
        packed = torch.stack([
            (x.numel() - n_finite).double(),
            n_finite.double(),
            (xf * xf).sum(),
            xf.abs().amax() if x.numel() else torch.zeros((), dtype=torch.float64,
                                                         device=x.device),
            xf.sum(),
        ]).tolist()
    non_finite, nf, sumsq, absmax, total = packed
    if nf == 0:
        return int(non_finite), 0.0, 0.0, 0.0
    rms = (sumsq / nf) ** 0.5
    mean = total / nf
    ok = all(v == v and abs(v) != float("inf") for v in (rms, absmax, mean))
    if not ok:  # overflow in the reduction: the contract wants finite numbers
        return int(non_finite), 0.0, 0.0, 0.0
    return int(non_finite), rms, absmax, mean


class StatsRecorder:
    """Reduces tensors' statistics by the cheapest exact path and keeps each as the
    ``ct_tensor_stats`` struct the library records, until :meth:`flush` records them
    into the session (or :meth:`drop` forgets them)."""

    def __init__(self, session: Session) -> None:
        self._session = session
        raw = session._lib.raw
        self._reduce = raw.ct_reduce_tensor_stats_f32
        self._record = raw.ct_record_tensor_stats
        self._text: Dict[str, bytes] = {}  # labels and dtypes, encoded once
        #: (span, the struct, its shape array), in record order
        self._pending: List[Tuple[int, _TensorStats, Any]] = []

    def _bytes(self, text: str, arg: str) -> bytes:
        b = self._text.get(text)
        if b is None:
            b = self._text[text] = _args.text(text, "StatsRecorder.record", arg)
        return b

    def record(self, span: int, label: str, t: torch.Tensor) -> None:
        shape = tuple(t.shape)
        rank = len(shape)
        dims = (ctypes.c_int64 * max(rank, 1))(*shape)
        st = _TensorStats(size=ctypes.sizeof(_TensorStats), label=self._bytes(label, "label"),
                          shape=dims, rank=rank)
        if t.dtype is torch.float32 and t.is_cpu and t.layout is torch.strided and t.numel():
            x = t if t.is_contiguous() else t.contiguous()
            # The tensor stays referenced (x) for the call: the library reads numel floats
            # from its data pointer, which matches the shape by construction.
            rc = self._reduce(ctypes.c_void_p(x.data_ptr()), dims, ctypes.c_size_t(rank),
                              ctypes.byref(st))
            if rc:
                self._session._call(rc)
        else:
            nf, rms, amax, mean = tensor_stats(t)
            st.dtype = self._bytes(dtype_name(t), "dtype")
            st.elements = t.numel()
            st.non_finite, st.rms, st.abs_max, st.mean = nf, rms, amax, mean
        self._pending.append((span, st, dims))

    def flush(self) -> None:
        """Records what was reduced (after the update: tracer work outside it)."""
        pending, self._pending = self._pending, []
        rec, hc, call = self._record, self._session._hc, self._session._call
        for span, st, _ in pending:
            rc = rec(hc, ctypes.c_uint64(span), ctypes.byref(st))
            if rc:
                call(rc)

    def drop(self) -> None:
        """Forgets what was reduced (an update the flight recorder does not keep)."""
        self._pending = []
