// cuda_state.h — private to the CUDA backend (cuda_backend.cu,
// cuda_products.cu and cuda_attention_ops.cu): a backend's state, the
// helpers they share, and the ops the other files give the vtable.
#ifndef BIGBATCH_CUDA_STATE_H
#define BIGBATCH_CUDA_STATE_H

#include <cublasLt.h>
#include <cublas_v2.h>

#include "backend/backend_impl.h"
#include "cudnn_attention.h"

namespace bb_cuda {

struct cuda_state {
    int device;
    cudaStream_t stream[3];     // bb_stream: compute, copy, comm
    cublasHandle_t blas;        // on the compute stream
    // bf16 products with epilogues (cuBLASLt, on the compute stream; NULL
    // under fp32): lt_f32_bias when it adds an fp32 bias to bf16 sums,
    // lt_warned the epilogues it had no algorithm for (said once each).
    cublasLtHandle_t lt;
    bool lt_f32_bias;
    unsigned lt_warned;
    void *blas_ws;              // cuBLAS's and cuBLASLt's workspace: kBlasWorkspace bytes
    // Scratch of the ops, sized by bb_backend_reserve_scratch and grown in
    // stream order (cudaMallocAsync) when an op needs more: no op frees or
    // allocates with a call that synchronizes the device.
    float *columns;             // column-sum partials: 2 · BBK_COLUMN_CHUNKS · width floats
    size_t columns_bytes;
    double *row_loss;           // per-row losses: rows doubles
    size_t row_loss_bytes;
    void *sort;                 // the embedding backward's ordered reduction (bbk_embedding_sort_bytes)
    size_t sort_bytes;
    // bf16 attention through cuDNN (cudnn_attention.h): its bf16 operands
    // (qkv, out, dout, dqkv: 8 · B·T·C halves) and its workspace, grown as
    // the rest of the scratch; cudnn_off once it failed to load or to run.
    bb_cudnn *cudnn;
    bool cudnn_off;
    uint16_t *attn16;
    size_t attn16_bytes;
    float *attn32; // bf16 tensors on the tiled attention kernels: their fp32 copies
    size_t attn32_bytes;
    void *cudnn_ws;
    size_t cudnn_ws_bytes;
    // Graphs of the compute stream's work (bb_backend_graph_begin): the
    // instantiated one, updated in place; graphs_off by BB_CUDA_GRAPHS=off
    // or after a failure.
    cudaGraphExec_t graph;
    bool graphs_off;
    double *partial;            // sum_squares: kPartials block sums
    double *range_sums;         // and kRanges ranges' sums
    double *loss_sum;           // device: the loss, summed in a fixed order
    int *counter;               // device: rows with a target
    struct host_result {
        double loss;
        int valid, correct;
    } *host;                    // pinned: what the loss reads back
};

constexpr int kPartials = 1024, kRanges = 1024;
constexpr size_t kBlasWorkspace = size_t(32) << 20; // as cuda_sizes.c counts it

inline cuda_state *state(bb_backend_t *b) { return static_cast<cuda_state *>(b->impl); }
inline cudaStream_t compute(bb_backend_t *b) { return state(b)->stream[BB_STREAM_COMPUTE]; }
inline void use(bb_backend_t *b) { cudaSetDevice(state(b)->device); }
// The fp32 data of a tensor (ops.def's dtypes are checked before the call).
inline float *f32(bb_tensor t) { return static_cast<float *>(t.data); }

// Makes *p hold at least `need` bytes, in stream order on the compute
// stream (cuda_backend.cu); false (error noted) on failure.
bool grow(bb_backend_t *b, void **p, size_t *bytes, size_t need, const char *what);

// cuda_backend.cu: the column-sum scratch (2 · BBK_COLUMN_CHUNKS · width
// floats, NULL and noted on failure) and the activation ops
float *column_scratch(bb_backend_t *b, size_t width);
void cuda_activation_forward(bb_backend_t *b, bb_activation act, bb_tensor out, bb_tensor in, size_t n);
void cuda_activation_backward(bb_backend_t *b, bb_activation act, bb_tensor din, bb_tensor dout, bb_tensor in,
                              size_t n);

// cuda_products.cu: the products' ops, and at backend creation under bf16
// cuBLASLt (lt_start: none, with a warning, where it cannot start)
void cuda_linear_forward(bb_backend_t *b, bb_tensor out, bb_tensor in, bb_tensor w, bb_tensor bias, int N, int IC,
                         int OC, int ldo);
void cuda_linear_backward(bb_backend_t *b, bb_tensor din, bb_tensor dw, bb_tensor dbias, bb_tensor dout, bb_tensor in,
                          bb_tensor w, int N, int IC, int OC, int ldd, bool accumulate);
void cuda_linear_activation_forward(bb_backend_t *b, bb_activation act, bb_tensor out, bb_tensor pre, bb_tensor in,
                                    bb_tensor w, bb_tensor bias, int N, int IC, int OC);
void cuda_activation_linear_backward(bb_backend_t *b, bb_activation act, bb_tensor dpre, bb_tensor dw, bb_tensor dbias,
                                     bb_tensor dout, bb_tensor in, bb_tensor w, bb_tensor pre, int N, int IC, int OC,
                                     bool accumulate);
void cuda_muon(bb_backend_t *b, float *params, const float *grads, float *momentum_buf, float *work, int rows, int cols,
               float lr, float momentum, float weight_decay, float update_scale, float grad_scale);
void lt_start(bb_backend_t *b);
const char *cuda_bf16_products(bb_backend_t *b);

// cuda_attention_ops.cu
void cuda_attention_forward(bb_backend_t *b, bb_tensor out, float *lse, bb_tensor qkv, int B, int T, int NH, int KVH,
                            int HS);
void cuda_attention_backward(bb_backend_t *b, bb_tensor dqkv, bb_tensor dout, bb_tensor qkv, bb_tensor out,
                             const float *lse, int B, int T, int NH, int KVH, int HS);
void cuda_attention_decode(bb_backend_t *b, bb_tensor out, float *scores, bb_tensor kv, bb_tensor qkv, int T, int NH, int KVH,
                           int HS);
const char *cuda_attention_engine(bb_backend_t *b);
// At backend creation: cuDNN opened (bf16, --attention auto|cudnn); fails only for --attention cudnn.
bb_status cudnn_start(bb_backend_t *b);

} // namespace bb_cuda

#endif
