/* The one check of a shape argument, shared by the records that carry one
 * (convert.go: op, tensor, stats, memory; ct_record_tensor_stats_f32) and by
 * ct_reduce_tensor_stats_f32 (stats.c), which never enters Go. */
#ifndef CT_SHAPE_H
#define CT_SHAPE_H

#include <stddef.h>
#include <stdint.h>

#include "candle_trace.h"

/* Shapes of more dimensions are almost certainly a wrong length argument. */
#define CT_MAX_RANK 64
/* A host buffer of float32 holds at most this many elements. */
#define CT_MAX_HOST_ELEMENTS (1ull << 40)

/* Checks shape[0..rank) of argument field of fn: rank at most CT_MAX_RANK,
 * shape not NULL when rank > 0, no negative dimension. With elements (a host
 * buffer's shape), also that the element count fits 64 bits and
 * CT_MAX_HOST_ELEMENTS, and stores it. CT_OK, or CT_ERR_INVALID_ARGUMENT with
 * the calling thread's message ("fn: ..."). fn and field are given with
 * their lengths, so Go passes its strings without copying them. */
ct_status ct__check_shape(const char *fn, size_t fn_len, const char *field, size_t field_len,
                          const int64_t *shape, size_t rank, uint64_t *elements);

#endif
