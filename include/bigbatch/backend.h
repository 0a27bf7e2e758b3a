/* backend.h — compute backends: device memory with accounting, copies,
 * synchronization, and the ops the models are built from.
 *
 * How to use:
 *   bb_backend_options bo = {.device_mem = 256 << 20};    // 0: no cap
 *   bb_backend_t *be;
 *   BB_TRY(bb_backend_create_cpu(&bo, &be));
 *   float *w;
 *   BB_TRY(bb_backend_alloc(be, n * sizeof(float), "weights", (void **)&w));
 *   bb_op_linear_forward(be, bb_f32(out), bb_f32(in), bb_f32(w), bb_no_tensor(), N, IC, OC);
 *   bb_backend_free(be, w);
 *   bb_backend_destroy(be);
 *
 * Every op is declared once, in ops.def, and is a call through the
 * backend's vtable (src/backend/backend_impl.h, in the style of
 * ggml-backend): the CPU instance uses OpenBLAS cblas_sgemm and plain C
 * loops; the CUDA instance cuBLAS and the kernels of kernels/. Tensors and
 * pointers in ops are device memory of that backend; shapes are written
 * beside them, row-major.
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
    char reason[256];       /* why device_count is 0, e.g. "no CUDA driver" */
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
/* The OpenBLAS kernels this process runs ("SkylakeX", "Haswell", ...). */
const char *bb_cpu_blas_core(void);

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
/* Bytes one transient buffer of a pass (a chunk an op works through: the
 * LM head's logits) may take on a device of kind k with `device_mem` bytes
 * (0: unknown): on the CPU 32 MiB (BB_CPU_TRANSIENT_BYTES: cache-sized), at
 * most a 64th of device_mem; on a GPU a 16th of device_mem (unknown: no
 * bound). */
#define BB_CPU_TRANSIENT_BYTES (32u << 20)
uint64_t bb_device_transient_budget(bb_device_kind k, uint64_t device_mem);
/* Whether kind k's memory is the host's (CPU devices: offloading to the
 * host saves nothing there). Never fails (false for an unknown kind). */
bool bb_device_host_is_device(bb_device_kind k);
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
    double bytes;      /* the traffic it cannot avoid at its dtypes (ops.def's bytes) */
} bb_op_time;
/* The ops timed since creation or the last reset, the longest first, at
 * most cap; their count (0 when profiling is off). Waits for the device. */
int bb_backend_op_profile(bb_backend_t *b, bb_op_time *out, int cap);
void bb_backend_op_profile_reset(bb_backend_t *b);
/* How many times the host has waited for the device (synchronizations,
 * copies to the host, reads of a loss): the sync budget, on a real GPU. */
uint64_t bb_backend_host_waits(const bb_backend_t *b);
/* Who runs this backend's attention: "cuDNN 9.x.y SDPA" while cuDNN's fused
 * SDPA is in use (a bf16 GPU backend opens it at creation; a failure turns
 * it off), else "bigbatch's kernels". */
const char *bb_backend_attention_engine(bb_backend_t *b);
/* Who runs the products of bf16 tensors, for banners: on the CPU "oneDNN
 * bf16 (AMX)", "oneDNN bf16 (AVX512-BF16)", "oneDNN bf16 (emulated)" or,
 * where oneDNN has no bf16 matmul for the CPU, "OpenBLAS fp32 (no bf16
 * matmul on this CPU)"; on a GPU "cuBLAS bf16 (tensor cores)". */
const char *bb_backend_bf16_products(bb_backend_t *b);

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
/* bb_device_transient_budget for this backend: of its cap, else (GPU) of
 * what its device has free now. */
uint64_t bb_backend_transient_budget(bb_backend_t *b);
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

/* The backend's device (o->device: the CUDA ordinal). Never fails. */
int bb_backend_device(const bb_backend_t *b);
/* The sum of squares of n host floats, in double, by the CPU's kernel (a
 * reducer's norm of what it averaged). */
double bb_host_sum_squares(const float *x, size_t n);

/* Streams and events: each backend has a compute, a copy and a
 * communication stream; ops run on the compute stream. An event recorded on
 * one stream can be waited for on another (or by the host). On the CPU
 * everything is done when the call returns, so these are no-ops. */
typedef enum bb_stream { BB_STREAM_COMPUTE, BB_STREAM_COPY, BB_STREAM_COMM } bb_stream;
/* The native handle of a stream: a cudaStream_t on CUDA, NULL on the CPU
 * (and for a value that is not a bb_stream) — what a communication library
 * (the NCCL reducer) enqueues on. */
void *bb_backend_native_stream(bb_backend_t *b, bb_stream stream);
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

/* Graphs: the compute stream's work between bb_backend_graph_begin and
 * bb_backend_graph_end recorded as one graph and launched whole at the end
 * (CUDA: captured, instantiated at the first graph, then updated in place
 * while its operations stay the same, the arguments changing; the device
 * runs its kernels back to back, without a launch each). In between, only
 * ops and asynchronous copies on the compute stream: no waits for the
 * device, no allocations (an op whose scratch must grow first runs once
 * without a graph). BB_CUDA_GRAPHS=off turns graphs off.
 *
 *   if (bb_backend_graph_begin(b)) {
 *       issue(b);
 *       if (!bb_backend_graph_end(b)) issue(b); // nothing ran: again, without a graph
 *   } else
 *       issue(b);
 *
 * bb_backend_graph_begin: false where nothing is recorded (no graphs on this
 * backend, BB_CUDA_GRAPHS=off, a pending error, graphs off after a failure):
 * the work then runs as issued, and bb_backend_graph_end is not called.
 * bb_backend_graph_end: true when the recorded work was launched; false when
 * the recording or its launch failed: nothing of it ran, the error an op
 * noted while recording is dropped (the work issued again notes it again),
 * and graphs stay off for this backend after one warning naming the cause. */
bool bb_backend_graph_begin(bb_backend_t *b);
bool bb_backend_graph_end(bb_backend_t *b);

/* ---- tensors ------------------------------------------------------------
 * An op's activations, weights and gradients are tensors: device memory
 * and the dtype of its elements. Shapes are the op's arguments (written
 * beside each tensor in ops.def). A tensor whose data is NULL is none
 * (an optional argument: a bias, a second table). */
typedef enum bb_dtype { BB_DTYPE_F32 = 0, BB_DTYPE_BF16 } bb_dtype;
#define BB_DTYPE_COUNT 2
/* "f32", "bf16"; bytes per element (4, 2). */
const char *bb_dtype_name(bb_dtype d);
size_t bb_dtype_size(bb_dtype d);

typedef struct bb_tensor {
    void *data;
    bb_dtype dtype;
} bb_tensor;
/* A tensor over fp32 (bf16) memory; const memory is only read by the op's contract. */
static inline bb_tensor bb_f32(const float *p) { return (bb_tensor){(void *)p, BB_DTYPE_F32}; }
static inline bb_tensor bb_bf16(const uint16_t *p) { return (bb_tensor){(void *)p, BB_DTYPE_BF16}; }
/* t's elements from `offset` on: a row, a chunk. */
static inline bb_tensor bb_tensor_at(bb_tensor t, size_t offset)
{
    if (t.data) t.data = (char *)t.data + offset * bb_dtype_size(t.dtype);
    return t;
}
/* A tensor of no memory: an optional argument left out. */
static inline bb_tensor bb_no_tensor(void) { return (bb_tensor){NULL, BB_DTYPE_F32}; }

/* The element-wise activations (bb_op_activation_*). */
typedef enum bb_activation { BB_ACTIVATION_RELU = 0, BB_ACTIVATION_GELU_TANH, BB_ACTIVATION_SILU } bb_activation;
/* "relu", "gelu", "silu"; and "<name>_forward" / "<name>_backward", the op profile's labels. */
const char *bb_activation_name(bb_activation a);
const char *bb_activation_op_name(bb_activation a, bool backward);

/* ---- ops ------------------------------------------------------------------
 * Every op is declared once, in ops.def (its contract, shapes and the
 * dtypes it takes); they all return nothing, but for the few that hand a
 * value to the host. An op's failure (a device fault, a dtype it does not
 * take) makes the backend's next synchronizing call fail. */
#define BB_UNPAREN(...) __VA_ARGS__
#define BB_OP(name, params, ...) void bb_op_##name(bb_backend_t *b, BB_UNPAREN params);
#define BB_OP_VALUE(type, name, params, ...) type bb_op_##name(bb_backend_t *b, BB_UNPAREN params);
#include "bigbatch/ops.def"

/* The ops of ops.def, in its order: how many, and the name of each (NULL
 * past the end). */
int bb_op_count(void);
const char *bb_op_name(int index);
/* Sum of squares of x[0..n): bb_op_sum_squares_ranges over one range. */
double bb_op_sum_squares(bb_backend_t *b, const float *x, size_t n);

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
/* The layer-wise optimizers' trust ratios from a tensor's norms (lamb:
 * ||p|| / ||r||; lars: coefficient * ||p|| / (||g|| + weight_decay * ||p||)),
 * 1 where either norm is 0 (and for lars where the coefficient is 0): the
 * same float on both backends. */
static inline BB_HOST_DEVICE float bb_lamb_trust(double p_norm, double r_norm)
{
    return p_norm > 0 && r_norm > 0 ? (float)(p_norm / r_norm) : 1.0f;
}
static inline BB_HOST_DEVICE float bb_lars_trust(double p_norm, double g_norm, float coefficient, float weight_decay)
{
    return coefficient != 0.0f && p_norm > 0 && g_norm > 0
               ? (float)(coefficient * p_norm / (g_norm + weight_decay * p_norm))
               : 1.0f;
}

/* Muon's Newton-Schulz iteration (bb_op_muon): its steps, its quintic's
 * coefficients (Jordan's, chosen for speed over exactness: the singular
 * values land in about [0.7, 1.2]), the normalization's epsilon, and the
 * scratch one matrix's step needs (bb_muon_work_floats): X and the next X (rows·cols each), A and
 * b A + c A² (s² each, s the smaller side). */
#define BB_MUON_NS_STEPS 5
#define BB_MUON_A 3.4445f
#define BB_MUON_B (-4.7750f)
#define BB_MUON_C 2.0315f
#define BB_MUON_EPS 1e-7f
static inline size_t bb_muon_work_floats(int rows, int cols)
{
    size_t s = (size_t)(rows < cols ? rows : cols);
    return 2 * (size_t)rows * (size_t)cols + 2 * s * s;
}

#endif /* BIGBATCH_BACKEND_H */
