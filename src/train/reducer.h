/* reducer.h — private: the CPU gradient reducer. Gradients are cut into
 * buckets in reverse layer order (the end of the parameter buffer first,
 * where the backward finishes first); bucket 0 holds about 1 MiB (or
 * bucket_bytes when smaller), the rest about `bucket_bytes` each, never splitting a tensor (as PyTorch DDP).
 *
 * On the last micro-step each worker posts the buckets the backward has
 * finished (reducer_post, from the model's grad-ready hook); a reducer
 * thread averages bucket b over the devices' gradient buffers as soon as
 * every device posted it, in bucket order, while the workers go on with the
 * backward. reducer_wait returns once every bucket of the step is averaged.
 * The counters only grow (step k's bucket b is ready at devices·(k+1)
 * posts), so no reset races with a fast worker; they are compared modulo
 * 2^32 (futex words are 32-bit), which long runs wrap.
 *
 * The CUDA issue puts NCCL behind the same four calls. */
#ifndef BIGBATCH_TRAIN_REDUCER_H
#define BIGBATCH_TRAIN_REDUCER_H

#include "bigbatch/model.h"
#include "bigbatch/trace.h"

typedef struct reducer reducer_t;

/* Buckets over `m`'s tensors for `devices` gradient buffers `grads`
 * (param_count floats each). Starts the reducer thread; its spans go to
 * `trace` (may be NULL) on track `track`, numbered from step first_step + 1. */
bb_status reducer_create(const bb_model_t *m, float *const *grads, int devices, size_t bucket_bytes,
                         uint64_t first_step, bb_trace_t *trace, int track, reducer_t **out);
void reducer_destroy(reducer_t *r);
int reducer_bucket_count(const reducer_t *r);
/* Device `device`'s gradients from `ready_from` (floats) to the end are
 * final: posts every bucket that lies inside. Matches bb_grad_ready_fn
 * through a small adapter (see worker). */
void reducer_post(reducer_t *r, int device, size_t ready_from);
/* Waits until the step's buckets are all averaged (every device posted
 * ready_from 0), or the reducer is aborted. Returns the nanoseconds waited. */
uint64_t reducer_wait(reducer_t *r, int device);
/* Stops the reducer early (a worker failed): waits return at once. */
void reducer_abort(reducer_t *r);
bool reducer_aborted(const reducer_t *r);

/* The last finished step's reduction: busy time, and the time within
 * [.., until_ns] (the last backward's end) — the overlapped part. Valid
 * between reducer_wait and the next step's first post. */
void reducer_last_step(const reducer_t *r, uint64_t until_ns, uint64_t *busy_ns, uint64_t *overlapped_ns);

#endif
