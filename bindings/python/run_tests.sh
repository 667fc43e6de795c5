#!/usr/bin/env bash
# Tests of the Python binding against the real library:
#   - without torch, under $PYTHON (default build/venv/bin/python: make setup; any
#     Python >= 3.8 with pytest);
#   - with torch, under each interpreter of $TORCH_PYTHONS, by default two:
#     build/venv/bin/python (a venv over /usr/bin/python3 with its site-packages, so
#     Debian's python3-torch 1.13 is its torch) and build/venv-torch2/bin/python
#     (PyPI's torch 2.x: make torch2-venv). TORCH_PYTHON=PY runs them under PY alone.
# Needs build/libcandle_trace.so, build/candle-trace and build/tools/bin/candle-graph.
# The op observer (candle_trace/torch/_observer.cpp) is compiled on first use into
# $CANDLE_TRACE_CACHE (default ~/.cache/candle_trace) and needs g++, ninja (Debian's
# ninja-build, or the virtualenv's) and torch's headers (Debian: libtorch-dev); without
# them its tests are skipped and the dispatch-mode fallback is tested.
# CANDLE_TRACE_REQUIRE_OBSERVER=1 (CI) turns a missing toolchain into failures.
# test_distributed.py runs gloo DDP jobs of 2 and 4 ranks with torchrun on 127.0.0.1
# (about 30-40 s per interpreter on 2 cores) and exports the 2-rank one to the OpenTelemetry
# Collector of the tests ($CANDLE_TRACE_OTELCOL, default build/tools/otelcol/otelcol: make
# otelcol; missing, its test is skipped, under CI=true it fails).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
export CANDLE_TRACE_LIB="${CANDLE_TRACE_LIB:-$PWD/build/libcandle_trace.so}"
PY="${PYTHON:-build/venv/bin/python}"
if [ -n "${TORCH_PYTHON:-}" ]; then
  TORCH_PYS="$TORCH_PYTHON"
else
  TORCH_PYS="${TORCH_PYTHONS:-build/venv/bin/python build/venv-torch2/bin/python}"
fi

"$PY" -m pytest -q -p no:cacheprovider bindings/python/tests/test_abi_mirror.py \
  bindings/python/tests/test_session.py bindings/python/tests/test_session_misuse.py

for tpy in $TORCH_PYS; do
  if ! "$tpy" -c "import torch, pytest" 2>/dev/null; then
    case "$tpy" in
      */venv-torch2/*) hint="make torch2-venv" ;;
      */venv/*) hint="make setup: Debian's python3-torch and python3-pytest, build/venv" ;;
      *) hint="apt-get install python3-torch python3-pytest" ;;
    esac
    echo "run_tests.sh: $tpy has no torch or pytest ($hint)" >&2
    exit 1
  fi
  echo "run_tests.sh: torch $("$tpy" -c 'import torch; print(torch.__version__)') under $tpy"
  # The interpreter's bin first: a virtualenv's ninja builds the observer.
  PATH="$(cd "$(dirname "$tpy")" && pwd):$PATH" "$tpy" -m pytest -q -p no:cacheprovider \
    bindings/python/tests/test_torch.py bindings/python/tests/test_torch_trust.py \
    bindings/python/tests/test_torch_observer.py bindings/python/tests/test_torch_compile.py \
    bindings/python/tests/test_torch_watch.py bindings/python/tests/test_torch_triggers.py \
    bindings/python/tests/test_torch_stats.py bindings/python/tests/test_torch_module_spans.py \
    bindings/python/tests/test_run.py \
    bindings/python/tests/test_distributed.py
done
