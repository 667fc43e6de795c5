/* ct_reduce_tensor_stats_f32: the float32 statistics pass of internal/events
 * (reduce_f32.c) behind the C ABI, in C alone -- no session, no lock, no call
 * into Go. Its shape is checked as ct_record_tensor_stats_f32's is, by the
 * same function (shape.c). */
#include "candle_trace.h"
#include "fastpath.h"
#include "reduce_f32.h"
#include "shape.h"

#include <math.h>
#include <string.h>

#define FN "ct_reduce_tensor_stats_f32"

ct_status ct_reduce_tensor_stats_f32(const float *data, const int64_t *shape, size_t rank,
                                     ct_tensor_stats *out) {
    if (!out) return ct__fail(CT_ERR_INVALID_ARGUMENT, FN ": out is NULL");
    if (out->size < sizeof(ct_tensor_stats))
        return ct__fail(CT_ERR_INVALID_ARGUMENT,
                        FN ": out->size is %u, smaller than sizeof(ct_tensor_stats) %zu",
                        (unsigned)out->size, sizeof(ct_tensor_stats));
    uint64_t n;
    ct_status st = ct__check_shape(FN, sizeof FN - 1, "shape", sizeof "shape" - 1, shape, rank, &n);
    if (st != CT_OK) return st;
    if (!data && n > 0)
        return ct__fail(CT_ERR_INVALID_ARGUMENT, FN ": data is NULL for a tensor of %llu elements",
                        (unsigned long long)n);
    ct_f32_reduction r;
    ct__reduce_f32(data, (size_t)n, 0, &r);
    uint64_t finite = n - r.non_finite;
    out->dtype = "f32";
    out->elements = n;
    out->non_finite = r.non_finite;
    out->rms = out->abs_max = out->mean = 0;
    if (finite > 0) { /* StatsFromF32's arithmetic: IEEE sqrt and division, the same bits */
        float amax;
        memcpy(&amax, &r.abs_max_bits, sizeof amax);
        out->rms = sqrt(r.sum_sq / (double)finite);
        out->abs_max = (double)amax;
        out->mean = r.sum / (double)finite;
    }
    return CT_OK;
}
