"""The batches a ``torch.utils.data.DataLoader`` hands out inside a captured update, each
a span of it (``DataLoader.__next__``).

A loader that stalls (a slow disk, too few workers, a worker stuck on one sample) is the
commonest cause of a slow update, and a flight recorder's update runs from one
``step()`` to the next, its data step included: without a span of its own the stall was
the update's own time ("in no span below it"), the trace saying that the update was slow
but not why. The same for a loop that accumulates gradients, fetching a batch between
its forwards. Whatever the main process does for the batch (a single-process loader's
collate, its ops) falls inside the span; the workers' processes are not traced.

:class:`LoaderSpans` wraps ``__next__`` of the iterator class every DataLoader's derives
from while any capture holds it (installed and removed in pairs, as
:class:`~._amp.ScaledLosses`); the wrapper calls straight through unless a capture is
capturing.
"""

from __future__ import annotations

import functools
from typing import Any, List, Optional

from ._common import outside_dynamo

__all__ = ["LoaderSpans", "SPAN_NAME"]

#: the span of one batch
SPAN_NAME = "DataLoader.__next__"


def _iterator_class() -> Optional[type]:
    """``torch.utils.data.dataloader._BaseDataLoaderIter`` (the single-process and the
    multi-process iterators inherit its ``__next__``), or None where this torch has no
    such class."""
    try:
        from torch.utils.data import dataloader
    except Exception:  # noqa: BLE001 - a torch without it: no loader spans
        return None
    cls = getattr(dataloader, "_BaseDataLoaderIter", None)
    return cls if isinstance(cls, type) and "__next__" in cls.__dict__ else None


class LoaderSpans:
    """The wrapper on the DataLoader iterator's ``__next__``; one for the process."""

    _captures: List[Any] = []  # the captures holding it, in install order
    _orig: Any = None
    _ours: Any = None

    @classmethod
    def install(cls, capture: Any) -> None:
        """``capture`` (a :class:`~._capture.Capture`) gets a span for each batch fetched
        while it captures, until :meth:`remove`."""
        it = _iterator_class()
        if it is None:
            return
        cls._captures.append(capture)
        if len(cls._captures) > 1:
            return
        orig = cls._orig = it.__dict__["__next__"]
        captures = cls._captures

        @functools.wraps(orig)
        def __next__(self: Any) -> Any:
            on = [c for c in captures if c.state == "capturing"]
            if not on:
                return orig(self)
            sids = [(c, c.guard_call(c.spans.push, "data", SPAN_NAME, "function", None))
                    for c in on]
            try:
                return orig(self)
            finally:
                for c, sid in reversed(sids):
                    if sid:
                        c.guard_call(c.spans.close_until, sid)

        cls._ours = outside_dynamo(__next__)
        it.__next__ = cls._ours  # type: ignore[attr-defined]

    @classmethod
    def remove(cls, capture: Any) -> None:
        """Undoes one :meth:`install` of ``capture``; the last one puts ``__next__`` back
        (unless something was put over it since, which then keeps calling ours, and ours
        calls straight through)."""
        if capture not in cls._captures:
            return
        cls._captures.remove(capture)
        if cls._captures:
            return
        it = _iterator_class()
        if it is not None and it.__dict__.get("__next__") is cls._ours:
            it.__next__ = cls._orig  # type: ignore[attr-defined]
        cls._orig = cls._ours = None


def installed() -> bool:
    """Whether the wrapper is on (tests)."""
    it = _iterator_class()
    return it is not None and LoaderSpans._ours is not None and \
        it.__dict__.get("__next__") is LoaderSpans._ours

