/* cpu_attention.c — causal multi-head self-attention on the CPU. Per
 * (batch, head) the products Q·Kᵀ, P·V and their gradients are cblas_sgemm
 * calls on strided views of qkv (row stride 3C), so BLAS threads carry the
 * bulk of the work; the softmax and its gradient are row loops over the
 * causal part only. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "cpu_math.h"
#include "cpu_ops.h"

void bb_cpu_attention_forward(bb_backend_t *b, float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    (void)b;
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int bi = 0; bi < B; bi++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)bi * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            float *p = att + ((size_t)bi * NH + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3, 0.0f, p, T);
            for (int i = 0; i < T; i++) {
                float *row = p + (size_t)i * T, max = row[0], sum = 0.0f;
                for (int j = 1; j <= i; j++) max = row[j] > max ? row[j] : max;
                for (int j = 0; j <= i; j++) sum += row[j] = bb_expf(row[j] - max);
                float inv = 1.0f / sum;
                for (int j = 0; j <= i; j++) row[j] *= inv;
                memset(row + i + 1, 0, (size_t)(T - i - 1) * sizeof *row);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, v, C3, 0.0f,
                        out + (size_t)bi * T * C + h * hs, C);
        }
}

void bb_cpu_attention_backward(bb_backend_t *b, float *dqkv, float *scratch, const float *dout, const float *qkv,
                            const float *att, int B, int T, int C, int NH)
{
    (void)b;
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int bi = 0; bi < B; bi++)
        for (int h = 0; h < NH; h++) {
            size_t qoff = (size_t)bi * T * C3 + h * hs;
            const float *q = qkv + qoff, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + qoff, *dk = dq + C, *dv = dq + 2 * C;
            const float *p = att + ((size_t)bi * NH + h) * T * T, *dy = dout + (size_t)bi * T * C + h * hs;
            float *dp = scratch + ((size_t)bi * NH + h) * T * T;
            /* dP = dY·Vᵀ and dV = Pᵀ·dY */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dy, C, v, C3, 0.0f, dp, T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, dy, C, 0.0f, dv, C3);
            /* softmax backward, in place: dS = P ∘ (dP - rowsum(P ∘ dP)) */
            for (int i = 0; i < T; i++) {
                const float *prow = p + (size_t)i * T;
                float *drow = dp + (size_t)i * T, dot = 0.0f;
                for (int j = 0; j <= i; j++) dot += prow[j] * drow[j];
                for (int j = 0; j <= i; j++) drow[j] = prow[j] * (drow[j] - dot);
                memset(drow + i + 1, 0, (size_t)(T - i - 1) * sizeof *drow);
            }
            /* dQ = scale·dS·K and dK = scale·dSᵀ·Q */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, dp, T, k, C3, 0.0f, dq, C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, dp, T, q, C3, 0.0f, dk, C3);
        }
}
