// cuda_grid.cuh — private: what the kernel files (cuda_kernels.cu,
// cuda_optim.cu) share of their launch shapes and reductions: the block
// size, a grid for n elements, the grid-stride loop, and a block's sum in
// double in a fixed order (the same bits every run).
#ifndef BIGBATCH_CUDA_GRID_CUH
#define BIGBATCH_CUDA_GRID_CUH

#include <stddef.h>

#include "cuda_device.cuh"

namespace {

constexpr int kThreads = 256;

unsigned grid_for(size_t n, int threads = kThreads)
{
    size_t blocks = (n + threads - 1) / threads;
    return (unsigned)(blocks < 65535u * 16 ? (blocks ? blocks : 1) : 65535u * 16);
}

#define GRID_STRIDE(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// The sum over a block of blockDim.x threads (a multiple of 32, at most
// 1024) in double; every thread gets it.
__device__ double block_sum_double(double v)
{
    __shared__ double lanes[32];
    __shared__ double result;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) lanes[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double w = lane < warps ? lanes[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
        if (lane == 0) result = w;
    }
    __syncthreads();
    double r = result;
    __syncthreads();
    return r;
}

} // namespace

#endif
