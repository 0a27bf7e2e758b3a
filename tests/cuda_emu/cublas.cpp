// cublas.cpp — the emulated cuBLAS (include/cublas_v2.h): each call checks
// its arguments as cuBLAS does, reads alpha and beta (host pointer mode),
// and queues the product on the handle's stream, where OpenBLAS runs it
// (one thread: the streams are the parallelism) after checking that the
// matrices are device memory of the handle's device.
#include <cblas.h>
#include <stdio.h>
#include <string.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cublas_v2.h"
#include "cuda_emu.h"

#define EXPORT extern "C" __attribute__((visibility("default")))

struct bbemu_cublas {
    int device;
    cudaStream_t stream;
    cublasMath_t math;
};

namespace {

std::once_flag blas_threads;

// What the tensor cores take of an fp32 input: bf16 or tf32, to nearest (ties to even).
enum rounding { EXACT, TO_BF16, TO_TF32 };

float round_to(float x, rounding r)
{
    if (r == EXACT || x != x) return x;
    uint32_t u;
    memcpy(&u, &x, 4);
    int drop = r == TO_BF16 ? 16 : 13;
    uint32_t half = (1u << (drop - 1)) - 1;
    u += half + ((u >> drop) & 1);
    u &= ~((1u << drop) - 1);
    memcpy(&x, &u, 4);
    return x;
}

float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

struct gemm_call {
    std::string name;
    int device;
    cublasOperation_t ta, tb;
    int m, n, k, lda, ldb, ldc, batch;
    long long sa, sb, sc;
    float alpha, beta;
    const void *A, *B;
    void *C;
    cudaDataType at, bt, ct;
    rounding round;
};

size_t type_bytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

// Elements a strided batch of column-major (rows, cols) matrices spans.
size_t extent(int rows, int cols, int ld, long long stride, int batch)
{
    if (rows == 0 || cols == 0 || batch == 0) return 0;
    return (size_t)stride * (size_t)(batch - 1) + (size_t)ld * (size_t)(cols - 1) + (size_t)rows;
}

// One operand as fp32 (rounded as the compute type asks), or the device memory itself.
const float *operand(const void *p, cudaDataType t, size_t n, rounding r, std::vector<float> &tmp)
{
    if (t == CUDA_R_32F && r == EXACT) return static_cast<const float *>(p);
    tmp.resize(n);
    for (size_t i = 0; i < n; i++)
        tmp[i] = t == CUDA_R_32F ? round_to(static_cast<const float *>(p)[i], r)
                                 : from_bf16(static_cast<const uint16_t *>(p)[i]);
    return tmp.data();
}

void run_gemm(void *ctx)
{
    gemm_call &g = *static_cast<gemm_call *>(ctx);
    int ar = g.ta == CUBLAS_OP_N ? g.m : g.k, ac = g.ta == CUBLAS_OP_N ? g.k : g.m;
    int br = g.tb == CUBLAS_OP_N ? g.k : g.n, bc = g.tb == CUBLAS_OP_N ? g.n : g.k;
    size_t na = extent(ar, ac, g.lda, g.sa, g.batch), nb = extent(br, bc, g.ldb, g.sb, g.batch);
    size_t nc = extent(g.m, g.n, g.ldc, g.sc, g.batch);
    const struct {
        const char *which;
        const void *p;
        size_t bytes;
    } mats[] = {{"A", g.A, na * type_bytes(g.at)}, {"B", g.B, nb * type_bytes(g.bt)}, {"C", g.C, nc * type_bytes(g.ct)}};
    for (const auto &x : mats) {
        const char *why = "";
        if (x.bytes && !bbemu_device_range(x.p, x.bytes, g.device, &why)) {
            bbemu_fail_operation(cudaErrorIllegalAddress, "%s: %s (%p, %zu bytes) is not memory of cuda:%d: %s",
                                 g.name.c_str(), x.which, x.p, x.bytes, g.device, why);
            return;
        }
    }
    std::vector<float> ta, tb;
    const float *A = operand(g.A, g.at, na, g.round, ta), *B = operand(g.B, g.bt, nb, g.round, tb);
    // a bf16 C: summed in fp32 from its widened values, rounded once (nearest, ties to even)
    std::vector<float> tc;
    float *C = g.ct == CUDA_R_32F ? static_cast<float *>(g.C) : nullptr;
    if (!C) {
        tc.resize(nc);
        for (size_t i = 0; i < nc; i++) tc[i] = g.beta != 0.0f ? from_bf16(static_cast<const uint16_t *>(g.C)[i]) : 0.0f;
        C = tc.data();
    }
    for (int i = 0; i < g.batch; i++)
        cblas_sgemm(CblasColMajor, g.ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                    g.tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, g.m, g.n, g.k, g.alpha, A + (size_t)i * g.sa,
                    g.lda, B + (size_t)i * g.sb, g.ldb, g.beta, C + (size_t)i * g.sc, g.ldc);
    if (!tc.empty())
        for (size_t i = 0; i < nc; i++) {
            uint32_t u;
            memcpy(&u, &tc[i], 4);
            uint16_t h = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u)
                                                           : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
            static_cast<uint16_t *>(g.C)[i] = h;
        }
}

cublasStatus_t gemm(cublasHandle_t h, const char *name, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                    int k, const float *alpha, const void *A, cudaDataType at, int lda, long long sa, const void *B,
                    cudaDataType bt, int ldb, long long sb, const float *beta, void *C, cudaDataType ct, int ldc,
                    long long sc, int batch, rounding round)
{
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T) || m < 0 || n < 0 ||
        k < 0 || batch < 0 || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    int ar = ta == CUBLAS_OP_N ? m : k, br = tb == CUBLAS_OP_N ? k : n;
    if (lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1)) return CUBLAS_STATUS_INVALID_VALUE;
    if ((at != CUDA_R_32F && at != CUDA_R_16BF) || (bt != CUDA_R_32F && bt != CUDA_R_16BF) ||
        (ct != CUDA_R_32F && ct != CUDA_R_16BF))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    bbemu_count("blas_calls", 1);
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    gemm_call *g = new gemm_call{name, h->device, ta, tb, m, n, k, lda, ldb, ldc, batch, sa, sb, sc, *alpha, *beta,
                                 A, B, C, at, bt, ct, round};
    cudaError_t e = bbemu_enqueue_host(
        h->stream, name, run_gemm, [](void *p) { delete static_cast<gemm_call *>(p); }, g, 1);
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

rounding math_rounding(cublasHandle_t h) { return h && h->math == CUBLAS_TF32_TENSOR_OP_MATH ? TO_TF32 : EXACT; }

cublasStatus_t compute_rounding(cublasComputeType_t c, rounding *r)
{
    switch (c) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC: *r = EXACT; return CUBLAS_STATUS_SUCCESS;
    case CUBLAS_COMPUTE_32F_FAST_16BF: *r = TO_BF16; return CUBLAS_STATUS_SUCCESS;
    case CUBLAS_COMPUTE_32F_FAST_TF32: *r = TO_TF32; return CUBLAS_STATUS_SUCCESS;
    default: return CUBLAS_STATUS_NOT_SUPPORTED; // fp16 compute is not emulated
    }
}

} // namespace

EXPORT cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    int device = 0, count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || !count) {
        cudaGetLastError();
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    cudaGetDevice(&device);
    std::call_once(blas_threads, [] { openblas_set_num_threads(1); });
    *handle = new bbemu_cublas{device, nullptr, CUBLAS_DEFAULT_MATH};
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

// A stream of another device than the handle's is refused (its products could not run there).
EXPORT cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    int d = bbemu_stream_device(stream);
    if (d != handle->device) {
        fprintf(stderr, "cuda-emu: cublasSetStream: a stream of cuda:%d for a handle of cuda:%d\n", d, handle->device);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    *stream = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_DEFAULT_MATH && mode != CUBLAS_TENSOR_OP_MATH && mode != CUBLAS_PEDANTIC_MATH &&
        mode != CUBLAS_TF32_TENSOR_OP_MATH)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    *mode = handle->math;
    return CUBLAS_STATUS_SUCCESS;
}

namespace {

const struct {
    cublasStatus_t status;
    const char *name, *text;
} kStatuses[] = {
    {CUBLAS_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS", "success"},
    {CUBLAS_STATUS_NOT_INITIALIZED, "CUBLAS_STATUS_NOT_INITIALIZED", "the library was not initialized"},
    {CUBLAS_STATUS_ALLOC_FAILED, "CUBLAS_STATUS_ALLOC_FAILED", "the resource allocation failed"},
    {CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_STATUS_INVALID_VALUE", "an invalid numeric value was used as an argument"},
    {CUBLAS_STATUS_ARCH_MISMATCH, "CUBLAS_STATUS_ARCH_MISMATCH", "an absent device architectural feature is required"},
    {CUBLAS_STATUS_MAPPING_ERROR, "CUBLAS_STATUS_MAPPING_ERROR", "an access to GPU memory space failed"},
    {CUBLAS_STATUS_EXECUTION_FAILED, "CUBLAS_STATUS_EXECUTION_FAILED", "the GPU program failed to execute"},
    {CUBLAS_STATUS_INTERNAL_ERROR, "CUBLAS_STATUS_INTERNAL_ERROR", "an internal operation failed"},
    {CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED", "the functionality requested is not supported"},
};

} // namespace

EXPORT const char *cublasGetStatusName(cublasStatus_t s)
{
    for (const auto &x : kStatuses)
        if (x.status == s) return x.name;
    return "CUBLAS_STATUS_UNKNOWN";
}

EXPORT const char *cublasGetStatusString(cublasStatus_t s)
{
    for (const auto &x : kStatuses)
        if (x.status == s) return x.text;
    return "unknown error";
}

EXPORT cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                  const float *alpha, const float *A, int lda, const float *B, int ldb,
                                  const float *beta, float *C, int ldc)
{
    return gemm(h, "cublasSgemm", ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B, CUDA_R_32F, ldb, 0, beta, C,
                CUDA_R_32F, ldc, 0, 1, math_rounding(h));
}

EXPORT cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                                int n, int k, const float *alpha, const float *A, int lda,
                                                long long sa, const float *B, int ldb, long long sb,
                                                const float *beta, float *C, int ldc, long long sc, int batch)
{
    return gemm(h, "cublasSgemmStridedBatched", ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, sa, B, CUDA_R_32F, ldb,
                sb, beta, C, CUDA_R_32F, ldc, sc, batch, math_rounding(h));
}

EXPORT cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                                   cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                                   cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    rounding r;
    cublasStatus_t s = compute_rounding(compute, &r);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    (void)algo;
    return gemm(h, "cublasGemmEx", ta, tb, m, n, k, static_cast<const float *>(alpha), A, at, lda, 0, B, bt, ldb, 0,
                static_cast<const float *>(beta), C, ct, ldc, 0, 1, r);
}

EXPORT cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                                 int n, int k, const void *alpha, const void *A, cudaDataType at,
                                                 int lda, long long sa, const void *B, cudaDataType bt, int ldb,
                                                 long long sb, const void *beta, void *C, cudaDataType ct, int ldc,
                                                 long long sc, int batch, cublasComputeType_t compute,
                                                 cublasGemmAlgo_t algo)
{
    rounding r;
    cublasStatus_t s = compute_rounding(compute, &r);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    (void)algo;
    return gemm(h, "cublasGemmStridedBatchedEx", ta, tb, m, n, k, static_cast<const float *>(alpha), A, at, lda, sa, B,
                bt, ldb, sb, static_cast<const float *>(beta), C, ct, ldc, sc, batch, r);
}
