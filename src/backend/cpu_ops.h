/* cpu_ops.h — private: the CPU backend's op implementations (cpu_ops.c, cpu_optim.c, cpu_norm.c,
 * cpu_loss.c, cpu_attention.c), gathered into its vtable in cpu_backend.c. */
#ifndef BIGBATCH_CPU_OPS_H
#define BIGBATCH_CPU_OPS_H

#include "backend_impl.h"

/* A tensor's data as fp32 or bf16 bits, and whether it is bf16. */
#define F32(t) ((float *)(t).data)
#define H16(t) ((uint16_t *)(t).data)
#define IS_BF16(t) ((t).dtype == BB_DTYPE_BF16)

/* C (M,N) = alpha · op(A) (M,K) · op(B) (K,N) + beta · C, row-major, fp32
 * through OpenBLAS: in the caller's thread, or split over the backend's
 * pool from 2^25 multiply-adds on (cpu_ops.c). */
void bb_cpu_sgemm(bb_backend_t *b, bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc);

/* bb_cpu_<name> for every op of ops.def. */
#define BB_OP(name, params, ...) void bb_cpu_##name(bb_backend_t *b, BB_UNPAREN params);
#define BB_OP_VALUE(type, name, params, ...) type bb_cpu_##name(bb_backend_t *b, BB_UNPAREN params);
#include "bigbatch/ops.def"

#endif
