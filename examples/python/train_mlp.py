"""A small MLP (64-64-10, batch 32, float32) trained with SGD on synthetic data;
update 3 is captured into a candle-graph/trace/10 trace with candle_trace.torch.

    PYTHONPATH=bindings/python /usr/bin/python3 examples/python/train_mlp.py build/py/mlp.jsonl
    build/candle-trace report build/py/mlp.jsonl

With ``--aggregate SUMMARY.json`` a second session keeps candle-trace/aggregate/1 statistics
of every update (forward, backward, optimizer, data, the update, the loss) in constant memory,
beside the capture of update 3:

    ... train_mlp.py build/py/mlp.jsonl --steps 10000 --aggregate build/py/summary.json
    build/candle-trace report build/py/summary.json

Its twin is bindings/rust/examples/train_mlp.rs (candle): the same model, the
same numbers — every weight, bias, input and label comes from one splitmix64
stream seeded with 0, drawn in the same order — and the same comparison
identity but for implementation_id, so `make compare-demo` can put the two
traces side by side with `candle-trace compare`.
"""

from __future__ import annotations

import argparse
import sys
import time

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


MASK = (1 << 64) - 1


class SplitMix64:
    """The example's one random stream; the Rust twin draws the same numbers."""

    def __init__(self, seed: int) -> None:
        self.state = seed & MASK

    def next_u64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def uniform(self, n: int) -> torch.Tensor:
        """n floats in [-1, 1): 24 random bits, exact in float32."""
        return torch.tensor([(self.next_u64() >> 40) / float(1 << 24) * 2.0 - 1.0
                             for _ in range(n)], dtype=torch.float32)


def init_like_rust(model: MLP, rng: SplitMix64) -> None:
    """Weights and biases ~ U(-1/sqrt(in), 1/sqrt(in)), in the Rust twin's order."""
    with torch.no_grad():
        for p, fan_in in ((model.fc1.weight, 64), (model.fc1.bias, 64),
                          (model.fc2.weight, 64), (model.fc2.bias, 64)):
            scale = torch.tensor(1.0 / fan_in ** 0.5, dtype=torch.float32)
            p.copy_((rng.uniform(p.numel()) * scale).reshape(p.shape))


def batches(rng: SplitMix64, steps: int, batch: int = 32):
    for _ in range(steps):
        x = rng.uniform(batch * 64).reshape(batch, 64)
        y = torch.tensor([rng.next_u64() % 10 for _ in range(batch)], dtype=torch.int64)
        yield x, y


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", default="traces/mlp.jsonl")
    ap.add_argument("--steps", type=int, default=5)  # the Rust twin trains 5 updates too
    ap.add_argument("--capture-step", type=int, default=3)
    ap.add_argument("--aggregate", metavar="SUMMARY.json", default=None,
                    help="also keep aggregate statistics of every update in this summary")
    ap.add_argument("--aggregate-interval-ms", type=int, default=None,
                    help="rewrite the summary this often (default 10 s) besides at the end")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    rng = SplitMix64(0)
    model = MLP()
    init_like_rust(model, rng)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    agg = {}
    if args.aggregate is not None:
        agg = {"aggregate_path": args.aggregate,
               "aggregate_interval_ms": args.aggregate_interval_ms}
    t0 = time.perf_counter()
    with candle_trace.torch.profile(model, optimizer, args.trace,
                                    capture_step=args.capture_step, name="mlp",
                                    identity=IDENTITY, tags={"example": "python"},
                                    **agg) as prof:
        for x, y in batches(rng, args.steps):
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            prof.step()
    print(f"wrote {args.trace} (update {args.capture_step} of {args.steps}, "
          f"{prof.op_count} ops via {prof.op_mechanism}, final loss {loss.item():.4f})")
    if args.aggregate is not None:
        wall = time.perf_counter() - t0
        print(f"wrote {args.aggregate} (aggregate statistics of all {args.steps} updates, "
              f"{wall:.2f} s, {wall / max(args.steps, 1) * 1e6:.1f} us per update)")
        print(f"report: candle-trace report {args.aggregate}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
