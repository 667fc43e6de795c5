"""The capture's open spans, per thread, and the brackets around the tracer's own work.

Spans nest per thread (autograd runs backward hooks on its own threads on CUDA), so each
thread keeps its own stack of (owner, span id), innermost last. The owner is a tag
("f:<module>", "b:<module>", "backward", "optimizer", "update") by which a hook finds the
span it opened.

Everything the capture does inside the program -- hooks' bookkeeping, statistics,
gradient norms, writing records -- runs between :meth:`Spans.pause` and
:meth:`Spans.resume` (``ct_tracer_begin``/``ct_tracer_end``): the session clock stands
still there, so no span counts it, and the trace states the total.

Two implementations of the stacks: :class:`NativeSpans` keeps them in C++
(``_module_spans.cpp``, the op observer's library), where the module spans' wrappers and
hooks (``_modules.NativeModuleSpans``) push and pop without Python; :class:`Spans` keeps
them in Python, where that library cannot be built. :func:`spans_for` chooses.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import _args
from ..session import Session, _raise

__all__ = ["Spans", "NativeSpans", "spans_for"]


# The wire enums of ct_span_kind and ct_step (include/candle_trace.h).
_KIND = {"function": 0, "op": 1, "module": 2}
_STEP = {None: 0, "forward": 1, "backward": 2, "optimizer": 3}


#: span names as the library takes them, encoded (and checked) once per process: a
#: capture's Spans is new, its names are not
_ENCODED: Dict[str, bytes] = {}


class _Thread(threading.local):
    def __init__(self, every: List[List[Tuple[str, int]]]) -> None:
        self.stack: List[Tuple[str, int]] = []
        every.append(self.stack)  # each thread's, for open_elsewhere


class Spans:
    """The open spans of one capture's session."""

    def __init__(self, session: Session) -> None:
        self.session = session
        raw = session._lib.raw
        hc = session._hc
        self._tb, self._te, self._hc = raw.ct_tracer_begin, raw.ct_tracer_end, hc
        # The span fast path (no argtypes: ctypes converts nothing), names encoded once.
        self._begin, self._end = raw.ct_span_begin, raw.ct_span_end
        self._names = _ENCODED
        self._every: List[List[Tuple[str, int]]] = []
        self._tl = _Thread(self._every)
        #: told the new innermost span of the calling thread (the op observer's span)
        self.on_innermost: Callable[[int], None] = lambda sid: None

    def reset(self) -> None:
        """Forgets every thread's open spans (the session went on as a new one:
        ``Session.reopen``, whose handle this object already follows)."""
        self._every = []
        self._tl = _Thread(self._every)
        self.on_innermost = lambda sid: None

    # -- the tracer's own time --------------------------------------------------------

    def pause(self) -> None:
        """The session clock stops: what follows is the tracer's work."""
        self._tb(self._hc)

    def resume(self) -> None:
        self._te(self._hc)

    # -- spans ------------------------------------------------------------------------

    @property
    def stack(self) -> List[Tuple[str, int]]:
        """The calling thread's open spans, innermost last."""
        return self._tl.stack

    def open_elsewhere(self) -> int:
        """How many spans threads other than the calling one hold open (autograd's
        device threads run backward hooks on CUDA: ``_autograd_threads`` closes what
        they leave)."""
        mine = self._tl.stack
        return sum(len(st) for st in self._every if st is not mine)

    def current(self) -> int:
        st = self._tl.stack
        return st[-1][1] if st else 1

    def publish_to(self, observer: Any) -> None:
        """From now on the op observer (an ``_observer.Observer``; None: no one) is told
        each thread's innermost span, where its ops go."""
        self.on_innermost = observer.set_span if observer is not None else (lambda sid: None)

    def _name(self, name: str) -> bytes:
        b = self._names.get(name)
        if b is None:
            b = self._names[name] = _args.text(name, "Spans.push", "name")
        return b

    def push(self, owner: str, name: str, kind: str, step: Optional[str]) -> int:
        b = self._name(name)
        out = ctypes.c_uint64()
        st = self._begin(self._hc, b, _KIND[kind], _STEP[step], ctypes.byref(out))
        if st:
            _raise(st)
        sid = out.value
        self._tl.stack.append((owner, sid))
        self.on_innermost(sid)
        return sid

    def push_measured(self, name: str) -> int:
        sid = self.session.begin_measurement(name)
        self._tl.stack.append(("update", sid))
        self.on_innermost(sid)
        return sid

    def in_backward(self) -> bool:
        """A backward's span (the backward call's, a module's backward) is open on the
        calling thread."""
        return any(o == "backward" or o.startswith("b:") for o, _ in self._tl.stack)

    def find(self, owner: str) -> Optional[int]:
        """The calling thread's innermost open span of ``owner``, if any."""
        stack = self._tl.stack
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] == owner:
                return stack[i][1]
        return None

    def pop_top(self) -> None:
        """Closes the calling thread's innermost span."""
        stack = self._tl.stack
        _, top = stack.pop()
        # The observer learns the new innermost span before the old one closes, so an
        # event between the two calls still lands in an open span.
        self.on_innermost(stack[-1][1] if stack else 0)
        st = self._end(self._hc, ctypes.c_uint64(top))
        if st:
            _raise(st)

    def close_until(self, sid: int) -> None:
        """Closes this thread's spans down to and including ``sid`` (if it is open)."""
        stack = self._tl.stack
        for _, s in stack:
            if s == sid:
                break
        else:
            return
        while stack:
            top = stack[-1][1]
            self.pop_top()
            if top == sid:
                return


class NativeSpans(Spans):
    """The same stacks in C++ (the op observer's library: ``native``, an
    ``Observer.native``), shared with the module spans' C++ wrappers and hooks; the op
    observer is told the innermost span there without a call from Python."""

    def __init__(self, session: Session, native: Any) -> None:
        super().__init__(session)
        del self._tl  # the stacks are the C++ object's
        self.native = native
        self.frames = native.span_stack(session._hc, ctypes.addressof(session._hc), _raise)
        # The tracer's brackets as C methods of the stacks: a ctypes call costs thousands
        # of instructions, and every hook of the update in Python (backward, the
        # optimizer's step, the loss's statistics) opens one.
        self.pause, self.resume = self.frames.pause, self.frames.resume  # type: ignore[method-assign]

    def reset(self) -> None:
        self.frames.reset()

    def publish_to(self, observer: Any) -> None:
        # The observer is this very library (one per process): its ct_obs_set_span is
        # called from C++.
        self.frames.publish = observer is not None

    @property
    def stack(self) -> List[Tuple[str, int]]:
        return self.frames.frames()

    def current(self) -> int:
        return self.frames.current()

    def push(self, owner: str, name: str, kind: str, step: Optional[str]) -> int:
        return self.frames.push(owner, self._name(name), _KIND[kind], _STEP[step])

    def push_measured(self, name: str) -> int:
        # ct_measurement_begin from C++ (the session's ctypes call costs ~8k instructions)
        return self.frames.push_measured("update", self._name(name))

    def find(self, owner: str) -> Optional[int]:
        return self.frames.find(owner)

    def open_elsewhere(self) -> int:
        return self.frames.open_elsewhere()

    def pop_top(self) -> None:
        self.frames.pop_top()

    def close_until(self, sid: int) -> None:
        self.frames.close_until(sid)


def spans_for(session: Session, native: Any) -> Spans:
    """The spans of a capture: in C++ where the op observer's library is loaded
    (``native``: its ``Observer.native``), else in Python."""
    return NativeSpans(session, native) if native is not None else Spans(session)
