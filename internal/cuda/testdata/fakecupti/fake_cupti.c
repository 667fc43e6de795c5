/* A stand-in libcupti.so for tests on machines without CUDA.
 *
 * It implements the CUPTI functions candle-trace's collector calls and lays
 * activity records out byte for byte as CUPTI 12.9 does (cupti_activity.h of
 * the nvidia-cuda-cupti-cu12 12.9.79 wheel), writing every field at its
 * documented offset by hand, not through candle-trace's own struct
 * declarations, so that a mistake there shows:
 *
 *   CUpti_ActivityKernel9  208 bytes: kind@0 start@16 end@24 deviceId@40
 *                          contextId@44 streamId@48 correlationId@92 name@104
 *   CUpti_ActivityMemcpy6   96 bytes: kind@0 copyKind@4 bytes@8 start@16 end@24
 *                          deviceId@32 contextId@36 streamId@40
 *                          correlationId@44 runtimeCorrelationId@48
 *   CUpti_ActivityMemset4   88 bytes: kind@0 value@4 bytes@8 start@16 end@24
 *                          deviceId@32 contextId@36 streamId@40 correlationId@44
 *   CUpti_ActivityAPI       40 bytes: kind@0 cbid@4 start@8 end@16
 *                          processId@24 threadId@28 correlationId@32
 *
 * Records go, in order, into the buffers the client's request callback
 * hands out; a full buffer, cuptiActivityFlushAll and fake_cupti_complete
 * deliver the current one to the completion callback from another thread,
 * as CUPTI does from its own. cuptiActivityGetNextRecord walks a buffer by
 * each record's kind.
 *
 * fake_cupti_set_delivery_delay (or FAKE_CUPTI_DELIVERY_DELAY_MS) makes every
 * delivery asynchronous and late instead (see deliver).
 *
 * Test hooks (fake_cupti_*): simulate an API call on the calling thread
 * (the subscriber's callback runs there, at entry and exit, with a fresh
 * correlation id), append device records, inject dropped records, hold the
 * subscriber slot as another profiler would, and shape the clock:
 * cuptiGetTimestamp = CLOCK_MONOTONIC + offset, with a busy wait of slow_ns
 * before reading on every call but each every-th.
 *
 * Build: cc -shared -fPIC -o libcupti.so.12 fake_cupti.c -lpthread */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef int CUptiResult;
typedef void *CUcontext;
typedef void *CUpti_SubscriberHandle;
typedef void (*CallbackFunc)(void *userdata, int domain, uint32_t cbid, const void *cbdata);
typedef void (*RequestFunc)(uint8_t **buffer, size_t *size, size_t *max_records);
typedef void (*CompleteFunc)(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid);

enum { OK = 0, INVALID_PARAMETER = 1, INVALID_OPERATION = 7, MAX_LIMIT_REACHED = 12,
       NOT_INITIALIZED = 15, INVALID_KIND = 21, MULTIPLE_SUBSCRIBERS = 39 };
enum { K_MEMCPY = 1, K_MEMSET = 2, K_KERNEL = 3, K_DRIVER = 4, K_RUNTIME = 5, K_CONCURRENT_KERNEL = 10 };
enum { D_DRIVER = 1, D_RUNTIME = 2 };

#define MAXCBID 2048

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int subscribed, held, subscribe_result;
static CallbackFunc callback;
static void *callback_userdata;
static uint8_t enabled_cb[3][MAXCBID];
static int kinds[64];
static RequestFunc request;
static CompleteFunc complete;
static uint8_t *cur;
static size_t cur_size, cur_used;
static uint32_t next_cid;
static size_t dropped;
static int64_t clock_offset;
static uint32_t slow_ns, slow_every, clock_calls;

static size_t record_size(uint32_t kind) {
    switch (kind) {
    case K_KERNEL:
    case K_CONCURRENT_KERNEL: return 208;
    case K_MEMCPY: return 96;
    case K_MEMSET: return 88;
    case K_DRIVER:
    case K_RUNTIME: return 40;
    default: return 0;
    }
}

static void put8(uint8_t *r, size_t off, uint8_t v) { r[off] = v; }
static void put32(uint8_t *r, size_t off, uint32_t v) { memcpy(r + off, &v, 4); }
static void put64(uint8_t *r, size_t off, uint64_t v) { memcpy(r + off, &v, 8); }
static void putptr(uint8_t *r, size_t off, const void *p) { memcpy(r + off, &p, sizeof p); }

static uint64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* ---- delivery ------------------------------------------------------------ */

typedef struct { uint8_t *buf; size_t size, used; } delivery;

static void *deliver_thread(void *arg) {
    delivery *d = arg;
    complete((CUcontext)0x1, 7, d->buf, d->size, d->used);
    return NULL;
}

/* Delayed delivery (fake_cupti_set_delivery_delay, or FAKE_CUPTI_DELIVERY_DELAY_MS
 * in the environment at load): a buffer taken out reaches the completion
 * callback from a detached thread delay_us later, and whoever took it out
 * (a flush, forced or not, or an append that filled it) returns at once.
 * That is the window a record launched just before exit falls into when
 * CUPTI's own thread, or the client's periodic unforced flush, is still
 * delivering its buffer as the exit's forced flush runs: widened
 * deterministically. */
static uint32_t delivery_delay_us;

static void *deliver_later(void *arg) {
    delivery *d = arg;
    struct timespec t = {(time_t)(delivery_delay_us / 1000000), (long)(delivery_delay_us % 1000000) * 1000};
    while (nanosleep(&t, &t) != 0) {
    }
    complete((CUcontext)0x1, 7, d->buf, d->size, d->used);
    free(d);
    return NULL;
}

__attribute__((constructor)) static void read_delivery_delay(void) {
    const char *ms = getenv("FAKE_CUPTI_DELIVERY_DELAY_MS");
    if (ms && *ms) delivery_delay_us = (uint32_t)strtoul(ms, NULL, 10) * 1000;
}

void fake_cupti_set_delivery_delay(uint32_t us) { __atomic_store_n(&delivery_delay_us, us, __ATOMIC_RELAXED); }

/* Hands a buffer to the completion callback from another thread. */
static void deliver(uint8_t *buf, size_t size, size_t used) {
    if (__atomic_load_n(&delivery_delay_us, __ATOMIC_RELAXED)) {
        delivery *later = malloc(sizeof *later);
        pthread_attr_t a;
        pthread_t t;
        if (later && pthread_attr_init(&a) == 0) {
            *later = (delivery){buf, size, used};
            pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
            int rc = pthread_create(&t, &a, deliver_later, later);
            pthread_attr_destroy(&a);
            if (rc == 0) return;
        }
        free(later);
    }
    delivery d = {buf, size, used};
    pthread_t t;
    if (pthread_create(&t, NULL, deliver_thread, &d) == 0)
        pthread_join(t, NULL);
    else
        deliver_thread(&d);
}

/* Takes the current buffer out (mu held); the caller delivers it unlocked. */
static int take_current(delivery *d) {
    if (!cur) return 0;
    d->buf = cur;
    d->size = cur_size;
    d->used = cur_used;
    cur = NULL;
    cur_size = cur_used = 0;
    return 1;
}

/* Space for one record of size n, or NULL (counted as dropped). */
static uint8_t *reserve(size_t n, delivery *full, int *have_full) {
    *have_full = 0;
    if (!request || !complete) return NULL;
    if (cur && cur_used + n > cur_size) *have_full = take_current(full);
    if (!cur) {
        uint8_t *b = NULL;
        size_t size = 0, max_records = 0;
        request(&b, &size, &max_records);
        if (!b || size < n) {
            dropped++;
            return NULL;
        }
        cur = b;
        cur_size = size;
        cur_used = 0;
    }
    uint8_t *r = cur + cur_used;
    memset(r, 0, n);
    cur_used += (n + 7) & ~(size_t)7;
    return r;
}

/* Appends one record, filled by fill(r, arg). */
static void append(uint32_t kind, void (*fill)(uint8_t *, const void *), const void *arg) {
    delivery full;
    int have_full;
    pthread_mutex_lock(&mu);
    if (!kinds[kind]) {
        pthread_mutex_unlock(&mu);
        return;
    }
    uint8_t *r = reserve(record_size(kind), &full, &have_full);
    if (r) {
        put32(r, 0, kind);
        fill(r, arg);
    }
    pthread_mutex_unlock(&mu);
    if (have_full) deliver(full.buf, full.size, full.used);
}

/* ---- CUPTI --------------------------------------------------------------- */

CUptiResult cuptiGetResultString(CUptiResult r, const char **s) {
    switch (r) {
    case OK: *s = "CUPTI_SUCCESS"; return OK;
    case NOT_INITIALIZED: *s = "CUPTI_ERROR_NOT_INITIALIZED"; return OK;
    case MULTIPLE_SUBSCRIBERS: *s = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"; return OK;
    default: *s = "CUPTI_ERROR_UNKNOWN"; return OK;
    }
}

CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *sub, CallbackFunc cb, void *userdata) {
    pthread_mutex_lock(&mu);
    CUptiResult r = subscribe_result ? subscribe_result : (subscribed || held) ? MULTIPLE_SUBSCRIBERS : OK;
    if (r == OK) {
        subscribed = 1;
        callback = cb;
        callback_userdata = userdata;
        memset(enabled_cb, 0, sizeof enabled_cb);
        *sub = (CUpti_SubscriberHandle)&subscribed;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle sub) {
    pthread_mutex_lock(&mu);
    CUptiResult r = sub == (CUpti_SubscriberHandle)&subscribed && subscribed ? OK : INVALID_PARAMETER;
    if (r == OK) {
        subscribed = 0;
        callback = NULL;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

CUptiResult cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle sub, int domain, uint32_t cbid) {
    if (sub != (CUpti_SubscriberHandle)&subscribed || (domain != D_DRIVER && domain != D_RUNTIME) || cbid >= MAXCBID)
        return INVALID_PARAMETER;
    pthread_mutex_lock(&mu);
    enabled_cb[domain][cbid] = enable ? 1 : 0;
    pthread_mutex_unlock(&mu);
    return OK;
}

CUptiResult cuptiActivityEnable(int kind) {
    if (kind < 0 || kind >= 64 || !record_size((uint32_t)kind)) return INVALID_KIND;
    pthread_mutex_lock(&mu);
    kinds[kind] = 1;
    pthread_mutex_unlock(&mu);
    return OK;
}

CUptiResult cuptiActivityDisable(int kind) {
    if (kind < 0 || kind >= 64) return INVALID_KIND;
    pthread_mutex_lock(&mu);
    kinds[kind] = 0;
    pthread_mutex_unlock(&mu);
    return OK;
}

CUptiResult cuptiActivityRegisterCallbacks(RequestFunc req, CompleteFunc done) {
    if (!req || !done) return INVALID_PARAMETER;
    pthread_mutex_lock(&mu);
    request = req;
    complete = done;
    pthread_mutex_unlock(&mu);
    return OK;
}

CUptiResult cuptiActivityFlushAll(uint32_t flag) {
    (void)flag;
    delivery d;
    pthread_mutex_lock(&mu);
    if (!complete) {
        pthread_mutex_unlock(&mu);
        return INVALID_OPERATION;
    }
    int have = take_current(&d);
    pthread_mutex_unlock(&mu);
    if (have) deliver(d.buf, d.size, d.used);
    return OK;
}

CUptiResult cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, void **record) {
    if (!buffer || !record) return INVALID_PARAMETER;
    uint8_t *p = buffer;
    if (*record) {
        uint32_t kind;
        memcpy(&kind, *record, 4);
        size_t n = record_size(kind);
        if (!n) return INVALID_KIND;
        p = (uint8_t *)*record + ((n + 7) & ~(size_t)7);
    }
    if (p >= buffer + valid) return MAX_LIMIT_REACHED;
    uint32_t kind;
    memcpy(&kind, p, 4);
    size_t n = record_size(kind);
    if (!n) return INVALID_KIND;
    /* CUPTI 12.9 takes a record cut short by `valid` as the end. */
    if (p + n > buffer + valid) return MAX_LIMIT_REACHED;
    *record = p;
    return OK;
}

CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext ctx, uint32_t stream, size_t *out) {
    (void)ctx;
    (void)stream;
    if (!out) return INVALID_PARAMETER;
    pthread_mutex_lock(&mu);
    *out = dropped;
    dropped = 0;
    pthread_mutex_unlock(&mu);
    return OK;
}

CUptiResult cuptiGetTimestamp(uint64_t *ts) {
    if (!ts) return INVALID_PARAMETER;
    uint32_t n = __atomic_fetch_add(&clock_calls, 1, __ATOMIC_RELAXED);
    uint32_t every = __atomic_load_n(&slow_every, __ATOMIC_RELAXED);
    uint32_t slow = __atomic_load_n(&slow_ns, __ATOMIC_RELAXED);
    if (slow && (!every || n % every != 0)) {
        uint64_t until = mono_ns() + slow;
        while (mono_ns() < until) {
        }
    }
    *ts = (uint64_t)((int64_t)mono_ns() + __atomic_load_n(&clock_offset, __ATOMIC_RELAXED));
    return OK;
}

/* ---- test hooks ------------------------------------------------------------ */

typedef struct {
    int site;
    const char *functionName;
    const void *functionParams;
    void *functionReturnValue;
    const char *symbolName;
    void *context;
    uint32_t contextUid;
    uint64_t *correlationData;
    uint32_t correlationId;
} callback_data; /* CUpti_CallbackData */

typedef struct { uint32_t kind, cbid, cid; uint64_t start, end; } api_rec;

static void fill_api(uint8_t *r, const void *arg) {
    const api_rec *a = arg;
    put32(r, 4, a->cbid);
    put64(r, 8, a->start);
    put64(r, 16, a->end);
    put32(r, 24, (uint32_t)getpid());
    put32(r, 28, (uint32_t)syscall(SYS_gettid));
    put32(r, 32, a->cid);
}

/* One API call of domain/cbid on the calling thread; returns its
 * correlation id. */
uint32_t fake_cupti_api(int domain, uint32_t cbid) {
    pthread_mutex_lock(&mu);
    uint32_t cid = ++next_cid;
    CallbackFunc cb = subscribed && domain > 0 && domain < 3 && cbid < MAXCBID && enabled_cb[domain][cbid] ? callback : NULL;
    void *ud = callback_userdata;
    pthread_mutex_unlock(&mu);
    callback_data d = {0};
    d.correlationId = cid;
    d.functionName = "fake";
    uint64_t t0;
    cuptiGetTimestamp(&t0);
    if (cb) cb(ud, domain, cbid, &d);
    d.site = 1;
    if (cb) cb(ud, domain, cbid, &d);
    api_rec a = {domain == D_RUNTIME ? K_RUNTIME : K_DRIVER, cbid, cid, t0, t0 + 1000};
    append(a.kind, fill_api, &a);
    return cid;
}

typedef struct {
    uint32_t cid, rt_cid, dev, stream, copy_kind;
    uint64_t start, end, bytes;
    const char *name;
} dev_rec;

static void fill_kernel(uint8_t *r, const void *arg) {
    const dev_rec *k = arg;
    put64(r, 16, k->start);
    put64(r, 24, k->end);
    put64(r, 32, k->end);      /* completed */
    put32(r, 40, k->dev);
    put32(r, 44, 1);           /* contextId */
    put32(r, 48, k->stream);
    put32(r, 52, 128);         /* gridX */
    put32(r, 64, 256);         /* blockX */
    put32(r, 92, k->cid);
    put64(r, 96, k->cid);      /* gridId */
    putptr(r, 104, k->name);
}

static void fill_memcpy(uint8_t *r, const void *arg) {
    const dev_rec *m = arg;
    put8(r, 4, (uint8_t)m->copy_kind);
    put8(r, 5, 1);             /* srcKind: pageable */
    put8(r, 6, 3);             /* dstKind: device */
    put64(r, 8, m->bytes);
    put64(r, 16, m->start);
    put64(r, 24, m->end);
    put32(r, 32, m->dev);
    put32(r, 36, 1);
    put32(r, 40, m->stream);
    put32(r, 44, m->cid);
    put32(r, 48, m->rt_cid);
    put64(r, 88, 1);           /* copyCount */
}

static void fill_memset(uint8_t *r, const void *arg) {
    const dev_rec *m = arg;
    put32(r, 4, 0);            /* value */
    put64(r, 8, m->bytes);
    put64(r, 16, m->start);
    put64(r, 24, m->end);
    put32(r, 32, m->dev);
    put32(r, 36, 1);
    put32(r, 40, m->stream);
    put32(r, 44, m->cid);
}

/* Names live as long as the process and, as CUPTI's do, one pointer per
 * distinct name (the collector caches demangled names by pointer). */
#define MAXNAMES 4096
static const char *names[MAXNAMES];
static int nnames;
static pthread_mutex_t names_mu = PTHREAD_MUTEX_INITIALIZER;

static const char *intern(const char *name) {
    if (!name) return NULL;
    pthread_mutex_lock(&names_mu);
    for (int i = nnames - 1; i >= 0; i--) {
        if (strcmp(names[i], name) == 0) {
            pthread_mutex_unlock(&names_mu);
            return names[i];
        }
    }
    const char *p = strdup(name);
    if (p && nnames < MAXNAMES) names[nnames++] = p;
    pthread_mutex_unlock(&names_mu);
    return p;
}

void fake_cupti_kernel(uint32_t cid, const char *name, uint32_t dev, uint32_t stream, uint64_t start, uint64_t end) {
    dev_rec k = {.cid = cid, .dev = dev, .stream = stream, .start = start, .end = end, .name = intern(name)};
    append(K_CONCURRENT_KERNEL, fill_kernel, &k);
}

void fake_cupti_memcpy(uint32_t cid, uint32_t rt_cid, uint32_t copy_kind, uint64_t bytes, uint32_t dev,
                       uint32_t stream, uint64_t start, uint64_t end) {
    dev_rec m = {.cid = cid, .rt_cid = rt_cid, .copy_kind = copy_kind, .bytes = bytes, .dev = dev,
                 .stream = stream, .start = start, .end = end};
    append(K_MEMCPY, fill_memcpy, &m);
}

void fake_cupti_memset(uint32_t cid, uint64_t bytes, uint32_t dev, uint32_t stream, uint64_t start, uint64_t end) {
    dev_rec m = {.cid = cid, .bytes = bytes, .dev = dev, .stream = stream, .start = start, .end = end};
    append(K_MEMSET, fill_memset, &m);
}

/* Delivers the current buffer now, as CUPTI does when it fills one. */
void fake_cupti_complete(void) { cuptiActivityFlushAll(0); }

void fake_cupti_drop(uint64_t n) {
    pthread_mutex_lock(&mu);
    dropped += (size_t)n;
    pthread_mutex_unlock(&mu);
}

/* held 1: another profiler is subscribed (cuptiSubscribe answers
 * MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED). result != 0: cuptiSubscribe answers it. */
void fake_cupti_hold(int h, int result) {
    pthread_mutex_lock(&mu);
    held = h;
    subscribe_result = result;
    pthread_mutex_unlock(&mu);
}

void fake_cupti_set_clock(int64_t offset, uint32_t slow, uint32_t every) {
    __atomic_store_n(&clock_offset, offset, __ATOMIC_RELAXED);
    __atomic_store_n(&slow_ns, slow, __ATOMIC_RELAXED);
    __atomic_store_n(&slow_every, every, __ATOMIC_RELAXED);
}

/* Whether the subscriber's callback is enabled for domain/cbid, and kind. */
int fake_cupti_enabled(int domain, uint32_t cbid) {
    return domain > 0 && domain < 3 && cbid < MAXCBID && enabled_cb[domain][cbid];
}
int fake_cupti_kind_enabled(int kind) { return kind >= 0 && kind < 64 && kinds[kind]; }

/* Turns an activity kind's records on or off behind the client's back
 * (benchmarks: a launch's callback without CUPTI's own API record). */
void fake_cupti_set_kind(int kind, int on) {
    if (kind < 0 || kind >= 64) return;
    pthread_mutex_lock(&mu);
    kinds[kind] = on;
    pthread_mutex_unlock(&mu);
}
int fake_cupti_subscribed(void) { return subscribed; }
