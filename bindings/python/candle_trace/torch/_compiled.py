"""The modules ``torch.compile`` wrapped after the tracer was given them.

nanoGPT's ``train.py`` -- and any script that makes its optimizer before it compiles its
model -- hands ``candle-trace run`` (which opens at the first optimizer) the plain
module, as does a ``profile(model)`` written before ``model = torch.compile(model)``;
the OptimizedModule that then runs is one the tracer never saw. The captured update
wrapped the plain module's submodules for their spans, and those wrappers run outside
dynamo: dynamo ran the whole model eagerly in that update alone. The trace showed eager
aten ops (layer norms, GELUs) where the program runs inductor's fused kernels.

So while a capture's layout of a model is alive, ``torch.compile`` is wrapped (once per
process; the wrapper calls straight through): each ``nn.Module`` compiled is kept,
weakly, with the OptimizedModule it returned, and :func:`compiled_as` gives that back.
A layout looks again at each arm (:func:`generation` says whether anything was compiled
since), and stands the compiled module in for the plain one -- as if it had been given
the compiled one: one span for it, nothing inside the graph. Listeners
(:func:`on_compile`) hear of every compile: a capture open before it turns inductor's
kernel records on then (``_kernels``), before the graph's code is generated.

A program that took ``from torch import compile`` before the tracer existed calls torch's
own function, and ``torch._dynamo.optimize(backend)(model)`` never calls torch.compile:
both make an OptimizedModule all the same, so it is OptimizedModule's constructor that
notes each module compiled, whatever made it (wrapped once, with torch.compile).

``module.compile()`` (torch's method) compiles the module's call in place: it calls
torch.compile with the module's bound ``_call_impl``, which counts as a compile here (a
layout looks again), and the module's span then wraps its ``_compiled_call_impl``
(``_modules.entry``), never anything inside.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, Callable, Dict, Optional

import torch

from ._common import compiled_inner, warn_once

__all__ = ["track", "compiled_as", "generation", "on_compile"]

_lock = threading.Lock()
#: plain module -> a weak reference to the OptimizedModule torch.compile made of it
_made: "weakref.WeakKeyDictionary[torch.nn.Module, weakref.ref]" = weakref.WeakKeyDictionary()
_generation = 0
_listeners: Dict[int, Callable[[], None]] = {}
_next_listener = 0
_tracked = False


def track() -> None:
    """Wraps ``torch.compile`` and OptimizedModule's constructor (once; a torch without
    them is left as it is)."""
    global _tracked
    with _lock:
        if _tracked or not callable(getattr(torch, "compile", None)):
            return
        _tracked = True
        real = torch.compile

    @functools.wraps(real)
    def compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
        out = real(model, *args, **kwargs)
        # A module's OptimizedModule is noted by its constructor; what it cannot see is
        # module.compile()'s, the module's bound call compiled in place.
        if isinstance(getattr(model, "__self__", None), torch.nn.Module):
            _made_of(model, out)
        return out

    torch.compile = compile
    _follow_optimized_modules()


def _follow_optimized_modules() -> None:
    """Wraps OptimizedModule's constructor to note the module it wraps (a torch without
    dynamo's OptimizedModule is left as it is). The profile imports dynamo's eval_frame
    for its own wrappers anyway (``_common.outside_dynamo``)."""
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except Exception:  # noqa: BLE001 - no dynamo, or one laid out otherwise
        return
    real = OptimizedModule.__init__

    @functools.wraps(real)
    def __init__(self: Any, mod: Any, *args: Any, **kwargs: Any) -> None:
        real(self, mod, *args, **kwargs)
        try:
            _made_of(mod, self)
        except Exception as e:  # noqa: BLE001 - the program's compile goes on whatever ours does
            warn_once("optimized-module", f"a compiled module went unnoted ({type(e).__name__}: "
                      f"{e}); a capture of it may run its plain modules")

    OptimizedModule.__init__ = __init__


def _made_of(model: Any, out: Any) -> None:
    global _generation
    in_place = isinstance(getattr(model, "__self__", None), torch.nn.Module)  # module.compile()
    if not in_place and (not isinstance(model, torch.nn.Module) or compiled_inner(out) is not model):
        return  # a function compiled, or a module some backend did not wrap
    with _lock:
        if not in_place:
            _made[model] = weakref.ref(out)
        _generation += 1
        listeners = list(_listeners.values())
    for listener in listeners:
        listener()


def compiled_as(module: torch.nn.Module) -> Optional[torch.nn.Module]:
    """The OptimizedModule torch.compile made of ``module``, while it lives; else None."""
    ref = _made.get(module)
    om = ref() if ref is not None else None
    return om if om is not None and compiled_inner(om) is module else None


def generation() -> int:
    """How many modules torch.compile has compiled since :func:`track`."""
    return _generation


def on_compile(listener: Callable[[], None]) -> Callable[[], None]:
    """Calls ``listener()`` after each module torch.compile compiles, until the returned
    function is called."""
    global _next_listener
    with _lock:
        _next_listener += 1
        key = _next_listener
        _listeners[key] = listener

    def remove() -> None:
        with _lock:
            _listeners.pop(key, None)
    return remove
