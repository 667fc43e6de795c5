"""Tensor statistics of the captured update (non-finite count, rms, abs max, mean).

A non-empty float32 tensor on the CPU is reduced by the library itself, straight from
the tensor's memory (``ct_record_tensor_stats_f32``): one call, no temporary of the
tensor's size beyond a contiguous copy when it is not contiguous, and float64
accumulation in the library. Everything else (CUDA tensors, float64, complex) is
reduced with torch on the tensor's own device into five numbers and one host copy.
"""

from __future__ import annotations

import ctypes
from typing import Tuple

import torch

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
    """Records a tensor's statistics into a session, by the cheapest exact path."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._raw = session._lib.raw.ct_record_tensor_stats_f32
        self._hc = session._hc
        self._labels: dict = {}

    def _label(self, label: str) -> bytes:
        b = self._labels.get(label)
        if b is None:
            b = self._labels[label] = label.encode()
        return b

    def record(self, span: int, label: str, t: torch.Tensor) -> None:
        x = t.detach()
        if x.dtype == torch.float32 and x.device.type == "cpu" and x.layout == torch.strided \
                and x.numel():
            self._record_host_f32(span, label, x)
            return
        nf, rms, amax, mean = tensor_stats(x)
        self._session.record_tensor_stats(span, label, dtype=dtype_name(t), shape=tuple(t.shape),
                                          non_finite=nf, rms=rms, abs_max=amax, mean=mean)

    def _record_host_f32(self, span: int, label: str, x: torch.Tensor) -> None:
        x = x.contiguous()
        shape = x.shape
        dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        # The tensor stays referenced (x) for the call: the library reads numel floats
        # from its data pointer, which matches the shape by construction.
        st = self._raw(self._hc, ctypes.c_uint64(span), self._label(label),
                       ctypes.c_void_p(x.data_ptr()), dims,
                       ctypes.c_size_t(len(shape)))
        if st:
            self._session._call(st)
