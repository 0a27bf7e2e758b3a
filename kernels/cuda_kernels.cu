// cuda_kernels.cu — the CUDA kernels of the backend ops that are not
// matrix products (fp32; the optimizers' are in cuda_optim.cu), then their
// launchers. Every reduction runs in a
// fixed order, so every op is deterministic: gradients of parameters
// (bias, LayerNorm weights, position embeddings) loop over rows in order,
// and the token embedding's gradient sorts positions by token (CUB's
// stable radix sort) and sums each token's rows in position order.
#include <math.h>

#include <cub/cub.cuh>

#include "bigbatch/backend.h"
#include "cuda_device.cuh"
#include "cuda_grid.cuh"
#include "cuda_kernels.h"

namespace {

// Sum (or max) over a block of blockDim.x threads (a multiple of 32, at
// most 1024); every thread gets the result.
template <bool Max> __device__ float block_reduce(float v)
{
    __shared__ float lanes[32];
    __shared__ float result;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = Max ? warp_max(v) : warp_sum(v);
    if (lane == 0) lanes[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < warps ? lanes[lane] : (Max ? -INFINITY : 0.0f);
        w = Max ? warp_max(w) : warp_sum(w);
        if (lane == 0) result = w;
    }
    __syncthreads();
    float r = result;
    __syncthreads(); // lanes/result may be reused by the next call
    return r;
}

// ---- elementwise -----------------------------------------------------------
// The activations: each its value and its gradient (dy · act'(x)); one
// forward and one backward kernel for all of them.
struct Relu {
    __device__ static float value(float x) { return x > 0.0f ? x : 0.0f; }
    __device__ static float grad(float dy, float x) { return x > 0.0f ? dy : 0.0f; }
};

// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
struct GeluTanh {
    __device__ static float value(float x)
    {
        return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    }
    __device__ static float grad(float dy, float x)
    {
        const float k = 0.7978845608028654f;
        float t = tanhf(k * (x + 0.044715f * x * x * x)), du = k * (1.0f + 3.0f * 0.044715f * x * x);
        return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
    }
};

// SiLU: x · sigmoid(x); its derivative s · (1 + x · (1 - s)).
struct Silu {
    __device__ static float value(float x) { return x / (1.0f + expf(-x)); }
    __device__ static float grad(float dy, float x)
    {
        float sg = 1.0f / (1.0f + expf(-x));
        return dy * sg * (1.0f + x * (1.0f - sg));
    }
};

// An activation on an element type: one template parameter, so that a
// launch names it in one token.
template <class A, class T> struct ActOn {
    using Act = A;
    using Elem = T;
};

template <class P> __global__ void activation_forward_k(typename P::Elem *out, const typename P::Elem *in, size_t n)
{
    GRID_STRIDE(i, n) bbk_st(out, i, P::Act::value(bbk_ld(in, i)));
}

template <class P>
__global__ void activation_backward_k(typename P::Elem *din, const typename P::Elem *dout, const typename P::Elem *in,
                                      size_t n)
{
    GRID_STRIDE(i, n) bbk_st(din, i, P::Act::grad(bbk_ld(dout, i), bbk_ld(in, i)));
}

template <class T> __global__ void add_k(T *out, const T *x, const T *y, size_t n)
{
    GRID_STRIDE(i, n) bbk_st(out, i, bbk_ld(x, i) + bbk_ld(y, i));
}

// The conversions are backend.h's, so CUDA and CPU round to the same bits.

__global__ void bf16_pack_k(uint16_t *packed, const float *x, size_t n)
{
    GRID_STRIDE(i, n) packed[i] = bb_bf16_from_float(x[i]);
}

__global__ void bf16_unpack_k(float *out, const uint16_t *packed, size_t n)
{
    GRID_STRIDE(i, n) out[i] = bb_bf16_to_float(packed[i]);
}

template <class T> __global__ void broadcast_rows_k(T *out, const float *bias, size_t N, int C)
{
    GRID_STRIDE(i, N * C) bbk_st(out, i, bias[i % C]);
}

// Column sums in two passes with a fixed split, so they are deterministic
// and still fill the GPU: pass 1 gives each (chunk of rows, column) a
// thread (consecutive threads, consecutive columns: coalesced), pass 2
// adds each column's chunks in order.
template <class T> __global__ void column_partials_k(float *partial, const T *x, int N, int C, int rows_per_chunk)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (c >= C) return;
    int r0 = chunk * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float s = 0.0f;
    for (int r = r0; r < r1; r++) s += bbk_ld(x, (size_t)r * C + c);
    partial[(size_t)chunk * C + c] = s;
}

__global__ void column_finish_k(float *sums, const float *partial, int chunks, int C, bool accumulate)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int k = 0; k < chunks; k++) s += partial[(size_t)k * C + c];
    sums[c] = accumulate ? sums[c] + s : s;
}

// ---- SwiGLU and RoPE: one thread per element pair ---------------------------
template <class T> __global__ void swiglu_forward_k(T *out, const T *gu, size_t n, size_t F)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t row = i / F, at = row * 2 * F + i % F;
        float g = bbk_ld(gu, at);
        bbk_st(out, i, Silu::value(g) * bbk_ld(gu, at + F));
    }
}

// One thread reads a (gate, up) pair and writes its gradient: dgu may alias gu.
template <class T> __global__ void swiglu_backward_k(T *dgu, const T *dout, const T *gu, size_t n, size_t F)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t row = i / F, at = row * 2 * F + i % F;
        float g = bbk_ld(gu, at), u = bbk_ld(gu, at + F), dh = bbk_ld(dout, i);
        float sg = 1.0f / (1.0f + expf(-g));
        bbk_st(dgu, at, dh * u * sg * (1.0f + g * (1.0f - sg)));
        bbk_st(dgu, at + F, dh * g * sg);
    }
}

// n = rows (B·T) × rotated heads × HS/2 pairs; a row is `width` wide.
template <class T>
__global__ void rope_k(T *qkv, const float *table, size_t n, int heads, int HS, int T_, int pos0, int width, float sign)
{
    int half = HS / 2;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int k = (int)(i % half);
        size_t hr = i / half, row = hr / heads;
        int h = (int)(hr % heads);
        const float *cs = table + (size_t)(pos0 + (int)(row % T_)) * HS;
        size_t at = row * width + (size_t)h * HS + k;
        float x0 = bbk_ld(qkv, at), x1 = bbk_ld(qkv, at + half), c = cs[k], sn = sign * cs[half + k];
        bbk_st(qkv, at, x0 * c - x1 * sn);
        bbk_st(qkv, at + half, x1 * c + x0 * sn);
    }
}

// ---- LayerNorm and RMSNorm: one block per row ------------------------------
// With `addend` (may be null) the residual add is fused in: res = in + addend is
// written (rounded to T, as add_k writes it) and normalised; each thread
// reads back only what it wrote itself, so res may alias in or addend.
// mean null: RMSNorm (no mean, no bias, its own eps).
template <class T>
__global__ void layernorm_forward_k(T *out, float *mean, float *rstd, const T *in, const T *addend, T *res,
                                    const float *w, const float *b, int C, float eps)
{
    size_t row = (size_t)blockIdx.x * C;
    const T *x = in + row;
    bool rms = mean == nullptr;
    float s = 0.0f, mu = 0.0f;
    if (addend) {
        for (int c = threadIdx.x; c < C; c += blockDim.x) bbk_st(res + row, c, bbk_ld(x, c) + bbk_ld(addend + row, c));
        x = res + row;
    }
    if (!rms) {
        for (int c = threadIdx.x; c < C; c += blockDim.x) s += bbk_ld(x, c);
        mu = block_reduce<false>(s) / C;
    }
    float v = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) v += (bbk_ld(x, c) - mu) * (bbk_ld(x, c) - mu);
    float r = rsqrtf(block_reduce<false>(v) / C + eps);
    T *y = out + (size_t)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        bbk_st(y, c, rms ? bbk_ld(x, c) * r * w[c] : (bbk_ld(x, c) - mu) * r * w[c] + b[c]);
    if (threadIdx.x == 0) {
        if (!rms) mean[blockIdx.x] = mu;
        rstd[blockIdx.x] = r;
    }
}

// din += rstd (g - mean(g) - xhat mean(g xhat)), g = dout * w; RMSNorm
// (mean null): xhat = x rstd and no mean(g) term.
template <class T>
__global__ void layernorm_backward_input_k(T *din, const T *dout, const T *in, const float *w, const float *mean,
                                           const float *rstd, int C)
{
    size_t row = blockIdx.x;
    const T *x = in + row * C, *dy = dout + row * C;
    float mu = mean ? mean[row] : 0.0f, r = rstd[row], sg = 0.0f, sgx = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float g = bbk_ld(dy, c) * w[c];
        sg += g;
        sgx += g * (bbk_ld(x, c) - mu) * r;
    }
    sg = mean ? block_reduce<false>(sg) / C : 0.0f;
    sgx = block_reduce<false>(sgx) / C;
    T *dx = din + row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float xhat = (bbk_ld(x, c) - mu) * r;
        bbk_st(dx, c, bbk_ld(dx, c) + r * (bbk_ld(dy, c) * w[c] - sg - xhat * sgx));
    }
}

// Pass 1 of dw[c] (+)= sum_n dout xhat and dbias[c] (+)= sum_n dout (pass 2
// is column_finish_k on each half of `partial`).
template <class T>
__global__ void layernorm_param_partials_k(float *partial_w, float *partial_b, const T *dout, const T *in,
                                           const float *mean, const float *rstd, int N, int C, int rows_per_chunk)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (c >= C) return;
    int r0 = chunk * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float sw = 0.0f, sb = 0.0f;
    for (int n = r0; n < r1; n++) {
        float dy = bbk_ld(dout, (size_t)n * C + c);
        sw += dy * (bbk_ld(in, (size_t)n * C + c) - (mean ? mean[n] : 0.0f)) * rstd[n];
        sb += dy;
    }
    partial_w[(size_t)chunk * C + c] = sw;
    if (partial_b) partial_b[(size_t)chunk * C + c] = sb;
}

// ---- embeddings ------------------------------------------------------------
template <class T>
__global__ void embedding_forward_k(T *out, const int32_t *tokens, const float *wte, const float *wpe, int Tn, int C,
                                    size_t n)
{
    GRID_STRIDE(i, n)
    {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % Tn);
        bbk_st(out, i, wte[(size_t)tokens[bt] * C + c] + (wpe ? wpe[(size_t)t * C + c] : 0.0f));
    }
}

__global__ void iota_k(int32_t *x, int n)
{
    GRID_STRIDE(i, (size_t)n) x[i] = (int32_t)i;
}

// One block column per run of equal tokens (grid.x: runs, grid.y: columns):
// dwte[token] += dout[p] for the run's positions p in increasing order.
template <class T>
__global__ void embedding_runs_k(float *dwte, const T *dout, const int32_t *positions, const int32_t *run_token,
                                 const int32_t *run_length, const int32_t *run_start, const int32_t *runs, int C)
{
    int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (r >= *runs || c >= C) return;
    float *row = dwte + (size_t)run_token[r] * C + c;
    float s = *row;
    for (int k = run_start[r], end = k + run_length[r]; k < end; k++) s += bbk_ld(dout, (size_t)positions[k] * C + c);
    *row = s;
}

// From the gradient so far, then the examples in order: the CPU's sum, bit for bit.
template <class E>
__global__ void embedding_backward_wpe_k(float *dwpe, const E *dout, int B, int T, int C, bool accumulate)
{
    GRID_STRIDE(i, (size_t)T * C) // (t, c)
    {
        float s = accumulate ? dwpe[i] : 0.0f;
        for (int b = 0; b < B; b++) s += bbk_ld(dout, (size_t)b * T * C + i);
        dwpe[i] = s;
    }
}

// ---- loader records into batches ------------------------------------------------
__global__ void records_to_tokens_k(int32_t *tokens, int32_t *targets, const uint8_t *records, int count, int T,
                                    int width, size_t n)
{
    GRID_STRIDE(i, n) // (b, t)
    {
        size_t b = i / T, t = i % T;
        if ((int)b >= count) {
            tokens[i] = 0;
            targets[i] = -1;
            continue;
        }
        const uint8_t *p = records + (b * (T + 1) + t) * width;
        if (width == 2) {
            tokens[i] = p[0] | p[1] << 8;
            targets[i] = p[2] | p[3] << 8;
        } else {
            tokens[i] = (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
            targets[i] = (int32_t)((uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24);
        }
    }
}

__global__ void records_to_images_k(float *features, int32_t *labels, const uint8_t *records, int count, int B,
                                    int inputs, size_t n)
{
    GRID_STRIDE(i, n) // (b, pixel)
    {
        size_t b = i / inputs, k = i % inputs;
        const uint8_t *r = records + b * (inputs + 1);
        features[i] = (int)b < count ? r[1 + k] / 255.0f : 0.0f;
        if (k == 0) labels[b] = (int)b < count ? r[0] : -1;
    }
    (void)B;
}

// ---- loss: one block per row, as the CPU: exp sums and the loss in double --------
// T: dlogits' type, L: the logits' (bf16 logits: in place, as llm.c's fused classifier).
template <class T, class L>
__global__ void softmax_crossentropy_k(double *row_loss, T *dlogits, const L *logits, const int32_t *targets, int V,
                                       int ld, float normalizer, int *valid)
{
    size_t row = blockIdx.x;
    const L *x = logits + row * ld;
    int target = targets[row];
    // One pass for the statistics (an online softmax: each thread keeps its
    // own maximum and its sum scaled to it), one for the gradient: the
    // logits are read twice, not three times.
    float mt = -INFINITY;
    double st = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float v = bbk_ld(x, j);
        if (v > mt) st = st * (double)expf(mt - v) + 1.0, mt = v;
        else if (v != -INFINITY) st += expf(v - mt); // NaN passes here, and makes the loss NaN
    }
    float m = block_reduce<true>(mt);
    double s = block_sum_double(mt == -INFINITY ? st : st * (double)expf(mt - m));
    float target_logit = target >= 0 ? bbk_ld(x, target) : 0.0f; // read before dlogits may overwrite it
    __syncthreads();
    if (threadIdx.x == 0) {
        row_loss[row] = target >= 0 ? log(s) - (double)(target_logit - m) : 0.0;
        if (target >= 0) atomicAdd(valid, 1);
    }
    if (!dlogits) return;
    T *d = dlogits + row * ld;
    float scale = (float)(1.0 / s) / normalizer;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float g = target >= 0 ? expf(bbk_ld(x, j) - m) * scale : 0.0f;
        if (j == target) g -= 1.0f / normalizer;
        bbk_st(d, j, g);
    }
}

// One block: thread k sums rows k, k + blockDim, ... in order, then a fixed tree.
__global__ void sum_rows_k(double *out, const double *rows, int n)
{
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += rows[i];
    s = block_sum_double(s);
    if (threadIdx.x == 0) *out = s;
}

// The CPU's loop, row by row: the first largest logit wins (a NaN never does).
__global__ void count_correct_k(int *hits, const float *logits, const int32_t *targets, int N, int V)
{
    GRID_STRIDE(n, (size_t)N)
    {
        const float *row = logits + n * (size_t)V;
        int best = 0;
        for (int k = 1; k < V; k++) best = row[k] > row[best] ? k : best;
        if (best == targets[n]) atomicAdd(hits, 1);
    }
}

__global__ void sum_squares_k(double *partial, const float *x, size_t n)
{
    __shared__ double lanes[kThreads];
    int t = threadIdx.x;
    double s = 0.0;
    GRID_STRIDE(i, n) s += (double)x[i] * x[i];
    lanes[t] = s;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if (t < o) lanes[t] += lanes[t + o];
        __syncthreads();
    }
    if (t == 0) partial[blockIdx.x] = lanes[0];
}

int row_threads(int width)
{
    int t = 32;
    while (t < width && t < 1024) t *= 2;
    return t;
}

// LayerNorm's rows (C 768, 1024, 1600 ...): about 4 elements a thread in
// whole warps, so no thread idles where a power of two would leave a
// quarter of the block out (C 768: 192 threads, not 1024), and more rows'
// blocks fit an SM.
int norm_threads(int C)
{
    int t = ((C + 3) / 4 + 31) / 32 * 32;
    return t < 32 ? 32 : t > 1024 ? 1024 : t;
}

// The sort scratch: positions (in, out), sorted tokens, run tokens, run
// lengths, run starts, the run count, then CUB's temporary storage.
size_t align256(size_t n) { return (n + 255) / 256 * 256; }

size_t cub_bytes(int n)
{
    size_t a = 0, b = 0, c = 0;
    int32_t *i = NULL;
    cub::DeviceRadixSort::SortPairs(NULL, a, i, i, i, i, n);
    cub::DeviceRunLengthEncode::Encode(NULL, b, i, i, i, i, n);
    cub::DeviceScan::ExclusiveSum(NULL, c, i, i, n);
    return a > b ? (a > c ? a : c) : (b > c ? b : c);
}

template <class Act, class T>
cudaError_t activation_launch(cudaStream_t s, bool backward, void *out_v, const void *x_v, const void *in_v, size_t n)
{
    using P = ActOn<Act, T>;
    T *out = static_cast<T *>(out_v);
    const T *x = static_cast<const T *>(x_v), *in = static_cast<const T *>(in_v);
    if (backward)
        BB_LAUNCH(activation_backward_k<P>, grid_for(n), kThreads, 0, s)(out, x, in, n);
    else
        BB_LAUNCH(activation_forward_k<P>, grid_for(n), kThreads, 0, s)(out, x, n);
    return cudaGetLastError();
}

template <class Act>
cudaError_t activation_on(cudaStream_t s, bool bf16, bool backward, void *out, const void *x, const void *in, size_t n)
{
    return bf16 ? activation_launch<Act, uint16_t>(s, backward, out, x, in, n)
                : activation_launch<Act, float>(s, backward, out, x, in, n);
}

template <class T> cudaError_t add_launch(cudaStream_t s, void *out, const void *x, const void *y, size_t n)
{
    BB_LAUNCH(add_k<T>, grid_for(n), kThreads, 0, s)(static_cast<T *>(out), static_cast<const T *>(x),
                                                     static_cast<const T *>(y), n);
    return cudaGetLastError();
}

template <class T>
void layernorm_launch(cudaStream_t s, void *out, float *mean, float *rstd, const void *in, const void *y, void *res,
                      const float *w, const float *bias, int N, int C, float eps, int threads)
{
    BB_LAUNCH(layernorm_forward_k<T>, N, threads, 0, s)(static_cast<T *>(out), mean, rstd, static_cast<const T *>(in),
                                                        static_cast<const T *>(y), static_cast<T *>(res), w, bias, C,
                                                        eps);
}

template <class T>
void layernorm_backward_launch(cudaStream_t s, void *din, float *pw, float *pb, const void *dout_v, const void *in_v,
                               const float *w, const float *mean, const float *rstd, int N, int C, int threads,
                               dim3 grid, int rows)
{
    const T *dout = static_cast<const T *>(dout_v), *in = static_cast<const T *>(in_v);
    if (N > 0) BB_LAUNCH(layernorm_backward_input_k<T>, N, threads, 0, s)(static_cast<T *>(din), dout, in, w, mean, rstd, C);
    BB_LAUNCH(layernorm_param_partials_k<T>, grid, kThreads, 0, s)(pw, pb, dout, in, mean, rstd, N, C, rows);
}

} // namespace

// ---- launchers -------------------------------------------------------------
extern "C" {

cudaError_t bbk_activation(cudaStream_t s, bool bf16, int act, bool backward, void *out, const void *x, const void *in,
                           size_t n)
{
    switch (act) {
    case 0: return activation_on<Relu>(s, bf16, backward, out, x, in, n);
    case 1: return activation_on<GeluTanh>(s, bf16, backward, out, x, in, n);
    case 2: return activation_on<Silu>(s, bf16, backward, out, x, in, n);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t bbk_add(cudaStream_t s, bool bf16, void *out, const void *x, const void *y, size_t n)
{
    return bf16 ? add_launch<uint16_t>(s, out, x, y, n) : add_launch<float>(s, out, x, y, n);
}

cudaError_t bbk_bf16_pack(cudaStream_t s, uint16_t *packed, const float *x, size_t n)
{
    BB_LAUNCH(bf16_pack_k, grid_for(n), kThreads, 0, s)(packed, x, n);
    return cudaGetLastError();
}

cudaError_t bbk_bf16_unpack(cudaStream_t s, float *out, const uint16_t *packed, size_t n)
{
    BB_LAUNCH(bf16_unpack_k, grid_for(n), kThreads, 0, s)(out, packed, n);
    return cudaGetLastError();
}

cudaError_t bbk_broadcast_rows(cudaStream_t s, bool bf16, void *out, const float *bias, int N, int C)
{
    if (bf16)
        BB_LAUNCH(broadcast_rows_k<uint16_t>, grid_for((size_t)N * C), kThreads, 0, s)(static_cast<uint16_t *>(out),
                                                                                       bias, (size_t)N, C);
    else
        BB_LAUNCH(broadcast_rows_k<float>, grid_for((size_t)N * C), kThreads, 0, s)(static_cast<float *>(out), bias,
                                                                                    (size_t)N, C);
    return cudaGetLastError();
}

static int chunk_rows(int N) { return N > BBK_COLUMN_CHUNKS ? (N + BBK_COLUMN_CHUNKS - 1) / BBK_COLUMN_CHUNKS : 1; }

cudaError_t bbk_column_sums(cudaStream_t s, bool bf16, float *dbias, float *scratch, const void *dout, int N, int C,
                            bool accumulate)
{
    dim3 grid((unsigned)((C + kThreads - 1) / kThreads), BBK_COLUMN_CHUNKS);
    if (bf16)
        BB_LAUNCH(column_partials_k<uint16_t>, grid, kThreads, 0, s)(scratch, static_cast<const uint16_t *>(dout), N, C,
                                                                     chunk_rows(N));
    else
        BB_LAUNCH(column_partials_k<float>, grid, kThreads, 0, s)(scratch, static_cast<const float *>(dout), N, C,
                                                                  chunk_rows(N));
    BB_LAUNCH(column_finish_k, grid_for((size_t)C), kThreads, 0, s)(dbias, scratch, BBK_COLUMN_CHUNKS, C, accumulate);
    return cudaGetLastError();
}

cudaError_t bbk_layernorm_forward(cudaStream_t s, bool bf16, void *out, float *mean, float *rstd, const void *in,
                                  const void *y, void *res, const float *w, const float *bias, int N, int C, float eps)
{
    if (N > 0 && bf16) layernorm_launch<uint16_t>(s, out, mean, rstd, in, y, res, w, bias, N, C, eps, norm_threads(C));
    else if (N > 0) layernorm_launch<float>(s, out, mean, rstd, in, y, res, w, bias, N, C, eps, norm_threads(C));
    return cudaGetLastError();
}

cudaError_t bbk_layernorm_backward(cudaStream_t s, bool bf16, void *din, float *dw, float *dbias, float *scratch,
                                   const void *dout, const void *in, const float *w, const float *mean,
                                   const float *rstd, int N, int C, bool accumulate)
{
    float *pw = scratch, *pb = dbias ? scratch + (size_t)BBK_COLUMN_CHUNKS * C : nullptr;
    dim3 grid((unsigned)((C + kThreads - 1) / kThreads), BBK_COLUMN_CHUNKS);
    if (bf16)
        layernorm_backward_launch<uint16_t>(s, din, pw, pb, dout, in, w, mean, rstd, N, C, norm_threads(C), grid,
                                            chunk_rows(N));
    else
        layernorm_backward_launch<float>(s, din, pw, pb, dout, in, w, mean, rstd, N, C, norm_threads(C), grid,
                                         chunk_rows(N));
    BB_LAUNCH(column_finish_k, grid_for((size_t)C), kThreads, 0, s)(dw, pw, BBK_COLUMN_CHUNKS, C, accumulate);
    if (dbias) BB_LAUNCH(column_finish_k, grid_for((size_t)C), kThreads, 0, s)(dbias, pb, BBK_COLUMN_CHUNKS, C, accumulate);
    return cudaGetLastError();
}

cudaError_t bbk_rope(cudaStream_t s, bool bf16, void *qkv, const float *table, int B, int T, int NH, int KVH, int HS,
                     int pos0, float sign)
{
    size_t n = (size_t)B * T * (NH + KVH) * (HS / 2);
    int width = (NH + 2 * KVH) * HS;
    if (n == 0) return cudaGetLastError();
    if (bf16)
        BB_LAUNCH(rope_k<uint16_t>, grid_for(n), kThreads, 0, s)(static_cast<uint16_t *>(qkv), table, n, NH + KVH, HS,
                                                                 T, pos0, width, sign);
    else
        BB_LAUNCH(rope_k<float>, grid_for(n), kThreads, 0, s)(static_cast<float *>(qkv), table, n, NH + KVH, HS, T,
                                                              pos0, width, sign);
    return cudaGetLastError();
}

cudaError_t bbk_swiglu_forward(cudaStream_t s, bool bf16, void *out, const void *gu, int N, int F)
{
    size_t n = (size_t)N * F;
    if (n == 0) return cudaGetLastError();
    if (bf16)
        BB_LAUNCH(swiglu_forward_k<uint16_t>, grid_for(n), kThreads, 0, s)(static_cast<uint16_t *>(out),
                                                                           static_cast<const uint16_t *>(gu), n, F);
    else
        BB_LAUNCH(swiglu_forward_k<float>, grid_for(n), kThreads, 0, s)(static_cast<float *>(out),
                                                                        static_cast<const float *>(gu), n, F);
    return cudaGetLastError();
}

cudaError_t bbk_swiglu_backward(cudaStream_t s, bool bf16, void *dgu, const void *dout, const void *gu, int N, int F)
{
    size_t n = (size_t)N * F;
    if (n == 0) return cudaGetLastError();
    if (bf16)
        BB_LAUNCH(swiglu_backward_k<uint16_t>, grid_for(n), kThreads, 0, s)(
            static_cast<uint16_t *>(dgu), static_cast<const uint16_t *>(dout), static_cast<const uint16_t *>(gu), n, F);
    else
        BB_LAUNCH(swiglu_backward_k<float>, grid_for(n), kThreads, 0, s)(
            static_cast<float *>(dgu), static_cast<const float *>(dout), static_cast<const float *>(gu), n, F);
    return cudaGetLastError();
}

cudaError_t bbk_embedding_forward(cudaStream_t s, bool bf16, void *out, const int32_t *tokens, const float *wte,
                                  const float *wpe, int B, int T, int C)
{
    size_t n = (size_t)B * T * C;
    if (bf16)
        BB_LAUNCH(embedding_forward_k<uint16_t>, grid_for(n), kThreads, 0, s)(static_cast<uint16_t *>(out), tokens, wte,
                                                                              wpe, T, C, n);
    else
        BB_LAUNCH(embedding_forward_k<float>, grid_for(n), kThreads, 0, s)(static_cast<float *>(out), tokens, wte, wpe,
                                                                           T, C, n);
    return cudaGetLastError();
}


size_t bbk_embedding_sort_bytes(size_t rows)
{
    int n = rows ? (int)rows : 1;
    return 6 * align256((size_t)n * sizeof(int32_t)) + 256 + align256(cub_bytes(n));
}

cudaError_t bbk_embedding_backward_wte(cudaStream_t s, bool bf16, float *dwte, const void *dout, const int32_t *tokens,
                                       int n, int C, int V, void *scratch, size_t scratch_bytes)
{
    if (n <= 0) return cudaGetLastError();
    if (scratch_bytes < bbk_embedding_sort_bytes((size_t)n)) return cudaErrorInvalidValue;
    size_t slice = align256((size_t)n * sizeof(int32_t));
    char *p = static_cast<char *>(scratch);
    int32_t *pos_in = (int32_t *)p, *pos = (int32_t *)(p + slice), *sorted = (int32_t *)(p + 2 * slice);
    int32_t *run_token = (int32_t *)(p + 3 * slice), *run_length = (int32_t *)(p + 4 * slice);
    int32_t *run_start = (int32_t *)(p + 5 * slice), *runs = (int32_t *)(p + 6 * slice);
    void *temp = p + 6 * slice + 256;
    size_t temp_bytes = scratch_bytes - 6 * slice - 256;
    int bits = 1;
    while (bits < 31 && (1 << bits) < V) bits++;
    BB_LAUNCH(iota_k, grid_for((size_t)n), kThreads, 0, s)(pos_in, n);
    // Stable: equal tokens keep their positions in increasing order.
    // Runs past the count stay 0, so the scan below reads no uninitialized memory.
    cudaError_t e = cudaMemsetAsync(run_length, 0, (size_t)n * sizeof *run_length, s);
    if (e == cudaSuccess) e = cub::DeviceRadixSort::SortPairs(temp, temp_bytes, tokens, sorted, pos_in, pos, n, 0, bits, s);
    if (e == cudaSuccess) e = cub::DeviceRunLengthEncode::Encode(temp, temp_bytes, sorted, run_token, run_length, runs, n, s);
    if (e == cudaSuccess) e = cub::DeviceScan::ExclusiveSum(temp, temp_bytes, run_length, run_start, n, s);
    if (e != cudaSuccess) return e;
    dim3 grid((unsigned)n, (unsigned)((C + kThreads - 1) / kThreads));
    if (bf16)
        BB_LAUNCH(embedding_runs_k<uint16_t>, grid, kThreads, 0, s)(dwte, static_cast<const uint16_t *>(dout), pos,
                                                                    run_token, run_length, run_start, runs, C);
    else
        BB_LAUNCH(embedding_runs_k<float>, grid, kThreads, 0, s)(dwte, static_cast<const float *>(dout), pos, run_token,
                                                                 run_length, run_start, runs, C);
    return cudaGetLastError();
}

cudaError_t bbk_embedding_backward_wpe(cudaStream_t s, bool bf16, float *dwpe, const void *dout, int B, int T, int C,
                                       bool accumulate)
{
    if (bf16)
        BB_LAUNCH(embedding_backward_wpe_k<uint16_t>, grid_for((size_t)T * C), kThreads, 0, s)(
            dwpe, static_cast<const uint16_t *>(dout), B, T, C, accumulate);
    else
        BB_LAUNCH(embedding_backward_wpe_k<float>, grid_for((size_t)T * C), kThreads, 0, s)(
            dwpe, static_cast<const float *>(dout), B, T, C, accumulate);
    return cudaGetLastError();
}

cudaError_t bbk_records_to_tokens(cudaStream_t s, int32_t *tokens, int32_t *targets, const uint8_t *records, int count,
                                  int B, int T, int width)
{
    size_t n = (size_t)B * T;
    BB_LAUNCH(records_to_tokens_k, grid_for(n), kThreads, 0, s)(tokens, targets, records, count, T, width, n);
    return cudaGetLastError();
}

cudaError_t bbk_records_to_images(cudaStream_t s, float *features, int32_t *labels, const uint8_t *records, int count,
                                  int B, int inputs)
{
    size_t n = (size_t)B * inputs;
    BB_LAUNCH(records_to_images_k, grid_for(n), kThreads, 0, s)(features, labels, records, count, B, inputs, n);
    return cudaGetLastError();
}

cudaError_t bbk_softmax_crossentropy(cudaStream_t s, bool bf16, bool bf16_logits, double *row_loss, void *dlogits,
                                     const void *logits, const int32_t *targets, int N, int V, int ld,
                                     float normalizer, int *valid)
{
    auto *d16 = static_cast<uint16_t *>(dlogits);
    auto *l16 = static_cast<const uint16_t *>(logits);
    auto *l32 = static_cast<const float *>(logits);
    if (N > 0 && bf16_logits)
        BB_LAUNCH((softmax_crossentropy_k<uint16_t, uint16_t>), N, row_threads(V), 0, s)(row_loss, d16, l16, targets, V,
                                                                                       ld, normalizer, valid);
    else if (N > 0 && bf16)
        BB_LAUNCH((softmax_crossentropy_k<uint16_t, float>), N, row_threads(V), 0, s)(row_loss, d16, l32, targets, V,
                                                                                    ld, normalizer, valid);
    else if (N > 0)
        BB_LAUNCH((softmax_crossentropy_k<float, float>), N, row_threads(V), 0, s)(
            row_loss, static_cast<float *>(dlogits), l32, targets, V, ld, normalizer, valid);
    return cudaGetLastError();
}

cudaError_t bbk_sum_rows(cudaStream_t s, double *out, const double *rows, int n)
{
    BB_LAUNCH(sum_rows_k, 1, 1024, 0, s)(out, rows, n);
    return cudaGetLastError();
}

cudaError_t bbk_count_correct(cudaStream_t s, int *hits, const float *logits, const int32_t *targets, int N, int V)
{
    if (N <= 0) return cudaGetLastError();
    BB_LAUNCH(count_correct_k, grid_for((size_t)N), kThreads, 0, s)(hits, logits, targets, N, V);
    return cudaGetLastError();
}

cudaError_t bbk_sum_squares(cudaStream_t s, double *partial, int max_blocks, int *blocks, const float *x, size_t n)
{
    unsigned g = grid_for(n);
    *blocks = (int)(g < (unsigned)max_blocks ? g : (unsigned)max_blocks);
    BB_LAUNCH(sum_squares_k, *blocks, kThreads, 0, s)(partial, x, n);
    return cudaGetLastError();
}

} // extern "C"
