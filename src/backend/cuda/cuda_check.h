// cuda_check.h — private: the CUDA, cuBLAS and NCCL members of the error
// macro family (core.h has BB_TRY, BB_TRY_GOTO and BB_PTHREAD). Each names
// the failed call (its text) and what it returned.
//
//   BB_CUDA(x), BB_CUBLAS(x)        in a function returning bb_status: a
//                                   failure returns BB_ERR_DEVICE
//   BB_CUDA_OP(b, x), BB_CUBLAS_OP(b, x)
//                                   inside an op, which returns nothing: the
//                                   first failure is noted on backend b and
//                                   returned by its next synchronizing call
//   BB_NCCL(x)                      (nccl_reducer.cu, where NCCL is loaded)
//
// CUDA's last-error state is cleared when a failure is reported, so the
// next call is not blamed for it.
#ifndef BIGBATCH_CUDA_CHECK_H
#define BIGBATCH_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "backend/backend_impl.h"
}

// Names the current device: every entry point makes its backend's current.
inline bb_status bb_cuda_fail(cudaError_t e, const char *call)
{
    cudaGetLastError();
    int device = -1;
    cudaGetDevice(&device);
    return bb_fail(BB_ERR_DEVICE, "cuda:%d: %s: %s", device, call, cudaGetErrorString(e));
}

inline void bb_cuda_note(bb_backend_t *b, cudaError_t e, const char *call)
{
    if (e == cudaSuccess) return;
    cudaGetLastError();
    bb_backend_note_error(b, BB_ERR_DEVICE, "%s: %s failed: %s", b->name, call, cudaGetErrorString(e));
}

inline void bb_cublas_note(bb_backend_t *b, cublasStatus_t s, const char *call)
{
    if (s != CUBLAS_STATUS_SUCCESS)
        bb_backend_note_error(b, BB_ERR_DEVICE, "%s: %s failed: %s", b->name, call, cublasGetStatusString(s));
}

#define BB_CUDA(expr)                                                       \
    do {                                                                    \
        cudaError_t bb_cuda_err_ = (expr);                                  \
        if (bb_cuda_err_ != cudaSuccess) return bb_cuda_fail(bb_cuda_err_, #expr); \
    } while (0)

#define BB_CUBLAS(expr)                                                     \
    do {                                                                    \
        cublasStatus_t bb_cublas_st_ = (expr);                              \
        if (bb_cublas_st_ != CUBLAS_STATUS_SUCCESS)                         \
            return bb_fail(BB_ERR_DEVICE, "%s: %s", #expr, cublasGetStatusString(bb_cublas_st_)); \
    } while (0)

#define BB_CUDA_OP(b, expr) bb_cuda_note((b), (expr), #expr)
#define BB_CUBLAS_OP(b, expr) bb_cublas_note((b), (expr), #expr)

#endif
