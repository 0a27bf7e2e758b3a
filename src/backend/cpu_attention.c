/* cpu_attention.c — causal multi-head self-attention on the CPU, tiled
 * (flash-style): memory linear in T.
 *
 * A row of qkv holds q (NH heads), then k and v (KVH heads each), every
 * head hs wide; query head h reads key/value head h / (NH / KVH).
 *
 * Forward: a task is one (batch, head, tile of QT query rows). It walks the
 * key/value tiles of KT keys up to the diagonal with an online softmax
 * (running max m and sum l per row, the output accumulator rescaled when
 * the max grows) and keeps only the output and lse = m + log l per row.
 * Backward: a task is one (batch, key/value head). D = rowsum(dout ∘ out)
 * first, for each query head of its group; then per key tile, for each of
 * the group's query heads in order, every query row at or below it
 * recomputes its probabilities p = exp(scale·q·k - lse), and dV += p·dout,
 * dS = p ∘ (dout·vᵀ - D), dK += scale·dS·q, dQ += scale·dS·k. No tile
 * outlives its task's loop: the only scratch is a few tiles and D (T
 * floats a query head) per thread.
 *
 * Tasks spread over the backend's threads (cpu_pool.h); a tile's products
 * are cblas_sgemm calls in the task's thread on strided views of qkv (row
 * stride W = (NH + 2·KVH)·hs), the softmax parts plain loops. Each task's sums run in a
 * fixed order whatever the thread count, so results are bitwise the same
 * on any number of threads.
 *
 * bf16 tensors are read a tile at a time: each tile of q, k, v and dout
 * widened into the thread's scratch just before its products, the
 * products in fp32 (on a CPU without AMX OpenBLAS's fp32 tiles outrun
 * oneDNN's bf16 ones at these sizes), every output rounded once as its
 * tile is done. The backward's dq, summed over every key tile, is summed
 * in an fp32 buffer of the task's (T rows of each query head of its group)
 * and rounded at the end. No fp32 copy of a whole tensor is made. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_math.h"
#include "cpu_ops.h"
#include "cpu_pool.h"

enum { QT = 64, KT = 64 };

typedef struct attn_args {
    void *out, *dqkv;               /* f32 or bf16, as qkv */
    const void *qkv, *dout, *o;
    float *lse;
    const float *lse_in;
    bool bf16;
    int B, T, NH, KVH, hs, qtiles;
    int C, W, koff, voff; /* out's row (NH·hs), qkv's row ((NH + 2·KVH)·hs), where k and v start in it */
    float scale;
    float **scratch; /* per thread */
} attn_args;

/* C (m,n) = alpha · A (m,k) · op(B) + beta · C, row-major, on this thread
 * (OpenBLAS is single-threaded here: the tasks are the parallelism). */
static void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *A, int lda, const float *B, int ldb,
                 float beta, float *C, int ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, A, lda,
                B, ldb, beta, C, ldc);
}

/* `rows` rows of hs elements at element `at` of `base` (row stride ld), as
 * fp32: in place for an f32 tensor, else widened into `tile` (stride hs);
 * *ld_out is the view's stride. */
static const float *rows_f32(const attn_args *a, const void *base, size_t at, int ld, int rows, float *tile,
                             int *ld_out)
{
    if (!a->bf16) {
        *ld_out = ld;
        return (const float *)base + at;
    }
    for (int r = 0; r < rows; r++)
        bb_bf16_widen(tile + (size_t)r * a->hs, (const uint16_t *)base + at + (size_t)r * ld, (size_t)a->hs);
    *ld_out = a->hs;
    return tile;
}

/* Stores hs fp32 values into element `at` of `base`, in its dtype. */
static void store_row(const attn_args *a, void *base, size_t at, const float *x)
{
    if (a->bf16) bb_bf16_narrow((uint16_t *)base + at, x, (size_t)a->hs);
    else memcpy((float *)base + at, x, (size_t)a->hs * sizeof *x);
}

static float elem(const attn_args *a, const void *base, size_t at)
{
    return a->bf16 ? bb_bf16_to_float(((const uint16_t *)base)[at]) : ((const float *)base)[at];
}

static void forward_task(void *ctx, int index, int thread)
{
    const attn_args *a = ctx;
    int hs = a->hs, C = a->C, C3 = a->W, T = a->T;
    int bh = index / a->qtiles, qt = a->qtiles - 1 - index % a->qtiles; /* longest rows first */
    int bi = bh / a->NH, h = bh % a->NH, g = h / (a->NH / a->KVH);
    int i0 = qt * QT, rows = i0 + QT < T ? QT : T - i0;
    size_t q = (size_t)bi * T * C3 + (size_t)h * hs, k = (size_t)bi * T * C3 + a->koff + (size_t)g * hs,
           v = k + (a->voff - a->koff);
    float *s = a->scratch[thread], *acc = s + QT * KT, *m = acc + (size_t)QT * hs, *l = m + QT;
    float *qb = l + QT, *kb = qb + (size_t)QT * hs, *vb = kb + (size_t)KT * hs; /* bf16's tiles */
    int ldq, ldk, ldv;
    const float *qi = rows_f32(a, a->qkv, q + (size_t)i0 * C3, C3, rows, qb, &ldq);
    for (int r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0.0f;
    for (int j0 = 0; j0 < i0 + rows; j0 += KT) {
        int nk = j0 + KT < i0 + rows ? KT : i0 + rows - j0;
        const float *kj = rows_f32(a, a->qkv, k + (size_t)j0 * C3, C3, nk, kb, &ldk);
        const float *vj = rows_f32(a, a->qkv, v + (size_t)j0 * C3, C3, nk, vb, &ldv);
        /* S = scale · Q Kᵀ for this tile (ld KT) */
        gemm(false, true, rows, nk, hs, a->scale, qi, ldq, kj, ldk, 0.0f, s, KT);
        for (int r = 0; r < rows; r++) {
            int valid = i0 + r - j0 + 1 < nk ? i0 + r - j0 + 1 : nk; /* keys j <= i; >= 1 since j0 <= i0 */
            float *sr = s + (size_t)r * KT, mx = m[r], sum = 0.0f;
            for (int j = 0; j < valid; j++) mx = sr[j] > mx ? sr[j] : mx;
            for (int j = 0; j < valid; j++) sr[j] = bb_expf(sr[j] - mx);
            for (int j = valid; j < nk; j++) sr[j] = 0.0f;
            for (int j = 0; j < valid; j++) sum += sr[j];
            float corr = bb_expf(m[r] - mx), *ar = acc + (size_t)r * hs;
            if (j0 == 0) memset(ar, 0, (size_t)hs * sizeof *ar);
            else if (corr != 1.0f)
                for (int d = 0; d < hs; d++) ar[d] *= corr;
            l[r] = l[r] * corr + sum;
            m[r] = mx;
        }
        /* acc += P · V */
        gemm(false, false, rows, hs, nk, 1.0f, s, KT, vj, ldv, 1.0f, acc, hs);
    }
    for (int r = 0; r < rows; r++) {
        int i = i0 + r;
        float inv = 1.0f / l[r], *ar = acc + (size_t)r * hs;
        for (int d = 0; d < hs; d++) ar[d] *= inv;
        store_row(a, a->out, ((size_t)bi * T + i) * C + (size_t)h * hs, ar);
        a->lse[(size_t)bh * T + i] = m[r] + logf(l[r]);
    }
}

static void backward_task(void *ctx, int bg, int thread)
{
    const attn_args *a = ctx;
    int hs = a->hs, C = a->C, C3 = a->W, T = a->T, G = a->NH / a->KVH;
    int bi = bg / a->KVH, g = bg % a->KVH;
    size_t k0 = (size_t)bi * T * C3 + a->koff + (size_t)g * hs, v0 = k0 + (a->voff - a->koff);
    float *p = a->scratch[thread], *ds = p + QT * KT, *dk = ds + QT * KT, *dv = dk + (size_t)KT * hs,
          *Dg = dv + (size_t)KT * hs; /* (G, T): D of each query head of the group */
    /* bf16's tiles, and dq in fp32: (G, T, hs) */
    float *kb = Dg + (size_t)G * T, *vb = kb + (size_t)KT * hs, *qb = vb + (size_t)KT * hs,
          *dyb = qb + (size_t)QT * hs, *dq32 = dyb + (size_t)QT * hs;
    for (int e = 0; e < G; e++) {
        int h = g * G + e;
        size_t yoff = (size_t)bi * T * C + (size_t)h * hs;
        float *D = Dg + (size_t)e * T;
        for (int i = 0; i < T; i++) {
            float dot = 0.0f;
            for (int d = 0; d < hs; d++)
                dot += elem(a, a->dout, yoff + (size_t)i * C + d) * elem(a, a->o, yoff + (size_t)i * C + d);
            D[i] = dot;
            if (!a->bf16)
                memset((float *)a->dqkv + (size_t)bi * T * C3 + (size_t)h * hs + (size_t)i * C3, 0,
                       (size_t)hs * sizeof(float));
        }
    }
    if (a->bf16) memset(dq32, 0, (size_t)G * T * hs * sizeof *dq32);
    for (int j0 = 0; j0 < T; j0 += KT) {
        int nk = j0 + KT < T ? KT : T - j0, ldk, ldv;
        const float *k = rows_f32(a, a->qkv, k0 + (size_t)j0 * C3, C3, nk, kb, &ldk);
        const float *v = rows_f32(a, a->qkv, v0 + (size_t)j0 * C3, C3, nk, vb, &ldv);
        for (int e = 0; e < G; e++) { /* the group's query heads, in order */
            int h = g * G + e, bh = bi * a->NH + h;
            size_t q = (size_t)bi * T * C3 + (size_t)h * hs, dy = (size_t)bi * T * C + (size_t)h * hs;
            const float *D = Dg + (size_t)e * T, *lse = a->lse_in + (size_t)bh * T;
            for (int i0 = j0 / QT * QT; i0 < T; i0 += QT) {
                int rows = i0 + QT < T ? QT : T - i0, ldq, ldy, lddq = a->bf16 ? hs : C3;
                const float *qi = rows_f32(a, a->qkv, q + (size_t)i0 * C3, C3, rows, qb, &ldq);
                const float *dyi = rows_f32(a, a->dout, dy + (size_t)i0 * C, C, rows, dyb, &ldy);
                float *dq = a->bf16 ? dq32 + ((size_t)e * T + i0) * hs : (float *)a->dqkv + q + (size_t)i0 * C3;
                /* P from the saved lse; dP = dout · Vᵀ */
                gemm(false, true, rows, nk, hs, a->scale, qi, ldq, k, ldk, 0.0f, p, KT);
                gemm(false, true, rows, nk, hs, 1.0f, dyi, ldy, v, ldv, 0.0f, ds, KT);
                for (int r = 0; r < rows; r++) {
                    int i = i0 + r, valid = i - j0 + 1 < nk ? i - j0 + 1 : nk;
                    float *pr = p + (size_t)r * KT, *dr = ds + (size_t)r * KT;
                    if (valid < 0) valid = 0;
                    for (int j = 0; j < valid; j++) pr[j] = bb_expf(pr[j] - lse[i]);
                    for (int j = 0; j < valid; j++) dr[j] = pr[j] * (dr[j] - D[i]) * a->scale;
                    for (int j = valid; j < nk; j++) pr[j] = dr[j] = 0.0f;
                }
                bool first = e == 0 && i0 == j0 / QT * QT;
                /* dV += Pᵀ · dout, dK += scale·dSᵀ · Q (scale is in dS), dQ += dS · K */
                gemm(true, false, nk, hs, rows, 1.0f, p, KT, dyi, ldy, first ? 0.0f : 1.0f, dv, hs);
                gemm(true, false, nk, hs, rows, 1.0f, ds, KT, qi, ldq, first ? 0.0f : 1.0f, dk, hs);
                gemm(false, false, rows, hs, nk, 1.0f, ds, KT, k, ldk, 1.0f, dq, lddq);
            }
        }
        for (int j = 0; j < nk; j++) {
            store_row(a, a->dqkv, k0 + (size_t)(j0 + j) * C3, dk + (size_t)j * hs);
            store_row(a, a->dqkv, v0 + (size_t)(j0 + j) * C3, dv + (size_t)j * hs);
        }
    }
    for (int e = 0; e < G && a->bf16; e++)
        for (int i = 0; i < T; i++)
            store_row(a, a->dqkv, (size_t)bi * T * C3 + (size_t)(g * G + e) * hs + (size_t)i * C3,
                      dq32 + ((size_t)e * T + i) * hs);
}

/* Per-thread scratch of `floats` each; NULL when out of memory. */
static float **thread_scratch(int threads, size_t floats)
{
    float **s = calloc((size_t)threads, sizeof *s);
    for (int t = 0; s && t < threads; t++)
        if (!(s[t] = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64))) {
            while (t--) free(s[t]);
            free(s);
            return NULL;
        }
    return s;
}

static void free_scratch(float **s, int threads)
{
    for (int t = 0; s && t < threads; t++) free(s[t]);
    free(s);
}

static attn_args attention_args(int B, int T, int NH, int KVH, int HS)
{
    return (attn_args){.B = B, .T = T, .NH = NH, .KVH = KVH, .hs = HS, .C = NH * HS, .W = (NH + 2 * KVH) * HS,
                       .koff = NH * HS, .voff = (NH + KVH) * HS, .qtiles = (T + QT - 1) / QT,
                       .scale = 1.0f / sqrtf((float)HS)};
}

void bb_cpu_attention_forward(bb_backend_t *b, bb_tensor out, float *lse, bb_tensor qkv, int B, int T, int NH, int KVH,
                              int HS)
{
    int threads = bb_cpu_threads(b);
    attn_args a = attention_args(B, T, NH, KVH, HS);
    a.out = out.data, a.lse = lse, a.qkv = qkv.data, a.bf16 = qkv.dtype == BB_DTYPE_BF16;
    a.scratch = thread_scratch(threads, (size_t)QT * KT + (size_t)QT * HS + 2 * QT +
                                            (a.bf16 ? (size_t)(QT + 2 * KT) * HS : 0));
    if (!a.scratch) {
        bb_backend_note_error(b, BB_ERR_NOMEM, "attention_forward: out of host memory for its tiles");
        return;
    }
    bb_cpu_parallel(b, B * NH * a.qtiles, forward_task, &a);
    free_scratch(a.scratch, threads);
}

/* One row per head, on the calling thread: the work is one row's. */
void bb_cpu_attention_decode(bb_backend_t *b, bb_tensor out_t, float *scores, bb_tensor kv_t, bb_tensor qkv_t, int T,
                             int NH, int KVH, int HS)
{
    (void)b;
    size_t W = 2 * (size_t)KVH * HS, voff = (size_t)KVH * HS; /* a cache row: keys, then values */
    const float *q = qkv_t.data;
    float *kv = kv_t.data, scale = 1.0f / sqrtf((float)HS);
    memcpy(kv + (size_t)(T - 1) * W, q + (size_t)NH * HS, W * sizeof(float));
    for (int h = 0; h < NH; h++) {
        int g = h / (NH / KVH);
        float *s = scores + (size_t)h * T, max = -INFINITY, sum = 0.0f;
        for (int t = 0; t < T; t++) {
            const float *k = kv + (size_t)t * W + g * HS;
            float dot = 0.0f;
            for (int d = 0; d < HS; d++) dot += q[h * HS + d] * k[d];
            s[t] = dot * scale;
            max = s[t] > max ? s[t] : max;
        }
        for (int t = 0; t < T; t++) sum += s[t] = expf(s[t] - max);
        float *o = (float *)out_t.data + h * HS, inv = 1.0f / sum;
        for (int d = 0; d < HS; d++) o[d] = 0.0f;
        for (int t = 0; t < T; t++) {
            const float *v = kv + (size_t)t * W + voff + g * HS;
            float p = s[t] * inv;
            for (int d = 0; d < HS; d++) o[d] += p * v[d];
        }
    }
}

void bb_cpu_attention_backward(bb_backend_t *b, bb_tensor dqkv, bb_tensor dout, bb_tensor qkv, bb_tensor out,
                               const float *lse, int B, int T, int NH, int KVH, int HS)
{
    int threads = bb_cpu_threads(b), G = NH / KVH;
    attn_args a = attention_args(B, T, NH, KVH, HS);
    a.dqkv = dqkv.data, a.dout = dout.data, a.qkv = qkv.data, a.o = out.data, a.lse_in = lse;
    a.bf16 = qkv.dtype == BB_DTYPE_BF16;
    a.scratch = thread_scratch(threads, 2 * (size_t)QT * KT + 2 * (size_t)KT * HS + (size_t)G * T +
                                            (a.bf16 ? (size_t)(2 * KT + 2 * QT) * HS + (size_t)G * T * HS : 0));
    if (!a.scratch) {
        bb_backend_note_error(b, BB_ERR_NOMEM, "attention_backward: out of host memory for its tiles");
        return;
    }
    bb_cpu_parallel(b, B * KVH, backward_task, &a);
    free_scratch(a.scratch, threads);
}
