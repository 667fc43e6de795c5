"""The ``candle-trace`` console script and ``python -m candle_trace``.

Both exec the Go command bundled in the package (``candle_trace/bin/candle-trace``, built
by setup.py), so arguments, standard streams, signals and the exit status are the
command's own: the Python process is replaced, not kept as a parent. In a source checkout
used through PYTHONPATH the repository's ``build/candle-trace`` is used instead.

One command is handled here, before any exec, because it needs this interpreter's torch:
``candle-trace torch-observer [--build]`` (the PyTorch op observer, see
candle_trace/torch/_observer.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence

COMMAND_NAME = "candle-trace"
PACKAGE_DIR = Path(__file__).resolve().parent
HELP_FLAGS = ("-h", "--help", "help")

TORCH_OBSERVER_USAGE = """\
usage: candle-trace torch-observer [--build]
  the PyTorch op observer of candle_trace.torch for this interpreter's torch
  (compiled once per torch version and ABI into ~/.cache/candle_trace, or
  $CANDLE_TRACE_CACHE): print its path; exit 1 when it is not built yet
  --build  compile it now when it is not built (needs g++, ninja and torch's
           headers), then print its path
"""

PYTHON_SIDE_HELP = """
commands of the Python package (run by this interpreter, which needs torch):
  torch-observer [--build]
        print the path of the compiled PyTorch op observer for this
        interpreter's torch; --build compiles it ahead of the first capture
"""


def command_candidates() -> List[Path]:
    """Where the Go command is looked for, in order: bundled in the package, the
    repository's build/ folder (a source checkout)."""
    paths = [PACKAGE_DIR / "bin" / COMMAND_NAME]
    for parent in PACKAGE_DIR.parents:
        if (parent / "include" / "candle_trace.h").exists():
            paths.append(parent / "build" / COMMAND_NAME)
            break
    return paths


def command_path() -> Path:
    """The Go command; FileNotFoundError naming where it was looked for."""
    candidates = command_candidates()
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(
        f"{COMMAND_NAME}: the Go command is not installed; looked at "
        + ", ".join(str(p) for p in candidates)
        + ". Reinstall the package (pip install path/to/candle-trace/bindings/python builds "
        "it with Go) or, in a checkout, run make cli.")


def torch_observer(args: Sequence[str]) -> int:
    """``candle-trace torch-observer [--build]``: exit status 0 when the observer is
    built (its path on stdout), 1 when it is not or cannot be, 2 on a usage error."""
    if any(a in HELP_FLAGS for a in args):
        sys.stdout.write(TORCH_OBSERVER_USAGE)
        return 0
    unknown = [a for a in args if a != "--build"]
    if unknown:
        sys.stderr.write(f"candle-trace torch-observer: unknown argument {unknown[0]!r}\n"
                         + TORCH_OBSERVER_USAGE)
        return 2
    try:
        import torch  # noqa: F401 - the observer is compiled against this torch
    except ImportError as e:
        sys.stderr.write(f"candle-trace torch-observer: {sys.executable} cannot import "
                         f"torch ({e}); run it with the interpreter your training uses\n")
        return 1
    from .torch import _observer

    if "--build" not in args:
        name, folder = _observer.build_dir()
        built = folder / f"{name}.so"
        if built.is_file() and not (folder / "lock").exists():
            print(built)
            return 0
        sys.stderr.write(f"candle-trace torch-observer: not built yet for torch "
                         f"{torch.__version__} (would be {built}); "
                         "candle-trace torch-observer --build compiles it\n")
        return 1
    try:
        print(_observer.build())
    except Exception as e:  # noqa: BLE001 - compiler, ninja, headers: the message says
        sys.stderr.write(f"candle-trace torch-observer: the build failed: "
                         f"{type(e).__name__}: {e}\n")
        return 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the console script; returns only when it does not exec."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["torch-observer"]:
        return torch_observer(args[1:])
    try:
        command = command_path()
    except FileNotFoundError as e:
        sys.stderr.write(f"{e}\n")
        return 127
    if len(args) == 1 and args[0] in HELP_FLAGS:
        # The Go command's usage, then the commands only this package has.
        sys.stdout.flush()
        status = subprocess.run([str(command), *args]).returncode
        sys.stdout.write(PYTHON_SIDE_HELP)
        return status
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command, [COMMAND_NAME, *args])
    return 127  # not reached: execv returns only by raising
