/* cpu_math.h — private: exp and tanh for the CPU ops, written so that the
 * compiler vectorizes the loops that call them (libm's expf/tanhf are
 * scalar calls: GELU alone spent 15% of a gpt step in them). Cephes'
 * single-precision exp polynomial: within 1 ulp of expf on [-87, 88].
 * And the sum of squares of a float array, vectorized the same way (the
 * CPU ops' and the CPU reducer's). */
#ifndef BIGBATCH_CPU_MATH_H
#define BIGBATCH_CPU_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bigbatch/backend.h"

static inline float bb_expf(float x)
{
    /* Below -87.3 the result is 0 (no denormals); above 88.37 it is +inf;
     * NaN passes through. Clamping first keeps 2^k a normal float and the
     * float-to-int conversion defined. */
    float c = x != x ? 0.0f : x < -87.3f ? -87.3f : x > 88.37f ? 88.37f : x;
    /* round(c / ln2) without floorf, which GCC does not vectorize: c + 128.5
     * is positive, so truncation is a floor. */
    int32_t k = (int32_t)(c * 1.44269504089f + 128.5f) - 128;
    float n = (float)k;
    float r = c - n * 0.693359375f + n * 2.12194440e-4f; /* c - n·ln2, ln2 in two parts */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = (k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float y = p * scale;
    return x != x ? x : x < -87.3f ? 0.0f : x > 88.37f ? INFINITY : y;
}

static inline float bb_tanhf(float x) { return 1.0f - 2.0f / (bb_expf(2.0f * x) + 1.0f); }

/* Sum of x[i]² in double: BB_SUM_LANES running sums (i mod lanes) that
 * the compiler keeps in one vector register, added in lane order after the
 * tail. The same result for the same n, whatever the machine's vectors. */
enum { BB_SUM_LANES = 8 };
static inline double bb_sum_squares_f32(const float *x, size_t n)
{
    double lane[BB_SUM_LANES] = {0};
    size_t i = 0;
    for (; i + BB_SUM_LANES <= n; i += BB_SUM_LANES)
        for (int k = 0; k < BB_SUM_LANES; k++) lane[k] += (double)x[i + k] * x[i + k];
    double s = 0.0;
    for (; i < n; i++) s += (double)x[i] * x[i];
    for (int k = 0; k < BB_SUM_LANES; k++) s += lane[k];
    return s;
}

/* n bf16 values widened to fp32 (exact), and n fp32 values rounded to
 * bf16 (backend.h's rounding): the CPU ops' conversions. */
static inline void bb_bf16_widen(float *out, const uint16_t *in, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = bb_bf16_to_float(in[i]);
}

static inline void bb_bf16_narrow(uint16_t *out, const float *in, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = bb_bf16_from_float(in[i]);
}

#endif
