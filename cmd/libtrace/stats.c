/* ct_reduce_tensor_stats_f32: the float32 statistics pass of internal/events
 * (reduce_f32.c) behind the C ABI, in C alone -- no session, no lock, no call
 * into Go. The checks are ct_record_tensor_stats_f32's (convertShape,
 * elementCount), with its messages. */
#include "candle_trace.h"
#include "fastpath.h"
#include "reduce_f32.h"

#include <math.h>
#include <string.h>

#define FN "ct_reduce_tensor_stats_f32"
#define MAX_RANK 64             /* convert.go's maxRank */
#define MAX_ELEMENTS (1ull << 40) /* elementCount's host-buffer bound */

ct_status ct_reduce_tensor_stats_f32(const float *data, const int64_t *shape, size_t rank,
                                     ct_tensor_stats *out) {
    if (!out) return ct__fail(CT_ERR_INVALID_ARGUMENT, FN ": out is NULL");
    if (out->size < sizeof(ct_tensor_stats))
        return ct__fail(CT_ERR_INVALID_ARGUMENT,
                        FN ": out->size is %u, smaller than sizeof(ct_tensor_stats) %zu",
                        (unsigned)out->size, sizeof(ct_tensor_stats));
    if (rank > MAX_RANK)
        return ct__fail(CT_ERR_INVALID_ARGUMENT, FN ": shape rank %zu is larger than %d", rank,
                        MAX_RANK);
    if (rank > 0 && !shape)
        return ct__fail(CT_ERR_INVALID_ARGUMENT, FN ": shape is NULL with rank %zu", rank);
    uint64_t n = 1;
    for (size_t i = 0; i < rank; i++) {
        if (shape[i] < 0)
            return ct__fail(CT_ERR_INVALID_ARGUMENT, FN ": shape[%zu] is negative (%lld)", i,
                            (long long)shape[i]);
        uint64_t d = (uint64_t)shape[i];
        if (d != 0 && n > UINT64_MAX / d)
            return ct__fail(CT_ERR_INVALID_ARGUMENT,
                            FN ": shape has more elements than fit in 64 bits");
        n *= d;
    }
    if (n > MAX_ELEMENTS)
        return ct__fail(CT_ERR_INVALID_ARGUMENT,
                        FN ": shape has %llu elements, more than a host buffer can hold",
                        (unsigned long long)n);
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
