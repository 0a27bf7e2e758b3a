/* cpu_norm.c — the CPU backend's normalisations: LayerNorm and RMSNorm,
 * forward (each also fused with a residual add) and backward, row by row
 * over the pool; bf16 rows widened into per-range scratch. Contracts are
 * in ops.def. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ew.h"
#include "cpu_math.h"
#include "cpu_ops.h"

#define LN_EPS 1e-5f

/* LayerNorm's rows: x = out, y = mean, z = rstd, a = in, c = w, and: */
typedef struct ln_args {
    ew_args e;
    const float *bias, *mean, *rstd, *dout;
    const float *y; /* forward fused with the residual: res = in + y, then the LayerNorm of res */
    float *res;
    float *din, *dw, *dbias, *parts; /* backward: per slice, C floats of dw then C of dbias */
    bool bf16;                       /* in, out (din, dout) are bf16: rows widened into scratch */
    bool rms;                        /* RMSNorm: no mean (nor its statistic), no bias, eps its own */
    float eps;
    atomic_bool *no_memory;          /* bf16: a range found no scratch (the op notes it) */
} ln_args;

/* bf16 rows: k rows of C floats of scratch for one range; NULL (flagged) when out of memory. */
static float *row_scratch(const ln_args *a, int k, int C)
{
    float *rows = malloc((size_t)k * C * sizeof(float));
    if (!rows) atomic_store(a->no_memory, true);
    return rows;
}

static void ln_run(bb_backend_t *b, ln_args *a, const char *op)
{
    atomic_bool no_memory;
    atomic_init(&no_memory, false);
    a->no_memory = &no_memory;
    bb_cpu_ew_run(b, &a->e);
    if (atomic_load(&no_memory)) bb_backend_note_error(b, BB_ERR_NOMEM, "%s: out of host memory for its rows", op);
}

static void layernorm_forward_range(const ew_args *ea, size_t lo, size_t hi, int slice)
{
    (void)slice;
    const ln_args *a = (const ln_args *)ea;
    int C = ea->C;
    const float *in = ea->a, *w = ea->c, *bias = a->bias;
    float *out = ea->x, *mean = ea->y, *rstd = ea->z, *rows = a->bf16 ? row_scratch(a, 3, C) : NULL;
    if (a->bf16 && !rows) return;
    for (size_t n = lo; n < hi; n++) {
        size_t at = (size_t)n * C;
        const float *x = in + at;
        float *y = out + at;
        if (a->bf16) {
            bb_bf16_widen(rows, (const uint16_t *)ea->a + at, (size_t)C);
            x = rows, y = rows + C;
        }
        if (a->res && a->bf16) { /* res rounded to bf16 as add writes it; the LayerNorm reads that */
            float *r = rows + 2 * C;
            bb_bf16_widen(r, (const uint16_t *)a->y + at, (size_t)C);
            for (int i = 0; i < C; i++) r[i] += rows[i];
            bb_bf16_narrow((uint16_t *)a->res + at, r, (size_t)C);
            bb_bf16_widen(rows, (const uint16_t *)a->res + at, (size_t)C);
        } else if (a->res) {
            for (int i = 0; i < C; i++) a->res[at + i] = x[i] + a->y[at + i];
            x = a->res + at;
        }
        float m = 0.0f, var = 0.0f;
        if (a->rms) {
            for (int i = 0; i < C; i++) var += x[i] * x[i];
            float s = 1.0f / sqrtf(var / C + a->eps);
            for (int i = 0; i < C; i++) y[i] = x[i] * s * w[i];
            rstd[n] = s;
        } else {
            for (int i = 0; i < C; i++) m += x[i];
            m /= C;
            for (int i = 0; i < C; i++) var += (x[i] - m) * (x[i] - m);
            float s = 1.0f / sqrtf(var / C + LN_EPS);
            for (int i = 0; i < C; i++) y[i] = (x[i] - m) * s * w[i] + bias[i];
            mean[n] = m;
            rstd[n] = s;
        }
        if (a->bf16) bb_bf16_narrow((uint16_t *)ea->x + (size_t)n * C, y, (size_t)C);
    }
    free(rows);
}

void bb_cpu_layernorm_forward(bb_backend_t *b, bb_tensor out, float *mean, float *rstd, bb_tensor in, bb_tensor w,
                              bb_tensor bias, int N, int C)
{
    ln_args a = {.e = {.range = layernorm_forward_range, .x = F32(out), .y = mean, .z = rstd, .a = F32(in),
                       .c = F32(w), .n = (size_t)N, .C = C},
                 .bias = F32(bias), .bf16 = IS_BF16(in)};
    ln_run(b, &a, "layernorm_forward");
}

void bb_cpu_residual_layernorm_forward(bb_backend_t *b, bb_tensor res, bb_tensor out, float *mean, float *rstd,
                                       bb_tensor x, bb_tensor y, bb_tensor w, bb_tensor bias, int N, int C)
{
    ln_args a = {.e = {.range = layernorm_forward_range, .x = F32(out), .y = mean, .z = rstd, .a = F32(x),
                       .c = F32(w), .n = (size_t)N, .C = C},
                 .bias = F32(bias), .y = F32(y), .res = F32(res), .bf16 = IS_BF16(x)};
    ln_run(b, &a, "residual_layernorm_forward");
}

void bb_cpu_rmsnorm_forward(bb_backend_t *b, bb_tensor out, float *rstd, bb_tensor in, bb_tensor w, int N, int C,
                            float eps)
{
    ln_args a = {.e = {.range = layernorm_forward_range, .x = F32(out), .z = rstd, .a = F32(in), .c = F32(w),
                       .n = (size_t)N, .C = C},
                 .bf16 = IS_BF16(in), .rms = true, .eps = eps};
    ln_run(b, &a, "rmsnorm_forward");
}

void bb_cpu_residual_rmsnorm_forward(bb_backend_t *b, bb_tensor res, bb_tensor out, float *rstd, bb_tensor x,
                                     bb_tensor y, bb_tensor w, int N, int C, float eps)
{
    ln_args a = {.e = {.range = layernorm_forward_range, .x = F32(out), .z = rstd, .a = F32(x), .c = F32(w),
                       .n = (size_t)N, .C = C},
                 .y = F32(y), .res = F32(res), .bf16 = IS_BF16(x), .rms = true, .eps = eps};
    ln_run(b, &a, "residual_rmsnorm_forward");
}

/* din for rows [lo, hi), and this slice's parts of dw and dbias (summed
 * in slice order afterwards: the same for any thread count). */
static void layernorm_backward_range(const ew_args *ea, size_t lo, size_t hi, int slice)
{
    const ln_args *a = (const ln_args *)ea;
    int C = ea->C;
    const float *in = ea->a, *w = ea->c, *dout = a->dout, *mean = a->mean, *rstd = a->rstd;
    float *din = a->din, *dw = a->parts + (size_t)slice * 2 * C, *dbias = dw + C;
    float *rows = a->bf16 ? row_scratch(a, 3, C) : NULL;
    memset(dw, 0, 2 * (size_t)C * sizeof *dw);
    if (a->bf16 && !rows) return;
    for (size_t n = lo; n < hi; n++) {
        const float *x = in + (size_t)n * C, *dy = dout + (size_t)n * C;
        float *dx = din + (size_t)n * C;
        if (a->bf16) {
            bb_bf16_widen(rows, (const uint16_t *)ea->a + (size_t)n * C, (size_t)C);
            bb_bf16_widen(rows + C, (const uint16_t *)a->dout + (size_t)n * C, (size_t)C);
            bb_bf16_widen(rows + 2 * C, (const uint16_t *)a->din + (size_t)n * C, (size_t)C);
            x = rows, dy = rows + C, dx = rows + 2 * C;
        }
        float m = a->rms ? 0.0f : mean[n], s = rstd[n];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s, dnorm = w[i] * dy[i];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean = a->rms ? 0.0f : dnorm_mean / C; /* RMSNorm subtracts no mean */
        dnorm_norm_mean /= C;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s, dnorm = w[i] * dy[i];
            dbias[i] += dy[i];
            dw[i] += norm * dy[i];
            dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
        if (a->bf16) bb_bf16_narrow((uint16_t *)a->din + (size_t)n * C, dx, (size_t)C);
    }
    free(rows);
}

/* LayerNorm's backward, or RMSNorm's (mean and dbias NULL). */
static void norm_backward(bb_backend_t *b, const char *op, bb_tensor din_t, float *dw, float *dbias, bb_tensor dout,
                          bb_tensor in, bb_tensor w, const float *mean, const float *rstd, int N, int C,
                          bool accumulate)
{
    float *din = F32(din_t);
    ln_args a = {.e = {.range = layernorm_backward_range, .a = F32(in), .c = F32(w), .n = (size_t)N, .C = C},
                 .mean = mean, .rstd = rstd, .dout = F32(dout), .din = din, .bf16 = IS_BF16(in), .rms = !mean};
    a.e.grain = EW_GRAIN / (size_t)C > 0 ? EW_GRAIN / (size_t)C : 1;
    int slices = bb_cpu_ew_slices(&a.e);
    a.parts = malloc((size_t)slices * 2 * C * sizeof *a.parts);
    if (!a.parts) {
        bb_backend_note_error(b, BB_ERR_NOMEM, "%s: out of host memory for %d slices", op, slices);
        return;
    }
    ln_run(b, &a, op);
    if (!accumulate) {
        memset(dw, 0, (size_t)C * sizeof *dw);
        if (dbias) memset(dbias, 0, (size_t)C * sizeof *dbias);
    }
    for (int k = 0; k < slices; k++) {
        const float *pw = a.parts + (size_t)k * 2 * C, *pb = pw + C;
        for (int i = 0; i < C; i++) dw[i] += pw[i];
        for (int i = 0; dbias && i < C; i++) dbias[i] += pb[i];
    }
    free(a.parts);
}

void bb_cpu_layernorm_backward(bb_backend_t *b, bb_tensor din, bb_tensor dw, bb_tensor dbias, bb_tensor dout,
                               bb_tensor in, bb_tensor w, const float *mean, const float *rstd, int N, int C,
                               bool accumulate)
{
    norm_backward(b, "layernorm_backward", din, F32(dw), F32(dbias), dout, in, w, mean, rstd, N, C, accumulate);
}

void bb_cpu_rmsnorm_backward(bb_backend_t *b, bb_tensor din, bb_tensor dw, bb_tensor dout, bb_tensor in, bb_tensor w,
                             const float *rstd, int N, int C, bool accumulate)
{
    norm_backward(b, "rmsnorm_backward", din, F32(dw), NULL, dout, in, w, NULL, rstd, N, C, accumulate);
}
