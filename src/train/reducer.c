/* reducer.c — the CPU reducer: buckets, the posting protocol and the thread
 * that averages each bucket across the replicas' gradient buffers. */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "bigbatch/queue.h"
#include "reducer.h"

#define CHUNK 8192 /* floats averaged at a time: 32 KiB, stays in L1/L2 */

struct reducer {
    int devices, buckets;
    float **grads;
    size_t *lo, *hi;              /* bucket b covers floats [lo[b], hi[b]); lo falls with b */
    _Atomic uint32_t *posted;     /* per bucket: posts so far (grows by devices per step) */
    _Atomic uint32_t reduced;     /* buckets averaged so far (grows by buckets per step) */
    _Atomic bool stop;
    int *next_bucket;             /* per device: the next bucket it will post this step */
    uint32_t *rounds;             /* per device: steps it has waited for */
    uint64_t *span_start, *span_end; /* per bucket, the last step */
    float *acc;                   /* CHUNK floats */
    bb_trace_t *trace;
    int track;
    uint64_t first_step;
    pthread_t thread;
    bool started;
};

static void average(reducer_t *r, size_t lo, size_t hi)
{
    float inv = 1.0f / (float)r->devices;
    for (size_t c = lo; c < hi; c += CHUNK) {
        size_t n = hi - c < CHUNK ? hi - c : CHUNK;
        float *acc = r->acc;
        memcpy(acc, r->grads[0] + c, n * sizeof *acc);
        for (int d = 1; d < r->devices; d++) { /* fixed order: the same sum every run */
            const float *g = r->grads[d] + c;
            for (size_t i = 0; i < n; i++) acc[i] += g[i];
        }
        for (size_t i = 0; i < n; i++) acc[i] *= inv;
        for (int d = 0; d < r->devices; d++) memcpy(r->grads[d] + c, acc, n * sizeof *acc);
    }
}

/* counter < target, modulo 2^32 */
static bool below(uint32_t counter, uint32_t target) { return (int32_t)(counter - target) < 0; }

static void *reducer_main(void *arg)
{
    reducer_t *r = arg;
    for (uint64_t step = 1;; step++) {
        for (int b = 0; b < r->buckets; b++) {
            uint32_t target = (uint32_t)(r->devices * step), v;
            while (below(v = atomic_load_explicit(&r->posted[b], memory_order_acquire), target)) {
                if (atomic_load(&r->stop)) return NULL;
                bb_futex_wait(&r->posted[b], v);
            }
            if (atomic_load(&r->stop)) return NULL;
            uint64_t t0 = bb_clock_ns();
            average(r, r->lo[b], r->hi[b]);
            r->span_start[b] = t0;
            r->span_end[b] = bb_clock_ns();
            bb_trace_add(r->trace, r->track, "reduce", t0, r->span_end[b], (int64_t)(r->first_step + step), b);
            atomic_fetch_add_explicit(&r->reduced, 1, memory_order_release);
            bb_futex_wake(&r->reduced, INT_MAX);
        }
    }
}

bb_status reducer_create(const bb_model_t *m, float *const *grads, int devices, size_t bucket_bytes,
                         uint64_t first_step, bb_trace_t *trace, int track, reducer_t **out)
{
    *out = NULL;
    int tensors = bb_model_tensor_count(m);
    reducer_t *r = calloc(1, sizeof *r);
    if (!r) return bb_fail(BB_ERR_NOMEM, "out of memory");
    r->devices = devices;
    r->trace = trace;
    r->track = track;
    r->first_step = first_step;
    r->grads = calloc((size_t)devices, sizeof *r->grads);
    r->lo = calloc((size_t)tensors, sizeof *r->lo);
    r->hi = calloc((size_t)tensors, sizeof *r->hi);
    r->posted = calloc((size_t)tensors, sizeof *r->posted);
    r->next_bucket = calloc((size_t)devices, sizeof *r->next_bucket);
    r->rounds = calloc((size_t)devices, sizeof *r->rounds);
    r->span_start = calloc((size_t)tensors, sizeof *r->span_start);
    r->span_end = calloc((size_t)tensors, sizeof *r->span_end);
    r->acc = malloc(CHUNK * sizeof *r->acc);
    if (!r->grads || !r->lo || !r->hi || !r->posted || !r->next_bucket || !r->rounds || !r->span_start ||
        !r->span_end || !r->acc) {
        reducer_destroy(r);
        return bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    for (int d = 0; d < devices; d++) r->grads[d] = grads[d];
    /* Tensors from the last to the first; a bucket closes once it holds
     * its share (1 MiB for the first, so the reducer starts early). */
    size_t hi = bb_model_param_count(m), cap = bucket_bytes < (1u << 20) ? bucket_bytes : (size_t)1 << 20;
    for (int t = tensors - 1; t >= 0; t--) {
        size_t lo = bb_model_tensor(m, t)->offset;
        if ((hi - lo) * sizeof(float) >= cap || t == 0) {
            r->lo[r->buckets] = lo;
            r->hi[r->buckets++] = hi;
            hi = lo;
            cap = bucket_bytes;
        }
    }
    int err = pthread_create(&r->thread, NULL, reducer_main, r);
    if (err) {
        reducer_destroy(r);
        return bb_fail(BB_ERR_INTERNAL, "cannot start the reducer thread: error %d", err);
    }
    r->started = true;
    *out = r;
    return BB_OK;
}

void reducer_destroy(reducer_t *r)
{
    if (!r) return;
    if (r->started) {
        atomic_store(&r->stop, true);
        /* Move every word the thread may sleep on, then wake it. */
        for (int b = 0; b < r->buckets; b++) {
            atomic_fetch_add(&r->posted[b], 1);
            bb_futex_wake(&r->posted[b], INT_MAX);
        }
        pthread_join(r->thread, NULL);
    }
    free(r->grads), free(r->lo), free(r->hi), free((void *)r->posted), free(r->next_bucket), free(r->rounds);
    free(r->span_start), free(r->span_end), free(r->acc);
    free(r);
}

int reducer_bucket_count(const reducer_t *r) { return r->buckets; }

void reducer_post(reducer_t *r, int device, size_t ready_from)
{
    int *next = &r->next_bucket[device];
    for (; *next < r->buckets && r->lo[*next] >= ready_from; (*next)++) {
        atomic_fetch_add_explicit(&r->posted[*next], 1, memory_order_release);
        bb_futex_wake(&r->posted[*next], 1);
    }
}

uint64_t reducer_wait(reducer_t *r, int device)
{
    uint64_t t0 = bb_clock_ns();
    uint32_t target = (r->rounds[device] + 1) * (uint32_t)r->buckets, v;
    while (below(v = atomic_load_explicit(&r->reduced, memory_order_acquire), target) && !atomic_load(&r->stop))
        bb_futex_wait_timeout(&r->reduced, v, 100000000); /* re-checks stop at least every 100 ms */
    r->rounds[device]++;
    r->next_bucket[device] = 0;
    return bb_clock_ns() - t0;
}

void reducer_abort(reducer_t *r)
{
    atomic_store(&r->stop, true);
    bb_futex_wake(&r->reduced, INT_MAX);
    for (int b = 0; b < r->buckets; b++) bb_futex_wake(&r->posted[b], INT_MAX);
}

bool reducer_aborted(const reducer_t *r) { return atomic_load(&((reducer_t *)r)->stop); }

void reducer_last_step(const reducer_t *r, uint64_t until_ns, uint64_t *busy_ns, uint64_t *overlapped_ns)
{
    *busy_ns = *overlapped_ns = 0;
    for (int b = 0; b < r->buckets; b++) {
        *busy_ns += r->span_end[b] - r->span_start[b];
        uint64_t end = r->span_end[b] < until_ns ? r->span_end[b] : until_ns;
        if (end > r->span_start[b]) *overlapped_ns += end - r->span_start[b];
    }
}
