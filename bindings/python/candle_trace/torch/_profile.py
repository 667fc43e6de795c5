"""``candle_trace.torch.profile``: which update to capture, and the run around it.

The profile counts updates (``step()``), arms the :class:`Capture` at the ``step()``
before the ``capture_step``-th update, ends it at the next ``step()``, keeps the
aggregate session (``aggregate_path``) for the whole run, and decides what an exception
means: inside the captured update it fails the capture (the capture saw it first);
after the capture it changes nothing -- a complete trace stays complete.
"""

from __future__ import annotations

import warnings
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from ..session import CandleTraceError
from ._aggregate import WholeRun
from ._capture import Capture, Config
from ._common import Optimizers, collect_ahead, exception_reason, optimizers_of
from ._distributed import StepAgreement, rank_path, rank_tags, rank_world
from ._model import parts_of

__all__ = ["profile"]

PHASES = ("train", "infer")


class profile:
    """Captures the ``capture_step``-th update of a training loop into ``path``.

    Arguments: ``model`` (an nn.Module; an object or mapping whose attributes or items are
    the modules, or trainable tensors; a list of tensors: see _model -- a model of
    tensors alone has no forward to mark its update's start, which opens at the
    ``step()`` before it),
    ``optimizer`` (or a list of the optimizers that step in each update -- a GAN's
    generator's and discriminator's: the update has stepped once each has -- or None),
    ``path`` of the trace (under torchrun ``{rank}`` or ``%r`` in
    it is the rank, else a job of several ranks gets ``-rank<N>`` before the extension;
    see _distributed), ``capture_step`` (1-based, the same on every rank).
    Keywords: ``phase`` ("train", or "infer" for an inference loop: no backward or
    optimizer, no gradients), ``name`` (the model's name in span names and the gradient
    root; default the class name), ``entrypoint`` (default ``<name>::<phase>``),
    ``device`` (default the device of the first parameter), ``tags``, ``identity`` (the
    comparison_identity), ``ops`` (capture aten ops), ``memory`` (op output
    allocations), ``stats`` (tensor statistics), ``gradient_families`` (family ->
    (expectation, min_present); a parameter's family is its module's name; default: every
    family data_conditional, see candle_trace.torch._gradients), ``enabled``,
    ``device_collect`` (``"auto"``, the default, is ``["cupti"]`` when the model is on
    CUDA, else none; or a list of ``"cupti"``, ``"nvml"``; or None), and the aggregate
    options ``aggregate_path``, ``aggregate_interval_ms``, ``aggregate_prefix``,
    ``aggregate_loss``.

    Use it as a context manager around the loop, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        model: Any,
        optimizer: Optimizers,
        path: str,
        capture_step: int = 3,
        *,
        phase: str = "train",
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
        if not isinstance(capture_step, int) or isinstance(capture_step, bool) or capture_step < 1:
            raise CandleTraceError(1, f"candle_trace.torch.profile: capture_step must be an "
                                      f"integer >= 1, got {capture_step!r}")
        if phase not in PHASES:
            raise CandleTraceError(1, f"candle_trace.torch.profile: phase must be one of "
                                      f"{', '.join(PHASES)}, got {phase!r}")
        parts = self._parts = parts_of(model, "candle_trace.torch.profile")
        self.model = model
        self.optimizer = optimizer
        #: the update's optimizers (``optimizer`` may be a list: a GAN's two)
        self.optimizers = optimizers_of(optimizer, "candle_trace.torch.profile")
        #: this process's rank and the job's world size (RANK/WORLD_SIZE; see _distributed)
        self.rank, self.world_size = rank_world()
        self.path = rank_path(str(path), self.rank, self.world_size)
        tags = rank_tags(dict(tags or {}), self.rank, self.world_size)
        self.capture_step = capture_step
        self.phase = phase
        self.name, device = parts.identity(name, device)
        if device_collect == "auto":
            device_collect = ["cupti"] if device.startswith("cuda") else []
        elif isinstance(device_collect, str):
            raise CandleTraceError(1, f"candle_trace.torch.profile: device_collect must be "
                                      f'"auto", a list of collectors or None, got {device_collect!r}')
        self.device = device
        self.enabled = enabled
        self.cfg = Config(
            path=self.path, name=self.name, entrypoint=entrypoint or f"{self.name}::{phase}",
            phase=phase, capture_step=capture_step, device=device, tags=dict(tags or {}),
            identity=identity, ops=ops, memory=memory, stats=stats,
            gradient_families=gradient_families, device_collect=list(device_collect or []),
            begin_at_arm=not parts.begins_at_forward)
        try:
            self.capture = Capture(self.cfg, parts, self.optimizers)
        except ValueError as e:
            raise CandleTraceError(1, f"candle_trace.torch.profile: {e}") from None
        self.steps = 0  #: step() calls so far
        if aggregate_path is not None:
            aggregate_path = rank_path(str(aggregate_path), self.rank, self.world_size)
        self._aggregate_args = (aggregate_path, aggregate_interval_ms, aggregate_prefix,
                                aggregate_loss)
        #: the same capture step on every rank, checked through the process group
        self.agreement = StepAgreement(capture_step)
        self.capture.on_complete.append(self.agreement.record)
        #: the aggregate session's owner (``aggregate_path`` given and enabled), else None
        self.whole_run: Optional[WholeRun] = None
        self._started = False

    # -- what a user reads -------------------------------------------------------------

    @property
    def state(self) -> str:
        """"idle" before start, "waiting" for the capture step, then the capture's state:
        "armed", "capturing", "done" or "failed"."""
        st = self.capture.state
        if st in ("done", "failed"):
            return st
        if not self._started:
            return "idle"
        return "waiting" if st == "open" else st

    @property
    def session(self) -> Any:
        """The trace's Session (None before start or when disabled)."""
        return self.capture.session

    @property
    def aggregate(self) -> Any:
        """The aggregate Session, or None."""
        return self.whole_run.session if self.whole_run is not None else None

    @property
    def op_mechanism(self) -> str:
        """"observer", "dispatch" or "none": how the capture records aten ops."""
        return self.capture.op_mechanism

    @property
    def op_count(self) -> int:
        ops = self.capture.ops
        return ops.count if ops is not None else 0

    @property
    def collecting(self) -> List[str]:
        return self.capture.device.collecting

    @property
    def device_collect(self) -> List[str]:
        return self.capture.device.collect

    @property
    def violations(self) -> List[str]:
        """What the captured update broke of the gradient contract (also warned)."""
        return self.capture.violations

    # -- the run ------------------------------------------------------------------------

    def start(self) -> "profile":
        """Starts profiling (what ``with`` does): the trace is created now."""
        if self._started:
            raise CandleTraceError(5, "candle_trace.torch.profile: start() was already called")
        if not self.enabled:
            self._started = True
            return self
        self.capture.open()
        self.agreement.publish()
        path, interval, prefix, loss = self._aggregate_args
        if path is not None:
            try:
                self.whole_run = WholeRun(str(path), self.cfg.entrypoint, self.phase,
                                          self.capture_step, self.device, self.cfg.tags,
                                          interval, prefix, loss)
                self.whole_run.install(self._parts.forward_modules(), self.optimizers)
            except BaseException as e:
                self.capture.fail(f"the aggregate session could not open: {e}")
                raise
        self._started = True
        self._get_ready()
        return self

    def step(self) -> None:
        """Marks the end of one update of the training loop."""
        if not self.enabled:
            self.steps += 1
            return
        if self.capture.state in ("armed", "capturing"):
            self.capture.end()
        if self.whole_run is not None:
            self.whole_run.step()
        self.steps += 1
        self._get_ready()

    def add_optimizer(self, opt: torch.optim.Optimizer) -> None:
        """An optimizer the loop made after the profile started (a new epoch's, a second
        phase's): its steps are spans of the captured update and of the whole-run
        statistics too."""
        if any(o is opt for o in self.optimizers):
            return
        self.optimizers.append(opt)
        if self.enabled:
            self.capture.add_optimizer(opt)
            if self.whole_run is not None:
                self.whole_run.add_optimizer(opt)

    def _get_ready(self) -> None:
        """Before the next update (at start() and after each step()): the capture arms
        when that update is the captured one, and installs its hooks an update before
        that, so that the captured update does not run in the caches their installation
        leaves cold."""
        if self.capture.state != "open":
            return
        ahead = self.capture_step - 1 - self.steps  # updates to run before the captured one
        if ahead == 0:
            self.capture.arm()
            collect_ahead()  # not inside the captured update
            self.agreement.line_up()  # every rank begins the captured update together
        elif ahead == 1:
            self.capture.prepare()

    def stop(self, exc_type: Any = None, exc: Any = None) -> None:
        """Ends profiling (what leaving ``with`` does). ``exc_type``/``exc``: the exception
        that ended the loop, if any. A capture already complete stays complete."""
        if not self._started:
            return
        self._started = False
        if not self.enabled:
            return
        try:
            self._end_capture(exc_type, exc)
        finally:
            if self.whole_run is not None:
                self.whole_run.close(exc_type, exc)

    def _end_capture(self, exc_type: Any, exc: Any) -> None:
        cap = self.capture
        if cap.state in ("done", "failed"):
            return
        if exc_type is not None and cap.state == "capturing":
            cap.fail(exception_reason(exc_type, exc))
            return
        why = (f"ended by {exception_reason(exc_type, exc)} after {self.steps} updates"
               if exc_type is not None else f"ended after {self.steps} updates")
        msg = f"the loop {why}, before capture step {self.capture_step} completed"
        cap.fail(msg)
        if exc_type is None:
            warnings.warn(f"candle_trace.torch: {msg}; {self.path} records a failed capture",
                          RuntimeWarning, stacklevel=3)

    def __enter__(self) -> "profile":
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self.stop(exc_type, exc)
        return False

    def __repr__(self) -> str:
        return (f"<candle_trace.torch.profile {self.path!r} step {self.capture_step} "
                f"({self.phase}): {self.state}>")
