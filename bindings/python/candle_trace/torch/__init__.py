"""candle_trace.torch: capture one update of a PyTorch training loop.

    import candle_trace.torch

    with candle_trace.torch.profile(model, optimizer, "trace.jsonl", capture_step=3) as prof:
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            prof.step()

Only the ``capture_step``-th update is captured (the one after ``capture_step - 1`` calls
of ``prof.step()``); every hook is installed when that update starts and removed when it
ends, so the other updates run untouched. The captured update holds:

- the measured region ``update``: from the model's forward to ``prof.step()``;
- module spans (kind module) in forward (step forward) and backward (step backward), the
  ``backward`` call (step backward) and the optimizer step (step optimizer);
- every aten op (name, output shape, dtype, device, duration, input/output tensor ids)
  with data edges from each input to the output. The mechanism is a C++
  ``at::RecordFunction`` observer (``_observer.cpp``, compiled against the installed torch
  on first use and cached; no Python runs per op), or, when it cannot be built (no C++
  compiler, ninja or torch headers: one warning), a Python ``TorchDispatchMode``.
  ``CANDLE_TRACE_TORCH_OPS=dispatch`` forces the dispatch mode, ``=observer`` makes an
  unavailable observer an error; ``profile.op_mechanism`` says which one ran;
- tensor statistics of the loss and of each module's output, reduced with torch on the
  tensor's own device;
- one gradient event per named parameter that requires grad, under an exact gradient
  contract (states present / zero / missing / non_finite with L2 norms);
- memory: allocation and free of op outputs' storages (CPU), and on CUDA device_memory
  samples of the caching allocator (reserved and allocated bytes).

Spans nest per thread: a backward module span is opened and closed on the thread that
runs its autograd hooks.

Both modes in one run: with ``aggregate_path``, a second session (``"mode": "aggregate"``,
a ``candle-trace/aggregate/1`` summary, docs/aggregate-format.md) stays open for the whole
loop and folds, for every update, cheap whole-run hooks into O(1)-memory statistics:

- ``<prefix>/forward`` (step forward): the model's ``forward`` (an instance wrapper);
- ``<prefix>/backward`` (step backward): ``torch.autograd.backward`` (``loss.backward()``);
- ``<prefix>/optimizer`` (step optimizer): ``optimizer.step``;
- ``<prefix>/step``: the update, from its first forward to ``prof.step()`` (the trace's
  measured region ``update`` spans the same), which encloses the phases (``candle-trace
  report SUMMARY`` leaves it out of the shares by default);
- ``<prefix>/data``: from ``prof.step()`` (or the profile's start) to the next update's
  forward -- the input pipeline, ``zero_grad`` and whatever else the loop does there;
- the scalar ``loss`` (the 1-element tensor given to backward, read after ``prof.step()``;
  on CUDA that read synchronizes once per update: ``aggregate_loss=False`` turns it off).

``<prefix>`` is ``aggregate_prefix`` (default ``train``). The captured update is counted
too (its phases carry the capture's cost: see their max). No per-module or per-op hook runs
outside the captured update. The summary is rewritten every ``aggregate_interval_ms``
(default 10 s) and at exit, also when the loop raised or the capture failed.
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from ..session import CandleTraceError, Session, gradient_contract
from . import _observer

__all__ = ["profile", "tensor_stats", "DTYPES"]

#: torch dtype -> the trace's dtype spelling.
DTYPES: Dict[torch.dtype, str] = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16",
    torch.bfloat16: "bf16", torch.int64: "i64", torch.int32: "i32", torch.int16: "i16",
    torch.int8: "i8", torch.uint8: "u8", torch.bool: "bool",
    torch.complex64: "c64", torch.complex128: "c128",
}

_warned: set = set()


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"candle_trace.torch: {msg}", RuntimeWarning, stacklevel=3)


try:  # torch >= 1.13
    from torch.utils._python_dispatch import TorchDispatchMode as _DispatchBase
except ImportError:  # pragma: no cover - older torch
    _DispatchBase = None  # type: ignore[assignment,misc]


def _dtype(t: torch.Tensor) -> str:
    return DTYPES.get(t.dtype) or str(t.dtype).replace("torch.", "")


def tensor_stats(t: torch.Tensor) -> Tuple[int, float, float, float]:
    """(non_finite, rms, abs_max, mean) of ``t`` over its finite elements, reduced with
    torch on the tensor's device; one small host copy (4 numbers)."""
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


def _first_tensor(out: Any) -> Optional[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (list, tuple)):
        for o in out:
            t = _first_tensor(o)
            if t is not None:
                return t
    if isinstance(out, Mapping):
        for o in out.values():
            t = _first_tensor(o)
            if t is not None:
                return t
    return None


def _tensors(args: Any) -> List[torch.Tensor]:
    out: List[torch.Tensor] = []
    stack = [args]
    while stack:
        a = stack.pop()
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            stack.extend(reversed(a))
        elif isinstance(a, Mapping):
            stack.extend(reversed(list(a.values())))
    return out


_MISSING = object()


def _restore(obj: Any, attr: str, prev: Any) -> None:
    """Puts back an instance attribute a wrapper replaced (removes it when there was none)."""
    if prev is _MISSING:
        obj.__dict__.pop(attr, None)
    else:
        obj.__dict__[attr] = prev


class _Thread(threading.local):
    """Per-thread span stack of the capture: (owner, span id), innermost last."""

    def __init__(self) -> None:
        self.stack: List[Tuple[str, int]] = []


if _DispatchBase is not None:

    class _OpCapture(_DispatchBase):  # type: ignore[misc,valid-type]
        """Records every aten op that runs while the capture is on."""

        def __init__(self, prof: "profile") -> None:
            super().__init__()
            self.prof = prof

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            prof = self.prof
            if kwargs is None:
                kwargs = {}
            if prof._suspended or not prof._capturing:
                return func(*args, **kwargs)
            now = prof._now
            hc = prof._hc
            t0 = now(hc)
            out = func(*args, **kwargs)
            t1 = now(hc)
            prof._on_op(func, args, kwargs, out, t0, t1)
            return out


class profile:
    """Captures the ``capture_step``-th update of a training loop into ``path``.

    Arguments: ``model`` (an nn.Module), ``optimizer`` (or None), ``path`` of the trace,
    ``capture_step`` (1-based). Keywords: ``name`` (the model's name in span names and the
    gradient root; default the class name), ``entrypoint`` (default ``<name>::train``),
    ``device`` (default the device of the first parameter), ``tags``, ``identity`` (the
    comparison_identity), ``ops`` (capture aten ops), ``memory`` (op output
    allocations), ``stats`` (tensor statistics), ``gradient_families`` (family ->
    (expectation, min_present); a parameter's family is its module's name), ``enabled``,
    ``device_collect`` (the device collectors run around the captured update: ``"auto"``,
    the default, is ``["cupti"]`` -- every kernel, memcpy and memset, on the span that
    launched it -- when the model is on CUDA, else none; or a list of ``"cupti"``,
    ``"nvml"``; or None. They start at the ``prof.step()`` before the captured update, so
    their start-up is not timed, and stop after it, once the device is synchronized. A
    collector that cannot start is a warning, not an error).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: Optional[torch.optim.Optimizer],
        path: str,
        capture_step: int = 3,
        *,
        name: Optional[str] = None,
        entrypoint: Optional[str] = None,
        device: Optional[str] = None,
        tags: Optional[Mapping[str, str]] = None,
        identity: Optional[Mapping[str, Any]] = None,
        ops: bool = True,
        memory: bool = True,
        stats: bool = True,
        gradient_families: Optional[Mapping[str, Tuple[str, int]]] = None,
        enabled: bool = True,
        aggregate_path: Optional[str] = None,
        aggregate_interval_ms: Optional[int] = None,
        aggregate_prefix: str = "train",
        aggregate_loss: bool = True,
        device_collect: Union[str, Sequence[str], None] = "auto",
    ) -> None:
        if not isinstance(capture_step, int) or capture_step < 1:
            raise CandleTraceError(1, f"candle_trace.torch.profile: capture_step must be an "
                                      f"integer >= 1, got {capture_step!r}")
        self.model = model
        self.optimizer = optimizer
        self.path = path
        self.capture_step = capture_step
        self.name = name or type(model).__name__
        self.entrypoint = entrypoint or f"{self.name}::train"
        if device is None:
            p = next(iter(model.parameters()), None)
            device = str(p.device) if p is not None else "cpu"
        self.device = device
        self.tags = dict(tags or {})
        self.identity = identity
        self.want_ops = ops
        self.want_memory = memory
        self.want_stats = stats
        self.gradient_families = gradient_families
        self.enabled = enabled
        if device_collect == "auto":
            device_collect = ["cupti"] if device.startswith("cuda") else []
        elif isinstance(device_collect, str):
            raise CandleTraceError(1, f"candle_trace.torch.profile: device_collect must be "
                                      f'"auto", a list of collectors or None, got {device_collect!r}')
        #: the device collectors asked for; ``collecting`` says which started
        self.device_collect: List[str] = list(device_collect or [])
        self.collecting: List[str] = []
        self.session: Optional[Session] = None
        self.steps = 0  #: prof.step() calls so far
        self.state = "idle"  # idle -> waiting -> armed -> capturing -> done
        self._capturing = False
        self._suspended = False
        self._tl = _Thread()
        self._handles: List[Any] = []
        self._undo: List[Callable[[], None]] = []
        self._mode: Any = None
        #: "observer" (C++ RecordFunction observer), "dispatch" (TorchDispatchMode) or
        #: "none"; decided when the profile is entered.
        self.op_mechanism = "none"
        self._obs: Optional[_observer.Observer] = None
        self._obs_on = False  # the observer records this capture
        self._set_span: Callable[[int], None] = lambda sid: None
        self._measured = 0
        self._grads_done = False
        self._ops: List[tuple] = []
        self._mem: List[tuple] = []
        self._edges: List[Tuple[str, str]] = []
        self._tids: Dict[int, Tuple[str, Any]] = {}
        self._next_tid = 0
        self._storages: Dict[Tuple[str, int], list] = {}  # live: [bytes, refs, tid, shape, dtype]
        self._external: set = set()
        self._lock = threading.Lock()
        self._params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._modules = {m: (n or self.name) for n, m in model.named_modules()}
        self._qual = {m: n for n, m in model.named_modules()}
        self.op_count = 0
        self.aggregate_path = None if aggregate_path is None else str(aggregate_path)
        self.aggregate_interval_ms = aggregate_interval_ms
        self.aggregate_prefix = aggregate_prefix
        self.aggregate_loss = aggregate_loss
        #: the aggregate session (``aggregate_path`` given and enabled), else None
        self.aggregate: Optional[Session] = None
        self._agg_undo: List[Callable[[], None]] = []
        self._agg_open: List[Any] = []
        self._agg_update: Any = None
        self._agg_loss_t: Optional[torch.Tensor] = None

    # -- schedule ---------------------------------------------------------------

    def _contract(self) -> dict:
        cuda = self.device.startswith("cuda")
        c: Dict[str, Any] = {
            "measurement_scope": "profiled_work",
            "operations": "complete" if self.op_mechanism != "none" else "none",
            "activations": "partial" if self.op_mechanism != "none" else "none",
            "tensors": "partial",
            "logical_memory": "partial" if self.want_memory and self.want_ops else "none",
            "physical_memory": "partial" if cuda else "none",
            "device_timing": "partial" if "cupti" in self.device_collect else "none",
        }
        if self._params:
            fam = lambda n: n.rsplit(".", 1)[0] if "." in n else self.name  # noqa: E731
            c["gradients"] = "complete"
            c["gradient_contract"] = gradient_contract(
                [(self.name, n, fam(n)) for n, _ in self._params], self.gradient_families)
        return c

    def _choose_mechanism(self) -> None:
        if not (self.enabled and self.want_ops):
            return
        obs = _observer.get()  # builds on first use; None (one warning) when unavailable
        if obs is not None:
            self._obs = obs
            self.op_mechanism = "observer"
            self._obs_named = obs.named(list(self.model.named_parameters()))
        elif _DispatchBase is not None:
            self.op_mechanism = "dispatch"
        else:
            _warn_once("dispatch", "this torch has no TorchDispatchMode and the C++ "
                                   "observer is unavailable; aten ops are not captured")

    def __enter__(self) -> "profile":
        self._choose_mechanism()
        self.session = Session(
            self.path, self.entrypoint, "train", self.capture_step, self.device,
            tags=self.tags, contract=self._contract(), identity=self.identity,
            enabled=self.enabled)
        self._hc = getattr(self.session, "_hc", None)
        if self.enabled:
            self._now = self.session._lib.raw.ct_now_ns
        if self.enabled and self.aggregate_path is not None:
            try:
                self._open_aggregate()
            except BaseException as e:
                try:
                    self.session.finish_failed(f"the aggregate session could not open: {e}")
                except CandleTraceError:
                    pass
                raise
        self.state = "waiting"
        if self.capture_step == 1:
            self._arm()
        return self

    def step(self) -> None:
        """Marks the end of one update of the training loop."""
        if self.state == "capturing" or self.state == "armed":
            self._end_capture()
        if self.aggregate is not None:
            self._agg_step()
        self.steps += 1
        if self.state == "waiting" and self.steps == self.capture_step - 1:
            self._arm()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        s = self.session
        if s is None:
            return False
        self._disarm()
        if not self.enabled:
            return False
        try:
            self._exit_trace(s, exc_type, exc)
        finally:
            self._close_aggregate(exc_type, exc)
        return False

    def _exit_trace(self, s: Session, exc_type: Any, exc: Any) -> bool:
        if exc_type is not None:
            reason = f"{exc_type.__name__}: {exc}" if str(exc) else exc_type.__name__
            try:
                s.finish_failed(reason)
            except CandleTraceError:
                pass
            return False
        if self.state == "done":
            s.finish()
        else:
            msg = (f"the training loop ended after {self.steps} updates, before capture "
                   f"step {self.capture_step} completed")
            s.finish_failed(msg)
            warnings.warn(f"candle_trace.torch: {msg}; {self.path} records a failed capture",
                          RuntimeWarning, stacklevel=2)
        return False

    # -- the aggregate session ---------------------------------------------------

    def _open_aggregate(self) -> None:
        run: Dict[str, Any] = {"mode": "aggregate"}
        if self.aggregate_interval_ms is not None:
            run["aggregate_interval_ms"] = int(self.aggregate_interval_ms)
        a = Session(self.aggregate_path, self.entrypoint, "train", self.capture_step,
                    self.device, tags=self.tags, run=run)
        self.aggregate = a
        p = self.aggregate_prefix
        fwd = a.span(f"{p}/forward", "module", "forward")
        bwd = a.span(f"{p}/backward", "function", "backward")
        opt_span = a.span(f"{p}/optimizer", "function", "optimizer")
        # The update span opens at the update's first forward (the trace's measured region
        # starts there too) and closes at prof.step(); the data span covers the rest, from
        # prof.step() (or the start) to the next forward. Both are plain begin/end spans of
        # this thread (ct_record_completed_span is not folded by aggregate sessions).
        self._agg_step_span = a.span(f"{p}/step")
        self._agg_data_span = a.span(f"{p}/data")
        self._agg_open: List[Any] = []  # the open update or data span (at most one)
        self._agg_open_data()

        model = self.model
        orig_forward = model.__dict__.get("forward", _MISSING)
        spanned_forward = fwd(model.forward)  # a Span per call, closed on exceptions too
        open_ = self._agg_open

        @functools.wraps(spanned_forward)
        def forward(*args: Any, **kw: Any) -> Any:
            if not open_ or open_[-1] is not None:  # data span open (or none): an update starts
                self._agg_begin_update()
            return spanned_forward(*args, **kw)

        model.forward = forward  # type: ignore[method-assign]
        self._agg_undo.append(lambda: _restore(model, "forward", orig_forward))

        orig_backward = torch.autograd.backward
        spanned_backward = bwd(orig_backward)
        want_loss = self.aggregate_loss

        @functools.wraps(orig_backward)
        def backward(tensors: Any, *args: Any, **kw: Any) -> Any:
            if want_loss and isinstance(tensors, torch.Tensor) and tensors.numel() == 1:
                self._agg_loss_t = tensors.detach()
            return spanned_backward(tensors, *args, **kw)

        torch.autograd.backward = backward  # Tensor.backward calls it too
        self._agg_undo.append(lambda: setattr(torch.autograd, "backward", orig_backward))

        o = self.optimizer
        if o is not None:
            orig_opt = o.__dict__.get("step", _MISSING)
            o.step = opt_span(o.step)  # type: ignore[method-assign]
            self._agg_undo.append(lambda: _restore(o, "step", orig_opt))

    def _agg_open_data(self) -> None:
        sp = self._agg_data_span
        data = type(sp)()
        data._sess, data._name, data._kind, data._step, data._measured = (
            sp._sess, sp._name, sp._kind, sp._step, False)
        data.__enter__()
        self._agg_open.append(data)  # a data span is not None: see forward()

    def _agg_begin_update(self) -> None:
        """Closes the data span (if open) and opens the update span."""
        open_ = self._agg_open
        if open_:
            open_.pop().__exit__(None, None, None)
        sp = self._agg_step_span
        upd = type(sp)()
        upd._sess, upd._name, upd._kind, upd._step, upd._measured = (
            sp._sess, sp._name, sp._kind, sp._step, False)
        upd.__enter__()
        open_.append(None)  # marks "update open"
        self._agg_update = upd

    def _agg_step(self) -> None:
        open_ = self._agg_open
        if not open_ or open_[-1] is not None:  # no forward in this update
            self._agg_begin_update()
        open_.pop()
        self._agg_update.__exit__(None, None, None)
        self._agg_update = None
        loss, self._agg_loss_t = self._agg_loss_t, None
        if loss is not None:
            self.aggregate.record_scalar(1, "loss", float(loss))  # type: ignore[union-attr]
        self._agg_open_data()

    def _close_aggregate(self, exc_type: Any, exc: Any) -> None:
        for u in reversed(self._agg_undo):
            u()
        self._agg_undo.clear()
        a, self.aggregate = self.aggregate, None
        if a is None or a.finished:
            return
        try:
            open_ = self._agg_open
            if open_:
                # The span after the last update (data, or an update without prof.step())
                # is no update: it ends with statistics off, so it is not counted.
                a.aggregate_enable(False)
                span = open_.pop()
                (span if span is not None else self._agg_update).__exit__(None, None, None)
        except CandleTraceError:
            pass
        if exc_type is None:
            a.finish()
        else:
            reason = f"{exc_type.__name__}: {exc}" if str(exc) else exc_type.__name__
            try:
                a.finish_failed(reason)
            except CandleTraceError:
                pass

    # -- arming ------------------------------------------------------------------

    def _arm(self) -> None:
        self.state = "armed"
        if not self.enabled:
            return
        self._start_collectors()
        for m in self._modules:
            self._handles.append(m.register_forward_pre_hook(self._fwd_pre))
            self._handles.append(m.register_forward_hook(self._fwd_post))
        opt = self.optimizer
        if opt is not None:
            if hasattr(opt, "register_step_pre_hook"):
                self._handles.append(opt.register_step_pre_hook(lambda o, a, k: self._opt_pre()))
                self._handles.append(opt.register_step_post_hook(lambda o, a, k: self._opt_post()))
            else:  # torch < 2.0: wrap the instance's step for the captured update only
                orig = opt.step

                @functools.wraps(orig)
                def step(*a: Any, **k: Any) -> Any:
                    self._opt_pre()
                    try:
                        return orig(*a, **k)
                    finally:
                        self._opt_post()

                prev = opt.__dict__.get("step", _MISSING)
                opt.step = step  # type: ignore[method-assign]
                self._undo.append(lambda: _restore(opt, "step", prev))
        orig_backward = torch.autograd.backward

        @functools.wraps(orig_backward)
        def backward(tensors: Any, *a: Any, **k: Any) -> Any:
            return self._backward(orig_backward, tensors, a, k)

        torch.autograd.backward = backward  # Tensor.backward calls it too
        self._undo.append(lambda: setattr(torch.autograd, "backward", orig_backward))
        if self.op_mechanism == "dispatch":
            self._enter_dispatch_mode()

    def _enter_dispatch_mode(self) -> None:
        self._mode = _OpCapture(self)
        self._mode.__enter__()

    def _stop_observer(self) -> None:
        if self._obs_on:
            self._set_span = lambda sid: None
            self._obs.stop()  # type: ignore[union-attr]

    def _disarm(self) -> None:
        self._capturing = False
        if self._obs_on:
            self._stop_observer()
            if self.state != "done":
                self._obs.discard()  # type: ignore[union-attr]
                self._obs_on = False
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for u in reversed(self._undo):
            u()
        self._undo.clear()
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)

    def _begin_capture(self) -> None:
        s = self.session
        assert s is not None
        self.state = "capturing"
        self._measured = s.begin_measurement("update")
        self._tl.stack.append(("update", self._measured))
        for n, p in self.model.named_parameters():
            self._tids[id(p)] = (n, None)
            self._external.add(self._storage_key(p))
            s.record_tensor(self._measured, n, dtype=_dtype(p), device=str(p.device),
                            shape=tuple(p.shape), label=n, requires_grad=p.requires_grad,
                            category="parameter")
        self._device_memory()
        if self.op_mechanism == "observer":
            self._begin_observer()
        self._capturing = True

    def _begin_observer(self) -> None:
        obs = self._obs
        assert obs is not None and self.session is not None
        try:
            memory = obs.begin(self.session.handle, self._measured, self.want_memory,
                               self._obs_named)
        except _observer.ObserverUnavailable as e:  # e.g. another capture holds it
            if _DispatchBase is None:
                raise
            _warn_once("observer-begin", f"{e}; this capture uses the dispatch mode")
            self.op_mechanism = "dispatch"
            self._enter_dispatch_mode()
            return
        self._obs_on = True
        self._set_span = obs.set_span
        obs.set_span(self._measured)
        if self.want_memory and not memory:
            _warn_once("observer-memory", "another profiler owns torch's memory reporting "
                                          "on this thread; op output memory is not captured")

    def _end_capture(self) -> None:
        s = self.session
        assert s is not None
        if self.state == "armed":  # no forward ran: an empty update
            self._begin_capture()
        if not self._grads_done:
            self._record_gradients()
        self._device_memory()
        self._capturing = False
        self._stop_observer()  # before any span closes: every record stays inside one
        self._close_until(self._tl, self._measured)
        self._stop_collectors()
        self.state = "done"
        self._disarm()
        self._emit()
        s.flush()

    # -- spans ---------------------------------------------------------------------

    def _push(self, owner: str, name: str, kind: str, step: Optional[str]) -> int:
        sid = self.session.begin_span(name, kind, step)  # type: ignore[union-attr]
        self._tl.stack.append((owner, sid))
        self._set_span(sid)
        return sid

    def _close_until(self, tl: _Thread, sid: int) -> None:
        """Closes this thread's spans down to and including ``sid`` (if it is open)."""
        stack = tl.stack
        if not any(s == sid for _, s in stack):
            return
        while stack:
            _, top = stack.pop()
            # The observer learns the new innermost span before the old one closes, so
            # an event between the two calls still lands in an open span.
            self._set_span(stack[-1][1] if stack else 0)
            self.session.end_span(top)  # type: ignore[union-attr]
            if top == sid:
                return

    def _current(self) -> int:
        st = self._tl.stack
        return st[-1][1] if st else 1

    def _fwd_pre(self, module: torch.nn.Module, args: Any) -> None:
        if self.state == "armed" and module is self.model:
            self._begin_capture()
        if not self._capturing:
            return
        self._push("f:" + self._modules[module], self._modules[module], "module", "forward")

    def _fwd_post(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if not self._capturing:
            return
        owner = "f:" + self._modules[module]
        stack = self._tl.stack
        idx = next((i for i in range(len(stack) - 1, -1, -1) if stack[i][0] == owner), None)
        if idx is None:
            return
        sid = stack[idx][1]
        t = _first_tensor(out)
        if t is not None and self.want_stats and (t.is_floating_point() or t.is_complex()):
            self._stats(sid, f"{self._modules[module]}/output", t)
        if t is not None and t.requires_grad and torch.is_grad_enabled():
            self._hook_backward(module, args, t)
        self._close_until(self._tl, sid)

    def _hook_backward(self, module: torch.nn.Module, args: Any, out: torch.Tensor) -> None:
        """Backward module span: opens when the gradient of the module's output arrives
        and closes when the gradients of its inputs are computed (or, for a module whose
        inputs need none, when another module's backward starts outside it or the
        backward call returns) -- always on the thread that runs the hook."""
        name = self._modules[module]
        owner = "b:" + name
        qual = self._qual[module]
        tl = self._tl

        def begin(grad: torch.Tensor) -> None:
            if not self._capturing:
                return
            # Close spans of this thread that do not contain this module.
            stack = tl.stack
            while stack and stack[-1][0].startswith("b:") and not self._contains(
                    stack[-1][0][2:], qual):
                _, top = stack.pop()
                self._set_span(stack[-1][1] if stack else 0)
                self.session.end_span(top)  # type: ignore[union-attr]
            self._push(owner, name, "module", "backward")

        def end(grad: torch.Tensor) -> None:
            if not self._capturing:
                return
            stack = tl.stack
            for i in range(len(stack) - 1, -1, -1):
                if stack[i][0] == owner:
                    self._close_until(tl, stack[i][1])
                    return

        self._tensor_hook(out, begin, True)
        for a in _tensors(args):
            if a.requires_grad:
                self._tensor_hook(a, end, False)

    @staticmethod
    def _tensor_hook(t: torch.Tensor, fn: Callable, begin: bool) -> None:
        """One autograd hook per tensor that runs, when its gradient arrives, the span
        ends of the modules that consumed it first, then the span begins of the modules
        that produced it, outermost first (an outer module's forward hook runs last)."""
        lists = getattr(t, "_candle_trace_hooks", None)
        if lists is None:
            ends: List[Callable] = []
            begins: List[Callable] = []
            lists = (ends, begins)

            def run(grad: torch.Tensor) -> None:
                for f in ends:
                    f(grad)
                for f in reversed(begins):
                    f(grad)

            t.register_hook(run)
            t._candle_trace_hooks = lists  # type: ignore[attr-defined]
        lists[1 if begin else 0].append(fn)

    def _contains(self, outer: str, qual: str) -> bool:
        """Whether module ``qual`` is (inside) the module named ``outer``."""
        if outer == self.name:
            return True
        oq = next((q for m, q in self._qual.items() if self._modules[m] == outer), None)
        return oq is not None and (qual == oq or qual.startswith(oq + "."))

    def _backward(self, orig: Callable, tensors: Any, a: tuple, k: dict) -> Any:
        if not self._capturing:
            return orig(tensors, *a, **k)
        sid = self._push("backward", "backward", "function", "backward")
        if isinstance(tensors, torch.Tensor) and self.want_stats and tensors.numel() == 1:
            self._stats(sid, "loss", tensors)
        try:
            return orig(tensors, *a, **k)
        finally:
            if self._capturing:
                self._close_until(self._tl, sid)
                self._device_memory()

    def _opt_pre(self) -> None:
        if not self._capturing:
            return
        if not self._grads_done:
            self._record_gradients()
        self._push("optimizer", f"{type(self.optimizer).__name__}.step", "function",
                   "optimizer")

    def _opt_post(self) -> None:
        if not self._capturing:
            return
        for i in range(len(self._tl.stack) - 1, -1, -1):
            if self._tl.stack[i][0] == "optimizer":
                self._close_until(self._tl, self._tl.stack[i][1])
                break

    # -- numbers -------------------------------------------------------------------

    def _suspend(self, on: bool) -> None:
        """Stats and gradient norms run torch ops that are not the model's."""
        self._suspended = on
        if self._obs_on:
            self._obs.suspend(1 if on else 0)  # type: ignore[union-attr]

    def _stats(self, sid: int, label: str, t: torch.Tensor) -> None:
        self._suspend(True)
        try:
            nf, rms, amax, mean = tensor_stats(t)
        finally:
            self._suspend(False)
        self.session.record_tensor_stats(  # type: ignore[union-attr]
            sid, label, dtype=_dtype(t), shape=tuple(t.shape), non_finite=nf, rms=rms,
            abs_max=amax, mean=mean)

    def _record_gradients(self) -> None:
        self._grads_done = True
        s = self.session
        assert s is not None
        self._suspend(True)
        try:
            with torch.no_grad():
                norms: List[Optional[float]] = []
                have = [(n, p.grad) for n, p in self._params if p.grad is not None]
                vals = {}
                if have:
                    # One host copy for all parameters: norms reduced on each device.
                    by_dev: Dict[Any, List[Tuple[str, torch.Tensor]]] = {}
                    for n, g in have:
                        by_dev.setdefault(g.device, []).append((n, g))
                    for dev, items in by_dev.items():
                        ns = torch.stack([torch.linalg.vector_norm(g.detach().double())
                                          for _, g in items]).tolist()
                        vals.update({n: v for (n, _), v in zip(items, ns)})
        finally:
            self._suspend(False)
        for n, _ in self._params:
            v = vals.get(n)
            if v is None:
                s.record_gradient(self.name, n, "missing")
            elif v != v or v in (float("inf"), float("-inf")):
                s.record_gradient(self.name, n, "non_finite")
            elif v == 0.0:
                s.record_gradient(self.name, n, "zero", 0.0)
            else:
                s.record_gradient(self.name, n, "present", v)
        del norms

    # -- device collectors ---------------------------------------------------------

    def _on_cuda(self) -> bool:
        """Whether the model's device is a CUDA device this process can use."""
        return self.device.startswith("cuda") and torch.cuda.is_available()

    def _sync(self) -> None:
        if self._on_cuda():
            torch.cuda.synchronize(torch.device(self.device))

    def _start_collectors(self) -> None:
        """Starts the asked-for collectors before the captured update (CUPTI's start-up
        takes tens of milliseconds). Work still running from the update before is waited
        for first: it would come out unattributed. Autograd launches backward kernels
        from its own thread: they go to the span the main thread is in."""
        want = list(self.device_collect)
        if not want:
            return
        s = self.session
        assert s is not None
        self._sync()
        while want:
            try:
                s.device_start({"collect": want, "unspanned_launches": "main_thread"})
                self.collecting = want
                return
            except CandleTraceError as e:
                # Without CUPTI (another profiler holds it, no libcupti) keep the rest.
                if "cupti" in want and len(want) > 1 and "CUPTI" in e.message:
                    _warn_once("collect-cupti", f"device collector cupti not started: {e.message}")
                    want = [c for c in want if c != "cupti"]
                    continue
                _warn_once("collect", f"device collectors {want} not started: {e.message}")
                return

    def _stop_collectors(self) -> None:
        if not self.collecting:
            return
        self._sync()  # every kernel of the update has ended: none comes out incomplete
        self.collecting = []
        self.session.device_stop()  # type: ignore[union-attr]

    def _device_memory(self) -> None:
        if not self._on_cuda():
            return
        dev = torch.device(self.device)
        self.session.record_device_memory(  # type: ignore[union-attr]
            self.device, used_bytes=torch.cuda.memory_allocated(dev),
            reserved_bytes=torch.cuda.memory_reserved(dev))

    # -- ops and memory ------------------------------------------------------------

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

    def _on_op(self, func: Any, args: Any, kwargs: Any, out: Any, t0: int, t1: int) -> None:
        span = self._current()
        ins = _tensors(args) + _tensors(kwargs)
        in_ids = [self._tid(t) for t in ins]
        in_bytes = sum(t.numel() * t.element_size() for t in ins)
        o = _first_tensor(out)
        name = func.__name__ if hasattr(func, "__name__") else str(func)
        name = str(getattr(func, "_schema", None).name if hasattr(func, "_schema") else name)
        if o is None:
            self._ops.append((span, name, "none", "cpu", (), in_ids, None, t0, t1, in_bytes))
            self.op_count += 1
            return
        new = id(o) not in self._tids
        oid = self._tid_new(o, span, name, t1) if new else self._tids[id(o)][0]
        self._ops.append((span, name, _dtype(o), str(o.device), tuple(o.shape), in_ids, oid,
                          t0, t1, in_bytes))
        for i in in_ids:
            if i != oid:
                self._edges.append((i, oid))
        self.op_count += 1

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
            live = [nbytes, 0, tid, tuple(o.shape), _dtype(o)]
            self._storages[sk] = live
            self._mem.append((t1, "alloc", span, sk, live[0], tid, tuple(o.shape), live[4],
                              op_name))
        if live is not None:
            live[1] += 1
        tids, storages, tl = self._tids, self._storages, self._tl

        def gone(_ref: Any, key: int = key, sk: Any = sk) -> None:
            tids.pop(key, None)
            lv = storages.get(sk)
            if lv is None:
                return
            lv[1] -= 1
            if lv[1] <= 0:
                del storages[sk]
                if self._capturing:
                    st = tl.stack
                    sid = st[-1][1] if st else 1
                    self._mem.append((self._now(self._hc), "free", sid, sk, lv[0], lv[2],
                                      lv[3], lv[4], None))

        try:
            ref = weakref.ref(o, gone)
        except TypeError:
            ref = None
        self._tids[key] = (tid, ref)
        return tid

    def _emit(self) -> None:
        """Writes what the captured update buffered (after its measured region)."""
        s = self.session
        assert s is not None
        if self._obs_on:
            obs = self._obs
            assert obs is not None
            self._obs_on = False
            self.op_count = obs.counts()[0]
            refused, msg = obs.emit()
            if refused:
                _warn_once("observer-refused", f"the library refused {refused} op/memory "
                                               f"records of the capture; the first: {msg}")
            return
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
