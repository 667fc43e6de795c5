"""Where the flight recorder's CPU goes (issue 13): one process takes turns -- ``BLOCK``
untraced updates, then ``BLOCK`` under ``candle_trace.torch.watch`` (its first update not
counted) -- for ``ROUNDS`` rounds under ``perf record`` (CLOCK_MONOTONIC, no call graphs),
and the samples inside each mode's time windows are summed by the library they landed
in, per update. What the flight recorder adds is the difference, component by
component: our C++ observer, the library's C fast paths and its Go side, torch's
RecordFunction and allocator work done for the observer, the Python of the hooks and
``step()``, the C runtime, and the model's own math slowed by all of it (caches).
Interleaving in one process keeps the machine's drift out of the difference.

    make bench-watch-perf   # or:
    PYTHONPATH=bindings/python python3 bindings/python/bench_watch_perf.py [WORKLOAD] [ROUNDS] [BLOCK]

``CANDLE_TRACE_PERF_SYMBOLS=N`` also prints the N symbols whose samples the recorder adds
most to (per update, both modes' samples of that symbol compared).

Needs ``perf`` (linux-perf) allowed to sample the process (perf_event_paranoid <= 2).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HZ = 2000
GO = ("runtime.", "github.com/", "main.", "internal/", "sync.", "syscall.", "os.", "fmt.",
      "strings.", "strconv.", "errors.", "time.", "_cgo", "crosscall", "encoding/")
GROUPS = [
    ("observer (_observer.cpp's callbacks)", lambda d, s: "candle_trace_observer" in d),
    ("libcandle_trace: Go (session, runtime)", lambda d, s: "libcandle_trace" in d and s.startswith(GO)),
    ("libcandle_trace: C fast paths", lambda d, s: "libcandle_trace" in d),
    ("torch: RecordFunction, boxing, allocator", lambda d, s: "libtorch_cpu" in d or "libc10" in d),
    ("Python, ctypes, libffi", lambda d, s: any(x in d for x in ("python3", "_ctypes", "libffi", "libtorch_python"))),
    ("libc, libstdc++, ld.so", lambda d, s: any(x in d for x in ("libc.so", "libstdc++", "ld-linux", "vdso"))),
    # the recorder's own work ends here (OWN); what follows is the model's, slowed by it
    ("BLAS and other math (the model)", lambda d, s: any(x in d for x in ("blas", "dnnl", "sleef", "gomp"))),
    ("kernel", lambda d, s: "kernel" in d),
    ("other", lambda d, s: True),
]

OWN = 6  # GROUPS[:OWN] is the recorder's own CPU


def child(name: str, rounds: int, block: int, out: str) -> None:
    """The measured program: modes in turns, their time windows written to ``out``."""
    sys.path.insert(0, str(REPO / "bindings" / "python"))
    sys.path.insert(0, str(REPO / "examples" / "python"))
    import torch

    import candle_trace.torch as ctt
    import workloads

    torch.set_num_threads(1)
    w = workloads.WORKLOADS[name]()
    mono = lambda: time.clock_gettime(time.CLOCK_MONOTONIC)  # noqa: E731 - perf's clock
    win: dict = {"untraced": [], "flight": []}
    for _ in range(3):
        w.update(*w.batch())
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            t = mono()
            for _ in range(block):
                w.update(*w.batch())
            win["untraced"].append((t, mono()))
            with ctt.watch(w.model, w.optimizer, os.path.join(tmp, str(r))) as wt:
                w.update(*w.batch())
                wt.step()
                t = mono()
                for _ in range(block):
                    w.update(*w.batch())
                    wt.step()
                win["flight"].append((t, mono()))
    with open(out, "w") as f:
        json.dump({"windows": win, "per_mode": rounds * block}, f)


def per_update(script: str, windows: dict, updates: int) -> tuple[dict, dict]:
    """mode -> component -> ms per update, and mode -> (library, symbol) -> ms per
    update, from ``perf script`` lines."""
    spans = sorted((a, b, m) for m, ws in windows.items() for a, b in ws)
    counts: dict = {m: Counter() for m in windows}
    symbols: dict = {m: Counter() for m in windows}
    line_re = re.compile(r"\s*(\d+\.\d+):\s+\S+\s+(.*) \((.*)\)\s*$")
    for line in script.splitlines():
        m = line_re.match(line)
        if not m:
            continue
        t = float(m.group(1))
        mode = next((md for a, b, md in spans if a <= t <= b), None)
        if mode is None:
            continue
        sym, dso = m.group(2), m.group(3)
        counts[mode][next(g for g, f in GROUPS if f(dso, sym))] += 1
        symbols[mode][(os.path.basename(dso), re.sub(r"\+0x[0-9a-f]+$", "", sym))] += 1
    scale = HZ / 1e3 * updates
    return ({md: {g: c[g] / scale for g, _ in GROUPS} for md, c in counts.items()},
            {md: {k: n / scale for k, n in c.items()} for md, c in symbols.items()})


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return 0
    name = sys.argv[1] if len(sys.argv) > 1 else "gpt-b8"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    block = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    with tempfile.TemporaryDirectory() as tmp:
        data, out = os.path.join(tmp, "perf.data"), os.path.join(tmp, "windows.json")
        subprocess.run(["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "-F", str(HZ), "-o", data,
                        sys.executable, __file__, "--child", name, str(rounds), str(block), out],
                       check=True)
        script = subprocess.run(["perf", "script", "-i", data, "-F", "time,ip,sym,dso"],
                                check=True, capture_output=True, text=True).stdout
        with open(out) as f:
            got = json.load(f)
    res, symbols = per_update(script, got["windows"], got["per_mode"])
    u, f = res["untraced"], res["flight"]
    print(f"{name}: {got['per_mode']} updates per mode ({rounds} rounds of {block}), perf at "
          f"{HZ} Hz, CPU ms per update (perf's own cost included)")
    print(f"  {'component':42s} {'untraced':>9s} {'flight':>9s} {'added':>7s}")
    for g, _ in GROUPS:
        print(f"  {g:42s} {u[g]:9.2f} {f[g]:9.2f} {f[g] - u[g]:+7.2f}")
    own = sum(f[g] - u[g] for g, _ in GROUPS[:OWN])
    label = f"the recorder's own (the first {OWN})"
    print(f"  {label:42s} {'':9s} {'':9s} {own:+7.2f}")
    tu, tf = sum(u.values()), sum(f.values())
    print(f"  {'total':42s} {tu:9.2f} {tf:9.2f} {tf - tu:+7.2f} ({tf / tu - 1:+.1%})")
    top = int(os.environ.get("CANDLE_TRACE_PERF_SYMBOLS", "0"))
    if top:
        su, sf = symbols["untraced"], symbols["flight"]
        added = sorted(((sf.get(k, 0) - su.get(k, 0), k) for k in set(su) | set(sf)), reverse=True)
        print(f"  the {top} symbols the recorder adds most to, ms per update:")
        for d, (lib, sym) in added[:top]:
            print(f"    {d:+6.3f}  {sym[:70]}  ({lib})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
