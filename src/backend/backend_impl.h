/* backend_impl.h — private: the backend vtable and the state every backend
 * shares (name, allocation accounting). Instances fill a bb_backend_vtable
 * with designated initializers; entries marked optional may be NULL and the
 * wrappers in backend.c check them. */
#ifndef BIGBATCH_BACKEND_IMPL_H
#define BIGBATCH_BACKEND_IMPL_H

#include "bigbatch/backend.h"

typedef struct bb_backend_vtable {
    /* memory: required */
    bb_status (*alloc)(bb_backend_t *b, size_t bytes, void **out);
    void (*free)(bb_backend_t *b, void *ptr);
    bb_status (*copy)(bb_backend_t *b, void *dst, const void *src, size_t bytes, bb_copy_kind kind);
    bb_status (*memset)(bb_backend_t *b, void *dst, int value, size_t bytes);
    /* optional: host memory (default: page-aligned malloc), free device bytes
     * (for messages), synchronize (default: nothing to wait for), destroy */
    bb_status (*host_alloc)(bb_backend_t *b, size_t bytes, void **out);
    void (*host_free)(bb_backend_t *b, void *ptr, size_t bytes);
    bool (*device_free_bytes)(bb_backend_t *b, uint64_t *free_bytes);
    bb_status (*synchronize)(bb_backend_t *b);
    bb_status (*copy_async)(bb_backend_t *b, void *dst, const void *src, size_t bytes, bb_copy_kind kind,
                            bb_stream stream); /* default: copy */
    void (*destroy)(bb_backend_t *b);
    /* optional: sizes the ops' own scratch (bb_backend_reserve_scratch) */
    bb_status (*reserve_scratch)(bb_backend_t *b, size_t rows, size_t width);
    /* device pointers are host pointers (the CPU): ops may read host memory */
    bool host_is_device;
    /* every op is a no-op (the counting backend: the planner's) */
    bool counts_only;
    /* optional: device bytes outside the counted allocations (scratch, workspaces) */
    uint64_t (*workspace_bytes)(const bb_backend_t *b);
    /* optional: streams and events (NULL: work is done when a call returns) */
    bb_status (*event_create)(bb_backend_t *b, bb_event_t **out);
    void (*event_destroy)(bb_backend_t *b, bb_event_t *e);
    bb_status (*event_record)(bb_backend_t *b, bb_event_t *e, bb_stream stream);
    bb_status (*stream_wait)(bb_backend_t *b, bb_stream stream, bb_event_t *e);
    bb_status (*event_synchronize)(bb_backend_t *b, bb_event_t *e);
    bb_status (*event_elapsed)(bb_backend_t *b, bb_event_t *from, bb_event_t *to, double *ms);
    /* optional: graphs of the compute stream's work (bb_backend_graph_begin;
     * NULL: none); graph_begin is called with no error pending */
    bool (*graph_begin)(bb_backend_t *b);
    bool (*graph_end)(bb_backend_t *b);
    /* optional: the native handle of a stream (NULL: none) */
    void *(*native_stream)(bb_backend_t *b, bb_stream stream);
    /* optional: who ran the last attention op (NULL: bigbatch's kernels) */
    const char *(*attention_engine)(bb_backend_t *b);
    const char *(*bf16_products)(bb_backend_t *b);

    /* ops: required, one entry per op of ops.def (its contract is there) */
#define BB_OP(name, params, ...) void (*name)(bb_backend_t *b, BB_UNPAREN params);
#define BB_OP_VALUE(type, name, params, ...) type (*name)(bb_backend_t *b, BB_UNPAREN params);
#include "bigbatch/ops.def"
} bb_backend_vtable;

typedef struct bb_allocation {
    void *ptr;
    size_t bytes;
    const char *what;
} bb_allocation;

struct bb_backend {
    const bb_backend_vtable *vt;
    bb_device_kind kind;        /* or the kind a counting backend counts as */
    char name[32];
    bb_backend_options opt;
    uint64_t in_use, peak;
    bb_allocation *allocations; /* live device allocations */
    size_t allocation_count, allocation_capacity;
    /* The first error of an op (ops return nothing; on a GPU they fail
     * later, asynchronously): returned by every later copy, memset,
     * synchronize and event call. Sticky: a device that failed stays failed. */
    bb_status error;
    char error_message[256];
    /* BB_FAULT=op:N (tests): the N-th call of that op fails, as a device
     * fault would, reported by the next synchronizing call. */
    char fault_op[32];
    uint64_t fault_at, fault_calls;
    size_t scratch_rows, scratch_width; /* reserved (bb_backend_reserve_scratch) */
    uint64_t scratch_grew;              /* ops that needed more than that */
    uint64_t scratch_attention;         /* the largest bf16 attention's (bb_device_desc.attention_bytes) */
    uint64_t h2d_bytes, h2d_copies;     /* host-to-device copies so far */
    uint64_t host_waits;                /* times the host waited for the device (bb_backend_host_waits) */
    struct bb_op_profile *profile;      /* BB_PROFILE_OPS=1: the ops' times (op_profile.c); NULL: off */
    void *impl;                 /* the instance's own state */
};

/* op_profile.c: made at creation when BB_PROFILE_OPS=1; every op marks its
 * start (op NULL: a synchronization, which only ends the op before). */
typedef struct bb_op_profile bb_op_profile;
void bb_op_profile_init(bb_backend_t *b);
/* An op's work, as ops.def counts it. */
typedef struct bb_op_work {
    double flops, elements, bytes;
} bb_op_work;
void bb_op_profile_mark(bb_backend_t *b, const char *op, bb_op_work w);
void bb_op_profile_free(bb_backend_t *b);

/* backend.c: fills the shared part; the instance sets vt and impl. */
bb_status bb_backend_init_common(bb_backend_t *b, bb_device_kind kind, const char *name, const bb_backend_options *o);
/* Records an op's failure (the first one wins; later ones are its
 * consequences) for the next synchronizing call to return. */
void bb_backend_note_error(bb_backend_t *b, bb_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* BB_OK, or the noted error (set again as the thread's message). */
bb_status bb_backend_pending(bb_backend_t *b);

/* cpu_ops.c */
extern const bb_backend_vtable bb_cpu_vtable;

/* A device kind: how to make its backends, and what the counting backend
 * mimics of them (backend.c's table; adding a kind is one entry). */
typedef struct bb_device_desc {
    const char *name;
    bb_status (*create)(const bb_backend_options *o, bb_backend_t **out);
    bool host_is_device;
    /* device bytes its backend holds besides allocations for ops' scratch
     * of `rows` rows and `width` columns; NULL: none */
    uint64_t (*workspace_bytes)(size_t rows, size_t width);
    /* a pass's transient buffer (bb_device_transient_budget): a
     * `transient_share`-th of the device's memory, at most transient_max (0: no cap) */
    uint32_t transient_share;
    uint64_t transient_max;
    /* device bytes its bf16 attention of this shape takes besides (cuDNN's
     * operands and workspace, bounded); NULL: none */
    uint64_t (*attention_bytes)(int B, int T, int NH, int KVH, int HS);
} bb_device_desc;
const bb_device_desc *bb_device_desc_of(bb_device_kind k);

/* cuda_sizes.c (every build): what the CUDA backend holds besides its
 * allocations for that scratch — the per-row loss, the column-sum
 * partials, the embedding's sort and cuBLAS's default workspace. */
uint64_t bb_cuda_workspace_bytes(size_t rows, size_t width);
/* And what its bf16 attention of this shape takes through cuDNN, bounded. */
uint64_t bb_cuda_attention_bytes(int B, int T, int NH, int KVH, int HS);

#endif
