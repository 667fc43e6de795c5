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

static void init_once(void) {
    const char *env = getenv("CANDLE_TRACE_AGG_CLOCK");
    counter_usable = counter_is_constant_rate();
    if (counter_usable) calibrate();
    int want_counter = counter_usable && !(env && strcmp(env, "monotonic") == 0);
    __atomic_store_n(&ct__tick_source, want_counter ? CT_TICKS_COUNTER : CT_TICKS_MONOTONIC, __ATOMIC_RELEASE);
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
