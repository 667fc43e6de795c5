/* test_abi — the C ABI of candle-trace, compiled against include/candle_trace.h.
 *
 *   build/test_abi OUT_DIR
 *
 * Every refused call is checked for its exact status code AND a substring of
 * ct_last_error(); refused calls on a watched session are also checked to
 * write nothing. Traces are written to OUT_DIR:
 *   valid-*.jsonl    must pass `candle-graph summary --require-valid` (tests/c/run.sh)
 *   failed-*.jsonl   end with terminal failed (ct_finish_failed)
 *   anything else    not checked by run.sh (poisoned, killed, ...)
 * The last line is `test_abi: N passed, M failed`; the exit status is non-zero
 * on any failure.
 *
 * Internal modes (exec'd by the crash-safety test, not for people):
 *   test_abi --child-killed TRACE_PATH PIPE_FD
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "candle_trace.h"

/* ---- harness ------------------------------------------------------------- */

static int g_pass, g_fail;
static const char *g_out;
static const char *g_section = "";

static void report_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "FAIL [%s] %s:%d: ", g_section, file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    g_fail++;
}

#define CHECK(cond, ...)                                          \
    do {                                                          \
        if (cond) {                                               \
            g_pass++;                                             \
        } else {                                                  \
            report_fail(__FILE__, __LINE__, __VA_ARGS__);         \
        }                                                         \
    } while (0)

static const char *status_name(int st) {
    static const char *names[] = {"CT_OK",         "CT_ERR_INVALID_ARGUMENT", "CT_ERR_INVALID_HANDLE",
                                  "CT_ERR_SPAN_MISMATCH", "CT_ERR_STATE",    "CT_ERR_IO",
                                  "CT_ERR_POISONED",      "CT_ERR_UNAVAILABLE", "CT_ERR_INTERNAL"};
    if (st >= 0 && st < (int)(sizeof names / sizeof names[0])) return names[st];
    return "ct_status(?)";
}

/* The session whose file must not grow when a call is refused (0 = none). */
static ct_session g_watch;
static char g_watch_path[4096];

static long long watched_size(void) {
    if (!g_watch) return -1;
    ct_status st = ct_flush(g_watch);
    if (st != CT_OK) return -2;
    struct stat sb;
    if (stat(g_watch_path, &sb) != 0) return -3;
    return (long long)sb.st_size;
}

static void check_status_msg(ct_status got, ct_status want, const char *sub, const char *msg,
                             const char *expr, const char *file, int line) {
    if (msg == NULL) {
        report_fail(file, line, "%s: ct_last_error() returned NULL", expr);
        return;
    }
    if (got != want) {
        if (got == CT_OK)
            report_fail(file, line, "%s returned CT_OK, want %s", expr, status_name(want));
        else
            report_fail(file, line, "%s returned %s (%d), want %s; message: \"%s\"", expr,
                        status_name(got), (int)got, status_name(want), msg);
        return;
    }
    if (want != CT_OK && sub && !strstr(msg, sub)) {
        report_fail(file, line, "%s returned %s as expected but the message \"%s\" lacks \"%s\"",
                    expr, status_name(got), msg, sub);
        return;
    }
    if (want != CT_OK && msg[0] == 0) {
        report_fail(file, line, "%s returned %s with an empty message", expr, status_name(got));
        return;
    }
    g_pass++;
}

static long long g_before;
static void watch_before(ct_status want) { g_before = (want != CT_OK && g_watch) ? watched_size() : -1; }
static void watch_after(ct_status want, ct_status got, const char *expr, const char *file, int line) {
    if (want == CT_OK || !g_watch || got == CT_OK) return;
    long long after = watched_size();
    if (g_before < 0 || after != g_before)
        report_fail(file, line, "%s was refused but the trace changed (%lld -> %lld bytes)", expr,
                    g_before, after);
    else
        g_pass++;
}

/* CHECK_ROW(description, call, expected code, substring of ct_last_error()).
 * When a session is watched and a failure is expected, its trace (flushed
 * before and after) must not change. */
#define CHECK_ROW(desc, call, code, sub)                                            \
    do {                                                                            \
        ct_status want_ = (code);                                                   \
        watch_before(want_);                                                        \
        ct_status got_ = (call);                                                    \
        char msg_[2048];                                                            \
        const char *m_ = ct_last_error();                                           \
        if (m_) {                                                                   \
            snprintf(msg_, sizeof msg_, "%s", m_);                                  \
            m_ = msg_;                                                              \
        }                                                                           \
        watch_after(want_, got_, (desc), __FILE__, __LINE__);                       \
        check_status_msg(got_, want_, (sub), m_, (desc), __FILE__, __LINE__);       \
    } while (0)

#define CHECK_STATUS(call, code, sub) CHECK_ROW(#call, call, code, sub)

/* Stop on a failed setup step: what follows would only report noise. */
#define MUST(call)                                                                  \
    do {                                                                            \
        ct_status st_ = (call);                                                     \
        if (st_ != CT_OK) {                                                         \
            report_fail(__FILE__, __LINE__, "setup %s failed: %s: %s", #call,       \
                        status_name(st_), ct_last_error());                         \
            return;                                                                 \
        }                                                                           \
    } while (0)

/* ---- small utilities ----------------------------------------------------- */

static const char *outpath(const char *name) {
    static char bufs[16][4096];
    static int next;
    char *b = bufs[next++ % 16];
    snprintf(b, sizeof bufs[0], "%s/%s", g_out, name);
    return b;
}

static int exists(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        if (r == 0) break;
        n += r;
    }
    fclose(f);
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

static long count_str(const char *hay, const char *needle) {
    long n = 0;
    size_t l = strlen(needle);
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += l) n++;
    return n;
}

/* Counts lines that contain both a and b (b may be NULL). */
static long count_lines_with(const char *buf, const char *a, const char *b) {
    long n = 0;
    const char *p = buf;
    while (*p) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char *line = malloc(len + 1);
        memcpy(line, p, len);
        line[len] = 0;
        if (strstr(line, a) && (!b || strstr(line, b))) n++;
        free(line);
        if (!e) break;
        p = e + 1;
    }
    return n;
}

/* Every line a whole JSON object line: starts with '{', ends with "}\n". */
static int whole_lines(const char *buf, size_t len, long *lines, char *why, size_t whylen) {
    *lines = 0;
    if (len == 0) {
        snprintf(why, whylen, "file is empty");
        return 0;
    }
    if (buf[len - 1] != '\n') {
        snprintf(why, whylen, "last byte is not a newline");
        return 0;
    }
    size_t start = 0;
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != '\n') continue;
        if (i == start) {
            snprintf(why, whylen, "blank line %ld", *lines + 1);
            return 0;
        }
        if (buf[start] != '{' || buf[i - 1] != '}') {
            snprintf(why, whylen, "line %ld is not a whole JSON object: %.80s", *lines + 1,
                     buf + start);
            return 0;
        }
        (*lines)++;
        start = i + 1;
    }
    if (memchr(buf, 0, len)) {
        snprintf(why, whylen, "file contains a NUL byte");
        return 0;
    }
    return 1;
}

/* Structural sanity of a finished trace (candle-graph does the real check in
 * run.sh): whole lines, meta first, one terminal last with the outcome. */
static void check_trace_file(const char *path, const char *outcome) {
    size_t len;
    char *buf = slurp(path, &len);
    CHECK(buf != NULL, "cannot read %s", path);
    if (!buf) return;
    long lines;
    char why[256];
    int ok = whole_lines(buf, len, &lines, why, sizeof why);
    CHECK(ok, "%s: %s", path, why);
    CHECK(strncmp(buf, "{\"kind\":\"meta\"", 14) == 0 || count_lines_with(buf, "\"kind\":\"meta\"", NULL) == 1,
          "%s: no meta line", path);
    const char *first_nl = strchr(buf, '\n');
    if (first_nl) {
        size_t l = (size_t)(first_nl - buf);
        char *first = malloc(l + 1);
        memcpy(first, buf, l);
        first[l] = 0;
        CHECK(strstr(first, "\"kind\":\"meta\"") != NULL, "%s: the first line is not meta", path);
        free(first);
    }
    CHECK(count_str(buf, "\"kind\":\"terminal\"") == 1, "%s: %ld terminal lines, want 1", path,
          count_str(buf, "\"kind\":\"terminal\""));
    if (ok && len > 1) {
        const char *last = buf + len - 2;
        while (last > buf && *last != '\n') last--;
        if (*last == '\n') last++;
        char want[64];
        snprintf(want, sizeof want, "\"outcome\":\"%s\"", outcome);
        CHECK(strstr(last, "\"kind\":\"terminal\"") && strstr(last, want),
              "%s: the last line is not a terminal with %s: %s", path, want, last);
    }
    free(buf);
}

/* The duration_ns of span id in the (flushed) trace at path, or -1. */
static long long span_duration(const char *path, ct_span id) {
    char *buf = slurp(path, NULL);
    if (!buf) return -1;
    char idq[64];
    snprintf(idq, sizeof idq, "\"id\":\"s%llu\"", (unsigned long long)id);
    long long dur = -1;
    char *p = buf;
    while (*p) {
        char *e = strchr(p, '\n');
        if (e) *e = 0;
        if (strstr(p, "\"kind\":\"span_end\"") && strstr(p, idq)) {
            char *d = strstr(p, "\"duration_ns\":");
            if (d) dur = strtoll(d + 14, NULL, 10);
        }
        if (!e) break;
        p = e + 1;
    }
    free(buf);
    return dur;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

#define RUN_INFER(ep) \
    "{\"entrypoint\":\"" ep "\",\"phase\":\"infer\",\"capture_step\":1,\"device\":\"cpu\"}"

static const int64_t SHAPE23[2] = {2, 3};

static ct_op op_tmpl(void) {
    ct_op o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.op_name = "matmul";
    o.dtype = "f32";
    o.device = "cpu";
    o.shape = SHAPE23;
    o.rank = 2;
    o.duration_ns = 1;
    return o;
}

static ct_tensor tensor_tmpl(void) {
    ct_tensor t;
    memset(&t, 0, sizeof t);
    t.size = sizeof t;
    t.tensor_id = "t-tmpl";
    t.dtype = "f32";
    t.device = "cpu";
    t.shape = SHAPE23;
    t.rank = 2;
    t.category = CT_CATEGORY_ACTIVATION;
    return t;
}

static ct_tensor_stats stats_tmpl(void) {
    ct_tensor_stats s;
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    s.label = "stats-tmpl";
    s.dtype = "f32";
    s.shape = SHAPE23;
    s.rank = 2;
    s.elements = 6;
    s.rms = 1.5;
    s.abs_max = 3.0;
    s.mean = -0.25;
    return s;
}

static ct_memory memory_tmpl(const char *storage, const char *tensor, uint64_t bytes) {
    ct_memory m;
    memset(&m, 0, sizeof m);
    m.size = sizeof m;
    m.storage_id = storage;
    m.tensor_id = tensor;
    m.device = "cpu";
    m.dtype = "f32";
    m.bytes = bytes;
    m.shape = SHAPE23;
    m.rank = 2;
    m.category = CT_CATEGORY_ACTIVATION;
    return m;
}

static ct_device_memory devmem_tmpl(void) {
    ct_device_memory d;
    memset(&d, 0, sizeof d);
    d.size = sizeof d;
    d.flags = CT_HAS_USED_BYTES;
    d.device = "cpu";
    d.used_bytes = 1024;
    return d;
}

static ct_device_interval interval_tmpl(void) {
    ct_device_interval d;
    memset(&d, 0, sizeof d);
    d.size = sizeof d;
    d.device = "cuda:0";
    d.stream_id = "7";
    d.backend = "cuda";
    d.name = "gemm_kernel";
    d.start_ns = 1;
    d.duration_ns = 5;
    return d;
}

/* ---- library-level ------------------------------------------------------- */

static void *fresh_thread_last_error(void *arg) {
    const char *m = ct_last_error();
    *(int *)arg = (m != NULL && m[0] == 0) ? 1 : 0;
    return NULL;
}

static void test_library(void) {
    g_section = "library";
    CHECK(ct_abi_version() == CT_ABI_VERSION, "ct_abi_version() = %u, want %d",
          (unsigned)ct_abi_version(), CT_ABI_VERSION);
    const char *v = ct_version();
    CHECK(v != NULL && v[0] != 0, "ct_version() is NULL or empty");
    CHECK(ct_last_error() != NULL, "ct_last_error() is NULL before any call");
    CHECK(ct_now_ns(0) == 0, "ct_now_ns(0) != 0");
    CHECK(ct_now_ns(0x12345678ull) == 0, "ct_now_ns(unknown) != 0");
    CHECK(ct_now_ns(UINT64_MAX) == 0, "ct_now_ns(UINT64_MAX) != 0");
    CHECK(ct_tracer_ns(0) == 0, "ct_tracer_ns(0) != 0");
    CHECK(ct_tracer_ns(0x12345678ull) == 0, "ct_tracer_ns(unknown) != 0");
    CHECK(ct_tracer_estimated_ns(0) == 0, "ct_tracer_estimated_ns(0) != 0");
    CHECK(ct_ambient_session() == 0, "ct_ambient_session() != 0 without CANDLE_TRACE_PATH");
    pthread_t th;
    int fresh_ok = 0;
    pthread_create(&th, NULL, fresh_thread_last_error, &fresh_ok);
    pthread_join(th, NULL);
    CHECK(fresh_ok, "ct_last_error() on a new thread is not \"\"");
}

/* ---- ct_open ------------------------------------------------------------- */

static const struct {
    const char *json, *sub, *what;
} BAD_RUNS[] = {
    {"not json", "invalid JSON", "not JSON"},
    {"", "invalid JSON", "empty string"},
    {"[]", "JSON object", "an array"},
    {"{\"phase\":\"train\",\"capture_step\":1,\"device\":\"cpu\"}", "entrypoint", "missing entrypoint"},
    {"{\"entrypoint\":\"e\",\"capture_step\":1,\"device\":\"cpu\"}", "phase", "missing phase"},
    {"{\"entrypoint\":\"e\",\"phase\":\"train\",\"device\":\"cpu\"}", "capture_step", "missing capture_step"},
    {"{\"entrypoint\":\"e\",\"phase\":\"train\",\"capture_step\":1}", "device", "missing device"},
    {"{\"entrypoint\":\"e\",\"phase\":\"train\",\"capture_step\":0,\"device\":\"cpu\"}", "capture_step", "capture_step 0"},
    {"{\"entrypoint\":\"e\",\"phase\":\"train\",\"capture_step\":1.5,\"device\":\"cpu\"}", "capture_step", "capture_step 1.5"},
    {"{\"entrypoint\":\"e\",\"phase\":\"train\",\"capture_step\":-1,\"device\":\"cpu\"}", "capture_step", "capture_step -1"},
    {"{\"entrypoint\":\"e\",\"phase\":\"train\",\"capture_step\":\"1\",\"device\":\"cpu\"}", "capture_step", "capture_step a string"},
    {"{\"entrypoint\":\"e\",\"phase\":\"train\",\"capture_step\":1,\"device\":\"cpu\",\"bogus\":1}", "unknown key", "unknown key"},
    {"{\"entrypoint\":\"e\",\"phase\":\"train\",\"capture_step\":1,\"device\":\"cpu\",\"capture_contract\":{\"bogus\":1}}", "unknown key", "unknown nested key"},
    {"{\"entrypoint\":\"e\",\"phase\":\"training\",\"capture_step\":1,\"device\":\"cpu\"}", "phase", "phase training"},
    {"{\"entrypoint\":\"e\",\"phase\":\"train\",\"capture_step\":1,\"device\":\"cpu\",\"timing_mode\":\"wall\"}", "timing_mode", "timing_mode wall"},
    {"{\"entrypoint\":\"\",\"phase\":\"train\",\"capture_step\":1,\"device\":\"cpu\"}", "entrypoint", "empty entrypoint"},
    {"{\"entrypoint\":\"\xff\",\"phase\":\"train\",\"capture_step\":1,\"device\":\"cpu\"}", "UTF-8", "non-UTF-8 entrypoint"},
    {"{\"entrypoint\":\"e\",\"phase\":\"train\",\"capture_step\":1,\"device\":\"\xed\xa0\x80\"}", "UTF-8", "surrogate device"},
    {"{\"entrypoint\":\"a\\ud800b\",\"phase\":\"train\",\"capture_step\":1,\"device\":\"cpu\"}", "run JSON", "lone surrogate escape \\ud800"},
    {"{\"entrypoint\":\"a\\udc00b\",\"phase\":\"train\",\"capture_step\":1,\"device\":\"cpu\"}", "run JSON", "lone trailing surrogate escape \\udc00"},
    {"{\"entrypoint\":\"e\",\"entrypoint\":\"f\",\"phase\":\"train\",\"capture_step\":1,\"device\":\"cpu\"}", "duplicate", "duplicate key"},
    {"{\"entrypoint\":\"e\",\"phase\":\"train\",\"capture_step\":3,\"warmup_steps\":3,\"device\":\"cpu\"}", "warmup_steps", "warmup_steps = capture_step"},
    {"{\"entrypoint\":\"e\",\"phase\":\"train\",\"capture_step\":1,\"device\":\"cpu\",\"tags\":null}", "tags", "tags null"},
    {"{\"entrypoint\":\"e\",\"phase\":\"train\",\"capture_step\":1,\"device\":\"cpu\",\"tags\":{\"a\":1}}", "tags", "tag value not a string"},
    {"{\"entrypoint\":\"e\",\"phase\":\"train\",\"capture_step\":1,\"device\":\"cpu\"} x", "invalid JSON", "trailing data"},
    {"{\"entrypoint\":\"e\",\"phase\":\"train\",\"capture_step\":1,\"device\":\"cpu\",\"measured_root\":1}", "measured_root", "measured_root not a bool"},
};

static void test_open(void) {
    g_section = "ct_open";
    ct_session s = 0;
    const char *p = outpath("never-open.jsonl");
    CHECK_STATUS(ct_open(NULL, RUN_INFER("e"), &s), CT_ERR_INVALID_ARGUMENT, "path is NULL");
    CHECK_STATUS(ct_open(p, NULL, &s), CT_ERR_INVALID_ARGUMENT, "run_json is NULL");
    CHECK_STATUS(ct_open(p, RUN_INFER("e"), NULL), CT_ERR_INVALID_ARGUMENT, "out is NULL");
    CHECK_STATUS(ct_open("", RUN_INFER("e"), &s), CT_ERR_INVALID_ARGUMENT, "empty");
    CHECK(!exists(p), "a refused ct_open left %s", p);

    const char *bad_utf8_path = outpath("never-\xff.jsonl");
    s = 0;
    CHECK_STATUS(ct_open(bad_utf8_path, RUN_INFER("e"), &s), CT_ERR_INVALID_ARGUMENT, "UTF-8");
    if (s != 0) { /* wrongly accepted: end it and remove its file */
        ct_finish_failed(s, "test_abi: wrongly accepted");
        unlink(bad_utf8_path);
    } else {
        CHECK(!exists(bad_utf8_path), "a refused ct_open of a non-UTF-8 path created the file");
    }

    for (size_t i = 0; i < sizeof BAD_RUNS / sizeof BAD_RUNS[0]; i++) {
        char desc[256];
        snprintf(desc, sizeof desc, "ct_open(run_json: %s)", BAD_RUNS[i].what);
        s = 0;
        CHECK_ROW(desc, ct_open(p, BAD_RUNS[i].json, &s), CT_ERR_INVALID_ARGUMENT, BAD_RUNS[i].sub);
        if (s != 0) { /* wrongly accepted: end it and remove its file */
            ct_finish_failed(s, "test_abi: wrongly accepted");
            unlink(p);
            continue;
        }
        CHECK(strstr(ct_last_error(), "ct_open") != NULL, "%s: message does not name ct_open", desc);
        CHECK(!exists(p), "%s: a refused ct_open left %s", desc, p);
        unlink(p);
    }

    /* The parent folder is a regular file. */
    const char *regular = outpath("regular-file");
    FILE *f = fopen(regular, "w");
    if (f) {
        fputs("not a folder\n", f);
        fclose(f);
    }
    const char *under = outpath("regular-file/trace.jsonl");
    const char *deeper = outpath("regular-file/sub/trace.jsonl");
    CHECK_STATUS(ct_open(under, RUN_INFER("e"), &s), CT_ERR_IO, "not a directory");
    CHECK(!exists(under), "ct_open left %s", under);
    CHECK_STATUS(ct_open(deeper, RUN_INFER("e"), &s), CT_ERR_IO, "not a directory");
    CHECK(!exists(deeper), "ct_open left %s", deeper);
    size_t rlen = 0;
    char *rbuf = slurp(regular, &rlen);
    CHECK(rbuf && strcmp(rbuf, "not a folder\n") == 0, "ct_open changed the regular file in the way");
    free(rbuf);

    /* The path is an existing folder. */
    const char *dir = outpath("a-folder");
    mkdir(dir, 0755);
    CHECK_STATUS(ct_open(dir, RUN_INFER("e"), &s), CT_ERR_IO, "a-folder");
    struct stat sb;
    CHECK(stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode), "ct_open removed the folder at its path");

    /* Parent folders are created; a previous trace at the path is replaced. */
    const char *nested = outpath("valid-nested/deeper/open.jsonl");
    ct_session a = 0, b = 0;
    CHECK_STATUS(ct_open(outpath("valid-replaced.jsonl"), RUN_INFER("test_abi::previous"), &b), CT_OK, NULL);
    if (b) CHECK_STATUS(ct_finish_failed(b, "the previous run"), CT_OK, NULL);
    b = 0;
    ct_span m;
    CHECK_STATUS(ct_open(nested, RUN_INFER("test_abi::nested"), &a), CT_OK, NULL);
    CHECK_STATUS(ct_open(outpath("valid-replaced.jsonl"),
                         "{\"entrypoint\":\"test_abi::replaced\",\"phase\":\"infer\",\"capture_step\":1,"
                         "\"device\":\"cpu\",\"measured_root\":true}",
                         &b),
                 CT_OK, NULL);
    CHECK(a != 0 && b != 0 && a != b, "ct_open handles are 0 or equal (%llu, %llu)",
          (unsigned long long)a, (unsigned long long)b);
    if (a) {
        CHECK_STATUS(ct_measurement_begin(a, "nested/measured", &m), CT_OK, NULL);
        CHECK_STATUS(ct_span_end(a, m), CT_OK, NULL);
        CHECK_STATUS(ct_finish(a), CT_OK, NULL);
        check_trace_file(nested, "complete");
    }
    if (b) {
        CHECK_STATUS(ct_finish(b), CT_OK, NULL);
        char *rb = slurp(outpath("valid-replaced.jsonl"), NULL);
        CHECK(rb && !strstr(rb, "test_abi::previous"), "ct_open did not replace the previous trace");
        free(rb);
        check_trace_file(outpath("valid-replaced.jsonl"), "complete");
    }
    /* "nested" is in a folder: move the trace next to the others for run.sh. */
    rename(nested, outpath("valid-nested.jsonl"));
}

/* ct_open never follows a final symbolic link, and never truncates a file
 * that is not empty, a trace or a summary: those are refused and left as they
 * were. In a folder of its own (run.sh checks only OUT_DIR's valid-*.jsonl). */
static void test_open_targets(void) {
    g_section = "ct_open targets";
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", outpath("targets"));
    mkdir(dir, 0755);
    char victim[4200], link[4200], script[4200], empty[4200];
    snprintf(victim, sizeof victim, "%s/victim.txt", dir);
    snprintf(link, sizeof link, "%s/link.jsonl", dir);
    snprintf(script, sizeof script, "%s/train.py", dir);
    snprintf(empty, sizeof empty, "%s/empty.jsonl", dir);
    unlink(link);
    FILE *f = fopen(victim, "w");
    if (f) {
        fputs("victim\n", f);
        fclose(f);
    }
    f = fopen(script, "w");
    if (f) {
        fputs("import torch\n", f);
        fclose(f);
    }
    f = fopen(empty, "w");
    if (f) fclose(f);
    CHECK(symlink(victim, link) == 0, "symlink %s: %s", link, strerror(errno));

    ct_session s = 0;
    CHECK_STATUS(ct_open(link, RUN_INFER("test_abi::link"), &s), CT_ERR_IO,
                 "is a symbolic link, which candle-trace does not follow");
    CHECK(strstr(ct_last_error(), link) != NULL, "the message does not name %s: %s", link, ct_last_error());
    CHECK(s == 0, "a refused ct_open stored a handle");
    CHECK_STATUS(ct_open(script, RUN_INFER("test_abi::script"), &s), CT_ERR_IO,
                 "is not a candle-trace trace or summary");
    CHECK(strstr(ct_last_error(), script) != NULL, "the message does not name %s: %s", script, ct_last_error());
    char *v = slurp(victim, NULL);
    CHECK(v && strcmp(v, "victim\n") == 0, "the link's target was overwritten: \"%.80s\"", v ? v : "(unreadable)");
    free(v);
    char target[4200] = "";
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n > 0) target[n] = 0;
    CHECK(strcmp(target, victim) == 0, "the symbolic link was replaced (readlink: \"%s\")", target);
    v = slurp(script, NULL);
    CHECK(v && strcmp(v, "import torch\n") == 0, "train.py was overwritten: \"%.80s\"", v ? v : "(unreadable)");
    free(v);

    /* An empty file is reused. */
    CHECK_STATUS(ct_open(empty,
                         "{\"entrypoint\":\"test_abi::empty\",\"phase\":\"infer\",\"capture_step\":1,"
                         "\"device\":\"cpu\",\"measured_root\":true}",
                         &s),
                 CT_OK, NULL);
    if (s) {
        CHECK_STATUS(ct_finish(s), CT_OK, NULL);
        check_trace_file(empty, "complete");
    }
}

/* ---- handles ------------------------------------------------------------- */

typedef ct_status (*handle_fn)(ct_session s);

static ct_status h_span_begin(ct_session s) {
    ct_span x;
    return ct_span_begin(s, "h", CT_SPAN_FUNCTION, CT_STEP_NONE, &x);
}
static ct_status h_measurement_begin(ct_session s) {
    ct_span x;
    return ct_measurement_begin(s, "h", &x);
}
static ct_status h_span_end(ct_session s) { return ct_span_end(s, 2); }
static ct_status h_completed(ct_session s) {
    ct_span x;
    return ct_record_completed_span(s, "h", CT_SPAN_FUNCTION, 0, 1, &x);
}
static ct_status h_op(ct_session s) {
    ct_op o = op_tmpl();
    return ct_record_op(s, 1, &o);
}
static ct_status h_tensor(ct_session s) {
    ct_tensor t = tensor_tmpl();
    return ct_record_tensor(s, 1, &t);
}
static ct_status h_stats(ct_session s) {
    ct_tensor_stats t = stats_tmpl();
    return ct_record_tensor_stats(s, 1, &t);
}
static ct_status h_stats_f32(ct_session s) {
    float d[6] = {1, 2, 3, 4, 5, 6};
    return ct_record_tensor_stats_f32(s, 1, "h", d, SHAPE23, 2);
}
static ct_status h_scalar(ct_session s) { return ct_record_scalar(s, 1, "h", 1.0); }
static ct_status h_memory(ct_session s) {
    ct_memory m = memory_tmpl("h-storage", "h-tensor", 24);
    return ct_record_memory(s, 1, CT_MEMORY_ALLOC, &m);
}
static ct_status h_devmem(ct_session s) {
    ct_device_memory d = devmem_tmpl();
    return ct_record_device_memory(s, &d);
}
static ct_status h_interval(ct_session s) {
    ct_device_interval d = interval_tmpl();
    return ct_record_device_interval(s, 1, &d);
}
static ct_status h_call_edge(ct_session s) { return ct_record_call_edge(s, 1, 2, 0); }
static ct_status h_data_edge(ct_session s) { return ct_record_data_edge(s, "a", "b"); }
static ct_status h_gradient(ct_session s) {
    return ct_record_gradient(s, "r", "k", CT_GRADIENT_MISSING, NULL);
}
static ct_status h_device_start(ct_session s) { return ct_device_start(s, NULL); }
static ct_status h_device_stop(ct_session s) { return ct_device_stop(s); }
static ct_status h_flush(ct_session s) { return ct_flush(s); }
static ct_status h_tracer_begin(ct_session s) { return ct_tracer_begin(s); }
static ct_status h_tracer_end(ct_session s) { return ct_tracer_end(s); }
static ct_status h_tracer_begin_earlier(ct_session s) { return ct_tracer_begin_earlier(s, 1000); }
static ct_status h_tracer_begin_at(ct_session s) {
    uint64_t at = 7;
    ct_status st = ct_tracer_begin_at(s, 1000, &at);
    CHECK(st == CT_OK || at == 7, "a refused ct_tracer_begin_at wrote *now_ns (%llu)", (unsigned long long)at);
    return st;
}
static ct_status h_tracer_exclude_earlier(ct_session s) { return ct_tracer_exclude_earlier(s, 1000); }
static ct_status h_finish(ct_session s) { return ct_finish(s); }
static ct_status h_finish_failed(ct_session s) { return ct_finish_failed(s, "reason"); }
static ct_status h_discard(ct_session s) { return ct_discard(s); }
static ct_status h_aggregate_enable(ct_session s) { return ct_aggregate_enable(s, 1); }
static ct_status h_aggregate_trigger(ct_session s) {
    return ct_aggregate_trigger(s, 1, "slow", 2.0, 1.0, NULL, NULL, NULL);
}
static ct_status h_reopen(ct_session s) {
    ct_session next = 0;
    return ct_reopen(s, outpath("never-written.jsonl"), 2, &next);
}

static const struct {
    const char *name;
    handle_fn fn;
} HANDLE_FNS[] = {
    {"ct_span_begin", h_span_begin},
    {"ct_measurement_begin", h_measurement_begin},
    {"ct_span_end", h_span_end},
    {"ct_record_completed_span", h_completed},
    {"ct_record_op", h_op},
    {"ct_record_tensor", h_tensor},
    {"ct_record_tensor_stats", h_stats},
    {"ct_record_tensor_stats_f32", h_stats_f32},
    {"ct_record_scalar", h_scalar},
    {"ct_record_memory", h_memory},
    {"ct_record_device_memory", h_devmem},
    {"ct_record_device_interval", h_interval},
    {"ct_record_call_edge", h_call_edge},
    {"ct_record_data_edge", h_data_edge},
    {"ct_record_gradient", h_gradient},
    {"ct_device_start", h_device_start},
    {"ct_device_stop", h_device_stop},
    {"ct_flush", h_flush},
    {"ct_tracer_begin", h_tracer_begin},
    {"ct_tracer_end", h_tracer_end},
    {"ct_tracer_begin_earlier", h_tracer_begin_earlier},
    {"ct_tracer_begin_at", h_tracer_begin_at},
    {"ct_tracer_exclude_earlier", h_tracer_exclude_earlier},
    {"ct_finish", h_finish},
    {"ct_finish_failed", h_finish_failed},
    {"ct_discard", h_discard},
    {"ct_aggregate_enable", h_aggregate_enable},
    {"ct_aggregate_trigger", h_aggregate_trigger},
    {"ct_reopen", h_reopen},
};

static void test_handles(void) {
    g_section = "handles";
    ct_session fin = 0;
    ct_span m;
    MUST(ct_open(outpath("valid-finished-handle.jsonl"), RUN_INFER("test_abi::finished"), &fin));
    MUST(ct_measurement_begin(fin, "finished/measured", &m));
    MUST(ct_span_end(fin, m));
    MUST(ct_finish(fin));
    check_trace_file(outpath("valid-finished-handle.jsonl"), "complete");
    CHECK(ct_now_ns(fin) == 0, "ct_now_ns(finished handle) != 0");

    /* Same slot, another generation; a handle with slot index 0; all ones. */
    const struct {
        ct_session h;
        const char *what, *sub;
    } handles[] = {
        {0, "0", "0 (never valid)"},
        {fin, "finished", "unknown or already finished"},
        {fin + 0x100 * 1000, "unknown (other generation)", "unknown or already finished"},
        {0x4200, "unknown (slot 0)", "unknown or already finished"},
        {UINT64_MAX, "unknown (all ones)", "unknown or already finished"},
    };
    for (size_t h = 0; h < sizeof handles / sizeof handles[0]; h++) {
        for (size_t i = 0; i < sizeof HANDLE_FNS / sizeof HANDLE_FNS[0]; i++) {
            char desc[160];
            snprintf(desc, sizeof desc, "%s(%s handle)", HANDLE_FNS[i].name, handles[h].what);
            CHECK_ROW(desc, HANDLE_FNS[i].fn(handles[h].h), CT_ERR_INVALID_HANDLE, handles[h].sub);
        }
    }
    /* Every refusal of a handle names the function that refused it. */
    for (size_t i = 0; i < sizeof HANDLE_FNS / sizeof HANDLE_FNS[0]; i++) {
        HANDLE_FNS[i].fn(fin);
        const char *msg = ct_last_error();
        size_t n = strlen(HANDLE_FNS[i].name);
        CHECK(strncmp(msg, HANDLE_FNS[i].name, n) == 0 && msg[n] == ':',
              "%s(finished handle): the message does not name the function: %s", HANDLE_FNS[i].name, msg);
    }
    size_t len;
    char *buf = slurp(outpath("valid-finished-handle.jsonl"), &len);
    CHECK(buf && count_str(buf, "\"name\":\"h\"") == 0,
          "a call on a finished handle wrote into its trace");
    free(buf);
}

/* ---- strings --------------------------------------------------------------- */

static const struct {
    const char *s, *sub, *what;
} BAD_STRINGS[] = {
    {"", "empty", "empty"},
    {"\xff", "UTF-8", "\\xff"},
    {"\xc0\xaf", "UTF-8", "overlong \\xc0\\xaf"},
    {"\xed\xa0\x80", "UTF-8", "lone surrogate \\xed\\xa0\\x80"},
    {"\xf4\x90\x80\x80", "UTF-8", "above U+10FFFF"},
    {"ok\x80", "UTF-8", "stray continuation byte"},
    {"ok\xe2\x82", "UTF-8", "truncated sequence"},
    {"\xe0\x80\xaf", "UTF-8", "overlong 3-byte"},
};

typedef ct_status (*str_fn)(ct_session s, ct_span span, const char *v);

static ct_status s_span_begin(ct_session s, ct_span sp, const char *v) {
    (void)sp;
    ct_span x = 0;
    ct_status st = ct_span_begin(s, v, CT_SPAN_FUNCTION, CT_STEP_NONE, &x);
    if (st == CT_OK) ct_span_end(s, x);
    return st;
}
static ct_status s_measurement_begin(ct_session s, ct_span sp, const char *v) {
    (void)sp;
    ct_span x = 0;
    ct_status st = ct_measurement_begin(s, v, &x);
    if (st == CT_OK) ct_span_end(s, x);
    return st;
}
static ct_status s_completed(ct_session s, ct_span sp, const char *v) {
    (void)sp;
    return ct_record_completed_span(s, v, CT_SPAN_FUNCTION, 0, 1, NULL);
}
static ct_status s_scalar(ct_session s, ct_span sp, const char *v) { return ct_record_scalar(s, sp, v, 2.0); }
static ct_status s_stats_label(ct_session s, ct_span sp, const char *v) {
    ct_tensor_stats t = stats_tmpl();
    t.label = v;
    return ct_record_tensor_stats(s, sp, &t);
}
static ct_status s_stats_dtype(ct_session s, ct_span sp, const char *v) {
    ct_tensor_stats t = stats_tmpl();
    t.dtype = v;
    return ct_record_tensor_stats(s, sp, &t);
}
static ct_status s_stats_f32(ct_session s, ct_span sp, const char *v) {
    float d[6] = {1, 2, 3, 4, 5, 6};
    return ct_record_tensor_stats_f32(s, sp, v, d, SHAPE23, 2);
}
#define OP_FIELD_FN(fname, field)                                      \
    static ct_status fname(ct_session s, ct_span sp, const char *v) { \
        ct_op o = op_tmpl();                                           \
        o.field = v;                                                   \
        return ct_record_op(s, sp, &o);                                \
    }
OP_FIELD_FN(s_op_name, op_name)
OP_FIELD_FN(s_op_dtype, dtype)
OP_FIELD_FN(s_op_device, device)
OP_FIELD_FN(s_op_output, output)
static ct_status s_op_input(ct_session s, ct_span sp, const char *v) {
    ct_op o = op_tmpl();
    const char *ins[2] = {"t-ok", v};
    o.inputs = ins;
    o.n_inputs = 2;
    return ct_record_op(s, sp, &o);
}
#define TENSOR_FIELD_FN(fname, field)                                  \
    static ct_status fname(ct_session s, ct_span sp, const char *v) { \
        ct_tensor t = tensor_tmpl();                                   \
        t.field = v;                                                   \
        return ct_record_tensor(s, sp, &t);                            \
    }
TENSOR_FIELD_FN(s_tensor_id, tensor_id)
TENSOR_FIELD_FN(s_tensor_dtype, dtype)
TENSOR_FIELD_FN(s_tensor_device, device)
TENSOR_FIELD_FN(s_tensor_label, label)
#define MEMORY_FIELD_FN(fname, field)                                  \
    static ct_status fname(ct_session s, ct_span sp, const char *v) { \
        ct_memory m = memory_tmpl("str-storage", "str-tensor", 24);    \
        m.field = v;                                                   \
        return ct_record_memory(s, sp, CT_MEMORY_ALLOC, &m);           \
    }
MEMORY_FIELD_FN(s_mem_storage, storage_id)
MEMORY_FIELD_FN(s_mem_tensor, tensor_id)
MEMORY_FIELD_FN(s_mem_device, device)
MEMORY_FIELD_FN(s_mem_dtype, dtype)
MEMORY_FIELD_FN(s_mem_op, op_name)
static ct_status s_devmem_device(ct_session s, ct_span sp, const char *v) {
    (void)sp;
    ct_device_memory d = devmem_tmpl();
    d.device = v;
    return ct_record_device_memory(s, &d);
}
#define INTERVAL_FIELD_FN(fname, field)                                \
    static ct_status fname(ct_session s, ct_span sp, const char *v) { \
        ct_device_interval d = interval_tmpl();                        \
        d.field = v;                                                   \
        return ct_record_device_interval(s, sp, &d);                   \
    }
INTERVAL_FIELD_FN(s_int_device, device)
INTERVAL_FIELD_FN(s_int_stream, stream_id)
INTERVAL_FIELD_FN(s_int_backend, backend)
INTERVAL_FIELD_FN(s_int_clock, clock_id)
INTERVAL_FIELD_FN(s_int_name, name)
static ct_status s_edge_from(ct_session s, ct_span sp, const char *v) {
    (void)sp;
    return ct_record_data_edge(s, v, "t-known");
}
static ct_status s_edge_to(ct_session s, ct_span sp, const char *v) {
    (void)sp;
    return ct_record_data_edge(s, "t-known", v);
}
static ct_status s_grad_root(ct_session s, ct_span sp, const char *v) {
    (void)sp;
    return ct_record_gradient(s, v, "k", CT_GRADIENT_MISSING, NULL);
}
static ct_status s_grad_key(ct_session s, ct_span sp, const char *v) {
    (void)sp;
    return ct_record_gradient(s, "r", v, CT_GRADIENT_MISSING, NULL);
}

/* optional: "" is a valid value (absent), so only the non-UTF-8 rows apply. */
static const struct {
    const char *name;
    str_fn fn;
    int optional;
} STR_TARGETS[] = {
    {"ct_span_begin name", s_span_begin, 0},
    {"ct_measurement_begin name", s_measurement_begin, 0},
    {"ct_record_completed_span name", s_completed, 0},
    {"ct_record_scalar label", s_scalar, 0},
    {"ct_record_tensor_stats label", s_stats_label, 0},
    {"ct_record_tensor_stats dtype", s_stats_dtype, 0},
    {"ct_record_tensor_stats_f32 label", s_stats_f32, 0},
    {"ct_op.op_name", s_op_name, 0},
    {"ct_op.dtype", s_op_dtype, 0},
    {"ct_op.device", s_op_device, 0},
    {"ct_op.output", s_op_output, 0},
    {"ct_op.inputs[1]", s_op_input, 0},
    {"ct_tensor.tensor_id", s_tensor_id, 0},
    {"ct_tensor.dtype", s_tensor_dtype, 0},
    {"ct_tensor.device", s_tensor_device, 0},
    {"ct_tensor.label", s_tensor_label, 1},
    {"ct_memory.storage_id", s_mem_storage, 0},
    {"ct_memory.tensor_id", s_mem_tensor, 0},
    {"ct_memory.device", s_mem_device, 0},
    {"ct_memory.dtype", s_mem_dtype, 0},
    {"ct_memory.op_name", s_mem_op, 1},
    {"ct_device_memory.device", s_devmem_device, 0},
    {"ct_device_interval.device", s_int_device, 0},
    {"ct_device_interval.stream_id", s_int_stream, 0},
    {"ct_device_interval.backend", s_int_backend, 0},
    {"ct_device_interval.clock_id", s_int_clock, 1},
    {"ct_device_interval.name", s_int_name, 1},
    {"ct_record_data_edge from", s_edge_from, 0},
    {"ct_record_data_edge to", s_edge_to, 0},
    {"ct_record_gradient root", s_grad_root, 0},
    {"ct_record_gradient key", s_grad_key, 0},
};

/* The longest span name (include/candle_trace.h), with the default ring. */
#define CT_TEST_SPAN_NAME_MAX 262096

static void test_strings(ct_session s, ct_span span) {
    g_section = "strings";
    for (size_t t = 0; t < sizeof STR_TARGETS / sizeof STR_TARGETS[0]; t++) {
        for (size_t i = 0; i < sizeof BAD_STRINGS / sizeof BAD_STRINGS[0]; i++) {
            if (STR_TARGETS[t].optional && BAD_STRINGS[i].s[0] == 0) continue;
            char desc[160];
            snprintf(desc, sizeof desc, "%s = %s", STR_TARGETS[t].name, BAD_STRINGS[i].what);
            CHECK_ROW(desc, STR_TARGETS[t].fn(s, span, BAD_STRINGS[i].s), CT_ERR_INVALID_ARGUMENT,
                      BAD_STRINGS[i].sub);
        }
    }
    /* Every string a record carries is bounded as span names are: a line
     * holding a larger one would be refused by the trace's readers. */
    size_t n = (1u << 20) + 1;
    char *big = malloc(n + 1);
    if (!big) return;
    memset(big, 'a', n);
    big[n] = 0;
    for (size_t t = 0; t < sizeof STR_TARGETS / sizeof STR_TARGETS[0]; t++) {
        char desc[160];
        snprintf(desc, sizeof desc, "%s = 1 MiB + 1 byte", STR_TARGETS[t].name);
        CHECK_ROW(desc, STR_TARGETS[t].fn(s, span, big), CT_ERR_INVALID_ARGUMENT, "longer than 1 MiB");
    }

    /* Each within 1 MiB, together more than a record may carry: 9 inputs of
     * 1 MiB made a 9 MiB line, and 70 one that the trace's readers refuse
     * (line_too_long) after the call said OK. */
    big[n - 1] = 0; /* 1 MiB */
    const char *nine[9];
    for (int i = 0; i < 9; i++) nine[i] = big;
    ct_op op = op_tmpl();
    op.inputs = nine;
    op.n_inputs = 9;
    CHECK_STATUS(ct_record_op(s, span, &op), CT_ERR_INVALID_ARGUMENT,
                 "ct_record_op: op: its strings are 9437196 bytes together, more than the 8 MiB one record may carry");
    op.n_inputs = 7; /* 7 MiB and the short fields: taken, and the trace stays valid (run.sh) */
    CHECK_STATUS(ct_record_op(s, span, &op), CT_OK, NULL);

    /* Span names: the header's 262,096 bytes exactly (half the default
     * 512 KiB ring less the 48-byte record header). */
    ct_span sp;
    memset(big, 'n', CT_TEST_SPAN_NAME_MAX + 1);
    big[CT_TEST_SPAN_NAME_MAX] = 0;
    CHECK_STATUS(ct_span_begin(s, big, CT_SPAN_FUNCTION, CT_STEP_NONE, &sp), CT_OK, NULL);
    CHECK_STATUS(ct_span_end(s, sp), CT_OK, NULL);
    big[CT_TEST_SPAN_NAME_MAX] = 'n';
    big[CT_TEST_SPAN_NAME_MAX + 1] = 0;
    CHECK_STATUS(ct_span_begin(s, big, CT_SPAN_FUNCTION, CT_STEP_NONE, &sp), CT_ERR_INVALID_ARGUMENT,
                 "ct_span_begin: name of 262097 bytes does not fit the event ring");
    free(big);
}

/* ---- NULL pointers ------------------------------------------------------- */

static void test_nulls(ct_session s, ct_span span) {
    g_section = "NULL pointers";
    ct_span x;
    CHECK_STATUS(ct_span_begin(s, NULL, CT_SPAN_FUNCTION, CT_STEP_NONE, &x), CT_ERR_INVALID_ARGUMENT, "name is NULL");
    CHECK_STATUS(ct_span_begin(s, "n", CT_SPAN_FUNCTION, CT_STEP_NONE, NULL), CT_ERR_INVALID_ARGUMENT, "out is NULL");
    CHECK_STATUS(ct_measurement_begin(s, NULL, &x), CT_ERR_INVALID_ARGUMENT, "name is NULL");
    CHECK_STATUS(ct_measurement_begin(s, "n", NULL), CT_ERR_INVALID_ARGUMENT, "out is NULL");
    CHECK_STATUS(ct_record_completed_span(s, NULL, CT_SPAN_FUNCTION, 0, 1, &x), CT_ERR_INVALID_ARGUMENT, "name is NULL");

    CHECK_STATUS(ct_record_op(s, span, NULL), CT_ERR_INVALID_ARGUMENT, "op is NULL");
    ct_op o = op_tmpl();
    o.op_name = NULL;
    CHECK_STATUS(ct_record_op(s, span, &o), CT_ERR_INVALID_ARGUMENT, "op_name is NULL");
    o = op_tmpl();
    o.dtype = NULL;
    CHECK_STATUS(ct_record_op(s, span, &o), CT_ERR_INVALID_ARGUMENT, "dtype is NULL");
    o = op_tmpl();
    o.device = NULL;
    CHECK_STATUS(ct_record_op(s, span, &o), CT_ERR_INVALID_ARGUMENT, "device is NULL");
    o = op_tmpl();
    o.n_inputs = 2;
    CHECK_STATUS(ct_record_op(s, span, &o), CT_ERR_INVALID_ARGUMENT, "inputs is NULL");
    const char *ins[2] = {"a", NULL};
    o.inputs = ins;
    CHECK_STATUS(ct_record_op(s, span, &o), CT_ERR_INVALID_ARGUMENT, "inputs[1] is NULL");
    o = op_tmpl();
    o.shape = NULL;
    CHECK_STATUS(ct_record_op(s, span, &o), CT_ERR_INVALID_ARGUMENT, "shape is NULL");

    CHECK_STATUS(ct_record_tensor(s, span, NULL), CT_ERR_INVALID_ARGUMENT, "tensor is NULL");
    ct_tensor t = tensor_tmpl();
    t.tensor_id = NULL;
    CHECK_STATUS(ct_record_tensor(s, span, &t), CT_ERR_INVALID_ARGUMENT, "tensor_id is NULL");
    t = tensor_tmpl();
    t.dtype = NULL;
    CHECK_STATUS(ct_record_tensor(s, span, &t), CT_ERR_INVALID_ARGUMENT, "dtype is NULL");
    t = tensor_tmpl();
    t.device = NULL;
    CHECK_STATUS(ct_record_tensor(s, span, &t), CT_ERR_INVALID_ARGUMENT, "device is NULL");
    t = tensor_tmpl();
    t.shape = NULL;
    CHECK_STATUS(ct_record_tensor(s, span, &t), CT_ERR_INVALID_ARGUMENT, "shape is NULL");

    CHECK_STATUS(ct_record_tensor_stats(s, span, NULL), CT_ERR_INVALID_ARGUMENT, "stats is NULL");
    ct_tensor_stats st = stats_tmpl();
    st.label = NULL;
    CHECK_STATUS(ct_record_tensor_stats(s, span, &st), CT_ERR_INVALID_ARGUMENT, "label is NULL");
    st = stats_tmpl();
    st.dtype = NULL;
    CHECK_STATUS(ct_record_tensor_stats(s, span, &st), CT_ERR_INVALID_ARGUMENT, "dtype is NULL");

    float d[6] = {0};
    CHECK_STATUS(ct_record_tensor_stats_f32(s, span, NULL, d, SHAPE23, 2), CT_ERR_INVALID_ARGUMENT, "label is NULL");
    CHECK_STATUS(ct_record_tensor_stats_f32(s, span, "l", NULL, SHAPE23, 2), CT_ERR_INVALID_ARGUMENT, "data is NULL");
    CHECK_STATUS(ct_record_tensor_stats_f32(s, span, "l", d, NULL, 2), CT_ERR_INVALID_ARGUMENT, "shape is NULL");
    CHECK_STATUS(ct_record_scalar(s, span, NULL, 1.0), CT_ERR_INVALID_ARGUMENT, "label is NULL");

    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_ALLOC, NULL), CT_ERR_INVALID_ARGUMENT, "memory is NULL");
    ct_memory m = memory_tmpl(NULL, "t", 24);
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_ALLOC, &m), CT_ERR_INVALID_ARGUMENT, "storage_id is NULL");
    m = memory_tmpl("st", NULL, 24);
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_ALLOC, &m), CT_ERR_INVALID_ARGUMENT, "tensor_id is NULL");
    m = memory_tmpl("st", "t", 24);
    m.device = NULL;
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_ALLOC, &m), CT_ERR_INVALID_ARGUMENT, "device is NULL");
    m = memory_tmpl("st", "t", 24);
    m.dtype = NULL;
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_ALLOC, &m), CT_ERR_INVALID_ARGUMENT, "dtype is NULL");

    CHECK_STATUS(ct_record_device_memory(s, NULL), CT_ERR_INVALID_ARGUMENT, "sample is NULL");
    ct_device_memory dm = devmem_tmpl();
    dm.device = NULL;
    CHECK_STATUS(ct_record_device_memory(s, &dm), CT_ERR_INVALID_ARGUMENT, "device is NULL");

    CHECK_STATUS(ct_record_device_interval(s, span, NULL), CT_ERR_INVALID_ARGUMENT, "interval is NULL");
    ct_device_interval di = interval_tmpl();
    di.device = NULL;
    CHECK_STATUS(ct_record_device_interval(s, span, &di), CT_ERR_INVALID_ARGUMENT, "device is NULL");
    di = interval_tmpl();
    di.stream_id = NULL;
    CHECK_STATUS(ct_record_device_interval(s, span, &di), CT_ERR_INVALID_ARGUMENT, "stream_id is NULL");
    di = interval_tmpl();
    di.backend = NULL;
    CHECK_STATUS(ct_record_device_interval(s, span, &di), CT_ERR_INVALID_ARGUMENT, "backend is NULL");

    CHECK_STATUS(ct_record_data_edge(s, NULL, "t-known"), CT_ERR_INVALID_ARGUMENT, "from_tensor is NULL");
    CHECK_STATUS(ct_record_data_edge(s, "t-known", NULL), CT_ERR_INVALID_ARGUMENT, "to_tensor is NULL");
    CHECK_STATUS(ct_record_gradient(s, NULL, "k", CT_GRADIENT_MISSING, NULL), CT_ERR_INVALID_ARGUMENT, "root is NULL");
    CHECK_STATUS(ct_record_gradient(s, "r", NULL, CT_GRADIENT_MISSING, NULL), CT_ERR_INVALID_ARGUMENT, "key is NULL");
}

/* ---- enums, sizes, shapes -------------------------------------------------- */

static void test_enums(ct_session s, ct_span span) {
    g_section = "unknown enums";
    ct_span x;
    CHECK_STATUS(ct_span_begin(s, "e", (ct_span_kind)7, CT_STEP_NONE, &x), CT_ERR_INVALID_ARGUMENT, "unknown span kind");
    CHECK_STATUS(ct_span_begin(s, "e", (ct_span_kind)-1, CT_STEP_NONE, &x), CT_ERR_INVALID_ARGUMENT, "unknown span kind");
    CHECK_STATUS(ct_span_begin(s, "e", CT_SPAN_FUNCTION, (ct_step)9, &x), CT_ERR_INVALID_ARGUMENT, "unknown step");
    CHECK_STATUS(ct_span_begin(s, "e", CT_SPAN_FUNCTION, (ct_step)-1, &x), CT_ERR_INVALID_ARGUMENT, "unknown step");
    CHECK_STATUS(ct_record_completed_span(s, "e", (ct_span_kind)7, 0, 1, &x), CT_ERR_INVALID_ARGUMENT, "unknown span kind");
    ct_memory m = memory_tmpl("enum-storage", "enum-tensor", 24);
    CHECK_STATUS(ct_record_memory(s, span, (ct_memory_action)5, &m), CT_ERR_INVALID_ARGUMENT, "memory action");
    m.category = (ct_category)11;
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_ALLOC, &m), CT_ERR_INVALID_ARGUMENT, "category");
    CHECK_STATUS(ct_record_gradient(s, "r", "k", (ct_gradient_state)4, NULL), CT_ERR_INVALID_ARGUMENT, "gradient state");
    double one = 1.0;
    CHECK_STATUS(ct_record_gradient(s, "r", "k", (ct_gradient_state)4, &one), CT_ERR_INVALID_ARGUMENT, "gradient state");
    ct_tensor t = tensor_tmpl();
    t.category = (ct_category)11;
    CHECK_STATUS(ct_record_tensor(s, span, &t), CT_ERR_INVALID_ARGUMENT, "category");
    t = tensor_tmpl();
    t.requires_grad = 2;
    CHECK_STATUS(ct_record_tensor(s, span, &t), CT_ERR_INVALID_ARGUMENT, "requires_grad");
}

/* The versioned-struct rule of the header: size at least 8 and a multiple
 * of the struct's alignment; a smaller (older) struct is read with zero for
 * what it lacks; a larger (newer) one only with zeros past this header's
 * struct; unknown flag bits and non-zero reserved fields are refused. */
static void test_sizes(ct_session s, ct_span span) {
    g_section = "record size field";
    ct_op o = op_tmpl();
    o.size = 0;
    CHECK_STATUS(ct_record_op(s, span, &o), CT_ERR_INVALID_ARGUMENT, "op.size is 0; set it to sizeof(ct_op)");
    o.size = 4;
    CHECK_STATUS(ct_record_op(s, span, &o), CT_ERR_INVALID_ARGUMENT, "op.size is 4; set it to sizeof(ct_op)");
    o.size = sizeof o - 4; /* would cut a field */
    CHECK_STATUS(ct_record_op(s, span, &o), CT_ERR_INVALID_ARGUMENT, "set it to sizeof(ct_op)");
    o.size = 1u << 20;
    CHECK_STATUS(ct_record_op(s, span, &o), CT_ERR_INVALID_ARGUMENT, "set it to sizeof(ct_op)");

    /* An older caller's ct_op, without the dense byte fields: defaults. */
    o = op_tmpl();
    o.size = offsetof(ct_op, output_dense_bytes);
    o.output_dense_bytes = 12345; /* past its size: never read */
    CHECK_STATUS(ct_record_op(s, span, &o), CT_OK, NULL);
    /* A required field past a smaller struct's size reads as NULL, and says so. */
    o = op_tmpl();
    o.size = offsetof(ct_op, device);
    CHECK_STATUS(ct_record_op(s, span, &o), CT_ERR_INVALID_ARGUMENT,
                 "op.device is NULL (op.size is 24, smaller than sizeof(ct_op)");

    /* A newer caller's larger struct: zeros past ours are fine, anything else is a
     * field this library does not know. */
    struct {
        ct_op op;
        uint64_t future[4];
    } big;
    memset(&big, 0, sizeof big);
    big.op = op_tmpl();
    big.op.size = sizeof big;
    CHECK_STATUS(ct_record_op(s, span, &big.op), CT_OK, NULL);
    big.future[2] = 7;
    CHECK_STATUS(ct_record_op(s, span, &big.op), CT_ERR_INVALID_ARGUMENT,
                 "larger than this library's sizeof(ct_op)");

    o = op_tmpl();
    o.flags = CT_HAS_OUTPUT_DENSE_BYTES | (1u << 5);
    CHECK_STATUS(ct_record_op(s, span, &o), CT_ERR_INVALID_ARGUMENT, "op.flags has unknown bits 0x20");
    ct_tensor t = tensor_tmpl();
    t.size = 0;
    CHECK_STATUS(ct_record_tensor(s, span, &t), CT_ERR_INVALID_ARGUMENT, "tensor.size is 0");
    t = tensor_tmpl();
    t.flags = 1u << 31;
    CHECK_STATUS(ct_record_tensor(s, span, &t), CT_ERR_INVALID_ARGUMENT, "tensor.flags has unknown bits 0x80000000");
    ct_tensor_stats st = stats_tmpl();
    st.size = 0;
    CHECK_STATUS(ct_record_tensor_stats(s, span, &st), CT_ERR_INVALID_ARGUMENT, "stats.size is 0");
    st = stats_tmpl();
    st.reserved = 1;
    CHECK_STATUS(ct_record_tensor_stats(s, span, &st), CT_ERR_INVALID_ARGUMENT, "stats.reserved is 0x1; it must be 0");
    ct_memory m = memory_tmpl("size-storage", "size-tensor", 24);
    m.size = 0;
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_ALLOC, &m), CT_ERR_INVALID_ARGUMENT, "memory.size is 0");
    m = memory_tmpl("size-storage", "size-tensor", 24);
    m.reserved = 2;
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_ALLOC, &m), CT_ERR_INVALID_ARGUMENT, "memory.reserved is 0x2; it must be 0");
    ct_device_memory dm = devmem_tmpl();
    dm.size = 0;
    CHECK_STATUS(ct_record_device_memory(s, &dm), CT_ERR_INVALID_ARGUMENT, "sample.size is 0");
    dm = devmem_tmpl();
    dm.flags |= 1u << 4;
    CHECK_STATUS(ct_record_device_memory(s, &dm), CT_ERR_INVALID_ARGUMENT, "sample.flags has unknown bits 0x10");
    ct_device_interval di = interval_tmpl();
    di.size = 0;
    CHECK_STATUS(ct_record_device_interval(s, span, &di), CT_ERR_INVALID_ARGUMENT, "interval.size is 0");
    di = interval_tmpl();
    di.flags = 2;
    CHECK_STATUS(ct_record_device_interval(s, span, &di), CT_ERR_INVALID_ARGUMENT, "interval.flags has unknown bits 0x2");
}

static void test_shapes(ct_session s, ct_span span) {
    g_section = "shapes";
    const int64_t big[2] = {(int64_t)1 << 62, 8};        /* elements overflow u64 */
    const int64_t big_bytes[2] = {(int64_t)1 << 62, 1};  /* elements fit, f32 bytes do not */
    const int64_t negative[2] = {2, -3};
    int64_t many[65];
    for (int i = 0; i < 65; i++) many[i] = 1;

    ct_op o = op_tmpl();
    o.shape = big;
    CHECK_STATUS(ct_record_op(s, span, &o), CT_ERR_INVALID_ARGUMENT, "u64");
    o.shape = big_bytes;
    CHECK_STATUS(ct_record_op(s, span, &o), CT_ERR_INVALID_ARGUMENT, "u64");
    o.shape = negative;
    CHECK_STATUS(ct_record_op(s, span, &o), CT_ERR_INVALID_ARGUMENT, "negative");
    o.shape = many;
    o.rank = 65;
    CHECK_STATUS(ct_record_op(s, span, &o), CT_ERR_INVALID_ARGUMENT, "rank");

    ct_tensor t = tensor_tmpl();
    t.shape = big;
    CHECK_STATUS(ct_record_tensor(s, span, &t), CT_ERR_INVALID_ARGUMENT, "u64");
    t.shape = big_bytes;
    CHECK_STATUS(ct_record_tensor(s, span, &t), CT_ERR_INVALID_ARGUMENT, "u64");
    t.shape = negative;
    CHECK_STATUS(ct_record_tensor(s, span, &t), CT_ERR_INVALID_ARGUMENT, "negative");

    ct_memory m = memory_tmpl("shape-storage", "shape-tensor", 24);
    m.shape = big;
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_ALLOC, &m), CT_ERR_INVALID_ARGUMENT, "u64");
    m.shape = negative;
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_ALLOC, &m), CT_ERR_INVALID_ARGUMENT, "negative");

    ct_tensor_stats st = stats_tmpl();
    st.shape = big;
    CHECK_STATUS(ct_record_tensor_stats(s, span, &st), CT_ERR_INVALID_ARGUMENT, "u64");
    st.shape = negative;
    CHECK_STATUS(ct_record_tensor_stats(s, span, &st), CT_ERR_INVALID_ARGUMENT, "negative");

    float d[6] = {0};
    CHECK_STATUS(ct_record_tensor_stats_f32(s, span, "big", d, big, 2), CT_ERR_INVALID_ARGUMENT, "64 bits");
    CHECK_STATUS(ct_record_tensor_stats_f32(s, span, "neg", d, negative, 2), CT_ERR_INVALID_ARGUMENT, "negative");

    /* One checker (cmd/libtrace/shape.c) for the recorded and the reduced
     * buffer: the same message past the function's name, also for a shape
     * wrong two ways (the negative dimension is named first). */
    const int64_t huge[2] = {(int64_t)1 << 41, 1};
    const int64_t neg_big[3] = {(int64_t)1 << 62, 8, -1};
    const struct {
        const int64_t *shape;
        size_t rank;
    } bad[] = {{big, 2}, {huge, 2}, {negative, 2}, {neg_big, 3}, {many, 65}, {NULL, 2}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ct_status recorded = ct_record_tensor_stats_f32(s, span, "same", d, bad[i].shape, bad[i].rank);
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ct_last_error());
        ct_tensor_stats out = {.size = sizeof out};
        ct_status reduced = ct_reduce_tensor_stats_f32(d, bad[i].shape, bad[i].rank, &out);
        const char *a = strchr(msg, ':'), *b = strchr(ct_last_error(), ':');
        CHECK(recorded == CT_ERR_INVALID_ARGUMENT && reduced == recorded && a && b && strcmp(a, b) == 0,
              "bad shape %zu: recorded %s, reduced %s", i, msg, ct_last_error());
    }
}

static void test_stats(ct_session s, ct_span span) {
    g_section = "tensor_stats invariants";
    ct_tensor_stats st = stats_tmpl();
    st.elements = 7;
    CHECK_STATUS(ct_record_tensor_stats(s, span, &st), CT_ERR_INVALID_ARGUMENT, "product");
    st = stats_tmpl();
    st.rank = 0;
    st.elements = 0; /* a scalar has 1 element */
    CHECK_STATUS(ct_record_tensor_stats(s, span, &st), CT_ERR_INVALID_ARGUMENT, "product");
    st = stats_tmpl();
    st.non_finite = 7;
    CHECK_STATUS(ct_record_tensor_stats(s, span, &st), CT_ERR_INVALID_ARGUMENT, "must not exceed");
    st = stats_tmpl();
    st.rms = -1.0;
    CHECK_STATUS(ct_record_tensor_stats(s, span, &st), CT_ERR_INVALID_ARGUMENT, "rms");
    st = stats_tmpl();
    st.abs_max = -0.5;
    CHECK_STATUS(ct_record_tensor_stats(s, span, &st), CT_ERR_INVALID_ARGUMENT, "abs_max");
    st = stats_tmpl();
    st.mean = NAN;
    CHECK_STATUS(ct_record_tensor_stats(s, span, &st), CT_ERR_INVALID_ARGUMENT, "finite");
    st = stats_tmpl();
    st.rms = INFINITY;
    CHECK_STATUS(ct_record_tensor_stats(s, span, &st), CT_ERR_INVALID_ARGUMENT, "finite");
    st = stats_tmpl();
    st.abs_max = NAN;
    CHECK_STATUS(ct_record_tensor_stats(s, span, &st), CT_ERR_INVALID_ARGUMENT, "finite");
    st = stats_tmpl();
    st.label = "   ";
    CHECK_STATUS(ct_record_tensor_stats(s, span, &st), CT_ERR_INVALID_ARGUMENT, "empty");
}

/* ct_reduce_tensor_stats_f32: the numbers, and every bad argument refused with
 * its message (no session: it is pure C). */
static void test_reduce_stats(void) {
    g_section = "ct_reduce_tensor_stats_f32";
    /* [1, -2, NaN, 4, +Inf, -0.0]: finite part 1, -2, 4, -0 -> mean 3/4, squares
     * 1 + 4 + 16 = 21 over 4 -> rms sqrt(5.25), |max| 4; two non-finite. */
    const float d[6] = {1, -2, NAN, 4, INFINITY, -0.0f};
    ct_tensor_stats st = {0};
    st.size = sizeof st;
    st.label = "kept";
    CHECK_STATUS(ct_reduce_tensor_stats_f32(d, SHAPE23, 2, &st), CT_OK, NULL);
    CHECK(st.elements == 6 && st.non_finite == 2, "counts %llu %llu",
          (unsigned long long)st.elements, (unsigned long long)st.non_finite);
    CHECK(st.mean == 0.75 && st.abs_max == 4.0 && st.rms == sqrt(5.25), "stats %g %g %g",
          st.mean, st.abs_max, st.rms);
    CHECK(st.dtype && strcmp(st.dtype, "f32") == 0 && strcmp(st.label, "kept") == 0,
          "dtype %s, label left alone", st.dtype ? st.dtype : "(null)");
    /* what it fills is what ct_record_tensor_stats accepts */
    st.shape = SHAPE23;
    st.rank = 2;
    ct_session s;
    ct_span m = 0;
    const char *path = outpath("failed-reduced-stats.jsonl");
    MUST(ct_open(path, RUN_INFER("test_abi::reduce"), &s));
    MUST(ct_measurement_begin(s, "m", &m));
    CHECK_STATUS(ct_record_tensor_stats(s, m, &st), CT_OK, NULL);
    MUST(ct_span_end(s, m));
    CHECK_STATUS(ct_finish_failed(s, "only the reduced stats"), CT_OK, NULL);
    check_trace_file(path, "failed");

    const float nan1[1] = {NAN};
    st = (ct_tensor_stats){.size = sizeof st};
    CHECK_STATUS(ct_reduce_tensor_stats_f32(nan1, NULL, 0, &st), CT_OK, NULL);
    CHECK(st.elements == 1 && st.non_finite == 1 && st.rms == 0 && st.mean == 0 &&
              st.abs_max == 0, "all non-finite: zeros");
    const int64_t empty[2] = {0, 3};
    CHECK_STATUS(ct_reduce_tensor_stats_f32(NULL, empty, 2, &st), CT_OK, NULL);
    CHECK(st.elements == 0 && st.non_finite == 0 && st.rms == 0, "empty");

    const int64_t big[2] = {(int64_t)1 << 62, 8};
    const int64_t huge[2] = {(int64_t)1 << 41, 1};
    const int64_t negative[2] = {2, -3};
    CHECK_STATUS(ct_reduce_tensor_stats_f32(d, SHAPE23, 2, NULL), CT_ERR_INVALID_ARGUMENT, "out is NULL");
    CHECK_STATUS(ct_reduce_tensor_stats_f32(NULL, SHAPE23, 2, &st), CT_ERR_INVALID_ARGUMENT, "data is NULL");
    CHECK_STATUS(ct_reduce_tensor_stats_f32(d, NULL, 2, &st), CT_ERR_INVALID_ARGUMENT, "shape is NULL");
    CHECK_STATUS(ct_reduce_tensor_stats_f32(d, big, 2, &st), CT_ERR_INVALID_ARGUMENT, "64 bits");
    CHECK_STATUS(ct_reduce_tensor_stats_f32(d, huge, 2, &st), CT_ERR_INVALID_ARGUMENT, "host buffer");
    CHECK_STATUS(ct_reduce_tensor_stats_f32(d, negative, 2, &st), CT_ERR_INVALID_ARGUMENT, "negative");
    CHECK_STATUS(ct_reduce_tensor_stats_f32(d, SHAPE23, 65, &st), CT_ERR_INVALID_ARGUMENT, "rank");
    st.size = 8;
    CHECK_STATUS(ct_reduce_tensor_stats_f32(d, SHAPE23, 2, &st), CT_ERR_INVALID_ARGUMENT, "sizeof");
}

static void test_gradients_refused(ct_session s) {
    g_section = "gradient state/norm";
    const double zero = 0.0, negzero = -0.0, one = 1.0, neg = -2.0, nan_ = NAN, inf = INFINITY;
    const struct {
        ct_gradient_state state;
        const double *norm;
        const char *what, *sub;
    } rows[] = {
        {CT_GRADIENT_PRESENT, NULL, "present, NULL norm", "needs"},
        {CT_GRADIENT_PRESENT, &zero, "present, norm 0", "> 0"},
        {CT_GRADIENT_PRESENT, &negzero, "present, norm -0.0", "> 0"},
        {CT_GRADIENT_PRESENT, &nan_, "present, norm NaN", "finite"},
        {CT_GRADIENT_PRESENT, &inf, "present, norm +inf", "finite"},
        {CT_GRADIENT_PRESENT, &neg, "present, norm -2", "> 0"},
        {CT_GRADIENT_ZERO, &negzero, "zero, norm -0.0", "+0.0"},
        {CT_GRADIENT_ZERO, &one, "zero, norm 1.0", "+0.0"},
        {CT_GRADIENT_ZERO, &nan_, "zero, norm NaN", "+0.0"},
        {CT_GRADIENT_ZERO, NULL, "zero, NULL norm", "+0.0"},
        {CT_GRADIENT_MISSING, &one, "missing with a norm", "must not carry"},
        {CT_GRADIENT_MISSING, &zero, "missing with norm 0", "must not carry"},
        {CT_GRADIENT_NON_FINITE, &one, "non_finite with a norm", "must not carry"},
        {CT_GRADIENT_NON_FINITE, &inf, "non_finite with norm inf", "must not carry"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char desc[128];
        snprintf(desc, sizeof desc, "ct_record_gradient(%s)", rows[i].what);
        CHECK_ROW(desc, ct_record_gradient(s, "model", "w", rows[i].state, rows[i].norm),
                  CT_ERR_INVALID_ARGUMENT, rows[i].sub);
    }
}

/* ---- spans ------------------------------------------------------------------ */

typedef struct {
    ct_session s;
    ct_span span;
    pthread_barrier_t opened, tried;
    ct_status begin_st, end_st;
} other_thread;

static void *other_thread_main(void *arg) {
    other_thread *o = arg;
    o->begin_st = ct_span_begin(o->s, "other-thread/span", CT_SPAN_FUNCTION, CT_STEP_NONE, &o->span);
    pthread_barrier_wait(&o->opened);
    pthread_barrier_wait(&o->tried);
    o->end_st = o->begin_st == CT_OK ? ct_span_end(o->s, o->span) : CT_OK;
    return NULL;
}

typedef struct {
    ct_session s;
    ct_status st;
    char msg[1024];
} root_end;

/* On a thread with no span open: ending s1 is refused as the root's. */
static void *end_root_main(void *arg) {
    root_end *r = arg;
    r->st = ct_span_end(r->s, 1);
    snprintf(r->msg, sizeof r->msg, "%s", ct_last_error());
    return NULL;
}

static void test_spans(ct_session s, ct_span measured) {
    g_section = "span nesting";
    ct_span a, b, c;
    MUST(ct_span_begin(s, "nest/a", CT_SPAN_FUNCTION, CT_STEP_NONE, &a));
    MUST(ct_span_begin(s, "nest/b", CT_SPAN_MODULE, CT_STEP_NONE, &b));
    CHECK(a != 0 && b != 0 && a != b && a != 1 && b != 1, "span ids 0, 1 or equal");
    CHECK_STATUS(ct_span_end(s, a), CT_ERR_SPAN_MISMATCH, "not the innermost");
    CHECK_STATUS(ct_span_end(s, measured), CT_ERR_SPAN_MISMATCH, "not the innermost");
    CHECK_STATUS(ct_span_end(s, 1), CT_ERR_SPAN_MISMATCH, "s1");
    CHECK_STATUS(ct_span_end(s, 987654), CT_ERR_SPAN_MISMATCH, "s987654");
    MUST(ct_span_begin(s, "nest/c", CT_SPAN_OP, CT_STEP_NONE, &c));
    CHECK_STATUS(ct_span_end(s, c), CT_OK, NULL);
    CHECK_STATUS(ct_span_end(s, c), CT_ERR_SPAN_MISMATCH, "not the innermost");
    CHECK_STATUS(ct_span_end(s, b), CT_OK, NULL);
    CHECK_STATUS(ct_span_end(s, a), CT_OK, NULL);

    /* A span opened on another thread. */
    other_thread o;
    memset(&o, 0, sizeof o);
    o.s = s;
    pthread_barrier_init(&o.opened, NULL, 2);
    pthread_barrier_init(&o.tried, NULL, 2);
    pthread_t th;
    pthread_create(&th, NULL, other_thread_main, &o);
    pthread_barrier_wait(&o.opened);
    CHECK(o.begin_st == CT_OK, "ct_span_begin on the other thread failed");
    /* Only the measured region is open on this thread. */
    CHECK_STATUS(ct_span_end(s, o.span), CT_ERR_SPAN_MISMATCH, "not the innermost");
    ct_span d;
    MUST(ct_span_begin(s, "nest/d", CT_SPAN_FUNCTION, CT_STEP_NONE, &d));
    CHECK_STATUS(ct_span_end(s, o.span), CT_ERR_SPAN_MISMATCH, "not the innermost");
    /* Records may still attach to a span open on another thread. */
    CHECK_STATUS(ct_record_scalar(s, o.span, "other-thread/scalar", 0.5), CT_OK, NULL);
    CHECK_STATUS(ct_span_end(s, d), CT_OK, NULL);
    pthread_barrier_wait(&o.tried);
    pthread_join(th, NULL);
    CHECK(o.end_st == CT_OK, "the owning thread could not end its span: %s", status_name(o.end_st));
    pthread_barrier_destroy(&o.opened);
    pthread_barrier_destroy(&o.tried);

    root_end r;
    memset(&r, 0, sizeof r);
    r.s = s;
    watch_before(CT_ERR_SPAN_MISMATCH);
    pthread_create(&th, NULL, end_root_main, &r);
    pthread_join(th, NULL);
    watch_after(CT_ERR_SPAN_MISMATCH, r.st, "ct_span_end(s, 1) on a thread with no open span", __FILE__, __LINE__);
    check_status_msg(r.st, CT_ERR_SPAN_MISMATCH, "root", r.msg, "ct_span_end(s, 1) on a thread with no open span",
                     __FILE__, __LINE__);
}

static void test_measured(ct_session s) {
    g_section = "measured region";
    ct_span x = 0;
    CHECK_STATUS(ct_measurement_begin(s, "second/measured", &x), CT_ERR_STATE, "measured region");

    ct_session r = 0;
    const char *path = outpath("valid-measured-root.jsonl");
    MUST(ct_open(path,
                 "{\"entrypoint\":\"test_abi::measured_root\",\"phase\":\"infer\",\"capture_step\":1,"
                 "\"device\":\"cpu\",\"measured_root\":true}",
                 &r));
    CHECK_STATUS(ct_measurement_begin(r, "not/allowed", &x), CT_ERR_STATE, "measured region");
    ct_span w;
    CHECK_STATUS(ct_span_begin(r, "root/work", CT_SPAN_FUNCTION, CT_STEP_NONE, &w), CT_OK, NULL);
    CHECK_STATUS(ct_measurement_begin(r, "not/allowed/nested", &x), CT_ERR_STATE, "measured region");
    CHECK_STATUS(ct_span_end(r, w), CT_OK, NULL);
    CHECK_STATUS(ct_finish(r), CT_OK, NULL);
    check_trace_file(path, "complete");
    char *buf = slurp(path, NULL);
    CHECK(buf && count_str(buf, "not/allowed") == 0, "a refused measurement_begin wrote a span");
    CHECK(buf && count_str(buf, "\"measured\":true") == 1, "measured-root trace has %ld measured spans",
          buf ? count_str(buf, "\"measured\":true") : -1);
    free(buf);
}

/* ---- records on spans: times, lifetimes, edges ----------------------------- */

/* The tracer's own time: the clock stands still inside an interval, and a
 * span around one does not count it. */
static void test_tracer(ct_session s) {
    g_section = "tracer time";
    CHECK_STATUS(ct_tracer_end(s), CT_ERR_STATE, "no tracer interval is open");
    uint64_t excluded0 = ct_tracer_ns(s);
    ct_span sp;
    MUST(ct_span_begin(s, "tracer/span", CT_SPAN_FUNCTION, CT_STEP_NONE, &sp));
    MUST(ct_tracer_begin(s));
    uint64_t frozen = ct_now_ns(s);
    sleep_ms(30);
    CHECK(ct_now_ns(s) == frozen, "the clock moved inside a tracer interval (%llu -> %llu)",
          (unsigned long long)frozen, (unsigned long long)ct_now_ns(s));
    MUST(ct_tracer_end(s));
    uint64_t after = ct_now_ns(s);
    CHECK(after >= frozen && after - frozen < 20000000ull,
          "the clock jumped by %llu ns over a tracer interval", (unsigned long long)(after - frozen));
    CHECK(ct_tracer_ns(s) - excluded0 >= 30000000ull, "ct_tracer_ns grew by %llu ns, want >= 30 ms",
          (unsigned long long)(ct_tracer_ns(s) - excluded0));
    /* Begun earlier than the call, but never before a value already read. */
    uint64_t read = ct_now_ns(s);
    sleep_ms(5);
    uint64_t est0 = ct_tracer_estimated_ns(s);
    MUST(ct_tracer_begin_earlier(s, 1000000000ull));
    uint64_t back_frozen = ct_now_ns(s);
    MUST(ct_tracer_end(s));
    CHECK(back_frozen >= read, "ct_tracer_begin_earlier took the clock back past a read (%llu < %llu)",
          (unsigned long long)back_frozen, (unsigned long long)read);
    uint64_t est = ct_tracer_estimated_ns(s) - est0;
    CHECK(est >= 5000000ull && est < 1000000000ull, "ct_tracer_estimated_ns grew by %llu ns, want [5 ms, 1 s)",
          (unsigned long long)est);
    /* ct_tracer_begin_at hands out the value the clock stands at, inside
     * nested intervals too, and that value is no earlier than a read. */
    uint64_t before_at = ct_now_ns(s);
    sleep_ms(2);
    uint64_t at = 0, nested_at = 0;
    MUST(ct_tracer_begin_at(s, 1000000000ull, &at));
    CHECK(at >= before_at, "ct_tracer_begin_at took the clock back past a read (%llu < %llu)",
          (unsigned long long)at, (unsigned long long)before_at);
    CHECK(ct_now_ns(s) == at, "ct_tracer_begin_at said %llu, the clock inside says %llu", (unsigned long long)at,
          (unsigned long long)ct_now_ns(s));
    sleep_ms(2);
    MUST(ct_tracer_begin_at(s, 0, &nested_at));
    CHECK(nested_at == at, "a nested ct_tracer_begin_at said %llu, the interval stands at %llu",
          (unsigned long long)nested_at, (unsigned long long)at);
    MUST(ct_tracer_end(s));
    MUST(ct_tracer_begin_at(s, 0, NULL)); /* now_ns may be NULL */
    MUST(ct_tracer_end(s));
    MUST(ct_tracer_end(s));
    CHECK(ct_now_ns(s) >= at, "the clock went back after ct_tracer_begin_at's interval");
    /* ct_tracer_exclude_earlier leaves out what passed since the last read,
     * at most earlier_ns, counted as estimated; inside an interval nothing. */
    uint64_t est1 = ct_tracer_estimated_ns(s), tracer1 = ct_tracer_ns(s); /* reads the clock too */
    uint64_t read2 = ct_now_ns(s);
    sleep_ms(5);
    MUST(ct_tracer_exclude_earlier(s, 1000000000ull));
    uint64_t after_exclude = ct_now_ns(s);
    uint64_t left_out = ct_tracer_estimated_ns(s) - est1;
    CHECK(after_exclude >= read2 && after_exclude - read2 < 2000000ull,
          "ct_tracer_exclude_earlier left the clock %lld ns from the read before it, want [0, 2 ms)",
          (long long)(after_exclude - read2));
    CHECK(left_out >= 5000000ull && left_out < 1000000000ull && ct_tracer_ns(s) - tracer1 == left_out,
          "ct_tracer_exclude_earlier left out %llu ns (estimated) and %llu ns (tracer), want the same, >= 5 ms",
          (unsigned long long)left_out, (unsigned long long)(ct_tracer_ns(s) - tracer1));
    MUST(ct_tracer_begin(s));
    uint64_t est2 = ct_tracer_estimated_ns(s), frozen2 = ct_now_ns(s);
    sleep_ms(2);
    MUST(ct_tracer_exclude_earlier(s, 1000000000ull));
    CHECK(ct_tracer_estimated_ns(s) == est2 && ct_now_ns(s) == frozen2,
          "ct_tracer_exclude_earlier inside an interval moved the clock or the estimate");
    MUST(ct_tracer_end(s));
    MUST(ct_span_end(s, sp));
}

static void test_times(ct_session s) {
    g_section = "op/memory inside span";
    uint64_t before = ct_now_ns(s);
    sleep_ms(2);
    ct_span sp;
    MUST(ct_span_begin(s, "times/span", CT_SPAN_FUNCTION, CT_STEP_NONE, &sp));
    uint64_t in1 = ct_now_ns(s);
    sleep_ms(1);
    uint64_t in2 = ct_now_ns(s);

    ct_op o = op_tmpl();
    o.timestamp_ns = before;
    o.duration_ns = 10;
    CHECK_STATUS(ct_record_op(s, sp, &o), CT_ERR_INVALID_ARGUMENT, "outside span");
    o.timestamp_ns = ct_now_ns(s) + 1000000000ull;
    CHECK_STATUS(ct_record_op(s, sp, &o), CT_ERR_INVALID_ARGUMENT, "outside span");
    o.timestamp_ns = in1;
    o.duration_ns = 2000000000ull; /* ends in the future */
    CHECK_STATUS(ct_record_op(s, sp, &o), CT_ERR_INVALID_ARGUMENT, "outside span");
    o.timestamp_ns = 0;
    o.duration_ns = ct_now_ns(s) + 1000000000ull; /* "now - duration" before the session */
    CHECK_STATUS(ct_record_op(s, sp, &o), CT_ERR_INVALID_ARGUMENT, "duration_ns");
    o.timestamp_ns = UINT64_MAX - 5;
    o.duration_ns = 10;
    CHECK_STATUS(ct_record_op(s, sp, &o), CT_ERR_INVALID_ARGUMENT, "overflows");

    ct_memory m = memory_tmpl("times-storage", "times-tensor", 24);
    m.timestamp_ns = before;
    CHECK_STATUS(ct_record_memory(s, sp, CT_MEMORY_ALLOC, &m), CT_ERR_INVALID_ARGUMENT, "outside span");
    m.timestamp_ns = ct_now_ns(s) + 1000000000ull;
    CHECK_STATUS(ct_record_memory(s, sp, CT_MEMORY_ALLOC, &m), CT_ERR_INVALID_ARGUMENT, "outside span");

    /* Inside, while open. */
    o = op_tmpl();
    o.timestamp_ns = in1;
    o.duration_ns = in2 - in1;
    CHECK_STATUS(ct_record_op(s, sp, &o), CT_OK, NULL);
    MUST(ct_span_end(s, sp));
    uint64_t after = ct_now_ns(s);
    sleep_ms(1);

    /* Closed: inside its interval is fine, after its end is not. */
    o.timestamp_ns = in1;
    o.duration_ns = in2 - in1;
    CHECK_STATUS(ct_record_op(s, sp, &o), CT_OK, NULL);
    o.timestamp_ns = 0;
    o.duration_ns = 1;
    CHECK_STATUS(ct_record_op(s, sp, &o), CT_ERR_INVALID_ARGUMENT, "outside span");
    o.timestamp_ns = in1;
    o.duration_ns = (after - in1) + 1000000; /* ends after the span closed */
    CHECK_STATUS(ct_record_op(s, sp, &o), CT_ERR_INVALID_ARGUMENT, "outside span");
    m.timestamp_ns = in2;
    CHECK_STATUS(ct_record_memory(s, sp, CT_MEMORY_ALLOC, &m), CT_OK, NULL);
    m.timestamp_ns = 0;
    CHECK_STATUS(ct_record_memory(s, sp, CT_MEMORY_FREE, &m), CT_ERR_INVALID_ARGUMENT, "outside span");
    m.timestamp_ns = in2;
    CHECK_STATUS(ct_record_memory(s, sp, CT_MEMORY_FREE, &m), CT_OK, NULL);

    /* Unknown spans. */
    CHECK_STATUS(ct_record_scalar(s, 0, "x", 1.0), CT_ERR_INVALID_HANDLE, "span 0");
    CHECK_STATUS(ct_record_scalar(s, 424242, "x", 1.0), CT_ERR_INVALID_HANDLE, "s424242");
    o = op_tmpl();
    CHECK_STATUS(ct_record_op(s, 424242, &o), CT_ERR_INVALID_HANDLE, "s424242");
    ct_tensor t = tensor_tmpl();
    CHECK_STATUS(ct_record_tensor(s, 424242, &t), CT_ERR_INVALID_HANDLE, "s424242");
    ct_device_interval di = interval_tmpl();
    CHECK_STATUS(ct_record_device_interval(s, 424242, &di), CT_ERR_INVALID_HANDLE, "s424242");
}

static void test_memory_lifetimes(ct_session s, ct_span span) {
    g_section = "memory lifetimes";
    ct_memory m = memory_tmpl("life-A", "life-t1", 24);
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_FREE, &m), CT_ERR_INVALID_ARGUMENT, "unpaired_free");
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_ALLOC, &m), CT_OK, NULL);
    ct_memory other = memory_tmpl("life-A", "life-t2", 48);
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_ALLOC, &other), CT_ERR_INVALID_ARGUMENT, "allocation_size_mismatch");
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_ALLOC, &m), CT_ERR_INVALID_ARGUMENT, "duplicate_allocation");
    ct_memory alias = memory_tmpl("life-A", "life-t2", 24);
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_ALLOC, &alias), CT_OK, NULL);
    /* The same storage id on another device is another storage. */
    ct_memory elsewhere = memory_tmpl("life-A", "life-t1", 48);
    elsewhere.device = "cuda:0";
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_ALLOC, &elsewhere), CT_OK, NULL);
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_FREE, &other), CT_ERR_INVALID_ARGUMENT, "allocation_size_mismatch");
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_FREE, &alias), CT_OK, NULL);
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_FREE, &m), CT_ERR_INVALID_ARGUMENT, "unpaired_free");
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_FREE, &elsewhere), CT_OK, NULL);
    /* A new lifetime of the same storage. */
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_ALLOC, &other), CT_OK, NULL);
    CHECK_STATUS(ct_record_memory(s, span, CT_MEMORY_FREE, &other), CT_OK, NULL);
}

static void test_edges(ct_session s, ct_span measured) {
    g_section = "call/data edges";
    ct_span a, b;
    MUST(ct_span_begin(s, "edge/a", CT_SPAN_FUNCTION, CT_STEP_NONE, &a));
    MUST(ct_span_begin(s, "edge/b", CT_SPAN_FUNCTION, CT_STEP_NONE, &b));
    CHECK_STATUS(ct_record_call_edge(s, 1, b, 0), CT_ERR_INVALID_ARGUMENT, "call_edge_hierarchy_mismatch");
    CHECK_STATUS(ct_record_call_edge(s, measured, b, 0), CT_ERR_INVALID_ARGUMENT, "call_edge_hierarchy_mismatch");
    CHECK_STATUS(ct_record_call_edge(s, b, a, 0), CT_ERR_INVALID_ARGUMENT, "call_edge_hierarchy_mismatch");
    CHECK_STATUS(ct_record_call_edge(s, a, 1, 0), CT_ERR_INVALID_ARGUMENT, "call_edge_hierarchy_mismatch");
    CHECK_STATUS(ct_record_call_edge(s, a, b, 5), CT_ERR_INVALID_ARGUMENT, "still open");
    CHECK_STATUS(ct_record_call_edge(s, a, 424242, 0), CT_ERR_INVALID_HANDLE, "s424242");
    CHECK_STATUS(ct_record_call_edge(s, 424242, b, 0), CT_ERR_INVALID_HANDLE, "s424242");
    CHECK_STATUS(ct_record_call_edge(s, 0, b, 0), CT_ERR_INVALID_HANDLE, "span 0");
    MUST(ct_span_end(s, b));
    CHECK_STATUS(ct_record_call_edge(s, a, b, 0xFFFFFFFFFFFFull), CT_ERR_INVALID_ARGUMENT, "differs");
    CHECK_STATUS(ct_record_call_edge(s, a, b, 1), CT_ERR_INVALID_ARGUMENT, "differs");
    MUST(ct_span_end(s, a));

    CHECK_STATUS(ct_record_data_edge(s, "no-such-tensor", "t-known"), CT_ERR_INVALID_ARGUMENT, "unknown_data_edge_tensor");
    CHECK_STATUS(ct_record_data_edge(s, "t-known", "no-such-tensor"), CT_ERR_INVALID_ARGUMENT, "unknown_data_edge_tensor");
    CHECK_STATUS(ct_record_data_edge(s, "t-known", "t-known-2"), CT_OK, NULL);
}

static void test_completed(ct_session s) {
    g_section = "completed spans";
    ct_span x;
    uint64_t now = ct_now_ns(s);
    CHECK_STATUS(ct_record_completed_span(s, "done", CT_SPAN_FUNCTION, 0, 0, &x), CT_ERR_INVALID_ARGUMENT, "duration");
    CHECK_STATUS(ct_record_completed_span(s, "done", CT_SPAN_FUNCTION, UINT64_MAX - 5, 10, &x), CT_ERR_INVALID_ARGUMENT, "overflows");
    CHECK_STATUS(ct_record_completed_span(s, "done", CT_SPAN_FUNCTION, now, 1000000000ull, &x), CT_ERR_INVALID_ARGUMENT, "future");
    CHECK_STATUS(ct_record_completed_span(s, "done", CT_SPAN_FUNCTION, now + 1000000000ull, 1, &x), CT_ERR_INVALID_ARGUMENT, "future");
    /* Stack-neutral: with a span open here, the completed span is root-attached
     * and the open span is still the innermost one. */
    ct_span open_;
    MUST(ct_span_begin(s, "completed/outer", CT_SPAN_FUNCTION, CT_STEP_NONE, &open_));
    now = ct_now_ns(s);
    x = 0;
    CHECK_STATUS(ct_record_completed_span(s, "completed/ok", CT_SPAN_OP, now / 2, now / 4, &x), CT_OK, NULL);
    CHECK(x > 1, "ct_record_completed_span returned span %llu", (unsigned long long)x);
    CHECK_STATUS(ct_record_completed_span(s, "completed/no-out", CT_SPAN_MODULE, now / 2, 1, NULL), CT_OK, NULL);
    CHECK_STATUS(ct_span_end(s, x), CT_ERR_SPAN_MISMATCH, "not the innermost");
    CHECK_STATUS(ct_record_call_edge(s, 1, x, 0), CT_OK, NULL);
    CHECK_STATUS(ct_span_end(s, open_), CT_OK, NULL);
}

static void test_device(ct_session s, ct_span span) {
    g_section = "device records";
    CHECK_STATUS(ct_device_start(s, NULL), CT_ERR_UNAVAILABLE, "NVML");
    CHECK_STATUS(ct_device_start(s, "{\"collect\":[\"nvml\"]}"), CT_ERR_UNAVAILABLE, "NVML");
    ct_device_memory dm = devmem_tmpl();
    dm.flags = 0;
    CHECK_STATUS(ct_record_device_memory(s, &dm), CT_ERR_INVALID_ARGUMENT, "at least one");
    dm = devmem_tmpl();
    dm.timestamp_ns = ct_now_ns(s) + 1000000000ull;
    CHECK_STATUS(ct_record_device_memory(s, &dm), CT_ERR_INVALID_ARGUMENT, "future");
    ct_device_interval di = interval_tmpl();
    di.duration_ns = 0;
    CHECK_STATUS(ct_record_device_interval(s, span, &di), CT_ERR_INVALID_ARGUMENT, "duration_ns");
    di = interval_tmpl();
    di.start_ns = UINT64_MAX - 2;
    CHECK_STATUS(ct_record_device_interval(s, span, &di), CT_ERR_INVALID_ARGUMENT, "overflows");
}

static void test_poison_free_finish_checks(void) {
    g_section = "finish checks";
    const char *path = outpath("valid-finish-checks.jsonl");
    ct_session s;
    MUST(ct_open(path,
                 "{\"entrypoint\":\"test_abi::finish_checks\",\"phase\":\"infer\",\"capture_step\":1,"
                 "\"device\":\"cpu\",\"capture_contract\":{\"measurement_scope\":\"profiled_work\","
                 "\"operations\":\"none\",\"activations\":\"none\",\"tensors\":\"none\","
                 "\"gradients\":\"complete\",\"logical_memory\":\"none\",\"physical_memory\":\"none\","
                 "\"device_timing\":\"none\",\"required_semantic_labels\":[\"needed/label\"],"
                 "\"gradient_contract\":{\"expected\":[{\"root\":\"m\",\"key\":\"w\",\"family\":\"f\"}],"
                 "\"families\":[{\"family\":\"f\",\"expectation\":\"active\",\"min_present\":1}]}}}",
                 &s));
    ct_span a, b, m;
    MUST(ct_span_begin(s, "open/a", CT_SPAN_FUNCTION, CT_STEP_NONE, &a));
    MUST(ct_span_begin(s, "open/b", CT_SPAN_FUNCTION, CT_STEP_NONE, &b));
    CHECK_STATUS(ct_finish(s), CT_ERR_STATE, "still open");
    /* The session stays usable. */
    CHECK_STATUS(ct_record_scalar(s, b, "after/refused/finish", 3.0), CT_OK, NULL);
    ct_span c;
    CHECK_STATUS(ct_span_begin(s, "after/refused/finish", CT_SPAN_FUNCTION, CT_STEP_NONE, &c), CT_OK, NULL);
    CHECK_STATUS(ct_span_end(s, c), CT_OK, NULL);
    CHECK_STATUS(ct_span_end(s, b), CT_OK, NULL);
    CHECK_STATUS(ct_finish(s), CT_ERR_STATE, "still open");
    CHECK_STATUS(ct_span_end(s, a), CT_OK, NULL);
    CHECK_STATUS(ct_finish(s), CT_ERR_STATE, "no measured region");
    MUST(ct_measurement_begin(s, "finish/measured", &m));
    CHECK_STATUS(ct_flush(s), CT_OK, NULL);
    MUST(ct_span_end(s, m));
    CHECK_STATUS(ct_finish(s), CT_ERR_STATE, "needed/label");
    ct_span n;
    MUST(ct_span_begin(s, "needed/label", CT_SPAN_FUNCTION, CT_STEP_NONE, &n));
    MUST(ct_span_end(s, n));
    CHECK_STATUS(ct_finish(s), CT_ERR_STATE, "m/w");
    double g = 0.75;
    CHECK_STATUS(ct_record_gradient(s, "m", "other", CT_GRADIENT_PRESENT, &g), CT_ERR_INVALID_ARGUMENT, "gradient_manifest_undeclared_key");
    CHECK_STATUS(ct_record_gradient(s, "m", "w", CT_GRADIENT_PRESENT, &g), CT_OK, NULL);
    CHECK_STATUS(ct_record_gradient(s, "m", "w", CT_GRADIENT_PRESENT, &g), CT_ERR_INVALID_ARGUMENT, "gradient_manifest_duplicate_key");
    CHECK_STATUS(ct_finish(s), CT_OK, NULL);
    CHECK_STATUS(ct_finish(s), CT_ERR_INVALID_HANDLE, "unknown or already finished");
    check_trace_file(path, "complete");
}

/* The session all refused-call tests run in: it must end valid. */
static void test_errors_session(void) {
    g_section = "errors session";
    const char *path = outpath("valid-errors.jsonl");
    ct_session s;
    ct_span m, w;
    MUST(ct_open(path, RUN_INFER("test_abi::errors"), &s));
    MUST(ct_measurement_begin(s, "errors/measured", &m));
    MUST(ct_span_begin(s, "errors/work", CT_SPAN_FUNCTION, CT_STEP_NONE, &w));
    /* Known tensors for the data-edge rows. */
    ct_tensor t = tensor_tmpl();
    t.tensor_id = "t-known";
    MUST(ct_record_tensor(s, w, &t));
    t.tensor_id = "t-known-2";
    MUST(ct_record_tensor(s, w, &t));

    g_watch = s;
    snprintf(g_watch_path, sizeof g_watch_path, "%s", path);
    test_nulls(s, w);
    test_strings(s, w);
    test_enums(s, w);
    test_sizes(s, w);
    test_shapes(s, w);
    test_stats(s, w);
    test_gradients_refused(s);
    test_memory_lifetimes(s, w);
    test_device(s, w);
    test_spans(s, m);
    test_measured(s);
    test_times(s);
    test_tracer(s);
    test_edges(s, w);
    test_completed(s);
    g_watch = 0;

    g_section = "errors session";
    MUST(ct_span_end(s, w));
    MUST(ct_span_end(s, m));
    CHECK_STATUS(ct_finish(s), CT_OK, NULL);
    check_trace_file(path, "complete");
    char *buf = slurp(path, NULL);
    CHECK(buf && count_lines_with(buf, "\"kind\":\"span_end\"", "\"id\":\"s1\"") == 1,
          "errors trace has no span_end for s1");
    CHECK(buf && count_str(buf, "not/allowed") == 0 && count_str(buf, "\"second/measured\"") == 0,
          "a refused span was written");
    CHECK(buf && count_str(buf, "\"measured\":true") == 1, "errors trace has %ld measured spans",
          buf ? count_str(buf, "\"measured\":true") : -1);
    free(buf);
}

/* ---- a full training step: every record kind ------------------------------ */

static void test_full_step(void) {
    g_section = "full step";
    const char *path = outpath("valid-full-step.jsonl");
    ct_session s;
    MUST(ct_open(path,
                 "{\"entrypoint\":\"test_abi::train_step\",\"phase\":\"train\",\"capture_step\":5,"
                 "\"warmup_steps\":2,\"device\":\"cpu\",\"timing_mode\":\"host\","
                 "\"candle_version\":\"0.9.1\",\"tags\":{\"suite\":\"test_abi\"},"
                 "\"correlation_id\":\"test_abi/full-step\","
                 "\"comparison_identity\":{\"workload_id\":\"w\",\"model_id\":\"mlp\",\"config_id\":\"c\","
                 "\"data_id\":\"d\",\"seed_policy\":\"fixed\",\"precision\":\"f32\",\"device_state\":\"idle\","
                 "\"physical_batch\":4,\"accumulation_steps\":1,\"implementation_id\":\"c-abi\"},"
                 "\"capture_contract\":{\"measurement_scope\":\"profiled_work\",\"operations\":\"complete\","
                 "\"activations\":\"partial\",\"tensors\":\"partial\",\"gradients\":\"complete\","
                 "\"logical_memory\":\"complete\",\"physical_memory\":\"partial\",\"device_timing\":\"partial\","
                 "\"required_semantic_labels\":[\"mlp/forward\",\"mlp/backward\",\"sgd/step\"],"
                 "\"gradient_contract\":{\"expected\":["
                 "{\"root\":\"mlp\",\"key\":\"fc1.weight\",\"family\":\"fc1\"},"
                 "{\"root\":\"mlp\",\"key\":\"fc1.bias\",\"family\":\"fc1\"}],"
                 "\"families\":[{\"family\":\"fc1\",\"expectation\":\"active\",\"min_present\":1}]}}}",
                 &s));
    ct_span update, fwd, bwd, opt, inner;
    MUST(ct_measurement_begin(s, "train/update", &update));

    MUST(ct_span_begin(s, "mlp/forward", CT_SPAN_MODULE, CT_STEP_FORWARD, &fwd));
    CHECK_STATUS(ct_record_call_edge(s, update, fwd, 0), CT_OK, NULL); /* written when fwd closes */
    uint64_t t0 = ct_now_ns(s);
    sleep_ms(1);
    const char *ins[] = {"x", "fc1.weight"};
    const int64_t hshape[2] = {4, 8};
    ct_op o = op_tmpl();
    o.op_name = "matmul";
    o.inputs = ins;
    o.n_inputs = 2;
    o.output = "h";
    o.shape = hshape;
    o.timestamp_ns = t0;
    o.duration_ns = ct_now_ns(s) - t0;
    o.input_dense_bytes = (4 * 16 + 8 * 16) * 4;
    CHECK_STATUS(ct_record_op(s, fwd, &o), CT_OK, NULL);
    o.op_name = "relu";
    const char *ins2[] = {"h"};
    o.inputs = ins2;
    o.n_inputs = 1;
    o.output = "h.relu";
    o.timestamp_ns = 0; /* = now - duration */
    o.duration_ns = 100;
    o.flags = CT_HAS_OUTPUT_DENSE_BYTES;
    o.output_dense_bytes = 128;
    o.input_dense_bytes = 128;
    CHECK_STATUS(ct_record_op(s, fwd, &o), CT_OK, NULL);
    o = op_tmpl();
    o.op_name = "scalar_op";
    o.dtype = "q4_custom"; /* a dtype without a derived size */
    o.shape = NULL;
    o.rank = 0;
    o.inputs = NULL;
    o.n_inputs = 0;
    CHECK_STATUS(ct_record_op(s, fwd, &o), CT_OK, NULL);

    ct_tensor t = tensor_tmpl();
    t.tensor_id = "fc1.weight";
    t.label = "fc1.weight";
    t.shape = (const int64_t[2]){8, 16};
    t.requires_grad = 1;
    t.category = CT_CATEGORY_PARAMETER;
    CHECK_STATUS(ct_record_tensor(s, fwd, &t), CT_OK, NULL);
    t = tensor_tmpl();
    t.tensor_id = "h";
    t.label = NULL;
    t.shape = hshape;
    t.flags = CT_HAS_DENSE_BYTES;
    t.dense_bytes = 128;
    t.dtype = "F32";
    CHECK_STATUS(ct_record_tensor(s, fwd, &t), CT_OK, NULL);

    ct_tensor_stats st = stats_tmpl();
    st.label = "mlp/h";
    st.shape = hshape;
    st.elements = 32;
    st.non_finite = 2;
    CHECK_STATUS(ct_record_tensor_stats(s, fwd, &st), CT_OK, NULL);
    st = stats_tmpl();
    st.label = "mlp/scalar-stats";
    st.shape = NULL;
    st.rank = 0;
    st.elements = 1;
    CHECK_STATUS(ct_record_tensor_stats(s, fwd, &st), CT_OK, NULL);
    float data[6] = {1.0f, -2.0f, NAN, INFINITY, 0.5f, 0.0f};
    CHECK_STATUS(ct_record_tensor_stats_f32(s, fwd, "mlp/with-nan", data, SHAPE23, 2), CT_OK, NULL);
    const int64_t empty[2] = {0, 3};
    CHECK_STATUS(ct_record_tensor_stats_f32(s, fwd, "mlp/empty", NULL, empty, 2), CT_OK, NULL);
    CHECK_STATUS(ct_record_scalar(s, fwd, "loss", 0.6931), CT_OK, NULL);
    CHECK_STATUS(ct_record_scalar(s, fwd, "loss/nan", NAN), CT_OK, NULL);
    CHECK_STATUS(ct_record_scalar(s, fwd, "loss/inf", -INFINITY), CT_OK, NULL);

    ct_memory mem = memory_tmpl("cpu-h", "h", 128);
    mem.shape = hshape;
    mem.op_name = "matmul";
    CHECK_STATUS(ct_record_memory(s, fwd, CT_MEMORY_ALLOC, &mem), CT_OK, NULL);
    ct_memory alias = memory_tmpl("cpu-h", "h.view", 128);
    alias.shape = hshape;
    CHECK_STATUS(ct_record_memory(s, fwd, CT_MEMORY_ALLOC, &alias), CT_OK, NULL);

    ct_device_memory dm = devmem_tmpl();
    dm.flags = CT_HAS_USED_BYTES | CT_HAS_CAPACITY_BYTES;
    dm.used_bytes = 4096;
    dm.capacity_bytes = 1 << 30;
    CHECK_STATUS(ct_record_device_memory(s, &dm), CT_OK, NULL);
    dm = devmem_tmpl();
    dm.flags = CT_HAS_FREE_BYTES | CT_HAS_RESERVED_BYTES;
    dm.free_bytes = 1000;
    dm.reserved_bytes = 2000;
    dm.timestamp_ns = ct_now_ns(s);
    CHECK_STATUS(ct_record_device_memory(s, &dm), CT_OK, NULL);

    ct_device_interval di = interval_tmpl();
    di.start_ns = t0;
    di.duration_ns = 1000;
    di.flags = CT_HAS_CORRELATION_ID;
    di.correlation_id = 77;
    CHECK_STATUS(ct_record_device_interval(s, fwd, &di), CT_OK, NULL);
    di = interval_tmpl();
    di.clock_id = "cuda-device";
    di.name = NULL;
    di.start_ns = 123456789;
    CHECK_STATUS(ct_record_device_interval(s, fwd, &di), CT_OK, NULL);
    CHECK_STATUS(ct_record_data_edge(s, "x", "h"), CT_OK, NULL);
    CHECK_STATUS(ct_record_data_edge(s, "h", "h.relu"), CT_OK, NULL);

    MUST(ct_span_begin(s, "mlp/forward/inner", CT_SPAN_OP, CT_STEP_NONE, &inner));
    MUST(ct_span_end(s, inner));
    CHECK_STATUS(ct_record_call_edge(s, fwd, inner, 0), CT_OK, NULL); /* closed: written at once */
    MUST(ct_span_end(s, fwd));

    MUST(ct_span_begin(s, "mlp/backward", CT_SPAN_MODULE, CT_STEP_BACKWARD, &bwd));
    o = op_tmpl();
    o.op_name = "matmul_backward";
    o.output = "fc1.weight.grad";
    o.duration_ns = 10;
    CHECK_STATUS(ct_record_op(s, bwd, &o), CT_OK, NULL);
    CHECK_STATUS(ct_record_memory(s, bwd, CT_MEMORY_FREE, &alias), CT_OK, NULL);
    MUST(ct_span_end(s, bwd));
    CHECK_STATUS(ct_flush(s), CT_OK, NULL);
    long long bdur = span_duration(path, bwd);
    CHECK(bdur > 0, "cannot find the duration of the backward span in the flushed trace");
    if (bdur > 0) CHECK_STATUS(ct_record_call_edge(s, update, bwd, (uint64_t)bdur), CT_OK, NULL);

    double n1 = 0.125, z = 0.0;
    CHECK_STATUS(ct_record_gradient(s, "mlp", "fc1.weight", CT_GRADIENT_PRESENT, &n1), CT_OK, NULL);
    CHECK_STATUS(ct_record_gradient(s, "mlp", "fc1.bias", CT_GRADIENT_ZERO, &z), CT_OK, NULL);

    MUST(ct_span_begin(s, "sgd/step", CT_SPAN_FUNCTION, CT_STEP_OPTIMIZER, &opt));
    float w[4] = {0.1f, 0.2f, -0.3f, 0.4f};
    const int64_t wshape[1] = {4};
    CHECK_STATUS(ct_record_tensor_stats_f32(s, opt, "fc1.weight", w, wshape, 1), CT_OK, NULL);
    MUST(ct_span_end(s, opt));

    uint64_t now = ct_now_ns(s);
    ct_span done = 0;
    CHECK_STATUS(ct_record_completed_span(s, "dataloader/next", CT_SPAN_FUNCTION, now / 4, now / 8, &done), CT_OK, NULL);
    CHECK_STATUS(ct_record_call_edge(s, 1, done, (uint64_t)(now / 8)), CT_OK, NULL);
    MUST(ct_span_end(s, update));
    CHECK_STATUS(ct_record_call_edge(s, 1, update, 0), CT_OK, NULL);
    CHECK_STATUS(ct_finish(s), CT_OK, NULL);
    check_trace_file(path, "complete");

    char *buf = slurp(path, NULL);
    if (!buf) return;
    static const struct {
        const char *needle;
        long want;
    } kinds[] = {
        {"\"kind\":\"meta\"", 1},          {"\"kind\":\"span_start\"", 7},
        {"\"kind\":\"span_end\"", 7},      {"\"kind\":\"op\"", 4},
        {"\"kind\":\"tensor\"", 2},        {"\"kind\":\"tensor_stats\"", 8},
        {"\"kind\":\"memory\"", 3},        {"\"kind\":\"device_memory\"", 2},
        {"\"kind\":\"device_interval\"", 2}, {"\"kind\":\"gradient\"", 2},
        {"\"edge_kind\":\"call\"", 5},     {"\"edge_kind\":\"data\"", 2},
        {"\"kind\":\"terminal\"", 1},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        long n = count_str(buf, kinds[i].needle);
        CHECK(n == kinds[i].want, "full step: %ld lines with %s, want %ld", n, kinds[i].needle, kinds[i].want);
    }
    char edge[128];
    snprintf(edge, sizeof edge, "\"to_span\":\"s%llu\"", (unsigned long long)bwd);
    CHECK(count_lines_with(buf, "\"edge_kind\":\"call\"", edge) == 1, "no call edge to the backward span");
    snprintf(edge, sizeof edge, "\"to_span\":\"s%llu\"", (unsigned long long)fwd);
    CHECK(count_lines_with(buf, "\"edge_kind\":\"call\"", edge) == 1, "the pending call edge to forward was not written");
    free(buf);
}

/* All four gradient states in one partial-coverage trace. */
static void test_gradients_valid(void) {
    g_section = "gradients";
    const char *path = outpath("valid-gradients.jsonl");
    ct_session s;
    ct_span m;
    MUST(ct_open(path,
                 "{\"entrypoint\":\"test_abi::gradients\",\"phase\":\"train\",\"capture_step\":1,"
                 "\"device\":\"cpu\",\"capture_contract\":{\"measurement_scope\":\"profiled_work\","
                 "\"operations\":\"none\",\"activations\":\"none\",\"gradients\":\"partial\","
                 "\"logical_memory\":\"none\",\"physical_memory\":\"none\",\"device_timing\":\"none\"}}",
                 &s));
    MUST(ct_measurement_begin(s, "gradients/measured", &m));
    double n = 2.5, z = 0.0;
    CHECK_STATUS(ct_record_gradient(s, "vb", "present", CT_GRADIENT_PRESENT, &n), CT_OK, NULL);
    CHECK_STATUS(ct_record_gradient(s, "vb", "zero", CT_GRADIENT_ZERO, &z), CT_OK, NULL);
    CHECK_STATUS(ct_record_gradient(s, "vb", "missing", CT_GRADIENT_MISSING, NULL), CT_OK, NULL);
    CHECK_STATUS(ct_record_gradient(s, "vb", "non_finite", CT_GRADIENT_NON_FINITE, NULL), CT_OK, NULL);
    CHECK_STATUS(ct_record_gradient(s, "vb", "present", CT_GRADIENT_PRESENT, &n), CT_OK, NULL); /* no contract: repeats allowed */
    MUST(ct_span_end(s, m));
    CHECK_STATUS(ct_finish(s), CT_OK, NULL);
    check_trace_file(path, "complete");
    char *buf = slurp(path, NULL);
    CHECK(buf && count_str(buf, "\"kind\":\"gradient\"") == 5, "gradients trace: want 5 gradient lines");
    free(buf);
}

/* ---- a failed capture ------------------------------------------------------ */

static void test_failed(void) {
    g_section = "finish_failed";
    const char *path = outpath("failed-open-spans.jsonl");
    ct_session s;
    ct_span m, a;
    MUST(ct_open(path, RUN_INFER("test_abi::failed"), &s));
    MUST(ct_measurement_begin(s, "failed/measured", &m));
    MUST(ct_span_begin(s, "failed/open", CT_SPAN_FUNCTION, CT_STEP_NONE, &a));
    CHECK_STATUS(ct_finish_failed(s, NULL), CT_ERR_INVALID_ARGUMENT, "reason is NULL");
    for (size_t i = 0; i < sizeof BAD_STRINGS / sizeof BAD_STRINGS[0]; i++) {
        char desc[128];
        snprintf(desc, sizeof desc, "ct_finish_failed(reason = %s)", BAD_STRINGS[i].what);
        CHECK_ROW(desc, ct_finish_failed(s, BAD_STRINGS[i].s), CT_ERR_INVALID_ARGUMENT, BAD_STRINGS[i].sub);
    }
    CHECK_STATUS(ct_finish_failed(s, "   "), CT_ERR_INVALID_ARGUMENT, "empty");
    /* Still usable after the refusals. */
    CHECK_STATUS(ct_record_scalar(s, a, "failed/scalar", 1.0), CT_OK, NULL);
    CHECK_STATUS(ct_finish_failed(s, "the step raised: out of memory"), CT_OK, NULL);
    CHECK_STATUS(ct_finish_failed(s, "again"), CT_ERR_INVALID_HANDLE, "unknown or already finished");
    CHECK_STATUS(ct_span_end(s, a), CT_ERR_INVALID_HANDLE, "unknown or already finished");
    check_trace_file(path, "failed");
    char *buf = slurp(path, NULL);
    CHECK(buf && strstr(buf, "the step raised: out of memory"), "failed trace lacks the reason");
    CHECK(buf && count_lines_with(buf, "\"kind\":\"span_end\"", NULL) == 0, "finish_failed closed open spans");
    free(buf);
}

/* ---- threads ----------------------------------------------------------------- */

#define THREADS 4
#define ITERS 10000

typedef struct {
    ct_session s;
    int fails;
    int scalars;
} nest_arg;

static void *nest_main(void *p) {
    nest_arg *a = p;
    for (int i = 0; i < ITERS; i++) {
        ct_span x, y, z;
        if (ct_span_begin(a->s, "thread/outer", CT_SPAN_FUNCTION, CT_STEP_NONE, &x) != CT_OK) a->fails++;
        if (ct_span_begin(a->s, "thread/mid", CT_SPAN_MODULE, CT_STEP_FORWARD, &y) != CT_OK) a->fails++;
        if (ct_span_begin(a->s, "thread/inner", CT_SPAN_OP, CT_STEP_NONE, &z) != CT_OK) a->fails++;
        if (i % 2500 == 0) {
            if (ct_record_scalar(a->s, z, "thread/scalar", (double)i) != CT_OK) a->fails++;
            a->scalars++;
        }
        if (ct_span_end(a->s, z) != CT_OK) a->fails++;
        if (ct_span_end(a->s, y) != CT_OK) a->fails++;
        if (ct_span_end(a->s, x) != CT_OK) a->fails++;
    }
    return NULL;
}

static void test_threads(void) {
    g_section = "threads";
    const char *path = outpath("valid-threads.jsonl");
    ct_session s;
    ct_span m;
    MUST(ct_open(path, RUN_INFER("test_abi::threads"), &s));
    MUST(ct_measurement_begin(s, "threads/measured", &m));
    pthread_t th[THREADS];
    nest_arg args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i].s = s;
        args[i].fails = 0;
        args[i].scalars = 0;
        pthread_create(&th[i], NULL, nest_main, &args[i]);
    }
    int fails = 0, scalars = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        fails += args[i].fails;
        scalars += args[i].scalars;
    }
    CHECK(fails == 0, "threads: %d calls failed", fails);
    MUST(ct_span_end(s, m));
    CHECK_STATUS(ct_finish(s), CT_OK, NULL);
    check_trace_file(path, "complete");
    char *buf = slurp(path, NULL);
    if (!buf) return;
    long want = 2 + (long)THREADS * ITERS * 3;
    long starts = count_str(buf, "\"kind\":\"span_start\"");
    long ends = count_str(buf, "\"kind\":\"span_end\"");
    CHECK(starts == want, "threads: %ld span_start lines, want %ld", starts, want);
    CHECK(ends == want, "threads: %ld span_end lines, want %ld", ends, want);
    CHECK(count_str(buf, "\"name\":\"thread/inner\"") == (long)THREADS * ITERS, "threads: inner span count");
    CHECK(count_str(buf, "\"label\":\"thread/scalar\"") == scalars, "threads: scalar count");
    free(buf);
}

/* A refused ct_finish leaves the session usable for every thread: a worker
 * keeps beginning and ending spans while ct_finish is refused again and again
 * (the calling thread holds a span open); not one of its calls is refused.
 * The worker makes a batch of pairs as each ct_finish begins, not as many as
 * it can: a refused ct_finish drains all the worker made, and a thread's
 * ring holds megabytes of them (it stretches), so an unbounded worker made
 * this test's trace as large as the machine was slow (gigabytes under load). */
typedef struct {
    ct_session s;
    int stop, started;
    long finishes; /* the ct_finish call about to be made */
    long acked;    /* the worker's batch for it has begun */
    long pairs, refused;
    char first[1024];
} finish_race_arg;

#define FINISH_RACE_BATCH 100

static void *finish_race_worker(void *p) {
    finish_race_arg *a = p;
    long seen = -1;
    while (!__atomic_load_n(&a->stop, __ATOMIC_ACQUIRE)) {
        /* A batch, then wait for the next ct_finish: each batch overlaps one. */
        long f = __atomic_load_n(&a->finishes, __ATOMIC_ACQUIRE);
        if (f == seen) {
            sched_yield();
            continue;
        }
        seen = f;
        __atomic_store_n(&a->acked, f, __ATOMIC_RELEASE);
        for (int i = 0; i < FINISH_RACE_BATCH; i++) {
            ct_span x;
            ct_status st = ct_span_begin(a->s, "worker/span", CT_SPAN_FUNCTION, CT_STEP_NONE, &x);
            if (st == CT_OK) st = ct_span_end(a->s, x);
            if (st == CT_OK) {
                a->pairs++;
            } else if (a->refused++ == 0) {
                snprintf(a->first, sizeof a->first, "%s: %s", status_name(st), ct_last_error());
            }
        }
        __atomic_store_n(&a->started, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

static void test_finish_refused_concurrently(void) {
    g_section = "refused ct_finish";
    const char *path = outpath("valid-finish-refused.jsonl");
    ct_session s;
    ct_span held;
    MUST(ct_open(path,
                 "{\"entrypoint\":\"test_abi::finish_refused\",\"phase\":\"infer\",\"capture_step\":1,"
                 "\"device\":\"cpu\",\"measured_root\":true}",
                 &s));
    MUST(ct_span_begin(s, "held/open", CT_SPAN_FUNCTION, CT_STEP_NONE, &held));
    finish_race_arg a;
    memset(&a, 0, sizeof a);
    a.s = s;
    pthread_t th;
    pthread_create(&th, NULL, finish_race_worker, &a);
    while (!__atomic_load_n(&a.started, __ATOMIC_ACQUIRE)) sleep_ms(1);
    int wrong = 0;
    char msg[1024] = "";
    for (int i = 1; i <= 2000; i++) {
        __atomic_store_n(&a.finishes, i, __ATOMIC_RELEASE);
        while (__atomic_load_n(&a.acked, __ATOMIC_ACQUIRE) != i) sched_yield();
        ct_status st = ct_finish(s);
        if (st != CT_ERR_STATE || !strstr(ct_last_error(), "spans still open")) {
            if (wrong++ == 0) snprintf(msg, sizeof msg, "%s: %s", status_name(st), ct_last_error());
        }
    }
    __atomic_store_n(&a.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    CHECK(wrong == 0, "ct_finish with a span open answered otherwise %d times (first: %s)", wrong, msg);
    CHECK(a.refused == 0, "the worker's span calls were refused %ld times during refused ct_finish calls (first: %s)",
          a.refused, a.first);
    CHECK(a.pairs > 0, "the worker ran no span");
    CHECK_STATUS(ct_span_end(s, held), CT_OK, NULL);
    CHECK_STATUS(ct_finish(s), CT_OK, NULL);
    check_trace_file(path, "complete");
}

/* ---- poisoning ---------------------------------------------------------------- */

/* After the first write error: the failing call says CT_ERR_IO, everything
 * after says CT_ERR_POISONED, ct_finish never writes complete and
 * ct_finish_failed still ends the session. first_flush_st is what the first
 * ct_flush after the error returned. */
static void check_poisoned(ct_session s, const char *path, ct_status first_flush_st, const char *first_msg) {
    CHECK(first_flush_st == CT_ERR_IO, "the first ct_flush after a write error returned %s, want CT_ERR_IO (%s)",
          status_name(first_flush_st), first_msg);
    ct_span x;
    CHECK_STATUS(ct_flush(s), CT_ERR_POISONED, "poisoned");
    CHECK_STATUS(ct_span_begin(s, "after/poison", CT_SPAN_FUNCTION, CT_STEP_NONE, &x), CT_ERR_POISONED, "poisoned");
    CHECK_STATUS(ct_measurement_begin(s, "after/poison", &x), CT_ERR_POISONED, "poisoned");
    CHECK_STATUS(ct_span_end(s, 2), CT_ERR_POISONED, "poisoned");
    CHECK_STATUS(ct_record_scalar(s, 1, "after/poison", 1.0), CT_ERR_POISONED, "poisoned");
    ct_op o = op_tmpl();
    CHECK_STATUS(ct_record_op(s, 1, &o), CT_ERR_POISONED, "poisoned");
    CHECK_STATUS(ct_record_completed_span(s, "after/poison", CT_SPAN_FUNCTION, 0, 1, NULL), CT_ERR_POISONED, "poisoned");
    CHECK_STATUS(ct_record_gradient(s, "r", "k", CT_GRADIENT_MISSING, NULL), CT_ERR_POISONED, "poisoned");
    CHECK_STATUS(ct_finish(s), CT_ERR_POISONED, "poisoned");
    CHECK_STATUS(ct_finish(s), CT_ERR_POISONED, "poisoned");
    ct_status st = ct_finish_failed(s, "the disk is full");
    CHECK(st == CT_OK || st == CT_ERR_IO, "ct_finish_failed on a poisoned session returned %s: %s",
          status_name(st), ct_last_error());
    CHECK_STATUS(ct_flush(s), CT_ERR_INVALID_HANDLE, "unknown or already finished");
    CHECK_STATUS(ct_finish_failed(s, "again"), CT_ERR_INVALID_HANDLE, "unknown or already finished");
    char *buf = slurp(path, NULL);
    if (buf) {
        CHECK(!strstr(buf, "\"outcome\":\"complete\""), "a poisoned session wrote terminal complete");
        CHECK(!strstr(buf, "after/poison"), "a call on a poisoned session was written");
        free(buf);
    }
}

static void test_dev_full(void) {
    g_section = "/dev/full";
    /* ct_open on a device node it cannot write: a private node (mknod, as
     * root) or /dev/full itself only when we cannot remove it (not root), so
     * a library that deletes what it cannot write cannot break the machine. */
    char path[4096];
    int is_node = 0;
    snprintf(path, sizeof path, "%s", outpath("dev-full-node"));
    if (mknod(path, S_IFCHR | 0666, makedev(1, 7)) == 0) {
        is_node = 1;
    } else if (geteuid() != 0) {
        snprintf(path, sizeof path, "/dev/full");
        is_node = 1;
    } else {
        snprintf(path, sizeof path, "%s", outpath("dev-full-link"));
        if (symlink("/dev/full", path) != 0) {
            CHECK(0, "cannot make a node or link to /dev/full: %s", strerror(errno));
            return;
        }
    }
    ct_session s = 0;
    ct_status st = ct_open(path, RUN_INFER("test_abi::dev_full"), &s);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ct_last_error());
    CHECK(st == CT_OK || st == CT_ERR_IO, "ct_open(%s) returned %s: %s", path, status_name(st), msg);
    if (st == CT_ERR_IO) {
        CHECK(strstr(msg, "ct_open") != NULL, "ct_open's IO message does not name ct_open: %s", msg);
        g_pass++;
    } else if (st == CT_OK) {
        ct_span m;
        ct_measurement_begin(s, "full/measured", &m);
        ct_span_end(s, m);
        ct_status fst = ct_flush(s);
        snprintf(msg, sizeof msg, "%s", ct_last_error());
        check_poisoned(s, path, fst, msg);
    }
    if (is_node) {
        struct stat sb;
        CHECK(lstat(path, &sb) == 0 && S_ISCHR(sb.st_mode),
              "ct_open deleted the device node %s it could not write (as root this removes /dev/full)", path);
    }
}

/* A file that accepts the meta line and then fails (RLIMIT_FSIZE, EFBIG). */
static void test_poison_fsize(void) {
    g_section = "poisoned (file size limit)";
    const char *path = outpath("poisoned-fsize.jsonl");
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 16384;
    if (old.rlim_max != RLIM_INFINITY && old.rlim_max < lim.rlim_cur) lim.rlim_cur = old.rlim_max;
    ct_session s;
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0) {
        CHECK(0, "setrlimit(RLIMIT_FSIZE): %s", strerror(errno));
        return;
    }
    ct_status st = ct_open(path, RUN_INFER("test_abi::poisoned"), &s);
    if (st != CT_OK) {
        setrlimit(RLIMIT_FSIZE, &old);
        CHECK(0, "ct_open under a 16 KiB size limit failed: %s", ct_last_error());
        return;
    }
    /* ~40 KB of spans: more than the limit allows. A background flush may
     * meet the error first (then the calls after it say CT_ERR_POISONED,
     * which is right too); otherwise the ct_flush below is the first. */
    ct_span m;
    ct_status bad = CT_OK;
    char msg[1024] = "";
    if ((bad = ct_measurement_begin(s, "poison/measured", &m)) == CT_OK) {
        for (int i = 0; i < 300 && bad == CT_OK; i++) {
            ct_span x;
            bad = ct_span_begin(s, "poison/a-span-with-a-fairly-long-name", CT_SPAN_FUNCTION, CT_STEP_NONE, &x);
            if (bad == CT_OK) bad = ct_span_end(s, x);
        }
        if (bad == CT_OK) bad = ct_span_end(s, m);
    }
    ct_status fst = bad;
    if (bad == CT_OK) {
        fst = ct_flush(s);
    } else {
        CHECK(bad == CT_ERR_POISONED, "a span call before the flush returned %s: %s", status_name(bad), ct_last_error());
    }
    snprintf(msg, sizeof msg, "%s", ct_last_error());
    if (fst == CT_ERR_POISONED) {
        /* The background flusher met the error first; the caller is told by
         * the poisoning, which names the write error. */
        CHECK(strstr(msg, "poisoned") && strstr(msg, "file too large"),
              "the poisoning message does not say why: %s", msg);
        fst = CT_ERR_IO;
        fprintf(stderr, "note: the background flusher met the write error before ct_flush did\n");
    } else if (fst == CT_ERR_IO) {
        CHECK(strstr(msg, "ct_flush") && strstr(msg, "file too large"), "ct_flush's IO message: %s", msg);
    }
    check_poisoned(s, path, fst, msg);
    setrlimit(RLIMIT_FSIZE, &old);
}

/* ---- fork ------------------------------------------------------------------ */

static int child_fail;
#define CHILD_EXPECT_STATE(call)                                                              \
    do {                                                                                      \
        ct_status st_ = (call);                                                               \
        const char *m_ = ct_last_error();                                                     \
        if (st_ != CT_ERR_STATE || !m_ || !strstr(m_, "fork")) {                              \
            fprintf(stderr, "FAIL [fork child] %s:%d: %s returned %s: %s\n", __FILE__, __LINE__, \
                    #call, status_name(st_), m_ ? m_ : "(NULL)");                            \
            child_fail++;                                                                     \
        }                                                                                     \
    } while (0)

static void test_fork(void) {
    g_section = "fork";
    const char *path = outpath("valid-fork.jsonl");
    const char *child_path = outpath("fork-child-must-not-exist.jsonl");
    ct_session s;
    ct_span m, x;
    MUST(ct_open(path, RUN_INFER("test_abi::fork"), &s));
    MUST(ct_measurement_begin(s, "fork/measured", &m));
    MUST(ct_span_begin(s, "fork/parent-span", CT_SPAN_FUNCTION, CT_STEP_NONE, &x));
    MUST(ct_record_scalar(s, x, "fork/before", 1.0));
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        CHECK(0, "fork: %s", strerror(errno));
        return;
    }
    if (pid == 0) {
        alarm(5);
        ct_span y;
        ct_session s2;
        CHILD_EXPECT_STATE(ct_span_begin(s, "fork/child-span", CT_SPAN_FUNCTION, CT_STEP_NONE, &y));
        CHILD_EXPECT_STATE(ct_measurement_begin(s, "fork/child-measured", &y));
        CHILD_EXPECT_STATE(ct_span_end(s, x));
        CHILD_EXPECT_STATE(ct_span_end(s, m));
        CHILD_EXPECT_STATE(ct_record_scalar(s, x, "fork/child-scalar", 2.0));
        ct_op o = op_tmpl();
        CHILD_EXPECT_STATE(ct_record_op(s, x, &o));
        CHILD_EXPECT_STATE(ct_record_completed_span(s, "fork/child-completed", CT_SPAN_FUNCTION, 0, 1, NULL));
        CHILD_EXPECT_STATE(ct_record_gradient(s, "fork", "child", CT_GRADIENT_MISSING, NULL));
        CHILD_EXPECT_STATE(ct_record_data_edge(s, "a", "b"));
        CHILD_EXPECT_STATE(ct_device_start(s, NULL));
        CHILD_EXPECT_STATE(ct_flush(s));
        CHILD_EXPECT_STATE(ct_finish(s));
        CHILD_EXPECT_STATE(ct_finish_failed(s, "fork/child-failed"));
        CHILD_EXPECT_STATE(ct_discard(s));
        if (ct_dropped_records(s) != 0) child_fail++;
        CHILD_EXPECT_STATE(ct_open(child_path, RUN_INFER("test_abi::fork_child"), &s2));
        CHILD_EXPECT_STATE(ct_span_begin(0, "fork/child-span", CT_SPAN_FUNCTION, CT_STEP_NONE, &y));
        if (ct_now_ns(s) != 0) {
            fprintf(stderr, "FAIL [fork child] ct_now_ns on an inherited session != 0\n");
            child_fail++;
        }
        if (ct_last_error() == NULL || ct_abi_version() != CT_ABI_VERSION) child_fail++;
        _exit(child_fail ? 1 : 0);
    }
    /* Parent: wait at most 10 s. */
    int status = 0, waited = 0;
    for (int i = 0; i < 1000; i++) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            waited = 1;
            break;
        }
        sleep_ms(10);
    }
    if (!waited) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        CHECK(0, "the fork child hung (killed after 10 s)");
    } else if (WIFSIGNALED(status)) {
        CHECK(0, "the fork child died of signal %d%s", WTERMSIG(status),
              WTERMSIG(status) == SIGALRM ? " (a ct_* call hung for 5 s)" : "");
    } else {
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the fork child reported failures (exit %d); see FAIL [fork child] above", WEXITSTATUS(status));
    }
    CHECK(!exists(child_path), "ct_open in the fork child created %s", child_path);
    /* The parent goes on. */
    ct_span after;
    CHECK_STATUS(ct_span_begin(s, "fork/parent-after", CT_SPAN_FUNCTION, CT_STEP_NONE, &after), CT_OK, NULL);
    CHECK_STATUS(ct_span_end(s, after), CT_OK, NULL);
    CHECK_STATUS(ct_span_end(s, x), CT_OK, NULL);
    CHECK_STATUS(ct_span_end(s, m), CT_OK, NULL);
    CHECK_STATUS(ct_finish(s), CT_OK, NULL);
    check_trace_file(path, "complete");
    char *buf = slurp(path, NULL);
    CHECK(buf && !strstr(buf, "fork/child"), "the fork child's calls reached the parent's trace");
    CHECK(buf && strstr(buf, "fork/parent-after"), "the parent's span after fork is missing");
    free(buf);
}

/* ---- crash safety ------------------------------------------------------------ */

#define KILLED_SPANS 1000

static int child_killed_main(const char *path, int fd) {
    ct_session s;
    ct_span m;
    if (ct_open(path, RUN_INFER("test_abi::killed"), &s) != CT_OK) {
        fprintf(stderr, "child: ct_open: %s\n", ct_last_error());
        return 2;
    }
    if (ct_measurement_begin(s, "killed/measured", &m) != CT_OK) return 3;
    for (int i = 0; i < KILLED_SPANS; i++) {
        ct_span x;
        if (ct_span_begin(s, "killed/span", CT_SPAN_FUNCTION, CT_STEP_NONE, &x) != CT_OK) return 4;
        if (ct_span_end(s, x) != CT_OK) return 5;
    }
    sleep_ms(6 * CT_DEFAULT_FLUSH_INTERVAL_MS); /* 300 ms: several flush intervals */
    if (write(fd, "ready", 5) != 5) return 6;
    for (;;) pause();
}

static void test_killed(void) {
    g_section = "crash safety";
    const char *path = outpath("killed-child.jsonl");
    int p[2];
    if (pipe(p) != 0) {
        CHECK(0, "pipe: %s", strerror(errno));
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        char fdarg[16];
        snprintf(fdarg, sizeof fdarg, "%d", p[1]);
        unsetenv("CANDLE_TRACE_FLUSH_MS"); /* the documented default interval */
        execl("/proc/self/exe", "test_abi", "--child-killed", path, fdarg, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    struct pollfd pfd = {p[0], POLLIN, 0};
    char buf[16] = {0};
    int ready = 0;
    if (poll(&pfd, 1, 10000) == 1 && read(p[0], buf, sizeof buf - 1) == 5 && strcmp(buf, "ready") == 0) ready = 1;
    close(p[0]);
    CHECK(ready, "the child never said ready");
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the child was not killed by SIGKILL (status %d)", status);
    if (!ready) return;
    size_t len;
    char *t = slurp(path, &len);
    CHECK(t != NULL, "the killed child left no trace");
    if (!t) return;
    long lines;
    char why[256];
    CHECK(whole_lines(t, len, &lines, why, sizeof why), "killed trace: %s", why);
    CHECK(strncmp(t, "{", 1) == 0 && count_lines_with(t, "\"kind\":\"meta\"", NULL) == 1, "killed trace: no meta");
    const char *nl = strchr(t, '\n');
    CHECK(nl && memmem(t, (size_t)(nl - t), "\"kind\":\"meta\"", 13) != NULL, "killed trace: meta is not the first line");
    long starts = count_lines_with(t, "\"kind\":\"span_start\"", "\"name\":\"killed/span\"");
    long ends = count_str(t, "\"kind\":\"span_end\"");
    CHECK(starts == KILLED_SPANS, "killed trace: %ld killed/span span_start lines, want %d", starts, KILLED_SPANS);
    CHECK(ends == KILLED_SPANS, "killed trace: %ld span_end lines, want %d", ends, KILLED_SPANS);
    CHECK(count_lines_with(t, "\"kind\":\"span_start\"", "\"name\":\"killed/measured\"") == 1, "killed trace: no measured span");
    CHECK(!strstr(t, "\"kind\":\"terminal\""), "killed trace has a terminal line");
    free(t);
}


/* ---- more sessions than one thread's span-stack cache ----------------------- */

#define MANY_SESSIONS 12

static void test_many_sessions(void) {
    g_section = "many sessions on one thread";
    ct_session s[MANY_SESSIONS];
    char names[MANY_SESSIONS][64];
    for (int i = 0; i < MANY_SESSIONS; i++) {
        snprintf(names[i], sizeof names[i], "many-sessions-%02d.jsonl", i);
        s[i] = 0;
        CHECK_STATUS(ct_open(outpath(names[i]), RUN_INFER("test_abi::many"), &s[i]), CT_OK, NULL);
    }
    /* One thread, spans in every session in turn, none left open: the header
     * allows any thread to use any session. */
    int measured[MANY_SESSIONS] = {0};
    for (int i = 0; i < MANY_SESSIONS; i++) {
        ct_span m = 0;
        char desc[96];
        snprintf(desc, sizeof desc, "ct_measurement_begin(session %d of %d live)", i + 1, MANY_SESSIONS);
        CHECK_ROW(desc, ct_measurement_begin(s[i], "many/measured", &m), CT_OK, NULL);
        if (m) {
            CHECK_STATUS(ct_span_end(s[i], m), CT_OK, NULL);
            measured[i] = 1;
        }
    }
    for (int i = 0; i < MANY_SESSIONS; i++) {
        if (!s[i]) continue;
        if (!measured[i]) { /* already reported above */
            ct_finish_failed(s[i], "test_abi: no measured region");
            continue;
        }
        ct_status st = ct_finish(s[i]);
        char desc[96];
        snprintf(desc, sizeof desc, "ct_finish(session %d of %d)", i + 1, MANY_SESSIONS);
        CHECK_ROW(desc, st, CT_OK, NULL);
        if (st != CT_OK) {
            ct_finish_failed(s[i], "test_abi: could not finish");
        } else {
            check_trace_file(outpath(names[i]), "complete");
        }
    }
}

/* ---- buffered sessions (the flight recorder) -------------------------------- */

#define RUN_BUFFERED(ep, buffer)                                                       \
    "{\"entrypoint\":\"" ep "\",\"phase\":\"infer\",\"capture_step\":1,\"device\":\"cpu\"," \
    "\"buffer\":" buffer "}"

static const struct {
    const char *buffer, *sub, *what;
} BAD_BUFFERS[] = {
    {"{\"max_bytes\":0}", "\"buffer.max_bytes\" must be >= 1, got 0", "max_bytes 0"},
    {"{\"max_bytes\":-1}", "\"buffer.max_bytes\" must be a non-negative integer, got -1", "max_bytes -1"},
    {"{\"max_bytes\":1.5}", "\"buffer.max_bytes\" must be an integer literal (no fraction or exponent), got 1.5", "max_bytes 1.5"},
    {"{\"max_bytes\":1e3}", "\"buffer.max_bytes\" must be an integer literal", "max_bytes 1e3"},
    {"{\"max_bytes\":\"4096\"}", "\"buffer.max_bytes\" must be a non-negative integer, got string", "max_bytes a string"},
    {"{\"max_bytes\":68719476737}", "\"buffer.max_bytes\" must be at most 68719476736", "max_bytes over 64 GiB"},
    {"{\"max_bytes\":4096,\"slots\":2}", "unknown key \"buffer.slots\" (allowed: max_bytes)", "unknown key in buffer"},
    {"null", "\"buffer\" must be an object, got null", "buffer null"},
    {"4096", "\"buffer\" must be an object, got number 4096", "buffer a number"},
};

/* One buffered update: a measured region, a forward span, n ops on it. */
static void buffered_update(ct_session s, int n_ops) {
    ct_span m, fwd;
    MUST(ct_measurement_begin(s, "buffered/update", &m));
    MUST(ct_span_begin(s, "buffered/forward", CT_SPAN_MODULE, CT_STEP_FORWARD, &fwd));
    int bad = 0;
    for (int i = 0; i < n_ops; i++) {
        ct_op o = op_tmpl();
        if (ct_record_op(s, fwd, &o) != CT_OK) bad++;
        if (ct_record_scalar(s, fwd, "buffered/loss", 0.5) != CT_OK) bad++;
    }
    CHECK(bad == 0, "%d records of a buffered session were refused (a dropped record must return CT_OK)", bad);
    MUST(ct_span_end(s, fwd));
    MUST(ct_span_end(s, m));
}

static void test_buffered(void) {
    g_section = "buffered sessions";
    ct_session s = 0;
    const char *p = outpath("buffered-never.jsonl");

    for (size_t i = 0; i < sizeof BAD_BUFFERS / sizeof BAD_BUFFERS[0]; i++) {
        char run[512], desc[160];
        snprintf(run, sizeof run,
                 "{\"entrypoint\":\"e\",\"phase\":\"infer\",\"capture_step\":1,\"device\":\"cpu\",\"buffer\":%s}",
                 BAD_BUFFERS[i].buffer);
        snprintf(desc, sizeof desc, "ct_open(buffer: %s)", BAD_BUFFERS[i].what);
        s = 0;
        CHECK_ROW(desc, ct_open(p, run, &s), CT_ERR_INVALID_ARGUMENT, BAD_BUFFERS[i].sub);
        CHECK(strncmp(ct_last_error(), "ct_open: run JSON: ", 19) == 0, "%s: message \"%s\"", desc, ct_last_error());
        CHECK(s == 0, "%s: a refused ct_open stored a handle", desc);
        if (s) ct_discard(s);
        CHECK(!exists(p), "%s: a refused ct_open left %s", desc, p);
    }
    CHECK_STATUS(ct_open(p,
                         "{\"entrypoint\":\"e\",\"phase\":\"infer\",\"device\":\"cpu\","
                         "\"mode\":\"aggregate\",\"buffer\":{}}",
                         &s),
                 CT_ERR_INVALID_ARGUMENT, "\"buffer\" is only for \"mode\": \"trace\"");
    CHECK(!exists(p), "a refused aggregate ct_open left %s", p);

    /* Bad paths are refused at ct_open, before anything is recorded. */
    const char *regular = outpath("buffered-regular-file");
    FILE *f = fopen(regular, "w");
    if (f) {
        fputs("not a folder\n", f);
        fclose(f);
    }
    CHECK_STATUS(ct_open(outpath("buffered-regular-file/t.jsonl"), RUN_BUFFERED("e", "{}"), &s), CT_ERR_IO,
                 "not a directory");
    const char *foreign = outpath("buffered-train.py");
    f = fopen(foreign, "w");
    if (f) {
        fputs("import torch\n", f);
        fclose(f);
    }
    CHECK_STATUS(ct_open(foreign, RUN_BUFFERED("e", "{}"), &s), CT_ERR_IO, "is not a candle-trace trace or summary");
    char *fb = slurp(foreign, NULL);
    CHECK(fb && strcmp(fb, "import torch\n") == 0, "a refused buffered ct_open changed %s", foreign);
    free(fb);

    /* ct_discard on a session that writes as it records: refused, still usable. */
    const char *streaming = outpath("valid-buffered-discard-refused.jsonl");
    ct_session st = 0;
    MUST(ct_open(streaming, RUN_INFER("test_abi::streaming"), &st));
    CHECK_STATUS(ct_discard(st), CT_ERR_STATE, "writes its trace as it records, so there is nothing to discard");
    CHECK(ct_dropped_records(st) == 0, "ct_dropped_records of a streaming session != 0");
    CHECK(exists(streaming), "ct_discard removed a streaming session's trace");
    buffered_update(st, 2);
    CHECK_STATUS(ct_finish(st), CT_OK, NULL);
    check_trace_file(streaming, "complete");
    CHECK(ct_dropped_records(0) == 0 && ct_dropped_records(st) == 0 && ct_dropped_records(UINT64_MAX) == 0,
          "ct_dropped_records of a bad handle != 0");

    /* Open, record, discard: nothing ever exists at the path. */
    const char *gone = outpath("buffered-discarded/update-7/trace.jsonl");
    ct_session b = 0;
    MUST(ct_open(gone, RUN_BUFFERED("test_abi::discarded", "{\"max_bytes\":65536}"), &b));
    CHECK(!exists(outpath("buffered-discarded")), "a buffered ct_open created a folder");
    buffered_update(b, 5);
    ct_span open_span;
    MUST(ct_span_begin(b, "buffered/left-open", CT_SPAN_FUNCTION, CT_STEP_NONE, &open_span));
    CHECK_STATUS(ct_flush(b), CT_OK, NULL);
    CHECK(!exists(outpath("buffered-discarded")), "ct_flush of a buffered session wrote something");
    CHECK_STATUS(ct_discard(b), CT_OK, NULL);
    CHECK(!exists(outpath("buffered-discarded")), "ct_discard left something behind");
    CHECK_STATUS(ct_discard(b), CT_ERR_INVALID_HANDLE, "unknown or already finished");
    CHECK_STATUS(ct_span_end(b, open_span), CT_ERR_INVALID_HANDLE, "");
    CHECK_STATUS(ct_finish(b), CT_ERR_INVALID_HANDLE, "unknown or already finished");

    /* Open, record, finish: the trace appears only then. */
    const char *kept = outpath("valid-buffered.jsonl");
    MUST(ct_open(kept, RUN_BUFFERED("test_abi::buffered", "{}"), &b));
    buffered_update(b, 5);
    CHECK(!exists(kept), "a buffered session wrote before ct_finish");
    CHECK_STATUS(ct_finish(b), CT_OK, NULL);
    check_trace_file(kept, "complete");
    char *kb = slurp(kept, NULL);
    CHECK(kb && strstr(kb, "\"dropped_records\":0,\"dropped_bytes\":0"), "the terminal does not state 0 dropped");
    free(kb);

    /* Past max_bytes: records dropped, counted, CT_OK; the trace stays valid. */
    const char *over = outpath("valid-buffered-overflow.jsonl");
    MUST(ct_open(over, RUN_BUFFERED("test_abi::overflow", "{\"max_bytes\":4096}"), &b));
    buffered_update(b, 200);
    CHECK_STATUS(ct_flush(b), CT_OK, NULL);
    uint64_t dropped = ct_dropped_records(b);
    CHECK(dropped > 0 && dropped <= 400, "ct_dropped_records = %llu, want 1..400", (unsigned long long)dropped);
    CHECK_STATUS(ct_finish(b), CT_OK, NULL);
    check_trace_file(over, "complete");
    char want[96];
    snprintf(want, sizeof want, "\"dropped_records\":%llu,", (unsigned long long)dropped);
    char *ob = slurp(over, NULL);
    CHECK(ob && strstr(ob, want), "the terminal does not state %s", want);
    struct stat sb;
    CHECK(stat(over, &sb) == 0 && sb.st_size <= 2 * 4096 + 1024, "the trace outgrew its bound: %lld bytes",
          (long long)sb.st_size);
    free(ob);

    /* The flight recorder's trigger: an exception ends it as failed. */
    const char *failed = outpath("failed-buffered-overflow.jsonl");
    MUST(ct_open(failed, RUN_BUFFERED("test_abi::overflow_failed", "{\"max_bytes\":2048}"), &b));
    buffered_update(b, 50);
    ct_span boom;
    MUST(ct_span_begin(b, "buffered/optimizer", CT_SPAN_MODULE, CT_STEP_OPTIMIZER, &boom));
    CHECK_STATUS(ct_finish_failed(b, "loss is NaN"), CT_OK, NULL);
    check_trace_file(failed, "failed");
    CHECK(ct_dropped_records(b) == 0, "ct_dropped_records of a finished session != 0");

    /* Many recordings in a row, each discarded: slots are freed. */
    int bad = 0;
    for (int i = 0; i < 1000; i++) {
        ct_session c = 0;
        if (ct_open(gone, RUN_BUFFERED("test_abi::cycle", "{\"max_bytes\":8192}"), &c) != CT_OK) {
            bad++;
            break;
        }
        ct_span x;
        if (ct_span_begin(c, "cycle/span", CT_SPAN_FUNCTION, CT_STEP_NONE, &x) != CT_OK) bad++;
        ct_op o = op_tmpl();
        if (ct_record_op(c, x, &o) != CT_OK) bad++;
        if (ct_discard(c) != CT_OK) bad++;
    }
    CHECK(bad == 0, "%d calls of 1000 open/record/discard cycles failed: %s", bad, ct_last_error());
    CHECK(!exists(outpath("buffered-discarded")), "the discarded cycles left something behind");

    /* ct_reopen: a flight recorder's next update, without ct_open's parse. The
     * update before is discarded; the new session is ct_open's with the step
     * changed (warmup_steps and correlation_id defaulted again). */
    const char *rec = outpath("buffered-reopen/recording.jsonl");
    ct_session r = 0, r2 = 0;
    MUST(ct_open(rec, RUN_BUFFERED("test_abi::reopen", "{\"max_bytes\":65536}"), &r));
    buffered_update(r, 5);
    CHECK_STATUS(ct_reopen(r, rec, 0, &r2), CT_ERR_INVALID_ARGUMENT, "capture_step");
    CHECK_STATUS(ct_reopen(r, NULL, 2, &r2), CT_ERR_INVALID_ARGUMENT, "path is NULL");
    CHECK_STATUS(ct_reopen(r, rec, 2, NULL), CT_ERR_INVALID_ARGUMENT, "out is NULL");
    CHECK_STATUS(ct_reopen(st, rec, 2, &r2), CT_ERR_INVALID_HANDLE, "unknown or already finished");
    for (uint64_t step = 2; step < 400; step++) { /* more than the 255 slots */
        MUST(ct_reopen(r, rec, step, &r2));
        CHECK(r2 != r, "ct_reopen gave the discarded session's handle");
        r = r2;
        buffered_update(r, 3);
    }
    CHECK(!exists(outpath("buffered-reopen")), "a reopened session wrote before ct_finish");
    const char *reo = outpath("valid-buffered-reopen.jsonl");
    MUST(ct_reopen(r, reo, 400, &r2));
    buffered_update(r2, 3);
    CHECK_STATUS(ct_finish(r2), CT_OK, NULL);
    check_trace_file(reo, "complete");
    char *rb = slurp(reo, NULL);
    CHECK(rb && strstr(rb, "\"capture_step\":400,\"warmup_steps\":399"), "the reopened trace is not update 400's");
    CHECK(rb && strstr(rb, "\"correlation_id\":\"test_abi::reopen/inference-400\""),
          "the reopened trace's correlation_id is not update 400's");
    free(rb);
    CHECK(!exists(outpath("buffered-reopen")), "the discarded updates left something behind");
}

/* ---- JSON escaping and extreme numbers ------------------------------------- */

#define SPECIAL "q\"uote \\back \nnl \ttab \r\x01\x1f ctl \x7f del \xe2\x80\xa8 ls \xf0\x9f\x98\x80 \xc3\xa9 </script>"

static void test_escapes(void) {
    g_section = "escaping and extremes";
    const char *path = outpath("valid-escapes.jsonl");
    ct_session s;
    MUST(ct_open(path,
                 "{\"entrypoint\":\"test_abi::\\\"esc\\\\aped\\u00e9\\ud83d\\ude00\\u2028\\u0001\\n\","
                 "\"phase\":\"infer\",\"capture_step\":18446744073709551615,\"device\":\"cuda:0 \\\"x\\\"\","
                 "\"tags\":{\"k \\\"\\\\\\t\":\"v\\u0000\\u001f\\u00ff\",\"\\u2603\":\"\"},"
                 "\"candle_version\":\"0.9.1-\\\"alpha\\\"\"}",
                 &s));
    ct_span m, a;
    MUST(ct_measurement_begin(s, "measured " SPECIAL, &m));
    CHECK_STATUS(ct_span_begin(s, SPECIAL, CT_SPAN_MODULE, CT_STEP_FORWARD, &a), CT_OK, NULL);
    const char *ins[] = {"in " SPECIAL};
    ct_op o = op_tmpl();
    o.op_name = "op " SPECIAL;
    o.dtype = "F32";
    o.device = "dev " SPECIAL;
    o.inputs = ins;
    o.n_inputs = 1;
    o.output = "out " SPECIAL;
    o.input_dense_bytes = UINT64_MAX;
    CHECK_STATUS(ct_record_op(s, a, &o), CT_OK, NULL);
    ct_tensor t = tensor_tmpl();
    t.tensor_id = "out " SPECIAL;
    t.label = "label " SPECIAL;
    t.flags = CT_HAS_DENSE_BYTES;
    t.dense_bytes = UINT64_MAX;
    CHECK_STATUS(ct_record_tensor(s, a, &t), CT_OK, NULL);
    CHECK_STATUS(ct_record_data_edge(s, "in " SPECIAL, "out " SPECIAL), CT_OK, NULL);
    ct_tensor_stats st = stats_tmpl();
    st.label = "stats " SPECIAL;
    st.rms = 1e300;
    st.abs_max = 4.9406564584124654e-324; /* the smallest subnormal */
    st.mean = -1.7976931348623157e308;
    CHECK_STATUS(ct_record_tensor_stats(s, a, &st), CT_OK, NULL);
    st.rms = 0.1;
    st.abs_max = 0.0;
    st.mean = -0.0;
    CHECK_STATUS(ct_record_tensor_stats(s, a, &st), CT_OK, NULL);
    CHECK_STATUS(ct_record_scalar(s, a, "scalar -0", -0.0), CT_OK, NULL);
    CHECK_STATUS(ct_record_scalar(s, a, "scalar tiny", 1e-320), CT_OK, NULL);
    CHECK_STATUS(ct_record_scalar(s, a, "scalar huge", -1e308), CT_OK, NULL);
    ct_memory mem = memory_tmpl("storage " SPECIAL, "out " SPECIAL, UINT64_MAX);
    mem.op_name = "op " SPECIAL;
    mem.dtype = "weird " SPECIAL; /* no derived size */
    CHECK_STATUS(ct_record_memory(s, a, CT_MEMORY_ALLOC, &mem), CT_OK, NULL);
    CHECK_STATUS(ct_record_memory(s, a, CT_MEMORY_FREE, &mem), CT_OK, NULL);
    ct_device_memory dm = devmem_tmpl();
    dm.device = "dev " SPECIAL;
    dm.flags = CT_HAS_USED_BYTES | CT_HAS_FREE_BYTES | CT_HAS_RESERVED_BYTES | CT_HAS_CAPACITY_BYTES;
    dm.used_bytes = UINT64_MAX;
    dm.free_bytes = 0;
    dm.reserved_bytes = 1;
    dm.capacity_bytes = UINT64_MAX - 1;
    CHECK_STATUS(ct_record_device_memory(s, &dm), CT_OK, NULL);
    ct_device_interval di = interval_tmpl();
    di.device = "dev " SPECIAL;
    di.stream_id = "stream " SPECIAL;
    di.backend = "backend " SPECIAL;
    di.clock_id = "clock " SPECIAL;
    di.name = "kernel " SPECIAL;
    di.start_ns = UINT64_MAX - 10;
    di.duration_ns = 10;
    di.flags = CT_HAS_CORRELATION_ID;
    di.correlation_id = UINT64_MAX;
    CHECK_STATUS(ct_record_device_interval(s, a, &di), CT_OK, NULL);
    double n = 1e-300;
    CHECK_STATUS(ct_record_gradient(s, "root " SPECIAL, "key " SPECIAL, CT_GRADIENT_PRESENT, &n), CT_OK, NULL);
    n = 1.7976931348623157e308;
    CHECK_STATUS(ct_record_gradient(s, "root " SPECIAL, "key2", CT_GRADIENT_PRESENT, &n), CT_OK, NULL);
    uint64_t now = ct_now_ns(s);
    CHECK_STATUS(ct_record_completed_span(s, "completed " SPECIAL, CT_SPAN_FUNCTION, 0, now ? now : 1, NULL), CT_OK, NULL);
    MUST(ct_span_end(s, a));
    MUST(ct_span_end(s, m));
    CHECK_STATUS(ct_finish(s), CT_OK, NULL);
    check_trace_file(path, "complete");
    char *buf = slurp(path, NULL);
    CHECK(buf && count_str(buf, "18446744073709551615") >= 4, "u64 maxima are not written as integers");
    CHECK(buf && !strstr(buf, "e+19") && !strstr(buf, "1.8446744073709552"), "a u64 was written as a float");
    free(buf);
}

/* ---- a thread that exits with a span open ----------------------------------- */

static void *exit_with_open_span(void *arg) {
    ct_session s = *(ct_session *)arg;
    ct_span x;
    ct_status st = ct_span_begin(s, "exited/open", CT_SPAN_FUNCTION, CT_STEP_NONE, &x);
    return (void *)(intptr_t)st;
}

static void test_thread_exit_open_span(void) {
    g_section = "thread exits with an open span";
    const char *path = outpath("failed-thread-exited.jsonl");
    ct_session s;
    ct_span m;
    MUST(ct_open(path, RUN_INFER("test_abi::thread_exit"), &s));
    MUST(ct_measurement_begin(s, "exit/measured", &m));
    pthread_t th;
    void *ret = NULL;
    pthread_create(&th, NULL, exit_with_open_span, &s);
    pthread_join(th, &ret);
    CHECK((intptr_t)ret == CT_OK, "ct_span_begin on the thread failed");
    MUST(ct_span_end(s, m));
    CHECK_STATUS(ct_finish(s), CT_ERR_STATE, "exited/open");
    CHECK_STATUS(ct_finish_failed(s, "a worker thread exited inside a span"), CT_OK, NULL);
    check_trace_file(path, "failed");
}

/* ---- records on closed spans older than the remembered window --------------- */

#define CLOSED_WINDOW 262144

static void test_old_closed_spans(void) {
    g_section = "closed-span window";
    const char *path = outpath("old-closed-spans.jsonl");
    ct_session s;
    ct_span m, first = 0, last = 0;
    MUST(ct_open(path, RUN_INFER("test_abi::old_spans"), &s));
    MUST(ct_measurement_begin(s, "old/measured", &m));
    int fails = 0;
    for (int i = 0; i < CLOSED_WINDOW + 100; i++) {
        ct_span x;
        if (ct_span_begin(s, "old/span", CT_SPAN_OP, CT_STEP_NONE, &x) != CT_OK || ct_span_end(s, x) != CT_OK) fails++;
        if (i == 0) first = x;
        last = x;
    }
    CHECK(fails == 0, "%d span calls failed", fails);
    CHECK_STATUS(ct_record_scalar(s, first, "old/too-old", 1.0), CT_ERR_INVALID_HANDLE, "closed too long ago");
    CHECK_STATUS(ct_record_scalar(s, last, "old/recent", 1.0), CT_OK, NULL);
    MUST(ct_span_end(s, m));
    CHECK_STATUS(ct_finish(s), CT_OK, NULL);
    check_trace_file(path, "complete");
    unlink(path); /* 50 MB that nothing else reads */
}

/* ---- main ------------------------------------------------------------------- */

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--child-killed") == 0) return child_killed_main(argv[2], atoi(argv[3]));
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    g_out = argv[1];
    if (mkdir(g_out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "test_abi: cannot create %s: %s\n", g_out, strerror(errno));
        return 2;
    }
    signal(SIGXFSZ, SIG_IGN); /* the size-limit test wants EFBIG, not death */
    setvbuf(stdout, NULL, _IOLBF, 0);

    test_library();
    test_open();
    test_open_targets();
    test_handles();
    test_errors_session();
    test_poison_free_finish_checks();
    test_full_step();
    test_gradients_valid();
    test_failed();
    test_threads();
    test_finish_refused_concurrently();
    test_many_sessions();
    test_buffered();
    test_escapes();
    test_thread_exit_open_span();
    test_old_closed_spans();
    test_reduce_stats();
    test_fork();
    test_killed();
    test_poison_fsize();
    test_dev_full();

    printf("test_abi: %d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
