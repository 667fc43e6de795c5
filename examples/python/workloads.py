"""Training programs in the shape users run, on synthetic data (no downloads): the
models the Python tests and bench.py capture.

- ``gpt(batch, block)``: a GPT-style character model (token and position embeddings,
  pre-LayerNorm blocks of causal multi-head attention and an MLP, a tied-free head),
  trained with AdamW -- 2 layers, 64 wide, 4 heads, vocabulary 65 by default;
- ``cnn(batch)``: an MNIST-style CNN (2 conv + 2 linear, dropout), SGD with momentum,
  28x28 inputs;
- ``mlp(batch)``: the 64-64-10 MLP of examples/python/train_mlp.py, SGD.

Each returns a :class:`Workload`: the model, its optimizer, ``batch()`` (fresh synthetic
inputs and targets) and ``update(x, y)`` (zero_grad, forward, loss, backward, step;
returns the loss).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Tuple

import torch
from torch import nn
from torch.nn import functional as F

from train_mlp import MLP


@dataclass
class Workload:
    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    batch: Callable[[], Tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

    def update(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return loss


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, block: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.register_buffer("mask", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, width: int, heads: int, block: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, block)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharGPT(nn.Module):
    def __init__(self, vocab: int = 65, width: int = 64, layers: int = 2, heads: int = 4,
                 block: int = 64) -> None:
        super().__init__()
        self.block = block
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(block, width)
        self.blocks = nn.ModuleList([Block(width, heads, block) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def _lm_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


def gpt(batch: int = 8, block: int = 64, seed: int = 0, vocab: int = 65) -> Workload:
    torch.manual_seed(seed)
    model = CharGPT(vocab=vocab, block=max(block, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    g = torch.Generator().manual_seed(seed + 1)

    def make() -> Tuple[torch.Tensor, torch.Tensor]:
        data = torch.randint(0, vocab, (batch, block + 1), generator=g)
        return data[:, :-1], data[:, 1:]

    return Workload(f"gpt b{batch}x{block}", model, opt, make, _lm_loss)


class MnistCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def cnn(batch: int = 64, seed: int = 0) -> Workload:
    torch.manual_seed(seed)
    model = MnistCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(seed + 1)

    def make() -> Tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batch,), generator=g)

    return Workload(f"cnn b{batch}", model, opt, make, F.nll_loss)


def mlp(batch: int = 32, seed: int = 0) -> Workload:
    torch.manual_seed(seed)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(seed + 1)

    def make() -> Tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(batch, 64, generator=g), torch.randint(0, 10, (batch,), generator=g)

    return Workload(f"mlp b{batch}", model, opt, make, F.cross_entropy)


WORKLOADS = {
    "mlp": lambda: mlp(),
    "gpt-b8": lambda: gpt(8, 64),
    "gpt-b1": lambda: gpt(1, 8),
    "cnn": lambda: cnn(64),
}
