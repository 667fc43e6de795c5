/* LTTng-UST: a statically linked tracepoint provider (lttng_tp.h). run.py
 * starts lttng-sessiond, creates a session writing to DIR and enables
 * candle_bench:* before this process starts; the events go through
 * LTTng's per-CPU shared-memory ring buffers to lttng-consumerd, which writes
 * them as CTF under DIR. peer_close runs `lttng stop`, which returns once the
 * consumer has written what the buffers held, so the run ends with the events
 * on disk, as ct_finish does. The daemons' CPU (their pids in
 * PEERS_LTTNG_PIDS) is read around the burst. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LTTNG_UST_TRACEPOINT_DEFINE
#define LTTNG_UST_TRACEPOINT_CREATE_PROBES
#include "lttng_tp.h"
#include "peer.h"

static char sink[4096];

void peer_open(const char *dir, const char *variant, int threads) {
    (void)variant, (void)threads;
    snprintf(sink, sizeof sink, "%s (CTF, lttng-consumerd)", dir);
    if (!getenv("PEERS_LTTNG_SESSION")) {
        fprintf(stderr, "PEERS_LTTNG_SESSION unset: run me from tests/bench/peers/run.py\n");
        exit(2);
    }
}
void peer_thread_start(void) {}
void peer_thread_stop(void) {}
void peer_begin(const char *name) { lttng_ust_tracepoint(candle_bench, span_begin, name); }
void peer_end(void) { lttng_ust_tracepoint(candle_bench, span_end); }

void peer_close(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "lttng stop %s >&2", getenv("PEERS_LTTNG_SESSION"));
    if (system(cmd) != 0) {
        fprintf(stderr, "lttng stop failed\n");
        exit(1);
    }
}

/* The daemons' CPU, every thread's, in ns: their process CPU clocks
 * (clock_getcpuclockid), not /proc's utime/stime, whose 10 ms ticks are
 * 100 ns per pair of a 100 000-pair burst. */
uint64_t peer_outside_cpu_ns(void) {
    const char *pids = getenv("PEERS_LTTNG_PIDS");
    if (!pids)
        return 0;
    uint64_t total = 0;
    char *copy = strdup(pids), *save = NULL;
    for (char *p = strtok_r(copy, " ", &save); p; p = strtok_r(NULL, " ", &save)) {
        clockid_t id;
        struct timespec t;
        if (clock_getcpuclockid((pid_t)atol(p), &id) == 0 && clock_gettime(id, &t) == 0)
            total += (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
    }
    free(copy);
    return total;
}
const char *peer_sink(void) { return sink; }
