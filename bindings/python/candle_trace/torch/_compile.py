"""torch.compile's compilations: spans of their own inside a captured update, and their
time in an update a watch finds slow.

A compiled model compiles again when a guard fails (a smaller last batch, a new dtype, a
Python attribute the graph depends on): hundreds of milliseconds inside an update that
otherwise takes a few -- the slow step a user most needs explained. Dynamo traces the
model with fake tensors meanwhile, and every aten op it runs on them (on the ``meta``
device, or on a FakeTensor that claims the model's) is compilation, not the model: the
update's time is dynamo's and inductor's, not any op's.

So while dynamo compiles on the capture's thread (``torch._dynamo.callback``'s start and
end callbacks), the capture holds a span named ``torch.compile`` (or ``torch.compile
(backward)`` for a backward compiled at its first run) and records no op; the span's time
is the program's, as it is. A watch (``_watch``) times them too, for every update: a slow
trigger's detail says how much of the update compilation took, and why dynamo compiled
again (:class:`RecompileReasons`), also with no flight recorder. Where this torch has no
such callbacks, or dynamo was never imported (no model is compiled), nothing is installed.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

__all__ = ["Compilations", "RecompileReasons", "span_name"]

#: dynamo's CallbackTrigger names -> the span's name; a trigger not listed gets
#: "torch.compile (<trigger>)"
_NAMES: Dict[str, str] = {"DYNAMO": "torch.compile", "LAZY_BACKWARD": "torch.compile (backward)"}


def span_name(args: Any) -> str:
    """The span's name for a start callback's argument (dynamo's ``CallbackArgs``;
    torches whose callbacks take none pass None)."""
    trigger = getattr(getattr(args, "callback_trigger", None), "name", None)
    if trigger is None:
        return "torch.compile"
    return _NAMES.get(trigger, f"torch.compile ({trigger.lower().replace('_', ' ')})")


def _handler() -> Any:
    dynamo = sys.modules.get("torch._dynamo")
    cb = getattr(dynamo, "callback", None) if dynamo is not None else None
    handler = getattr(cb, "callback_handler", None)
    if handler is None or not hasattr(handler, "register_start_callback"):
        return None
    return handler


class Compilations:
    """Calls ``begin(name)`` where a compilation starts, on the compiling thread, and
    ``end(token)`` with what it returned (unless None) where that thread's compilation
    ends -- or at :meth:`remove`, called on that thread, if it had not.

    A capture's ``begin`` opens the span and quiets its op recording, and its ``end``
    undoes exactly that, even when the capture ended meanwhile: the quieting is per
    thread, and would otherwise outlive the capture. (Dynamo runs the callbacks once for
    compilations that overlap on several threads, the end on whichever finishes last; a
    span that end never reaches stays open, as a failed capture's would.)"""

    def __init__(self, begin: Callable[[str], Optional[Any]],
                 end: Callable[[Any], None]) -> None:
        self._begin, self._end = begin, end
        self._open: Dict[int, Any] = {}  # thread ident -> begin's token
        self._handler: Any = None
        self._wanted = False  # install() was called
        self._removed = False

    def install(self) -> bool:
        """Registers the callbacks with dynamo; False where there is nothing to register
        with (no dynamo imported, or a torch before the callbacks)."""
        self._wanted = True
        handler = _handler()
        if handler is None:
            return False
        handler.register_start_callback(self._on_start)
        handler.register_end_callback(self._on_end)
        self._handler = handler
        return True

    def ensure(self) -> None:
        """:meth:`install` again where it found nothing to register with: for a run that
        imports dynamo (its first ``torch.compile``) after the watch or the whole-run
        statistics started. A dict lookup while dynamo is not imported."""
        if self._wanted and self._handler is None and not self._removed and \
                "torch._dynamo" in sys.modules:
            self.install()

    def remove(self) -> None:
        """Unregisters the callbacks and closes what the calling thread still has open
        (idempotent; :meth:`ensure` installs nothing after it)."""
        self._removed = True
        handler, self._handler = self._handler, None
        if handler is not None:
            for name, fn in (("remove_start_callback", self._on_start),
                             ("remove_end_callback", self._on_end)):
                try:
                    getattr(handler, name)(fn)
                except ValueError:  # torch._dynamo.reset() cleared them already
                    pass
        token = self._open.pop(threading.get_ident(), None)
        self._open.clear()
        if token is not None:
            self._end(token)

    def _on_start(self, args: Any = None) -> None:
        me = threading.get_ident()
        if me in self._open:  # dynamo counts nested compilations itself; be safe
            return
        token = self._begin(span_name(args))
        if token is not None:
            self._open[me] = token

    def _on_end(self, args: Any = None) -> None:
        token = self._open.pop(threading.get_ident(), None)
        if token is not None:
            self._end(token)


class RecompileReasons:
    """Why dynamo compiles again: the guard failures it records
    (``torch._dynamo.utils.guard_failures``, code object -> reasons, kept while
    ``torch._dynamo.config.report_guard_failures``, its default) since the last
    :meth:`take` -- "0/0: tensor 'idx' size mismatch at index 0. expected 8, actual 4".
    Read when a compilation starts (its reasons are recorded just before it), never per
    update."""

    def __init__(self) -> None:
        #: code object -> (its list of reasons, how many of them were taken); a reset()
        #: of dynamo clears the dict, and a code's next reason starts a new list
        self._seen: Dict[Any, Tuple[Any, int]] = {}

    def take(self) -> List[str]:
        """The reasons recorded since the last call, each its first line (a user stack
        trace may follow it)."""
        utils = sys.modules.get("torch._dynamo.utils")
        failures = getattr(utils, "guard_failures", None) if utils is not None else None
        if not isinstance(failures, Mapping):
            return []
        out: List[str] = []
        for code, reasons in list(failures.items()):
            was, seen = self._seen.get(code, (None, 0))
            if was is not reasons:
                seen = 0
            out.extend(str(r).split("\n", 1)[0] for r in list(reasons)[seen:])
            self._seen[code] = (reasons, len(reasons))
        return out
