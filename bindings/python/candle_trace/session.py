"""Sessions, spans and records: the C ABI of candle-trace as Python objects.

Every public function checks its arguments here (``_args``) before anything reaches the
C ABI: a wrong type raises :class:`CandleTraceTypeError`, a bad value
:class:`CandleTraceValueError` (both :class:`CandleTraceError`), naming the function and
the argument; what the library refuses raises :class:`CandleTraceError` with its message.
"""

from __future__ import annotations

import ctypes
import functools
import os
import types
import weakref
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, TypeVar, Union

from . import _args, _lib
from ._errors import CandleTraceError, CandleTraceTypeError, CandleTraceValueError  # noqa: F401
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

#: The ``failed`` reason of a Session garbage-collected (or left at interpreter exit)
#: without finish() or finish_failed().
DROPPED_REASON = "the Session was dropped without finish()"
#: The reason finish_failed("") writes: the library needs a non-empty one.
EMPTY_REASON = "finish_failed() was called without a reason"


def _raise(status: int) -> None:
    raise CandleTraceError(status, _lib.load().last_error())


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


def _kind(kind: Any, fn: str) -> int:
    k = _KINDS.get(kind) if kind.__class__ is int or kind.__class__ is str else None
    return k if k is not None else _args.choice(_KINDS, kind, fn, "kind", "span kind")


def _step(step: Any, fn: str) -> int:
    if step is None:
        return 0
    return _args.choice(_STEPS, step, fn, "step", "step")


def _category(category: Any, fn: str) -> int:
    return _args.choice(_CATEGORIES, category, fn, "category", "category")


def _span_id(span: Any, fn: str, arg: str = "span") -> int:
    """A span argument: a Span (its id) or a span id (an int, 1 is the root)."""
    if span.__class__ is int and 0 <= span <= _args.U64_MAX:
        return span
    if isinstance(span, (Span, _NoopSpan)):
        return span.id
    if isinstance(span, bool) or not hasattr(type(span), "__index__"):
        raise _args.type_error(fn, arg, "a Span or a span id (an int)", span)
    return _args.integer(span, fn, arg)


def _dims_pointer(dims: Any) -> Any:
    return ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64)) if dims is not None else None


class _Ignored:
    """An argtype that converts anything without running Python code (``callable`` is a
    C builtin) to an int the C function never reads."""

    from_param = staticmethod(callable)


def _span_exit_check(status: int, func: Any, args: tuple) -> bool:
    """errcheck of the span exit: runs after ct_span_end returned. A failed end raises
    only when the with block raised nothing (its exception matters more) and the session
    was not ended inside the block (finish_failed leaves spans open); the result is
    __exit__'s, False: exceptions are never swallowed."""
    if status and args[2] is None and not (
            status == Status.CT_ERR_INVALID_HANDLE and args[1]._sess._finished):
        _raise(status)
    return False


@functools.lru_cache(maxsize=None)
def _span_exit_function(lib: _lib.Library) -> Any:
    """ct_span_end declared as ``(session, span, exc_type, exc, tb)``: Span.__exit__
    with no Python bytecode before the span ends.

    A with statement calls ``__exit__(exc_type, exc, tb)``; a Python ``__exit__`` can be
    interrupted before its first line (CPython runs signal handlers when a function
    starts), which would leave the span open for good. So ``Span.__exit__`` is this
    function bound to the session handle and the span, called by C code only
    (types.MethodType, functools.partial, ctypes): the three exception arguments are
    passed as trailing integer arguments that ct_span_end does not declare and never
    reads, which every C calling convention the library is built for allows (the caller
    owns the argument registers and stack). The PyDLL handle keeps the GIL, as the span
    fast path does."""
    fn = ctypes.PyDLL(str(lib.path)).ct_span_end
    fn.restype = ctypes.c_int
    fn.argtypes = [_lib.c_session, _lib.c_span, _Ignored, _Ignored, _Ignored]
    fn.errcheck = _span_exit_check
    return fn


def _bind_span_exit(span: "Span") -> Callable[..., bool]:
    return types.MethodType(span._sess._span_exit, span)


class _SpanExit(property):
    """``Span.__exit__``: a property, looked up by the with statement before ``__enter__``
    runs (so its Python code cannot split a span's end from its begin), whose value is
    the C-level callable that ends the span (see _span_exit_function). Callable itself,
    for code that calls ``type(cm).__exit__(cm, *exc)`` (contextlib.ExitStack)."""

    def __call__(self, span: "Span", exc_type: Any, exc: Any, tb: Any) -> bool:
        return _bind_span_exit(span)(exc_type, exc, tb)


class Span(ctypes.c_uint64):
    """One span of a session: a context manager and a decorator.

    ``with session.span("forward", kind="module", step="forward"):`` opens the span on
    the calling thread (nested in that thread's innermost open span) and closes it on
    exit, exception or not; exceptions are never swallowed. Used as a decorator, each
    call of the function gets its own span. The object is its own span-id buffer (a
    ``c_uint64``), so the hot path allocates one object per span and nothing else.

    Asynchronous exceptions (KeyboardInterrupt from a signal handler, which CPython runs
    between bytecodes) never leave a span open: ``__enter__`` ends a span it began when
    anything is raised before it returns, and ``__exit__`` reaches ``ct_span_end`` without
    running Python code.
    """

    __slots__ = ("_sess", "_name", "_kind", "_step", "_measured")

    @property
    def id(self) -> int:
        """The span's id while open (``s<id>`` in the trace), 0 before it opened."""
        return self.value

    def __enter__(self) -> "Span":
        s = self._sess
        self.value = 0  # a reused Span must not look begun
        try:
            if self._measured:
                st = s._raw_measure(s._hc, self._name, ctypes.byref(self))
            else:
                st = s._raw_begin(s._hc, self._name, self._kind, self._step,
                                  ctypes.byref(self))
            if st:
                _raise(st)
            return self
        except BaseException:
            # Raised after ct_span_begin stored the id (a signal handler runs right after
            # the call): the with statement will not call __exit__, so end it here.
            if self.value:
                s._raw_end(s._hc, self)
            raise

    __exit__ = _SpanExit(_bind_span_exit)

    def __call__(self, fn: F) -> F:
        if not callable(fn):
            raise _args.type_error("Span", "the decorated object", "callable", fn)
        sess, name, kind, step, measured = (
            self._sess, self._name, self._kind, self._step, self._measured)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            sp = Span()
            sp._sess, sp._name, sp._kind, sp._step, sp._measured = (
                sess, name, kind, step, measured)
            with sp:
                result = fn(*args, **kwargs)  # the whole call, its end too, in the block
            return result

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"<Span {self._name.decode('utf-8', 'replace')!r} id={self.value}>"


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


def _finish_dropped(finish_failed: Callable[[Any, bytes], int], handle: ctypes.c_uint64) -> None:
    """The weakref.finalize callback of a Session: ends a session nobody finished (it was
    garbage-collected, or the interpreter is exiting) as failed, freeing its slot of the
    255. It never raises: nobody could catch it."""
    try:
        finish_failed(handle, DROPPED_REASON.encode())
    except Exception:  # noqa: BLE001 - a finalizer has nobody to tell
        pass


def _safe_reason(reason: Any) -> bytes:
    """A reason the library takes for a ``reason`` finish_failed could not use as is."""
    if isinstance(reason, (str, bytes)):
        raw = reason if isinstance(reason, str) else reason.decode("utf-8", "backslashreplace")
        raw = raw.encode("utf-8", "backslashreplace").decode("utf-8").replace("\0", "\\0")
        if raw.strip():
            return raw.encode("utf-8")
        return EMPTY_REASON.encode()
    return f"finish_failed() was given {_args.describe(reason)} as its reason".encode(
        "utf-8", "backslashreplace")


class Session:
    """One trace: ``ct_open`` ... ``ct_finish``.

    As a context manager it finishes on a normal exit and, when an exception leaves the
    block, ends the capture as failed with the exception's text as the reason (the
    exception still propagates). With ``enabled=False`` nothing is opened or written
    and every method is a no-op (its arguments are not checked).

    A Session that is garbage-collected, or still open when the interpreter exits,
    without finish() or finish_failed() is ended as failed with the reason
    :data:`DROPPED_REASON`, so its slot (255 sessions may be open at once) is freed.

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
        fn = "Session"
        try:
            self.path = os.fspath(path)
        except TypeError:
            raise _args.type_error(fn, "path", "a str or an os.PathLike", path) from None
        self.enabled = _args.flag(enabled, fn, "enabled")
        self.handle = 0
        self._finished = False
        self._finalizer: Optional[weakref.finalize] = None
        self._names: dict = {}
        if not self.enabled:
            return
        path_b = _args.text(self.path, fn, "path")
        run_json: dict = {
            "entrypoint": _args.string(entrypoint, fn, "entrypoint"),
            "phase": _args.string(phase, fn, "phase"),
            "capture_step": _args.integer(capture_step, fn, "capture_step"),
            "device": _args.string(device, fn, "device"),
            "binding": "python",  # meta.producer.binding
        }
        for key, arg, value in (("tags", "tags", tags),
                                ("capture_contract", "contract", contract),
                                ("comparison_identity", "identity", identity)):
            m = _args.mapping(value, fn, arg)
            if m is not None:
                run_json[key] = m
        if _args.flag(measured_root, fn, "measured_root"):
            run_json["measured_root"] = True
        run_json.update(_args.mapping(run, fn, "run") or {})
        text = _args.json_text(run_json, fn, "run JSON")
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
        try:
            st = lib.c.ct_open(path_b, text, ctypes.byref(out))
            if st:
                _raise(st)
            self.handle = out.value
            self._hc = ctypes.c_uint64(self.handle)
            self._span_exit = functools.partial(_span_exit_function(lib), self._hc)
            # The holder, not its value: a reopen changes the handle in place, and the
            # finalizer ends whichever session the object has then.
            self._finalizer = weakref.finalize(
                self, _finish_dropped, lib.c.ct_finish_failed, self._hc)
        except BaseException:
            # Interrupted between ct_open and the finalizer: nothing else would end it.
            if out.value and self._finalizer is None:
                lib.c.ct_finish_failed(out.value, b"the Session was interrupted while opening")
            raise

    # -- lifetime ----------------------------------------------------------------

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if not self.enabled or self._finished:
            return False
        if exc_type is None:
            self.finish()
        else:
            try:
                text = str(exc)
            except Exception:  # noqa: BLE001 - an exception whose __str__ fails
                text = ""
            reason = f"{exc_type.__name__}: {text}" if text else exc_type.__name__
            try:
                self.finish_failed(reason)
            except CandleTraceError:
                pass  # the original exception matters more
        return False

    def _call(self, st: int) -> None:
        if st:
            _raise(st)

    def _ended(self) -> None:
        """The handle is no longer valid: nothing is left for the finalizer to end."""
        self._finished = True
        if self._finalizer is not None:
            self._finalizer.detach()

    def finish(self) -> None:
        """Writes the terminal ``complete`` line (``ct_finish``). When the library refuses
        (open spans, no measured region, ...) the session stays usable."""
        if not self.enabled:
            return
        st = self._c.ct_finish(self.handle)
        if st in (Status.CT_OK, Status.CT_ERR_INVALID_HANDLE):
            self._ended()
        self._call(st)

    def finish_failed(self, reason: str) -> None:
        """Writes the terminal ``failed`` line with ``reason`` (``ct_finish_failed``).

        The session always ends: an empty or blank ``reason`` writes
        :data:`EMPTY_REASON`; a reason that is not a str (or bytes), holds a NUL
        character, or is not valid UTF-8 ends it with a reason made from it and then
        raises CandleTraceTypeError / CandleTraceValueError."""
        if not self.enabled:
            return
        fn = "Session.finish_failed"
        problem: Optional[CandleTraceError] = None
        try:
            b = _args.text(reason, fn, "reason")
            blank = not b.decode("utf-8", "replace").strip()
        except CandleTraceError as e:
            problem, b, blank = e, _safe_reason(reason), False
        st = self._c.ct_finish_failed(self.handle, EMPTY_REASON.encode() if blank else b)
        if st == Status.CT_ERR_INVALID_ARGUMENT:  # bytes the library refused (not UTF-8)
            problem = _args.value_error(fn, "reason", f"was refused by the library: "
                                                      f"{self._lib.last_error()}")
            st = self._c.ct_finish_failed(self.handle, _safe_reason(reason))
        self._ended()
        if problem is not None:
            raise type(problem)(problem.status, problem.message + "; the session was ended "
                                                                  "as failed anyway")
        self._call(st)

    def discard(self) -> None:
        """Ends a buffered session without writing anything (``ct_discard``): nothing is
        left at its path. Open one with ``run={"buffer": {"max_bytes": N}}``; its trace
        stays in memory and finish() or finish_failed() (also on an exception in a
        ``with`` block) write it. On a session that writes as it records the library
        refuses (CandleTraceError, CT_ERR_STATE) and the session stays usable. On a
        session already ended it does nothing."""
        if not self.enabled or self._finished:
            return
        st = self._c.ct_discard(self.handle)
        if st in (Status.CT_OK, Status.CT_ERR_INVALID_HANDLE):
            self._ended()
        self._call(st)

    def reopen(self, path: Union[str, os.PathLike], capture_step: int) -> None:
        """A flight recorder's next update (``ct_reopen``): discards this buffered
        session and goes on as a new one at ``path`` for ``capture_step``, with the same
        run JSON otherwise, parsed once (``warmup_steps`` and ``correlation_id`` follow
        the step unless the run gave them). The object stays the same -- the handle it
        passes changes in place, so whatever holds it (spans, the op observer's next
        begin) needs nothing new. Refused arguments (a non-buffered session, step 0)
        leave it as it was; once discarded, a path the library refuses raises with the
        session ended."""
        fn = "Session.reopen"
        if not self.enabled:
            return
        if self._finished:
            raise CandleTraceError(Status.CT_ERR_INVALID_HANDLE,
                                   f"{fn}: the session has already ended")
        try:
            p = os.fspath(path)
        except TypeError:
            raise _args.type_error(fn, "path", "a str or an os.PathLike", path) from None
        path_b = _args.text(p, fn, "path")
        step = _args.integer(capture_step, fn, "capture_step")
        out = ctypes.c_uint64()
        st = self._c.ct_reopen(self.handle, path_b, step, ctypes.byref(out))
        if st == Status.CT_OK:
            self.handle = out.value
            self._hc.value = out.value  # the span fast paths and the finalizer hold it
            self.path = p
            return
        if st not in (Status.CT_ERR_INVALID_ARGUMENT, Status.CT_ERR_STATE):
            self._ended()  # discarded (and the next could not open), or gone already
        self._call(st)

    @property
    def dropped_records(self) -> int:
        """How many records a buffered session's bound has dropped so far
        (``ct_dropped_records``; the terminal line states it too); 0 otherwise."""
        if not self.enabled or self._finished:
            return 0
        return self._c.ct_dropped_records(self.handle)

    def flush(self) -> None:
        """Writes everything recorded so far (``ct_flush``)."""
        if self.enabled:
            self._call(self._c.ct_flush(self.handle))

    def aggregate_enable(self, on: bool) -> None:
        """Switches an aggregate session's statistics on or off
        (``ct_aggregate_enable``; open it with ``run={"mode": "aggregate"}``)."""
        if self.enabled:
            on = _args.flag(on, "Session.aggregate_enable", "on")
            self._call(self._c.ct_aggregate_enable(self.handle, 1 if on else 0))

    def aggregate_trigger(self, update: int, trigger: str, value: float, threshold: float = 0.0,
                          *, detail: Optional[str] = None, trace: Optional[str] = None,
                          no_trace: Optional[str] = None) -> None:
        """Lists a trigger that fired in an aggregate session's summary
        (``ct_aggregate_trigger``): the update, its name, the value it measured against
        ``threshold``, and the ``trace`` written for it -- or, without one, why none
        was (``no_trace``): exactly one of the two."""
        if self.enabled:
            fn = "Session.aggregate_trigger"
            self._call(self._c.ct_aggregate_trigger(
                self.handle, _args.integer(update, fn, "update"), _args.text(trigger, fn, "trigger"),
                _args.real(value, fn, "value"), _args.real(threshold, fn, "threshold"),
                _args.text(detail, fn, "detail", optional=True),
                _args.text(trace, fn, "trace", optional=True),
                _args.text(no_trace, fn, "no_trace", optional=True)))

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

    def _name(self, name: Any, fn: str) -> bytes:
        try:
            b = self._names.get(name)
        except TypeError:  # unhashable: not a str, refused below
            b = None
        if b is None:
            b = _args.text(name, fn, "name")
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
        # The hot path inlines the lookups of _name and _kind (a call costs ~50 ns).
        b = self._names.get(name) if name.__class__ is str else None
        sp._name = b if b is not None else self._name(name, "Session.span")
        sp._kind = kind if kind.__class__ is int and -1 < kind < 3 else _kind(
            kind, "Session.span")
        sp._step = 0 if step is None else _step(step, "Session.span")
        sp._measured = False
        return sp

    def measure(self, name: str) -> Span:
        """The session's single measured region, as a context manager or decorator."""
        if not self.enabled:
            return _NOOP_SPAN  # type: ignore[return-value]
        sp = Span()
        sp._sess, sp._name, sp._kind, sp._step, sp._measured = (
            self, self._name(name, "Session.measure"), 0, 0, True)
        return sp

    def _end_begun(self, out: ctypes.c_uint64) -> None:
        """Ends a span whose begin returned but whose id never reached the caller (a
        signal's KeyboardInterrupt right after the call)."""
        if out.value:
            self._c.ct_span_end(self.handle, out.value)

    def begin_span(self, name: str, kind: Any = 0, step: Any = None) -> int:
        """``ct_span_begin``: opens a span on this thread and returns its id (a
        KeyboardInterrupt never loses a span it opened). Close it with end_span; unlike a
        ``with s.span(...)`` block, an interrupt can land before end_span's call."""
        if not self.enabled:
            return 0
        fn = "Session.begin_span"
        b, k, st = self._name(name, fn), _kind(kind, fn), _step(step, fn)
        out = ctypes.c_uint64()
        try:  # in this frame: an interrupt after the call still sees ``out``
            self._call(self._c.ct_span_begin(self.handle, b, k, st, ctypes.byref(out)))
            return out.value
        except BaseException:
            self._end_begun(out)
            raise

    def begin_measurement(self, name: str) -> int:
        """``ct_measurement_begin``: opens the measured region; returns its id."""
        if not self.enabled:
            return 0
        b = self._name(name, "Session.begin_measurement")
        out = ctypes.c_uint64()
        try:
            self._call(self._c.ct_measurement_begin(self.handle, b, ctypes.byref(out)))
            return out.value
        except BaseException:
            self._end_begun(out)
            raise

    def end_span(self, span: SpanRef) -> None:
        """``ct_span_end``: closes this thread's innermost span."""
        if self.enabled:
            self._call(self._c.ct_span_end(self.handle, _span_id(span, "Session.end_span")))

    def record_completed_span(self, name: str, kind: Any, start_ns: int,
                              duration_ns: int) -> int:
        """``ct_record_completed_span``: host work that already happened; returns its id."""
        if not self.enabled:
            return 0
        fn = "Session.record_completed_span"
        out = ctypes.c_uint64()
        self._call(self._c.ct_record_completed_span(
            self.handle, self._name(name, fn), _kind(kind, fn),
            _args.integer(start_ns, fn, "start_ns"),
            _args.integer(duration_ns, fn, "duration_ns"), ctypes.byref(out)))
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
        """``ct_record_op``: one executed operation. ``inputs`` is a sequence of tensor
        ids (a str is refused, not split into characters)."""
        if not self.enabled:
            return
        fn = "Session.record_op"
        sid = _span_id(span, fn)
        ins = _args.texts(inputs, fn, "inputs")
        arr = (ctypes.c_char_p * len(ins))(*ins) if ins else None
        dims, rank, _ = _args.shape(shape, fn)
        out_bytes = _args.optional_integer(output_dense_bytes, fn, "output_dense_bytes")
        op = _lib.Op(
            size=ctypes.sizeof(_lib.Op),
            flags=0 if out_bytes is None else _lib.CT_HAS_OUTPUT_DENSE_BYTES,
            op_name=_args.text(op_name, fn, "op_name"), dtype=_args.text(dtype, fn, "dtype"),
            device=_args.text(device, fn, "device"),
            inputs=ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p)) if arr else None,
            n_inputs=len(ins), output=_args.text(output, fn, "output", optional=True),
            shape=_dims_pointer(dims), rank=rank,
            duration_ns=_args.integer(duration_ns, fn, "duration_ns"),
            timestamp_ns=_args.integer(timestamp_ns, fn, "timestamp_ns"),
            output_dense_bytes=out_bytes or 0,
            input_dense_bytes=_args.integer(input_dense_bytes, fn, "input_dense_bytes"))
        self._call(self._c.ct_record_op(self.handle, sid, ctypes.byref(op)))

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
        fn = "Session.record_tensor"
        sid = _span_id(span, fn)
        dims, rank, _ = _args.shape(shape, fn)
        nbytes = _args.optional_integer(dense_bytes, fn, "dense_bytes")
        t = _lib.Tensor(
            size=ctypes.sizeof(_lib.Tensor),
            flags=0 if nbytes is None else _lib.CT_HAS_DENSE_BYTES,
            tensor_id=_args.text(tensor_id, fn, "tensor_id"),
            dtype=_args.text(dtype, fn, "dtype"), device=_args.text(device, fn, "device"),
            label=_args.text(label, fn, "label", optional=True),
            shape=_dims_pointer(dims), rank=rank,
            requires_grad=1 if _args.flag(requires_grad, fn, "requires_grad") else 0,
            category=_category(category, fn), dense_bytes=nbytes or 0)
        self._call(self._c.ct_record_tensor(self.handle, sid, ctypes.byref(t)))

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
        fn = "Session.record_tensor_stats"
        sid = _span_id(span, fn)
        dims, rank, n = _args.shape(shape, fn)
        count = _args.optional_integer(elements, fn, "elements")
        st = _lib.TensorStats(
            size=ctypes.sizeof(_lib.TensorStats), reserved=0,
            label=_args.text(label, fn, "label"), dtype=_args.text(dtype, fn, "dtype"),
            shape=_dims_pointer(dims), rank=rank, elements=n if count is None else count,
            non_finite=_args.integer(non_finite, fn, "non_finite"),
            rms=_args.real(rms, fn, "rms"), abs_max=_args.real(abs_max, fn, "abs_max"),
            mean=_args.real(mean, fn, "mean"))
        self._call(self._c.ct_record_tensor_stats(self.handle, sid, ctypes.byref(st)))

    def record_tensor_stats_f32(self, span: SpanRef, label: str, data: Any,
                                shape: Shape) -> None:
        """``ct_record_tensor_stats_f32``: the library reduces a host float32 buffer.
        ``data`` holds exactly the elements of ``shape`` (checked before the library reads
        it): a float32 buffer (array('f'), a numpy float32 array, a contiguous CPU torch
        tensor's numpy view, any strides), bytes of float32 values, or a flat sequence of
        real numbers."""
        if not self.enabled:
            return
        fn = "Session.record_tensor_stats_f32"
        sid = _span_id(span, fn)
        lab = _args.text(label, fn, "label")
        dims, rank, n = _args.shape(shape, fn)
        buf = _args.f32_data(data, n, fn, list(dims) if dims is not None else [])
        self._call(self._c.ct_record_tensor_stats_f32(
            self.handle, sid, lab,
            ctypes.cast(buf, ctypes.POINTER(ctypes.c_float)) if buf is not None else None,
            _dims_pointer(dims), rank))

    def record_scalar(self, span: SpanRef, label: str, value: float) -> None:
        """``ct_record_scalar``: a scalar (a loss, a learning rate) as 1-element stats."""
        if self.enabled:
            fn = "Session.record_scalar"
            self._call(self._c.ct_record_scalar(
                self.handle, _span_id(span, fn), _args.text(label, fn, "label"),
                _args.real(value, fn, "value")))

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
        fn = "Session.record_memory"
        sid = _span_id(span, fn)
        act = _args.choice(_ACTIONS, action, fn, "action", "memory action")
        dims, rank, _ = _args.shape(shape, fn)
        m = _lib.Memory(
            size=ctypes.sizeof(_lib.Memory), reserved=0,
            timestamp_ns=_args.integer(timestamp_ns, fn, "timestamp_ns"),
            storage_id=_args.text(storage_id, fn, "storage_id"),
            tensor_id=_args.text(tensor_id, fn, "tensor_id"),
            device=_args.text(device, fn, "device"), dtype=_args.text(dtype, fn, "dtype"),
            op_name=_args.text(op_name, fn, "op_name", optional=True),
            bytes=_args.integer(bytes, fn, "bytes"), shape=_dims_pointer(dims), rank=rank,
            category=_category(category, fn))
        self._call(self._c.ct_record_memory(self.handle, sid, act, ctypes.byref(m)))

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
        fn = "Session.record_device_memory"
        used, free, reserved, capacity = (
            _args.optional_integer(v, fn, arg) for v, arg in (
                (used_bytes, "used_bytes"), (free_bytes, "free_bytes"),
                (reserved_bytes, "reserved_bytes"), (capacity_bytes, "capacity_bytes")))
        flags = ((_lib.CT_HAS_USED_BYTES if used is not None else 0)
                 | (_lib.CT_HAS_FREE_BYTES if free is not None else 0)
                 | (_lib.CT_HAS_RESERVED_BYTES if reserved is not None else 0)
                 | (_lib.CT_HAS_CAPACITY_BYTES if capacity is not None else 0))
        d = _lib.DeviceMemory(
            size=ctypes.sizeof(_lib.DeviceMemory), flags=flags,
            timestamp_ns=_args.integer(timestamp_ns, fn, "timestamp_ns"),
            device=_args.text(device, fn, "device"), used_bytes=used or 0,
            free_bytes=free or 0, reserved_bytes=reserved or 0, capacity_bytes=capacity or 0)
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
        fn = "Session.record_device_interval"
        sid = _span_id(span, fn)
        corr = _args.optional_integer(correlation_id, fn, "correlation_id")
        d = _lib.DeviceInterval(
            size=ctypes.sizeof(_lib.DeviceInterval),
            flags=_lib.CT_HAS_CORRELATION_ID if corr is not None else 0,
            device=_args.text(device, fn, "device"),
            stream_id=_args.text(stream_id, fn, "stream_id"),
            clock_id=_args.text(clock_id, fn, "clock_id", optional=True),
            backend=_args.text(backend, fn, "backend"),
            name=_args.text(name, fn, "name", optional=True),
            start_ns=_args.integer(start_ns, fn, "start_ns"),
            duration_ns=_args.integer(duration_ns, fn, "duration_ns"),
            correlation_id=corr or 0)
        self._call(self._c.ct_record_device_interval(self.handle, sid, ctypes.byref(d)))

    def record_call_edge(self, from_span: SpanRef, to_span: SpanRef,
                         host_duration_ns: int = 0) -> None:
        """``ct_record_call_edge``: ``to``'s parent must be ``from``."""
        if self.enabled:
            fn = "Session.record_call_edge"
            self._call(self._c.ct_record_call_edge(
                self.handle, _span_id(from_span, fn, "from_span"),
                _span_id(to_span, fn, "to_span"),
                _args.integer(host_duration_ns, fn, "host_duration_ns")))

    def record_data_edge(self, from_tensor: str, to_tensor: str) -> None:
        """``ct_record_data_edge``: both tensor ids must already be known."""
        if self.enabled:
            fn = "Session.record_data_edge"
            self._call(self._c.ct_record_data_edge(
                self.handle, _args.text(from_tensor, fn, "from_tensor"),
                _args.text(to_tensor, fn, "to_tensor")))

    def record_gradient(self, root: str, key: str, state: Any,
                        norm: Optional[float] = None) -> None:
        """``ct_record_gradient``: ``state`` is "present", "zero", "missing" or
        "non_finite"; ``norm`` is required for present/zero and absent otherwise."""
        if not self.enabled:
            return
        fn = "Session.record_gradient"
        value = _args.real(norm, fn, "norm", optional=True)
        self._call(self._c.ct_record_gradient(
            self.handle, _args.text(root, fn, "root"), _args.text(key, fn, "key"),
            _args.choice(_GRAD_STATES, state, fn, "state", "gradient state"),
            ctypes.byref(ctypes.c_double(value)) if value is not None else None))

    # -- device collectors ---------------------------------------------------------

    def device_start(self, options: Optional[Mapping[str, Any]] = None) -> None:
        """``ct_device_start``; raises CandleTraceError(CT_ERR_UNAVAILABLE) when the
        collectors are not available (the session goes on).

        With ``"cupti"`` collected and no ``"cupti_lib"`` given, the libcupti of
        an installed nvidia-cuda-cupti package is offered to the library: this
        Python's import path finds it wherever pip put it."""
        if self.enabled:
            fn = "Session.device_start"
            opts = _args.mapping(options, fn, "options") or {}
            collect = opts.get("collect", ())
            if (isinstance(collect, (list, tuple)) and "cupti" in collect
                    and "cupti_lib" not in opts
                    and not os.environ.get("CANDLE_TRACE_CUPTI_LIB")):
                found = pip_cupti_dir()
                if found:
                    opts["cupti_lib"] = found
            self._call(self._c.ct_device_start(
                self.handle, _args.json_text(opts, fn, "options") if opts else None))

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
    fn = "gradient_contract"
    rows = [_args.strings(row, 3, fn, f"expected[{i}]", "a (root, key, family) tuple of str")
            for i, row in enumerate(_args.sequence(expected, fn, "expected"))]
    fams: dict = {}
    for _, _, fam in rows:
        fams.setdefault(fam, ("active", 1))
    for fam, spec in (_args.mapping(families, fn, "families") or {}).items():
        what = f"families[{fam!r}]"
        if not isinstance(spec, (tuple, list)) or len(spec) != 2:
            raise _args.type_error(fn, what, "an (expectation, min_present) pair", spec)
        fams[_args.string(fam, fn, f"families key {fam!r}")] = (
            _args.string(spec[0], fn, f"{what}[0]"), _args.integer(spec[1], fn, f"{what}[1]"))
    return {
        "expected": [{"root": r, "key": k, "family": f} for r, k, f in rows],
        "families": [{"family": f, "expectation": e, "min_present": m}
                     for f, (e, m) in fams.items()],
    }
