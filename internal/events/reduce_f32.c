// The float32 statistics pass of StatsFromF32 (stats_cgo.go), in C so that it runs at
// memory bandwidth: a captured update reduces every module output, megabytes each on a
// CNN, and Go's compiler does not vectorize.
//
// The result does not depend on the CPU: element i is accumulated into lane i % 16 (in
// float64, in element order), and the 16 lanes are combined by one fixed tree. The AVX2
// path keeps its 16 lanes in four registers of four, the portable path in arrays; both
// do the same float64 operations in the same order, and x*x of a float32 is exact in
// float64, so a fused multiply-add rounds as the separate multiply and add do. The Go
// fallback (reduceF32Lanes, stats.go) is the same computation too: the tests compare
// the three bit for bit.
//
// A non-finite element (exponent bits all ones) adds +0.0 to the sums and 0 to |x|'s
// maximum, and is counted. |x|'s maximum is taken on the bits with the sign cleared: for
// finite floats the same order as the values.

#include "reduce_f32.h"

#include <string.h>

#define LANES 16
#define EXP_MASK 0x7f800000u
#define ABS_MASK 0x7fffffffu

static void combine(const double s[LANES], const double q[LANES], const uint32_t m[LANES],
                    uint64_t bad, ct_f32_reduction *out) {
    double s8[8], q8[8];
    for (int i = 0; i < 8; i++) { s8[i] = s[i] + s[i + 8]; q8[i] = q[i] + q[i + 8]; }
    for (int i = 0; i < 4; i++) { s8[i] += s8[i + 4]; q8[i] += q8[i + 4]; }
    for (int i = 0; i < 2; i++) { s8[i] += s8[i + 2]; q8[i] += q8[i + 2]; }
    out->sum = s8[0] + s8[1];
    out->sum_sq = q8[0] + q8[1];
    uint32_t mx = 0;
    for (int i = 0; i < LANES; i++) if (m[i] > mx) mx = m[i];
    out->abs_max_bits = mx;
    out->non_finite = bad;
}

// The elements from i on, into the lanes of element i % LANES: the portable pass, and
// every path's tail.
static void lanes_from(const float *data, size_t i, size_t n, double s[LANES],
                       double q[LANES], uint32_t m[LANES], uint64_t *bad) {
    for (; i < n; i++) {
        uint32_t b;
        memcpy(&b, &data[i], sizeof b);
        size_t l = i % LANES;
        if ((b & EXP_MASK) == EXP_MASK) {
            (*bad)++;
            continue;
        }
        double v = (double)data[i];
        s[l] += v;
        q[l] += v * v;
        uint32_t a = b & ABS_MASK;
        if (a > m[l]) m[l] = a;
    }
}

static void reduce_portable(const float *data, size_t n, ct_f32_reduction *out) {
    double s[LANES] = {0}, q[LANES] = {0};
    uint32_t m[LANES] = {0};
    uint64_t bad = 0;
    lanes_from(data, 0, n, s, q, m, &bad);
    combine(s, q, m, bad, out);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

// Eight floats f (as int bits): the first four into (s_lo, q_lo), the last four into
// (s_hi, q_hi), sums and sums of squares.
#define CT_ACC8(bits, s_lo, q_lo, s_hi, q_hi)                                            \
    do {                                                                                 \
        __m256 f_ = _mm256_castsi256_ps(bits);                                           \
        __m256d lo_ = _mm256_cvtps_pd(_mm256_castps256_ps128(f_));                       \
        __m256d hi_ = _mm256_cvtps_pd(_mm256_extractf128_ps(f_, 1));                     \
        s_lo = _mm256_add_pd(s_lo, lo_);                                                 \
        q_lo = _mm256_fmadd_pd(lo_, lo_, q_lo);                                          \
        s_hi = _mm256_add_pd(s_hi, hi_);                                                 \
        q_hi = _mm256_fmadd_pd(hi_, hi_, q_hi);                                          \
    } while (0)

// Eight floats at p, with the masks: the non-finite ones become +0.0 and are counted
// (as -1s) into bad; |x| bits into m.
#define CT_STEP8(p, s_lo, q_lo, s_hi, q_hi, m, bad)                                      \
    do {                                                                                 \
        __m256i b_ = _mm256_loadu_si256((const __m256i *)(p));                          \
        __m256i nf_ = _mm256_cmpeq_epi32(_mm256_and_si256(b_, expm), expm);             \
        __m256i ok_ = _mm256_andnot_si256(nf_, b_);                                     \
        bad = _mm256_add_epi32(bad, nf_);                                                \
        m = _mm256_max_epu32(m, _mm256_and_si256(ok_, absm));                            \
        CT_ACC8(ok_, s_lo, q_lo, s_hi, q_hi);                                            \
    } while (0)

// The 16-element groups of [i, stop), with the masks: lanes acc[0..3] (sums) and
// acc[4..7] (sums of squares), |x| bits into *m, the non-finite count into *bad.
__attribute__((target("avx2,fma"))) static inline void masked_groups(
    const float *data, size_t i, size_t stop, __m256d acc[8], __m256i *m, uint64_t *bad) {
    const __m256i expm = _mm256_set1_epi32((int)EXP_MASK);
    const __m256i absm = _mm256_set1_epi32((int)ABS_MASK);
    __m256i b0 = _mm256_setzero_si256(), b1 = b0, m0 = *m, m1 = *m;
    for (; i < stop; i += LANES) {
        CT_STEP8(data + i, acc[0], acc[4], acc[1], acc[5], m0, b0);
        CT_STEP8(data + i + 8, acc[2], acc[6], acc[3], acc[7], m1, b1);
    }
    *m = _mm256_max_epu32(m0, m1);
    int32_t cnt[8];
    _mm256_storeu_si256((__m256i *)cnt, _mm256_add_epi32(b0, b1));
    for (int k = 0; k < 8; k++) *bad += (uint64_t)(-(int64_t)cnt[k]);
}

// Eight floats at p known finite: no masks.
#define CT_FAST8(p, s_lo, q_lo, s_hi, q_hi, m)                                          \
    do {                                                                                 \
        __m256i b_ = _mm256_loadu_si256((const __m256i *)(p));                          \
        m = _mm256_max_epu32(m, _mm256_and_si256(b_, absm));                             \
        CT_ACC8(b_, s_lo, q_lo, s_hi, q_hi);                                             \
    } while (0)

// Blocks of BLOCK elements are first summed as if every element were finite (no masks:
// a third fewer instructions); a block whose largest |x| bits show a NaN or an Inf
// (exponent all ones, so bits >= EXP_MASK) is summed again from the lanes' values before
// it, with the masks. Adding +0.0 for a skipped element leaves a lane as it was (a lane
// that starts at +0.0 is never -0.0), so both give the portable loop's result.
#define BLOCK 1024

__attribute__((target("avx2,fma"))) static void reduce_avx2(const float *data, size_t n,
                                                             ct_f32_reduction *out) {
    const __m256i expm = _mm256_set1_epi32((int)EXP_MASK);
    const __m256i absm = _mm256_set1_epi32((int)ABS_MASK);
    __m256d acc[8];  // sums of lanes 0-3, 4-7, 8-11, 12-15, then their squares
    for (int k = 0; k < 8; k++) acc[k] = _mm256_setzero_pd();
    __m256i m = _mm256_setzero_si256();
    uint64_t bad = 0;
    size_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        __m256d t0 = acc[0], t1 = acc[1], t2 = acc[2], t3 = acc[3];
        __m256d r0 = acc[4], r1 = acc[5], r2 = acc[6], r3 = acc[7];
        __m256i bm0 = _mm256_setzero_si256(), bm1 = bm0;
        for (size_t j = i; j < i + BLOCK; j += LANES) {
            CT_FAST8(data + j, t0, r0, t1, r1, bm0);
            CT_FAST8(data + j + 8, t2, r2, t3, r3, bm1);
        }
        __m256i bm = _mm256_max_epu32(bm0, bm1);
        // Any lane >= EXP_MASK: max(lane, EXP_MASK) == lane somewhere.
        __m256i hit = _mm256_cmpeq_epi32(_mm256_max_epu32(bm, expm), bm);
        if (!_mm256_testz_si256(hit, hit)) {
            masked_groups(data, i, i + BLOCK, acc, &m, &bad);
            continue;
        }
        acc[0] = t0; acc[1] = t1; acc[2] = t2; acc[3] = t3;
        acc[4] = r0; acc[5] = r1; acc[6] = r2; acc[7] = r3;
        m = _mm256_max_epu32(m, bm);
    }
    // What is left of whole 16-element groups (all of a tensor under BLOCK elements):
    // the masked loop, one group at a time.
    size_t groups_end = n - (n - i) % LANES;
    masked_groups(data, i, groups_end, acc, &m, &bad);
    i = groups_end;
    double s[LANES], q[LANES];
    uint32_t m8[8], ml[LANES] = {0};
    for (int k = 0; k < 4; k++) {
        _mm256_storeu_pd(s + 4 * k, acc[k]);
        _mm256_storeu_pd(q + 4 * k, acc[4 + k]);
    }
    _mm256_storeu_si256((__m256i *)m8, m);
    memcpy(ml, m8, sizeof m8);
    lanes_from(data, i, n, s, q, ml, &bad);
    combine(s, q, ml, bad, out);
}
#undef CT_FAST8
#undef CT_STEP8
#undef CT_ACC8

static int have_avx2(void) {
    __builtin_cpu_init();  // idempotent; reads what the loader's constructor found
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

void ct__reduce_f32(const float *data, size_t n, int portable, ct_f32_reduction *out) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (!portable && have_avx2()) {
        reduce_avx2(data, n, out);
        return;
    }
#endif
    (void)portable;
    reduce_portable(data, n, out);
}
