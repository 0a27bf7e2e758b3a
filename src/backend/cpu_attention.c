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
 * bf16 tensors are widened into fp32 copies for the op's duration and its
 * outputs rounded once at the end: the tiles' products run in fp32 (bf16
 * products in the tiles are not written yet). */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_math.h"
#include "cpu_ops.h"
#include "cpu_pool.h"

enum { QT = 64, KT = 64 };

typedef struct attn_args {
    float *out, *lse, *dqkv;
    const float *qkv, *dout, *o;
    const float *lse_in;
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

static void forward_task(void *ctx, int index, int thread)
{
    const attn_args *a = ctx;
    int hs = a->hs, C = a->C, C3 = a->W, T = a->T;
    int bh = index / a->qtiles, qt = a->qtiles - 1 - index % a->qtiles; /* longest rows first */
    int bi = bh / a->NH, h = bh % a->NH, g = h / (a->NH / a->KVH);
    int i0 = qt * QT, rows = i0 + QT < T ? QT : T - i0;
    const float *q = a->qkv + (size_t)bi * T * C3 + (size_t)h * hs;
    const float *k = a->qkv + (size_t)bi * T * C3 + a->koff + (size_t)g * hs, *v = k + (a->voff - a->koff);
    float *s = a->scratch[thread], *acc = s + QT * KT, *m = acc + (size_t)QT * hs, *l = m + QT;
    for (int r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0.0f;
    for (int j0 = 0; j0 < i0 + rows; j0 += KT) {
        int nk = j0 + KT < i0 + rows ? KT : i0 + rows - j0;
        /* S = scale · Q Kᵀ for this tile (ld KT) */
        gemm(false, true, rows, nk, hs, a->scale, q + (size_t)i0 * C3, C3, k + (size_t)j0 * C3, C3, 0.0f, s, KT);
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
        gemm(false, false, rows, hs, nk, 1.0f, s, KT, v + (size_t)j0 * C3, C3, 1.0f, acc, hs);
    }
    for (int r = 0; r < rows; r++) {
        int i = i0 + r;
        float inv = 1.0f / l[r], *o = a->out + ((size_t)bi * T + i) * C + (size_t)h * hs;
        for (int d = 0; d < hs; d++) o[d] = acc[(size_t)r * hs + d] * inv;
        a->lse[(size_t)bh * T + i] = m[r] + logf(l[r]);
    }
}

static void backward_task(void *ctx, int bg, int thread)
{
    const attn_args *a = ctx;
    int hs = a->hs, C = a->C, C3 = a->W, T = a->T, G = a->NH / a->KVH;
    int bi = bg / a->KVH, g = bg % a->KVH;
    const float *k0 = a->qkv + (size_t)bi * T * C3 + a->koff + (size_t)g * hs, *v0 = k0 + (a->voff - a->koff);
    float *dk0 = a->dqkv + (size_t)bi * T * C3 + a->koff + (size_t)g * hs, *dv0 = dk0 + (a->voff - a->koff);
    float *p = a->scratch[thread], *ds = p + QT * KT, *dk = ds + QT * KT, *dv = dk + (size_t)KT * hs,
          *Dg = dv + (size_t)KT * hs; /* (G, T): D of each query head of the group */
    for (int e = 0; e < G; e++) {
        int h = g * G + e;
        size_t yoff = (size_t)bi * T * C + (size_t)h * hs;
        const float *dy = a->dout + yoff, *y = a->o + yoff;
        float *dq = a->dqkv + (size_t)bi * T * C3 + (size_t)h * hs, *D = Dg + (size_t)e * T;
        for (int i = 0; i < T; i++) {
            float dot = 0.0f;
            for (int d = 0; d < hs; d++) dot += dy[(size_t)i * C + d] * y[(size_t)i * C + d];
            D[i] = dot;
            memset(dq + (size_t)i * C3, 0, (size_t)hs * sizeof *dq);
        }
    }
    for (int j0 = 0; j0 < T; j0 += KT) {
        int nk = j0 + KT < T ? KT : T - j0;
        const float *k = k0 + (size_t)j0 * C3, *v = v0 + (size_t)j0 * C3;
        for (int e = 0; e < G; e++) { /* the group's query heads, in order */
            int h = g * G + e, bh = bi * a->NH + h;
            const float *q = a->qkv + (size_t)bi * T * C3 + (size_t)h * hs, *D = Dg + (size_t)e * T;
            const float *dy = a->dout + (size_t)bi * T * C + (size_t)h * hs, *lse = a->lse_in + (size_t)bh * T;
            float *dq = a->dqkv + (size_t)bi * T * C3 + (size_t)h * hs;
            for (int i0 = j0 / QT * QT; i0 < T; i0 += QT) {
                int rows = i0 + QT < T ? QT : T - i0;
                const float *qi = q + (size_t)i0 * C3, *dyi = dy + (size_t)i0 * C;
                /* P from the saved lse; dP = dout · Vᵀ */
                gemm(false, true, rows, nk, hs, a->scale, qi, C3, k, C3, 0.0f, p, KT);
                gemm(false, true, rows, nk, hs, 1.0f, dyi, C, v, C3, 0.0f, ds, KT);
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
                gemm(true, false, nk, hs, rows, 1.0f, p, KT, dyi, C, first ? 0.0f : 1.0f, dv, hs);
                gemm(true, false, nk, hs, rows, 1.0f, ds, KT, qi, C3, first ? 0.0f : 1.0f, dk, hs);
                gemm(false, false, rows, hs, nk, 1.0f, ds, KT, k, C3, 1.0f, dq + (size_t)i0 * C3, C3);
            }
        }
        for (int j = 0; j < nk; j++) {
            memcpy(dk0 + (size_t)(j0 + j) * C3, dk + (size_t)j * hs, (size_t)hs * sizeof *dk);
            memcpy(dv0 + (size_t)(j0 + j) * C3, dv + (size_t)j * hs, (size_t)hs * sizeof *dv);
        }
    }
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

/* bf16: fp32 copies of the op's tensors (n elements each, widened when
 * `in`), and their release, rounding `out` copies back. */
typedef struct widened {
    bb_tensor *t[4];
    bb_tensor orig[4];
    size_t n[4];
    bool out[4];
    int count;
} widened;

static bool widen_add(widened *w, bb_tensor *t, size_t n, bool out)
{
    int k = w->count++;
    w->t[k] = t, w->orig[k] = *t, w->n[k] = n, w->out[k] = out;
    float *f = malloc(n * sizeof *f);
    if (!f) return false;
    if (!out) bb_bf16_widen(f, t->data, n);
    *t = bb_f32(f);
    return true;
}

/* Rounds the outputs into the bf16 tensors (when `done`) and frees the copies. */
static void widen_end(widened *w, bool done)
{
    for (int k = 0; k < w->count; k++) {
        if (w->t[k]->data == w->orig[k].data) continue; /* its copy was never made */
        const float *f = w->t[k]->data;
        if (done && w->out[k]) bb_bf16_narrow(w->orig[k].data, f, w->n[k]);
        free(w->t[k]->data);
        *w->t[k] = w->orig[k];
    }
}

static void attention_forward_f32(bb_backend_t *b, bb_tensor out, float *lse, bb_tensor qkv, int B, int T, int NH,
                                  int KVH, int HS);
static void attention_backward_f32(bb_backend_t *b, bb_tensor dqkv, bb_tensor dout, bb_tensor qkv, bb_tensor out,
                                   const float *lse, int B, int T, int NH, int KVH, int HS);

void bb_cpu_attention_forward(bb_backend_t *b, bb_tensor out, float *lse, bb_tensor qkv, int B, int T, int NH, int KVH,
                              int HS)
{
    if (qkv.dtype != BB_DTYPE_BF16) {
        attention_forward_f32(b, out, lse, qkv, B, T, NH, KVH, HS);
        return;
    }
    size_t rows = (size_t)B * T;
    widened w = {0};
    bool ok = widen_add(&w, &qkv, rows * (NH + 2 * KVH) * HS, false) && widen_add(&w, &out, rows * NH * HS, true);
    if (ok) attention_forward_f32(b, out, lse, qkv, B, T, NH, KVH, HS);
    else bb_backend_note_error(b, BB_ERR_NOMEM, "attention_forward: out of host memory for its fp32 operands");
    widen_end(&w, ok);
}

void bb_cpu_attention_backward(bb_backend_t *b, bb_tensor dqkv, bb_tensor dout, bb_tensor qkv, bb_tensor out,
                               const float *lse, int B, int T, int NH, int KVH, int HS)
{
    if (qkv.dtype != BB_DTYPE_BF16) {
        attention_backward_f32(b, dqkv, dout, qkv, out, lse, B, T, NH, KVH, HS);
        return;
    }
    size_t rows = (size_t)B * T, W = (size_t)(NH + 2 * KVH) * HS, C = (size_t)NH * HS;
    widened w = {0};
    bool ok = widen_add(&w, &qkv, rows * W, false) && widen_add(&w, &out, rows * C, false) &&
              widen_add(&w, &dout, rows * C, false) && widen_add(&w, &dqkv, rows * W, true);
    if (ok) attention_backward_f32(b, dqkv, dout, qkv, out, lse, B, T, NH, KVH, HS);
    else bb_backend_note_error(b, BB_ERR_NOMEM, "attention_backward: out of host memory for its fp32 operands");
    widen_end(&w, ok);
}

static void attention_forward_f32(bb_backend_t *b, bb_tensor out, float *lse, bb_tensor qkv, int B, int T, int NH,
                                  int KVH, int HS)
{
    int threads = bb_cpu_threads(b);
    attn_args a = attention_args(B, T, NH, KVH, HS);
    a.out = out.data, a.lse = lse, a.qkv = qkv.data;
    a.scratch = thread_scratch(threads, (size_t)QT * KT + (size_t)QT * HS + 2 * QT);
    if (!a.scratch) {
        bb_backend_note_error(b, BB_ERR_NOMEM, "attention_forward: out of host memory for its tiles");
        return;
    }
    bb_cpu_parallel(b, B * NH * a.qtiles, forward_task, &a);
    free_scratch(a.scratch, threads);
}

/* One row per head, on the calling thread: the work is one row's. */
void bb_cpu_attention_decode(bb_backend_t *b, bb_tensor out_t, float *scores, bb_tensor qkv_t, int T, int NH, int KVH,
                             int HS)
{
    (void)b;
    attn_args a = attention_args(1, T, NH, KVH, HS);
    const float *qkv = qkv_t.data, *q = qkv + (size_t)(T - 1) * a.W;
    for (int h = 0; h < NH; h++) {
        int g = h / (NH / KVH);
        float *s = scores + (size_t)h * T, max = -INFINITY, sum = 0.0f;
        for (int t = 0; t < T; t++) {
            const float *k = qkv + (size_t)t * a.W + a.koff + g * HS;
            float dot = 0.0f;
            for (int d = 0; d < HS; d++) dot += q[h * HS + d] * k[d];
            s[t] = dot * a.scale;
            max = s[t] > max ? s[t] : max;
        }
        for (int t = 0; t < T; t++) sum += s[t] = expf(s[t] - max);
        float *o = (float *)out_t.data + h * HS, inv = 1.0f / sum;
        for (int d = 0; d < HS; d++) o[d] = 0.0f;
        for (int t = 0; t < T; t++) {
            const float *v = qkv + (size_t)t * a.W + a.voff + g * HS;
            float p = s[t] * inv;
            for (int d = 0; d < HS; d++) o[d] += p * v[d];
        }
    }
}

static void attention_backward_f32(bb_backend_t *b, bb_tensor dqkv, bb_tensor dout, bb_tensor qkv, bb_tensor out,
                                   const float *lse, int B, int T, int NH, int KVH, int HS)
{
    int threads = bb_cpu_threads(b);
    attn_args a = attention_args(B, T, NH, KVH, HS);
    a.dqkv = dqkv.data, a.dout = dout.data, a.qkv = qkv.data, a.o = out.data, a.lse_in = lse;
    a.scratch = thread_scratch(threads, 2 * (size_t)QT * KT + 2 * (size_t)KT * HS + (size_t)(NH / KVH) * T);
    if (!a.scratch) {
        bb_backend_note_error(b, BB_ERR_NOMEM, "attention_backward: out of host memory for its tiles");
        return;
    }
    bb_cpu_parallel(b, B * KVH, backward_task, &a);
    free_scratch(a.scratch, threads);
}
