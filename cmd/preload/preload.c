/* libcandle_trace_preload.so — the drop-in's LD_PRELOAD entry point.
 *
 * Preloading the Go library itself into every process of a job would start
 * a Go runtime (two extra threads, ~2 MB) in every shell, compiler and
 * helper a training script spawns, and a Go runtime started from a
 * preloaded constructor is where init-order deadlocks live. This shim is
 * plain C: at load it decides whether this process is one to trace and only
 * then dlopens libcandle_trace.so, whose own load opens the ambient session
 * (CANDLE_TRACE_PATH) and finishes it at exit.
 *
 *   CANDLE_TRACE_MATCH  comma-separated shell patterns matched against the
 *                       program's name (the basename of /proc/self/exe, and
 *                       argv[0]'s basename); default "*" (every process).
 *   CANDLE_TRACE_LIB    the library to load; default libcandle_trace.so next
 *                       to this shim.
 *
 *   CANDLE_TRACE_PATH=run-%p.jsonl CANDLE_TRACE_MATCH='python*' \
 *     LD_PRELOAD=build/libcandle_trace_preload.so python train.py
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *base(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* argv[0] from /proc/self/cmdline: the name a script runner was started as
 * (e.g. "python3" when /proc/self/exe is python3.11). */
static void argv0(char *buf, size_t cap) {
    buf[0] = 0;
    FILE *f = fopen("/proc/self/cmdline", "r");
    if (!f) return;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = 0; /* the first NUL ends argv[0] */
}

static int matches(const char *patterns, const char *a, const char *b) {
    char list[4096];
    snprintf(list, sizeof list, "%s", patterns);
    for (char *save = NULL, *p = strtok_r(list, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        while (*p == ' ') p++;
        if (!*p) continue;
        if ((a[0] && fnmatch(p, a, 0) == 0) || (b[0] && fnmatch(p, b, 0) == 0)) return 1;
    }
    return 0;
}

__attribute__((constructor)) static void candle_trace_preload(void) {
    if (!getenv("CANDLE_TRACE_PATH")) return;
    const char *match = getenv("CANDLE_TRACE_MATCH");
    char exe[PATH_MAX] = "", arg0[PATH_MAX] = "";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) exe[n] = 0;
    argv0(arg0, sizeof arg0);
    if (match && *match && !matches(match, base(exe), base(arg0))) return;

    char lib[PATH_MAX];
    const char *want = getenv("CANDLE_TRACE_LIB");
    if (want && *want) {
        snprintf(lib, sizeof lib, "%s", want);
    } else {
        Dl_info self;
        if (!dladdr((void *)candle_trace_preload, &self) || !self.dli_fname) return;
        snprintf(lib, sizeof lib, "%s", self.dli_fname);
        char *slash = strrchr(lib, '/');
        size_t dir = slash ? (size_t)(slash - lib + 1) : 0;
        snprintf(lib + dir, sizeof lib - dir, "libcandle_trace.so");
    }
    if (!dlopen(lib, RTLD_NOW | RTLD_GLOBAL))
        fprintf(stderr, "candle-trace: drop-in not started: %s\n", dlerror());
}
