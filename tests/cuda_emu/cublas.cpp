// cublas.cpp — the emulated cuBLAS (include/cublas_v2.h) and cuBLASLt
// (include/cublasLt.h): each call checks its arguments as cuBLAS does,
// reads alpha and beta (host pointer mode), and queues the product on its
// stream, where OpenBLAS runs it (one thread: the streams are the
// parallelism) after checking that the matrices are device memory of the
// handle's device.
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cublasLt.h"
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

// To nearest, ties to even (NaN stays NaN).
uint16_t to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u)
                                           : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
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
    // (only the m rows of each column are stored back: the rest of a leading dimension is not C's)
        C = tc.data();
    }
    for (int i = 0; i < g.batch; i++)
        cblas_sgemm(CblasColMajor, g.ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                    g.tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, g.m, g.n, g.k, g.alpha, A + (size_t)i * g.sa,
                    g.lda, B + (size_t)i * g.sb, g.ldb, g.beta, C + (size_t)i * g.sc, g.ldc);
    if (!tc.empty())
        for (int b = 0; b < g.batch; b++)
            for (int j = 0; j < g.n; j++)
                for (int i = 0; i < g.m; i++) {
                    size_t at = (size_t)b * g.sc + (size_t)j * g.ldc + i;
                    static_cast<uint16_t *>(g.C)[at] = to_bf16(tc[at]);
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

namespace {

// A new handle's device (the current one); false without a device.
bool handle_device(int *device)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || !count) {
        cudaGetLastError();
        return false;
    }
    cudaGetDevice(device);
    std::call_once(blas_threads, [] { openblas_set_num_threads(1); });
    return true;
}

template <class H> cublasStatus_t destroy_handle(H *handle)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

} // namespace

EXPORT cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    int device = 0;
    if (!handle_device(&device)) return CUBLAS_STATUS_NOT_INITIALIZED;
    *handle = new bbemu_cublas{device, nullptr, CUBLAS_DEFAULT_MATH};
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasDestroy(cublasHandle_t handle) { return destroy_handle(handle); }

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

EXPORT cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t bytes)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    const char *why = "";
    if (bytes && !bbemu_device_range(workspace, bytes, handle->device, &why)) {
        fprintf(stderr, "cuda-emu: cublasSetWorkspace: %p (%zu bytes) is not memory of cuda:%d: %s\n", workspace, bytes,
                handle->device, why);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
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

// ---- cuBLASLt ----------------------------------------------------------------
struct bbemu_cublaslt {
    int device;
};

struct bbemu_lt_desc {
    cublasComputeType_t compute;
    int32_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    void *bias = nullptr, *aux = nullptr;
    int64_t aux_ld = 0;
    int32_t bias_type = -1, aux_type = -1; // -1: D's type
};

struct bbemu_lt_layout {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};

struct bbemu_lt_pref {
    uint64_t workspace = 0;
};

namespace {

// BB_CUDA_EMU_LT: "on" (default) or "off" (no heuristic finds an algorithm).
bool lt_enabled()
{
    static int on = -1;
    static std::once_flag read;
    std::call_once(read, [] {
        const char *v = getenv("BB_CUDA_EMU_LT");
        if (!v || !*v || !strcmp(v, "on")) on = 1;
        else if (!strcmp(v, "off")) on = 0;
        else {
            fprintf(stderr, "cuda-emu: BB_CUDA_EMU_LT=%s: expected on or off\n", v);
            exit(1);
        }
    });
    return on == 1;
}

struct lt_call {
    std::string name = "cublasLtMatmul";
    int device;
    int ta, tb, m, n, k;
    float alpha, beta;
    const void *A, *B, *C;
    void *D;
    cudaDataType at, bt, dt;
    int64_t lda, ldb, ldc, ldd;
    uint32_t epilogue;
    void *bias, *aux;
    cudaDataType bias_t, aux_t;
    int64_t aux_ld;
};

bool lt_type(cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }

// What the heuristic and the matmul both check; fills *c (but its pointers and scalars).
cublasStatus_t lt_check(const bbemu_lt_desc *d, const bbemu_lt_layout *A, const bbemu_lt_layout *B,
                        const bbemu_lt_layout *C, const bbemu_lt_layout *D, lt_call *c)
{
    if (!d || !A || !B || !C || !D) return CUBLAS_STATUS_INVALID_VALUE;
    if (d->compute != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED; // the one the backend uses
    if (!lt_type(A->type) || !lt_type(B->type) || !lt_type(D->type) || C->type != D->type)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    uint64_t m = d->ta == CUBLAS_OP_N ? A->rows : A->cols, k = d->ta == CUBLAS_OP_N ? A->cols : A->rows;
    uint64_t kb = d->tb == CUBLAS_OP_N ? B->rows : B->cols, n = d->tb == CUBLAS_OP_N ? B->cols : B->rows;
    if (k != kb || D->rows != m || D->cols != n || C->rows != m || C->cols != n || m > INT32_MAX || n > INT32_MAX ||
        k > INT32_MAX)
        return CUBLAS_STATUS_INVALID_VALUE;
    for (const bbemu_lt_layout *L : {A, B, C, D})
        if (L->ld < (int64_t)(L->rows > 1 ? L->rows : 1)) return CUBLAS_STATUS_INVALID_VALUE;
    if (C->ld != D->ld) return CUBLAS_STATUS_NOT_SUPPORTED; // the emulator's limit, not cuBLASLt's
    uint32_t e = d->epilogue;
    bool bias = e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
                e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_BGRADB;
    bool aux = e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU;
    if (!bias && !aux && e != CUBLASLT_EPILOGUE_DEFAULT && e != CUBLASLT_EPILOGUE_GELU)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    cudaDataType bias_t = d->bias_type < 0 ? D->type : (cudaDataType)d->bias_type;
    cudaDataType aux_t = d->aux_type < 0 ? D->type : (cudaDataType)d->aux_type;
    if (bias && (!d->bias || !lt_type(bias_t))) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (aux && (!d->aux || !lt_type(aux_t) || d->aux_ld < (int64_t)m || d->aux_ld % 8))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    c->ta = d->ta, c->tb = d->tb, c->m = (int)m, c->n = (int)n, c->k = (int)k;
    c->at = A->type, c->bt = B->type, c->dt = D->type;
    c->lda = A->ld, c->ldb = B->ld, c->ldc = C->ld, c->ldd = D->ld;
    c->epilogue = e, c->bias = bias ? d->bias : nullptr, c->aux = aux ? d->aux : nullptr;
    c->bias_t = bias_t, c->aux_t = aux_t, c->aux_ld = d->aux_ld;
    return CUBLAS_STATUS_SUCCESS;
}

float gelu_tanh(float x) { return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))); }

float gelu_tanh_grad(float x)
{
    const float k = 0.7978845608028654f;
    float t = tanhf(k * (x + 0.044715f * x * x * x)), du = k * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

float load(const void *p, cudaDataType t, size_t i)
{
    return t == CUDA_R_32F ? static_cast<const float *>(p)[i] : from_bf16(static_cast<const uint16_t *>(p)[i]);
}

void store(void *p, cudaDataType t, size_t i, float v)
{
    if (t == CUDA_R_32F) static_cast<float *>(p)[i] = v;
    else static_cast<uint16_t *>(p)[i] = to_bf16(v);
}

void run_lt(void *ctx)
{
    lt_call &g = *static_cast<lt_call *>(ctx);
    int ar = g.ta == CUBLAS_OP_N ? g.m : g.k, ac = g.ta == CUBLAS_OP_N ? g.k : g.m;
    int br = g.tb == CUBLAS_OP_N ? g.k : g.n, bc = g.tb == CUBLAS_OP_N ? g.n : g.k;
    size_t na = extent(ar, ac, (int)g.lda, 0, 1), nb = extent(br, bc, (int)g.ldb, 0, 1);
    size_t nd = extent(g.m, g.n, (int)g.ldd, 0, 1);
    bool bgrad = g.epilogue == CUBLASLT_EPILOGUE_BGRADB;
    const struct {
        const char *which;
        const void *p;
        size_t bytes;
    } mats[] = {{"A", g.A, na * type_bytes(g.at)},
                {"B", g.B, nb * type_bytes(g.bt)},
                {"C", g.C, nd * type_bytes(g.dt)},
                {"D", g.D, nd * type_bytes(g.dt)},
                {"the bias", g.bias, g.bias ? (size_t)(bgrad ? g.n : g.m) * type_bytes(g.bias_t) : 0},
                {"the aux matrix", g.aux, g.aux ? extent(g.m, g.n, (int)g.aux_ld, 0, 1) * type_bytes(g.aux_t) : 0}};
    for (const auto &x : mats) {
        const char *why = "";
        if (x.bytes && !bbemu_device_range(x.p, x.bytes, g.device, &why)) {
            bbemu_fail_operation(cudaErrorIllegalAddress, "%s: %s (%p, %zu bytes) is not memory of cuda:%d: %s",
                                 g.name.c_str(), x.which, x.p, x.bytes, g.device, why);
            return;
        }
    }
    std::vector<float> ta, tb, acc(nd, 0.0f);
    const float *A = operand(g.A, g.at, na, EXACT, ta), *B = operand(g.B, g.bt, nb, EXACT, tb);
    if (g.beta != 0.0f)
        for (size_t i = 0; i < nd; i++) acc[i] = load(g.C, g.dt, i);
    cblas_sgemm(CblasColMajor, g.ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                g.tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, g.m, g.n, g.k, g.alpha, A, (int)g.lda, B,
                (int)g.ldb, g.beta, acc.data(), (int)g.ldd);
    uint32_t e = g.epilogue;
    for (int j = 0; j < g.n; j++)
        for (int i = 0; i < g.m; i++) {
            size_t at = (size_t)j * g.ldd + i, ax = (size_t)j * g.aux_ld + i;
            float v = acc[at];
            if (e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
                v += load(g.bias, g.bias_t, i);
            if (e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) store(g.aux, g.aux_t, ax, v);
            if (e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX ||
                e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
                v = gelu_tanh(v);
            if (e == CUBLASLT_EPILOGUE_DGELU) v *= gelu_tanh_grad(load(g.aux, g.aux_t, ax));
            store(g.D, g.dt, at, v);
        }
    if (bgrad) // the k elements of each column of op(B)
        for (int j = 0; j < g.n; j++) {
            float s = 0.0f;
            for (int l = 0; l < g.k; l++)
                s += g.tb == CUBLAS_OP_N ? B[(size_t)j * g.ldb + l] : B[(size_t)l * g.ldb + j];
            store(g.bias, g.bias_t, (size_t)j, s);
        }
}

template <class T> cublasStatus_t set_exact(T *field, const void *buf, size_t bytes)
{
    if (!buf || bytes != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(field, buf, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}

} // namespace

EXPORT cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle)
{
    int device = 0;
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    if (!handle_device(&device)) return CUBLAS_STATUS_NOT_INITIALIZED;
    *handle = new bbemu_cublaslt{device};
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) { return destroy_handle(handle); }

EXPORT cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                               cudaDataType_t scale_type)
{
    if (!desc || scale_type != CUDA_R_32F) return CUBLAS_STATUS_INVALID_VALUE;
    *desc = new bbemu_lt_desc{};
    (*desc)->compute = compute;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc)
{
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                                     const void *buf, size_t bytes)
{
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return set_exact(&d->ta, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSB: return set_exact(&d->tb, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_exact(&d->epilogue, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set_exact(&d->bias, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return set_exact(&d->aux, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return set_exact(&d->aux_ld, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return set_exact(&d->aux_type, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set_exact(&d->bias_type, buf, bytes);
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

EXPORT cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type, uint64_t rows,
                                                 uint64_t cols, int64_t ld)
{
    if (!layout) return CUBLAS_STATUS_INVALID_VALUE;
    *layout = new bbemu_lt_layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout)
{
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    *pref = new bbemu_lt_pref{};
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                           cublasLtMatmulPreferenceAttributes_t attr,
                                                           const void *buf, size_t bytes)
{
    if (!pref || attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) return CUBLAS_STATUS_INVALID_VALUE;
    return set_exact(&pref->workspace, buf, bytes);
}

EXPORT cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                     cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                                     cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                                                     cublasLtMatmulPreference_t pref, int requested,
                                                     cublasLtMatmulHeuristicResult_t results[], int *returned)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!pref || requested < 1 || !results || !returned) return CUBLAS_STATUS_INVALID_VALUE;
    *returned = 0;
    lt_call c{};
    cublasStatus_t st = lt_check(desc, A, B, C, D, &c);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (!lt_enabled()) return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(&results[0], 0, sizeof results[0]);
    results[0].algo.data[0] = 1; // the one algorithm: OpenBLAS, no workspace
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha,
                                     const void *a, cublasLtMatrixLayout_t A, const void *b, cublasLtMatrixLayout_t B,
                                     const void *beta, const void *c, cublasLtMatrixLayout_t C, void *d,
                                     cublasLtMatrixLayout_t D, const cublasLtMatmulAlgo_t *algo, void *workspace,
                                     size_t workspace_bytes, cudaStream_t stream)
{
    (void)workspace, (void)workspace_bytes;
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!alpha || !beta || (algo && algo->data[0] != 1)) return CUBLAS_STATUS_INVALID_VALUE;
    lt_call *g = new lt_call{};
    cublasStatus_t st = lt_check(desc, A, B, C, D, g);
    if (st == CUBLAS_STATUS_SUCCESS && !lt_enabled()) st = CUBLAS_STATUS_NOT_SUPPORTED;
    int sd = bbemu_stream_device(stream);
    if (st == CUBLAS_STATUS_SUCCESS && sd != handle->device) {
        fprintf(stderr, "cuda-emu: cublasLtMatmul: a stream of cuda:%d for a handle of cuda:%d\n", sd, handle->device);
        st = CUBLAS_STATUS_INVALID_VALUE;
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
        delete g;
        return st;
    }
    g->device = handle->device;
    g->alpha = *static_cast<const float *>(alpha), g->beta = *static_cast<const float *>(beta);
    g->A = a, g->B = b, g->C = c, g->D = d;
    bbemu_count("blas_calls", 1);
    if (g->epilogue != CUBLASLT_EPILOGUE_DEFAULT) bbemu_count("lt_epilogues", 1);
    if (g->m == 0 || g->n == 0) {
        delete g;
        return CUBLAS_STATUS_SUCCESS;
    }
    cudaError_t e = bbemu_enqueue_host(
        stream, "cublasLtMatmul", run_lt, [](void *p) { delete static_cast<lt_call *>(p); }, g, 1);
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
