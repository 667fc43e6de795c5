"""Many ranks: real gloo DDP jobs on CPU under torchrun (ddp_job.py), one rank made a
straggler by a sleep in its forward on the captured update; and the rank rules of paths.

Each job must give one valid trace per rank (candle-graph, each alone in a fresh folder),
the same capture step on every rank (checked through the store: the ranks' scalars),
collective ops whose bytes are the DDP buckets' (and add up to the parameters' bytes),
per-rank aggregate summaries tagged with their rank and the job's id, and a job view
whose straggler verdict names the slow rank. The 2-rank job's traces, exported with
``candle-trace export --format otlp`` to the real collector of the tests (make otelcol),
must arrive as one OTLP trace: every rank's spans and ops with their names, parent links
and durations, told apart by their resource's rank.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Tuple

import pytest

from conftest import REPO, VALIDATOR, judged, read_trace

sys.path.insert(0, str(REPO / "tests" / "python"))
import otelcol  # noqa: E402 - the collector of the tests, shared with tests/python

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from candle_trace.torch._distributed import job_id, rank_path, rank_tags  # noqa: E402

JOB = Path(__file__).with_name("ddp_job.py")
CAPTURE_STEP = 3
SLEEP_S = 0.4  # the straggler's extra forward time: far above what 2 cores at load 14 delay a rank (a 100 ms late start still passes)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_args(log_dir: Path) -> List[str]:
    """torchrun's flags for this torch. Debian's torch 1.13 under Python 3.11 parses
    ``--redirects 0`` (the default) to None and fails (enum.Flag no longer iterates a
    zero member): there, stdout goes to log files and is teed back to the console."""
    from torch.distributed.elastic.multiprocessing.api import Std
    if Std.from_str("0") is not None:
        return []
    return ["--redirects", "1", "--tee", "1", "--log_dir", str(log_dir)]


def run_job(out: Path, world: int, slow_rank: int, capture_skew: int = 0) -> List[Dict]:
    """Runs ddp_job.py on ``world`` ranks; returns each rank's facts, by rank."""
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}",
           *torchrun_args(out.parent / f"{out.name}-logs"),
           str(JOB), str(out), str(CAPTURE_STEP), str(slow_rank), str(SLEEP_S), str(capture_skew)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, f"torchrun failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return [json.loads((out / f"facts-{k}.json").read_text()) for k in range(world)]


def candle_trace(*args: str) -> subprocess.CompletedProcess:
    if not VALIDATOR.exists():
        pytest.fail(f"{VALIDATOR} is not built (make cli)")
    return subprocess.run([str(VALIDATOR), *args], capture_output=True, text=True, timeout=60)


def scalars(records: List[Dict]) -> Dict[str, float]:
    return {r["label"]: r["mean"] for r in records if r["kind"] == "tensor_stats"
            and r["label"].startswith("candle_trace/ranks/")}


Job = Tuple[Path, List[Dict]]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int, int], Job]:
    """The DDP jobs of this module, each run once (a job costs 10-20 s of 2 cores):
    ``jobs(world, slow_rank)`` is its folder and its ranks' facts."""
    done: Dict[Tuple[int, int], Job] = {}

    def get(world: int, slow_rank: int) -> Job:
        if (world, slow_rank) not in done:
            out = tmp_path_factory.mktemp(f"ddp{world}") / "job"
            done[world, slow_rank] = (out, run_job(out, world, slow_rank))
        return done[world, slow_rank]
    return get


@pytest.mark.parametrize("world,slow_rank", [(2, 1), (4, 2)])
def test_ddp_job(tmp_path: Path, jobs: Callable[[int, int], Job], world: int, slow_rank: int) -> None:
    out, facts = jobs(world, slow_rank)
    traces = [Path(f["trace"]) for f in facts]
    job_ids = set()
    assert [t.name for t in traces] == [f"trace-{k}.jsonl" for k in range(world)]
    collectives = []
    for k, (f, trace) in enumerate(zip(facts, traces)):
        assert f["state"] == "done" and f["rank"] == k and f["world_size"] == world
        recs = judged(trace, tmp_path)  # candle-graph, alone in a fresh folder; our validate
        meta = recs[0]
        assert meta["capture_step"] == CAPTURE_STEP
        assert meta["process"]["rank"] == k and meta["process"]["world_size"] == world
        # Every rank counted itself and the others in the store, all with one step.
        assert f["agreement"] == [world, world]
        assert scalars(recs) == {"candle_trace/ranks/profiling": world,
                                 "candle_trace/ranks/same_capture_step": world}
        measured = next(r["id"] for r in recs if r["kind"] == "span_start" and r.get("measured"))
        ops = [r for r in recs if r["kind"] == "op"]
        coll = [r for r in ops if r["op_name"] == "gloo:all_reduce"]
        # One all-reduce per DDP bucket, of the bucket's bytes; together the gradients
        # of every parameter. The record starts when one of gloo's two worker threads
        # picks the work up, so the buckets may be entered in either order (the job
        # view pairs them by name and bytes); the c10d op below is in bucket order.
        assert sorted(r["input_dense_bytes"] for r in coll) == sorted(f["bucket_bytes"]), coll
        assert sum(f["bucket_bytes"]) == f["param_bytes"]
        assert all(r["span_id"] == measured and r["duration_ns"] > 0 for r in coll)
        if f["op_mechanism"] == "observer":  # the c10d op that enqueued each of them
            enq = [r["input_dense_bytes"] for r in ops if r["op_name"] == "c10d::allreduce_"]
            assert enq == f["bucket_bytes"]
        collectives.append(sorted((r["op_name"], r["input_dense_bytes"]) for r in coll))
        # torchrun's static rendezvous says TORCHELASTIC_RUN_ID=none: the ranks agreed
        # on an id through the store (a uuid), the same in the trace and the summary.
        job = meta["tags"]["job_id"]
        assert re.fullmatch(r"[0-9a-f]{32}", job), meta["tags"]
        job_ids.add(job)
        stats = json.loads((out / f"stats-rank{k}.json").read_text())
        assert stats["run"]["tags"] == {"rank": str(k), "world_size": str(world), "job_id": job}
        assert stats["final"] is True
    assert all(c == collectives[0] for c in collectives), "every rank, the same collectives"
    assert len(job_ids) == 1, f"one job, one id: {job_ids}"

    r = candle_trace("report", "--json", *map(str, traces))
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    a = job["analysis"]
    assert a["straggler_rank"] == slow_rank, a
    assert a["phase"] == "forward" and a["kind"] == "compute-bound", a
    assert a["verdict"].startswith(f"rank {slow_rank} is "), a["verdict"]
    assert job["alignment"]["matched_collectives"] == len(collectives[0])
    assert all(c["last_rank"] == slow_rank for c in job["collectives"]), job["collectives"]
    ranks = {s["rank"]: s for s in job["ranks"]}
    waits = []
    for k, s in ranks.items():
        if k == slow_rank:
            assert s["last_in"] == len(collectives[0])
            continue
        # The others waited for the sleep. How much of it each saw depends on when it
        # began its update: ranks that share 2 cores do not start in step.
        assert 0.01e9 < s["wait_ns"] < s["update_ns"], s
        waits.append(s["wait_ns"])
    assert sorted(waits)[len(waits) // 2] > 0.5 * SLEEP_S * 1e9, waits
    fwd = {k: next(p["busy_ns"] for p in s["phases"] if p["phase"] == "forward")
           for k, s in ranks.items()}
    assert fwd[slow_rank] >= SLEEP_S * 1e9

    text = candle_trace("report", *map(str, traces))
    assert text.returncode == 0 and f"verdict:    rank {slow_rank} is" in text.stdout, text.stdout

    # The ranks' whole-run summaries side by side: every rank counted every update, and
    # the straggler's one slow forward is its max.
    stats = [str(out / f"stats-rank{k}.json") for k in range(world)]
    r = candle_trace("report", "--json", *reversed(stats))
    assert r.returncode == 0, r.stderr
    summ = json.loads(r.stdout)
    assert summ["ranks"] == list(range(world))
    rows = {row["name"]: row for row in summ["rows"]}
    assert rows["train/step"]["rank_counts"] == [CAPTURE_STEP + 1] * world
    fwd_max = rows["train/forward"]["rank_max_ns"]
    assert max(range(world), key=fwd_max.__getitem__) == slow_rank and fwd_max[slow_rank] >= SLEEP_S * 1e9

    merged = tmp_path / "job.json"
    m = candle_trace("merge", *map(str, traces), "-o", str(merged))
    assert m.returncode == 0, m.stderr
    assert f"clocks refined by the ends of {len(collectives[0])} collectives" in m.stderr
    pids = {e["pid"] for e in json.loads(merged.read_text())["traceEvents"] if e["ph"] == "X"}
    assert set(range(1, world + 1)) <= pids


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Tuple[str, Path]]:
    with otelcol.running(tmp_path, "traces") as c:
        yield c


def collected(out: Path, want: int) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """(resource attributes, span) of every span the collector wrote, once it has
    written ``want`` (the file exporter flushes every 10 ms; a loaded machine may take
    longer: up to 20 s)."""
    deadline = time.monotonic() + 20
    while True:
        got = []
        for line in otelcol.complete_lines(out):
            for rs in json.loads(line)["resourceSpans"]:
                res = {a["key"]: next(iter(a["value"].values())) for a in rs["resource"]["attributes"]}
                got += [(res, sp) for ss in rs["scopeSpans"] for sp in ss["spans"]]
        if len(got) >= want or time.monotonic() > deadline:
            assert len(got) == want, f"the collector wrote {len(got)} spans, the exports sent {want}"
            return got
        time.sleep(0.02)


def span_attrs(sp: Dict[str, Any]) -> Dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values())) for a in sp.get("attributes", [])}


def test_ddp_job_exported_to_the_collector(jobs: Callable[[int, int], Job],
                                           collector: Tuple[str, Path]) -> None:
    """The 2-rank job's traces, exported one by one, arrive as one OTLP trace: the job
    id's, every rank's spans and ops as they are in its trace (names, parents, times),
    the collectives with the buckets' bytes, each rank under its own resource."""
    endpoint, out = collector
    _, facts = jobs(2, 1)
    sent, trace_ids = 0, set()
    for f in facts:
        r = candle_trace("export", "--format", "otlp", "--endpoint", endpoint, f["trace"])
        assert r.returncode == 0, r.stderr
        m = re.search(r": (\d+) spans \(.*; trace id ([0-9a-f]{32})\n", r.stderr)
        assert m, r.stderr
        sent += int(m.group(1))
        trace_ids.add(m.group(2))
        assert " job " in r.stderr, r.stderr
    got = collected(out, sent)

    recs = [read_trace(f["trace"]) for f in facts]
    job = recs[0][0]["tags"]["job_id"]
    corr = recs[0][0]["correlation_id"]
    want_id = hashlib.sha256(f"job\x00{job}\x00{corr}".encode()).hexdigest()[:32]
    assert trace_ids == {want_id}, "every rank's export gives the job's trace id"
    assert {sp["traceId"] for _, sp in got} == {want_id}
    ids = [sp["spanId"] for _, sp in got]
    assert len(set(ids)) == len(ids), "no two spans of the job's trace share an id"

    for k, (f, rr) in enumerate(zip(facts, recs)):
        meta = rr[0]
        mine = [sp for res, sp in got if res.get("candle.rank") == str(k)]
        res = next(res for res, _ in got if res.get("candle.rank") == str(k))
        assert res["candle.world_size"] == "2" and res["candle.tag.job_id"] == job, res
        assert res["candle.run_id"] == meta["run_id"] and res["candle.tag.rank"] == str(k)
        anchor = int(meta["clock"]["wall_unix_ns_at_open"])
        # Spans: each the trace's span of its candle.span.id, child of its parent's.
        by_trace_id = {span_attrs(sp).get("candle.span.id"): sp for sp in mine
                       if span_attrs(sp)["candle.record"] == "span"}
        starts = {r["id"]: r for r in rr if r["kind"] == "span_start"}
        ends = {r["id"]: r for r in rr if r["kind"] == "span_end"}
        assert set(by_trace_id) == set(starts), f"rank {k}: every span, once"
        for sid, r in starts.items():
            sp = by_trace_id[sid]
            assert sp["name"] == r["name"]
            assert int(sp["startTimeUnixNano"]) == anchor + r["start_ns"]
            assert int(sp["endTimeUnixNano"]) - int(sp["startTimeUnixNano"]) == ends[sid]["duration_ns"]
            parent = r.get("parent_id")
            if parent is None:
                assert not sp.get("parentSpanId"), f"rank {k}: its root is a child of nothing"
            else:
                assert sp["parentSpanId"] == by_trace_id[parent]["spanId"], (k, r)
        # Ops: each a child span of its span, with its times and bytes.
        span_of = {sp["spanId"]: sid for sid, sp in by_trace_id.items()}
        want_ops = sorted((r["op_name"], r["span_id"], anchor + r["timestamp_ns"], r["duration_ns"],
                           r.get("input_dense_bytes", 0)) for r in rr if r["kind"] == "op")
        got_ops = sorted((sp["name"], span_of[sp["parentSpanId"]], int(sp["startTimeUnixNano"]),
                          int(sp["endTimeUnixNano"]) - int(sp["startTimeUnixNano"]),
                          int(span_attrs(sp)["candle.op.input_bytes"]))
                         for sp in mine if span_attrs(sp)["candle.record"] == "op")
        assert got_ops == want_ops, f"rank {k}: the ops as spans"
        # The all-reduces: one span per DDP bucket, with its bytes, in the order the trace
        # says the rank entered them (which bucket first is test_ddp_job's question).
        coll = sorted((int(sp["startTimeUnixNano"]), int(span_attrs(sp)["candle.op.input_bytes"]))
                      for sp in mine if sp["name"] == "gloo:all_reduce")
        entered = sorted((r["timestamp_ns"], r["input_dense_bytes"]) for r in rr
                         if r["kind"] == "op" and r["op_name"] == "gloo:all_reduce")
        assert [b for _, b in coll] == [b for _, b in entered], f"rank {k}: the all-reduces as spans"
        assert sorted(b for _, b in coll) == sorted(f["bucket_bytes"]), f"rank {k}: one span per DDP bucket"
        assert len(mine) == len(starts) + len(want_ops)


def test_capture_step_mismatch_is_found(tmp_path: Path) -> None:
    """Rank 1 captures the update after rank 0's: the store's counts say so, and the job
    view warns that the times are not of one step."""
    facts = run_job(tmp_path / "job", 2, slow_rank=-1, capture_skew=1)
    assert [f["agreement"] for f in facts] == [[2, 1], [2, 1]]
    traces = [f["trace"] for f in facts]
    steps = []
    for t in traces:
        recs = judged(t, tmp_path)
        steps.append(recs[0]["capture_step"])
        assert scalars(recs)["candle_trace/ranks/same_capture_step"] == 1
    assert steps == [CAPTURE_STEP, CAPTURE_STEP + 1]
    r = candle_trace("report", "--json", *traces)
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert job["capture_step"] == 0
    assert any("captured different updates" in w for w in job["warnings"]), job["warnings"]


@pytest.mark.parametrize("path,rank,world,want", [
    ("t.jsonl", 0, 1, "t.jsonl"),                       # one process: as given
    ("t.jsonl", 3, 4, "t-rank3.jsonl"),                 # a job: the rank before the suffix
    ("out/stats.json", 1, 2, "out/stats-rank1.json"),
    ("out/trace", 1, 2, "out/trace-rank1"),
    ("t-%r.jsonl", 2, 4, "t-2.jsonl"),                  # placeholders: where they say
    ("r{rank}/t.jsonl", 5, 8, "r5/t.jsonl"),
    ("t-{rank}-of-{world_size}.jsonl", 1, 2, "t-1-of-2.jsonl"),
    ("t-%r.jsonl", 0, 1, "t-0.jsonl"),
    ("t-7.rank1.jsonl", 1, 2, "t-7.rank1.jsonl"),       # already says whose (candle-trace run)
    ("t-rank1.jsonl", 1, 2, "t-rank1.jsonl"),
    ("t.rank1.jsonl", 0, 2, "t.rank1-rank0.jsonl"),     # another rank's name is no claim
])
def test_rank_path(path: str, rank: int, world: int, want: str) -> None:
    assert rank_path(path, rank, world) == want


def test_rank_tags() -> None:
    assert rank_tags({"a": "b"}, 0, 1) == {"a": "b"}
    assert rank_tags({"a": "b"}, 2, 4, "") == {"rank": "2", "world_size": "4", "a": "b"}
    assert rank_tags({"a": "b"}, 2, 4, "j1") == {"rank": "2", "world_size": "4", "job_id": "j1", "a": "b"}
    assert rank_tags({"rank": "mine", "job_id": "theirs"}, 2, 4, "j1") == {
        "rank": "mine", "world_size": "4", "job_id": "theirs"}


@pytest.mark.parametrize("env,want", [
    ({"TORCHELASTIC_RUN_ID": "e7f3", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "e7f3"),
    ({"TORCHELASTIC_RUN_ID": "e7f3", "TORCHELASTIC_RESTART_COUNT": "0"}, "e7f3"),
    ({"TORCHELASTIC_RUN_ID": "e7f3", "TORCHELASTIC_RESTART_COUNT": "2"}, "e7f3/restart-2"),
    ({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "node7", "MASTER_PORT": "29500"}, "node7:29500"),
    ({"MASTER_ADDR": "node7", "MASTER_PORT": "29500"}, "node7:29500"),
    ({"MASTER_ADDR": "node7"}, ""),
    ({}, ""),
])
def test_job_id_from_environment(monkeypatch: pytest.MonkeyPatch, env: Dict[str, str], want: str) -> None:
    """Without a process group (the store's id is the DDP jobs' above): torchrun's run id,
    else the master's address."""
    if dist.is_initialized():
        pytest.fail("a process group in the test process: the store would answer")
    for k in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert job_id() == want
    assert rank_tags({}, 1, 2).get("job_id", "") == want


def test_rank_world_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from candle_trace.torch._distributed import rank_world
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert rank_world() == (3, 4)
    monkeypatch.delenv("RANK")
    if not dist.is_initialized():
        assert rank_world() == (0, 1)


def test_profile_and_watch_name_files_by_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun's environment a profile's trace and summary, and a watch's traces,
    carry the rank; a single process keeps the names it was given."""
    import candle_trace.torch as ctt
    model = torch.nn.Linear(2, 2)
    for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)  # no job id: the tags are the rank's alone
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    p = ctt.profile(model, None, str(tmp_path / "t.jsonl"), aggregate_path=str(tmp_path / "s.json"))
    assert (p.rank, p.world_size, p.path) == (1, 2, str(tmp_path / "t-rank1.jsonl"))
    assert p._aggregate_args[0] == str(tmp_path / "s-rank1.json")
    assert p.cfg.tags == {"rank": "1", "world_size": "2"}
    w = ctt.watch(model, None, str(tmp_path / "w"))
    assert w._path(7, "slow") == str(tmp_path / "w" / "update-000007-slow-rank1.jsonl")
    w = ctt.watch(model, None, str(tmp_path / "w-{rank}"))
    assert w.folder == str(tmp_path / "w-1")
    assert w._path(7, "slow") == str(tmp_path / "w-1" / "update-000007-slow.jsonl")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    p = ctt.profile(model, None, str(tmp_path / "t.jsonl"))
    assert p.path == str(tmp_path / "t.jsonl") and p.cfg.tags == {}
