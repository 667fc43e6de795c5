"""Whole-run statistics beside the capture: an aggregate session (``"mode":
"aggregate"``) that folds every update's phases into O(1)-memory statistics through
three cheap wrappers (the model's forward, ``torch.autograd.backward``, the optimizer's
step) and the profile's ``step()`` -- and torch.compile's compilations (``<prefix>/compile``,
from dynamo's callbacks: how often the run compiled, and how long that took)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from ..session import CandleTraceError, Session
from ._amp import ScaledLosses, unscaled
from ._common import exception_reason, patch, restore
from ._compile import Compilations

__all__ = ["WholeRun"]


class WholeRun:
    """The aggregate session of one profile, open from its start to its end."""

    def __init__(self, path: str, entrypoint: str, phase: str, capture_step: int, device: str,
                 tags: Dict[str, str], interval_ms: Optional[int], prefix: str,
                 want_loss: bool) -> None:
        run: Dict[str, Any] = {"mode": "aggregate"}
        if interval_ms is not None:
            run["aggregate_interval_ms"] = int(interval_ms)
        self.session = a = Session(path, entrypoint, phase, capture_step, device, tags=tags,
                                   run=run)
        self._undo: List[Callable[[], None]] = []
        #: set by close(): a wrapper left in place under one installed after it (see
        #: _common.restore) calls straight through from then on
        self._closed = False
        self._want_loss = want_loss
        self._loss: Optional[torch.Tensor] = None
        self._fwd = a.span(f"{prefix}/forward", "module", "forward")
        self._bwd = a.span(f"{prefix}/backward", "function", "backward")
        self._opt = a.span(f"{prefix}/optimizer", "function", "optimizer")
        # The update span opens at the update's first forward (the trace's measured region
        # starts there too) and closes at step(); the data span covers the rest, from
        # step() (or the start) to the next forward. Both are plain begin/end spans of this
        # thread (ct_record_completed_span is not folded by aggregate sessions).
        self._step_span = a.span(f"{prefix}/step")
        self._data_span = a.span(f"{prefix}/data")
        self._compile_span = a.span(f"{prefix}/compile")
        self._open: List[Any] = []  # the open update (None) or data span (at most one)
        self._compiles = Compilations(self._compile_begin, self._compile_end)
        self._update: Any = None
        #: the modules whose forwards open the update (install); their submodules' too
        #: once an update went by without any of theirs (_begin_at_submodules)
        self._roots: List[torch.nn.Module] = []
        self._submodules_begin = False
        self._open_data()

    def install(self, modules: Sequence[torch.nn.Module],
                optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """Wraps the modules' forwards (an update starts at the first call of any),
        backward and each optimizer's step. A model of tensors alone (no ``modules``)
        has no forward: its updates start at their backward."""
        for m in modules:
            self._install_forward(m)
        self._roots = list(modules)

        orig_backward = torch.autograd.backward
        spanned_backward = self._bwd(orig_backward)
        want_loss = self._want_loss
        begins = not modules

        @functools.wraps(orig_backward)
        def backward(tensors: Any, *args: Any, **kw: Any) -> Any:
            if self._closed:
                return orig_backward(tensors, *args, **kw)
            if want_loss and isinstance(tensors, torch.Tensor) and tensors.numel() == 1:
                self._loss = unscaled(tensors).detach()  # not GradScaler's product
            if begins:
                self._begin_update_unless_open()
            return spanned_backward(tensors, *args, **kw)

        # Tensor.backward calls it too
        prev_backward = patch(torch.autograd, "backward", backward)
        self._undo.append(lambda: restore(torch.autograd, "backward", prev_backward))
        if want_loss:
            ScaledLosses.install()
            self._undo.append(ScaledLosses.remove)

        for opt in optimizers:
            self._install_step(opt)

        self._compiles.install()
        self._undo.append(self._compiles.remove)

    def _compile_begin(self, name: str) -> Any:
        if self._closed:
            return None
        span = self._span(self._compile_span)
        span.__enter__()
        return span

    def _compile_end(self, span: Any) -> None:
        span.__exit__(None, None, None)

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer made after install (a new epoch's): its steps are counted too."""
        if not self._closed:
            self._install_step(optimizer)

    def _install_step(self, optimizer: torch.optim.Optimizer) -> None:
        orig_step = optimizer.step
        spanned_step = self._opt(orig_step)

        @functools.wraps(orig_step)
        def step(*args: Any, **kw: Any) -> Any:
            if self._closed:
                return orig_step(*args, **kw)
            return spanned_step(*args, **kw)

        prev_step = patch(optimizer, "step", step)
        self._undo.append(lambda: restore(optimizer, "step", prev_step))

    def _install_forward(self, model: torch.nn.Module) -> None:
        orig_forward = model.forward
        spanned_forward = self._fwd(orig_forward)  # a Span per call, closed on exceptions too

        @functools.wraps(spanned_forward)
        def forward(*args: Any, **kw: Any) -> Any:
            if self._closed:
                return orig_forward(*args, **kw)
            self._begin_update_unless_open()
            return spanned_forward(*args, **kw)

        prev = patch(model, "forward", forward)
        self._undo.append(lambda: restore(model, "forward", prev))

    def _span(self, proto: Any) -> Any:
        sp = type(proto)()
        sp._sess, sp._name, sp._kind, sp._step, sp._measured = (
            proto._sess, proto._name, proto._kind, proto._step, False)
        return sp

    def _open_data(self) -> None:
        data = self._span(self._data_span)
        data.__enter__()
        self._open.append(data)  # a data span is not None: see forward()

    @property
    def _update_open(self) -> bool:
        """An update is open (its marker is the last of ``_open``)."""
        return bool(self._open) and self._open[-1] is None

    def _begin_update_unless_open(self) -> None:
        """Closes the data span (if open) and opens the update span, unless the update
        is open already (a later forward of it, its backward)."""
        if self._update_open:
            return
        if self._open:
            self._open.pop().__exit__(None, None, None)
        upd = self._span(self._step_span)
        upd.__enter__()
        self._open.append(None)  # marks "update open"
        self._update = upd

    def _install_begin(self, module: torch.nn.Module) -> None:
        """``module``'s forward opens the update if none is open (no span of its own)."""
        orig_forward = module.forward

        @functools.wraps(orig_forward)
        def forward(*args: Any, **kw: Any) -> Any:
            if not self._closed:
                self._begin_update_unless_open()
            return orig_forward(*args, **kw)

        prev = patch(module, "forward", forward)
        self._undo.append(lambda: restore(module, "forward", prev))

    def _begin_at_submodules(self) -> None:
        """An update ended without a forward of the model's own: a module that holds
        others and is never called itself (a GAN's, whose loop calls its generator and
        discriminator in turn). From the next update on, the first forward of any module
        inside it opens the update, as the model's own would have -- before, the update
        span held none of the update's time and the data span all of it. Only then: a
        model that is called costs no wrapper per submodule call."""
        self._submodules_begin = True
        seen = {id(m) for m in self._roots}
        for root in self._roots:
            for m in root.modules():
                if id(m) not in seen:
                    seen.add(id(m))
                    self._install_begin(m)

    def step(self) -> None:
        """The end of one update (the profile's ``step()``)."""
        self._compiles.ensure()  # a model compiled after the run's statistics started
        if self._roots and not self._submodules_begin and not self._update_open:
            self._begin_at_submodules()
        self._begin_update_unless_open()  # no forward (or backward) began it
        self._open.pop()
        self._update.__exit__(None, None, None)
        self._update = None
        loss, self._loss = self._loss, None
        if loss is not None:
            self.session.record_scalar(1, "loss", float(loss))
        self._open_data()

    def close(self, exc_type: Any, exc: Any) -> None:
        self._closed = True
        for u in reversed(self._undo):
            u()
        self._undo.clear()
        a = self.session
        if a.finished:
            return
        try:
            if self._open:
                # The span after the last update (data, or an update without step()) is no
                # update: it ends with statistics off, so it is not counted.
                a.aggregate_enable(False)
                span = self._open.pop()
                (span if span is not None else self._update).__exit__(None, None, None)
        except CandleTraceError:
            pass
        if exc_type is None:
            a.finish()
        else:
            try:
                a.finish_failed(exception_reason(exc_type, exc))
            except CandleTraceError:
                pass
