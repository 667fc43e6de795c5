"""One rank of a small DDP job on CPU (gloo), run by torchrun from test_distributed.py.

    python -m torch.distributed.run --nproc_per_node=N ddp_job.py OUT CAPTURE_STEP SLOW_RANK SLEEP_S [SKEW]

Trains an MLP on synthetic data for CAPTURE_STEP + 1 updates under
``candle_trace.torch.profile`` (trace ``OUT/trace-%r.jsonl``, whole-run statistics
``OUT/stats.json``, which the profile turns into ``stats-rank<N>.json``). On the captured
update, rank SLOW_RANK sleeps SLEEP_S seconds inside its forward: the straggler the
others wait for in the gradients' all-reduce (-1: no rank is slow). With SKEW, rank 1
captures update CAPTURE_STEP + SKEW instead: ranks that disagree. Writes ``OUT/facts-<rank>.json`` with what
the test compares the trace against: the DDP buckets' sizes and the parameters' bytes.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import candle_trace.torch as ctt


class Net(nn.Module):
    """An MLP of 1.6 MB of parameters: two DDP buckets at bucket_cap_mb=1."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512),
                                  nn.ReLU(), nn.Linear(512, 10))
        self.delay_s = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay_s:
            time.sleep(self.delay_s)  # the straggler: slow in forward, on one update
        return self.body(x)


def main() -> None:
    out, capture_step, slow_rank, sleep_s = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                             float(sys.argv[4]))
    skew = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    capture_step += skew if rank == 1 else 0
    updates = capture_step + 1 + (skew if rank != 1 else 0)  # the same number everywhere
    torch.manual_seed(0)  # the same weights on every rank, as DDP wants
    net = Net()
    model = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1 + rank)  # each rank its own shard of data
    with ctt.profile(model, opt, os.path.join(out, "trace-%r.jsonl"), capture_step=capture_step,
                     aggregate_path=os.path.join(out, "stats.json")) as prof:
        for update in range(1, updates + 1):
            x = torch.randn(32, 256, generator=gen)
            y = torch.randint(0, 10, (32,), generator=gen)
            net.delay_s = sleep_s if (update == capture_step and rank == slow_rank) else 0.0
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            prof.step()
    logging = model._get_ddp_logging_data()
    facts = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "trace": prof.path,
        "state": prof.state,
        "op_mechanism": prof.op_mechanism,
        "agreement": prof.agreement.result,
        "bucket_bytes": [int(b) for b in str(logging["rebuilt_bucket_sizes"]).split(",")],
        "param_bytes": sum(p.numel() * p.element_size() for p in net.parameters()),
    }
    with open(os.path.join(out, f"facts-{rank}.json"), "w") as f:
        json.dump(facts, f)
    # torch 2.15 aborts a rank at exit now and then when gloo is torn down while another
    # rank is still in its last collective or a DDP reducer outlives the group
    # (tests/python/programs/ddp_ranks.py): every rank past a barrier, the reducer gone
    dist.barrier()
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
