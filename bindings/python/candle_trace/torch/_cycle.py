"""Which optimizer step ends an update, in a loop that may step several optimizers.

Most loops step one optimizer once an update, and each of its steps ends one. Some step
several: a GAN its discriminator's and then its generator's (``od.step(); ...;
og.step()``), a model with a sparse embedding a SparseAdam beside a dense Adam, a
modern GPT recipe Muon for its matrices beside AdamW for the rest; a WGAN its critic's
five times for each of its generator's. Taking every step for an update's end would cut
each of those iterations into pieces -- a trace of half a GAN step, with half its model.

:class:`StepCycle` ends an update at the step that completes the round: once every
optimizer of the loop has stepped since the last end (a WGAN's round is its critic's
five steps and its generator's one). The loop's optimizers are those created and still
alive; one created later joins when it first steps. One that stops stepping while
others go on (the first phase's, kept in a variable after the program made a new one)
leaves the round after :data:`STALL` steps of the others without it, so that updates
never stop ending.
"""

from __future__ import annotations

import weakref
from typing import Any, List

__all__ = ["StepCycle", "STALL"]

#: steps of the other optimizers after which one that has not stepped leaves the round
STALL = 64


class StepCycle:
    """Counts the optimizers' steps and says which one ends an update."""

    def __init__(self) -> None:
        self._members: List[weakref.ref] = []
        self._since: set = set()  # id() of the members that stepped since the last end
        self._waited = 0  # steps since the last end
        #: steps seen in all (0: the loop has not stepped yet)
        self.steps = 0

    def join(self, opt: Any) -> None:
        """``opt`` is one of the loop's optimizers (created)."""
        if not any(r() is opt for r in self._members):
            self._members.append(weakref.ref(opt))

    def optimizers(self) -> List[Any]:
        """The loop's optimizers still alive, in the order they joined."""
        return [o for o in (r() for r in self._members) if o is not None]

    def ends(self, opt: Any) -> bool:
        """``opt`` has just stepped: True when that step ends an update."""
        self.join(opt)
        self.steps += 1
        self._waited += 1
        self._since.add(id(opt))
        live = self.optimizers()
        self._members = [weakref.ref(o) for o in live]
        missing = [o for o in live if id(o) not in self._since]
        if missing and self._waited >= STALL:
            gone = {id(o) for o in missing}
            self._members = [r for r in self._members if id(r()) not in gone]
            missing = []
        if missing:
            return False
        self._since.clear()
        self._waited = 0
        return True
