// StatsFromF32's pass over a float32 buffer (reduce_f32.c).
#ifndef CT_REDUCE_F32_H
#define CT_REDUCE_F32_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    double sum;             // of the finite elements, float64
    double sum_sq;          // of their squares, float64
    uint32_t abs_max_bits;  // the float32 bits of the largest finite |x| (0 when none)
    uint64_t non_finite;    // NaN and +-Inf elements
} ct_f32_reduction;

// Reduces data[0..n). portable != 0 takes the portable loop even where AVX2 is there
// (the tests compare the two).
void ct__reduce_f32(const float *data, size_t n, int portable, ct_f32_reduction *out);

#endif
