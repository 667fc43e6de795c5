"""Closing the backward spans that autograd's device threads leave open.

On CUDA (any device but the CPU), autograd runs a backward's nodes -- and the module
spans' hooks on them -- on a thread of its own per device, not on the thread that called
``backward()``. A module whose inputs need no gradient (the first layer, the model
itself) has no hook that ends its backward span: on the calling thread that span closes
when the backward call returns (``Spans.close_until``), but a span can only be closed by
the thread that opened it (``ct_span_end``), and the device thread runs nothing of the
capture's after its last node. Left open, those spans made ``ct_finish`` refuse, so
every full capture of a CUDA model ended as failed (found on the first GPU run).

So when the backward call returns and other threads still hold spans, one more tiny
backward runs a node on each of the capture's devices, and that node, on the device's
thread, closes its spans: at the same point of the program as on the CPU (the backward
call's return). It launches no kernel and allocates nothing (empty tensors), and runs
with the capture's op recording suspended and the session clock paused (tracer work).
"""

from __future__ import annotations

from typing import Any, Iterable, List

import torch

from ._common import torch_grad

__all__ = ["close_spans_on_device_threads", "devices_of"]


class _CloseSpans(torch.autograd.Function):
    """Its backward closes every span the thread running it holds open."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, spans: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.spans = spans
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        spans = ctx.spans
        while spans.stack:
            spans.pop_top()
        return grad, None


def devices_of(tensors: Iterable[torch.Tensor]) -> List[torch.device]:
    """The devices other than the CPU (each has an autograd thread) the tensors live on."""
    seen: List[torch.device] = []
    for t in tensors:
        d = t.device
        if d.type not in ("cpu", "meta") and d not in seen:
            seen.append(d)
    return seen


def close_spans_on_device_threads(spans: Any, devices: List[torch.device]) -> None:
    """Runs, on the autograd thread of each device, a node that closes that thread's
    open spans (call it with the capture's op recording suspended)."""
    if not devices:
        return
    leaves = [torch.empty(0, device=d, requires_grad=True) for d in devices]
    with torch.enable_grad():
        outs = [_CloseSpans.apply(x, spans) for x in leaves]
    torch_grad(outs, leaves, [torch.empty(0, device=d) for d in devices])
