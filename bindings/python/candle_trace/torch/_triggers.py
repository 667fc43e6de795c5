"""When an update is worth a trace: the triggers of :class:`candle_trace.torch.watch`,
evaluated at the end of every update from a few numbers, in memory that does not grow
with the run.

- ``slow``: the update (from one ``step()`` to the next: the input pipeline included)
  took more than ``slow`` times the median of the last ``window`` updates (and at least
  ``slow_min_excess_s``, 1 ms, more than it), once ``warmup`` updates have been seen.
  An update's time (``watch`` measures it) leaves out the capture's own work -- the
  tracer time of its hooks, step()'s closing and arming of captures: a full capture
  after a trigger costs a 0.25 ms update several times its length, and would fire the
  trigger again for itself -- and what its thread spent runnable but waiting for a CPU
  (Linux's ``/proc/thread-self/schedstat``, :class:`CpuWait`): on a busy machine the
  scheduler stalls a 0.25 ms update by several milliseconds now and then, a stall of
  the machine and not of the program, which a trace of the update would not explain.
  A data loader the update waits for, an I/O, a straggler's collective are sleeps, not
  CPU waits, and stay in. The default, 3, sits above what steady training
  shows (an update's p99 is rarely 1.5x its median on a quiet machine) and below what
  is worth a look (a data-loader stall, a recompilation, a checkpoint, a straggler are
  2-10x).
- ``non_finite``: the loss given to ``backward`` is NaN or infinite, on the update it
  first turns so (not again until it has been finite).
- ``exception``: the update raised (an out-of-memory error, say).
- ``user``: the program called ``trigger(why)``.
"""

from __future__ import annotations

import bisect
import math
import os
import threading
from collections import deque
from dataclasses import dataclass
from typing import Deque, List, Optional

__all__ = ["Triggers", "Fired", "Evaluator", "CpuWait"]


@dataclass
class Triggers:
    """Which triggers fire (see the module's doc); ``None`` or ``False`` turns one off."""

    slow: Optional[float] = 3.0
    warmup: int = 10
    window: int = 64
    #: and slower than the median by at least this much: a sub-millisecond excess is a
    #: scheduler's or a collector's hiccup, not a stall worth a trace
    slow_min_excess_s: float = 0.001
    non_finite: bool = True
    exception: bool = True

    def check(self) -> None:
        if self.slow is not None and not (isinstance(self.slow, (int, float)) and self.slow > 1):
            raise ValueError(f"triggers.slow must be a factor > 1 (or None), got {self.slow!r}")
        for name in ("warmup", "window"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"triggers.{name} must be an integer >= 1, got {v!r}")


@dataclass
class Fired:
    """One trigger that fired: on which update, why, the value against the threshold,
    and the trace written for it (None when the cap was reached)."""

    update: int
    trigger: str
    value: float
    threshold: float
    detail: str = ""
    trace: Optional[str] = None


class CpuWait:
    """How long the calling thread has waited, runnable, for a CPU (seconds), from the
    kernel's schedstat of the thread (its second field, ns on a runqueue); 0 where
    there is none (not Linux, schedstats off). :meth:`take` is the wait since the
    call before, on the thread of the call before (a new thread starts from 0)."""

    def __init__(self) -> None:
        self._fd = -1
        self._tid = -1
        self._last = 0

    def _read(self) -> int:
        try:
            return int(os.pread(self._fd, 128, 0).split()[1])
        except (OSError, ValueError, IndexError):
            return 0

    def take(self) -> float:
        tid = threading.get_native_id()
        if tid != self._tid:
            self.close()
            self._tid = tid
            try:
                self._fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
            except OSError:
                self._fd = -1
            self._last = self._read() if self._fd >= 0 else 0
            return 0.0
        if self._fd < 0:
            return 0.0
        now = self._read()
        waited, self._last = max(now - self._last, 0), now
        return waited / 1e9

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._tid = -1, -1


class Evaluator:
    """The triggers' state over a run: the last ``window`` update times, sorted."""

    def __init__(self, cfg: Triggers) -> None:
        cfg.check()
        self.cfg = cfg
        self._times: Deque[float] = deque()
        self._sorted: List[float] = []
        self._seen = 0
        self._loss_was_finite = True
        self._asked: Optional[str] = None

    def ask(self, why: str) -> None:
        """The program's own trigger, for the update under way."""
        self._asked = why or "trigger()"

    def median(self) -> float:
        s = self._sorted
        n = len(s)
        return (s[(n - 1) // 2] + s[n // 2]) / 2 if n else 0.0

    def end_of_update(self, update: int, seconds: float, loss: Optional[float],
                      cpu_wait: float = 0.0) -> Optional[Fired]:
        """The first trigger that fires for the update just ended (user, non-finite,
        slow); the update's time (``seconds`` less ``cpu_wait``, the time its thread
        waited for a CPU) joins the window either way."""
        waited = min(max(cpu_wait, 0.0), seconds)
        seconds -= waited
        fired: Optional[Fired] = None
        if self._asked is not None:
            fired = Fired(update, "user", seconds, 0.0, self._asked)
            self._asked = None
        if loss is not None:
            finite = math.isfinite(loss)
            if self.cfg.non_finite and not finite and self._loss_was_finite and fired is None:
                fired = Fired(update, "non_finite", loss, 0.0, f"loss {loss}")
            self._loss_was_finite = finite
        k = self.cfg.slow
        if k is not None and fired is None and self._seen >= self.cfg.warmup:
            limit = max(k * self.median(), self.median() + self.cfg.slow_min_excess_s)
            if seconds > limit:
                wait = f" ({waited * 1e3:.1f} ms waiting for a CPU left out)" if waited else ""
                fired = Fired(update, "slow", seconds, limit,
                              f"{seconds * 1e3:.1f} ms > {k:g} x median "
                              f"{self.median() * 1e3:.1f} ms{wait}")
        self._add(seconds)
        return fired

    def _add(self, seconds: float) -> None:
        self._seen += 1
        self._times.append(seconds)
        bisect.insort(self._sorted, seconds)
        if len(self._times) > self.cfg.window:
            old = self._times.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
