/* cuda_runtime.h — the CUDA emulator's stand-in for the CUDA runtime: the
 * same .cu sources compile as C++ against it and run on the CPU (the
 * emulated build, `make cuda-emu`; a test double, never in bin/bigbatch).
 *
 *   g++ -x c++ -std=c++17 -DBB_CUDA_EMU -Itests/cuda_emu/include -c kernels/cuda_kernels.cu
 *   ... link with -lbbcudaemu (build/cuda-emu/lib/libbbcudaemu.so)
 *
 * Host side: the runtime calls the backend makes, with CUDA's contracts —
 * device memory apart from host memory (guard pages, poisoned on
 * allocation and on free), streams that run asynchronously (a thread
 * each), events, sticky errors, several devices (BB_CUDA_EMU_DEVICES,
 * default 2; BB_CUDA_EMU_MEM bytes each). Every call fails as CUDA's
 * does: it returns the error and sets the thread's last error; a fault in
 * a kernel is sticky for its device, as on a GPU.
 *
 * Device side: each CUDA thread of a block is a fiber; blocks run one at a
 * time on their stream's thread. __syncthreads/__syncwarp are counted
 * barriers and __shfl_*_sync a per-warp exchange, strict like the
 * hardware: a barrier some thread of the block does not reach, a mask
 * that names a lane that is not there, a shuffle from a lane outside its
 * mask end the kernel with cudaErrorLaunchFailure and a line naming it.
 * Launches go through BB_LAUNCH (kernels/cuda_device.cuh), which the
 * real build expands to <<<>>>; dynamic shared memory through
 * BB_DYNAMIC_SHARED (a buffer of the launch's byte count, with canaries).
 *
 * Adding a call: declare it here with CUDA's prototype, define it in
 * tests/cuda_emu/runtime.cpp (validate as CUDA does, count it in the
 * stats where it synchronizes or moves bytes). */
#ifndef BBEMU_CUDA_RUNTIME_H
#define BBEMU_CUDA_RUNTIME_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define CUDART_VERSION 13000

#ifdef __cplusplus
extern "C" {
#endif

/* ---- types (CUDA's values) --------------------------------------------- */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInsufficientDriver = 35,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalState = 401,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureWrongThread = 908,
    cudaErrorGraphExecUpdateFailure = 910,
    cudaErrorUnknown = 999
} cudaError_t;

typedef struct bbemu_stream *cudaStream_t;
typedef struct bbemu_event *cudaEvent_t;
typedef struct bbemu_graph *cudaGraph_t;          /* a capture's operations, in stream order */
typedef struct bbemu_graph_exec *cudaGraphExec_t; /* an instantiated graph: launched whole on a stream */
typedef struct bbemu_graph_node *cudaGraphNode_t; /* never made: the update's error nodes stay NULL */

enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2
};
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
};
enum cudaGraphExecUpdateResult {
    cudaGraphExecUpdateSuccess = 0x0,
    cudaGraphExecUpdateError = 0x1,
    cudaGraphExecUpdateErrorTopologyChanged = 0x2
};
typedef struct cudaGraphExecUpdateResultInfo {
    enum cudaGraphExecUpdateResult result;
    cudaGraphNode_t errorNode, errorFromNode;
} cudaGraphExecUpdateResultInfo;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
} cudaMemcpyKind;

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaHostAllocWriteCombined 0x04

typedef struct bbemu_uint3 {
    unsigned int x, y, z;
} uint3;

#ifdef __cplusplus
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
#else
typedef struct dim3 {
    unsigned int x, y, z;
} dim3;
#endif

/* The fields the backend reads, and the limits the emulator enforces. */
typedef struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;      /* 48 KiB: dynamic shared memory above it needs cudaFuncSetAttribute */
    size_t sharedMemPerBlockOptin; /* 227 KiB: the most a block may have (sm_90) */
    int warpSize, maxThreadsPerBlock, maxThreadsDim[3], maxGridSize[3];
    int major, minor, multiProcessorCount;
} cudaDeviceProp;

/* ---- the runtime calls ---------------------------------------------------- */
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaRuntimeGetVersion(int *v);
cudaError_t cudaDriverGetVersion(int *v);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

cudaError_t cudaMalloc(void **ptr, size_t bytes);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream);
cudaError_t cudaHostAlloc(void **ptr, size_t bytes, unsigned int flags);
cudaError_t cudaMallocHost(void **ptr, size_t bytes);
cudaError_t cudaFreeHost(void *ptr);

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemset(void *dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream);

cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);

/* Stream capture and graphs (graphs.cpp): a capture records the stream's
 * work (kernels, copies, memsets, cuBLAS and host work; a wait on an event
 * or another stream invalidates it) instead of running it, and the calling
 * thread may not wait for the device, allocate or free meanwhile (except in
 * Relaxed mode): such a call fails with cudaErrorStreamCaptureUnsupported
 * and invalidates the capture. A graph launch queues the recorded work
 * again, with the arguments it was captured with. An update succeeds when
 * the new graph runs the same operations in the same order (the arguments
 * may differ), else cudaErrorGraphExecUpdateFailure (topology changed). */
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags);
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph, cudaGraphExecUpdateResultInfo *info);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);

cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

/* cudaFuncSetAttribute's body (C++ callers use the template below). */
cudaError_t bbemu_func_set_attribute(const void *func, enum cudaFuncAttribute attr, int value);

/* ---- device-side entry points (the builtins below call these) ------------ */
enum bbemu_warp_op { BBEMU_SYNCWARP, BBEMU_SHFL_XOR, BBEMU_SHFL_DOWN, BBEMU_SHFL_UP, BBEMU_SHFL_IDX };
void bbemu_syncthreads(const char *file, int line);
/* A warp operation of the calling lane: `op` with `arg` (lane mask, delta
 * or source lane) and `width`; returns the source lane's `bits`. */
uint64_t bbemu_warp(const char *file, int line, enum bbemu_warp_op op, unsigned mask, uint64_t bits, int arg,
                    int width);

/* What a fiber sees of itself: at the top of its stack (see self() below). */
typedef struct bbemu_fiber_view {
    uint3 thread_idx, block_idx;
    dim3 block_dim, grid_dim;
    void *dynamic_shared;
} bbemu_fiber_view;
/* Fiber stacks are this size and aligned to it; the view sits in the top
 * BBEMU_VIEW_BYTES. */
#define BBEMU_STACK_BYTES ((size_t)1 << 18)
#define BBEMU_VIEW_BYTES ((size_t)64)

/* A launch, as BB_LAUNCH makes it: checked and queued on `stream`; the
 * body runs `invoke(ctx)` once per CUDA thread; `drop(ctx)` when done.
 * `pointers` lists the kernel's pointer arguments (checked when it runs:
 * device memory of the stream's device, or pinned host memory). */
typedef struct bbemu_launch_desc {
    const char *name;
    const void *func;
    dim3 grid, block;
    size_t shared_bytes;
    cudaStream_t stream;
    void (*invoke)(void *ctx);
    void (*drop)(void *ctx);
    void *ctx;
    const void *const *pointers; /* the pointer arguments, and their positions */
    const int *pointer_index;
    int pointer_count;
} bbemu_launch_desc;
cudaError_t bbemu_launch(const bbemu_launch_desc *d);

#ifdef __cplusplus
} /* extern "C" */

/* ---- C++: the kernel language on the CPU ------------------------------- */
#include <algorithm>
#include <memory>
#include <string.h>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
/* Static shared memory: one copy per stream thread, which runs one block
 * at a time (not poisoned between blocks, like uninitialised shared memory). */
#define __shared__ static thread_local

/* The typed overloads CUDA's header has for C++. */
template <class T> cudaError_t cudaMalloc(T **ptr, size_t bytes) { return cudaMalloc((void **)ptr, bytes); }
template <class T> cudaError_t cudaMallocAsync(T **ptr, size_t bytes, cudaStream_t s)
{
    return cudaMallocAsync((void **)ptr, bytes, s);
}
template <class T> cudaError_t cudaHostAlloc(T **ptr, size_t bytes, unsigned int flags)
{
    return cudaHostAlloc((void **)ptr, bytes, flags);
}
template <class T> cudaError_t cudaMallocHost(T **ptr, size_t bytes) { return cudaMallocHost((void **)ptr, bytes); }

template <class T> cudaError_t cudaFuncSetAttribute(T *func, enum cudaFuncAttribute attr, int value)
{
    return bbemu_func_set_attribute(reinterpret_cast<const void *>(func), attr, value);
}

namespace bbemu {

/* The running fiber: its stack is aligned to BBEMU_STACK_BYTES and ends
 * with its view, so no thread-local lookup is needed. */
inline bbemu_fiber_view *self()
{
    uintptr_t base = reinterpret_cast<uintptr_t>(__builtin_frame_address(0)) & ~(uintptr_t)(BBEMU_STACK_BYTES - 1);
    return reinterpret_cast<bbemu_fiber_view *>(base + BBEMU_STACK_BYTES - BBEMU_VIEW_BYTES);
}

template <class T>
inline T warp_op(const char *file, int line, bbemu_warp_op op, unsigned mask, T v, int arg, int width = 32)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffles move up to 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = bbemu_warp(file, line, op, mask, bits, arg, width);
    memcpy(&v, &bits, sizeof v);
    return v;
}

inline void syncwarp(const char *file, int line, unsigned mask = 0xffffffffu)
{
    bbemu_warp(file, line, BBEMU_SYNCWARP, mask, 0, 0, 32);
}

/* Appends argument i to the launch's pointer list when it is a pointer. */
template <class T> inline void note_pointer(const void **ptrs, int *index, int *n, int i, const T &v)
{
    if constexpr (std::is_pointer<T>::value) {
        ptrs[*n] = reinterpret_cast<const void *>(v);
        index[*n] = i;
        ++*n;
    }
}

template <class... P> struct closure {
    void (*fn)(P...);
    std::tuple<std::decay_t<P>...> args;
};

template <class... P> struct launcher {
    const char *name;
    void (*fn)(P...);
    dim3 grid, block;
    size_t shared;
    cudaStream_t stream;

    template <class... A> void operator()(A &&...a) const
    {
        static_assert(sizeof...(A) == sizeof...(P), "a kernel launch with the wrong number of arguments");
        using C = closure<P...>;
        C *c = new C{fn, std::tuple<std::decay_t<P>...>(static_cast<P>(std::forward<A>(a))...)};
        const void *ptrs[sizeof...(P) + 1] = {nullptr};
        int index[sizeof...(P) + 1] = {0}, n = 0, i = 0;
        std::apply([&](const auto &...v) { (note_pointer(ptrs, index, &n, i++, v), ...); }, c->args);
        bbemu_launch_desc d;
        d.name = name, d.func = reinterpret_cast<const void *>(fn);
        d.grid = grid, d.block = block, d.shared_bytes = shared, d.stream = stream;
        d.invoke = [](void *ctx) {
            C *k = static_cast<C *>(ctx);
            std::apply(k->fn, k->args);
        };
        d.drop = [](void *ctx) { delete static_cast<C *>(ctx); };
        d.ctx = c, d.pointers = ptrs, d.pointer_index = index, d.pointer_count = n;
        bbemu_launch(&d); /* the error is the thread's last error, as after <<<>>> */
    }
};

template <class... P>
launcher<P...> launch(const char *name, void (*fn)(P...), dim3 grid, dim3 block, size_t shared, cudaStream_t stream)
{
    return launcher<P...>{name, fn, grid, block, shared, stream};
}

} // namespace bbemu

#define threadIdx (::bbemu::self()->thread_idx)
#define blockIdx (::bbemu::self()->block_idx)
#define blockDim (::bbemu::self()->block_dim)
#define gridDim (::bbemu::self()->grid_dim)
static constexpr int warpSize = 32;

#define __syncthreads() bbemu_syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) ::bbemu::syncwarp(__FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__)
#define __shfl_xor_sync(...) ::bbemu::warp_op(__FILE__, __LINE__, BBEMU_SHFL_XOR, __VA_ARGS__)
#define __shfl_down_sync(...) ::bbemu::warp_op(__FILE__, __LINE__, BBEMU_SHFL_DOWN, __VA_ARGS__)
#define __shfl_up_sync(...) ::bbemu::warp_op(__FILE__, __LINE__, BBEMU_SHFL_UP, __VA_ARGS__)
#define __shfl_sync(...) ::bbemu::warp_op(__FILE__, __LINE__, BBEMU_SHFL_IDX, __VA_ARGS__)

/* Atomics: blocks of one device may run on several stream threads at once. */
inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v)
{
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
template <class T> inline T bbemu_atomic_add_float(T *p, T v)
{
    T old, next;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do next = old + v;
    while (!__atomic_compare_exchange(p, &old, &next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}
inline float atomicAdd(float *p, float v) { return bbemu_atomic_add_float(p, v); }
inline double atomicAdd(double *p, double v) { return bbemu_atomic_add_float(p, v); }
inline int atomicExch(int *p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }

/* CUDA's device math that C's libm does not have. */
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float x, float y) { return x / y; }
template <class T> inline T __ldg(const T *p) { return *p; }
#define BBEMU_MINMAX(T)                                  \
    inline T min(T a, T b) { return b < a ? b : a; }     \
    inline T max(T a, T b) { return a < b ? b : a; }
BBEMU_MINMAX(int)
BBEMU_MINMAX(unsigned)
BBEMU_MINMAX(long)
BBEMU_MINMAX(unsigned long)
BBEMU_MINMAX(long long)
BBEMU_MINMAX(unsigned long long)
BBEMU_MINMAX(float)
BBEMU_MINMAX(double)
#undef BBEMU_MINMAX

#endif /* __cplusplus */
#endif
