"""The aten ops (and their output storages) of the captured update.

Two mechanisms behind one small interface (:class:`OpSource`):

- :class:`ObserverOps`, the C++ ``at::RecordFunction`` observer (``_observer.cpp``):
  no Python per op; it brackets its own per-op work as tracer time;
- :class:`DispatchOps`, a Python ``TorchDispatchMode``, where the observer cannot be
  built (tens of microseconds per op, also bracketed).

Both buffer during the update and write after it, or at a failure: a failed capture
keeps the ops and memory it saw up to the failure.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..session import Session
from . import _observer
from ._common import dtype_name, first_tensor, tensors, warn_once
from ._spans import Spans

try:  # torch >= 1.13
    from torch.utils._python_dispatch import TorchDispatchMode as _DispatchBase
except ImportError:  # pragma: no cover - older torch
    _DispatchBase = None  # type: ignore[assignment,misc]

__all__ = ["OpSource", "ObserverOps", "DispatchOps", "choose"]


def _nothing() -> None:
    pass


def _once(fn: Callable[[], None]) -> Callable[[], None]:
    """``fn``, run by the first call only."""
    left = [fn]

    def run() -> None:
        if left:
            left.pop()()

    return run


class OpSource:
    """What the capture needs of an op mechanism."""

    mechanism = "none"
    #: ops recorded so far (set by :meth:`emit`)
    count = 0

    def prepare(self, session: Session) -> None:
        """Before the update (when the capture arms): whatever is measured ahead."""

    def rehearse(self, session: Session) -> None:
        """Records the update before the captured one into ``session``, to be dropped
        (:meth:`end_rehearsal`): the mechanism's path through torch runs warm in the
        captured update instead of cold after updates that ran without it."""

    def end_rehearsal(self) -> None:
        """Drops what :meth:`rehearse` recorded (idempotent)."""

    def begin(self, session: Session, spans: Spans, measured: int,
              params: Sequence[Tuple[str, torch.Tensor]]) -> None:
        """Starts recording into ``session`` (the measured region is open)."""

    def suspend(self, on: bool) -> None:
        """Suspends recording on this thread (the tracer's own torch ops)."""

    def quiet(self) -> Callable[[], None]:
        """Suspends recording on this thread until the returned function is called
        (once; later calls do nothing), whatever happens to the capture meanwhile:
        torch.compile's compilation (_compile), which may outlive it."""
        return _nothing

    def stop(self) -> None:
        """Stops recording (before the spans close: every record stays inside one)."""

    def emit(self) -> None:
        """Writes what was recorded (after the update, or at its failure)."""

    def discard(self) -> None:
        """Drops what was recorded (a flight recorder's update that was not kept)."""


class ObserverOps(OpSource):
    mechanism = "observer"

    def __init__(self, obs: "_observer.Observer", want_memory: bool,
                 named: Any) -> None:
        self._obs = obs
        self._want_memory = want_memory
        self._named = named
        self._on = False
        self._rehearsing = False
        #: the module spans in C++ of the same library (_spans.NativeSpans)
        self.native = obs.native

    def prepare(self, session: Session) -> None:
        self._obs.calibrate(session)

    def rehearse(self, session: Session) -> None:
        # Measured (bench_observer_warmth.py, torch 1.13): an observed 64-64-10 MLP update
        # after five without the observer costs 1.5 us per record function, one after a
        # single unobserved update 0.75 us; the calibration is of the warm path.
        if not self._on and not self._rehearsing:
            self._obs.begin(session.handle, 1, self._want_memory, self._named)
            self._rehearsing = True

    def end_rehearsal(self) -> None:
        if self._rehearsing:
            self._rehearsing = False
            try:
                self._obs.stop()
            finally:
                self._obs.discard()

    def begin(self, session: Session, spans: Spans, measured: int,
              params: Sequence[Tuple[str, torch.Tensor]]) -> None:
        memory = self._obs.begin(session.handle, measured, self._want_memory, self._named)
        self._on = True
        # Each thread's span is 0 once the observer begins, which is the measured region
        # (no ct_obs_set_span for it): its innermost span from now on.
        spans.publish_to(self._obs)
        self._spans = spans
        if self._want_memory and not memory:
            warn_once("observer-memory", "another profiler owns torch's memory reporting "
                                         "on this thread; op output memory is not captured")

    def suspend(self, on: bool) -> None:
        if self._on:
            self._obs.suspend(1 if on else 0)

    def quiet(self) -> Callable[[], None]:
        if not self._on:
            return _nothing
        suspend = self._obs.suspend
        suspend(1)
        return _once(lambda: suspend(0))

    def stop(self) -> None:
        if self._on:
            self._spans.publish_to(None)
            self._obs.stop()

    def discard(self) -> None:
        if self._on:
            self._on = False
            self._obs.discard()

    def emit(self) -> None:
        if not self._on:
            return
        self._on = False
        self.count = self._obs.counts()[0]
        refused, msg = self._obs.emit()
        if refused:
            warn_once("observer-refused", f"the library refused {refused} op/memory "
                                          f"records of the capture; the first: {msg}")


if _DispatchBase is not None:

    class _Mode(_DispatchBase):  # type: ignore[misc,valid-type]
        """Records every aten op that runs while the capture is on."""

        def __init__(self, ops: "DispatchOps") -> None:
            super().__init__()
            self.ops = ops

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            ops = self.ops
            if kwargs is None:
                kwargs = {}
            if ops.suspended or not ops.on:
                return func(*args, **kwargs)
            pause, resume, now, hc = ops.pause, ops.resume, ops.now, ops.hc
            pause()
            t0 = now(hc)
            resume()
            out = func(*args, **kwargs)
            pause()
            try:
                ops.on_op(func, args, kwargs, out, t0, now(hc))
            finally:
                resume()
            return out


class DispatchOps(OpSource):
    """The Python fallback: buffers (span, op, shapes, tensor ids, storages) per op."""

    mechanism = "dispatch"

    def __init__(self, want_memory: bool) -> None:
        self.want_memory = want_memory
        self.on = False
        self.suspended = 0  # nested suspensions (stats inside a compilation's quiet)
        self._ops: List[tuple] = []
        self._mem: List[tuple] = []
        self._edges: List[Tuple[str, str]] = []
        self._tids: Dict[int, Tuple[str, Any]] = {}
        self._next_tid = 0
        self._storages: Dict[Tuple[str, int], list] = {}  # live: [bytes, refs, tid, shape, dtype]
        self._external: set = set()
        self._mode: Any = None

    def begin(self, session: Session, spans: Spans, measured: int,
              params: Sequence[Tuple[str, torch.Tensor]]) -> None:
        self._session, self._spans = session, spans
        self.pause, self.resume = spans.pause, spans.resume
        self.now, self.hc = session._lib.raw.ct_now_ns, session._hc
        for n, p in params:
            self._tids[id(p)] = (n, None)
            self._external.add(self._storage_key(p))
        self._mode = _Mode(self)
        self._mode.__enter__()
        self.on = True

    def suspend(self, on: bool) -> None:
        self.suspended = max(0, self.suspended + (1 if on else -1))

    def quiet(self) -> Callable[[], None]:
        self.suspend(True)
        return _once(lambda: self.suspend(False))

    def stop(self) -> None:
        self.on = False
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)

    @staticmethod
    def _storage_key(t: torch.Tensor) -> Tuple[str, int]:
        return (str(t.device), t.data_ptr() - t.storage_offset() * t.element_size())

    def _tid(self, t: torch.Tensor) -> str:
        e = self._tids.get(id(t))
        if e is not None:
            return e[0]
        self._next_tid += 1
        tid = f"t{self._next_tid}"
        key = id(t)
        tids = self._tids

        def gone(_ref: Any, key: int = key) -> None:
            tids.pop(key, None)

        try:
            ref = weakref.ref(t, gone)
        except TypeError:
            ref = None
        tids[key] = (tid, ref)
        if t.device.type != "meta":
            k = self._storage_key(t)
            if k not in self._storages:
                self._external.add(k)
        return tid

    def on_op(self, func: Any, args: Any, kwargs: Any, out: Any, t0: int, t1: int) -> None:
        span = self._spans.current()
        ins = tensors(args) + tensors(kwargs)
        in_ids = [self._tid(t) for t in ins]
        in_bytes = sum(t.numel() * t.element_size() for t in ins)
        o = first_tensor(out)
        name = str(func._schema.name) if hasattr(func, "_schema") else getattr(
            func, "__name__", str(func))
        self.count += 1
        if o is None:
            self._ops.append((span, name, "none", "cpu", (), in_ids, None, t0, t1, in_bytes))
            return
        new = id(o) not in self._tids
        oid = self._tid_new(o, span, name, t1) if new else self._tids[id(o)][0]
        self._ops.append((span, name, dtype_name(o), str(o.device), tuple(o.shape), in_ids, oid,
                          t0, t1, in_bytes))
        for i in in_ids:
            if i != oid:
                self._edges.append((i, oid))

    def _tid_new(self, o: torch.Tensor, span: int, op_name: str, t1: int) -> str:
        """Id of an op's new output; its storage's allocation when the storage is new."""
        self._next_tid += 1
        tid = f"t{self._next_tid}"
        key = id(o)
        if not (self.want_memory and o.device.type == "cpu"):
            ref = None
            try:
                ref = weakref.ref(o, lambda _r, key=key: self._tids.pop(key, None))
            except TypeError:
                pass
            self._tids[key] = (tid, ref)
            return tid
        sk = self._storage_key(o)
        live = self._storages.get(sk)
        if live is None and sk not in self._external:
            try:
                nbytes = o.untyped_storage().nbytes() if hasattr(o, "untyped_storage") \
                    else o.storage().nbytes()
            except Exception:  # noqa: BLE001 - sparse and other storage-less tensors
                nbytes = o.numel() * o.element_size()
            live = [nbytes, 0, tid, tuple(o.shape), dtype_name(o)]
            self._storages[sk] = live
            self._mem.append((t1, "alloc", span, sk, live[0], tid, tuple(o.shape), live[4],
                              op_name))
        if live is not None:
            live[1] += 1
        tids, storages, spans = self._tids, self._storages, self._spans

        def gone(_ref: Any, key: int = key, sk: Any = sk) -> None:
            tids.pop(key, None)
            lv = storages.get(sk)
            if lv is None:
                return
            lv[1] -= 1
            if lv[1] <= 0:
                del storages[sk]
                if self.on:
                    self._mem.append((self.now(self.hc), "free", spans.current(), sk, lv[0],
                                      lv[2], lv[3], lv[4], None))

        try:
            ref = weakref.ref(o, gone)
        except TypeError:
            ref = None
        self._tids[key] = (tid, ref)
        return tid

    def discard(self) -> None:
        self._ops.clear()
        self._mem.clear()
        self._edges.clear()
        self._tids.clear()

    def emit(self) -> None:
        s = self._session
        for (span, name, dtype, device, shape, ins, out, t0, t1, in_bytes) in self._ops:
            s.record_op(span, name, dtype=dtype, device=device, shape=shape, inputs=ins,
                        output=out, duration_ns=max(t1 - t0, 0), timestamp_ns=t0,
                        input_dense_bytes=in_bytes)
        for (ts, action, span, sk, nbytes, tid, shape, dtype, op) in sorted(
                self._mem, key=lambda e: e[0]):
            s.record_memory(span, action, storage_id=f"{sk[0]}-{sk[1]:x}", tensor_id=tid,
                            device=sk[0], dtype=dtype, bytes=nbytes, shape=shape,
                            op_name=op, category="activation", timestamp_ns=ts)
        seen = set()
        for e in self._edges:
            if e not in seen:
                seen.add(e)
                s.record_data_edge(*e)
        self._ops.clear()
        self._mem.clear()
        self._edges.clear()
        self._tids.clear()


def choose(params: Sequence[Tuple[str, torch.Tensor]], want_ops: bool,
           want_memory: bool) -> Optional[OpSource]:
    """The op mechanism of a capture: the observer (built on first use), else the dispatch
    mode (one warning), else None (no ops: one warning)."""
    if not want_ops:
        return None
    obs = _observer.get()  # builds on first use; None (one warning) when unavailable
    if obs is not None:
        return ObserverOps(obs, want_memory, obs.named(list(params)))
    if _DispatchBase is not None:
        return DispatchOps(want_memory)
    warn_once("dispatch", "this torch has no TorchDispatchMode and the C++ "
                          "observer is unavailable; aten ops are not captured")
    return None


def fallback_to_dispatch(e: Exception, want_memory: bool) -> Optional[OpSource]:
    """Where the observer cannot begin (another capture holds it): the dispatch mode."""
    if _DispatchBase is None:
        return None
    warn_once("observer-begin", f"{e}; this capture uses the dispatch mode")
    return DispatchOps(want_memory)
