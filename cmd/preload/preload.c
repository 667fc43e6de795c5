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
 *
 * Fatal signals. The background flusher writes every ~50 ms, so a program
 * that dies of a signal would lose what it recorded in its last moments
 * (records still in the per-thread rings or in the Go-side buffer). In a
 * traced process the shim therefore handles SIGSEGV, SIGBUS, SIGFPE, SIGILL,
 * SIGABRT, SIGTERM, SIGHUP and SIGQUIT — each only when its disposition is
 * still SIG_DFL when the shim loads (a program's own handler, or an
 * inherited SIG_IGN, is left alone). A thread of the library writes
 * everything recorded so far as whole lines and a failed terminal naming the
 * signal; then the shim puts the previous disposition (SIG_DFL) back and
 * raises the signal again, so the process dies of its own signal with the
 * same status and core dump as without the shim. Two kinds of signal are
 * handled two ways:
 *  - A kill from another process (SIGTERM, SIGHUP, SIGQUIT sent with kill(1)
 *    or by a job scheduler) is deferred: the handler asks for the flush and
 *    returns. The thread it interrupted may hold the library's lock (the
 *    kernel prefers the main thread, which is often inside a ct_* call), so
 *    waiting in the handler could wait for ever on the flush that lock
 *    blocks; returning lets that call finish and release it. The shim's
 *    watchdog thread raises the signal once the flush is written, or after
 *    KILL_FLUSH_WAIT_MS; a process that reaches its exit handlers first dies
 *    of the signal there (ct__preload_crash_stop).
 *  - Everything else (a fault, abort(), a signal the process sent itself)
 *    must not return into the code that raised it: the handler waits in
 *    place for the flush, at most CRASH_FLUSH_WAIT_MS, then raises. A fault
 *    while a thread holds the library's lock (or the C allocator's, when a
 *    ring is freed) leaves the flusher waiting; the handler gives up after
 *    the bound and the trace holds what was already written.
 * Programs that ask for a signal's disposition see a handler where they
 * would have seen SIG_DFL; a program that installs its own handler later
 * replaces ours, as it would replace the default.
 *
 * Why these pieces are where they are:
 *  - The handlers are installed here, BEFORE dlopen. The Go runtime in a
 *    c-shared library installs its own SIGSEGV/SIGBUS/SIGFPE handlers at load
 *    and forwards a fault raised in non-Go code to the handler that was there
 *    before it. Installed first, ours is that forwarding target and Go keeps
 *    turning faults in Go code into panics; installed after, ours would
 *    replace Go's handler and break them. Go installs nothing for SIGILL,
 *    SIGABRT and SIGTERM in a c-shared library, so those reach ours directly.
 *    A program linked with the library has it initialised before this
 *    shim's constructor; the library's first constructor then asks the shim
 *    to install them (ct__preload_install_early), still before its Go
 *    runtime starts.
 *  - Only the shim installs handlers: the library linked normally (or
 *    preloaded without the shim) never touches signal dispositions.
 *  - The handshake is two futex words owned by the shim (req: a flush is
 *    asked / the session ended; done: the flush is written) and four
 *    functions the library looks up with dlsym(RTLD_DEFAULT) from the
 *    package init that opens the ambient session. The lookup goes that way
 *    round because the Go init runs on its own thread after dlopen has
 *    returned: the shim never waits for the Go runtime inside a constructor,
 *    and everything the library looks up exists before the library loads,
 *    so there is no race. Futex words rather than a pipe or an eventfd: no
 *    file descriptor a program could close or dup2 over (a write would then
 *    land in the program's file), and a "done" word that any number of
 *    crashing threads can wait on at once (futex wake-all), so one flush
 *    serves them all.
 *  - Only async-signal-safe calls in the handler: atomics, futex(2),
 *    clock_gettime, getpid, gettid, sigaction, raise.
 *  - The library's waiter thread blocks SIGTERM and SIGABRT, so a
 *    process-directed kill never lands on the one thread that must do the
 *    flush; should a fault hit that thread, its handler does not wait for
 *    itself. A fork() child inherits the handlers but not the library's
 *    thread: the handler checks the pid and does not wait there.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fnmatch.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
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

/* ---- flushing on a fatal signal ------------------------------------------ */

/* How long, in total, a faulting thread waits in its handler for the trace
 * to be written. The flush itself takes well under a millisecond for the
 * few MB a ring and the write buffer can hold; the bound is for when it
 * cannot happen at all (the crashed thread holds the library's lock). */
#define CRASH_FLUSH_WAIT_MS 2000

/* How long a deferred kill lets the program run on while the trace is
 * written (a disk under heavy writeback can hold a write for seconds);
 * the signal is raised once the flush is done, at the latest after this. */
#define KILL_FLUSH_WAIT_MS 10000

/* Not SIGINT: CPython (and others) install their own SIGINT handler only over
 * SIG_DFL, so taking it at load would turn Ctrl-C's KeyboardInterrupt into a
 * kill; a program that ends on KeyboardInterrupt exits through its exit
 * handlers anyway. */
static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTERM, SIGHUP, SIGQUIT};
#define N_FATAL (sizeof fatal_signals / sizeof fatal_signals[0])
static struct sigaction previous[N_FATAL]; /* the disposition ours replaced */
static int installed[N_FATAL];
static int any_installed;

enum { REQ_FLUSH = 1, REQ_STOP = 2 };
static uint32_t req;        /* futex: REQ_FLUSH (a fatal signal) | REQ_STOP (the session ended) */
static uint32_t done;       /* futex: 1 once the library has written the trace */
static uint32_t ready;      /* 1 while the library's waiter thread serves requests */
static uint32_t fired;      /* 1 once a handler has asked for the flush: one per process */
static int fired_sig;       /* the signal of that handler (the trace's reason names it) */
static pid_t waiter_pid;    /* the process the waiter belongs to (not a fork child) */
static pid_t waiter_tid;    /* the waiter's thread */
static uint32_t deferred;   /* 1 when the fired signal is a kill left to the watchdog */
static int watchdog_started;

static long futex(uint32_t *word, int op, uint32_t val, const struct timespec *rel) {
    return syscall(SYS_futex, word, op, val, rel, NULL, 0);
}

static pid_t thread_id(void) { return (pid_t)syscall(SYS_gettid); }

static int64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Waits until the flush is written or budget_ns has passed. */
static void wait_flushed(int64_t budget_ns) {
    int64_t end = mono_ns() + budget_ns;
    while (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) {
        int64_t left = end - mono_ns();
        if (left <= 0) return;
        struct timespec rel = {(time_t)(left / 1000000000), (long)(left % 1000000000)};
        futex(&done, FUTEX_WAIT_PRIVATE, 0, &rel);
    }
}

static size_t signal_index(int sig) {
    size_t i = 0;
    while (i < N_FATAL && fatal_signals[i] != sig) i++;
    return i;
}

/* Dies of sig as the program would have: its previous disposition (SIG_DFL:
 * we install over nothing else) back, the signal unblocked on this thread,
 * then raised here. */
static void die_of(int sig) {
    size_t i = signal_index(sig);
    if (i < N_FATAL) sigaction(sig, &previous[i], NULL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, NULL);
    raise(sig);
}

/* A kill from outside (another process, or the kernel's hangup): nothing of
 * this process is broken, and the interrupted thread may hold the lock the
 * flush needs (see the top). One the process sent itself (raise, kill of its
 * own pid) must not return into the code after it. */
static int is_kill_from_outside(int sig, const siginfo_t *info) {
    if (sig != SIGTERM && sig != SIGHUP && sig != SIGQUIT) return 0;
    return !(info && info->si_code <= 0 && info->si_pid == getpid());
}

static void on_fatal_signal(int sig, siginfo_t *info, void *uctx) {
    (void)uctx;
    int saved_errno = errno;
    size_t i = signal_index(sig);
    if (i == N_FATAL) return; /* not ours: cannot happen */
    if (__atomic_load_n(&ready, __ATOMIC_ACQUIRE) && getpid() == waiter_pid &&
        thread_id() != waiter_tid) {
        int outside = is_kill_from_outside(sig, info) && __atomic_load_n(&watchdog_started, __ATOMIC_ACQUIRE);
        /* The first dying thread asks; every dying thread (this one and
         * any that crash meanwhile) waits for the same flush, so none of
         * them kills the process before the trace is written. */
        if (!__atomic_exchange_n(&fired, 1, __ATOMIC_ACQ_REL)) {
            __atomic_store_n(&fired_sig, sig, __ATOMIC_RELAXED);
            __atomic_store_n(&deferred, (uint32_t)outside, __ATOMIC_RELAXED);
            __atomic_fetch_or(&req, REQ_FLUSH, __ATOMIC_RELEASE);
            futex(&req, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL);
        }
        if (__atomic_load_n(&deferred, __ATOMIC_ACQUIRE)) {
            /* The watchdog raises the first kill once the trace is
             * written; this thread goes on (and may release the lock). */
            errno = saved_errno;
            return;
        }
        wait_flushed((int64_t)CRASH_FLUSH_WAIT_MS * 1000000);
    }
    /* The signal is blocked while its handler runs, so the raised one is
     * delivered as soon as we return: the default action kills the process
     * with this signal, and a core dump where there would have been one.
     * For a fault, returning alone would do too (the instruction faults
     * again); raising covers kill(1) and abort() alike. When Go forwarded
     * the fault to us, we return through Go's handler, which does nothing
     * more for a forwarded signal. */
    sigaction(sig, &previous[i], NULL);
    raise(sig);
    errno = saved_errno;
}

/* The watchdog of a deferred kill: parked until a flush is asked for or the
 * session ends; for a deferred kill it waits for the flush (bounded) and
 * raises the signal. Every signal is blocked on it but the one it raises. */
static void *kill_watchdog(void *arg) {
    (void)arg;
    for (;;) {
        uint32_t r = __atomic_load_n(&req, __ATOMIC_ACQUIRE);
        if (r & REQ_FLUSH) break;
        if (r & REQ_STOP) return NULL;
        futex(&req, FUTEX_WAIT_PRIVATE, r, NULL);
    }
    if (!__atomic_load_n(&deferred, __ATOMIC_ACQUIRE)) return NULL; /* a fault: its handler raises */
    wait_flushed((int64_t)KILL_FLUSH_WAIT_MS * 1000000);
    die_of(__atomic_load_n(&fired_sig, __ATOMIC_RELAXED));
    return NULL;
}

static void start_kill_watchdog(void) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the new thread inherits it */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    pthread_t t;
    if (pthread_create(&t, &attr, kill_watchdog, NULL) == 0)
        __atomic_store_n(&watchdog_started, 1, __ATOMIC_RELEASE);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void install_fatal_handlers(void) {
    static int done_once;
    if (__atomic_exchange_n(&done_once, 1, __ATOMIC_ACQ_REL)) return; /* early, then the constructor */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal_signal;
    /* SA_ONSTACK: the handler may run on a Go thread (a SIGTERM can be
     * delivered to any thread), which must not run it on a goroutine's small
     * stack; Go gives each of its threads a signal stack. Everything is
     * blocked while it runs, so it is never re-entered on one thread. */
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigfillset(&sa.sa_mask);
    for (size_t i = 0; i < N_FATAL; i++) {
        if (sigaction(fatal_signals[i], NULL, &previous[i]) != 0) continue;
        int dfl = !(previous[i].sa_flags & SA_SIGINFO) && previous[i].sa_handler == SIG_DFL;
        if (!dfl) continue; /* the program's (or an inherited SIG_IGN): leave it */
        if (sigaction(fatal_signals[i], &sa, NULL) == 0) installed[i] = any_installed = 1;
    }
}

static void remove_fatal_handlers(void) {
    for (size_t i = 0; i < N_FATAL; i++)
        if (installed[i]) sigaction(fatal_signals[i], &previous[i], NULL);
    any_installed = 0;
}

/* The library's side of the handshake (cmd/libtrace/crashflush.go looks
 * these up with dlsym(RTLD_DEFAULT); they are not part of the public ABI).
 * One goroutine of the library, locked to its own thread, calls begin, then
 * wait; when wait says a flush is asked it writes the trace and calls done.
 * The end of the ambient session (the exit handler) calls stop, which makes
 * wait return 0. A request and a stop that race are both bounded: the
 * handler never waits longer than CRASH_FLUSH_WAIT_MS. */

/* Called on the waiter thread: 0 when there is a handler to serve (the
 * thread now blocks the asynchronous ones, SIGTERM, SIGHUP, SIGQUIT and
 * SIGABRT, and is the one the handlers ask), -1 when none was installed. */
int ct__preload_crash_waiter_begin(void) {
    if (!any_installed) return -1;
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigaddset(&block, SIGQUIT);
    sigaddset(&block, SIGABRT);
    pthread_sigmask(SIG_BLOCK, &block, NULL);
    waiter_pid = getpid();
    waiter_tid = thread_id();
    __atomic_store_n(&done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&req, 0, __ATOMIC_RELAXED);
    start_kill_watchdog(); /* without it, kills wait in their handler as faults do */
    __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
    return 0;
}

/* Blocks until a fatal signal asks for a flush (its number) or stop was
 * called (0). */
int ct__preload_crash_wait(void) {
    for (;;) {
        uint32_t r = __atomic_load_n(&req, __ATOMIC_ACQUIRE);
        if (r & REQ_FLUSH) return __atomic_load_n(&fired_sig, __ATOMIC_RELAXED);
        if (r & REQ_STOP) return 0;
        futex(&req, FUTEX_WAIT_PRIVATE, r, NULL);
    }
}

/* The flush asked for is written (or failed): every waiting handler goes on. */
void ct__preload_crash_done(void) {
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
    futex(&done, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL);
}

/* The ambient session has ended: handlers stop waiting (nothing is left to
 * flush) and the waiter returns. Called from any thread. A deferred kill
 * whose flush is under way when the program reaches its exit handlers is
 * still the process's death: once the trace is written, the signal is
 * raised here rather than the program exiting with its own status. */
void ct__preload_crash_stop(void) {
    __atomic_store_n(&ready, 0, __ATOMIC_RELEASE);
    __atomic_fetch_or(&req, REQ_STOP, __ATOMIC_RELEASE);
    futex(&req, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL);
    if (__atomic_load_n(&fired, __ATOMIC_ACQUIRE) && __atomic_load_n(&deferred, __ATOMIC_ACQUIRE) &&
        getpid() == waiter_pid) {
        wait_flushed((int64_t)KILL_FLUSH_WAIT_MS * 1000000);
        die_of(__atomic_load_n(&fired_sig, __ATOMIC_RELAXED));
    }
}

/* Whether this process is one to trace: CANDLE_TRACE_PATH set and the
 * program's name matching CANDLE_TRACE_MATCH. */
static int traced(void) {
    if (!getenv("CANDLE_TRACE_PATH")) return 0;
    const char *match = getenv("CANDLE_TRACE_MATCH");
    char exe[PATH_MAX] = "", arg0[PATH_MAX] = "";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) exe[n] = 0;
    argv0(arg0, sizeof arg0);
    return !(match && *match && !matches(match, base(exe), base(arg0)));
}

/* A program linked with libcandle_trace.so (not only preloaded) has the
 * library initialised before this shim's constructor: the Go runtime's
 * SIGSEGV/SIGBUS/SIGFPE handlers would be in place when the shim looks, and
 * the shim would leave them alone, so a fault in the program's code would
 * kill it with nothing flushed. The library therefore calls this from a
 * constructor that runs before its Go runtime starts (cmd/libtrace/shims.c),
 * and the handlers go in first, as when the shim dlopens the library:
 * Go forwards non-Go faults to them and keeps its own panics. */
void ct__preload_install_early(void) {
    if (traced()) install_fatal_handlers();
}

__attribute__((constructor)) static void candle_trace_preload(void) {
    if (!traced()) return;

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
    /* Before dlopen, so that the Go runtime forwards faults to us (above);
     * nothing when the library, linked into the program, asked already. */
    install_fatal_handlers();
    void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        remove_fatal_handlers();
        fprintf(stderr, "candle-trace: drop-in not started: %s\n", dlerror());
        return;
    }
    /* The device collectors start in the library's Go init, on its own
     * thread, while the program runs on: a kernel launched before CUPTI is
     * enabled is never recorded, so a short program (or one started on a
     * loaded machine) lost its first kernels, all of them in a drop-in
     * trace with 0 device intervals. When collectors are asked for, the
     * program starts once they run: ct_ambient_session returns after the
     * Go inits. Waited for here, after dlopen has returned and released the
     * loader's lock (the Go init dlopens libcupti and libnvidia-ml), never
     * inside the library's own constructors. */
    const char *collect = getenv("CANDLE_TRACE_DEVICE_COLLECT");
    uint64_t (*ambient)(void) = (uint64_t (*)(void))dlsym(h, "ct_ambient_session");
    if (collect && *collect && ambient) ambient();
}
