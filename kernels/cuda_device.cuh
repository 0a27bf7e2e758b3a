// cuda_device.cuh — private: device helpers the kernel files share.
#ifndef BIGBATCH_CUDA_DEVICE_CUH
#define BIGBATCH_CUDA_DEVICE_CUH

// Sum (max) over the 32 lanes of a warp; every lane gets the result.
static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#endif
