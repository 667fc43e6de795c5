"""The device side of a capture: the CUDA collectors (CUPTI kernels, NVML samples) around
the captured update and samples of torch's caching allocator."""

from __future__ import annotations

from typing import List, Sequence

import torch

from ..session import CandleTraceError, Session
from ._common import torch_grad, warn_once

__all__ = ["Device", "WARMUP_SPAN"]

#: the span of the tracer's own CUDA work before the update (see Device.warm)
WARMUP_SPAN = "candle_trace/cupti_warmup"


class Device:
    """The model's device as the capture sees it."""

    def __init__(self, device: str, collect: Sequence[str]) -> None:
        self.device = device
        #: the device collectors asked for; ``collecting`` says which started
        self.collect: List[str] = list(collect)
        self.collecting: List[str] = []
        self._cuda_named = device.startswith("cuda")  # sample() runs inside the update

    @property
    def cuda(self) -> bool:
        """Whether the model's device is a CUDA device this process can use."""
        return self.device.startswith("cuda") and torch.cuda.is_available()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(torch.device(self.device))

    def start(self, session: Session) -> None:
        """Starts the asked-for collectors before the captured update (CUPTI's start-up
        takes tens of milliseconds). Work still running from the update before is waited
        for first: it would come out unattributed. Autograd launches backward kernels
        from its own thread: they go to the span the main thread is in."""
        want = list(self.collect)
        if not want:
            return
        self.sync()
        while want:
            try:
                session.device_start({"collect": want, "unspanned_launches": "main_thread"})
                self.collecting = want
                return
            except CandleTraceError as e:
                # Without CUPTI (another profiler holds it, no libcupti) keep the rest.
                if "cupti" in want and len(want) > 1 and "CUPTI" in e.message:
                    warn_once("collect-cupti", f"device collector cupti not started: {e.message}")
                    want = [c for c in want if c != "cupti"]
                    continue
                warn_once("collect", f"device collectors {want} not started: {e.message}")
                return

    def warm(self, session: Session) -> None:
        """CUPTI's first launch on each thread after its start is slower (0.3-0.6 ms on
        an H200 VM, 0.2 ms without CUPTI): in the update, that stalled its first forward
        and its first backward launch (on autograd's thread), and a 2.2 ms step measured
        3.0. One small backward on the device, in a span of its own before the update,
        makes both threads' first launches -- its few kernels are in the trace, named.
        Call it outside the tracer's brackets (its span takes program time, before the
        update); a failure only warns."""
        if "cupti" not in self.collecting or not self.cuda:
            return
        dev = torch.device(self.device)
        try:
            with session.span(WARMUP_SPAN):
                w = torch.ones(1, device=dev, requires_grad=True)
                torch_grad((w * 2).sum(), w)
                torch.cuda.synchronize(dev)
        except Exception as e:  # noqa: BLE001 - a warm-up, not the program's work
            warn_once("cupti-warmup", f"CUPTI warm-up before the update failed: {e}")

    def stop(self, session: Session) -> None:
        if not self.collecting:
            return
        self.sync()  # every kernel of the update has ended: none comes out incomplete
        self.collecting = []
        session.device_stop()

    def sample(self, session: Session) -> None:
        """One device_memory sample of torch's caching allocator (CUDA only)."""
        if not (self._cuda_named and self.cuda):
            return
        dev = torch.device(self.device)
        session.record_device_memory(self.device, used_bytes=torch.cuda.memory_allocated(dev),
                                     reserved_bytes=torch.cuda.memory_reserved(dev))
