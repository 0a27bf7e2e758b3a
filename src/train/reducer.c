/* reducer.c — the buckets every reducer shares, and the CPU reducer: the
 * posting protocol and the thread that averages each bucket across the
 * replicas' gradient buffers. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "bigbatch/queue.h"
#include "bigbatch/world.h"
#include "reducer.h"

bb_status bb_reducer_init_shared(reducer_t *r, const reducer_args *a)
{
    bb_buckets b;
    BB_TRY(bb_buckets_make(a->model, a->bucket_bytes, &b));
    r->devices = a->spec->count;
    r->buckets = b.count, r->lo = b.lo, r->hi = b.hi;
    r->shards = a->shards;
    r->first_owner = a->spec->rank * a->spec->count;
    bool same = !a->shards || a->shards->buckets.count == b.count;
    for (int k = 0; same && a->shards && k < b.count; k++)
        same = a->shards->buckets.lo[k] == b.lo[k] && a->shards->buckets.hi[k] == b.hi[k];
    return same ? BB_OK : bb_fail(BB_ERR_ARG, "the ZeRO shards were cut on other gradient buckets than the reducer's");
}

void bb_reducer_free_buckets(reducer_t *r)
{
    bb_buckets_free(&(bb_buckets){.count = r->buckets, .lo = r->lo, .hi = r->hi});
    r->lo = r->hi = NULL;
}

bb_status bb_reducer_device_buckets(const reducer_t *r, const reducer_args *a, int d, float **slots, size_t *shard_at)
{
    size_t prior = 0; /* ZeRO-2: the device's slices of the buckets before b */
    for (int b = 0; b < r->buckets; b++) {
        slots[b] = a->window_models ? bb_model_grad_bucket(a->window_models[d], a->bucket_bytes, b)
                                    : a->grads[d] + r->lo[b];
        if (!slots[b]) return bb_fail(BB_ERR_INTERNAL, "the gradient window was cut on other buckets than the reducer's");
        if (!a->window_models || !shard_at) continue;
        size_t lo, hi;
        bb_param_shards_slice(a->shards, b, r->first_owner + d, &lo, &hi);
        shard_at[b] = prior;
        prior += hi - lo;
    }
    return BB_OK;
}

static bb_status sum_over_processes(void *ctx, float *host, size_t n)
{
    (void)ctx;
    return bb_world_sum_floats(host, n);
}

bb_state_gather bb_reducer_state_gather(void) { return (bb_state_gather){sum_over_processes, NULL}; }

bb_status bb_reducer_create(const reducer_args *a, reducer_t **out)
{
    *out = NULL;
    if (a->spec->count < 2 && a->spec->world < 2) return BB_OK;
    return a->spec->kind == BB_DEVICE_CUDA ? bb_reducer_create_nccl(a, out) : bb_reducer_create_cpu(a, out);
}

/* ---- the CPU reducer --------------------------------------------------- */
#define CHUNK 8192 /* floats averaged at a time: 32 KiB, stays in L1/L2 */

typedef struct cpu_reducer {
    reducer_t base;
    float **slots, **params;      /* slots: (devices × buckets) each bucket's first gradient */
    float **shard_grads;          /* ZeRO-2: per device, its optimizer's shard gradients; NULL: none */
    float **shard_params;         /* ZeRO-3: per device, its optimizer's master weights; NULL: none */
    size_t *gather_parts;         /* ZeRO-3 over processes: per device, 2 × world: its gather's process parts */
    size_t *shard_at;             /* ZeRO-2: (devices × buckets) where the owner's slice starts there */
    int accumulation;             /* rounds a step: ZeRO-2's micro-steps, else 1 */
    _Atomic uint32_t *posted;     /* per bucket: posts so far (grows by devices per step) */
    _Atomic uint32_t reduced;     /* buckets averaged so far (grows by buckets per step) */
    int *next_bucket;             /* per device: the next bucket it will post this round */
    uint32_t *rounds;             /* per device: rounds it has posted in full (a round: a step, ZeRO-2 a micro-step) */
    uint64_t *span_start, *span_end; /* per bucket, the last step */
    double *squares;              /* per bucket: sum of squares of its average, the last step */
    double *device_squares;       /* (devices × buckets): each device's own gradient's, the last step's rounds */
    float *acc;                   /* CHUNK floats; a whole bucket with several processes */
    size_t *part_lo, *part_hi;    /* ZeRO-1 over processes: each process's floats of the bucket being gathered */
    int world;                    /* processes of the job (spec->world) */
    bb_trace_t *trace;
    int track;
    uint64_t first_step;
    pthread_t thread;
    bool started;
    /* the scalar collectives: every device's value of the current round */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    double *values, result;
    int arrived;
    uint64_t round;
} cpu_reducer;

static bool stopping(const cpu_reducer *c) { return __atomic_load_n(&c->base.stop, __ATOMIC_SEQ_CST); }

/* The reducer's own failure: the workers' waits return and report it. */
static void fail_reducer(cpu_reducer *c)
{
    reducer_t *r = &c->base;
    if (r->failure == BB_OK) {
        snprintf(r->failure_message, sizeof r->failure_message, "%s", bb_error_message());
        r->failure = BB_ERR_DEVICE;
    }
    r->ops->abort(r);
}

/* Device d's gradient at float k of bucket b (k in [lo[b], hi[b])). */
static float *grad_at(const cpu_reducer *c, int d, int b, size_t k)
{
    return c->slots[(size_t)d * c->base.buckets + b] + (k - c->base.lo[b]);
}

/* acc, the average of the bucket's floats [k, k + n), into every device's
 * buffer; with ZeRO-1 only into each device's own slice; with ZeRO-2 into
 * its slice of its shard's gradients. */
static void store_average(const cpu_reducer *c, int bucket, size_t k, size_t n, const float *acc)
{
    for (int d = 0; d < c->base.devices; d++) {
        size_t a = k, b = k + n, slo = 0, shi;
        if (c->base.shards) {
            bb_param_shards_slice(c->base.shards, bucket, c->base.first_owner + d, &slo, &shi);
            a = slo > a ? slo : a, b = shi < b ? shi : b;
        }
        float *to = c->shard_grads ? c->shard_grads[d] + c->shard_at[(size_t)d * c->base.buckets + bucket] + (a - slo)
                                   : grad_at(c, d, bucket, a);
        if (a < b) memcpy(to, acc + (a - k), (b - a) * sizeof *acc);
    }
}

/* ZeRO-2: acc, the sum over the devices of micro-step `micro`'s floats
 * [k, k + n) of the bucket, added to the step's earlier micro-steps in
 * each owner's shard gradients (this process's owners), and on the last
 * micro-step times 1/devices: the result there and back in acc. */
static void accumulate_shards(const cpu_reducer *c, int bucket, size_t k, size_t n, float *acc, int micro, float inv)
{
    bool add = micro > 0, last = micro == c->accumulation - 1;
    for (int d = 0; d < c->base.devices; d++) {
        size_t slo, shi;
        bb_param_shards_slice(c->base.shards, bucket, c->base.first_owner + d, &slo, &shi);
        size_t a = slo > k ? slo : k, b = shi < k + n ? shi : k + n;
        float *to = c->shard_grads[d] + c->shard_at[(size_t)d * c->base.buckets + bucket];
        for (size_t i = a; i < b; i++) {
            float v = add ? to[i - slo] + acc[i - k] : acc[i - k];
            to[i - slo] = acc[i - k] = last ? v * inv : v;
        }
    }
}

/* ZeRO over processes: each process's part of bucket b (its owners'
 * slices, contiguous, in rank order) into part_lo/part_hi, less `base`. */
static void process_parts(const cpu_reducer *c, int b, size_t base, size_t *part_lo, size_t *part_hi)
{
    const bb_param_shards *sh = c->base.shards;
    int per = c->base.devices;
    for (int p = 0; p < c->world; p++) {
        size_t lo, hi;
        bb_param_shards_slice(sh, b, p * per, &lo, &hi), part_lo[p] = lo - base;
        bb_param_shards_slice(sh, b, p * per + per - 1, &lo, &hi), part_hi[p] = hi - base;
    }
}

/* The sums of squares of every device's own gradients of [lo, lo + n) of
 * the bucket, before they are summed (the noise scale's small batches),
 * added over the step's rounds. */
static void add_device_squares(cpu_reducer *c, int bucket, size_t lo, size_t n)
{
    for (int d = 0; d < c->base.devices; d++)
        c->device_squares[(size_t)d * c->base.buckets + bucket] += bb_host_sum_squares(grad_at(c, d, bucket, lo), n);
}

/* Several processes: this process's devices summed in device order, the
 * sums summed over the processes (MPI, one call per bucket: an all-reduce,
 * or under ZeRO-2 with accumulation a reduce-scatter of the processes'
 * parts), then the average over all the job's devices stored
 * (store_average) or added into the shards (accumulate_shards). */
static bb_status average_world(cpu_reducer *c, int bucket, size_t lo, size_t hi, int micro, double *squares)
{
    int devices = c->base.devices;
    size_t n = hi - lo;
    float *acc = c->acc;
    add_device_squares(c, bucket, lo, n);
    memcpy(acc, grad_at(c, 0, bucket, lo), n * sizeof *acc);
    for (int d = 1; d < devices; d++) {
        const float *g = grad_at(c, d, bucket, lo);
        for (size_t i = 0; i < n; i++) acc[i] += g[i];
    }
    float inv = 1.0f / (float)(devices * c->world);
    if (c->accumulation > 1) { /* ZeRO-2 over micro-steps: each process sums and keeps its owners' part only */
        process_parts(c, bucket, lo, c->part_lo, c->part_hi);
        BB_TRY(bb_world_reduce_scatter_floats(acc, c->part_lo, c->part_hi));
        accumulate_shards(c, bucket, lo, n, acc, micro, inv);
        return BB_OK;
    }
    BB_TRY(bb_world_sum_floats(acc, n));
    for (size_t i = 0; i < n; i++) acc[i] *= inv;
    store_average(c, bucket, lo, n, acc);
    for (size_t k = 0; k < n; k += CHUNK) *squares += bb_host_sum_squares(acc + k, n - k < CHUNK ? n - k : CHUNK);
    return BB_OK;
}

/* The bucket's average into every device's buffer (ZeRO-1: its owner's
 * slice), and the average's sum of squares into c->squares[bucket], added
 * chunk by chunk (the same chunks with one process or several) while the
 * chunk is in cache: the gradient norm costs no pass of its own. */
static void average(cpu_reducer *c, int bucket, size_t lo, size_t hi, int micro)
{
    double *squares = &c->squares[bucket];
    *squares = 0.0;
    for (int d = 0; micro == 0 && d < c->base.devices; d++) c->device_squares[(size_t)d * c->base.buckets + bucket] = 0;
    if (c->world > 1) {
        if (average_world(c, bucket, lo, hi, micro, squares) != BB_OK) fail_reducer(c);
        return;
    }
    int devices = c->base.devices;
    float inv = 1.0f / (float)devices;
    for (size_t k = lo; k < hi; k += CHUNK) {
        size_t n = hi - k < CHUNK ? hi - k : CHUNK;
        float *acc = c->acc;
        add_device_squares(c, bucket, k, n);
        memcpy(acc, grad_at(c, 0, bucket, k), n * sizeof *acc);
        for (int d = 1; d < devices; d++) { /* fixed order: the same sum every run */
            const float *g = grad_at(c, d, bucket, k);
            for (size_t i = 0; i < n; i++) acc[i] += g[i];
        }
        if (c->shard_grads) { /* ZeRO-2: every owner is here, so acc ends as the whole average */
            accumulate_shards(c, bucket, k, n, acc, micro, inv);
            if (micro == c->accumulation - 1) *squares += bb_host_sum_squares(acc, n);
            continue;
        }
        for (size_t i = 0; i < n; i++) acc[i] *= inv;
        *squares += bb_host_sum_squares(acc, n);
        store_average(c, bucket, k, n, acc);
    }
}

/* counter < target, modulo 2^32 */
static bool below(uint32_t counter, uint32_t target) { return (int32_t)(counter - target) < 0; }

static void *reducer_main(void *arg)
{
    cpu_reducer *c = arg;
    reducer_t *r = &c->base;
    for (uint64_t round = 1;; round++) {
        int micro = (int)((round - 1) % (uint64_t)c->accumulation);
        int64_t step = (int64_t)(c->first_step + (round - 1) / (uint64_t)c->accumulation + 1);
        for (int b = 0; b < r->buckets; b++) {
            uint32_t target = (uint32_t)(r->devices * round), v;
            while (below(v = atomic_load_explicit(&c->posted[b], memory_order_acquire), target)) {
                if (stopping(c)) return NULL;
                bb_futex_wait(&c->posted[b], v);
            }
            if (stopping(c)) return NULL;
            uint64_t t0 = bb_clock_ns();
            average(c, b, r->lo[b], r->hi[b], micro);
            c->span_start[b] = t0;
            c->span_end[b] = bb_clock_ns();
            bb_trace_add(c->trace, c->track, "reduce", t0, c->span_end[b], step, b);
            atomic_fetch_add_explicit(&c->reduced, 1, memory_order_release);
            bb_futex_wake(&c->reduced, INT_MAX);
        }
    }
}

static void cpu_destroy(reducer_t *r)
{
    cpu_reducer *c = (cpu_reducer *)r;
    if (c->started) {
        __atomic_store_n(&r->stop, 1, __ATOMIC_SEQ_CST);
        /* Move every word the thread may sleep on, then wake it. */
        for (int b = 0; b < r->buckets; b++) {
            atomic_fetch_add(&c->posted[b], 1);
            bb_futex_wake(&c->posted[b], INT_MAX);
        }
        pthread_join(c->thread, NULL);
    }
    bb_reducer_free_buckets(r);
    free(c->slots), free(c->params), free(c->shard_grads), free(c->shard_params), free(c->gather_parts), free(c->shard_at), free((void *)c->posted), free(c->next_bucket), free(c->rounds);
    free(c->span_start), free(c->span_end), free(c->squares), free(c->device_squares), free(c->acc), free(c->values), free(c->part_lo),
        free(c->part_hi);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
    free(c);
}

static void cpu_post(reducer_t *r, int device, size_t ready_from)
{
    cpu_reducer *c = (cpu_reducer *)r;
    int *next = &c->next_bucket[device];
    for (; *next < r->buckets && r->lo[*next] >= ready_from; (*next)++) {
        atomic_fetch_add_explicit(&c->posted[*next], 1, memory_order_release);
        bb_futex_wake(&c->posted[*next], 1);
    }
    if (*next == r->buckets) *next = 0, c->rounds[device]++;
}

/* Until `reduced` reaches target (modulo 2^32) or the reducer stops. */
static void wait_reduced(cpu_reducer *c, uint32_t target)
{
    uint32_t v;
    while (below(v = atomic_load_explicit(&c->reduced, memory_order_acquire), target) && !stopping(c))
        bb_futex_wait_timeout(&c->reduced, v, 100000000); /* re-checks stop at least every 100 ms */
}

/* ZeRO-2: waits for the reduction of the slot's previous tenant
 * (reductions run in round and bucket order: one counter says it). */
static void cpu_window_write(reducer_t *r, int device, int bucket, size_t final_from)
{
    cpu_reducer *c = (cpu_reducer *)r;
    cpu_post(r, device, final_from);
    bool this_round;
    int tenant = bb_reducer_window_tenant(r, bucket, &this_round);
    uint32_t target = c->rounds[device] * (uint32_t)r->buckets; /* the previous round's, all of them */
    wait_reduced(c, this_round ? target + (uint32_t)tenant + 1 : target);
}

static uint64_t cpu_wait(reducer_t *r, int device)
{
    cpu_reducer *c = (cpu_reducer *)r;
    uint64_t t0 = bb_clock_ns();
    wait_reduced(c, c->rounds[device] * (uint32_t)r->buckets); /* every round it posted */
    return bb_clock_ns() - t0;
}

static void cpu_abort(reducer_t *r)
{
    cpu_reducer *c = (cpu_reducer *)r;
    __atomic_store_n(&r->stop, 1, __ATOMIC_SEQ_CST);
    bb_futex_wake(&c->reduced, INT_MAX);
    for (int b = 0; b < r->buckets; b++) bb_futex_wake(&c->posted[b], INT_MAX);
    pthread_mutex_lock(&c->lock);
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

/* One round of a scalar collective: the last device to arrive computes the
 * result from every device's value (mean: in device order; else device
 * 0's), the others wait for it. false when the reducer was aborted. */
static bool exchange(cpu_reducer *c, int device, double value, bool mean, double *out, bb_status (*last)(cpu_reducer *))
{
    reducer_t *r = &c->base;
    pthread_mutex_lock(&c->lock);
    if (stopping(c)) { /* aborted: a round may be half joined for ever */
        pthread_mutex_unlock(&c->lock);
        return false;
    }
    c->values[device] = value;
    uint64_t round = c->round;
    if (++c->arrived == r->devices && last && last(c) != BB_OK) {
        pthread_mutex_unlock(&c->lock);
        fail_reducer(c);
        return false;
    }
    if (c->arrived == r->devices) {
        double v = mean ? 0 : c->values[0];
        for (int d = 0; mean && d < r->devices; d++) v += c->values[d] / r->devices;
        /* across processes: the mean of the processes' means, or rank 0's */
        bb_status rc = c->world == 1 ? BB_OK
                       : mean        ? bb_world_sum_doubles(&v, 1)
                                     : bb_world_broadcast_doubles(&v, 1, 0);
        if (rc != BB_OK) {
            pthread_mutex_unlock(&c->lock);
            fail_reducer(c);
            return false;
        }
        c->result = mean && c->world > 1 ? v / c->world : v;
        c->arrived = 0;
        c->round++;
        pthread_cond_broadcast(&c->cond);
    }
    while (round == c->round && !stopping(c)) pthread_cond_wait(&c->cond, &c->lock);
    bool done = round != c->round;
    *out = c->result;
    pthread_mutex_unlock(&c->lock);
    return done;
}

static double cpu_allreduce_scalar(reducer_t *r, int device, double value)
{
    double v;
    return exchange((cpu_reducer *)r, device, value, true, &v, NULL) ? v : NAN;
}

static bool cpu_broadcast_stop(reducer_t *r, int device, bool stop)
{
    double v;
    return !exchange((cpu_reducer *)r, device, stop ? 1 : 0, false, &v, NULL) || v != 0;
}

/* Across processes, by the last device of this process to arrive: the
 * process's own slices (its devices') are in every local replica already;
 * bucket by bucket, each process's part (its owners' slices, contiguous)
 * goes to every process (MPI's all-gather, in device 0's replica), which
 * is then copied into the others. */
static bb_status gather_world(cpu_reducer *c)
{
    reducer_t *r = &c->base;
    for (int b = 0; b < r->buckets; b++) {
        process_parts(c, b, 0, c->part_lo, c->part_hi);
        BB_TRY(bb_world_allgather_floats(c->params[0], c->part_lo, c->part_hi));
        for (int d = 1; d < r->devices; d++)
            memcpy(c->params[d] + r->lo[b], c->params[0] + r->lo[b], (r->hi[b] - r->lo[b]) * sizeof(float));
    }
    return BB_OK;
}

/* Each device copies its slices into the other replicas (disjoint writes;
 * over processes into device 0's only, which gather_world completes and
 * copies on), then all meet, as in a scalar round, before any reads its
 * weights. */
static bool cpu_allgather(reducer_t *r, int device)
{
    cpu_reducer *c = (cpu_reducer *)r;
    for (int b = 0; b < r->buckets; b++) {
        size_t lo, hi;
        bb_param_shards_slice(r->shards, b, r->first_owner + device, &lo, &hi);
        for (int e = 0; c->params[device] && e < (c->world > 1 ? 1 : r->devices); e++)
            if (e != device && hi > lo) memcpy(c->params[e] + lo, c->params[device] + lo, (hi - lo) * sizeof(float));
    }
    double v; /* ZeRO-3 (no replicas' weights): a meeting alone, the gathers come with each use */
    return exchange(c, device, 0, false, &v, c->world > 1 && c->params[0] ? gather_world : NULL);
}

/* ZeRO-3: this process's owners' slices straight from their master
 * weights (the process's part of the bucket) and, over processes, the
 * other processes' parts by an all-gather on the device's own channel
 * (every process's device d gathers the same buckets in the same order).
 * The owners wrote their weights in the last optimizer step, before the
 * allgather's meeting; they write them again only after every device
 * posted all of this step's buckets, after its last gather. */
static bb_status cpu_gather(reducer_t *r, int device, bb_gather_phase phase, int bucket, size_t lo, size_t n,
                            float *slot)
{
    cpu_reducer *c = (cpu_reducer *)r;
    if (phase == BB_GATHER_WAIT) return BB_OK; /* the copies are done */
    if (!c->shard_params || lo != r->lo[bucket] || n != r->hi[bucket] - r->lo[bucket])
        return bb_fail(BB_ERR_INTERNAL, "the parameter window was cut on other buckets than the reducer's, or the "
                       "reducer keeps no master weights");
    for (int k = 0; k < r->devices; k++) {
        size_t a, b;
        bb_param_shards_slice(r->shards, bucket, r->first_owner + k, &a, &b);
        if (b > a)
            memcpy(slot + (a - lo), c->shard_params[k] + c->shard_at[(size_t)k * r->buckets + bucket],
                   (b - a) * sizeof *slot);
    }
    if (c->world < 2) return BB_OK;
    size_t *part_lo = c->gather_parts + (size_t)device * 2 * c->world, *part_hi = part_lo + c->world;
    process_parts(c, bucket, lo, part_lo, part_hi);
    return bb_world_allgather_floats_on(device, slot, part_lo, part_hi);
}

static void cpu_last_step(const reducer_t *r, uint64_t until_ns, uint64_t *busy_ns, uint64_t *overlapped_ns)
{
    const cpu_reducer *c = (const cpu_reducer *)r;
    *busy_ns = *overlapped_ns = 0;
    for (int b = 0; b < r->buckets; b++) {
        *busy_ns += c->span_end[b] - c->span_start[b];
        uint64_t end = c->span_end[b] < until_ns ? c->span_end[b] : until_ns;
        if (end > c->span_start[b]) *overlapped_ns += end - c->span_start[b];
    }
}

/* After cpu_wait: the buckets' sums in bucket order (not kept by ZeRO-2
 * over processes with accumulation: a process holds its owners' sums only). */
static bool cpu_sum_squares(const reducer_t *r, double *out)
{
    const cpu_reducer *c = (const cpu_reducer *)r;
    if (c->world > 1 && c->accumulation > 1) return false;
    double s = 0.0;
    for (int b = 0; b < r->buckets; b++) s += c->squares[b];
    *out = s;
    return true;
}

/* After cpu_wait: the device's own sums, in bucket order. */
static bool cpu_device_squares(const reducer_t *r, int device, double *out)
{
    const cpu_reducer *c = (const cpu_reducer *)r;
    double s = 0.0;
    for (int b = 0; b < r->buckets; b++) s += c->device_squares[(size_t)device * r->buckets + b];
    *out = s;
    return true;
}

static const reducer_ops cpu_ops = {.destroy = cpu_destroy,
                                    .post = cpu_post,
                                    .wait = cpu_wait,
                                    .abort = cpu_abort,
                                    .last_step = cpu_last_step,
                                    .allreduce_scalar = cpu_allreduce_scalar,
                                    .broadcast_stop = cpu_broadcast_stop,
                                    .allgather = cpu_allgather,
                                    .sum_squares = cpu_sum_squares,
                                    .device_squares = cpu_device_squares,
                                    .window_write = cpu_window_write,
                                    .gather = cpu_gather};

static bb_status start_thread(cpu_reducer *c)
{
    BB_PTHREAD(pthread_create(&c->thread, NULL, reducer_main, c));
    c->started = true;
    return BB_OK;
}

bb_status bb_reducer_create_cpu(const reducer_args *a, reducer_t **out)
{
    *out = NULL;
    cpu_reducer *c = calloc(1, sizeof *c);
    if (!c) return bb_fail(BB_ERR_NOMEM, "out of memory");
    reducer_t *r = &c->base;
    int devices = a->spec->count;
    r->ops = &cpu_ops;
    c->trace = a->trace;
    c->track = a->track;
    c->first_step = a->first_step;
    c->world = a->spec->world > 1 ? a->spec->world : 1;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    bb_status rc = bb_reducer_init_shared(r, a);
    c->accumulation = a->window_models && a->accumulation > 1 ? a->accumulation : 1;
    c->values = calloc((size_t)devices, sizeof *c->values);
    c->slots = calloc((size_t)devices * (size_t)(r->buckets + 1), sizeof *c->slots);
    c->params = calloc((size_t)devices, sizeof *c->params);
    c->posted = calloc((size_t)r->buckets + 1, sizeof *c->posted);
    c->next_bucket = calloc((size_t)devices, sizeof *c->next_bucket);
    c->rounds = calloc((size_t)devices, sizeof *c->rounds);
    c->span_start = calloc((size_t)r->buckets + 1, sizeof *c->span_start);
    c->span_end = calloc((size_t)r->buckets + 1, sizeof *c->span_end);
    c->squares = calloc((size_t)r->buckets + 1, sizeof *c->squares);
    c->device_squares = calloc((size_t)devices * (size_t)r->buckets + 1, sizeof *c->device_squares);
    size_t acc = CHUNK;
    for (int b = 0; c->world > 1 && b < r->buckets; b++) acc = r->hi[b] - r->lo[b] > acc ? r->hi[b] - r->lo[b] : acc;
    c->acc = malloc(acc * sizeof *c->acc);
    if (a->shards && c->world > 1 &&
        (!(c->part_lo = calloc((size_t)c->world, sizeof *c->part_lo)) ||
         !(c->part_hi = calloc((size_t)c->world, sizeof *c->part_hi))))
        rc = rc == BB_OK ? bb_fail(BB_ERR_NOMEM, "out of memory") : rc;
    if (rc == BB_OK && a->window_models &&
        (!(c->shard_grads = calloc((size_t)devices, sizeof *c->shard_grads)) ||
         !(c->shard_at = calloc((size_t)devices * (size_t)r->buckets, sizeof *c->shard_at)) ||
         (a->shard_params && !(c->shard_params = calloc((size_t)devices, sizeof *c->shard_params))) ||
         (a->shard_params && c->world > 1 &&
          !(c->gather_parts = calloc((size_t)devices * 2 * (size_t)c->world, sizeof *c->gather_parts)))))
        rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    if (rc == BB_OK && a->shard_params) rc = bb_world_open_channels(devices); /* one a device's gathers */
    if (rc == BB_OK && (!c->slots || !c->params || !c->posted || !c->next_bucket || !c->rounds || !c->span_start || !c->span_end || !c->squares ||
                        !c->device_squares ||
                        !c->acc || !c->values))
        rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    for (int d = 0; rc == BB_OK && d < devices; d++) {
        c->params[d] = a->params ? a->params[d] : NULL;
        if (a->window_models) c->shard_grads[d] = a->shard_grads[d];
        if (c->shard_params) c->shard_params[d] = a->shard_params[d];
        rc = bb_reducer_device_buckets(r, a, d, c->slots + (size_t)d * r->buckets,
                                       c->shard_at ? c->shard_at + (size_t)d * r->buckets : NULL);
    }
    if (rc == BB_OK) rc = start_thread(c);
    if (rc != BB_OK) {
        cpu_destroy(r);
        return rc;
    }
    *out = r;
    return BB_OK;
}
