/* cublasLt.h — the CUDA emulator's stand-in for cuBLASLt: the matmul
 * with the epilogues the backend uses, run by OpenBLAS on the call's
 * stream (tests/cuda_emu/cublas.cpp). Values of the enums are cuBLASLt's.
 *
 *   cublasLtHandle_t lt; cublasLtCreate(&lt);
 *   cublasLtMatmulDesc_t d; cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
 *   cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);  ... layouts ...
 *   cublasLtMatmulAlgoGetHeuristic(lt, d, A, B, C, D, pref, 1, &heur, &found);
 *   cublasLtMatmul(lt, d, &alpha, a, A, b, B, &beta, c, C, d_out, D, &heur.algo, ws, ws_bytes, stream);
 *
 * Column-major. Each attribute must be given with its size in cuBLASLt
 * (int32_t transposes and data types, uint32_t epilogue, int64_t aux
 * leading dimension, pointers), else CUBLAS_STATUS_INVALID_VALUE. The
 * heuristic checks what the matmul checks: shapes that agree, A and B
 * bf16 or fp32, C of D's type and shape (C may be D), the epilogue one of
 * DEFAULT, BIAS, GELU(_BIAS), GELU_AUX(_BIAS), DGELU and BGRADB with its
 * pointers set, an aux leading dimension ≥ D's rows and a multiple of 8,
 * a bias (or bias gradient) of fp32 or bf16; anything else
 * CUBLAS_STATUS_NOT_SUPPORTED with no algorithm, as cuBLASLt answers
 * when it has none. BB_CUDA_EMU_LT=off: every heuristic finds none (the
 * fallback of a cuBLASLt without these epilogues). The products sum in
 * fp32 (bf16 operands widened), the epilogue runs on the fp32 sums (GELU
 * in its tanh form, as cuBLASLt's), what is stored is rounded once to its
 * type; a bias gradient sums op(B)'s k elements of each column in fp32. */
#ifndef BBEMU_CUBLASLT_H
#define BBEMU_CUBLASLT_H

#include <stddef.h>
#include <stdint.h>

#include "cublas_v2.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bbemu_cublaslt *cublasLtHandle_t;
typedef struct bbemu_lt_desc *cublasLtMatmulDesc_t;
typedef struct bbemu_lt_layout *cublasLtMatrixLayout_t;
typedef struct bbemu_lt_pref *cublasLtMatmulPreference_t;

typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

typedef enum {
    CUBLASLT_EPILOGUE_DEFAULT = 1,
    CUBLASLT_EPILOGUE_RELU = 2,
    CUBLASLT_EPILOGUE_BIAS = 4,
    CUBLASLT_EPILOGUE_GELU = 32,
    CUBLASLT_EPILOGUE_GELU_BIAS = 36,
    CUBLASLT_EPILOGUE_GELU_AUX = 160,
    CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 164,
    CUBLASLT_EPILOGUE_DGELU = 192,
    CUBLASLT_EPILOGUE_DGELU_BGRAD = 208,
    CUBLASLT_EPILOGUE_BGRADA = 256,
    CUBLASLT_EPILOGUE_BGRADB = 512
} cublasLtEpilogue_t;

typedef enum {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE = 22,
    CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26
} cublasLtMatmulDescAttributes_t;

typedef enum { CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1 } cublasLtMatmulPreferenceAttributes_t;

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t bytes);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t bytes);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                              cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *returned);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha, const void *a,
                              cublasLtMatrixLayout_t A, const void *b, cublasLtMatrixLayout_t B, const void *beta,
                              const void *c, cublasLtMatrixLayout_t C, void *d, cublasLtMatrixLayout_t D,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes,
                              cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
