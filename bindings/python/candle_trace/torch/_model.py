"""What a profile or a watch is given as the model, taken apart once: its top modules and
the trainable tensors it holds outside any module.

A model is an ``nn.Module``; or an object (a mapping, a plain class, a namespace) whose
attributes or items are modules and tensors; or a list or tuple of tensors -- a model
written with raw tensors (``W1 = torch.randn(..., requires_grad=True)``), as many
tutorials train one. Its loose tensors are parameters of the trace like a module's,
named after where the model holds them (``W1``, ``layers.0``; a list's by position).
A model with tensors of its own has no forward that marks the start of an update (a
module among them may run late in it): its captures open the update at the ``step()``
before it (:attr:`Parts.begins_at_forward`).
"""

from __future__ import annotations

from typing import Any, Iterable, List, Mapping, Optional, Tuple

import torch

from ._common import compiled_inner

__all__ = ["Parts", "parts_of"]

Named = List[Tuple[str, Any]]


class Parts:
    """A model's top modules (a top named "" is the model itself) and its loose
    tensors, each with its name."""

    def __init__(self, model: Any, tops: Named, tensors: Named) -> None:
        self.model = model
        self.tops: List[Tuple[str, torch.nn.Module]] = tops
        self.tensors: List[Tuple[str, torch.Tensor]] = tensors

    @property
    def begins_at_forward(self) -> bool:
        """A forward of a top module opens the update. Not where the model computes with
        tensors of its own: what it does with them before its first module runs (an
        embedding lookup, a matmul) is the update's too."""
        return bool(self.tops) and not self.tensors

    def forward_modules(self) -> List[torch.nn.Module]:
        """The modules whose first forward in an update starts it for the whole-run
        statistics (none: no forward does) -- each top, as a GAN's loop may call its
        generator or its discriminator first."""
        if isinstance(self.model, torch.nn.Module):
            return [self.model]
        return [m for _, m in self.tops] if self.begins_at_forward else []

    def identity(self, name: Optional[str], device: Optional[str]) -> Tuple[str, str]:
        """The model's name (its class's; a compiled module's, the class it compiles; a
        container's, "model") and device (its first parameter's, else cpu), where they
        are not given."""
        if device is None:
            first = next((p for _, m in self.tops for p in m.parameters()), None)
            if first is None and self.tensors:
                first = self.tensors[0][1]
            device = str(first.device) if first is not None else "cpu"
        if name:
            return name, device
        if isinstance(self.model, (Mapping, list, tuple)):
            return "model", device
        return type(compiled_inner(self.model) or self.model).__name__, device


def parts_of(model: Any, caller: str) -> Parts:
    """The model's parts; a TypeError naming ``caller`` for anything that holds neither
    a module nor a tensor."""
    if isinstance(model, torch.nn.Module):
        return Parts(model, [("", model)], [])
    if isinstance(model, torch.Tensor):
        model = [model]
    if isinstance(model, Mapping):
        items: Iterable[Tuple[Any, Any]] = model.items()
    elif isinstance(model, (list, tuple)):
        items = enumerate(model)
    else:
        items = vars(model).items() if hasattr(model, "__dict__") else ()
    tops: Named = []
    tensors: Named = []
    for key, value in items:
        name = str(key)
        if isinstance(value, torch.nn.Module):
            tops.append((name, value))
        elif isinstance(value, torch.Tensor):
            tensors.append((name, value))
        elif isinstance(value, (list, tuple)) and value and \
                all(isinstance(v, torch.Tensor) for v in value):
            tensors.extend((f"{name}.{i}", v) for i, v in enumerate(value))
    # An object's attributes may hold data (inputs, constants) beside the model's own:
    # only trainable leaves are its parameters. A mapping or a list was given as them.
    if not isinstance(model, (Mapping, list, tuple)):
        tensors = [(n, t) for n, t in tensors if t.is_leaf and t.requires_grad]
    seen = {id(p) for _, m in tops for p in m.parameters()}
    loose: Named = []
    for n, t in tensors:  # each tensor once: a module's parameter is the module's
        if id(t) not in seen:
            seen.add(id(t))
            loose.append((n, t))
    tensors = loose
    if not tops and not tensors:
        raise TypeError(f"{caller}: model must be a torch.nn.Module, an object or mapping "
                        f"holding modules or trainable tensors, or a list of tensors; got "
                        f"{type(model).__name__} with none")
    return Parts(model, tops, tensors)
