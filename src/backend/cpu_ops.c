/* cpu_ops.c — the CPU backend's ops: fp32 matrix products through
 * OpenBLAS cblas_sgemm, bf16 ones through oneDNN (cpu_dnnl.h), everything
 * else plain loops the compiler vectorizes. Contracts are in ops.def.
 *
 * bf16 tensors: the element-wise ops widen blocks of BF16_BLOCK elements
 * (the row-wise ops a row) to fp32 on the stack, run the fp32 loop on
 * them and round what they write once; the products read bf16 directly.
 *
 * Threads: OpenBLAS runs single-threaded (cpu_backend.c) and a product is
 * split into one slice of rows (or columns) per thread of the backend's
 * pool, so that BLAS and the other ops share one set of threads: OpenBLAS's
 * own workers, which spin between calls, would take the cores the pool's
 * ops need. */
#include <cblas.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_dnnl.h"
#include "cpu_ew.h"
#include "cpu_math.h"
#include "cpu_ops.h"
#include "cpu_pool.h"

/* C (M,N) = alpha · op(A) (M,K) · op(B) (K,N) + beta · C, row-major, split
 * over the pool: the longer of M and N in slices of whole 16s. */
typedef struct gemm_args {
    CBLAS_TRANSPOSE ta, tb;
    int M, N, K, lda, ldb, ldc, per;
    float alpha, beta;
    const float *A, *B;
    float *C;
    const float *bias; /* when set: each row of the task's part of C starts as bias, then beta = 1 */
    bool split_rows;
} gemm_args;

static void gemm_task(void *ctx, int part, int thread)
{
    (void)thread;
    const gemm_args *g = ctx;
    int lo = part * g->per, hi = lo + g->per, total = g->split_rows ? g->M : g->N;
    hi = hi < total ? hi : total;
    if (lo >= hi) return;
    if (g->bias) { /* in the task: its rows (or columns) of C are in cache for the product */
        int r0 = g->split_rows ? lo : 0, r1 = g->split_rows ? hi : g->M, c0 = g->split_rows ? 0 : lo,
            c1 = g->split_rows ? g->N : hi;
        for (int r = r0; r < r1; r++) memcpy(g->C + (size_t)r * g->ldc + c0, g->bias + c0, (size_t)(c1 - c0) * sizeof *g->C);
    }
    if (g->split_rows)
        cblas_sgemm(CblasRowMajor, g->ta, g->tb, hi - lo, g->N, g->K, g->alpha,
                    g->A + (g->ta == CblasNoTrans ? (size_t)lo * g->lda : (size_t)lo), g->lda, g->B, g->ldb, g->beta,
                    g->C + (size_t)lo * g->ldc, g->ldc);
    else
        cblas_sgemm(CblasRowMajor, g->ta, g->tb, g->M, hi - lo, g->K, g->alpha, g->A, g->lda,
                    g->B + (g->tb == CblasNoTrans ? (size_t)lo : (size_t)lo * g->ldb), g->ldb, g->beta, g->C + lo,
                    g->ldc);
}

/* With `bias` (N floats), C's rows start as bias and beta must be 1. */
static void sgemm_bias(bb_backend_t *b, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc,
                       const float *bias)
{
    if (M <= 0 || N <= 0) return;
    gemm_args g = {ta, tb, M, N, K, lda, ldb, ldc, 0, alpha, beta, A, B, C, bias, M >= N};
    int parts = bb_cpu_threads(b), total = g.split_rows ? M : N;
    /* below ~2 MFLOP a slice costs more to hand out than to compute */
    if ((double)M * N * K < 1 << 20) parts = 1;
    g.per = ((total + parts - 1) / parts + 15) / 16 * 16;
    parts = (total + g.per - 1) / g.per;
    bb_cpu_parallel(b, parts, gemm_task, &g);
}

static void sgemm(bb_backend_t *b, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    sgemm_bias(b, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
}

/* Below 2^25 multiply-adds the pool's split gained nothing on the 2-core
 * machines measured (Muon's 128x512 iteration: 14 ms split, 5 ms not). */
void bb_cpu_sgemm(bb_backend_t *b, bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc)
{
    CBLAS_TRANSPOSE at = ta ? CblasTrans : CblasNoTrans, bt = tb ? CblasTrans : CblasNoTrans;
    if ((double)M * N * K < (double)(1 << 25)) cblas_sgemm(CblasRowMajor, at, bt, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else sgemm(b, at, bt, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* The bf16 products (cpu_dnnl.h), split over the pool: the longer of M and
 * N in BF16_SLICES slices of whole 16s, a count that depends on the shape
 * only, so that every element is the same sum on any number of threads. */
enum { BF16_SLICES = 16 };
typedef struct bf16_gemm_args {
    bb_cpu_bf16_gemm g;
    int per;
    bool split_rows;
    atomic_bool failed;
} bf16_gemm_args;

static void bf16_gemm_task(void *ctx, int part, int thread)
{
    (void)thread;
    bf16_gemm_args *a = ctx;
    bb_cpu_bf16_gemm g = a->g;
    size_t c_size = bb_dtype_size(g.c_dtype);
    int lo = part * a->per, total = a->split_rows ? g.M : g.N, n = lo + a->per < total ? a->per : total - lo;
    if (n <= 0) return;
    if (a->split_rows) { /* B (and B32) shared */
        g.M = n;
        g.A += g.ta ? (size_t)lo : (size_t)lo * g.lda;
        g.C = (char *)g.C + (size_t)lo * g.ldc * c_size;
    } else { /* A (and A32) shared */
        g.N = n;
        g.B += g.tb ? (size_t)lo * g.ldb : (size_t)lo;
        g.C = (char *)g.C + (size_t)lo * c_size;
        if (g.bias) g.bias += lo;
    }
    if (!bb_cpu_bf16_gemm_run(&g)) atomic_store(&a->failed, true);
}

/* Without oneDNN: the operand every slice reads, widened once, in fixed
 * blocks of rows over the pool. */
typedef struct widen_args {
    float *out;
    const uint16_t *in;
    size_t n, per;
} widen_args;

static void widen_task(void *ctx, int part, int thread)
{
    (void)thread;
    const widen_args *w = ctx;
    size_t lo = (size_t)part * w->per, n = lo + w->per < w->n ? w->per : w->n - lo;
    bb_bf16_widen(w->out + lo, w->in + lo, n);
}

static float *widen_shared(bb_backend_t *b, const uint16_t *x, size_t n)
{
    float *f = malloc(n * sizeof *f);
    if (!f) return NULL;
    widen_args w = {f, x, n, 1 << 16};
    bb_cpu_parallel(b, (int)((n + w.per - 1) / w.per), widen_task, &w);
    return f;
}

static void bf16_gemm(bb_backend_t *b, const bb_cpu_bf16_gemm *g, const char *op)
{
    if (g->M <= 0 || g->N <= 0) return;
    bf16_gemm_args a = {.g = *g, .split_rows = g->M >= g->N};
    int total = a.split_rows ? g->M : g->N, parts = (double)g->M * g->N * g->K < 1 << 20 ? 1 : BF16_SLICES;
    a.per = ((total + parts - 1) / parts + 15) / 16 * 16;
    atomic_init(&a.failed, false);
    float *shared = NULL;
    if (!bb_cpu_bf16_onednn() && parts > 1) {
        /* the shared operand's stored rows times its stride, as fp32 */
        size_t n = a.split_rows ? (size_t)((g->tb ? g->N : g->K) - 1) * g->ldb + (g->tb ? g->K : g->N)
                                : (size_t)((g->ta ? g->K : g->M) - 1) * g->lda + (g->ta ? g->M : g->K);
        if (!(shared = widen_shared(b, a.split_rows ? g->B : g->A, n))) atomic_store(&a.failed, true);
        if (a.split_rows) a.g.B32 = shared;
        else a.g.A32 = shared;
    }
    if (!atomic_load(&a.failed)) bb_cpu_parallel(b, (total + a.per - 1) / a.per, bf16_gemm_task, &a);
    free(shared);
    if (atomic_load(&a.failed)) bb_backend_note_error(b, BB_ERR_NOMEM, "%s: out of host memory for a bf16 product", op);
}

static void ew_task(void *ctx, int slice, int thread)
{
    (void)thread;
    const ew_args *a = ctx;
    size_t lo = (size_t)slice * a->grain, hi = lo + a->grain < a->n ? lo + a->grain : a->n;
    a->range(a, lo, hi, slice);
}

void bb_cpu_ew_run(bb_backend_t *b, ew_args *a)
{
    if (!a->grain) a->grain = a->C ? (EW_GRAIN / (size_t)a->C > 0 ? EW_GRAIN / (size_t)a->C : 1) : EW_GRAIN;
    bb_cpu_parallel(b, bb_cpu_ew_slices(a), ew_task, a);
}

/* An element-wise op whose output x and inputs a, c (c may be NULL) are
 * all of `dtype`: bf16 runs the fp32 range on widened blocks of
 * BF16_BLOCK and rounds each output block once. x may alias a or c. */
enum { BF16_BLOCK = 1024 };
typedef struct bf16_ew {
    ew_args e;
    void (*fp32)(const ew_args *a, size_t lo, size_t hi, int slice);
    uint16_t *x;
    const uint16_t *a, *c;
} bf16_ew;

static void bf16_ew_range(const ew_args *ea, size_t lo, size_t hi, int slice)
{
    const bf16_ew *w = (const bf16_ew *)ea;
    float x[BF16_BLOCK], a[BF16_BLOCK], c[BF16_BLOCK];
    ew_args local = w->e;
    local.x = x, local.a = a, local.c = w->c ? c : NULL;
    for (size_t b0 = lo; b0 < hi; b0 += BF16_BLOCK) {
        size_t n = hi - b0 < BF16_BLOCK ? hi - b0 : BF16_BLOCK;
        bb_bf16_widen(a, w->a + b0, n);
        if (w->c) bb_bf16_widen(c, w->c + b0, n);
        w->fp32(&local, 0, n, slice);
        bb_bf16_narrow(w->x + b0, x, n);
    }
}

static void ew_run_act(bb_backend_t *b, ew_args *a, bb_dtype dtype)
{
    if (dtype != BB_DTYPE_BF16) {
        bb_cpu_ew_run(b, a);
        return;
    }
    bf16_ew w = {.e = *a, .fp32 = a->range, .x = (uint16_t *)a->x, .a = (const uint16_t *)a->a,
                 .c = (const uint16_t *)a->c};
    w.e.range = bf16_ew_range;
    bb_cpu_ew_run(b, &w.e);
}

void bb_cpu_linear_forward(bb_backend_t *b, bb_tensor out, bb_tensor in, bb_tensor w, bb_tensor bias, int N, int IC,
                           int OC, int ldo)
{
    if (IS_BF16(in)) {
        bf16_gemm(b, &(bb_cpu_bf16_gemm){.M = N, .N = OC, .K = IC, .A = H16(in), .lda = IC, .B = H16(w), .ldb = IC,
                                         .tb = true, .C = out.data, .c_dtype = out.dtype, .ldc = ldo, .bias = F32(bias)},
                  "linear_forward");
        return;
    }
    sgemm_bias(b, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, F32(in), IC, F32(w), IC, bias.data ? 1.0f : 0.0f,
               F32(out), ldo, F32(bias));
}

/* dbias[lo, hi) += the column sums of dout, rows in order (the same sums
 * for any split of the columns). */
static void bias_grad_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    (void)slice;
    float *dbias = a->x;
    const float *dout = a->a;
    const uint16_t *dout16 = a->hc; /* bf16 */
    for (int r = 0; r < a->rows; r++) {
        if (dout16) {
            const uint16_t *row = dout16 + (size_t)r * a->n;
            for (size_t o = lo; o < hi; o++) dbias[o] += bb_bf16_to_float(row[o]);
            continue;
        }
        const float *row = dout + (size_t)r * a->n;
        for (size_t o = lo; o < hi; o++) dbias[o] += row[o];
    }
}

void bb_cpu_linear_backward(bb_backend_t *b, bb_tensor din_t, bb_tensor dw_t, bb_tensor dbias_t, bb_tensor dout_t,
                            bb_tensor in_t, bb_tensor w_t, int N, int IC, int OC, int ldd, bool accumulate)
{
    float *din = F32(din_t), *dw = F32(dw_t), *dbias = F32(dbias_t);
    const float *dout = F32(dout_t), *in = F32(in_t), *w = F32(w_t);
    bool bf16 = IS_BF16(dout_t);
    if (bf16 && dw) /* dw (OC,IC) (+)= doutᵀ · in */
        bf16_gemm(b, &(bb_cpu_bf16_gemm){.M = OC, .N = IC, .K = N, .A = H16(dout_t), .lda = ldd, .ta = true,
                                         .B = H16(in_t), .ldb = IC, .C = dw, .c_dtype = BB_DTYPE_F32, .ldc = IC,
                                         .accumulate = accumulate},
                  "linear_backward");
    else if (dw) sgemm(b, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, ldd, in, IC, accumulate ? 1.0f : 0.0f, dw, IC);
    if (dbias) { /* packed rows (ops.def) */
        if (!accumulate) memset(dbias, 0, (size_t)OC * sizeof *dbias);
        size_t columns = EW_GRAIN / (size_t)N; /* about EW_GRAIN elements a slice, whole 16s of columns */
        bb_cpu_ew_run(b, &(ew_args){.range = bias_grad_range, .x = dbias, .a = bf16 ? NULL : dout,
                             .hc = bf16 ? H16(dout_t) : NULL, .n = (size_t)OC, .rows = N,
                             .grain = columns < 16 ? 16 : columns / 16 * 16});
    }
    /* last: din may alias in */
    if (din && bf16)
        bf16_gemm(b, &(bb_cpu_bf16_gemm){.M = N, .N = IC, .K = OC, .A = H16(dout_t), .lda = ldd, .B = H16(w_t),
                                         .ldb = IC, .C = din, .c_dtype = BB_DTYPE_BF16, .ldc = IC},
                  "linear_backward");
    else if (din) sgemm(b, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, ldd, w, IC, 0.0f, din, IC);
}

/* The fused ops of ops.def, composed: the same values as their two ops. */
void bb_cpu_linear_activation_forward(bb_backend_t *b, bb_activation act, bb_tensor out, bb_tensor pre, bb_tensor in,
                                      bb_tensor w, bb_tensor bias, int N, int IC, int OC)
{
    bb_tensor z = pre.data ? pre : out;
    bb_cpu_linear_forward(b, z, in, w, bias, N, IC, OC, OC);
    bb_cpu_activation_forward(b, act, out, z, (size_t)N * OC);
}

void bb_cpu_activation_linear_backward(bb_backend_t *b, bb_activation act, bb_tensor dpre, bb_tensor dw,
                                       bb_tensor dbias, bb_tensor dout, bb_tensor in, bb_tensor w, bb_tensor pre,
                                       int N, int IC, int OC, bool accumulate)
{
    bb_cpu_linear_backward(b, dpre, dw, dbias, dout, in, w, N, IC, OC, OC, accumulate);
    bb_cpu_activation_backward(b, act, dpre, dpre, pre, (size_t)N * IC);
}

static void relu_forward_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    (void)slice;
    float *out = a->x;
    const float *in = a->a;
    for (size_t i = lo; i < hi; i++) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}

static void relu_backward_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    (void)slice;
    float *din = a->x;
    const float *dout = a->a, *in = a->c;
    for (size_t i = lo; i < hi; i++) {
        float g = dout[i]; /* read unconditionally: the loop vectorizes into a blend */
        din[i] = in[i] > 0.0f ? g : 0.0f;
    }
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

static void gelu_forward_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    (void)slice;
    float *restrict out = a->x;
    const float *restrict in = a->a;
    for (size_t i = lo; i < hi; i++) {
        float x = in[i];
        out[i] = 0.5f * x * (1.0f + bb_tanhf(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

static void gelu_backward_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    (void)slice;
    float *din = a->x;
    const float *dout = a->a, *in = a->c;
    for (size_t i = lo; i < hi; i++) {
        float x = in[i];
        float t = bb_tanhf(GELU_SCALE * (x + 0.044715f * x * x * x));
        float local = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        din[i] = local * dout[i];
    }
}

/* SiLU: x · sigmoid(x); its derivative s · (1 + x · (1 - s)). */
static void silu_forward_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    (void)slice;
    float *restrict out = a->x;
    const float *restrict in = a->a;
    for (size_t i = lo; i < hi; i++) {
        float x = in[i];
        out[i] = x / (1.0f + bb_expf(-x));
    }
}

static void silu_backward_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    (void)slice;
    float *din = a->x;
    const float *dout = a->a, *in = a->c;
    for (size_t i = lo; i < hi; i++) {
        float x = in[i], s = 1.0f / (1.0f + bb_expf(-x));
        din[i] = dout[i] * s * (1.0f + x * (1.0f - s));
    }
}

typedef void (*ew_range)(const ew_args *a, size_t lo, size_t hi, int slice);
static const ew_range activation_ranges[][2] = {
    [BB_ACTIVATION_RELU] = {relu_forward_range, relu_backward_range},
    [BB_ACTIVATION_GELU_TANH] = {gelu_forward_range, gelu_backward_range},
    [BB_ACTIVATION_SILU] = {silu_forward_range, silu_backward_range},
};

/* ops.def checked `act`. */
void bb_cpu_activation_forward(bb_backend_t *b, bb_activation act, bb_tensor out, bb_tensor in, size_t n)
{
    ew_run_act(b, &(ew_args){.range = activation_ranges[act][0], .x = F32(out), .a = F32(in), .n = n}, in.dtype);
}

void bb_cpu_activation_backward(bb_backend_t *b, bb_activation act, bb_tensor din, bb_tensor dout, bb_tensor in,
                                size_t n)
{
    ew_run_act(b, &(ew_args){.range = activation_ranges[act][1], .x = F32(din), .a = F32(dout), .c = F32(in), .n = n},
               in.dtype);
}

/* An element of an activation tensor of either dtype, in fp32, and back. */
static inline float act_ld(const void *p, bool bf16, size_t i)
{
    return bf16 ? bb_bf16_to_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
static inline void act_st(void *p, bool bf16, size_t i, float v)
{
    if (bf16) ((uint16_t *)p)[i] = bb_bf16_from_float(v);
    else ((float *)p)[i] = v;
}

/* SwiGLU's rows: x = out (or dgu), a = gu, c = dout; C = F; f[0] = bf16. */
static void swiglu_forward_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    (void)slice;
    bool bf16 = a->f[0] != 0;
    size_t F = (size_t)a->C;
    for (size_t n = lo; n < hi; n++)
        for (size_t i = 0; i < F; i++) {
            float g = act_ld(a->a, bf16, n * 2 * F + i), u = act_ld(a->a, bf16, n * 2 * F + F + i);
            act_st(a->x, bf16, n * F + i, g / (1.0f + bb_expf(-g)) * u);
        }
}

/* Each (gate, up) pair is read before it is written: dgu may alias gu. */
static void swiglu_backward_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    (void)slice;
    bool bf16 = a->f[0] != 0;
    size_t F = (size_t)a->C;
    for (size_t n = lo; n < hi; n++)
        for (size_t i = 0; i < F; i++) {
            size_t at = n * 2 * F + i;
            float g = act_ld(a->a, bf16, at), u = act_ld(a->a, bf16, at + F), dh = act_ld(a->c, bf16, n * F + i);
            float sg = 1.0f / (1.0f + bb_expf(-g));
            act_st(a->x, bf16, at, dh * u * sg * (1.0f + g * (1.0f - sg)));
            act_st(a->x, bf16, at + F, dh * g * sg);
        }
}

void bb_cpu_swiglu_forward(bb_backend_t *b, bb_tensor out, bb_tensor gu, int N, int F)
{
    bb_cpu_ew_run(b, &(ew_args){.range = swiglu_forward_range, .x = out.data, .a = gu.data, .f = {IS_BF16(gu)},
                         .n = (size_t)N, .C = F});
}

void bb_cpu_swiglu_backward(bb_backend_t *b, bb_tensor dgu, bb_tensor dout, bb_tensor gu, int N, int F)
{
    bb_cpu_ew_run(b, &(ew_args){.range = swiglu_backward_range, .x = dgu.data, .a = gu.data, .c = dout.data,
                         .f = {IS_BF16(gu)}, .n = (size_t)N, .C = F});
}

/* RoPE's rows: x = qkv, a = table, C = the row's width, f: bf16, sign (1
 * forward, -1 backward), NH + KVH heads rotated, HS, T, pos0. */
static void rope_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    (void)slice;
    bool bf16 = a->f[0] != 0;
    float sign = a->f[1];
    int heads = (int)a->f[2], HS = (int)a->f[3], T = (int)a->f[4], pos0 = (int)a->f[5], half = HS / 2;
    for (size_t n = lo; n < hi; n++) {
        const float *cs = a->a + (size_t)(pos0 + (int)(n % (size_t)T)) * HS, *sn = cs + half;
        for (int h = 0; h < heads; h++) {
            size_t at = n * (size_t)a->C + (size_t)h * HS;
            for (int i = 0; i < half; i++) {
                float x0 = act_ld(a->x, bf16, at + i), x1 = act_ld(a->x, bf16, at + i + half);
                float c = cs[i], s = sign * sn[i];
                act_st(a->x, bf16, at + i, x0 * c - x1 * s);
                act_st(a->x, bf16, at + i + half, x1 * c + x0 * s);
            }
        }
    }
}

static void rope(bb_backend_t *b, bb_tensor qkv, const float *table, int B, int T, int NH, int KVH, int HS, int pos0,
                 float sign)
{
    bb_cpu_ew_run(b, &(ew_args){.range = rope_range, .x = qkv.data, .a = table,
                         .f = {IS_BF16(qkv), sign, (float)(NH + KVH), (float)HS, (float)T, (float)pos0},
                         .n = (size_t)B * T, .C = (NH + 2 * KVH) * HS});
}

void bb_cpu_rope_forward(bb_backend_t *b, bb_tensor qkv, const float *table, int B, int T, int NH, int KVH, int HS,
                         int pos0)
{
    rope(b, qkv, table, B, T, NH, KVH, HS, pos0, 1.0f);
}

void bb_cpu_rope_backward(bb_backend_t *b, bb_tensor dqkv, const float *table, int B, int T, int NH, int KVH, int HS,
                          int pos0)
{
    rope(b, dqkv, table, B, T, NH, KVH, HS, pos0, -1.0f);
}

void bb_cpu_embedding_forward(bb_backend_t *b, bb_tensor out, const int32_t *tokens, bb_tensor wte, bb_tensor wpe,
                              int B, int T, int C)
{
    (void)b;
    const float *wpe_f = F32(wpe);
    for (int i = 0; i < B * T; i++) {
        const float *te = F32(wte) + (size_t)tokens[i] * C, *pe = wpe_f ? wpe_f + (size_t)(i % T) * C : NULL;
        if (IS_BF16(out)) {
            uint16_t *o = H16(out) + (size_t)i * C;
            for (int c = 0; c < C; c++) o[c] = bb_bf16_from_float(pe ? te[c] + pe[c] : te[c]);
            continue;
        }
        float *o = F32(out) + (size_t)i * C;
        if (!pe) memcpy(o, te, (size_t)C * sizeof *o);
        else
            for (int c = 0; c < C; c++) o[c] = te[c] + pe[c];
    }
}

void bb_cpu_embedding_backward(bb_backend_t *b, bb_tensor dwte_t, bb_tensor dwpe_t, bb_tensor dout_t,
                               const int32_t *tokens, int B, int T, int C, int V, int maxT, bool accumulate_wte,
                               bool accumulate_wpe)
{
    (void)b;
    float *dwte = F32(dwte_t), *dwpe = F32(dwpe_t);
    const float *dout = F32(dout_t);
    if (!accumulate_wte) memset(dwte, 0, (size_t)V * C * sizeof *dwte);
    if (dwpe && !accumulate_wpe) memset(dwpe, 0, (size_t)maxT * C * sizeof *dwpe);
    for (int i = 0; i < B * T; i++) {
        const float *d = dout + (size_t)i * C;
        if (IS_BF16(dout_t)) {
            const uint16_t *h = H16(dout_t) + (size_t)i * C;
            float *te = dwte + (size_t)tokens[i] * C, *pe = dwpe ? dwpe + (size_t)(i % T) * C : NULL;
            for (int c = 0; c < C; c++) te[c] += bb_bf16_to_float(h[c]);
            if (pe)
                for (int c = 0; c < C; c++) pe[c] += bb_bf16_to_float(h[c]);
            continue;
        }
        float *te = dwte + (size_t)tokens[i] * C;
        for (int c = 0; c < C; c++) te[c] += d[c];
        if (!dwpe) continue;
        float *pe = dwpe + (size_t)(i % T) * C;
        for (int c = 0; c < C; c++) pe[c] += d[c];
    }
}

static void add_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    (void)slice;
    float *out = a->x;
    const float *x = a->a, *y = a->c;
    for (size_t i = lo; i < hi; i++) out[i] = x[i] + y[i];
}

void bb_cpu_add(bb_backend_t *b, bb_tensor out, bb_tensor x, bb_tensor y, size_t n)
{
    ew_run_act(b, &(ew_args){.range = add_range, .x = F32(out), .a = F32(x), .c = F32(y), .n = n}, x.dtype);
}

double bb_host_sum_squares(const float *x, size_t n) { return bb_sum_squares_f32(x, n); }

static void sum_squares_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    a->parts[slice] = bb_sum_squares_f32(a->a + lo, hi - lo);
}

/* Per slice in double, the slices summed in order. */
static double sum_squares_one(bb_backend_t *b, const float *x, size_t n)
{
    ew_args a = {.range = sum_squares_range, .a = x, .n = n, .grain = EW_GRAIN};
    double one, *parts = bb_cpu_ew_slices(&a) > 1 ? malloc((size_t)bb_cpu_ew_slices(&a) * sizeof *parts) : &one;
    if (!parts) {
        bb_backend_note_error(b, BB_ERR_NOMEM, "sum_squares: out of host memory");
        return NAN;
    }
    a.parts = parts;
    bb_cpu_ew_run(b, &a);
    double s = 0.0;
    for (int k = 0; k < bb_cpu_ew_slices(&a); k++) s += parts[k];
    if (parts != &one) free(parts);
    return s;
}

/* Range by range, in order: the same as summing each range alone. */
double bb_cpu_sum_squares_ranges(bb_backend_t *b, const float *x, const size_t *lo, const size_t *hi, int n)
{
    double s = 0.0;
    for (int r = 0; r < n; r++) s += sum_squares_one(b, x + lo[r], hi[r] - lo[r]);
    return s;
}

void bb_cpu_sum_squares_into(bb_backend_t *b, const float *x, size_t n, double *out) { *out = sum_squares_one(b, x, n); }

static void convert_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    (void)slice;
    if (a->h) bb_bf16_narrow(a->h + lo, a->a + lo, hi - lo);
    else bb_bf16_widen(a->x + lo, a->hc + lo, hi - lo);
}

void bb_cpu_convert(bb_backend_t *b, bb_tensor out, bb_tensor in, size_t n)
{
    if (out.dtype == in.dtype) {
        if (out.data != in.data) memmove(out.data, in.data, n * bb_dtype_size(in.dtype));
        return;
    }
    bool to16 = IS_BF16(out);
    bb_cpu_ew_run(b, &(ew_args){.range = convert_range, .x = to16 ? NULL : F32(out), .a = to16 ? F32(in) : NULL,
                         .h = to16 ? H16(out) : NULL, .hc = to16 ? NULL : H16(in), .n = n});
}

void bb_cpu_records_to_tokens(bb_backend_t *b, int32_t *tokens, int32_t *targets, const uint8_t *records, int count,
                           int B, int T, int width)
{
    (void)b;
    for (int r = 0; r < B; r++)
        for (int t = 0; t <= T; t++) {
            uint32_t v = 0;
            if (r < count) {
                const uint8_t *p = records + ((size_t)r * (T + 1) + t) * width;
                v = width == 2 ? (uint32_t)(p[0] | p[1] << 8)
                               : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            }
            if (t < T) tokens[(size_t)r * T + t] = (int32_t)v;
            if (t > 0) targets[(size_t)r * T + t - 1] = r < count ? (int32_t)v : -1;
        }
}

void bb_cpu_records_to_images(bb_backend_t *b, bb_tensor features, int32_t *labels, const uint8_t *records, int count,
                              int B, int inputs)
{
    (void)b;
    for (int r = 0; r < B; r++) {
        const uint8_t *p = records + (size_t)r * (inputs + 1);
        float *x = F32(features) + (size_t)r * inputs;
        labels[r] = r < count ? p[0] : -1;
        if (r >= count) memset(x, 0, (size_t)inputs * sizeof *x);
        else
            for (int i = 0; i < inputs; i++) x[i] = p[1 + i] / 255.0f;
    }
}
