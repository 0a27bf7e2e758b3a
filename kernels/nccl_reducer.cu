// nccl_reducer.cu — the reducer for CUDA replicas: one NCCL communicator
// per GPU of the process (ncclCommInitAll), the same buckets as the CPU
// reducer. A post enqueues, for each newly finished bucket, an event on the
// worker's compute stream, a wait for it on the communication stream, and
// an ncclAllReduce (average, in place) there, inside ncclGroupStart/End. A
// wait makes the compute stream wait for the step's last reduction: the
// optimizer is ordered after it on the GPU and the host does not block.
// Each worker thread drives only its own communicator, in the same bucket
// order, which is NCCL's one-thread-per-GPU model.
//
// Failure: when a worker fails, the others' collectives would wait for it
// on the GPU for ever, and so would their host (every loss read
// synchronizes). So an abort calls ncclCommAbort on every communicator
// (under the lock that posts take), which ends those collectives with an
// error; a failed NCCL or CUDA call here aborts the same way and is
// reported as the run's error.
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"

extern "C" {
#include "../src/train/reducer.h"
}

namespace {

struct device_side {
    ncclComm_t comm;
    cudaStream_t compute, comm_stream;
    float *grads;
    int cuda_device, next_bucket;
    cudaEvent_t ready, done;
};

struct nccl_reducer {
    reducer_t base;
    pthread_mutex_t lock;       // posts vs abort: no collective on an aborted communicator
    device_side *dev;
    // device 0's timing of the last step: each bucket's reduction and the
    // end of the backward, on the GPU clock
    cudaEvent_t *start, *end, backward_end;
    bool timed;
};

nccl_reducer *of(reducer_t *r) { return reinterpret_cast<nccl_reducer *>(r); }

void n_destroy(reducer_t *r)
{
    nccl_reducer *n = of(r);
    for (int d = 0; n->dev && d < r->devices; d++) {
        device_side *s = &n->dev[d];
        cudaSetDevice(s->cuda_device);
        if (s->comm) ncclCommDestroy(s->comm); // aborted ones are already gone
        if (s->ready) cudaEventDestroy(s->ready);
        if (s->done) cudaEventDestroy(s->done);
    }
    if (n->dev) cudaSetDevice(n->dev[0].cuda_device);
    for (int b = 0; b < r->buckets; b++) {
        if (n->start && n->start[b]) cudaEventDestroy(n->start[b]);
        if (n->end && n->end[b]) cudaEventDestroy(n->end[b]);
    }
    if (n->backward_end) cudaEventDestroy(n->backward_end);
    free(n->start), free(n->end), free(n->dev);
    reducer_free_buckets(r);
    pthread_mutex_destroy(&n->lock);
    free(n);
}

// Ends every collective: each device's pending ones fail, so no thread
// waits for a peer that will never post. Call with the lock held.
void abort_locked(nccl_reducer *n)
{
    reducer_t *r = &n->base;
    __atomic_store_n(&r->stop, 1, __ATOMIC_SEQ_CST);
    for (int d = 0; d < r->devices; d++)
        if (n->dev[d].comm) {
            ncclCommAbort(n->dev[d].comm);
            n->dev[d].comm = NULL;
        }
}

// Records the reducer's own failure (the first), then aborts. Lock held.
void fail_locked(nccl_reducer *n, const char *what, const char *why)
{
    reducer_t *r = &n->base;
    if (r->failure == BB_OK) {
        r->failure = BB_ERR_DEVICE;
        snprintf(r->failure_message, sizeof r->failure_message, "NCCL reducer: %s: %s", what, why);
    }
    abort_locked(n);
}

bool cuda_ok(nccl_reducer *n, cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return true;
    fail_locked(n, what, cudaGetErrorString(e));
    return false;
}

bool nccl_ok(nccl_reducer *n, ncclResult_t e, const char *what)
{
    if (e == ncclSuccess || e == ncclInProgress) return true;
    fail_locked(n, what, ncclGetErrorString(e));
    return false;
}

void n_post(reducer_t *r, int device, size_t ready_from)
{
    nccl_reducer *n = of(r);
    device_side *s = &n->dev[device];
    pthread_mutex_lock(&n->lock);
    cudaSetDevice(s->cuda_device);
    bool ok = !reducer_aborted(r);
    if (ok && device == 0 && ready_from == 0) ok = cuda_ok(n, cudaEventRecord(n->backward_end, s->compute), "event");
    for (; ok && s->next_bucket < r->buckets && r->lo[s->next_bucket] >= ready_from; s->next_bucket++) {
        int b = s->next_bucket;
        ok = cuda_ok(n, cudaEventRecord(s->ready, s->compute), "event") &&
             cuda_ok(n, cudaStreamWaitEvent(s->comm_stream, s->ready, 0), "stream wait") &&
             (device != 0 || cuda_ok(n, cudaEventRecord(n->start[b], s->comm_stream), "event")) &&
             nccl_ok(n, ncclGroupStart(), "ncclGroupStart") &&
             nccl_ok(n, ncclAllReduce(s->grads + r->lo[b], s->grads + r->lo[b], r->hi[b] - r->lo[b], ncclFloat, ncclAvg,
                                      s->comm, s->comm_stream),
                     "ncclAllReduce") &&
             nccl_ok(n, ncclGroupEnd(), "ncclGroupEnd") &&
             (device != 0 || cuda_ok(n, cudaEventRecord(n->end[b], s->comm_stream), "event"));
    }
    pthread_mutex_unlock(&n->lock);
}

uint64_t n_wait(reducer_t *r, int device)
{
    nccl_reducer *n = of(r);
    device_side *s = &n->dev[device];
    pthread_mutex_lock(&n->lock);
    cudaSetDevice(s->cuda_device);
    ncclResult_t async = ncclSuccess;
    bool ok = !reducer_aborted(r) && nccl_ok(n, ncclCommGetAsyncError(s->comm, &async), "ncclCommGetAsyncError") &&
              nccl_ok(n, async, "an all-reduce") && cuda_ok(n, cudaEventRecord(s->done, s->comm_stream), "event") &&
              cuda_ok(n, cudaStreamWaitEvent(s->compute, s->done, 0), "stream wait");
    s->next_bucket = 0;
    if (ok && device == 0) n->timed = true;
    pthread_mutex_unlock(&n->lock);
    return 0;
}

void n_abort(reducer_t *r)
{
    nccl_reducer *n = of(r);
    pthread_mutex_lock(&n->lock);
    abort_locked(n);
    pthread_mutex_unlock(&n->lock);
}

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

const reducer_ops nccl_ops = {n_destroy, n_post, n_wait, n_abort, n_last_step};

} // namespace

extern "C" bb_status reducer_create_nccl(const bb_model_t *m, bb_backend_t *const *be, float *const *grads,
                                         int devices, size_t bucket_bytes, reducer_t **out)
{
    *out = NULL;
    nccl_reducer *n = static_cast<nccl_reducer *>(calloc(1, sizeof *n));
    if (!n) return bb_fail(BB_ERR_NOMEM, "out of memory");
    reducer_t *r = &n->base;
    r->ops = &nccl_ops;
    pthread_mutex_init(&n->lock, NULL);
    bb_status rc = reducer_init_buckets(r, m, devices, bucket_bytes);
    n->dev = static_cast<device_side *>(calloc((size_t)devices, sizeof *n->dev));
    n->start = static_cast<cudaEvent_t *>(calloc((size_t)r->buckets + 1, sizeof *n->start));
    n->end = static_cast<cudaEvent_t *>(calloc((size_t)r->buckets + 1, sizeof *n->end));
    int *ids = static_cast<int *>(calloc((size_t)devices, sizeof *ids));
    ncclComm_t *comms = static_cast<ncclComm_t *>(calloc((size_t)devices, sizeof *comms));
    if (rc == BB_OK && (!n->dev || !n->start || !n->end || !ids || !comms)) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    for (int d = 0; rc == BB_OK && d < devices; d++) {
        device_side *s = &n->dev[d];
        s->cuda_device = ids[d] = bb_cuda_backend_device(be[d]);
        s->compute = bb_cuda_backend_stream(be[d], BB_STREAM_COMPUTE);
        s->comm_stream = bb_cuda_backend_stream(be[d], BB_STREAM_COMM);
        s->grads = grads[d];
        cudaSetDevice(s->cuda_device);
        if (cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming) != cudaSuccess)
            rc = bb_fail(BB_ERR_DEVICE, "cuda:%d: cannot create events for the reducer", s->cuda_device);
    }
    if (rc == BB_OK) {
        ncclResult_t nr = ncclCommInitAll(comms, devices, ids);
        if (nr != ncclSuccess) rc = bb_fail(BB_ERR_DEVICE, "ncclCommInitAll over %d GPUs: %s", devices, ncclGetErrorString(nr));
        for (int d = 0; rc == BB_OK && d < devices; d++) n->dev[d].comm = comms[d];
    }
    if (rc == BB_OK) {
        cudaSetDevice(n->dev[0].cuda_device);
        bool ok = cudaEventCreate(&n->backward_end) == cudaSuccess;
        for (int b = 0; ok && b < r->buckets; b++)
            ok = cudaEventCreate(&n->start[b]) == cudaSuccess && cudaEventCreate(&n->end[b]) == cudaSuccess;
        if (!ok) rc = bb_fail(BB_ERR_DEVICE, "cannot create the reducer's timing events");
    }
    free(ids);
    free(comms);
    if (rc != BB_OK) {
        cudaGetLastError();
        n_destroy(r);
        return rc;
    }
    *out = r;
    return BB_OK;
}
