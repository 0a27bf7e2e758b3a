// nccl_gather.cu — the NCCL reducer's gathers of the weights (see
// nccl_reducer.cu): ZeRO-1's into every replica after the update, and
// ZeRO-3's of one bucket into a parameter window slot ahead of its use.
// Equal slices are all-gathered; whole-tensor slices (of differing lengths,
// which ncclAllGather does not take) are broadcast from each owner in one
// group. All on the device's communication stream.
#include "nccl_reducer.h"

namespace bb_nccl {

// Whole-tensor slices broadcast from their owners, in place, in one group:
// bucket b's into `slot` (ZeRO-3), or with b < 0 every bucket's into the
// replica's weights (ZeRO-1).
struct owners_args {
    reducer_t *r;
    device_side *s;
    int b;
    float *slot;
};

ncclResult_t broadcast_owners(void *ctx)
{
    owners_args *a = static_cast<owners_args *>(ctx);
    reducer_t *r = a->r;
    ncclResult_t rc = nccl.GroupStart();
    for (int b = a->b < 0 ? 0 : a->b; rc == ncclSuccess && b < (a->b < 0 ? r->buckets : a->b + 1); b++) {
        float *x = a->b < 0 ? a->s->params + r->lo[b] : a->slot; /* the bucket's first float */
        for (int k = 0; rc == ncclSuccess && k < r->shards->owners; k++) { // k: the owner's rank in the communicator
            size_t lo, hi;
            bb_param_shards_slice(r->shards, b, k, &lo, &hi);
            float *p = x + (lo - r->lo[b]);
            if (hi > lo) rc = nccl.Broadcast(p, p, hi - lo, ncclFloat, k, a->s->comm, a->s->comm_stream);
        }
    }
    ncclResult_t end = nccl.GroupEnd();
    return rc != ncclSuccess ? rc : end;
}

// The communication stream after the compute stream's work so far.
bool after_compute(nccl_reducer *n, device_side *s)
{
    return BB_CUDA_REDUCER(n, cudaEventRecord(s->ready, s->compute)) &&
           BB_CUDA_REDUCER(n, cudaStreamWaitEvent(s->comm_stream, s->ready, 0));
}

// ZeRO-1, after the compute stream's update, which the next compute waits for.
bool n_allgather(reducer_t *r, int device)
{
    nccl_reducer *n = of(r);
    device_side *s = &n->dev[device];
    if (!s->params) return !stopping(r); // ZeRO-3: no replica to fill; each gather follows the update (n_gather)
    cudaSetDevice(s->cuda_device);
    owners_args a = {r, s, -1, NULL};
    bool ok = !stopping(r) && after_compute(n, s);
    if (r->shards->rule == BB_PARAM_SHARD_ELEMENTS)
        for (int b = 0; ok && b < r->buckets; b++) ok = equal_slices(n, s, b, ALL_GATHER, s->params + r->lo[b]);
    else
        ok = ok && nccl_step(n, s, broadcast_owners, &a, "ncclBroadcast (the ZeRO-1 gather)");
    return ok && BB_CUDA_REDUCER(n, cudaEventRecord(s->done, s->comm_stream)) &&
           BB_CUDA_REDUCER(n, cudaStreamWaitEvent(s->compute, s->done, 0));
}

// ZeRO-3: bucket b's weights into a window slot. The issue, on the
// communication stream after the compute stream's work so far (which may
// still read the slot's previous bucket): this owner's slice from its
// master weights (on the device, or offloaded: pinned host memory, hence
// cudaMemcpyDefault) into its place in the slot, then the slices gathered;
// gathered[b] is recorded after. The wait makes the compute stream wait
// for that record: a prefetched bucket's gather runs while the compute
// stream works on the buckets before it. Every device issues its gathers
// in the order of its model's passes, the same everywhere, as NCCL needs.
bb_status n_gather(reducer_t *r, int device, bb_gather_phase phase, int b, size_t lo, size_t len, float *slot)
{
    nccl_reducer *n = of(r);
    device_side *s = &n->dev[device];
    if (!s->shard_params || lo != r->lo[b] || len != r->hi[b] - r->lo[b])
        return bb_fail(BB_ERR_INTERNAL, "the parameter window was cut on other buckets than the reducer's, or the "
                       "reducer keeps no master weights");
    cudaSetDevice(s->cuda_device);
    bool ok = !stopping(r);
    if (phase == BB_GATHER_WAIT) {
        ok = ok && BB_CUDA_REDUCER(n, cudaStreamWaitEvent(s->compute, s->gathered[b], 0));
        return ok ? BB_OK : bb_reducer_failure(r);
    }
    size_t slo, shi;
    bb_param_shards_slice(r->shards, b, s->rank, &slo, &shi);
    cudaStream_t st = s->comm_stream;
    ok = ok && after_compute(n, s) &&
         (shi == slo || BB_CUDA_REDUCER(n, cudaMemcpyAsync(slot + (slo - lo), s->shard_params + s->shard_at[b],
                                                           (shi - slo) * sizeof(float), cudaMemcpyDefault, st)));
    owners_args a = {r, s, b, slot};
    if (r->shards->rule == BB_PARAM_SHARD_ELEMENTS) ok = ok && equal_slices(n, s, b, ALL_GATHER, slot);
    else ok = ok && nccl_step(n, s, broadcast_owners, &a, "ncclBroadcast (the ZeRO-3 gather)");
    ok = ok && BB_CUDA_REDUCER(n, cudaEventRecord(s->gathered[b], st));
    return ok ? BB_OK : bb_reducer_failure(r);
}

} // namespace bb_nccl
