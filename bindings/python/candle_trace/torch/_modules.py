"""Module spans of the captured update: forward spans from a wrapper of each module's
``forward`` (an instance attribute for the captured update only), backward spans from
autograd hooks on the modules' outputs and inputs.

A wrapper, not module hooks: any hook sends torch's ``Module.__call__`` down its slow
path, which costs microseconds per module call before the hook can stop the session
clock -- time the trace would count as the model's. The wrapper's first statement
stops it.

A ``torch.compile``'d module (its OptimizedModule) gets one span, named as the module it
compiles: what runs inside is the compiled graph, where nothing of the tracer may be
(the wrappers run under ``torch.compiler.disable``, outside any graph).

A forward span is named after the module (its qualified name, the model's name for the
model itself), kind module, step forward -- or, for a forward that runs with gradients
off inside the update (an eval pass), ``<name> [no_grad]`` with no step; and for one that
runs with gradients on inside a backward (activation checkpointing recomputing it, the
``torch.utils.checkpoint`` way), ``<name> [recompute]`` with no step: its time is the
backward's that holds it.

A backward span opens when the gradient of the module's output arrives and closes when
the gradients of its inputs are computed (or, for a module whose inputs need none, when
another module's backward starts outside it or the backward call returns) -- always on
the thread that runs the hook.

Two implementations, chosen with the capture's spans (:func:`module_spans`):
:class:`NativeModuleSpans`, whose wrappers and hooks are C++ objects
(``_module_spans.cpp``: no Python frame, no ctypes call per module), and
:class:`PyModuleSpans`, the same in Python where the op observer's library cannot be
built.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch
from torch.overrides import has_torch_function_unary

from .. import _args
from ._common import first_tensor, outside_dynamo, patch, restore, tensors
from ._spans import NativeSpans

__all__ = ["ModuleSpans", "PyModuleSpans", "NativeModuleSpans", "module_spans"]

_KEYS = itertools.count(1)  # one key per ModuleSpans, never reused in the process


class ModuleSpans:
    """The module spans of one capture. ``capture`` provides ``state``, ``capturing``,
    ``spans``, ``stats`` (a StatsRecorder or None), ``ops_suspend``,
    ``on_forward(module)``, ``failing(exc)`` (the program raised) and ``abort(exc)``
    (an internal error fails the capture); every hook's work is tracer work, between
    ``spans``' brackets. Subclasses make the wrappers (:meth:`_wrapper`)."""

    def __init__(self, capture: Any, modules: Sequence[Tuple[str, torch.nn.Module]],
                 tops: Sequence[torch.nn.Module], root: str) -> None:
        self._cap = capture
        self._root = root
        #: module -> (span name, qualified name)
        self._names: Dict[torch.nn.Module, Tuple[str, str]] = {
            m: (q or root, q) for q, m in modules}
        self._tops = set(tops)
        self._undo: List[Callable[[], None]] = []
        #: the key of this capture's hook in a tensor's ``_backward_hooks`` (a str: never
        #: one of register_hook's integer ids, nor another capture's)
        self._key = f"candle_trace-{next(_KEYS)}"

    def install(self) -> None:
        for m in self._names:
            attr = entry(m)
            prev = patch(m, attr, self._wrapper(m, getattr(m, attr)))
            self._undo.append(lambda m=m, attr=attr, prev=prev: restore(m, attr, prev))

    def remove(self) -> None:
        for u in reversed(self._undo):
            u()
        self._undo.clear()

    def autograd_compiled(self) -> None:
        """Autograd runs compiled (see :func:`_common.compiled_autograd_on`): from the next
        forward on, gradients are hooked where its graph calls them, the tensors' Python
        hooks (what these are everywhere but in :class:`NativeModuleSpans`)."""

    def _wrapper(self, module: torch.nn.Module, orig: Callable) -> Callable:
        """The span's wrapper of ``orig``, what ``module``'s call runs (:func:`entry`)."""
        raise NotImplementedError

    def _record_output(self, name: str, sid: int, t: torch.Tensor) -> None:
        """The statistics of a module's output, where the capture takes them."""
        if t.is_floating_point():
            self._cap.stats.record(sid, f"{name}/output", t)  # pauses op recording if it must


class PyModuleSpans(ModuleSpans):
    """The module spans in Python (with :class:`_spans.Spans`)."""

    def __init__(self, capture: Any, modules: Sequence[Tuple[str, torch.nn.Module]],
                 tops: Sequence[torch.nn.Module], root: str) -> None:
        super().__init__(capture, modules, tops, root)
        #: what every tensor hook of this capture calls, bound to the tensor's lists
        self._run_hooks = _hook_runner(capture)

    # -- forward ------------------------------------------------------------------------

    def _wrapper(self, module: torch.nn.Module, orig: Callable) -> Callable:
        cap = self._cap
        spans = cap.spans
        # The tracer brackets and the span calls bound once: every module call of every
        # recorded update runs this, so each Python frame it saves counts (the flight
        # recorder's cost is mostly such frames, run with cold caches between ops).
        tb, te, hc = spans._tb, spans._te, spans._hc
        name = self._names[module][0]
        owner, no_grad, recompute = "f:" + name, f"{name} [no_grad]", f"{name} [recompute]"
        top = module in self._tops
        hooks = self._backward_span_ends(module)
        is_grad_enabled = torch.is_grad_enabled

        def forward(*args: Any, **kw: Any) -> Any:
            state = cap.state
            if state != "capturing" and state != "armed":
                return orig(*args, **kw)
            tb(hc)
            sid = 0
            try:
                if state == "armed":
                    cap.on_forward(module)
                if cap.state == "capturing":
                    if is_grad_enabled():
                        if spans.in_backward():
                            sid = spans.push(owner, recompute, "module", None)
                        else:
                            sid = spans.push(owner, name, "module", "forward")
                    else:
                        sid = spans.push(owner, no_grad, "module", None)
            except Exception as e:  # noqa: BLE001 - the tracer's failure is not the program's
                cap.abort(e)
            finally:
                te(hc)
            try:
                out = orig(*args, **kw)
            except BaseException as e:
                if top:  # the program raised inside the update: the capture fails with it
                    cap.failing(e)
                raise
            if sid and cap.state == "capturing":
                tb(hc)
                try:
                    self._end(name, sid, args, out, hooks)
                except Exception as e:  # noqa: BLE001
                    cap.abort(e)
                finally:
                    te(hc)
            return out

        return outside_dynamo(forward)

    def _end(self, name: str, sid: int, args: Any, out: Any,
             hooks: Tuple[Callable, Callable]) -> None:
        cap = self._cap
        t = out if isinstance(out, torch.Tensor) else first_tensor(out)
        if t is not None and cap.stats is not None:
            self._record_output(name, sid, t)
        if t is not None and t.requires_grad and torch.is_grad_enabled():
            begin, end = hooks
            self._tensor_hook(t, begin, True)
            ins = args if len(args) == 1 and isinstance(args[0], torch.Tensor) else tensors(args)
            for a in ins:
                if a.requires_grad:
                    self._tensor_hook(a, end, False)
        stack = cap.spans._tl.stack
        if stack and stack[-1][1] == sid:  # the module's own span is the innermost
            cap.spans.pop_top()
        else:
            cap.spans.close_until(sid)

    # -- backward -----------------------------------------------------------------------

    def _backward_span_ends(self, module: torch.nn.Module) -> Tuple[Callable, Callable]:
        """What the gradient of the module's output (begin) and of its inputs (end) do
        to its backward span."""
        cap = self._cap
        name, qual = self._names[module]
        owner = "b:" + name
        spans = cap.spans

        root = self._root

        def begin(grad: torch.Tensor) -> None:
            # Close spans of this thread that do not contain this module.
            stack = spans._tl.stack  # (not the property: one frame less per hook)
            while stack:
                top = stack[-1][0]
                if not top.startswith("b:"):
                    break
                outer = top[2:]
                if outer == root or qual == outer or qual.startswith(outer + "."):
                    break
                spans.pop_top()
            spans.push(owner, name, "module", "backward")

        def end(grad: torch.Tensor) -> None:
            stack = spans._tl.stack  # (not the property: one frame less per hook)
            if stack and stack[-1][0] == owner:  # its span is the innermost: most calls
                spans.pop_top()
                return
            sid = spans.find(owner)
            if sid is not None:
                spans.close_until(sid)

        return begin, end

    def _tensor_hook(self, t: torch.Tensor, fn: Callable, begin: bool) -> None:
        """One autograd hook per tensor that runs, when its gradient arrives, the span
        ends of the modules that consumed it first, then the span begins of the modules
        that produced it, outermost first (an outer module's forward hook runs last).

        What ``Tensor.register_hook`` does, less the handle it makes (nothing removes
        these: the tensor and its hooks go together): the hook goes into the tensor's
        ``_backward_hooks`` dict under this object's key, where the next module to
        see the tensor finds its lists; it is one dispatcher built once per capture
        (:meth:`_run_hooks`) bound to the lists. Every module of every recorded update
        registers on its output and inputs, so the handle, its weak reference and the
        dynamo wrapper per tensor were a measurable part of the flight recorder's
        cost (see BENCHMARKS.md)."""
        hooks = t._backward_hooks
        if hooks is not None:
            bound = hooks.get(self._key)
            if bound is not None:
                bound.args[1 if begin else 0].append(fn)
                return
        if has_torch_function_unary(t):  # a tensor subclass: its own register_hook
            bound = getattr(t, "_candle_trace_hooks", None)
            if bound is None or bound.func is not self._run_hooks:
                bound = functools.partial(self._run_hooks, [], [])
                t.register_hook(bound)
                t._candle_trace_hooks = bound  # type: ignore[attr-defined]
            bound.args[1 if begin else 0].append(fn)
            return
        bound = functools.partial(self._run_hooks, [], [])
        bound.args[1 if begin else 0].append(fn)
        _ = t.grad_fn  # as register_hook: refreshes a stale view before the dict
        if hooks is None:
            hooks = t._backward_hooks = OrderedDict()
            grad_fn = t.grad_fn
            if grad_fn is not None:
                grad_fn._register_hook_dict(t)
        hooks[self._key] = bound


def _hook_runner(cap: Any) -> Callable:
    """What every tensor hook of ``cap`` calls, bound to the tensor's lists (see
    :meth:`ModuleSpans._tensor_hook`): the span ends of the modules that consumed the
    tensor, then the span begins of those that produced it (outermost first), as
    tracer work -- ``cap.guard`` inlined (an error fails the capture)."""
    spans = cap.spans
    tb, te, hc = spans._tb, spans._te, spans._hc

    def run(ends: List[Callable], begins: List[Callable], grad: torch.Tensor) -> None:
        if cap.state != "capturing":
            return
        tb(hc)
        try:
            for f in ends:
                f(grad)
            for f in reversed(begins):
                f(grad)
        except Exception as e:  # noqa: BLE001 - the tracer's failure is not the program's
            cap.abort(e)
        finally:
            te(hc)

    return outside_dynamo(run)


class NativeModuleSpans(ModuleSpans):
    """The module spans in C++ (with :class:`_spans.NativeSpans`): each module's forward
    wrapper and its tensors' hooks are objects of ``_module_spans.cpp`` that do what
    :class:`PyModuleSpans` does, calling back into Python only for what is rare (the
    update's first forward, a failure, the output's statistics of a full capture)."""

    def __init__(self, capture: Any, modules: Sequence[Tuple[str, torch.nn.Module]],
                 tops: Sequence[torch.nn.Module], root: str) -> None:
        super().__init__(capture, modules, tops, root)
        spans = capture.spans
        # torch.compile must see the hooks as opaque (outside_dynamo), as the wrappers:
        # one disabled caller per capture, bound to each tensor's hooks.
        call = lambda hooks, grad: hooks(grad)  # noqa: E731
        disabled = outside_dynamo(call)
        wrap = None if disabled is call else functools.partial(functools.partial, disabled)
        # The outputs' float32 statistics are reduced into the capture's StatsBuffer from
        # C++; anything else comes back to _record_output_at.
        stats = capture.stats.buffer if capture.stats is not None else None
        self._table = spans.native.module_table(capture, spans.frames, self._key,
                                                self._record_output_at, wrap, root, stats,
                                                backward_hooks() == "node")
        self._index: Dict[torch.nn.Module, int] = {}
        self._span_names: List[str] = []  # by index
        for m, (name, qual) in self._names.items():
            self._index[m] = self._table.add(m, name, qual, _encoded(name),
                                             _encoded(f"{name} [no_grad]"),
                                             _encoded(f"{name} [recompute]"),
                                             _encoded(f"{name}/output", "StatsRecorder.record",
                                                      "label"), m in self._tops)
            self._span_names.append(name)

    def _wrapper(self, module: torch.nn.Module, orig: Callable) -> Callable:
        return outside_dynamo(self._table.wrapper(self._index[module], orig))

    def autograd_compiled(self) -> None:
        self._table.use_tensor_hooks()

    def _record_output_at(self, index: int, sid: int, t: torch.Tensor) -> None:
        self._record_output(self._span_names[index], sid, t)


def entry(module: torch.nn.Module) -> str:
    """The attribute a module's span wraps: its ``forward``, or, for a module compiled in
    place (``module.compile()``: its call goes to ``_compiled_call_impl``, whose compiled
    frame calls ``forward``), the compiled call -- a wrapper inside it would send dynamo
    to run that call eagerly."""
    return "_compiled_call_impl" if getattr(module, "_compiled_call_impl", None) is not None \
        else "forward"


def backward_hooks() -> str:
    """Where the C++ module spans hook a tensor's gradient (``CANDLE_TRACE_BACKWARD_HOOKS``):
    ``node`` (default), a pre-hook on the autograd node that receives it, called by autograd
    in C++; ``tensor``, the tensor's ``_backward_hooks`` as ``Tensor.register_hook`` does,
    called through torch's Python hook path (what a leaf or a tensor subclass always
    takes)."""
    v = os.environ.get("CANDLE_TRACE_BACKWARD_HOOKS", "node").strip().lower() or "node"
    if v not in ("node", "tensor"):
        raise ValueError(f"CANDLE_TRACE_BACKWARD_HOOKS={v!r}: node or tensor")
    return v


def _encoded(name: str, fn: str = "Spans.push", arg: str = "name") -> Any:
    """A span name (or statistics label) as the library takes it, or the binding's error
    for it (raised when the span would open, or by Python's statistics: the capture
    fails, the program goes on -- as in Python)."""
    try:
        return _args.text(name, fn, arg)
    except Exception as e:  # noqa: BLE001 - the argument check's error, kept for later
        return e


def module_spans(capture: Any, modules: Sequence[Tuple[str, torch.nn.Module]],
                 tops: Sequence[torch.nn.Module], root: str) -> ModuleSpans:
    """The module spans of ``capture``, in C++ when its spans are (:class:`NativeSpans`)."""
    cls = NativeModuleSpans if isinstance(capture.spans, NativeSpans) else PyModuleSpans
    return cls(capture, modules, tops, root)
