/* The clock of aggregate spans.
 *
 * An aggregate span keeps only its duration, so it may be timed by the CPU's
 * cycle counter rather than CLOCK_MONOTONIC: reading the TSC costs ~9 ns on
 * the machines we measured, clock_gettime ~21 ns, and a span reads the clock
 * twice out of a 40 ns budget. Trace spans stay on CLOCK_MONOTONIC: their
 * start times must line up with records taken by other means, which a
 * converted counter could only approximate.
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

static inline __attribute__((always_inline)) uint64_t ct__ticks(void) {
    if (__builtin_expect(ct__tick_source == CT_TICKS_COUNTER, 1)) return ct__counter();
    return ct__mono_ns();
}

#endif
