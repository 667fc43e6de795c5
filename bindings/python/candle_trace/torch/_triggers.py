"""When an update is worth a trace: the triggers of :class:`candle_trace.torch.watch`,
evaluated at the end of every update from a few numbers, in memory that does not grow
with the run.

- ``slow``: the update (from one ``step()`` to the next: the input pipeline included)
  took longer than its window's median (the last ``window`` updates, once ``warmup``
  have been seen) plus an excess that must clear three bars at once, each against one
  kind of noise a trace of the update would not explain:

  - ``(slow - 1) x median``: the factor (3 by default). Steady training's p99 is rarely
    1.5x its median on a quiet machine; a data-loader stall, a recompilation, a
    checkpoint, a straggler are 2-10x;
  - ``slow_spread x MAD`` (10, the window's median absolute deviation): a workload whose
    updates vary by nature (sequence lengths, a periodic evaluation) widens its own bar,
    while steady training's MAD is a few percent of the median and sets nothing;
  - ``slow_min_excess_s`` (5 ms) *plus* ``slow_wait_share`` (1) times the time the
    machine held the update up (:class:`CpuWait`): the time its thread waited,
    runnable, for a CPU (Linux's ``/proc/thread-self/schedstat``) and, when the
    thread never blocked in the update, all of its time off the CPU (a vCPU the host
    took away: on the loaded 2-vCPU VM of BENCHMARKS.md an update of a 0.5 ms MLP once
    took 8.3 ms with no CPU wait, no context switch at all and a steal tick). That
    time itself is left out of the update's: a stall of the machine, not of the
    program, which a trace of the update would not explain. But the machine's stall
    does not end there: a thread preempted many times comes back to caches others
    filled, and its own CPU time inflates. In 10,000-update runs of that MLP,
    updates were up to 0.9 ms over their median with no wait at all, 1.2 ms over it
    after 25.5 ms of waiting (30 preemptions), 2.4 ms after 2.4 ms (load 7.5):
    excesses up to the wait itself, and the 3x-or-median-plus-1-ms rule before this
    one fired on them. And some stalls of the machine leave no trace in the thread's
    accounts at all: on an AMD EPYC VM at load ~1 (2026-12-04), 10,000-update runs of
    a 0.4 ms MLP under the flight recorder had single updates of 2.5-5.0 ms -- every
    op in them several times slower, or one gap of 2.4 ms between two lines of Python
    -- with no run-queue wait, no context switch, no page fault, no steal and no
    collection, in about half the runs (``noisy-updates-c``: 3.0 ms, where a 2 ms
    floor fired). The floor is 5 ms for that: it makes the factor grow for sub-ms
    updates (21x at 0.25 ms, 6x at 1 ms); from 2.5 ms on the 3x factor sets the bar,
    and a stall of the program's own is missed only when it is under 5 ms or the
    machine held the update up for about as long. A data loader the update waits
    for, an I/O, a lock, a straggler's collective block the thread: they stay in the
    time and raise no bar.

  An update's time also leaves out the capture's own work -- the tracer time of its
  hooks, step()'s closing and arming of captures -- and an update captured in full
  (after a trigger) is not timed at all: it costs several times its length in
  statistics, and would fire the trigger again for itself.
  Check: ``test_torch_triggers.py`` feeds the rule the update times of a real 10,000-update
  run on that machine (``tests/data/noisy-updates-*.txt.gz``, on which the old rule
  fired): nothing fires, and a 5x stall put into the same series fires at once.
- ``non_finite``: the loss given to ``backward`` is NaN or infinite, on the update it
  first turns so (not again until it has been finite). Under mixed precision, the loss
  a ``GradScaler`` scaled, not its product with the scale (which overflows where the
  loss does not: see _amp).
- ``non_finite_grad``: a gradient's norm is NaN or infinite, where gradients are read: in
  an update captured in full (after a trigger), whose trace it names, when no other
  trigger fired for it -- and an optimizer's step was called in it (a GradScaler calls
  none on gradients its scale made overflow, and backs off: mixed precision at work).
  The flight recorder does not read them: the norms of every gradient cost 0.30 ms of a
  86 ms GPT-style update and 0.67 ms of a 171 ms CNN one on the machine of BENCHMARKS.md
  (0.35-0.39%, a third of the 1% the always-on triggers may cost), and on CUDA a copy to
  the host each update; a loss that turns non-finite (``non_finite``) is what catches
  the usual cause, and its update's trace has them.
- ``exception``: the update raised (an out-of-memory error, say).
- ``user``: the program called ``trigger(why)``.
"""

from __future__ import annotations

import bisect
import math
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Deque, List, Mapping, Optional, Tuple

try:
    import resource
except ImportError:  # not POSIX
    resource = None  # type: ignore[assignment]

__all__ = ["Triggers", "Fired", "Evaluator", "CpuWait"]


@dataclass
class Triggers:
    """Which triggers fire (see the module's doc); ``None`` or ``False`` turns one off."""

    slow: Optional[float] = 3.0
    warmup: int = 10
    window: int = 64
    #: and slower than the median by at least this much plus ``slow_wait_share`` x its
    #: CPU wait: a smaller excess is the machine's hiccup (see the module's doc)
    slow_min_excess_s: float = 0.005
    #: and by more than this many median absolute deviations of the window
    slow_spread: float = 10.0
    #: the share of the update's CPU wait added to ``slow_min_excess_s``
    slow_wait_share: float = 1.0
    non_finite: bool = True
    #: a non-finite gradient norm in an update captured in full
    non_finite_grad: bool = True
    exception: bool = True

    def check(self) -> None:
        if self.slow is not None and not (isinstance(self.slow, (int, float)) and self.slow > 1):
            raise ValueError(f"triggers.slow must be a factor > 1 (or None), got {self.slow!r}")
        for name in ("warmup", "window"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"triggers.{name} must be an integer >= 1, got {v!r}")
        for name in ("slow_min_excess_s", "slow_spread", "slow_wait_share"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"triggers.{name} must be a number >= 0, got {v!r}")


@dataclass
class Fired:
    """One trigger that fired: on which update, why, the value against the threshold,
    and the trace written for it -- or, None there, why none was (``no_trace``: the
    run's cap on traces reached, say)."""

    update: int
    trigger: str
    value: float
    threshold: float
    detail: str = ""
    trace: Optional[str] = None
    no_trace: str = ""


class CpuWait:
    """How long the machine held the calling thread up (seconds): the time it waited,
    runnable, for a CPU, from the kernel's schedstat of the thread (its second field,
    ns on a runqueue; 0 where there is none: not Linux, schedstats off), and -- given
    the interval's wall time -- the time it was off its CPU without having blocked
    (no voluntary context switch, ``getrusage(RUSAGE_THREAD)``: the thread neither
    slept nor waited for I/O or a lock, so the time is a vCPU the host took away, an
    interrupt's, the machine's in any case; its CPU time is ``CLOCK_THREAD_CPUTIME``).
    A thread that blocked in the interval keeps its off-CPU time: a data loader's wait
    is the program's. :meth:`take` covers the time since the call before, on the thread
    of the call before (a new thread starts from 0).

    To read the CPU clock of the running thread the kernel takes its scheduler's lock,
    and on a VM whose other vCPU holds that lock when the host preempts it the read
    waits for the host (the likely cause of what was seen): on the 2-vCPU VM of
    BENCHMARKS.md, for stretches of an hour,
    ~5 ms in 1-3% of the reads made after a millisecond of work (130-640 µs on
    average, more than all the rest the triggers do per update), while schedstat's
    read stayed at a few µs. A read that takes over ``SLOW_READ_S`` makes the next
    ``FALLBACK_TAKES`` calls use schedstat's own CPU time (its first field, read with
    the wait anyway) instead: the figure the scheduler last wrote, up to a tick behind
    at each end, so off-CPU time then counts only beyond ``TICK_S``, a bound of that
    error (CONFIG_HZ=250's tick)."""

    #: a read of the CPU clock slower than this is the host's lock-holder preemption
    SLOW_READ_S = 0.001
    #: calls that use schedstat's CPU time after a slow read, before the clock is tried
    #: again
    FALLBACK_TAKES = 1000
    #: seconds: the most schedstat's CPU time can be off at both ends of an interval
    #: together, taken off the off-CPU time when it is used
    TICK_S = 0.004

    _usage = getattr(resource, "RUSAGE_THREAD", None) if resource is not None else None

    def __init__(self) -> None:
        self._fd = -1
        self._tid = -1
        self._last = 0
        # the thread's CPU ns at the call before: from its clock (None: not read) and
        # from schedstat
        self._clock: Optional[int] = None
        self._sched = 0
        self._blocks = 0
        #: calls left that do not read the clock (after a slow read)
        self.fallback = 0

    def _read(self) -> Tuple[int, int]:
        """The thread's (CPU ns, runqueue ns) from schedstat; (0, 0) where not known."""
        try:
            f = os.pread(self._fd, 128, 0).split()
            return int(f[0]), int(f[1])
        except (OSError, ValueError, IndexError):
            return 0, 0

    def _read_clock(self) -> Optional[int]:
        """The thread's CPU clock, unless a slow read made the calls go without it."""
        if self.fallback > 0:
            self.fallback -= 1
            return None
        t = time.perf_counter()
        ns = time.thread_time_ns()
        if time.perf_counter() - t > self.SLOW_READ_S:
            self.fallback = self.FALLBACK_TAKES
        return ns

    def _blocked(self) -> int:
        """Voluntary context switches of the thread so far (-1: not known)."""
        if self._usage is None:
            return -1
        try:
            return resource.getrusage(self._usage).ru_nvcsw
        except (OSError, ValueError):
            return -1

    def take(self, wall: Optional[float] = None) -> float:
        tid = threading.get_native_id()
        blocks = self._blocked()
        clock = self._read_clock()
        if tid != self._tid:
            self.close()
            self._tid = tid
            try:
                self._fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
            except OSError:
                self._fd = -1
            self._sched, self._last = self._read() if self._fd >= 0 else (0, 0)
            self._clock, self._blocks = clock, blocks
            return 0.0
        sched, now = self._read() if self._fd >= 0 else (0, 0)
        waited, self._last = max(now - self._last, 0) / 1e9, now
        if clock is not None and self._clock is not None:
            ran, error = (clock - self._clock) / 1e9, 0.0
        else:
            ran, error = (sched - self._sched) / 1e9, self.TICK_S
        self._clock, self._sched = clock, sched
        slept, self._blocks = blocks != self._blocks or blocks < 0, blocks
        if wall is not None and not slept and (self._fd >= 0 or not error):
            # all of its off-CPU time was the machine's (beyond what schedstat's error
            # could make of nothing)
            waited = max(waited, wall - ran - error)
        return waited

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._tid = -1, -1


def held_up(seconds: float, cpu_wait: float) -> float:
    """The part of an update's ``seconds`` the machine held its thread up for: the
    measured CPU wait, never below 0 nor above the update's time; the slow trigger judges
    the rest."""
    return min(max(cpu_wait, 0.0), seconds)


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

    @property
    def timed(self) -> int:
        """How many updates' times the slow trigger has seen (captured ones are not)."""
        return self._seen

    @property
    def slow_armed(self) -> bool:
        """Whether the slow trigger can fire: on, and its warm-up's updates timed."""
        return self.cfg.slow is not None and self._seen >= self.cfg.warmup

    def median(self) -> float:
        s = self._sorted
        n = len(s)
        return (s[(n - 1) // 2] + s[n // 2]) / 2 if n else 0.0

    def gradients(self, update: int, norms: Mapping[str, Optional[float]]) -> Optional[Fired]:
        """``non_finite_grad`` for an update whose gradient norms were read: the first
        non-finite norm's value, the parameters that have one in the detail."""
        if not self.cfg.non_finite_grad:
            return None
        bad = [(k, v) for k, v in norms.items() if v is not None and not math.isfinite(v)]
        if not bad:
            return None
        names = ", ".join(k for k, _ in bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        return Fired(update, "non_finite_grad", bad[0][1], 0.0,
                     f"non-finite gradient norm in {names} ({len(bad)} of {len(norms)})")

    def mad(self) -> float:
        """The window's median absolute deviation from its median."""
        med = self.median()
        dev = sorted(abs(x - med) for x in self._sorted)
        n = len(dev)
        return (dev[(n - 1) // 2] + dev[n // 2]) / 2 if n else 0.0

    def end_of_update(self, update: int, seconds: Optional[float], loss: Optional[float],
                      cpu_wait: float = 0.0) -> Optional[Fired]:
        """The first trigger that fires for the update just ended (user, non-finite,
        slow). The update's time is ``seconds`` less ``cpu_wait`` (the time the machine
        held its thread up, :class:`CpuWait`), and joins the window; ``seconds`` None: the update is not
        timed (captured in full: its time is the capture's), the slow trigger skips it."""
        fired: Optional[Fired] = None
        if self._asked is not None:
            fired = Fired(update, "user", seconds or 0.0, 0.0, self._asked)
            self._asked = None
        if loss is not None:
            finite = math.isfinite(loss)
            if self.cfg.non_finite and not finite and self._loss_was_finite and fired is None:
                fired = Fired(update, "non_finite", loss, 0.0, f"loss {loss}")
            self._loss_was_finite = finite
        if seconds is None:
            return fired
        waited = held_up(seconds, cpu_wait)
        seconds -= waited
        if fired is None and self.slow_armed:
            fired = self._slow(update, seconds, waited)
        self._add(seconds)
        return fired

    def _slow(self, update: int, seconds: float, waited: float) -> Optional[Fired]:
        """The slow trigger (see the module's doc): the cheap bars first, the spread's
        (a sort of the window) only for an update that clears them."""
        k = self.cfg.slow
        if k is None:
            return None
        med = self.median()
        floor = self.cfg.slow_min_excess_s + self.cfg.slow_wait_share * waited
        bars = [((k - 1) * med, f"{k:g} x median"),
                (floor, f"median + {self.cfg.slow_min_excess_s * 1e3:g} ms"
                        + (f" + {self.cfg.slow_wait_share:g} x the {waited * 1e3:.1f} ms "
                           f"the machine held it up" if waited >= 5e-5 else ""))]
        if seconds <= med + max(b for b, _ in bars):
            return None
        bars.append((self.cfg.slow_spread * self.mad(), f"median + {self.cfg.slow_spread:g} x MAD"))
        excess, why = max(bars, key=lambda b: b[0])
        limit = med + excess
        if seconds <= limit:
            return None
        wait = f"; {waited * 1e3:.1f} ms the machine held it up left out" if waited >= 5e-5 else ""
        return Fired(update, "slow", seconds, limit,
                     f"{seconds * 1e3:.1f} ms > {limit * 1e3:.1f} ms ({why}; "
                     f"median {med * 1e3:.1f} ms{wait})")

    def _add(self, seconds: float) -> None:
        self._seen += 1
        self._times.append(seconds)
        bisect.insort(self._sorted, seconds)
        if len(self._times) > self.cfg.window:
            old = self._times.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
