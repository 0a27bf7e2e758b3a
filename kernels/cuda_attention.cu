// cuda_attention.cu — the tiled (flash-style) attention kernels and their
// launchers (cuda_kernels.h): forward, dQ and dK/dV, fp32 and bf16 operands.
#include <math.h>

#include "bigbatch/backend.h"
#include "cuda_device.cuh"
#include "cuda_kernels.h"

namespace {

// ---- tiled (flash-style) attention ------------------------------------------
// A row of qkv is W = (NH + 2·KVH)·hs wide: q's NH heads, then k's and v's
// KVH heads (Heads: where each starts); query head h reads key/value head
// g = h / (NH / KVH). Head h of row t: q at qkv + (b·T + t)·W + h·hs, its
// k at + koff + g·hs, its v at + voff + g·hs; out rows are C = NH·hs. Tiles
// of kKeys keys (one lane each) are staged in shared memory with a row
// pitch of hs + 1 (no bank conflicts when lanes read different keys). The
// forward and the dQ kernel give each warp one query row, kRows rows per
// block sharing the key tiles; the dK/dV kernel gives one warp kKeys keys
// and walks the query rows below them. Every sum runs in a fixed order
// (no atomics): the results are deterministic. Bf16: the products' operands
// (q, k, v, dout, p, dS) are rounded to bf16 as tensor cores would take
// them; sums stay fp32.
constexpr int kRows = 8, kKeys = 32;

struct Heads {
    int NH, KVH, hs, C, W, koff, voff, group;
};

Heads heads_of(int NH, int KVH, int HS)
{
    return Heads{NH, KVH, HS, NH * HS, (NH + 2 * KVH) * HS, NH * HS, (NH + KVH) * HS, NH / KVH};
}

template <bool Bf16> __device__ float operand(float x)
{
    return Bf16 ? bb_bf16_to_float(bb_bf16_from_float(x)) : x;
}

// Stages keys j0 .. j0+keys-1 of k and v (kbase, vbase: the head's first
// row) into shared memory (rows past T become 0), between two barriers:
// the previous tile is no longer read, and this one is whole. All threads
// of the block take part.
template <bool Bf16>
__device__ void stage_keys(float *ks, float *vs, const float *kbase, const float *vbase, int j0, int T, int W, int hs,
                           int pitch, int keys = kKeys)
{
    __syncthreads();
    for (int e = threadIdx.x; e < keys * hs; e += blockDim.x) {
        int jj = e / hs, d = e % hs, j = j0 + jj;
        ks[jj * pitch + d] = j < T ? operand<Bf16>(kbase[(size_t)j * W + d]) : 0.0f;
        vs[jj * pitch + d] = j < T ? operand<Bf16>(vbase[(size_t)j * W + d]) : 0.0f;
    }
    __syncthreads();
}

__device__ float row_dot(const float *x, const float *y, int hs)
{
    float s = 0.0f;
    for (int d = 0; d < hs; d++) s += x[d] * y[d];
    return s;
}

// dout_i · out_i, summed by the warp.
__device__ float warp_row_dot(const float *x, const float *y, int hs)
{
    float s = 0.0f;
    for (int d = threadIdx.x % 32; d < hs; d += 32) s += x[d] * y[d];
    return warp_sum(s);
}

// grid (ceil(T / kRows), NH, B), kRows warps. Shared: k and v tiles, then
// per warp its q row, output accumulator and probabilities.
template <bool Bf16>
__global__ void attention_forward_k(float *out, float *lse, const float *qkv, int T, Heads H, float scale)
{
    BB_DYNAMIC_SHARED(float, sm);
    int hs = H.hs, W = H.W, pitch = hs + 1, h = blockIdx.y, b = blockIdx.z, g = h / H.group;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, i0 = blockIdx.x * kRows, i = i0 + warp;
    float *ks = sm, *vs = ks + kKeys * pitch, *q = vs + kKeys * pitch + warp * hs,
          *acc = vs + kKeys * pitch + kRows * hs + warp * hs, *ps = vs + kKeys * pitch + 2 * kRows * hs + warp * kKeys;
    const float *rows = qkv + (size_t)b * T * W, *base = rows + (size_t)h * hs;
    const float *kbase = rows + H.koff + (size_t)g * hs, *vbase = rows + H.voff + (size_t)g * hs;
    bool active = i < T;
    for (int d = lane; d < hs; d += 32) {
        q[d] = active ? operand<Bf16>(base[(size_t)i * W + d]) * scale : 0.0f;
        acc[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    int keys = min(i0 + kRows, T); // j0 <= i0 <= i for every tile: each row sees a key per tile
    for (int j0 = 0; j0 < keys; j0 += kKeys) {
        stage_keys<Bf16>(ks, vs, kbase, vbase, j0, T, W, hs, pitch);
        if (!active) continue;
        int j = j0 + lane;
        float s = j <= i ? row_dot(q, ks + lane * pitch, hs) : -INFINITY;
        float mx = fmaxf(m, warp_max(s));
        float p = j <= i ? expf(s - mx) : 0.0f, corr = expf(m - mx);
        l = l * corr + warp_sum(p); // fp32 p in the normalizer, bf16 p in p·v: as FlashAttention-2 and cuDNN
        m = mx;
        ps[lane] = operand<Bf16>(p);
        __syncwarp();
        for (int d = lane; d < hs; d += 32) {
            float a = acc[d] * corr;
            for (int jj = 0; jj < kKeys; jj++) a += ps[jj] * vs[jj * pitch + d];
            acc[d] = a;
        }
        __syncwarp();
    }
    if (!active) return;
    float *o = out + ((size_t)b * T + i) * H.C + (size_t)h * hs;
    for (int d = lane; d < hs; d += 32) o[d] = acc[d] / l;
    if (lane == 0) lse[((size_t)b * H.NH + h) * T + i] = m + logf(l);
}

// D = dout·out for every row and head, once (the dK/dV kernel needs it for
// every key tile): one warp each, into the first float of the row's dQ
// slot of dqkv, which the dK/dV kernel reads and the dQ kernel reads before
// it writes the slot (the three run in that order on one stream).
__global__ void attention_d_k(float *dqkv, const float *dout, const float *out, int BT, Heads H)
{
    int hs = H.hs, NH = H.NH;
    size_t w = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (w >= (size_t)BT * NH) return; // whole warps leave together
    size_t row = w / (size_t)NH, yoff = row * H.C + (w % (size_t)NH) * hs;
    float D = warp_row_dot(dout + yoff, out + yoff, hs);
    if (threadIdx.x % 32 == 0) dqkv[row * H.W + (w % (size_t)NH) * hs] = D;
}

// dQ: as the forward, per query row: p = exp(scale·q·k - lse), dS = p ∘
// (dout·vᵀ - D) with D = dout·out, dq = scale · Σ dS·k.
template <bool Bf16>
__global__ void attention_dq_k(float *dqkv, const float *dout, const float *qkv, const float *lse, int T, Heads H,
                               float scale)
{
    BB_DYNAMIC_SHARED(float, sm);
    int hs = H.hs, W = H.W, pitch = hs + 1, h = blockIdx.y, b = blockIdx.z, g = h / H.group;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, i0 = blockIdx.x * kRows, i = i0 + warp;
    float *ks = sm, *vs = ks + kKeys * pitch, *rows = vs + kKeys * pitch;
    float *q = rows + warp * hs, *dy = rows + (kRows + warp) * hs, *acc = rows + (2 * kRows + warp) * hs,
          *ds = rows + 3 * kRows * hs + warp * kKeys;
    const float *all = qkv + (size_t)b * T * W, *base = all + (size_t)h * hs;
    const float *kbase = all + H.koff + (size_t)g * hs, *vbase = all + H.voff + (size_t)g * hs;
    bool active = i < T;
    size_t yoff = ((size_t)b * T + (active ? i : 0)) * H.C + (size_t)h * hs;
    for (int d = lane; d < hs; d += 32) {
        q[d] = active ? operand<Bf16>(base[(size_t)i * W + d]) * scale : 0.0f;
        dy[d] = active ? operand<Bf16>(dout[yoff + d]) : 0.0f;
        acc[d] = 0.0f;
    }
    // D, left by attention_d_k in the first float of this row's dQ slot, read before the slot is written.
    float D = active ? dqkv[((size_t)b * T + i) * W + (size_t)h * hs] : 0.0f;
    float L = active ? lse[((size_t)b * H.NH + h) * T + i] : 0.0f;
    int keys = min(i0 + kRows, T);
    for (int j0 = 0; j0 < keys; j0 += kKeys) {
        stage_keys<Bf16>(ks, vs, kbase, vbase, j0, T, W, hs, pitch);
        if (!active) continue;
        int j = j0 + lane;
        float dscore = 0.0f;
        if (j <= i) {
            float p = expf(row_dot(q, ks + lane * pitch, hs) - L);
            dscore = p * (row_dot(dy, vs + lane * pitch, hs) - D) * scale;
        }
        ds[lane] = operand<Bf16>(dscore);
        __syncwarp();
        for (int d = lane; d < hs; d += 32) {
            float a = acc[d];
            for (int jj = 0; jj < kKeys; jj++) a += ds[jj] * ks[jj * pitch + d];
            acc[d] = a;
        }
        __syncwarp();
    }
    if (!active) return;
    float *dq = dqkv + ((size_t)b * T + i) * W + (size_t)h * hs;
    for (int d = lane; d < hs; d += 32) dq[d] = acc[d];
}

// dK and dV: grid (ceil(T / Keys), KVH, B), kDkvWarps warps. The block
// stages its Keys keys of key/value head g once and, for each query head
// of g's group in order, walks the query rows i >= j0, kDkvWarps at a
// time, one per warp: lane jj gives p and dS for key jj and the warp's row
// (shared memory); then each thread adds the group's rows, in row order,
// to its own entries of the dK and dV accumulators — every sum in
// increasing (head, i), as one warp walking the rows would
// (deterministic). Keys is 32 up to head size 128, 16 above (shared
// memory for 2 blocks an SM at head size 256).
constexpr int kDkvWarps = 4;

template <bool Bf16, int Keys>
__global__ void attention_dkv_k(float *dqkv, const float *dout, const float *qkv, const float *lse, int T, Heads H,
                                float scale)
{
    BB_DYNAMIC_SHARED(float, sm);
    int hs = H.hs, W = H.W, pitch = hs + 1, g = blockIdx.y, b = blockIdx.z;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, j0 = blockIdx.x * Keys, j = j0 + lane;
    float *ks = sm, *vs = ks + Keys * pitch, *dk = vs + Keys * pitch, *dv = dk + Keys * pitch;
    float *qs = dv + Keys * pitch, *dys = qs + kDkvWarps * hs, *ps = dys + kDkvWarps * hs, *gs = ps + kDkvWarps * Keys;
    const float *all = qkv + (size_t)b * T * W;
    for (int e = threadIdx.x; e < Keys * hs; e += blockDim.x) {
        int at = e / hs * pitch + e % hs;
        dk[at] = dv[at] = 0.0f;
    }
    stage_keys<Bf16>(ks, vs, all + H.koff + (size_t)g * hs, all + H.voff + (size_t)g * hs, j0, T, W, hs, pitch, Keys);
    for (int h = g * H.group; h < (g + 1) * H.group; h++) {
        const float *base = all + (size_t)h * hs;
        for (int i0 = j0; i0 < T; i0 += kDkvWarps) {
            int i = i0 + warp;
            bool active = i < T;
            size_t row = (size_t)b * T + (active ? i : 0), yoff = row * H.C + (size_t)h * hs;
            for (int d = lane; d < hs; d += 32) {
                qs[warp * hs + d] = active ? operand<Bf16>(base[(size_t)i * W + d]) : 0.0f;
                dys[warp * hs + d] = active ? operand<Bf16>(dout[yoff + d]) : 0.0f;
            }
            __syncwarp();
            float p = 0.0f, gr = 0.0f;
            if (active && lane < Keys && j <= i) {
                float D = dqkv[row * W + (size_t)h * hs], L = lse[((size_t)b * H.NH + h) * T + i]; // D: attention_d_k's
                p = expf(row_dot(qs + warp * hs, ks + lane * pitch, hs) * scale - L);
                gr = operand<Bf16>(p * (row_dot(dys + warp * hs, vs + lane * pitch, hs) - D) * scale);
                p = operand<Bf16>(p);
            }
            if (lane < Keys) ps[warp * Keys + lane] = p, gs[warp * Keys + lane] = gr;
            __syncthreads();
            for (int e = threadIdx.x; e < Keys * hs; e += blockDim.x) {
                int jj = e / hs, d = e % hs;
                float a = dk[jj * pitch + d], c = dv[jj * pitch + d];
                for (int w = 0; w < kDkvWarps; w++) {
                    c += ps[w * Keys + jj] * dys[w * hs + d];
                    a += gs[w * Keys + jj] * qs[w * hs + d];
                }
                dk[jj * pitch + d] = a, dv[jj * pitch + d] = c;
            }
            __syncthreads(); // the group's rows are no longer read
        }
    }
    for (int e = threadIdx.x; e < Keys * hs; e += blockDim.x) {
        int jj = e / hs, d = e % hs;
        if (j0 + jj >= T) continue;
        float *row = dqkv + ((size_t)b * T + j0 + jj) * W;
        row[H.koff + (size_t)g * hs + d] = dk[jj * pitch + d], row[H.voff + (size_t)g * hs + d] = dv[jj * pitch + d];
    }
}

// Dynamic shared memory beyond the default 48 KiB must be asked for per
// kernel; past the device's limit the launch fails (a head too wide).
template <typename K> cudaError_t allow_shared(K kernel, size_t bytes)
{
    return bytes > 48 * 1024 ? cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes)
                             : cudaSuccess;
}

template <bool Bf16>
cudaError_t attention_forward(cudaStream_t s, float *out, float *lse, const float *qkv, int B, int T, Heads H)
{
    int hs = H.hs;
    size_t bytes = (2 * (size_t)kKeys * (hs + 1) + 2 * (size_t)kRows * hs + kRows * kKeys) * sizeof(float);
    cudaError_t e = allow_shared(attention_forward_k<Bf16>, bytes);
    if (e != cudaSuccess) return e;
    dim3 grid((unsigned)((T + kRows - 1) / kRows), (unsigned)H.NH, (unsigned)B);
    BB_LAUNCH(attention_forward_k<Bf16>, grid, kRows * 32, bytes, s)(out, lse, qkv, T, H, 1.0f / sqrtf((float)hs));
    return cudaGetLastError();
}

template <bool Bf16, int Keys>
cudaError_t launch_dkv(cudaStream_t s, float *dqkv, const float *dout, const float *qkv, const float *lse, int B,
                       int T, Heads H, float scale)
{
    int hs = H.hs;
    size_t bytes = (4 * (size_t)Keys * (hs + 1) + 2 * (size_t)kDkvWarps * hs + 2 * kDkvWarps * Keys) * sizeof(float);
    const auto attention_dkv = attention_dkv_k<Bf16, Keys>; // one name for the launch macro
    cudaError_t e = allow_shared(attention_dkv, bytes);
    if (e != cudaSuccess) return e;
    dim3 keys((unsigned)((T + Keys - 1) / Keys), (unsigned)H.KVH, (unsigned)B);
    BB_LAUNCH(attention_dkv, keys, kDkvWarps * 32, bytes, s)(dqkv, dout, qkv, lse, T, H, scale);
    return cudaGetLastError();
}

// D first (into dQ's place), then dK/dV, then dQ (which overwrites D).
template <bool Bf16>
cudaError_t attention_backward(cudaStream_t s, float *dqkv, const float *dout, const float *qkv, const float *out,
                               const float *lse, int B, int T, Heads H)
{
    int hs = H.hs;
    float scale = 1.0f / sqrtf((float)hs);
    size_t dq_bytes = (2 * (size_t)kKeys * (hs + 1) + 3 * (size_t)kRows * hs + kRows * kKeys) * sizeof(float);
    cudaError_t e = allow_shared(attention_dq_k<Bf16>, dq_bytes);
    if (e != cudaSuccess) return e;
    size_t warps = (size_t)B * T * H.NH;
    BB_LAUNCH(attention_d_k, (unsigned)((warps + 7) / 8), 256, 0, s)(dqkv, dout, out, B * T, H);
    e = hs > 128 ? launch_dkv<Bf16, 16>(s, dqkv, dout, qkv, lse, B, T, H, scale)
                 : launch_dkv<Bf16, kKeys>(s, dqkv, dout, qkv, lse, B, T, H, scale);
    if (e != cudaSuccess) return e;
    dim3 rows((unsigned)((T + kRows - 1) / kRows), (unsigned)H.NH, (unsigned)B);
    BB_LAUNCH(attention_dq_k<Bf16>, rows, kRows * 32, dq_bytes, s)(dqkv, dout, qkv, lse, T, H, scale);
    return cudaGetLastError();
}

// ---- incremental decoding: the new row's query over T cached rows ----------
// The cache's rows hold the key/value heads' keys, then their values: the
// Heads of a row without queries (W = 2·KVH·hs, koff 0, voff KVH·hs); the
// query q is the new row's first NH·hs floats.
constexpr int kDecodeThreads = 256;

Heads cache_heads_of(int NH, int KVH, int HS)
{
    return Heads{NH, KVH, HS, NH * HS, 2 * KVH * HS, 0, KVH * HS, NH / KVH};
}

// scores[h, t] = q_h · k_(t,g) / sqrt(hs): one thread per (t, h).
__global__ void decode_scores_k(float *scores, const float *q_row, const float *kv, int T, Heads H)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y, hs = H.hs, g = h / H.group;
    if (t >= T) return;
    const float *q = q_row + h * hs, *k = kv + (size_t)t * H.W + H.koff + g * hs;
    float dot = 0.0f;
    for (int d = 0; d < hs; d++) dot += q[d] * k[d];
    scores[(size_t)h * T + t] = dot * (1.0f / sqrtf((float)hs));
}

// The max (Max) or the sum over the block; every thread gets it.
template <bool Max> __device__ float decode_reduce(float v, float *lanes, float *result)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = Max ? fmaxf(v, w) : v + w;
    }
    if (lane == 0) lanes[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float r = lanes[0];
        for (int i = 1; i < warps; i++) r = Max ? fmaxf(r, lanes[i]) : r + lanes[i];
        *result = r;
    }
    __syncthreads();
    float r = *result;
    __syncthreads(); // lanes and result are used again
    return r;
}

// One block per head: the softmax of its scores in place, then out_h = p · v.
__global__ void decode_out_k(float *out, float *scores, const float *kv, int T, Heads H)
{
    __shared__ float lanes[32];
    __shared__ float result;
    int h = blockIdx.x, hs = H.hs;
    const float *v = kv + H.voff + (size_t)(h / H.group) * hs;
    float *s = scores + (size_t)h * T, m = -INFINITY, sum = 0.0f;
    for (int t = threadIdx.x; t < T; t += blockDim.x) m = fmaxf(m, s[t]);
    m = decode_reduce<true>(m, lanes, &result);
    for (int t = threadIdx.x; t < T; t += blockDim.x) sum += s[t] = expf(s[t] - m);
    float inv = 1.0f / decode_reduce<false>(sum, lanes, &result); // its barriers publish s
    for (int d = threadIdx.x; d < hs; d += blockDim.x) {
        float acc = 0.0f;
        for (int t = 0; t < T; t++) acc += s[t] * inv * v[(size_t)t * H.W + d];
        out[h * hs + d] = acc;
    }
}

// Split-K decoding (flash-decoding): the T keys cut into `chunk`-key
// splits, one block per (split, head), so that a short prompt's 12 heads
// still fill the GPU. In a block each warp takes every kDecodeWarps-th key
// of the split, its lanes the head's dimensions (q, k and v rows read
// whole: coalesced), with an online softmax of its own; the warps are
// merged through shared memory. One split writes out_h; several write each
// split's max, sum and unnormalised output into the head's row of the
// scores scratch (part = scores + h·T: splits maxes, splits sums, then
// splits × hs outputs; splits·(hs+2) ≤ T by the choice of chunk), merged by
// decode_merge_k.
constexpr int kDecodeWarps = kDecodeThreads / 32;

__global__ void decode_split_k(float *out, float *scores, const float *q_row, const float *kv, int T, int chunk,
                               Heads H)
{
    BB_DYNAMIC_SHARED(float, shared); // q (hs), then each warp's output (kDecodeWarps · hs)
    __shared__ float warp_max[kDecodeWarps], warp_sum[kDecodeWarps];
    int split = blockIdx.x, splits = gridDim.x, h = blockIdx.y, hs = H.hs, g = h / H.group;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float *q = shared, *acc = shared + hs + (size_t)warp * hs;
    for (int d = threadIdx.x; d < hs; d += blockDim.x) q[d] = q_row[h * hs + d];
    for (int d = lane; d < hs; d += 32) acc[d] = 0.0f;
    __syncthreads();
    const float *keys = kv + H.koff + (size_t)g * hs, *values = kv + H.voff + (size_t)g * hs;
    float scale = 1.0f / sqrtf((float)hs), m = -INFINITY, l = 0.0f;
    int t1 = min(T, (split + 1) * chunk);
    for (int t = split * chunk + warp; t < t1; t += kDecodeWarps) {
        const float *k = keys + (size_t)t * H.W, *v = values + (size_t)t * H.W;
        float dot = 0.0f;
        for (int d = lane; d < hs; d += 32) dot += q[d] * k[d];
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        dot *= scale;
        float next = fmaxf(m, dot), rescale = expf(m - next), p = expf(dot - next);
        l = l * rescale + p;
        for (int d = lane; d < hs; d += 32) acc[d] = acc[d] * rescale + p * v[d];
        m = next;
    }
    if (lane == 0) warp_max[warp] = m, warp_sum[warp] = l;
    __syncthreads();
    float M = -INFINITY, L = 0.0f, weight[kDecodeWarps];
    for (int w = 0; w < kDecodeWarps; w++) M = fmaxf(M, warp_max[w]);
    for (int w = 0; w < kDecodeWarps; w++) { // a warp without keys weighs 0
        weight[w] = warp_max[w] == -INFINITY ? 0.0f : expf(warp_max[w] - M);
        L += warp_sum[w] * weight[w];
    }
    float *part = scores + (size_t)h * T;
    for (int d = threadIdx.x; d < hs; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < kDecodeWarps; w++) o += shared[hs + (size_t)w * hs + d] * weight[w];
        if (splits == 1) out[h * hs + d] = o / L;
        else part[2 * splits + (size_t)split * hs + d] = o;
    }
    if (splits > 1 && threadIdx.x == 0) part[split] = M, part[splits + split] = L;
}

// One block per head: the splits' outputs weighed by their maxes and sums.
__global__ void decode_merge_k(float *out, const float *scores, int T, int splits, Heads H)
{
    int h = blockIdx.x, hs = H.hs;
    const float *part = scores + (size_t)h * T;
    float M = -INFINITY, L = 0.0f;
    for (int s = 0; s < splits; s++) M = fmaxf(M, part[s]);
    for (int s = 0; s < splits; s++) L += part[splits + s] * expf(part[s] - M);
    for (int d = threadIdx.x; d < hs; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < splits; s++) o += part[2 * splits + (size_t)s * hs + d] * expf(part[s] - M);
        out[h * hs + d] = o / L;
    }
}

} // namespace

extern "C" {

cudaError_t bbk_attention_forward(cudaStream_t s, float *out, float *lse, const float *qkv, int B, int T, int NH,
                                  int KVH, int HS, bool bf16)
{
    if (B <= 0 || T <= 0) return cudaGetLastError();
    Heads H = heads_of(NH, KVH, HS);
    return bf16 ? attention_forward<true>(s, out, lse, qkv, B, T, H) : attention_forward<false>(s, out, lse, qkv, B, T, H);
}

cudaError_t bbk_attention_decode(cudaStream_t s, float *out, float *scores, float *kv, const float *qkv, int T, int NH,
                                 int KVH, int HS)
{
    if (T <= 0) return cudaGetLastError();
    Heads H = cache_heads_of(NH, KVH, HS);
    size_t row = (size_t)H.W; // the new row's keys and values are contiguous after its queries, as in the cache
    cudaError_t e = cudaMemcpyAsync(kv + (size_t)(T - 1) * row, qkv + H.C, row * sizeof(float),
                                    cudaMemcpyDeviceToDevice, s);
    if (e != cudaSuccess) return e;
    // Splits of at least 128 keys and of twice a split's partial results
    // (so that they fit in the head's T floats of scratch); heads too wide
    // for the warps' outputs in shared memory take the two-pass kernels.
    size_t shared_bytes = (size_t)(kDecodeWarps + 1) * HS * sizeof(float);
    if (shared_bytes <= 48 * 1024) {
        int chunk = max(128, 2 * (HS + 2)), splits = (T + chunk - 1) / chunk;
        BB_LAUNCH(decode_split_k, dim3((unsigned)splits, (unsigned)NH), kDecodeThreads, shared_bytes,
                  s)(out, scores, qkv, kv, T, chunk, H);
        if (splits > 1) BB_LAUNCH(decode_merge_k, NH, 128, 0, s)(out, scores, T, splits, H);
        return cudaGetLastError();
    }
    dim3 grid((unsigned)((T + kDecodeThreads - 1) / kDecodeThreads), (unsigned)NH);
    BB_LAUNCH(decode_scores_k, grid, kDecodeThreads, 0, s)(scores, qkv, kv, T, H);
    BB_LAUNCH(decode_out_k, NH, kDecodeThreads, 0, s)(out, scores, kv, T, H);
    return cudaGetLastError();
}

cudaError_t bbk_attention_backward(cudaStream_t s, float *dqkv, const float *dout, const float *qkv, const float *out,
                                   const float *lse, int B, int T, int NH, int KVH, int HS, bool bf16)
{
    if (B <= 0 || T <= 0) return cudaGetLastError();
    Heads H = heads_of(NH, KVH, HS);
    return bf16 ? attention_backward<true>(s, dqkv, dout, qkv, out, lse, B, T, H)
                : attention_backward<false>(s, dqkv, dout, qkv, out, lse, B, T, H);
}

} // extern "C"
