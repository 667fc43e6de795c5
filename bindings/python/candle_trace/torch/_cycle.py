"""Which optimizer step ends an update, in a loop that may step several optimizers.

Most loops step one optimizer once an update, and each of its steps ends one. Some step
several: a GAN its discriminator's and then its generator's (``od.step(); ...;
og.step()``), a model with a sparse embedding a SparseAdam beside a dense Adam, a
modern GPT recipe Muon for its matrices beside AdamW for the rest; a WGAN its critic's
five times for each of its generator's. Taking every step for an update's end would cut
each of those iterations into pieces -- a trace of half a GAN step, with half its model.

:class:`StepCycle` ends an update at the step that completes the round: once every
optimizer of the loop has stepped since the last end (a WGAN's round is its critic's
five steps and its generator's one). The loop's optimizers are those made (:meth:`join`)
and still alive; one the runner did not see made joins when it first steps. One that
has been replaced leaves the round: an optimizer whose last step came before another
was made, once that other steps (a program that makes a new optimizer each epoch, or
for a second phase, and keeps the old one referenced). One that does not step while
others go on leaves it after :data:`STALL` steps of theirs, so that updates never stop
ending; if it steps after all (an optimizer stepped every few hundred updates), it is an
occasional one: its steps fall inside updates and end none.
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional

__all__ = ["StepCycle", "STALL"]

#: steps of the other optimizers after which one that has not stepped leaves the round
STALL = 64


class _Member:
    __slots__ = ("ref", "made", "last")

    def __init__(self, opt: Any, made: Optional[int]) -> None:
        self.ref = weakref.ref(opt)
        self.made = made  # the event count when it was made (None: not seen made)
        self.last: Optional[int] = None  # ... at its last step


class StepCycle:
    """Counts the optimizers' steps and says which one ends an update."""

    def __init__(self) -> None:
        self._members: Dict[int, _Member] = {}  # by id() of the optimizer
        self._since: set = set()  # id() of the members that stepped since the last end
        self._waited = 0  # steps since the last end
        self._events = 0  # joins and steps, in order
        #: id() -> weak reference of the optimizers that left the round for not stepping
        self._occasional: Dict[int, weakref.ref] = {}
        #: steps seen in all (0: the loop has not stepped yet)
        self.steps = 0

    def join(self, opt: Any) -> None:
        """``opt`` was made: it is one of the loop's optimizers."""
        self._events += 1
        m = self._members.get(id(opt))
        if m is None or m.ref() is not opt:
            self._members[id(opt)] = _Member(opt, self._events)

    def optimizers(self) -> List[Any]:
        """The loop's optimizers still alive, in the order they joined."""
        return [o for o in (m.ref() for m in self._members.values()) if o is not None]

    def ends(self, opt: Any) -> bool:
        """``opt`` has just stepped: True when that step ends an update."""
        self._events += 1
        self.steps += 1
        self._waited += 1
        me = self._members.get(id(opt))
        if me is None or me.ref() is not opt:
            gone = self._occasional.get(id(opt))
            if gone is not None and gone() is opt:
                return False  # inside the update, as the round goes on without it
            me = self._members[id(opt)] = _Member(opt, None)
        me.last = self._events
        if len(self._members) == 1:  # the usual loop: one optimizer, each step an update
            self._waited = 0
            return True
        self._since.add(id(opt))
        for key, m in list(self._members.items()):
            replaced = m.last is not None and me.made is not None and m.last < me.made
            if m.ref() is None or replaced:
                del self._members[key]
                self._since.discard(key)
        missing = [k for k in self._members if k not in self._since]
        if missing and self._waited >= STALL:
            for k in missing:
                self._occasional[k] = self._members.pop(k).ref
            missing = []
        if missing:
            return False
        self._since.clear()
        self._waited = 0
        return True
