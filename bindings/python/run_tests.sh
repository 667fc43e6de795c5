#!/usr/bin/env bash
# Tests of the Python binding against the real library:
#   - without torch, under python3 (any Python >= 3.8 with pytest);
#   - with torch, under /usr/bin/python3 (Debian's python3-torch 1.13 installs there only),
#     or $TORCH_PYTHON.
# Needs build/libcandle_trace.so, build/candle-trace and build/tools/bin/candle-graph.
# The op observer (candle_trace/torch/_observer.cpp) is compiled on first use into
# $CANDLE_TRACE_CACHE (default ~/.cache/candle_trace) and needs g++, ninja-build and
# libtorch-dev; without them its tests are skipped and the dispatch-mode fallback is
# tested. CANDLE_TRACE_REQUIRE_OBSERVER=1 (CI) turns a missing toolchain into failures.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
export CANDLE_TRACE_LIB="${CANDLE_TRACE_LIB:-$PWD/build/libcandle_trace.so}"
PY="${PYTHON:-python3}"
TORCH_PY="${TORCH_PYTHON:-/usr/bin/python3}"

"$PY" -m pytest -q -p no:cacheprovider bindings/python/tests/test_abi_mirror.py \
  bindings/python/tests/test_session.py bindings/python/tests/test_session_misuse.py

if "$TORCH_PY" -c "import torch, pytest" 2>/dev/null; then
  "$TORCH_PY" -m pytest -q -p no:cacheprovider bindings/python/tests/test_torch.py \
    bindings/python/tests/test_torch_trust.py \
    bindings/python/tests/test_torch_observer.py
else
  echo "run_tests.sh: $TORCH_PY has no torch or pytest (apt-get install python3-torch python3-pytest)" >&2
  exit 1
fi
