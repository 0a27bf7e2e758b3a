/* cuda_kernels.h — private: launchers of the CUDA kernels in
 * cuda_kernels.cu (attention: cuda_attention.cu; the optimizers: cuda_optim.cu), one per backend op that
 * is not a matrix product (those go through cuBLAS in cuda_backend.cu).
 * Each takes the stream it runs on; shapes as in backend.h; all pointers
 * are device pointers. They return cudaGetLastError() of their launch. */
#ifndef BIGBATCH_CUDA_KERNELS_H
#define BIGBATCH_CUDA_KERNELS_H

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Activations (and their gradients) are `void *`: fp32, or bf16 (uint16_t)
 * where the launcher's `bf16` says so; kernels compute in fp32 and round
 * what they write once (backend.h's conversions). */
/* act: bb_activation's value (0 relu, 1 gelu tanh, 2 silu); forward:
 * out = act(x) (in unused); backward: out = x · act'(in), out may alias x.
 * cudaErrorInvalidValue for another act. */
cudaError_t bbk_activation(cudaStream_t s, bool bf16, int act, bool backward, void *out, const void *x, const void *in,
                           size_t n);
cudaError_t bbk_add(cudaStream_t s, bool bf16, void *out, const void *x, const void *y, size_t n);
/* bb_op_convert's two directions: packed = x rounded to bf16, out = packed widened. */
cudaError_t bbk_bf16_unpack(cudaStream_t s, float *out, const uint16_t *packed, size_t n);
cudaError_t bbk_bf16_pack(cudaStream_t s, uint16_t *packed, const float *x, size_t n);
/* out[n, :] = bias for every row n (before a GEMM with beta 1). */
cudaError_t bbk_broadcast_rows(cudaStream_t s, bool bf16, void *out, const float *bias, int N, int C);
/* Column reductions run in two passes over BBK_COLUMN_CHUNKS chunks of
 * rows (deterministic); `scratch` holds BBK_COLUMN_CHUNKS * C floats
 * (twice that for the LayerNorm backward). 256 chunks: at C 768 and 8192
 * rows, 196K threads of 32 rows each, where 64 chunks gave 49K threads of
 * 128 (a fifth of what an H100 keeps in flight: latency-bound). */
#define BBK_COLUMN_CHUNKS 256
/* dbias[c] (+)= sum over rows of dout[:, c]. */
cudaError_t bbk_column_sums(cudaStream_t s, bool bf16, float *dbias, float *scratch, const void *dout, int N, int C,
                            bool accumulate);

/* y NULL: the LayerNorm of in; else res = in + y is written and normalised
 * (the residual add fused in; res may alias in or y). mean (and bias) NULL:
 * RMSNorm (rmsnorm_forward); eps 1e-5 for LayerNorm. The backward's mean
 * and dbias NULL: RMSNorm's. */
cudaError_t bbk_layernorm_forward(cudaStream_t s, bool bf16, void *out, float *mean, float *rstd, const void *in,
                                  const void *y, void *res, const float *w, const float *bias, int N, int C, float eps);
cudaError_t bbk_layernorm_backward(cudaStream_t s, bool bf16, void *din, float *dw, float *dbias, float *scratch,
                                   const void *dout, const void *in, const float *w, const float *mean,
                                   const float *rstd, int N, int C, bool accumulate);

/* RoPE on the q and k heads of qkv in place (bb_op_rope_forward); sign -1:
 * its inverse (rope_backward). */
cudaError_t bbk_rope(cudaStream_t s, bool bf16, void *qkv, const float *table, int B, int T, int NH, int KVH, int HS,
                     int pos0, float sign);
/* bb_op_swiglu_forward and _backward (dgu may alias gu). */
cudaError_t bbk_swiglu_forward(cudaStream_t s, bool bf16, void *out, const void *gu, int N, int F);
cudaError_t bbk_swiglu_backward(cudaStream_t s, bool bf16, void *dgu, const void *dout, const void *gu, int N, int F);

/* wpe NULL: no position embedding. */
cudaError_t bbk_embedding_forward(cudaStream_t s, bool bf16, void *out, const int32_t *tokens, const float *wte,
                                  const float *wpe, int B, int T, int C);
/* dwte (V, C) += the rows of dout (n, C) of each token, summed per token in
 * position order (deterministic; the CPU's order). `scratch` holds
 * bbk_embedding_sort_bytes(n) bytes (cudaErrorInvalidValue when smaller).
 * The table must already be zeroed (or hold the sum to add to). */
size_t bbk_embedding_sort_bytes(size_t rows);
cudaError_t bbk_embedding_backward_wte(cudaStream_t s, bool bf16, float *dwte, const void *dout, const int32_t *tokens,
                                       int n, int C, int V, void *scratch, size_t scratch_bytes);
cudaError_t bbk_embedding_backward_wpe(cudaStream_t s, bool bf16, float *dwpe, const void *dout, int B, int T, int C,
                                       bool accumulate);
/* Loader records into a batch: see bb_op_records_to_tokens and _images. */
cudaError_t bbk_records_to_tokens(cudaStream_t s, int32_t *tokens, int32_t *targets, const uint8_t *records, int count,
                                  int B, int T, int width);
cudaError_t bbk_records_to_images(cudaStream_t s, float *features, int32_t *labels, const uint8_t *records, int count,
                                  int B, int inputs);

/* Tiled causal attention (see bb_op_attention_forward and _backward): NH
 * query heads, KVH key/value heads (dividing NH), each HS wide; bf16: the
 * products' operands rounded to bf16, sums in fp32. Fails
 * (cudaErrorInvalidValue) when a head is too wide for the device's shared
 * memory (head size ~400 on sm_90). */
/* The new row qkv's keys and values into row T-1 of the cache kv, then
 * the attention of its queries over rows 0..T-1 (bb_op_attention_decode). */
cudaError_t bbk_attention_decode(cudaStream_t s, float *out, float *scores, float *kv, const float *qkv, int T, int NH,
                                 int KVH, int HS);
cudaError_t bbk_attention_forward(cudaStream_t s, float *out, float *lse, const float *qkv, int B, int T, int NH,
                                  int KVH, int HS, bool bf16);
cudaError_t bbk_attention_backward(cudaStream_t s, float *dqkv, const float *dout, const float *qkv, const float *out,
                                   const float *lse, int B, int T, int NH, int KVH, int HS, bool bf16);

/* Per row (rows `ld` apart, V wide): row_loss[n] = -log softmax(logits[n])[target] in double (0
 * when target is -1); dlogits (may alias logits of its dtype, may be NULL)
 * = (softmax - onehot) / normalizer, bf16 when `bf16`; logits bf16 when
 * `bf16_logits` (then dlogits is bf16 too); *valid (device int,
 * pre-zeroed) counts rows with a target. As the CPU: exp sums in double. */
cudaError_t bbk_softmax_crossentropy(cudaStream_t s, bool bf16, bool bf16_logits, double *row_loss, void *dlogits,
                                     const void *logits, const int32_t *targets, int N, int V, int ld,
                                     float normalizer, int *valid);
/* *out = the sum of rows[0..n) in a fixed order (one block). */
cudaError_t bbk_sum_rows(cudaStream_t s, double *out, const double *rows, int n);

cudaError_t bbk_adamw(cudaStream_t s, float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                      float beta2, float eps, float weight_decay, float bias1, float bias2_sqrt, float grad_scale);
cudaError_t bbk_sgd(cudaStream_t s, float *p, const float *g, float *buf, size_t n, float lr, float momentum,
                    float weight_decay, float grad_scale);
/* bb_op_lamb and bb_op_lars on one tensor: the norms' block sums in
 * partial (`partials` doubles), their totals in sums[0..1] (device
 * memory), then the update reads them: no wait for the host. bias1 and
 * bias2 are 1 - beta^t. */
cudaError_t bbk_lamb(cudaStream_t s, float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                     float beta2, float eps, float weight_decay, float bias1, float bias2, float grad_scale,
                     double *partial, int partials, double *sums);
cudaError_t bbk_lars(cudaStream_t s, float *p, const float *g, float *buf, size_t n, float lr, float momentum,
                     float weight_decay, float trust_coefficient, float grad_scale, double *partial, int partials,
                     double *sums);
/* bb_op_muon's element-wise passes: the momentum and the Nesterov
 * direction into x, scaled to norm 1 (its squares' block sums in partial,
 * their total in sums[0], device memory: no wait for the host); and
 * p = p·keep - step·x. */
cudaError_t bbk_muon_direction(cudaStream_t s, float *x, float *buf, const float *g, size_t n, float momentum,
                               float grad_scale, double *partial, int partials, double *sums);
cudaError_t bbk_muon_apply(cudaStream_t s, float *p, const float *x, size_t n, float keep, float step);
/* *hits += rows whose argmax is their target (see bb_op_count_correct);
 * one thread per row: for classifier heads. */
cudaError_t bbk_count_correct(cudaStream_t s, int *hits, const float *logits, const int32_t *targets, int N, int V);
/* partial[b] = sum of squares of block b's share; returns the block count
 * used through *blocks (at most max_blocks). */
cudaError_t bbk_sum_squares(cudaStream_t s, double *partial, int max_blocks, int *blocks, const float *x, size_t n);

#ifdef __cplusplus
}
#endif

#endif
