// nccl_reducer.h — private to the NCCL reducer (nccl_reducer.cu: the
// machinery, the reductions, the reducer's set-up; nccl_gather.cu: the
// gathers of ZeRO-1 and ZeRO-3): NCCL's entry points (loaded with dlopen),
// a device's and the reducer's state, and what both files call. C++ only.
#ifndef BIGBATCH_TRAIN_NCCL_REDUCER_H
#define BIGBATCH_TRAIN_NCCL_REDUCER_H

#include <nccl.h>
#include <pthread.h>

#include <cuda_runtime.h>

extern "C" {
#include "reducer.h"
#include "watchdog.h"
}

namespace bb_nccl {

struct nccl_api {
    ncclResult_t (*GetVersion)(int *);
    ncclResult_t (*GetUniqueId)(ncclUniqueId *);
    ncclResult_t (*CommInitRankConfig)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
    ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*CommFinalize)(ncclComm_t);
    ncclResult_t (*CommDestroy)(ncclComm_t);
    ncclResult_t (*CommAbort)(ncclComm_t);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*Broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*ReduceScatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                  cudaStream_t);
    ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    const char *(*GetErrorString)(ncclResult_t);
    const char *(*GetLastError)(ncclComm_t); // NCCL 2.13 on; NULL before
};

extern nccl_api nccl; // filled by need_nccl (nccl_reducer.cu)

enum comm_state { COMM_IDLE, COMM_BUSY, COMM_GONE };

struct device_side {
    ncclComm_t comm;
    int state;                  // comm_state, __atomic builtins
    pthread_mutex_t abort_lock; // orders an abort with the watchdog's poll of the error (never across a wait)
    cudaStream_t compute, comm_stream;
    float *params;
    float **bucket;             // each bucket's gradients: in the whole buffer, or its window slot (ZeRO-2)
    float *shard_grads;         // ZeRO-2: the optimizer's shard gradients, and where each bucket's slice starts there
    size_t *shard_at;
    float *shard_params;        // ZeRO-3: the optimizer's master weights (laid out as shard_grads)
    cudaEvent_t *freed;         // ZeRO-2: per bucket, recorded once its slot has been read out
    cudaEvent_t *gathered;      // ZeRO-3: per bucket, recorded once its weights are in its window slot
    unsigned round;             // rounds posted in full (ZeRO-2: micro-steps, else steps)
    float *stage;               // ZeRO-1's equal slices of a bucket they do not divide: owners × count floats
    int rank, cuda_device, next_bucket; // rank: in the communicator (the job's device number)
    cudaEvent_t ready, done;
    double *scalar, *host_scalar; // the scalar collectives' value: device, pinned host
    // the noise scale's small batches: each round's (ZeRO-2: micro-step's)
    // sum of squares of every bucket of this device's own gradients, before
    // the reduction (rounds × buckets, device and pinned host), and the
    // block sums they are made of
    double *own_squares, *host_own_squares, *own_partial;
};

struct nccl_reducer {
    reducer_t base;
    pthread_mutex_t fail_lock;  // the first failure's message; never held across NCCL or CUDA
    device_side *dev;
    // device 0's timing of the last step: each bucket's reduction and the
    // end of the backward, on the GPU clock
    cudaEvent_t *start, *end, backward_end;
    bool timed;
    int accumulation;           // ZeRO-2: micro-steps a step (each reduced); 0: not ZeRO-2
    bb_watchdog *watchdog;      // polls every communicator's asynchronous error (watchdog_poll)
};

inline nccl_reducer *of(reducer_t *r) { return reinterpret_cast<nccl_reducer *>(r); }

inline bool stopping(const reducer_t *r) { return __atomic_load_n(&r->stop, __ATOMIC_SEQ_CST); }

// The error family's member for the reducer: a failed CUDA call fails the
// reducer (naming the call) and aborts every communicator; true when it
// succeeded.
bool cuda_call_ok(nccl_reducer *n, cudaError_t e, const char *call);
#define BB_CUDA_REDUCER(n, expr) cuda_call_ok((n), (expr), #expr)
// One NCCL step on device `s` (call(ctx) enqueues it): false when the
// reducer stopped or the step failed (then reported and aborted).
bool nccl_step(nccl_reducer *n, device_side *s, ncclResult_t (*call)(void *ctx), void *ctx, const char *what);
// Bucket b's equal slices (BB_PARAM_SHARD_ELEMENTS): reduce-scatters the
// gradients or all-gathers the weights at `x` (the bucket's first float),
// in place or through the staging buffer; on the communication stream.
enum collective { ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER };
bool equal_slices(nccl_reducer *n, device_side *s, int b, collective kind, float *x);

// nccl_gather.cu: reducer_ops.allgather (ZeRO-1) and .gather (ZeRO-3).
bool n_allgather(reducer_t *r, int device);
bb_status n_gather(reducer_t *r, int device, bb_gather_phase phase, int b, size_t lo, size_t len, float *slot);

} // namespace bb_nccl

#endif
