// nccl_reducer.cu — the reducer for CUDA replicas: one NCCL communicator
// per GPU of the process, the same buckets as the CPU reducer. A post
// enqueues, for each newly finished bucket, an event on the worker's
// compute stream, a wait for it on the communication stream, and the
// bucket's collective there: ncclAllReduce (average, in place), or with
// ZeRO-1's equal slices ncclReduceScatter (each owner's slice averaged; in
// place when the bucket divides into them, else through a padded staging
// buffer). A wait makes the compute stream wait for the step's last
// reduction: the optimizer is ordered after it on the GPU and the host does
// not block. The gather after the update is ncclAllGather of the equal
// slices (in place or staged the same way), or an ncclBroadcast from each
// owner of whole-tensor slices, whose lengths differ (nccl_gather.cu, with
// ZeRO-3's gathers; nccl_reducer.h is what the two files share).
//
// ZeRO-2 (reducer_args.window_models): every micro-step posts, each
// bucket is reduced as above in its window slot, and the device's averaged
// slice is copied (the step's first micro-step) or added (the others: a
// kernel on the communication stream) into its shard gradients; an event
// per bucket then says its slot is free, which the compute stream waits
// for before the backward writes the slot's next bucket (window_write).
//
// ZeRO-3 (reducer_args.shard_params): besides, the model's parameter window
// gathers each bucket of weights from the owners' master shards into a
// slot, on the communication stream, ahead of its use (n_gather).
//
// Threads. Each worker thread drives only its own communicator, in the same
// bucket order (NCCL's one-thread-per-GPU model), and no lock is held
// across an NCCL call: NCCL connects peers lazily inside the first
// collectives, where one device's call may wait for the others'. The
// communicators are non-blocking (ncclConfig_t.blocking = 0): a call that
// would wait returns ncclInProgress, and its thread polls
// ncclCommGetAsyncError, checking the reducer's stop flag in between. So no
// thread is ever stuck inside NCCL, and a failure elsewhere always reaches
// it. (Blocking communicators would leave a thread inside ncclGroupEnd
// waiting for a peer that failed, where only an abort from another thread,
// racing with that call, could free it.)
//
// Failure. When a worker fails, the others' collectives would wait for it on
// the GPU for ever, and so would their host (every loss read synchronizes).
// An abort sets the stop flag and ends every communicator with
// ncclCommAbort, which ends their pending collectives with an error. Each
// communicator carries a state word (idle, busy in its owner's NCCL call,
// gone): the aborting thread takes down the idle ones itself, and a busy
// owner takes its own down when its call returns and it sees the flag.
// Nothing waits for a lock that a blocked thread holds.
//
// NCCL is loaded with dlopen when a reducer is created (libnccl.so.2, or
// BB_NCCL_LIBRARY), so a CUDA build runs where NCCL is not installed.
#include <dlfcn.h>
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

extern "C" {
#include "bigbatch/world.h"
}
#include "nccl_reducer.h"
#include "cuda_device.cuh" // BB_LAUNCH; after the C headers, which it includes again (guarded)
#include "cuda_kernels.h"  // bbk_sum_squares, bbk_sum_rows

namespace bb_nccl {

// ---- NCCL through dlopen ------------------------------------------------------
nccl_api nccl;
pthread_once_t nccl_once = PTHREAD_ONCE_INIT;
char nccl_error[512]; // empty once loaded
int nccl_version;

void load_nccl()
{
    const char *name = getenv("BB_NCCL_LIBRARY");
    if (!name || !*name) name = "libnccl.so.2";
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(nccl_error, sizeof nccl_error,
                 "the multi-GPU reducer needs NCCL: cannot load %s (%s); install NCCL or set BB_NCCL_LIBRARY to "
                 "its libnccl.so.2", name, dlerror());
        return;
    }
    struct {
        void **fn;
        const char *symbol;
    } table[] = {
        {(void **)&nccl.GetVersion, "ncclGetVersion"},
        {(void **)&nccl.GetUniqueId, "ncclGetUniqueId"},
        {(void **)&nccl.CommInitRankConfig, "ncclCommInitRankConfig"},
        {(void **)&nccl.CommGetAsyncError, "ncclCommGetAsyncError"},
        {(void **)&nccl.CommFinalize, "ncclCommFinalize"},
        {(void **)&nccl.CommDestroy, "ncclCommDestroy"},
        {(void **)&nccl.CommAbort, "ncclCommAbort"},
        {(void **)&nccl.GroupStart, "ncclGroupStart"},
        {(void **)&nccl.GroupEnd, "ncclGroupEnd"},
        {(void **)&nccl.AllReduce, "ncclAllReduce"},
        {(void **)&nccl.Broadcast, "ncclBroadcast"},
        {(void **)&nccl.ReduceScatter, "ncclReduceScatter"},
        {(void **)&nccl.AllGather, "ncclAllGather"},
        {(void **)&nccl.GetErrorString, "ncclGetErrorString"},
    };
    for (auto &e : table)
        if (!(*e.fn = dlsym(h, e.symbol))) {
            snprintf(nccl_error, sizeof nccl_error, "%s has no %s: NCCL 2.14 or later is needed", name, e.symbol);
            dlclose(h);
            return;
        }
    nccl.GetLastError = reinterpret_cast<const char *(*)(ncclComm_t)>(dlsym(h, "ncclGetLastError"));
    if (nccl.GetVersion(&nccl_version) != ncclSuccess) nccl_version = 0;
}

bb_status need_nccl()
{
    pthread_once(&nccl_once, load_nccl);
    return nccl_error[0] ? bb_fail(BB_ERR_UNSUPPORTED, "%s", nccl_error) : BB_OK;
}

// ---- the reducer ------------------------------------------------------------------
// Ends `s`'s communicator if nobody is inside an NCCL call on it; its
// owner does this itself on leaving such a call otherwise.
void take_down(device_side *s)
{
    int idle = COMM_IDLE;
    pthread_mutex_lock(&s->abort_lock);
    if (s->comm && __atomic_compare_exchange_n(&s->state, &idle, COMM_GONE, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        nccl.CommAbort(s->comm);
    pthread_mutex_unlock(&s->abort_lock);
}

void abort_all(nccl_reducer *n)
{
    reducer_t *r = &n->base;
    __atomic_store_n(&r->stop, 1, __ATOMIC_SEQ_CST);
    for (int d = 0; n->dev && d < r->devices; d++) take_down(&n->dev[d]);
}

// Records the reducer's own failure (the first), then aborts everything.
void fail(nccl_reducer *n, const char *what, const char *why)
{
    reducer_t *r = &n->base;
    pthread_mutex_lock(&n->fail_lock);
    if (r->failure == BB_OK) {
        snprintf(r->failure_message, sizeof r->failure_message, "NCCL reducer: %s: %s", what, why);
        r->failure = BB_ERR_DEVICE;
    }
    pthread_mutex_unlock(&n->fail_lock);
    abort_all(n);
}

// An NCCL call of device s failed: the device, the call, NCCL's error and
// its last message (the rank is the log's prefix).
void fail_comm(nccl_reducer *n, device_side *s, const char *what, ncclResult_t rc)
{
    char where[160], why[320];
    snprintf(where, sizeof where, "cuda:%d: %s", s->cuda_device, what);
    snprintf(why, sizeof why, "%s", nccl.GetErrorString(rc));
    pthread_mutex_lock(&s->abort_lock); // not aborted (freed) while asked
    const char *last = nccl.GetLastError && s->comm && __atomic_load_n(&s->state, __ATOMIC_SEQ_CST) != COMM_GONE
                           ? nccl.GetLastError(s->comm)
                           : nullptr;
    if (last && *last) snprintf(why + strlen(why), sizeof why - strlen(why), " (%s)", last);
    pthread_mutex_unlock(&s->abort_lock);
    fail(n, where, why);
}

// The error family's member for the reducer: a failed CUDA call fails the
// reducer (naming the call) and aborts every communicator; true when it
// succeeded.
bool cuda_call_ok(nccl_reducer *n, cudaError_t e, const char *call)
{
    if (e == cudaSuccess) return true;
    cudaGetLastError(); // reported here, not blamed on the next kernel
    fail(n, call, cudaGetErrorString(e));
    return false;
}

// In functions returning bb_status (NCCL's calls outside the step machinery).
#define BB_NCCL(expr)                                                                             \
    do {                                                                                          \
        ncclResult_t bb_nccl_rc_ = (expr);                                                        \
        if (bb_nccl_rc_ != ncclSuccess)                                                           \
            return bb_fail(BB_ERR_DEVICE, "%s: %s", #expr, nccl.GetErrorString(bb_nccl_rc_));     \
    } while (0)

// The owner's side of a communicator: enter before an NCCL call (false: it
// is gone), leave after it (takes it down if an abort came meanwhile).
bool enter(device_side *s)
{
    int idle = COMM_IDLE;
    return __atomic_compare_exchange_n(&s->state, &idle, COMM_BUSY, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

void leave(reducer_t *r, device_side *s)
{
    __atomic_store_n(&s->state, COMM_IDLE, __ATOMIC_SEQ_CST);
    if (stopping(r)) take_down(s);
}

// Waits (inside enter/leave) until the communicator finished the calls made
// so far: ncclSuccess, an error, or ncclInProgress left when the reducer
// stops meanwhile.
ncclResult_t settle(reducer_t *r, device_side *s, ncclResult_t rc)
{
    while (rc == ncclInProgress && !stopping(r)) {
        sched_yield();
        ncclResult_t state = ncclSuccess;
        ncclResult_t q = nccl.CommGetAsyncError(s->comm, &state);
        rc = q != ncclSuccess ? q : state;
    }
    return rc;
}

// One NCCL step on device `s`, e.g. the all-reduce of a bucket: false when
// the reducer stopped or the step failed (then reported and aborted).
bool nccl_step(nccl_reducer *n, device_side *s, ncclResult_t (*call)(void *ctx), void *ctx, const char *what)
{
    reducer_t *r = &n->base;
    if (stopping(r) || !enter(s)) return false;
    ncclResult_t rc = settle(r, s, call(ctx));
    leave(r, s);
    if (rc == ncclSuccess) return true;
    if (rc != ncclInProgress) fail_comm(n, s, what, rc);
    return false;
}

// One bucket's collective (collective, nccl_reducer.h) of `buf` (owners ×
// count floats for the reduce-scatter and the all-gather; in place).
struct bucket_args {
    device_side *s;
    collective kind;
    float *buf;
    size_t count; // the all-reduce's floats; the slices' otherwise
};

ncclResult_t bucket_call(void *ctx)
{
    bucket_args *a = static_cast<bucket_args *>(ctx);
    device_side *s = a->s;
    float *mine = a->buf + (size_t)s->rank * a->count;
    switch (a->kind) {
    case REDUCE_SCATTER: return nccl.ReduceScatter(a->buf, mine, a->count, ncclFloat, ncclAvg, s->comm, s->comm_stream);
    case ALL_GATHER: return nccl.AllGather(mine, a->buf, a->count, ncclFloat, s->comm, s->comm_stream);
    default: return nccl.AllReduce(a->buf, a->buf, a->count, ncclFloat, ncclAvg, s->comm, s->comm_stream);
    }
}

// Bucket b's equal slices (ZeRO-1, BB_PARAM_SHARD_ELEMENTS): reduce-scatters the
// gradients or all-gathers the weights at `x` (the bucket's first float). When the slices fill the bucket
// exactly, in place; else the bucket goes through the staging buffer,
// padded with zeros: copied in (the gather: only this owner's slice), the
// collective, and the result copied back (the reduce-scatter: only the
// owner's slice, so no neighbouring bucket is written). All on the
// communication stream, in order.
bool equal_slices(nccl_reducer *n, device_side *s, int b, collective kind, float *x)
{
    reducer_t *r = &n->base;
    const bb_param_shards *sh = r->shards;
    size_t lo = r->lo[b], len = r->hi[b] - lo, count = sh->count[b], slo, shi;
    bb_param_shards_slice(sh, b, s->rank, &slo, &shi);
    const char *what = kind == REDUCE_SCATTER ? "ncclReduceScatter" : "ncclAllGather";
    if (len == count * (size_t)sh->owners) {
        bucket_args a = {s, kind, x, count};
        return nccl_step(n, s, bucket_call, &a, what);
    }
    cudaStream_t st = s->comm_stream;
    size_t padded = count * (size_t)sh->owners, mine = (size_t)s->rank * count;
    bucket_args a = {s, kind, s->stage, count};
    if (kind == REDUCE_SCATTER)
        return BB_CUDA_REDUCER(n, cudaMemcpyAsync(s->stage, x, len * sizeof(float), cudaMemcpyDeviceToDevice, st)) &&
               BB_CUDA_REDUCER(n, cudaMemsetAsync(s->stage + len, 0, (padded - len) * sizeof(float), st)) &&
               nccl_step(n, s, bucket_call, &a, what) &&
               (shi == slo || BB_CUDA_REDUCER(n, cudaMemcpyAsync(x + (slo - lo), s->stage + mine, (shi - slo) * sizeof(float),
                                                                 cudaMemcpyDeviceToDevice, st)));
    return BB_CUDA_REDUCER(n, cudaMemsetAsync(s->stage + mine, 0, count * sizeof(float), st)) &&
           (shi == slo || BB_CUDA_REDUCER(n, cudaMemcpyAsync(s->stage + mine, x + (slo - lo), (shi - slo) * sizeof(float),
                                                             cudaMemcpyDeviceToDevice, st))) &&
           nccl_step(n, s, bucket_call, &a, what) &&
           BB_CUDA_REDUCER(n, cudaMemcpyAsync(x, s->stage, len * sizeof(float), cudaMemcpyDeviceToDevice, st));
}

__global__ void add_into(float *to, const float *from, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        to[i] += from[i];
}

// ZeRO-2, after bucket b's reduction: the device's averaged slice of it,
// copied (a step's first micro-step) or added into its shard gradients;
// then the slot is free (freed[b]).
bool keep_slice(nccl_reducer *n, device_side *s, int b)
{
    reducer_t *r = &n->base;
    size_t slo, shi;
    bb_param_shards_slice(r->shards, b, s->rank, &slo, &shi);
    const float *from = s->bucket[b] + (slo - r->lo[b]);
    float *to = s->shard_grads + s->shard_at[b];
    size_t len = shi - slo;
    cudaStream_t st = s->comm_stream;
    bool ok = true;
    if (len && s->round % (unsigned)n->accumulation == 0)
        ok = BB_CUDA_REDUCER(n, cudaMemcpyAsync(to, from, len * sizeof(float), cudaMemcpyDeviceToDevice, st));
    else if (len) {
        unsigned blocks = (unsigned)((len + 255) / 256 < 1024 ? (len + 255) / 256 : 1024);
        BB_LAUNCH(add_into, blocks, 256, 0, st)(to, from, len);
        ok = BB_CUDA_REDUCER(n, cudaGetLastError());
    }
    return ok && BB_CUDA_REDUCER(n, cudaEventRecord(s->freed[b], st));
}

constexpr int kOwnPartials = 1024; // block sums of a bucket's squares (bbk_sum_squares' most)

unsigned rounds_of(const nccl_reducer *n) { return n->accumulation ? (unsigned)n->accumulation : 1u; }

// This device's own gradients of bucket b before the reduction: their sum
// of squares into this round's place, queued on the communication stream
// ahead of the collective.
bool own_squares(nccl_reducer *n, device_side *s, int b)
{
    reducer_t *r = &n->base;
    int blocks = 0;
    double *slot = s->own_squares + (size_t)(s->round % rounds_of(n)) * (size_t)r->buckets + b;
    return BB_CUDA_REDUCER(n, bbk_sum_squares(s->comm_stream, s->own_partial, kOwnPartials, &blocks, s->bucket[b],
                                              r->hi[b] - r->lo[b])) &&
           BB_CUDA_REDUCER(n, bbk_sum_rows(s->comm_stream, slot, s->own_partial, blocks));
}

// The reduction of bucket b: equal slices reduce-scattered, else an all-reduce.
bool reduce_bucket(nccl_reducer *n, device_side *s, int b)
{
    reducer_t *r = &n->base;
    bool ok = own_squares(n, s, b);
    if (!ok) return false;
    if (r->shards && r->shards->rule == BB_PARAM_SHARD_ELEMENTS) {
        ok = equal_slices(n, s, b, REDUCE_SCATTER, s->bucket[b]);
    } else {
        bucket_args a = {s, ALL_REDUCE, s->bucket[b], r->hi[b] - r->lo[b]};
        ok = nccl_step(n, s, bucket_call, &a, "ncclAllReduce");
    }
    return ok && (!n->accumulation || keep_slice(n, s, b));
}

ncclResult_t async_error(void *ctx)
{
    device_side *s = static_cast<device_side *>(ctx);
    ncclResult_t state = ncclSuccess, rc = nccl.CommGetAsyncError(s->comm, &state);
    return rc != ncclSuccess ? rc : state;
}

// Finalizes every live communicator (all of them first: finalizing may
// wait for the other ranks'), waits for them, at most 60 s, then frees
// them; one that fails or does not finish in time is aborted.
constexpr int kMaxDevices = 64; // the trainer's BB_TRAIN_MAX_DEVICES; checked at creation

void finalize_all(nccl_reducer *n)
{
    reducer_t *r = &n->base;
    int devices = n->dev ? r->devices : 0;
    ncclResult_t state[kMaxDevices]; // ncclInvalidUsage: none, or already gone
    for (int d = 0; d < devices; d++) {
        device_side *s = &n->dev[d];
        bool live = s->comm && __atomic_load_n(&s->state, __ATOMIC_SEQ_CST) != COMM_GONE;
        if (live) cudaSetDevice(s->cuda_device);
        state[d] = live ? nccl.CommFinalize(s->comm) : ncclInvalidUsage;
    }
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (bool waiting = true; waiting;) {
        waiting = false;
        clock_gettime(CLOCK_MONOTONIC, &now);
        bool late = now.tv_sec - t0.tv_sec > 60;
        for (int d = 0; d < devices; d++) {
            if (state[d] != ncclInProgress) continue;
            ncclResult_t async = ncclSuccess;
            ncclResult_t q = nccl.CommGetAsyncError(n->dev[d].comm, &async);
            state[d] = q != ncclSuccess ? q : late && async == ncclInProgress ? ncclSystemError : async;
            waiting |= state[d] == ncclInProgress;
        }
        if (waiting) sched_yield();
    }
    for (int d = 0; d < devices; d++) {
        device_side *s = &n->dev[d];
        if (state[d] == ncclInvalidUsage) continue;
        cudaSetDevice(s->cuda_device);
        if (state[d] == ncclSuccess) nccl.CommDestroy(s->comm);
        else nccl.CommAbort(s->comm);
    }
}

// The watchdog's hooks (its thread, under its lock): an asynchronous error
// in any communicator (a peer that died, a network error) fails the reducer
// and aborts every communicator, even while every worker waits on its GPU;
// on a timeout, every communicator is aborted before the process ends.
void watchdog_poll(void *ctx)
{
    nccl_reducer *n = static_cast<nccl_reducer *>(ctx);
    for (int d = 0; d < n->base.devices && !stopping(&n->base); d++) {
        device_side *s = &n->dev[d];
        ncclResult_t state = ncclSuccess, rc = ncclSuccess;
        pthread_mutex_lock(&s->abort_lock); // not aborted (freed) while asked
        if (s->comm && __atomic_load_n(&s->state, __ATOMIC_SEQ_CST) != COMM_GONE)
            rc = nccl.CommGetAsyncError(s->comm, &state);
        pthread_mutex_unlock(&s->abort_lock);
        if (rc == ncclSuccess) rc = state;
        if (rc != ncclSuccess && rc != ncclInProgress) fail_comm(n, s, "its communicator's asynchronous error", rc);
    }
}

void watchdog_abort(void *ctx) { abort_all(static_cast<nccl_reducer *>(ctx)); }

void n_destroy(reducer_t *r)
{
    nccl_reducer *n = of(r);
    bb_watchdog_remove_hooks(n->watchdog, n);
    finalize_all(n);
    for (int d = 0; n->dev && d < r->devices; d++) {
        device_side *s = &n->dev[d];
        cudaSetDevice(s->cuda_device);
        if (s->ready) cudaEventDestroy(s->ready);
        if (s->done) cudaEventDestroy(s->done);
        if (s->scalar) cudaFree(s->scalar);
        if (s->host_scalar) cudaFreeHost(s->host_scalar);
        if (s->own_squares) cudaFree(s->own_squares);
        if (s->own_partial) cudaFree(s->own_partial);
        if (s->host_own_squares) cudaFreeHost(s->host_own_squares);
        if (s->stage) cudaFree(s->stage);
        for (int b = 0; b < r->buckets; b++) {
            if (s->freed && s->freed[b]) cudaEventDestroy(s->freed[b]);
            if (s->gathered && s->gathered[b]) cudaEventDestroy(s->gathered[b]);
        }
        free(s->freed), free(s->gathered), free(s->bucket), free(s->shard_at);
        pthread_mutex_destroy(&s->abort_lock); // zeroed (never initialized) is the default mutex
    }
    if (n->dev) cudaSetDevice(n->dev[0].cuda_device);
    for (int b = 0; b < r->buckets; b++) {
        if (n->start && n->start[b]) cudaEventDestroy(n->start[b]);
        if (n->end && n->end[b]) cudaEventDestroy(n->end[b]);
    }
    if (n->backward_end) cudaEventDestroy(n->backward_end);
    free(n->start), free(n->end), free(n->dev);
    bb_reducer_free_buckets(r);
    pthread_mutex_destroy(&n->fail_lock);
    free(n);
}

void n_post(reducer_t *r, int device, size_t ready_from)
{
    nccl_reducer *n = of(r);
    device_side *s = &n->dev[device];
    cudaSetDevice(s->cuda_device);
    bool ok = !stopping(r);
    if (ok && device == 0 && ready_from == 0) ok = BB_CUDA_REDUCER(n, cudaEventRecord(n->backward_end, s->compute));
    for (; ok && s->next_bucket < r->buckets && r->lo[s->next_bucket] >= ready_from; s->next_bucket++) {
        int b = s->next_bucket;
        ok = BB_CUDA_REDUCER(n, cudaEventRecord(s->ready, s->compute)) &&
             BB_CUDA_REDUCER(n, cudaStreamWaitEvent(s->comm_stream, s->ready, 0)) &&
             (device != 0 || BB_CUDA_REDUCER(n, cudaEventRecord(n->start[b], s->comm_stream))) &&
             reduce_bucket(n, s, b) &&
             (device != 0 || BB_CUDA_REDUCER(n, cudaEventRecord(n->end[b], s->comm_stream)));
    }
    if (s->next_bucket == r->buckets) s->next_bucket = 0, s->round++;
}

// ZeRO-2: what is final goes out, and the compute stream waits until the
// slot's previous tenant (bb_reducer_window_tenant) has been read out: its
// event's last record, this round's or the previous round's (an event
// never recorded is no wait).
void n_window_write(reducer_t *r, int device, int bucket, size_t final_from)
{
    nccl_reducer *n = of(r);
    device_side *s = &n->dev[device];
    n_post(r, device, final_from);
    bool this_round;
    int tenant = bb_reducer_window_tenant(r, bucket, &this_round);
    if (!stopping(r)) BB_CUDA_REDUCER(n, cudaStreamWaitEvent(s->compute, s->freed[tenant], 0));
}

uint64_t n_wait(reducer_t *r, int device)
{
    nccl_reducer *n = of(r);
    device_side *s = &n->dev[device];
    cudaSetDevice(s->cuda_device);
    bool ok = nccl_step(n, s, async_error, s, "an all-reduce") &&
              BB_CUDA_REDUCER(n, cudaEventRecord(s->done, s->comm_stream)) &&
              BB_CUDA_REDUCER(n, cudaStreamWaitEvent(s->compute, s->done, 0));
    if (ok && device == 0) n->timed = true;
    return 0;
}

void n_abort(reducer_t *r) { abort_all(of(r)); }

// Measured on device 0 against its backward's end. The trainer calls this
// after the optimizer read the gradient norm, which synchronized the
// compute stream, so every event of the step has completed.
void n_last_step(const reducer_t *r, uint64_t until_ns, uint64_t *busy_ns, uint64_t *overlapped_ns)
{
    (void)until_ns;
    const nccl_reducer *n = reinterpret_cast<const nccl_reducer *>(r);
    *busy_ns = *overlapped_ns = 0;
    if (!n->timed) return;
    cudaSetDevice(n->dev[0].cuda_device);
    for (int b = 0; b < r->buckets; b++) {
        float start_ms, end_ms;
        if (cudaEventElapsedTime(&start_ms, n->backward_end, n->start[b]) != cudaSuccess ||
            cudaEventElapsedTime(&end_ms, n->backward_end, n->end[b]) != cudaSuccess) {
            cudaGetLastError();
            return;
        }
        // times relative to the backward's end: negative means before it
        if (end_ms > start_ms) *busy_ns += (uint64_t)((end_ms - start_ms) * 1e6);
        float overlap_end = end_ms < 0 ? end_ms : 0;
        if (overlap_end > start_ms) *overlapped_ns += (uint64_t)((overlap_end - start_ms) * 1e6);
    }
}

struct scalar_args {
    device_side *s;
    bool broadcast;
};

ncclResult_t scalar_call(void *ctx)
{
    scalar_args *a = static_cast<scalar_args *>(ctx);
    device_side *s = a->s;
    return a->broadcast ? nccl.Broadcast(s->scalar, s->scalar, 1, ncclDouble, 0, s->comm, s->comm_stream)
                        : nccl.AllReduce(s->scalar, s->scalar, 1, ncclDouble, ncclAvg, s->comm, s->comm_stream);
}

// A scalar collective on the communication stream, after the step's
// buckets: device 0's value (broadcast) or the mean. The host polls for the
// result, and the communicator's error while it waits and once the stream
// is done: a collective of this step (a bucket's, or this one) that failed
// fails the reducer here, which aborts every communicator — the peers that
// wait for this device are freed instead of waiting for ever, and this
// device does not take its own value for the mean. false when the reducer
// stopped or failed.
bool scalar_collective(nccl_reducer *n, int device, bool broadcast, double *value)
{
    device_side *s = &n->dev[device];
    cudaSetDevice(s->cuda_device);
    *s->host_scalar = *value;
    scalar_args a = {s, broadcast};
    cudaStream_t st = s->comm_stream;
    double *dev = s->scalar, *host = s->host_scalar;
    const char *what = broadcast ? "ncclBroadcast" : "ncclAllReduce";
    bool ok = BB_CUDA_REDUCER(n, cudaMemcpyAsync(dev, host, sizeof *dev, cudaMemcpyHostToDevice, st)) &&
              nccl_step(n, s, scalar_call, &a, what) &&
              BB_CUDA_REDUCER(n, cudaMemcpyAsync(host, dev, sizeof *dev, cudaMemcpyDeviceToHost, st));
    cudaError_t e = cudaErrorNotReady;
    while (ok && (e = cudaStreamQuery(st)) == cudaErrorNotReady)
        if ((ok = nccl_step(n, s, async_error, s, what))) sched_yield();
    ok = ok && cuda_call_ok(n, e, "cudaStreamQuery") && nccl_step(n, s, async_error, s, what);
    if (ok) *value = *s->host_scalar;
    return ok;
}

double n_allreduce_scalar(reducer_t *r, int device, double value)
{
    return scalar_collective(of(r), device, false, &value) ? value : NAN;
}

bool n_broadcast_stop(reducer_t *r, int device, bool stop)
{
    double v = stop ? 1 : 0;
    return !scalar_collective(of(r), device, true, &v) || v != 0;
}

// After n_wait: the step's sums of this device's own squares, read once
// the communication stream is done, added in (round, bucket) order.
bool n_device_squares(const reducer_t *cr, int device, double *out)
{
    nccl_reducer *n = of(const_cast<reducer_t *>(cr));
    device_side *s = &n->dev[device];
    size_t count = (size_t)rounds_of(n) * (size_t)cr->buckets;
    cudaSetDevice(s->cuda_device);
    bool ok = !stopping(cr) &&
              BB_CUDA_REDUCER(n, cudaMemcpyAsync(s->host_own_squares, s->own_squares, count * sizeof(double),
                                                 cudaMemcpyDeviceToHost, s->comm_stream)) &&
              BB_CUDA_REDUCER(n, cudaStreamSynchronize(s->comm_stream));
    double sum = 0.0;
    for (size_t i = 0; ok && i < count; i++) sum += s->host_own_squares[i];
    *out = sum;
    return ok;
}

// No sum_squares: the gradients' norm is a pass of the optimizer's own.
const reducer_ops nccl_ops = {n_destroy,   n_post,         n_wait,       n_abort,        n_last_step,
                              n_allreduce_scalar, n_broadcast_stop, n_allgather, NULL, n_device_squares,
                              n_window_write, n_gather};

// The communicators, one per device, non-blocking, over every GPU of every
// process of the job (rank 0's unique id is broadcast over MPI; this
// process's GPU d is rank rank * devices + d); waits for them to be ready
// (at most `timeout_s`, --timeout; 0: no limit).
bb_status init_comms(nccl_reducer *n, const bb_device_spec *spec, double timeout_s)
{
    int devices = spec->count, world = spec->world > 1 ? spec->world : 1;
    ncclUniqueId id;
    if (spec->rank == 0) BB_NCCL(nccl.GetUniqueId(&id));
    BB_TRY(bb_world_broadcast_bytes(&id, sizeof id, 0));
    ncclResult_t rc = ncclSuccess;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    nccl.GroupStart();
    for (int d = 0; d < devices; d++) {
        cudaSetDevice(n->dev[d].cuda_device);
        rc = nccl.CommInitRankConfig(&n->dev[d].comm, devices * world, id, spec->rank * devices + d, &config);
        if (rc != ncclSuccess && rc != ncclInProgress) break;
    }
    ncclResult_t end = nccl.GroupEnd();
    if (rc == ncclSuccess || rc == ncclInProgress) rc = end;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int d = 0; d < devices && (rc == ncclSuccess || rc == ncclInProgress); d++) {
        device_side *s = &n->dev[d];
        do {
            ncclResult_t state = ncclSuccess;
            rc = s->comm ? nccl.CommGetAsyncError(s->comm, &state) : ncclInternalError;
            if (rc == ncclSuccess) rc = state;
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (rc == ncclInProgress && timeout_s > 0 && (double)(now.tv_sec - t0.tv_sec) > timeout_s)
                return bb_fail(BB_ERR_DEVICE, "NCCL communicators over %d GPUs not ready after %.0f s (--timeout)",
                               devices * world, timeout_s);
            if (rc == ncclInProgress) sched_yield();
        } while (rc == ncclInProgress);
    }
    if (rc != ncclSuccess)
        return bb_fail(BB_ERR_DEVICE, "NCCL communicators over %d GPUs: %s", devices * world, nccl.GetErrorString(rc));
    return BB_OK;
}

} // namespace bb_nccl

using namespace bb_nccl;

extern "C" bb_status bb_reducer_load_nccl(int *version)
{
    BB_TRY(need_nccl());
    if (version) *version = nccl_version;
    return BB_OK;
}

extern "C" bb_status bb_reducer_create_nccl(const reducer_args *a, reducer_t **out)
{
    *out = NULL;
    int devices = a->spec->count;
    BB_TRY(need_nccl());
    if (devices > kMaxDevices) return bb_fail(BB_ERR_ARG, "the NCCL reducer takes at most %d GPUs", kMaxDevices);
    const char *blocking = getenv("NCCL_COMM_BLOCKING");
    if (blocking && strcmp(blocking, "0"))
        return bb_fail(BB_ERR_ARG, "NCCL_COMM_BLOCKING=%s makes NCCL calls block, where a failed peer could hang the "
                       "run for ever: the reducer needs non-blocking communicators; unset it", blocking);
    nccl_reducer *n = static_cast<nccl_reducer *>(calloc(1, sizeof *n));
    if (!n) return bb_fail(BB_ERR_NOMEM, "out of memory");
    reducer_t *r = &n->base;
    r->ops = &nccl_ops;
    pthread_mutex_init(&n->fail_lock, NULL);
    bb_status rc = bb_reducer_init_shared(r, a);
    n->accumulation = a->window_models ? (a->accumulation > 1 ? a->accumulation : 1) : 0;
    n->dev = static_cast<device_side *>(calloc((size_t)devices, sizeof *n->dev));
    n->start = static_cast<cudaEvent_t *>(calloc((size_t)r->buckets + 1, sizeof *n->start));
    n->end = static_cast<cudaEvent_t *>(calloc((size_t)r->buckets + 1, sizeof *n->end));
    if (rc == BB_OK && (!n->dev || !n->start || !n->end)) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    /* the staging buffer: the largest bucket its equal slices do not fill exactly */
    size_t stage = 0, own = (size_t)rounds_of(n) * (size_t)r->buckets;
    for (int b = 0; rc == BB_OK && a->shards && a->shards->rule == BB_PARAM_SHARD_ELEMENTS && b < r->buckets; b++) {
        size_t padded = a->shards->count[b] * (size_t)a->shards->owners;
        if (padded != r->hi[b] - r->lo[b] && padded > stage) stage = padded;
    }
    for (int d = 0; rc == BB_OK && d < devices; d++) {
        device_side *s = &n->dev[d];
        pthread_mutex_init(&s->abort_lock, NULL);
        s->rank = r->first_owner + d;
        s->cuda_device = bb_backend_device(a->be[d]);
        s->compute = static_cast<cudaStream_t>(bb_backend_native_stream(a->be[d], BB_STREAM_COMPUTE));
        s->comm_stream = static_cast<cudaStream_t>(bb_backend_native_stream(a->be[d], BB_STREAM_COMM));
        s->params = a->params ? a->params[d] : NULL;
        s->shard_grads = a->window_models ? a->shard_grads[d] : NULL;
        s->shard_params = a->shard_params ? a->shard_params[d] : NULL;
        s->bucket = static_cast<float **>(calloc((size_t)r->buckets, sizeof *s->bucket));
        s->shard_at = static_cast<size_t *>(calloc((size_t)r->buckets, sizeof *s->shard_at));
        s->freed = static_cast<cudaEvent_t *>(calloc((size_t)r->buckets, sizeof *s->freed));
        s->gathered = static_cast<cudaEvent_t *>(calloc((size_t)r->buckets, sizeof *s->gathered));
        if (!s->bucket || !s->shard_at || !s->freed || !s->gathered) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
        if (rc == BB_OK) rc = bb_reducer_device_buckets(r, a, d, s->bucket, s->shard_at);
        if (rc != BB_OK) break;
        cudaSetDevice(s->cuda_device);
        for (int b = 0; a->window_models && b < r->buckets; b++)
            if (cudaEventCreateWithFlags(&s->freed[b], cudaEventDisableTiming) != cudaSuccess) s->freed[b] = NULL;
        for (int b = 0; s->shard_params && b < r->buckets; b++)
            if (cudaEventCreateWithFlags(&s->gathered[b], cudaEventDisableTiming) != cudaSuccess) s->gathered[b] = NULL;
        if (cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming) != cudaSuccess ||
            cudaMalloc(&s->scalar, sizeof(double)) != cudaSuccess ||
            cudaHostAlloc(&s->host_scalar, sizeof(double), cudaHostAllocDefault) != cudaSuccess ||
            cudaMalloc(&s->own_partial, kOwnPartials * sizeof(double)) != cudaSuccess ||
            cudaMalloc(&s->own_squares, own * sizeof(double)) != cudaSuccess ||
            cudaHostAlloc(&s->host_own_squares, own * sizeof(double), cudaHostAllocDefault) != cudaSuccess ||
            (stage && cudaMalloc(&s->stage, stage * sizeof(float)) != cudaSuccess))
            rc = bb_fail(BB_ERR_DEVICE, "cuda:%d: cannot create events and buffers for the reducer", s->cuda_device);
        for (int b = 0; rc == BB_OK && a->window_models && b < r->buckets; b++)
            if (!s->freed[b] || (s->shard_params && !s->gathered[b]))
                rc = bb_fail(BB_ERR_DEVICE, "cuda:%d: cannot create the windows' events", s->cuda_device);
    }
    if (rc == BB_OK) rc = init_comms(n, a->spec, a->timeout_s);
    if (rc == BB_OK) {
        cudaSetDevice(n->dev[0].cuda_device);
        bool ok = cudaEventCreate(&n->backward_end) == cudaSuccess;
        for (int b = 0; ok && b < r->buckets; b++)
            ok = cudaEventCreate(&n->start[b]) == cudaSuccess && cudaEventCreate(&n->end[b]) == cudaSuccess;
        if (!ok) rc = bb_fail(BB_ERR_DEVICE, "cannot create the reducer's timing events");
    }
    if (rc == BB_OK && a->watchdog) {
        n->watchdog = a->watchdog;
        if (!bb_watchdog_add_hook(a->watchdog, watchdog_poll, watchdog_abort, n))
            rc = bb_fail(BB_ERR_INTERNAL, "the watchdog has no room for the NCCL reducer's hooks");
    }
    if (rc != BB_OK) {
        cudaGetLastError();
        abort_all(n); // communicators half made are ended, not finalized
        n_destroy(r);
        return rc;
    }
    *out = r;
    return BB_OK;
}
