# candle-trace — build, test, benchmark.
#   make          build/libcandle_trace.so and build/candle-trace
#   make demo     build and run the C demo, check its trace with candle-graph, write build/demo/demo.html
#   make test     every test of the project
#   make setup    what make test needs on a fresh Debian 12 (tools/setup.sh; make demo
#                 runs its smaller part, setup-demo); both are quick once done
#   make bench    the benchmarks (figures go into BENCHMARKS.md)
#   make bench-peers  the span burst beside Tracy and LTTng-UST (part of make bench)
#   make bench-view  the view page's JavaScript time budget: a >1 M-event trace's page in headless Chromium

GO        ?= go
CC        ?= cc
BUILD     := build
LIB       := $(BUILD)/libcandle_trace.so
# The same library with the benchmark/test hooks of cmd/libtrace/bench_exports.go
# exported too (bench_spans, tests/python/test_runtime.py); never shipped.
BENCH_LIB := $(BUILD)/bench/libcandle_trace.so
PRELOAD   := $(BUILD)/libcandle_trace_preload.so
ARCHIVE   := $(BUILD)/libcandle_trace.a
CLI       := $(BUILD)/candle-trace
CFLAGS    ?= -O2 -Wall -Wextra -Werror -std=c99
# candle-graph, the reference reader: installed by tools (or .ci/run) from crates.io.
CANDLE_GRAPH_VERSION := 0.10.1
TOOLS     := $(BUILD)/tools
CANDLE_GRAPH ?= $(TOOLS)/bin/candle-graph
export CANDLE_GRAPH := $(abspath $(CANDLE_GRAPH))
# The Python of every test: a virtualenv over Debian's /usr/bin/python3 that sees its
# torch 1.13 (tools/setup.sh makes it).
VENV      := $(BUILD)/venv
PYTHON    := $(abspath $(VENV))/bin/python
# The OpenTelemetry Collector the OTLP tests export to (tools/otelcol, its own
# Go module): built once per machine, like candle-graph.
OTELCOL   ?= $(TOOLS)/otelcol/otelcol
export CANDLE_TRACE_OTELCOL := $(abspath $(OTELCOL))
# Rebuilt only when missing or when tools/otelcol changed (the stamp names a hash
# of its sources): the collector's ~170 modules take a minute to compile, and
# build/tools is the cache CI keeps. tools/otelcol/go.mod pins its release.
# Defined here, above every rule that names it: make expands prerequisites as
# it reads them, so a later definition left `tools` without the collector.
OTELCOL_STAMP := $(TOOLS)/otelcol/.built-$(shell cat tools/otelcol/go.mod tools/otelcol/go.sum tools/otelcol/main.go | sha256sum | cut -c1-12)

GO_SRC    := $(shell find cmd internal -name '*.go' -o -name '*.c' -o -name '*.h' -o -name '*.S') include/candle_trace.h go.mod
# go-nvml's cgo wrappers call NVML functions nvml.h marks deprecated; the
# warnings are theirs, not ours.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: all lib cli otelcol archive setup setup-demo test-packaging real-libs demo compare-demo aggregate-demo test-aggregate-demo test test-go test-c test-sanitize test-load test-python test-run torch2-venv test-rust test-twins bench bench-core bench-peers bench-span-windows bench-view bench-python bench-watch bench-observer-warmth bench-backward-hooks bench-kernels bench-watch-perf bench-rust tools clean

all: lib cli $(PRELOAD)

lib: $(LIB)
cli: $(CLI)
# The static archive for CANDLE_TRACE_LIB_DIR=build (bindings/rust/build.rs).
archive: $(ARCHIVE)

# A linker version script keeps every symbol but the header's ct_* functions
# local (cmd/libtrace/exports.map; tests/abi checks it).
$(LIB): $(GO_SRC) cmd/libtrace/exports.map
	$(GO) build -buildmode=c-shared -ldflags '-extldflags -Wl,--version-script=$(abspath cmd/libtrace/exports.map)' -o $@ ./cmd/libtrace
	@rm -f $(BUILD)/libcandle_trace.h   # the hand-written include/candle_trace.h is the header

# A c-archive takes no version script: the program it is linked into exports nothing.
$(ARCHIVE): $(GO_SRC)
	$(GO) build -buildmode=c-archive -o $@ ./cmd/libtrace
	@rm -f $(BUILD)/libcandle_trace.h

$(BENCH_LIB): $(GO_SRC) cmd/libtrace/exports_bench.map
	@mkdir -p $(dir $@)
	$(GO) build -buildmode=c-shared -ldflags '-extldflags -Wl,--version-script=$(abspath cmd/libtrace/exports_bench.map)' -o $@ ./cmd/libtrace
	@rm -f $(BUILD)/bench/libcandle_trace.h

# The drop-in's LD_PRELOAD shim: plain C, loads the Go library only into
# the processes CANDLE_TRACE_MATCH names.
$(PRELOAD): cmd/preload/preload.c
	$(CC) -O2 -Wall -Wextra -Werror -shared -fPIC $< -o $@ -ldl

# internal/runner embeds sitecustomize.py (go:embed): a change to it is a change of the CLI.
$(CLI): $(GO_SRC) internal/runner/sitecustomize.py
	@if [ -d cmd/candle-trace ]; then $(GO) build -o $@ ./cmd/candle-trace; fi

$(BUILD)/%: examples/c/%.c $(LIB) include/candle_trace.h
	$(CC) $(CFLAGS) -Iinclude $< -o $@ -L$(BUILD) -lcandle_trace -Wl,-rpath,'$$ORIGIN' -lm

$(BUILD)/test_abi: tests/c/test_abi.c $(LIB) include/candle_trace.h
	$(CC) $(CFLAGS) -D_GNU_SOURCE -Iinclude $< -o $@ -L$(BUILD) -lcandle_trace -Wl,-rpath,'$$ORIGIN' -lm -lpthread

$(BUILD)/test_aggregate: tests/c/test_aggregate.c $(LIB) include/candle_trace.h
	$(CC) $(CFLAGS) -D_GNU_SOURCE -Iinclude $< -o $@ -L$(BUILD) -lcandle_trace -Wl,-rpath,'$$ORIGIN' -lpthread -lm

$(BUILD)/bench_spans: tests/bench/bench_spans.c $(BENCH_LIB)
	$(CC) -O2 -Wall -std=c99 -Iinclude $< -o $@ -L$(BUILD)/bench -lcandle_trace -Wl,-rpath,'$$ORIGIN/bench'

$(BUILD)/span_windows: tests/bench/span_windows.c $(BENCH_LIB)
	$(CC) -O2 -Wall -std=c99 -Iinclude $< -o $@ -L$(BUILD)/bench -lcandle_trace -Wl,-rpath,'$$ORIGIN/bench'

tools: $(CANDLE_GRAPH) $(OTELCOL_STAMP)

otelcol: $(OTELCOL_STAMP)
$(OTELCOL_STAMP):
	@mkdir -p $(dir $@)
	rm -f $(TOOLS)/otelcol/.built-*
	cd tools/otelcol && $(GO) build -trimpath -o $(abspath $(OTELCOL)) .
	@touch $@

# Idempotent set-up for a fresh Debian 12 (apt packages when root, build/venv,
# candle-graph, real libraries, torch 2.x venv): tools/setup.sh says what and why.
setup:
	./tools/setup.sh test
setup-demo:
	./tools/setup.sh demo

# A tiny program that writes traces with candle-graph's own TraceSession, so
# the reader is checked against what candle-graph writes, not only reads.
WRITER := $(BUILD)/cargo/release/candle_graph_writer
$(WRITER): tests/candle_graph_writer/src/main.rs tests/candle_graph_writer/Cargo.toml tests/candle_graph_writer/Cargo.lock
	cargo build --release --locked --manifest-path tests/candle_graph_writer/Cargo.toml --target-dir $(BUILD)/cargo

$(CANDLE_GRAPH):
	cargo install candle-graph --version $(CANDLE_GRAPH_VERSION) --locked --root $(TOOLS)

# NVIDIA's real libcupti (PyPI wheel) and libnvidia-ml (Debian non-free),
# which load without a GPU: the no-driver tests run against them. Fetched
# once into build/reallibs; the tests skip without them, except in CI.
REAL_LIBS := $(BUILD)/reallibs
real-libs: $(REAL_LIBS)/.fetched
$(REAL_LIBS)/.fetched: tests/reallibs/fetch.py
	python3 tests/reallibs/fetch.py $(REAL_LIBS)
	@touch $@

demo: setup-demo $(LIB) $(CLI) $(BUILD)/train_step
	rm -rf $(BUILD)/demo && mkdir -p $(BUILD)/demo
	$(BUILD)/train_step $(BUILD)/demo/demo.jsonl
	@echo "--- first lines of the trace:"; head -c 1200 $(BUILD)/demo/demo.jsonl; echo " ..."
	@echo "--- candle-graph's verdict:"
	cd $(BUILD)/demo && $(CANDLE_GRAPH) summary demo.jsonl --require-valid > summary.json && \
	  python3 -c "import json; h=json.load(open('summary.json'))['health']; print('structurally_valid:', h['structurally_valid'], ' capture_complete:', h['capture_complete']); [print(' ', i['severity'], i['code'], '-', i['message']) for i in h['issues']]"
	@echo "--- candle-trace report:"
	$(CLI) report $(BUILD)/demo/demo.jsonl
	@echo "--- candle-trace view (one self-contained page for a browser):"
	$(CLI) view $(BUILD)/demo/demo.jsonl --output $(BUILD)/demo/demo.html

test: test-go test-c test-sanitize test-load test-python test-rust test-twins test-aggregate-demo test-packaging

test-go: setup $(LIB) $(BENCH_LIB) $(WRITER)
	@unformatted=$$(gofmt -l cmd internal tests); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	CANDLE_GRAPH_WRITER=$(abspath $(WRITER)) CANDLE_TRACE_LIB=$(abspath $(LIB)) CANDLE_TRACE_BENCH_LIB=$(abspath $(BENCH_LIB)) $(GO) test -race -count=1 ./...

test-c: setup $(BUILD)/test_abi $(BUILD)/test_aggregate $(BUILD)/train_step $(CLI)
	CANDLE_GRAPH=$(CANDLE_GRAPH) ./tests/c/run.sh $(BUILD)

# The C span path alone (fastpath.c, aggkeys.c, ticks.c with stand-ins for
# the Go side) under ASan+UBSan and under TSan: tests/c/fastpath_sanitize.c.
FASTPATH_SRC := tests/c/fastpath_sanitize.c internal/session/fastpath.c internal/session/aggkeys.c internal/session/ticks.c
SAN_FLAGS := -std=gnu11 -O1 -g -Wall -Wextra -Werror -fno-omit-frame-pointer -Iinclude -Iinternal/session
$(BUILD)/fastpath_asan: $(FASTPATH_SRC) internal/session/fastpath.h internal/session/aggkeys.h internal/session/ticks.h
	@mkdir -p $(BUILD)
	$(CC) $(SAN_FLAGS) -fsanitize=address,undefined -fno-sanitize-recover=all $(FASTPATH_SRC) -o $@ -lpthread
$(BUILD)/fastpath_tsan: $(FASTPATH_SRC) internal/session/fastpath.h internal/session/aggkeys.h internal/session/ticks.h
	@mkdir -p $(BUILD)
	$(CC) $(SAN_FLAGS) -fsanitize=thread $(FASTPATH_SRC) -o $@ -lpthread

test-sanitize: $(BUILD)/fastpath_asan $(BUILD)/fastpath_tsan
	CANDLE_TRACE_RING_KB=64 ./$(BUILD)/fastpath_asan
	@# setarch -R: gcc 12's TSan refuses the high-entropy mmap layouts of newer kernels
	CANDLE_TRACE_RING_KB=64 TSAN_OPTIONS=halt_on_error=1 $$(command -v setarch >/dev/null && echo setarch $$(uname -m) -R) ./$(BUILD)/fastpath_tsan

test-load: setup $(LIB) $(BENCH_LIB) $(PRELOAD) $(BUILD)/train_step $(OTELCOL_STAMP)
	CANDLE_TRACE_LIB=$(abspath $(LIB)) CANDLE_TRACE_BENCH_LIB=$(abspath $(BENCH_LIB)) $(PYTHON) -m pytest -q tests/python

# The Python binding: non-torch tests and torch 1.13 tests under $(PYTHON) (Debian's
# python3-torch, seen through the venv), torch tests again under PyPI's torch 2.x in
# $(TORCH2_VENV) (TORCH_PYTHON=PY: under PY alone).
test-python: setup $(LIB) $(CLI) $(PRELOAD)
	PYTHON=$(PYTHON) ./bindings/python/run_tests.sh

# pip install bindings/python into a fresh venv, then use it with no CANDLE_TRACE_*
# variable set (tests/packaging/fresh_venv.sh). The install runs make for the three
# files it bundles: built first here, so that under -j no two makes write them at once.
test-packaging: setup $(LIB) $(CLI) $(PRELOAD)
	./tests/packaging/fresh_venv.sh

# `candle-trace run` alone: the runner's Go tests (a fake child) and the unmodified
# programs of tests/python/programs under each torch (also part of test-go and test-python).
# candle-trace run alone (also part of test-go and test-python): the runner's Go tests and
# its pytest under both torch interpreters.
test-run: setup $(LIB) $(CLI) $(PRELOAD)
	$(GO) test -race -count=1 ./internal/runner
	for py in $(PYTHON) $(TORCH2_VENV)/bin/python; do \
	  PATH="$$(dirname $$py):$$PATH" $$py -m pytest -q -p no:cacheprovider bindings/python/tests/test_run.py || exit 1; done

# A virtualenv with PyPI's torch 2.x, pinned in bindings/python/requirements-torch2.txt:
# made once (about 40 s from the wheel folder ~/.cache/candle_trace/wheels, which a first
# run fills with 2.6 GB; 4.3 GB installed), then a no-op while the pins are unchanged.
TORCH2_VENV := $(BUILD)/venv-torch2
torch2-venv:
	./bindings/python/torch2_venv.sh $(TORCH2_VENV)

# The torch interpreters the Python benchmarks run under: TORCH_PYTHON alone when set;
# else Debian's torch 1.13 and PyPI's torch 2.x ($(TORCH2_VENV), when made), since the
# two differ by ten times on the same model (BENCHMARKS.md, "On a quiet Intel host").
TORCH_PYTHONS = $${TORCH_PYTHON:-/usr/bin/python3 $$(test -x $(TORCH2_VENV)/bin/python && echo $(TORCH2_VENV)/bin/python || echo >&2 "(no $(TORCH2_VENV): make torch2-venv for the torch 2.x figures)")}

bench-python: $(LIB)
	for py in $(TORCH_PYTHONS); do PYTHONPATH=bindings/python $$py bindings/python/bench.py || exit 1; done

# Always-on watching (issue 13): the flight recorder's and the triggers' cost per update,
# interleaved (bench_watch.py [ROUNDS] [LONG]), and where the recorder's CPU goes (perf).
bench-watch: $(LIB)
	for py in $(TORCH_PYTHONS); do PYTHONPATH=bindings/python $$py bindings/python/bench_watch.py $(WATCH_ARGS) || exit 1; done

# What an observed update pays per record function after updates without the op
# observer, and after a rehearsal (issue 12): bench_observer_warmth.py [ROUNDS] [WORKLOAD...].
bench-observer-warmth: $(LIB)
	for py in $(TORCH_PYTHONS); do PYTHONPATH=bindings/python $$py bindings/python/bench_observer_warmth.py $(WARMTH_ARGS) || exit 1; done

# A backward module span's gradient hook on autograd's node vs in the tensor's Python
# hooks (bench_backward_hooks.py [ROUNDS] [DEPTH]).
bench-backward-hooks: $(LIB)
	for py in $(TORCH_PYTHONS); do PYTHONPATH=bindings/python $$py bindings/python/bench_backward_hooks.py $(HOOKS_ARGS) || exit 1; done

# Inductor's kernels with the record function a capture gives them (torch 2.x only):
# the compiled GPT's update and one kernel's call, with and without (bench_kernels.py
# [ROUNDS] [UPDATES]).
bench-kernels: $(LIB)
	@py=$${TORCH_PYTHON:-$(TORCH2_VENV)/bin/python}; if test -x "$$py"; then \
	  PYTHONPATH=bindings/python $$py bindings/python/bench_kernels.py $(KERNELS_ARGS); \
	else echo "(no $$py: make torch2-venv for bench-kernels)"; fi

bench-watch-perf: $(LIB)
	PYTHONPATH=bindings/python $${TORCH_PYTHON:-/usr/bin/python3} bindings/python/bench_watch_perf.py $(WATCH_ARGS)

# The Rust binding (bindings/rust): its build.rs builds the library as a static
# archive with Go (unless CANDLE_TRACE_LIB_DIR names one); the candle feature builds
# candle-core/candle-nn 0.11 from crates.io. tests/rust_dependent: a crate depending
# on it builds and runs with no rpath and no variable set. rustfmt's and clippy's
# verdicts first: a style drift or a lint fails here, not in a reviewer's diff.
test-rust: setup
	cd bindings/rust && cargo fmt --check && cargo clippy --all-targets --all-features -- -D warnings
	cd tests/rust_dependent && cargo fmt --check
	cd bindings/rust && cargo test --all-features
	./tests/rust_dependent/run.sh

# The same MLP in candle and PyTorch, compared (needs torch and cargo).
compare-demo: $(LIB) $(CLI)
	./tests/compare_demo.sh

test-twins: setup $(LIB) $(CLI) test-rust
	TORCH_PYTHON=$(PYTHON) ./tests/compare_demo.sh --check

# Both examples, 10,000 updates with aggregate statistics: every update
# counted, the report shown, peak memory flat (tests/aggregate_demo.sh).
aggregate-demo: $(LIB) $(CLI)
	./tests/aggregate_demo.sh

test-aggregate-demo: setup $(LIB) $(CLI) test-rust
	TORCH_PYTHON=$(PYTHON) ./tests/aggregate_demo.sh --check

bench-rust: $(LIB)
	cd bindings/rust && cargo bench --features tracing --bench spans && cargo bench --features candle --bench step_overhead && cargo bench --features candle --bench stats && cargo bench --features candle --bench watch && cargo bench --features candle --bench llama_overhead

# Every benchmark: Go packages, the C span path (burst + 50 M events
# sustained) and both bindings. Figures go into BENCHMARKS.md.
bench: bench-core bench-python bench-kernels bench-rust

# The page of a generated trace of over a million events, loaded once in
# headless Chromium: the page's own data-render-ms and each view's data-ms-*
# (bench-core runs it too, among every Go benchmark). Not part of make test.
bench-view:
	$(GO) test -run '^$$' -bench PageInChromium -benchtime 1x ./internal/report/htmlview/

bench-core: $(LIB) $(BUILD)/bench_spans
	$(GO) test -run '^$$' -bench . -benchmem ./internal/...
	./$(BUILD)/bench_spans /tmp 100000
	./$(BUILD)/bench_spans /tmp 100000 trace
	./$(BUILD)/bench_spans /tmp 100000 tracer
	CANDLE_TRACE_AGG_CLOCK=monotonic ./$(BUILD)/bench_spans /tmp 100000 aggregate
	./$(BUILD)/bench_spans /tmp 0 50000000
	./$(BUILD)/bench_spans /tmp 0 50000000 aggregate
	$(MAKE) --no-print-directory bench-peers
	$(MAKE) --no-print-directory bench-go-wakeups

# How often our Go threads wake while the program computes between reopens, one P
# against two (tests/bench/go_wakeups.py): the monitor's polling, per update.
bench-go-wakeups: $(LIB)
	python3 tests/bench/go_wakeups.py 4 $(LIB)

# Whether the span pair's cost is the process's or the moment's (issue 14):
# medians per 60 ms window beside two rdtsc, in one thread.
bench-span-windows: $(BUILD)/span_windows
	./$(BUILD)/span_windows 25
	CANDLE_TRACE_RING_KB=65536 ./$(BUILD)/span_windows 25

# The same span burst (and a 50 M-event sustained run) through Tracy's C client
# and LTTng-UST beside candle-trace's two modes and two clock reads, one process
# per system per round, round-robin, printing ratios (tests/bench/peers/run.py).
# It fetches Tracy (cargo, cached in build/peers) and installs LTTng (apt-get,
# as root) when it can; a peer it cannot get is reported loudly and left out.
# Not part of make test.
bench-peers: $(LIB)
	python3 tests/bench/peers/run.py --build $(BUILD) --json $(BUILD)/peers/results.json

clean:
	rm -rf $(BUILD)/*.so $(BUILD)/libcandle_trace.a $(BUILD)/bench $(BUILD)/candle-trace $(BUILD)/train_step $(BUILD)/test_abi $(BUILD)/test_aggregate $(BUILD)/fastpath_asan $(BUILD)/fastpath_tsan $(BUILD)/bench_spans $(BUILD)/span_windows $(BUILD)/peers/burst_* $(BUILD)/demo
