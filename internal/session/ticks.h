/* The clock of aggregate spans.
 *
 * An aggregate span keeps only its duration, so it may be timed by the CPU's
 * cycle counter rather than CLOCK_MONOTONIC: reading the TSC costs ~9 ns on
 * the machines we measured, clock_gettime ~21 ns, and a span reads the clock
 * twice out of a 40 ns budget. Trace spans read the same counter, but their
 * start times must line up with records taken by other means, so they go
 * through a shared conversion (the counter clock, below).
 *
 * Ticks become nanoseconds when the drainer folds them (ct__ns_per_tick),
 * with a rate measured against CLOCK_MONOTONIC: first over a 2 ms spin when
 * the first aggregate session opens, then over the whole time since, so the
 * rate's error shrinks as the run goes on (about 1e-5 after the spin, below
 * 1e-7 after a second) — far inside a histogram bucket's 6.25%.
 *
 * The counter is used only where it ticks at a constant rate whatever the
 * core's frequency or sleep state: x86-64 with the invariant-TSC CPUID bit
 * or a kernel that runs its own clock on the TSC, and aarch64's virtual
 * counter. Elsewhere, or with CANDLE_TRACE_AGG_CLOCK=monotonic, a tick is a
 * CLOCK_MONOTONIC nanosecond. */
#ifndef CT_TICKS_H
#define CT_TICKS_H

#include <stdint.h>
#include <time.h>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

enum { CT_TICKS_MONOTONIC = 1, CT_TICKS_COUNTER = 2 };

/* Which source ct__ticks reads; set once by ct__ticks_init. */
extern int ct__tick_source;

/* Chooses the source and calibrates it; idempotent and thread-safe. */
void ct__ticks_init(void);
/* Nanoseconds per tick as measured so far (1 for CLOCK_MONOTONIC). */
double ct__ns_per_tick(void);
/* Tests only: switch the source (1 monotonic, 2 counter where available).
 * Returns the source in force. Never while aggregate spans are open. */
int ct__ticks_force(int source);

static inline __attribute__((always_inline)) uint64_t ct__mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static inline __attribute__((always_inline)) uint64_t ct__counter(void) {
#if defined(__x86_64__)
    return __rdtsc();
#elif defined(__aarch64__)
    uint64_t v;
    __asm__ __volatile__("mrs %0, cntvct_el0" : "=r"(v));
    return v;
#else
    return ct__mono_ns();
#endif
}

/* The counter read after every earlier load has completed (lfence first, as
 * the kernel's rdtsc_ordered): for readers whose value must not predate
 * what they loaded before it. */
static inline __attribute__((always_inline)) uint64_t ct__counter_ordered(void) {
#if defined(__x86_64__)
    _mm_lfence();
    return __rdtsc();
#elif defined(__aarch64__)
    uint64_t v;
    __asm__ __volatile__("isb; mrs %0, cntvct_el0" : "=r"(v)::"memory");
    return v;
#else
    return ct__mono_ns();
#endif
}

static inline __attribute__((always_inline)) uint64_t ct__ticks(void) {
    if (__builtin_expect(ct__tick_source == CT_TICKS_COUNTER, 1)) return ct__counter();
    return ct__mono_ns();
}

/* ---- the trace sessions' counter clock ------------------------------------
 *
 * A trace session's span begin and end write the raw counter too, where it
 * is usable (CANDLE_TRACE_CLOCK=monotonic keeps them on CLOCK_MONOTONIC), and
 * the drainer converts it. Start times must then line up with everything the
 * session times otherwise (records through Go, tracer intervals, CUPTI's
 * anchors), so the conversion is one function of the counter that every
 * reader shares: piecewise linear, continuous and nondecreasing, estimating
 * CLOCK_MONOTONIC. A segment, once published, is never changed: a new one
 * starts a little after the counter's value at its publication, so any value
 * read before it converts as it did; its slope steers the function back
 * towards CLOCK_MONOTONIC (ct__tsc_update, from the drainer), so the error
 * stays at about the calibration's pair error. The same arithmetic runs in Go
 * (tsc.go), in integers so that both sides agree to the nanosecond. */
typedef struct ct_tsc_seg {
    uint64_t tick; /* where it starts */
    uint64_t ns;   /* its value there (CLOCK_MONOTONIC ns) */
    uint64_t mult; /* ns per tick << 32 */
} ct_tsc_seg;

#define CT_TSC_SEGS 256

extern ct_tsc_seg ct__tsc_segs[CT_TSC_SEGS];
extern uint64_t ct__tsc_seq; /* odd while a segment is being published */
extern uint64_t ct__tsc_n;   /* segments published; segment i is at i % CT_TSC_SEGS */

/* Whether trace sessions opened now run on the counter (CANDLE_TRACE_CLOCK). */
int ct__trace_counter(void);
/* Tests only: 1 monotonic, 2 counter where usable, for sessions opened from
 * now on; returns the source in force. */
int ct__trace_clock_force(int source);
/* The conversion of counter value t. */
uint64_t ct__tsc_ns(uint64_t t);
/* The conversion of the counter now: ct__tsc_ns(ct__counter()), read so that
 * a segment published meanwhile cannot make it disagree with later reads. */
uint64_t ct__tsc_now(void);
/* Publishes a new segment when the newest is 20 ms old (force: now).
 * Called by the drainer; cheap when nothing is due. */
void ct__tsc_update(int force);
/* Copies the newest up to max segments (newest first) for the drainer;
 * returns how many. */
int ct__tsc_snapshot(ct_tsc_seg *out, int max);

static inline __attribute__((always_inline)) uint64_t ct__tsc_eval(const ct_tsc_seg *g, uint64_t t) {
    if (t >= g->tick) return g->ns + (uint64_t)(((unsigned __int128)(t - g->tick) * g->mult) >> 32);
    uint64_t back = (uint64_t)(((unsigned __int128)(g->tick - t) * g->mult) >> 32);
    return back < g->ns ? g->ns - back : 0;
}

#endif
