"""Writes aggregate-triggers.json: the whole-run summary of a real candle_trace.torch.watch
run in which triggers fired, for `report SUMMARY` and `view SUMMARY`'s trigger lists.

    CANDLE_TRACE_LIB=build/libcandle_trace.so PYTHONPATH=bindings/python \
        build/venv/bin/python internal/report/testdata/aggregate-triggers.py OUT_DIR

30 updates of a small model whose update sleeps 20 ms, at the default triggers and at most
4 traces: update 12 stalls 1 s (slow fires: its value is the update's seconds), the program
calls trigger() at updates 20 and 24 (user), and update 27's loss is NaN (non-finite: the
loss given to backward is multiplied by NaN; its value is the loss, so the scalar counts it
as non-finite). Updates 12, 13 (after it), 20 and 21 are the 4 traces; 24 and 27 fire past
the cap. The summary is OUT_DIR/stats.json, naming the traces relative to OUT_DIR, where
they lie (not part of the fixture)."""

import gc
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

import candle_trace.torch as ctt


class Slow(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        time.sleep(0.02)
        return self.fc2(torch.relu(self.fc1(x)))


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(out)
    torch.manual_seed(0)
    model = Slow()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gc.disable()  # a collection of the interpreter's heap is a slow update of its own
    with ctt.watch(model, opt, "traces", max_traces=4, aggregate_path="stats.json",
                   name="triggers::train") as w:
        for i in range(1, 31):
            opt.zero_grad()
            loss = model(torch.randn(8, 16)).pow(2).mean()
            if i == 27:
                loss = loss * float("nan")
            loss.backward()
            opt.step()
            if i == 12:
                time.sleep(1.0)
            if i in (20, 24):
                w.trigger(f"checkpoint at {i}")
            w.step()
    for f in w.fired:
        print(f.update, f.trigger, f.value, f.threshold, f.trace or f.no_trace)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
