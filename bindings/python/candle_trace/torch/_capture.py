"""One captured update (or inference step) of a PyTorch program, in one trace.

:class:`Capture` owns the trace session and the hooks of the captured update. Its life:
``open()`` (the trace exists, its provenance checked), ``arm()`` (hooks in, before the
update), the update begins at the first forward of a top module -- with gradients on, in
phase train -- (``begin()``), and ends at ``end()`` (complete) or ``fail(reason)``
(failed, keeping everything recorded up to the failure: ops, memory, module spans,
stats, a device-memory sample). Whoever schedules it (:class:`profile`, or a trigger)
calls those; the capture calls nothing back.

Honest timing: every hook runs as tracer work (:meth:`guard`: the session clock stands
still), so span durations, op times and the measured region are the program's. An error
inside the tracer ends the capture as failed with the reason and never reaches the
program; an exception of the program inside the update (an out-of-memory, a
KeyboardInterrupt) ends it as failed with the exception's type and message, and goes on
to the program unchanged.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from ..session import CandleTraceError, Session
from . import _compiled, _gradients, _observer, _ops
from ._amp import ScaledLosses, scale_of, unscaled
from ._autograd_threads import close_spans_on_device_threads, devices_of
from ._compile import Compilations
from ._common import (compiled_autograd_on, compiled_inner, dtype_name, exception_reason,
                      outside_dynamo, patch, restore, warn_once)
from ._device import Device
from ._kernels import KernelRecords
from ._loaders import LoaderSpans
from ._model import Parts
from ._modules import ModuleSpans, module_spans
from ._spans import Spans, spans_for
from ._stats import StatsRecorder

__all__ = ["Capture", "Config", "Layout"]


@dataclass
class Config:
    """What to capture and how (the keywords of :class:`profile`)."""

    path: str
    name: str
    entrypoint: str
    phase: str
    capture_step: int
    device: str
    tags: Dict[str, str] = field(default_factory=dict)
    identity: Optional[Mapping[str, Any]] = None
    ops: bool = True
    memory: bool = True
    stats: bool = True
    gradient_families: Optional[Mapping[str, Tuple[str, int]]] = None
    device_collect: List[str] = field(default_factory=list)
    #: keep the trace in memory, at most this many bytes, until end() or fail() write
    #: it -- or discard() drops it (a flight recorder); None: written as recorded
    buffer_bytes: Optional[int] = None
    #: the measured region opens when the capture arms (at the step() before the
    #: update: the input pipeline is part of it), not at the update's first forward
    begin_at_arm: bool = False


#: the scalar a captured update under a GradScaler carries: 1 when the scaler skipped the
#: optimizer step (the gradients it unscaled held an inf or a NaN), else 0
SKIPPED_LABEL = "grad_scaler/step_skipped"


class Layout:
    """What a capture walks of a model -- its modules and parameters, named -- found once
    for every capture of it (a watch captures every update)."""

    def __init__(self, parts: Parts, cfg: Config) -> None:
        _compiled.track()
        self._parts = parts
        self._generation = -1
        self.tops: List[torch.nn.Module] = []
        self.modules: List[Tuple[str, torch.nn.Module]] = []
        self.refresh()
        self.params = _named(parts.tops, "parameters") + parts.tensors
        self.grad_params = [(n, p) for n, p in self.params if p.requires_grad]
        _gradients.check_families(cfg.gradient_families,
                                  [_gradients.family_of(cfg.name, n) for n, _ in self.grad_params])

    def refresh(self) -> None:
        """The modules again where torch.compile compiled one since they were found: the
        compiled module stands in for the plain one (``_compiled``)."""
        if self._generation == _compiled.generation():
            return
        self._generation = _compiled.generation()
        self.tops = [_or(_compiled.compiled_as(m), m) for _, m in self._parts.tops]
        self.modules = _named(self._parts.tops, "modules")


class Capture:
    """The capture of one update: see the module's doc."""

    def __init__(self, cfg: Config, parts: Union[Parts, Layout],
                 optimizers: Sequence[torch.optim.Optimizer]) -> None:
        self.cfg = cfg
        #: the path a warning names: the trace's final one where it is renamed once
        #: written (a flight recorder's working file); cfg.path otherwise
        self.shown_path: Optional[str] = None
        #: the update's optimizers: it has stepped once each of them has
        self.optimizers = list(optimizers)
        layout = parts if isinstance(parts, Layout) else Layout(parts, cfg)
        self._layout = layout
        self._tops = layout.tops
        self.modules = layout.modules
        self.params = layout.params
        self.grad_params = layout.grad_params
        # new -> open -> armed -> capturing -> done | failed; a flight recorder's also
        # capturing -> spare -> armed (drop_update, recycle: its next update)
        self.state = "new"
        self.session: Optional[Session] = None
        self.ops: Optional[_ops.OpSource] = None
        self.device = Device(cfg.device, cfg.device_collect)
        self.stats: Optional[StatsRecorder] = None
        self.reason: Optional[str] = None
        #: key -> gradient state of the captured update, once recorded
        self.gradients: Dict[str, str] = {}
        #: parameter key -> its gradient's L2 norm (None: no gradient), once read
        self.grad_norms: Dict[str, Optional[float]] = {}
        #: the contract's violations found at the end (also warned)
        self.violations: List[str] = []
        self._grads_done = False
        self._stepped: set = set()  # id() of each optimizer whose step ran in the update
        self._called: set = set()  # ... whose step was called (and may not have returned)
        self._scaled = False  # a GradScaler scaled the update's loss
        #: the optimizer's step under way while armed (its name): a closure it calls
        #: (LBFGS) begins the update inside it, and its span opens then (:meth:`begin`)
        self._step_pending: Optional[str] = None
        self._step_sid = 0  # that span
        self._undo: List[Callable[[], None]] = []
        self._measured = 0
        self._module_spans: Optional[ModuleSpans] = None
        self._devices: Optional[List[torch.device]] = None  # the parameters', but the CPU
        self._compiles: Optional[Compilations] = None  # torch.compile's spans, once installed
        #: called with (session, measured span) once the update's records are written,
        #: before the trace completes (the ranks' capture-step check, _distributed)
        self.on_complete: List[Callable[[Session, int], None]] = []

    # -- what the hooks see -----------------------------------------------------------

    @property
    def capturing(self) -> bool:
        return self.state == "capturing"

    @property
    def op_mechanism(self) -> str:
        return self.ops.mechanism if self.ops is not None else "none"

    def guard(self, fn: Callable) -> Callable:
        """``fn`` as a hook (returning None, as torch wants): :meth:`guard_call` on each
        call."""

        def hook(*args: Any) -> None:
            self.guard_call(fn, *args)

        return hook

    def ops_suspend(self, on: bool) -> None:
        if self.ops is not None:
            self.ops.suspend(on)

    def on_forward(self, module: torch.nn.Module) -> None:
        """A forward of one of the model's modules starts while armed: the update starts
        with the first that runs with gradients on (phase train) or the first of all
        (phase infer). Any module's, not only the model's own: a model may be a module
        that holds others and is never called itself (a GAN's generator and
        discriminator, called in turn by the loop)."""
        if self.state == "armed" and (self.cfg.phase == "infer" or torch.is_grad_enabled()):
            self.begin()

    # -- life -------------------------------------------------------------------------

    def open(self) -> None:
        """Creates the trace (its path and provenance are checked now)."""
        self.ops = _ops.choose(self.params, self.cfg.ops, self.cfg.memory)
        c = self.cfg
        run = None if c.buffer_bytes is None else {"buffer": {"max_bytes": int(c.buffer_bytes)}}
        self.session = Session(c.path, c.entrypoint, c.phase, c.capture_step, c.device,
                               tags=c.tags, contract=self._contract(), identity=c.identity,
                               run=run)
        # The spans in C++ with the op observer's library (its module spans too).
        native = self.ops.native if isinstance(self.ops, _ops.ObserverOps) else None
        self.spans: Spans = spans_for(self.session, native)
        if c.stats:  # kept in C++ with the op observer's library (its module spans reduce there)
            self.stats = StatsRecorder(self.session, self.ops_suspend, native)
        if native is not None:  # a compiled model's inductor kernels, as the observer's ops
            self._record_kernels(KernelRecords(_observer.cache_root()))
        self.state = "open"

    def _record_kernels(self, kernels: KernelRecords) -> None:
        """Inductor's kernel records on while the capture lasts -- from now, or from the
        first model compiled after this (torch.compile imports inductor's config, which
        a capture does not import itself: ~1 s), before its code is generated."""
        if kernels.acquire():
            self._undo.append(kernels.release)
            return

        def on_compile() -> None:  # heard until the capture's end undoes it
            if not kernels.held and kernels.acquire():
                self._undo.append(kernels.release)
        self._undo.append(_compiled.on_compile(on_compile))

    def _contract(self) -> dict:
        c = self.cfg
        have_ops = self.ops is not None
        out: Dict[str, Any] = {
            "measurement_scope": "profiled_work",
            "operations": "complete" if have_ops else "none",
            "activations": "partial" if have_ops else "none",
            "tensors": "partial",
            "logical_memory": "partial" if c.memory and have_ops else "none",
            "physical_memory": "partial" if c.device.startswith("cuda") else "none",
            "device_timing": "partial" if "cupti" in c.device_collect else "none",
        }
        if self.grad_params and c.phase == "train":
            out["gradients"] = "complete"
            out["gradient_contract"] = _gradients.contract(
                c.name, [n for n, _ in self.grad_params], c.gradient_families)
        return out

    def prepare(self) -> None:
        """Installs the update's hooks ahead of :meth:`arm`; they pass through until then.
        Done an update early (``profile``), so that the update that follows this work --
        which leaves the caches cold, the update after it running up to twice its time
        (a 64-64-10 MLP, torch 1.13) -- is not the captured one. That update is also the
        op mechanism's rehearsal (:meth:`OpSource.rehearse`): recorded, then dropped at
        :meth:`arm`, so that torch's path to the observer is warm in the captured update."""
        assert self.state == "open", self.state
        if self._module_spans is not None:
            return
        if not self._install_or_abort():
            return
        if self.ops is None:
            return
        self.spans.pause()
        try:
            self.ops.rehearse(self.session)  # type: ignore[arg-type]
        except Exception as e:  # noqa: BLE001 - a cold captured update, not a lost one
            warn_once(f"rehearse-{type(e).__name__}",
                      f"candle_trace: the update before the captured one could not warm the "
                      f"op observer up ({e}); the captured update runs it cold")
        finally:
            self.spans.resume()

    def _install_or_abort(self) -> bool:
        """:meth:`_install`; an error inside the tracer (the op observer's calibration,
        say) fails the capture and never reaches the program, which called in from a
        hook or step()."""
        try:
            self._install()
            return True
        except Exception as e:  # noqa: BLE001 - the tracer's failure is not the program's
            self.abort(e)
            return False

    def _install(self) -> None:
        if self._module_spans is not None:
            return
        self.spans.pause()
        try:
            if self.ops is not None:
                self.ops.prepare(self.session)  # type: ignore[arg-type]
            self._layout.refresh()  # a model compiled since the layout was found
            self.modules, self._tops = self._layout.modules, self._layout.tops
            self._module_spans = module_spans(self, self.modules, self._tops, self.cfg.name)
            self._module_spans.install()
            self._compiles = Compilations(self._compile_begin, self._compile_end)
            self._compiles.install()
            self._undo.append(self._compiles.remove)
            LoaderSpans.install(self)
            self._undo.append(lambda: LoaderSpans.remove(self))
            if self.cfg.phase == "train":
                self._wrap_backward()
                ScaledLosses.install()  # the loss behind a GradScaler's product
                self._undo.append(ScaledLosses.remove)
                for opt in self.optimizers:
                    self._wrap_optimizer(opt)
                for m in self._tops if self.optimizers else ():
                    self._wrap_zero_grad(m)
        finally:
            self.spans.resume()

    def arm(self) -> None:
        """The next update is the captured one (the update before has just ended): the
        hooks (:meth:`prepare`, unless done already) start recording."""
        assert self.state == "open", self.state
        if not self._install_or_abort():
            return
        self.state = "armed"
        if self.ops is not None:
            try:
                self.ops.end_rehearsal()
            except Exception as e:  # noqa: BLE001 - the tracer's failure is not the program's
                self.abort(e)
                return
        self.spans.pause()
        try:
            self.device.start(self.session)  # type: ignore[arg-type]
        finally:
            self.spans.resume()
        self._warm_and_begin()

    def begin(self) -> None:
        """The measured region opens (called as tracer work, from a hook)."""
        s = self.session
        assert s is not None
        self.state = "capturing"
        self._measured = self.spans.push_measured("update")
        if self._step_pending is not None:
            self._step_sid = self.spans.push("optimizer", self._step_pending, "function",
                                             "optimizer")
        self.device.sample(s)
        if self.ops is not None:
            try:
                self.ops.begin(s, self.spans, self._measured, self.params)
            except _observer.ObserverUnavailable as e:  # e.g. another capture holds it
                self.ops = _ops.fallback_to_dispatch(e, self.cfg.memory)
                if self.ops is None:
                    raise
                self.ops.begin(s, self.spans, self._measured, self.params)

    def _warm_and_begin(self) -> None:
        """After the collectors start: CUPTI's warm-up (program time, its own span, before
        the update), then the measured region where it opens at arming."""
        self.device.warm(self.session)  # type: ignore[arg-type]
        if self.cfg.begin_at_arm:
            self.spans.pause()
            try:
                self.begin()
            finally:
                self.spans.resume()

    def end(self) -> None:
        """The update ended (``step()``): everything closes and the trace is complete."""
        if self.state not in ("armed", "capturing"):
            return
        self.spans.pause()
        try:
            if self.state == "armed":  # no forward ran: an empty update
                self.begin()
            if self.cfg.phase == "train" and not self._grads_done:
                self._record_gradients()
            self.device.sample(self.session)  # type: ignore[arg-type]
            if self.ops is not None:
                self.ops.stop()  # before any span closes: every record stays inside one
            self._close_device_threads()  # a backward not through backward() (autograd.grad)
            if self._scaled:  # whether the GradScaler applied the gradients, in the trace
                self.session.record_scalar(self._measured, SKIPPED_LABEL,  # type: ignore[union-attr]
                                           0.0 if self.applied else 1.0)
            self.spans.close_until(self._measured)
            self.device.stop(self.session)  # type: ignore[arg-type]
            self._disarm()
            self._emit()
            for hook in self.on_complete:
                hook(self.session, self._measured)  # type: ignore[arg-type]
            self.session.finish()  # type: ignore[union-attr]
            self.state = "done"
        except Exception as e:  # noqa: BLE001 - the tracer's failure is not the program's
            self.abort(e)
        finally:
            self.spans.resume()
        self._warn_violations()

    def fail(self, reason: str) -> None:
        """Ends the capture as failed, keeping what it recorded (idempotent)."""
        if self.state in ("done", "failed", "new"):
            return
        self.state = "failed"
        self.reason = reason
        s = self.session
        assert s is not None
        try:
            if self.ops is not None and self._measured:
                self.ops.stop()
            try:
                self.device.sample(s)
                self.device.stop(s)
            except Exception:  # noqa: BLE001 - e.g. CUDA itself is what failed
                pass
        finally:
            self._disarm()
        try:
            if self._measured:
                self._emit()
        finally:
            try:
                s.finish_failed(reason)
            except CandleTraceError:
                pass

    def note(self, label: str, value: float) -> None:
        """A scalar of the capture's measured region (why it was kept, say), written as
        tracer work; only while the update is under way."""
        if self.state == "capturing":
            self.guard_call(self.session.record_scalar, self._measured, label, float(value))  # type: ignore[union-attr]

    def discard(self) -> None:
        """Ends a buffered capture without writing anything: its hooks go, the op
        mechanism drops what it buffered, nothing is left at its path."""
        if self.state in ("done", "failed", "new"):
            return
        self.state = "failed"
        try:
            self._drop_recorded()
        except Exception:  # noqa: BLE001 - never into the program
            pass
        finally:
            self._disarm()
        try:
            self.session.discard()  # type: ignore[union-attr]
        except CandleTraceError:
            pass

    def _drop_recorded(self) -> None:
        """Stops the op mechanism and the device collectors and drops what they hold
        (tracer work)."""
        self.spans.pause()
        try:
            if self.ops is not None and self._measured:
                self.ops.stop()
                self.ops.discard()
            if self.stats is not None:
                self.stats.drop()
            self.device.stop(self.session)  # type: ignore[arg-type]
        finally:
            self.spans.resume()

    # -- a flight recorder's next update (one Capture for every update it drops) ------

    def drop_update(self) -> bool:
        """Drops what a buffered capture recorded of the update just ended and idles
        (state ``spare``: every hook stays installed and passes through) until
        :meth:`recycle` starts the next update's, or :meth:`discard` ends it. False
        when it could not (the capture is then discarded: open a fresh one)."""
        if self.state not in ("armed", "capturing"):
            return False
        self.state = "spare"
        try:
            self._drop_recorded()
            return True
        except Exception as e:  # noqa: BLE001 - the tracer's failure is not the program's
            warn_once(f"drop-{type(e).__name__}", f"candle_trace internal error: {e}; the "
                                                  "flight recorder starts afresh")
            self.discard()
            return False

    def recycle(self, capture_step: int, path: str) -> None:
        """Records the next update in this capture's place (after :meth:`drop_update`):
        the session goes on as a new one at ``path`` (``Session.reopen``: no run JSON to
        build or parse), the hooks and the op mechanism stay, and the update begins
        as :meth:`arm` would begin it. What costs a fresh capture per update --
        opening a session, wrapping every module -- is not paid again."""
        assert self.state == "spare" and self.cfg.buffer_bytes is not None, self.state
        self.cfg.capture_step, self.cfg.path = capture_step, path
        self.session.reopen(path, capture_step)  # type: ignore[union-attr]
        self.spans.reset()
        self.reason = None
        self.gradients = {}
        self.grad_norms = {}
        self.violations = []
        self._grads_done = False
        self._stepped, self._called = set(), set()
        self._scaled = False
        self._step_pending, self._step_sid = None, 0
        self._measured = 0
        self.state = "armed"
        if self._compiles is not None:
            self._compiles.ensure()  # a model compiled after the recorder started
        self.spans.pause()
        try:
            if self.ops is not None:
                self.ops.prepare(self.session)  # type: ignore[arg-type]
            self.device.start(self.session)  # type: ignore[arg-type]
        finally:
            self.spans.resume()
        self._warm_and_begin()

    def abort(self, e: BaseException) -> None:
        """An error inside the tracer: the capture fails, the program goes on."""
        reason = f"candle_trace internal error: {exception_reason(type(e), e)}"
        warn_once(f"abort-{type(e).__name__}", f"{reason}; the capture ends as failed and "
                                               "the program goes on")
        try:
            self.fail(reason)
        except Exception:  # noqa: BLE001 - never into the program
            pass

    def _emit(self) -> None:
        """Writes what the update buffered, once it is over: the parameters (tensor
        records of the measured region, which carry no time), the statistics and the
        ops."""
        s = self.session
        assert s is not None
        for n, p in self.params:
            s.record_tensor(self._measured, n, dtype=dtype_name(p), device=str(p.device),
                            shape=tuple(p.shape), label=n, requires_grad=p.requires_grad,
                            category="parameter")
        if self.stats is not None:
            self.stats.flush()
        if self.ops is not None:
            self.ops.emit()

    def _disarm(self) -> None:
        if self.ops is not None:
            self.ops.end_rehearsal()
        if self._module_spans is not None:
            self._module_spans.remove()
            self._module_spans = None
        for u in reversed(self._undo):
            u()
        self._undo.clear()

    # -- the update's phases ----------------------------------------------------------

    def failing(self, exc: BaseException) -> None:
        """The program raised inside the update: the capture fails with its exception."""
        if self.state == "capturing":
            self.spans.pause()
            try:
                self.fail(exception_reason(type(exc), exc))
            finally:
                self.spans.resume()

    def _wrap_backward(self) -> None:
        orig = torch.autograd.backward

        @functools.wraps(orig)
        def backward(tensors: Any, *a: Any, **k: Any) -> Any:
            if self._module_spans is not None and compiled_autograd_on():
                self._module_spans.autograd_compiled()
            if self.state != "capturing":
                return orig(tensors, *a, **k)
            sid = self.guard_call(self._backward_begin, tensors)
            return self._backward_in(sid, orig, (tensors, *a), k)

        # Tensor.backward calls it too
        prev = patch(torch.autograd, "backward", outside_dynamo(backward))
        self._undo.append(lambda: restore(torch.autograd, "backward", prev))

        orig_grad = torch.autograd.grad

        @functools.wraps(orig_grad)
        def grad(*a: Any, **k: Any) -> Any:
            # A backward pass too (a gradient penalty's, a meta-learner's inner step):
            # its span holds the module backward spans it opens, and closes them when it
            # returns -- left open, every forward after it read as a recomputation
            # inside a backward.
            if self.state != "capturing":
                return orig_grad(*a, **k)
            sid = self.guard_call(self.spans.push, "backward", "autograd.grad", "function",
                                  "backward")
            return self._backward_in(sid, orig_grad, a, k)

        prev_grad = patch(torch.autograd, "grad", outside_dynamo(grad))
        self._undo.append(lambda: restore(torch.autograd, "grad", prev_grad))

    def _backward_in(self, sid: int, fn: Callable, args: Any, kw: Any) -> Any:
        """The program's backward pass ``fn(*args, **kw)`` inside its span ``sid`` (0:
        none could open), closed when it returns; an exception fails the capture."""
        try:
            return fn(*args, **kw)
        except BaseException as e:
            self.failing(e)
            raise
        finally:
            if sid:
                self.guard_call(self._backward_end, sid)

    def _backward_begin(self, tensors: Any) -> int:
        sid = self.spans.push("backward", "backward", "function", "backward")
        if isinstance(tensors, torch.Tensor) and tensors.numel() == 1 and tensors.is_floating_point():
            # The program's loss, not a GradScaler's product of it (65,536 times it at
            # first), and the scale beside it; whether the scaler skips the step is said
            # with statistics off too (end()).
            loss = unscaled(tensors)
            scale = scale_of(tensors) if loss is not tensors else None
            self._scaled = self._scaled or scale is not None
            if self.stats is not None:
                self.stats.record(sid, "loss", loss)
                if scale is not None:
                    self.stats.record(sid, "grad_scaler/scale", scale)
        return sid

    def _backward_end(self, sid: int) -> None:
        self.spans.close_until(sid)
        self._close_device_threads()
        self.device.sample(self.session)  # type: ignore[arg-type]

    def _close_device_threads(self) -> None:
        """Closes the spans autograd's device threads hold open (see _autograd_threads)."""
        if not self.spans.open_elsewhere():
            return
        if self._devices is None:
            self._devices = devices_of(p for _, p in self.params)
        self.ops_suspend(True)
        try:
            close_spans_on_device_threads(self.spans, self._devices)
        finally:
            self.ops_suspend(False)

    def _compile_begin(self, name: str) -> Optional[Tuple[int, Callable[[], None]]]:
        """torch.compile starts compiling on this thread (_compile): its span, and no op
        recorded until it ends -- they run on fake tensors."""
        if self.state != "capturing":
            return None
        sid = self.guard_call(self.spans.push, "compile", name, "function", None)
        if not sid:
            return None
        return sid, (self.ops.quiet() if self.ops is not None else lambda: None)

    def _compile_end(self, token: Tuple[int, Callable[[], None]]) -> None:
        sid, release = token
        release()  # whatever the capture's state: the quieting is the thread's
        self.guard_call(self.spans.close_until, sid)

    def _wrap_optimizer(self, opt: torch.optim.Optimizer) -> None:
        orig = opt.step
        name = f"{type(opt).__name__}.step"

        @functools.wraps(orig)
        def step(*a: Any, **k: Any) -> Any:
            if self.state in ("armed", "capturing"):
                self._called.add(id(opt))
            if self.state == "armed":
                # A closure (LBFGS) may evaluate the model inside the step: the update
                # then begins at its first forward, and this span with it (begin()).
                self._step_pending = name
            elif self.state == "capturing":
                self._step_sid = self.guard_call(self.spans.push, "optimizer", name,
                                                 "function", "optimizer") or 0
            else:
                return orig(*a, **k)
            try:
                out = orig(*a, **k)
            except BaseException as e:
                self.failing(e)
                raise
            finally:
                self._step_pending = None
                sid, self._step_sid = self._step_sid, 0
                if sid:
                    self.guard_call(self.spans.close_until, sid)
            if self.state == "capturing":
                self._stepped.add(id(opt))
            return out

        prev = patch(opt, "step", outside_dynamo(step))
        self._undo.append(lambda: restore(opt, "step", prev))
        self._wrap_zero_grad(opt)

    def add_optimizer(self, opt: torch.optim.Optimizer) -> None:
        """An optimizer made after the capture was (a new epoch's): its steps are spans
        of the update too."""
        if any(o is opt for o in self.optimizers):
            return
        self.optimizers.append(opt)
        if self._module_spans is not None and self.cfg.phase == "train":  # hooks are in
            self.spans.pause()
            try:
                self._wrap_optimizer(opt)
            finally:
                self.spans.resume()

    @property
    def stepped(self) -> bool:
        """Every optimizer of the update has stepped in it."""
        return bool(self.optimizers) and len(self._stepped) == len(self.optimizers)

    @property
    def applied(self) -> bool:
        """An optimizer's step was called in the update (a GradScaler calls none whose
        gradients overflowed) -- or the update has no optimizer to call."""
        return bool(self._called) or not self.optimizers

    def _wrap_zero_grad(self, obj: Any) -> None:
        """The gradients are read once the optimizers have stepped (they read them and
        leave them be), so that their reduction's memory traffic is not in an
        optimizer's span: at the first ``zero_grad`` after the last step -- which would
        clear them -- or else at ``prof.step()``. With several optimizers (a GAN's), a
        ``zero_grad`` between their steps is the loop's, not the update's end."""
        orig = obj.zero_grad

        @functools.wraps(orig)
        def zero_grad(*a: Any, **k: Any) -> Any:
            if self.state == "capturing" and self.stepped and not self._grads_done:
                self.guard_call(self._record_gradients)
            return orig(*a, **k)

        prev = patch(obj, "zero_grad", outside_dynamo(zero_grad))
        self._undo.append(lambda: restore(obj, "zero_grad", prev))

    def guard_call(self, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` as tracer work; an error in it fails the capture (returns None)."""
        if self.state != "capturing":
            return None
        self.spans.pause()
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - the tracer's failure is not the program's
            self.abort(e)
            return None
        finally:
            self.spans.resume()

    def _record_gradients(self) -> None:
        self._grads_done = True
        if not self.grad_params:
            return
        self.ops_suspend(True)
        try:
            vals = _gradients.norms(self.grad_params)
        finally:
            self.ops_suspend(False)
        self.grad_norms = vals
        self.gradients = _gradients.record(self.session, self.cfg.name, vals)  # type: ignore[arg-type]

    def _warn_violations(self) -> None:
        if self.state != "done" or not self.gradients:
            return
        self.violations = _gradients.violations(self.cfg.name, self.gradients,
                                                self.cfg.gradient_families)
        if self.violations:
            # Mixed precision's overflow: a GradScaler found the inf and skipped the step
            skipped = " (no optimizer stepped in it: a GradScaler skips the step of " \
                "gradients that hold an inf or a NaN)" if not self.applied else ""
            warnings.warn("candle_trace.torch: the captured update breaks the gradient "
                          f"contract ({self.shown_path or self.cfg.path}){skipped}: " +
                          "; ".join(self.violations),
                          RuntimeWarning, stacklevel=4)


def _or(m: Optional[torch.nn.Module], default: torch.nn.Module) -> torch.nn.Module:
    """``m`` unless None (``m or default`` would ask a module's ``__len__``)."""
    return default if m is None else m


def _named(tops: Sequence[Tuple[str, torch.nn.Module]], what: str) -> List[Tuple[str, Any]]:
    """(qualified name, item) of every module (``what`` "modules") or parameter
    ("parameters") of the top modules, each once; a top module named "" is the model.
    A torch.compile'd module stands for the module it compiles: its modules are not
    listed (their forward is the compiled graph's), and ``_orig_mod`` is no part of a
    name. A module torch.compile compiled after the tracer was given it is listed as its
    compiled module, under its own name (``_compiled``)."""
    out, seen = [], set()
    for prefix, top in tops:
        inside: set = set()
        compiled: Dict[int, torch.nn.Module] = {}
        for q, m in top.named_modules():
            inner = compiled_inner(m)
            if inner is not None:
                inside.update(id(x) for x in inner.modules())
            om = _compiled.compiled_as(m) if what == "modules" and id(m) not in inside else None
            if om is not None:
                compiled[id(m)] = om
            if om is not None or getattr(m, "_compiled_call_impl", None) is not None:
                # (compiled in place, module.compile(): its span wraps the compiled call)
                inside.update(id(x) for x in m.modules() if x is not m)
        for q, x in getattr(top, f"named_{what}")():
            if id(x) in seen or (what == "modules" and id(x) in inside):
                continue
            seen.add(id(x))
            x = compiled.get(id(x), x)
            q = ".".join(p for p in q.split(".") if p != "_orig_mod")
            out.append((".".join(p for p in (prefix, q) if p), x))
    return out
