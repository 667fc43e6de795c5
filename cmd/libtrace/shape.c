#include "shape.h"

#include <stdio.h>

#include "fastpath.h"

/* Room for "[d0 d1 ... d63]" of the largest dimensions (20 digits each). */
#define DIMS_CAP (CT_MAX_RANK * 21 + 3)

/* Writes the dimensions as Go's %v writes a []uint64: "[2 3]". */
static void format_dims(char *out, const int64_t *shape, size_t rank) {
    size_t n = 0;
    out[n++] = '[';
    for (size_t i = 0; i < rank; i++)
        n += (size_t)snprintf(out + n, DIMS_CAP - n, i ? " %llu" : "%llu", (unsigned long long)shape[i]);
    out[n++] = ']';
    out[n] = 0;
}

ct_status ct__check_shape(const char *fn, size_t fn_len, const char *field, size_t field_len,
                          const int64_t *shape, size_t rank, uint64_t *elements) {
    const int fl = (int)fn_len, dl = (int)field_len;
    if (rank > CT_MAX_RANK)
        return ct__fail(CT_ERR_INVALID_ARGUMENT, "%.*s: %.*s rank %zu is larger than %d", fl, fn, dl,
                        field, rank, CT_MAX_RANK);
    if (rank > 0 && !shape)
        return ct__fail(CT_ERR_INVALID_ARGUMENT, "%.*s: %.*s is NULL with rank %zu", fl, fn, dl, field,
                        rank);
    for (size_t i = 0; i < rank; i++)
        if (shape[i] < 0)
            return ct__fail(CT_ERR_INVALID_ARGUMENT, "%.*s: %.*s[%zu] is negative (%lld)", fl, fn, dl,
                            field, i, (long long)shape[i]);
    if (!elements) return CT_OK;
    char dims[DIMS_CAP];
    uint64_t n = 1;
    for (size_t i = 0; i < rank; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (d != 0 && n > UINT64_MAX / d) {
            format_dims(dims, shape, rank);
            return ct__fail(CT_ERR_INVALID_ARGUMENT, "%.*s: %.*s %s has more elements than fit in 64 bits",
                            fl, fn, dl, field, dims);
        }
        n *= d;
    }
    if (n > CT_MAX_HOST_ELEMENTS) {
        format_dims(dims, shape, rank);
        return ct__fail(CT_ERR_INVALID_ARGUMENT,
                        "%.*s: %.*s %s has %llu elements, more than a host buffer can hold", fl, fn, dl,
                        field, dims, (unsigned long long)n);
    }
    *elements = n;
    return CT_OK;
}
