#!/usr/bin/env bash
# Both examples — examples/python/train_mlp.py (PyTorch) and
# bindings/rust/examples/train_mlp.rs (candle) — train for 10,000 updates
# with aggregate statistics on (and update 3 captured), then
# `candle-trace report` shows each summary. With --check it also asserts what
# must hold: every update counted, the summaries final and readable, the
# captures valid, and peak resident memory flat: 10,000 updates may use at
# most 4 MiB more than 1,000 (a leak of 100 bytes per span would add 4.5 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/aggregate-demo
rm -rf "$out" && mkdir -p "$out"
export CANDLE_TRACE_LIB="$PWD/build/libcandle_trace.so"
PY=${TORCH_PYTHON:-/usr/bin/python3}
(cd bindings/rust && cargo build -q --example train_mlp --features candle)
RUST=bindings/rust/target/debug/examples/train_mlp

# maxrss CMD... — runs CMD (stdout to /dev/null), prints its peak RSS in KiB.
maxrss() {
    python3 -c 'import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)
if r.returncode:
    sys.exit("%s exited %d" % (sys.argv[1:], r.returncode))
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' "$@"
}

declare -A rss
for n in 1000 10000; do
    rss[py-$n]=$(PYTHONPATH=bindings/python maxrss "$PY" examples/python/train_mlp.py "$out/py-$n.jsonl" --steps $n --aggregate "$out/py-$n.json")
    rss[rs-$n]=$(maxrss "$RUST" "$out/rs-$n.jsonl" --steps $n --aggregate "$out/rs-$n.json")
done
for lang in py rs; do
    echo "--- $lang: 10,000 updates; peak RSS ${rss[$lang-1000]} KiB at 1,000 updates, ${rss[$lang-10000]} KiB at 10,000"
    build/candle-trace report "$out/$lang-10000.json"
done

if [ "${1:-}" = "--check" ]; then
    build/candle-trace validate "$out/py-10000.jsonl" "$out/rs-10000.jsonl"
    for lang in py rs; do
        grow=$(( ${rss[$lang-10000]} - ${rss[$lang-1000]} ))
        if [ "$grow" -gt 4096 ]; then
            echo "aggregate-demo: $lang grew by $grow KiB from 1,000 to 10,000 updates (limit 4096)" >&2
            exit 1
        fi
        build/candle-trace report --json "$out/$lang-10000.json" | python3 -c '
import json, sys
lang = sys.argv[1]
d = json.load(sys.stdin)
spans = {s["name"]: s for s in d["spans"]}
assert d["final"], "summary not final"
assert spans["train/step"]["count"] == 10000, spans["train/step"]
assert all(s["count"] == 10000 for s in spans.values()), {n: s["count"] for n, s in spans.items()}
loss = [s for s in d["scalars"] if s["label"] == "loss"]
assert loss and loss[0]["count"] == 10000, d["scalars"]
print("aggregate-demo: %s counted %d spans x 10000 updates, loss over 10000" % (lang, len(spans)))
' "$lang"
    done
fi
