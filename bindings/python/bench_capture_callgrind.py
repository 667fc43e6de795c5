"""Where a captured update's instructions go, counted by callgrind (deterministic: the
figures do not move with the machine's load, unlike bench_capture.py's times).

    PYTHONPATH=bindings/python /usr/bin/python3 bindings/python/bench_capture_callgrind.py \
        [--repo CHECKOUT] [--keep DIR] [WORKLOAD...]

For each workload of examples/python/workloads.py (default: mlp gpt-b1), one update is
counted four ways, each in its own valgrind process, instructions collected only while
the update runs (client requests from a small shim built here; needs valgrind and its
headers, and a C compiler):

- untraced: the update alone;
- torch.profiler: under torch.profiler.profile(record_shapes=True, profile_memory=True);
- ours, outside: the captured update, outside the tracer's intervals -- what the session
  clock counts as the model's: the update's own instructions plus what the capture adds
  that no interval covers (torch's record functions for the observer, the ends of the
  intervals around their clock reads, hooks' Python before an interval opens);
- ours, inside: the captured update's tracer intervals (hooks' bookkeeping, the
  observer's callbacks, statistics) -- left out of every span and stated in the trace.

The library's tracer intervals are reached through the shim, which switches collection
when the outermost interval opens and closes: an interval's own begin counts outside,
its end inside (in time, each is split at its clock read; until 2026-12-02 the shim
counted the end outside as well, against this rule). The leak (outside minus
untraced) is before the calibrated backdating (tracer_estimated_ns), which is time.
``--repo`` counts another checkout's binding and workloads (main's, for a before/after);
``--keep DIR`` keeps callgrind's profiles there (``callgrind_annotate --inclusive=yes
DIR/cg.mlp.inside`` says which functions the instructions are in); ``--warm`` counts the
process's second capture (what the observer learns once per process -- which op kinds
to quiet -- already known, as in bench_capture.py's rounds but the first), without it
the first; ``CANDLE_TRACE_CALLGRIND_JOBS=N`` runs N valgrinds at a time.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(os.environ.get("CANDLE_TRACE_BENCH_REPO") or Path(__file__).resolve().parents[2])
MODES = ("untraced", "tp", "outside", "inside")
KEEP = ""  # --keep: the folder callgrind's profiles are kept in
JOBS = int(os.environ.get("CANDLE_TRACE_CALLGRIND_JOBS", "1"))  # valgrinds at a time
#: --warm: the counted capture is the process's second (bench_capture.py's rounds after the
#: first): what the observer learns once per process (which op kinds to quiet) is known
WARM = os.environ.get("CANDLE_TRACE_CALLGRIND_WARM") == "1"

SHIM = r"""
#include <stdint.h>
#include <valgrind/callgrind.h>
typedef int (*b0_fn)(uint64_t);
typedef int (*be_fn)(uint64_t, uint64_t);
typedef int (*bat_fn)(uint64_t, uint64_t, uint64_t *);
static b0_fn real_b, real_e;
static be_fn real_be, real_ex;
static bat_fn real_bat;
static int depth, in_update, mode; /* 0: the whole update, 1: outside intervals, 2: inside */
void shim_init(void *b, void *be, void *e, int m) { real_b = b; real_be = be; real_e = e; mode = m; }
void shim_init_at(void *bat, void *ex) { real_bat = bat; real_ex = ex; }
static void opened(void) { if (in_update && depth++ == 0 && mode) CALLGRIND_TOGGLE_COLLECT; }
static void closing(void) { if (in_update && --depth == 0 && mode) CALLGRIND_TOGGLE_COLLECT; }
int shim_begin(uint64_t h) { int r = real_b(h); opened(); return r; }
int shim_begin_earlier(uint64_t h, uint64_t e) { int r = real_be(h, e); opened(); return r; }
int shim_end(uint64_t h) { int r = real_e(h); closing(); return r; }
int shim_begin_at(uint64_t h, uint64_t e, uint64_t *now) { int r = real_bat(h, e, now); opened(); return r; }
/* an interval opened and closed in one call: counted where the caller is */
int shim_exclude_earlier(uint64_t h, uint64_t e) { return real_ex(h, e); }
void shim_update(int on) {
    if (on) {
        CALLGRIND_START_INSTRUMENTATION;
        in_update = 1; depth = 0;
        if (mode != 2) CALLGRIND_TOGGLE_COLLECT;
    } else {
        if (mode == 0 || (mode == 1 && depth == 0) || (mode == 2 && depth > 0))
            CALLGRIND_TOGGLE_COLLECT;
        in_update = 0;
        CALLGRIND_STOP_INSTRUMENTATION;
    }
}
"""


def _child(name: str, mode: str, shim_path: str) -> None:
    """One update of ``name`` counted as ``mode`` (run under valgrind)."""
    sys.path.insert(0, str(REPO / "bindings" / "python"))
    sys.path.insert(0, str(REPO / "examples" / "python"))
    import torch

    import candle_trace.torch as ctt
    import workloads
    from candle_trace import _lib
    from candle_trace.torch import _observer

    torch.set_num_threads(1)
    shim = ctypes.CDLL(shim_path)
    lib = _lib.load()
    addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    c = lib.c
    shim.shim_init(ctypes.c_void_p(addr(c.ct_tracer_begin)),
                   ctypes.c_void_p(addr(c.ct_tracer_begin_earlier)),
                   ctypes.c_void_p(addr(c.ct_tracer_end)),
                   {"outside": 1, "inside": 2}.get(mode, 0))
    shim.shim_update.argtypes = [ctypes.c_int]
    # the binding's intervals and the observer's through the shim
    lib.raw.ct_tracer_begin, lib.raw.ct_tracer_end = shim.shim_begin, shim.shim_end
    obs = _observer.get()
    if obs is not None and len(obs._dll.ct_obs_set_abi.argtypes or ()) == 8:
        # the observer's intervals open with their clock read (ct_tracer_begin_at)
        shim.shim_init_at(ctypes.c_void_p(addr(c.ct_tracer_begin_at)),
                          ctypes.c_void_p(addr(c.ct_tracer_exclude_earlier)))
        obs._dll.ct_obs_set_abi(addr(c.ct_now_ns), addr(shim.shim_begin_at),
                                addr(shim.shim_exclude_earlier), addr(shim.shim_end),
                                addr(c.ct_record_op), addr(c.ct_record_memory),
                                addr(c.ct_record_data_edge), addr(c.ct_last_error))
    elif obs is not None:  # a checkout before ct_tracer_begin_at (--repo)
        obs._dll.ct_obs_set_abi(addr(c.ct_now_ns), addr(shim.shim_begin_earlier),
                                addr(shim.shim_end), addr(c.ct_record_op),
                                addr(c.ct_record_memory), addr(c.ct_record_data_edge),
                                addr(c.ct_last_error))
        if hasattr(obs, "native") and not hasattr(obs, "native_over"):
            # the module spans' brackets in C++ of a checkout before native_over (--repo)
            import collections
            import collections.abc
            obs.native = obs._dll.ct_obs_native(
                addr(c.ct_span_begin), addr(c.ct_span_end), addr(shim.shim_begin),
                addr(shim.shim_end), torch.Tensor, torch.overrides.has_torch_function_unary,
                collections.OrderedDict, collections.abc.Mapping)
    if obs is not None and hasattr(obs, "native_over"):
        # the module spans' brackets in C++ (statistics included) through the shim too:
        # left to the library's own, they counted as the model's
        obs.native = obs.native_over(addr(shim.shim_begin), addr(shim.shim_end))
    w = workloads.WORKLOADS[name]()
    for _ in range(5):
        w.update(*w.batch())
    shim_update = shim.shim_update

    def update(on: int) -> None:
        # Python's collector empties its youngest generation first, in every mode: else
        # whether a collection (~0.2M instructions) falls inside the one counted update
        # depends on how many objects happened to be allocated before it (under
        # torch.profiler it runs before the profiler starts, below).
        if on and mode != "tp":
            gc.collect()
        shim_update(on)

    if mode == "untraced":
        w.update(*w.batch())
        x, y = w.batch()
        update(1)
        w.update(x, y)
        update(0)
    elif mode == "tp":
        from torch.profiler import ProfilerActivity, profile

        for i in range(2):
            x, y = w.batch()
            tp = profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                         profile_memory=True)
            gc.collect()  # not while it records: it would record the frees
            tp.__enter__()
            if i:
                update(1)
            w.update(x, y)
            if i:
                update(0)
            tp.__exit__(None, None, None)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            for counted in ([False, True] if WARM else [True]):
                prof = ctt.profile(w.model, w.optimizer, os.path.join(tmp, f"t{counted}.jsonl"),
                                   capture_step=3)
                prof.start()
                for i in range(1, 5):
                    x, y = w.batch()
                    if i == 3 and counted:
                        update(1)
                    w.update(x, y)
                    if i == 3 and counted:
                        update(0)
                    prof.step()
                prof.stop()


def _count(name: str, mode: str, shim: str, tmp: str) -> int:
    out = os.path.join(KEEP or tmp, f"cg.{name}.{mode}")
    env = dict(os.environ, PYTHONHASHSEED="0", GODEBUG="asyncpreemptoff=1",
               CANDLE_TRACE_BENCH_REPO=str(REPO))
    r = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                        "--collect-atstart=no", f"--callgrind-out-file={out}",
                        sys.executable, __file__, "--child", name, mode, shim],
                       capture_output=True, text=True, env=env)
    m = re.search(r"Collected : (\d+)", r.stderr)
    if r.returncode != 0 or not m:
        raise RuntimeError(f"valgrind {name} {mode} failed:\n{r.stderr[-2000:]}")
    return int(m.group(1))


def run(names) -> dict:
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        shim = os.path.join(tmp, "shim.so")
        src = os.path.join(tmp, "shim.c")
        Path(src).write_text(SHIM)
        subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-o", shim, src],
                       check=True)
        # one valgrind per mode and workload, JOBS at a time (counts do not depend on load)
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max_workers=JOBS) as pool:
            futs = {(n, m): pool.submit(_count, n, m, shim, tmp) for n in names for m in MODES}
            for name in names:
                res[name] = {m: futs[(name, m)].result() for m in MODES}
    return res


def print_table(res: dict) -> None:
    print("\ninstructions of one update (callgrind; torch "
          f"{__import__('torch').__version__}, 1 thread)")
    print(f"  {'workload':9s} {'untraced':>11s} {'torch.prof +':>12s} {'ours: leak':>11s} "
          f"{'(of untr.)':>10s} {'tracer work':>12s} {'ours +':>11s} {'ours/tp':>8s}")
    for name, r in res.items():
        u = r["untraced"]
        tp, leak, inside = r["tp"] - u, r["outside"] - u, r["inside"]
        print(f"  {name:9s} {u:11,d} {tp:12,d} {leak:11,d} {leak / u:9.1%} {inside:12,d} "
              f"{leak + inside:11,d} {(leak + inside) / max(tp, 1):7.2f}x")
    print("  (torch.prof +: instructions torch.profiler adds in the update; leak: the captured "
          "update's outside the tracer's intervals, less untraced; tracer work: inside them; "
          "ours +: the two)")


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        _child(*sys.argv[2:5])
        return 0
    global REPO, KEEP
    args = sys.argv[1:]
    while args[:1] in (["--repo"], ["--keep"], ["--warm"]):
        if args[0] == "--warm":
            os.environ["CANDLE_TRACE_CALLGRIND_WARM"] = "1"  # the children's
            args = args[1:]
            continue
        if args[0] == "--repo":
            REPO = Path(args[1]).resolve()
        else:
            KEEP = str(Path(args[1]).resolve())
            os.makedirs(KEEP, exist_ok=True)
        args = args[2:]
    names = args or ["mlp", "gpt-b1"]
    res = run(names)
    print_table(res)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
