/* candle-trace through its public C ABI (include/candle_trace.h), trace mode
 * (JSONL written by the library's drainer thread) or aggregate mode (a
 * summary at finish), the session JSON of tests/bench/bench_spans.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "candle_trace.h"
#include "peer.h"

static const char TRACE_RUN[] =
    "{\"entrypoint\":\"bench\",\"phase\":\"infer\",\"capture_step\":1,\"device\":\"cpu\",\"measured_root\":true}";
static const char AGG_RUN[] = "{\"entrypoint\":\"bench\",\"phase\":\"train\",\"device\":\"cpu\",\"mode\":\"aggregate\"}";

static ct_session s;
static char path[4096];
/* The calling thread's open spans: the outer one and the pair's. */
static __thread ct_span stack[2];
static __thread int depth;

static void die(const char *what) {
    fprintf(stderr, "candle-trace %s: %s\n", what, ct_last_error());
    exit(1);
}

void peer_open(const char *dir, const char *variant, int threads) {
    (void)threads;
    int agg = !strcmp(variant, "aggregate");
    if (!agg && strcmp(variant, "trace")) {
        fprintf(stderr, "candle variant must be trace or aggregate\n");
        exit(2);
    }
    snprintf(path, sizeof path, "%s/candle-%s.%s", dir, variant, agg ? "json" : "jsonl");
    if (ct_open(path, agg ? AGG_RUN : TRACE_RUN, &s))
        die("open");
}
void peer_thread_start(void) {}
void peer_thread_stop(void) {}
void peer_begin(const char *name) {
    if (ct_span_begin(s, name, CT_SPAN_FUNCTION, CT_STEP_NONE, &stack[depth++]))
        die("span_begin");
}
void peer_end(void) {
    if (ct_span_end(s, stack[--depth]))
        die("span_end");
}
void peer_close(void) {
    if (ct_finish(s))
        die("finish");
}
uint64_t peer_outside_cpu_ns(void) { return 0; }
const char *peer_sink(void) { return path; }
