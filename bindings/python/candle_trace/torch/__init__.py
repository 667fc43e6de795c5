"""candle_trace.torch: capture one update of a PyTorch training loop.

    import candle_trace.torch

    with candle_trace.torch.profile(model, optimizer, "trace.jsonl", capture_step=3) as prof:
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            prof.step()

(or ``prof = profile(...); prof.start()`` ... ``prof.stop()`` around a loop you would
rather not re-indent). Only the ``capture_step``-th update is captured (the one after
``capture_step - 1`` calls of ``prof.step()``); every hook is installed at the
``prof.step()`` before it and removed when it ends, so the other updates run untouched.
The captured update holds:

- the measured region ``update``: from the model's first forward with gradients on (a
  ``no_grad`` evaluation before it is not part of it) to ``prof.step()``; with
  ``phase="infer"``, from the step's first forward to ``prof.step()``;
- module spans (kind module) in forward (step forward; a forward with gradients off
  inside the update is ``<name> [no_grad]``) and backward (step backward), the
  ``backward`` call (step backward) and the optimizer step (step optimizer);
- every aten op (name, output shape, dtype, device, duration, input/output tensor ids)
  with data edges from each input to the output. The mechanism is a C++
  ``at::RecordFunction`` observer (``_observer.cpp``, compiled against the installed torch
  on first use and cached; no Python runs per op), or, when it cannot be built (no C++
  compiler, ninja or torch headers: one warning), a Python ``TorchDispatchMode``.
  ``CANDLE_TRACE_TORCH_OPS=dispatch`` forces the dispatch mode, ``=observer`` makes an
  unavailable observer an error; ``profile.op_mechanism`` says which one ran;
- tensor statistics of the loss and of each module's output (a float32 CPU tensor is
  reduced by the library straight from its memory; others with torch on their device);
- one gradient event per named parameter that requires grad, under a gradient contract
  that claims only what is known (see ``_gradients``: every family data_conditional
  unless ``gradient_families`` says more; a broken claim is a warning at the end);
- memory: allocation and free of op outputs' storages (CPU), and on CUDA device_memory
  samples of the caching allocator (reserved and allocated bytes).

Honest timing: everything the tracer does inside the program (hooks' bookkeeping, the
observer's per-op work, statistics, gradient norms, writing records) is left out of the
session clock (``ct_tracer_begin``/``ct_tracer_end``), so spans measure the model; the
measured span's end and the terminal state how much was left out (``tracer_ns``), and
``candle-trace report`` shows it.

Failures keep their evidence: an exception inside the captured update (an
out-of-memory, a KeyboardInterrupt) ends the trace as ``failed`` with the exception's
type and message, holding every op, memory event, span and statistic recorded up to it,
and a device-memory sample at the failure on CUDA. An exception after the capture leaves
the complete trace complete. An error inside the tracer itself fails the capture with the
reason and never reaches the training loop.

Both modes in one run: with ``aggregate_path``, a second session (``"mode": "aggregate"``,
a ``candle-trace/aggregate/1`` summary, docs/aggregate-format.md) stays open for the whole
loop and folds, for every update, cheap whole-run hooks into O(1)-memory statistics:

- ``<prefix>/forward`` (step forward): the model's ``forward`` (an instance wrapper);
- ``<prefix>/backward`` (step backward): ``torch.autograd.backward`` (``loss.backward()``);
- ``<prefix>/optimizer`` (step optimizer): ``optimizer.step``;
- ``<prefix>/step``: the update, from its first forward to ``prof.step()``, which
  encloses the phases (``candle-trace report SUMMARY`` leaves it out of the shares by
  default);
- ``<prefix>/data``: from ``prof.step()`` (or the profile's start) to the next update's
  forward -- the input pipeline, ``zero_grad`` and whatever else the loop does there;
- the scalar ``loss`` (the 1-element tensor given to backward, read after ``prof.step()``;
  on CUDA that read synchronizes once per update: ``aggregate_loss=False`` turns it off).

``<prefix>`` is ``aggregate_prefix`` (default ``train``). The captured update is counted
too (its phases carry the capture's cost: see their max). No per-module or per-op hook runs
outside the captured update. The summary is rewritten every ``aggregate_interval_ms``
(default 10 s) and at exit, also when the loop raised or the capture failed.

The parts, each in its own module: ``_profile`` (which update; the run), ``_capture`` (one
update into one trace), ``_modules`` (module spans), ``_ops`` (aten ops and memory),
``_spans`` (span stacks and the tracer's brackets), ``_stats``, ``_gradients``,
``_device`` (CUDA collectors and allocator samples), ``_aggregate`` (whole-run statistics),
``_distributed`` (many ranks under torchrun: the rank in file names, the same capture step
and start on every rank; collectives are ops the observer records).
"""

from __future__ import annotations

from ..session import CandleTraceError  # noqa: F401 - raised by profile
from ._common import DTYPES
from ._profile import profile
from ._stats import tensor_stats
from ._triggers import Fired, Triggers
from ._watch import watch

__all__ = ["profile", "watch", "Triggers", "Fired", "tensor_stats", "DTYPES"]
