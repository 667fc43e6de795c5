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
off inside the update (an eval pass), ``<name> [no_grad]`` with no step.

A backward span opens when the gradient of the module's output arrives and closes when
the gradients of its inputs are computed (or, for a module whose inputs need none, when
another module's backward starts outside it or the backward call returns) -- always on
the thread that runs the hook.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch

from ._common import first_tensor, outside_dynamo, patch, restore, tensors

__all__ = ["ModuleSpans"]


class ModuleSpans:
    """The module spans of one capture. ``capture`` provides ``state``, ``capturing``,
    ``spans``, ``stats`` (a StatsRecorder or None), ``ops_suspend``,
    ``on_top_forward(module)``, ``failing(exc)`` (the program raised), ``abort(exc)`` (an
    internal error fails the capture) and ``guard(fn)`` (fn as a hook: tracer work,
    errors into abort)."""

    def __init__(self, capture: Any, modules: Sequence[Tuple[str, torch.nn.Module]],
                 tops: Sequence[torch.nn.Module], root: str) -> None:
        self._cap = capture
        self._root = root
        #: module -> (span name, qualified name)
        self._names: Dict[torch.nn.Module, Tuple[str, str]] = {
            m: (q or root, q) for q, m in modules}
        self._tops = set(tops)
        self._undo: List[Callable[[], None]] = []

    def install(self) -> None:
        for m in self._names:
            prev = patch(m, "forward", self._wrapper(m))
            self._undo.append(lambda m=m, prev=prev: restore(m, "forward", prev))

    def remove(self) -> None:
        for u in reversed(self._undo):
            u()
        self._undo.clear()

    # -- forward ------------------------------------------------------------------------

    def _wrapper(self, module: torch.nn.Module) -> Callable:
        cap = self._cap
        spans = cap.spans
        orig = module.forward
        name = self._names[module][0]
        top = module in self._tops
        active = ("armed", "capturing") if top else ("capturing",)
        hooks = self._backward_span_ends(module)

        def forward(*args: Any, **kw: Any) -> Any:
            if cap.state not in active:
                return orig(*args, **kw)
            spans.pause()
            sid = 0
            try:
                sid = self._begin(module, name, top)
            except Exception as e:  # noqa: BLE001 - the tracer's failure is not the program's
                cap.abort(e)
            finally:
                spans.resume()
            try:
                out = orig(*args, **kw)
            except BaseException as e:
                if top:  # the program raised inside the update: the capture fails with it
                    cap.failing(e)
                raise
            if sid and cap.state == "capturing":
                spans.pause()
                try:
                    self._end(name, sid, args, out, hooks)
                except Exception as e:  # noqa: BLE001
                    cap.abort(e)
                finally:
                    spans.resume()
            return out

        return outside_dynamo(forward)

    def _begin(self, module: torch.nn.Module, name: str, top: bool) -> int:
        cap = self._cap
        if not cap.capturing:
            if top:
                cap.on_top_forward(module)
            if not cap.capturing:
                return 0
        if torch.is_grad_enabled():
            return cap.spans.push("f:" + name, name, "module", "forward")
        return cap.spans.push("f:" + name, f"{name} [no_grad]", "module", None)

    def _end(self, name: str, sid: int, args: Any, out: Any,
             hooks: Tuple[Callable, Callable]) -> None:
        cap = self._cap
        t = first_tensor(out)
        if t is not None and cap.stats is not None and t.is_floating_point():
            cap.ops_suspend(True)
            try:
                cap.stats.record(sid, f"{name}/output", t)
            finally:
                cap.ops_suspend(False)
        if t is not None and t.requires_grad and torch.is_grad_enabled():
            begin, end = hooks
            self._tensor_hook(t, begin, True)
            for a in tensors(args):
                if a.requires_grad:
                    self._tensor_hook(a, end, False)
        cap.spans.close_until(sid)

    # -- backward -----------------------------------------------------------------------

    def _contains(self, outer: str, qual: str) -> bool:
        """Whether module ``qual`` is (inside) the module whose span is named ``outer``."""
        return outer == self._root or qual == outer or qual.startswith(outer + ".")

    def _backward_span_ends(self, module: torch.nn.Module) -> Tuple[Callable, Callable]:
        """What the gradient of the module's output (begin) and of its inputs (end) do
        to its backward span."""
        cap = self._cap
        name, qual = self._names[module]
        owner = "b:" + name
        spans = cap.spans

        def begin(grad: torch.Tensor) -> None:
            # Close spans of this thread that do not contain this module.
            stack = spans.stack
            while stack and stack[-1][0].startswith("b:") and not self._contains(
                    stack[-1][0][2:], qual):
                spans.pop_top()
            spans.push(owner, name, "module", "backward")

        def end(grad: torch.Tensor) -> None:
            sid = spans.find(owner)
            if sid is not None:
                spans.close_until(sid)

        return begin, end

    def _tensor_hook(self, t: torch.Tensor, fn: Callable, begin: bool) -> None:
        """One autograd hook per tensor that runs, when its gradient arrives, the span
        ends of the modules that consumed it first, then the span begins of the modules
        that produced it, outermost first (an outer module's forward hook runs last)."""
        lists = getattr(t, "_candle_trace_hooks", None)
        if lists is None:
            ends: List[Callable] = []
            begins: List[Callable] = []
            lists = (ends, begins)

            def run(grad: torch.Tensor) -> None:
                for f in ends:
                    f(grad)
                for f in reversed(begins):
                    f(grad)

            t.register_hook(outside_dynamo(self._cap.guard(run)))  # one interval per gradient
            t._candle_trace_hooks = lists  # type: ignore[attr-defined]
        lists[1 if begin else 0].append(fn)
