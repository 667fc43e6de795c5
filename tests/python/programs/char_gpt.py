"""A character-level GPT trained with AdamW and a cosine learning-rate schedule on
synthetic text, in the shape of the small public GPT scripts: token and position
embeddings, pre-LayerNorm blocks of causal self-attention and an MLP, a head; an
evaluation pass under torch.no_grad() every few updates. Nothing in it knows
candle_trace: `candle-trace run -- python char_gpt.py` traces it as it is.

Two things are here for the tests: the model has a layer it never calls
(``unused``, which must show as parameters with no gradient) and a branch taken only
on even updates (``extra_mix``); and, with CHAR_GPT_GRAD_NORMS=FILE set, each update
appends ``{"update": n, "norms": {parameter: |grad|}}`` to FILE, read after backward,
so a test can hold the trace's gradients to the program's own.

For `candle-trace run --watch`, three ways to go wrong, each at a chosen update:
``--lr-spike-at N`` sets the learning rate to 1e30 in update N's optimizer step, so
that update N+1's loss is not finite; ``--oom-at N`` makes update N's backward raise
CUDA's out-of-memory RuntimeError (on any device), which ends the program;
``--stall-at N`` makes update N's data step wait 5x the median update so far. With
``--loader-ms MS`` every data step waits MS first (a loader), so that a stall stands
well above the machine's noise. The data step is a ``DataLoader`` (over an
``IterableDataset``, no workers): the wait is inside its ``__next__``.

``--device`` runs it elsewhere than the CPU (tests/gpu/programs.py: ``cuda:0``).

    python char_gpt.py [--updates N] [--eval-every K] [--loader-ms MS]
                       [--lr-spike-at N] [--oom-at N] [--stall-at N] [--device D]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from typing import Any, Dict, List, Optional

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, IterableDataset

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


class Attention(nn.Module):
    """Causal multi-head self-attention with one fused input projection."""

    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.in_proj = nn.Linear(dim, 3 * dim, bias=False)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        batch, length, dim = h.shape
        heads = self.in_proj(h).reshape(batch, length, 3, self.n_heads, dim // self.n_heads)
        q, k, v = heads.permute(2, 0, 3, 1, 4).unbind(0)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        future = torch.ones(length, length, dtype=torch.bool, device=h.device).triu(1)
        weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        mixed = (weights @ v).transpose(1, 2).reshape(batch, length, dim)
        return self.out_proj(mixed)


class Block(nn.Module):
    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, n_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attn(self.norm1(h))
        return h + self.ff(self.norm2(h))


class CharGPT(nn.Module):
    def __init__(self, vocab: int, context: int, dim: int = 48, n_heads: int = 4,
                 n_blocks: int = 2) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, n_heads) for _ in range(n_blocks))
        self.extra_mix = nn.Linear(dim, dim)  # only on the updates that ask for it
        self.unused = nn.Linear(dim, dim)  # never called: its gradient stays missing
        self.final_norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor, mix: bool = False) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        h = self.tokens(idx) + self.positions(pos)
        for block in self.blocks:
            h = block(h)
        if mix:
            h = h + torch.tanh(self.extra_mix(h))
        return self.head(self.final_norm(h))


class RaisingBackward(torch.autograd.Function):
    """Identity whose backward raises CUDA's out-of-memory message when armed."""

    armed = False

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        if RaisingBackward.armed:
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB "
                               "(GPU 0; 79.35 GiB total capacity; 71.20 GiB already allocated)")
        return g


class Windows(IterableDataset):
    """The data step, through a DataLoader as the public scripts' are: batches of random
    windows of the text, each after ``wait_s`` (what ``--loader-ms`` and ``--stall-at``
    set for the next one: a loader's wait for its disk)."""

    def __init__(self, data: torch.Tensor, context: int, batch: int,
                 gen: torch.Generator) -> None:
        super().__init__()
        self.data, self.context, self.batch, self.gen = data, context, batch, gen
        self.wait_s = 0.0

    def __iter__(self):
        data, context = self.data, self.context
        while True:
            if self.wait_s:
                time.sleep(self.wait_s)
            starts = torch.randint(len(data) - context - 1, (self.batch,), generator=self.gen)
            x = torch.stack([data[s:s + context] for s in starts])
            y = torch.stack([data[s + 1:s + context + 1] for s in starts])
            yield x, y


def grad_norms(model: nn.Module) -> Dict[str, Optional[float]]:
    return {name: (None if p.grad is None else float(p.grad.detach().double().norm()))
            for name, p in model.named_parameters() if p.requires_grad}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=6)
    ap.add_argument("--eval-every", type=int, default=2)
    ap.add_argument("--loader-ms", type=float, default=0.0)
    ap.add_argument("--lr-spike-at", type=int)
    ap.add_argument("--oom-at", type=int)
    ap.add_argument("--stall-at", type=int)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.manual_seed(0)
    chars = sorted(set(TEXT))
    data = torch.tensor([chars.index(c) for c in TEXT])
    context, batch = 16, 8
    model = CharGPT(len(chars), context).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.updates)
    norms_file = os.environ.get("CHAR_GPT_GRAD_NORMS")
    windows = Windows(data, context, batch, torch.Generator().manual_seed(1))
    stream = iter(DataLoader(windows, batch_size=None))  # batches as the dataset makes them
    took: List[float] = []
    for update in range(1, args.updates + 1):
        began = time.perf_counter()
        model.train()
        stall = 5 * sorted(took)[len(took) // 2] if update == args.stall_at and took else 0.0
        windows.wait_s = args.loader_ms / 1e3 + stall
        x, y = (t.to(args.device) for t in next(stream))
        logits = RaisingBackward.apply(model(x, mix=update % 2 == 0))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        RaisingBackward.armed = update == args.oom_at
        loss.backward()
        if update == args.lr_spike_at:
            for group in opt.param_groups:
                group["lr"] = 1e30
        if norms_file:
            with open(norms_file, "a") as f:
                f.write(json.dumps({"update": update, "norms": grad_norms(model)}) + "\n")
        opt.step()
        schedule.step()
        if update % args.eval_every == 0:
            model.eval()
            with torch.no_grad():
                windows.wait_s = 0.0
                vx, vy = (t.to(args.device) for t in next(stream))
                vlogits = model(vx)
                vloss = F.cross_entropy(vlogits.reshape(-1, vlogits.shape[-1]), vy.reshape(-1))
            print(f"update {update}: loss {loss.item():.4f}, eval loss {vloss.item():.4f}")
        took.append(time.perf_counter() - began)
    params = sum(p.numel() for p in model.parameters())
    print(f"trained {args.updates} updates of a {params}-parameter CharGPT")


if __name__ == "__main__":
    main()
