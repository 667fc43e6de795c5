/* The interface every system of the peer benchmark implements (tests/bench/peers/).
 *
 * burst.c owns the loop, the threads, the clock and the statistics; a system
 * only says how to open, begin a span, end one and close. Each system is its
 * own executable, linked from burst.c and one backend file, so every system
 * runs exactly the same loop, name, nesting and thread count, and each call
 * into a system is one ordinary (not inlined) function call. */
#ifndef PEER_H
#define PEER_H

#include <stdint.h>

/* The one span name of the benchmark (the same as tests/bench/bench_spans.c). */
#define PEER_SPAN_NAME "layer/forward"
/* The outer span each thread holds open around its burst. */
#define PEER_OUTER_NAME "bench/burst"

/* Opens the system for a run of `threads` threads writing under `dir`
 * (`variant` is the system's own argument: "trace" or "aggregate" for
 * candle-trace, unused elsewhere). Prints its reason and exits on failure. */
void peer_open(const char *dir, const char *variant, int threads);
/* Called once by every thread before its first span / after its last. */
void peer_thread_start(void);
void peer_thread_stop(void);
/* Opens a span named `name` nested in the calling thread's innermost one;
 * closes the calling thread's innermost span. */
void peer_begin(const char *name);
void peer_end(void);
/* Ends the run: every event the system keeps is where it will stay (on disk
 * for candle-trace and LTTng) when this returns. */
void peer_close(void);
/* CPU (ns) spent for this process by processes other than this one (LTTng's
 * daemons); 0 where the system has none. */
uint64_t peer_outside_cpu_ns(void);
/* Where this system's events went, for the result line. */
const char *peer_sink(void);

#endif
