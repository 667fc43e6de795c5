/* The burst every system of the peer benchmark runs (tests/bench/peers/run.py).
 *
 *   burst_<system> VARIANT DIR burst PAIRS THREADS
 *       every thread: an outer span, WARMUP untimed pairs, then (after all
 *       threads are warm) PAIRS begin+end pairs of one name nested in the
 *       outer span, timed in chunks of CHUNK pairs
 *   burst_<system> VARIANT DIR sustained EVENTS
 *       one thread, EVENTS/2 pairs after the same warm-up, timed as a whole
 *       through peer_close (for candle-trace and LTTng: until on disk)
 *
 * Prints one line `RESULT key=value ...` for the runner. The warm-up is
 * excluded from every figure the same way for every system: wall time and
 * CPU are read after all threads finished it. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "peer.h"

#define CHUNK 100
#define WARMUP 1000

/* CLOCK_MONOTONIC for wall time; CLOCK_PROCESS_CPUTIME_ID for this
 * process's CPU, every thread's (a drainer's too), user and system, in ns. */
static uint64_t clock_ns(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}
#define now() clock_ns(CLOCK_MONOTONIC)
#define cpu_ns() clock_ns(CLOCK_PROCESS_CPUTIME_ID)

static int by_value(const void *a, const void *b) {
    double d = *(const double *)a - *(const double *)b;
    return (d > 0) - (d < 0);
}

static long pairs;
static int chunked;
static pthread_barrier_t warm, go;
static double *chunk_ns; /* [thread][chunk] */
static uint64_t *burst_end;
static uint64_t start;

static void *worker(void *arg) {
    long t = (long)arg;
    peer_thread_start();
    peer_begin(PEER_OUTER_NAME);
    for (int i = 0; i < WARMUP; i++) {
        peer_begin(PEER_SPAN_NAME);
        peer_end();
    }
    pthread_barrier_wait(&warm);
    pthread_barrier_wait(&go); /* the main thread read the clocks in between */
    if (chunked) {
        double *per = chunk_ns + t * (pairs / CHUNK);
        for (long c = 0; c < pairs / CHUNK; c++) {
            uint64_t t0 = now();
            for (int i = 0; i < CHUNK; i++) {
                peer_begin(PEER_SPAN_NAME);
                peer_end();
            }
            per[c] = (double)(now() - t0) / CHUNK;
        }
    } else {
        for (long i = 0; i < pairs; i++) {
            peer_begin(PEER_SPAN_NAME);
            peer_end();
        }
    }
    burst_end[t] = now();
    peer_end();
    peer_thread_stop();
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5 || (strcmp(argv[3], "burst") && strcmp(argv[3], "sustained")) ||
        (!strcmp(argv[3], "burst") && argc < 6)) {
        fprintf(stderr, "usage: %s VARIANT DIR burst PAIRS THREADS | VARIANT DIR sustained EVENTS\n", argv[0]);
        return 2;
    }
    const char *variant = argv[1], *dir = argv[2];
    chunked = !strcmp(argv[3], "burst");
    int threads = chunked ? atoi(argv[5]) : 1;
    pairs = chunked ? atol(argv[4]) / CHUNK * CHUNK : atol(argv[4]) / 2;
    if (pairs <= 0 || threads <= 0 || threads > 64) {
        fprintf(stderr, "bad PAIRS/EVENTS or THREADS\n");
        return 2;
    }
    chunk_ns = calloc((size_t)threads * (pairs / CHUNK + 1), sizeof *chunk_ns);
    burst_end = calloc((size_t)threads, sizeof *burst_end);
    pthread_barrier_init(&warm, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&go, NULL, (unsigned)threads + 1);

    peer_open(dir, variant, threads);
    pthread_t th[64];
    for (long t = 0; t < threads; t++)
        pthread_create(&th[t], NULL, worker, (void *)t);
    pthread_barrier_wait(&warm);
    uint64_t cpu0 = cpu_ns(), out0 = peer_outside_cpu_ns();
    start = now();
    pthread_barrier_wait(&go);
    for (int t = 0; t < threads; t++)
        pthread_join(th[t], NULL);
    peer_close();
    uint64_t closed = now();
    uint64_t cpu = cpu_ns() - cpu0, out = peer_outside_cpu_ns() - out0;

    double total = (double)pairs * threads;
    double mean = 0;
    for (int t = 0; t < threads; t++)
        mean += (double)(burst_end[t] - start) / pairs;
    mean /= threads;
    double median = 0, p99 = 0;
    if (chunked) {
        long n = (long)threads * (pairs / CHUNK);
        qsort(chunk_ns, (size_t)n, sizeof *chunk_ns, by_value);
        median = chunk_ns[n / 2];
        p99 = chunk_ns[n * 99 / 100];
    }
    /* Peak resident memory of this program: VmHWM, not getrusage's ru_maxrss,
     * which Linux carries across exec from the (larger) process that forked us. */
    double hwm_kib = 0;
    FILE *st = fopen("/proc/self/status", "r");
    char line[256];
    while (st && fgets(line, sizeof line, st))
        if (sscanf(line, "VmHWM: %lf kB", &hwm_kib) == 1)
            break;
    if (st)
        fclose(st);
    /* Every span the run opened: outer + warm-up + timed, begin and end each. */
    long events = 2L * threads * (1 + WARMUP + pairs);
    printf("RESULT mode=%s threads=%d pairs=%ld median_ns=%.2f p99_ns=%.2f mean_ns=%.2f "
           "cpu_ns=%.1f outside_cpu_ns=%.1f secs_to_close=%.4f events=%ld max_rss_mib=%.1f sink=%s\n",
           argv[3], threads, pairs, median, p99, mean, cpu / total, out / total, (closed - start) / 1e9, events,
           hwm_kib / 1024.0, peer_sink());
    return 0;
}
