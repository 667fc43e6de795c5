"""The slow trigger's arithmetic (candle_trace.torch._triggers): what counts as an
update's time, and when it is slow. No timing asserts on the machine's speed: the
updates are given, except where the kernel's own accounting is what is tested."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")
from candle_trace.torch._triggers import CpuWait, Evaluator, Triggers  # noqa: E402

MS = 1e-3


def steady(ev, n, seconds=0.25 * MS):
    for i in range(1, n + 1):
        assert ev.end_of_update(i, seconds, 1.0) is None


def test_a_sub_millisecond_update_stalled_by_the_scheduler_is_not_slow():
    ev = Evaluator(Triggers())
    steady(ev, 64)
    # 4 ms of wall time, 3.8 ms of it runnable but waiting for a CPU: the machine's stall
    assert ev.end_of_update(65, 4 * MS, 1.0, cpu_wait=3.8 * MS) is None
    # the same 4 ms spent in the program (a data loader's sleep is no CPU wait): slow
    fired = ev.end_of_update(66, 4 * MS, 1.0, cpu_wait=0.0)
    assert fired is not None and fired.trigger == "slow"
    assert fired.value == pytest.approx(4 * MS)
    assert fired.threshold == pytest.approx(0.25 * MS + 1 * MS)  # median + slow_min_excess_s


def test_the_wait_left_out_is_stated_and_bounded_by_the_update():
    ev = Evaluator(Triggers())
    steady(ev, 20, 1 * MS)
    fired = ev.end_of_update(21, 30 * MS, 1.0, cpu_wait=10 * MS)
    assert fired.value == pytest.approx(20 * MS) and fired.threshold == pytest.approx(3 * MS)
    assert "10.0 ms waiting for a CPU left out" in fired.detail
    # a wait larger than the update (clock granularity) leaves 0, never a negative time
    assert ev.end_of_update(22, 1 * MS, 1.0, cpu_wait=5 * MS) is None
    assert min(ev._sorted) == 0.0


def test_the_window_holds_the_updates_time_less_the_wait():
    ev = Evaluator(Triggers(window=4))
    for i, (s, w) in enumerate([(2 * MS, 1 * MS)] * 4):
        ev.end_of_update(i + 1, s, None, cpu_wait=w)
    assert ev.median() == pytest.approx(1 * MS)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="schedstat is Linux's")
def test_cpu_wait_reads_the_threads_runqueue_time():
    w = CpuWait()
    assert w.take() == 0.0  # the first call starts the count
    time.sleep(0.05)
    assert w.take() < 0.02, "a sleeping thread waits for no CPU"
    # more spinning processes than cores: this thread, spinning too, waits its turn
    import os
    n = 2 * (os.cpu_count() or 1) + 1
    spin = "import time\nt = time.time()\nwhile time.time() - t < 0.6: pass"
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(n)]
    try:
        t = time.time()
        while time.time() - t < 0.5:
            pass
        waited = w.take()
    finally:
        for p in procs:
            p.wait()
    assert 0.02 < waited < 0.6, waited
    w.close()
