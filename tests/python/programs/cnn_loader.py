"""An MNIST-shaped CNN trained with SGD and momentum from a DataLoader with two worker
processes, on a synthetic dataset generated in the workers (no download). Nothing in it
knows candle_trace: `candle-trace run -- python cnn_loader.py` traces it as it is, and
the workers must neither write traces nor break.

With CNN_GRAD_NORMS=FILE set, each update appends ``{"update": n, "norms": {parameter:
|grad|}}`` to FILE, read after backward, so that a test can hold the trace's gradients
to the program's own; with CNN_WORKER_PIDS=FILE, each worker appends its pid.

    python cnn_loader.py [--updates N] [--workers W] [--start-method fork|spawn]
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SyntheticDigits(Dataset):
    """28x28 images whose class is where a bright square sits."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        gen = torch.Generator().manual_seed(i)
        label = i % 10
        img = 0.1 * torch.randn(1, 28, 28, generator=gen)
        row, col = divmod(label, 4)
        img[:, 2 + 6 * row:8 + 6 * row, 2 + 6 * col:8 + 6 * col] += 1.0
        return img, label


def note_worker(worker_id: int) -> None:
    path = os.environ.get("CNN_WORKER_PIDS")
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.25), nn.Linear(16 * 7 * 7, 64),
                                        nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--start-method", default=None, help="fork (Linux's default) or spawn")
    args = ap.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(SyntheticDigits(32 * args.updates), batch_size=32, shuffle=True,
                        num_workers=args.workers, worker_init_fn=note_worker,
                        multiprocessing_context=args.start_method)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    norms_file = os.environ.get("CNN_GRAD_NORMS")
    for update, (x, y) in enumerate(loader, start=1):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        if norms_file:
            norms = {n: float(p.grad.double().norm()) for n, p in model.named_parameters()}
            with open(norms_file, "a") as f:
                f.write(json.dumps({"update": update, "norms": norms}) + "\n")
        opt.step()
        print(f"update {update}: loss {loss.item():.4f}")
    params = sum(p.numel() for p in model.parameters())
    print(f"trained {update} updates of a {params}-parameter CNN with {args.workers} workers")


if __name__ == "__main__":
    main()
