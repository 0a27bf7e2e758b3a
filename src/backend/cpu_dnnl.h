/* cpu_dnnl.h — private: the CPU backend's bf16 matrix products, through
 * oneDNN's matmul (AMX or AVX512-BF16 where the CPU has them).
 *
 * How to use (from a task of the backend's pool, cpu_pool.h):
 *   bb_cpu_bf16_gemm g = {.M = rows, .N = OC, .K = IC, .A = in, .lda = IC, .B = w, .tb = true, .ldb = IC,
 *                         .C = out, .c_dtype = BB_DTYPE_BF16, .ldc = OC, .bias = bias};
 *   if (!bb_cpu_bf16_gemm_run(&g)) ... out of memory
 *
 * A product runs on the calling thread only: each thread of the pool has
 * its own oneDNN stream and its own cache of primitives (one per shape,
 * made on first use, with its own scratchpad), and oneDNN's OpenMP
 * parallelism is set to one thread in every thread that calls it, so
 * oneDNN never starts threads of its own next to the pool's. The caller
 * splits a product into slices (cpu_ops.c).
 *
 * oneDNN runs them where the CPU has AMX. Elsewhere (AVX512-BF16 alone,
 * or neither) OpenBLAS's fp32 sgemm is faster than oneDNN's bf16 matmul,
 * and runs on the operands widened to fp32 (the same bf16 values, fp32
 * sums): the caller widens the operand every slice shares once (A32 or
 * B32), each slice widens its own part into its thread's buffers.
 * bb_cpu_bf16_onednn() says which runs, bb_cpu_bf16_products() names it. */
#ifndef BIGBATCH_CPU_DNNL_H
#define BIGBATCH_CPU_DNNL_H

#include "backend_impl.h"

/* C (M,N) = op(A) (M,K) · op(B) (K,N) [+ bias] [+ C], row-major: A, B bf16;
 * op(A) = Aᵀ when ta (A stored (K,M), row stride lda), op(B) = Bᵀ when tb
 * (B stored (N,K)); C fp32 or bf16 (rounded once, from the fp32 sum). */
typedef struct bb_cpu_bf16_gemm {
    int M, N, K;
    const uint16_t *A, *B;
    int lda, ldb, ldc;
    bool ta, tb;
    void *C;
    bb_dtype c_dtype;
    const float *bias;      /* (N) fp32, added to every row; NULL: none */
    bool accumulate;        /* C += the product (fp32 C only) */
    const float *A32, *B32; /* without oneDNN: A or B already widened (same layout), or NULL */
} bb_cpu_bf16_gemm;

/* Runs g on the calling thread. False when out of host memory (the
 * primitive's scratchpad or the fallback's fp32 copies); C is then
 * unchanged or partly written. */
bool bb_cpu_bf16_gemm_run(const bb_cpu_bf16_gemm *g);

/* What runs the bf16 products, for banners: "oneDNN bf16 (AMX)",
 * "oneDNN bf16 (AVX512-BF16)", "oneDNN bf16 (AVX-512, emulated)", or
 * "OpenBLAS fp32 (no bf16 matmul on this CPU)". Never fails. */
const char *bb_cpu_bf16_products(void);
/* Whether oneDNN runs the bf16 products (else OpenBLAS on widened operands). */
bool bb_cpu_bf16_onednn(void);

#endif
