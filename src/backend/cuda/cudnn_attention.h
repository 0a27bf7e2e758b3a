/* cudnn_attention.h — private: causal attention through cuDNN's fused
 * SDPA (flash attention, forward and backward, bf16 in and out, fp32
 * statistics) for the CUDA backend's bf16 path. cuDNN is loaded with
 * dlopen (BB_CUDNN_LIBRARY, else libcudnn.so.9) once per process, so the
 * binary runs where it is absent: every failure below is a reason to use
 * bigbatch's own kernels (the backend warns once and does).
 *
 * How to use (one per device, on its compute stream):
 *   bb_cudnn *c;
 *   if (bb_cudnn_open(stream, &c) != BB_OK) ...;              // bb_error_message(): why not
 *   size_t fwd, bwd;
 *   BB_TRY(bb_cudnn_attention_workspace(c, B, T, NH, KVH, hs, &fwd, &bwd)); // builds and caches the graphs
 *   BB_TRY(bb_cudnn_attention_forward(c, qkv16, out16, lse, B, T, NH, KVH, hs, ws, fwd));
 *   BB_TRY(bb_cudnn_attention_backward(c, qkv16, out16, dout16, lse, dqkv16, B, T, NH, KVH, hs, ws, bwd));
 *   bb_cudnn_close(c);
 *
 * Layouts are the backend's: qkv and dqkv (B, T, C + 2·KVH·hs) with query
 * head h of row (b, t) at h·hs, key/value head g at C + g·hs (k) and
 * C + (KVH + g)·hs (v), query head h attending with key/value head
 * h / (NH / KVH) (grouped-query attention when KVH < NH; C = NH·hs); out
 * and dout (B, T, C);
 * lse (B, NH, T) fp32, the natural log-sum-exp of the scaled scores per
 * row, as the backend's own kernels keep it (cuDNN's "Stats"). Scale
 * 1/sqrt(hs), query i sees keys j <= i, no dropout. The backward is cuDNN's
 * deterministic one (bitwise-repeatable runs; its workspace grows with T²)
 * unless BB_CUDNN_DETERMINISTIC=0.
 *
 * The graph code needs the cuDNN frontend's headers at build time (make
 * deps fetches them); a build without them, and the emulated GPU, load the
 * library but report that they cannot build graphs. */
#ifndef BIGBATCH_CUDNN_ATTENTION_H
#define BIGBATCH_CUDNN_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "bigbatch/core.h"

typedef struct bb_cudnn bb_cudnn;

/* Loads cuDNN (once per process) and makes a handle on `stream` (a
 * cudaStream_t of the current device). Fails with BB_ERR_UNSUPPORTED,
 * saying why in one line: the library cannot be loaded, lacks cuDNN 9's
 * symbols, is too old or was built for another CUDA, the build has no
 * graph code, or the GPU is older than sm_80; BB_ERR_DEVICE when
 * cudnnCreate fails. */
bb_status bb_cudnn_open(void *stream, bb_cudnn **out);
/* The graphs of this shape, built once and cached; *fwd_bytes and
 * *bwd_bytes (either may be NULL) the workspace each needs. Fails with
 * BB_ERR_UNSUPPORTED when cuDNN takes no such shape (hs not a multiple of
 * 8, above 256, grouped-query heads on a cuDNN without them, ...), saying
 * why. */
bb_status bb_cudnn_attention_workspace(bb_cudnn *c, int B, int T, int NH, int KVH, int hs, size_t *fwd_bytes,
                                       size_t *bwd_bytes);
/* out (bf16) and lse from qkv (bf16), queued on the handle's stream.
 * Fails as bb_cudnn_attention_workspace, and with BB_ERR_DEVICE when the
 * execution fails (the outputs are then garbage). */
bb_status bb_cudnn_attention_forward(bb_cudnn *c, const uint16_t *qkv, uint16_t *out, float *lse, int B, int T,
                                     int NH, int KVH, int hs, void *workspace, size_t workspace_bytes);
/* dqkv (bf16, overwritten) from the forward's qkv, out and lse and dout
 * (bf16). Fails as bb_cudnn_attention_forward. */
bb_status bb_cudnn_attention_backward(bb_cudnn *c, const uint16_t *qkv, const uint16_t *out, const uint16_t *dout,
                                      const float *lse, uint16_t *dqkv, int B, int T, int NH, int KVH, int hs,
                                      void *workspace, size_t workspace_bytes);
/* "cuDNN 9.19.0" once loaded; NULL before. */
const char *bb_cudnn_version(void);
/* "cuDNN 9.x.y SDPA" once loaded (the banner's name of the engine), else NULL. */
const char *bb_cudnn_engine(void);
/* Frees the handle and the cached graphs (the library stays loaded);
 * accepts NULL. */
void bb_cudnn_close(bb_cudnn *c);

#ifdef __cplusplus
}
#endif

#endif
