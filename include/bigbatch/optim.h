/* optim.h — the optimizer: its configuration and learning-rate schedule,
 * the gradient buckets the reducers all-reduce and ZeRO-1 shards follow,
 * one replica's optimizer state (AdamW or SGD), the step that clips and
 * updates, and the state file. Below both the planner (which counts the
 * state on a counting backend) and the trainer.
 *
 * How to use:
 *   bb_optimizer_config cfg = bb_optimizer_defaults();
 *   cfg.lr = 3e-4;
 *   bb_optimizer o;
 *   BB_TRY(bb_optimizer_create(be, &cfg, bb_model_param_count(m), NULL, &o));
 *   double norm = bb_optimizer_sum_squares(be, m, &o), lr;   // then sqrt, across devices
 *   bb_optimizer_apply(be, m, &o, step, total, sqrt(norm), &lr);
 *   bb_optimizer_destroy(be, &o);
 */
#ifndef BIGBATCH_OPTIM_H
#define BIGBATCH_OPTIM_H

#include "bigbatch/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum bb_optimizer_kind { BB_OPTIMIZER_ADAMW = 0, BB_OPTIMIZER_SGD } bb_optimizer_kind;
typedef enum bb_lr_schedule { BB_LR_COSINE = 0, BB_LR_CONSTANT } bb_lr_schedule;

typedef struct bb_optimizer_config {
    bb_optimizer_kind kind;
    double lr;             /* peak learning rate */
    double beta1, beta2, eps; /* AdamW */
    double momentum;       /* SGD */
    double weight_decay;   /* on matrices only (bb_tensor_info.decay) */
    uint64_t warmup;       /* steps of linear warm-up from lr/warmup to lr */
    bb_lr_schedule schedule; /* cosine: from lr down to lr/10 at the last step */
    double grad_clip;      /* clip the global gradient norm to this; 0: off */
} bb_optimizer_config;

/* The defaults: AdamW at lr 1e-3 (betas 0.9, 0.999, eps 1e-8), SGD's
 * momentum 0.9, no weight decay, cosine schedule, clip at norm 1. */
bb_optimizer_config bb_optimizer_defaults(void);
/* "adamw", "sgd" (--optimizer's names), and back: BB_ERR_ARG for another. */
const char *bb_optimizer_kind_name(bb_optimizer_kind k);
bb_status bb_optimizer_kind_parse(const char *s, bb_optimizer_kind *out);
/* "cosine", "constant" (--lr-schedule's names), and back: BB_ERR_ARG for another. */
const char *bb_lr_schedule_name(bb_lr_schedule s);
bb_status bb_lr_schedule_parse(const char *s, bb_lr_schedule *out);
/* The learning rate of step `step` (0-based) of a `total`-step run. */
double bb_lr_at(const bb_optimizer_config *o, uint64_t step, uint64_t total);

/* ---- gradient buckets ------------------------------------------------------
 * The parameter buffer cut into buckets from its end (the gradients the
 * backward finishes first): the first holds about 1 MiB (or bucket_bytes
 * when smaller), the rest about bucket_bytes each, never splitting a tensor
 * (as PyTorch DDP). Bucket b covers floats [lo[b], hi[b]); lo falls with b. */
#define BB_BUCKET_MIB_DEFAULT 25.0 /* --bucket-mib: PyTorch DDP's */
/* MiB to bytes (--bucket-mib; 0: the default). */
static inline size_t bb_bucket_bytes(double mib)
{
    return (size_t)((mib > 0 ? mib : BB_BUCKET_MIB_DEFAULT) * 1048576.0);
}
typedef struct bb_buckets {
    int count;
    size_t *lo, *hi;
} bb_buckets;

/* Fails with BB_ERR_NOMEM. */
bb_status bb_buckets_make(const bb_model_t *m, size_t bucket_bytes, bb_buckets *out);
void bb_buckets_free(bb_buckets *b);
/* Owner k of n's slice of bucket b: [lo + len·k/n, lo + len·(k+1)/n). */
static inline void bb_bucket_slice(const size_t *lo, const size_t *hi, int b, int k, int n, size_t *out_lo,
                                   size_t *out_hi)
{
    size_t len = hi[b] - lo[b];
    *out_lo = lo[b] + len * (size_t)k / (size_t)n;
    *out_hi = lo[b] + len * (size_t)(k + 1) / (size_t)n;
}

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
 * buckets of `bucket_bytes` (bb_buckets_make). Fails with BB_ERR_NOMEM. */
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

#ifdef __cplusplus
}
#endif
#endif /* BIGBATCH_OPTIM_H */
