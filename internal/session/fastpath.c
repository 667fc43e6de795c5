#define _GNU_SOURCE
#include "fastpath.h"
#include "aggkeys.h"
#include "ticks.h"

/* Fields other threads only glance at (a span stack's depth). */
#define LOAD_RLX(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define STORE_RLX(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <linux/futex.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

ct_slot ct__slots[CT_MAX_SESSIONS];
ct_ring *ct__rings;
int ct__forked;
int ct__wake_fd = -1;

static uint64_t generation;
static pthread_mutex_t slots_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t rings_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_key_t thread_key;
static uint32_t ring_bytes = 1u << 19; /* a ring's everyday size (soft) */
/* How far a ring stretches under a burst: its address space, ring_bytes
 * times this (8 MiB by default), up to CT_RING_MAX. */
#define CT_RING_REACH 16
#define CT_RING_MAX (1u << 30)

#define CT_ID_BLOCK 64

/* What every span begin and end touches, in initial-exec TLS: one load off
 * the thread pointer instead of a __tls_get_addr call per access (the
 * library is dlopen'ed; glibc keeps a little static TLS for that, so this
 * stays two pointers). */
typedef struct ct_hot {
    ct_ring *ring;      /* this thread's ring and span stacks; NULL until its first span */
    ct_tls_sess *last;  /* the ring's session entry used last */
} ct_hot;

static __thread ct_hot hot __attribute__((tls_model("initial-exec")));

/* The rest of the thread's state, rarely touched. */
typedef struct ct_tls {
    int64_t tid;
    int registered;
    char err[CT_ERR_CAP];
} ct_tls;

static __thread ct_tls tls;

/* ---- process hooks ------------------------------------------------------ */

/* After fork() only the forking thread exists in the child, and the Go runtime
 * does not survive that: a Go call that allocates or needs another thread
 * hangs. The child therefore refuses every call before touching Go. */
static void on_fork_child(void) { STORE(&ct__forked, 1); }

static void thread_exit(void *arg) {
    (void)arg;
    ct_ring *r = hot.ring;
    if (!r) return;
    for (int i = 0; i < CT_TLS_SESSIONS; i++) {
        ct_tls_sess *ts = &r->sess[i];
        free(ts->stack);
        ts->stack = NULL;
        ts->cap = 0;
        ct__agg_keys_free(ts->keys);
        ts->keys = NULL;
        /* Spans left open stay counted (handle and depth), so that ct_finish
         * of an aggregate session still refuses them. */
        if (!ct__slot_of(ts->handle)) {
            ts->handle = 0;
            STORE_RLX(&ts->depth, 0);
        }
    }
    /* The drainer frees the ring once it has read what is left. */
    STORE(&r->dead, 1);
    hot.ring = NULL;
    hot.last = NULL;
}

__attribute__((constructor)) static void ct_init(void) {
    pthread_atfork(NULL, NULL, on_fork_child);
    pthread_key_create(&thread_key, thread_exit);
    const char *kb = getenv("CANDLE_TRACE_RING_KB");
    if (kb) {
        long v = strtol(kb, NULL, 10);
        if (v >= 64 && v <= (1 << 20)) {
            uint32_t b = 1u << 16;
            while (b < (uint64_t)v * 1024 && b < (1u << 30)) b <<= 1;
            ring_bytes = b;
        }
    }
}

/* ---- clock, ids, errors ------------------------------------------------- */

static inline __attribute__((always_inline)) uint64_t clock_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

uint64_t ct__clock_ns(void) { return clock_now(); }

int64_t ct__gettid(void) {
    if (!tls.tid) tls.tid = (int64_t)syscall(SYS_gettid);
    return tls.tid;
}

char *ct__errbuf(void) { return tls.err; }

ct_status ct__fail(ct_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls.err, sizeof tls.err, fmt, ap);
    va_end(ap);
    return st;
}

/* ---- registry ----------------------------------------------------------- */

/* A handle is (generation << 8) | (slot index + 1): the low byte finds the slot
 * in O(1), the generation makes a finished handle never valid again. */
uint64_t ct__slot_alloc_locked(void) {
    uint64_t h = 0;
    for (int i = 0; i < CT_MAX_SESSIONS - 1; i++) {
        ct_slot *s = &ct__slots[i];
        if (LOAD(&s->handle) != 0) continue;
        uint64_t gen = __atomic_fetch_add(&generation, 1, __ATOMIC_RELAXED) + 1;
        h = (gen << 8) | (uint64_t)(i + 1);
        s->tsc = (uint32_t)ct__trace_counter();
        s->t0 = s->tsc ? ct__tsc_now() : ct__clock_ns();
        STORE(&s->tracer_seq, 0);
        s->tracer_total = s->tracer_since = s->tracer_hw = s->tracer_estimated = 0;
        s->tracer_depth = 0;
        s->measure_id = s->measure_tracer0 = 0;
        s->poison[0] = 0;
        STORE(&s->measured, 0);
        STORE(&s->measure_ring, NULL);
        STORE(&s->measure_top, 0);
        STORE(&s->track_main, 0);
        STORE(&s->agg, 0);
        STORE(&s->agg_on, 0);
        STORE(&s->next_span, 1); /* the root is s1 */
        STORE(&s->rearm_ok, 0);
        s->rearm_root = s->rearm_next = 0;
        STORE(&s->state, CT_SLOT_OPEN);
        STORE(&s->handle, h);
        break;
    }
    return h;
}

uint64_t ct__slot_alloc(void) {
    pthread_mutex_lock(&slots_mu);
    uint64_t h = ct__slot_alloc_locked();
    pthread_mutex_unlock(&slots_mu);
    return h;
}

void ct__slots_lock(void) { pthread_mutex_lock(&slots_mu); }
void ct__slots_unlock(void) { pthread_mutex_unlock(&slots_mu); }

void ct__slot_free_locked(ct_slot *s) {
    STORE(&s->state, CT_SLOT_FREE);
    STORE(&s->handle, 0);
}

void ct__slot_release(uint64_t handle) {
    pthread_mutex_lock(&slots_mu); /* a re-arm in C reads its chain's slots under it */
    ct_slot *s = ct__slot_of(handle);
    if (s) ct__slot_free_locked(s);
    pthread_mutex_unlock(&slots_mu);
}

static inline __attribute__((always_inline)) ct_slot *slot_get(uint64_t handle) {
    uint64_t idx = handle & 0xff;
    if (idx == 0) return NULL;
    ct_slot *s = &ct__slots[idx - 1];
    if (LOAD(&s->handle) != handle) return NULL;
    return s;
}

ct_slot *ct__slot_of(uint64_t handle) { return slot_get(handle); }

/* ---- the session clock ---------------------------------------------------
 * CLOCK_MONOTONIC since open, less the tracer's own time: while any thread is
 * inside ct_tracer_begin/end the clock stands at the value it had when the
 * first of them began, and it goes on from there once the last has ended.
 * The tracer's work runs inline in the program it observes (a PyTorch hook,
 * an op observer), so what it spends is taken out of every span around it
 * rather than counted as the program's. *excluded gets the tracer ns so far. */
/* The clock under the session clock: CLOCK_MONOTONIC, or the counter
 * converted as the drainer converts the fast path's raw values (ticks.h). */
static inline __attribute__((always_inline)) uint64_t base_now(const ct_slot *s) {
    return s->tsc ? ct__tsc_now() : clock_now();
}

/* Raises the session clock's mark (the value no backdated interval goes
 * before) to v, if it is lower; readers and tracer_end race to raise it. */
static inline __attribute__((always_inline)) void raise_mark(ct_slot *s, uint64_t v) {
    uint64_t hw = __atomic_load_n(&s->tracer_hw, __ATOMIC_RELAXED);
    while (v > hw &&
           !__atomic_compare_exchange_n(&s->tracer_hw, &hw, v, 1, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
    }
}

static inline __attribute__((always_inline)) uint64_t session_clock(ct_slot *s, uint64_t *excluded) {
    uint64_t seq = LOAD(&s->tracer_seq);
    if (__builtin_expect(seq == 0, 1)) {
        uint64_t now = base_now(s);
        /* Still no interval once the clock is read: the value is the plain
         * clock's. Otherwise the first interval began in between and froze
         * the clock at its own reading, which may be earlier than ours (this
         * thread was preempted between the two loads): read again under the
         * sequence, or the next read would go back. */
        if (__builtin_expect(__atomic_load_n(&s->tracer_seq, __ATOMIC_SEQ_CST) == 0, 1)) {
            if (excluded) *excluded = 0;
            return now - s->t0;
        }
        seq = LOAD(&s->tracer_seq);
    }
    for (;;) {
        if (seq & 1) {
            seq = LOAD(&s->tracer_seq);
            continue;
        }
        /* Acquire loads: the sequence's second read cannot move above them.
         * Inside an interval the clock stands at its start, so the counter
         * is read only when none is open or the excluded time is wanted:
         * the observer reads the clock inside every interval it opens. */
        uint32_t depth = LOAD(&s->tracer_depth);
        uint64_t mono = depth && !excluded ? 0 : base_now(s);
        uint64_t total = LOAD(&s->tracer_total);
        uint64_t since = LOAD(&s->tracer_since);
        uint64_t clock = (depth ? since : mono) - s->t0 - total;
        /* The value is published as handed out before the sequence is read again
         * (both sequentially consistent, as the writer's lock and its read of
         * the mark): a writer either sees it, or changed the sequence and this
         * read starts over (leaving the mark a little high: harmless). Inside
         * an interval the mark is there already (tracer_begin raised it). */
        raise_mark(s, clock);
        uint64_t again = __atomic_load_n(&s->tracer_seq, __ATOMIC_SEQ_CST);
        if (again != seq) {
            seq = again;
            continue;
        }
        if (excluded) *excluded = mono - s->t0 - clock;
        return clock;
    }
}

/* Writers of the tracer fields: the sequence number doubles as their lock. */
static inline uint64_t tracer_lock(ct_slot *s) {
    for (;;) {
        uint64_t seq = LOAD_RLX(&s->tracer_seq);
        if (!(seq & 1) && __atomic_compare_exchange_n(&s->tracer_seq, &seq, seq + 1, 1,
                                                      __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
            return seq + 1;
    }
}

static inline void tracer_unlock(ct_slot *s, uint64_t seq) { STORE(&s->tracer_seq, seq + 1); }

uint64_t ct__session_now(uint64_t handle) {
    ct_slot *s = ct__slot_of(handle);
    if (!s) return 0;
    return session_clock(s, NULL);
}

uint64_t ct__slot_now(ct_slot *s, uint64_t *excluded) { return session_clock(s, excluded); }


static inline __attribute__((always_inline)) ct_status check_slot(ct_slot *s, ct_session h, const char *fn) {
    uint32_t st = s ? LOAD(&s->state) : CT_SLOT_FREE;
    if (__builtin_expect(st == CT_SLOT_OPEN, 1)) return CT_OK;
    if (!s || st == CT_SLOT_REARMED) { /* re-armed: as it will be once Go has discarded it */
        if (h == 0) return ct__fail(CT_ERR_INVALID_HANDLE, "%s: session handle is 0 (never valid)", fn);
        return ct__fail(CT_ERR_INVALID_HANDLE,
                        "%s: session %llu is unknown or already finished", fn,
                        (unsigned long long)h);
    }
    if (st == CT_SLOT_POISONED)
        return ct__fail(CT_ERR_POISONED,
                        "%s: session %llu is poisoned by an earlier write error (%s); only "
                        "ct_finish_failed works now",
                        fn, (unsigned long long)h, s->poison);
    return ct__fail(CT_ERR_STATE, "%s: session %llu is finishing", fn, (unsigned long long)h);
}

ct_status ct__tracer_begin(ct_session h) { return ct__tracer_begin_at(h, 0, NULL, "ct_tracer_begin"); }

ct_status ct__tracer_begin_earlier(ct_session h, uint64_t earlier_ns) {
    return ct__tracer_begin_at(h, earlier_ns, NULL, earlier_ns ? "ct_tracer_begin_earlier" : "ct_tracer_begin");
}

/* With the tracer lock held and no interval open: an interval begins, up to
 * earlier_ns before now (never before a value the clock handed out, nor where
 * the last interval left it). Returns now, on the base clock. */
static uint64_t interval_open(ct_slot *s, uint64_t earlier_ns) {
    /* The session's first interval (since is 0 until one began; not
     * seq == 1: a refused ct_tracer_end takes the lock too). */
    int first = s->tracer_since == 0;
    uint64_t now = base_now(s);
    if (first && s->tsc) {
        /* The first interval: a span begin or end that saw no interval
         * (the sequence still 0) may have executed its rdtsc a few
         * dozen cycles after that check (rdtsc is not ordered with
         * loads), so later than this read. Freeze the clock past that
         * window: a microsecond, once per session. */
        uint64_t until = now + 1000;
        while ((now = base_now(s)) < until) {
        }
    }
    uint64_t clock = now - s->t0 - s->tracer_total;
    /* The first interval: every value read before it came from the plain
     * clock, at most this one. */
    uint64_t hw = first ? clock : __atomic_load_n(&s->tracer_hw, __ATOMIC_SEQ_CST);
    uint64_t back = clock > hw ? clock - hw : 0;
    if (back > earlier_ns) back = earlier_ns;
    if (first) STORE(&s->tracer_hw, hw);
    /* Release stores: no reader sees them before the odd sequence number. */
    STORE(&s->tracer_since, now - back);
    STORE(&s->tracer_estimated, s->tracer_estimated + back);
    /* The value the clock stands at is handed out from now on (readers
     * inside the interval, ct_tracer_begin_at): the mark goes there now
     * rather than at the end, so those readers find it raised (the end
     * would raise it to the same value). */
    raise_mark(s, clock - back);
    return now;
}

static ct_status tracer_usable(ct_slot *s, ct_session h, const char *fn) {
    ct_status st = check_slot(s, h, fn);
    if (st != CT_OK) return st;
    if (s->agg)
        return ct__fail(CT_ERR_STATE,
                        "%s: session %llu is an aggregate session; its spans are "
                        "timed by the cycle counter, which tracer intervals do not correct",
                        fn, (unsigned long long)h);
    return CT_OK;
}

ct_status ct__tracer_begin_at(ct_session h, uint64_t earlier_ns, uint64_t *at, const char *fn) {
    ct_slot *s = slot_get(h);
    ct_status st = tracer_usable(s, h, fn);
    if (st != CT_OK) return st;
    uint64_t seq = tracer_lock(s);
    if (s->tracer_depth == UINT32_MAX) {
        tracer_unlock(s, seq);
        return ct__fail(CT_ERR_STATE, "%s: %u tracer intervals are open already", fn,
                        (unsigned)UINT32_MAX);
    }
    if (s->tracer_depth == 0) interval_open(s, earlier_ns);
    if (at) *at = s->tracer_since - s->t0 - s->tracer_total;
    STORE(&s->tracer_depth, s->tracer_depth + 1);
    tracer_unlock(s, seq);
    return CT_OK;
}

ct_status ct__tracer_exclude_earlier(ct_session h, uint64_t earlier_ns) {
    ct_slot *s = slot_get(h);
    ct_status st = tracer_usable(s, h, "ct_tracer_exclude_earlier");
    if (st != CT_OK) return st;
    uint64_t seq = tracer_lock(s);
    /* Inside an open interval the clock stands still: nothing to leave out. */
    if (s->tracer_depth == 0) {
        uint64_t now = interval_open(s, earlier_ns);
        /* ... and it ends where it began, now. */
        STORE(&s->tracer_total, s->tracer_total + (now - s->tracer_since));
    }
    tracer_unlock(s, seq);
    return CT_OK;
}

ct_status ct__tracer_end(ct_session h) {
    ct_slot *s = slot_get(h);
    ct_status st = check_slot(s, h, "ct_tracer_end");
    if (st != CT_OK) return st;
    uint64_t seq = tracer_lock(s);
    if (s->tracer_depth == 0) {
        tracer_unlock(s, seq);
        return ct__fail(CT_ERR_STATE, "ct_tracer_end: no tracer interval is open in session %llu",
                        (unsigned long long)h);
    }
    if (s->tracer_depth == 1) {
        /* The clock goes on from the value it stood at: the next interval's
         * backdating stops there, read or not, or it would leave this
         * interval's time (and the program time before its start) out again. */
        raise_mark(s, s->tracer_since - s->t0 - s->tracer_total);
        STORE(&s->tracer_total, s->tracer_total + (base_now(s) - s->tracer_since));
    }
    STORE(&s->tracer_depth, s->tracer_depth - 1);
    tracer_unlock(s, seq);
    return CT_OK;
}

uint64_t ct__slot_tracer_estimated(ct_slot *s) { return LOAD(&s->tracer_estimated); }

uint64_t ct__tracer_estimated_ns(ct_session h) {
    ct_slot *s = slot_get(h);
    return s ? ct__slot_tracer_estimated(s) : 0;
}

uint64_t ct__tracer_ns(ct_session h) {
    ct_slot *s = slot_get(h);
    if (!s) return 0;
    uint64_t excluded;
    session_clock(s, &excluded);
    return excluded;
}

ct_status ct__session_usable(ct_session h, const char *fn) {
    return check_slot(ct__slot_of(h), h, fn);
}

/* ---- UTF-8 -------------------------------------------------------------- */

int ct__utf8_len(const char *str, size_t *len, int *blank) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    for (;;) {
        unsigned char c = s[i];
        if (c == 0) break;
        if (c < 0x80) { i++; continue; }
        int n;
        uint32_t cp;
        if ((c & 0xE0) == 0xC0) { n = 1; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { n = 2; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { n = 3; cp = c & 0x07; }
        else return -1;
        for (int k = 1; k <= n; k++) {
            unsigned char cc = s[i + k];
            if ((cc & 0xC0) != 0x80) return -1;
            cp = (cp << 6) | (cc & 0x3F);
        }
        /* overlong forms, surrogates and values past U+10FFFF */
        if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
            (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
            return -1;
        i += (size_t)n + 1;
    }
    *len = i;
    if (blank) {
        /* Blank = empty or ASCII whitespace only (what a trim would empty);
         * real names rarely start with a space, so this rarely scans. */
        size_t k = 0;
        while (k < i && (s[k] == ' ' || (s[k] >= '\t' && s[k] <= '\r'))) k++;
        *blank = k == i;
    }
    return 0;
}

/* ---- per-thread state --------------------------------------------------- */

/* A ring's address space: its own mapping, not malloc's, so that pages no
 * burst reached are never touched, so never resident. In small pages
 * whatever the system's transparent huge page setting: a burst stretches
 * into megabytes, and a fresh huge page costs ~0.35 us per 4 KiB of it
 * against ~2 us for a 4 KiB fault most of the time, but 11-65 us per 4 KiB
 * at times on a VM whose host backs the guest's memory lazily -- up to
 * ~30 ms for one page, paid by the thread that stretched into it, inside
 * the program's update (BENCHMARKS.md, "Small pages"). */
static uint8_t *ring_map(uint32_t cap) {
    uint8_t *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
    madvise(p, cap, MADV_NOHUGEPAGE);
    return p;
}

static ct_ring *ring_new(void) {
    ct_ring *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    uint32_t cap = ring_bytes <= CT_RING_MAX / CT_RING_REACH ? ring_bytes * CT_RING_REACH : CT_RING_MAX;
    if (cap < ring_bytes) cap = ring_bytes;
    uint8_t *data = ring_map(cap);
    if (!data) { free(r); return NULL; }
    r->data = data;
    r->cap = cap;
    r->soft = ring_bytes;
    r->limit = r->reach = ring_bytes;
    r->tid = ct__gettid();
    pthread_mutex_lock(&rings_mu);
    r->next = LOAD(&ct__rings);
    STORE(&ct__rings, r);
    pthread_mutex_unlock(&rings_mu);
    return r;
}

/* Whether a live session still counts spans left open on r. */
static int holds_open_spans(ct_ring *r) {
    for (int i = 0; i < CT_TLS_SESSIONS; i++)
        if (LOAD_RLX(&r->sess[i].depth) && ct__slot_of(r->sess[i].handle)) return 1;
    return 0;
}

void ct__ring_unlink_dead(void) {
    pthread_mutex_lock(&rings_mu);
    ct_ring **link = &ct__rings;
    ct_ring *r = LOAD(link);
    while (r) {
        ct_ring *next = r->next;
        if (LOAD(&r->dead) && LOAD(&r->head) == LOAD(&r->tail) && !holds_open_spans(r)) {
            STORE(link, next);
            for (int i = 0; i < CT_NAME_SLOTS; i++) free(r->names[i].copy);
            munmap(r->data, r->cap);
            free(r);
        } else {
            link = &r->next;
        }
        r = next;
    }
    pthread_mutex_unlock(&rings_mu);
}

uint64_t ct__open_spans(ct_session h, int64_t *tids, uint32_t *counts, int max, int *threads) {
    uint64_t total = 0;
    int n = 0;
    pthread_mutex_lock(&rings_mu);
    for (ct_ring *r = LOAD(&ct__rings); r; r = r->next) {
        for (int i = 0; i < CT_TLS_SESSIONS; i++) {
            if (LOAD_RLX(&r->sess[i].handle) != h) continue;
            uint32_t d = LOAD_RLX(&r->sess[i].depth);
            if (!d) continue;
            if (n < max) {
                tids[n] = r->tid;
                counts[n] = d;
            }
            n++;
            total += d;
        }
    }
    pthread_mutex_unlock(&rings_mu);
    *threads = n;
    return total;
}

/* The calling thread's span state in session h; NULL when it has none. */
static inline __attribute__((always_inline)) ct_tls_sess *tls_sess(uint64_t h) {
    ct_tls_sess *last = hot.last;
    if (__builtin_expect(last && last->handle == h, 1)) return last;
    ct_ring *r = hot.ring;
    if (!r) return NULL;
    for (int i = 0; i < CT_TLS_SESSIONS; i++)
        if (r->sess[i].handle == h) return hot.last = &r->sess[i];
    return NULL;
}

/* Takes a per-thread slot for handle h: one whose session is gone (or never
 * was), else one with no open spans (its session simply gets a new slot the
 * next time this thread opens a span in it). Only a thread holding open
 * spans in CT_TLS_SESSIONS other live sessions is refused. */
static __attribute__((noinline)) ct_tls_sess *tls_sess_new(uint64_t h) {
    ct_ring *r = hot.ring; /* the caller made sure it exists */
    ct_tls_sess *free_slot = NULL;
    for (int i = 0; i < CT_TLS_SESSIONS && !free_slot; i++) {
        ct_tls_sess *ts = &r->sess[i];
        if (ts->handle == 0 || !ct__slot_of(ts->handle)) free_slot = ts;
    }
    for (int i = 0; i < CT_TLS_SESSIONS && !free_slot; i++)
        if (r->sess[i].depth == 0) free_slot = &r->sess[i];
    if (!free_slot) return NULL;
    if (!tls.registered) {
        pthread_setspecific(thread_key, &tls);
        tls.registered = 1;
    }
    /* Keys belong to one session's aggregator: never carry them over. */
    ct__agg_keys_free(free_slot->keys);
    free_slot->keys = NULL;
    STORE_RLX(&free_slot->depth, 0);
    free_slot->next_id = free_slot->end_id = 0;
    STORE_RLX(&free_slot->handle, h);
    return hot.last = free_slot;
}

/* ---- ring writes -------------------------------------------------------- */

static void wake_drainer(void);

/* Sleeps until the drainer bumps r->room_seq past seq (or 2 ms pass: the
 * wake is asked for again then, in case the drainer was not running yet). */
static void wait_for_room(ct_ring *r, uint32_t seq) {
    struct timespec ts = {0, 2000000};
    long rc = syscall(SYS_futex, &r->room_seq, FUTEX_WAIT_PRIVATE, seq, &ts, NULL, 0);
    if (rc != 0 && errno == ETIMEDOUT) wake_drainer();
}

/* How far a stretching ring goes past its limit before the producer looks
 * again whether the drainer has caught up: a sixteenth of the everyday size
 * (32 KiB), so that the drainer, once it is caught up, is found so within
 * two steps (ring_caught_up). */
static inline uint64_t ring_step(const ct_ring *r) { return r->soft / 16 > 4096 ? r->soft / 16 : 4096; }

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define CT_PAGE 4096u
static inline uint64_t page_up(uint64_t off) { return (off + CT_PAGE - 1) & ~(uint64_t)(CT_PAGE - 1); }
static inline uint64_t page_down(uint64_t off) { return off & ~(uint64_t)(CT_PAGE - 1); }

/* Lets the producer write up to limit, and faults in the pages it stretches
 * into now, all at once: one madvise for a step's pages rather than a
 * page fault every hundred spans (where the kernel lacks
 * MADV_POPULATE_WRITE, 5.14, the pages fault in as they are written). */
static void ring_stretch(ct_ring *r, uint64_t limit) {
    uint64_t from = page_up(r->limit), to = page_up(limit);
    if (to > r->cap) to = r->cap;
    if (to > from) madvise(r->data + from, to - from, MADV_POPULATE_WRITE);
    r->limit = limit;
    if (limit > r->reach) r->reach = limit;
}

/* How far ahead of a stretching producer the drainer faults pages in. */
#define CT_RING_AHEAD (2u << 20)

/* What a ring keeps resident past its everyday size when it wraps back
 * (two everyday sizes): a producer a little ahead of the drainer stretches
 * into it now and then, and would otherwise fault it in lap after lap. */
static inline uint64_t ring_keep(const ct_ring *r) { return (uint64_t)r->soft * 3; }

uint64_t ct__ring_keep(const ct_ring *r) { return ring_keep(r); }

/* Whether the drainer has caught up well enough for the producer to wrap
 * back: used bytes behind it. The padding record of a wrap back counts as
 * written until the drainer has read it, so the producer's room in its new
 * lap is only what lies behind the drainer until then; an eighth of the
 * everyday size lets the drainer (~5 times slower a record) reach the pad
 * before the producer has filled that room. */
static inline int ring_caught_up(const ct_ring *r, uint64_t used) { return used <= r->soft / 8; }

void ct__ring_prefault(ct_ring *r, uint64_t head) {
    uint64_t off = head & (r->cap - 1);
    /* A burst: past the everyday size (at its very end, a producer wraps
     * back; an aggregate session's always does) and a whole one of it behind
     * (a small stretch faults in its own few pages). */
    if (off <= r->soft || head - r->tail < r->soft) return;
    uint64_t from = page_up(off), to = from + CT_RING_AHEAD;
    if (to > r->cap) to = r->cap;
    if (to > from) {
        madvise(r->data + from, to - from, MADV_POPULATE_WRITE);
        /* Counted as the producer's reach at its next wrap back: a ring that
         * stretched only a little gives these pages back too. */
        if (to > LOAD(&r->faulted)) STORE(&r->faulted, to);
    }
}

/* Whether a wrap back has pages to give back: the producer stretched, or the
 * drainer faulted pages in ahead of it, past what a ring keeps. */
static inline int ring_spread(ct_ring *r) {
    return r->reach > ring_keep(r) || LOAD(&r->faulted) > ring_keep(r);
}

/* The producer wraps back to the start from off (early, or at the end of the
 * address space) with the drainer caught up to tail in this lap: the pages
 * a burst stretched into go back to the kernel (faulted in again at the
 * next stretch), so a burst's memory is resident only until the drainer has
 * caught up. Kept: the everyday size, the records the drainer has still to
 * read ([tail, off)) and the padding record at off. */
static void ring_release(ct_ring *r, uint64_t tail, uint64_t off) {
    uint64_t keep_from = page_down(tail), keep_to = page_up(off + sizeof(ct_rec_hdr));
    uint64_t from = page_up(ring_keep(r));
    if (keep_to < from) keep_to = from;
    if (keep_from > from) madvise(r->data + from, keep_from - from, MADV_DONTNEED);
    /* To the end: the drainer faults pages in ahead of the producer's
     * reach (ct__ring_prefault). */
    if (r->cap > keep_to) madvise(r->data + keep_to, r->cap - keep_to, MADV_DONTNEED);
    r->reach = r->soft;
    STORE(&r->faulted, 0);
}

/* Whether a record may stretch the ring: trace spans, whose drainer encodes
 * and writes them far slower than a thread makes them; an aggregate
 * session's records fold in a few ns, and its memory stays flat. */
enum { CT_RING_FLAT = 0, CT_RING_STRETCH = 1 };

static __attribute__((noinline)) uint8_t *ring_reserve_slow(ct_ring *r, uint32_t size, int stretch) {
    int waiting = 0;
    uint32_t seq = 0;
    for (;;) {
        uint64_t head = r->head;
        uint64_t tail = __atomic_load_n(&r->tail, __ATOMIC_SEQ_CST);
        uint64_t off = head & (r->cap - 1);
        uint64_t used = head - tail;
        uint64_t to_end = r->cap - off;
        int wrap = size > to_end;
        if (!wrap && off + size > r->limit) {
            /* At the everyday size (or a stretch step past it): back to
             * the start while the drainer keeps up (at most half the
             * everyday size behind, and out of the way of this record),
             * else on into pages no record has touched yet. */
            if (ring_caught_up(r, used) && off >= used + size) {
                /* The padding record to the end counts as written until
                 * the drainer has read it: wake it now, so that a burst
                 * coming next finds the whole address space again. */
                wrap = 1;
                r->wake_mark = head;
                wake_drainer();
            } else if (stretch) {
                uint64_t limit = off + size + ring_step(r);
                ring_stretch(r, limit < r->cap ? limit : r->cap);
                continue;
            } else {
                wrap = 1; /* back to the start, waiting for room there */
            }
        }
        uint64_t need = wrap ? to_end + size : size;
        if (r->cap - used >= need) {
            if (waiting) STORE_RLX(&r->waiting, 0);
            if (wrap) {
                /* Back to the start, early or at the end: the pages past
                 * the everyday size go if the drainer has caught up. */
                if (ring_spread(r) && ring_caught_up(r, used)) ring_release(r, tail & (r->cap - 1), off);
                ct_rec_hdr *pad = (ct_rec_hdr *)(r->data + off);
                pad->size = (uint32_t)to_end;
                pad->type = CT_REC_PAD;
                STORE(&r->head, head + to_end);
                /* The padding is not written records: the next wake
                 * comes half an everyday size of records on, as after
                 * any other (ring_commit's mark would otherwise lie a
                 * whole address space behind, and never be crossed). */
                r->wake_mark += to_end;
                off = 0;
                r->limit = r->soft;
            }
            return r->data + off;
        }
        if (!waiting) {
            /* Full: wait for the drainer rather than drop or drain here.
             * seq before waiting, waiting before the tail is read again:
             * a drainer that moves tail after that read sees waiting and
             * bumps room_seq past seq, so the futex wait cannot miss it. */
            seq = __atomic_load_n(&r->room_seq, __ATOMIC_SEQ_CST);
            __atomic_store_n(&r->waiting, 1, __ATOMIC_SEQ_CST);
            waiting = 1;
            STORE_RLX(&r->waits, r->waits + 1);
            r->wake_mark = head;
            wake_drainer();
            continue;
        }
        wait_for_room(r, seq);
        seq = __atomic_load_n(&r->room_seq, __ATOMIC_SEQ_CST);
    }
}

ct_ring *ct__own_ring(void) { return hot.ring; }

uint64_t ct__ring_resident_in(const ct_ring *r, uint64_t from, uint64_t to) {
    if (to > r->cap || from >= to) return 0;
    size_t pages = (to - from) / CT_PAGE;
    unsigned char *vec = malloc(pages);
    if (!vec || mincore(r->data + from, to - from, vec) != 0) {
        free(vec);
        return 0;
    }
    uint64_t n = 0;
    for (size_t i = 0; i < pages; i++) n += vec[i] & 1;
    free(vec);
    return n * CT_PAGE;
}

void ct__ring_consumed(ct_ring *r, uint64_t tail) {
    __atomic_store_n(&r->tail, tail, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&r->waiting, __ATOMIC_SEQ_CST)) {
        __atomic_fetch_add(&r->room_seq, 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, &r->room_seq, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    }
}

static inline __attribute__((always_inline)) uint8_t *ring_reserve(ct_ring *r, uint32_t size, int stretch) {
    uint64_t head = r->head; /* only this thread writes head */
    uint64_t off = head & (r->cap - 1);
    if (off + size <= r->limit && r->cap - (head - LOAD(&r->tail)) >= size) return r->data + off;
    return ring_reserve_slow(r, size, stretch);
}

/* Wakes the Go drainer once per half everyday ring, so it drains on its own core
 * while this thread goes on; one write(2) per thousands of events. */
static __attribute__((noinline)) void wake_drainer(void) {
    int fd = LOAD(&ct__wake_fd);
    if (fd >= 0) {
        uint64_t one = 1;
        ssize_t n = write(fd, &one, sizeof one);
        (void)n;
    }
}

static inline void ring_commit(ct_ring *r, uint32_t size) {
    uint64_t head = r->head;
    uint64_t half = r->soft >> 1;
    STORE(&r->head, head + size);
    /* Half an everyday size past the mark, however far: a mark left behind
     * (as the wraps once left it, 7.5 MiB back) heals at the next record
     * instead of silencing the drainer for good. */
    if (head + size - r->wake_mark >= half) {
        r->wake_mark = head + size;
        wake_drainer();
    }
}

int ct__wake_fd_open(void) {
    int fd = LOAD(&ct__wake_fd);
    if (fd >= 0) return fd;
    fd = eventfd(0, EFD_CLOEXEC);
    if (fd >= 0) STORE(&ct__wake_fd, fd);
    return fd;
}

/* ---- spans -------------------------------------------------------------- */

static __attribute__((noinline)) ct_status grow_stack(ct_tls_sess *ts, const char *fn) {
    uint32_t cap = ts->cap ? ts->cap * 2 : 32;
    ct_frame *grown = realloc(ts->stack, cap * sizeof *grown);
    if (!grown) return ct__fail(CT_ERR_INTERNAL, "%s: out of memory for the span stack", fn);
    ts->stack = grown;
    ts->cap = cap;
    return CT_OK;
}

static ct_status claim_measured(ct_slot *s) {
    uint32_t expect = 0;
    if (!__atomic_compare_exchange_n(&s->measured, &expect, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return ct__fail(CT_ERR_STATE,
                        "ct_measurement_begin: session already has its measured region (a "
                        "capture holds exactly one)");
    return CT_OK;
}

static void track_begin(ct_slot *s, const ct_ring *r, uint64_t id);

static inline __attribute__((always_inline)) uint64_t take_id(ct_slot *s, ct_tls_sess *ts) {
    /* Ids come in blocks per thread: one shared atomic per CT_ID_BLOCK spans
     * instead of a contended one per span. */
    if (ts->next_id == ts->end_id) {
        ts->next_id = __atomic_fetch_add(&s->next_span, CT_ID_BLOCK, __ATOMIC_RELAXED) + 1;
        ts->end_id = ts->next_id + CT_ID_BLOCK;
    }
    return ts->next_id++;
}

static inline __attribute__((always_inline)) ct_tls_sess *thread_sess(uint64_t h, const char *fn, ct_status *st) {
    if (__builtin_expect(!hot.ring, 0) && !(hot.ring = ring_new())) {
        *st = ct__fail(CT_ERR_INTERNAL, "%s: out of memory for the event ring", fn);
        return NULL;
    }
    ct_tls_sess *ts = tls_sess(h);
    if (!ts) ts = tls_sess_new(h);
    if (!ts)
        *st = ct__fail(CT_ERR_STATE, "%s: this thread already has open spans in %d other sessions", fn,
                       CT_TLS_SESSIONS);
    return ts;
}

/* An aggregate session's span begin: no record, only a frame holding the
 * statistics key and the start tick (none while statistics are off). */
static inline __attribute__((always_inline)) ct_status agg_begin(ct_slot *s, ct_session h, const char *name,
                                                                 ct_span_kind kind, ct_step step, int measured,
                                                                 ct_span *out, const char *fn) {
    if ((uint32_t)kind > CT_SPAN_MODULE)
        return ct__fail(CT_ERR_INVALID_ARGUMENT, "%s: unknown span kind %d", fn, (int)kind);
    if ((uint32_t)step > CT_STEP_OPTIMIZER)
        return ct__fail(CT_ERR_INVALID_ARGUMENT, "%s: unknown step %d", fn, (int)step);
    ct_status st = CT_OK;
    ct_tls_sess *ts = thread_sess(h, fn, &st);
    if (!ts) return st;
    uint32_t key;
    if (!ct__agg_key_fast(ts->keys, name, (uint32_t)step, &key) &&
        (st = ct__agg_key_slow(&ts->keys, h, name, (uint32_t)step, fn, &key)) != CT_OK)
        return st;
    if (__builtin_expect(ts->depth == ts->cap, 0) && (st = grow_stack(ts, fn)) != CT_OK) return st;
    if (measured && (st = claim_measured(s)) != CT_OK) return st;
    uint64_t id = take_id(s, ts);
    ct_frame *f = &ts->stack[ts->depth];
    f->id = id;
    f->key = key;
    f->start = LOAD_RLX(&s->agg_on) ? ct__ticks() : CT_UNTIMED;
    STORE_RLX(&ts->depth, ts->depth + 1);
    *out = id;
    return CT_OK;
}

/* The name of a span begin, by the ring's name cache: *flags gets NAME_REF
 * (cached: neither checked nor copied again), NAME_DEF (checked, to be
 * cached once the record is written: name_keep) or 0 (checked, too long to
 * cache), with the slot. */
static inline __attribute__((always_inline)) ct_status name_lookup(ct_ring *r, const char *name, const char *fn,
                                                                   size_t *n, uint32_t *flags) {
    uintptr_t a = (uintptr_t)name;
    uint32_t slot = (uint32_t)((a >> 3) ^ (a >> 11)) & (CT_NAME_SLOTS - 1);
    ct_name_ent *e = &r->names[slot];
    if (__builtin_expect(e->ptr == name, 1) && strcmp(e->copy, name) == 0) {
        *n = e->len;
        *flags = CT_RECF_NAME_REF | slot << 8;
        return CT_OK;
    }
    ct_status st = ct__check_text(fn, "name", name, n);
    if (st != CT_OK) return st;
    *flags = *n <= CT_NAME_CACHE_MAX ? CT_RECF_NAME_DEF | slot << 8 : 0;
    return CT_OK;
}

/* Caches the name a NAME_DEF record carries; 0 when out of memory (the
 * record then goes without the flag). */
static __attribute__((noinline)) int name_keep(ct_ring *r, uint32_t slot, const char *name, size_t n) {
    ct_name_ent *e = &r->names[slot];
    if (e->cap < n + 1) {
        char *c = realloc(e->copy, CT_NAME_CACHE_MAX + 1);
        if (!c) {
            e->ptr = NULL;
            return 0;
        }
        e->copy = c;
        e->cap = CT_NAME_CACHE_MAX + 1;
    }
    memcpy(e->copy, name, n + 1);
    e->len = (uint32_t)n;
    e->ptr = name;
    return 1;
}

/* Reads the start or end of a trace span: the raw counter (*ticks = 1) while
 * the session is on it and has never had a tracer interval, else the session
 * clock (and, in *tracer, the tracer ns left out of it so far). */
static inline __attribute__((always_inline)) uint64_t span_clock(ct_slot *s, uint64_t *tracer, uint32_t *ticks) {
    if (__builtin_expect(LOAD(&s->tracer_seq) == 0 && s->tsc, 1)) {
        uint64_t t = ct__counter();
        /* As session_clock: still no interval once the counter is read
         * (the first one waits out rdtsc's reordering, ct__tracer_begin). */
        if (__builtin_expect(__atomic_load_n(&s->tracer_seq, __ATOMIC_SEQ_CST) == 0, 1)) {
            *tracer = 0;
            *ticks = 1;
            return t;
        }
    }
    *ticks = 0;
    return session_clock(s, tracer);
}

/* Writes the session marker of h before a compact record when marker says
 * there is one (its bytes were reserved); the record goes after it. */
static inline __attribute__((always_inline)) uint8_t *trace_marker(ct_ring *r, ct_session h, uint8_t *p,
                                                                   uint32_t marker) {
    if (__builtin_expect(marker == 0, 1)) return p;
    ct_rec_agg *m = (ct_rec_agg *)p;
    m->size = sizeof *m;
    m->type_key = CT_REC_TRACE_SESSION;
    m->val = h;
    r->trace_last = h;
    return p + sizeof *m;
}

/* Pushes the frame of a span begun (its record is in the ring). */
static inline __attribute__((always_inline)) void begin_frame(ct_slot *s, ct_tls_sess *ts, ct_ring *r, uint64_t id,
                                                              uint64_t start, uint32_t ticks, int measured) {
    ct_frame *f = &ts->stack[ts->depth];
    f->id = id;
    f->start = start;
    f->ticks = ticks;
    STORE_RLX(&ts->depth, ts->depth + 1);
    if (measured) STORE_RLX(&s->measure_ring, (const void *)r);
    if (__builtin_expect(LOAD_RLX(&s->track_main), 0)) track_begin(s, r, id);
}

/* Pops the frame of a span ended (its record is in the ring). */
static inline __attribute__((always_inline)) void end_frame(ct_slot *s, ct_tls_sess *ts, const ct_ring *r) {
    STORE_RLX(&ts->depth, ts->depth - 1);
    if (__builtin_expect(LOAD_RLX(&s->track_main), 0) && LOAD_RLX(&s->measure_ring) == (const void *)r)
        STORE_RLX(&s->measure_top, ts->depth ? ts->stack[ts->depth - 1].id : 0);
}

ct_status ct__span_begin(ct_session h, const char *name, ct_span_kind kind, ct_step step,
                         int measured, ct_span *out) {
    const char *fn = measured ? "ct_measurement_begin" : "ct_span_begin";
    ct_slot *s = slot_get(h);
    ct_status st = check_slot(s, h, fn);
    if (st != CT_OK) return st;
    if (!out) return ct__fail(CT_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    if (!name) return ct__fail(CT_ERR_INVALID_ARGUMENT, "%s: name is NULL", fn);
    if (s->agg) return agg_begin(s, h, name, kind, step, measured, out, fn);
    if ((uint32_t)kind > CT_SPAN_MODULE)
        return ct__fail(CT_ERR_INVALID_ARGUMENT, "%s: unknown span kind %d", fn, (int)kind);
    if ((uint32_t)step > CT_STEP_OPTIMIZER)
        return ct__fail(CT_ERR_INVALID_ARGUMENT, "%s: unknown step %d", fn, (int)step);
    ct_tls_sess *ts = thread_sess(h, fn, &st);
    if (!ts) return st;
    ct_ring *r = hot.ring;
    size_t n;
    uint32_t flags;
    if ((st = name_lookup(r, name, fn, &n, &flags)) != CT_OK) return st;
    if (ts->depth == ts->cap && (st = grow_stack(ts, fn)) != CT_OK) return st;
    uint32_t size = (uint32_t)((sizeof(ct_rec_hdr) + n + 7) & ~(size_t)7);
    if (flags & CT_RECF_NAME_REF) {
        size = sizeof(ct_rec_hdr);
    } else if (size > r->soft / 2) {
        return ct__fail(CT_ERR_INVALID_ARGUMENT, "%s: name of %zu bytes does not fit the event ring", fn, n);
    }
    if (measured && (st = claim_measured(s)) != CT_OK) return st;

    if (__builtin_expect((flags & CT_RECF_NAME_DEF) != 0, 0) && !name_keep(r, flags >> 8, name, n))
        flags = 0;
    /* Room for the long form, and for a session marker: which form the
     * record takes is known once the clock is read, after the reserve (a
     * wait for room must not fall inside the span). */
    uint32_t marker = r->trace_last != h ? sizeof(ct_rec_agg) : 0;
    uint8_t *p = ring_reserve(r, size + marker, CT_RING_STRETCH);
    uint64_t id = take_id(s, ts);
    uint64_t tracer;
    uint32_t ticks;
    uint64_t start = span_clock(s, &tracer, &ticks);
    if (__builtin_expect(ticks && (flags & CT_RECF_NAME_REF) && !measured, 1)) {
        p = trace_marker(r, h, p, marker);
        uint64_t delta = start - r->last_ticks;
        uint32_t used;
        if (__builtin_expect(id == r->last_id + 1 && delta < (1u << CT_BEGIN_NEXT_DELTA_BITS), 1)) {
            ct_rec_short *b = (ct_rec_short *)p;
            b->size = sizeof *b;
            b->word = CT_REC_BEGIN_NEXT | (uint32_t)kind << CT_SHORT_KIND_SHIFT |
                      (uint32_t)step << CT_SHORT_STEP_SHIFT |
                      (flags >> 8 & (CT_NAME_SLOTS - 1)) << CT_SHORT_SLOT_SHIFT |
                      (uint32_t)delta << CT_SHORT_BEGIN_DELTA_SHIFT;
            used = sizeof *b;
        } else {
            ct_rec_begin *b = (ct_rec_begin *)p;
            b->size = sizeof *b;
            b->type = CT_REC_BEGIN;
            b->kind = (uint8_t)kind;
            b->step = (uint8_t)step;
            b->slot = (uint8_t)(flags >> 8);
            b->id = id;
            b->ticks = start;
            used = sizeof *b;
        }
        r->last_id = id;
        r->last_ticks = start;
        ring_commit(r, marker + used);
        begin_frame(s, ts, r, id, start, ticks, measured);
        *out = id;
        return CT_OK;
    }
    if (measured) {
        s->measure_tracer0 = tracer;
        STORE(&s->measure_id, id);
    }
    ct_rec_hdr *rec = (ct_rec_hdr *)p;
    rec->size = size;
    rec->type = CT_REC_SPAN_START;
    rec->kind = (uint8_t)kind;
    rec->step = (uint8_t)step;
    rec->measured = (uint8_t)measured;
    rec->session = h;
    rec->id = id;
    rec->parent = ts->depth ? ts->stack[ts->depth - 1].id : 1;
    rec->ts = start;
    rec->name_len = (uint32_t)n;
    rec->flags = flags | ticks;
    if (!(flags & CT_RECF_NAME_REF)) memcpy(p + sizeof *rec, name, n);
    ring_commit(r, size);
    begin_frame(s, ts, r, id, start, ticks, measured);
    *out = id;
    return CT_OK;
}

/* The main thread, for device work launched where no span is open: the one
 * that began the measured region, else the first to open a span. */
static __attribute__((noinline)) void track_begin(ct_slot *s, const ct_ring *r, uint64_t id) {
    const void *main_ring = LOAD_RLX(&s->measure_ring);
    if (!main_ring && __atomic_compare_exchange_n(&s->measure_ring, &main_ring, (const void *)r, 0,
                                                  __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        main_ring = r;
    if (main_ring == (const void *)r) STORE_RLX(&s->measure_top, id);
}

void ct__track_main_thread(ct_session h, int on) {
    ct_slot *s = slot_get(h);
    if (!s) return;
    /* Either way, no span from an earlier tracking: the main thread's next
     * span begin or end says where it is. */
    STORE_RLX(&s->measure_top, 0);
    STORE_RLX(&s->track_main, (uint32_t)(on != 0));
}

uint64_t ct__innermost_span(ct_session h) {
    if (!slot_get(h)) return 1;
    ct_tls_sess *ts = tls_sess(h);
    return ts && ts->depth ? ts->stack[ts->depth - 1].id : 1;
}

uint64_t ct__launch_span(ct_session h, int *borrowed) {
    *borrowed = 0;
    uint64_t own = ct__innermost_span(h); /* 1: none here (s1 is on no thread's stack) */
    if (own != 1) return own;
    ct_slot *s = slot_get(h);
    uint64_t top = s ? LOAD_RLX(&s->measure_top) : 0;
    if (!top) return 1;
    *borrowed = 1;
    return top;
}

uint32_t ct__innermost_key(ct_session h) {
    ct_tls_sess *ts = tls_sess(h);
    return ts && ts->depth && ts->stack ? ts->stack[ts->depth - 1].key : UINT32_MAX;
}

/* One aggregate record: 16 bytes into the ring, 32 when the ring's last
 * aggregate record was of another session (the session marker first). */
static inline __attribute__((always_inline)) void agg_write(ct_ring *r, ct_session h, uint32_t type_key,
                                                            uint64_t val) {
    uint32_t size = r->agg_last == h ? sizeof(ct_rec_agg) : 2 * sizeof(ct_rec_agg);
    ct_rec_agg *rec = (ct_rec_agg *)ring_reserve(r, size, CT_RING_FLAT);
    if (size != sizeof(ct_rec_agg)) {
        rec->size = sizeof *rec;
        rec->type_key = CT_REC_AGG_SESSION;
        rec->val = h;
        rec++;
        r->agg_last = h;
    }
    rec->size = sizeof *rec;
    rec->type_key = type_key;
    rec->val = val;
    ring_commit(r, size);
}

/* An aggregate span's end: its key and ticks. */
static inline __attribute__((always_inline)) void agg_end(ct_slot *s, ct_session h, ct_ring *r, ct_frame top) {
    if (top.start == CT_UNTIMED || !LOAD_RLX(&s->agg_on)) return;
    uint64_t d = ct__ticks() - top.start;
    if ((int64_t)d < 0) d = 0; /* counters of two cores a hair apart */
    agg_write(r, h, CT_REC_AGG | (top.key << 8), d);
}

ct_status ct__agg_scalar(ct_session h, ct_span span, const char *label, double value, int *handled) {
    const char *fn = "ct_record_scalar";
    ct_slot *s = slot_get(h);
    *handled = s && LOAD_RLX(&s->agg);
    if (!*handled) return CT_OK;
    ct_status st = check_slot(s, h, fn);
    if (st != CT_OK) return st;
    if (!label) return ct__fail(CT_ERR_INVALID_ARGUMENT, "%s: label is NULL", fn);
    /* The Go side never sees an aggregate session's spans: an id handed out
     * is all there is to check, as for the other records. */
    if (span == 0) return ct__fail(CT_ERR_INVALID_HANDLE, "%s: span 0 is never valid", fn);
    if (span > LOAD(&s->next_span))
        return ct__fail(CT_ERR_INVALID_HANDLE, "%s: span s%llu does not exist in session %llu", fn,
                        (unsigned long long)span, (unsigned long long)h);
    ct_tls_sess *ts = thread_sess(h, fn, &st);
    if (!ts) return st;
    uint32_t key;
    if (!ct__agg_key_fast(ts->keys, label, CT_AGG_SCALAR, &key) &&
        (st = ct__agg_key_slow(&ts->keys, h, label, CT_AGG_SCALAR, fn, &key)) != CT_OK)
        return st;
    if (!LOAD_RLX(&s->agg_on)) return CT_OK;
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    agg_write(hot.ring, h, CT_REC_AGG_SCALAR | (key << 8), bits);
    return CT_OK;
}

ct_status ct__span_end(ct_session h, ct_span span) {
    ct_slot *s = slot_get(h);
    ct_status st = check_slot(s, h, "ct_span_end");
    if (st != CT_OK) return st;
    ct_tls_sess *ts = tls_sess(h);
    if (!ts || ts->depth == 0) {
        if (span == 1)
            return ct__fail(CT_ERR_SPAN_MISMATCH,
                            "ct_span_end: s1 is the root span; ct_finish closes it");
        return ct__fail(CT_ERR_SPAN_MISMATCH, "ct_span_end: span s%llu is not open on this thread",
                        (unsigned long long)span);
    }
    ct_frame top = ts->stack[ts->depth - 1];
    if (top.id != span)
        return ct__fail(CT_ERR_SPAN_MISMATCH,
                        "ct_span_end: span s%llu is not the innermost open span of this thread "
                        "(s%llu is)",
                        (unsigned long long)span, (unsigned long long)top.id);
    ct_ring *r = hot.ring;
    if (s->agg) {
        agg_end(s, h, r, top);
        STORE_RLX(&ts->depth, ts->depth - 1);
        return CT_OK;
    }
    uint32_t marker = r->trace_last != h ? sizeof(ct_rec_agg) : 0;
    uint8_t *p = ring_reserve(r, sizeof(ct_rec_hdr) + marker, CT_RING_STRETCH);
    uint64_t tracer;
    uint32_t ticks;
    uint64_t end = span_clock(s, &tracer, &ticks);
    if (__builtin_expect(ticks && top.ticks && span != LOAD_RLX(&s->measure_id), 1)) {
        p = trace_marker(r, h, p, marker);
        uint64_t delta = end - r->last_ticks;
        uint32_t used;
        if (__builtin_expect(delta < (1u << CT_END_NEXT_DELTA_BITS), 1)) {
            ct_rec_short *e = (ct_rec_short *)p;
            e->size = sizeof *e;
            e->word = CT_REC_END_NEXT | (uint32_t)delta << CT_SHORT_END_DELTA_SHIFT;
            used = sizeof *e;
        } else {
            ct_rec_end *e = (ct_rec_end *)p;
            e->size = sizeof *e;
            e->type = CT_REC_END;
            e->ticks = end;
            used = sizeof *e;
        }
        r->last_ticks = end;
        ring_commit(r, marker + used);
        end_frame(s, ts, r);
        return CT_OK;
    }
    ct_rec_hdr *rec = (ct_rec_hdr *)p;
    rec->size = sizeof *rec;
    rec->type = CT_REC_SPAN_END;
    rec->session = h;
    rec->id = span;
    rec->measured = span == LOAD_RLX(&s->measure_id);
    if (__builtin_expect(ticks && top.ticks, 1)) {
        /* Both ends on the counter: the drainer converts both (and no
         * tracer time can lie between them). */
        rec->ts = end;
        rec->parent = top.start;
        rec->flags = CT_RECF_TICKS;
    } else {
        /* A start on the counter and an end on the session clock (a tracer
         * interval began in between): the end, from which the drainer
         * subtracts the start as it converted it (converted again here, a
         * start older than the counter's kept segments would convert through
         * another). Neither on the counter: the duration. */
        if (ticks) end = ct__tsc_ns(end) - s->t0;
        if (top.ticks) {
            rec->ts = end;
            rec->flags = CT_RECF_END_AT;
        } else {
            rec->ts = end > top.start ? end - top.start : 0;
            rec->flags = 0;
        }
        rec->parent = rec->measured ? tracer - s->measure_tracer0 : 0;
    }
    ring_commit(r, sizeof *rec);
    end_frame(s, ts, r);
    return CT_OK;
}
