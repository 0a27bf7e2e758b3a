// cuda_products.cu — the CUDA backend's matrix products (row-major
// through column-major cuBLAS, on the compute stream): fp32 on cuBLAS,
// bf16 on cuBLASLt with the epilogues that carry biases, GELU and its
// gradient and the bias gradients (ARCHITECTURE.md, "bf16 tensors"), and
// cuBLAS plus a kernel where cuBLASLt has no algorithm.
#include <string.h>

#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_state.h"

namespace bb_cuda {

// One GEMM (or a strided batch of them), column-major as cuBLAS: fp32
// throughout, or on bf16 tensor cores with fp32 in and out (fp32 tensors
// under the backend's bf16 precision).
static void gemm(bb_backend_t *b, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
          const float *A, int lda, long long sa, const float *B, int ldb, long long sb, float beta, float *C, int ldc,
          long long sc, int batch, const char *op)
{
    cublasHandle_t h = state(b)->blas;
    cublasStatus_t st;
    if (b->opt.precision == BB_PRECISION_BF16)
        st = batch == 1 ? cublasGemmEx(h, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, &beta, C,
                                       CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT)
                        : cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, sa, B, CUDA_R_32F,
                                                     ldb, sb, &beta, C, CUDA_R_32F, ldc, sc, batch,
                                                     CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT);
    else
        st = batch == 1 ? cublasSgemm(h, ta, tb, m, n, k, &alpha, A, lda, B, ldb, &beta, C, ldc)
                        : cublasSgemmStridedBatched(h, ta, tb, m, n, k, &alpha, A, lda, sa, B, ldb, sb, &beta, C, ldc,
                                                    sc, batch);
    bb_cublas_note(b, st, op);
}

// A GEMM of bf16 tensors A and B (tensor cores), C bf16 or fp32, fp32 sums.
static void gemm16(bb_backend_t *b, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *A, int lda,
            const void *B, int ldb, float beta, void *C, bb_dtype c_dtype, int ldc, const char *op)
{
    float alpha = 1.0f;
    cudaDataType_t ct = c_dtype == BB_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    bb_cublas_note(b, cublasGemmEx(state(b)->blas, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb,
                                   &beta, C, ct, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   op);
}

// ---- bf16 products on cuBLASLt, with epilogues ----------------------------------
// One column-major product D (m,n) = op(A) (m,k) · op(B) (k,n) (+ beta D),
// A and B bf16, fp32 sums, through `epilogue`: the bias (BIAS: an input of
// m; BGRADB: the output, op(B)'s sums over k, n of them), the GELU's input
// `aux` (GELU_AUX: written; DGELU: read) with leading dimension aux_ld.
struct lt_gemm {
    cublasOperation_t ta, tb;
    int m, n, k;
    const void *A;
    int lda;
    const void *B;
    int ldb;
    void *D;
    bb_dtype d_dtype;
    int ldd;
    float beta;
    cublasLtEpilogue_t epilogue;
    const void *bias;
    void *aux;
    int aux_ld;
};

static const char *lt_epilogue_name(cublasLtEpilogue_t e)
{
    switch (e) {
    case CUBLASLT_EPILOGUE_BIAS: return "bias";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "bias and GELU";
    case CUBLASLT_EPILOGUE_GELU: return "GELU (no aux)";
    case CUBLASLT_EPILOGUE_GELU_BIAS: return "bias and GELU (no aux)";
    case CUBLASLT_EPILOGUE_DGELU: return "GELU gradient";
    case CUBLASLT_EPILOGUE_BGRADB: return "bias gradient";
    default: return "plain";
    }
}

// Asks cuBLASLt's heuristic for g and, with `queue`, queues g on the
// compute stream; false (nothing queued) when this backend has no
// cuBLASLt or it has no algorithm for g, said once per epilogue when
// queuing: the caller runs the plain product and a kernel. A failure of
// the call itself is the op's error.
static bool lt_product(bb_backend_t *b, const lt_gemm &g, const char *op, bool queue)
{
    cuda_state *s = state(b);
    if (!s->lt) return false;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t A = NULL, B = NULL, D = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    memset(&heur, 0, sizeof heur);
    int found = 0;
    int32_t ta = g.ta, tb = g.tb, f32 = CUDA_R_32F;
    uint32_t epilogue = g.epilogue;
    int64_t aux_ld = g.aux_ld;
    uint64_t ws = kBlasWorkspace;
    const void *bias = g.bias;
    void *aux = g.aux;
    cudaDataType dt = g.d_dtype == BB_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasStatus_t st = cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
#define LT_STEP(call) \
    if (st == CUBLAS_STATUS_SUCCESS) st = (call)
    LT_STEP(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_STEP(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT_STEP(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    if (bias) {
        LT_STEP(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        // our biases and their gradients are fp32 (a bias gradient is D's type: fp32 too)
        LT_STEP(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &f32, sizeof f32));
    }
    if (aux) {
        LT_STEP(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
        LT_STEP(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
    }
    bool an = g.ta == CUBLAS_OP_N, bn = g.tb == CUBLAS_OP_N;
    LT_STEP(cublasLtMatrixLayoutCreate(&A, CUDA_R_16BF, an ? g.m : g.k, an ? g.k : g.m, g.lda));
    LT_STEP(cublasLtMatrixLayoutCreate(&B, CUDA_R_16BF, bn ? g.k : g.n, bn ? g.n : g.k, g.ldb));
    LT_STEP(cublasLtMatrixLayoutCreate(&D, dt, g.m, g.n, g.ldd));
    LT_STEP(cublasLtMatmulPreferenceCreate(&pref));
    LT_STEP(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    LT_STEP(cublasLtMatmulAlgoGetHeuristic(s->lt, desc, A, B, D, D, pref, 1, &heur, &found));
#undef LT_STEP
    bool ran = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (ran && queue) {
        float alpha = 1.0f, beta = g.beta;
        bb_cublas_note(b,
                       cublasLtMatmul(s->lt, desc, &alpha, g.A, A, g.B, B, &beta, g.D, D, g.D, D, &heur.algo,
                                      s->blas_ws, kBlasWorkspace, compute(b)),
                       op);
    } else if (!ran && queue && !(s->lt_warned & epilogue)) {
        s->lt_warned |= epilogue;
        BB_WARN("%s: %s: cuBLASLt has no bf16 product with the %s epilogue for (%d x %d x %d) (%s): a plain "
                "product and a separate kernel run instead (slower)",
                b->name, op, lt_epilogue_name(g.epilogue), g.m, g.n, g.k,
                st == CUBLAS_STATUS_SUCCESS ? "no algorithm" : cublasGetStatusString(st));
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(D);
    cublasLtMatrixLayoutDestroy(B);
    cublasLtMatrixLayoutDestroy(A);
    cublasLtMatmulDescDestroy(desc);
    return ran;
}

static bool lt_matmul(bb_backend_t *b, const lt_gemm &g, const char *op) { return lt_product(b, g, op, true); }

// At backend creation under bf16: cuBLASLt, and whether it adds an fp32
// bias to bf16 sums (asked of its heuristic on a small product, nothing
// queued). Without it the products run on cuBLAS and the epilogues' work
// in kernels.
void lt_start(bb_backend_t *b)
{
    cuda_state *s = state(b);
    cublasStatus_t st = cublasLtCreate(&s->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        s->lt = NULL;
        BB_WARN("%s: cuBLASLt: %s; bf16 products run on cuBLAS, their bias and GELU in separate kernels", b->name,
                cublasGetStatusString(st));
        return;
    }
    void *p = s->blas_ws; // aligned device memory: the heuristic reads no data
    lt_gemm probe = {CUBLAS_OP_N, CUBLAS_OP_N, 256, 256, 256, p, 256, p, 256, p, BB_DTYPE_BF16, 256, 0.0f,
                     CUBLASLT_EPILOGUE_BIAS, p, NULL, 0};
    s->lt_f32_bias = lt_product(b, probe, "cuBLASLt's fp32 bias", false);
}

const char *cuda_bf16_products(bb_backend_t *b)
{
    cuda_state *s = state(b);
    if (!s->lt) return "cuBLAS bf16 (tensor cores)";
    return s->lt_f32_bias ? "cuBLASLt bf16 (bias, GELU and bias-gradient epilogues)"
                          : "cuBLASLt bf16 (GELU and bias-gradient epilogues; biases by a kernel)";
}

// ---- matrix products (row-major through column-major cuBLAS) ---------------
// out (N,OC) = in (N,IC) · wᵀ: column-major outᵀ (OC,N) = w (stored as wᵀ) ᵀ · inᵀ.
// bf16: on cuBLASLt with the bias in its epilogue (or broadcast into out
// first, beta 1, where it takes no fp32 bias), and with `gelu` out =
// GELU(sums) and pre (may be none) the sums; false: cuBLASLt did not run
// (nothing queued but, maybe, out's bias).
static bool lt_forward(bb_backend_t *b, bb_tensor out, bb_tensor pre, bb_tensor in, bb_tensor w, bb_tensor bias, int N,
                int IC, int OC, int ldo, bool gelu)
{
    bool in_epilogue = bias.data && state(b)->lt_f32_bias, staged = bias.data && !in_epilogue;
    cublasLtEpilogue_t e = gelu ? (pre.data ? (in_epilogue ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                                            : (in_epilogue ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU))
                                : (in_epilogue ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
    if (!state(b)->lt || (!in_epilogue && !gelu)) return false; // no epilogue: cuBLAS's product
    if (staged) BB_CUDA_OP(b, bbk_broadcast_rows(compute(b), out.dtype == BB_DTYPE_BF16, out.data, f32(bias), N, OC));
    lt_gemm g = {CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w.data, IC, in.data, IC, out.data, out.dtype, ldo,
                 staged ? 1.0f : 0.0f, e, in_epilogue ? bias.data : NULL, pre.data, OC};
    return lt_matmul(b, g, gelu ? "linear_activation_forward" : "linear_forward");
}

void cuda_linear_forward(bb_backend_t *b, bb_tensor out, bb_tensor in, bb_tensor w, bb_tensor bias, int N, int IC,
                         int OC, int ldo)
{
    use(b);
    if (in.dtype == BB_DTYPE_BF16 && lt_forward(b, out, bb_no_tensor(), in, w, bias, N, IC, OC, ldo, false)) return;
    float beta = 0.0f;
    bool bf16_out = out.dtype == BB_DTYPE_BF16;
    if (bias.data) { // C starts as the bias (bf16 out: the bias rounded to bf16), then beta 1
        BB_CUDA_OP(b, bbk_broadcast_rows(compute(b), bf16_out, out.data, f32(bias), N, OC));
        beta = 1.0f;
    }
    if (in.dtype == BB_DTYPE_BF16) {
        gemm16(b, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w.data, IC, in.data, IC, beta, out.data, out.dtype, ldo,
               "linear_forward");
        return;
    }
    gemm(b, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, 1.0f, f32(w), IC, 0, f32(in), IC, 0, beta, f32(out), ldo, 0, 1,
         "linear_forward");
}

// dw and dbias of a bf16 product: dwᵀ (IC,OC) (+)= inᵀ (IC,N) · dout (N,OC)
// on cuBLASLt with the bias gradient in its epilogue (into the column
// scratch, then added, when accumulating), else cuBLAS and column sums.
static void weight_grads16(bb_backend_t *b, float *dw, float *dbias, bb_tensor dout, bb_tensor in, int N, int IC, int OC,
                    int ldd, bool accumulate)
{
    float *scratch = dbias ? column_scratch(b, (size_t)OC) : NULL;
    if (dbias && !scratch) return; // noted
    if (dw) {
        lt_gemm g = {CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, in.data, IC, dout.data, ldd, dw, BB_DTYPE_F32, IC,
                     accumulate ? 1.0f : 0.0f, dbias ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT,
                     dbias ? (accumulate ? scratch : dbias) : NULL, NULL, 0};
        if (dbias && lt_matmul(b, g, "linear_backward dw")) {
            if (accumulate) BB_CUDA_OP(b, bbk_add(compute(b), false, dbias, dbias, scratch, (size_t)OC));
            return;
        }
        gemm16(b, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, in.data, IC, dout.data, ldd, accumulate ? 1.0f : 0.0f, dw,
               BB_DTYPE_F32, IC, "linear_backward dw");
    }
    if (dbias) BB_CUDA_OP(b, bbk_column_sums(compute(b), true, dbias, scratch, dout.data, N, OC, accumulate));
}

void cuda_linear_backward(bb_backend_t *b, bb_tensor din_t, bb_tensor dw_t, bb_tensor dbias_t, bb_tensor dout_t,
                          bb_tensor in_t, bb_tensor w_t, int N, int IC, int OC, int ldd, bool accumulate)
{
    use(b);
    float *din = f32(din_t), *dw = f32(dw_t), *dbias = f32(dbias_t), *dout = f32(dout_t), *in = f32(in_t),
          *w = f32(w_t);
    if (dout_t.dtype == BB_DTYPE_BF16) { // as below, on bf16 operands: dw and dbias fp32, din bf16
        weight_grads16(b, dw, dbias, dout_t, in_t, N, IC, OC, ldd, accumulate);
        if (din_t.data)
            gemm16(b, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, w_t.data, IC, dout_t.data, ldd, 0.0f, din_t.data,
                   BB_DTYPE_BF16, IC, "linear_backward din");
        return;
    }
    // dwᵀ (IC,OC) += inᵀ (IC,N) · dout (N,OC); before din, which may alias in
    gemm(b, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, 1.0f, in, IC, 0, dout, ldd, 0, accumulate ? 1.0f : 0.0f, dw, IC, 0, 1,
         "linear_backward dw");
    float *scratch = dbias ? column_scratch(b, (size_t)OC) : NULL;
    if (scratch) BB_CUDA_OP(b, bbk_column_sums(compute(b), false, dbias, scratch, dout, N, OC, accumulate));
    if (din) // dinᵀ (IC,N) = wᵀ (IC,OC) · doutᵀ (OC,N)
        gemm(b, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, 1.0f, w, IC, 0, dout, ldd, 0, 0.0f, din, IC, 0, 1,
             "linear_backward din");
}

// The fused ops: GELU in cuBLASLt's epilogues under bf16, else the two ops.
void cuda_linear_activation_forward(bb_backend_t *b, bb_activation act, bb_tensor out, bb_tensor pre, bb_tensor in,
                                    bb_tensor w, bb_tensor bias, int N, int IC, int OC)
{
    use(b);
    if (act == BB_ACTIVATION_GELU_TANH && in.dtype == BB_DTYPE_BF16 &&
        lt_forward(b, out, pre, in, w, bias, N, IC, OC, OC, true))
        return;
    bb_tensor z = pre.data ? pre : out;
    cuda_linear_forward(b, z, in, w, bias, N, IC, OC, OC);
    cuda_activation_forward(b, act, out, z, (size_t)N * OC);
}

void cuda_activation_linear_backward(bb_backend_t *b, bb_activation act, bb_tensor dpre, bb_tensor dw, bb_tensor dbias,
                                     bb_tensor dout, bb_tensor in, bb_tensor w, bb_tensor pre, int N, int IC, int OC,
                                     bool accumulate)
{
    use(b);
    if (act == BB_ACTIVATION_GELU_TANH && dout.dtype == BB_DTYPE_BF16) {
        weight_grads16(b, f32(dw), f32(dbias), dout, in, N, IC, OC, OC, accumulate); // before dpre, which may alias in
        // dpreᵀ (IC,N) = (wᵀ · doutᵀ) ⊙ GELU'(preᵀ)
        lt_gemm g = {CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, w.data, IC, dout.data, OC, dpre.data, BB_DTYPE_BF16, IC,
                     0.0f, CUBLASLT_EPILOGUE_DGELU, NULL, pre.data, IC};
        if (lt_matmul(b, g, "activation_linear_backward")) return;
        gemm16(b, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, w.data, IC, dout.data, OC, 0.0f, dpre.data, BB_DTYPE_BF16, IC,
               "activation_linear_backward");
    } else
        cuda_linear_backward(b, dpre, dw, dbias, dout, in, w, N, IC, OC, OC, accumulate);
    cuda_activation_backward(b, act, dpre, dpre, pre, (size_t)N * IC);
}

// Muon's step (ops.def) on one row-major matrix, which cuBLAS sees as its
// transpose (column-major, cols x rows): with X_c that transpose, A = X Xᵀ
// is X_cᵀ X_c and X B is B X_c (A and B symmetric); on the tall side
// (rows > cols) A = Xᵀ X is X_c X_cᵀ and X B is X_c B.
void cuda_muon(bb_backend_t *b, float *params, const float *grads, float *momentum_buf, float *work, int rows, int cols,
               float lr, float momentum, float weight_decay, float update_scale, float grad_scale)
{
    use(b);
    cuda_state *s = state(b);
    cudaStream_t st = compute(b);
    size_t n = (size_t)rows * (size_t)cols;
    int m = rows < cols ? rows : cols;
    float *x = work, *y = work + n, *A = work + 2 * n, *B = A + (size_t)m * m;
    BB_CUDA_OP(b, bbk_muon_direction(st, x, momentum_buf, grads, n, momentum, grad_scale, s->partial, kPartials,
                                     s->range_sums));
    bool wide = rows <= cols;
    for (int k = 0; k < BB_MUON_NS_STEPS && b->error == BB_OK; k++) {
        if (wide) gemm(b, CUBLAS_OP_T, CUBLAS_OP_N, m, m, cols, 1.0f, x, cols, 0, x, cols, 0, 0.0f, A, m, 0, 1, "muon");
        else gemm(b, CUBLAS_OP_N, CUBLAS_OP_T, m, m, rows, 1.0f, x, cols, 0, x, cols, 0, 0.0f, A, m, 0, 1, "muon");
        BB_CUDA_OP(b, cudaMemcpyAsync(B, A, (size_t)m * m * sizeof *B, cudaMemcpyDeviceToDevice, st));
        gemm(b, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, BB_MUON_C, A, m, 0, A, m, 0, BB_MUON_B, B, m, 0, 1, "muon");
        BB_CUDA_OP(b, cudaMemcpyAsync(y, x, n * sizeof *y, cudaMemcpyDeviceToDevice, st));
        if (wide) gemm(b, CUBLAS_OP_N, CUBLAS_OP_N, cols, rows, rows, 1.0f, x, cols, 0, B, m, 0, BB_MUON_A, y, cols, 0, 1,
                       "muon");
        else gemm(b, CUBLAS_OP_N, CUBLAS_OP_N, cols, rows, cols, 1.0f, B, m, 0, x, cols, 0, BB_MUON_A, y, cols, 0, 1,
                  "muon");
        float *t = x;
        x = y, y = t;
    }
    BB_CUDA_OP(b, bbk_muon_apply(st, params, x, n, 1.0f - lr * weight_decay, lr * update_scale));
}

} // namespace bb_cuda
