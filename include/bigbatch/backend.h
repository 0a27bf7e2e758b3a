/* backend.h — compute backends: device memory with accounting, copies,
 * synchronization, and the ops the models are built from.
 *
 * How to use:
 *   bb_backend_options bo = {.device_mem = 256 << 20};    // 0: no cap
 *   bb_backend_t *be;
 *   BB_TRY(bb_backend_create_cpu(&bo, &be));
 *   float *w;
 *   BB_TRY(bb_backend_alloc(be, n * sizeof(float), "weights", (void **)&w));
 *   bb_op_linear_forward(be, out, in, w, bias, N, IC, OC);
 *   bb_backend_free(be, w);
 *   bb_backend_destroy(be);
 *
 * Every op is a call through the backend's vtable (src/backend/backend_impl.h,
 * in the style of ggml-backend): the CPU instance uses OpenBLAS cblas_sgemm
 * and plain C loops; the CUDA instance cuBLAS and the kernels of kernels/. Pointers in
 * ops are device pointers of that backend; shapes are written beside them,
 * row-major. Ops that "accumulate" add into their output when `accumulate`
 * is true and overwrite it otherwise (first micro-step).
 *
 * A CUDA build links the CUDA runtime statically and no libcuda (nor NCCL,
 * which the multi-GPU reducer loads with dlopen): it loads and runs on
 * machines without a GPU driver, where the probe reports no device.
 *
 * Testing hook: BB_FAULT=op:N (e.g. adamw:3) in the environment when a
 * backend is created makes the N-th call of that op fail as a device fault
 * would: the op returns, and the next synchronizing call reports it.
 */
#ifndef BIGBATCH_BACKEND_H
#define BIGBATCH_BACKEND_H

#include <string.h>

#include "bigbatch/core.h"

/* ---- CUDA discovery ---------------------------------------------------- */
typedef struct bb_cuda_info {
    bool compiled;          /* this build contains the CUDA backend */
    int runtime_version;    /* e.g. 13000 for CUDA 13.0; 0 when not compiled */
    int driver_version;     /* 0 when no driver is installed */
    int device_count;       /* usable devices; 0 when none */
    char device_name[256];  /* device 0, when there is one */
    size_t device_memory;   /* bytes on device 0 */
    int compute_major, compute_minor;
    char reason[160];       /* why device_count is 0, e.g. "no CUDA driver" */
} bb_cuda_info;

/* Fills `info`; never fails (a missing GPU or driver is reported, not an error). */
void bb_cuda_probe(bb_cuda_info *info);

/* ---- backends ---------------------------------------------------------- */
typedef struct bb_backend bb_backend_t;

/* What --precision bf16 changes: the models store the activations they
 * keep for the backward in bf16 (gpt; see model.h), and on CUDA the matrix
 * products run on bf16 tensor cores with fp32 inputs, outputs and
 * accumulation (CUBLAS_COMPUTE_32F_FAST_16BF). The CPU's products stay
 * fp32. Weights, gradients and optimizer state are fp32 always. */
typedef enum bb_precision { BB_PRECISION_FP32 = 0, BB_PRECISION_BF16 } bb_precision;

/* bf16 attention on a GPU: cuDNN's fused SDPA where it loads, else (one
 * warning) bigbatch's kernels; cuDNN or nothing (its failure is the op's);
 * bigbatch's kernels always. fp32 attention always runs on bigbatch's. */
typedef enum bb_attention { BB_ATTENTION_AUTO = 0, BB_ATTENTION_CUDNN, BB_ATTENTION_KERNELS } bb_attention;
/* "auto", "cudnn" or "kernels" (the enum's order: --attention takes them). */
const char *bb_attention_name(bb_attention a);

typedef struct bb_backend_options {
    int device;              /* index among the backend's devices */
    uint64_t device_mem;     /* cap on device allocations in bytes; 0: none */
    int threads;             /* CPU: this backend's threads (products, attention, loss); 0: all CPUs */
    bb_precision precision;  /* CUDA: bf16 matrix products; the CPU ignores it */
    bb_attention attention;  /* CUDA, bf16: who runs attention; the CPU ignores it */
    bool profile_ops;        /* time every op (as BB_PROFILE_OPS=1): bb_backend_op_profile */
} bb_backend_options;

/* "fp32", "bf16"; and the parser for --precision (BB_ERR_ARG). */
const char *bb_precision_name(bb_precision p);
bb_status bb_precision_parse(const char *s, bb_precision *out);

/* Call first thing in main(): when OpenBLAS picked generic kernels on a CPU
 * with AVX-512 (AVX2), re-executes the program with OPENBLAS_CORETYPE set
 * to SkylakeX (Haswell), saying so in one info line. Returns otherwise. */
void bb_cpu_fix_blas_core(char **argv);

/* The CPU backend. Fails with BB_ERR_NOMEM. */
bb_status bb_backend_create_cpu(const bb_backend_options *o, bb_backend_t **out);
/* The CUDA backend on device o->device (o->threads is ignored). Fails
 * with BB_ERR_UNSUPPORTED in a build without CUDA or on a machine without
 * a usable GPU (saying why), BB_ERR_ARG for a device that does not exist,
 * BB_ERR_DEVICE when CUDA or cuBLAS cannot start. Ops run on the device's
 * compute stream; an error inside an op is returned by the next copy,
 * synchronize or event call. Any thread may call it (each call makes the
 * device current). */
bb_status bb_backend_create_cuda(const bb_backend_options *o, bb_backend_t **out);
/* ---- device kinds: one descriptor each (backend.c's table) ------------ */
typedef enum bb_device_kind { BB_DEVICE_CPU = 0, BB_DEVICE_CUDA } bb_device_kind;
/* "cpu", "cuda". */
const char *bb_device_kind_name(bb_device_kind k);
/* Bytes the fused LM head's logits may take (bb_model_loss_chunk) on a
 * device of kind k with `device_mem` bytes (0: unknown): on the CPU 32 MiB
 * (cache-sized), at most a 64th of device_mem; on a GPU a 16th of
 * device_mem (unknown: no bound, the whole micro-batch). */
uint64_t bb_device_head_budget(bb_device_kind k, uint64_t device_mem);
/* The devices one process trains on: their kind, their local ids (GPU
 * ordinals; 0..count-1 for CPU devices), and the process's rank among
 * `world` processes (0 and 1 when it runs alone). */
#define BB_DEVICES_MAX 64
typedef struct bb_device_spec {
    bb_device_kind kind;
    int count;
    int ids[BB_DEVICES_MAX];
    int rank, world;
} bb_device_spec;
/* A backend of kind `k` (bb_backend_create_cpu or _cuda); fails as they do. */
bb_status bb_backend_create(bb_device_kind k, const bb_backend_options *o, bb_backend_t **out);
/* The planner's backend: it allocates nothing and runs no op, but counts
 * every allocation (bytes in use, peak), scratch reservation and the
 * scratch ops would need, as a backend of kind `like` would: its host is
 * its device where like's is (no record buffers), and its workspace is
 * like's for the scratch reserved. Device pointers it returns are distinct
 * and never to be dereferenced. Fails with BB_ERR_NOMEM. */
bb_status bb_backend_create_counting(bb_device_kind like, const bb_backend_options *o, bb_backend_t **out);
/* Device bytes the backend holds outside its counted allocations: on CUDA
 * the ops' scratch and cuBLAS's workspace; 0 on the CPU. */
uint64_t bb_backend_workspace_bytes(const bb_backend_t *b);

/* ---- the ops' times (BB_PROFILE_OPS=1) -----------------------------------
 * With BB_PROFILE_OPS=1 in the environment, every backend times each op it
 * runs: on a GPU from an event recorded before the op on the compute stream
 * to the next op's (or a synchronization's), so time the device sits idle
 * after an op counts to it; on the CPU with the host clock. It costs an
 * event per op and a host wait per 256 ops: measure with it, not beside it.
 * A counting backend keeps the same table with no time (ms 0): the work
 * of each op it was asked for, which the planner's time model weighs. */
typedef struct bb_op_time {
    const char *op;    /* "linear_forward", ... */
    uint64_t calls;
    double ms, flops;  /* flops: the products' (linear, attention), 0 for the rest */
    double elements;   /* what the op reads or writes, in elements (outputs of products) */
} bb_op_time;
/* The ops timed since creation or the last reset, the longest first, at
 * most cap; their count (0 when profiling is off). Waits for the device. */
int bb_backend_op_profile(bb_backend_t *b, bb_op_time *out, int cap);
void bb_backend_op_profile_reset(bb_backend_t *b);
/* How many times the host has waited for the device (synchronizations,
 * copies to the host, reads of a loss): the sync budget, on a real GPU. */
uint64_t bb_backend_host_waits(const bb_backend_t *b);
/* Who runs this backend's attention: "cuDNN 9.x.y" once its fused SDPA ran,
 * else "bigbatch's kernels". */
const char *bb_backend_attention_engine(bb_backend_t *b);

/* Frees the backend and every allocation still live; accepts NULL. */
void bb_backend_destroy(bb_backend_t *b);
/* "cpu", "cuda:0", ... */
const char *bb_backend_name(const bb_backend_t *b);

/* Allocates `bytes` of device memory, 64-byte aligned, for `what` (named in
 * messages; a string that outlives the allocation). Fails with BB_ERR_OOM,
 * saying the bytes asked, the bytes in use, the cap, and which flags reduce
 * memory (--micro-batch, --checkpoint), when the cap or the device would be
 * exceeded. */
bb_status bb_backend_alloc(bb_backend_t *b, size_t bytes, const char *what, void **out);
/* Frees an allocation of this backend; accepts NULL. */
void bb_backend_free(bb_backend_t *b, void *ptr);
/* Bytes allocated now and the most at any time since creation (or since
 * bb_backend_reset_peak). */
uint64_t bb_backend_bytes_in_use(const bb_backend_t *b);
/* The cap on allocations (bb_backend_options.device_mem); 0: none. */
uint64_t bb_backend_mem_cap(const bb_backend_t *b);
/* bb_device_head_budget for this backend: of its cap, else (GPU) of what
 * its device has free now. */
uint64_t bb_backend_head_budget(bb_backend_t *b);
uint64_t bb_backend_peak_bytes(const bb_backend_t *b);
void bb_backend_reset_peak(bb_backend_t *b);

/* Host memory the device copies from fast (pinned on CUDA). */
bb_status bb_backend_host_alloc(bb_backend_t *b, size_t bytes, void **out);
void bb_backend_host_free(bb_backend_t *b, void *ptr, size_t bytes);
/* The same as the loader's slot hooks (bb_loader_options.host_alloc and
 * host_free with host_ctx = the backend): NULL when the allocation fails. */
void *bb_backend_slot_alloc(void *backend, size_t bytes);
void bb_backend_slot_free(void *backend, void *ptr, size_t bytes);

typedef enum bb_copy_kind { BB_COPY_H2D, BB_COPY_D2H, BB_COPY_D2D } bb_copy_kind;
/* Copies and memset fail with the backend's pending error (below) before
 * they start, BB_ERR_DEVICE when the device fails. */
bb_status bb_backend_copy(bb_backend_t *b, void *dst, const void *src, size_t bytes, bb_copy_kind kind);
bb_status bb_backend_memset(bb_backend_t *b, void *dst, int value, size_t bytes);
/* Waits for every op queued on the backend (a no-op on the CPU), also when
 * an error is pending. Ops return nothing: the first op that failed (on a
 * GPU, asynchronously) makes this, and every later copy, memset and event
 * call, fail with BB_ERR_DEVICE naming the op. A backend that failed stays
 * failed. */
bb_status bb_backend_synchronize(bb_backend_t *b);
/* Host-to-device copies made so far through bb_backend_copy and
 * bb_backend_copy_async: how many, and their bytes. */
void bb_backend_copy_stats(const bb_backend_t *b, uint64_t *h2d_copies, uint64_t *h2d_bytes);
/* True where device pointers are host pointers (the CPU): an op may then
 * read host memory, such as a loader slot, directly. */
bool bb_backend_host_is_device(const bb_backend_t *b);
/* Some ops need scratch of their own (CUDA: column-sum partials for widths
 * up to `width`, per-row losses and the embedding's sort for up to `rows`
 * rows). Reserving it once before training means no op allocates or frees
 * mid-step (which synchronizes the device, and with collectives in flight
 * can deadlock). An op on a larger shape still works: its scratch grows in
 * stream order, and bb_backend_scratch_grew() counts such ops. Not counted
 * in bb_backend_bytes_in_use. Fails with BB_ERR_DEVICE. */
bb_status bb_backend_reserve_scratch(bb_backend_t *b, size_t rows, size_t width);
uint64_t bb_backend_scratch_grew(const bb_backend_t *b);

/* Streams and events: each backend has a compute, a copy and a
 * communication stream; ops run on the compute stream. An event recorded on
 * one stream can be waited for on another (or by the host). On the CPU
 * everything is done when the call returns, so these are no-ops. */
typedef enum bb_stream { BB_STREAM_COMPUTE, BB_STREAM_COPY, BB_STREAM_COMM } bb_stream;
typedef struct bb_event bb_event_t;
bb_status bb_backend_event_create(bb_backend_t *b, bb_event_t **out); /* *out may be NULL on the CPU */
void bb_backend_event_destroy(bb_backend_t *b, bb_event_t *e);
bb_status bb_backend_event_record(bb_backend_t *b, bb_event_t *e, bb_stream stream);
/* Makes `stream` wait for `e` without blocking the host. */
bb_status bb_backend_stream_wait(bb_backend_t *b, bb_stream stream, bb_event_t *e);
/* Blocks the host until `e` has happened. */
bb_status bb_backend_event_synchronize(bb_backend_t *b, bb_event_t *e);
/* Milliseconds of device time from `from` to `to` (both recorded and
 * happened). Fails with BB_ERR_UNSUPPORTED where there is no device clock
 * (the CPU, whose work is done when a call returns). */
bb_status bb_backend_event_elapsed(bb_backend_t *b, bb_event_t *from, bb_event_t *to, double *ms);
/* Queues a copy on `stream` and returns (CUDA; the CPU copies at once):
 * `src` must stay unchanged until an event recorded on `stream` after it
 * has happened, and consumers on other streams wait for such an event. */
bb_status bb_backend_copy_async(bb_backend_t *b, void *dst, const void *src, size_t bytes, bb_copy_kind kind,
                                bb_stream stream);

/* ---- ops --------------------------------------------------------------- */
/* out = in · wᵀ + bias (bias may be NULL). */
void bb_op_linear_forward(bb_backend_t *b, float *out /* (N,OC) */, const float *in /* (N,IC) */,
                          const float *w /* (OC,IC) */, const float *bias /* (OC) */, int N, int IC, int OC);
/* din = dout · w (overwritten; din may be NULL); dw, dbias accumulate.
 * dw and dbias are formed first: din may alias `in` (not dout). */
void bb_op_linear_backward(bb_backend_t *b, float *din /* (N,IC) */, float *dw /* (OC,IC) */,
                           float *dbias /* (OC) or NULL */, const float *dout /* (N,OC) */,
                           const float *in /* (N,IC) */, const float *w /* (OC,IC) */, int N, int IC, int OC,
                           bool accumulate);

void bb_op_relu_forward(bb_backend_t *b, float *out, const float *in, size_t n);
/* din = dout where in > 0, else 0 (overwritten; may alias dout). */
void bb_op_relu_backward(bb_backend_t *b, float *din, const float *dout, const float *in, size_t n);
/* GELU, tanh form (GPT-2; PyTorch approximate='tanh'). */
void bb_op_gelu_forward(bb_backend_t *b, float *out, const float *in, size_t n);
/* din = dout * gelu'(in) (overwritten; may alias dout or in). */
void bb_op_gelu_backward(bb_backend_t *b, float *din, const float *dout, const float *in, size_t n);

/* LayerNorm over the last dimension, eps 1e-5; saves mean and 1/std. */
void bb_op_layernorm_forward(bb_backend_t *b, float *out /* (N,C) */, float *mean /* (N) */, float *rstd /* (N) */,
                             const float *in /* (N,C) */, const float *w /* (C) */, const float *bias /* (C) */,
                             int N, int C);
/* din += ...; dw, dbias accumulate. */
void bb_op_layernorm_backward(bb_backend_t *b, float *din /* (N,C) */, float *dw, float *dbias,
                              const float *dout /* (N,C) */, const float *in, const float *w, const float *mean,
                              const float *rstd, int N, int C, bool accumulate);

/* out[b,t] = wte[tokens[b,t]] + wpe[t]. */
void bb_op_embedding_forward(bb_backend_t *b, float *out /* (B,T,C) */, const int32_t *tokens /* (B,T) */,
                             const float *wte /* (V,C) */, const float *wpe /* (maxT,C) */, int B, int T, int C);
/* dwte (V,C) and dwpe (maxT,C) accumulate; without accumulation each table
 * is overwritten whole (rows no token or position touched become 0). */
void bb_op_embedding_backward(bb_backend_t *b, float *dwte /* (V,C) */, float *dwpe /* (maxT,C) */,
                              const float *dout /* (B,T,C) */, const int32_t *tokens, int B, int T, int C, int V,
                              int maxT, bool accumulate_wte, bool accumulate_wpe);

/* Causal multi-head self-attention of qkv = [q | k | v], scaled by
 * 1/sqrt(C/NH), tiled (flash-style): no T×T matrix is ever stored. Saves
 * per row and head the log-sum-exp of its scores in lse for the backward,
 * which recomputes the probabilities tile by tile from q, k and lse.
 * Memory is linear in T; the CPU spreads heads and row tiles over the
 * backend's threads. */
void bb_op_attention_forward(bb_backend_t *b, float *out /* (B,T,C) */, float *lse /* (B,NH,T) */,
                             const float *qkv /* (B,T,3C) */, int B, int T, int C, int NH);
/* dqkv overwritten, from dout, the forward's qkv, out and lse. */
void bb_op_attention_backward(bb_backend_t *b, float *dqkv /* (B,T,3C) */, const float *dout /* (B,T,C) */,
                              const float *qkv /* (B,T,3C) */, const float *out /* (B,T,C) */,
                              const float *lse /* (B,NH,T) */, int B, int T, int C, int NH);

/* The last row of bb_op_attention_forward of qkv (1,T,3C), alone: the
 * attention of row T-1's query over the keys and values of rows 0..T-1
 * (incremental decoding: qkv holds a sequence's cached rows). `scores`
 * (NH,T) is workspace. Work linear in T. */
void bb_op_attention_decode(bb_backend_t *b, float *out /* (C) */, float *scores /* (NH,T) */,
                            const float *qkv /* (T,3C) */, int T, int C, int NH);

/* out = x + y (out may alias either). */
void bb_op_add(bb_backend_t *b, float *out, const float *x, const float *y, size_t n);

/* Softmax + cross-entropy in one pass over logits (N,V). Returns through
 * *loss (when not NULL; on CUDA returning it waits for the device) the sum
 * of -log p[target] over the rows divided by `normalizer`;
 * when dlogits is not NULL, writes (softmax - onehot) / normalizer (it may
 * alias logits). Rows whose target is -1 are ignored. `valid` (may be
 * NULL) gets the number of rows with a target. */
void bb_op_softmax_crossentropy(bb_backend_t *b, double *loss, float *dlogits /* (N,V) */,
                                const float *logits /* (N,V) */, const int32_t *targets /* (N) */, int N, int V,
                                float normalizer, int *valid);

/* The same without waiting (gpt's chunked head): each row's -log p[target]
 * (0 where the target is -1), in double, goes to row_loss[0..N) in device
 * memory — a chunk's place in one buffer for the micro-batch's rows — and
 * dlogits (may alias logits) as above. */
void bb_op_crossentropy_rows(bb_backend_t *b, double *row_loss /* (N) */, float *dlogits /* (N,V) */,
                             const float *logits /* (N,V) */, const int32_t *targets /* (N) */, int N, int V,
                             float normalizer);
/* rows[0] + ... + rows[n-1] (device memory) in a fixed order, to the host:
 * the one wait for the device of a chunked loss. NAN after a device fault,
 * which the next synchronizing call reports. */
double bb_op_sum_rows(bb_backend_t *b, const double *rows, size_t n);

/* Rows whose argmax (the first largest logit; a row whose first logit is
 * NaN picks 0) is their target: a classifier's hits, counted on the device
 * and returned (waits for the device; 0 after a device fault, which the
 * next synchronizing call reports). Rows whose target is -1 never count. */
int bb_op_count_correct(bb_backend_t *b, const float *logits /* (N,V) */, const int32_t *targets /* (N) */, int N,
                        int V);

/* AdamW (decoupled weight decay, bias correction at step t >= 1), in place,
 * on the gradients times grad_scale (a clip's factor, applied as they are
 * read; grads is left as it is; 1: none). */
void bb_op_adamw(bb_backend_t *b, float *params, const float *grads, float *m, float *v, size_t n, float lr,
                 float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale);
/* SGD with momentum (PyTorch's rule: buf = momentum*buf + g + wd*p) on
 * g = grads times grad_scale (as in bb_op_adamw). */
void bb_op_sgd(bb_backend_t *b, float *params, const float *grads, float *momentum_buf, size_t n, float lr,
               float momentum, float weight_decay, float grad_scale);
/* Sum of squares of x[0..n), accumulated in double. */
double bb_op_sum_squares(bb_backend_t *b, const float *x, size_t n);
/* The sum of squares of x[lo[r]..hi[r]) over the n ranges, range by range in
 * order: one wait for the device for all of them (ZeRO-1's shard). */
double bb_op_sum_squares_ranges(bb_backend_t *b, const float *x, const size_t *lo, const size_t *hi, int n);

/* ---- bf16 storage (--precision bf16) ------------------------------------ */
/* x = the bf16 nearest to x (ties to even; NaN stays NaN), in place, and
 * the same values packed into 16 bits each when `packed` is not NULL. */
void bb_op_bf16_round(bb_backend_t *b, float *x, uint16_t *packed, size_t n);
/* out = the packed bf16 values widened to fp32 (exact). */
void bb_op_bf16_unpack(bb_backend_t *b, float *out, const uint16_t *packed, size_t n);

/* ---- loader records into a batch ------------------------------------------ */
/* `count` (<= B) records at `records` (device memory, or host memory where
 * bb_backend_host_is_device) become B rows; rows past `count` are padding
 * (zero inputs, target -1). Values are not checked: the caller checks them
 * on the host. Token records hold T+1 tokens of `width` bytes (2 or 4,
 * little-endian): tokens are the first T, targets the last T. */
void bb_op_records_to_tokens(bb_backend_t *b, int32_t *tokens /* (B,T) */, int32_t *targets /* (B,T) */,
                             const uint8_t *records /* (count, (T+1)·width) */, int count, int B, int T, int width);
/* Image records: a label byte, then `inputs` pixels (u8); features = pixel / 255. */
void bb_op_records_to_images(bb_backend_t *b, float *features /* (B,inputs) */, int32_t *labels /* (B) */,
                             const uint8_t *records /* (count, 1+inputs) */, int count, int B, int inputs);

/* The conversions both backends (and the tests) use, so that they agree
 * to the bit. */
#ifdef __CUDACC__
#define BB_HOST_DEVICE __host__ __device__
#else
#define BB_HOST_DEVICE
#endif
static inline BB_HOST_DEVICE uint16_t bb_bf16_from_float(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN, sign kept */
    u += 0x7fffu + ((u >> 16) & 1u);                                           /* nearest, ties to even */
    return (uint16_t)(u >> 16);
}
static inline BB_HOST_DEVICE float bb_bf16_to_float(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

#endif /* BIGBATCH_BACKEND_H */
