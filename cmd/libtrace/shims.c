/* The public ct_* functions: thin shims over the fast path (spans, clock) and
 * the private Go exports (everything else). Each refuses to run in a fork
 * child before touching Go: the Go runtime does not survive fork(). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_DEFAULT */
#endif
#include "candle_trace.h"
#include "fastpath.h"
#include "_cgo_export.h"

#include <dlfcn.h>
#include <stdlib.h>

/* Kept equal to session.Version (a test checks). */
#define CT_LIBRARY_VERSION "0.1.0"

#define FORK_GUARD(fn)                                                                   \
    do {                                                                                 \
        if (__atomic_load_n(&ct__forked, __ATOMIC_ACQUIRE))                             \
            return ct__fail(CT_ERR_STATE,                                                \
                            fn ": this process is a fork() child; sessions belong to "    \
                               "the parent and the library cannot run here");            \
    } while (0)

#define CSTR(p) ((char *)(p))

ct_status ct_open(const char *path, const char *run_json, ct_session *out) {
    FORK_GUARD("ct_open");
    return (ct_status)ctgo_open(CSTR(path), CSTR(run_json), out);
}

ct_status ct_span_begin(ct_session s, const char *name, ct_span_kind kind, ct_step step,
                        ct_span *out) {
    FORK_GUARD("ct_span_begin");
    return ct__span_begin(s, name, kind, step, 0, out);
}

ct_status ct_measurement_begin(ct_session s, const char *name, ct_span *out) {
    FORK_GUARD("ct_measurement_begin");
    return ct__span_begin(s, name, CT_SPAN_FUNCTION, CT_STEP_NONE, 1, out);
}

ct_status ct_span_end(ct_session s, ct_span span) {
    FORK_GUARD("ct_span_end");
    return ct__span_end(s, span);
}

ct_status ct_record_completed_span(ct_session s, const char *name, ct_span_kind kind,
                                   uint64_t start_ns, uint64_t duration_ns, ct_span *out) {
    FORK_GUARD("ct_record_completed_span");
    return (ct_status)ctgo_record_completed_span(s, CSTR(name), (uint32_t)kind, start_ns,
                                                 duration_ns, out);
}

uint64_t ct_now_ns(ct_session s) {
    if (__atomic_load_n(&ct__forked, __ATOMIC_ACQUIRE)) return 0;
    return ct__session_now(s);
}

ct_status ct_tracer_begin(ct_session s) {
    FORK_GUARD("ct_tracer_begin");
    return ct__tracer_begin(s);
}

ct_status ct_tracer_begin_earlier(ct_session s, uint64_t earlier_ns) {
    FORK_GUARD("ct_tracer_begin_earlier");
    return ct__tracer_begin_earlier(s, earlier_ns);
}

ct_status ct_tracer_begin_at(ct_session s, uint64_t earlier_ns, uint64_t *now_ns) {
    FORK_GUARD("ct_tracer_begin_at");
    return ct__tracer_begin_at(s, earlier_ns, now_ns, "ct_tracer_begin_at");
}

ct_status ct_tracer_exclude_earlier(ct_session s, uint64_t earlier_ns) {
    FORK_GUARD("ct_tracer_exclude_earlier");
    return ct__tracer_exclude_earlier(s, earlier_ns);
}

uint64_t ct_tracer_estimated_ns(ct_session s) {
    if (__atomic_load_n(&ct__forked, __ATOMIC_ACQUIRE)) return 0;
    return ct__tracer_estimated_ns(s);
}

ct_status ct_tracer_end(ct_session s) {
    FORK_GUARD("ct_tracer_end");
    return ct__tracer_end(s);
}

uint64_t ct_tracer_ns(ct_session s) {
    if (__atomic_load_n(&ct__forked, __ATOMIC_ACQUIRE)) return 0;
    return ct__tracer_ns(s);
}

ct_status ct_record_op(ct_session s, ct_span span, const ct_op *op) {
    FORK_GUARD("ct_record_op");
    return (ct_status)ctgo_record_op(s, span, (ct_op *)op);
}

ct_status ct_record_tensor(ct_session s, ct_span span, const ct_tensor *t) {
    FORK_GUARD("ct_record_tensor");
    return (ct_status)ctgo_record_tensor(s, span, (ct_tensor *)t);
}

ct_status ct_record_tensor_stats(ct_session s, ct_span span, const ct_tensor_stats *st) {
    FORK_GUARD("ct_record_tensor_stats");
    return (ct_status)ctgo_record_tensor_stats(s, span, (ct_tensor_stats *)st);
}

ct_status ct_record_tensor_stats_f32(ct_session s, ct_span span, const char *label,
                                     const float *data, const int64_t *shape, size_t rank) {
    FORK_GUARD("ct_record_tensor_stats_f32");
    return (ct_status)ctgo_record_tensor_stats_f32(s, span, CSTR(label), (float *)data,
                                                   (int64_t *)shape, rank);
}

ct_status ct_record_scalar(ct_session s, ct_span span, const char *label, double value) {
    FORK_GUARD("ct_record_scalar");
    /* An aggregate session folds scalars without a call into Go. */
    int handled;
    ct_status st = ct__agg_scalar(s, span, label, value, &handled);
    if (handled) return st;
    return (ct_status)ctgo_record_scalar(s, span, CSTR(label), value);
}

ct_status ct_record_memory(ct_session s, ct_span span, ct_memory_action action,
                           const ct_memory *m) {
    FORK_GUARD("ct_record_memory");
    return (ct_status)ctgo_record_memory(s, span, (uint32_t)action, (ct_memory *)m);
}

ct_status ct_record_device_memory(ct_session s, const ct_device_memory *m) {
    FORK_GUARD("ct_record_device_memory");
    return (ct_status)ctgo_record_device_memory(s, (ct_device_memory *)m);
}

ct_status ct_record_device_interval(ct_session s, ct_span span, const ct_device_interval *d) {
    FORK_GUARD("ct_record_device_interval");
    return (ct_status)ctgo_record_device_interval(s, span, (ct_device_interval *)d);
}

ct_status ct_record_call_edge(ct_session s, ct_span from, ct_span to, uint64_t host_duration_ns) {
    FORK_GUARD("ct_record_call_edge");
    return (ct_status)ctgo_record_call_edge(s, from, to, host_duration_ns);
}

ct_status ct_record_data_edge(ct_session s, const char *from_tensor, const char *to_tensor) {
    FORK_GUARD("ct_record_data_edge");
    return (ct_status)ctgo_record_data_edge(s, CSTR(from_tensor), CSTR(to_tensor));
}

ct_status ct_record_gradient(ct_session s, const char *root, const char *key,
                             ct_gradient_state state, const double *norm) {
    FORK_GUARD("ct_record_gradient");
    return (ct_status)ctgo_record_gradient(s, CSTR(root), CSTR(key), (uint32_t)state,
                                           (double *)norm);
}

ct_status ct_device_start(ct_session s, const char *options_json) {
    FORK_GUARD("ct_device_start");
    return (ct_status)ctgo_device_start(s, CSTR(options_json));
}

ct_status ct_device_stop(ct_session s) {
    FORK_GUARD("ct_device_stop");
    return (ct_status)ctgo_device_stop(s);
}

ct_status ct_aggregate_enable(ct_session s, int enabled) {
    FORK_GUARD("ct_aggregate_enable");
    return (ct_status)ctgo_aggregate_enable(s, enabled);
}

ct_status ct_aggregate_trigger(ct_session s, uint64_t update, const char *trigger, double value,
                               double threshold, const char *detail, const char *trace,
                               const char *no_trace) {
    FORK_GUARD("ct_aggregate_trigger");
    return (ct_status)ctgo_aggregate_trigger(s, update, CSTR(trigger), value, threshold, CSTR(detail),
                                             CSTR(trace), CSTR(no_trace));
}

ct_status ct_flush(ct_session s) {
    FORK_GUARD("ct_flush");
    return (ct_status)ctgo_flush(s);
}

ct_status ct_finish(ct_session s) {
    FORK_GUARD("ct_finish");
    return (ct_status)ctgo_finish(s);
}

ct_status ct_finish_failed(ct_session s, const char *reason) {
    FORK_GUARD("ct_finish_failed");
    return (ct_status)ctgo_finish_failed(s, CSTR(reason));
}

ct_status ct_discard(ct_session s) {
    FORK_GUARD("ct_discard");
    return (ct_status)ctgo_discard(s);
}

ct_status ct_reopen(ct_session s, const char *path, uint64_t capture_step, ct_session *out) {
    FORK_GUARD("ct_reopen");
    /* Most updates of a flight recorder: in C alone (rearm.c). */
    if (ct__rearm(s, path, capture_step, out) == CT_OK) return CT_OK;
    return (ct_status)ctgo_reopen(s, CSTR(path), capture_step, out);
}

uint64_t ct_dropped_records(ct_session s) {
    if (__atomic_load_n(&ct__forked, __ATOMIC_ACQUIRE)) return 0;
    return ctgo_dropped_records(s);
}

const char *ct_last_error(void) { return ct__errbuf(); }

const char *ct_version(void) { return CT_LIBRARY_VERSION; }

uint32_t ct_abi_version(void) { return CT_ABI_VERSION; }

/* Drop-in mode (ambient.go). The Go side opens the session from a package
 * init; these shims wait for it by calling a Go export, which blocks until
 * the Go runtime and package inits are done. */
ct_session ct_ambient_session(void) {
    if (__atomic_load_n(&ct__forked, __ATOMIC_ACQUIRE)) return 0;
    if (!getenv("CANDLE_TRACE_PATH")) return 0;
    return ctgo_ambient_handle();
}

static void ambient_exit(void) {
    /* A fork child must not touch Go; its parent finishes the session. */
    if (__atomic_load_n(&ct__forked, __ATOMIC_ACQUIRE)) return;
    ctgo_ambient_exit();
}

/* A program linked with this library and run under the drop-in shim
 * initialises the library before the shim: the shim's fatal-signal handlers
 * must still go in before the Go runtime's, which forwards the faults of
 * non-Go code only to a handler that was there before it. Priority 101 puts
 * this ahead of the Go runtime's own initialiser in .init_array; the shim,
 * preloaded, is mapped already. Without the shim: nothing. */
__attribute__((constructor(101))) static void ct_preload_early(void) {
    void (*early)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "ct__preload_install_early");
    if (early) early();
}

/* Registered at load, so a program that exits before the Go runtime has
 * finished starting still finishes its trace. */
__attribute__((constructor)) static void ambient_init(void) {
    if (getenv("CANDLE_TRACE_PATH")) atexit(ambient_exit);
}
