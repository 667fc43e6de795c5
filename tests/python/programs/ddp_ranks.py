"""A two-layer model trained with DistributedDataParallel over gloo (CPU), each rank on
its own synthetic data, as `torchrun --nproc_per_node 2 ddp_ranks.py` starts it. Nothing
in it knows candle_trace: under `candle-trace run -- torchrun ...` each rank writes its
own trace, named with its rank. The all-reduce makes every rank's gradients the mean of
all ranks', so the ranks' traces must hold equal gradient norms.

With DDP_RANKS_NAN_RANK=R, rank R's input of update 3 is NaN: its loss alone is not
finite there (the other rank's stays finite, while the all-reduce gives both NaN
gradients), for `candle-trace run --watch` to keep that rank's update and no other."""

from __future__ import annotations

import gc
import os

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # DDP broadcasts rank 0's parameters anyway
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    nan_rank = int(os.environ.get("DDP_RANKS_NAN_RANK", "-1"))
    for update in range(1, 5):
        opt.zero_grad()
        x = torch.randn(4, 8, generator=data)
        if rank == nan_rank and update == 3:
            x[0, 0] = float("nan")
        model(x).pow(2).mean().backward()
        opt.step()
    print(f"rank {rank} of {dist.get_world_size()} done")
    # Every rank past its last all-reduce, and its DDP reducer gone, before any tears
    # gloo down: torch 2.15 itself aborts a rank at exit otherwise ("terminate called
    # without an active exception"): with neither, 3 of 20 plain torchrun runs beside two
    # CPU hogs; with the barrier alone still 2 of 15 plain and 2 of 15 traced beside one
    # hog (and a clean-clone CI run); with both, 0 of 20 plain and 0 of 20 traced
    dist.barrier()
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
