#!/usr/bin/env bash
# The same MLP in candle (bindings/rust/examples/train_mlp.rs) and PyTorch
# (examples/python/train_mlp.py), both captured at update 3, compared with
# candle-trace compare. With --check it also asserts what must hold: both
# traces valid, the identities comparable, and every gradient norm equal to
# within 1e-5 relative error (the two runs draw the same numbers).
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/compare-demo
rm -rf "$out" && mkdir -p "$out"
export CANDLE_TRACE_LIB="$PWD/build/libcandle_trace.so"
PYTHONPATH=bindings/python "${TORCH_PYTHON:-/usr/bin/python3}" examples/python/train_mlp.py "$out/pytorch.jsonl"
(cd bindings/rust && cargo run -q --example train_mlp --features candle -- "../../$out/candle.jsonl")
build/candle-trace validate "$out/candle.jsonl" "$out/pytorch.jsonl"
build/candle-trace compare "$out/candle.jsonl" "$out/pytorch.jsonl"
if [ "${1:-}" = "--check" ]; then
  build/candle-trace compare --json "$out/candle.jsonl" "$out/pytorch.jsonl" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["identity_comparable"] and not d["refused"], d["identity_diffs"]
grads = d["gradients"]
keys = sorted(g["key"] for g in grads)
assert keys == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"], keys
for g in grads:
    assert g["state_a"] == g["state_b"] == "present", g
    assert g["rel_error"] < 1e-5, g
print("compare-demo: candle and PyTorch agree on all %d gradient norms (max rel error %.2g)"
      % (len(grads), max(g["rel_error"] for g in grads)))
'
fi
