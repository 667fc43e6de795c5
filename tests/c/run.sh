#!/usr/bin/env bash
# tests/c/run.sh BUILD_DIR — the C side of `make test`.
#
#   1. runs BUILD_DIR/test_abi into a fresh folder;
#   2. checks every valid-*.jsonl it wrote with candle-graph (each alone in a
#      fresh folder, `summary --require-valid` must exit 0 and report a
#      structurally valid, complete capture);
#   3. checks every failed-*.jsonl is a readable, structurally valid trace
#      that --require-valid refuses only because the capture failed;
#   4. runs the demo (BUILD_DIR/train_step) and checks its trace;
#   5. runs test_abi again under LD_BIND_NOW=1 and checks its traces again;
#   6. runs BUILD_DIR/test_aggregate with each tick source (the cycle counter,
#      CLOCK_MONOTONIC) and reads every summary it wrote with
#      `candle-trace report` (format, counts equal to their buckets).
#
# candle-graph comes from $CANDLE_GRAPH (default build/tools/bin/candle-graph).
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 BUILD_DIR" >&2
    exit 2
fi
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "$1" && pwd)
CANDLE_GRAPH=${CANDLE_GRAPH:-$ROOT/build/tools/bin/candle-graph}
case $CANDLE_GRAPH in /*) ;; *) CANDLE_GRAPH=$ROOT/$CANDLE_GRAPH ;; esac
# Fewer than this many valid-*.jsonl means test_abi lost a test, not that all is well.
MIN_VALID=10

for f in "$BUILD/test_abi" "$BUILD/test_aggregate" "$BUILD/train_step" "$BUILD/candle-trace" "$CANDLE_GRAPH"; do
    if [ ! -x "$f" ]; then
        echo "run.sh: $f is missing (make $(basename "$f") / make tools)" >&2
        exit 2
    fi
done
command -v python3 >/dev/null || { echo "run.sh: python3 is needed to read candle-graph's JSON" >&2; exit 2; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/candle-trace-c.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
FAILURES=0
CHECKED=0

fail() {
    echo "FAIL: $*" >&2
    FAILURES=$((FAILURES + 1))
}

# health FILE.json EXPECT_COMPLETE — prints why the summary is not as expected.
health() {
    python3 - "$1" "$2" <<'EOF'
import json, sys
path, want_complete = sys.argv[1], sys.argv[2] == "1"
try:
    h = json.load(open(path))["health"]
except Exception as e:  # noqa: BLE001 - any unreadable summary is a failure
    print(f"summary is not candle-graph JSON: {e}")
    sys.exit(1)
errors = [f"{i['code']}: {i['message']}" for i in h.get("issues", []) if i.get("severity") == "error"]
problems = []
if h.get("structurally_valid") is not True:
    problems.append("structurally_valid is not true")
if errors:
    problems.append("errors: " + "; ".join(errors))
if h.get("capture_complete") is not want_complete:
    problems.append(f"capture_complete is {h.get('capture_complete')}, want {want_complete}")
if not want_complete and not any(i.get("code") == "capture_failed" for i in h.get("issues", [])):
    problems.append("no capture_failed issue")
if problems:
    print(" / ".join(problems))
    sys.exit(1)
EOF
}

# check_valid TRACE — alone in a fresh folder, --require-valid must pass.
check_valid() {
    local trace=$1 dir name why rc
    name=$(basename "$trace")
    dir=$(mktemp -d "$TMP/cg.XXXXXX")
    cp "$trace" "$dir/$name"
    rc=0
    (cd "$dir" && "$CANDLE_GRAPH" summary "$name" --require-valid >summary.json 2>stderr.txt) || rc=$?
    CHECKED=$((CHECKED + 1))
    if [ "$rc" -ne 0 ]; then
        fail "$trace: candle-graph summary --require-valid exited $rc: $(head -c 600 "$dir/stderr.txt")"
        health "$dir/summary.json" 1 >&2 || true
        return
    fi
    if ! why=$(health "$dir/summary.json" 1); then
        fail "$trace: $why"
    fi
}

# check_failed TRACE — parses and is structurally valid; refused by
# --require-valid only because the capture failed.
check_failed() {
    local trace=$1 dir name why rc
    name=$(basename "$trace")
    dir=$(mktemp -d "$TMP/cg.XXXXXX")
    cp "$trace" "$dir/$name"
    rc=0
    (cd "$dir" && "$CANDLE_GRAPH" summary "$name" --require-valid >summary.json 2>stderr.txt) || rc=$?
    CHECKED=$((CHECKED + 1))
    if [ "$rc" -eq 0 ]; then
        fail "$trace: --require-valid accepted a failed capture"
        return
    fi
    if ! grep -q "capture_complete is false" "$dir/stderr.txt"; then
        fail "$trace: --require-valid refused it for another reason: $(head -c 600 "$dir/stderr.txt")"
        return
    fi
    if ! why=$(health "$dir/summary.json" 0); then
        fail "$trace: $why"
    fi
    rc=0
    (cd "$dir" && "$CANDLE_GRAPH" summary "$name" >plain.json 2>plain.txt) || rc=$?
    if [ "$rc" -ne 0 ]; then
        fail "$trace: candle-graph summary (without --require-valid) exited $rc: $(head -c 600 "$dir/plain.txt")"
    fi
}

# run_test_abi LABEL [ENV=VALUE...] — runs test_abi and checks its traces.
run_test_abi() {
    local label=$1 out log rc last nvalid nfailed
    shift
    out="$TMP/$label"
    log="$TMP/$label.log"
    echo "--- test_abi ($label)"
    rc=0
    env "$@" timeout 300 "$BUILD/test_abi" "$out" >"$log" 2>&1 || rc=$?
    grep -E '^(FAIL|note)' "$log" >&2 || true
    last=$(tail -n 1 "$log")
    echo "$last"
    if [ "$rc" -ne 0 ]; then
        fail "test_abi ($label) exited $rc"
    fi
    if ! [[ $last =~ ^test_abi:\ [0-9]+\ passed,\ 0\ failed$ ]]; then
        fail "test_abi ($label): last line is \"$last\", want \"test_abi: N passed, 0 failed\""
    fi
    nvalid=0
    nfailed=0
    shopt -s nullglob
    for t in "$out"/valid-*.jsonl; do
        check_valid "$t"
        nvalid=$((nvalid + 1))
    done
    for t in "$out"/failed-*.jsonl; do
        check_failed "$t"
        nfailed=$((nfailed + 1))
    done
    shopt -u nullglob
    echo "checked $nvalid valid-*.jsonl and $nfailed failed-*.jsonl with candle-graph"
    if [ "$nvalid" -lt "$MIN_VALID" ]; then
        fail "test_abi ($label) wrote only $nvalid valid-*.jsonl traces (want >= $MIN_VALID)"
    fi
    if [ "$nfailed" -lt 1 ]; then
        fail "test_abi ($label) wrote no failed-*.jsonl trace"
    fi
}

# test_abi expects ct_device_start to find no NVML; on a machine with the
# driver, point it at a library that does not exist (tests/gpu covers the GPU).
export CANDLE_TRACE_NVML_LIB=/nonexistent/libnvidia-ml.so.1

run_test_abi default

echo "--- demo"
mkdir -p "$TMP/demo"
rc=0
timeout 60 "$BUILD/train_step" "$TMP/demo/demo.jsonl" || rc=$?
if [ "$rc" -ne 0 ]; then
    fail "train_step exited $rc"
elif [ ! -s "$TMP/demo/demo.jsonl" ]; then
    fail "train_step wrote no trace"
else
    check_valid "$TMP/demo/demo.jsonl"
fi

run_test_abi bind-now LD_BIND_NOW=1

# run_test_aggregate LABEL [ENV=VALUE...] — runs test_aggregate, reads its summaries.
run_test_aggregate() {
    local label=$1 out log rc last n=0
    shift
    out="$TMP/aggregate-$label"
    log="$TMP/aggregate-$label.log"
    echo "--- test_aggregate ($label)"
    rc=0
    env "$@" timeout 300 "$BUILD/test_aggregate" "$out" >"$log" 2>&1 || rc=$?
    grep -E '^(FAIL|note)' "$log" >&2 || true
    last=$(tail -n 1 "$log")
    echo "$last"
    if [ "$rc" -ne 0 ] || ! [[ $last =~ ^test_aggregate:\ [0-9]+\ passed,\ 0\ failed$ ]]; then
        fail "test_aggregate ($label) exited $rc: \"$last\""
    fi
    for f in "$out"/*.json; do
        if ! "$BUILD/candle-trace" report "$f" >"$f.report" 2>&1; then
            fail "candle-trace report $f: $(head -c 600 "$f.report")"
        fi
        n=$((n + 1))
    done
    if [ "$n" -lt 10 ]; then
        fail "test_aggregate ($label) wrote $n summaries, want 10"
    fi
    echo "read $n summaries with candle-trace report"
}

run_test_aggregate counter
run_test_aggregate monotonic CANDLE_TRACE_AGG_CLOCK=monotonic

echo "--- C tests: $CHECKED traces checked with candle-graph, $FAILURES failure(s)"
if [ "$FAILURES" -ne 0 ]; then
    exit 1
fi
