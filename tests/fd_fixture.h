/* fd_fixture.h — what the CPU op suites share (test_cpu_ops.c,
 * test_cpu_attention.c): deterministic random operands and the central
 * finite-difference check of an op's backward.
 *
 *   float *x = random_floats(n, 1, 1.0f);
 *   fd_check("op.x", x, n, analytic_gradient, my_loss, &ctx, 1e-2f, 2e-3);
 */
#ifndef BIGBATCH_FD_FIXTURE_H
#define BIGBATCH_FD_FIXTURE_H

#include <math.h>

#include "model_fixture.h"

#define F(p) bb_f32(p)
#define NONE bb_no_tensor()

/* Uniform in [-scale, scale), deterministic. */
static float *random_floats(size_t n, uint64_t seed, float scale)
{
    float *x = malloc(n * sizeof *x);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = scale * ((float)(s >> 40) / (float)(1u << 24) * 2.0f - 1.0f);
    }
    return x;
}

/* The scalar every FD check differentiates: L = sum(out * R), in double. */
typedef double (*loss_fn)(void *ctx);

static double dot(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* Compares `analytic` with central differences of loss() in every element of
 * x (at most 400, spread evenly); prints the relative error ||a - n|| /
 * max(||a||, ||n||) and holds it below `tolerance`. */
static void fd_check(const char *name, float *x, size_t n, const float *analytic, loss_fn loss, void *ctx,
                       float eps, double tolerance)
{
    double diff = 0, na = 0, nn = 0;
    size_t step = n > 400 ? n / 400 : 1;
    for (size_t i = 0; i < n; i += step) {
        float saved = x[i];
        x[i] = saved + eps;
        double plus = loss(ctx);
        x[i] = saved - eps;
        double minus = loss(ctx);
        x[i] = saved;
        double numeric = (plus - minus) / (2.0 * eps);
        diff += (analytic[i] - numeric) * (analytic[i] - numeric);
        na += (double)analytic[i] * analytic[i];
        nn += numeric * numeric;
    }
    double rel = sqrt(diff) / fmax(fmax(sqrt(na), sqrt(nn)), 1e-12);
    printf("fd %-22s relative error %.2e\n", name, rel);
    cr_assert_lt(rel, tolerance, "%s: relative error %.3e", name, rel);
}

#endif
