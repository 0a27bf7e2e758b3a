/* backend.c — the backend wrappers: allocation accounting and the cap,
 * optional vtable entries, and the op entry points. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "backend_impl.h"

bb_status bb_backend_init_common(bb_backend_t *b, bb_device_kind kind, const char *name, const bb_backend_options *o)
{
    b->kind = kind;
    snprintf(b->name, sizeof b->name, "%s", name);
    if (o) b->opt = *o;
    /* BB_FAULT=op:N, a test hook: see backend_impl.h. */
    const char *fault = getenv("BB_FAULT"), *colon = fault ? strchr(fault, ':') : NULL;
    if (colon && colon - fault < (long)sizeof b->fault_op && atoll(colon + 1) > 0) {
        snprintf(b->fault_op, sizeof b->fault_op, "%.*s", (int)(colon - fault), fault);
        b->fault_at = (uint64_t)atoll(colon + 1);
    }
    bb_op_profile_init(b);
    return BB_OK;
}

void bb_backend_note_error(bb_backend_t *b, bb_status status, const char *fmt, ...)
{
    if (b->error != BB_OK) return;
    b->error = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->error_message, sizeof b->error_message, fmt, ap);
    va_end(ap);
}

bb_status bb_backend_pending(bb_backend_t *b)
{
    return b->error == BB_OK ? BB_OK : bb_fail(b->error, "%s", b->error_message);
}

/* Every op passes here first: the BB_FAULT hook, and the profile's mark
 * (ops.def's flops, elements and bytes). */
static inline void op_entry_work(bb_backend_t *b, const char *op, bb_op_work w)
{
    if (__builtin_expect(b->fault_at != 0, 0) && !strcmp(op, b->fault_op) && ++b->fault_calls == b->fault_at)
        bb_backend_note_error(b, BB_ERR_DEVICE, "%s: %s failed: injected fault (BB_FAULT=%s:%llu)", b->name, op,
                              b->fault_op, (unsigned long long)b->fault_at);
    if (__builtin_expect(b->profile != NULL, 0)) bb_op_profile_mark(b, op, w);
}

/* Ops run, except on a counting backend (the planner's): there every op
 * is a no-op, while the allocations, the scratch reservations and the
 * scratch the ops would need are all counted. */
static inline bool runs(const bb_backend_t *b) { return !b->vt->counts_only; }

/* Ops with scratch of their own pass here too: what they need beyond the
 * reservation is counted (the CUDA backend then grows it in stream order). */
static inline void scratch_need(bb_backend_t *b, size_t rows, size_t width)
{
    if (rows <= b->scratch_rows && width <= b->scratch_width) return;
    b->scratch_grew++;
    if (rows > b->scratch_rows) b->scratch_rows = rows;
    if (width > b->scratch_width) b->scratch_width = width;
}

/* And bf16 attention's, where the device kind has some (cuDNN's). */
static inline void attention_need(bb_backend_t *b, int B, int T, int NH, int KVH, int HS)
{
    const bb_device_desc *d = bb_device_desc_of(b->kind);
    if (b->opt.precision != BB_PRECISION_BF16 || !d || !d->attention_bytes) return;
    uint64_t need = d->attention_bytes(B, T, NH, KVH, HS);
    if (need > b->scratch_attention) b->scratch_attention = need;
}

bb_status bb_backend_reserve_scratch(bb_backend_t *b, size_t rows, size_t width)
{
    if (rows < b->scratch_rows) rows = b->scratch_rows;
    if (width < b->scratch_width) width = b->scratch_width;
    if (b->vt->reserve_scratch) BB_TRY(b->vt->reserve_scratch(b, rows, width));
    b->scratch_rows = rows;
    b->scratch_width = width;
    return BB_OK;
}

uint64_t bb_backend_scratch_grew(const bb_backend_t *b) { return b->scratch_grew; }
uint64_t bb_backend_host_waits(const bb_backend_t *b) { return b->host_waits; }

const char *bb_backend_bf16_products(bb_backend_t *b)
{
    return b->vt->bf16_products ? b->vt->bf16_products(b) : "none (this backend only counts)";
}

const char *bb_backend_attention_engine(bb_backend_t *b)
{
    const char *e = b->vt->attention_engine ? b->vt->attention_engine(b) : NULL;
    return e ? e : "bigbatch's kernels";
}
bool bb_backend_host_is_device(const bb_backend_t *b) { return b->vt->host_is_device; }
int bb_backend_device(const bb_backend_t *b) { return b->opt.device; }
void *bb_backend_native_stream(bb_backend_t *b, bb_stream stream)
{
    bool known = stream >= BB_STREAM_COMPUTE && stream <= BB_STREAM_COMM;
    return known && b->vt->native_stream ? b->vt->native_stream(b, stream) : NULL;
}

void bb_backend_copy_stats(const bb_backend_t *b, uint64_t *h2d_copies, uint64_t *h2d_bytes)
{
    *h2d_copies = b->h2d_copies;
    *h2d_bytes = b->h2d_bytes;
}

static void count_copy(bb_backend_t *b, size_t bytes, bb_copy_kind kind)
{
    if (kind != BB_COPY_H2D) return;
    b->h2d_copies++;
    b->h2d_bytes += bytes;
}

void bb_backend_destroy(bb_backend_t *b)
{
    if (!b) return;
    for (size_t i = 0; i < b->allocation_count; i++) b->vt->free(b, b->allocations[i].ptr);
    free(b->allocations);
    bb_op_profile_free(b);
    if (b->vt->destroy) b->vt->destroy(b);
    free(b);
}

const char *bb_backend_name(const bb_backend_t *b) { return b->name; }

uint64_t bb_backend_mem_cap(const bb_backend_t *b) { return b->opt.device_mem; }

uint64_t bb_backend_workspace_bytes(const bb_backend_t *b) { return b->vt->workspace_bytes ? b->vt->workspace_bytes(b) : 0; }

/* ---- device kinds -------------------------------------------------------- */
static const bb_device_desc devices[] = {
    /* The CPU's logits stay cache-sized: 32 MiB chunks stream no slower than one. */
    [BB_DEVICE_CPU] = {.name = "cpu", .create = bb_backend_create_cpu, .host_is_device = true, .transient_share = 64,
                       .transient_max = BB_CPU_TRANSIENT_BYTES},
    /* A GPU's take a 16th of its memory: the whole micro-batch of GPT-2 124M
     * at 8 × 1024 tokens (1.6 GB of logits) on a 40 GB GPU, so one head
     * product each way and nothing recomputed, while the activations keep
     * 15/16 of the memory. */
    [BB_DEVICE_CUDA] = {.name = "cuda", .create = bb_backend_create_cuda, .workspace_bytes = bb_cuda_workspace_bytes,
                        .transient_share = 16, .attention_bytes = bb_cuda_attention_bytes},
};

const bb_device_desc *bb_device_desc_of(bb_device_kind k)
{
    return (unsigned)k < sizeof devices / sizeof *devices ? &devices[k] : NULL;
}

uint64_t bb_device_transient_budget(bb_device_kind k, uint64_t device_mem)
{
    const bb_device_desc *d = bb_device_desc_of(k);
    uint64_t budget = d && device_mem ? device_mem / d->transient_share : UINT64_MAX;
    return d && d->transient_max && d->transient_max < budget ? d->transient_max : budget;
}

bool bb_device_host_is_device(bb_device_kind k)
{
    const bb_device_desc *d = bb_device_desc_of(k);
    return d && d->host_is_device;
}

uint64_t bb_backend_transient_budget(bb_backend_t *b)
{
    uint64_t mem = b->opt.device_mem, free_bytes = 0;
    if (!mem && b->vt->device_free_bytes && b->vt->device_free_bytes(b, &free_bytes)) mem = free_bytes;
    return bb_device_transient_budget(b->kind, mem);
}

const char *bb_device_kind_name(bb_device_kind k)
{
    const bb_device_desc *d = bb_device_desc_of(k);
    return d ? d->name : "(unknown device kind)";
}

bb_status bb_backend_create(bb_device_kind k, const bb_backend_options *o, bb_backend_t **out)
{
    *out = NULL;
    const bb_device_desc *d = bb_device_desc_of(k);
    if (!d) return bb_fail(BB_ERR_ARG, "unknown device kind %d", k);
    return d->create(o, out);
}

const char *bb_attention_name(bb_attention a)
{
    static const char *const names[] = {[BB_ATTENTION_AUTO] = "auto", [BB_ATTENTION_CUDNN] = "cudnn",
                                        [BB_ATTENTION_KERNELS] = "kernels"};
    return a >= BB_ATTENTION_AUTO && a <= BB_ATTENTION_KERNELS ? names[a] : "?";
}

const char *bb_precision_name(bb_precision p) { return p == BB_PRECISION_BF16 ? "bf16" : "fp32"; }

bb_status bb_precision_parse(const char *s, bb_precision *out)
{
    if (!strcmp(s, "fp32")) *out = BB_PRECISION_FP32;
    else if (!strcmp(s, "bf16")) *out = BB_PRECISION_BF16;
    else return bb_fail(BB_ERR_ARG, "precision '%s' is not fp32 or bf16", s);
    return BB_OK;
}
uint64_t bb_backend_bytes_in_use(const bb_backend_t *b) { return b->in_use; }
uint64_t bb_backend_peak_bytes(const bb_backend_t *b) { return b->peak; }
void bb_backend_reset_peak(bb_backend_t *b) { b->peak = b->in_use; }

/* "out of memory" with what was asked, what is in use, the limit met
 * (limit_kind NULL: the allocator refused with no known limit) and the
 * flags that need less memory. */
static bb_status out_of_memory(bb_backend_t *b, size_t bytes, const char *what, const char *limit_kind,
                               uint64_t limit)
{
    char asked[32], used[32], cap[32], tail[96] = "the allocator refused";
    bb_format_bytes(bytes, asked, sizeof asked);
    bb_format_bytes(b->in_use, used, sizeof used);
    if (limit_kind) snprintf(tail, sizeof tail, "%s %s", limit_kind, bb_format_bytes(limit, cap, sizeof cap));
    return bb_fail(BB_ERR_OOM,
                   "%s: out of memory allocating %s for %s: %s in use, %s (activations: a smaller "
                   "--micro-batch or --checkpoint blocks or every:K needs less; parameters, gradients and "
                   "optimizer state: a smaller model)",
                   b->name, asked, what, used, tail);
}

bb_status bb_backend_alloc(bb_backend_t *b, size_t bytes, const char *what, void **out)
{
    *out = NULL;
    if (b->opt.device_mem && b->in_use + bytes > b->opt.device_mem)
        return out_of_memory(b, bytes, what, "cap (--device-mem)", b->opt.device_mem);
    if (b->allocation_count == b->allocation_capacity) {
        size_t cap = b->allocation_capacity ? 2 * b->allocation_capacity : 64;
        bb_allocation *a = realloc(b->allocations, cap * sizeof *a);
        if (!a) return bb_fail(BB_ERR_NOMEM, "out of memory");
        b->allocations = a;
        b->allocation_capacity = cap;
    }
    bb_status rc = b->vt->alloc(b, bytes ? bytes : 1, out);
    if (rc != BB_OK && rc != BB_ERR_OOM) return rc; /* a device error, not a lack of memory */
    if (rc == BB_ERR_OOM) {
        uint64_t free_bytes = 0;
        if (b->vt->device_free_bytes && b->vt->device_free_bytes(b, &free_bytes))
            return out_of_memory(b, bytes, what, "free on the device", free_bytes);
        return out_of_memory(b, bytes, what, NULL, 0);
    }
    b->allocations[b->allocation_count++] = (bb_allocation){*out, bytes, what};
    b->in_use += bytes;
    if (b->in_use > b->peak) b->peak = b->in_use;
    return BB_OK;
}

void bb_backend_free(bb_backend_t *b, void *ptr)
{
    if (!ptr) return;
    for (size_t i = b->allocation_count; i-- > 0;) {
        if (b->allocations[i].ptr != ptr) continue;
        b->in_use -= b->allocations[i].bytes;
        b->allocations[i] = b->allocations[--b->allocation_count];
        b->vt->free(b, ptr);
        return;
    }
    BB_WARN("%s: free of %p, which this backend did not allocate", b->name, ptr);
}

bb_status bb_backend_host_alloc(bb_backend_t *b, size_t bytes, void **out)
{
    if (b->vt->host_alloc) return b->vt->host_alloc(b, bytes, out);
    *out = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    return *out ? BB_OK : bb_fail(BB_ERR_NOMEM, "cannot allocate %zu bytes of host memory", bytes);
}

void bb_backend_host_free(bb_backend_t *b, void *ptr, size_t bytes)
{
    if (b->vt->host_free)
        b->vt->host_free(b, ptr, bytes);
    else
        free(ptr);
}

void *bb_backend_slot_alloc(void *backend, size_t bytes)
{
    void *p = NULL;
    return bb_backend_host_alloc(backend, bytes, &p) == BB_OK ? p : NULL;
}

void bb_backend_slot_free(void *backend, void *ptr, size_t bytes) { bb_backend_host_free(backend, ptr, bytes); }

bb_status bb_backend_copy(bb_backend_t *b, void *dst, const void *src, size_t bytes, bb_copy_kind kind)
{
    BB_TRY(bb_backend_pending(b));
    count_copy(b, bytes, kind);
    return b->vt->copy(b, dst, src, bytes, kind);
}

bb_status bb_backend_memset(bb_backend_t *b, void *dst, int value, size_t bytes)
{
    BB_TRY(bb_backend_pending(b));
    return b->vt->memset(b, dst, value, bytes);
}

bb_status bb_backend_event_elapsed(bb_backend_t *b, bb_event_t *from, bb_event_t *to, double *ms)
{
    if (!b->vt->event_elapsed || !from || !to) return BB_ERR_UNSUPPORTED; /* no message: callers fall back */
    return b->vt->event_elapsed(b, from, to, ms);
}

bb_status bb_backend_copy_async(bb_backend_t *b, void *dst, const void *src, size_t bytes, bb_copy_kind kind,
                                bb_stream stream)
{
    BB_TRY(bb_backend_pending(b));
    count_copy(b, bytes, kind);
    return b->vt->copy_async ? b->vt->copy_async(b, dst, src, bytes, kind, stream) : b->vt->copy(b, dst, src, bytes, kind);
}

bool bb_backend_graph_begin(bb_backend_t *b)
{
    return b->vt->graph_begin && b->error == BB_OK && b->vt->graph_begin(b);
}

bool bb_backend_graph_end(bb_backend_t *b) { return b->vt->graph_end(b); }

bb_status bb_backend_synchronize(bb_backend_t *b)
{
    /* It waits even when an error is pending: callers rely on the queued
     * work being over (no copy still reading a host buffer) when it returns. */
    if (b->profile && !b->vt->counts_only) bb_op_profile_mark(b, NULL, (bb_op_work){0});
    bb_status rc = b->vt->synchronize ? b->vt->synchronize(b) : BB_OK;
    return b->error != BB_OK ? bb_backend_pending(b) : rc;
}

bb_status bb_backend_event_create(bb_backend_t *b, bb_event_t **out)
{
    *out = NULL;
    return b->vt->event_create ? b->vt->event_create(b, out) : BB_OK;
}

void bb_backend_event_destroy(bb_backend_t *b, bb_event_t *e)
{
    if (e && b->vt->event_destroy) b->vt->event_destroy(b, e);
}

bb_status bb_backend_event_record(bb_backend_t *b, bb_event_t *e, bb_stream stream)
{
    BB_TRY(bb_backend_pending(b));
    return b->vt->event_record ? b->vt->event_record(b, e, stream) : BB_OK;
}

bb_status bb_backend_stream_wait(bb_backend_t *b, bb_stream stream, bb_event_t *e)
{
    BB_TRY(bb_backend_pending(b));
    return b->vt->stream_wait ? b->vt->stream_wait(b, stream, e) : BB_OK;
}

bb_status bb_backend_event_synchronize(bb_backend_t *b, bb_event_t *e)
{
    BB_TRY(bb_backend_pending(b));
    return b->vt->event_synchronize ? b->vt->event_synchronize(b, e) : BB_OK;
}

/* ---- ops --------------------------------------------------------------- */
const char *bb_dtype_name(bb_dtype d)
{
    static const char *const names[] = {[BB_DTYPE_F32] = "f32", [BB_DTYPE_BF16] = "bf16"};
    return d >= 0 && d < BB_DTYPE_COUNT ? names[d] : "(no dtype)";
}

size_t bb_dtype_size(bb_dtype d) { return d == BB_DTYPE_BF16 ? 2 : 4; }

const char *bb_activation_name(bb_activation a)
{
    static const char *const names[] = {[BB_ACTIVATION_RELU] = "relu", [BB_ACTIVATION_GELU_TANH] = "gelu",
                                        [BB_ACTIVATION_SILU] = "silu"};
    return a >= BB_ACTIVATION_RELU && a <= BB_ACTIVATION_SILU ? names[a] : "(no activation)";
}

const char *bb_activation_op_name(bb_activation a, bool backward)
{
    static const char *const names[][2] = {[BB_ACTIVATION_RELU] = {"relu_forward", "relu_backward"},
                                           [BB_ACTIVATION_GELU_TANH] = {"gelu_forward", "gelu_backward"},
                                           [BB_ACTIVATION_SILU] = {"silu_forward", "silu_backward"}};
    return a >= BB_ACTIVATION_RELU && a <= BB_ACTIVATION_SILU ? names[a][backward] : "activation";
}

/* What a tensor argument may be (ops.def's BB_ACCEPT): one bit per dtype. */
enum { F32 = 1u << BB_DTYPE_F32, BF16 = 1u << BB_DTYPE_BF16, ACT = F32 | BF16 };

/* A tensor outside its op's dtypes fails the op, named, for the next
 * synchronizing call to report. */
static bool accepts(bb_backend_t *b, const char *op, const char *arg, bb_tensor t, unsigned mask)
{
    if (!t.data || (mask >> t.dtype & 1u)) return true;
    char took[32] = "";
    for (int d = 0; d < BB_DTYPE_COUNT; d++)
        if (mask >> d & 1u) snprintf(took + strlen(took), sizeof took - strlen(took), "%s%s", *took ? " or " : "",
                                     bb_dtype_name((bb_dtype)d));
    bb_backend_note_error(b, BB_ERR_UNSUPPORTED, "%s: %s: `%s` is a %s tensor; this op takes %s", b->name, op, arg,
                          bb_dtype_name(t.dtype), took);
    return false;
}
#define BB_ACCEPT(tensor, mask) accepts(b, op, #tensor, tensor, mask)

/* Two tensor arguments of one dtype (either may be none). */
static bool same(bb_backend_t *b, const char *op, const char *x_name, bb_tensor x, const char *y_name, bb_tensor y)
{
    if (!x.data || !y.data || x.dtype == y.dtype) return true;
    bb_backend_note_error(b, BB_ERR_UNSUPPORTED, "%s: %s: `%s` is a %s tensor and `%s` a %s one; this op takes them "
                          "of one dtype", b->name, op, x_name, bb_dtype_name(x.dtype), y_name, bb_dtype_name(y.dtype));
    return false;
}
#define BB_SAME(x, y) same(b, op, #x, x, #y, y)

/* Attention's heads: KVH key/value heads, dividing the NH query heads. */
static bool heads_ok(bb_backend_t *b, const char *op, int NH, int KVH, int HS)
{
    if (NH >= 1 && KVH >= 1 && HS >= 1 && NH % KVH == 0) return true;
    bb_backend_note_error(b, BB_ERR_ARG, "%s: %s: %d key/value heads do not divide %d query heads (head size %d)",
                          b->name, op, KVH, NH, HS);
    return false;
}

/* RoPE's head size: even, and its first position not negative. */
static bool rope_ok(bb_backend_t *b, const char *op, int HS, int pos0)
{
    if (HS % 2 == 0 && pos0 >= 0) return true;
    bb_backend_note_error(b, BB_ERR_ARG, "%s: %s: head size %d (must be even), first position %d", b->name, op, HS,
                          pos0);
    return false;
}

/* An activation of bb_activation's. */
static bool activation_ok(bb_backend_t *b, const char *op, bb_activation act)
{
    if (act >= BB_ACTIVATION_RELU && act <= BB_ACTIVATION_SILU) return true;
    bb_backend_note_error(b, BB_ERR_ARG, "%s: %s: activation %d is not one of bb_activation", b->name, op, (int)act);
    return false;
}

/* A row stride of at least the row's width; packed (stride = width) where `packed` (a bias). */
static bool row_stride_ok(bb_backend_t *b, const char *op, int ld, int width, bool packed)
{
    if (ld >= width && (!packed || ld == width)) return true;
    bb_backend_note_error(b, BB_ERR_ARG, "%s: %s: row stride %d for rows of %d%s", b->name, op, ld, width,
                          packed ? " (a bias takes packed rows)" : "");
    return false;
}

/* ops.def's bytes: n elements of a tensor (none: 0), of fp32s at p, of int32s. */
static inline double TB(bb_tensor t, double n) { return t.data ? n * (double)bb_dtype_size(t.dtype) : 0; }
static inline double FB(const void *p, double n) { return p ? 4 * n : 0; }
static inline double IB(double n) { return 4 * n; }

static double range_elements(const size_t *lo, const size_t *hi, int n)
{
    double elements = 0;
    for (int i = 0; i < n; i++) elements += (double)(hi[i] - lo[i]);
    return elements;
}

/* Muon's Newton-Schulz products: per step X Xᵀ and (b A + c A²) X (2 s² l
 * each) and A² (2 s³), s and l the matrix's smaller and larger side. */
static double muon_flops(int rows, int cols)
{
    double s = rows < cols ? rows : cols, l = rows < cols ? cols : rows;
    return BB_MUON_NS_STEPS * (4.0 * s * s * l + 2.0 * s * s * s);
}

/* Every op: its `before` (ops.def), the BB_FAULT hook and the profile's
 * mark (its work computed only when one of them is on), its dtypes, then
 * the call unless the backend only counts. */
#define BB_OP(name, params, args, accept, flops, elements, bytes, before)                                          \
    void bb_op_##name(bb_backend_t *b, BB_UNPAREN params)                                                          \
    {                                                                                                               \
        const char *op = #name;                                                                                     \
        before;                                                                                                     \
        if (__builtin_expect(b->profile != NULL || b->fault_at != 0, 0))                                            \
            op_entry_work(b, op, (bb_op_work){flops, elements, bytes});                                             \
        if ((accept) && runs(b)) b->vt->name args;                                                                  \
    }
#define BB_OP_VALUE(type, name, params, args, accept, flops, elements, bytes, before)                              \
    type bb_op_##name(bb_backend_t *b, BB_UNPAREN params)                                                          \
    {                                                                                                               \
        const char *op = #name;                                                                                     \
        before;                                                                                                     \
        if (__builtin_expect(b->profile != NULL || b->fault_at != 0, 0))                                            \
            op_entry_work(b, op, (bb_op_work){flops, elements, bytes});                                             \
        return (accept) && runs(b) ? b->vt->name args : (type)0;                                                    \
    }
#include "bigbatch/ops.def"
#undef BB_ACCEPT
#undef BB_SAME

static const char *const op_names[] = {
#define BB_OP(name, ...) #name,
#define BB_OP_VALUE(type, name, ...) #name,
#include "bigbatch/ops.def"
};

int bb_op_count(void) { return (int)(sizeof op_names / sizeof *op_names); }
const char *bb_op_name(int index) { return index >= 0 && index < bb_op_count() ? op_names[index] : NULL; }

double bb_op_sum_squares(bb_backend_t *b, const float *x, size_t n)
{
    size_t lo = 0;
    return bb_op_sum_squares_ranges(b, x, &lo, &n, 1);
}
