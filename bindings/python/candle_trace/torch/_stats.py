"""Tensor statistics of the captured update (non-finite count, rms, abs max, mean).

A non-empty float32 tensor on the CPU is reduced by the library itself, straight from
the tensor's memory (``ct_reduce_tensor_stats_f32``: one pass at memory bandwidth, C
alone, no session); everything else (CUDA tensors, float64, complex) is reduced with
torch on the tensor's own device into five numbers and one host copy. Either way the
reduction runs where the values are, inside the update; the numbers are recorded
(``ct_record_tensor_stats``, which enters the library's Go runtime and encodes the
record, tens of microseconds a call) by :meth:`StatsRecorder.flush` once the update is
over, as the observer's ops are.

Where the op observer's library is loaded, the numbers are kept in C++ (its
``stats_buffer``, ``_stats_buffer.cpp``), and a float32 tensor is reduced there without
Python: from the module spans' C++ wrappers directly, from :meth:`StatsRecorder.record`
(the loss) in one C call -- the ctypes path costs ~31k instructions a call, a few times
the reduction of a module output of a small model.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Dict, List, Optional, Tuple

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


#: labels and dtypes encoded (and checked) once per process: a capture's recorder is new,
#: its labels are not
_TEXT: Dict[str, bytes] = {}

#: rank -> the ctypes array type of a shape, kept for the process: ``c_int64 * n`` makes
#: a new type (~67k instructions) whenever the last one was collected -- in every capture
#: (its arrays die when it is written), inside the update.
_DIMS: Dict[int, Any] = {}
_WARM_RANKS = 7  # the types made ahead, at a recorder's construction

#: ct_reduce_tensor_stats_f32 with its argument types: plain ints and the struct pass as
#: they are, no ctypes object made per call.
_REDUCE_F32 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64),
                               ctypes.c_size_t, ctypes.POINTER(_TensorStats))


def _dims(shape: Tuple[int, ...]) -> Any:
    n = len(shape)
    t = _DIMS.get(n)
    if t is None:
        t = _DIMS[n] = ctypes.c_int64 * max(n, 1)
    return t(*shape)


class StatsRecorder:
    """Reduces tensors' statistics by the cheapest exact path and keeps each as the
    ``ct_tensor_stats`` struct the library records, until :meth:`flush` records them
    into the session (or :meth:`drop` forgets them).

    ``suspend(on)`` pauses the capture's op recording around the torch ops a reduction
    runs (torch's own reduction, a non-contiguous tensor's copy), which are not the
    model's; the library's float32 pass runs none, and pausing costs two rebuilds of
    torch's record-function cache, so it is not paused for."""

    def __init__(self, session: Session,
                 suspend: Optional[Callable[[bool], None]] = None, native: Any = None) -> None:
        self._session = session
        #: the statistics kept in C++, in record order, where ``native`` (an
        #: ``Observer.native``) is given: the module spans' C++ wrappers add to it
        self.buffer: Any = native.stats_buffer() if native is not None else None
        raw = session._lib.raw
        self._reduce = _REDUCE_F32(ctypes.cast(raw.ct_reduce_tensor_stats_f32,
                                               ctypes.c_void_p).value)
        self._record = raw.ct_record_tensor_stats
        self._suspend = suspend or (lambda on: None)
        self._size = ctypes.sizeof(_TensorStats)
        self._text = _TEXT
        #: (span, the struct, its shape array), in record order
        self._pending: List[Tuple[int, _TensorStats, Any]] = []
        # What a first call makes (the shape array types of the usual ranks, ctypes'
        # and torch's lazily built state) is made here, before any update.
        for rank in range(_WARM_RANKS):
            _dims((1,) * rank)
        self._reduced("", torch.zeros(1))

    def _bytes(self, text: str, arg: str) -> bytes:
        b = self._text.get(text)
        if b is None:
            b = self._text[text] = _args.text(text, "StatsRecorder.record", arg)
        return b

    def record(self, span: int, label: str, t: torch.Tensor) -> None:
        """Reduces ``t``'s statistics now, for ``span``; recorded by :meth:`flush`."""
        buf = self.buffer
        if buf is None:
            st, dims = self._reduced(label, t)
            self._pending.append((span, st, dims))
        elif not buf.reduce(span, self._bytes(label, "label"), t):
            st, dims = self._reduced(label, t)
            buf.add(span, ctypes.addressof(st))  # copied, with its label, dtype and shape

    def _reduced(self, label: str, t: torch.Tensor) -> Tuple[_TensorStats, Any]:
        """The filled struct of ``t``'s statistics and the shape array it points to."""
        shape = t.shape
        rank = len(shape)
        dims = _dims(shape)
        st = _TensorStats()
        st.size, st.label, st.shape, st.rank = self._size, self._bytes(label, "label"), dims, rank
        if t.dtype is torch.float32 and t.is_cpu and t.layout is torch.strided and t.numel():
            x = t
            if not t.is_contiguous():
                self._suspend(True)
                try:
                    x = t.contiguous()
                finally:
                    self._suspend(False)
            # The tensor stays referenced (x) for the call: the library reads numel floats
            # from its data pointer, which matches the shape by construction.
            rc = self._reduce(x.data_ptr(), dims, rank, st)
            if rc:
                self._session._call(rc)
        else:
            self._suspend(True)
            try:
                nf, rms, amax, mean = tensor_stats(t)
            finally:
                self._suspend(False)
            st.dtype = self._bytes(dtype_name(t), "dtype")
            st.elements = t.numel()
            st.non_finite, st.rms, st.abs_max, st.mean = nf, rms, amax, mean
        return st, dims

    def flush(self) -> None:
        """Records what was reduced (after the update: tracer work outside it)."""
        pending, self._pending = self._pending, []
        rec, hc, call = self._record, self._session._hc, self._session._call
        for span, st, _ in pending:
            rc = rec(hc, ctypes.c_uint64(span), ctypes.byref(st))
            if rc:
                call(rc)
        if self.buffer is not None:
            call(self.buffer.flush(self._session.handle))

    def drop(self) -> None:
        """Forgets what was reduced (an update the flight recorder does not keep)."""
        self._pending = []
        if self.buffer is not None:
            self.buffer.drop()
