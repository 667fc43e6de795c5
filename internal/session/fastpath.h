/* The per-event path of candle-trace, in C.
 *
 * Why C: a C->Go call through cgo costs about 70 ns, so a span begin+end that
 * crossed into Go twice could never meet the 40 ns budget. Span begin/end stay
 * here: a registry lookup, a per-thread span stack, a clock read (the raw
 * cycle counter where usable, ticks.h) and a record in a per-thread ring (a
 * name the thread passed before is not copied again). A Go goroutine drains
 * the rings, converts counter values, encodes JSON and writes the file (see
 * drain.go).
 *
 * Everything else (ops, tensors, memory, ...) is rare enough to go through Go.
 */
#ifndef CT_FASTPATH_H
#define CT_FASTPATH_H

#include <stddef.h>
#include <stdint.h>

#include "candle_trace.h"

/* The slots' and rings' shared fields: acquire loads, release stores. */
#define LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

#define CT_MAX_SESSIONS 256          /* live sessions at once */
#define CT_TLS_SESSIONS 8            /* sessions one thread may hold spans in */
#define CT_ERR_CAP 1024              /* bytes of ct_last_error() */
#define CT_POISON_CAP 512
#define CT_REARM_PATH_CAP 1024       /* the longest path a re-arm in C takes (rearm.c) */

/* Session slot states. REARMED: a flight recorder's session replaced by
 * ct_reopen in C alone (rearm.c); its handle is no longer valid, and Go
 * discards it when it next runs. */
enum { CT_SLOT_FREE = 0, CT_SLOT_OPEN = 1, CT_SLOT_FINISHING = 2, CT_SLOT_POISONED = 3, CT_SLOT_REARMED = 4 };

typedef struct ct_slot {
    uint64_t handle;      /* 0 = free */
    uint32_t state;
    uint32_t measured;    /* 1 once the measured region exists */
    uint64_t next_span;   /* last span id handed out */
    uint32_t agg;         /* 1: an aggregate session (spans take the aggregate path) */
    uint32_t agg_on;      /* aggregate sessions: statistics switched on */
    uint32_t track_main;  /* 1 while a collector wants measure_top kept (ct__track_main_thread) */
    uint64_t t0;                  /* the clock (CLOCK_MONOTONIC ns, or its counter estimate) at open */
    /* The tracer's own time (ct_tracer_begin/ct_tracer_end): the session
     * clock stands still while any thread is inside it. A seqlock: odd
     * while a writer changes the fields after it; 0 until the first
     * interval, so that a session that never has one reads its clock as
     * before. */
    uint64_t tracer_seq;
    uint64_t tracer_total;        /* ns in closed tracer intervals */
    uint64_t tracer_since;        /* CLOCK_MONOTONIC ns the open interval began at */
    uint32_t tracer_depth;        /* intervals open, over all threads */
    uint32_t tsc;                 /* 1: the clock is the converted counter (ticks.h), else CLOCK_MONOTONIC */
    /* The highest clock value handed out since the first interval: an
     * interval that begins earlier than its call (ct_tracer_begin_earlier)
     * never goes back past it, so the clock never runs backwards. */
    uint64_t tracer_hw;
    uint64_t tracer_estimated;    /* ns of tracer time begun earlier than its call */
    uint64_t measure_id;          /* the measured span, once begun */
    uint64_t measure_tracer0;     /* tracer ns excluded before it began */
    /* The session's main thread (its ring, compared, never followed): the
     * one that began the measured region, else the first to open a span
     * while tracked; and, while track_main, its innermost open span here (0:
     * none), on a cache line of its own since that thread writes it at every
     * span. Device work launched from a thread with no open span may be
     * attributed to that span (ct__launch_span). */
    const void *measure_ring;
    uint64_t measure_top __attribute__((aligned(64)));
    char measure_pad[56];
    char poison[CT_POISON_CAP];   /* why the session is poisoned */
    /* ct_reopen in C alone (rearm.c), under the registry's lock. rearm_ok,
     * rearm_min_step and rearm_dir are set by Go once a buffered trace
     * session can take calls (rearm_ok cleared while it must not: device
     * collectors, a session Go is still opening). A session re-armed in C
     * has rearm_root (the session Go holds, which it replaces) and what Go
     * needs to open it in Go's tables later (step, tid, wall clock, path);
     * the session Go holds has rearm_next (the one in its place now). */
    uint32_t rearm_ok;
    uint32_t rearm_measured_root; /* the run's root is its measured region (measured from the start) */
    uint64_t rearm_min_step;
    uint64_t rearm_root;
    uint64_t rearm_next;
    uint64_t rearm_step;
    int64_t rearm_tid;
    uint64_t rearm_wall_ns;
    char rearm_dir[CT_REARM_PATH_CAP];
    char rearm_path[CT_REARM_PATH_CAP];
} ct_slot;

typedef struct ct_frame {
    uint64_t id;
    uint64_t start;   /* session ns; aggregate sessions: ticks, CT_UNTIMED when off */
    uint32_t key;     /* aggregate sessions: the span's statistics key */
    uint32_t ticks;   /* trace sessions: 1 when start is a raw counter value (CT_RECF_TICKS) */
} ct_frame;

#define CT_UNTIMED UINT64_MAX

struct ct_agg_keys; /* aggkeys.c: a thread's span name -> key cache */

/* What one thread holds in one session: its span stack and a block of ids.
 * It lives in the thread's ring (below), not in TLS, so that ct_finish can
 * see from another thread whether spans are still open, also on a thread
 * that has exited. */
typedef struct ct_tls_sess {
    uint64_t handle;
    uint64_t next_id, end_id; /* this thread's block of span ids: [next_id, end_id) */
    uint32_t depth;           /* written by the owner, read by ct__open_spans */
    uint32_t cap;
    ct_frame *stack;
    struct ct_agg_keys *keys; /* aggregate sessions only */
} ct_tls_sess;

/* A single-producer single-consumer byte ring: the owning thread writes, the
 * Go drainer (under its mutex) reads. head/tail count bytes ever written/read.
 * A producer that finds its ring full never drains it itself (that would run
 * the Go encoder and the file write on the application's thread): it sets
 * waiting, wakes the drainer and sleeps on a futex on room_seq, which the
 * drainer bumps after moving tail while waiting is set (ct__ring_consumed).
 *
 * The ring stretches under a burst: its address space is cap bytes (16
 * times its everyday size, soft), mapped but touched only as far as the
 * producer writes. While the drainer keeps up, the producer wraps early, at
 * soft (a padding record covers the rest up to cap, never touched), so
 * only soft bytes are ever resident; while the drainer lags, it writes on
 * past soft into pages not touched before, and waits only once all of cap
 * is full; once the drainer has caught up (the producer wraps back), the
 * pages past three times soft go back to the kernel. Trace spans stretch the ring;
 * aggregate records never do (they fold fast, and always-on sessions keep
 * their memory flat). */
/* A thread's last span names, by address: a begin whose name is the one
 * cached at its slot (same address, same bytes) neither checks nor copies it;
 * its record refers to the slot, which the drainer keeps per ring. Names
 * longer than CT_NAME_CACHE_MAX bytes always travel inline. */
#define CT_NAME_SLOTS 64
#define CT_NAME_CACHE_MAX 256

typedef struct ct_name_ent {
    const char *ptr; /* NULL: empty */
    char *copy;      /* the bytes, NUL-terminated */
    uint32_t len, cap;
} ct_name_ent;

typedef struct ct_ring {
    uint64_t head;
    char pad0[56];
    uint64_t tail;
    uint32_t waiting;     /* producer: 1 while it waits for room */
    uint32_t room_seq;    /* consumer: bumped (and futex-woken) when room appears for a waiter */
    char pad1[48];
    uint32_t dead;        /* owning thread exited */
    uint32_t cap;                 /* bytes of address space, a power of two */
    uint32_t soft;                /* everyday size: where the producer wraps while the drainer keeps up */
    int64_t tid;
    uint64_t wake_mark;           /* head when the drainer was last woken (producer only) */
    uint64_t limit;               /* producer: offset up to which the fast path writes before looking again */
    uint64_t reach;               /* producer: the furthest limit since stretched pages were last released */
    uint64_t faulted;             /* drainer sets, producer clears: the furthest page it faulted in ahead since */
    uint64_t waits;               /* producer: how often it waited for room (tests, benchmarks) */
    struct ct_ring *next;
    uint8_t *data;
    uint64_t agg_last;            /* producer: session of the last aggregate record */
    uint64_t agg_cur;             /* consumer (Go): the same, as read so far */
    uint64_t trace_last;          /* producer: session of the last compact trace record */
    uint64_t trace_cur;           /* consumer (Go): the same, as read so far */
    uint64_t last_id, last_ticks; /* producer: the id of the last compact begin, the counter of the last compact record */
    uint64_t id_cur, ticks_cur;   /* consumer (Go): the same, as read so far */
    ct_tls_sess sess[CT_TLS_SESSIONS];
    ct_name_ent names[CT_NAME_SLOTS]; /* producer only */
} ct_ring;

/* Fields read by both C and Go are accessed with __atomic builtins in C and
 * sync/atomic in Go (cgo cannot see _Atomic types). */

/* Ring records are 8-byte aligned; a record never wraps (a PAD fills the end). */
enum { CT_REC_PAD = 0, CT_REC_SPAN_START = 1, CT_REC_SPAN_END = 2, CT_REC_AGG_SESSION = 3, CT_REC_AGG = 4,
       CT_REC_AGG_SCALAR = 5, CT_REC_TRACE_SESSION = 6, CT_REC_BEGIN = 7, CT_REC_END = 8,
       CT_REC_BEGIN_NEXT = 9, CT_REC_END_NEXT = 10 };

typedef struct ct_rec_hdr {
    uint32_t size;      /* whole record incl. header and name, multiple of 8 */
    uint8_t type;
    uint8_t kind;
    uint8_t step;
    uint8_t measured;   /* span_end: 1 for the measured span's */
    uint64_t session;
    uint64_t id;
    uint64_t parent;    /* span_start; span_end of the measured span: tracer ns inside it */
    uint64_t ts;        /* span_start: start_ns; span_end: duration_ns */
    uint32_t name_len;  /* span_start only; name bytes follow the header (none with CT_RECF_NAME_REF) */
    uint32_t flags;     /* CT_RECF_*; bits 8-15: the name slot of NAME_DEF / NAME_REF */
} ct_rec_hdr;

/* ct_rec_hdr.flags. TICKS: ts is a raw counter value (ticks.h) the drainer
 * converts: a span_start's start, a span_end's end, whose parent field then
 * holds its start (both ends on the counter, so no tracer time inside).
 * NAME_DEF: the name bytes that follow become the ring's name at the slot;
 * NAME_REF: the name is the ring's name at the slot, no bytes follow. */
#define CT_RECF_TICKS 1u
#define CT_RECF_NAME_DEF 2u
#define CT_RECF_NAME_REF 4u
/* span_end: ts is the end on the session clock, not the duration (its start
 * was on the counter: the drainer subtracts the start it wrote). */
#define CT_RECF_END_AT 8u

/* The compact form of a trace span's records, what nearly every span
 * writes: 24 bytes for a begin, 16 for an end, where ct_rec_hdr takes 48
 * each. A span takes it when its name is in the ring's name cache (a
 * NAME_REF begin), both ends are on the counter and it is not the measured
 * span; anything else takes ct_rec_hdr. What the compact records leave out
 * the drainer knows: the session is the ring's last CT_REC_TRACE_SESSION's
 * (a ct_rec_agg whose val is the handle, written when it changes: r->
 * trace_last), a begin's parent is the thread's innermost open span in that
 * session (else the root, s1), and an end ends that innermost span, whose
 * start the drainer kept. */
typedef struct ct_rec_begin {
    uint32_t size;  /* sizeof(ct_rec_begin) */
    uint8_t type;   /* CT_REC_BEGIN */
    uint8_t kind;
    uint8_t step;
    uint8_t slot;   /* the name's slot in the ring's name cache */
    uint64_t id;
    uint64_t ticks; /* the start, a raw counter value */
} ct_rec_begin;

typedef struct ct_rec_end {
    uint32_t size;  /* sizeof(ct_rec_end) */
    uint8_t type;   /* CT_REC_END */
    uint8_t pad[3];
    uint64_t ticks; /* the end, a raw counter value */
} ct_rec_end;

/* The shortest form, 8 bytes, of a compact begin or end: what a burst of
 * spans writes (40 bytes a span pair take 16), so that a burst the drainer
 * cannot keep up with stretches its ring into a third as many fresh pages,
 * each a page fault on the program's thread. Its counter value is a delta
 * from the ring's last compact record's (last_ticks), and a begin's id is
 * the ring's last compact begin's plus one (last_id); the drainer follows
 * both along the ring (id_cur, ticks_cur), whatever session each record is
 * of. word, by bits from the lowest (little-endian: type is byte 4 as in
 * every record):
 *   CT_REC_BEGIN_NEXT: type 0-7, kind 8-9, step 10-11, name slot 12-17,
 *                      delta 18-31 (under 2^14 ticks, ~6 us, since the last record);
 *   CT_REC_END_NEXT:   type 0-7, delta 8-31 (under 2^24 ticks, ~7 ms).
 * A record that does not fit takes ct_rec_begin or ct_rec_end. */
typedef struct ct_rec_short {
    uint32_t size; /* sizeof(ct_rec_short) */
    uint32_t word;
} ct_rec_short;

/* Where ct_rec_short.word's fields start (bits), one place for the producer
 * (fastpath.c) and the drainers (drain.go, tests/c/fastpath_sanitize.c). */
#define CT_SHORT_KIND_SHIFT 8
#define CT_SHORT_STEP_SHIFT 10
#define CT_SHORT_SLOT_SHIFT 12
#define CT_SHORT_BEGIN_DELTA_SHIFT 18
#define CT_SHORT_END_DELTA_SHIFT 8
#define CT_BEGIN_NEXT_DELTA_BITS (32 - CT_SHORT_BEGIN_DELTA_SHIFT)
#define CT_END_NEXT_DELTA_BITS (32 - CT_SHORT_END_DELTA_SHIFT)

/* Aggregate sessions write 16 bytes per span end and no start record.
 * CT_REC_AGG: type_key = type | key << 8, val = duration in ticks (see
 * ticks.h). CT_REC_AGG_SCALAR: the same with a scalar key, val = the bits of
 * the double. CT_REC_AGG_SESSION: val = the session the following aggregate
 * records of this ring belong to, written when it changes. Only the first
 * eight bytes match ct_rec_hdr. */
typedef struct ct_rec_agg {
    uint32_t size;
    uint32_t type_key;
    uint64_t val;
} ct_rec_agg;

#define CT_AGG_MAX_KEY 0xFFFFFFu  /* keys must fit 24 bits */

extern ct_slot ct__slots[CT_MAX_SESSIONS];
extern ct_ring *ct__rings;
extern int ct__forked;
extern int ct__wake_fd;       /* eventfd the drainer blocks on; -1 until the first open */
int ct__wake_fd_open(void);

/* Registry (used by Go). */
uint64_t ct__slot_alloc(void);            /* 0 when full */
/* The same with the registry's lock held (rearm.c); ct__slot_free_locked
 * gives slot s back. */
uint64_t ct__slot_alloc_locked(void);
void ct__slot_free_locked(ct_slot *s);
void ct__slots_lock(void);
void ct__slots_unlock(void);
void ct__slot_release(uint64_t handle);
ct_slot *ct__slot_of(uint64_t handle);    /* NULL when not live */
uint64_t ct__clock_ns(void);
uint64_t ct__session_now(uint64_t handle);
/* The tracer's own time (ct_tracer_begin/end/ns in the header). begin/end
 * return CT_OK or fail with the message; tracer_ns is 0 on a bad handle. */
ct_status ct__tracer_begin(ct_session h);
ct_status ct__tracer_begin_earlier(ct_session h, uint64_t earlier_ns);
/* Both of the above, and ct_tracer_begin_at: *at (may be NULL) gets the value
 * the clock stands at inside the interval; fn names the caller in errors. */
ct_status ct__tracer_begin_at(ct_session h, uint64_t earlier_ns, uint64_t *at, const char *fn);
ct_status ct__tracer_exclude_earlier(ct_session h, uint64_t earlier_ns);
uint64_t ct__tracer_estimated_ns(ct_session h);
uint64_t ct__slot_tracer_estimated(ct_slot *s);
ct_status ct__tracer_end(ct_session h);
uint64_t ct__tracer_ns(ct_session h);
/* The clock of slot s (session ns) and, in *excluded (may be NULL), the
 * tracer ns left out of it so far; for Go, which holds its slot. */
uint64_t ct__slot_now(ct_slot *s, uint64_t *excluded);
int64_t ct__gettid(void);

/* Errors: the calling thread's message buffer. */
char *ct__errbuf(void);
ct_status ct__fail(ct_status st, const char *fmt, ...);

/* Argument checks shared with cmd/libtrace's shims. */
/* 0 ok (with the length, and whether it is empty or ASCII whitespace only),
 * -1 invalid UTF-8. */
int ct__utf8_len(const char *s, size_t *len, int *blank);

/* A span name or scalar label (what): valid UTF-8, not blank, at most 1 MiB.
 * CT_OK with its length in *len, else CT_ERR_INVALID_ARGUMENT and the
 * message. Shared by the trace and aggregate paths. */
static inline ct_status ct__check_text(const char *fn, const char *what, const char *s, size_t *len) {
    int blank;
    if (ct__utf8_len(s, len, &blank) != 0)
        return ct__fail(CT_ERR_INVALID_ARGUMENT, "%s: %s is not valid UTF-8", fn, what);
    if (blank) return ct__fail(CT_ERR_INVALID_ARGUMENT, "%s: %s is empty", fn, what);
    if (*len > (1u << 20)) return ct__fail(CT_ERR_INVALID_ARGUMENT, "%s: %s is longer than 1 MiB", fn, what);
    return CT_OK;
}

/* ct_reopen in C alone (rearm.c): a flight recorder's next update without
 * a call into Go. CT_OK with the new handle in *out; CT_REARM_GO when it
 * must go the Go way (which also reports every error): h not an open
 * buffered session Go has marked re-armable, a path outside the folder of
 * the session's path or one that exists (lstat), a step below the run's
 * lowest, a full registry. */
#define CT_REARM_GO (-1)
int ct__rearm(ct_session h, const char *path, uint64_t step, ct_session *out);

/* What Go needs to take over a session re-armed in C. */
typedef struct ct_rearm_claim {
    uint64_t root;  /* the session Go holds, to discard */
    uint64_t next;  /* the session re-armed in its place, to open in Go */
    uint64_t step;
    int64_t tid;
    uint64_t wall_ns;
    char path[CT_REARM_PATH_CAP];
} ct_rearm_claim;

/* For Go, under its lock: when h is a session re-armed in C, or one Go
 * holds that was re-armed since, fills *c and returns 1 (next is Go's from
 * then on, not re-armable until Go sets rearm_ok again); else 0. */
int ct__rearm_claim(uint64_t h, ct_rearm_claim *c);
/* Go marks slot s re-armable (or not) with the run's lowest capture step,
 * whether its root span is the measured region and the folder its path was
 * found usable in. */
void ct__rearm_allow(ct_slot *s, int ok, uint64_t min_step, int measured_root, const char *dir);

/* The fast path proper. */
ct_status ct__span_begin(ct_session h, const char *name, ct_span_kind kind, ct_step step,
                         int measured, ct_span *out);
ct_status ct__span_end(ct_session h, ct_span span);
ct_status ct__session_usable(ct_session h, const char *fn);

/* ct_record_scalar of an aggregate session, without entering Go: the label's
 * key from the thread's cache, 16 bytes into the ring. *handled is 0 when h
 * is not a live aggregate session (the caller takes the Go path, which
 * reports a bad handle as usual). */
ct_status ct__agg_scalar(ct_session h, ct_span span, const char *label, double value, int *handled);

/* The calling thread's innermost open span in session h; 1 (the root) when
 * the thread has none there or h is not live. Reads only the calling thread's
 * own span stack: any thread may call it, at any time (the CUPTI collector
 * calls it from CUDA API callbacks on the launching thread). */
uint64_t ct__innermost_span(ct_session h);

/* The span device work launched now from the calling thread belongs to: its
 * innermost open span in h; when it has none, the span innermost at this
 * moment on the session's main thread (the one that began the measured
 * region, else the first to open a span; *borrowed set to 1: PyTorch's
 * autograd launches backward kernels from its own device thread while the
 * main thread waits inside backward); else 1. Lock-free, callable from any
 * thread at any time (CUPTI's callbacks). */
uint64_t ct__launch_span(ct_session h, int *borrowed);

/* Starts (on = 1) or stops keeping the main thread's innermost span for
 * ct__launch_span. Off, span begin and end pay one load and a branch for it.
 * Started while the main thread has spans open, it is known from that
 * thread's next span begin or end. */
void ct__track_main_thread(ct_session h, int on);

/* The calling thread's ring; NULL before its first span. */
ct_ring *ct__own_ring(void);

/* How many bytes of [from, to) of r's address space are resident (mincore;
 * page-aligned bounds; tests). */
uint64_t ct__ring_resident_in(const ct_ring *r, uint64_t from, uint64_t to);

/* How much of r's address space stays resident past a wrap back once a
 * burst has stretched it: what ct__ring_resident_in comes back to (tests). */
uint64_t ct__ring_keep(const ct_ring *r);

/* The drainer, about to read r up to head: while the producer has
 * stretched r past its everyday size and is a whole one of it ahead (a
 * burst), faults in the next pages it will write (2 MiB past head), so that
 * a burst's page faults are the drainer's rather than the application
 * thread's. Concurrent with the producer's
 * own (it faults in what is still missing as it stretches) and harmless
 * to it: a page already present is left as it is. */
void ct__ring_prefault(ct_ring *r, uint64_t head);

/* The drainer has read r up to tail: publishes it and wakes a producer
 * waiting for room. Go does the same inline (drain.go) and calls this only
 * when waiting is set. */
void ct__ring_consumed(ct_ring *r, uint64_t tail);

/* Frees the rings of exited threads once drained (and once no live session
 * has spans left open on them). Called by Go under the drain mutex. */
void ct__ring_unlink_dead(void);

/* Aggregate sessions: how many spans are open in session h, on how many
 * threads; up to max of those threads' ids and counts go to tids/counts.
 * Other threads' depths are read without stopping them: exact when they
 * are quiet, as at a ct_finish. */
uint64_t ct__open_spans(ct_session h, int64_t *tids, uint32_t *counts, int max, int *threads);
/* The calling thread's innermost open span's key in aggregate session h;
 * UINT32_MAX when none. */
uint32_t ct__innermost_key(ct_session h);

#endif
