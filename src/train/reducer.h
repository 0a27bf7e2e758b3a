/* reducer.h — private: the gradient reducers, on the CPU and with NCCL,
 * over the gradient buckets of optim.h (bb_buckets_make: from the end of
 * the parameter buffer, where the backward finishes first).
 *
 * On the last micro-step each worker posts the buckets the backward has
 * finished (bb_reducer_post, from the model's grad-ready hook); a reducer
 * thread averages bucket b over the devices' gradient buffers as soon as
 * every device posted it, in bucket order, while the workers go on with the
 * backward. bb_reducer_wait returns once every bucket of the step is averaged.
 * The counters only grow (step k's bucket b is ready at devices·(k+1)
 * posts), so no reset races with a fast worker; they are compared modulo
 * 2^32 (futex words are 32-bit), which long runs wrap.
 *
 * With ZeRO-1 (reducer_args.shards: optim.h's bb_param_shards, the job's
 * devices its owners) each device owns a slice of every bucket: the
 * reduction leaves the average in the owner's slice (a reduce-scatter:
 * the CPU writes the average only there, over processes after an MPI
 * all-reduce of the bucket, which keeps the gradient norm the bits of
 * --zero 0; NCCL reduce-scatters equal slices, all-reduces whole-tensor
 * ones), each device
 * updates its slices, and bb_reducer_allgather copies every owner's
 * updated weights into every replica (the CPU: copies, and MPI's
 * all-gather over processes; NCCL: all-gather of equal slices, a
 * broadcast from each owner of whole-tensor ones).
 *
 * Besides the gradients, two small collectives cross devices once a step:
 * the mean of a scalar (the step's loss) and the stop decision of device
 * 0. Every device calls each, in the same order; they wait for the others
 * and return at once when the reducer is aborted.
 *
 * bb_reducer_create picks the reducer for a device spec: the CPU one
 * (reducer.c) for CPU devices, NCCL (nccl_reducer.cu) for GPUs; both take
 * the same arguments.
 *
 * The NCCL reducer keeps the same buckets and calls: a post enqueues the
 * bucket's all-reduce (ZeRO-1's equal slices: its reduce-scatter) on the
 * device's communication stream after an event of its compute stream, and
 * a wait
 * makes the compute stream wait for the step's reductions (the host does
 * not block). Each device thread drives its own non-blocking communicator
 * and no lock is held across NCCL calls; an abort from any thread ends
 * every communicator without waiting for one. */
#ifndef BIGBATCH_TRAIN_REDUCER_H
#define BIGBATCH_TRAIN_REDUCER_H

#include "bigbatch/model.h"
#include "bigbatch/optim.h"
#include "bigbatch/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct reducer reducer_t;

typedef struct reducer_ops {
    void (*destroy)(reducer_t *r);
    void (*post)(reducer_t *r, int device, size_t ready_from);
    uint64_t (*wait)(reducer_t *r, int device);
    void (*abort)(reducer_t *r);
    void (*last_step)(const reducer_t *r, uint64_t until_ns, uint64_t *busy_ns, uint64_t *overlapped_ns);
    double (*allreduce_scalar)(reducer_t *r, int device, double value);
    bool (*broadcast_stop)(reducer_t *r, int device, bool stop);
    bool (*allgather)(reducer_t *r, int device);
    bool (*sum_squares)(const reducer_t *r, double *out); /* NULL: not kept */
    bool (*device_squares)(const reducer_t *r, int device, double *out); /* NULL: not kept */
    void (*window_write)(reducer_t *r, int device, int bucket, size_t final_from); /* NULL: no ZeRO-2 */
    bb_status (*gather)(reducer_t *r, int device, bb_gather_phase phase, int bucket, size_t lo, size_t n,
                        float *slot); /* NULL: no ZeRO-3 */
} reducer_ops;

/* The first member of every reducer. */
struct reducer {
    const reducer_ops *ops;
    int devices, buckets;
    size_t *lo, *hi;      /* bucket b covers floats [lo[b], hi[b]); lo falls with b */
    const bb_param_shards *shards; /* ZeRO-1: the buckets' owners (the caller's); NULL: none */
    int first_owner;      /* this process's first device among the owners (rank x devices) */
    int stop;             /* aborted or shutting down; __atomic builtins (C and C++) */
    bb_status failure;    /* set before stop when the reducer itself failed (NCCL) */
    char failure_message[256];
};

/* What a reducer is made over: the devices, the replicas' backends and
 * gradient buffers (param_count floats each, laid out as `model`'s), the
 * bucket size, and where its spans go (CPU: `trace`, may be NULL, on
 * track `track`, numbered from step first_step + 1). */
typedef struct reducer_args {
    const bb_device_spec *spec;
    const bb_model_t *model;
    bb_backend_t *const *be;
    float *const *grads, *const *params; /* params: what bb_reducer_allgather fills (ZeRO-1) */
    size_t bucket_bytes;
    const bb_param_shards *shards;       /* ZeRO-1 (see above), on the same buckets; NULL: none */
    /* ZeRO-2 (with shards): the replicas' models keep a gradient window
     * (model.h) on the same buckets, every micro-step of `accumulation` is
     * reduced, and the owners' sums go to their optimizers' shard
     * gradients (bb_optimizer.grads, shard_grads[d]); else NULL */
    bb_model_t *const *window_models;
    float *const *shard_grads;
    /* ZeRO-3 (with window_models): the optimizers' master weights
     * (bb_optimizer.params), which bb_reducer_gather reads; else NULL */
    float *const *shard_params;
    int accumulation;
    uint64_t first_step;
    bb_trace_t *trace;
    int track;
    struct bb_watchdog *watchdog;        /* may be NULL: NCCL's reducer hooks its error polls and aborts there */
    double timeout_s;                    /* NCCL's set-up waits at most this long for every rank (--timeout); 0: no limit */
} reducer_args;

/* Fills the shared part of `r` from `a`: the devices, the buckets of
 * a->model's parameter buffer (bb_buckets_make), and ZeRO-1's owners
 * (a->shards, cut on the same buckets) with this process's first. Fails
 * with BB_ERR_NOMEM, BB_ERR_ARG when the shards were cut on other buckets. */
bb_status bb_reducer_init_shared(reducer_t *r, const reducer_args *a);
void bb_reducer_free_buckets(reducer_t *r);
/* Local device d's gradients of every bucket as a reducer reads them
 * (slots: r->buckets pointers to each bucket's first float: its window
 * slot under ZeRO-2, else into the whole buffer) and, under ZeRO-2, where
 * its slice of each bucket starts in its shard gradients (shard_at; may be
 * NULL otherwise). Fails with BB_ERR_INTERNAL when the window was cut on
 * other buckets than the reducer's. */
bb_status bb_reducer_device_buckets(const reducer_t *r, const reducer_args *a, int d, float **slots, size_t *shard_at);

/* The reducer for a->spec: *out NULL when there is nothing to reduce (one
 * device, one process), else the CPU or the NCCL reducer (over processes
 * too: world.h's collectives, or NCCL's). Fails like them. */
bb_status bb_reducer_create(const reducer_args *a, reducer_t **out);
/* The CPU reducer: starts the reducer thread. Fails with BB_ERR_NOMEM,
 * BB_ERR_INTERNAL when the thread cannot start. */
bb_status bb_reducer_create_cpu(const reducer_args *a, reducer_t **out);
/* Loads NCCL (dlopen of libnccl.so.2, or of BB_NCCL_LIBRARY) once per
 * process; *version (may be NULL) gets ncclGetVersion's code. Fails with
 * BB_ERR_UNSUPPORTED, naming the library, when it cannot be loaded or a
 * CUDA build is missing. */
bb_status bb_reducer_load_nccl(int *version);
/* The NCCL reducer over the replicas on CUDA backends (one non-blocking
 * communicator per GPU). Fails like bb_reducer_load_nccl, BB_ERR_DEVICE
 * when NCCL fails. */
bb_status bb_reducer_create_nccl(const reducer_args *a, reducer_t **out);

static inline void bb_reducer_destroy(reducer_t *r)
{
    if (r) r->ops->destroy(r);
}
static inline int bb_reducer_bucket_count(const reducer_t *r) { return r->buckets; }
/* Device `device`'s gradients from `ready_from` (floats) to the end are
 * final: posts every bucket that lies inside. */
static inline void bb_reducer_post(reducer_t *r, int device, size_t ready_from) { r->ops->post(r, device, ready_from); }
/* Until the step's buckets are all averaged (CPU; every device posted
 * ready_from 0) or ordered before the device's next compute (NCCL), or the
 * reducer is aborted. Returns the nanoseconds the host waited. */
static inline uint64_t bb_reducer_wait(reducer_t *r, int device) { return r->ops->wait(r, device); }
/* Stops the reducer early (a worker failed): waits return at once. */
static inline void bb_reducer_abort(reducer_t *r) { r->ops->abort(r); }
static inline bool bb_reducer_aborted(const reducer_t *r) { return __atomic_load_n(&r->stop, __ATOMIC_SEQ_CST); }
/* Why an aborted reducer stopped: its own failure, or BB_ERR_CLOSED when a
 * worker's failure stopped it. */
static inline bb_status bb_reducer_failure(const reducer_t *r)
{
    return r->failure != BB_OK ? bb_fail(r->failure, "%s", r->failure_message) : BB_ERR_CLOSED;
}
/* The mean of every device's `value` (on the CPU: the sum of value/devices
 * in device order, the same every run); NaN when the reducer is aborted. */
static inline double bb_reducer_allreduce_scalar(reducer_t *r, int device, double value)
{
    return r->ops->allreduce_scalar(r, device, value);
}
/* ZeRO-1, after each device updated its slices of the weights: every
 * owner's slices into every replica; returns when this replica holds them
 * all (false when the reducer is aborted). Every device calls it. */
static inline bool bb_reducer_allgather(reducer_t *r, int device) { return r->ops->allgather(r, device); }
/* After bb_reducer_wait: the sum of squares of the whole averaged gradient
 * (every bucket, every owner's slice), which the CPU reducer adds up as it
 * averages, in a fixed order (the same on every device, and for ZeRO-1 the
 * same as without). False when this reducer does not keep it (NCCL): the
 * optimizer then reads the gradients for their norm. */
static inline bool bb_reducer_sum_squares(const reducer_t *r, double *out)
{
    return r->ops->sum_squares && r->ops->sum_squares(r, out);
}
/* After bb_reducer_wait: the sum of squares of local device `device`'s
 * own gradients as the reduction took them, before they were summed, over
 * the step's rounds (one; under ZeRO-2 with accumulation each micro-step's):
 * the gradient noise scale's small batches (train.h). False when this
 * reducer does not keep them. */
static inline bool bb_reducer_device_squares(const reducer_t *r, int device, double *out)
{
    return r->ops->device_squares && r->ops->device_squares(r, device, out);
}
/* ZeRO-2, from the model's window hook (model.h): device `device`'s
 * gradients from final_from on are final (posted), and it may write
 * bucket `bucket` once its slot is free (the reducer has taken out the
 * bucket that used it before); returns at once when aborted. */
static inline void bb_reducer_window_write(reducer_t *r, int device, int bucket, size_t final_from)
{
    r->ops->window_write(r, device, bucket, final_from);
}
/* ZeRO-2: the bucket whose window slot bucket `bucket` takes over (model.h:
 * bucket - BB_GRAD_WINDOW_RING of the same round; for the first buckets the
 * last one of the previous round with the same slot; the last bucket its
 * own of the previous round), and whether that tenant was this round's. */
static inline int bb_reducer_window_tenant(const reducer_t *r, int bucket, bool *this_round)
{
    int last = r->buckets - 1, tenant = bucket;
    *this_round = bucket < last && bucket >= BB_GRAD_WINDOW_RING;
    if (*this_round) return bucket - BB_GRAD_WINDOW_RING;
    while (bucket < last && tenant + BB_GRAD_WINDOW_RING < last) tenant += BB_GRAD_WINDOW_RING;
    return tenant;
}
/* ZeRO-3, from the model's parameter window hook (model.h): bucket
 * `bucket`'s weights (its n floats from lo on) into device `device`'s
 * `slot`, from every owner's master weights: BB_GATHER_ISSUE starts it
 * (CPU: copies; NCCL: an all-gather on the communication stream, after the
 * compute stream's work so far, which may still read the slot's previous
 * bucket), BB_GATHER_WAIT orders the device's next compute after it.
 * Fails with BB_ERR_UNSUPPORTED where the reducer does not gather,
 * BB_ERR_INTERNAL when the window's buckets are not the reducer's,
 * BB_ERR_DEVICE when the collective fails. */
static inline bb_status bb_reducer_gather(reducer_t *r, int device, bb_gather_phase phase, int bucket, size_t lo,
                                          size_t n, float *slot)
{
    if (!r->ops->gather) return bb_fail(BB_ERR_UNSUPPORTED, "this reducer does not gather sharded weights (ZeRO-3)");
    return r->ops->gather(r, device, phase, bucket, lo, n, slot);
}
/* ZeRO's optimizer state is saved whole: a sum over the processes of a
 * host buffer that is zero where the process holds none (bb_optimizer_save's
 * gather; every process joins). */
bb_state_gather bb_reducer_state_gather(void);
/* Device 0's `stop`, on every device; true when the reducer is aborted. */
static inline bool bb_reducer_broadcast_stop(reducer_t *r, int device, bool stop)
{
    return r->ops->broadcast_stop(r, device, stop);
}
/* The last finished step's reduction: busy time, and the part of it before
 * the last backward ended (until_ns on the host clock; the NCCL reducer
 * measures on the GPU instead) — the overlapped part. Valid between
 * bb_reducer_wait and the next step's first post. */
static inline void bb_reducer_last_step(const reducer_t *r, uint64_t until_ns, uint64_t *busy_ns, uint64_t *overlapped_ns)
{
    r->ops->last_step(r, until_ns, busy_ns, overlapped_ns);
}

#ifdef __cplusplus
}
#endif

#endif
