/* Tracy's C client (TracyC.h; the C++ client sources shipped in the
 * tracy-client-sys crate, built by run.py with TRACY_ENABLE and without
 * TRACY_ON_DEMAND). No server connects: with TRACY_ON_DEMAND a zone would
 * only test "connected?" and record nothing, so we leave it off and Tracy
 * does its full work per zone (timestamp, enqueue in its per-thread queue)
 * and keeps every event in RAM, waiting for a server that never comes.
 * Nothing reaches a disk. */
#include <stdlib.h>
#include <string.h>

#include "tracy/TracyC.h"
#include "peer.h"

/* Tracy names a zone by a static source location, as TracyCZoneN does. */
static const struct ___tracy_source_location_data span_loc = {PEER_SPAN_NAME, "peer_begin", __FILE__, __LINE__, 0};
static const struct ___tracy_source_location_data outer_loc = {PEER_OUTER_NAME, "peer_begin", __FILE__, __LINE__, 0};

static __thread TracyCZoneCtx stack[2];
static __thread int depth;
/* The last name pointer seen on this thread and its location: one compare
 * per zone, not a string compare. */
static __thread const char *last_name;
static __thread const struct ___tracy_source_location_data *last_loc;

void peer_open(const char *dir, const char *variant, int threads) { (void)dir, (void)variant, (void)threads; }
void peer_thread_start(void) {}
void peer_thread_stop(void) {}
void peer_begin(const char *name) {
    if (name != last_name) {
        last_name = name;
        last_loc = strcmp(name, PEER_SPAN_NAME) ? &outer_loc : &span_loc;
    }
    stack[depth++] = ___tracy_emit_zone_begin(last_loc, 1);
}
void peer_end(void) { ___tracy_emit_zone_end(stack[--depth]); }
void peer_close(void) {}
uint64_t peer_outside_cpu_ns(void) { return 0; }
const char *peer_sink(void) { return "RAM"; }
