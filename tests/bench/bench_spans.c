/* Span begin+end cost from C, while the session writes to disk.
 * Prints one line per design: median and p99 ns per pair over bursts.
 *
 *   bench_spans DIR PAIRS                 trace and aggregate sessions, side by side
 *   bench_spans DIR PAIRS aggregate       aggregate sessions only (run it again with
 *                                         CANDLE_TRACE_AGG_CLOCK=monotonic)
 *   bench_spans DIR PAIRS trace           the trace fast path only (nothing else in the
 *                                         process: its CPU per pair is its own)
 *   bench_spans DIR 0 EVENTS [aggregate]  sustained: EVENTS events through one session
 *   bench_spans DIR CALLS tracer          the tracer's own intervals (ct_tracer_*), as the
 *                                         PyTorch op observer makes them per record function */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "candle_trace.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

/* Benchmark-only export: the straightforward design, one Go call per event.
 * Only build/bench/libcandle_trace.so exports it (cmd/libtrace/exports_bench.map). */
extern ct_status ctbench_naive_span_begin(ct_session, const char *, ct_span_kind, ct_step, ct_span *);
extern ct_status ctbench_naive_span_end(ct_session, ct_span);

static uint64_t now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* Process CPU (user + system, every thread: the drainer's too) in ns. */
static uint64_t cpu_ns(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000ull +
           ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ull;
}

/* Minor page faults of the process so far (first touches of fresh memory). */
static long minflt(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef ct_status (*begin_fn)(ct_session, const char *, ct_span_kind, ct_step, ct_span *);
typedef ct_status (*end_fn)(ct_session, ct_span);

#define CHUNK 100

static const char TRACE_RUN[] =
    "{\"entrypoint\":\"bench\",\"phase\":\"infer\",\"capture_step\":1,\"device\":\"cpu\",\"measured_root\":true}";
static const char AGG_RUN[] = "{\"entrypoint\":\"bench\",\"phase\":\"train\",\"device\":\"cpu\",\"mode\":\"aggregate\"}";

/* The floor a span pair is compared with: two clock_gettime calls, timed in
 * the same chunks, right before each fast-path run (its median, for the
 * fast path's line). */
static double baseline_median;

static void baseline(long pairs) {
    long chunks = pairs / CHUNK;
    double *per = malloc(sizeof(double) * chunks);
    volatile uint64_t sink = 0;
    uint64_t cpu0 = cpu_ns();
    uint64_t total0 = now();
    for (long c = 0; c < chunks; c++) {
        uint64_t t0 = now();
        for (int i = 0; i < CHUNK; i++) {
            uint64_t a = now();
            sink += now() - a;
        }
        per[c] = (double)(now() - t0) / CHUNK;
    }
    uint64_t total = now() - total0;
    double cpu = (double)(cpu_ns() - cpu0) / pairs;
    qsort(per, chunks, sizeof *per, cmp);
    baseline_median = per[chunks / 2];
    printf("%-34s pairs=%ld median=%.1f ns p99=%.1f ns mean=%.1f ns cpu/pair=%.0f ns\n", "baseline: 2x clock_gettime", pairs,
           per[chunks / 2], per[chunks * 99 / 100], (double)total / pairs, cpu);
#if defined(__x86_64__)
    /* The floor of a pair on the cycle counter: its two reads alone. */
    for (long c = 0; c < chunks; c++) {
        uint64_t t0 = now();
        for (int i = 0; i < CHUNK; i++) {
            sink += __rdtsc();
            sink += __rdtsc();
        }
        per[c] = (double)(now() - t0) / CHUNK;
    }
    qsort(per, chunks, sizeof *per, cmp);
    printf("%-34s pairs=%ld median=%.1f ns\n", "floor: 2x rdtsc", pairs, per[chunks / 2]);
#endif
    free(per);
    (void)sink;
}

static void run(const char *label, const char *path, const char *run_json, begin_fn b, end_fn e, long pairs) {
    ct_session s;
    if (ct_open(path, run_json, &s)) {
        fprintf(stderr, "open: %s\n", ct_last_error());
        exit(1);
    }
    long chunks = pairs / CHUNK;
    double *per = malloc(sizeof(double) * chunks);
    ct_span sp;
    long flt0 = minflt();
    uint64_t cpu0 = cpu_ns();
    uint64_t total0 = now();
    for (long c = 0; c < chunks; c++) {
        uint64_t t0 = now();
        for (int i = 0; i < CHUNK; i++) {
            if (b(s, "layer/forward", CT_SPAN_FUNCTION, CT_STEP_NONE, &sp) || e(s, sp)) {
                fprintf(stderr, "%s: %s\n", label, ct_last_error());
                exit(1);
            }
        }
        per[c] = (double)(now() - t0) / CHUNK;
    }
    uint64_t total = now() - total0;
    if (ct_finish(s)) {
        fprintf(stderr, "finish: %s\n", ct_last_error());
        exit(1);
    }
    uint64_t fin = now() - total0;
    double cpu = (double)(cpu_ns() - cpu0) / pairs; /* through ct_finish: all the drainer's work */
    qsort(per, chunks, sizeof *per, cmp);
    double median = per[chunks / 2], mean = (double)total / pairs;
    printf("%-34s pairs=%ld median=%.1f ns p99=%.1f ns mean=%.1f ns cpu/pair=%.0f ns events/s(incl. finish)=%.2fM "
           "mean/median=%.1f faults=%ld",
           label, pairs, median, per[chunks * 99 / 100], mean, cpu, 2.0 * pairs / (fin / 1e9) / 1e6, mean / median,
           minflt() - flt0);
    if (b == ct_span_begin && baseline_median > 0) printf(" vs-2x-clock_gettime=%.2f", median / baseline_median);
    printf("\n");
    free(per);
}

/* The tracer's intervals, per call pattern of the op observer (one thread, a
 * trace session that has had an interval, so every read is the session
 * clock's): ns per pattern, chunk median and mean. */
enum { T_BEGIN_END, T_BEGIN_READ_END, T_BEGIN_AT_END, T_EXCLUDE, T_READ_INSIDE, T_READ };

static ct_status tracer_pattern(ct_session s, int which, volatile uint64_t *sink) {
    ct_status st = CT_OK;
    uint64_t at = 0;
    switch (which) {
    case T_BEGIN_END: /* an interval that reads nothing */
        if (!(st = ct_tracer_begin(s))) st = ct_tracer_end(s);
        break;
    case T_BEGIN_READ_END: /* the observer until protocol 4: an op's start or end */
        if (!(st = ct_tracer_begin_earlier(s, 300))) {
            *sink += ct_now_ns(s);
            st = ct_tracer_end(s);
        }
        break;
    case T_BEGIN_AT_END: /* the same, the value from the call that opens it */
        if (!(st = ct_tracer_begin_at(s, 300, &at))) {
            *sink += at;
            st = ct_tracer_end(s);
        }
        break;
    case T_EXCLUDE: /* a record function the observer does not record */
        st = ct_tracer_exclude_earlier(s, 300);
        break;
    case T_READ_INSIDE: /* the same call; tracer_run opens an interval around it */
    case T_READ:
        *sink += ct_now_ns(s);
        break;
    }
    return st;
}

static void tracer_run(const char *dir, long calls) {
    static const char *const labels[] = {
        "tracer: begin + end", "tracer: begin_earlier + now + end", "tracer: begin_at + end",
        "tracer: exclude_earlier", "tracer: now inside an interval", "tracer: now (intervals had)",
    };
    char path[4096];
    snprintf(path, sizeof path, "%s/bench-tracer.jsonl", dir);
    ct_session s;
    if (ct_open(path, TRACE_RUN, &s)) {
        fprintf(stderr, "open: %s\n", ct_last_error());
        exit(1);
    }
    long chunks = calls / CHUNK;
    double *per = malloc(sizeof(double) * chunks);
    volatile uint64_t sink = 0;
    for (int which = T_BEGIN_END; which <= T_READ; which++) {
        if (which == T_READ_INSIDE && ct_tracer_begin(s)) break;
        uint64_t total0 = now();
        for (long c = 0; c < chunks; c++) {
            uint64_t t0 = now();
            for (int i = 0; i < CHUNK; i++) {
                if (tracer_pattern(s, which, &sink)) {
                    fprintf(stderr, "%s: %s\n", labels[which], ct_last_error());
                    exit(1);
                }
            }
            per[c] = (double)(now() - t0) / CHUNK;
        }
        uint64_t total = now() - total0;
        if (which == T_READ_INSIDE && ct_tracer_end(s)) break;
        qsort(per, chunks, sizeof *per, cmp);
        printf("%-34s calls=%ld median=%.1f ns p99=%.1f ns mean=%.1f ns vs-2x-clock_gettime=%.2f\n", labels[which],
               calls, per[chunks / 2], per[chunks * 99 / 100], (double)total / calls,
               baseline_median > 0 ? per[chunks / 2] / baseline_median : 0);
    }
    free(per);
    if (ct_finish(s)) {
        fprintf(stderr, "finish: %s\n", ct_last_error());
        exit(1);
    }
    unlink(path);
}

/* 50 M events through one session: throughput and peak resident memory. */
static void sustained(const char *path, long events, int aggregate) {
    ct_session s;
    if (ct_open(path, aggregate ? AGG_RUN : TRACE_RUN, &s)) {
        fprintf(stderr, "open: %s\n", ct_last_error());
        exit(1);
    }
    ct_span sp;
    uint64_t t0 = now();
    for (long i = 0; i < events / 2; i++) {
        if (ct_span_begin(s, "layer/forward", CT_SPAN_FUNCTION, CT_STEP_NONE, &sp) || ct_span_end(s, sp)) {
            fprintf(stderr, "sustained: %s\n", ct_last_error());
            exit(1);
        }
    }
    if (ct_finish(s)) {
        fprintf(stderr, "finish: %s\n", ct_last_error());
        exit(1);
    }
    double secs = (now() - t0) / 1e9;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    FILE *f = fopen(path, "r");
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fclose(f);
    unlink(path);
    if (aggregate)
        printf("sustained (aggregate): %ld events in %.2f s = %.2f M events/s folded (summary %ld bytes), max RSS %.1f MiB\n",
               events, secs, events / secs / 1e6, bytes, ru.ru_maxrss / 1024.0);
    else
        printf("sustained (trace): %ld events in %.2f s = %.2f M events/s written (%.0f MB/s of JSONL), max RSS %.1f MiB\n",
               events, secs, events / secs / 1e6, bytes / secs / 1e6, ru.ru_maxrss / 1024.0);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    long pairs = argc > 2 ? atol(argv[2]) : 100000;
    int agg_only = argc > 3 && strcmp(argv[3], "aggregate") == 0;
    int trace_only = argc > 3 && strcmp(argv[3], "trace") == 0;
    if (argc > 3 && strcmp(argv[3], "tracer") == 0) {
        for (int round = 0; round < 3; round++) {
            baseline(pairs);
            tracer_run(dir, pairs);
        }
        return 0;
    }
    if (argc > 3 && !agg_only && !trace_only) {
        char p[4096];
        int agg = argc > 4 && strcmp(argv[4], "aggregate") == 0;
        snprintf(p, sizeof p, "%s/bench-sustained.%s", dir, agg ? "json" : "jsonl");
        sustained(p, atol(argv[3]), agg);
        return 0;
    }
    const char *clock = getenv("CANDLE_TRACE_AGG_CLOCK");
    char agg_label[64];
    snprintf(agg_label, sizeof agg_label, "aggregate (%s)", clock && !strcmp(clock, "monotonic") ? "CLOCK_MONOTONIC" : "cycle counter");
    char p1[4096], p2[4096], p3[4096], p4[4096];
    snprintf(p1, sizeof p1, "%s/bench-fast.jsonl", dir);
    snprintf(p2, sizeof p2, "%s/bench-naive.jsonl", dir);
    snprintf(p3, sizeof p3, "%s/bench-aggregate.json", dir);
    snprintf(p4, sizeof p4, "%s/bench-naive-aggregate.json", dir);
    for (int round = 0; round < 3; round++) {
        baseline(pairs);
        if (trace_only) {
            run("trace: fast path (C ring)", p1, TRACE_RUN, ct_span_begin, ct_span_end, pairs);
            continue;
        }
        if (!agg_only) {
            run("trace: fast path (C ring)", p1, TRACE_RUN, ct_span_begin, ct_span_end, pairs);
            run("trace: naive (Go per event)", p2, TRACE_RUN, ctbench_naive_span_begin, ctbench_naive_span_end, pairs);
        }
        run(agg_label, p3, AGG_RUN, ct_span_begin, ct_span_end, pairs);
        if (!agg_only)
            run("aggregate: naive (Go per event)", p4, AGG_RUN, ctbench_naive_span_begin, ctbench_naive_span_end, pairs);
    }
    unlink(p3);
    unlink(p4);
    return 0;
}
