#!/usr/bin/env bash
# The torch tests' second interpreter: a virtualenv with PyPI's torch 2.x, every package
# pinned in bindings/python/requirements-torch2.txt (see there what is in it and why).
#
#   bindings/python/torch2_venv.sh [VENV]      (default build/venv-torch2; make torch2-venv)
#
# Quick when VENV already holds these requirements (VENV/.requirements is their copy);
# otherwise VENV is made anew from Debian's /usr/bin/python3 (python3-venv;
# TORCH2_BASE_PYTHON overrides) and filled offline from a wheel folder that outlives the
# build folder: $CANDLE_TRACE_WHEELS, default ${XDG_CACHE_HOME:-~/.cache}/candle_trace/wheels
# (about 3.5 GB). pip's own HTTP cache stays empty here -- the registry's answers carry no
# caching headers -- so the wheels are downloaded into that folder, once per version.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${1:-build/venv-torch2}"
REQ=bindings/python/requirements-torch2.txt
BASE_PY="${TORCH2_BASE_PYTHON:-/usr/bin/python3}"
WHEELS="${CANDLE_TRACE_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/candle_trace/wheels}"

if [ -x "$VENV/bin/python" ] && cmp -s "$REQ" "$VENV/.requirements"; then
  exit 0
fi
start=$(date +%s)
rm -rf "$VENV"
if ! "$BASE_PY" -m venv "$VENV"; then
  echo "torch2_venv.sh: $BASE_PY -m venv failed (Debian: apt-get install python3-venv)" >&2
  exit 1
fi
mkdir -p "$WHEELS"
install() {  # --no-compile: modules compile on first import (9 s less of 39)
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --no-compile --no-index --find-links "$WHEELS" -r "$REQ" "$@"
}
if ! install 2>/dev/null; then  # some wheel is not in the folder yet
  echo "torch2_venv.sh: downloading the missing wheels into $WHEELS"
  "$VENV/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
    --dest "$WHEELS" -r "$REQ"
  install
fi
"$VENV/bin/python" -c 'import torch, pytest; torch.ones(1).add_(1)'
cp "$REQ" "$VENV/.requirements"
echo "torch2_venv.sh: $VENV ready in $(( $(date +%s) - start )) s: torch" \
  "$("$VENV/bin/python" -c 'import torch; print(torch.__version__)'), $(du -sh "$VENV" | cut -f1)"
