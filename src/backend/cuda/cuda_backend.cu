// cuda_backend.cu — the CUDA backend instance: cudaMalloc behind the shared
// accounting, pinned host memory, a compute, a copy and a communication
// stream with events between them, and the ops on the kernels of
// cuda_kernels.cu; the matrix products are cuda_products.cu's (cuBLAS and
// cuBLASLt), attention's ops cuda_attention_ops.cu's (the state they
// share: cuda_state.h).
//
// Ops return nothing (backend.h), so a CUDA or cuBLAS error in one is kept
// (the first one, bb_backend_note_error) and returned by the next copy,
// synchronize or event call on this backend, naming the op. No op
// allocates or frees with a call that synchronizes the device: scratch is
// reserved before training and grows in stream order. Every entry point
// first makes the backend's device current on the calling thread: worker
// threads need no setup of their own.
#include <cublas_v2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <new>

#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_state.h"
#include "cudnn_attention.h"

namespace bb_cuda {

bool failed(bb_backend_t *b) { return b->error != BB_OK; }

// Makes *p hold at least `need` bytes, in stream order on the compute
// stream: the old buffer is freed after the ops queued before, the new one
// is usable by the ops queued after. false (error noted) on failure.
bool grow(bb_backend_t *b, void **p, size_t *bytes, size_t need, const char *what)
{
    if (need <= *bytes) return true;
    cudaStream_t st = compute(b);
    if (*p) BB_CUDA_OP(b, cudaFreeAsync(*p, st));
    *p = NULL;
    *bytes = 0;
    cudaError_t e = cudaMallocAsync(p, need, st);
    bb_cuda_note(b, e, what);
    if (e != cudaSuccess) {
        *p = NULL;
        return false;
    }
    *bytes = need;
    return true;
}

float *column_scratch(bb_backend_t *b, size_t width)
{
    cuda_state *s = state(b);
    size_t need = 2 * (size_t)BBK_COLUMN_CHUNKS * width * sizeof(float);
    return grow(b, (void **)&s->columns, &s->columns_bytes, need, "column-sum scratch") ? s->columns : NULL;
}

double *row_scratch(bb_backend_t *b, size_t rows)
{
    cuda_state *s = state(b);
    return grow(b, (void **)&s->row_loss, &s->row_loss_bytes, rows * sizeof(double), "per-row loss scratch")
               ? s->row_loss
               : NULL;
}

void *sort_scratch(bb_backend_t *b, size_t rows)
{
    cuda_state *s = state(b);
    return grow(b, &s->sort, &s->sort_bytes, bbk_embedding_sort_bytes(rows), "embedding sort scratch") ? s->sort : NULL;
}

static_assert(BBK_COLUMN_CHUNKS == 256, "cuda_sizes.c counts 256 column chunks");

// What this backend holds besides its counted allocations: the scratch,
// the reduction partials and cuBLAS's (and cuBLASLt's) workspace (as
// cuda_sizes.c counts it for the planner).
uint64_t cuda_workspace_bytes(const bb_backend_t *b)
{
    const cuda_state *s = static_cast<const cuda_state *>(b->impl);
    return s->row_loss_bytes + s->columns_bytes + s->sort_bytes + s->attn16_bytes + s->attn32_bytes + s->cudnn_ws_bytes +
           (kPartials + kRanges) * sizeof(double) + kBlasWorkspace;
}

bb_status cuda_reserve_scratch(bb_backend_t *b, size_t rows, size_t width)
{
    use(b);
    if (width) column_scratch(b, width);
    if (rows) row_scratch(b, rows), sort_scratch(b, rows);
    // The planner counts bb_cuda_workspace_bytes: say so when the real scratch is larger.
    uint64_t real = cuda_workspace_bytes(b), counted = bb_cuda_workspace_bytes(rows, width);
    if (real > counted) {
        char a[24], c[24];
        BB_WARN("%s: the ops' scratch takes %s, more than the planner counts (%s): its predictions are low by "
                "the difference", b->name, bb_format_bytes(real, a, sizeof a), bb_format_bytes(counted, c, sizeof c));
    }
    return bb_backend_pending(b);
}

// ---- memory ----------------------------------------------------------------
bb_status cuda_alloc(bb_backend_t *b, size_t bytes, void **out)
{
    use(b);
    cudaError_t err = cudaMalloc(out, bytes);
    if (err == cudaSuccess) return BB_OK;
    *out = NULL;
    if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError(); // an out-of-memory is reported by the caller, and is not sticky
        return BB_ERR_OOM;
    }
    return bb_fail(BB_ERR_DEVICE, "%s: cudaMalloc of %zu bytes: %s", b->name, bytes, cudaGetErrorString(err));
}

void cuda_free(bb_backend_t *b, void *ptr)
{
    use(b);
    cudaFree(ptr);
}

bool cuda_free_bytes(bb_backend_t *b, uint64_t *free_bytes)
{
    use(b);
    size_t f = 0, total = 0;
    if (cudaMemGetInfo(&f, &total) != cudaSuccess) return false;
    *free_bytes = f;
    return true;
}

bb_status cuda_host_alloc(bb_backend_t *b, size_t bytes, void **out)
{
    use(b);
    // Portable: pinned for every device of the process (the loader's slots
    // feed several workers' copies).
    cudaError_t err = cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocPortable);
    if (err != cudaSuccess) *out = NULL;
    return err == cudaSuccess ? BB_OK : bb_fail(BB_ERR_NOMEM, "%s: cannot pin %zu bytes of host memory: %s", b->name,
                                                 bytes, cudaGetErrorString(err));
}

void cuda_host_free(bb_backend_t *b, void *ptr, size_t bytes)
{
    (void)bytes;
    use(b);
    cudaFreeHost(ptr);
}

bb_status cuda_copy_async(bb_backend_t *b, void *dst, const void *src, size_t bytes, bb_copy_kind kind,
                          bb_stream stream)
{
    use(b);
    static const cudaMemcpyKind kinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice};
    BB_CUDA(cudaMemcpyAsync(dst, src, bytes, kinds[kind], state(b)->stream[stream]));
    return bb_backend_pending(b);
}

// Copies run on the compute stream, so they are ordered after the ops that
// produced their source (and, for a batch upload, after the previous
// micro-step's ops that read the buffer they overwrite). Host<->device
// copies wait for completion: bb_backend_copy promises the data is there
// when it returns. (batch.c overlaps uploads through cuda_copy_async.)
bb_status cuda_copy(bb_backend_t *b, void *dst, const void *src, size_t bytes, bb_copy_kind kind)
{
    BB_TRY(cuda_copy_async(b, dst, src, bytes, kind, BB_STREAM_COMPUTE));
    if (kind != BB_COPY_D2D) {
        b->host_waits++;
        BB_CUDA(cudaStreamSynchronize(compute(b)));
    }
    return bb_backend_pending(b);
}

bb_status cuda_memset(bb_backend_t *b, void *dst, int value, size_t bytes)
{
    use(b);
    BB_CUDA(cudaMemsetAsync(dst, value, bytes, compute(b)));
    return bb_backend_pending(b);
}

// Waits for all three streams, also after one of them failed.
bb_status cuda_synchronize(bb_backend_t *b)
{
    use(b);
    bb_status rc = BB_OK;
    b->host_waits++;
    for (int i = 0; i < 3; i++) {
        cudaError_t e = cudaStreamSynchronize(state(b)->stream[i]);
        if (e != cudaSuccess && rc == BB_OK) rc = bb_cuda_fail(e, "cudaStreamSynchronize");
    }
    return rc != BB_OK ? rc : bb_backend_pending(b);
}

void cuda_destroy(bb_backend_t *b)
{
    cuda_state *s = state(b);
    if (!s) return;
    use(b);
    // Stream-ordered scratch is not waited for by cudaFree: nothing queued may still use it.
    for (int i = 0; i < 3; i++)
        if (s->stream[i]) cudaStreamSynchronize(s->stream[i]);
    cudaGetLastError();
    cudaFree(s->columns);
    cudaFree(s->row_loss);
    cudaFree(s->sort);
    cudaFree(s->attn16);
    cudaFree(s->attn32);
    cudaFree(s->cudnn_ws);
    bb_cudnn_close(s->cudnn);
    cudaFree(s->partial);
    cudaFree(s->range_sums);
    cudaFree(s->loss_sum);
    cudaFree(s->counter);
    cudaFreeHost(s->host);
    if (s->graph) cudaGraphExecDestroy(s->graph);
    if (s->lt) cublasLtDestroy(s->lt);
    if (s->blas) cublasDestroy(s->blas);
    cudaFree(s->blas_ws);
    for (int i = 0; i < 3; i++)
        if (s->stream[i]) cudaStreamDestroy(s->stream[i]);
    delete s;
    b->impl = NULL;
}

// ---- streams and events -----------------------------------------------------
bb_status cuda_event_create(bb_backend_t *b, bb_event_t **out)
{
    use(b);
    cudaEvent_t e;
    BB_CUDA(cudaEventCreate(&e)); // with timing: the trace reads device times
    *out = reinterpret_cast<bb_event_t *>(e);
    return BB_OK;
}

void cuda_event_destroy(bb_backend_t *b, bb_event_t *e)
{
    use(b);
    cudaEventDestroy(reinterpret_cast<cudaEvent_t>(e));
}

bb_status cuda_event_record(bb_backend_t *b, bb_event_t *e, bb_stream stream)
{
    use(b);
    BB_CUDA(cudaEventRecord(reinterpret_cast<cudaEvent_t>(e), state(b)->stream[stream]));
    return bb_backend_pending(b);
}

bb_status cuda_stream_wait(bb_backend_t *b, bb_stream stream, bb_event_t *e)
{
    use(b);
    BB_CUDA(cudaStreamWaitEvent(state(b)->stream[stream], reinterpret_cast<cudaEvent_t>(e), 0));
    return bb_backend_pending(b);
}

// ---- graphs: the compute stream captured (this thread only), launched whole --
bool cuda_graph_begin(bb_backend_t *b)
{
    cuda_state *s = state(b);
    if (s->graphs_off) return false;
    use(b);
    cudaError_t e = cudaStreamBeginCapture(compute(b), cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) return true;
    cudaGetLastError();
    BB_WARN("%s: CUDA graphs off (cudaStreamBeginCapture: %s): kernels are launched one by one", b->name,
            cudaGetErrorString(e));
    s->graphs_off = true;
    return false;
}

// The captured graph into s->graph (updated in place where its operations
// are the same, else instantiated anew) and launched.
cudaError_t launch_captured(cuda_state *s, cudaGraph_t g, cudaStream_t stream)
{
    if (s->graph) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(s->graph, g, &info) != cudaSuccess) { // another topology: a new graph
            cudaGetLastError();
            cudaGraphExecDestroy(s->graph);
            s->graph = nullptr;
        }
    }
    cudaError_t e = s->graph ? cudaSuccess : cudaGraphInstantiate(&s->graph, g, 0);
    return e == cudaSuccess ? cudaGraphLaunch(s->graph, stream) : e;
}

bool cuda_graph_end(bb_backend_t *b)
{
    cuda_state *s = state(b);
    use(b);
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamEndCapture(compute(b), &g);
    char why[300] = "";
    if (b->error != BB_OK) snprintf(why, sizeof why, "%s", b->error_message); // an op failed while captured
    else if (e != cudaSuccess) snprintf(why, sizeof why, "cudaStreamEndCapture: %s", cudaGetErrorString(e));
    else if ((e = launch_captured(s, g, compute(b))) != cudaSuccess)
        snprintf(why, sizeof why, "launching the graph: %s", cudaGetErrorString(e));
    if (g) cudaGraphDestroy(g);
    if (!why[0]) return true;
    cudaGetLastError();
    BB_WARN("%s: CUDA graphs off (%s): kernels are launched one by one", b->name, why);
    s->graphs_off = true;
    b->error = BB_OK; // nothing ran: the work, issued again, notes its own failures
    return false;
}

bb_status cuda_event_elapsed(bb_backend_t *b, bb_event_t *from, bb_event_t *to, double *ms)
{
    use(b);
    float f = 0;
    BB_CUDA(cudaEventElapsedTime(&f, reinterpret_cast<cudaEvent_t>(from), reinterpret_cast<cudaEvent_t>(to)));
    BB_TRY(bb_backend_pending(b));
    *ms = f;
    return BB_OK;
}

bb_status cuda_event_synchronize(bb_backend_t *b, bb_event_t *e)
{
    use(b);
    b->host_waits++;
    BB_CUDA(cudaEventSynchronize(reinterpret_cast<cudaEvent_t>(e)));
    return bb_backend_pending(b);
}


// ---- the other ops -----------------------------------------------------------
// forward: out = act(x); backward: out = x · act'(in) (x is dout). ops.def checked `act`.
void activation(bb_backend_t *b, bb_activation act, bool backward, bb_tensor out, bb_tensor x, const void *in,
                size_t n)
{
    use(b);
    bb_cuda_note(b, bbk_activation(compute(b), x.dtype == BB_DTYPE_BF16, (int)act, backward, out.data, x.data, in, n),
                 bb_activation_op_name(act, backward));
}

void cuda_activation_forward(bb_backend_t *b, bb_activation act, bb_tensor out, bb_tensor in, size_t n)
{
    activation(b, act, false, out, in, nullptr, n);
}

void cuda_activation_backward(bb_backend_t *b, bb_activation act, bb_tensor din, bb_tensor dout, bb_tensor in, size_t n)
{
    activation(b, act, true, din, dout, in.data, n);
}

void cuda_layernorm_forward(bb_backend_t *b, bb_tensor out, float *mean, float *rstd, bb_tensor in, bb_tensor w,
                            bb_tensor bias, int N, int C)
{
    use(b);
    BB_CUDA_OP(b, bbk_layernorm_forward(compute(b), in.dtype == BB_DTYPE_BF16, out.data, mean, rstd, in.data, nullptr,
                                        nullptr, f32(w), f32(bias), N, C, 1e-5f));
}

void cuda_residual_layernorm_forward(bb_backend_t *b, bb_tensor res, bb_tensor out, float *mean, float *rstd,
                                     bb_tensor x, bb_tensor y, bb_tensor w, bb_tensor bias, int N, int C)
{
    use(b);
    BB_CUDA_OP(b, bbk_layernorm_forward(compute(b), x.dtype == BB_DTYPE_BF16, out.data, mean, rstd, x.data, y.data,
                                        res.data, f32(w), f32(bias), N, C, 1e-5f));
}

void cuda_layernorm_backward(bb_backend_t *b, bb_tensor din, bb_tensor dw, bb_tensor dbias, bb_tensor dout,
                             bb_tensor in, bb_tensor w, const float *mean, const float *rstd, int N, int C,
                             bool accumulate)
{
    use(b);
    float *scratch = column_scratch(b, (size_t)C);
    if (scratch)
        BB_CUDA_OP(b, bbk_layernorm_backward(compute(b), in.dtype == BB_DTYPE_BF16, din.data, f32(dw), f32(dbias),
                                             scratch, dout.data, in.data, f32(w), mean, rstd, N, C, accumulate));
}

void cuda_rmsnorm_forward(bb_backend_t *b, bb_tensor out, float *rstd, bb_tensor in, bb_tensor w, int N, int C,
                          float eps)
{
    use(b);
    BB_CUDA_OP(b, bbk_layernorm_forward(compute(b), in.dtype == BB_DTYPE_BF16, out.data, nullptr, rstd, in.data, nullptr,
                                        nullptr, f32(w), nullptr, N, C, eps));
}

void cuda_residual_rmsnorm_forward(bb_backend_t *b, bb_tensor res, bb_tensor out, float *rstd, bb_tensor x,
                                   bb_tensor y, bb_tensor w, int N, int C, float eps)
{
    use(b);
    BB_CUDA_OP(b, bbk_layernorm_forward(compute(b), x.dtype == BB_DTYPE_BF16, out.data, nullptr, rstd, x.data, y.data,
                                        res.data, f32(w), nullptr, N, C, eps));
}

void cuda_rmsnorm_backward(bb_backend_t *b, bb_tensor din, bb_tensor dw, bb_tensor dout, bb_tensor in, bb_tensor w,
                           const float *rstd, int N, int C, bool accumulate)
{
    use(b);
    float *scratch = column_scratch(b, (size_t)C);
    if (scratch)
        BB_CUDA_OP(b, bbk_layernorm_backward(compute(b), in.dtype == BB_DTYPE_BF16, din.data, f32(dw), nullptr, scratch,
                                             dout.data, in.data, f32(w), nullptr, rstd, N, C, accumulate));
}

void cuda_rope_forward(bb_backend_t *b, bb_tensor qkv, const float *table, int B, int T, int NH, int KVH, int HS,
                       int pos0)
{
    use(b);
    BB_CUDA_OP(b, bbk_rope(compute(b), qkv.dtype == BB_DTYPE_BF16, qkv.data, table, B, T, NH, KVH, HS, pos0, 1.0f));
}

void cuda_rope_backward(bb_backend_t *b, bb_tensor dqkv, const float *table, int B, int T, int NH, int KVH, int HS,
                        int pos0)
{
    use(b);
    BB_CUDA_OP(b, bbk_rope(compute(b), dqkv.dtype == BB_DTYPE_BF16, dqkv.data, table, B, T, NH, KVH, HS, pos0, -1.0f));
}

void cuda_swiglu_forward(bb_backend_t *b, bb_tensor out, bb_tensor gu, int N, int F)
{
    use(b);
    BB_CUDA_OP(b, bbk_swiglu_forward(compute(b), gu.dtype == BB_DTYPE_BF16, out.data, gu.data, N, F));
}

void cuda_swiglu_backward(bb_backend_t *b, bb_tensor dgu, bb_tensor dout, bb_tensor gu, int N, int F)
{
    use(b);
    BB_CUDA_OP(b, bbk_swiglu_backward(compute(b), gu.dtype == BB_DTYPE_BF16, dgu.data, dout.data, gu.data, N, F));
}

void cuda_embedding_forward(bb_backend_t *b, bb_tensor out, const int32_t *tokens, bb_tensor wte, bb_tensor wpe, int B,
                            int T, int C)
{
    use(b);
    BB_CUDA_OP(b, bbk_embedding_forward(compute(b), out.dtype == BB_DTYPE_BF16, out.data, tokens, f32(wte), f32(wpe), B,
                                        T, C));
}

// The token table's gradient is an ordered reduction: positions sorted by
// token (stably), each row summed in position order, as the CPU does, so
// it is deterministic and equal to the CPU's to the bit.
void cuda_embedding_backward(bb_backend_t *b, bb_tensor dwte_t, bb_tensor dwpe_t, bb_tensor dout_t,
                             const int32_t *tokens, int B, int T, int C, int V, int maxT, bool accumulate_wte,
                             bool accumulate_wpe)
{
    use(b);
    float *dwte = f32(dwte_t), *dwpe = f32(dwpe_t);
    const void *dout = dout_t.data;
    bool bf16 = dout_t.dtype == BB_DTYPE_BF16;
    cudaStream_t s = compute(b);
    void *sort = sort_scratch(b, (size_t)B * T);
    if (!sort) return;
    // Overwriting means the whole table: rows no token (position) touched become 0.
    if (!accumulate_wte) BB_CUDA_OP(b, cudaMemsetAsync(dwte, 0, (size_t)V * C * sizeof(float), s));
    BB_CUDA_OP(b, bbk_embedding_backward_wte(s, bf16, dwte, dout, tokens, B * T, C, V, sort, state(b)->sort_bytes));
    if (!dwpe) return; // no position table
    if (!accumulate_wpe && maxT > T)
        BB_CUDA_OP(b, cudaMemsetAsync(dwpe + (size_t)T * C, 0, (size_t)(maxT - T) * C * sizeof(float), s));
    BB_CUDA_OP(b, bbk_embedding_backward_wpe(s, bf16, dwpe, dout, B, T, C, accumulate_wpe));
}

void cuda_records_to_tokens(bb_backend_t *b, int32_t *tokens, int32_t *targets, const uint8_t *records, int count,
                            int B, int T, int width)
{
    use(b);
    BB_CUDA_OP(b, bbk_records_to_tokens(compute(b), tokens, targets, records, count, B, T, width));
}

void cuda_records_to_images(bb_backend_t *b, bb_tensor features, int32_t *labels, const uint8_t *records, int count,
                            int B, int inputs)
{
    use(b);
    BB_CUDA_OP(b, bbk_records_to_images(compute(b), f32(features), labels, records, count, B, inputs));
}

void cuda_add(bb_backend_t *b, bb_tensor out, bb_tensor x, bb_tensor y, size_t n)
{
    use(b);
    BB_CUDA_OP(b, bbk_add(compute(b), x.dtype == BB_DTYPE_BF16, out.data, x.data, y.data, n));
}

void cuda_convert(bb_backend_t *b, bb_tensor out, bb_tensor in, size_t n)
{
    use(b);
    if (out.dtype == in.dtype) {
        if (out.data != in.data)
            BB_CUDA_OP(b, cudaMemcpyAsync(out.data, in.data, n * bb_dtype_size(in.dtype), cudaMemcpyDeviceToDevice,
                                          compute(b)));
    } else if (out.dtype == BB_DTYPE_BF16)
        BB_CUDA_OP(b, bbk_bf16_pack(compute(b), static_cast<uint16_t *>(out.data), f32(in), n));
    else
        BB_CUDA_OP(b, bbk_bf16_unpack(compute(b), f32(out), static_cast<const uint16_t *>(in.data), n));
}

// The loss leaves the device as one double: per-row losses (in double, as
// the CPU's) summed in a fixed order on the device.
void cuda_softmax_crossentropy(bb_backend_t *b, double *loss, bb_tensor dlogits_t, bb_tensor logits_t,
                               const int32_t *targets, int N, int V, float normalizer, int *valid)
{
    use(b);
    void *dlogits = dlogits_t.data;
    const void *logits = logits_t.data;
    bool bf16 = dlogits_t.dtype == BB_DTYPE_BF16, bf16_logits = logits_t.dtype == BB_DTYPE_BF16;
    cuda_state *s = state(b);
    cudaStream_t st = compute(b);
    if (loss) *loss = NAN;
    if (valid) *valid = 0;
    if (!loss && !valid) { // the gradient alone: nothing to wait for
        double *rows = row_scratch(b, (size_t)N);
        if (rows)
            BB_CUDA_OP(b, bbk_softmax_crossentropy(st, bf16, bf16_logits, rows, dlogits, logits, targets, N, V, V,
                                                   normalizer, s->counter));
        return;
    }
    double *rows = row_scratch(b, (size_t)N);
    if (!rows) return;
    BB_CUDA_OP(b, cudaMemsetAsync(s->counter, 0, sizeof(int), st));
    BB_CUDA_OP(b, bbk_softmax_crossentropy(st, bf16, bf16_logits, rows, dlogits, logits, targets, N, V, V,
                                           normalizer, s->counter));
    BB_CUDA_OP(b, bbk_sum_rows(st, s->loss_sum, rows, N));
    BB_CUDA_OP(b, cudaMemcpyAsync(&s->host->loss, s->loss_sum, sizeof(double), cudaMemcpyDeviceToHost, st));
    BB_CUDA_OP(b, cudaMemcpyAsync(&s->host->valid, s->counter, sizeof(int), cudaMemcpyDeviceToHost, st));
    b->host_waits++;
    BB_CUDA_OP(b, cudaStreamSynchronize(st));
    if (failed(b)) return;
    if (loss) *loss = s->host->loss / normalizer;
    if (valid) *valid = s->host->valid;
}

void cuda_crossentropy_rows(bb_backend_t *b, double *row_loss, bb_tensor dlogits, bb_tensor logits,
                            const int32_t *targets, int N, int V, int ld, float normalizer)
{
    use(b);
    BB_CUDA_OP(b, bbk_softmax_crossentropy(compute(b), dlogits.dtype == BB_DTYPE_BF16, logits.dtype == BB_DTYPE_BF16,
                                           row_loss, dlogits.data, logits.data, targets, N, V, ld, normalizer,
                                           state(b)->counter));
}

// One double back through pinned memory: the only wait of a chunked loss.
double read_sum(bb_backend_t *b, const double *rows, int n)
{
    cuda_state *s = state(b);
    cudaStream_t st = compute(b);
    BB_CUDA_OP(b, bbk_sum_rows(st, s->loss_sum, rows, n));
    BB_CUDA_OP(b, cudaMemcpyAsync(&s->host->loss, s->loss_sum, sizeof(double), cudaMemcpyDeviceToHost, st));
    b->host_waits++;
    BB_CUDA_OP(b, cudaStreamSynchronize(st));
    return failed(b) ? NAN : s->host->loss;
}

double cuda_sum_rows(bb_backend_t *b, const double *rows, size_t n)
{
    use(b);
    return read_sum(b, rows, (int)n);
}

void cuda_adamw(bb_backend_t *b, float *params, const float *grads, float *m, float *v, size_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale)
{
    use(b);
    float bias1 = 1.0f - powf(beta1, (float)t), bias2_sqrt = sqrtf(1.0f - powf(beta2, (float)t));
    BB_CUDA_OP(b, bbk_adamw(compute(b), params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, bias1, bias2_sqrt,
                            grad_scale));
}

void cuda_sgd(bb_backend_t *b, float *params, const float *grads, float *momentum_buf, size_t n, float lr,
              float momentum, float weight_decay, float grad_scale)
{
    use(b);
    BB_CUDA_OP(b, bbk_sgd(compute(b), params, grads, momentum_buf, n, lr, momentum, weight_decay, grad_scale));
}

// The norms' block sums and totals in the backend's reduction scratch
// (partial, range_sums), in stream order like every op.
void cuda_lamb(bb_backend_t *b, float *params, const float *grads, float *m, float *v, size_t n, float lr, float beta1,
               float beta2, float eps, float weight_decay, int t, float grad_scale)
{
    use(b);
    cuda_state *s = state(b);
    float bias1 = 1.0f - powf(beta1, (float)t), bias2 = 1.0f - powf(beta2, (float)t);
    BB_CUDA_OP(b, bbk_lamb(compute(b), params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, bias1, bias2,
                           grad_scale, s->partial, kPartials, s->range_sums));
}

void cuda_lars(bb_backend_t *b, float *params, const float *grads, float *momentum_buf, size_t n, float lr,
               float momentum, float weight_decay, float trust_coefficient, float grad_scale)
{
    use(b);
    cuda_state *s = state(b);
    BB_CUDA_OP(b, bbk_lars(compute(b), params, grads, momentum_buf, n, lr, momentum, weight_decay, trust_coefficient,
                           grad_scale, s->partial, kPartials, s->range_sums));
}

int cuda_count_correct(bb_backend_t *b, bb_tensor logits_t, const int32_t *targets, int N, int V)
{
    const float *logits = f32(logits_t);
    use(b);
    cuda_state *s = state(b);
    cudaStream_t st = compute(b);
    BB_CUDA_OP(b, cudaMemsetAsync(s->counter, 0, sizeof(int), st));
    BB_CUDA_OP(b, bbk_count_correct(st, s->counter, logits, targets, N, V));
    BB_CUDA_OP(b, cudaMemcpyAsync(&s->host->correct, s->counter, sizeof(int), cudaMemcpyDeviceToHost, st));
    b->host_waits++;
    BB_CUDA_OP(b, cudaStreamSynchronize(st));
    return failed(b) ? 0 : s->host->correct;
}

// Each range's block sums are summed on the device (in a fixed order) into
// its place in range_sums, which is summed and read as one double: one
// wait for up to kRanges ranges.
double cuda_sum_squares_ranges(bb_backend_t *b, const float *x, const size_t *lo, const size_t *hi, int n)
{
    use(b);
    cuda_state *s = state(b);
    double total = 0.0;
    for (int r0 = 0; r0 < n; r0 += kRanges) {
        int count = n - r0 < kRanges ? n - r0 : kRanges;
        for (int r = 0; r < count; r++) {
            int blocks = 0;
            BB_CUDA_OP(b, bbk_sum_squares(compute(b), s->partial, kPartials, &blocks, x + lo[r0 + r],
                                          hi[r0 + r] - lo[r0 + r]));
            BB_CUDA_OP(b, bbk_sum_rows(compute(b), s->range_sums + r, s->partial, blocks));
        }
        total += read_sum(b, s->range_sums, count);
    }
    return total;
}

void cuda_sum_squares_into(bb_backend_t *b, const float *x, size_t n, double *out)
{
    use(b);
    cuda_state *s = state(b);
    int blocks = 0;
    BB_CUDA_OP(b, bbk_sum_squares(compute(b), s->partial, kPartials, &blocks, x, n));
    BB_CUDA_OP(b, bbk_sum_rows(compute(b), out, s->partial, blocks));
}

void *cuda_native_stream(bb_backend_t *b, bb_stream stream) { return state(b)->stream[stream]; }

bb_backend_vtable make_vtable()
{
    bb_backend_vtable v;
    memset(&v, 0, sizeof v);
    v.alloc = cuda_alloc;
    v.free = cuda_free;
    v.copy = cuda_copy;
    v.copy_async = cuda_copy_async;
    v.memset = cuda_memset;
    v.host_alloc = cuda_host_alloc;
    v.host_free = cuda_host_free;
    v.device_free_bytes = cuda_free_bytes;
    v.synchronize = cuda_synchronize;
    v.destroy = cuda_destroy;
    v.reserve_scratch = cuda_reserve_scratch;
    v.workspace_bytes = cuda_workspace_bytes;
    v.event_create = cuda_event_create;
    v.event_destroy = cuda_event_destroy;
    v.event_record = cuda_event_record;
    v.stream_wait = cuda_stream_wait;
    v.event_synchronize = cuda_event_synchronize;
    v.event_elapsed = cuda_event_elapsed;
    v.attention_engine = cuda_attention_engine;
    v.bf16_products = cuda_bf16_products;
    v.native_stream = cuda_native_stream;
    v.graph_begin = cuda_graph_begin;
    v.graph_end = cuda_graph_end;
#define BB_OP(name, ...) v.name = cuda_##name;
#define BB_OP_VALUE(type, name, ...) v.name = cuda_##name;
#include "bigbatch/ops.def"
    return v;
}

const bb_backend_vtable cuda_vtable = make_vtable();

// Streams, the cuBLAS handle and the small buffers of a new backend; what
// is made before a failure is freed by cuda_destroy.
bb_status cuda_start(bb_backend_t *b, const bb_backend_options *o)
{
    cuda_state *s = state(b);
    BB_CUDA(cudaSetDevice(o->device));
    for (int i = 0; i < 3; i++) BB_CUDA(cudaStreamCreateWithFlags(&s->stream[i], cudaStreamNonBlocking));
    BB_CUBLAS(cublasCreate(&s->blas));
    BB_CUBLAS(cublasSetStream(s->blas, s->stream[BB_STREAM_COMPUTE]));
    // fp32 must not use TF32 (to match the CPU backend to 1e-5): the default math mode does not (as
    // PyTorch's with TF32 off) and may pick faster kernels than pedantic mode, which refuses TF32 even
    // where NVIDIA_TF32_OVERRIDE=1 forces it: then, or with BB_CUBLAS_PEDANTIC=1 (to compare), pedantic.
    // bf16 picks its compute type per call.
    const char *tf32 = getenv("NVIDIA_TF32_OVERRIDE"), *pedantic = getenv("BB_CUBLAS_PEDANTIC");
    bool strict = (tf32 && strcmp(tf32, "0")) || (pedantic && !strcmp(pedantic, "1"));
    cublasMath_t math = o->precision == BB_PRECISION_BF16 || !strict ? CUBLAS_DEFAULT_MATH : CUBLAS_PEDANTIC_MATH;
    BB_CUBLAS(cublasSetMathMode(s->blas, math));
    BB_CUDA(cudaMalloc(&s->blas_ws, kBlasWorkspace));
    BB_CUBLAS(cublasSetWorkspace(s->blas, s->blas_ws, kBlasWorkspace));
    // BB_CUBLASLT=off: bf16 products on plain cuBLAS, bias, GELU and bias gradients in kernels (to compare)
    const char *graphs = getenv("BB_CUDA_GRAPHS");
    s->graphs_off = graphs && !strcmp(graphs, "off");
    const char *lt = getenv("BB_CUBLASLT");
    if (o->precision == BB_PRECISION_BF16 && !(lt && !strcmp(lt, "off"))) lt_start(b);
    BB_CUDA(cudaMalloc(&s->partial, kPartials * sizeof(double)));
    BB_CUDA(cudaMalloc(&s->range_sums, kRanges * sizeof(double)));
    BB_CUDA(cudaMalloc(&s->counter, sizeof(int)));
    BB_CUDA(cudaMalloc(&s->loss_sum, sizeof(double)));
    BB_CUDA(cudaHostAlloc(&s->host, sizeof *s->host, cudaHostAllocDefault));
    return cudnn_start(b);
}

} // namespace bb_cuda

using namespace bb_cuda;

extern "C" bb_status bb_backend_create_cuda(const bb_backend_options *o, bb_backend_t **out)
{
    *out = NULL;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        cudaGetLastError();
        bb_cuda_info info;
        bb_cuda_probe(&info); /* says why: no driver, no device, ... */
        return bb_fail(BB_ERR_UNSUPPORTED, "no usable GPU: %s", info.reason);
    }
    if (o->device < 0 || o->device >= count)
        return bb_fail(BB_ERR_ARG, "cuda:%d: this machine has CUDA devices 0..%d", o->device, count - 1);
    bb_backend_t *b = static_cast<bb_backend_t *>(calloc(1, sizeof *b));
    cuda_state *s = new (std::nothrow) cuda_state();
    if (!b || !s) {
        free(b);
        delete s;
        return bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    char name[32];
    snprintf(name, sizeof name, "cuda:%d%s", o->device, o->precision == BB_PRECISION_BF16 ? " (bf16)" : "");
    b->vt = &cuda_vtable;
    b->impl = s;
    bb_backend_init_common(b, BB_DEVICE_CUDA, name, o);
    s->device = o->device;
    bb_status rc = cuda_start(b, o);
    if (rc != BB_OK) {
        bb_backend_destroy(b);
        return rc;
    }
    *out = b;
    return BB_OK;
}
