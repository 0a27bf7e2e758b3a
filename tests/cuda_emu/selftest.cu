// selftest.cu — the kernels of selftest.h (the emulated build only).
#include "selftest.h"

#include "cuda_device.cuh"

namespace {

__global__ void iota_k(int *out, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = i;
}

__global__ void barrier_some_skip_k(int *out, int half)
{
    int t = threadIdx.x;
    if (t < half) __syncthreads();
    out[t] = t;
}

__global__ void barrier_two_sites_k(int *out)
{
    int t = threadIdx.x;
    if (t % 2) __syncthreads();
    else __syncthreads();
    out[t] = t;
}

__global__ void barrier_after_return_k(int *out)
{
    int t = threadIdx.x;
    if (t == 5) return;
    __syncthreads();
    out[t] = t;
}

__global__ void warp_sum_k(int *out) { out[threadIdx.x] = (int)warp_sum(1.0f); }

__global__ void shuffle_outside_mask_k(int *out)
{
    int t = threadIdx.x;
    if (t < 16) out[t] = __shfl_sync(0x0000ffffu, t, 20);
}

__global__ void neighbour_k(int *out, int base, bool sync)
{
    __shared__ int slot[32];
    int lane = threadIdx.x;
    slot[lane] = base + lane;
    if (sync) __syncwarp();
    out[lane] = slot[(lane + 1) % 32];
}

__global__ void dynamic_shared_k(int *out, int index)
{
    BB_DYNAMIC_SHARED(float, sm);
    int t = threadIdx.x;
    sm[t] = (float)t;
    if (t == 0) sm[index] = -1.0f;
    __syncthreads();
    out[t] = (int)sm[(t + 1) % blockDim.x];
}

__global__ void shared_bytes_k(int *out)
{
    BB_DYNAMIC_SHARED(int, sm);
    sm[threadIdx.x] = (int)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = sm[31 - threadIdx.x];
}

__global__ void trivial_k(int *out)
{
    if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) out[0] = 1;
}

} // namespace

extern "C" {

cudaError_t bbemu_test_iota(cudaStream_t s, int *out, int n, unsigned blocks, unsigned threads)
{
    BB_LAUNCH(iota_k, blocks, threads, 0, s)(out, n);
    return cudaGetLastError();
}

cudaError_t bbemu_test_barrier_some_skip(cudaStream_t s, int *out, int threads, int half)
{
    BB_LAUNCH(barrier_some_skip_k, 1, threads, 0, s)(out, half);
    return cudaGetLastError();
}

cudaError_t bbemu_test_barrier_two_sites(cudaStream_t s, int *out, int threads)
{
    BB_LAUNCH(barrier_two_sites_k, 1, threads, 0, s)(out);
    return cudaGetLastError();
}

cudaError_t bbemu_test_barrier_after_return(cudaStream_t s, int *out, int threads)
{
    BB_LAUNCH(barrier_after_return_k, 1, threads, 0, s)(out);
    return cudaGetLastError();
}

cudaError_t bbemu_test_warp_sum(cudaStream_t s, int *out, int threads)
{
    BB_LAUNCH(warp_sum_k, 1, threads, 0, s)(out);
    return cudaGetLastError();
}

cudaError_t bbemu_test_shuffle_outside_mask(cudaStream_t s, int *out)
{
    BB_LAUNCH(shuffle_outside_mask_k, 1, 32, 0, s)(out);
    return cudaGetLastError();
}

cudaError_t bbemu_test_neighbour(cudaStream_t s, int *out, int base, bool syncwarp)
{
    BB_LAUNCH(neighbour_k, 1, 32, 0, s)(out, base, syncwarp);
    return cudaGetLastError();
}

cudaError_t bbemu_test_dynamic_shared(cudaStream_t s, int *out, int threads, int index)
{
    BB_LAUNCH(dynamic_shared_k, 1, threads, (size_t)threads * sizeof(float), s)(out, index);
    return cudaGetLastError();
}

cudaError_t bbemu_test_shared_bytes(cudaStream_t s, int *out, size_t bytes)
{
    BB_LAUNCH(shared_bytes_k, 1, 32, bytes, s)(out);
    return cudaGetLastError();
}

cudaError_t bbemu_test_allow_shared(int bytes)
{
    return cudaFuncSetAttribute(shared_bytes_k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

cudaError_t bbemu_test_configuration(cudaStream_t s, int *out, dim3 grid, dim3 block)
{
    BB_LAUNCH(trivial_k, grid, block, 0, s)(out);
    return cudaGetLastError();
}

} // extern "C"
