"""The C++ op observer (_observer.cpp): built on first use against the installed torch,
loaded with ctypes, and driven by candle_trace.torch.profile. The same library carries the
module spans in C++ (_module_spans.cpp, :attr:`Observer.native`).

The build goes through torch.utils.cpp_extension.load (ninja and a C++ compiler, torch's
headers) into ``$CANDLE_TRACE_CACHE`` (default ``~/.cache/candle_trace``), one folder per
torch version, Python version and source digest: it compiles once and later processes
load the built library in milliseconds.

``CANDLE_TRACE_TORCH_OPS`` chooses the op capture mechanism:
``auto`` (default: the observer, else the Python dispatch mode with one warning),
``observer`` (the observer or an error), ``dispatch`` (the Python dispatch mode).
"""

from __future__ import annotations

import collections
import collections.abc
import ctypes
import fcntl
import hashlib
import os
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from .. import _lib
from ._common import torch_grad

SOURCE = Path(__file__).resolve().parent / "_observer.cpp"
#: the library's sources: the observer, and the module spans and statistics in C++
#: (_native.h)
SOURCES = (SOURCE,) + tuple(SOURCE.parent / f for f in (
    "_native.cpp", "_span_stack.cpp", "_module_spans.cpp", "_stats_buffer.cpp"))
#: what the build folder's name digests: the sources and the header they share
DIGESTED = SOURCES + (SOURCE.parent / "_native.h",)
PROTOCOL = 5  # kProtocol of _observer.cpp
#: calibration rounds added while the observed minimum is not above the unobserved one
EXTRA_ROUNDS = 6
MODES = ("auto", "observer", "dispatch")

_lock = threading.Lock()
_observer: Any = None  # an Observer, or False once it failed (or was not wanted)
_failure: Optional[str] = None


class ObserverUnavailable(RuntimeError):
    """The observer could not be built or loaded (the message says why)."""


def mode() -> str:
    m = os.environ.get("CANDLE_TRACE_TORCH_OPS", "auto").strip().lower() or "auto"
    if m not in MODES:
        raise ValueError(f"CANDLE_TRACE_TORCH_OPS={m!r}: one of {', '.join(MODES)}")
    return m


def cache_root() -> Path:
    env = os.environ.get("CANDLE_TRACE_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "candle_trace"


def build_dir() -> Tuple[str, Path]:
    """(extension name, build folder) for this torch, Python and sources."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in DIGESTED)).hexdigest()[:12]
    tv = torch.__version__.replace("+", "_").replace("/", "_")
    cuda = getattr(torch.version, "cuda", None)
    flavour = f"cu{cuda.replace('.', '')}" if cuda else "cpu"
    tag = f"torch{tv}-{flavour}-py{sys.version_info[0]}{sys.version_info[1]}"
    name = f"candle_trace_observer_{digest}"
    return name, cache_root() / tag / name


def build(verbose: bool = False) -> Path:
    """Compiles _observer.cpp (when not built yet) and returns the shared library.

    To build ahead of time (a CI image, a cluster's shared cache)::

        python3 -c 'from candle_trace.torch import _observer; print(_observer.build(True))'
    """
    name, folder = build_dir()
    folder.mkdir(parents=True, exist_ok=True)
    so, built = folder / f"{name}.so", folder / "built"
    if so.exists() and (built.exists() or not build_under_way(folder)):
        # Built by an earlier process (the folder name carries the source digest): no
        # ninja or compiler needed. "built" says so at once, where asking torch's lock
        # imports cpp_extension (~80 ms, setuptools with it, on torch 2.15).
        _mark_built(built)
        return so
    from torch.utils import cpp_extension

    # The compile takes 5-6 s on a 2-core machine at load 1.5 (torch 1.13 and 2.15), and
    # was seen to take 39 s on a busy one: say up front that the wait happens once.
    sys.stderr.write(
        f"candle_trace: compiling the PyTorch op observer for torch {torch.__version__} "
        "(once, ~10s)...\n")
    sys.stderr.flush()
    started = time.monotonic()
    cpp_extension.load(
        name=name, sources=[str(p) for p in SOURCES], build_directory=str(folder),
        # NDEBUG as in torch's own (release) build: at::RecordFunction has debug-only
        # members and assertions that must match the library's layout.
        extra_cflags=["-O2", "-DNDEBUG", "-fvisibility=hidden", "-fvisibility-inlines-hidden"],
        is_python_module=False, verbose=verbose)
    if not so.exists():
        raise ObserverUnavailable(f"the build left no {so}")
    sys.stderr.write(f"candle_trace: op observer compiled in {time.monotonic() - started:.1f}s "
                     f"into {folder}\n")
    _mark_built(built)
    return so


def _mark_built(built: Path) -> None:
    """Leaves ``built`` beside a finished build (a read-only shared cache keeps asking the
    lock instead)."""
    if not built.exists():
        try:
            built.touch()
        except OSError:
            pass


def build_under_way(folder: Path) -> bool:
    """Whether torch's cpp_extension is building in ``folder`` now. Its ``lock`` there is
    the lock either way, but of two kinds: torch 1.x's FileBaton is the file itself
    (created for the build, removed after it), later torches' FileLock an advisory lock
    held on a file that stays -- there the file alone said "under way" for ever, and
    every process went through cpp_extension.load again, saying it compiled."""
    try:
        fd = os.open(folder / "lock", os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        from torch.utils import cpp_extension
        if not hasattr(cpp_extension, "FileLock"):
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def miniature_step() -> Callable[[], None]:
    """The miniature training step :meth:`Observer.calibrate` times: a linear layer's
    forward, backward and in-place update, with its own weight."""
    # The program may be calling from under torch.inference_mode() (an inference loop):
    # its tensors would take no gradient, and enable_grad alone does not leave it.
    with torch.inference_mode(False):
        gen = torch.Generator().manual_seed(0)
        weight = torch.randn(8, 8, generator=gen).requires_grad_()
        x = torch.randn(4, 8, generator=gen)

    # torch's autograd.grad, not backward(): what wraps the program's backward (a
    # whole-run session, a watch reading the loss, the user's own) must not see it
    @torch.inference_mode(False)
    @torch.enable_grad()
    def step() -> None:
        (grad,) = torch_grad(torch.nn.functional.linear(x, weight).relu().sum(), [weight])
        with torch.no_grad():
            weight.add_(grad, alpha=-1e-3)

    return step


class Observer:
    """The loaded observer library: one capture at a time per process."""

    def __init__(self, path: Path) -> None:
        self.path = path
        dll = ctypes.PyDLL(str(path))  # short calls, keep the GIL
        self._dll = dll
        self._emit_dll = ctypes.CDLL(str(path))  # emit enters the library's Go side
        proto = dll.ct_obs_protocol()
        if proto != PROTOCOL:
            raise ObserverUnavailable(f"{path} speaks protocol {proto}, expected {PROTOCOL}")
        dll.ct_obs_error.restype = ctypes.c_char_p
        dll.ct_obs_set_abi.argtypes = [ctypes.c_void_p] * 8
        dll.ct_obs_set_abi.restype = None
        dll.ct_obs_begin.argtypes = [
            ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t,
            ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
        dll.ct_obs_begin.restype = ctypes.c_int
        dll.ct_obs_set_span.argtypes = [ctypes.c_uint64]
        dll.ct_obs_set_span.restype = None
        dll.ct_obs_suspend.argtypes = [ctypes.c_int]
        dll.ct_obs_suspend.restype = None
        dll.ct_obs_stop.restype = ctypes.c_int
        dll.ct_obs_counts.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
        dll.ct_obs_counts.restype = None
        self._emit_dll.ct_obs_emit.restype = ctypes.c_uint64
        dll.ct_obs_discard.restype = None
        dll.ct_obs_count_intervals.argtypes = [ctypes.c_int]
        dll.ct_obs_count_intervals.restype = ctypes.c_uint64
        lib = _lib.load()
        addr = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value  # noqa: E731
        c = lib.c
        dll.ct_obs_set_abi(addr(c.ct_now_ns), addr(c.ct_tracer_begin_at),
                           addr(c.ct_tracer_exclude_earlier), addr(c.ct_tracer_end),
                           addr(c.ct_record_op), addr(c.ct_record_memory),
                           addr(c.ct_record_data_edge), addr(c.ct_last_error))
        self.set_span = dll.ct_obs_set_span
        self.suspend = dll.ct_obs_suspend
        native = dll.ct_obs_native
        native.argtypes = [ctypes.c_void_p] * 7 + [ctypes.py_object] * 4
        native.restype = ctypes.py_object
        #: the module spans and statistics in C++ (_module_spans.cpp, _stats_buffer.cpp):
        #: span_stack(), module_table(), stats_buffer()
        self.native = self.native_over(addr(c.ct_tracer_begin), addr(c.ct_tracer_end))
        self.running = False
        #: ns torch spends per record function the observer sees, before and after
        #: its callbacks run (calibrate()); None until measured
        self.per_op_ns: Optional[int] = None

    def native_over(self, tracer_begin: int, tracer_end: int) -> Any:
        """The module of the module spans and statistics in C++ whose brackets call these
        functions (addresses): the library's ``ct_tracer_begin``/``ct_tracer_end``, or a
        counting tool's shim in front of them (bench_capture_callgrind.py). One library
        per process: the latest call's functions are every object's."""
        c = _lib.load().c
        addr = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value  # noqa: E731
        return self._dll.ct_obs_native(
            addr(c.ct_span_begin), addr(c.ct_span_end), addr(c.ct_measurement_begin),
            tracer_begin, tracer_end,
            addr(c.ct_reduce_tensor_stats_f32), addr(c.ct_record_tensor_stats), torch.Tensor,
            torch.overrides.has_torch_function_unary, collections.OrderedDict,
            collections.abc.Mapping)

    def error(self) -> str:
        m = self._dll.ct_obs_error()
        return m.decode("utf-8", "replace") if m else ""

    @staticmethod
    def named(tensors: Sequence[Tuple[str, torch.Tensor]]) -> tuple:
        """The argument of begin() for these named tensors (prepare it ahead of the step):
        the arrays (kept alive by the tuple), their addresses and the count."""
        n = len(tensors)
        arrays = (
            (ctypes.c_uint64 * max(n, 1))(*[t._cdata for _, t in tensors]),
            (ctypes.c_int64 * max(n, 1))(*[t.numel() for _, t in tensors]),
            (ctypes.c_char_p * max(n, 1))(*[k.encode() for k, _ in tensors]),
        )
        return arrays + tuple(ctypes.addressof(a) for a in arrays) + (n,)

    def calibrate(self, session: Any = None, batch: int = 20, batches: int = 7,
                  rounds: int = 3) -> int:
        """What recording costs that no tracer interval covers -- torch setting up each
        record function, boxing its inputs and outputs, naming an autograd node's record
        function (which it does only when a callback listens), the calls into the
        observer and the library's own before and after their clock reads -- in ns per
        record function the observer sees: ``batch`` miniature training steps (a linear
        layer's forward, backward and in-place update: the record functions of an
        update) timed untraced, and on the clock of a private session of the library
        while the observer records them into it (then discarded); the fastest of
        ``batches`` batches each (interference only adds time), over ``rounds`` rounds:
        the fastest observed round less the fastest unobserved one, each per record
        function (with up to ``EXTRA_ROUNDS`` more rounds while that is not above 0). A slow moment of the machine lasts a round or more and slows one kind
        more than the other: an observed round that comes out two to three times the
        others (torch 2.15 here: 1.2-2.0 us against 0.55-0.8), once two rounds of three
        in one process of eight (2235, 2250 and 1207 ns, where five of the others
        measured 1.20-1.28 us), would backdate every callback by it and leave the
        model's own time out of the trace (a GPT-style update at batch 1 x 8 measured
        0.88x its untraced time); an unobserved round slowed under load made a round's
        difference 0. The fastest of each kind is what neither did to it. Each callback's
        interval then begins half of it early (:meth:`begin`).

        A private session, not the capture's: the capture arms (and calibrates) inside
        a tracer interval of its session, whose clock stands still there, and no trace
        counts the calibration. Measured once per process, before the first capture's
        update; ``CANDLE_TRACE_CALIBRATE=0`` makes it 0 (the trace then counts that cost
        as the model's). ``session`` is not used."""
        if self.per_op_ns is not None:
            return self.per_op_ns
        if os.environ.get("CANDLE_TRACE_CALIBRATE", "1").strip() == "0":
            self.per_op_ns = 0
            return 0
        from ..session import CandleTraceError, Session

        step = miniature_step()

        def steps(clock: Any, *arg: Any) -> int:
            t = clock(*arg)
            for _ in range(batch):
                step()
            return clock(*arg) - t

        nobody = self.named([])
        count = self._dll.ct_obs_count_intervals
        on_rf: List[float] = []  # each round's fastest observed batch, per record function
        off_rf: List[float] = []  # ... and unobserved batch
        try:
            with tempfile.TemporaryDirectory(prefix="candle_trace-calibration-") as tmp:
                s = Session(os.path.join(tmp, "calibration.jsonl"), "candle_trace::calibrate",
                            "train", 1, "cpu", run={"buffer": {"max_bytes": 1 << 20}})
                try:
                    now, hc = s._lib.raw.ct_now_ns, s._hc
                    steps(time.perf_counter_ns)  # warm
                    done = 0
                    # More rounds while the fastest observed one is no slower than the
                    # fastest unobserved one: a difference of two noisy minimums, which
                    # came out 0 in 1 of 24 calibrations on a 2-vCPU VM (where 500-2,600
                    # ns was the spread of the others); each round only lowers a minimum.
                    while done < rounds or (on_rf and min(on_rf) <= min(off_rf)
                                            and done < rounds + EXTRA_ROUNDS):
                        done += 1
                        offs, ons, seen = [], [], 0
                        for i in range(batches + 1):
                            offs.append(steps(time.perf_counter_ns))
                            self.begin(s.handle, 1, True, nobody, earlier_ns=0)
                            try:
                                count(1)
                                on = steps(now, hc)
                                n = count(0)
                            finally:
                                self.stop()
                                self.discard()
                            if i:  # the first: the observer learns which ops call others
                                ons.append(on)
                                seen = n
                        # per record function seen, two intervals each (its start and
                        # end callbacks): the round's fastest batch of each kind
                        per_rf = 2 / max(seen, 1)
                        on_rf.append(min(ons) * per_rf)
                        off_rf.append(min(offs) * per_rf)
                finally:
                    s.discard()
        except (OSError, CandleTraceError) as e:  # no temporary folder, no session left
            warnings.warn(f"candle_trace.torch: the observer's cost could not be calibrated "
                          f"({e}); the captured update counts it as the model's",
                          RuntimeWarning, stacklevel=4)
            self.per_op_ns = 0
            return 0
        self.per_op_ns = max(0, int(min(on_rf) - min(off_rf)))
        return self.per_op_ns

    def begin(self, session: int, measured: int, memory: bool, named: tuple,
              earlier_ns: Optional[int] = None) -> bool:
        """Starts recording (``named`` from :meth:`named`); returns whether op-output
        memory is recorded. Each callback's tracer interval begins ``earlier_ns`` early
        (default: half of :meth:`calibrate`'s figure, none when it was not measured)."""
        _, _, _, impls, numels, names, n = named
        earlier = (self.per_op_ns or 0) // 2 if earlier_ns is None else earlier_ns
        # ct_obs_begin through the library's own module: a ctypes call converting nine
        # arguments costs ~15k instructions, and this runs in the update's first forward.
        mem = self.native.observer_begin(session, measured, 1 if memory else 0, impls, numels,
                                         names, n, earlier)
        if mem < 0:
            raise ObserverUnavailable(self.error())
        self.running = True
        return bool(mem)

    def stop(self) -> None:
        if self.running:
            self.running = False
            if self._dll.ct_obs_stop():
                raise ObserverUnavailable(self.error())

    def counts(self) -> Tuple[int, int, int]:
        out = (ctypes.c_uint64 * 3)()
        self._dll.ct_obs_counts(out)
        return out[0], out[1], out[2]

    def emit(self) -> Tuple[int, str]:
        """Writes the buffered records; (refused records, first refusal's message)."""
        errors = self._emit_dll.ct_obs_emit()
        return int(errors), (self.error() if errors else "")

    def discard(self) -> None:
        self._dll.ct_obs_discard()


def get() -> Optional[Observer]:
    """The observer, building it on first use; None when the dispatch mode is to be
    used (forced, or the observer is unavailable: then one warning says why)."""
    global _observer, _failure
    m = mode()
    if m == "dispatch":
        return None
    with _lock:
        if _observer is None:
            try:
                _observer = Observer(build())
            except Exception as e:  # noqa: BLE001 - no compiler, ninja, headers, ...
                _observer = False
                _failure = f"{type(e).__name__}: {e}".strip()
        if _observer is False:
            if m == "observer":
                raise ObserverUnavailable(
                    f"candle_trace.torch: the C++ op observer is unavailable: {_failure}")
            if not getattr(get, "_warned", False):
                get._warned = True  # type: ignore[attr-defined]
                lines = (_failure or "unknown").splitlines()
                short = next((ln for ln in lines if "error" in ln.lower() and ": " in ln),
                             lines[0]).strip()
                warnings.warn(
                    "candle_trace.torch: the C++ op observer is unavailable (needs a C++ "
                    "compiler, ninja and torch's headers; set CANDLE_TRACE_TORCH_OPS=dispatch "
                    f"to silence this): {short[:500]}. Falling back to a Python "
                    "TorchDispatchMode, which costs tens of microseconds per op.",
                    RuntimeWarning, stacklevel=3)
            return None
        return _observer


def failure() -> Optional[str]:
    """Why the observer is unavailable (None when it loaded or was not tried)."""
    return _failure
