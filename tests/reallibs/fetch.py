#!/usr/bin/env python3
"""Fetch NVIDIA's real libcupti and libnvidia-ml for the no-GPU tests.

Neither library needs a GPU to load: libcupti answers cuptiGetTimestamp and
refuses cuptiSubscribe with CUPTI_ERROR_NOT_INITIALIZED, libnvidia-ml answers
nvmlInit with NVML_ERROR_DRIVER_NOT_LOADED. That is enough to test, without a
GPU, what the fakes cannot: that every symbol the collectors bind exists in
the shipped libraries, that libcupti is found where its Python package puts
it, how CUPTI's clock relates to the session's, and the errors a user on a
machine without a driver sees.

    python3 tests/reallibs/fetch.py build/reallibs

writes
    build/reallibs/site/nvidia/cuda_cupti/lib/libcupti.so.12   (a site-packages
        layout, as `pip install nvidia-cuda-cupti-cu12` leaves it)
    build/reallibs/site13/nvidia/cu13/lib/libcupti.so.13       (CUDA 13's, as
        `pip install nvidia-cuda-cupti` leaves it)
    build/reallibs/nvml/libnvidia-ml.so.1                       (Debian's driver
        userspace library, non-free, any current 535 release)

Only PyPI and deb.debian.org are contacted. The Debian package is checked
against the SHA-256 its Packages index lists. Existing files are kept.
"""
from __future__ import annotations

import hashlib
import io
import lzma
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path

# (wheel, the library in it, the site-packages folder it goes to)
CUPTIS = [
    ("nvidia-cuda-cupti-cu12==12.9.79", "nvidia/cuda_cupti/lib/libcupti.so.12", "site"),  # CUDA 12
    ("nvidia-cuda-cupti==13.5.25", "nvidia/cu13/lib/libcupti.so.13", "site13"),         # CUDA 13
]
DEBIAN = "http://deb.debian.org/debian"
SUITE = "bookworm"
NVML_PACKAGE = "libnvidia-ml1"


def debian_arch() -> str:
    m = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(m, m)


def fetch_cupti(out: Path, wheel_spec: str, member: str, site: str) -> Path:
    dest = out / site / member
    if dest.exists():
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "--dest", tmp, wheel_spec],
            check=True,
        )
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            dest.parent.mkdir(parents=True, exist_ok=True)
            part = dest.with_suffix(".part")
            with open(part, "wb") as dst:
                shutil.copyfileobj(src, dst)
            part.rename(dest)
    return dest


def packages_entry(arch: str, package: str) -> dict[str, str]:
    url = f"{DEBIAN}/dists/{SUITE}/non-free/binary-{arch}/Packages.xz"
    with urllib.request.urlopen(url, timeout=60) as r:
        text = lzma.decompress(r.read()).decode("utf-8", "replace")
    for stanza in text.split("\n\n"):
        fields = {}
        for line in stanza.splitlines():
            if line and not line[0].isspace() and ":" in line:
                k, v = line.split(":", 1)
                fields[k] = v.strip()
        if fields.get("Package") == package:
            return fields
    raise SystemExit(f"{package} is not in {url}")


def deb_data(deb: bytes) -> tarfile.TarFile:
    """The data.tar.* member of a .deb (an ar archive), opened."""
    if not deb.startswith(b"!<arch>\n"):
        raise SystemExit("not a Debian package")
    pos = 8
    while pos + 60 <= len(deb):
        name = deb[pos:pos + 16].decode().strip().rstrip("/")
        size = int(deb[pos + 48:pos + 58].decode().strip())
        body = deb[pos + 60:pos + 60 + size]
        if name.startswith("data.tar"):
            return tarfile.open(fileobj=io.BytesIO(body))  # bookworm's are xz; tarfile reads xz and gz
        pos += 60 + size + (size & 1)
    raise SystemExit("no data.tar in the Debian package")


def fetch_nvml(out: Path) -> Path:
    dest = out / "nvml" / "libnvidia-ml.so.1"
    if dest.exists():
        return dest
    entry = packages_entry(debian_arch(), NVML_PACKAGE)
    with urllib.request.urlopen(f"{DEBIAN}/{entry['Filename']}", timeout=120) as r:
        deb = r.read()
    if hashlib.sha256(deb).hexdigest() != entry["SHA256"]:
        raise SystemExit(f"{entry['Filename']}: SHA-256 does not match the Packages index")
    with deb_data(deb) as tar:
        libs = [m for m in tar.getmembers() if m.isfile() and "/libnvidia-ml.so." in m.name]
        if len(libs) != 1:
            raise SystemExit(f"expected one libnvidia-ml.so.* in {entry['Filename']}, found {[m.name for m in libs]}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_suffix(".part")
        with tar.extractfile(libs[0]) as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst)
        part.rename(dest)
    (dest.parent / "VERSION").write_text(f"{NVML_PACKAGE} {entry['Version']}\n")
    return dest


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/reallibs")
    for p in [fetch_cupti(out, *c) for c in CUPTIS] + [fetch_nvml(out)]:
        print(f"{p} ({os.path.getsize(p)} bytes)")


if __name__ == "__main__":
    main()
