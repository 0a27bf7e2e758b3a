/* cuda_backend.h — private: what other CUDA code (the NCCL reducer) needs
 * from a CUDA backend instance. */
#ifndef BIGBATCH_CUDA_BACKEND_H
#define BIGBATCH_CUDA_BACKEND_H

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "bigbatch/backend.h"

/* The CUDA device index and a stream of a backend made by
 * bb_backend_create_cuda (undefined for other backends). */
int bb_cuda_backend_device(bb_backend_t *b);
cudaStream_t bb_cuda_backend_stream(bb_backend_t *b, bb_stream stream);

#ifdef __cplusplus
}
#endif

#endif
