/* test_aggregate — aggregate sessions through the C ABI.
 *
 *   build/test_aggregate OUT_DIR
 *
 * Writes one candle-trace/aggregate/1 summary per test into OUT_DIR and
 * checks the numbers in it (tests/c/run.sh then reads every summary with
 * `candle-trace report`, whose reader checks the format and that counts
 * equal their buckets). Run it once per tick source: as is, and with
 * CANDLE_TRACE_AGG_CLOCK=monotonic. The last line is
 * `test_aggregate: N passed, M failed`.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "candle_trace.h"

static int g_pass, g_fail;
static const char *g_out;
static const char *g_section = "";

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (cond) {                                                               \
            g_pass++;                                                             \
        } else {                                                                  \
            fprintf(stderr, "FAIL [%s] %s:%d: ", g_section, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                         \
            fputc('\n', stderr);                                                  \
            g_fail++;                                                             \
        }                                                                         \
    } while (0)

#define OK(call)                                                                    \
    do {                                                                            \
        ct_status st_ = (call);                                                     \
        CHECK(st_ == CT_OK, "%s -> %d: %s", #call, (int)st_, ct_last_error());      \
    } while (0)

#define REFUSED(call, code, substr)                                                              \
    do {                                                                                         \
        ct_status st_ = (call);                                                                  \
        const char *msg_ = ct_last_error();                                                      \
        CHECK(st_ == (code) && strstr(msg_, (substr)), "%s -> %d \"%s\", want %d with \"%s\"", \
              #call, (int)st_, msg_, (int)(code), (substr));                                     \
    } while (0)

static const char RUN[] = "{\"entrypoint\":\"agg::test\",\"phase\":\"train\",\"device\":\"cpu\",\"mode\":\"aggregate\"}";

static char *out_path(const char *name) {
    static char buf[8][4096];
    static int i;
    char *p = buf[i++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", g_out, name);
    return p;
}

static ct_session open_agg(const char *file) {
    ct_session s = 0;
    ct_status st = ct_open(out_path(file), RUN, &s);
    CHECK(st == CT_OK, "ct_open(%s): %s", file, ct_last_error());
    return s;
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* ---- reading our own summaries --------------------------------------------
 * The writer puts one span per line; a field is found on the line of the span
 * (name, step). Readers in general must not rely on that layout, but this
 * test checks this writer. */

typedef struct {
    int found;
    uint64_t count, total, min, max;
} span_stats;

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    size_t got = fread(b, 1, (size_t)n, f);
    b[got] = 0;
    fclose(f);
    return b;
}

static uint64_t field(const char *line, const char *end, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    if (!p || p > end) return UINT64_MAX;
    return strtoull(p + strlen(pat), NULL, 10);
}

/* step NULL: the entry without a step. */
static span_stats span_in(const char *file, const char *name, const char *step) {
    span_stats r = {0};
    char *doc = slurp(out_path(file));
    if (!doc) return r;
    char pat[512];
    snprintf(pat, sizeof pat, "{\"name\":\"%s\",", name);
    for (const char *p = strstr(doc, pat); p; p = strstr(p + 1, pat)) {
        const char *end = strchr(p, '\n');
        if (!end) end = p + strlen(p);
        const char *sp = strstr(p, "\"step\":\"");
        int has_step = sp && sp < end;
        if (step ? !(has_step && strncmp(sp + 8, step, strlen(step)) == 0 && sp[8 + strlen(step)] == '"') : has_step)
            continue;
        r.found++;
        r.count = field(p, end, "count");
        r.total = field(p, end, "total_ns");
        r.min = field(p, end, "min_ns");
        r.max = field(p, end, "max_ns");
    }
    free(doc);
    return r;
}

/* Sum of every span entry's count in a summary. */
static uint64_t all_counts(const char *file, int *entries) {
    char *doc = slurp(out_path(file));
    uint64_t sum = 0;
    *entries = 0;
    if (!doc) return 0;
    for (const char *p = strstr(doc, "{\"name\":"); p; p = strstr(p + 1, "{\"name\":")) {
        const char *end = strchr(p, '\n');
        if (!end) end = p + strlen(p);
        uint64_t c = field(p, end, "count");
        if (c != UINT64_MAX) {
            sum += c;
            (*entries)++;
        }
    }
    free(doc);
    return sum;
}

static void spans(ct_session s, const char *name, ct_step step, int n) {
    for (int i = 0; i < n; i++) {
        ct_span sp = 0;
        ct_status st = ct_span_begin(s, name, CT_SPAN_FUNCTION, step, &sp);
        if (st == CT_OK) st = ct_span_end(s, sp);
        if (st != CT_OK) {
            CHECK(0, "span %s: %s", name, ct_last_error());
            return;
        }
    }
}

/* ---- tests ---------------------------------------------------------------- */

/* The per-thread name cache keys on the name's address first: a buffer that
 * is reused for another name, or fresh buffers with one name, must still
 * count per name. */
static void test_name_cache(void) {
    g_section = "name cache";
    ct_session s = open_agg("cache.json");
    char buf[64];
    strcpy(buf, "alpha");
    spans(s, buf, CT_STEP_NONE, 10);
    strcpy(buf, "beta");
    spans(s, buf, CT_STEP_NONE, 20);
    strcpy(buf, "alphabet"); /* "alpha" is a prefix: must not match */
    spans(s, buf, CT_STEP_NONE, 3);
    strcpy(buf, "alpha");
    spans(s, buf, CT_STEP_NONE, 5);
    for (int i = 0; i < 30; i++) {
        char *fresh = strdup("gamma");
        spans(s, fresh, CT_STEP_NONE, 1);
        free(fresh);
    }
    spans(s, "gamma", CT_STEP_FORWARD, 7);
    spans(s, "gamma", CT_STEP_BACKWARD, 8);
    /* More names than the address table has slots, twice over. */
    char name[32];
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < 300; i++) {
            snprintf(name, sizeof name, "many/%03d", i);
            spans(s, name, CT_STEP_NONE, 1);
        }
    OK(ct_finish(s));
    span_stats a = span_in("cache.json", "alpha", NULL), b = span_in("cache.json", "beta", NULL),
               ab = span_in("cache.json", "alphabet", NULL), g = span_in("cache.json", "gamma", NULL),
               gf = span_in("cache.json", "gamma", "forward"), gb = span_in("cache.json", "gamma", "backward");
    CHECK(a.found == 1 && a.count == 15, "alpha: %d entries, count %llu, want 1 entry of 15", a.found, (unsigned long long)a.count);
    CHECK(b.found == 1 && b.count == 20, "beta: count %llu, want 20", (unsigned long long)b.count);
    CHECK(ab.found == 1 && ab.count == 3, "alphabet: count %llu, want 3", (unsigned long long)ab.count);
    CHECK(g.found == 1 && g.count == 30, "gamma: %d entries, count %llu, want 1 of 30", g.found, (unsigned long long)g.count);
    CHECK(gf.count == 7 && gb.count == 8, "gamma per step: %llu forward, %llu backward, want 7 and 8",
          (unsigned long long)gf.count, (unsigned long long)gb.count);
    int bad = 0;
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "many/%03d", i);
        span_stats m = span_in("cache.json", name, NULL);
        if (m.found != 1 || m.count != 2) bad++;
    }
    CHECK(bad == 0, "%d of the 300 many/NNN names do not have count 2", bad);
}

/* Keys belong to one session: a thread's cache must not carry them into the
 * next session, nor mix two sessions open at once. */
static void test_sessions(void) {
    g_section = "sessions";
    ct_session s1 = open_agg("first.json");
    spans(s1, "x", CT_STEP_NONE, 1);
    spans(s1, "y", CT_STEP_NONE, 1);
    OK(ct_finish(s1));
    /* Interned in the other order: key 1 is "y" here. */
    ct_session s2 = open_agg("second.json");
    spans(s2, "y", CT_STEP_NONE, 4);
    spans(s2, "x", CT_STEP_NONE, 2);
    ct_session s3 = open_agg("third.json");
    for (int i = 0; i < 1000; i++) {
        spans(s2, "x", CT_STEP_NONE, 1);
        spans(s3, "x", CT_STEP_NONE, 2);
        spans(s3, "z", CT_STEP_NONE, 1);
    }
    OK(ct_finish(s2));
    OK(ct_finish(s3));
    span_stats x2 = span_in("second.json", "x", NULL), y2 = span_in("second.json", "y", NULL);
    span_stats x3 = span_in("third.json", "x", NULL), z3 = span_in("third.json", "z", NULL),
               y3 = span_in("third.json", "y", NULL);
    CHECK(x2.count == 1002 && y2.count == 4, "second: x %llu y %llu, want 1002 and 4", (unsigned long long)x2.count,
          (unsigned long long)y2.count);
    CHECK(x3.count == 2000 && z3.count == 1000 && !y3.found, "third: x %llu z %llu (y found %d), want 2000, 1000, none",
          (unsigned long long)x3.count, (unsigned long long)z3.count, y3.found);
}

/* A span counts when statistics were on at its begin and at its end. */
static void test_enable_window(void) {
    g_section = "enable";
    ct_session s = open_agg("window.json");
    ct_span a, b;
    spans(s, "on", CT_STEP_NONE, 5);
    OK(ct_aggregate_enable(s, 0));
    spans(s, "on", CT_STEP_NONE, 100);
    OK(ct_span_begin(s, "edge", CT_SPAN_FUNCTION, CT_STEP_NONE, &a)); /* begins off, ends on */
    OK(ct_aggregate_enable(s, 1));
    OK(ct_span_end(s, a));
    OK(ct_span_begin(s, "edge", CT_SPAN_FUNCTION, CT_STEP_NONE, &b)); /* begins on, ends off */
    OK(ct_aggregate_enable(s, 0));
    OK(ct_span_end(s, b));
    OK(ct_aggregate_enable(s, 1));
    spans(s, "on", CT_STEP_NONE, 6);
    spans(s, "edge", CT_STEP_NONE, 1);
    OK(ct_finish(s));
    span_stats on = span_in("window.json", "on", NULL), edge = span_in("window.json", "edge", NULL);
    CHECK(on.count == 11, "on: %llu, want 11", (unsigned long long)on.count);
    CHECK(edge.count == 1, "edge: %llu, want 1 (only the span inside the window)", (unsigned long long)edge.count);
}

typedef struct {
    ct_session s;
    int n;
} worker_arg;

static void *worker(void *p) {
    worker_arg *w = p;
    for (int i = 0; i < w->n; i++) {
        ct_span outer, inner;
        if (ct_span_begin(w->s, "t/outer", CT_SPAN_FUNCTION, CT_STEP_NONE, &outer) ||
            ct_span_begin(w->s, "t/inner", CT_SPAN_FUNCTION, CT_STEP_FORWARD, &inner) || ct_span_end(w->s, inner) ||
            ct_span_end(w->s, outer)) {
            fprintf(stderr, "worker: %s\n", ct_last_error());
            return (void *)1;
        }
    }
    return NULL;
}

/* Four threads, far more records than a ring holds: nothing lost. */
static void test_threads(void) {
    g_section = "threads";
    ct_session s = open_agg("threads.json");
    pthread_t th[4];
    worker_arg w = {s, 250000};
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, worker, &w);
    int errs = 0;
    for (int i = 0; i < 4; i++) {
        void *rv;
        pthread_join(th[i], &rv);
        errs += rv != NULL;
    }
    CHECK(errs == 0, "%d workers failed", errs);
    OK(ct_finish(s));
    span_stats o = span_in("threads.json", "t/outer", NULL), in = span_in("threads.json", "t/inner", "forward");
    CHECK(o.count == 1000000 && in.count == 1000000, "outer %llu inner %llu, want 1000000 each",
          (unsigned long long)o.count, (unsigned long long)in.count);
    CHECK(in.max <= o.max, "an inner span (max %llu ns) outlasts every outer one (max %llu ns)",
          (unsigned long long)in.max, (unsigned long long)o.max);
}

static void spin_until(uint64_t t) {
    while (now_ns() < t) {
    }
}

/* Durations: each span busy-waits 300 us inside; the outer clock bounds it. */
static void test_durations(void) {
    g_section = "durations";
    ct_session s = open_agg("durations.json");
    enum { N = 40, INNER = 300000 };
    uint64_t outer_sum = 0, outer_max = 0;
    for (int i = 0; i < N; i++) {
        ct_span sp;
        uint64_t t0 = now_ns();
        OK(ct_span_begin(s, "spin", CT_SPAN_FUNCTION, CT_STEP_NONE, &sp));
        spin_until(now_ns() + INNER);
        OK(ct_span_end(s, sp));
        uint64_t d = now_ns() - t0;
        outer_sum += d;
        if (d > outer_max) outer_max = d;
    }
    OK(ct_finish(s));
    span_stats st = span_in("durations.json", "spin", NULL);
    CHECK(st.count == N, "count %llu, want %d", (unsigned long long)st.count, N);
    /* The tick rate's error is ~1e-5; allow 1e-3 and 1 us of rounding. */
    CHECK(st.min >= (uint64_t)(INNER * 0.999), "min %llu ns < the %d ns each span spins", (unsigned long long)st.min, INNER);
    CHECK(st.max <= (uint64_t)(outer_max * 1.001) + 1000, "max %llu ns > the longest call measured outside (%llu ns)",
          (unsigned long long)st.max, (unsigned long long)outer_max);
    CHECK(st.total >= (uint64_t)(N * (double)INNER * 0.999) && st.total <= (uint64_t)(outer_sum * 1.001) + N * 1000,
          "total %llu ns outside [%llu, %llu]", (unsigned long long)st.total, (unsigned long long)N * INNER,
          (unsigned long long)outer_sum);
}

typedef struct {
    ct_session s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stage; /* 1: span open; 2: may exit */
    long tid;
} holder_arg;

static void *holder(void *p) {
    holder_arg *h = p;
    ct_span sp;
    ct_status st = ct_span_begin(h->s, "held", CT_SPAN_FUNCTION, CT_STEP_NONE, &sp);
    pthread_mutex_lock(&h->mu);
    h->tid = (long)syscall(SYS_gettid);
    h->stage = st == CT_OK ? 1 : -1;
    pthread_cond_broadcast(&h->cv);
    while (h->stage != 2) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    return NULL; /* exits with "held" still open */
}

/* ct_finish refuses spans left open on any thread, also one that exited. */
static void test_open_spans(void) {
    g_section = "open spans";
    ct_session s = open_agg("open.json");
    holder_arg h = {.s = s, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    pthread_t th;
    pthread_create(&th, NULL, holder, &h);
    pthread_mutex_lock(&h.mu);
    while (h.stage == 0) pthread_cond_wait(&h.cv, &h.mu);
    pthread_mutex_unlock(&h.mu);
    char want[128];
    snprintf(want, sizeof want, "1 spans still open: thread %ld holds 1", h.tid);
    REFUSED(ct_finish(s), CT_ERR_STATE, want);
    ct_span mine, inner;
    OK(ct_span_begin(s, "outer", CT_SPAN_FUNCTION, CT_STEP_NONE, &mine));
    OK(ct_span_begin(s, "inner", CT_SPAN_FUNCTION, CT_STEP_NONE, &inner));
    REFUSED(ct_finish(s), CT_ERR_STATE, "holds 2 (innermost \"inner\")");
    REFUSED(ct_span_end(s, mine), CT_ERR_SPAN_MISMATCH, "not the innermost open span");
    OK(ct_span_end(s, inner));
    OK(ct_span_end(s, mine));
    pthread_mutex_lock(&h.mu);
    h.stage = 2;
    pthread_cond_broadcast(&h.cv);
    pthread_mutex_unlock(&h.mu);
    pthread_join(th, NULL);
    REFUSED(ct_finish(s), CT_ERR_STATE, want); /* the thread is gone; its span never ended */
    OK(ct_finish_failed(s, "a worker exited inside a span"));
    span_stats o = span_in("open.json", "outer", NULL);
    CHECK(o.count == 1, "outer: %llu, want 1 (statistics survive a failed finish)", (unsigned long long)o.count);
}

/* Bad input gets the codes and messages a trace session gives; records on
 * aggregate spans are checked against the ids handed out. */
static void test_inputs(void) {
    g_section = "inputs";
    ct_session s = open_agg("inputs.json");
    ct_span sp;
    REFUSED(ct_span_begin(s, NULL, CT_SPAN_FUNCTION, CT_STEP_NONE, &sp), CT_ERR_INVALID_ARGUMENT, "name is NULL");
    REFUSED(ct_span_begin(s, "x", CT_SPAN_FUNCTION, CT_STEP_NONE, NULL), CT_ERR_INVALID_ARGUMENT, "out is NULL");
    REFUSED(ct_span_begin(s, "bad \xff", CT_SPAN_FUNCTION, CT_STEP_NONE, &sp), CT_ERR_INVALID_ARGUMENT, "not valid UTF-8");
    REFUSED(ct_span_begin(s, " \t", CT_SPAN_FUNCTION, CT_STEP_NONE, &sp), CT_ERR_INVALID_ARGUMENT, "name is empty");
    REFUSED(ct_span_begin(s, "x", (ct_span_kind)9, CT_STEP_NONE, &sp), CT_ERR_INVALID_ARGUMENT, "unknown span kind 9");
    REFUSED(ct_span_begin(s, "x", CT_SPAN_FUNCTION, (ct_step)7, &sp), CT_ERR_INVALID_ARGUMENT, "unknown step 7");
    REFUSED(ct_span_begin(0, "x", CT_SPAN_FUNCTION, CT_STEP_NONE, &sp), CT_ERR_INVALID_HANDLE, "handle is 0");
    REFUSED(ct_span_end(s, 1), CT_ERR_SPAN_MISMATCH, "s1 is the root span");
    OK(ct_span_begin(s, "x", CT_SPAN_FUNCTION, CT_STEP_NONE, &sp));
    OK(ct_record_scalar(s, sp, "loss", 0.5));
    REFUSED(ct_record_scalar(s, sp + 100000, "loss", 0.5), CT_ERR_INVALID_HANDLE, "does not exist");
    OK(ct_span_end(s, sp));
    OK(ct_record_scalar(s, sp, "loss", 1.5)); /* ended spans too */
    ct_span m;
    OK(ct_measurement_begin(s, "measured", &m));
    OK(ct_span_end(s, m));
    REFUSED(ct_measurement_begin(s, "again", &m), CT_ERR_STATE, "already has its measured region");
    /* Tracer intervals: an aggregate session's spans are timed by the cycle
     * counter, which they do not correct; each call names itself. */
    uint64_t at = 7;
    REFUSED(ct_tracer_begin(s), CT_ERR_STATE, "ct_tracer_begin: session");
    REFUSED(ct_tracer_begin_earlier(s, 100), CT_ERR_STATE, "ct_tracer_begin_earlier: session");
    REFUSED(ct_tracer_begin_at(s, 100, &at), CT_ERR_STATE, "ct_tracer_begin_at: session");
    CHECK(at == 7, "a refused ct_tracer_begin_at wrote *now_ns (%llu)", (unsigned long long)at);
    REFUSED(ct_tracer_exclude_earlier(s, 100), CT_ERR_STATE, "ct_tracer_exclude_earlier: session");
    REFUSED(ct_tracer_exclude_earlier(s, 100), CT_ERR_STATE, "is an aggregate session");
    OK(ct_finish(s));
    REFUSED(ct_span_begin(s, "x", CT_SPAN_FUNCTION, CT_STEP_NONE, &sp), CT_ERR_INVALID_HANDLE, "already finished");
    span_stats x = span_in("inputs.json", "x", NULL);
    CHECK(x.count == 1, "x: %llu, want 1 (refused calls count nothing)", (unsigned long long)x.count);
}

typedef struct {
    int found;
    double count, mean, min, max, last, non_finite;
} scalar_stats;

static double dfield(const char *line, const char *end, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    if (!p || p > end) return -1e300;
    return strtod(p + strlen(pat), NULL);
}

static scalar_stats scalar_in(const char *file, const char *label) {
    scalar_stats r = {0};
    char *doc = slurp(out_path(file));
    if (!doc) return r;
    char pat[256];
    snprintf(pat, sizeof pat, "{\"label\":\"%s\",", label);
    const char *p = strstr(doc, pat);
    if (p) {
        const char *end = strchr(p, '\n');
        if (!end) end = p + strlen(p);
        r.found = 1;
        r.count = dfield(p, end, "count");
        r.mean = dfield(p, end, "mean");
        r.min = dfield(p, end, "min");
        r.max = dfield(p, end, "max");
        r.last = dfield(p, end, "last");
        r.non_finite = dfield(p, end, "non_finite");
    }
    free(doc);
    return r;
}

static void *scalar_thread(void *arg) {
    ct_session s = *(ct_session *)arg;
    for (int i = 0; i < 1000; i++)
        if (ct_record_scalar(s, 1, "from/thread", 2.0) != CT_OK) return (void *)1;
    return NULL;
}

/* ct_record_scalar in an aggregate session takes the C path: the label's key
 * from the thread's cache, 16 bytes into the ring, folded by the drainer. */
static void test_scalars(void) {
    g_section = "scalars";
    ct_session s = open_agg("scalars.json"), other = open_agg("scalars-other.json");
    ct_span sp;
    OK(ct_span_begin(s, "step", CT_SPAN_FUNCTION, CT_STEP_NONE, &sp));
    char label[16];
    for (int i = 1; i <= 100; i++) {
        strcpy(label, "loss"); /* one buffer, rewritten */
        OK(ct_record_scalar(s, sp, label, (double)i));
        OK(ct_record_scalar(other, 1, "loss", -1.0)); /* interleaved sessions, same label */
        strcpy(label, "lr");
        OK(ct_record_scalar(s, 1, label, 0.001));
    }
    OK(ct_record_scalar(s, sp, "loss", NAN));
    OK(ct_record_scalar(s, sp, "loss", INFINITY));
    OK(ct_aggregate_enable(s, 0));
    OK(ct_record_scalar(s, sp, "loss", 1e9)); /* off: not counted */
    OK(ct_aggregate_enable(s, 1));
    OK(ct_span_end(s, sp));
    pthread_t th;
    void *rv;
    pthread_create(&th, NULL, scalar_thread, &s);
    pthread_join(th, &rv);
    CHECK(rv == NULL, "scalars from a thread without spans failed");

    REFUSED(ct_record_scalar(s, sp, NULL, 1), CT_ERR_INVALID_ARGUMENT, "label is NULL");
    REFUSED(ct_record_scalar(s, sp, " ", 1), CT_ERR_INVALID_ARGUMENT, "label is empty");
    REFUSED(ct_record_scalar(s, sp, "bad \xff", 1), CT_ERR_INVALID_ARGUMENT, "label is not valid UTF-8");
    REFUSED(ct_record_scalar(s, sp, "(overflow)", 1), CT_ERR_INVALID_ARGUMENT, "ct_record_scalar: aggregate: (overflow) is reserved");
    char *long_label = malloc(1100);
    memset(long_label, 'x', 1099);
    long_label[1099] = 0;
    REFUSED(ct_record_scalar(s, sp, long_label, 1), CT_ERR_INVALID_ARGUMENT, "ct_record_scalar: aggregate: scalar label is 1099 bytes, more than 1024");
    free(long_label);
    REFUSED(ct_record_scalar(s, 0, "loss", 1), CT_ERR_INVALID_HANDLE, "span 0 is never valid");
    REFUSED(ct_record_scalar(s, sp + 1000000, "loss", 1), CT_ERR_INVALID_HANDLE, "does not exist in session");
    REFUSED(ct_record_scalar(0, 1, "loss", 1), CT_ERR_INVALID_HANDLE, "handle is 0");
    OK(ct_finish(s));
    OK(ct_finish(other));
    REFUSED(ct_record_scalar(s, 1, "loss", 1), CT_ERR_INVALID_HANDLE, "already finished");

    scalar_stats loss = scalar_in("scalars.json", "loss"), lr = scalar_in("scalars.json", "lr"),
                 th_s = scalar_in("scalars.json", "from/thread"), o = scalar_in("scalars-other.json", "loss");
    CHECK(loss.found && loss.count == 100 && loss.mean == 50.5 && loss.min == 1 && loss.max == 100 && loss.last == 100 &&
              loss.non_finite == 2,
          "loss: count %g mean %g min %g max %g last %g non_finite %g; want 100, 50.5, 1, 100, 100, 2", loss.count,
          loss.mean, loss.min, loss.max, loss.last, loss.non_finite);
    CHECK(lr.count == 100 && lr.mean == 0.001, "lr: count %g mean %g", lr.count, lr.mean);
    CHECK(th_s.count == 1000 && th_s.last == 2, "from/thread: count %g", th_s.count);
    CHECK(o.count == 100 && o.mean == -1, "the other session's loss: count %g mean %g", o.count, o.mean);
}

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &v) == 1) break;
    if (f) fclose(f);
    return v;
}

/* 10 M spans over 10,000 (name, step) pairs: resident memory flat once every
 * name has been seen; every span counted (past the 4096-key cap, in the
 * overflow entry). */
static void test_memory(void) {
    g_section = "memory";
    ct_session s = open_agg("memory.json");
    enum { NAMES = 3334, TOTAL = 10000000 };
    static char names[NAMES][24];
    for (int i = 0; i < NAMES; i++) snprintf(names[i], sizeof names[i], "layer%04d/op", i);
    long warm = 0;
    uint64_t t0 = now_ns();
    for (int i = 0; i < TOTAL; i++) {
        ct_span sp;
        int k = i % (NAMES * 3);
        if (ct_span_begin(s, names[k / 3], CT_SPAN_OP, (ct_step)(k % 3), &sp) || ct_span_end(s, sp)) {
            CHECK(0, "span %d: %s", i, ct_last_error());
            break;
        }
        if (i == 1000000) warm = rss_kib();
    }
    uint64_t dt = now_ns() - t0;
    long end = rss_kib();
    OK(ct_finish(s));
    printf("note: memory: 10 M spans in %.2f s, RSS %ld KiB after 1 M, %ld KiB at 10 M\n", dt / 1e9, warm, end);
    CHECK(warm > 0 && end - warm < 2048, "RSS grew from %ld KiB to %ld KiB after warm-up (want < 2 MiB)", warm, end);
    int entries;
    uint64_t sum = all_counts("memory.json", &entries);
    span_stats ov = span_in("memory.json", "(overflow)", NULL);
    CHECK(sum == TOTAL, "counts sum to %llu, want %d", (unsigned long long)sum, TOTAL);
    CHECK(entries == 4097 && ov.count > 0, "%d entries (overflow count %llu), want 4096 keys + (overflow)", entries,
          (unsigned long long)ov.count);
}

/* The summary is renamed over its path, so ct_open refuses a path where a
 * FIFO or a symbolic link stands (the rename would replace it) and leaves
 * both as they were. In a folder of its own: run.sh reads every *.json here. */
static void test_targets(void) {
    g_section = "targets";
    char dir[4096], fifo[4200], link[4200], victim[4200];
    snprintf(dir, sizeof dir, "%s/targets", g_out);
    snprintf(fifo, sizeof fifo, "%s/fifo.json", dir);
    snprintf(link, sizeof link, "%s/link.json", dir);
    snprintf(victim, sizeof victim, "%s/victim.txt", dir);
    mkdir(dir, 0755);
    unlink(fifo);
    unlink(link);
    CHECK(mkfifo(fifo, 0644) == 0, "mkfifo %s", fifo);
    FILE *f = fopen(victim, "w");
    if (f) {
        fputs("victim\n", f);
        fclose(f);
    }
    CHECK(symlink(victim, link) == 0, "symlink %s", link);

    ct_session s = 0;
    REFUSED(ct_open(fifo, RUN, &s), CT_ERR_IO, "is a named pipe (FIFO), not a regular file");
    CHECK(s == 0, "a refused ct_open stored a handle");
    REFUSED(ct_open(link, RUN, &s), CT_ERR_IO, "is a symbolic link, not a regular file");
    struct stat st;
    CHECK(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode), "the FIFO was replaced");
    char target[4200] = "";
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n > 0) target[n] = 0;
    CHECK(strcmp(target, victim) == 0, "the symbolic link was replaced (readlink: \"%s\")", target);
    char *v = slurp(victim);
    CHECK(v && strcmp(v, "victim\n") == 0, "the link's target changed: \"%s\"", v ? v : "(unreadable)");
    free(v);
}

/* ct_aggregate_trigger: the firings in the summary, in order; every bad field
 * refused with its status and message, nothing listed for it. */
static void test_triggers(void) {
    g_section = "triggers";
    ct_session s = open_agg("triggers.json");
    OK(ct_aggregate_trigger(s, 20, "non_finite", NAN, 0, "loss nan", "traces/update-000020-non_finite.jsonl", NULL));
    OK(ct_aggregate_enable(s, 0)); /* statistics off: a firing is still listed */
    OK(ct_aggregate_trigger(s, 37, "slow", 0.0685, 0.0521, NULL, NULL, "the run's cap of 3 traces was reached"));
    OK(ct_aggregate_enable(s, 1));
    REFUSED(ct_aggregate_trigger(0, 1, "slow", 1, 0, NULL, "t", NULL), CT_ERR_INVALID_HANDLE, "handle is 0");
    REFUSED(ct_aggregate_trigger(s, 0, "slow", 1, 0, NULL, "t", NULL), CT_ERR_INVALID_ARGUMENT,
            "ct_aggregate_trigger: update must be >= 1");
    REFUSED(ct_aggregate_trigger(s, 1, NULL, 1, 0, NULL, "t", NULL), CT_ERR_INVALID_ARGUMENT, "trigger is NULL");
    REFUSED(ct_aggregate_trigger(s, 1, " ", 1, 0, NULL, "t", NULL), CT_ERR_INVALID_ARGUMENT, "trigger must not be blank");
    REFUSED(ct_aggregate_trigger(s, 1, "s\xff", 1, 0, NULL, "t", NULL), CT_ERR_INVALID_ARGUMENT, "trigger is not valid UTF-8");
    REFUSED(ct_aggregate_trigger(s, 1, "slow", 1, NAN, NULL, "t", NULL), CT_ERR_INVALID_ARGUMENT, "threshold must be finite");
    REFUSED(ct_aggregate_trigger(s, 1, "slow", 1, 0, NULL, NULL, NULL), CT_ERR_INVALID_ARGUMENT, "exactly one of the two");
    REFUSED(ct_aggregate_trigger(s, 1, "slow", 1, 0, NULL, "", ""), CT_ERR_INVALID_ARGUMENT, "exactly one of the two");
    REFUSED(ct_aggregate_trigger(s, 1, "slow", 1, 0, NULL, "t", "why"), CT_ERR_INVALID_ARGUMENT, "exactly one of the two");
    char *longer = malloc(1100);
    memset(longer, 'x', 1099);
    longer[1099] = 0;
    REFUSED(ct_aggregate_trigger(s, 1, "slow", 1, 0, longer, "t", NULL), CT_ERR_INVALID_ARGUMENT,
            "detail is 1099 bytes, more than 1024");
    free(longer);
    OK(ct_finish(s));
    REFUSED(ct_aggregate_trigger(s, 1, "slow", 1, 0, NULL, "t", NULL), CT_ERR_INVALID_HANDLE, "");

    char *text = slurp(out_path("triggers.json"));
    CHECK(text && strstr(text, "\"triggers\": {\"max\":256,\"refused\":0,\"fired\":[\n"
                               "  {\"update\":20,\"trigger\":\"non_finite\",\"value\":\"NaN\",\"threshold\":0,"
                               "\"detail\":\"loss nan\",\"trace\":\"traces/update-000020-non_finite.jsonl\",\"no_trace\":\"\"},\n"
                               "  {\"update\":37,\"trigger\":\"slow\",\"value\":0.0685,\"threshold\":0.0521,\"detail\":\"\","
                               "\"trace\":\"\",\"no_trace\":\"the run's cap of 3 traces was reached\"}\n ]}"),
          "the summary's triggers: %s", text ? text : "(unreadable)");
    free(text);

    /* a trace session has no summary to list them in */
    ct_session t = 0;
    OK(ct_open(out_path("triggers-trace.jsonl"),
               "{\"entrypoint\":\"agg::test\",\"phase\":\"train\",\"device\":\"cpu\",\"capture_step\":1}", &t));
    REFUSED(ct_aggregate_trigger(t, 1, "slow", 1, 0, NULL, "t", NULL), CT_ERR_STATE, "is a trace session");
    OK(ct_finish_failed(t, "test over"));
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    g_out = argv[1];
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", g_out);
    if (system(cmd) != 0) return 2;
    test_name_cache();
    test_sessions();
    test_enable_window();
    test_threads();
    test_durations();
    test_open_spans();
    test_inputs();
    test_scalars();
    test_memory();
    test_targets();
    test_triggers();
    printf("test_aggregate: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}
