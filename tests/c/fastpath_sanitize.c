/* fastpath_sanitize — the C span path alone, under AddressSanitizer +
 * UndefinedBehaviorSanitizer and under ThreadSanitizer.
 *
 * The Go library cannot run under the C sanitizers, so this program links
 * internal/session/{fastpath,aggkeys,ticks}.c with stand-ins for the Go side
 * (the drainer, and the key interning they call) and drives them hard:
 * four threads, two aggregate sessions and a trace session at once, a name
 * buffer rewritten between spans, fresh heap copies of names, nested spans,
 * rings small enough to fill (producers then wait for the drainer, which
 * starts only once one does, so every ring stretches to its whole address
 * space first, and wraps back early once the drainer keeps up), a drainer
 * thread racing the producers, and a thread that exits inside a span. Every
 * aggregate record drained must match what the threads did, exactly, per
 * (session, name, step); trace spans come in both record forms, compact
 * (after a session marker: ct_rec_begin/ct_rec_end, and their 8-byte
 * ct_rec_short forms, deltas along the ring) and long.
 *
 *   make test-sanitize   (builds it twice and runs both, CANDLE_TRACE_RING_KB=64)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "aggkeys.h"
#include "fastpath.h"
#include "ticks.h"

#define NAMES 100
#define STEPS 4
#define THREADS 4
#define ITERS 60000

static int failures;
#define CHECK(cond, ...)                                  \
    do {                                                  \
        if (!(cond)) {                                    \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                 \
            fputc('\n', stderr);                          \
            failures++;                                   \
        }                                                 \
    } while (0)

/* ---- stand-in for ctgo_agg_intern: keys per session, from 1 --------------- */

typedef struct {
    uint64_t h;
    char name[32];
    uint32_t step;
    uint32_t key;
} interned;

static pthread_mutex_t intern_mu = PTHREAD_MUTEX_INITIALIZER;
static interned table[4 * NAMES * (STEPS + 1)];
static int n_interned;
static uint32_t next_key[2];
static uint64_t agg_handles[2];
static unsigned long intern_calls;

int64_t ctgo_agg_intern(uint64_t h, char *name, size_t n, uint32_t step) {
    pthread_mutex_lock(&intern_mu);
    intern_calls++;
    int sess = h == agg_handles[0] ? 0 : h == agg_handles[1] ? 1 : -1;
    int64_t key = -1;
    if (sess >= 0 && n < sizeof table[0].name) {
        for (int i = 0; i < n_interned; i++)
            if (table[i].h == h && table[i].step == step && strlen(table[i].name) == n &&
                memcmp(table[i].name, name, n) == 0) {
                key = table[i].key;
                break;
            }
        if (key < 0) {
            interned *e = &table[n_interned++];
            e->h = h;
            memcpy(e->name, name, n);
            e->name[n] = 0;
            e->step = step;
            e->key = ++next_key[sess];
            key = e->key;
        }
    }
    pthread_mutex_unlock(&intern_mu);
    return key;
}

static const interned *by_key(uint64_t h, uint32_t key) {
    for (int i = 0; i < n_interned; i++)
        if (table[i].h == h && table[i].key == key) return &table[i];
    return NULL;
}

/* ---- stand-in for the Go drainer (drain.go) --------------------------------- */

static pthread_mutex_t drain_mu = PTHREAD_MUTEX_INITIALIZER;
/* drained[session][name][step] */
static unsigned long drained[2][NAMES][STEPS];
static unsigned long drained_scalars[2][NAMES];
static double scalar_sum;
static unsigned long trace_starts, trace_ends, bad_records, short_records;
/* Records read past a ring's everyday size (it stretched), and padding
 * records that wrapped a ring back before its end (the drainer caught up). */
static unsigned long stretched_records, early_wraps;

/* Trace spans of tick_handle (on the counter clock) as the drainer sees
 * them: each ring's open starts, converted as drain.go converts them, and
 * the latest end among each open span's children. */
static uint64_t tick_handle;
static unsigned long tick_spans, tick_refs, tick_bad, tick_segments;
#define TICK_RINGS 8
static struct tick_ring {
    const ct_ring *r;
    int depth;
    uint64_t last_start;
    uint64_t start[8], child_end[8];
    uint64_t start_ticks[8]; /* the counter's value at each open start (0: not on it) */
} tick_rings[TICK_RINGS];

/* ticks: the counter value of a compact record (CT_REC_BEGIN*, CT_REC_END*),
 * its short forms' deltas added up along the ring as drain.go does. */
static void tick_record(const ct_ring *r, const uint8_t *p, uint64_t ticks_now) {
    const ct_rec_hdr *h = (const ct_rec_hdr *)p;
    struct tick_ring *tr = NULL;
    for (int i = 0; i < TICK_RINGS && !tr; i++)
        if (tick_rings[i].r == r || !tick_rings[i].r) tr = &tick_rings[i];
    if (!tr) {
        tick_bad++;
        return;
    }
    tr->r = r;
    uint64_t t0 = ct__slot_of(tick_handle)->t0;
    if (h->type == CT_REC_SPAN_START || h->type == CT_REC_BEGIN || h->type == CT_REC_BEGIN_NEXT) {
        uint64_t start, ticks = 0;
        if (h->type != CT_REC_SPAN_START) {
            /* Compact: on the counter, its name in the ring's cache. */
            ticks = ticks_now;
            start = ct__tsc_ns(ticks) - t0;
            tick_refs++;
        } else {
            if (h->flags & CT_RECF_TICKS) ticks = h->ts;
            start = ticks ? ct__tsc_ns(ticks) - t0 : h->ts;
            if (h->flags & CT_RECF_NAME_REF) tick_refs++;
        }
        if (start < tr->last_start || (tr->depth && start < tr->start[tr->depth - 1]) || tr->depth == 8) {
            tick_bad++;
            return;
        }
        tr->last_start = start;
        tr->start[tr->depth] = start;
        tr->start_ticks[tr->depth] = ticks;
        tr->child_end[tr->depth] = start;
        tr->depth++;
        return;
    }
    if (tr->depth == 0) {
        tick_bad++;
        return;
    }
    tr->depth--;
    uint64_t start = tr->start[tr->depth], end;
    if (h->type == CT_REC_END || h->type == CT_REC_END_NEXT) {
        end = ct__tsc_ns(ticks_now) - t0;
    } else if (h->flags & CT_RECF_TICKS) {
        /* The start's ticks again (in parent), compared as ticks: converted
         * again, a span open across more segments than the clock keeps
         * would convert through another (drain.go takes the start it wrote). */
        end = ct__tsc_ns(h->ts) - t0;
        if (h->parent != tr->start_ticks[tr->depth]) tick_bad++;
    } else if (h->flags & CT_RECF_END_AT) {
        end = h->ts;
    } else {
        end = start + h->ts;
    }
    if (end < start || end < tr->child_end[tr->depth]) tick_bad++;
    if (tr->depth && end > tr->child_end[tr->depth - 1]) tr->child_end[tr->depth - 1] = end;
    tick_spans++;
}

static void drain_locked(void) {
    int dead = 0;
    /* As drain.go: a new counter-clock segment (here at every drain, not
     * every 20 ms) only as every ring is drained, so no record waits across
     * more than two of them. */
    if (__atomic_load_n(&tick_handle, __ATOMIC_ACQUIRE)) {
        ct__tsc_update(1);
        tick_segments++;
    }
    for (ct_ring *r = __atomic_load_n(&ct__rings, __ATOMIC_ACQUIRE); r; r = r->next) {
        uint64_t head = __atomic_load_n(&r->head, __ATOMIC_ACQUIRE);
        uint64_t tail = r->tail;
        ct__ring_prefault(r, head); /* as drain.go, racing the producer's stretch and release */
        while (tail < head) {
            uint8_t *p = r->data + (tail & (r->cap - 1));
            uint32_t size = *(uint32_t *)p;
            uint8_t type = p[4];
            if (size == 0 || size % 8 || size > r->cap) {
                bad_records++;
                tail = head;
                break;
            }
            uint64_t off = tail & (r->cap - 1);
            if (off >= r->soft) stretched_records++;
            /* A pad at the end of the address space is shorter than the
             * record that did not fit (at most half the everyday size). */
            if (type == CT_REC_PAD && size > r->soft / 2 + 2 * sizeof(ct_rec_hdr)) early_wraps++;
            /* As drain.go: every compact record moves the ring's last id
             * and counter value, whoever's session it is. */
            int compact = 1;
            uint32_t word = ((const ct_rec_short *)p)->word;
            if (type == CT_REC_BEGIN) {
                r->id_cur = ((const ct_rec_begin *)p)->id;
                r->ticks_cur = ((const ct_rec_begin *)p)->ticks;
            } else if (type == CT_REC_BEGIN_NEXT) {
                r->id_cur++;
                r->ticks_cur += word >> CT_SHORT_BEGIN_DELTA_SHIFT;
            } else if (type == CT_REC_END) {
                r->ticks_cur = ((const ct_rec_end *)p)->ticks;
            } else if (type == CT_REC_END_NEXT) {
                r->ticks_cur += word >> CT_SHORT_END_DELTA_SHIFT;
            } else {
                compact = 0;
            }
            if (type == CT_REC_BEGIN_NEXT || type == CT_REC_END_NEXT) {
                short_records++;
                if (size != sizeof(ct_rec_short)) bad_records++;
            }
            if (type == CT_REC_TRACE_SESSION) {
                r->trace_cur = ((ct_rec_agg *)p)->val;
            } else if (compact && tick_handle && r->trace_cur == tick_handle) {
                tick_record(r, p, r->ticks_cur);
            } else if (type == CT_REC_BEGIN || type == CT_REC_BEGIN_NEXT) {
                trace_starts++;
            } else if (type == CT_REC_END || type == CT_REC_END_NEXT) {
                trace_ends++;
            } else if (type == CT_REC_AGG_SESSION) {
                r->agg_cur = ((ct_rec_agg *)p)->val;
            } else if (type == CT_REC_AGG || type == CT_REC_AGG_SCALAR) {
                ct_rec_agg *a = (ct_rec_agg *)p;
                uint64_t h = r->agg_cur;
                int sess = h == agg_handles[0] ? 0 : h == agg_handles[1] ? 1 : -1;
                pthread_mutex_lock(&intern_mu);
                const interned *e = sess >= 0 ? by_key(h, a->type_key >> 8) : NULL;
                pthread_mutex_unlock(&intern_mu);
                int name = e ? atoi(e->name + 5) : -1; /* "name/NN" */
                int scalar = type == CT_REC_AGG_SCALAR;
                if (!e || name < 0 || name >= NAMES || scalar != (e->step == CT_AGG_SCALAR)) {
                    bad_records++;
                } else if (scalar) {
                    double v;
                    memcpy(&v, &a->val, sizeof v);
                    drained_scalars[sess][name]++;
                    scalar_sum += v;
                } else {
                    drained[sess][name][e->step]++;
                }
            } else if ((type == CT_REC_SPAN_START || type == CT_REC_SPAN_END) && tick_handle &&
                       ((ct_rec_hdr *)p)->session == tick_handle) {
                tick_record(r, p, 0);
            } else if (type == CT_REC_SPAN_START) {
                trace_starts++;
            } else if (type == CT_REC_SPAN_END) {
                trace_ends++;
            } else if (type != CT_REC_PAD) {
                bad_records++;
            }
            tail += size;
        }
        /* As drain.go: publish tail and wake a producer waiting for room. */
        ct__ring_consumed(r, tail);
        if (__atomic_load_n(&r->dead, __ATOMIC_ACQUIRE)) dead = 1;
    }
    if (dead) ct__ring_unlink_dead();
}

static void drain_rings(void) {
    pthread_mutex_lock(&drain_mu);
    drain_locked();
    pthread_mutex_unlock(&drain_mu);
}

/* ---- the producers ------------------------------------------------------------ */

static uint64_t trace_handle;
static unsigned long expected[THREADS][2][NAMES][STEPS];
static unsigned long expected_scalars[THREADS][2][NAMES];
static int stop_drainer;

/* Set once the drainer has seen a producer waiting for room. */
static int saw_waiting;

static int any_waiting(void) {
    for (ct_ring *r = __atomic_load_n(&ct__rings, __ATOMIC_ACQUIRE); r; r = r->next)
        if (__atomic_load_n(&r->waiting, __ATOMIC_SEQ_CST)) return 1;
    return 0;
}

static void *drainer(void *arg) {
    (void)arg;
    struct timespec ts = {0, 50000};
    /* Nothing is drained until a producer's ring is full and it waits for
     * room (each writes far more than its 64 KiB ring holds): every
     * producer past that point depends on ct__ring_consumed waking it. */
    while (!any_waiting()) {
        if (__atomic_load_n(&stop_drainer, __ATOMIC_ACQUIRE)) return NULL; /* the check on saw_waiting fails */
        nanosleep(&ts, NULL);
    }
    saw_waiting = 1;
    while (!__atomic_load_n(&stop_drainer, __ATOMIC_ACQUIRE)) {
        drain_rings();
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void *producer(void *arg) {
    int me = (int)(intptr_t)arg;
    char buf[32];
    unsigned seed = 1234567u * (unsigned)(me + 1);
    for (int i = 0; i < ITERS; i++) {
        seed = seed * 1103515245u + 12345u;
        int sess = (seed >> 8) & 1, name = (int)((seed >> 9) % NAMES), step = (int)((seed >> 20) % STEPS);
        uint64_t h = agg_handles[sess];
        /* The same buffer with new contents most of the time, a fresh heap
         * copy now and then. */
        snprintf(buf, sizeof buf, "name/%d", name);
        char *heap = ((seed >> 24) & 7) == 0 ? strdup(buf) : NULL;
        ct_span outer = 0, inner = 0, t = 0;
        ct_status st = ct__span_begin(h, heap ? heap : buf, CT_SPAN_FUNCTION, (ct_step)step, 0, &outer);
        if (st == CT_OK) st = ct__span_begin(h, "name/0", CT_SPAN_OP, CT_STEP_NONE, 0, &inner);
        if (st == CT_OK && (i % 16) == 0) st = ct__span_begin(trace_handle, "traced", CT_SPAN_FUNCTION, CT_STEP_NONE, 0, &t);
        if (st == CT_OK && t) st = ct__span_end(trace_handle, t);
        if (st == CT_OK && (i % 4) == 0) {
            int handled = 0;
            st = ct__agg_scalar(h, outer, heap ? heap : buf, 0.5, &handled);
            if (st == CT_OK && !handled) st = CT_ERR_INTERNAL;
            if (st == CT_OK) expected_scalars[me][sess][name]++;
        }
        if (st == CT_OK) st = ct__span_end(h, inner);
        if (st == CT_OK) st = ct__span_end(h, outer);
        free(heap);
        if (st != CT_OK) {
            CHECK(0, "thread %d iteration %d: %s", me, i, ct__errbuf());
            return NULL;
        }
        expected[me][sess][name][step]++;
        expected[me][sess][0][CT_STEP_NONE]++;
    }
    return NULL;
}

/* A CUDA launch on a thread with no span, as CUPTI's callback sees it,
 * racing the producers' trace spans: the session's main thread (the first
 * producer to open one) moves its innermost span while this reads it. */
static int stop_launcher;
static unsigned long launches, borrowed_launches;

static void *launcher(void *arg) {
    (void)arg;
    while (!__atomic_load_n(&stop_launcher, __ATOMIC_ACQUIRE)) {
        int borrowed = 0;
        uint64_t span = ct__launch_span(trace_handle, &borrowed);
        uint64_t issued = __atomic_load_n(&ct__slot_of(trace_handle)->next_span, __ATOMIC_RELAXED);
        CHECK(span >= 1 && span <= issued + 1, "launch attributed to s%llu, past the ids issued (%llu)",
              (unsigned long long)span, (unsigned long long)issued);
        CHECK(borrowed == (span != 1), "borrowed %d for s%llu", borrowed, (unsigned long long)span);
        launches++;
        borrowed_launches += (unsigned long)borrowed;
    }
    return NULL;
}

/* Tracer intervals on the trace session racing its spans (producers) and a
 * clock reader that must never see the clock run backwards. */
static int stop_tracer;
static unsigned long tracer_intervals, clock_reads;

static void *tracer(void *arg) {
    (void)arg;
    uint64_t last = 0;
    while (!__atomic_load_n(&stop_tracer, __ATOMIC_ACQUIRE)) {
        /* Begun as early as allowed: the clock reader checks the bound. Every
         * third interval hands out where the clock stands inside it, which a
         * read inside must give too, and never less than this thread saw. */
        uint64_t at = 0;
        int with_at = tracer_intervals % 3 == 2;
        ct_status st = with_at                   ? ct__tracer_begin_at(trace_handle, 100000, &at, "at")
                       : (tracer_intervals & 1) ? ct__tracer_begin_earlier(trace_handle, 100000)
                                                : ct__tracer_begin(trace_handle);
        if (st == CT_OK && with_at) {
            uint64_t inside = ct__session_now(trace_handle);
            CHECK(inside == at && at >= last, "ct__tracer_begin_at handed out %llu; inside %llu, before %llu",
                  (unsigned long long)at, (unsigned long long)inside, (unsigned long long)last);
            last = inside;
        }
        if (st == CT_OK) st = ct__tracer_end(trace_handle);
        if (st == CT_OK && tracer_intervals % 5 == 4) st = ct__tracer_exclude_earlier(trace_handle, 100000);
        if (st != CT_OK) {
            CHECK(0, "tracer interval: %s", ct__errbuf());
            return NULL;
        }
        tracer_intervals++;
    }
    return NULL;
}

static void *clock_reader(void *arg) {
    (void)arg;
    uint64_t last = 0;
    while (!__atomic_load_n(&stop_tracer, __ATOMIC_ACQUIRE)) {
        uint64_t now = ct__session_now(trace_handle);
        CHECK(now >= last, "the session clock went back from %llu to %llu", (unsigned long long)last,
              (unsigned long long)now);
        last = now;
        clock_reads++;
    }
    return NULL;
}

/* A session's first tracer interval racing a reader that was already past
 * the "no interval yet" check: the reader must not hand out a value above the
 * one the interval froze the clock at. Fresh sessions, many times. */
static uint64_t first_handle;
static int first_stop;
static unsigned long first_backwards;

static void *first_reader(void *arg) {
    (void)arg;
    uint64_t last = 0;
    while (!__atomic_load_n(&first_stop, __ATOMIC_ACQUIRE)) {
        uint64_t now = ct__session_now(__atomic_load_n(&first_handle, __ATOMIC_ACQUIRE));
        if (now < last) first_backwards++;
        last = now;
    }
    return NULL;
}

static void first_intervals(int sessions) {
    for (int i = 0; i < sessions; i++) {
        uint64_t h = ct__slot_alloc();
        __atomic_store_n(&first_handle, h, __ATOMIC_RELEASE);
        __atomic_store_n(&first_stop, 0, __ATOMIC_RELEASE);
        pthread_t r;
        pthread_create(&r, NULL, first_reader, NULL);
        for (volatile int k = 0; k < 2000 + (i % 7) * 300; k++) {
        }
        CHECK(ct__tracer_begin_earlier(h, 1000000) == CT_OK && ct__tracer_end(h) == CT_OK, "first interval: %s",
              ct__errbuf());
        for (volatile int k = 0; k < 2000; k++) {
        }
        __atomic_store_n(&first_stop, 1, __ATOMIC_RELEASE);
        pthread_join(r, NULL);
        ct__slot_release(h);
    }
    CHECK(first_backwards == 0, "the clock went back %lu times around a session's first tracer interval",
          first_backwards);
}

/* Nested trace spans on the counter clock while drains publish segments and
 * another thread reads the converted clock: every record checked by
 * tick_record. */
static int tick_stop;
static unsigned long tick_backwards;

/* Three nested pairs an iteration, 48 bytes in the 8-byte records: enough
 * for a thread to fill its 64 KiB ring's whole address space (1 MiB) and
 * wait for the drainer. */
#define TICK_ITERS 60000

static void *tick_spanner(void *arg) {
    (void)arg;
    for (int i = 0; i < TICK_ITERS; i++) {
        ct_span a, b, c;
        ct_status st = ct__span_begin(tick_handle, "outer", CT_SPAN_FUNCTION, CT_STEP_NONE, 0, &a);
        if (st == CT_OK) st = ct__span_begin(tick_handle, "middle", CT_SPAN_FUNCTION, CT_STEP_NONE, 0, &b);
        if (st == CT_OK) st = ct__span_begin(tick_handle, "inner", CT_SPAN_OP, CT_STEP_NONE, 0, &c);
        if (st == CT_OK) st = ct__span_end(tick_handle, c);
        if (st == CT_OK) st = ct__span_end(tick_handle, b);
        if (st == CT_OK) st = ct__span_end(tick_handle, a);
        if (st != CT_OK) {
            CHECK(0, "counter-clock spans: %s", ct__errbuf());
            return NULL;
        }
    }
    return NULL;
}

/* Reads the converted counter while drains publish segments: it must never
 * go back. */
static void *tick_publisher(void *arg) {
    (void)arg;
    uint64_t last = 0;
    while (!__atomic_load_n(&tick_stop, __ATOMIC_ACQUIRE)) {
        uint64_t now = ct__tsc_now();
        if (now < last) tick_backwards++;
        last = now;
    }
    return NULL;
}

static void counter_clock_spans(void) {
    if (!ct__trace_counter()) {
        printf("fastpath_sanitize: no constant-rate counter here; the counter-clock phase is skipped\n");
        return;
    }
    uint64_t h = ct__slot_alloc();
    CHECK(h && ct__slot_of(h)->tsc, "a trace session on the counter clock");
    __atomic_store_n(&tick_handle, h, __ATOMIC_RELEASE);
    __atomic_store_n(&stop_drainer, 0, __ATOMIC_RELEASE);
    pthread_t d, pub, sp[2];
    pthread_create(&d, NULL, drainer, NULL);
    pthread_create(&pub, NULL, tick_publisher, NULL);
    for (int i = 0; i < 2; i++) pthread_create(&sp[i], NULL, tick_spanner, NULL);
    for (int i = 0; i < 2; i++) pthread_join(sp[i], NULL);
    __atomic_store_n(&tick_stop, 1, __ATOMIC_RELEASE);
    pthread_join(pub, NULL);
    __atomic_store_n(&stop_drainer, 1, __ATOMIC_RELEASE);
    pthread_join(d, NULL);
    drain_rings();
    CHECK(tick_spans == 2ul * TICK_ITERS * 3 && tick_bad == 0,
          "counter clock: %lu spans checked (want %lu), %lu out of order or outside their parents", tick_spans,
          2ul * TICK_ITERS * 3, tick_bad);
    CHECK(short_records > 0, "no span took the 8-byte records");
    CHECK(tick_refs >= 2ul * 3 * (TICK_ITERS - 1), "counter clock: only %lu span names came from the name cache",
          tick_refs);
    CHECK(tick_segments > 0 && tick_backwards == 0, "counter clock: %lu segments, went back %lu times",
          tick_segments, tick_backwards);
    ct__slot_release(h);
    drain_rings();
}

/* A ring stretches while nobody drains it and wraps back to its start once
 * the drainer has caught up: one thread, drained by hand. The stretcher
 * writes span pairs past one and a half everyday sizes (it must never wait:
 * the main thread watches, and drains to unblock it and fail if it does),
 * the main thread drains, and the stretcher writes on until its ring wraps. */
static int stretch_phase; /* 1: filling, 2: drained (write on), 3: done */
static unsigned long stretch_waits, stretch_pairs;
static uint64_t stretch_reached, stretch_wrapped_at;

static void *stretcher(void *arg) {
    uint64_t h = *(const uint64_t *)arg;
    ct_ring *r = NULL;
    for (int phase = 1; phase <= 2; phase++) {
        while (__atomic_load_n(&stretch_phase, __ATOMIC_ACQUIRE) != phase) nanosleep(&(struct timespec){0, 100000}, NULL);
        for (;;) {
            ct_span sp;
            if (ct__span_begin(h, "stretch", CT_SPAN_FUNCTION, CT_STEP_NONE, 0, &sp) != CT_OK ||
                ct__span_end(h, sp) != CT_OK) {
                CHECK(0, "stretcher: %s", ct__errbuf());
                break;
            }
            stretch_pairs++;
            r = ct__own_ring();
            uint64_t off = r->head & (r->cap - 1);
            if (phase == 1 && off >= r->soft + r->soft / 2) {
                stretch_reached = off;
                break;
            }
            if (phase == 2 && off < r->soft) {
                stretch_wrapped_at = r->head;
                break;
            }
            if (phase == 2 && stretch_pairs > (unsigned long)r->cap) {
                CHECK(0, "stretcher: the drained ring never wrapped back (at offset %llu)", (unsigned long long)off);
                break;
            }
        }
        __atomic_store_n(&stretch_phase, phase == 1 ? 11 : 3, __ATOMIC_RELEASE);
    }
    return NULL;
}

static void stretch_and_wrap(void) {
    unsigned long wraps_before = early_wraps;
    uint64_t h = ct__slot_alloc();
    pthread_t t;
    pthread_create(&t, NULL, stretcher, &h);
    for (int phase = 1; phase <= 2; phase++) {
        __atomic_store_n(&stretch_phase, phase, __ATOMIC_RELEASE);
        int done = phase == 1 ? 11 : 3;
        while (__atomic_load_n(&stretch_phase, __ATOMIC_ACQUIRE) != done) {
            if (any_waiting()) {
                stretch_waits++;
                drain_rings();
            }
            nanosleep(&(struct timespec){0, 100000}, NULL);
        }
        drain_rings();
    }
    pthread_join(t, NULL);
    CHECK(stretch_waits == 0, "stretch: the producer waited %lu times with room to stretch into", stretch_waits);
    CHECK(stretch_reached > 0 && stretch_wrapped_at > 0,
          "stretch: reached offset %llu undrained, wrapped back at %llu once drained",
          (unsigned long long)stretch_reached, (unsigned long long)stretch_wrapped_at);
    CHECK(trace_starts == trace_ends && trace_starts == stretch_pairs, "stretch: %lu pairs made, %lu/%lu drained",
          stretch_pairs, trace_starts, trace_ends);
    CHECK(early_wraps > wraps_before, "stretch: the drained ring wrapped back at its end, not early");
    ct__slot_release(h);
}

static void *leaver(void *arg) {
    (void)arg;
    ct_span sp;
    ct_status st = ct__span_begin(agg_handles[0], "name/1", CT_SPAN_FUNCTION, CT_STEP_NONE, 0, &sp);
    CHECK(st == CT_OK, "leaver: %s", ct__errbuf());
    return NULL; /* exits inside the span */
}

static uint64_t open_agg(void) {
    uint64_t h = ct__slot_alloc();
    ct_slot *s = ct__slot_of(h);
    __atomic_store_n(&s->agg, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&s->agg_on, 1, __ATOMIC_RELEASE);
    return h;
}

int main(void) {
    ct__ticks_init();
    agg_handles[0] = open_agg();
    agg_handles[1] = open_agg();
    trace_handle = ct__slot_alloc();
    CHECK(agg_handles[0] && agg_handles[1] && trace_handle, "slots");

    pthread_t d, th[THREADS], lv, la, tr, cr;
    pthread_create(&d, NULL, drainer, NULL);
    ct__track_main_thread(trace_handle, 1); /* as the CUPTI collector does with "main_thread" */
    pthread_create(&la, NULL, launcher, NULL);
    pthread_create(&tr, NULL, tracer, NULL);
    pthread_create(&cr, NULL, clock_reader, NULL);
    for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, producer, (void *)(intptr_t)i);
    pthread_create(&lv, NULL, leaver, NULL);
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    pthread_join(lv, NULL);
    __atomic_store_n(&stop_launcher, 1, __ATOMIC_RELEASE);
    pthread_join(la, NULL);
    __atomic_store_n(&stop_tracer, 1, __ATOMIC_RELEASE);
    pthread_join(tr, NULL);
    pthread_join(cr, NULL);
    CHECK(tracer_intervals > 0 && clock_reads > 0, "%lu tracer intervals, %lu clock reads", tracer_intervals,
          clock_reads);
    CHECK(launches > 0 && borrowed_launches > 0, "%lu launches, %lu on the main thread's span", launches,
          borrowed_launches);
    __atomic_store_n(&stop_drainer, 1, __ATOMIC_RELEASE);
    pthread_join(d, NULL);
    drain_rings();
    drain_rings(); /* unlinks the rings of exited threads */

    unsigned long mismatches = 0, total = 0;
    for (int s = 0; s < 2; s++)
        for (int n = 0; n < NAMES; n++)
            for (int st = 0; st < STEPS; st++) {
                unsigned long want = 0;
                for (int t = 0; t < THREADS; t++) want += expected[t][s][n][st];
                total += drained[s][n][st];
                if (want != drained[s][n][st]) {
                    if (mismatches < 5)
                        fprintf(stderr, "session %d name/%d step %d: drained %lu, want %lu\n", s, n, st,
                                drained[s][n][st], want);
                    mismatches++;
                }
            }
    CHECK(mismatches == 0, "%lu (session, name, step) counts differ", mismatches);
    CHECK(total == 2ul * THREADS * ITERS, "drained %lu aggregate records, want %lu", total, 2ul * THREADS * ITERS);
    unsigned long scalars = 0, want_scalars = 0;
    for (int sn = 0; sn < 2; sn++)
        for (int n = 0; n < NAMES; n++) {
            unsigned long want = 0;
            for (int t = 0; t < THREADS; t++) want += expected_scalars[t][sn][n];
            want_scalars += want;
            scalars += drained_scalars[sn][n];
            CHECK(want == drained_scalars[sn][n], "scalars session %d name/%d: drained %lu, want %lu", sn, n,
                  drained_scalars[sn][n], want);
        }
    CHECK(scalars == want_scalars && scalar_sum == 0.5 * (double)scalars, "scalars: %lu drained, sum %g",
          scalars, scalar_sum);
    CHECK(saw_waiting, "no producer ever waited for room");
    CHECK(stretched_records > 0, "rings: no record read past a ring's everyday size (no ring stretched)");
    CHECK(bad_records == 0, "%lu malformed records", bad_records);
    CHECK(trace_starts == trace_ends && trace_starts == (unsigned long)THREADS * ((ITERS + 15) / 16),
          "trace records: %lu starts, %lu ends", trace_starts, trace_ends);
    /* Interning happened once per (thread, session, name, step) at most,
     * not once per span. */
    CHECK(intern_calls <= (unsigned long)(THREADS + 1) * 2 * NAMES * (STEPS + 1), "%lu intern calls", intern_calls);

    int64_t tids[4];
    uint32_t counts[4];
    int threads = 0;
    uint64_t open = ct__open_spans(agg_handles[0], tids, counts, 4, &threads);
    CHECK(open == 1 && threads == 1, "open spans after the leaver exited: %llu on %d threads",
          (unsigned long long)open, threads);

    /* The session ends: the exited thread's ring can go. */
    ct__slot_release(agg_handles[0]);
    ct__slot_release(agg_handles[1]);
    ct__slot_release(trace_handle);
    first_intervals(2000);
    counter_clock_spans();
    trace_starts = trace_ends = 0;
    stretch_and_wrap();
    ct__ring_unlink_dead();
    int rings = 0;
    for (ct_ring *r = ct__rings; r; r = r->next) rings++;
    CHECK(rings == 0, "%d rings left, want 0 (every thread that made spans has exited)", rings);

    printf("fastpath_sanitize: %lu aggregate records over %d threads, %lu intern calls, %lu launches (%lu on the main thread's span), %lu tracer intervals, %lu clock reads, %lu counter-clock spans over %lu segments, %lu records past a ring's everyday size, %lu early wraps, %d failure(s)\n", total,
           THREADS, intern_calls, launches, borrowed_launches, tracer_intervals, clock_reads, tick_spans, tick_segments,
           stretched_records, early_wraps, failures);
    return failures != 0;
}
