"""Sessions, spans and records: the C ABI of candle-trace as Python objects."""

from __future__ import annotations

import ctypes
import functools
import json
import math
import os
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, TypeVar, Union

from . import _lib
from ._lib import (
    Category,
    GradientState,
    MemoryAction,
    SpanKind,
    Status,
    Step,
)

F = TypeVar("F", bound=Callable[..., Any])

#: A span argument of a record: a Span object, or a span id (1 is the root).
SpanRef = Union["Span", int]
Shape = Sequence[int]

ROOT_SPAN = 1


class CandleTraceError(Exception):
    """A call into the library failed.

    ``status`` is the ``ct_status`` (a :class:`Status`, whose ``name`` is the header's,
    e.g. ``"CT_ERR_INVALID_ARGUMENT"``); ``message`` is ``ct_last_error()`` of the call.
    """

    def __init__(self, status: int, message: str) -> None:
        try:
            self.status: Status = Status(status)
        except ValueError:  # a status this binding does not know (a newer library)
            self.status = status  # type: ignore[assignment]
        self.message = message
        name = getattr(self.status, "name", f"ct_status({status})")
        super().__init__(f"{message} [{name}]")


def _raise(status: int) -> None:
    raise CandleTraceError(status, _lib.load().last_error())


def _kw_enum(table: Mapping[Any, int], value: Any, what: str) -> int:
    try:
        return table[value]
    except (KeyError, TypeError):
        raise CandleTraceError(
            Status.CT_ERR_INVALID_ARGUMENT,
            f"candle_trace: unknown {what} {value!r} (one of: "
            + ", ".join(repr(k) for k in table if isinstance(k, str))
            + ")",
        ) from None


def _table(enum_cls: Any, prefix: str, extra: Optional[Mapping[Any, int]] = None) -> dict:
    t: dict = {}
    for m in enum_cls:
        t[m.name[len(prefix):].lower()] = int(m)
        t[int(m)] = int(m)
    t.update(extra or {})
    return t


_KINDS = _table(SpanKind, "CT_SPAN_")
_STEPS = _table(Step, "CT_STEP_", {None: 0})
_ACTIONS = _table(MemoryAction, "CT_MEMORY_")
_GRAD_STATES = _table(GradientState, "CT_GRADIENT_")
_CATEGORIES = _table(Category, "CT_CATEGORY_", {None: 0})


def _enc(value: Optional[str], what: str) -> Optional[bytes]:
    """str -> NUL-terminated UTF-8 (None stays NULL). Embedded NULs are refused."""
    if value is None:
        return None
    if isinstance(value, bytes):
        b = value
    else:
        try:
            b = str(value).encode("utf-8")
        except UnicodeEncodeError as e:
            raise CandleTraceError(
                Status.CT_ERR_INVALID_ARGUMENT, f"candle_trace: {what} is not valid UTF-8: {e}"
            ) from None
    if b"\0" in b:
        raise CandleTraceError(
            Status.CT_ERR_INVALID_ARGUMENT, f"candle_trace: {what} contains a NUL character"
        )
    return b


def _shape(shape: Shape) -> tuple[Any, int]:
    dims = [int(d) for d in shape]
    if not dims:
        return None, 0
    return (ctypes.c_int64 * len(dims))(*dims), len(dims)


def _span_id(span: SpanRef) -> int:
    if isinstance(span, int):
        return span
    return span.id


class Span(ctypes.c_uint64):
    """One span of a session: a context manager and a decorator.

    ``with session.span("forward", kind="module", step="forward"):`` opens the span on
    the calling thread (nested in that thread's innermost open span) and closes it on
    exit, exception or not; exceptions are never swallowed. Used as a decorator, each
    call of the function gets its own span. The object is its own span-id buffer (a
    ``c_uint64``), so the hot path allocates one object per span and nothing else.
    """

    __slots__ = ("_sess", "_name", "_kind", "_step", "_measured")

    @property
    def id(self) -> int:
        """The span's id while open (``s<id>`` in the trace), 0 before it opened."""
        return self.value

    def __enter__(self) -> "Span":
        s = self._sess
        if self._measured:
            st = s._raw_measure(s._hc, self._name, ctypes.byref(self))
        else:
            st = s._raw_begin(s._hc, self._name, self._kind, self._step, ctypes.byref(self))
        if st:
            _raise(st)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        s = self._sess
        st = s._raw_end(s._hc, self)
        if st and exc_type is None:
            _raise(st)
        return False

    def __call__(self, fn: F) -> F:
        sess, name, kind, step, measured = (
            self._sess, self._name, self._kind, self._step, self._measured)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            sp = Span()
            sp._sess, sp._name, sp._kind, sp._step, sp._measured = (
                sess, name, kind, step, measured)
            with sp:
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"<Span {self._name.decode()!r} id={self.value}>"


class _NoopSpan:
    """What spans are when the session is disabled."""

    __slots__ = ()
    id = 0

    def __enter__(self) -> "_NoopSpan":
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False

    def __call__(self, fn: F) -> F:
        return fn


_NOOP_SPAN = _NoopSpan()


class TracerWork:
    """The tracer's own work (``session.tracer_work()``): a context manager and a
    decorator. Inside, the session clock stands still (``ct_tracer_begin``), so a binding's
    bookkeeping, statistics or record writing is counted in no span; the trace states the
    total (``tracer_ns`` on the measured span's end and on the terminal). Nests; a
    disabled session makes it a no-op."""

    __slots__ = ("_sess",)

    def __init__(self, session: "Session") -> None:
        self._sess = session

    def __enter__(self) -> "TracerWork":
        s = self._sess
        if s.enabled:
            s._call(s._c.ct_tracer_begin(s.handle))
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        s = self._sess
        if s.enabled:
            st = s._c.ct_tracer_end(s.handle)
            if st and exc_type is None:
                _raise(st)
        return False

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
_NAME_CACHE_MAX = 4096


class Session:
    """One trace: ``ct_open`` ... ``ct_finish``.

    As a context manager it finishes on a normal exit and, when an exception leaves the
    block, ends the capture as failed with the exception's text as the reason (the
    exception still propagates). With ``enabled=False`` nothing is opened or written
    and every method is a no-op.

    ``contract`` is the ``capture_contract`` object and ``identity`` the
    ``comparison_identity`` object of docs/trace-format.md; ``run`` adds further keys of
    the run JSON (``warmup_steps``, ``correlation_id``, ``timing_mode``, ...).
    """

    def __init__(
        self,
        path: Union[str, os.PathLike],
        entrypoint: str,
        phase: str = "train",
        capture_step: int = 1,
        device: str = "cpu",
        *,
        tags: Optional[Mapping[str, str]] = None,
        contract: Optional[Mapping[str, Any]] = None,
        identity: Optional[Mapping[str, Any]] = None,
        measured_root: bool = False,
        enabled: bool = True,
        run: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.path = os.fspath(path)
        self.enabled = bool(enabled)
        self.handle = 0
        self._finished = False
        self._names: dict = {}
        if not self.enabled:
            return
        run_json: dict = {
            "entrypoint": entrypoint,
            "phase": phase,
            "capture_step": capture_step,
            "device": device,
            "binding": "python",  # meta.producer.binding
        }
        if tags is not None:
            run_json["tags"] = dict(tags)
        if contract is not None:
            run_json["capture_contract"] = dict(contract)
        if identity is not None:
            run_json["comparison_identity"] = dict(identity)
        if measured_root:
            run_json["measured_root"] = True
        for k, v in (run or {}).items():
            run_json[k] = v
        try:
            text = json.dumps(run_json, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise CandleTraceError(
                Status.CT_ERR_INVALID_ARGUMENT, f"candle_trace: run JSON: {e}") from None
        lib = _lib.load()
        self._lib = lib
        self._c = lib.c
        raw = lib.raw
        # The span fast path: functions without argtypes (ctypes converts nothing), on
        # the PyDLL handle (the GIL is kept: the calls cost tens of nanoseconds).
        self._raw_begin = raw.ct_span_begin
        self._raw_measure = raw.ct_measurement_begin
        self._raw_end = raw.ct_span_end
        out = ctypes.c_uint64()
        st = lib.c.ct_open(_enc(self.path, "path"), text.encode(), ctypes.byref(out))
        if st:
            _raise(st)
        self.handle = out.value
        self._hc = ctypes.c_uint64(self.handle)

    # -- lifetime ----------------------------------------------------------------

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if not self.enabled or self._finished:
            return False
        if exc_type is None:
            self.finish()
        else:
            reason = f"{exc_type.__name__}: {exc}" if str(exc) else exc_type.__name__
            try:
                self.finish_failed(reason)
            except CandleTraceError:
                pass  # the original exception matters more
        return False

    def _call(self, st: int) -> None:
        if st:
            _raise(st)

    def finish(self) -> None:
        """Writes the terminal ``complete`` line (``ct_finish``)."""
        if not self.enabled:
            return
        self._call(self._c.ct_finish(self.handle))
        self._finished = True

    def finish_failed(self, reason: str) -> None:
        """Writes the terminal ``failed`` line with ``reason`` (``ct_finish_failed``)."""
        if not self.enabled:
            return
        self._finished = True
        self._call(self._c.ct_finish_failed(self.handle, _enc(reason, "reason")))

    def flush(self) -> None:
        """Writes everything recorded so far (``ct_flush``)."""
        if self.enabled:
            self._call(self._c.ct_flush(self.handle))

    def aggregate_enable(self, on: bool) -> None:
        """Switches an aggregate session's statistics on or off
        (``ct_aggregate_enable``; open it with ``run={"mode": "aggregate"}``)."""
        if self.enabled:
            self._call(self._c.ct_aggregate_enable(self.handle, 1 if on else 0))

    @property
    def finished(self) -> bool:
        return self._finished

    def now_ns(self) -> int:
        """The session clock (ns since open); 0 when disabled."""
        if not self.enabled:
            return 0
        return self._c.ct_now_ns(self.handle)

    def tracer_ns(self) -> int:
        """The tracer's own time left out of the session clock so far (ns; ``ct_tracer_ns``)."""
        if not self.enabled:
            return 0
        return self._c.ct_tracer_ns(self.handle)

    def tracer_work(self) -> "TracerWork":
        """Brackets the tracer's own work (``with session.tracer_work(): ...``): the session
        clock stands still inside, so no span counts it (``ct_tracer_begin``/``ct_tracer_end``)."""
        return TracerWork(self)

    # -- spans -----------------------------------------------------------------

    def _name(self, name: str) -> bytes:
        b = self._names.get(name)
        if b is None:
            b = _enc(name, "span name")
            if len(self._names) >= _NAME_CACHE_MAX:
                self._names.clear()
            self._names[name] = b
        return b  # type: ignore[return-value]

    def span(self, name: str, kind: Any = 0, step: Any = None) -> Span:
        """A span named ``name``: ``kind`` is "function" (default), "op" or "module";
        ``step`` is None, "forward", "backward" or "optimizer"."""
        if not self.enabled:
            return _NOOP_SPAN  # type: ignore[return-value]
        sp = Span()
        sp._sess = self
        b = self._names.get(name)
        sp._name = b if b is not None else self._name(name)
        sp._kind = kind if kind.__class__ is int else _kw_enum(_KINDS, kind, "span kind")
        sp._step = 0 if step is None else _kw_enum(_STEPS, step, "step")
        sp._measured = False
        return sp

    def measure(self, name: str) -> Span:
        """The session's single measured region, as a context manager or decorator."""
        if not self.enabled:
            return _NOOP_SPAN  # type: ignore[return-value]
        sp = Span()
        sp._sess, sp._name, sp._kind, sp._step, sp._measured = (
            self, self._name(name), 0, 0, True)
        return sp

    def begin_span(self, name: str, kind: Any = 0, step: Any = None) -> int:
        """``ct_span_begin``: opens a span on this thread and returns its id."""
        if not self.enabled:
            return 0
        out = ctypes.c_uint64()
        self._call(self._c.ct_span_begin(
            self.handle, self._name(name), _kw_enum(_KINDS, kind, "span kind"),
            _kw_enum(_STEPS, step, "step"), ctypes.byref(out)))
        return out.value

    def begin_measurement(self, name: str) -> int:
        """``ct_measurement_begin``: opens the measured region; returns its id."""
        if not self.enabled:
            return 0
        out = ctypes.c_uint64()
        self._call(self._c.ct_measurement_begin(self.handle, self._name(name),
                                                ctypes.byref(out)))
        return out.value

    def end_span(self, span: SpanRef) -> None:
        """``ct_span_end``: closes this thread's innermost span."""
        if self.enabled:
            self._call(self._c.ct_span_end(self.handle, _span_id(span)))

    def record_completed_span(self, name: str, kind: Any, start_ns: int,
                              duration_ns: int) -> int:
        """``ct_record_completed_span``: host work that already happened; returns its id."""
        if not self.enabled:
            return 0
        out = ctypes.c_uint64()
        self._call(self._c.ct_record_completed_span(
            self.handle, self._name(name), _kw_enum(_KINDS, kind, "span kind"),
            int(start_ns), int(duration_ns), ctypes.byref(out)))
        return out.value

    # -- records -----------------------------------------------------------------

    def record_op(
        self,
        span: SpanRef,
        op_name: str,
        *,
        dtype: str,
        device: str,
        shape: Shape = (),
        inputs: Iterable[str] = (),
        output: Optional[str] = None,
        duration_ns: int = 0,
        timestamp_ns: int = 0,
        input_dense_bytes: int = 0,
        output_dense_bytes: Optional[int] = None,
    ) -> None:
        """``ct_record_op``: one executed operation."""
        if not self.enabled:
            return
        ins = [_enc(i, "op input") for i in inputs]
        arr = (ctypes.c_char_p * len(ins))(*ins) if ins else None
        dims, rank = _shape(shape)
        op = _lib.Op(
            size=ctypes.sizeof(_lib.Op),
            flags=0 if output_dense_bytes is None else _lib.CT_HAS_OUTPUT_DENSE_BYTES,
            op_name=_enc(op_name, "op_name"), dtype=_enc(dtype, "dtype"),
            device=_enc(device, "device"),
            inputs=ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p)) if arr else None,
            n_inputs=len(ins), output=_enc(output, "output"),
            shape=ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64)) if dims else None,
            rank=rank, duration_ns=int(duration_ns), timestamp_ns=int(timestamp_ns),
            output_dense_bytes=int(output_dense_bytes or 0),
            input_dense_bytes=int(input_dense_bytes))
        self._call(self._c.ct_record_op(self.handle, _span_id(span), ctypes.byref(op)))

    def record_tensor(
        self,
        span: SpanRef,
        tensor_id: str,
        *,
        dtype: str,
        device: str,
        shape: Shape = (),
        label: Optional[str] = None,
        requires_grad: bool = False,
        category: Any = "other",
        dense_bytes: Optional[int] = None,
    ) -> None:
        """``ct_record_tensor``: a tensor's metadata."""
        if not self.enabled:
            return
        dims, rank = _shape(shape)
        t = _lib.Tensor(
            size=ctypes.sizeof(_lib.Tensor),
            flags=0 if dense_bytes is None else _lib.CT_HAS_DENSE_BYTES,
            tensor_id=_enc(tensor_id, "tensor_id"), dtype=_enc(dtype, "dtype"),
            device=_enc(device, "device"), label=_enc(label, "label"),
            shape=ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64)) if dims else None,
            rank=rank, requires_grad=1 if requires_grad else 0,
            category=_kw_enum(_CATEGORIES, category, "category"),
            dense_bytes=int(dense_bytes or 0))
        self._call(self._c.ct_record_tensor(self.handle, _span_id(span), ctypes.byref(t)))

    def record_tensor_stats(
        self,
        span: SpanRef,
        label: str,
        *,
        dtype: str,
        shape: Shape,
        non_finite: int,
        rms: float,
        abs_max: float,
        mean: float,
        elements: Optional[int] = None,
    ) -> None:
        """``ct_record_tensor_stats``: statistics the caller already reduced.
        ``elements`` defaults to the product of ``shape``."""
        if not self.enabled:
            return
        dims, rank = _shape(shape)
        if elements is None:
            elements = math.prod(int(d) for d in shape)
        st = _lib.TensorStats(
            size=ctypes.sizeof(_lib.TensorStats), reserved=0,
            label=_enc(label, "label"), dtype=_enc(dtype, "dtype"),
            shape=ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64)) if dims else None,
            rank=rank, elements=int(elements), non_finite=int(non_finite),
            rms=float(rms), abs_max=float(abs_max), mean=float(mean))
        self._call(self._c.ct_record_tensor_stats(self.handle, _span_id(span),
                                                  ctypes.byref(st)))

    def record_tensor_stats_f32(self, span: SpanRef, label: str, data: Any,
                                shape: Shape) -> None:
        """``ct_record_tensor_stats_f32``: the library reduces a host float32 buffer.
        ``data`` is anything with the buffer protocol (array('f'), a numpy array, a
        contiguous CPU torch tensor's numpy view) or a sequence of floats."""
        if not self.enabled:
            return
        dims, rank = _shape(shape)
        n = math.prod(int(d) for d in shape)
        try:
            mv = memoryview(data).cast("B")
            if mv.nbytes != 4 * n:
                raise CandleTraceError(
                    Status.CT_ERR_INVALID_ARGUMENT,
                    f"candle_trace: record_tensor_stats_f32: buffer has {mv.nbytes} bytes, "
                    f"shape {list(shape)} needs {4 * n}")
            buf = (ctypes.c_float * n).from_buffer_copy(mv) if n else None
        except TypeError:
            vals = list(data)
            buf = (ctypes.c_float * len(vals))(*vals) if vals else None
        self._call(self._c.ct_record_tensor_stats_f32(
            self.handle, _span_id(span), _enc(label, "label"),
            ctypes.cast(buf, ctypes.POINTER(ctypes.c_float)) if buf is not None else None,
            ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64)) if dims else None, rank))

    def record_scalar(self, span: SpanRef, label: str, value: float) -> None:
        """``ct_record_scalar``: a scalar (a loss, a learning rate) as 1-element stats."""
        if self.enabled:
            self._call(self._c.ct_record_scalar(self.handle, _span_id(span),
                                                _enc(label, "label"), float(value)))

    def record_memory(
        self,
        span: SpanRef,
        action: Any,
        *,
        storage_id: str,
        tensor_id: str,
        device: str,
        dtype: str,
        bytes: int,
        shape: Shape = (),
        op_name: Optional[str] = None,
        category: Any = "other",
        timestamp_ns: int = 0,
    ) -> None:
        """``ct_record_memory``: ``action`` is "alloc" or "free"."""
        if not self.enabled:
            return
        dims, rank = _shape(shape)
        m = _lib.Memory(
            size=ctypes.sizeof(_lib.Memory), reserved=0, timestamp_ns=int(timestamp_ns),
            storage_id=_enc(storage_id, "storage_id"), tensor_id=_enc(tensor_id, "tensor_id"),
            device=_enc(device, "device"), dtype=_enc(dtype, "dtype"),
            op_name=_enc(op_name, "op_name"), bytes=int(bytes),
            shape=ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64)) if dims else None,
            rank=rank, category=_kw_enum(_CATEGORIES, category, "category"))
        self._call(self._c.ct_record_memory(
            self.handle, _span_id(span), _kw_enum(_ACTIONS, action, "memory action"),
            ctypes.byref(m)))

    def record_device_memory(
        self,
        device: str,
        *,
        used_bytes: Optional[int] = None,
        free_bytes: Optional[int] = None,
        reserved_bytes: Optional[int] = None,
        capacity_bytes: Optional[int] = None,
        timestamp_ns: int = 0,
    ) -> None:
        """``ct_record_device_memory``: a physical memory sample (at least one value)."""
        if not self.enabled:
            return
        flags = ((_lib.CT_HAS_USED_BYTES if used_bytes is not None else 0)
                 | (_lib.CT_HAS_FREE_BYTES if free_bytes is not None else 0)
                 | (_lib.CT_HAS_RESERVED_BYTES if reserved_bytes is not None else 0)
                 | (_lib.CT_HAS_CAPACITY_BYTES if capacity_bytes is not None else 0))
        d = _lib.DeviceMemory(
            size=ctypes.sizeof(_lib.DeviceMemory), flags=flags, timestamp_ns=int(timestamp_ns),
            device=_enc(device, "device"), used_bytes=int(used_bytes or 0),
            free_bytes=int(free_bytes or 0), reserved_bytes=int(reserved_bytes or 0),
            capacity_bytes=int(capacity_bytes or 0))
        self._call(self._c.ct_record_device_memory(self.handle, ctypes.byref(d)))

    def record_device_interval(
        self,
        span: SpanRef,
        *,
        device: str,
        stream_id: str,
        backend: str,
        start_ns: int,
        duration_ns: int,
        clock_id: Optional[str] = None,
        name: Optional[str] = None,
        correlation_id: Optional[int] = None,
    ) -> None:
        """``ct_record_device_interval``: device work launched by ``span``."""
        if not self.enabled:
            return
        d = _lib.DeviceInterval(
            size=ctypes.sizeof(_lib.DeviceInterval),
            flags=_lib.CT_HAS_CORRELATION_ID if correlation_id is not None else 0,
            device=_enc(device, "device"), stream_id=_enc(stream_id, "stream_id"),
            clock_id=_enc(clock_id, "clock_id"), backend=_enc(backend, "backend"),
            name=_enc(name, "name"), start_ns=int(start_ns), duration_ns=int(duration_ns),
            correlation_id=int(correlation_id or 0))
        self._call(self._c.ct_record_device_interval(self.handle, _span_id(span),
                                                     ctypes.byref(d)))

    def record_call_edge(self, from_span: SpanRef, to_span: SpanRef,
                         host_duration_ns: int = 0) -> None:
        """``ct_record_call_edge``: ``to``'s parent must be ``from``."""
        if self.enabled:
            self._call(self._c.ct_record_call_edge(
                self.handle, _span_id(from_span), _span_id(to_span), int(host_duration_ns)))

    def record_data_edge(self, from_tensor: str, to_tensor: str) -> None:
        """``ct_record_data_edge``: both tensor ids must already be known."""
        if self.enabled:
            self._call(self._c.ct_record_data_edge(
                self.handle, _enc(from_tensor, "from_tensor"), _enc(to_tensor, "to_tensor")))

    def record_gradient(self, root: str, key: str, state: Any,
                        norm: Optional[float] = None) -> None:
        """``ct_record_gradient``: ``state`` is "present", "zero", "missing" or
        "non_finite"; ``norm`` is required for present/zero and absent otherwise."""
        if not self.enabled:
            return
        n = ctypes.byref(ctypes.c_double(float(norm))) if norm is not None else None
        self._call(self._c.ct_record_gradient(
            self.handle, _enc(root, "root"), _enc(key, "key"),
            _kw_enum(_GRAD_STATES, state, "gradient state"), n))

    # -- device collectors ---------------------------------------------------------

    def device_start(self, options: Optional[Mapping[str, Any]] = None) -> None:
        """``ct_device_start``; raises CandleTraceError(CT_ERR_UNAVAILABLE) when the
        collectors are not available (the session goes on).

        With ``"cupti"`` collected and no ``"cupti_lib"`` given, the libcupti of
        an installed nvidia-cuda-cupti package is offered to the library: this
        Python's import path finds it wherever pip put it."""
        if self.enabled:
            opts = dict(options) if options else {}
            if ("cupti" in opts.get("collect", ()) and "cupti_lib" not in opts
                    and not os.environ.get("CANDLE_TRACE_CUPTI_LIB")):
                found = pip_cupti_dir()
                if found:
                    opts["cupti_lib"] = found
            self._call(self._c.ct_device_start(
                self.handle, json.dumps(opts).encode() if opts else None))

    def device_stop(self) -> None:
        """``ct_device_stop``."""
        if self.enabled:
            self._call(self._c.ct_device_stop(self.handle))

    def __repr__(self) -> str:
        state = "disabled" if not self.enabled else (
            "finished" if self._finished else f"handle={self.handle}")
        return f"<candle_trace.Session {self.path!r} {state}>"


def pip_cupti_dir() -> Optional[str]:
    """The folder holding libcupti from the nvidia-cuda-cupti-cu12 (or CUDA 13
    nvidia-cuda-cupti) package importable here, or None. The package has no
    Python code: its folder is found without importing anything but the
    ``nvidia`` namespace."""
    import importlib.util

    for package in ("nvidia.cuda_cupti", "nvidia.cu13"):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for loc in (spec.submodule_search_locations or []) if spec else []:
            lib = os.path.join(loc, "lib")
            if os.path.isdir(lib) and any(f.startswith("libcupti.so") for f in os.listdir(lib)):
                return lib
    return None


def version() -> str:
    """The library version (``ct_version``)."""
    return _lib.load().version()


def abi_version() -> int:
    """The library's C ABI version (``ct_abi_version``)."""
    return int(_lib.load().c.ct_abi_version())


def gradient_contract(expected: Sequence[tuple[str, str, str]],
                      families: Optional[Mapping[str, tuple[str, int]]] = None) -> dict:
    """A ``gradient_contract`` object: ``expected`` is an ordered list of
    ``(root, key, family)``; ``families`` maps a family to ``(expectation, min_present)``
    (default: every family "active" with min_present 1). The digest is computed by the
    library."""
    fams: dict = {}
    for _, _, fam in expected:
        fams.setdefault(fam, ("active", 1))
    fams.update(families or {})
    return {
        "expected": [{"root": r, "key": k, "family": f} for r, k, f in expected],
        "families": [{"family": f, "expectation": e, "min_present": m}
                     for f, (e, m) in fams.items()],
    }

