#define _GNU_SOURCE
#include "ticks.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

int ct__tick_source = CT_TICKS_MONOTONIC;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int counter_usable;
static uint64_t tick_base, mono_base; /* one (counter, monotonic) pair */
static double first_rate;             /* ns per tick over the calibration spin */
static int trace_source = CT_TICKS_MONOTONIC; /* of trace sessions opened now */

/* Reads the counter between two monotonic reads, three times, and keeps the
 * tightest bracket: the pair's error is at most half of it. */
static void read_pair(uint64_t *tick, uint64_t *mono) {
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 3; i++) {
        uint64_t m0 = ct__mono_ns();
        uint64_t t = ct__counter();
        uint64_t m1 = ct__mono_ns();
        if (m1 - m0 < best) {
            best = m1 - m0;
            *tick = t;
            *mono = m0 + (m1 - m0) / 2;
        }
    }
}

static int counter_is_constant_rate(void) {
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (__get_cpuid(0x80000007, &a, &b, &c, &d) && (d & (1u << 8))) return 1;
    /* Hypervisors often hide the CPUID bit; a kernel that chose the TSC as
     * its own clocksource has checked it is stable. */
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    if (!f) return 0;
    char buf[32] = {0};
    int ok = fgets(buf, sizeof buf, f) && strncmp(buf, "tsc", 3) == 0 && (buf[3] == '\n' || buf[3] == 0);
    fclose(f);
    return ok;
#elif defined(__aarch64__)
    return 1; /* the generic timer's virtual count has a fixed frequency */
#else
    return 0;
#endif
}

static void calibrate(void) {
    uint64_t t1, m1;
    read_pair(&tick_base, &mono_base);
    do {
        read_pair(&t1, &m1);
    } while (m1 - mono_base < 2000000);
    if (t1 <= tick_base) {
        counter_usable = 0;
        return;
    }
    first_rate = (double)(m1 - mono_base) / (double)(t1 - tick_base);
}

static void tsc_first_segment(void);

static void init_once(void) {
    const char *env = getenv("CANDLE_TRACE_AGG_CLOCK");
    counter_usable = counter_is_constant_rate();
    if (counter_usable) calibrate();
    int want_counter = counter_usable && !(env && strcmp(env, "monotonic") == 0);
    __atomic_store_n(&ct__tick_source, want_counter ? CT_TICKS_COUNTER : CT_TICKS_MONOTONIC, __ATOMIC_RELEASE);
    if (counter_usable) tsc_first_segment();
    const char *tenv = getenv("CANDLE_TRACE_CLOCK");
    int trace = counter_usable && !(tenv && strcmp(tenv, "monotonic") == 0);
    __atomic_store_n(&trace_source, trace ? CT_TICKS_COUNTER : CT_TICKS_MONOTONIC, __ATOMIC_RELEASE);
}

void ct__ticks_init(void) { pthread_once(&once, init_once); }

double ct__ns_per_tick(void) {
    if (__atomic_load_n(&ct__tick_source, __ATOMIC_ACQUIRE) != CT_TICKS_COUNTER) return 1.0;
    uint64_t t, m;
    read_pair(&t, &m);
    /* Until the baseline is long enough that the pairs' error is negligible,
     * the spin's rate is the better estimate. */
    if (m - mono_base < 200000000 || t <= tick_base) return first_rate;
    return (double)(m - mono_base) / (double)(t - tick_base);
}

int ct__ticks_force(int source) {
    ct__ticks_init();
    if (source == CT_TICKS_COUNTER && !counter_usable) source = CT_TICKS_MONOTONIC;
    __atomic_store_n(&ct__tick_source, source, __ATOMIC_RELEASE);
    return source;
}

/* ---- the trace sessions' counter clock (ticks.h) -------------------------- */

ct_tsc_seg ct__tsc_segs[CT_TSC_SEGS];
uint64_t ct__tsc_seq;
uint64_t ct__tsc_n;

static pthread_mutex_t tsc_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t tsc_update_ticks; /* 20 ms in ticks */
static uint64_t tsc_margin_ticks; /* 10 µs in ticks: how far ahead a new segment starts */

/* A seqlock without fences (TSan does not model them): the data are stored
 * with release (after the odd sequence number) and loaded with acquire
 * (before the sequence is read again). On x86-64 and aarch64 these are
 * plain or cheap moves. */
#define RLX(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define SET_RLX(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

static uint64_t mult_of(double ns_per_tick) { return (uint64_t)(ns_per_tick * 4294967296.0 + 0.5); }

/* A writer of segments (holding tsc_mu) makes the sequence odd before it
 * reads the clocks for a new segment and even once it is written: readers
 * that overlap see the sequence change and read again. Every field is
 * accessed atomically (release stores, acquire loads), so that readers never
 * race with the writer in the C11 sense. */
static uint64_t tsc_write_begin(void) {
    uint64_t seq = RLX(&ct__tsc_seq);
    __atomic_store_n(&ct__tsc_seq, seq + 1, __ATOMIC_SEQ_CST);
    return seq;
}

static void tsc_write_end(uint64_t seq, const ct_tsc_seg *g) {
    if (g) {
        uint64_t n = RLX(&ct__tsc_n);
        ct_tsc_seg *d = &ct__tsc_segs[n % CT_TSC_SEGS];
        SET_RLX(&d->tick, g->tick);
        SET_RLX(&d->ns, g->ns);
        SET_RLX(&d->mult, g->mult);
        SET_RLX(&ct__tsc_n, n + 1);
    }
    __atomic_store_n(&ct__tsc_seq, seq + 2, __ATOMIC_RELEASE);
}

/* The first segment: the calibration's pair (CLOCK_MONOTONIC at the middle of
 * its tightest bracket) and the rate over its spin. */
static void tsc_first_segment(void) {
    tsc_update_ticks = (uint64_t)(20e6 / first_rate);
    tsc_margin_ticks = (uint64_t)(10e3 / first_rate) + 1;
    pthread_mutex_lock(&tsc_mu);
    ct_tsc_seg g = {.tick = tick_base, .ns = mono_base, .mult = mult_of(first_rate)};
    tsc_write_end(tsc_write_begin(), &g);
    pthread_mutex_unlock(&tsc_mu);
}

int ct__trace_counter(void) {
    ct__ticks_init();
    return __atomic_load_n(&trace_source, __ATOMIC_ACQUIRE) == CT_TICKS_COUNTER;
}

int ct__trace_clock_force(int source) {
    ct__ticks_init();
    if (source == CT_TICKS_COUNTER && !counter_usable) source = CT_TICKS_MONOTONIC;
    __atomic_store_n(&trace_source, source, __ATOMIC_RELEASE);
    return source;
}

/* The segment holding t among those published (the oldest kept when t is
 * older still); the caller checks the sequence around it. */
static ct_tsc_seg tsc_find(uint64_t t, uint64_t n) {
    uint64_t i = n - 1;
    for (;;) {
        const ct_tsc_seg *s = &ct__tsc_segs[i % CT_TSC_SEGS];
        ct_tsc_seg g = {RLX(&s->tick), RLX(&s->ns), RLX(&s->mult)};
        /* Not the oldest slot: it is the one a writer fills next. */
        if (g.tick <= t || i == 0 || n - i >= CT_TSC_SEGS - 1) return g;
        i--;
    }
}

/* Whether a reader that found the sequence odd should wait for the writer:
 * not for ever, since the writer may be the very thread the reader runs on
 * (a signal handler's flush that interrupted the drainer inside
 * ct__tsc_update). The table published so far is whole; only the segment
 * being written is missing from it, and the values it changes are the
 * counter's from after the writer began, which such a reader never has. */
static inline int tsc_wait(uint64_t seq, unsigned *spins) { return (seq & 1) && ++*spins < (1u << 20); }

uint64_t ct__tsc_ns(uint64_t t) {
    unsigned spins = 0;
    for (;;) {
        uint64_t seq = __atomic_load_n(&ct__tsc_seq, __ATOMIC_ACQUIRE);
        uint64_t n = RLX(&ct__tsc_n);
        if (n == 0) return ct__mono_ns(); /* never: sessions on the counter init first */
        if (tsc_wait(seq, &spins)) continue;
        ct_tsc_seg g = tsc_find(t, n);
        if (RLX(&ct__tsc_seq) == seq || (seq & 1)) return ct__tsc_eval(&g, t);
    }
}

uint64_t ct__tsc_now(void) {
    unsigned spins = 0;
    for (;;) {
        /* The sequence before the counter: a segment published after this
         * read starts past the counter value read here (tsc_update), one
         * published in between makes the sequence differ. The counter is
         * read after every earlier load (as the vDSO's clock_gettime reads
         * it): the session clock reads the tracer's fields after it, and a
         * value from before a tracer interval ended, combined with that
         * interval's total, would run the clock backwards. */
        uint64_t seq = __atomic_load_n(&ct__tsc_seq, __ATOMIC_SEQ_CST);
        uint64_t t = ct__counter_ordered();
        uint64_t n = RLX(&ct__tsc_n);
        if (n == 0) return ct__mono_ns();
        if (tsc_wait(seq, &spins)) continue;
        ct_tsc_seg g = tsc_find(t, n);
        if (RLX(&ct__tsc_seq) == seq || (seq & 1)) return ct__tsc_eval(&g, t);
    }
}

void ct__tsc_update(int force) {
    if (!counter_usable || __atomic_load_n(&ct__tsc_n, __ATOMIC_ACQUIRE) == 0) return;
    if (!force) {
        const ct_tsc_seg *last = &ct__tsc_segs[(RLX(&ct__tsc_n) - 1) % CT_TSC_SEGS];
        if (ct__counter() - RLX(&last->tick) < tsc_update_ticks) return;
    }
    if (pthread_mutex_trylock(&tsc_mu) != 0) return;
    uint64_t n = RLX(&ct__tsc_n);
    ct_tsc_seg last = ct__tsc_segs[(n - 1) % CT_TSC_SEGS];
    /* The clocks are read with the sequence odd: a conversion that
     * completed before it converted a counter value read before this one,
     * which the new segment (starting past it) leaves as it was. */
    uint64_t seq = tsc_write_begin();
    uint64_t t, m;
    read_pair(&t, &m);
    if (t <= last.tick || t <= tick_base) {
        tsc_write_end(seq, NULL);
        pthread_mutex_unlock(&tsc_mu);
        return;
    }
    /* A margin past now: a counter value read out of order (rdtsc is not
     * ordered with loads) around a conversion still falls before it. */
    uint64_t a = t + tsc_margin_ticks;
    uint64_t v = ct__tsc_eval(&last, a);
    double rate = (double)(m - mono_base) / (double)(t - tick_base);
    if (m - mono_base < 200000000) rate = first_rate;
    uint64_t target = m + (uint64_t)((double)tsc_margin_ticks * rate);
    double slope = rate;
    if (v + 1000000 < target) {
        v = target; /* more than 1 ms behind (a clock step): jump ahead, never back */
    } else {
        /* Steer the error out over the next 50 ms: between 0.5x and 1.01x
         * the measured rate, so the function never runs backwards. */
        double err = (double)(int64_t)(v - target);
        double corr = -err / 50e6;
        if (corr < -0.5) corr = -0.5;
        if (corr > 0.01) corr = 0.01;
        slope = rate * (1.0 + corr);
    }
    ct_tsc_seg g = {.tick = a, .ns = v, .mult = mult_of(slope)};
    tsc_write_end(seq, &g);
    pthread_mutex_unlock(&tsc_mu);
}

int ct__tsc_snapshot(ct_tsc_seg *out, int max) {
    unsigned spins = 0;
    for (;;) {
        uint64_t seq = __atomic_load_n(&ct__tsc_seq, __ATOMIC_ACQUIRE);
        uint64_t n = RLX(&ct__tsc_n);
        if (tsc_wait(seq, &spins)) continue;
        int k = 0;
        for (; k < max && (uint64_t)k < n && k < CT_TSC_SEGS - 1; k++) {
            const ct_tsc_seg *s = &ct__tsc_segs[(n - 1 - (uint64_t)k) % CT_TSC_SEGS];
            out[k] = (ct_tsc_seg){RLX(&s->tick), RLX(&s->ns), RLX(&s->mult)};
        }
        if (RLX(&ct__tsc_seq) == seq || (seq & 1)) return k;
    }
}
