/* candle-trace's CUPTI activity collector (C half; cupti.go drives it).
 *
 * libcupti is dlopened (never linked), so the library builds and loads with
 * no CUDA anywhere. The collector:
 *   - subscribes to CUPTI's callback API and watches the entry of every CUDA
 *     runtime/driver function that launches device work (cbids.c). At entry,
 *     on the launching thread, it stores correlation id -> that thread's
 *     innermost span (read from the C fast path's thread-local span stack;
 *     for a thread with none, s1, or with "unspanned_launches":"main_thread"
 *     the span innermost on the session's main thread) in a bounded table;
 *   - enables the activity kinds CONCURRENT_KERNEL, MEMCPY, MEMSET and, so
 *     that every API call carries a correlation id, RUNTIME and DRIVER;
 *   - hands CUPTI 1-10 MB buffers through the buffer callbacks and queues the
 *     completed ones for Go, which decodes them (ct_cupti_decode) on its own
 *     goroutine: CUPTI's threads only queue. The buffers come from a pool
 *     whose pages are written at start (see pool_fill) and go back to it once
 *     decoded.
 *
 * One collector per process: CUPTI allows one subscriber. */
#define _GNU_SOURCE
#include "collector.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)

/* ---- the library ------------------------------------------------------------ */

static struct {
    CUptiResult (*activityEnable)(CUpti_ActivityKind);
    CUptiResult (*activityDisable)(CUpti_ActivityKind);
    CUptiResult (*activityRegisterCallbacks)(CUpti_BuffersCallbackRequestFunc,
                                             CUpti_BuffersCallbackCompleteFunc);
    CUptiResult (*activityFlushAll)(uint32_t);
    CUptiResult (*activityGetNextRecord)(uint8_t *, size_t, CUpti_Activity **);
    CUptiResult (*activityGetNumDroppedRecords)(CUcontext, uint32_t, size_t *);
    CUptiResult (*getTimestamp)(uint64_t *);
    CUptiResult (*subscribe)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *);
    CUptiResult (*unsubscribe)(CUpti_SubscriberHandle);
    CUptiResult (*enableCallback)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain,
                                  CUpti_CallbackId);
    CUptiResult (*getResultString)(CUptiResult, const char **); /* optional */
} fn;

static void *lib;
static char lib_path[4096];
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;

int ct_cupti_load(const char *path, int noload, char *err, size_t errcap) {
    pthread_mutex_lock(&load_mu);
    if (lib) {
        pthread_mutex_unlock(&load_mu);
        return 0;
    }
    dlerror();
    /* RTLD_LOCAL: the functions are reached through fn only. Never closed:
     * CUPTI keeps calling our callbacks and its threads run in it. */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | (noload ? RTLD_NOLOAD : 0));
    if (!h) {
        const char *e = dlerror();
        snprintf(err, errcap, "%s", noload ? "not loaded in this process" : (e ? e : "dlopen failed"));
        pthread_mutex_unlock(&load_mu);
        return -1;
    }
    struct {
        const char *name;
        void **slot;
        int optional;
    } syms[] = {
        {"cuptiActivityEnable", (void **)&fn.activityEnable, 0},
        {"cuptiActivityDisable", (void **)&fn.activityDisable, 0},
        {"cuptiActivityRegisterCallbacks", (void **)&fn.activityRegisterCallbacks, 0},
        {"cuptiActivityFlushAll", (void **)&fn.activityFlushAll, 0},
        {"cuptiActivityGetNextRecord", (void **)&fn.activityGetNextRecord, 0},
        {"cuptiActivityGetNumDroppedRecords", (void **)&fn.activityGetNumDroppedRecords, 0},
        {"cuptiGetTimestamp", (void **)&fn.getTimestamp, 0},
        {"cuptiSubscribe", (void **)&fn.subscribe, 0},
        {"cuptiUnsubscribe", (void **)&fn.unsubscribe, 0},
        {"cuptiEnableCallback", (void **)&fn.enableCallback, 0},
        {"cuptiGetResultString", (void **)&fn.getResultString, 1},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *p = dlsym(h, syms[i].name);
        if (!p && !syms[i].optional) {
            snprintf(err, errcap, "%s has no %s (not a CUPTI library, or one older than CUDA 10)", path,
                     syms[i].name);
            memset(&fn, 0, sizeof fn);
            pthread_mutex_unlock(&load_mu);
            return -2; /* left open: harmless, and dlclose of a half-used library is not */
        }
        *syms[i].slot = p;
    }
    snprintf(lib_path, sizeof lib_path, "%s", path);
    STORE(&lib, h);
    pthread_mutex_unlock(&load_mu);
    return 0;
}

const char *ct_cupti_loaded_path(void) { return LOAD(&lib) ? lib_path : ""; }

const char *ct_cupti_result_string(CUptiResult r) {
    const char *s = NULL;
    if (LOAD(&lib) && fn.getResultString && fn.getResultString(r, &s) == CUPTI_SUCCESS && s) return s;
    return "";
}

int ct_cuda_probe(char *err, size_t errcap) {
    /* The driver's own library, as CUPTI and the CUDA runtime find it. Never
     * closed: a program that uses CUDA keeps it loaded anyway. */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(err, errcap, "the NVIDIA driver's libcuda.so.1 could not be loaded: %s", e ? e : "dlopen failed");
        return -1;
    }
    int (*cu_init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*cu_error_name)(int, const char **) = (int (*)(int, const char **))dlsym(h, "cuGetErrorName");
    if (!cu_init) {
        snprintf(err, errcap, "libcuda.so.1 has no cuInit");
        return -1;
    }
    int r = cu_init(0);
    if (r == 0) return 0;
    const char *name = NULL;
    if (!cu_error_name || cu_error_name(r, &name) != 0 || !name) name = "CUDA error";
    snprintf(err, errcap, "cuInit returned %s (%d)", name, r);
    return r;
}

void *ct_cupti_sym(const char *name) {
    void *h = LOAD(&lib);
    return h ? dlsym(h, name) : NULL;
}

/* ---- correlation id -> span ----------------------------------------------------- */

/* Direct-mapped on the correlation id, which CUPTI hands out in sequence:
 * the table keeps the newest CT_CUPTI_MAP_SIZE API calls, with no eviction
 * bookkeeping. Each entry is a tiny seqlock: writers (the launching threads)
 * never block, and a reader that races a writer sees a miss, not a wrong span.
 * A record whose launch is older than that (more than 262144 watched API
 * calls ago) is attributed to the root span and counted. */
#define CT_CUPTI_MAP_BITS 18
#define CT_CUPTI_MAP_SIZE (1u << CT_CUPTI_MAP_BITS)

typedef struct {
    uint64_t key; /* (1 << 32) | correlation id; 0 = empty or being written */
    uint64_t span;
} map_entry;

static map_entry *map;

static void map_put(uint32_t cid, uint64_t span) {
    map_entry *e = &map[cid & (CT_CUPTI_MAP_SIZE - 1)];
    __atomic_store_n(&e->key, 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&e->span, span, __ATOMIC_RELAXED);
    STORE(&e->key, (1ull << 32) | cid);
}

static uint64_t map_get(uint32_t cid) {
    map_entry *e = &map[cid & (CT_CUPTI_MAP_SIZE - 1)];
    uint64_t want = (1ull << 32) | cid;
    if (LOAD(&e->key) != want) return 0;
    uint64_t span = LOAD(&e->span);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&e->key, __ATOMIC_RELAXED) != want) return 0;
    return span;
}

/* ---- state ------------------------------------------------------------------------- */

static pthread_mutex_t state_mu = PTHREAD_MUTEX_INITIALIZER; /* start/stop */
static uint64_t active_session;                                /* 0 = not collecting */
static int borrow_main; /* unspanned launches: the main thread's span, not s1 */
static CUpti_SubscriberHandle subscriber;
static size_t buf_bytes;
static int max_bufs;
static int outstanding;                                        /* buffers allocated, not freed */
static ct_cupti_counters counters;

static pthread_mutex_t done_mu = PTHREAD_MUTEX_INITIALIZER;   /* the completed-buffer queue */
static ct_cupti_buf *done_head, *done_tail;

/* Buffers CUPTI holds: handed out by buffer_requested, not yet back through
 * buffer_completed. A flush must wait for them: cuptiActivityFlushAll does
 * not wait for a buffer another thread is delivering (CUPTI's own, when one
 * fills, or the drain loop's unforced flush), so a record launched just
 * before exit could reach the queue after the terminal line. Each buffer
 * carries this header in front of what CUPTI sees; the list is in request
 * order, so its head is the oldest buffer still out. Guarded by done_mu;
 * returns are signalled on done_cv. */
typedef struct held_buf {
    struct held_buf *prev, *next;
    uint64_t bytes;  /* the data's size (what follows the header) */
    uint64_t seq;    /* 1, 2, ... in request order */
    uint64_t linked; /* on the list (a flush gave up on it: no longer); also keeps the data 8-byte aligned */
} held_buf;
#define HELD_HDR sizeof(held_buf)
static held_buf *held_head, *held_tail;
static uint64_t held_seq;
static pthread_cond_t done_cv;
static pthread_once_t done_cv_once = PTHREAD_ONCE_INIT;

static void done_cv_init(void) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&done_cv, &a);
    pthread_condattr_destroy(&a);
}

static held_buf *held_of(uint8_t *data) { return (held_buf *)(void *)(data - HELD_HDR); }

/* ---- the buffer pool ---------------------------------------------------------------
 *
 * CUPTI asks for a buffer on the thread whose API call makes the first record
 * (each launching thread's first launch, CUPTI's own thread for device
 * records), and fills it there. A fresh malloc'd buffer's pages are faulted in
 * on that first fill, inside the program's step: on an H200 VM (gVisor) the
 * first launch of every thread took 2.8 ms with CUPTI on (0.27 ms without),
 * and a traced step of 2.2 ms measured 5.4. So buffers come from a pool whose
 * pages were written at ct_cupti_start -- the tracer's time, before anything
 * is measured -- and go back to it once Go has decoded them. The pool keeps
 * at most POOL_MAX_BYTES between sessions. Guarded by pool_mu. */
#define POOL_START 4                  /* filled at start: the program's thread, autograd's, CUPTI's, one more */
#define POOL_MAX_BYTES (32u << 20)    /* kept for the next session at most */
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static held_buf *pool_head;
static size_t pool_count;

/* A new buffer of n data bytes, aligned as CUPTI wants its records
 * (ACTIVITY_RECORD_ALIGNMENT, 8); NULL when out of memory. */
static held_buf *held_new(size_t n) {
    held_buf *h = aligned_alloc(8, HELD_HDR + n);
    if (h) h->bytes = n;
    return h;
}

/* A buffer of n data bytes: the pool's when it has one of that size, else new
 * (counted: buffers_fresh). NULL when out of memory. */
static held_buf *pool_take(size_t n) {
    pthread_mutex_lock(&pool_mu);
    held_buf *h = pool_head;
    if (h && h->bytes == n) {
        pool_head = h->next;
        pool_count--;
    } else {
        h = NULL;
    }
    pthread_mutex_unlock(&pool_mu);
    if (h) return h;
    h = held_new(n);
    if (h) ADD(&counters.buffers_fresh, 1);
    return h;
}

/* Back to the pool, or freed where the pool is full or of another size. */
static void pool_give(held_buf *h) {
    pthread_mutex_lock(&pool_mu);
    if (h->bytes == LOAD(&buf_bytes) && (pool_count + 1) * h->bytes <= POOL_MAX_BYTES) {
        h->next = pool_head;
        pool_head = h;
        pool_count++;
        h = NULL;
    }
    pthread_mutex_unlock(&pool_mu);
    free(h);
}

/* Tops the pool up to POOL_START buffers of n bytes, every page written
 * (faulted in now, not on a launching thread); buffers of another size go. */
static void pool_fill(size_t n) {
    pthread_mutex_lock(&pool_mu);
    while (pool_head && pool_head->bytes != n) {
        held_buf *h = pool_head;
        pool_head = h->next;
        pool_count--;
        free(h);
    }
    size_t want = POOL_START;
    if (want * n > POOL_MAX_BYTES) want = POOL_MAX_BYTES / n;
    while (pool_count < want) {
        held_buf *h = held_new(n);
        if (!h) break;
        memset((uint8_t *)h + HELD_HDR, 0, n);
        h->next = pool_head;
        pool_head = h;
        pool_count++;
    }
    pthread_mutex_unlock(&pool_mu);
}

static const CUpti_ActivityKind kinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER,
};
#define NKINDS ((int)(sizeof kinds / sizeof kinds[0]))

/* At the entry of a watched API function, on the thread that called it. */
static void api_callback(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                         const void *cbdata) {
    (void)userdata;
    (void)cbid;
    if (domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
    const CUpti_CallbackData *d = cbdata;
    if (!d || d->callbackSite != CUPTI_API_ENTER) return;
    uint64_t h = LOAD(&active_session);
    if (!h) return;
    int borrowed;
    uint64_t span = ct__launch_span(h, &borrowed);
    if (borrowed && !LOAD(&borrow_main)) span = 1, borrowed = 0;
    map_put(d->correlationId, span);
    ADD(&counters.launches, 1);
    if (borrowed) ADD(&counters.borrowed, 1);
}

static void buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *max_records = 0; /* as many as fit */
    *buffer = NULL;
    *size = 0;
    if (ADD(&outstanding, 1) >= LOAD(&max_bufs)) {
        /* Go is behind: CUPTI drops records and counts them (dropped). */
        ADD(&outstanding, -1);
        ADD(&counters.buffers_refused, 1);
        return;
    }
    size_t n = LOAD(&buf_bytes);
    held_buf *h = pool_take(n);
    if (!h) {
        ADD(&outstanding, -1);
        ADD(&counters.buffers_refused, 1);
        return;
    }
    pthread_mutex_lock(&done_mu);
    h->seq = ++held_seq;
    h->linked = 1;
    h->next = NULL;
    h->prev = held_tail;
    if (held_tail)
        held_tail->next = h;
    else
        held_head = h;
    held_tail = h;
    pthread_mutex_unlock(&done_mu);
    *buffer = (uint8_t *)h + HELD_HDR;
    *size = n;
}

/* Takes h off the held list; done_mu held. */
static void held_unlink(held_buf *h) {
    if (!h->linked) return;
    h->linked = 0;
    if (h->prev)
        h->prev->next = h->next;
    else
        held_head = h->next;
    if (h->next)
        h->next->prev = h->prev;
    else
        held_tail = h->prev;
    h->prev = h->next = NULL;
}

/* Waits until every buffer handed out up to seq mark is back, at most
 * CT_CUPTI_FLUSH_WAIT_MS; returns 0 when they are, -1 when the bound
 * passed (counted). */
static int wait_returned(uint64_t mark) {
    pthread_once(&done_cv_once, done_cv_init);
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += CT_CUPTI_FLUSH_WAIT_MS / 1000;
    until.tv_nsec += (long)(CT_CUPTI_FLUSH_WAIT_MS % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    int rc = 0;
    pthread_mutex_lock(&done_mu);
    while (held_head && held_head->seq <= mark) {
        if (pthread_cond_timedwait(&done_cv, &done_mu, &until) == ETIMEDOUT) {
            /* Given up on: later flushes do not wait for these again (one
             * that still comes back is queued as any other). */
            while (held_head && held_head->seq <= mark) {
                held_unlink(held_head);
                rc = -1;
            }
            break;
        }
    }
    pthread_mutex_unlock(&done_mu);
    if (rc) ADD(&counters.flush_timeouts, 1);
    return rc;
}

static uint64_t held_mark(void) {
    pthread_mutex_lock(&done_mu);
    uint64_t m = held_seq;
    pthread_mutex_unlock(&done_mu);
    return m;
}

static void buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                             size_t valid) {
    (void)size;
    size_t dropped = 0;
    if (fn.activityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
        ADD(&counters.dropped, (uint64_t)dropped);
    if (!buffer) return;
    pthread_once(&done_cv_once, done_cv_init);
    held_buf *h = held_of(buffer);
    ct_cupti_buf *b = valid ? calloc(1, sizeof *b) : NULL;
    pthread_mutex_lock(&done_mu);
    held_unlink(h);
    if (b) {
        b->data = buffer;
        b->valid = valid;
        ADD(&counters.buffers, 1);
        if (done_tail)
            done_tail->next = b;
        else
            done_head = b;
        done_tail = b;
    }
    /* Queued before the flush waiting for it is told: it takes the queue next. */
    pthread_cond_broadcast(&done_cv);
    pthread_mutex_unlock(&done_mu);
    if (!b) {
        pool_give(h);
        ADD(&outstanding, -1);
    }
}

static void disable_all(int upto) {
    for (int i = 0; i < upto; i++) fn.activityDisable(kinds[i]);
}

int ct_cupti_start(uint64_t session, size_t buffer_bytes, int max_buffers, int borrow, CUptiResult *res,
                   int *kind) {
    *res = CUPTI_SUCCESS;
    *kind = 0;
    if (!LOAD(&lib)) return CT_CUPTI_STAGE_NOT_LOADED;
    pthread_mutex_lock(&state_mu);
    if (LOAD(&active_session)) {
        pthread_mutex_unlock(&state_mu);
        return CT_CUPTI_STAGE_BUSY;
    }
    if (!map && !(map = calloc(CT_CUPTI_MAP_SIZE, sizeof *map))) {
        pthread_mutex_unlock(&state_mu);
        return CT_CUPTI_STAGE_MEMORY;
    }
    memset(map, 0, CT_CUPTI_MAP_SIZE * sizeof *map);
    {
        uint64_t *k = (uint64_t *)&counters;
        for (size_t i = 0; i < sizeof counters / sizeof(uint64_t); i++) STORE(&k[i], 0);
    }
    STORE(&buf_bytes, buffer_bytes);
    STORE(&max_bufs, max_buffers);
    STORE(&borrow_main, borrow);
    pool_fill(buffer_bytes);

    CUptiResult r = fn.subscribe(&subscriber, api_callback, NULL);
    if (r != CUPTI_SUCCESS) {
        *res = r;
        pthread_mutex_unlock(&state_mu);
        return CT_CUPTI_STAGE_SUBSCRIBE;
    }
    int watched = 0;
    for (int i = 0; i < ct_cupti_n_runtime_cbids; i++)
        watched += fn.enableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API,
                                     ct_cupti_runtime_cbids[i].cbid) == CUPTI_SUCCESS;
    for (int i = 0; i < ct_cupti_n_driver_cbids; i++)
        watched += fn.enableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API,
                                     ct_cupti_driver_cbids[i].cbid) == CUPTI_SUCCESS;
    int stage = CT_CUPTI_STAGE_OK;
    if (!watched) {
        stage = CT_CUPTI_STAGE_CALLBACKS;
    } else if ((r = fn.activityRegisterCallbacks(buffer_requested, buffer_completed)) != CUPTI_SUCCESS) {
        stage = CT_CUPTI_STAGE_BUFFERS;
    } else {
        /* Attribute before enabling: no record may precede its session. */
        if (borrow) ct__track_main_thread(session, 1);
        STORE(&active_session, session);
        for (int i = 0; i < NKINDS; i++) {
            if ((r = fn.activityEnable(kinds[i])) != CUPTI_SUCCESS) {
                *kind = kinds[i];
                disable_all(i);
                STORE(&active_session, 0);
                if (borrow) ct__track_main_thread(session, 0);
                stage = CT_CUPTI_STAGE_ENABLE;
                break;
            }
        }
    }
    if (stage != CT_CUPTI_STAGE_OK) {
        *res = r;
        fn.unsubscribe(subscriber);
        subscriber = NULL;
    }
    pthread_mutex_unlock(&state_mu);
    return stage;
}

CUptiResult ct_cupti_flush(int forced) {
    if (!LOAD(&lib)) return CUPTI_ERROR_NOT_INITIALIZED;
    if (!forced) return fn.activityFlushAll(0);
    /* Every buffer handed out before the flush holds records launched
     * before it: forced out, each comes back, here or on another thread. */
    uint64_t mark = held_mark();
    CUptiResult r = fn.activityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    wait_returned(mark);
    return r;
}

void ct_cupti_stop(void) {
    pthread_mutex_lock(&state_mu);
    uint64_t session = LOAD(&active_session);
    if (session) {
        ct_cupti_flush(1);
        disable_all(NKINDS);
        fn.unsubscribe(subscriber);
        subscriber = NULL;
        STORE(&active_session, 0);
        if (LOAD(&borrow_main)) ct__track_main_thread(session, 0);
        uint64_t mark = held_mark();
        fn.activityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
        wait_returned(mark);
        ct_cupti_poll_dropped();
    }
    pthread_mutex_unlock(&state_mu);
}

ct_cupti_buf *ct_cupti_take(void) {
    pthread_mutex_lock(&done_mu);
    ct_cupti_buf *b = done_head;
    done_head = done_tail = NULL;
    pthread_mutex_unlock(&done_mu);
    return b;
}

void ct_cupti_buf_free(ct_cupti_buf *b) {
    if (!b) return;
    pool_give(held_of(b->data));
    free(b);
    ADD(&outstanding, -1);
}

void ct_cupti_poll_dropped(void) {
    size_t dropped = 0;
    if (LOAD(&lib) && fn.activityGetNumDroppedRecords(NULL, 0, &dropped) == CUPTI_SUCCESS && dropped)
        ADD(&counters.dropped, (uint64_t)dropped);
}

void ct_cupti_read_counters(ct_cupti_counters *out) {
    uint64_t *src = (uint64_t *)&counters, *dst = (uint64_t *)out;
    for (size_t i = 0; i < sizeof counters / sizeof(uint64_t); i++) dst[i] = LOAD(&src[i]);
}

CUptiResult ct_cupti_clock_read(uint64_t session, uint64_t *h0, uint64_t *c, uint64_t *h1) {
    *h0 = ct__session_now(session);
    CUptiResult r = fn.getTimestamp(c);
    *h1 = ct__session_now(session);
    return r;
}

/* ---- decoding --------------------------------------------------------------------- */

static uint64_t attribute(uint32_t cid, uint32_t alt) {
    uint64_t span = map_get(cid);
    if (!span && alt) span = map_get(alt);
    if (!span) ADD(&counters.unattributed, 1);
    return span;
}

int ct_cupti_decode(ct_cupti_buf *b, ct_cupti_rec *out, int cap) {
    int n = 0;
    while (n < cap && !b->done) {
        CUptiResult r = fn.activityGetNextRecord(b->data, b->valid, &b->cursor);
        if (r != CUPTI_SUCCESS) {
            /* MAX_LIMIT_REACHED: the end. Anything else (INVALID_KIND: an
             * incomplete or corrupt record) ends the buffer too. */
            if (r != CUPTI_ERROR_MAX_LIMIT_REACHED) ADD(&counters.bad_records, 1);
            b->done = 1;
            break;
        }
        ct_cupti_rec rec;
        memset(&rec, 0, sizeof rec);
        switch (b->cursor->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        case CUPTI_ACTIVITY_KIND_KERNEL: {
            const CUpti_ActivityKernel9 *k = (const void *)b->cursor;
            rec.kind = CT_CUPTI_REC_KERNEL;
            rec.device_id = k->deviceId;
            rec.stream_id = k->streamId;
            rec.start = k->start;
            rec.end = k->end;
            rec.correlation_id = k->correlationId;
            rec.name = k->name;
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            const CUpti_ActivityMemcpy6 *m = (const void *)b->cursor;
            rec.kind = CT_CUPTI_REC_MEMCPY;
            rec.device_id = m->deviceId;
            rec.stream_id = m->streamId;
            rec.copy_kind = m->copyKind;
            rec.bytes = m->bytes;
            rec.start = m->start;
            rec.end = m->end;
            rec.correlation_id = m->correlationId;
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            const CUpti_ActivityMemset4 *m = (const void *)b->cursor;
            rec.kind = CT_CUPTI_REC_MEMSET;
            rec.device_id = m->deviceId;
            rec.stream_id = m->streamId;
            rec.bytes = m->bytes;
            rec.start = m->start;
            rec.end = m->end;
            rec.correlation_id = m->correlationId;
            break;
        }
        case CUPTI_ACTIVITY_KIND_RUNTIME:
        case CUPTI_ACTIVITY_KIND_DRIVER:
            ADD(&counters.api_records, 1);
            continue;
        default:
            ADD(&counters.other_records, 1);
            continue;
        }
        if (rec.start == 0 || rec.end < rec.start) {
            /* No timing (CUPTI lacked device memory for it), or still running
             * at a forced flush (end 0). end == start (work shorter than the
             * GPU timer's tick) is kept. */
            ADD(&counters.incomplete, 1);
            continue;
        }
        uint32_t alt = rec.kind == CT_CUPTI_REC_MEMCPY
                           ? ((const CUpti_ActivityMemcpy6 *)(const void *)b->cursor)->runtimeCorrelationId
                           : 0;
        rec.span = attribute((uint32_t)rec.correlation_id, alt);
        out[n++] = rec;
    }
    return n;
}
