/*
 * candle_trace.h — the C ABI of candle-trace, a profiler for one representative
 * training (or inference) step that writes a candle-graph/trace/10 JSONL trace.
 *
 * Example: trace one update of a training loop.
 *
 *     #include "candle_trace.h"
 *
 *     ct_session s;
 *     if (ct_open("traces/step.jsonl",
 *                 "{\"entrypoint\":\"mlp::train\",\"phase\":\"train\","
 *                 "\"capture_step\":3,\"device\":\"cpu\"}", &s) != CT_OK) {
 *         fprintf(stderr, "candle-trace: %s\n", ct_last_error());
 *         return 1;
 *     }
 *     ct_span update, fwd;
 *     ct_measurement_begin(s, "update", &update);      // the one measured region
 *     ct_span_begin(s, "forward", CT_SPAN_MODULE, CT_STEP_FORWARD, &fwd);
 *     ... run the forward pass, ct_record_op(s, fwd, &op) per op ...
 *     ct_span_end(s, fwd);
 *     ... backward, optimizer, ct_record_gradient(...) per parameter ...
 *     ct_span_end(s, update);
 *     if (ct_finish(s) != CT_OK) fprintf(stderr, "%s\n", ct_last_error());
 *
 * Conventions (they hold for every function below):
 * - Fallible functions return ct_status; CT_OK (0) is success. On failure the
 *   calling thread's message is in ct_last_error() and nothing was written.
 * - Handles are integers; 0 is never a valid session or span. The root span
 *   opened by ct_open is always 1 ("s1" in the trace).
 * - Strings are NUL-terminated UTF-8, borrowed for the duration of the call;
 *   the library copies what it keeps. NULL, empty (where a value is required)
 *   and invalid UTF-8 are refused with CT_ERR_INVALID_ARGUMENT. Arrays come as
 *   pointer + length.
 * - Limits: 255 sessions open at once; a thread may hold open spans in at
 *   most 8 sessions at a time; span names up to 262,096 bytes (half the
 *   per-thread event ring of 512 KiB less a record header;
 *   CANDLE_TRACE_RING_KB changes it) and every other string up to 1 MiB
 *   (CT_ERR_INVALID_ARGUMENT beyond), an op's strings up to 8 MiB together;
 *   shapes up to 64 dimensions; ops up to 65536 inputs.
 * - Every function may be called from any thread on any session. Spans nest
 *   per OS thread: ct_span_begin's parent is the innermost open span of the
 *   calling thread (the root when it has none), and ct_span_end must close that
 *   innermost span.
 * - Record structs are versioned: they start with `size` (set it to
 *   sizeof(the struct) of the header you compile against), then `flags` or
 *   `reserved`. The library reads `size` bytes. A smaller struct (a caller of
 *   an older header) is read with the default of every field it lacks: zero,
 *   NULL, not flagged. A larger one (a newer header) is accepted only when
 *   every byte past this library's struct is zero; otherwise it carries a
 *   field this library does not know. `size` must be at least 8, a multiple
 *   of the struct's alignment and at most 4096. In `flags` only the CT_HAS_*
 *   bits of that struct may be set; `reserved` must be 0. Anything else is
 *   CT_ERR_INVALID_ARGUMENT. So the structs grow in later ABI versions
 *   without breaking compiled callers either way.
 * - Timestamps are nanoseconds on the session clock (CLOCK_MONOTONIC since
 *   ct_open, less the tracer's own time: see ct_tracer_begin); ct_now_ns
 *   reads it. Where the CPU's cycle counter runs at a constant rate, the
 *   clock is that counter converted to CLOCK_MONOTONIC nanoseconds (span
 *   begin and end then read only the counter);
 *   CANDLE_TRACE_CLOCK=monotonic reads CLOCK_MONOTONIC itself.
 * - A session whose trace write ever failed is poisoned: every later call
 *   returns CT_ERR_POISONED except ct_finish_failed, and `complete` is never
 *   written for it.
 * - In a child created by fork(), every call on any session returns
 *   CT_ERR_STATE without touching the parent's trace (the Go runtime inside
 *   the library does not survive fork). Open a new session after exec instead.
 * - The library exports exactly the functions declared here; every other
 *   symbol inside it (the Go runtime's included) is local.
 * - Events are written by a background flusher at most
 *   CT_DEFAULT_FLUSH_INTERVAL_MS after they are recorded (environment
 *   CANDLE_TRACE_FLUSH_MS changes it), so a killed process leaves a readable
 *   partial trace of whole lines (a SIGKILL that stops a write halfway may
 *   cut its last line at a page boundary; candle-trace's readers drop it).
 */
#ifndef CANDLE_TRACE_H
#define CANDLE_TRACE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CT_ABI_VERSION 1
#define CT_DEFAULT_FLUSH_INTERVAL_MS 50

typedef uint64_t ct_session;
typedef uint64_t ct_span;

/* Status codes. Values are fixed. */
typedef enum ct_status {
    CT_OK = 0,
    CT_ERR_INVALID_ARGUMENT = 1, /* NULL, empty, non-UTF-8, unknown enum, inconsistent record */
    CT_ERR_INVALID_HANDLE = 2,   /* 0, unknown or finished session; unknown span */
    CT_ERR_SPAN_MISMATCH = 3,    /* span_end of a span that is not this thread's innermost */
    CT_ERR_STATE = 4,            /* call not allowed now: open spans at finish, second measured region, fork child */
    CT_ERR_IO = 5,               /* the trace could not be created or written (the session is now poisoned) */
    CT_ERR_POISONED = 6,         /* an earlier write failed; only ct_finish_failed works */
    CT_ERR_UNAVAILABLE = 7,      /* a device collector or its library is not present */
    CT_ERR_INTERNAL = 8          /* a bug or out of memory; the message says which */
} ct_status;

/* Wire enums: each mirrors a value set of the trace format. Values are fixed. */
typedef enum ct_span_kind { CT_SPAN_FUNCTION = 0, CT_SPAN_OP = 1, CT_SPAN_MODULE = 2 } ct_span_kind;

typedef enum ct_step {
    CT_STEP_NONE = 0, /* the span is not a training step phase */
    CT_STEP_FORWARD = 1,
    CT_STEP_BACKWARD = 2,
    CT_STEP_OPTIMIZER = 3
} ct_step;

typedef enum ct_memory_action { CT_MEMORY_ALLOC = 0, CT_MEMORY_FREE = 1 } ct_memory_action;

typedef enum ct_gradient_state {
    CT_GRADIENT_PRESENT = 0,   /* norm required: finite and > 0 */
    CT_GRADIENT_ZERO = 1,      /* norm required: exactly +0.0 */
    CT_GRADIENT_MISSING = 2,   /* norm must be NULL */
    CT_GRADIENT_NON_FINITE = 3 /* norm must be NULL */
} ct_gradient_state;

typedef enum ct_category {
    CT_CATEGORY_OTHER = 0,
    CT_CATEGORY_PARAMETER = 1,
    CT_CATEGORY_ACTIVATION = 2,
    CT_CATEGORY_GRADIENT = 3,
    CT_CATEGORY_OPTIMIZER = 4
} ct_category;

/* Presence flags of optional record fields. */
#define CT_HAS_OUTPUT_DENSE_BYTES (1u << 0) /* ct_op.output_dense_bytes is set */
#define CT_HAS_DENSE_BYTES (1u << 0)        /* ct_tensor.dense_bytes is set */
#define CT_HAS_USED_BYTES (1u << 0)         /* ct_device_memory fields ... */
#define CT_HAS_FREE_BYTES (1u << 1)
#define CT_HAS_RESERVED_BYTES (1u << 2)
#define CT_HAS_CAPACITY_BYTES (1u << 3)
#define CT_HAS_CORRELATION_ID (1u << 0)     /* ct_device_interval.correlation_id is set */

/* One executed operation (a matmul, an aten op, ...). */
typedef struct ct_op {
    uint32_t size;                /* sizeof(ct_op) */
    uint32_t flags;               /* CT_HAS_OUTPUT_DENSE_BYTES */
    const char *op_name;          /* required */
    const char *dtype;            /* required, e.g. "f32" (case-insensitive element sizes) */
    const char *device;           /* required, e.g. "cpu", "cuda:0" */
    const char *const *inputs;    /* tensor ids of the inputs; may be NULL when n_inputs is 0 */
    size_t n_inputs;
    const char *output;           /* tensor id of the output, NULL for none */
    const int64_t *shape;         /* output shape; each dim >= 0 */
    size_t rank;
    uint64_t duration_ns;
    uint64_t timestamp_ns;        /* start on the session clock; 0 = now - duration_ns */
    uint64_t output_dense_bytes;  /* when not flagged: product(shape) x element size */
    uint64_t input_dense_bytes;
} ct_op;

/* Tensor metadata (an activation, a parameter, ...). */
typedef struct ct_tensor {
    uint32_t size;                /* sizeof(ct_tensor) */
    uint32_t flags;               /* CT_HAS_DENSE_BYTES */
    const char *tensor_id;        /* required: the backend's identity of the tensor */
    const char *dtype;            /* required */
    const char *device;           /* required */
    const char *label;            /* NULL for none; a human name, never an identity */
    const int64_t *shape;
    size_t rank;
    int32_t requires_grad;        /* 0 or 1 */
    ct_category category;
    uint64_t dense_bytes;
} ct_tensor;

/* Statistics a framework already reduced (on its own device). */
typedef struct ct_tensor_stats {
    uint32_t size;                /* sizeof(ct_tensor_stats) */
    uint32_t reserved;            /* 0 */
    const char *label;            /* required, non-blank */
    const char *dtype;            /* required */
    const int64_t *shape;
    size_t rank;
    uint64_t elements;            /* must equal product(shape); 1 for rank 0 */
    uint64_t non_finite;          /* <= elements */
    double rms;                   /* finite, >= 0 (write 0 when the reduction was not finite) */
    double abs_max;               /* finite, >= 0 */
    double mean;                  /* finite */
} ct_tensor_stats;

/* A logical allocation or free of one tensor's storage. */
typedef struct ct_memory {
    uint32_t size;                /* sizeof(ct_memory) */
    uint32_t reserved;            /* 0 */
    uint64_t timestamp_ns;        /* 0 = now; must lie inside the span */
    const char *storage_id;       /* required; lifetimes are keyed by (device, storage_id) */
    const char *tensor_id;        /* required */
    const char *device;           /* required */
    const char *dtype;            /* required */
    const char *op_name;          /* NULL for none */
    uint64_t bytes;
    const int64_t *shape;
    size_t rank;
    ct_category category;
} ct_memory;

/* A sample of a device's physical memory. At least one value must be flagged. */
typedef struct ct_device_memory {
    uint32_t size;                /* sizeof(ct_device_memory) */
    uint32_t flags;               /* CT_HAS_USED_BYTES | CT_HAS_FREE_BYTES | ... */
    uint64_t timestamp_ns;        /* 0 = now */
    const char *device;           /* required */
    uint64_t used_bytes;
    uint64_t free_bytes;
    uint64_t reserved_bytes;
    uint64_t capacity_bytes;
} ct_device_memory;

/* One interval of device work (a kernel, a memcpy, ...). */
typedef struct ct_device_interval {
    uint32_t size;                /* sizeof(ct_device_interval) */
    uint32_t flags;               /* CT_HAS_CORRELATION_ID */
    const char *device;           /* required */
    const char *stream_id;        /* required */
    const char *clock_id;         /* NULL = "host-monotonic" (start_ns on the session clock) */
    const char *backend;          /* required, e.g. "cuda" */
    const char *name;             /* NULL for none, e.g. the kernel name */
    uint64_t start_ns;
    uint64_t duration_ns;         /* > 0 */
    uint64_t correlation_id;
} ct_device_interval;

/* ---- sessions ----------------------------------------------------------- */

/* Opens a trace at `path` and writes its meta line and root span s1.
 *
 * `run_json` is a JSON object with the run's provenance: required
 * "entrypoint", "phase" ("train" | "infer"), "capture_step" (>= 1) and
 * "device"; optional "warmup_steps" (default capture_step - 1),
 * "correlation_id" (default "<entrypoint>/update-<step>" or
 * ".../inference-<step>"), "timing_mode" ("host" | "device_synchronized"),
 * "measured_region_device_synchronized", "capture_contract",
 * "comparison_identity", "tags" (string -> string), "candle_version",
 * "measured_root": true to make the root span the measured region, and
 * "binding" (e.g. "python": meta.producer.binding, ours), "buffer" (a
 * buffered session, below). Unknown
 * keys are refused (typos would otherwise vanish). The gradient manifest
 * digest of a gradient contract is computed here; do not pass one.
 * Parent folders of `path` are created. Nothing but the library's own files
 * is ever truncated or replaced: a final symbolic link is never followed
 * (refused, also when it points at a trace); an existing regular file is
 * reused only when it is empty or one of candle-trace's traces
 * or aggregate summaries (told by its first bytes: a trace's meta line
 * `{"kind":"meta","schema":"candle-graph/trace/10"`, a summary's "schema"
 * "candle-trace/aggregate/1"), so a rerun overwrites its previous output
 * (a trace is replaced by a new file renamed over it at its first write: a
 * process killed inside ct_open leaves the old one whole) and any other file (a mistyped `train.py`) is refused with CT_ERR_IO, the
 * message naming the path and why. A character device or a FIFO is written
 * into as it is (a trace session only: an aggregate summary needs a regular
 * file, see aggregate mode); a directory, a socket or a block device is
 * refused.
 *
 * Buffered session (a flight recorder of one training update):
 * "buffer": {"max_bytes": N} keeps the whole trace in memory instead. Nothing
 * is created or written at ct_open (no file, no folder), but the path is
 * checked as above — an existing file must be one ct_open would reuse and
 * writable, the nearest existing parent a folder this process may create
 * files in — and refused with CT_ERR_IO otherwise. ct_finish and
 * ct_finish_failed then make the folder and write the trace in one go, under
 * the same file rules; when that fails they return CT_ERR_IO and leave
 * nothing that claims to be a trace. ct_discard drops it unwritten.
 * "max_bytes" is an integer from 1 to 68719476736 (64 GiB), default
 * 67108864 (64 MiB) when "buffer" is {}; 0, a negative or non-integer
 * number, null or another key inside "buffer" is CT_ERR_INVALID_ARGUMENT, as
 * is "buffer" with "mode": "aggregate". The bound: once the trace would
 * outgrow max_bytes, op, tensor, tensor_stats (scalars too), memory,
 * device_memory, device_interval and data-edge records are dropped — that
 * one and every later one — and the call still returns CT_OK. Spans, call
 * edges and gradients are kept up to twice max_bytes; past that new spans
 * are dropped with their ends, call edges and records, and so are call
 * edges and gradients outside a gradient contract. What keeps the trace
 * valid is always kept: the root, the end of every kept span, the measured
 * region and the first span of each required semantic label (with the
 * dropped spans they open under), a contract's gradients, the terminal.
 * So memory stays within about 2 x max_bytes plus those lines. The terminal
 * line states "dropped_records" and "dropped_bytes" (0 when nothing was);
 * see ct_dropped_records. ct_flush on a buffered session writes nothing to
 * disk (CT_OK once everything recorded is in the buffer).
 *
 * Thread-safe. Returns CT_OK and stores the handle in *out;
 * CT_ERR_INVALID_ARGUMENT for bad JSON or provenance (nothing is created);
 * CT_ERR_IO when the file cannot be created or written, or may not be
 * (above; no file that claims to be a trace is left). */
ct_status ct_open(const char *path, const char *run_json, ct_session *out);

/* Opens a span nested in the calling thread's innermost open span (the root
 * when it has none). `step` tags a training phase (CT_STEP_NONE for none).
 * Costs tens of nanoseconds: it never blocks on I/O and never encodes or
 * writes; a thread whose event ring is full waits for the library's drainer
 * thread to make room (nothing is dropped).
 * Thread-safe. Returns CT_OK and the span in *out. */
ct_status ct_span_begin(ct_session session, const char *name, ct_span_kind kind, ct_step step,
                        ct_span *out);

/* Opens the session's single measured region (a function span marked
 * measured), nested like ct_span_begin. A second one, or one in a session
 * opened with "measured_root", is CT_ERR_STATE. Close it with ct_span_end. */
ct_status ct_measurement_begin(ct_session session, const char *name, ct_span *out);

/* Closes `span`, which must be the innermost open span of the calling thread;
 * any other id (another thread's span, an outer span, an unknown id) is
 * CT_ERR_SPAN_MISMATCH and nothing is written. The root s1 is closed by
 * ct_finish only. Thread-safe. */
ct_status ct_span_end(ct_session session, ct_span span);

/* Records host work that already happened (on any thread) as a closed span
 * attached to the root. It does not touch any thread's span stack.
 * duration_ns must be > 0 and start_ns + duration_ns must not lie in the
 * future. Thread-safe. Returns the new span in *out (may be NULL). */
ct_status ct_record_completed_span(ct_session session, const char *name, ct_span_kind kind,
                                   uint64_t start_ns, uint64_t duration_ns, ct_span *out);

/* The session clock: nanoseconds since ct_open, less the tracer's own time
 * (ct_tracer_begin). 0 on a bad handle. Thread-safe, never blocks. */
uint64_t ct_now_ns(ct_session session);

/* ---- the tracer's own time ------------------------------------------------
 * A binding that does work of its own inside the program it observes (hooks'
 * bookkeeping, tensor statistics, gradient norms, encoding records) brackets
 * that work with ct_tracer_begin / ct_tracer_end. While any thread is inside
 * such an interval the session clock stands still, so the work is counted in
 * no span's duration and no record's timestamp: spans measure the program,
 * not the profiler. Records made inside an interval (a span begun by a hook)
 * carry the time at which it began.
 *
 * The clock is the session's, not the thread's: tracer work on one thread
 * also stops the clock for a thread running the program beside it. That is
 * exact for the usual case, a tracer running inline on the program's critical
 * path (PyTorch's hooks and autograd: one thread works while the other
 * waits), and an under-count of concurrent program work otherwise.
 *
 * What was left out is stated, never hidden: the measured span's span_end
 * carries "tracer_ns" (tracer time inside it) and the terminal line the
 * session's total. Device intervals (CUPTI) are placed on this clock by
 * interpolating between its clock anchors: one that ran between two anchors
 * may be off by as much as the tracer time between them.
 *
 * Intervals nest and may overlap across threads (a count, not a stack);
 * begin and end need not be on the same thread. Aggregate sessions refuse
 * them (CT_ERR_STATE): their spans are timed by the cycle counter. Each call
 * costs two clock reads and an uncontended atomic; thread-safe. */

/* Opens a tracer interval. CT_ERR_INVALID_HANDLE, CT_ERR_POISONED, or
 * CT_ERR_STATE (an aggregate or finishing session) on failure. */
ct_status ct_tracer_begin(ct_session session);

/* Opens a tracer interval that began up to earlier_ns before the call: for the
 * tracer's work that no call can bracket because it runs before the tracer
 * gets control -- an interpreter dispatching a hook, a framework boxing an
 * op's arguments for a profiling callback -- whose cost the binding measured
 * beforehand (a calibration). The clock stops at the latest of (now -
 * earlier_ns), the latest value it has handed out and where the previous
 * interval left it, so it never runs backwards and no time is left out
 * twice; inside an open interval there is nothing to backdate. What is
 * backdated is counted apart as estimated (ct_tracer_estimated_ns; the
 * terminal's "tracer_estimated_ns"), so a reader can tell measured tracer
 * time from calibrated. earlier_ns 0 is ct_tracer_begin. Errors as
 * ct_tracer_begin. */
ct_status ct_tracer_begin_earlier(ct_session session, uint64_t earlier_ns);

/* ct_tracer_begin_earlier, and the session clock inside the interval it
 * opens in *now_ns (may be NULL; untouched on failure): the value
 * ct_now_ns returns until the last open interval ends. For a tracer that
 * times the program's work from inside its own (an op observer's start and
 * end), one call instead of two. Errors as ct_tracer_begin. */
ct_status ct_tracer_begin_at(ct_session session, uint64_t earlier_ns, uint64_t *now_ns);

/* ct_tracer_begin_earlier followed at once by ct_tracer_end, in one call:
 * leaves out of the session clock up to earlier_ns of tracer work that has
 * just ended and that no call could bracket (a framework's work for a
 * profiling callback that has nothing else to do), within the same bounds,
 * counted as estimated. Inside an open interval it does nothing. Errors as
 * ct_tracer_begin. */
ct_status ct_tracer_exclude_earlier(ct_session session, uint64_t earlier_ns);

/* Closes a tracer interval; CT_ERR_STATE when none is open. */
ct_status ct_tracer_end(ct_session session);

/* The tracer time left out of the session clock so far (an open interval
 * counts up to now). 0 on a bad handle. Thread-safe, never blocks. */
uint64_t ct_tracer_ns(ct_session session);

/* The part of ct_tracer_ns that intervals begun earlier than their call
 * added (ct_tracer_begin_earlier): calibrated, not measured. 0 on a bad
 * handle. Thread-safe, never blocks. */
uint64_t ct_tracer_estimated_ns(ct_session session);

/* ---- records -------------------------------------------------------------
 * Each takes the span the record belongs to. The span must exist; records
 * with times (op, memory) must lie inside the span: while it is open they
 * must end no later than now, once it is closed inside its interval. The
 * library remembers the bounds of the most recent 262144 closed spans; older
 * closed spans are refused with CT_ERR_INVALID_HANDLE. All are thread-safe. */

/* One operation. Derives output_dense_bytes from shape and dtype when not
 * flagged. Shapes whose byte size overflows 64 bits are refused. */
ct_status ct_record_op(ct_session session, ct_span span, const ct_op *op);

/* Tensor metadata. */
ct_status ct_record_tensor(ct_session session, ct_span span, const ct_tensor *tensor);

/* Statistics already reduced by the caller; the invariants noted in
 * ct_tensor_stats are checked. */
ct_status ct_record_tensor_stats(ct_session session, ct_span span, const ct_tensor_stats *stats);

/* Reduces a host float32 buffer (product(shape) elements) to rms, abs_max,
 * mean and the count of non-finite elements; the finite elements alone feed
 * rms, abs_max and mean. `data` may be NULL only for an empty tensor. */
ct_status ct_record_tensor_stats_f32(ct_session session, ct_span span, const char *label,
                                     const float *data, const int64_t *shape, size_t rank);

/* The reduction of ct_record_tensor_stats_f32 without recording it: fills
 * out->elements, non_finite, rms, abs_max and mean (and out->dtype, "f32", a
 * static string), the same numbers ct_record_tensor_stats_f32 records (one
 * pass at memory bandwidth, float64 sums, the same bits on every CPU); label,
 * shape and rank are left to the caller. out->size must be at least
 * sizeof(ct_tensor_stats). It takes no session, no lock and never enters the
 * library's runtime (it works in a fork child too): a binding reduces a tensor
 * where its values are (inside a timed region) and records the numbers with
 * ct_record_tensor_stats once the region is over. */
ct_status ct_reduce_tensor_stats_f32(const float *data, const int64_t *shape, size_t rank,
                                     ct_tensor_stats *out);

/* A scalar observation (a loss, a learning rate) as single-element stats.
 * A non-finite value is recorded as non_finite 1 with zeros. */
ct_status ct_record_scalar(ct_session session, ct_span span, const char *label, double value);

/* A logical allocation or free. Lifetimes are checked as they arrive: an
 * alloc of a live storage with other bytes, a repeated (storage, tensor)
 * alloc, a free of a storage that is not live, and an event earlier than one
 * its storage already had (record one storage's events in time order) are
 * refused. */
ct_status ct_record_memory(ct_session session, ct_span span, ct_memory_action action,
                           const ct_memory *memory);

/* A physical device-memory sample (not tied to a span). */
ct_status ct_record_device_memory(ct_session session, const ct_device_memory *sample);

/* A device interval, attributed to `span` (the span that launched it). */
ct_status ct_record_device_interval(ct_session session, ct_span span,
                                    const ct_device_interval *interval);

/* A call edge from `from` to its child `to` (to's parent must be from).
 * host_duration_ns 0 takes to's duration: the edge is written when `to`
 * closes (at once if it is closed). Otherwise it must equal that duration. */
ct_status ct_record_call_edge(ct_session session, ct_span from, ct_span to,
                              uint64_t host_duration_ns);

/* A data edge between two tensor ids, each already known from a ct_tensor or
 * an op's inputs/output (the first 1048576 distinct ids are remembered). */
ct_status ct_record_data_edge(ct_session session, const char *from_tensor, const char *to_tensor);

/* One gradient fact for parameter `key` under `root` (e.g. a VarMap).
 * `norm` is NULL when absent; see ct_gradient_state for what each state
 * requires. With a gradient contract, the key must be in its manifest and may
 * be recorded once. */
ct_status ct_record_gradient(ct_session session, const char *root, const char *key,
                             ct_gradient_state state, const double *norm);

/* ---- device collectors -------------------------------------------------- */

/* Starts device collectors on `session`. `options_json` is NULL (all
 * defaults) or a JSON object; every key is optional, unknown and duplicate
 * keys are refused:
 *
 *   "collect":     array of distinct collector names, non-empty.
 *                  "nvml":  device memory samples (device_memory events,
 *                           device "cuda:<ordinal>": used/free/capacity, and
 *                           reserved_bytes where the driver has the v2
 *                           memory query; extra: gpu_utilization_pct,
 *                           memory_utilization_pct, power_w where the GPU
 *                           reports them, compute_processes and
 *                           process_used_bytes at most once a second,
 *                           nvml_query_ns = what the sample's NVML calls took).
 *                  "cupti": every kernel, memcpy and memset the GPUs run
 *                           (device_interval events: device "cuda:<id>",
 *                           stream_id, name, correlation_id, backend "cuda",
 *                           start_ns on the session clock), each attributed
 *                           to the span innermost on the launching thread at
 *                           launch (s1 when none). libcupti is dlopened from
 *                           $CANDLE_TRACE_CUPTI_LIB, "cupti_lib", one already
 *                           in the process, libcupti.so.12/.13/.so, the
 *                           nvidia-cuda-cupti Python package (in the
 *                           site-packages of PYTHONPATH, VIRTUAL_ENV,
 *                           CONDA_PREFIX, or of the Python running this
 *                           process), the CUDA toolkit. Records CUPTI dropped are stated as the
 *                           scalar "cupti/dropped_records" on s1. Synchronize
 *                           the device before ct_device_stop / ct_finish:
 *                           work still running then is not traced. One
 *                           CUPTI user per process: with torch.profiler,
 *                           Nsight or another session collecting CUPTI it is
 *                           CT_ERR_UNAVAILABLE. CUPTI's first launch on each
 *                           thread after the start is slower (0.25-0.35 ms
 *                           more on an H200 VM; the activity buffers it
 *                           fills are written at the start, so that cost
 *                           is not in it): launch once from each thread
 *                           (for PyTorch, one small backward) before the
 *                           region you measure.
 *                  Default: ["nvml"].
 *   "interval_ms": integer 1..60000, the NVML sampling period. Default 10.
 *                  Each sample costs a few NVML calls per device on a
 *                  library goroutine (NVML serialises calls in the driver);
 *                  the trace states the cost per sample (nvml_query_ns).
 *   "devices":     array of distinct CUDA ordinals (cuda:N as PyTorch counts
 *                  them, after CUDA_VISIBLE_DEVICES). Default: every visible
 *                  device. An ordinal that is not visible is
 *                  CT_ERR_INVALID_ARGUMENT.
 *   "cupti_lib":   a libcupti file, or the folder holding one, to try
 *                  right after $CANDLE_TRACE_CUPTI_LIB.
 *   "unspanned_launches": "root" (default) or "main_thread": where CUPTI
 *                  attributes work launched from a thread with no open
 *                  span. "root": s1, the span innermost on the launching
 *                  thread. "main_thread": the span innermost at that moment
 *                  on the session's main thread (the one that began the
 *                  measured region, else the first to open a span); for
 *                  PyTorch, whose autograd launches backward kernels from
 *                  its own thread while the main thread waits in backward.
 *
 * Example: {"collect":["nvml"], "interval_ms":10, "devices":[0]}.
 *
 * All or nothing: when a requested collector cannot start, none runs.
 * NVML is loaded from $CANDLE_TRACE_NVML_LIB, else libnvidia-ml.so.1.
 * Returns CT_OK once the collectors run (the first sample is taken at once);
 * CT_ERR_INVALID_ARGUMENT for bad options; CT_ERR_STATE when collectors
 * already run on this session; CT_ERR_UNAVAILABLE with a message naming what
 * is missing (libnvidia-ml.so.1, the driver, a GPU, CUPTI) — the session
 * goes on either way. Thread-safe. */
ct_status ct_device_start(ct_session session, const char *options_json);

/* Stops the session's device collectors, after writing a last sample.
 * Without running collectors it does nothing and returns CT_OK. ct_finish
 * and ct_finish_failed take a last sample before the terminal line and stop
 * the collectors too (a refused ct_finish leaves them running). */
ct_status ct_device_stop(ct_session session);

/* ---- aggregate mode ------------------------------------------------------
 * ct_open with "mode": "aggregate" in the run JSON opens an aggregate
 * session: instead of a trace of one step, `path` receives a
 * candle-trace/aggregate/1 JSON summary (docs/aggregate-format.md) of every
 * span and scalar of the run — per span name and step: count, total, min, max
 * and p50/p95/p99 from a fixed log-scale histogram; per scalar label: count,
 * mean, min, max, last — rewritten atomically every "aggregate_interval_ms"
 * (default 10 s) and at ct_finish / ct_flush, in memory that does not grow
 * with the number of steps. Since the summary is renamed over `path`, ct_open
 * refuses (CT_ERR_IO, nothing replaced) a path where anything but a regular
 * file stands: a device, a FIFO, a socket, a directory or a symbolic link
 * (the rename would replace the link itself); each later rewrite checks
 * again, and the ct_open rules for regular files hold too. "capture_step" is optional there. Spans use the
 * same calls as in a trace session and cost less (about a third: no start
 * record, and durations timed by the CPU's cycle counter where it runs at a
 * constant rate — CANDLE_TRACE_AGG_CLOCK=monotonic forces CLOCK_MONOTONIC;
 * the first aggregate ct_open of a process spends 2 ms measuring the
 * counter's rate). ct_record_scalar folds the value into its label's
 * statistics on the same path (no call into the library's runtime). Other
 * records are checked and then not kept; one that names an aggregate span
 * is checked only against the span ids handed out.
 * ct_finish needs no measured region and, as in a trace session, refuses
 * spans still open on any thread. Statistics start enabled.
 * With "otlp_endpoint" in the run JSON (or CANDLE_TRACE_OTLP_ENDPOINT set),
 * each summary is also pushed to that OpenTelemetry Collector as OTLP
 * metrics (docs/otlp.md), from a thread of the library's own: no span call
 * ever waits for the network. A push that fails is dropped and counted in
 * the summary's "otlp" block, never retried (the next summary supersedes
 * it); ct_finish waits at most 2 s for the final summary's push. */

/* Switches an aggregate session's statistics on (1) or off (0), e.g. to
 * cover a window of steps. A span counts when statistics were on both when
 * it began and when it ended. CT_ERR_STATE on a trace session;
 * CT_ERR_INVALID_ARGUMENT for another value. Thread-safe. */
ct_status ct_aggregate_enable(ct_session session, int enabled);

/* Lists one trigger that fired (candle_trace.torch.watch, the Rust
 * Schedule: a slow update, a non-finite loss, an exception, the program's
 * own call) in an aggregate session's summary, under "triggers"
 * (docs/aggregate-format.md): on which `update` (>= 1), the `trigger`'s
 * name (non-blank, at most 64 bytes), the `value` it measured (seconds of
 * a slow update, the loss: NaN and infinities are kept), the `threshold`
 * it measured against (finite; 0 when there is none), a `detail` line
 * (NULL: none) and the trace written for it in `trace` — or, NULL or empty
 * there, why none was in `no_trace` (the run's cap on traces reached, say):
 * exactly one of the two. Strings are UTF-8, at most 1024 bytes each.
 * A summary lists the first 256 firings of a run in the order of these
 * calls; later ones are counted in "triggers.refused" (CT_OK: not an
 * error). Recorded whether statistics are enabled or not.
 * CT_ERR_INVALID_ARGUMENT for a bad field (nothing listed), CT_ERR_STATE on
 * a trace session. Thread-safe. */
ct_status ct_aggregate_trigger(ct_session session, uint64_t update, const char *trigger,
                               double value, double threshold, const char *detail,
                               const char *trace, const char *no_trace);

/* ---- ending --------------------------------------------------------------- */

/* Writes everything recorded so far to the file. Returns CT_OK when it is
 * there; CT_ERR_IO (and the session is poisoned) when a write failed. A
 * buffered session writes nothing before it finishes: CT_OK. */
ct_status ct_flush(ct_session session);

/* Closes the root, writes the terminal `complete` line, flushes, closes the
 * file and invalidates the handle. Refused with CT_ERR_STATE (the session
 * stays usable, and a refusal never refuses other threads' calls) when spans
 * are still open, when no measured region exists,
 * when a required semantic label was not seen exactly once, or when a
 * gradient contract's keys were not all recorded. It does not refuse what
 * describes the run rather than the calls — a non-finite gradient family, an
 * active family below its minimum — which candle-graph reports as health
 * errors of the captured step. Calls racing with ct_finish on other threads
 * may be dropped; they never corrupt the trace. */
ct_status ct_finish(ct_session session);

/* Ends a capture that did not complete: writes the terminal `failed` line
 * with `reason` (non-empty), leaves open spans open, and invalidates the
 * handle. Works on a poisoned session (the write may still fail: CT_ERR_IO,
 * and the handle is invalidated anyway). */
ct_status ct_finish_failed(ct_session session, const char *reason);

/* Ends a buffered session ("buffer" in the run JSON of ct_open) without
 * writing anything: nothing is created at its path, its memory is freed and
 * the handle becomes invalid (its slot is free for another ct_open). Spans
 * still open, on any thread, do not matter. Running device collectors are
 * stopped. On a session that writes its trace as it records, CT_ERR_STATE:
 * the session stays open (end it with ct_finish or ct_finish_failed).
 * CT_ERR_INVALID_HANDLE for 0, an unknown or finished session.
 * Thread-safe. */
ct_status ct_discard(ct_session session);

/* A flight recorder's next update: discards the buffered session `session`
 * (as ct_discard does) and opens the next one at `path` with the same run
 * JSON, except that "capture_step" is `capture_step` — and "warmup_steps"
 * and "correlation_id", where that run JSON left them out, default again
 * from it — without parsing the run JSON again (most of what ct_open costs
 * a flight recorder per update), and keeping the trace in the memory the
 * discarded one used (emptied; still within its bound). The new session is
 * what ct_open would have opened (the path checked by the same rules,
 * nothing created); its handle is stored in *out and differs from
 * `session`'s.
 * CT_ERR_INVALID_ARGUMENT (NULL path or out, a path that is empty or not
 * UTF-8, capture_step 0 or not above an explicit "warmup_steps"),
 * CT_ERR_STATE (a session that writes as it records) and
 * CT_ERR_INVALID_HANDLE leave `session` as it was. Once it is discarded, a
 * path the new session may not use is CT_ERR_IO with nothing open (then
 * ct_open). Thread-safe. Where `path` is a name that does not exist yet in
 * the folder of `session`'s path (a flight recorder's every update), the
 * call runs in C alone, without waking the library's Go runtime (such a
 * wake cost 35-120 us of the caller's CPU and 85-150 us of other threads'
 * per update on a 2-vCPU VM); the library takes the new session over when
 * it next runs for it. (An addition: a library without it has no
 * ct_reopen symbol; ct_discard and ct_open do the same.) */
ct_status ct_reopen(ct_session session, const char *path, uint64_t capture_step,
                    ct_session *out);

/* How many records the bound of a buffered session has dropped so far (the
 * terminal line's "dropped_records"; a dropped span counts as its two lines
 * once it has ended). 0 for a session that is not buffered and on a bad
 * handle. Thread-safe. */
uint64_t ct_dropped_records(ct_session session);

/* ---- library -------------------------------------------------------------- */

/* The message of the calling thread's last failed call ("" when none).
 * Never NULL; valid until the thread's next ct_* call. */
const char *ct_last_error(void);

/* The library version, e.g. "0.1.0". */
const char *ct_version(void);

/* CT_ABI_VERSION of the library; bindings compare it with theirs. */
uint32_t ct_abi_version(void);

/* Drop-in mode: with CANDLE_TRACE_PATH set, loading the library (LD_PRELOAD
 * or a normal link) opens an ambient session whose root is the measured
 * region, and process exit finishes it (complete when no span is open,
 * failed with the reason otherwise). Provenance comes from
 * CANDLE_TRACE_ENTRYPOINT (default: the program name), _PHASE (default
 * "infer"), _DEVICE ("cpu"), _CAPTURE_STEP (1) and _TAGS ("k=v,k=v"); in the
 * path, %p expands to the pid and %r to $RANK. Returns that session, or 0
 * when there is none; when CANDLE_TRACE_PATH is set the first call waits for
 * the library to finish starting. Bindings call it to join the session.
 * CANDLE_TRACE_DEVICE_COLLECT ("nvml", comma-separated) starts device
 * collectors on it as ct_device_start would, with
 * CANDLE_TRACE_DEVICE_INTERVAL_MS as interval_ms; when they cannot start,
 * stderr says why and the session goes on without them.
 * To pick processes, preload build/libcandle_trace_preload.so instead of
 * this library: it loads this library only where the program name matches
 * CANDLE_TRACE_MATCH (comma-separated shell patterns, default "*").
 * Under that shim, a process dying of SIGSEGV, SIGBUS, SIGFPE, SIGILL,
 * SIGABRT, SIGTERM, SIGHUP or SIGQUIT (each only if its disposition was
 * SIG_DFL when the shim loaded) first writes everything recorded so far as
 * whole lines and a failed terminal naming the signal, then dies of that
 * signal as before. A SIGTERM, SIGHUP or SIGQUIT sent from outside the
 * process is deferred until the trace is written (at most 10 s; the program
 * runs on meanwhile); a fault, abort() or a signal the process raised itself
 * waits for it in its handler, at most 2 s: not guaranteed when the fault
 * hits a thread holding the library's lock (inside a ct_* call), where the
 * trace then holds what the 50 ms flusher had written. The library alone
 * never touches signal dispositions. */
ct_session ct_ambient_session(void);

#ifdef __cplusplus
}
#endif

#endif /* CANDLE_TRACE_H */
