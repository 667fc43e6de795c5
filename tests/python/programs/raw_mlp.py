"""A character-level MLP language model written with raw tensors, no ``nn.Module``, in
the shape of the well-known "makemore" tutorial: an embedding table ``C``, a tanh
hidden layer ``W1``/``b1`` with a batch-norm gain and bias, an output layer
``W2``/``b2``, trained with SGD on synthetic three-character contexts. ``spare`` is a
tensor it trains but never uses (it must show as a parameter with no gradient).
Nothing in it knows candle_trace: `candle-trace run -- python raw_mlp.py` traces it as
it is.

``--model class`` holds the same tensors in a plain class (``MLP``, no
``nn.Module``) with an ``nn.LayerNorm`` among them, as hand-written models often mix
the two; ``--optimizer none`` updates the parameters by hand, as the tutorial does
(``p.grad = None``, backward, ``p.data += -lr * p.grad``: no torch optimizer at all);
``--lr-spike-at N`` sets the learning rate to 1e30 in update N's step, so that update
N+1's loss is not finite. With RAW_MLP_GRAD_NORMS=FILE set, each update
appends ``{"update": n, "norms": {parameter: |grad|}}`` to FILE, read after backward,
named as the trace names them.

    python raw_mlp.py [--updates N] [--model globals|class] [--optimizer sgd|none]
                      [--lr-spike-at N]
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Dict, List, Optional, Tuple

import torch
from torch.nn import functional as F

VOCAB, EMBED, HIDDEN, CONTEXT, BATCH = 27, 10, 64, 3, 32


class MLP:
    """The same model as the globals, in a class of its own (no nn.Module), held by the
    global ``model`` as a script's top level would."""

    def __init__(self, g: torch.Generator) -> None:
        self.C = torch.randn((VOCAB, EMBED), generator=g)
        self.W1 = torch.randn((CONTEXT * EMBED, HIDDEN), generator=g) * 0.2
        self.b1 = torch.randn(HIDDEN, generator=g) * 0.01
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.head = [torch.randn((HIDDEN, VOCAB), generator=g) * 0.01, torch.zeros(VOCAB)]
        self.spare = torch.randn(5, 5, generator=g)
        for t in self.parameters():
            t.requires_grad_(True)

    def tensors(self) -> List[Tuple[str, torch.Tensor]]:
        """(the trace's name, tensor) of each trained tensor the class holds itself."""
        return [("model.C", self.C), ("model.W1", self.W1), ("model.b1", self.b1),
                ("model.head.0", self.head[0]), ("model.head.1", self.head[1]),
                ("model.spare", self.spare)]

    def parameters(self) -> List[torch.Tensor]:
        return [t for _, t in self.tensors()] + list(self.norm.parameters())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.norm(self.C[x].view(-1, CONTEXT * EMBED) @ self.W1 + self.b1))
        return h @ self.head[0] + self.head[1]


def main() -> None:
    global C, W1, b1, bngain, bnbias, W2, b2, spare, parameters, model
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=5)
    ap.add_argument("--model", choices=["globals", "class"], default="globals")
    ap.add_argument("--optimizer", choices=["sgd", "none"], default="sgd")
    ap.add_argument("--lr-spike-at", type=int, default=0)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(2147483647)
    X = torch.randint(0, VOCAB, (1000, CONTEXT), generator=g)
    Y = torch.randint(0, VOCAB, (1000,), generator=g)

    names: List[Tuple[str, torch.Tensor]]
    if args.model == "class":
        model = MLP(g)
        parameters = model.parameters()
        names = model.tensors() + [(f"model.norm.{n}", p)
                                   for n, p in model.norm.named_parameters()]
    else:
        C = torch.randn((VOCAB, EMBED), generator=g)
        W1 = torch.randn((CONTEXT * EMBED, HIDDEN), generator=g) * 0.2
        b1 = torch.randn(HIDDEN, generator=g) * 0.01
        bngain, bnbias = torch.ones((1, HIDDEN)), torch.zeros((1, HIDDEN))
        W2 = torch.randn((HIDDEN, VOCAB), generator=g) * 0.01
        b2 = torch.zeros(VOCAB)
        spare = torch.randn(5, 5, generator=g)
        parameters = [C, W1, b1, bngain, bnbias, W2, b2, spare]
        for p in parameters:
            p.requires_grad = True
        names = [(n, globals()[n]) for n in ("C", "W1", "b1", "bngain", "bnbias", "W2", "b2",
                                             "spare")]

        def model(x: torch.Tensor) -> torch.Tensor:
            hpre = C[x].view(-1, CONTEXT * EMBED) @ W1 + b1
            hpre = bngain * (hpre - hpre.mean(0, keepdim=True)) / \
                (hpre.std(0, keepdim=True) + 1e-5) + bnbias
            return torch.tanh(hpre) @ W2 + b2

    opt = torch.optim.SGD(parameters, lr=0.1) if args.optimizer == "sgd" else None
    norms_path: Optional[str] = os.environ.get("RAW_MLP_GRAD_NORMS")
    for update in range(1, args.updates + 1):
        ix = torch.randint(0, X.shape[0], (BATCH,), generator=g)
        loss = F.cross_entropy(model(X[ix]), Y[ix])
        for p in parameters:
            p.grad = None
        loss.backward()
        if norms_path:
            norms: Dict[str, Optional[float]] = {
                n: None if t.grad is None else float(t.grad.norm()) for n, t in names}
            with open(norms_path, "a") as f:
                f.write(json.dumps({"update": update, "norms": norms}) + "\n")
        lr = 1e30 if update == args.lr_spike_at else 0.1
        if opt is None:
            for p in parameters:
                if p.grad is not None:
                    p.data += -lr * p.grad
        else:
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
        print(f"update {update}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
