"""How often our Go threads wake, and what CPU they spend, while the program computes
(issue 13's one-P change).

A flight recorder's session is reopened at every update; between reopens the
program computes on the CPU for 30 ms. For one P (the default) and two, in
alternating processes, this prints the distribution of our threads' voluntary
context switches per update and the CPU they spent in it (schedstat) -- Go's monitor thread polling every 20 us shows as
updates of ~60. A benchmark, not a test: how often the monitor polls depends on
the host's load (two CPU hogs beside it give one P some 40-60 updates too).

    python3 tests/bench/go_wakeups.py [ROUNDS] [LIB]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent("""
    import ctypes, json, os, sys, time
    lib = ctypes.CDLL(sys.argv[1])
    s = ctypes.c_uint64()
    run = b'{"entrypoint":"wakeups","phase":"train","capture_step":1,"device":"cpu","buffer":{}}'
    assert lib.ct_open(sys.argv[2].encode(), run, ctypes.byref(s)) == 0
    me = str(os.getpid())
    def others():  # voluntary switches only (sleeps, not preemptions), and CPU ns
        n = cpu = 0
        for t in os.listdir("/proc/self/task"):
            if t != me:
                for line in open(f"/proc/self/task/{t}/status"):
                    if line.startswith("voluntary_ctxt_switches"):
                        n += int(line.split()[1])
                cpu += int(open(f"/proc/self/task/{t}/schedstat").read().split()[0])
        return n, cpu
    time.sleep(0.1)
    counts = []
    for i in range(25):
        before = others()
        nxt = ctypes.c_uint64()
        assert lib.ct_reopen(s, f"{sys.argv[2]}.{i}".encode(), i + 1, ctypes.byref(nxt)) == 0
        s = nxt
        t = time.monotonic()
        while time.monotonic() - t < 0.03:
            pass
        after = others()
        counts.append([after[0] - before[0], after[1] - before[1]])
    assert lib.ct_discard(s) == 0
    print(json.dumps(counts))
""")


def updates(lib: str, procs: str) -> list[list[int]]:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMAXPROCS", "CANDLE_TRACE_PATH")}
    env["CANDLE_TRACE_GOMAXPROCS"] = procs
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run([sys.executable, "-c", PROGRAM, lib, str(Path(d) / "t.jsonl")],
                             env=env, capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def describe(got: list[list[int]]) -> str:
    c = sorted(n for n, _ in got)
    cpu = sorted(ns / 1e3 for _, ns in got)
    polled = sum(1 for n in c if n >= 30)
    return (f"mean {sum(c) / len(c):5.1f}  median {c[len(c) // 2]:3d}  max {c[-1]:3d}  "
            f"updates with >= 30: {polled:3d} of {len(c)}; their CPU per update: mean "
            f"{sum(cpu) / len(cpu):6.1f} us, median {cpu[len(cpu) // 2]:6.1f} us")


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    lib = sys.argv[2] if len(sys.argv) > 2 else str(REPO / "build" / "libcandle_trace.so")
    got: dict[str, list[list[int]]] = {"1": [], "2": []}
    for _ in range(rounds):
        for procs in got:
            got[procs] += updates(lib, procs)
    print(f"our threads' voluntary switches per update, {rounds} x 25 updates of 30 ms:")
    for procs, counts in got.items():
        print(f"  {procs} P{'s' if procs != '1' else ' '}: {describe(counts)}")


if __name__ == "__main__":
    main()
