/* LTTng-UST tracepoint provider of the peer benchmark: a span begin carrying
 * its name (copied into the event, as candle-trace copies it into its ring)
 * and a span end. */
#undef LTTNG_UST_TRACEPOINT_PROVIDER
#define LTTNG_UST_TRACEPOINT_PROVIDER candle_bench

#undef LTTNG_UST_TRACEPOINT_INCLUDE
#define LTTNG_UST_TRACEPOINT_INCLUDE "./lttng_tp.h"

#if !defined(LTTNG_TP_H) || defined(LTTNG_UST_TRACEPOINT_HEADER_MULTI_READ)
#define LTTNG_TP_H

#include <lttng/tracepoint.h>

LTTNG_UST_TRACEPOINT_EVENT(candle_bench, span_begin, LTTNG_UST_TP_ARGS(const char *, name),
                           LTTNG_UST_TP_FIELDS(lttng_ust_field_string(name, name)))

LTTNG_UST_TRACEPOINT_EVENT(candle_bench, span_end, LTTNG_UST_TP_ARGS(), LTTNG_UST_TP_FIELDS())

#endif

#include <lttng/tracepoint-event.h>
