/* optimizer.h — private (src/train, and the planner, which counts the
 * state): one replica's optimizer state, the step that clips the
 * gradients and updates the parameters, and the state file.
 *
 * How to use:
 *   bb_optimizer o;
 *   BB_TRY(bb_optimizer_create(be, &cfg, bb_model_param_count(m), &o));
 *   double lr, norm = bb_optimizer_step(be, m, &o, step, total, &lr);
 *   bb_optimizer_destroy(be, &o);
 */
#ifndef BIGBATCH_TRAIN_OPTIMIZER_H
#define BIGBATCH_TRAIN_OPTIMIZER_H

#include "bigbatch/train.h"

/* The parameters a replica's optimizer updates: all of them, or with
 * ZeRO-1 (--zero 1) its shard — in every gradient bucket (reducer.h) the
 * owner's slice, bucket b's [lo[b], hi[b]) floats, held in the state at
 * `at[b]`. Owner k of n gets floats [lo + len·k/n, lo + len·(k+1)/n) of a
 * bucket of len floats. */
typedef struct bb_shard {
    int ranges;
    size_t *lo, *hi, *at;
    size_t floats; /* the state's length: the sum of hi - lo */
} bb_shard;

/* Owner `owner` of `owners`'s shard of `m`'s parameters, cut on the
 * reducer's buckets of `bucket_bytes` (bb_reducer_init_buckets). Fails with
 * BB_ERR_NOMEM. */
bb_status bb_shard_make(const bb_model_t *m, size_t bucket_bytes, int owners, int owner, bb_shard *out);
void bb_shard_free(bb_shard *s);

/* One replica's optimizer: AdamW moments (m, v) or the SGD momentum (m),
 * for every parameter, or for its shard's (shard.ranges > 0). */
typedef struct bb_optimizer {
    bb_optimizer_config cfg;
    float *m, *v;  /* device memory, `count` floats; v NULL for SGD */
    size_t count;  /* param_count, or the shard's floats */
    bb_shard shard;
} bb_optimizer;

/* State for `count` parameters, or with `shard` (may be NULL; taken over
 * by the optimizer, also when it fails) for that shard. */
bb_status bb_optimizer_create(bb_backend_t *be, const bb_optimizer_config *c, size_t count, bb_shard *shard,
                              bb_optimizer *o);
void bb_optimizer_destroy(bb_backend_t *be, bb_optimizer *o);
/* A step is two passes over the gradients at most: their sum of squares
 * (this optimizer's part: all of them, or its shard's), which a caller
 * skips when it has the norm already (the CPU reducer adds it up as it
 * averages), then bb_optimizer_apply. */
double bb_optimizer_sum_squares(bb_backend_t *be, bb_model_t *m, const bb_optimizer *o);
/* Given `norm`, the norm of the whole gradient (every shard's), updates
 * o's parameters for step `step` (0-based) of `total` with the gradients
 * clipped to norm cfg.grad_clip (when set), in one pass: the clip scales
 * them as the update reads them (the gradient buffer keeps the unclipped
 * values). *lr gets the rate used. A norm that is not finite (NaN or
 * infinite gradients) leaves the parameters and the optimizer state
 * untouched. */
void bb_optimizer_apply(bb_backend_t *be, bb_model_t *m, bb_optimizer *o, uint64_t step, uint64_t total, double norm,
                        double *lr);
/* optimizer.bin: magic, buffer count, float count, XXH64 of the floats, then
 * the floats — always the whole state, in parameter order. Save gathers it
 * from `n` optimizers (one whole one, or the shards that cover the
 * parameters, each on its backend); `across_processes`: from every
 * process's too (ZeRO-1 over MPI: a sum over the processes, which every
 * process joins; the others pass path NULL and write nothing). Load takes
 * the part `o` holds. Load fails with BB_ERR_FORMAT/BB_ERR_CORRUPT naming
 * the file. */
bb_status bb_optimizer_save(bb_backend_t *const *be, const bb_optimizer *const *o, int n, size_t param_count,
                            bool across_processes, const char *path);
bb_status bb_optimizer_load(bb_backend_t *be, bb_optimizer *o, size_t param_count, const char *path);

#endif
