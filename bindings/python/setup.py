"""Build hook of the candle_trace package: bundles the native pieces into it.

``pip install bindings/python`` (or ``pip wheel``) builds, with Go, from the repository
this folder lives in (``bindings/python`` -> the repository root, two levels up):

    candle_trace/libcandle_trace.so          the library the ctypes binding loads
    candle_trace/libcandle_trace_preload.so  the LD_PRELOAD drop-in shim
    candle_trace/bin/candle-trace            the command (the console script execs it)

through the repository's Makefile (``make lib cli build/libcandle_trace_preload.so``),
so the flags (the exports' version script) are defined once. The wheel is tagged for
this platform only (py3-none-<platform>): it holds machine code but no CPython
extension, so any Python 3 on the same platform can use it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional, Tuple

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
# (file the Makefile builds under REPO/build, where it goes inside the package)
BUNDLED: List[Tuple[str, str]] = [
    ("libcandle_trace.so", "libcandle_trace.so"),
    ("libcandle_trace_preload.so", "libcandle_trace_preload.so"),
    ("candle-trace", "bin/candle-trace"),
]
MAKE_TARGETS = ["lib", "cli", "build/libcandle_trace_preload.so"]


class NativeBuildError(RuntimeError):
    """A tool or the sources needed to build the bundled native files are missing."""


def required_go_version() -> str:
    """The Go version go.mod asks for ("1.26")."""
    match = re.search(r"^go\s+(\d+\.\d+)", (REPO / "go.mod").read_text(), re.MULTILINE)
    return match.group(1) if match else "1.26"


def version_tuple(text: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:2])


def check_sources() -> None:
    missing = [p for p in ("go.mod", "cmd/libtrace", "cmd/candle-trace", "cmd/preload/preload.c",
                           "Makefile") if not (REPO / p).exists()]
    if missing:
        raise NativeBuildError(
            f"candle_trace: the repository's sources are not at {REPO} (missing: "
            f"{', '.join(missing)}). This package bundles libcandle_trace.so and the "
            "candle-trace command, built with Go from a checkout of the repository: install "
            "it from there (pip install path/to/candle-trace/bindings/python), not from a "
            "copy of bindings/python alone or an sdist.")


def check_tools() -> Tuple[str, str]:
    """(go, make) executables; a clear error naming the one that is missing."""
    need = required_go_version()
    go = shutil.which(os.environ.get("GO", "go"))
    if go is None:
        raise NativeBuildError(
            f"go not found: building libcandle_trace.so needs Go >= {need} "
            "(https://go.dev/dl; or set GO to its path)")
    have = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True).stdout.strip()
    if version_tuple(have) < version_tuple(need):
        raise NativeBuildError(
            f"{go} is {have or 'of unknown version'}: building libcandle_trace.so needs "
            f"Go >= {need} (https://go.dev/dl; or set GO to a newer one)")
    make = shutil.which(os.environ.get("MAKE", "make"))
    if make is None:
        raise NativeBuildError(
            "make not found: building libcandle_trace.so goes through the repository's "
            "Makefile (Debian: apt-get install make)")
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise NativeBuildError(
            f"C compiler {cc!r} not found: cgo and the drop-in shim need one "
            "(Debian: apt-get install gcc; or set CC)")
    return go, make


def build_native(go: str, make: str) -> None:
    env = dict(os.environ)
    # pip or an outer make may pass jobserver flags that are not for this make.
    for var in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL"):
        env.pop(var, None)
    cmd = [make, "-C", str(REPO), f"GO={go}", *MAKE_TARGETS]
    print("candle_trace: building the native library and command:", " ".join(cmd), flush=True)
    result = subprocess.run(cmd, env=env)
    if result.returncode != 0:
        raise NativeBuildError(
            f"candle_trace: `{' '.join(cmd)}` failed (exit {result.returncode}); its output "
            "above says why")


class BuildPyWithNative(build_py):
    """build_py that also builds and copies the bundled native files."""

    def run(self) -> None:
        # pip builds in place: a module deleted from the sources must not live on in
        # the wheel from an earlier build's copy.
        shutil.rmtree(Path(self.build_lib) / "candle_trace", ignore_errors=True)
        super().run()
        check_sources()
        go, make = check_tools()
        build_native(go, make)
        package = Path(self.build_lib) / "candle_trace"
        for built, inside in BUNDLED:
            source = REPO / "build" / built
            if not source.is_file():
                raise NativeBuildError(f"candle_trace: the build left no {source}")
            target = package / inside
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)  # copy2 keeps the command's executable bit


class NativeDistribution(Distribution):
    """Says it holds platform code, so the files install into platlib at the wheel's
    root (and the wheel is not marked pure) although no Python extension is built."""

    def has_ext_modules(self) -> bool:
        return True


def platform_wheel() -> Optional[type]:
    """bdist_wheel tagged py3-none-<platform>, or None where no bdist_wheel exists
    (setup.py is also run to build an sdist, without the wheel package)."""
    try:
        from setuptools.command.bdist_wheel import bdist_wheel
    except ImportError:  # setuptools < 70.1 has it in the wheel package
        try:
            from wheel.bdist_wheel import bdist_wheel
        except ImportError:
            return None

    class PlatformWheel(bdist_wheel):  # type: ignore[misc, valid-type]
        # Not cpXY-cpXY: nothing in the package links libpython, so one wheel serves
        # every Python 3 on the platform.
        def get_tag(self) -> Tuple[str, str, str]:
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    return PlatformWheel


cmdclass = {"build_py": BuildPyWithNative}
wheel_command = platform_wheel()
if wheel_command is not None:
    cmdclass["bdist_wheel"] = wheel_command

setup(cmdclass=cmdclass, distclass=NativeDistribution)
