"""A mixed-precision training loop as the PyTorch AMP recipe writes one, on the CPU:
``torch.autocast`` (bfloat16) around the forward, a ``GradScaler`` around backward and
the optimizer step. The first ``--overflow-until`` iterations run at a scale so large
that the gradients overflow -- what an fp16 run's first iterations do on a GPU -- and
the scaler skips their optimizer step; from then on the scale is 1024. ``--nan-at N``
makes update N's loss NaN (a real anomaly, which the scaler skips too). Nothing in it
knows candle_trace: `candle-trace run -- python amp_mlp.py` traces it as it is.

Each iteration prints its (unscaled) loss and whether the scaler skipped the step.

    python amp_mlp.py [--updates N] [--overflow-until N] [--nan-at N]
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn
from torch.nn import functional as F


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=8)
    ap.add_argument("--overflow-until", type=int, default=3)
    ap.add_argument("--nan-at", type=int, default=0)
    args = ap.parse_args()
    if not hasattr(torch, "amp") or not hasattr(torch.amp, "GradScaler"):
        sys.exit(f"amp_mlp.py: torch {torch.__version__} has no torch.amp.GradScaler")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # a scale the gradients overflow at (the loss is ~1e3): the step is skipped
    def scale_for(update: int) -> float:
        return 2.0 ** 127 if update <= args.overflow_until else 1024.0

    scaler = torch.amp.GradScaler("cpu", init_scale=scale_for(1))
    first = next(model.parameters())
    for update in range(1, args.updates + 1):
        x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).float(), y) * 1e3
        if update == args.nan_at:
            loss = loss * float("nan")
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        before = first.detach().clone()
        scaler.step(opt)
        scaler.update(scale_for(update + 1))
        skipped = torch.equal(before, first)  # inf or NaN found: no optimizer step
        print(f"update {update}: loss {loss.item():.4f}{' skipped' if skipped else ''}")


if __name__ == "__main__":
    main()
