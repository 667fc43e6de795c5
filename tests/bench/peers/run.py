#!/usr/bin/env python3
"""The span burst of tests/bench/bench_spans.c through candle-trace and the
tracers a C/C++ user would otherwise pick, side by side (make bench-peers).

Systems, each its own executable linked from burst.c (the one loop) and one
backend file:
  baseline        two clock_gettime(CLOCK_MONOTONIC) per pair, nothing kept
  candle-trace    candle-trace trace mode (JSONL written by its drainer thread)
  candle-agg      candle-trace aggregate mode (one summary at finish)
  tracy           Tracy's C client, no server connected (events stay in RAM)
  lttng           LTTng-UST, session daemon started here, CTF written by
                  lttng-consumerd

Every round runs every system once per thread count, one process each, in an
order rotated per round; then the sustained runs, also round-robin. The
figures of a round are compared with candle-trace's of the same round, so the
ratios carry the spread of the shared machine, not its level.

A peer that cannot be fetched, built or installed is reported loudly
("PEER NOT AVAILABLE") and left out; the rest still runs. Not part of make
test; nothing here is needed by CI.

Tracy's C++ client sources come from the tracy-client-sys crate (cargo fetch,
once per machine, cached under build/peers/); LTTng from Debian's
liblttng-ust-dev, lttng-tools and babeltrace2 (apt-get install when root and
missing).
"""

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))

TRACY_CRATE = "tracy-client-sys"
TRACY_VERSION = "0.30.1"
# Tracy's own features that sample or trace the system are off: they measure
# something else than the zones, and they need a server to be worth anything.
# Left on (the default): everything a zone does. TRACY_ON_DEMAND stays off:
# with it and no server, a zone only checks "connected?" and records nothing.
TRACY_DEFINES = [
    "-DTRACY_ENABLE",
    "-DTRACY_NO_SYSTEM_TRACING",
    "-DTRACY_NO_CONTEXT_SWITCH",
    "-DTRACY_NO_SAMPLING",
    "-DTRACY_NO_CODE_TRANSFER",
    "-DTRACY_NO_BROADCAST",
    "-DTRACY_NO_CALLSTACK",
    "-DTRACY_NO_CRASH_HANDLER",
    "-DTRACY_NO_FRAME_IMAGE",
    "-DTRACY_NO_VSYNC_CAPTURE",
]
LTTNG_PACKAGES = ["liblttng-ust-dev", "lttng-tools", "babeltrace2"]
LTTNG_HEADER = "lttng/tracepoint.h"

CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror", "-pthread"]


def log(msg):
    print(msg, flush=True)


def unavailable(system, why):
    bar = "!" * 78
    msg = f"{bar}\n!! PEER NOT AVAILABLE: {system}: {why}\n!! (left out of this run; the other systems still run)\n{bar}"
    print(msg, flush=True)
    print(msg, file=sys.stderr, flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def newer(target, *sources):
    return os.path.exists(target) and all(os.path.getmtime(target) >= os.path.getmtime(s) for s in sources)


def compile_burst(out, backend, extra_src=(), extra_flags=(), libs=()):
    srcs = [os.path.join(HERE, "burst.c"), os.path.join(HERE, backend), os.path.join(HERE, "peer.h")]
    deps = srcs + [s for s in extra_src if os.path.exists(s)]
    if newer(out, *deps):
        return
    cmd = ["cc", *CFLAGS, *extra_flags, "-I", HERE, srcs[0], srcs[1], *extra_src, "-o", out, *libs]
    sh(cmd)


# --- Tracy -------------------------------------------------------------------


def fetch_tracy(cache):
    """The crate's tracy/ folder (TracyClient.cpp and headers), fetched once."""
    dest = os.path.join(cache, f"{TRACY_CRATE}-{TRACY_VERSION}")
    if os.path.exists(os.path.join(dest, "TracyClient.cpp")):
        return dest
    if not shutil.which("cargo"):
        raise RuntimeError("cargo not on PATH (it fetches the tracy-client-sys crate)")
    proj = os.path.join(cache, "tracy-fetch")
    os.makedirs(os.path.join(proj, "src"), exist_ok=True)
    with open(os.path.join(proj, "Cargo.toml"), "w") as f:
        f.write(
            '[package]\nname = "tracy-fetch"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n\n'
            f'[dependencies]\n{TRACY_CRATE} = {{ version = "={TRACY_VERSION}", default-features = false }}\n'
        )
    open(os.path.join(proj, "src", "lib.rs"), "w").close()
    manifest = os.path.join(proj, "Cargo.toml")
    log(f"fetching {TRACY_CRATE} {TRACY_VERSION} with cargo (once per machine) ...")
    sh(["cargo", "fetch", "--manifest-path", manifest, "--target", "x86_64-unknown-linux-gnu"])
    meta = json.loads(sh(["cargo", "metadata", "--format-version", "1", "--manifest-path", manifest]).stdout)
    crate = next(p for p in meta["packages"] if p["name"] == TRACY_CRATE)
    src = os.path.join(os.path.dirname(crate["manifest_path"]), "tracy")
    tmp = dest + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    os.rename(tmp, dest)
    return dest


def build_tracy(out_dir):
    src = fetch_tracy(out_dir)
    obj = os.path.join(out_dir, "TracyClient.o")
    stamp = obj + ".flags"
    flags = " ".join(TRACY_DEFINES)
    if not (os.path.exists(obj) and os.path.exists(stamp) and open(stamp).read() == flags):
        if not shutil.which("g++"):
            raise RuntimeError("g++ not on PATH (Tracy's client is C++)")
        log("building Tracy's client (TracyClient.cpp) ...")
        sh(["g++", "-O2", "-std=c++17", *TRACY_DEFINES, "-c", os.path.join(src, "TracyClient.cpp"), "-o", obj])
        with open(stamp, "w") as f:
            f.write(flags)
    exe = os.path.join(out_dir, "burst_tracy")
    compile_burst(exe, "tracy.c", extra_src=[obj], extra_flags=[*TRACY_DEFINES, "-I", src], libs=["-ldl", "-lstdc++"])
    return exe


# --- LTTng -------------------------------------------------------------------


def lttng_installed():
    hdr = any(os.path.exists(os.path.join(d, LTTNG_HEADER)) for d in ("/usr/include", "/usr/include/x86_64-linux-gnu"))
    tools = all(shutil.which(t) for t in ("lttng", "lttng-sessiond", "babeltrace2"))
    return hdr and tools


def install_lttng():
    if lttng_installed():
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise RuntimeError(f"not installed, and installing needs root and apt-get: apt-get install -y {' '.join(LTTNG_PACKAGES)}")
    log(f"installing {' '.join(LTTNG_PACKAGES)} (apt-get) ...")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    r = subprocess.run(["apt-get", "install", "-y", *LTTNG_PACKAGES], text=True, capture_output=True, env=env)
    if r.returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True, env=env)
        r = subprocess.run(["apt-get", "install", "-y", *LTTNG_PACKAGES], text=True, capture_output=True, env=env)
    if r.returncode != 0 or not lttng_installed():
        raise RuntimeError("apt-get install failed: " + (r.stderr or r.stdout).strip()[-400:])


def build_lttng(out_dir):
    install_lttng()
    exe = os.path.join(out_dir, "burst_lttng")
    compile_burst(exe, "lttng.c", extra_src=[], libs=["-llttng-ust", "-ldl"])
    return exe


class Lttng:
    """Our own lttng-sessiond, for the length of the run: started here, killed here."""

    def __init__(self, work):
        self.work = work
        self.pidfile = os.path.join(work, "sessiond.pid")
        self.pid = None
        self.n = 0

    def start(self):
        running = subprocess.run(["lttng", "list"], capture_output=True, text=True)
        if running.returncode == 0:
            raise RuntimeError("another lttng-sessiond is already running; not sharing or stopping it")
        sh(["lttng-sessiond", "--daemonize", f"--pidfile={self.pidfile}"])
        for _ in range(50):
            if os.path.exists(self.pidfile) and open(self.pidfile).read().strip():
                break
            time.sleep(0.1)
        self.pid = int(open(self.pidfile).read().strip())

    def stop(self):
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
            for _ in range(100):
                os.kill(self.pid, 0)
                time.sleep(0.05)
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.pid = None

    def daemon_pids(self):
        """The session daemon and every process under it (lttng-consumerd)."""
        pids, todo = [], [self.pid]
        while todo:
            p = todo.pop()
            pids.append(p)
            kids = subprocess.run(["pgrep", "-P", str(p)], capture_output=True, text=True).stdout.split()
            todo.extend(int(k) for k in kids)
        return pids

    def session(self, out):
        self.n += 1
        name = f"candle-peers-{os.getpid()}-{self.n}"
        sh(["lttng", "create", name, f"--output={out}"])
        # The defaults of lttng-tools 2.13: channel0, per-UID buffers,
        # 4 sub-buffers of 512 KiB per CPU, discard mode (drop when full).
        sh(["lttng", "enable-event", "--userspace", "candle_bench:*", "--session", name])
        sh(["lttng", "start", name])
        return name

    def finish(self, name, out):
        listing = sh(["lttng", "list", name]).stdout
        m = re.search(r"Discarded events:\s*(\d+)", listing)
        discarded = int(m.group(1)) if m else None
        if discarded is not None and discarded >= 1 << 63:
            # Seen once in 2.13.9 with per-user buffers: the count with bit 63
            # set (2^63 + the number babeltrace2's count agreed with).
            discarded -= 1 << 63
        sh(["lttng", "destroy", name])
        counted = sh(["babeltrace2", out, "-c", "sink.utils.counter", "-p", "step=+0"]).stdout
        # The last block is the total (step=+0 prints only that one).
        written = [int(x) for x in re.findall(r"(\d+)\s+Event messages", counted)]
        lost = [int(x) for x in re.findall(r"(\d+)\s+Discarded event messages", counted)]
        return (written[-1] if written else 0), discarded, (lost[-1] if lost else None)


# --- counting what reached the disk -----------------------------------------


def count_trace(path):
    """span_start + span_end lines of a candle-trace JSONL, less the root's two."""
    n, tail = 0, b""
    keys = (b'"kind":"span_start"', b'"kind":"span_end"')
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 24)
            if not block:
                break
            data = tail + block
            cut = data.rfind(b"\n") + 1
            n += sum(data[:cut].count(k) for k in keys)
            tail = data[cut:]
    n += sum(tail.count(k) for k in keys)
    return n - 2


def count_aggregate(path):
    with open(path) as f:
        doc = json.load(f)
    return 2 * sum(s["count"] for s in doc["spans"]), doc.get("dropped")


# --- running -----------------------------------------------------------------


def parse(out):
    for line in out.splitlines():
        if line.startswith("RESULT "):
            head, _, sink = line[7:].partition(" sink=")  # the sink may hold spaces: it comes last
            r = {k: v for k, v in (kv.split("=", 1) for kv in head.split())}
            r["sink"] = sink
            return r
    raise RuntimeError("no RESULT line in:\n" + out)


def run_one(system, exe, variant, args, work, lttng):
    out = tempfile.mkdtemp(prefix=f"{system}-", dir=work)
    env = dict(os.environ)
    session = None
    if system == "lttng":
        session = lttng.session(os.path.join(out, "ctf"))
        env["PEERS_LTTNG_SESSION"] = session
        env["PEERS_LTTNG_PIDS"] = " ".join(str(p) for p in lttng.daemon_pids())
    # What the run before left to write back (gigabytes after a sustained
    # run) is written now, not while this system runs.
    os.sync()
    try:
        p = subprocess.run([exe, variant, out, *args], text=True, capture_output=True, env=env, timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"{system} exited {p.returncode}: {p.stderr.strip()[-600:]}")
        r = parse(p.stdout)
        for k in ("median_ns", "p99_ns", "mean_ns", "cpu_ns", "outside_cpu_ns", "secs_to_close", "max_rss_mib"):
            r[k] = float(r[k])
        r["events"] = int(r["events"])
        r["system"] = system
        r["cpu_all"] = r["cpu_ns"] + r["outside_cpu_ns"]
        if system == "candle-trace":
            r["written"] = count_trace(os.path.join(out, "candle-trace.jsonl"))
            r["lost"] = r["events"] - r["written"]
        elif system == "candle-agg":
            r["written"], dropped = count_aggregate(os.path.join(out, "candle-aggregate.json"))
            r["lost"] = r["events"] - r["written"]
            r["reported_dropped"] = dropped
        elif system == "lttng":
            r["written"], r["reported_discarded"], r["bt_discarded"] = lttng.finish(session, os.path.join(out, "ctf"))
            session = None
            r["lost"] = r["events"] - r["written"]
            if r["reported_discarded"] != r["lost"]:
                log(f"note: LTTng reported {r['reported_discarded']} discarded, the CTF holds {r['lost']} fewer than emitted")
        else:
            r["written"], r["lost"] = None, None
        return r
    finally:
        if session:
            subprocess.run(["lttng", "destroy", session], capture_output=True)
        shutil.rmtree(out, ignore_errors=True)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def span(xs, fmt="{:.1f}"):
    if not xs:
        return "–"
    if len(xs) == 1:
        return fmt.format(xs[0])
    return f"{fmt.format(med(xs))} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"


LABELS = {
    "baseline": "2× clock_gettime (baseline)",
    "candle-trace": "candle-trace trace mode",
    "candle-agg": "candle-trace aggregate",
    "tracy": "Tracy C client, no server",
    "lttng": "LTTng-UST",
}


def disk(rs):
    s = rs[0]["system"]
    if s == "baseline":
        return "–"
    if s == "tracy":
        return f"0 (RAM only, max RSS {span([r['max_rss_mib'] for r in rs], '{:.0f}')} MiB)"
    lost = [r["lost"] for r in rs]
    pct = [100.0 * r["lost"] / r["events"] for r in rs]
    what = "counts" if s == "candle-agg" else "events"
    if max(lost) == 0:
        return f"all {rs[0]['events']:,} {what}, 0 lost"
    return f"lost {min(lost):,}–{max(lost):,} of {rs[0]['events']:,} ({min(pct):.1f}–{max(pct):.1f}%)"


def ratio_by_round(rows, key, system, ref="candle-trace"):
    """system's figure ÷ candle-trace's, round by round."""
    out = []
    for rnd in sorted({r["round"] for r in rows}):
        a = [r[key] for r in rows if r["round"] == rnd and r["system"] == system]
        b = [r[key] for r in rows if r["round"] == rnd and r["system"] == ref]
        if a and b and b[0] > 0:
            out.append(a[0] / b[0])
    return out


def burst_table(rows, threads, pairs):
    rows = [r for r in rows if int(r["threads"]) == threads]
    log(f"\n### Burst: {pairs:,} nested pairs per thread, {threads} thread{'s' if threads > 1 else ''} "
        f"(median of rounds, (min–max); ratio = system ÷ candle-trace trace mode, same round)\n")
    log("| system | chunk median per pair | burst mean per pair | CPU per pair (process) | CPU per pair incl. daemons "
        "| on disk | median ratio | mean ratio | CPU ratio (incl. daemons) |")
    log("|---|---|---|---|---|---|---|---|---|")
    for s in [s for s in LABELS if any(r["system"] == s for r in rows)]:
        rs = [r for r in rows if r["system"] == s]
        log(f"| {LABELS[s]} | {span([r['median_ns'] for r in rs])} ns | {span([r['mean_ns'] for r in rs])} ns "
            f"| {span([r['cpu_ns'] for r in rs], '{:.0f}')} ns | {span([r['cpu_all'] for r in rs], '{:.0f}')} ns "
            f"| {disk(rs)} | {span(ratio_by_round(rows, 'median_ns', s), '{:.2f}')} "
            f"| {span(ratio_by_round(rows, 'mean_ns', s), '{:.2f}')} | {span(ratio_by_round(rows, 'cpu_all', s), '{:.2f}')} |")


def sustained_table(rows, events):
    log(f"\n### Sustained: {events:,} events, 1 thread (events/s through close: ct_finish / lttng stop; "
        "median of rounds (min–max))\n")
    log("| system | events/s (all emitted) | events/s reaching disk | CPU per pair incl. daemons | on disk | max RSS "
        "| candle-trace ÷ system (events/s on disk) |")
    log("|---|---|---|---|---|---|---|")
    for r in rows:
        r["eps"] = r["events"] / r["secs_to_close"] / 1e6
        r["eps_disk"] = (r["written"] if r["written"] is not None else 0) / r["secs_to_close"] / 1e6
    for s in [s for s in LABELS if any(r["system"] == s for r in rows)]:
        rs = [r for r in rows if r["system"] == s]
        disk_eps = "–" if s in ("baseline", "tracy") else span([r["eps_disk"] for r in rs], "{:.2f}") + " M"
        vs = "–"
        if s not in ("baseline", "tracy", "candle-trace"):
            vs = span([1 / x for x in ratio_by_round(rows, "eps_disk", s)], "{:.2f}")
        log(f"| {LABELS[s]} | {span([r['eps'] for r in rs], '{:.2f}')} M | {disk_eps} "
            f"| {span([r['cpu_all'] for r in rs], '{:.0f}')} ns | {disk(rs)} "
            f"| {span([r['max_rss_mib'] for r in rs], '{:.0f}')} MiB | {vs} |")
    if any(r["system"] == "lttng" for r in rows):
        ratios = [1 / x for x in ratio_by_round(rows, "eps", "lttng")]
        lt_lost = [r["lost"] for r in rows if r["system"] == "lttng"]
        ours_lost = [r["lost"] for r in rows if r["system"] == "candle-trace"]
        log(f"\ncandle-trace ÷ LTTng, events/s (all emitted, through close), per round: "
            f"{', '.join(f'{x:.2f}' for x in ratios)} (target ≥ 0.7); LTTng lost {lt_lost}, candle-trace lost {ours_lost}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build folder (libcandle_trace.so)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=100000)
    ap.add_argument("--threads", default="1,4")
    ap.add_argument("--events", type=int, default=50_000_000, help="sustained run; 0 skips it")
    ap.add_argument("--sustained-rounds", type=int, default=3)
    ap.add_argument("--systems", default=",".join(LABELS))
    ap.add_argument("--json", help="write every result here too")
    a = ap.parse_args()

    build = os.path.abspath(a.build)
    out_dir = os.path.join(build, "peers")
    os.makedirs(out_dir, exist_ok=True)
    lib = os.path.join(build, "libcandle_trace.so")
    if not os.path.exists(lib):
        sys.exit(f"{lib} missing: make lib first")
    wanted = a.systems.split(",")

    exes = {}
    exes["baseline"] = os.path.join(out_dir, "burst_baseline")
    compile_burst(exes["baseline"], "baseline.c")
    exes["candle-trace"] = exes["candle-agg"] = os.path.join(out_dir, "burst_candle")
    compile_burst(exes["candle-trace"], "candle.c", extra_src=[], extra_flags=["-I", os.path.join(ROOT, "include")],
                  libs=[f"-L{build}", "-lcandle_trace", f"-Wl,-rpath,{build}"])
    for name, builder in (("tracy", build_tracy), ("lttng", build_lttng)):
        if name not in wanted:
            continue
        try:
            exes[name] = builder(out_dir)
        except (RuntimeError, subprocess.CalledProcessError, OSError, StopIteration) as e:
            detail = getattr(e, "stderr", None) or str(e)
            unavailable(name, detail.strip()[-600:])
    systems = [s for s in LABELS if s in wanted and s in exes]

    work = tempfile.mkdtemp(prefix="run-", dir=out_dir)
    lttng = None
    if "lttng" in systems:
        lttng = Lttng(work)
        try:
            lttng.start()
        except (RuntimeError, subprocess.CalledProcessError, OSError, ValueError) as e:
            unavailable("lttng", getattr(e, "stderr", None) or str(e))
            systems.remove("lttng")
            lttng = None

    def on_signal(sig, _):
        if lttng:
            lttng.stop()
        sys.exit(128 + sig)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    load0 = os.getloadavg()
    log(f"\nmachine: {os.cpu_count()} CPUs, {cpu}, Linux {platform.release()}; load average at start "
        f"{load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}")
    log(f"systems: {', '.join(systems)}; {a.rounds} rounds × threads {a.threads}, round-robin (order rotated per round)")
    variant = {"candle-trace": "trace", "candle-agg": "aggregate"}
    rows, sus = [], []
    try:
        for rnd in range(a.rounds):
            order = systems[rnd % len(systems):] + systems[:rnd % len(systems)]
            for threads in [int(t) for t in a.threads.split(",")]:
                for s in order:
                    r = run_one(s, exes[s], variant.get(s, "-"), ["burst", str(a.pairs), str(threads)], work, lttng)
                    r["round"] = rnd
                    rows.append(r)
                    log(f"round {rnd + 1} threads {threads} {s:13s} median {r['median_ns']:7.1f} mean {r['mean_ns']:7.1f} "
                        f"cpu {r['cpu_ns']:6.0f}+{r['outside_cpu_ns']:.0f} ns/pair  lost {r['lost']}")
        for rnd in range(a.sustained_rounds if a.events else 0):
            order = systems[rnd % len(systems):] + systems[:rnd % len(systems)]
            for s in order:
                r = run_one(s, exes[s], variant.get(s, "-"), ["sustained", str(a.events)], work, lttng)
                r["round"] = rnd
                sus.append(r)
                log(f"sustained round {rnd + 1} {s:13s} {r['events'] / r['secs_to_close'] / 1e6:6.2f} M events/s "
                    f"lost {r['lost']} max RSS {r['max_rss_mib']:.0f} MiB")
    finally:
        if lttng:
            lttng.stop()
        shutil.rmtree(work, ignore_errors=True)

    load1 = os.getloadavg()
    for threads in [int(t) for t in a.threads.split(",")]:
        burst_table(rows, threads, a.pairs)
    if sus:
        sustained_table(sus, a.events)
    log(f"\nload average at end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": cpu, "load_start": load0, "load_end": load1, "burst": rows, "sustained": sus}, f, indent=1)


if __name__ == "__main__":
    main()
