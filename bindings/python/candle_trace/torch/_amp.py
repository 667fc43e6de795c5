"""Mixed precision's loss scaling, seen through: the loss a ``GradScaler`` scaled, and the
optimizer steps it skipped.

Under ``torch.amp``/``torch.cuda.amp`` a loop calls ``scaler.scale(loss).backward()``:
what reaches ``backward`` is the loss times the scale (65,536 to start with), so a
watch's ``non_finite`` trigger and the whole-run ``loss`` statistic would judge that
product -- which overflows where the loss does not, and moves with the scale. And
``scaler.step(optimizer)`` does not call ``optimizer.step()`` when the gradients it
unscaled hold an inf or a NaN (at the start of every fp16 run, and again each time the
scale has grown too far): an iteration with no optimizer step.

:class:`ScaledLosses` remembers, per thread, the last tensor ``GradScaler.scale`` made
and the loss it made it from, while anything of ours needs it (installed and removed in
pairs); :func:`unscaled` gives the loss behind a tensor given to ``backward``.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, Optional

import torch

__all__ = ["GRAD_SCALER", "ScaledLosses", "scale_of", "unscaled"]


def _grad_scaler() -> Optional[type]:
    """The class every GradScaler derives from (``torch.amp.GradScaler`` on torch 2.3
    and later, ``torch.cuda.amp.GradScaler`` before), or None."""
    amp = getattr(torch, "amp", None)
    cls = getattr(amp, "GradScaler", None)
    if isinstance(cls, type):
        return cls
    cuda_amp = getattr(getattr(torch, "cuda", None), "amp", None)
    cls = getattr(cuda_amp, "GradScaler", None)
    return cls if isinstance(cls, type) else None


#: the GradScaler base class of this torch (None: a torch without one)
GRAD_SCALER = _grad_scaler()


class _Last(threading.local):
    scaled: Optional[weakref.ref] = None
    loss: Optional[torch.Tensor] = None
    scaler: Optional[weakref.ref] = None


class ScaledLosses:
    """The wrapper on ``GradScaler.scale`` that remembers what it scaled; one for the
    process, installed while any user holds it."""

    _users = 0
    _orig: Any = None
    last = _Last()

    @classmethod
    def install(cls) -> None:
        if GRAD_SCALER is None:
            return
        cls._users += 1
        if cls._users > 1:
            return
        orig = cls._orig = GRAD_SCALER.__dict__["scale"]
        last = cls.last

        @functools.wraps(orig)
        def scale(self: Any, outputs: Any) -> Any:
            out = orig(self, outputs)
            if isinstance(outputs, torch.Tensor) and isinstance(out, torch.Tensor) and \
                    out is not outputs:
                last.scaled, last.loss = weakref.ref(out), outputs.detach()
                last.scaler = weakref.ref(self)
            return out

        GRAD_SCALER.scale = scale  # type: ignore[attr-defined]

    @classmethod
    def remove(cls) -> None:
        if GRAD_SCALER is None or cls._users == 0:
            return
        cls._users -= 1
        if cls._users == 0:
            GRAD_SCALER.scale = cls._orig  # type: ignore[attr-defined]
            cls._orig = None
            cls.last.scaled = cls.last.loss = cls.last.scaler = None


def unscaled(t: torch.Tensor) -> torch.Tensor:
    """The loss ``GradScaler.scale`` made ``t`` from (while :class:`ScaledLosses` is
    installed), else ``t``."""
    last = ScaledLosses.last
    ref = last.scaled
    if ref is not None and ref() is t and last.loss is not None:
        return last.loss
    return t


def scale_of(t: torch.Tensor) -> Optional[torch.Tensor]:
    """The scale (a one-element tensor) of the ``GradScaler`` that made ``t`` (while
    :class:`ScaledLosses` is installed), else None."""
    last = ScaledLosses.last
    ref, owner = last.scaled, last.scaler
    if ref is None or ref() is not t or owner is None:
        return None
    scale = getattr(owner(), "_scale", None)  # what GradScaler.scale multiplied by
    return scale if isinstance(scale, torch.Tensor) else None
