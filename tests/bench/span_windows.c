/* Whether a span pair's cost is a property of the process or of the moment
 * (issue 14's "bimodality"): one thread, windows of ~60 ms 30 ms apart; in
 * each window, chunk by chunk interleaved, the span pair, two rdtsc alone,
 * two rdtsc around a handful of plain stores and adds (no library), a
 * chain of 24 dependent multiplies (72 cycles of the core's clock), and 32
 * independent loads and adds in four chains (throughput-bound: what a core
 * shared with another hardware thread runs slower, where the chain does
 * not). A line per window: the five chunk medians, ns per iteration, and
 * the CPU the process's other threads (the drainer) spent in the window.
 *
 *     make bench-span-windows      # or: build/span_windows [WINDOWS] [trace]
 *
 * CANDLE_TRACE_RING_KB sizes the ring, as for any program. The trace or
 * summary goes to /tmp and is removed at the end. */
#define _DEFAULT_SOURCE
#include "candle_trace.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { CHUNKS = 31, PAIRS = 2000 };

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static inline uint64_t counter(void) {
    unsigned lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v) {
    qsort(v, CHUNKS, sizeof *v, by_value);
    return v[CHUNKS / 2];
}

static uint64_t scratch[8192];

/* CPU ns of the process's other threads (the drainer, Go's), from schedstat. */
static uint64_t others_cpu_ns(void) {
    char me[32], path[300];
    snprintf(me, sizeof me, "%ld", (long)getpid());
    DIR *d = opendir("/proc/self/task");
    if (!d) return 0;
    uint64_t sum = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, me) == 0) continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/schedstat", e->d_name);
        FILE *f = fopen(path, "r");
        unsigned long long ns = 0;
        if (f && fscanf(f, "%llu", &ns) == 1) sum += ns;
        if (f) fclose(f);
    }
    closedir(d);
    return sum;
}

int main(int argc, char **argv) {
    int windows = argc > 1 ? atoi(argv[1]) : 25;
    int trace = argc > 2 && strcmp(argv[2], "trace") == 0;
    const char *run = trace
        ? "{\"entrypoint\":\"span_windows\",\"phase\":\"infer\",\"capture_step\":1,\"device\":\"cpu\",\"measured_root\":true}"
        : "{\"entrypoint\":\"span_windows\",\"phase\":\"infer\",\"capture_step\":1,\"device\":\"cpu\",\"mode\":\"aggregate\"}";
    const char *path = trace ? "/tmp/span_windows.jsonl" : "/tmp/span_windows.json";
    ct_session s;
    if (ct_open(path, run, &s) != CT_OK) {
        fprintf(stderr, "span_windows: %s\n", ct_last_error());
        return 1;
    }
    double pair[CHUNKS], bare[CHUNKS], work[CHUNKS], alu[CHUNKS], wide[CHUNKS];
    uint64_t acc = 0, pos = 0;
    printf("%s, ns per iteration, chunk medians per window: span pair / 2x rdtsc / 2x rdtsc + stores / 24 dependent multiplies / 32 independent loads+adds; then the other threads' CPU in the window (us)\n",
           trace ? "trace mode" : "aggregate mode");
    for (int w = 0; w < windows; w++) {
        uint64_t others0 = others_cpu_ns();
        for (int c = 0; c < CHUNKS; c++) {
            ct_span sp;
            uint64_t t0 = now_ns();
            for (int i = 0; i < PAIRS; i++) {
                if (ct_span_begin(s, "layer/forward", CT_SPAN_FUNCTION, CT_STEP_NONE, &sp) != CT_OK ||
                    ct_span_end(s, sp) != CT_OK) {
                    fprintf(stderr, "span_windows: %s\n", ct_last_error());
                    return 1;
                }
            }
            uint64_t t1 = now_ns();
            for (int i = 0; i < PAIRS; i++) acc += counter() + counter();
            uint64_t t2 = now_ns();
            for (int i = 0; i < PAIRS; i++) {
                uint64_t x = counter(), *p = &scratch[pos & 8191];
                p[0] = x;
                p[1] = acc;
                acc += x * 3 + (acc >> 7);
                p[2] = acc;
                pos += 5;
                p[3] = counter() - x;
            }
            uint64_t t3 = now_ns();
            for (int i = 0; i < PAIRS; i++) /* a chain of 24 dependent multiplies: the core's clock */
                for (int k = 0; k < 24; k++) __asm__ volatile("imul $3, %0, %0" : "+r"(acc));
            uint64_t t4 = now_ns();
            uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
            for (int i = 0; i < PAIRS; i++) {
                const volatile uint64_t *q = &scratch[(pos + (uint64_t)i * 8) & 8160];
                for (int k = 0; k < 8; k++) {
                    a0 += q[k];
                    a1 ^= q[k] + 1;
                    a2 += q[k] >> 1;
                    a3 -= q[k];
                }
            }
            acc += a0 + a1 + a2 + a3;
            uint64_t t5 = now_ns();
            wide[c] = (double)(t5 - t4) / PAIRS;
            pair[c] = (double)(t1 - t0) / PAIRS;
            alu[c] = (double)(t4 - t3) / PAIRS;
            bare[c] = (double)(t2 - t1) / PAIRS;
            work[c] = (double)(t3 - t2) / PAIRS;
        }
        uint64_t others = others_cpu_ns() - others0;
        printf("%5.1f %5.1f %5.1f %5.1f %5.1f %6.0f\n", median(pair), median(bare), median(work), median(alu), median(wide),
               others / 1e3);
        fflush(stdout);
        struct timespec gap = {0, 30000000};
        nanosleep(&gap, NULL);
    }
    if (ct_finish(s) != CT_OK) {
        fprintf(stderr, "span_windows: %s\n", ct_last_error());
        return 1;
    }
    remove(path); /* what it wrote is not the point: the times are */
    return acc == 42 ? 2 : 0; /* acc is used: the loops are not optimised away */
}
