// cuda_attention_ops.cu — the CUDA backend's attention ops: cuDNN's fused
// SDPA where it loads and takes the shape, else the tiled kernels of
// kernels/cuda_attention.cu; and incremental decoding's one row.
#include <atomic>

#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_state.h"

namespace bb_cuda {

// bf16 tensors: cuDNN's fused SDPA on them when it loads and takes the
// shape; else the tiled kernels of cuda_attention.cu on fp32 copies (their
// operands rounded to bf16 as tensor cores take them: exact on bf16
// values), the outputs rounded back — the one op that still converts (bf16
// tiles in these kernels are the next issue's). fp32 tensors under the
// backend's bf16 precision: cuDNN on bf16 copies of them. A process warns
// once when cuDNN is not used.
std::atomic<bool> cudnn_warned{false};

void warn_no_cudnn(bb_backend_t *b, const char *why)
{
    if (!cudnn_warned.exchange(true)) BB_WARN("%s: %s; attention runs on bigbatch's own kernels", b->name, why);
}

// Whether a cuDNN call ran (rc BB_OK), or failed the op (--attention cudnn:
// the failure is the op's). Under --attention auto a failure at execution
// warns once, turns cuDNN off for the backend and returns false: the
// caller runs the op on our kernels (their lse is cuDNN's Stats, so a
// forward on one and a backward on the other agree).
bool cudnn_ran(bb_backend_t *b, bb_status rc, const char *op)
{
    if (rc == BB_OK) return true;
    if (b->opt.attention == BB_ATTENTION_CUDNN) {
        bb_backend_note_error(b, rc, "%s: %s: %s", b->name, op, bb_error_message());
        return true;
    }
    BB_WARN("%s: %s: cuDNN SDPA failed (%s); attention runs on bigbatch's own kernels from here", b->name, op,
            bb_error_message());
    cudnn_warned = true;
    state(b)->cudnn_off = true;
    return false;
}

// At backend creation (bf16 precision, --attention auto or cudnn): cuDNN
// loaded and its handle made before any op, so the banner can name the
// engine and --attention cudnn fails at once when it cannot be had.
bb_status cudnn_start(bb_backend_t *b)
{
    cuda_state *s = state(b);
    if (b->opt.precision != BB_PRECISION_BF16 || b->opt.attention == BB_ATTENTION_KERNELS) return BB_OK;
    if (bb_cudnn_open(compute(b), &s->cudnn) == BB_OK) return BB_OK;
    if (b->opt.attention == BB_ATTENTION_CUDNN)
        return bb_fail(BB_ERR_UNSUPPORTED, "%s: --attention cudnn: %s", b->name, bb_error_message());
    warn_no_cudnn(b, bb_error_message());
    s->cudnn_off = true;
    return BB_OK;
}

// cuDNN, its operands' scratch and workspace for this shape; NULL: our
// kernels. Grouped-query attention too (K and V KVH heads wide), where the
// cuDNN loaded supports it; where not, one warning and our kernels.
bb_cudnn *cudnn_for(bb_backend_t *b, bool bf16_tensors, int B, int T, int NH, int KVH, int HS, uint16_t **ops,
                    void **ws, size_t *ws_bytes)
{
    cuda_state *s = state(b);
    if ((b->opt.precision != BB_PRECISION_BF16 && !bf16_tensors) || b->opt.attention == BB_ATTENTION_KERNELS ||
        s->cudnn_off)
        return nullptr;
    size_t n = (size_t)B * T * NH * HS, nqkv = (size_t)B * T * (NH + 2 * KVH) * HS;
    size_t fwd = 0, bwd = 0, halves = bf16_tensors ? 0 : 2 * nqkv + 2 * n; /* qkv, out, dout, dqkv */
    if ((!s->cudnn && bb_cudnn_open(compute(b), &s->cudnn) != BB_OK) ||
        bb_cudnn_attention_workspace(s->cudnn, B, T, NH, KVH, HS, &fwd, &bwd) != BB_OK) {
        if (b->opt.attention == BB_ATTENTION_CUDNN) /* asked for: its failure is the op's */
            bb_backend_note_error(b, BB_ERR_UNSUPPORTED, "%s: --attention cudnn: %s", b->name, bb_error_message());
        else
            warn_no_cudnn(b, bb_error_message());
        s->cudnn_off = true;
        return nullptr;
    }
    if ((halves && !grow(b, (void **)&s->attn16, &s->attn16_bytes, halves * sizeof(uint16_t),
                         "cuDNN attention's bf16 operands")) ||
        !grow(b, &s->cudnn_ws, &s->cudnn_ws_bytes, fwd > bwd ? fwd : bwd, "cuDNN attention's workspace"))
        return nullptr;
    uint64_t counted = bb_cuda_attention_bytes(B, T, NH, KVH, HS), real = s->attn16_bytes + s->cudnn_ws_bytes;
    static std::atomic<bool> warned{false};
    if (real > counted && !warned.exchange(true)) {
        char a[24], c[24];
        BB_WARN("%s: cuDNN attention takes %s, more than the planner counts (%s): its predictions are low by the "
                "difference", b->name, bb_format_bytes(real, a, sizeof a), bb_format_bytes(counted, c, sizeof c));
    }
    *ops = s->attn16, *ws = s->cudnn_ws, *ws_bytes = s->cudnn_ws_bytes;
    return s->cudnn;
}

const char *cuda_attention_engine(bb_backend_t *b)
{
    const cuda_state *s = state(b);
    return s->cudnn && !s->cudnn_off ? bb_cudnn_engine() : nullptr;
}

// bf16 tensors on the tiled kernels: `total` floats for their fp32 copies.
float *attention_f32(bb_backend_t *b, size_t total)
{
    cuda_state *s = state(b);
    return grow(b, (void **)&s->attn32, &s->attn32_bytes, total * sizeof(float), "attention's fp32 operands (bf16)")
               ? s->attn32
               : nullptr;
}

void cuda_attention_forward(bb_backend_t *b, bb_tensor out_t, float *lse, bb_tensor qkv_t, int B, int T, int NH,
                            int KVH, int HS)
{
    use(b);
    uint16_t *ops;
    void *ws;
    float *out = f32(out_t), *qkv = f32(qkv_t);
    size_t ws_bytes, n = (size_t)B * T * NH * HS, nqkv = (size_t)B * T * (NH + 2 * KVH) * HS;
    bool bf16 = qkv_t.dtype == BB_DTYPE_BF16;
    bb_cudnn *c = cudnn_for(b, bf16, B, T, NH, KVH, HS, &ops, &ws, &ws_bytes);
    if (c && bf16 &&
        cudnn_ran(b,
                  bb_cudnn_attention_forward(c, static_cast<const uint16_t *>(qkv_t.data),
                                             static_cast<uint16_t *>(out_t.data), lse, B, T, NH, KVH, HS, ws,
                                             ws_bytes),
                  "attention_forward"))
        return;
    if (bf16) {
        float *f = attention_f32(b, nqkv + n);
        if (!f) return;
        cudaStream_t st = compute(b);
        BB_CUDA_OP(b, bbk_bf16_unpack(st, f, static_cast<const uint16_t *>(qkv_t.data), nqkv));
        BB_CUDA_OP(b, bbk_attention_forward(st, f + nqkv, lse, f, B, T, NH, KVH, HS, true));
        BB_CUDA_OP(b, bbk_bf16_pack(st, static_cast<uint16_t *>(out_t.data), f + nqkv, n));
        return;
    }
    if (c && !bf16) {
        uint16_t *qkv16 = ops, *out16 = ops + nqkv;
        BB_CUDA_OP(b, bbk_bf16_pack(compute(b), qkv16, qkv, nqkv));
        if (cudnn_ran(b, bb_cudnn_attention_forward(c, qkv16, out16, lse, B, T, NH, KVH, HS, ws, ws_bytes),
                      "attention_forward")) {
            BB_CUDA_OP(b, bbk_bf16_unpack(compute(b), out, out16, n));
            return;
        }
    }
    BB_CUDA_OP(b, bbk_attention_forward(compute(b), out, lse, qkv, B, T, NH, KVH, HS,
                                        b->opt.precision == BB_PRECISION_BF16));
}

void cuda_attention_decode(bb_backend_t *b, bb_tensor out, float *scores, bb_tensor kv, bb_tensor qkv, int T, int NH,
                           int KVH, int HS)
{
    use(b);
    BB_CUDA_OP(b, bbk_attention_decode(compute(b), f32(out), scores, f32(kv), f32(qkv), T, NH, KVH, HS));
}

void cuda_attention_backward(bb_backend_t *b, bb_tensor dqkv_t, bb_tensor dout_t, bb_tensor qkv_t, bb_tensor out_t,
                             const float *lse, int B, int T, int NH, int KVH, int HS)
{
    use(b);
    uint16_t *ops;
    void *ws;
    float *dqkv = f32(dqkv_t), *dout = f32(dout_t), *qkv = f32(qkv_t), *out = f32(out_t);
    size_t ws_bytes, n = (size_t)B * T * NH * HS, nqkv = (size_t)B * T * (NH + 2 * KVH) * HS;
    bool bf16 = qkv_t.dtype == BB_DTYPE_BF16;
    bb_cudnn *c = cudnn_for(b, bf16, B, T, NH, KVH, HS, &ops, &ws, &ws_bytes);
    if (c && bf16 &&
        cudnn_ran(b,
                  bb_cudnn_attention_backward(c, static_cast<const uint16_t *>(qkv_t.data),
                                              static_cast<const uint16_t *>(out_t.data),
                                              static_cast<const uint16_t *>(dout_t.data), lse,
                                              static_cast<uint16_t *>(dqkv_t.data), B, T, NH, KVH, HS, ws,
                                              ws_bytes),
                  "attention_backward"))
        return;
    if (bf16) {
        float *f = attention_f32(b, 2 * nqkv + 2 * n); // qkv, out, dout, dqkv
        if (!f) return;
        cudaStream_t st = compute(b);
        float *fq = f, *fo = f + nqkv, *fd = fo + n, *fdq = fd + n;
        BB_CUDA_OP(b, bbk_bf16_unpack(st, fq, static_cast<const uint16_t *>(qkv_t.data), nqkv));
        BB_CUDA_OP(b, bbk_bf16_unpack(st, fo, static_cast<const uint16_t *>(out_t.data), n));
        BB_CUDA_OP(b, bbk_bf16_unpack(st, fd, static_cast<const uint16_t *>(dout_t.data), n));
        BB_CUDA_OP(b, bbk_attention_backward(st, fdq, fd, fq, fo, lse, B, T, NH, KVH, HS, true));
        BB_CUDA_OP(b, bbk_bf16_pack(st, static_cast<uint16_t *>(dqkv_t.data), fdq, nqkv));
        return;
    }
    if (c && !bf16) {
        uint16_t *qkv16 = ops, *out16 = ops + nqkv, *dout16 = out16 + n, *dqkv16 = dout16 + n;
        cudaStream_t st = compute(b);
        BB_CUDA_OP(b, bbk_bf16_pack(st, qkv16, qkv, nqkv));
        BB_CUDA_OP(b, bbk_bf16_pack(st, out16, out, n));
        BB_CUDA_OP(b, bbk_bf16_pack(st, dout16, dout, n));
        if (cudnn_ran(b,
                      bb_cudnn_attention_backward(c, qkv16, out16, dout16, lse, dqkv16, B, T, NH, KVH, HS, ws,
                                                  ws_bytes),
                      "attention_backward")) {
            BB_CUDA_OP(b, bbk_bf16_unpack(st, dqkv, dqkv16, nqkv));
            return;
        }
    }
    BB_CUDA_OP(b, bbk_attention_backward(compute(b), dqkv, dout, qkv, out, lse, B, T, NH, KVH, HS,
                                         b->opt.precision == BB_PRECISION_BF16));
}

} // namespace bb_cuda
