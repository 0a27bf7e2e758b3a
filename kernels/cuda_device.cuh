// cuda_device.cuh — private: device helpers the kernel files share, and
// the two macros every kernel file uses for what C++ cannot parse:
//
//   BB_LAUNCH(kernel, grid, block, shared_bytes, stream)(args...);
//   BB_DYNAMIC_SHARED(float, sm);   // the launch's dynamic shared memory
//
// The CUDA build expands them to kernel<<<grid, block, shared_bytes,
// stream>>>(args...) and extern __shared__ float sm[]; the emulated build
// (BB_CUDA_EMU, tests/cuda_emu) to its launcher and its per-block buffer.
#ifndef BIGBATCH_CUDA_DEVICE_CUH
#define BIGBATCH_CUDA_DEVICE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "bigbatch/backend.h"

#ifdef BB_CUDA_EMU
#define BB_LAUNCH(kernel, grid, block, shared, stream) ::bbemu::launch(#kernel, kernel, grid, block, shared, stream)
#define BB_DYNAMIC_SHARED(type, name) type *name = static_cast<type *>(::bbemu::self()->dynamic_shared)
#else
#define BB_LAUNCH(kernel, grid, block, shared, stream) kernel<<<grid, block, shared, stream>>>
#define BB_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

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

// An activation's element: float, or bf16 held in a uint16_t (backend.h's
// conversions, so that CUDA and the CPU round to the same bits). Kernels
// over activations are templates on it and compute in fp32.
static __device__ __forceinline__ float bbk_ld(const float *p, size_t i) { return p[i]; }
static __device__ __forceinline__ float bbk_ld(const uint16_t *p, size_t i) { return bb_bf16_to_float(p[i]); }
static __device__ __forceinline__ void bbk_st(float *p, size_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void bbk_st(uint16_t *p, size_t i, float v) { p[i] = bb_bf16_from_float(v); }

#endif
