#!/usr/bin/env bash
# tests/rust_dependent/run.sh — a crate depending on bindings/rust builds and runs with
# nothing set up by hand (part of make test-rust).
#
#   1. without Go (GO=/nonexistent/go) and with a CANDLE_TRACE_LIB_DIR holding no
#      library, the build fails with a message naming what is missing;
#   2. with no CANDLE_TRACE_* variable, the crate's build script builds the Go library
#      as a static archive; the dependent's binary has no rpath/runpath and needs no
#      libcandle_trace.so;
#   3. that binary, copied to a fresh folder and run with a bare environment (no
#      LD_LIBRARY_PATH), writes a trace that candle-graph accepts (alone in a fresh
#      folder).
#
# Its target folder is bindings/rust's, so the dependencies both lock to the same
# versions of are compiled once.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
CANDLE_GRAPH=${CANDLE_GRAPH:-$ROOT/build/tools/bin/candle-graph}
MANIFEST=tests/rust_dependent/Cargo.toml
TARGET=$ROOT/bindings/rust/target
OUT=$ROOT/build/rust_dependent

fail() { echo "rust_dependent/run.sh: FAIL: $*" >&2; exit 1; }
step() { echo "rust_dependent/run.sh: $*"; }
[ -x "$CANDLE_GRAPH" ] || fail "no candle-graph at $CANDLE_GRAPH (make tools)"
for var in $(compgen -e); do
  case $var in CANDLE_TRACE_*) unset "$var" ;; esac
done
rm -rf "$OUT"
mkdir -p "$OUT/empty"
build() { cargo build --quiet --locked --manifest-path "$MANIFEST" --target-dir "$TARGET" "$@"; }

step "1. clear errors: no Go, an empty CANDLE_TRACE_LIB_DIR"
if GO=/nonexistent/go build >"$OUT/nogo.log" 2>&1; then
  fail "the dependent built without Go"
fi
grep -q "go not found: building libcandle_trace needs Go >= " "$OUT/nogo.log" ||
  fail "no clear error without Go: $(tail -20 "$OUT/nogo.log")"
if CANDLE_TRACE_LIB_DIR="$OUT/empty" build >"$OUT/empty.log" 2>&1; then
  fail "the dependent built with an empty CANDLE_TRACE_LIB_DIR"
fi
grep -q "CANDLE_TRACE_LIB_DIR=$OUT/empty holds neither libcandle_trace.a nor libcandle_trace.so" "$OUT/empty.log" ||
  fail "no clear error for an empty CANDLE_TRACE_LIB_DIR: $(tail -20 "$OUT/empty.log")"

step "2. the build links the Go library statically, with no rpath"
build || fail "cargo build of $MANIFEST failed"
BIN=$TARGET/debug/rust_dependent
dynamic=$(readelf -d "$BIN")
if grep -Eq 'RPATH|RUNPATH' <<<"$dynamic"; then
  fail "$BIN has an rpath: $(grep -E 'RPATH|RUNPATH' <<<"$dynamic")"
fi
if grep -q 'libcandle_trace' <<<"$dynamic"; then
  fail "$BIN needs a shared libcandle_trace: $(grep NEEDED <<<"$dynamic")"
fi

step "3. the binary, moved elsewhere and run with a bare environment, writes a trace"
mkdir -p "$OUT/run" "$OUT/judge"
cp "$BIN" "$OUT/run/"
(cd "$OUT/run" && env -i PATH=/usr/bin:/bin HOME="$HOME" ./rust_dependent dependent.jsonl) ||
  fail "rust_dependent failed to run"
mv "$OUT/run/dependent.jsonl" "$OUT/judge/"
(cd "$OUT/judge" && "$CANDLE_GRAPH" summary --require-valid dependent.jsonl >summary.json) ||
  fail "candle-graph refuses the dependent's trace: $(tail -c 2000 "$OUT/judge/summary.json")"
step "passed"
