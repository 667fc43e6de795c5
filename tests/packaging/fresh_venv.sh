#!/usr/bin/env bash
# tests/packaging/fresh_venv.sh — the package as a new user gets it (make test-packaging).
#
# A fresh virtualenv under build/packaging, made from Debian's /usr/bin/python3 with
# --system-site-packages (so python3-torch 1.13 is its torch, for the torch check),
# gets `pip install bindings/python`: offline (--no-index) and without build isolation,
# with the venv's setuptools and Debian's python3-wheel, so a run contacts no registry.
# Then, with no CANDLE_TRACE_* variable and no PYTHONPATH set, from a folder outside the
# repository's Python sources:
#   1. `import candle_trace` loads the bundled library and writes a trace;
#   2. the `candle-trace` console script validates it, passes exit statuses on, and is
#      replaced by the bundled Go command (exec: a signal reaches the command itself);
#   3. `python -m candle_trace --help` shows the command's usage and torch-observer;
#   4. a torch program captured with candle_trace.torch.profile gives a trace that the
#      real candle-graph accepts, through the C++ op observer (no fallback warning);
#      `candle-trace torch-observer` then names the built observer, and into an empty
#      cache `--build` compiles it with a progress line;
#   4b. `candle-trace run -- python char_gpt.py` traces the unchanged GPT program: one
#      complete trace candle-graph accepts, with ops and gradients, the program's own
#      output unchanged;
#   5. a wheel built with `pip wheel` is py3-none-<platform> and bundles the three files;
#   6. installing a copy of bindings/python without the repository, or without Go,
#      fails with a message naming what is missing.
# Every trace is judged by candle-graph alone in a fresh folder.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
CANDLE_GRAPH=${CANDLE_GRAPH:-$ROOT/build/tools/bin/candle-graph}
BASE_PY=/usr/bin/python3
OUT=$ROOT/build/packaging
VENV=$OUT/venv
WORK=$OUT/work

fail() { echo "fresh_venv.sh: FAIL: $*" >&2; exit 1; }
step() { echo "fresh_venv.sh: $*"; }
[ -x "$CANDLE_GRAPH" ] || fail "no candle-graph at $CANDLE_GRAPH (make tools)"

# candle-graph's verdict on one trace, copied alone into a fresh folder.
judge() {
  local trace=$1 dir
  dir=$(mktemp -d "$OUT/judge.XXXXXX")
  cp "$trace" "$dir/"
  (cd "$dir" && "$CANDLE_GRAPH" summary --require-valid "$(basename "$trace")" >summary.json) ||
    fail "candle-graph refuses $trace: $(tail -c 2000 "$dir/summary.json")"
  rm -rf "$dir"
}

start=$(date +%s)
rm -rf "$OUT"
mkdir -p "$WORK"
"$BASE_PY" -m venv --system-site-packages "$VENV" ||
  fail "$BASE_PY -m venv failed (make setup installs python3-venv)"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
step "pip install bindings/python into $VENV"
"${PIP[@]}" install --quiet --no-index --no-build-isolation "$ROOT/bindings/python" ||
  fail "pip install bindings/python failed"

# The user's environment: none of ours, and nothing pointing into the checkout.
for var in $(compgen -e); do
  case $var in CANDLE_TRACE_*|PYTHONPATH|LD_PRELOAD) unset "$var" ;; esac
done
PATH="$VENV/bin:$PATH"
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
cd "$WORK"

step "1. import candle_trace writes a trace with the bundled library"
python - >lib_path <<'EOF'
import candle_trace as ct
from candle_trace import _lib

with ct.Session("session.jsonl", "packaging::smoke", phase="infer", capture_step=1) as s:
    with s.measure("update"):
        with s.span("forward", kind="module", step="forward"):
            pass
print(_lib.load().path)
EOF
[ "$(cat lib_path)" = "$SITE/candle_trace/libcandle_trace.so" ] ||
  fail "candle_trace loaded $(cat lib_path), not the bundled $SITE/candle_trace/libcandle_trace.so"
judge session.jsonl

step "2. the candle-trace console script runs the bundled command"
[ "$(command -v candle-trace)" = "$VENV/bin/candle-trace" ] ||
  fail "candle-trace on PATH is $(command -v candle-trace), not the venv's console script"
candle-trace validate session.jsonl || fail "candle-trace validate refuses session.jsonl"
set +e
candle-trace validate no-such-trace.jsonl >/dev/null 2>&1; missing_status=$?
candle-trace no-such-command >/dev/null 2>&1; usage_status=$?
set -e
[ "$missing_status" = 1 ] || fail "validate of a missing file exited $missing_status, not 1"
[ "$usage_status" = 2 ] || fail "an unknown command exited $usage_status, not 2"
# validate - waits on its standard input (a FIFO held open by fd 3): the console
# script's process must by then be the Go command itself (exec), which a SIGTERM ends
# as it ends the command.
mkfifo stdin.fifo
candle-trace validate - <stdin.fifo >/dev/null 2>&1 &
pid=$!
exec 3>stdin.fifo
for _ in $(seq 100); do
  [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$SITE/candle_trace/bin/candle-trace" ] && break
  sleep 0.1
done
exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
kill -TERM "$pid"
set +e; wait "$pid"; term_status=$?; set -e
exec 3>&-
[ "$exe" = "$SITE/candle_trace/bin/candle-trace" ] ||
  fail "the console script's process runs $exe, not the bundled command"
[ "$term_status" = $((128 + 15)) ] || fail "SIGTERM: exit status $term_status, not 143"

step "3. python -m candle_trace --help"
python -m candle_trace --help >help.txt || fail "python -m candle_trace --help exited $?"
grep -q '^usage: candle-trace' help.txt || fail "no usage line in: $(head -5 help.txt)"
grep -q 'torch-observer \[--build\]' help.txt || fail "--help does not list torch-observer"

step "4. a torch program under candle_trace.torch.profile (torch $(python -c 'import torch; print(torch.__version__)'))"
python "$ROOT/examples/python/train_mlp.py" mlp.jsonl 2>torch.stderr ||
  fail "train_mlp.py failed: $(tail -20 torch.stderr)"
if grep -q 'observer is unavailable' torch.stderr; then
  fail "the op observer fell back to the dispatch mode: $(cat torch.stderr)"
fi
judge mlp.jsonl
candle-trace validate mlp.jsonl >/dev/null || fail "candle-trace validate refuses mlp.jsonl"
observer=$(candle-trace torch-observer) || fail "candle-trace torch-observer exited $?"
[ -f "$observer" ] || fail "torch-observer printed $observer, which is no file"
[ "$(candle-trace torch-observer --build)" = "$observer" ] ||
  fail "torch-observer --build names another observer than torch-observer"
# A first build, into an empty cache (XDG_CACHE_HOME: no CANDLE_TRACE_* variable): not
# built says so (exit 1); --build compiles it with a progress line, then it is found.
set +e
XDG_CACHE_HOME="$OUT/empty-cache" candle-trace torch-observer >/dev/null 2>not-built.txt
not_built_status=$?
set -e
[ "$not_built_status" = 1 ] || fail "torch-observer with an empty cache exited $not_built_status, not 1"
grep -q 'not built yet.*torch-observer --build' not-built.txt ||
  fail "torch-observer with an empty cache does not say how to build: $(cat not-built.txt)"
fresh=$(XDG_CACHE_HOME="$OUT/empty-cache" candle-trace torch-observer --build 2>first-build.txt) ||
  fail "torch-observer --build failed: $(tail -20 first-build.txt)"
grep -q '^candle_trace: compiling the PyTorch op observer for torch .* (once, ~[0-9]*s)\.\.\.$' first-build.txt ||
  fail "no progress line before the first build: $(head -5 first-build.txt)"
grep -q '^candle_trace: op observer compiled in [0-9.]*s into ' first-build.txt ||
  fail "no line after the first build: $(tail -5 first-build.txt)"
case $fresh in "$OUT/empty-cache/candle_trace/"*) ;; *) fail "--build built $fresh, not in the empty cache" ;; esac
[ "$(XDG_CACHE_HOME="$OUT/empty-cache" candle-trace torch-observer)" = "$fresh" ] ||
  fail "torch-observer does not find what --build built"

step "4b. candle-trace run -- python char_gpt.py: the program unchanged, traced"
# The output pattern is the runner's default (candle-trace-%p.jsonl, in the working
# folder); the runner prints one verdict line per trace it wrote.
python "$ROOT/tests/python/programs/char_gpt.py" --updates 5 >plain.out 2>&1 ||
  fail "char_gpt.py fails without the runner: $(tail -20 plain.out)"
rm -f candle-trace-*.jsonl
candle-trace run -- python "$ROOT/tests/python/programs/char_gpt.py" --updates 5 >run.out 2>&1 ||
  fail "candle-trace run -- python char_gpt.py exited $?: $(tail -20 run.out)"
set -- candle-trace-*.jsonl
[ $# = 1 ] && [ -f "$1" ] || fail "candle-trace run wrote $# traces ($*), not one: $(tail -20 run.out)"
judge "$1"
grep -q "$1.*valid, complete" run.out || fail "no verdict line naming $1 as valid and complete: $(tail -5 run.out)"
# the program's own output passes through unchanged (its losses are seeded)
grep -v '^candle-trace' run.out | diff - plain.out >/dev/null ||
  fail "the program's output changed under the runner: $(diff <(grep -v '^candle-trace' run.out) plain.out | head)"
grep -q '"kind":"gradient"' "$1" || fail "the run's trace has no gradients"
grep -q '"op_name":"aten::' "$1" || fail "the run's trace has no aten ops"

step "5. pip wheel: a platform wheel with the native files"
"${PIP[@]}" wheel --quiet --no-index --no-build-isolation --no-deps -w wheel "$ROOT/bindings/python" ||
  fail "pip wheel bindings/python failed"
python - wheel <<'EOF'
import stat
import sys
import zipfile
from pathlib import Path

(wheel,) = Path(sys.argv[1]).glob("*.whl")
tag = wheel.name.split("-", 2)[2]
assert tag.startswith("py3-none-linux_") and tag.endswith(".whl"), f"wheel tag: {wheel.name}"
with zipfile.ZipFile(wheel) as z:
    infos = {i.filename: i for i in z.infolist()}
for name in ("candle_trace/libcandle_trace.so", "candle_trace/libcandle_trace_preload.so",
             "candle_trace/bin/candle-trace"):
    assert name in infos, f"{wheel.name} lacks {name}"
mode = infos["candle_trace/bin/candle-trace"].external_attr >> 16
assert mode & stat.S_IXUSR, f"bin/candle-trace is not executable in the wheel ({oct(mode)})"
print(f"{wheel.name}: bundles the library, the shim and the command")
EOF

step "6. clear errors: no repository around the sources, no Go"
cp -r "$ROOT/bindings/python" "$OUT/python-alone"
rm -rf "$OUT/python-alone/build"
if "${PIP[@]}" install --no-index --no-build-isolation "$OUT/python-alone" >alone.log 2>&1; then
  fail "installing bindings/python without the repository succeeded"
fi
grep -q "the repository's sources are not at" alone.log ||
  fail "no clear error without the repository: $(tail -20 alone.log)"
if GO=/nonexistent/go "${PIP[@]}" install --no-index --no-build-isolation "$ROOT/bindings/python" >nogo.log 2>&1; then
  fail "installing bindings/python without Go succeeded"
fi
grep -q "go not found: building libcandle_trace.so needs Go >= " nogo.log ||
  fail "no clear error without Go: $(tail -20 nogo.log)"

step "passed in $(( $(date +%s) - start )) s"
