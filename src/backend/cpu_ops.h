/* cpu_ops.h — private: the CPU backend's op implementations (cpu_ops.c,
 * cpu_attention.c), gathered into its vtable in cpu_backend.c. */
#ifndef BIGBATCH_CPU_OPS_H
#define BIGBATCH_CPU_OPS_H

#include "backend_impl.h"

void bb_cpu_linear_forward(bb_backend_t *b, float *out, const float *in, const float *w, const float *bias, int N,
                        int IC, int OC);
void bb_cpu_linear_backward(bb_backend_t *b, float *din, float *dw, float *dbias, const float *dout, const float *in,
                         const float *w, int N, int IC, int OC, bool accumulate);
void bb_cpu_relu_forward(bb_backend_t *b, float *out, const float *in, size_t n);
void bb_cpu_relu_backward(bb_backend_t *b, float *din, const float *dout, const float *in, size_t n);
void bb_cpu_gelu_forward(bb_backend_t *b, float *out, const float *in, size_t n);
void bb_cpu_gelu_backward(bb_backend_t *b, float *din, const float *dout, const float *in, size_t n);
void bb_cpu_layernorm_forward(bb_backend_t *b, float *out, float *mean, float *rstd, const float *in, const float *w,
                           const float *bias, int N, int C);
void bb_cpu_layernorm_backward(bb_backend_t *b, float *din, float *dw, float *dbias, const float *dout, const float *in,
                            const float *w, const float *mean, const float *rstd, int N, int C, bool accumulate);
void bb_cpu_embedding_forward(bb_backend_t *b, float *out, const int32_t *tokens, const float *wte, const float *wpe,
                           int B, int T, int C);
void bb_cpu_embedding_backward(bb_backend_t *b, float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                            int B, int T, int C, int V, int maxT, bool accumulate_wte, bool accumulate_wpe);
void bb_cpu_attention_forward(bb_backend_t *b, float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
void bb_cpu_attention_decode(bb_backend_t *b, float *out, float *scores, const float *qkv, int T, int C, int NH);
void bb_cpu_attention_backward(bb_backend_t *b, float *dqkv, const float *dout, const float *qkv, const float *out,
                               const float *lse, int B, int T, int C, int NH);
void bb_cpu_add(bb_backend_t *b, float *out, const float *x, const float *y, size_t n);
void bb_cpu_crossentropy_rows(bb_backend_t *b, double *row_loss, float *dlogits, const float *logits,
                              const int32_t *targets, int N, int V, float normalizer);
double bb_cpu_sum_rows(bb_backend_t *b, const double *rows, size_t n);
void bb_cpu_softmax_crossentropy(bb_backend_t *b, double *loss, float *dlogits, const float *logits,
                              const int32_t *targets, int N, int V, float normalizer, int *valid);
void bb_cpu_adamw(bb_backend_t *b, float *params, const float *grads, float *m, float *v, size_t n, float lr,
               float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale);
void bb_cpu_sgd(bb_backend_t *b, float *params, const float *grads, float *momentum_buf, size_t n, float lr,
             float momentum, float weight_decay, float grad_scale);
double bb_cpu_sum_squares(bb_backend_t *b, const float *x, const size_t *lo, const size_t *hi, int n);
int bb_cpu_count_correct(bb_backend_t *b, const float *logits, const int32_t *targets, int N, int V);
void bb_cpu_bf16_round(bb_backend_t *b, float *x, uint16_t *packed, size_t n);
void bb_cpu_bf16_unpack(bb_backend_t *b, float *out, const uint16_t *packed, size_t n);

void bb_cpu_records_to_tokens(bb_backend_t *b, int32_t *tokens, int32_t *targets, const uint8_t *records, int count,
                           int B, int T, int width);
void bb_cpu_records_to_images(bb_backend_t *b, float *features, int32_t *labels, const uint8_t *records, int count,
                           int B, int inputs);

#endif
