"""Small helpers shared by the capture's parts: dtype spellings, tensor walks, instance
attribute patches and one-time warnings."""

from __future__ import annotations

import dataclasses
import functools
import gc
import sys
import warnings
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Union

import torch

#: torch dtype -> the trace's dtype spelling.
DTYPES: Dict[torch.dtype, str] = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16",
    torch.bfloat16: "bf16", torch.int64: "i64", torch.int32: "i32", torch.int16: "i16",
    torch.int8: "i8", torch.uint8: "u8", torch.bool: "bool",
    torch.complex64: "c64", torch.complex128: "c128",
}

_warned: set = set()


def warn_once(key: str, msg: str, stacklevel: int = 3) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"candle_trace.torch: {msg}", RuntimeWarning, stacklevel=stacklevel)


def collect_ahead() -> int:
    """Runs, between two updates, the collection of Python's cyclic GC that the next
    update would otherwise run inside itself: when the youngest generation is past half
    its threshold, that generation and any older one due with it (Python's own rule, a
    little early). The capture's and the watch's own work allocates, and a 64-64-10 MLP
    loop that allocates nothing that survives an update ran no collection in 10,000
    updates untraced but, under a watch, a full one of 14 ms inside an update (which the
    slow trigger then reported). Returns the generation collected, -1 for none (or GC
    off)."""
    if not gc.isenabled():
        return -1
    counts, thresholds = gc.get_count(), gc.get_threshold()
    if thresholds[0] <= 0 or counts[0] < thresholds[0] // 2:
        return -1
    gen = 0
    while gen < 2 and thresholds[gen + 1] > 0 and counts[gen + 1] + 1 >= thresholds[gen + 1]:
        gen += 1
    gc.collect(gen)
    return gen


Optimizers = Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer], None]


def optimizers_of(optimizer: Optimizers, caller: str) -> List[torch.optim.Optimizer]:
    """The update's optimizers, however given: one, a list or tuple of them (a GAN's
    generator and discriminator, a sparse embedding's SparseAdam beside a dense Adam,
    Muon beside AdamW), or None. A TypeError naming ``caller`` for anything with no
    ``step``; each optimizer once."""
    given = [] if optimizer is None else list(optimizer) if isinstance(
        optimizer, (list, tuple)) else [optimizer]
    out: List[torch.optim.Optimizer] = []
    for opt in given:
        if not callable(getattr(opt, "step", None)) or isinstance(opt, torch.nn.Module):
            raise TypeError(f"{caller}: optimizer must be a torch optimizer, a list of "
                            f"them or None; got {type(opt).__name__}")
        if not any(o is opt for o in out):
            out.append(opt)
    return out


def dtype_name(t: torch.Tensor) -> str:
    return DTYPES.get(t.dtype) or str(t.dtype).replace("torch.", "")


def first_tensor(out: Any) -> Optional[torch.Tensor]:
    """The first tensor in a module's output (a tensor, or nested lists/tuples/dicts/
    dataclasses)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (list, tuple)):
        for o in out:
            t = first_tensor(o)
            if t is not None:
                return t
    if isinstance(out, Mapping):
        for o in out.values():
            t = first_tensor(o)
            if t is not None:
                return t
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        for f in dataclasses.fields(out):
            t = first_tensor(getattr(out, f.name, None))
            if t is not None:
                return t
    return None


def tensors(args: Any) -> List[torch.Tensor]:
    """Every tensor in ``args`` (nested lists/tuples/dicts), in order."""
    out: List[torch.Tensor] = []
    stack = [args]
    while stack:
        a = stack.pop()
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            stack.extend(reversed(a))
        elif isinstance(a, Mapping):
            stack.extend(reversed(list(a.values())))
    return out


#: ``torch.autograd.grad`` as torch defines it, for the tracer's own backward passes
#: (closing autograd's device threads' spans, CUPTI's warm-up, the observer's
#: calibration): a capture wraps the program's (its span ``autograd.grad``) and must not
#: see these.
torch_grad = torch.autograd.grad

MISSING = object()


class Patched(NamedTuple):
    """An instance attribute :func:`patch` replaced: what was there, and what it put."""

    prev: Any
    value: Any


def patch(obj: Any, attr: str, value: Any) -> Patched:
    """Sets an instance attribute and returns what restores it (see :func:`restore`)."""
    prev = obj.__dict__.get(attr, MISSING)
    setattr(obj, attr, value)
    return Patched(prev, obj.__dict__.get(attr, MISSING))


def restore(obj: Any, attr: str, p: Patched) -> None:
    """Puts back an instance attribute a wrapper replaced (removes it when there was
    none) -- while the wrapper is still what the object holds. Something put over it
    since (an LR scheduler's counter on ``optimizer.step``, ``candle-trace run``'s, a
    later capture's) keeps its place, and with it the wrapper beneath, which must then
    call straight through (every wrapper of ours checks that its owner is still on):
    putting back what was there first would take out whatever was installed after it."""
    if obj.__dict__.get(attr, MISSING) is not p.value:
        return
    if p.prev is MISSING:
        obj.__dict__.pop(attr, None)
    else:
        obj.__dict__[attr] = p.prev


_disable = getattr(getattr(torch, "compiler", None), "disable", None) or getattr(
    getattr(torch, "_dynamo", None), "disable", None)


def _eval_frame_hooks() -> Any:
    """(dynamo's current frame callback getter, skip_code), where this torch has both."""
    try:
        from torch._C._dynamo.eval_frame import get_eval_frame_callback
        from torch._dynamo.eval_frame import skip_code
    except Exception:  # noqa: BLE001 - a torch without them: the plain wrapper
        return None
    return get_eval_frame_callback, skip_code


def outside_dynamo(fn: Any) -> Any:
    """``fn`` as torch.compile must see what the tracer hands to torch (a wrapper, a
    hook): never traced into a graph (torch.compiler.disable), so the tracer's calls
    split no graph and its state is never a graph's. Identity on a torch without
    dynamo.

    torch.compiler.disable's wrapper switches dynamo's frame callback off and on around
    every call (~0.45 µs, Python frames the session clock counts as the model's: a
    captured update passes through several). Here the call goes straight to ``fn`` while
    no callback is set -- no compiled code is running, and nothing would compile ``fn``'s
    frames -- and through that wrapper otherwise; dynamo, tracing a call to it, finds it
    disabled (a graph break), and never compiles its own frame (skip_code)."""
    if _disable is None:
        return fn
    guarded = _disable(fn)
    hooks = _eval_frame_hooks()
    if hooks is None:
        return guarded
    callback, skip_code = hooks

    @functools.wraps(fn)
    def run(*a: Any, **k: Any) -> Any:
        if callback() is None:
            return fn(*a, **k)
        return guarded(*a, **k)

    run._torchdynamo_disable = True  # type: ignore[attr-defined]
    skip_code(run.__code__)
    return run


def compiled_autograd_on() -> bool:
    """Whether autograd runs compiled now (torch._dynamo's compiled autograd, entered around
    a backward or turned on in dynamo's config): its graph runs in place of autograd's
    nodes, and calls the tensors' Python hooks but not the nodes' C++ ones."""
    ca = sys.modules.get("torch._dynamo.compiled_autograd")
    if ca is not None and getattr(ca, "compiled_autograd_enabled", False):
        return True
    cfg = sys.modules.get("torch._dynamo.config")
    return bool(cfg is not None and getattr(cfg, "compiled_autograd", False))


def compiled_inner(m: Any) -> Any:
    """The module a ``torch.compile`` wrapper (OptimizedModule) stands for, else None."""
    inner = getattr(m, "_orig_mod", None)
    if isinstance(inner, torch.nn.Module) and type(m).__name__ == "OptimizedModule":
        return inner
    return None


def exception_reason(exc_type: Any, exc: Any) -> str:
    """``Type: message`` (the terminal's reason of a capture an exception ended)."""
    name = getattr(exc_type, "__name__", str(exc_type))
    text = str(exc).strip() if exc is not None else ""
    return f"{name}: {text}" if text else name
