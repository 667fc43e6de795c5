"""A small MLP (64-64-10, batch 32, float32, seed 0) trained with SGD on synthetic data;
update 3 is captured into a candle-graph/trace/10 trace with candle_trace.torch.

    PYTHONPATH=bindings/python /usr/bin/python3 examples/python/train_mlp.py build/py/mlp.jsonl
    cd build/py && candle-graph summary mlp.jsonl --require-valid

A Rust twin (candle) declares the same comparison identity with implementation_id
"candle", so candle-graph can compare the two traces.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

import candle_trace.torch

IDENTITY = {
    "workload_id": "mlp-synthetic",
    "model_id": "mlp-64-64-10",
    "config_id": "sgd-lr0.1",
    "data_id": "synthetic-seed0",
    "seed_policy": "fixed-0",
    "precision": "f32",
    "device_state": "cpu",
    "physical_batch": 32,
    "accumulation_steps": 1,
    "implementation_id": "pytorch",
}


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 64)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def batches(steps: int, batch: int = 32):
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randn(batch, 64, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)
        yield x, y


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", default="traces/mlp.jsonl")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--capture-step", type=int, default=3)
    args = ap.parse_args(argv)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    with candle_trace.torch.profile(model, optimizer, args.trace,
                                    capture_step=args.capture_step, name="mlp",
                                    identity=IDENTITY, tags={"example": "train_mlp"}) as prof:
        for x, y in batches(args.steps):
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            prof.step()
    print(f"wrote {args.trace} (update {args.capture_step} of {args.steps}, "
          f"{prof.op_count} ops via {prof.op_mechanism}, final loss {loss.item():.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
