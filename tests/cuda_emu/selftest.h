/* selftest.h — kernels that break CUDA's rules on purpose, and a few that
 * keep them, for the emulator's own tests (tests/test_cuda_emu.c; built in
 * the emulated build only, from selftest.cu). Each launches on `s` and
 * returns cudaGetLastError() of its launch; pointers are device memory of
 * n ints unless said otherwise. */
#ifndef BBEMU_SELFTEST_H
#define BBEMU_SELFTEST_H

#include <cuda_runtime.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[i] = i over a grid of `blocks` x `threads` (grid-stride). */
cudaError_t bbemu_test_iota(cudaStream_t s, int *out, int n, unsigned blocks, unsigned threads);
/* Threads below `half` wait at a __syncthreads the others never reach (they return). */
cudaError_t bbemu_test_barrier_some_skip(cudaStream_t s, int *out, int threads, int half);
/* Odd and even threads wait at two different __syncthreads. */
cudaError_t bbemu_test_barrier_two_sites(cudaStream_t s, int *out, int threads);
/* Thread 5 returns; the rest meet at a __syncthreads. */
cudaError_t bbemu_test_barrier_after_return(cudaStream_t s, int *out, int threads);
/* out[t] = the warp's sum of 1 (32), with a full mask; `threads` need not be a multiple of 32. */
cudaError_t bbemu_test_warp_sum(cudaStream_t s, int *out, int threads);
/* Lanes 0-15 shuffle with mask 0xffff and read lane 20. */
cudaError_t bbemu_test_shuffle_outside_mask(cudaStream_t s, int *out);
/* Each lane writes base + lane to shared memory, then reads its
 * neighbour's (with or without the __syncwarp between): out[lane] should
 * be base + (lane + 1) % 32. One warp. */
cudaError_t bbemu_test_neighbour(cudaStream_t s, int *out, int base, bool syncwarp);
/* Dynamic shared memory of `threads` floats; thread 0 also writes element
 * `index` (threads: one past the end). out: threads ints. */
cudaError_t bbemu_test_dynamic_shared(cudaStream_t s, int *out, int threads, int index);
/* A kernel with `bytes` of dynamic shared memory (one block of 32). */
cudaError_t bbemu_test_shared_bytes(cudaStream_t s, int *out, size_t bytes);
/* cudaFuncSetAttribute(MaxDynamicSharedMemorySize, bytes) of that kernel. */
cudaError_t bbemu_test_allow_shared(int bytes);
/* A launch with the given grid and block (a trivial kernel writing out[0]). */
cudaError_t bbemu_test_configuration(cudaStream_t s, int *out, dim3 grid, dim3 block);

#ifdef __cplusplus
}
#endif

#endif
