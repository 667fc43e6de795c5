"""Injected by `candle-trace run` (internal/runner): the first folder on PYTHONPATH
holds this file alone, so Python's ``site`` imports it at start-up in every Python
process of the run.

It costs a script that never imports torch almost nothing: it chains to the
sitecustomize it hides, decides whether this process is the one to trace, and
leaves one finder on ``sys.meta_path`` that waits for ``import torch``. Only then does
it load the integration (``candle_trace.torch._run``), which patches
``torch.optim.Optimizer`` and the module forward hooks.

Which process traces: the first Python process of the run claims the capture (it
sets CANDLE_TRACE_RUN_CLAIM=pid:rank, which its children inherit). A child with the
same $RANK -- a DataLoader worker started by spawn, a subprocess -- sees the claim
and stays out; a child forked after torch loaded checks the pid in every hook. A
torchrun rank has a $RANK of its own, so each rank claims and traces.

Only the standard library here, and little of it (no importlib.util or importlib.abc
before torch is imported: with what they import, 3 to 15 ms of every start-up): this runs
before the program's first line.
"""

import os
import sys

_CLAIM = "CANDLE_TRACE_RUN_CLAIM"


def _chain() -> None:
    """Runs the sitecustomize this file hides (the next one on sys.path), as if ours
    were not there."""
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        __import__("sitecustomize")
    except ImportError as e:
        if e.name != "sitecustomize":
            raise
    finally:
        sys.path[:] = saved
        if ours is not None:  # the program sees the one it would have seen
            sys.modules.setdefault("sitecustomize", ours)
            sys.modules["_candle_trace_run_site"] = ours


def _claims() -> bool:
    """Whether this process takes the capture (see the module's doc)."""
    rank = os.environ.get("RANK", "")
    claim = os.environ.get(_CLAIM)
    if claim is not None and claim.partition(":")[2] == rank:
        return False
    os.environ[_CLAIM] = f"{os.getpid()}:{rank}"
    return True


def _torch_loaded() -> None:
    try:
        from candle_trace.torch import _run
        _run.install()
    except Exception as e:  # noqa: BLE001 - the program runs on, untraced
        print(f"candle-trace run: the PyTorch integration is off in this process: "
              f"{type(e).__name__}: {e}", file=sys.stderr)


class _AfterTorch:
    """A meta path finder that finds nothing itself: on the first ``import torch`` it
    lets the other finders find torch and runs :func:`_torch_loaded` once torch's
    module has executed."""

    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        import importlib.util  # torch's import takes seconds; this, milliseconds

        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def run(module):  # type: ignore[no-untyped-def]
            exec_module(module)
            _torch_loaded()

        loader.exec_module = run
        return spec


_chain()
if _claims():
    if "torch" in sys.modules:
        _torch_loaded()
    else:
        sys.meta_path.insert(0, _AfterTorch())
