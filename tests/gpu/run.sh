#!/usr/bin/env bash
# tests/gpu/run.sh — the GPU check of the device collectors (issue 5). One
# script, at most 8 minutes, on a machine with an NVIDIA GPU, its driver and
# PyTorch with CUDA. Without them it stops within seconds, exit 2, saying
# what is missing.
#
#   1. builds build/libcandle_trace.so;
#   2. traces one CUDA training step through the Python binding with
#      ct_device_start, timing the same step with torch.cuda.Event;
#   3. traces an uninstrumented CUDA PyTorch script under the drop-in
#      (LD_PRELOAD, CANDLE_TRACE_DEVICE_COLLECT);
#   3c. runs a training loop that really runs out of CUDA memory inside
#      update 15 under candle_trace.torch.watch (tests/gpu/watch_oom.py: the
#      forward asks for twice the GPU's memory) and checks that exactly
#      update-000015-exception.jsonl is kept, failed with the OOM's message,
#      holding the ops up to the failure and a sample of torch's caching
#      allocator, valid for candle-graph, and listed in the run's summary
#      (the same script runs on CPU in test_torch_watch.py, --device cpu);
#   3d. runs a float16 training loop with a CUDA GradScaler under watch
#      (tests/gpu/amp_watch.py): the steps the scaler skips for overflow fire
#      nothing, update 9's NaN loss fires non_finite, the whole-run loss is
#      unscaled (the same script runs on CPU in test_torch_amp.py);
#   3e. real programs (tests/gpu/programs.py): `candle-trace run` on the char
#      GPT of tests/python/programs on cuda:0 -- complete, valid, gradients
#      equal to the program's p.grad norms, backward module spans (opened on
#      autograd's CUDA thread) with kernels, CUPTI's warm-up span before the
#      update -- and a torch.compile'd model under profile: the loop runs,
#      the trace is complete and valid, with inductor's Triton kernels and
#      the compiled graphs' CUDA buffers (allocated by no op) in its memory;
#   4. checks: device_memory samples for cuda:0 (capacity > 0; used > 0 once the
#      process has launched work: before, NVML may truthfully say 0),
#      kernel names demangled (at most 1 in 10 still mangled),
#      the NVML cost per sample (extra.nvml_query_ns, printed), candle-graph
#      --require-valid on every trace; with CUPTI: kernels present with
#      names, every device interval inside the session and attributed to an
#      existing span, kernels attributed to forward, backward and optimizer
#      (the span innermost on the launching thread; autograd launches
#      backward kernels from its own thread, where none is open, and with
#      "unspanned_launches":"main_thread" they go to the main thread's
#      innermost, backward), the dropped-record count
#      stated (cupti/dropped_records), the device time of the measured
#      step within ±10% of torch.cuda.Event's on it (printed: it and the first
#      step after ct_device_start against the untraced step -- CUPTI's first
#      launch per thread), in the torch.profile trace CUPTI's warm-up span
#      before the update; the libcandle_trace.so has no undefined cupti
#      symbol (libcupti is dlopened);
#   5. when the checks passed with time to spare: tests/gpu/bench.py, the
#      step's time untraced vs with the collectors vs under torch.profiler
#      (printed, not a check).
#
# Exit: 0 all checks passed; 1 a check failed; 2 no GPU / driver / torch;
# 3 incomplete: the CUPTI collector could not start here (no libcupti found,
# another profiler, no permission: the reason is printed), so its checks did
# not run (GPU_CHECK_ALLOW_NO_CUPTI=1 turns that into 0). libcupti is found
# as ct_device_start documents it (PyTorch's own libcupti.so.12 from the
# nvidia-cuda-cupti-cu12 wheel is usually already loaded);
# CANDLE_TRACE_CUPTI_LIB names another.
# Environment: PYTHON (default python3), CANDLE_GRAPH (default
# build/tools/bin/candle-graph; its checks are skipped, said so, when absent).
# Without Go on the GPU machine, carry build/libcandle_trace.so,
# build/libcandle_trace_preload.so, build/candle-trace and
# build/tools/bin/candle-graph from a machine that built them (make lib cli
# build/libcandle_trace_preload.so tools).
# For this project's lent H200 (no Go; PyTorch 2.11+cu130 in a venv that
# python3 runs unactivated): one device `run` of
#   PYTHONUNBUFFERED=1 bash tests/gpu/run.sh 2>&1 | tee $OUT/gpu-check.log
# with carry [build/libcandle_trace.so, build/libcandle_trace_preload.so,
# build/candle-trace, build/tools/bin/candle-graph] and timeout_s 540 (under 8 minutes of
# checks, and 15 minutes of device time in all, so one rerun at most).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-python3}
CANDLE_GRAPH=${CANDLE_GRAPH:-$ROOT/build/tools/bin/candle-graph}
START=$(date +%s)

say() { echo "gpu-check: $*"; }
die() { echo "gpu-check: $1" >&2; exit "${2:-1}"; }

# ---- 1. preflight: seconds, not minutes ---------------------------------------
if ! timeout 20 "$PYTHON" -c 'import ctypes; ctypes.CDLL("libnvidia-ml.so.1")' 2>/dev/null; then
    die "no NVIDIA driver here: libnvidia-ml.so.1 cannot be loaded (this check needs a GPU machine)" 2
fi
if command -v nvidia-smi >/dev/null && ! timeout 20 nvidia-smi -L >/dev/null 2>&1; then
    die "nvidia-smi -L fails: the driver sees no GPU" 2
fi
if ! timeout 60 "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    die "$PYTHON has no PyTorch with CUDA (import torch; torch.cuda.is_available() is not True)" 2
fi
say "GPU: $(nvidia-smi -L 2>/dev/null | head -n 1 || echo unknown)"

# ---- 2. build (or take the build carried from a machine with Go) ------------------
LIB=$ROOT/build/libcandle_trace.so
PRELOAD=$ROOT/build/libcandle_trace_preload.so
if command -v go >/dev/null; then
    say "building"
    (cd "$ROOT" && timeout 240 make lib cli build/libcandle_trace_preload.so >/dev/null) || die "make failed"
elif [ -f "$LIB" ] && [ -f "$PRELOAD" ] && [ -x "$ROOT/build/candle-trace" ]; then
    say "no Go here: using the carried $LIB, $PRELOAD and build/candle-trace"
else
    die "no Go here to build with, and no carried build/libcandle_trace.so, build/libcandle_trace_preload.so and build/candle-trace" 2
fi
if command -v nm >/dev/null; then
    nvml_undefined=$(nm -D --undefined-only "$LIB" | grep -c nvml || true)
    [ "$nvml_undefined" = 0 ] || die "$LIB has $nvml_undefined undefined nvml symbols"
    cupti_undefined=$(nm -D --undefined-only "$LIB" | grep -ci cupti || true)
    [ "$cupti_undefined" = 0 ] || die "$LIB has $cupti_undefined undefined cupti symbols (libcupti must be dlopened)"
    echo "ok    no undefined nvml or cupti symbol in $(basename "$LIB")"
else
    say "nm not found: the undefined-symbol checks did not run"
fi

OUT=$(mktemp -d "${TMPDIR:-/tmp}/candle-trace-gpu.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
export CANDLE_TRACE_LIB=$LIB PYTHONPATH=$ROOT/bindings/python${PYTHONPATH:+:$PYTHONPATH}

# ---- 3. a traced training step through the binding --------------------------------
say "traced step (Python binding, ct_device_start)"
timeout 180 "$PYTHON" - "$OUT/step.jsonl" "$OUT/step.json" <<'PY'
import json, sys, time
import torch
import candle_trace as ct

trace, report = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
dev = torch.device("cuda:0")
model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(512, 4096, device=dev)

def step():
    opt.zero_grad(set_to_none=True)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()

for _ in range(5):  # warm up: cuBLAS handles, allocator
    step()
torch.cuda.synchronize()

# The same step timed by CUDA events, untraced.
a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
a.record(); step(); b.record(); torch.cuda.synchronize()
event_ms = a.elapsed_time(b)

s = ct.Session(trace, "gpu_check::step", phase="train", capture_step=6, device="cuda:0",
               run={"warmup_steps": 5})
cupti, cupti_error = True, ""
try:
    s.device_start({"collect": ["nvml", "cupti"], "interval_ms": 10, "unspanned_launches": "main_thread"})
except ct.CandleTraceError as e:
    print("gpu-check: CUPTI not started:", e.message, flush=True)
    cupti, cupti_error = False, e.message
    s.device_start({"collect": ["nvml"], "interval_ms": 10})
time.sleep(0.05)
# The first step after ct_device_start, as it comes: CUPTI's first launch on each thread
# is slower (check.py prints what that costs against event_ms).
a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
with s.span("first_step"):
    opt.zero_grad(set_to_none=True)
    a.record()
    model(x).square().mean().backward()
    opt.step()
    b.record()
    torch.cuda.synchronize()
first_event_ms = a.elapsed_time(b)
a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
with s.measure("update"):
    with s.span("forward", step="forward"):
        opt.zero_grad(set_to_none=True)
        a.record()  # the GPU idles from here to the first kernel: record it late
        loss = model(x).square().mean()
    with s.span("backward", step="backward"):
        loss.backward()
    with s.span("optimizer", step="optimizer"):
        opt.step()
    b.record()
    torch.cuda.synchronize()
traced_event_ms = a.elapsed_time(b)
time.sleep(0.05)
s.device_stop()
s.finish()
json.dump({"event_ms": event_ms, "first_event_ms": first_event_ms,
           "traced_event_ms": traced_event_ms, "cupti": cupti,
           "cupti_error": cupti_error}, open(report, "w"))
PY

# ---- 3b. the same model through candle_trace.torch.profile (CUPTI by default on CUDA) ---
say "captured update (candle_trace.torch.profile, device_collect default)"
timeout 180 "$PYTHON" - "$OUT/profile.jsonl" <<'PY' || die "the torch.profile run failed"
import sys, warnings
import torch
import candle_trace.torch as ctt

warnings.simplefilter("always")
dev = torch.device("cuda:0")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(256, 1024, device=dev)
with ctt.profile(model, opt, sys.argv[1], capture_step=3) as prof:
    for _ in range(4):
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        prof.step()
print("gpu-check: profile collected", prof.device_collect, "ops via", prof.op_mechanism, flush=True)
PY

# ---- 3c. a real CUDA out-of-memory inside an update, under watch ---------------------
say "CUDA out of memory inside an update (candle_trace.torch.watch)"
set +e
timeout 180 "$PYTHON" "$ROOT/tests/gpu/watch_oom.py" "$OUT/watch-oom" --device cuda:0
oom_rc=$?
set -e

# ---- 3d. mixed precision under watch: float16, a CUDA GradScaler ----------------------
say "mixed precision: float16 autocast and a GradScaler (candle_trace.torch.watch)"
set +e
timeout 120 "$PYTHON" "$ROOT/tests/gpu/amp_watch.py" "$OUT/amp" --device cuda:0
amp_rc=$?
set -e

# ---- 3e. real programs: candle-trace run on the CUDA char GPT, a compiled model ---------
say "real programs: candle-trace run on a CUDA GPT, a torch.compile'd model under profile"
set +e
timeout 300 "$PYTHON" "$ROOT/tests/gpu/programs.py" "$OUT/programs"
programs_rc=$?
set -e

# ---- 4. an uninstrumented script under the drop-in -----------------------------------
say "uninstrumented script under the drop-in"
cat >"$OUT/plain.py" <<'PY'
import torch
x = torch.randn(2048, 2048, device="cuda")
for _ in range(20):
    x = torch.tanh(x @ x / 2048)
torch.cuda.synchronize()
print("plain done", float(x.sum()))
PY
COLLECT=nvml
if "$PYTHON" -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["cupti"] else 1)' "$OUT/step.json"; then
    COLLECT=nvml,cupti
fi
# As a user would: the preload shim, which loads the library into Python
# processes only; CANDLE_TRACE_LIB (exported above) names the library.
env LD_PRELOAD="$PRELOAD" CANDLE_TRACE_MATCH='python*' CANDLE_TRACE_PATH="$OUT/dropin-%p.jsonl" \
    CANDLE_TRACE_DEVICE_COLLECT=$COLLECT CANDLE_TRACE_DEVICE_INTERVAL_MS=10 \
    timeout 120 "$PYTHON" "$OUT/plain.py" 2>"$OUT/dropin.err" \
    || { cat "$OUT/dropin.err" >&2; die "the drop-in run failed"; }
if grep -q "device collectors not started" "$OUT/dropin.err"; then
    cat "$OUT/dropin.err" >&2
    die "the drop-in did not start its device collectors"
fi

# ---- 5. checks ------------------------------------------------------------------------
say "checking"
set +e
"$PYTHON" "$ROOT/tests/gpu/check.py" "$OUT"
rc=$?
set -e
if [ "$oom_rc" -ne 0 ]; then
    echo "FAIL  the watch's CUDA out-of-memory check (step 3c, exit $oom_rc)"; rc=1
fi
if [ "$amp_rc" -ne 0 ]; then
    echo "FAIL  the watch's mixed-precision check (step 3d, exit $amp_rc)"; rc=1
fi
if [ "$programs_rc" -ne 0 ]; then
    echo "FAIL  the real programs' check (step 3e, exit $programs_rc)"; rc=1
fi

if [ -x "$CANDLE_GRAPH" ]; then
    for t in "$OUT"/*.jsonl; do
        d=$(mktemp -d "$OUT/cg.XXXXXX"); cp "$t" "$d/trace.jsonl"
        if (cd "$d" && "$CANDLE_GRAPH" summary trace.jsonl --require-valid >/dev/null 2>"$d/err"); then
            echo "ok    $(basename "$t"): candle-graph --require-valid"
        else
            echo "FAIL  $(basename "$t"): candle-graph --require-valid: $(head -c 400 "$d/err")"; rc=1
        fi
    done
else
    say "candle-graph not found at $CANDLE_GRAPH: validity not checked (make tools)"
fi

# ---- 6. overhead, side by side with torch.profiler (figures for BENCHMARKS.md) ------
if [ "$rc" -eq 0 ] && [ $(( $(date +%s) - START )) -lt 300 ]; then
    say "overhead: untraced vs candle-trace collectors vs torch.profiler"
    timeout 150 "$PYTHON" "$ROOT/tests/gpu/bench.py" --device cuda:0 || say "the overhead benchmark did not finish (not a check)"
fi

say "done in $(( $(date +%s) - START )) s"
[ "$rc" -eq 0 ] || die "checks failed"
if ! "$PYTHON" -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["cupti"] else 1)' "$OUT/step.json"; then
    why=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["cupti_error"])' "$OUT/step.json")
    if [ "${GPU_CHECK_ALLOW_NO_CUPTI:-0}" = 1 ]; then
        say "CUPTI collector did not start ($why): its checks did not run (allowed by GPU_CHECK_ALLOW_NO_CUPTI=1)"
        exit 0
    fi
    die "INCOMPLETE: the CUPTI collector did not start ($why), so kernel, attribution and timing checks did not run" 3
fi
say "all checks passed"
