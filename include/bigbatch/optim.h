/* optim.h — the optimizers: one descriptor each (its name, its state per
 * parameter, its checks and its step, and what a ZeRO shard of its state
 * must be), their configuration and learning-rate schedule, the gradient
 * buckets the reducers all-reduce and ZeRO-1 shards follow, one replica's
 * optimizer state, the step that clips and updates, and the state file.
 * Below both the planner (which counts the state on a counting backend)
 * and the trainer.
 *
 * How to use:
 *   bb_optimizer_config cfg = bb_optimizer_defaults();   // AdamW
 *   cfg.lr = 3e-4;
 *   BB_TRY(bb_optimizer_check(&cfg));
 *   bb_optimizer o;
 *   BB_TRY(bb_optimizer_create(be, &cfg, m, NULL, &o));
 *   double norm = bb_optimizer_sum_squares(be, m, &o), lr;   // then sqrt, across devices
 *   bb_optimizer_apply(be, m, &o, step, total, sqrt(norm), &lr);
 *   bb_optimizer_destroy(be, &o);
 *
 * Adding an optimizer: src/optim/<name>.c defines its bb_optimizer_desc
 * (a step from bb_op_* calls), its value in bb_optimizer_kind and its
 * extern below, and its entry in optimizer.c's table; a step that needs a kernel of its own
 * adds an op (ARCHITECTURE.md's recipe).
 */
#ifndef BIGBATCH_OPTIM_H
#define BIGBATCH_OPTIM_H

#include "bigbatch/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The optimizers, in the order of optimizer.c's table (--optimizer's names). */
typedef enum bb_optimizer_kind {
    BB_OPTIMIZER_ADAMW = 0,
    BB_OPTIMIZER_SGD,
    BB_OPTIMIZER_LAMB,
    BB_OPTIMIZER_LARS,
    BB_OPTIMIZER_MUON,
    BB_OPTIMIZER_COUNT
} bb_optimizer_kind;
typedef enum bb_lr_schedule { BB_LR_COSINE = 0, BB_LR_CONSTANT } bb_lr_schedule;
/* --lr-scale none|linear|sqrt (in this order): the peak rate given for
 * global batch base_batch (B0), scaled to the batch trained: lr x G/B0
 * (linear: Goyal et al.'s rule, arXiv 1706.02677) or lr x sqrt(G/B0)
 * (sqrt: the square-root rule, e.g. for Adam-family optimizers). */
typedef enum bb_lr_scale { BB_LR_SCALE_NONE = 0, BB_LR_SCALE_LINEAR, BB_LR_SCALE_SQRT } bb_lr_scale;
/* --offload none|optimizer|auto (in this order): where the optimizer's state
 * lives (auto: the planner's pick, the device's when it fits). */
typedef enum bb_offload { BB_OFFLOAD_NONE = 0, BB_OFFLOAD_OPTIMIZER, BB_OFFLOAD_AUTO } bb_offload;

typedef struct bb_optimizer_config {
    bb_optimizer_kind kind;
    double lr;             /* peak learning rate (at base_batch when lr_scale is set) */
    bb_lr_scale lr_scale;  /* none: lr as given */
    int base_batch;        /* B0: the global batch lr was given for (lr_scale needs it) */
    int batch;             /* the global batch trained, which lr_scale scales to (the trainer's); 0: unscaled */
    double beta1, beta2, eps; /* AdamW, LAMB, Muon's AdamW part */
    double momentum;       /* SGD, LARS, Muon */
    double trust_coefficient; /* LARS: the trust ratio's factor */
    double weight_decay;   /* on matrices only (bb_tensor_info.decay) */
    uint64_t warmup;       /* steps of linear warm-up from lr/warmup to lr */
    bb_lr_schedule schedule; /* cosine: from lr down to lr/10 at the last step */
    double grad_clip;      /* clip the global gradient norm to this; 0: off */
} bb_optimizer_config;

/* The defaults: AdamW at lr 1e-3 (betas 0.9, 0.999, eps 1e-8), SGD's
 * momentum 0.9, LARS's trust coefficient 0.001, no weight decay, cosine
 * schedule, clip at norm 1; and those of optimizer k (its eps: LAMB's
 * 1e-6; its momentum: Muon's 0.95). Never fail. */
bb_optimizer_config bb_optimizer_defaults(void);
bb_optimizer_config bb_optimizer_defaults_for(bb_optimizer_kind k);

/* ---- the optimizers' descriptors ----------------------------------------- */
#define BB_OPTIMIZER_MAX_STATE 4
/* How ZeRO cuts the parameters (--zero-shards auto|elements|tensors, in
 * this order): AUTO, as the optimizer's descriptor says; ELEMENTS, any run
 * of floats (element-wise updates: AdamW, SGD); TENSORS, whole tensors
 * (updates that read a whole matrix). A descriptor says ELEMENTS or
 * TENSORS. */
typedef enum bb_param_shard_rule {
    BB_PARAM_SHARD_AUTO = 0,
    BB_PARAM_SHARD_ELEMENTS,
    BB_PARAM_SHARD_TENSORS
} bb_param_shard_rule;
/* A run of one tensor's parameters the step updates, with its gradients
 * and its state (state_buffers of them). */
typedef struct bb_optimizer_piece {
    float *params;
    const float *grads;
    float *state[BB_OPTIMIZER_MAX_STATE];
    size_t n;
    bool decay;  /* weight decay applies (bb_tensor_info.decay) */
    bool hidden; /* a hidden matrix (bb_tensor_info.hidden) */
    int rows, cols; /* a whole matrix's shape; 0, 0 for a vector or a part of a tensor */
    float *work; /* the descriptor's work_floats of scratch (device memory); NULL when it needs none */
} bb_optimizer_piece;
/* How messages name a hyperparameter ("beta2": "--beta2" on the command
 * line); name NULL, or NULL returned: the optimizer's own words ("AdamW's
 * beta2"). */
typedef struct bb_optimizer_names {
    const char *(*name)(void *ctx, const char *hyperparameter);
    void *ctx;
} bb_optimizer_names;

typedef struct bb_optimizer_desc {
    const char *name;     /* --optimizer NAME, state.json's "optimizer", optimizer.bin's */
    const char *title;    /* messages: "AdamW" */
    const char *state;    /* --help: "two moments of state" */
    uint32_t version;     /* of its state in optimizer.bin */
    int state_buffers;    /* fp32 state floats per parameter */
    bb_param_shard_rule shard; /* TENSORS: its step needs whole tensors (pieces never cut one) */
    double eps;           /* its default eps (bb_optimizer_defaults_for); 0: it has none */
    double momentum;      /* its default momentum; 0: SGD's 0.9 */
    /* The scratch its step needs for tensor t, in floats (one buffer of the
     * largest is kept: bb_optimizer.work); NULL: none. */
    size_t (*work_floats)(const bb_tensor_info *t);
    /* Its hyperparameters' bounds (a division by zero, a state that
     * diverges): BB_ERR_ARG naming the hyperparameter (names may be NULL). */
    bb_status (*check)(const bb_optimizer_config *c, const bb_optimizer_names *names);
    /* Its own hyperparameters as text ("beta1 0.9, beta2 0.999, eps 1e-08"):
     * what processes agree on and a resume compares. */
    void (*describe)(const bb_optimizer_config *c, char *buf, size_t cap);
    /* One piece at learning rate lr, step `step` (0-based), the gradients
     * times grad_scale (a clip's factor) as they are read. */
    void (*step)(bb_backend_t *be, const bb_optimizer_config *c, const bb_optimizer_piece *p, float lr,
                 uint64_t step, float grad_scale);
} bb_optimizer_desc;

/* The descriptors, one a kind (src/optim/<name>.c). */
extern const bb_optimizer_desc bb_optimizer_adamw, bb_optimizer_sgd, bb_optimizer_lamb, bb_optimizer_lars,
    bb_optimizer_muon;
/* What AdamW and LAMB share (adamw.c): the moments' bounds (betas in
 * [0, 1), eps > 0; BB_ERR_ARG naming the one that is not, in d's words),
 * and their words ("beta1 0.9, beta2 0.999, eps 1e-08"). */
bb_status bb_optimizer_check_moments(const bb_optimizer_desc *d, const bb_optimizer_config *c,
                                     const bb_optimizer_names *names);
void bb_optimizer_describe_moments(const bb_optimizer_config *c, char *buf, size_t cap);
/* The descriptor of kind k; NULL for none. */
const bb_optimizer_desc *bb_optimizer_desc_of(bb_optimizer_kind k);
/* "adamw", "sgd", "lamb", "lars", "muon" (--optimizer's names), and back:
 * BB_ERR_ARG for another. */
const char *bb_optimizer_kind_name(bb_optimizer_kind k);
bb_status bb_optimizer_kind_parse(const char *s, bb_optimizer_kind *out);
/* "adamw|sgd|lamb|lars|muon" (--optimizer's choices) and "adamw (two moments
 * of state), sgd (momentum), ..." (its help). */
const char *bb_optimizer_choices(void);
const char *bb_optimizer_help(void);
/* The configuration's hyperparameters fit its optimizer and the schedule
 * (a finite, non-negative rate). Fails with BB_ERR_ARG naming the one that
 * does not (as `names` says; may be NULL). */
bb_status bb_optimizer_check(const bb_optimizer_config *c, const bb_optimizer_names *names);
/* Hyperparameter `hp` of optimizer d as messages name it, into buf. */
const char *bb_optimizer_param_name(const bb_optimizer_desc *d, const bb_optimizer_names *names, const char *hp,
                                    char *buf, size_t cap);
/* "cosine", "constant" (--lr-schedule's names), and back: BB_ERR_ARG for another. */
const char *bb_lr_schedule_name(bb_lr_schedule s);
bb_status bb_lr_schedule_parse(const char *s, bb_lr_schedule *out);
/* "none", "linear", "sqrt" (--lr-scale's names), and back: BB_ERR_ARG for another. */
const char *bb_lr_scale_name(bb_lr_scale s);
bb_status bb_lr_scale_parse(const char *s, bb_lr_scale *out);
/* The peak rate: lr scaled from base_batch to batch (lr as given without
 * lr_scale, or while batch or base_batch is 0). Never fails. */
double bb_lr_peak(const bb_optimizer_config *o);
/* The learning rate of step `step` (0-based) of a `total`-step run: a
 * linear warm-up to the peak (bb_lr_peak), then the schedule. */
double bb_lr_at(const bb_optimizer_config *o, uint64_t step, uint64_t total);

/* ---- ZeRO: the parameters cut among owners -----------------------------------
 * With ZeRO (--zero 1) the job's devices own the optimizer state in parts:
 * in every gradient bucket, owner k a run of floats of its own, which its
 * reduction leaves averaged there, its optimizer updates, and the gather
 * copies into every replica. Two rules (the optimizer's, or --zero-shards):
 * equal slices (BB_PARAM_SHARD_ELEMENTS: bucket b padded to owners × count[b]
 * floats, owner k's slice the k-th count[b] of them, cut to the bucket —
 * what NCCL's reduce-scatter and all-gather take), or whole tensors
 * (BB_PARAM_SHARD_TENSORS: each owner a run of the bucket's tensors, balanced by
 * size — what an update of whole matrices takes). */
typedef struct bb_param_shards {
    bb_param_shard_rule rule;
    int owners;
    bb_buckets buckets;
    size_t *lo, *hi; /* (buckets × owners): owner k's floats of bucket b at [b × owners + k] */
    size_t *count;   /* (buckets): equal slices' length; 0 for whole tensors (slices differ) */
} bb_param_shards;

/* The cut of `m`'s parameters on the buckets of `bucket_bytes` among
 * `owners` under `rule` (AUTO: elements). Fails with BB_ERR_NOMEM. */
bb_status bb_param_shards_make(const bb_model_t *m, size_t bucket_bytes, int owners, bb_param_shard_rule rule,
                               bb_param_shards *out);
void bb_param_shards_free(bb_param_shards *s);
static inline void bb_param_shards_slice(const bb_param_shards *s, int b, int k, size_t *lo, size_t *hi)
{
    *lo = s->lo[(size_t)b * s->owners + k];
    *hi = s->hi[(size_t)b * s->owners + k];
}
/* `asked`, or for AUTO the rule of optimizer `k`'s descriptor. Never fails. */
bb_param_shard_rule bb_param_shard_rule_for(bb_optimizer_kind k, bb_param_shard_rule asked);
/* "auto", "elements", "tensors" (--zero-shards); "(no rule)" for another. */
const char *bb_param_shard_rule_name(bb_param_shard_rule r);

/* What one owner's optimizer holds: its slice of every bucket, range r's
 * floats [lo[r], hi[r]) at state offset at[r]. */
typedef struct bb_param_shard {
    int ranges;
    size_t *lo, *hi, *at;
    size_t floats; /* the state's length: the sum of hi - lo */
    bool gradients; /* ZeRO-2: the optimizer keeps the shard's gradients too (bb_optimizer.grads) */
    bool parameters; /* ZeRO-3: and the shard's fp32 weights, the master copy (bb_optimizer.params) */
} bb_param_shard;

/* Owner `owner`'s part of `all`. Fails with BB_ERR_NOMEM. */
bb_status bb_param_shard_of(const bb_param_shards *all, int owner, bb_param_shard *out);
void bb_param_shard_free(bb_param_shard *s);

/* ---- one replica's optimizer --------------------------------------------- */
/* Its state (the descriptor's state_buffers fp32 buffers) for every
 * parameter, or for its shard's (shard.ranges > 0). */
typedef struct bb_optimizer {
    bb_optimizer_config cfg;
    const bb_optimizer_desc *desc;
    float *state[BB_OPTIMIZER_MAX_STATE]; /* device memory, `count` floats each */
    size_t count;  /* param_count, or the shard's floats */
    bb_param_shard shard;
    /* ZeRO-2 (shard.gradients): the shard's averaged gradients, laid out
     * as the state (`count` floats), which the reducer fills micro-step by
     * micro-step and the step reads instead of the model's; else NULL */
    float *grads;
    /* ZeRO-3 (shard.parameters): the shard's fp32 weights, laid out as the
     * state, which the step updates instead of the model's (the model keeps
     * a window of gathered weights, model.h); offloaded: the fp32 master
     * weights of its ranges in pinned host memory; else NULL */
    float *params;
    /* The step's scratch (bb_optimizer_desc.work_floats: Muon's), on the
     * backend the step runs on; else NULL */
    float *work;
    size_t work_floats;
    /* Offloaded (bb_optimizer_offload): the host backend the step runs on,
     * the state and params above in pinned host memory, and the gradients'
     * staging there; else NULL */
    bb_backend_t *host;
    float *host_grads;
    struct offload_plan *offload;
} bb_optimizer;

/* State for `m`'s parameters, or with `shard` (may be NULL; taken over by
 * the optimizer, also when it fails) for that shard, zeroed (and with
 * shard->gradients the shard's gradient buffer, with shard->parameters its
 * weights, unset until bb_optimizer_put_params). Fails with
 * BB_ERR_ARG for an unknown optimizer, BB_ERR_OOM, BB_ERR_DEVICE (the
 * zeroing); what it made is freed then (destroy is harmless). */
bb_status bb_optimizer_create(bb_backend_t *be, const bb_optimizer_config *c, const bb_model_t *m,
                              bb_param_shard *shard, bb_optimizer *o);
void bb_optimizer_destroy(bb_backend_t *be, bb_optimizer *o);
/* --offload optimizer: the same optimizer with its state (and the master
 * weights of its ranges: a copy of `m`'s, or under ZeRO-3 its shard, put
 * later) in pinned host memory (bb_backend_host_alloc of `be`), and `host`
 * (a CPU backend, kept by the caller) running its steps:
 * bb_optimizer_apply then copies the (reduced) gradients down in chunks,
 * steps each on the host as soon as it is there, and copies its updated
 * weights back up (not under ZeRO-3: the window gathers from the host
 * shard), the copies queued on the compute stream so that they overlap the
 * host's work. ZeRO-2's shard gradients stay on the device. host NULL: as
 * bb_optimizer_create. Needs bb_optimizer_offload_bytes of host memory
 * within `host_cap` (0: no cap). Fails as bb_optimizer_create, and with
 * BB_ERR_OOM naming the bytes needed when they exceed host_cap or cannot be
 * pinned. */
bb_status bb_optimizer_create_offloaded(bb_backend_t *be, bb_backend_t *host, uint64_t host_cap,
                                        const bb_optimizer_config *c, bb_model_t *m, bb_param_shard *shard,
                                        bb_optimizer *o);
/* The pinned host bytes an offloaded o takes (or o would take): its state,
 * master weights and gradients' staging. Never fails. */
uint64_t bb_optimizer_offload_bytes(const bb_optimizer *o);

/* ZeRO-3: the shard's weights from the whole weights on the host
 * (param_count floats), and back into their place there (the rest of
 * `host` untouched). Fail with BB_ERR_ARG for an optimizer that keeps no
 * weights, else like bb_backend_copy. */
bb_status bb_optimizer_put_params(bb_backend_t *be, bb_optimizer *o, const float *host);
bb_status bb_optimizer_get_params(bb_backend_t *be, const bb_optimizer *o, float *host);
/* A step is two passes over the gradients at most: their sum of squares
 * (this optimizer's part: all of them, or its shard's), which a caller
 * skips when it has the norm already (the CPU reducer adds it up as it
 * averages), then bb_optimizer_apply. */
double bb_optimizer_sum_squares(bb_backend_t *be, bb_model_t *m, const bb_optimizer *o); /* NAN after a device fault */
/* Given `norm`, the norm of the whole gradient (every shard's), updates
 * o's parameters for step `step` (0-based) of `total` with the gradients
 * clipped to norm cfg.grad_clip (when set), in one pass: the clip scales
 * them as the update reads them (the gradient buffer keeps the unclipped
 * values). *lr gets the rate used. A norm that is not finite (NaN or
 * infinite gradients) leaves the parameters and the optimizer state
 * untouched. */
void bb_optimizer_apply(bb_backend_t *be, bb_model_t *m, bb_optimizer *o, uint64_t step, uint64_t total, double norm,
                        double *lr);

/* ---- optimizer.bin ---------------------------------------------------------
 * A header (the optimizer's name and state version, the buffer count, the
 * floats per buffer, the XXH64 of the floats), then the floats: always the
 * whole state, in parameter order, whatever the devices or --zero. Save
 * gathers it from `n` optimizers (one whole one, or the shards that cover
 * the parameters, each on its backend) and, with `gather` (ZeRO over
 * processes), from every process: `gather` sums a host buffer over the
 * processes (every process joins; the others pass path NULL and write
 * nothing). Load takes the part `o` holds; it fails with BB_ERR_FORMAT
 * naming the file and both optimizers when the file holds another
 * optimizer's state (or another version of it), BB_ERR_CORRUPT when it is
 * damaged. Files of before the header named the optimizer (BBOPTIM1) still
 * load: their buffer count says which it was. */
typedef struct bb_state_gather {
    bb_status (*sum)(void *ctx, float *host, size_t n);
    void *ctx;
} bb_state_gather;
bb_status bb_optimizer_save(bb_backend_t *const *be, const bb_optimizer *const *o, int n, size_t param_count,
                            const bb_state_gather *gather, const char *path);
bb_status bb_optimizer_load(bb_backend_t *be, bb_optimizer *o, size_t param_count, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* BIGBATCH_OPTIM_H */
