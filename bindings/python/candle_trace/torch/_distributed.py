"""Many ranks: a profile under ``torchrun`` (torch.distributed, one process per rank).

Three things differ from one process, and this module holds them:

- **Which rank, and its file.** The rank and world size come from ``RANK`` /
  ``WORLD_SIZE`` (what torchrun sets, and what the library writes into the trace's
  ``meta.process``), else from an initialised default process group. A path may say where
  the rank goes -- ``{rank}`` or ``%r`` (``{world_size}`` too) -- and when the job has
  more than one rank and the path says nothing, ``-rank<N>`` goes before its extension
  (``trace.jsonl`` -> ``trace-rank1.jsonl``; a name that already ends in ``.rank<N>`` or
  ``-rank<N>`` for this rank is kept), so ranks never write over each other.
- **The same update on every rank.** The rule is that every rank passes the same
  ``capture_step`` and calls ``step()`` once per update: DDP already holds the ranks in
  lock step (each update's all-reduces pair the ranks' backward passes), so the
  ``capture_step``-th ``step()`` is the same update everywhere. The rule is checked, not
  assumed: each rank adds itself to two counters in the process group's store -- ranks
  profiling, ranks profiling with this capture step -- and reads them back when its
  capture ends. The store's ``add`` never blocks, so a job where only some ranks profile
  cannot hang on the check; a mismatch is a warning, and the counts are scalars of the
  measured region (``candle_trace/ranks/profiling``, ``.../same_capture_step``).
- **The same start.** Arming a capture (the op observer's calibration, hooks) takes each
  rank a different time, and a rank that starts the captured update late makes the
  others wait for it: the profiler would make the straggler. So once armed, each rank
  waits at a line-up in the store (another counter, polled) until every rank profiling
  the same step has armed, at most ``LINE_UP_TIMEOUT_S``; then all begin it together.
- **One job, one id.** Each rank's trace and summary carry the tag ``job_id``, the same
  on every rank of the job (see :func:`job_id`), so that tools put the ranks together:
  ``candle-trace export --format otlp`` makes it the trace id, one OTLP trace for the
  job's captured update.
- **Collectives.** The op observer records them (``_observer.cpp``): each backend work
  (``gloo:all_reduce``, ``nccl:all_reduce``, ...) is an op of the measured region from
  the moment the rank entered it to its completion, with the bytes it carried.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
import warnings
from typing import Any, Dict, Optional, Tuple

__all__ = ["rank_world", "rank_path", "rank_tags", "job_id", "has_rank_placeholder", "StepAgreement"]

_PLACEHOLDERS = ("{rank}", "%r")
#: how long a rank waits at the line-up for the others before it goes on alone
LINE_UP_TIMEOUT_S = 10.0
_profiles = itertools.count(1)  # the process's profiles, in order: one store key each
#: the store key under which the ranks agree on a job id: the first rank's proposal wins
JOB_ID_KEY = "candle_trace/job_id"


def rank_world() -> Tuple[int, int]:
    """(rank, world size): from RANK/WORLD_SIZE, else the default process group, else
    (0, 1)."""
    try:
        return int(os.environ["RANK"]), int(os.environ.get("WORLD_SIZE", "1"))
    except (KeyError, ValueError):
        pass
    dist = _dist()
    if dist is not None:
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def has_rank_placeholder(path: str) -> bool:
    return any(p in path for p in _PLACEHOLDERS)


def rank_path(path: str, rank: int, world: int) -> str:
    """``path`` with the rank put in (see the module's doc)."""
    if has_rank_placeholder(path):
        return (path.replace("{rank}", str(rank)).replace("%r", str(rank))
                .replace("{world_size}", str(world)))
    if world <= 1:
        return path
    head, tail = os.path.split(path)
    stem, ext = os.path.splitext(tail)
    # A name that already says whose it is (`candle-trace run` expands its own pattern
    # to ``t-PID-rank<N>.jsonl``; before, ``t-PID.rank<N>.jsonl``) is kept: no second rank in the name.
    if stem.endswith((f".rank{rank}", f"-rank{rank}")):
        return path
    return os.path.join(head, f"{stem}-rank{rank}{ext}")


def job_id() -> str:
    """The id every rank of this job shares ("" when there is none to be had):

    - ``TORCHELASTIC_RUN_ID``, torchrun's rendezvous id (``--rdzv-id``, a fresh uuid
      under ``--standalone``), with ``/restart-<n>`` after an elastic restart
      (``TORCHELASTIC_RESTART_COUNT``): a restart is other processes, another capture.
      torchrun's placeholder ``none`` (a static rendezvous: ``--master-port`` given and
      no ``--rdzv-id``) is no id: every such job has it;
    - else, with the default process group up, an id agreed through its store: each
      rank proposes a fresh uuid with ``compare_set``, which keeps the first and never
      blocks, and all read back that one. The store lives as long as the job, so the id
      is the job's alone;
    - else ``MASTER_ADDR:MASTER_PORT`` (env:// initialisation before the group exists):
      shared by the ranks, but a later job on the same address and port repeats it.
    """
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run and run != "none":
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return run if restart in ("", "0") else f"{run}/restart-{restart}"
    dist = _dist()
    if dist is not None:
        try:
            got = dist.distributed_c10d._get_default_store().compare_set(JOB_ID_KEY, "", uuid.uuid4().hex)
            return got.decode() if isinstance(got, bytes) else str(got)
        except Exception:  # noqa: BLE001 - no store that compares: the address is next best
            pass
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return f"{addr}:{port}" if addr and port else ""


def rank_tags(tags: Dict[str, str], rank: int, world: int, job: Optional[str] = None) -> Dict[str, str]:
    """The run's tags with ``rank``, ``world_size`` and ``job_id`` (``job``, else
    :func:`job_id`; none when "") in a job of several ranks (a tag the caller gave wins),
    so a trace or an aggregate summary says whose it is and which job's."""
    if world <= 1:
        return tags
    if job is None:
        job = job_id()
    out = {"rank": str(rank), "world_size": str(world)}
    if job:
        out["job_id"] = job
    return {**out, **tags}


def _dist() -> Any:
    """torch.distributed when its default process group is initialised, else None."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch built without distributed
        return None
    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist


class StepAgreement:
    """The capture-step check of one profile through the process group's store."""

    def __init__(self, capture_step: int) -> None:
        self.capture_step = capture_step
        self._key = f"candle_trace/profile/{next(_profiles)}"
        self._store: Any = None
        #: (ranks profiling, of them with this capture step), once checked
        self.result: Optional[Tuple[int, int]] = None

    def publish(self) -> None:
        """Adds this rank to the counters, once, as soon as a process group exists."""
        if self._store is not None:
            return
        dist = _dist()
        if dist is None:
            return
        try:
            store = dist.distributed_c10d._get_default_store()
            store.add(f"{self._key}/ranks", 1)
            store.add(f"{self._key}/step/{self.capture_step}", 1)
        except Exception as e:  # noqa: BLE001 - a check, never the program's failure
            warnings.warn(f"candle_trace.torch: could not check the capture step across "
                          f"ranks: {e}", RuntimeWarning, stacklevel=3)
            return
        self._store = store

    def line_up(self) -> None:
        """Once armed: waits until every rank profiling this step has armed (or the
        timeout)."""
        self.publish()
        if self._store is None:
            return
        # Only the ranks that capture this step line up: one that captures another
        # cannot arm before this one's update, which needs it (DDP).
        step = f"{self._key}/step/{self.capture_step}"
        try:
            seen = int(self._store.add(step, 0))
            armed = int(self._store.add(f"{step}/armed", 1))
            deadline = time.monotonic() + LINE_UP_TIMEOUT_S
            while armed < seen and time.monotonic() < deadline:
                time.sleep(0.0005)
                armed = int(self._store.add(f"{step}/armed", 0))
        except Exception:  # noqa: BLE001 - the store went away: nothing to line up with
            return
        if armed < seen:
            warnings.warn(f"candle_trace.torch: only {armed} of the {seen} ranks profiling "
                          f"step {self.capture_step} armed within {LINE_UP_TIMEOUT_S:.0f} s; this rank captures "
                          f"without them", RuntimeWarning, stacklevel=4)

    def check(self) -> Optional[Tuple[int, int]]:
        """Reads the counters back: (ranks profiling, ranks with this capture step)."""
        self.publish()
        if self._store is None:
            return None
        try:
            seen = int(self._store.add(f"{self._key}/ranks", 0))
            same = int(self._store.add(f"{self._key}/step/{self.capture_step}", 0))
        except Exception:  # noqa: BLE001 - the store went away (a rank exited)
            return None
        self.result = (seen, same)
        return self.result

    def record(self, session: Any, measured: int) -> None:
        """At the capture's end: the counts as scalars of the measured region, and a
        warning when a rank profiles another update."""
        got = self.check()
        if got is None:
            return
        seen, same = got
        session.record_scalar(measured, "candle_trace/ranks/profiling", float(seen))
        session.record_scalar(measured, "candle_trace/ranks/same_capture_step", float(same))
        if same < seen:
            warnings.warn(f"candle_trace.torch: {seen - same} of the {seen} ranks profiling "
                          f"capture another update than {self.capture_step}: their traces "
                          f"do not show the same step", RuntimeWarning, stacklevel=4)
