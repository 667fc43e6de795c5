"""``candle_trace.torch.watch``: catch the update that goes wrong, with no capture step
given.

    with candle_trace.torch.watch(model, optimizer, "traces/") as w:
        for x, y in loader:
            ...                      # the update, as before
            w.step()

Every update runs under a *flight recorder*: a capture kept in memory (ops, memory,
module spans; no tensor statistics, so it stays cheap; at most ``recorder_bytes``, what
does not fit is dropped and counted in the trace) from the ``step()`` before it -- the
input pipeline included -- to its own ``step()``. When a trigger fires for it (see
``_triggers``: slow, non-finite loss, an exception, ``trigger(why)``) it is written as
``update-<N>-<trigger>.jsonl`` (``failed`` with the exception's type and message for an
exception, complete otherwise, the trigger's value and threshold as scalars
``candle_trace/trigger/...`` of its measured region); otherwise it is dropped unwritten.
After a trigger, the next update is also captured in full, stats included
(``update-<N>-after-<trigger>.jsonl``; most slow-step causes recur); its gradient norms,
read there, fire ``non_finite_grad`` when one is not finite. At most
``max_traces`` traces are written in a run. ``watch.fired`` lists what fired, with the
trace written for it or why none was; with ``aggregate_path`` the whole-run summary lists
them too (``ct_aggregate_trigger``; ``candle-trace report SUMMARY.json`` shows them).
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from typing import Any, List, Mapping, Optional, Tuple, Union

import torch

from ..session import CandleTraceError
from ._aggregate import WholeRun
from ._capture import Capture, Config, Layout
from ._amp import ScaledLosses, unscaled
from ._common import (Optimizers, Patched, collect_ahead, exception_reason, optimizers_of, patch,
                      restore, warn_once)
from ._compile import Compilations, RecompileReasons
from ._distributed import has_rank_placeholder, rank_path, rank_tags, rank_world
from ._model import parts_of
from ._triggers import CpuWait, Evaluator, Fired, Triggers

__all__ = ["watch", "Triggers", "Fired"]

DEFAULT_RECORDER_BYTES = 64 << 20
INTERNAL = "candle_trace internal error"


def _line(text: str, limit: int = 1024) -> Optional[str]:
    """``text`` cut to ``limit`` bytes of UTF-8 (a summary's bound), None when empty."""
    return text.encode("utf-8")[:limit].decode("utf-8", "ignore") or None


#: the aggregate summary's scalar of the flight recorder's measured share
RECORDER_SHARE = "flight_recorder/share"


class RecorderCost:
    """What the flight recorder adds to the updates it records, measured once over
    ``updates`` of them (after ``skip``, which pay for warming up), as a share of the
    update's own time: per update, its tracer time (what its hooks bracketed, torch's
    calibrated price per record function included) plus ``step()``'s work for it
    (dropping the update, reopening the session: in C alone where the library can, else
    with its Go runtime woken), over the update's wall time less that tracer time; the median. A lower
    bound: torch's work for the op callbacks beyond the calibrated share (the record
    functions' own cost, slower in a real update's cold caches than in the calibration's
    warm ones) and the library's background threads are not counted -- interleaved
    with untraced updates (``bench_watch.py``) the recorder measured 1.5-3 times this
    figure on torch 2.15's op-bound updates. At ``warn_at`` or more the program is told
    once, with the way to keep the triggers without it."""

    def __init__(self, skip: int = 3, updates: int = 20, warn_at: float = 0.05) -> None:
        self.skip, self.updates, self.warn_at = skip, updates, warn_at
        #: how the warning tells the program to go without the recorder (``candle-trace
        #: run`` names its own flag)
        self.way_out = "watch(..., flight_recorder=False)"
        self._shares: List[float] = []
        #: the median share once measured, else None
        self.share: Optional[float] = None

    def add(self, tracer_s: float, wall_s: float, step_s: float = 0.0) -> bool:
        """Folds one recorded update: ``tracer_s`` of its ``wall_s``, and ``step_s`` of
        ``step()``'s time spent on it; True when that measured the share."""
        if self.share is not None or wall_s <= 0:
            return False
        if self.skip > 0:
            self.skip -= 1
            return False
        tracer_s, step_s = max(tracer_s, 0.0), max(step_s, 0.0)
        own = max(wall_s - tracer_s, wall_s * 1e-3)  # a tracer time above the wall: clock skew
        self._shares.append(min((tracer_s + step_s) / own, 1e3))
        if len(self._shares) < self.updates:
            return False
        self.share = statistics.median(self._shares)
        self._shares = []
        if self.share >= self.warn_at:
            warn_once("flight-recorder-cost",
                      f"the flight recorder adds at least {self.share:.0%} to this loop's "
                      f"updates (what its hooks and step() measurably spend; torch's own "
                      f"work for its op callbacks, beyond a calibrated share, and the "
                      f"library's background threads come on top); "
                      f"{self.way_out} keeps every trigger and captures "
                      f"the update after one fires in full", stacklevel=4)
        return True


class _LossTap:
    """The 1-element tensor last given to ``torch.autograd.backward`` (the loss; the one
    a GradScaler scaled, not its product: see _amp)."""

    def __init__(self) -> None:
        self.loss: Optional[torch.Tensor] = None
        self._patched: Optional[Patched] = None

    def install(self) -> None:
        orig = torch.autograd.backward

        @functools.wraps(orig)
        def backward(tensors: Any, *a: Any, **k: Any) -> Any:
            if self._patched is not None and isinstance(tensors, torch.Tensor) and \
                    tensors.numel() == 1:
                self.loss = unscaled(tensors).detach()
            return orig(tensors, *a, **k)

        self._patched = patch(torch.autograd, "backward", backward)
        ScaledLosses.install()

    def take(self) -> Optional[float]:
        loss, self.loss = self.loss, None
        return None if loss is None else float(loss)

    def remove(self) -> None:
        patched, self._patched = self._patched, None
        if patched is not None:
            restore(torch.autograd, "backward", patched)
            ScaledLosses.remove()
        self.loss = None


class watch:
    """Keeps the updates that go wrong (see the module's doc).

    Arguments: ``model`` (an nn.Module, or what ``profile`` takes: an object, mapping or
    list holding modules and trainable tensors), ``optimizer`` (or a list of them, as
    ``profile`` takes, or None), ``folder`` for
    the traces. Keywords: ``triggers`` (a :class:`Triggers`),
    ``max_traces`` (default 3), ``flight_recorder`` (default True; False keeps only the
    capture of the update after a trigger), ``recorder_bytes`` (the flight recorder's
    bound, default 64 MiB), ``capture_next`` (default True), ``name``, ``device``,
    ``tags``, ``gradient_families``, ``enabled``; ``aggregate_path`` (and
    ``aggregate_interval_ms``, ``aggregate_prefix``) keeps whole-run statistics beside it,
    as ``profile`` does, with each trigger that fires as a scalar ``trigger/<name>`` (its
    value) of the summary; ``first_update`` (default 1), the loop's number of the first
    update watched, for a watch started part way into a loop (its traces and triggers
    say the loop's numbers).
    """

    def __init__(self, model: Any, optimizer: Optimizers,
                 folder: Union[str, os.PathLike], *, triggers: Optional[Triggers] = None,
                 max_traces: int = 3, flight_recorder: bool = True,
                 recorder_bytes: int = DEFAULT_RECORDER_BYTES, capture_next: bool = True,
                 name: Optional[str] = None, device: Optional[str] = None,
                 tags: Optional[Mapping[str, str]] = None,
                 gradient_families: Optional[Mapping[str, Tuple[str, int]]] = None,
                 enabled: bool = True, aggregate_path: Optional[Union[str, os.PathLike]] = None,
                 aggregate_interval_ms: Optional[int] = None,
                 aggregate_prefix: str = "train", first_update: int = 1) -> None:
        if not isinstance(first_update, int) or isinstance(first_update, bool) or \
                first_update < 1:
            raise CandleTraceError(1, f"candle_trace.torch.watch: first_update must be an "
                                      f"integer >= 1, got {first_update!r}")
        if not isinstance(max_traces, int) or isinstance(max_traces, bool) or max_traces < 0:
            raise CandleTraceError(1, f"candle_trace.torch.watch: max_traces must be an integer "
                                      f">= 0, got {max_traces!r}")
        if not isinstance(recorder_bytes, int) or recorder_bytes < 1:
            raise CandleTraceError(1, f"candle_trace.torch.watch: recorder_bytes must be an "
                                      f"integer >= 1, got {recorder_bytes!r}")
        self._triggers = triggers or Triggers()
        try:
            self._eval = Evaluator(self._triggers)
        except ValueError as e:
            raise CandleTraceError(1, f"candle_trace.torch.watch: {e}") from None
        self.model, self.optimizer = model, optimizer
        self.optimizers = optimizers_of(optimizer, "candle_trace.torch.watch")
        self._parts = parts_of(model, "candle_trace.torch.watch")
        # Under torchrun every rank watches: {rank}/%r in the folder, else -rank<N> in
        # each file's name, keeps them apart (see _distributed).
        self.rank, self.world_size = rank_world()
        folder = os.fspath(folder)
        self._rank_names = self.world_size > 1 and not has_rank_placeholder(folder)
        self.folder = rank_path(folder, self.rank, self.world_size) \
            if not self._rank_names else folder
        self.name, self.device = self._parts.identity(name, device)
        self.tags = rank_tags(dict(tags or {}), self.rank, self.world_size)
        if aggregate_path is not None:
            aggregate_path = rank_path(os.fspath(aggregate_path), self.rank, self.world_size)
        self.gradient_families = gradient_families
        self.max_traces = max_traces
        self.flight_recorder = flight_recorder
        self.recorder_bytes = recorder_bytes
        self.capture_next = capture_next
        self.enabled = enabled
        #: the triggers that fired, in order, each with the trace written for it
        self.fired: List[Fired] = []
        self.traces: List[str] = []  #: the traces written, in order
        #: the number of the last update ended (step() calls so far, from first_update)
        self.updates = first_update - 1
        self.first_update = first_update
        self._cap: Optional[Capture] = None
        self._cap_kind = ""  # "flight" or "after"
        #: the flight recorder's capture of an update just dropped, kept (hooks
        #: installed, session buffered) to record the next one (Capture.recycle)
        self._spare: Optional[Capture] = None
        self._after: Optional[Fired] = None  # the trigger the next full capture follows
        self._tap = _LossTap()
        self._cpu_wait = CpuWait()  # the machine's stalls are not the update's
        #: torch.compile's time in the update under way (seconds), for a slow trigger's
        #: detail
        self.compile_s = 0.0
        self._compiles = Compilations(self._compile_started, self._compiled)
        #: why dynamo compiled again in the update under way, for the same detail
        self.recompiled: List[str] = []
        self._reasons = RecompileReasons()
        #: what the flight recorder adds to the updates it records (``.share``, once
        #: measured over its first 20 updates; warned about from 5%)
        self.recorder_cost = RecorderCost()
        self._aggregate_args = (aggregate_path, aggregate_interval_ms, aggregate_prefix)
        #: the whole-run statistics (aggregate_path given), else None
        self.whole_run: Optional[WholeRun] = None
        try:
            self._layout = Layout(self._parts, self._capture_cfg(1, True, ""))
        except ValueError as e:
            raise CandleTraceError(1, f"candle_trace.torch.watch: {e}") from None
        self._last = 0.0
        self._tracer_base = 0.0
        self._started = False

    def add_optimizer(self, opt: torch.optim.Optimizer) -> None:
        """An optimizer the loop made after the watch started (see profile's)."""
        if any(o is opt for o in self.optimizers):
            return
        self.optimizers.append(opt)
        for cap in (self._cap, self._spare):
            if cap is not None:
                cap.add_optimizer(opt)
        if self.whole_run is not None:
            self.whole_run.add_optimizer(opt)

    @property
    def slow_unarmed(self) -> Optional[str]:
        """Why the slow trigger could not fire yet, or None where it can (or is off): it
        times its warm-up's updates first, so a run shorter than that is never slow."""
        if self._triggers.slow is None or self._eval.slow_armed:
            return None
        return (f"the slow trigger arms after {self._triggers.warmup} timed updates; "
                f"this run timed {self._eval.timed}")

    @property
    def in_update(self) -> bool:
        """An update is being recorded: its capture has begun."""
        return self._cap is not None and self._cap.state == "capturing"

    # -- the run ------------------------------------------------------------------------

    def start(self) -> "watch":
        if self._started:
            raise CandleTraceError(5, "candle_trace.torch.watch: start() was already called")
        self._started = True
        if not self.enabled:
            return self
        os.makedirs(self.folder, exist_ok=True)
        path, interval, prefix = self._aggregate_args
        if path is not None:
            self.whole_run = WholeRun(os.fspath(path), f"{self.name}::train", "train", 1,
                                      self.device, self.tags, interval, prefix, want_loss=False)
            self.whole_run.install(self._parts.forward_modules(), self.optimizers)
        self._tap.install()
        self._reasons.take()  # those of compilations before the watch are not its
        self._compiles.install()
        self._arm_next()
        self._mark()
        return self

    def trigger(self, why: str) -> None:
        """Keeps the update under way (a condition only the program knows)."""
        self._eval.ask(str(why))

    def step(self) -> None:
        """Marks the end of one update."""
        self.updates += 1
        if not self.enabled:
            return
        # The update's own time, for the slow trigger: from the end of the step() before
        # to this one, less the capture's work inside it (its hooks' tracer time: an
        # update captured in full takes several times longer, and would otherwise fire
        # the trigger again for its own cost) and less the time the thread waited for a
        # CPU (the machine's stall, not the update's).
        wall = time.perf_counter() - self._last
        tracer = max(self._tracer_s() - self._tracer_base, 0.0)
        seconds = wall - tracer
        waited = self._cpu_wait.take(wall)
        loss = self._tap.take()
        cap, kind = self._cap, self._cap_kind
        self._cap = None
        fired: Optional[Fired] = None
        closing: Optional[float] = None
        if cap is not None and cap.state == "failed" and cap.reason:
            if cap.reason.startswith(INTERNAL):  # the tracer's failure, not the update's
                self._keep(cap, self.updates, "tracer-error")
            else:  # the update raised and the loop went on: the exception is the trigger
                fired = self._exception(cap)
        else:
            # An update captured in full is not timed: its statistics cost the tracer
            # several times the update, more than its hooks' tracer time accounts for.
            timed = None if cap is not None and kind == "after" else seconds
            fired = self._eval.end_of_update(self.updates, timed, loss, waited)
            if cap is not None:
                closing = time.perf_counter()
                self._close(cap, kind, fired)
                closing = time.perf_counter() - closing
                # Read in full, its gradients tell too -- where an optimizer applied
                # them: a GradScaler skips the step on the inf its overflow makes, and
                # backs off, as mixed precision means it to.
                if kind == "after" and cap.applied:
                    fired = fired or self._eval.gradients(self.updates, cap.grad_norms)
                    if fired is not None:  # its full capture is its trace
                        fired.trace = cap.cfg.path
        if fired is not None and fired.trigger == "slow" and self.compile_s >= 1e-4:
            # the likeliest cause, where it ran: dynamo compiled inside the update
            fired.detail += f"; torch.compile ran {self.compile_s * 1e3:.1f} ms of it"
            if self.recompiled:
                more = len(self.recompiled) - 2
                fired.detail += " (recompiled: " + "; ".join(self.recompiled[:2]) + \
                    (f"; and {more} more" if more > 0 else "") + ")"
        if fired is not None:
            self._fired(fired, recorded=cap is not None and kind == "flight")
            if self.capture_next and fired.trigger not in ("exception", "non_finite_grad"):
                self._after = fired
        if self.whole_run is not None:
            if loss is not None:
                self.whole_run.session.record_scalar(1, "loss", loss)
            self.whole_run.step()
        arming = time.perf_counter()
        self._arm_next()
        if closing is not None and kind == "flight" and fired is None:
            # A dropped update: its recorder's work, and the next one's arming, in step()
            step_s = closing + time.perf_counter() - arming
            if self.recorder_cost.add(tracer, wall, step_s):
                self._summarize_recorder_cost()
        self._mark()

    def _fired(self, fired: Fired, recorded: bool) -> None:
        """Keeps a trigger that fired in :attr:`fired` and, with whole-run statistics,
        in their summary: as the scalar ``trigger/<name>`` (its value) and in the list
        of firings (``ct_aggregate_trigger``), with the trace written or why none was."""
        if fired.trace is None and not fired.no_trace:
            if self._left() <= 0 and (recorded or self.flight_recorder):
                fired.no_trace = f"the run's cap of {self.max_traces} traces was reached"
            elif not recorded:
                fired.no_trace = "not recorded: flight_recorder=False"
            else:
                fired.no_trace = "the capture wrote nothing"
        self.fired.append(fired)
        if self.whole_run is None:
            return
        s = self.whole_run.session
        try:
            s.record_scalar(1, f"trigger/{fired.trigger}", fired.value)
            s.aggregate_trigger(fired.update, fired.trigger, fired.value, fired.threshold,
                                detail=_line(fired.detail), trace=fired.trace,
                                no_trace=None if fired.trace else fired.no_trace)
        except CandleTraceError as e:  # the summary's loss, not the program's
            warn_once(f"watch-summary-{e.status}", f"watch: the summary misses a trigger: {e}")

    def _summarize_recorder_cost(self) -> None:
        """The recorder's measured share, once, into the whole-run summary (the scalar
        ``flight_recorder/share``): what the watch spent is stated where the run's
        statistics are."""
        if self.whole_run is None or self.recorder_cost.share is None:
            return
        try:
            self.whole_run.session.record_scalar(1, RECORDER_SHARE, self.recorder_cost.share)
        except CandleTraceError as e:  # the summary's loss, not the program's
            warn_once(f"watch-summary-{e.status}", f"watch: the summary misses the recorder's cost: {e}")

    def _compile_started(self, name: str) -> float:
        self.recompiled.extend(self._reasons.take())
        return time.perf_counter()

    def _compiled(self, t0: float) -> None:
        self.compile_s += time.perf_counter() - t0

    def _mark(self) -> None:
        """Where the next update's time starts: after step()'s own work (closing one
        capture, arming the next, and the GC collection the next update would run), so
        none of it is the update's."""
        collect_ahead()
        self._cpu_wait.take()
        self._tracer_base = self._tracer_s()
        self.compile_s = 0.0
        self.recompiled = []
        self._compiles.ensure()
        self._last = time.perf_counter()

    def _tracer_s(self) -> float:
        """The tracer time of the capture under way so far (0 without one)."""
        cap = self._cap
        if cap is None or cap.session is None or cap.session.finished:
            return 0.0
        return cap.session.tracer_ns() / 1e9

    def stop(self, exc_type: Any = None, exc: Any = None) -> None:
        if not self._started:
            return
        self._started = False
        if not self.enabled:
            return
        cap, kind = self._cap, self._cap_kind
        self._cap = None
        try:
            self._drop_spare()
            if cap is not None:
                if exc_type is not None and cap.state == "capturing":
                    cap.fail(exception_reason(exc_type, exc))
                if cap.state == "failed" and cap.reason:
                    self._fired(self._exception(cap, update=self.updates + 1), recorded=True)
                elif kind == "flight":
                    cap.discard()
                elif cap.state == "armed":
                    # The update after a trigger, which the loop never began (it ended
                    # just after): a trace of nothing of the program's. Its file, this
                    # watch's own and new, goes (a streaming session cannot be
                    # discarded unwritten).
                    cap.fail(f"the loop ended before update {self.updates + 1} began")
                    self._remove_own(cap.cfg.path)
                else:  # a full capture the loop did not reach the end of
                    cap.fail(f"the loop ended before update {self.updates + 1} completed")
                    self._keep(cap, self.updates + 1, f"after-{self._after.trigger}"
                               if self._after else "after")
        finally:
            self._tap.remove()
            self._compiles.remove()
            self._cpu_wait.close()
            if self.whole_run is not None:
                wr, self.whole_run = self.whole_run, None
                wr.close(exc_type, exc)

    def __enter__(self) -> "watch":
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self.stop(exc_type, exc)
        return False

    # -- captures -----------------------------------------------------------------------

    def _left(self) -> int:
        return self.max_traces - len(self.traces)

    def _arm_next(self) -> None:
        n = self.updates + 1
        if self._after is not None and self._left() > 0:
            self._drop_spare()
            after, self._after = self._after, None
            self._cap = self._capture(n, full=True, path=self._path(n, f"after-{after.trigger}"))
            self._cap_kind = "after"
        elif self.flight_recorder and self._left() > 0:
            if self._recycle(n):
                return
            self._cap = self._capture(n, full=False, path=self._path(n, "recording"))
            self._cap_kind = "flight"
        else:
            self._drop_spare()
            self._after = None
            return
        try:
            self._cap.open()
            self._cap.arm()
        except Exception as e:  # noqa: BLE001 - the tracer's failure is not the program's
            warn_once(f"watch-arm-{type(e).__name__}", f"watch: update {n} is not recorded: {e}")
            self._cap = None

    def _recycle(self, n: int) -> bool:
        """Records update ``n`` in the spare flight capture, if there is one (most
        updates: the one before was dropped); False when a fresh one must open."""
        spare, self._spare = self._spare, None
        if spare is None:
            return False
        try:
            spare.recycle(n, self._path(n, "recording"))
        except Exception as e:  # noqa: BLE001 - the tracer's failure is not the program's
            warn_once(f"watch-recycle-{type(e).__name__}",
                      f"watch: the flight recorder could not go on ({e}); it restarts")
            try:
                spare.discard()
            except Exception:  # noqa: BLE001
                pass
            return False
        self._cap, self._cap_kind = spare, "flight"
        return True

    def _drop_spare(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            spare.discard()

    def _capture_cfg(self, n: int, full: bool, path: str) -> Config:
        return Config(path=path, name=self.name, entrypoint=f"{self.name}::train", phase="train",
                      capture_step=n, device=self.device, tags=dict(self.tags),
                      stats=full, memory=True, ops=True, gradient_families=self.gradient_families,
                      buffer_bytes=None if full else self.recorder_bytes,
                      begin_at_arm=not full or not self._parts.begins_at_forward)

    def _capture(self, n: int, full: bool, path: str) -> Capture:
        return Capture(self._capture_cfg(n, full, path), self._layout, self.optimizers)

    def _path(self, n: int, what: str) -> str:
        path = os.path.join(self.folder, f"update-{n:06d}-{what}.jsonl")
        return rank_path(path, self.rank, self.world_size) if self._rank_names else path

    def _close(self, cap: Capture, kind: str, fired: Optional[Fired]) -> None:
        if kind == "after":
            cap.end()
            self.traces.append(cap.cfg.path)
            return
        if fired is None or self._left() <= 0:
            # Dropped; its hooks and session wait for the next update (_recycle).
            if cap.drop_update():
                self._spare = cap
            return
        cap.note(f"candle_trace/trigger/{fired.trigger}", fired.value)
        cap.note(f"candle_trace/trigger/{fired.trigger}/threshold", fired.threshold)
        cap.shown_path = self._free_path(fired.update, fired.trigger)  # what end() warns of
        cap.end()
        fired.trace = self._keep(cap, fired.update, fired.trigger)

    def _exception(self, cap: Capture, update: Optional[int] = None) -> Fired:
        n = update if update is not None else self.updates
        fired = Fired(n, "exception", 0.0, 0.0, cap.reason or "")
        fired.trace = self._keep(cap, n, "exception")
        return fired

    def _keep(self, cap: Capture, n: int, what: str) -> Optional[str]:
        """The written trace under its final name (a buffered one was written under a
        working name); None when nothing was written."""
        src = cap.cfg.path
        if not os.path.exists(src):
            return None
        dst = self._path(n, what)
        if dst != src:
            dst = self._free_path(n, what)
            os.rename(src, dst)
        self.traces.append(dst)
        return dst

    @staticmethod
    def _remove_own(path: str) -> None:
        try:
            os.remove(path)
        except OSError:
            pass

    def _free_path(self, n: int, what: str) -> str:
        """The name update ``n``'s trace for ``what`` takes: -2, -3... after it where one
        is there already (never over another file)."""
        dst, i = self._path(n, what), 1
        while os.path.exists(dst):
            i += 1
            dst = self._path(n, f"{what}-{i}")
        return dst
