/* plan.h — the memory planner: what a training step needs on each device,
 * and which (micro-batch, accumulation, checkpointing) to run when the
 * global batch does not fit.
 *
 * How to use:
 *   bb_plan_request q = {.model = cfg, .devices = 1, .global_batch = 1024,
 *                        .device_mem = 128 << 20, .optimizer = BB_OPTIMIZER_ADAMW};
 *   bb_plan p;
 *   BB_TRY(bb_plan_make(&q, &p));        // every candidate, fitting or not
 *   if (p.chosen < 0) puts(p.why_nothing_fits);
 *   bb_plan_free(&p);
 *
 * Memory is measured, not modelled: for each candidate the planner builds
 * the model and the optimizer on a counting backend (backend.h) of the
 * device kind — allocations counted, nothing allocated, ops no-ops — and
 * runs one micro-step's forward and backward on it. Parameters, gradients
 * and optimizer state (4 bytes each per parameter, AdamW two moments, SGD
 * one), the two batch buffers (and, where the host is not the device, the
 * raw records' buffers), the activations of the checkpoint policy and the
 * backend's workspace (on GPUs the ops' scratch and cuBLAS's) are what the
 * model and the backend allocate, so the prediction is exact against the
 * allocator (tests/test_plan.c) and follows any change to the models. The
 * loader's host slots come from the loader itself (bb_loader_slot_bytes).
 * On a GPU the planner keeps a safety margin for what CUDA itself takes.
 *
 * Relative step time, with a calibration of the device kind (calibrate.h;
 * `plan --calibrate`): each candidate's work per op, counted on the
 * counting backend during its micro-step (recomputation included), weighed
 * with the measured cost per FLOP or element of that op at that
 * micro-batch, times the accumulation; 1.0 is the whole per-device batch
 * at once without checkpointing, and step_ms the predicted milliseconds.
 *
 * Without one it counts FLOPs: a step is forward (1) + backward (2) of
 * every example; checkpointing recomputes the forward of every recomputed
 * segment the backward must re-run (not the last), adding 1/L of a forward
 * per block, and a selective block's recomputation (two LayerNorms and a
 * GELU) BB_PLAN_SELECTIVE_COST of one; each micro-step also costs a
 * quarter of an example's compute (launches, the loader hand-off, smaller
 * matrices). Both are assumptions, checked in perf/RESULTS.md.
 */
#ifndef BIGBATCH_PLAN_H
#define BIGBATCH_PLAN_H

#include "bigbatch/calibrate.h"
#include "bigbatch/loader.h"
#include "bigbatch/optim.h"

/* A selective block's recomputation, as a share of the block's forward. */
#define BB_PLAN_SELECTIVE_COST 0.05

typedef struct bb_memory_breakdown {
    uint64_t parameters, gradients, optimizer, batches, activations, workspace;
    uint64_t total;           /* device memory: the sum of the above */
    uint64_t loader_slots;    /* host memory (pinned on GPUs), not in total: the loader's
                                 batch slots for this device with its defaults */
    uint64_t offloaded;       /* host memory (pinned), not in total: --offload optimizer's state,
                                 master weights and gradients' staging for this device, and the
                                 offloaded blocks' activations (policy 'o'), which are */
    uint64_t offloaded_activations;
    int recomputed_layers, selective_recomputes; /* not memory: what the micro-step recomputed
                                                    (bb_model_recompute_counts), for the time model */
} bb_memory_breakdown;

/* Device bytes one replica needs for `cfg` (seq_len/vocab or
 * inputs/classes filled) at micro-batch B with cfg->recompute_every on a
 * device of kind `device`; loader_slots for one device, 2 loader threads
 * and records as wide as the model takes. Fails with BB_ERR_ARG when the
 * model cannot be built (its message), BB_ERR_NOMEM. */
bb_status bb_plan_memory(const bb_model_config *cfg, int micro_batch, bb_optimizer_kind opt, bb_device_kind device,
                         bb_memory_breakdown *out);
/* --zero auto (after 0, 1, 2 and 3 in --zero's choices): the planner's pick. */
#define BB_ZERO_AUTO 4
/* How a job shards its state (train --zero, --zero-shards, --bucket-mib):
 * ZeRO stage 0 (none), 1 (the optimizer state), 2 (and the gradients:
 * a window of buckets in the model, the largest shard's gradients in the
 * optimizer) or 3 (and the weights: a window of them in the model, the
 * shard's fp32 master weights in the optimizer) over `devices`, cut under
 * `rule` on buckets of `bucket_bytes` as the trainer cuts them. */
typedef struct bb_plan_zero {
    int stage, devices;
    size_t bucket_bytes;
    bb_param_shard_rule rule;
    bool offload;              /* --offload optimizer: the state (and master weights) in host memory */
} bb_plan_zero;
/* The same under `zero` (NULL, stage 0 or one device: no sharding): the
 * device holding the largest shard. */
bb_status bb_plan_memory_sharded(const bb_model_config *cfg, int micro_batch, bb_optimizer_kind opt,
                                 bb_device_kind device, const bb_plan_zero *zero, bb_memory_breakdown *out);

/* The work per op of one micro-step (forward and backward, recomputation
 * included) and of the optimizer's step, as the counting backend counted
 * it (bb_op_time: calls, FLOPs, elements, bytes; no times). */
#define BB_STEP_WORK_CAP 64
typedef struct bb_step_work {
    bb_op_time micro[BB_STEP_WORK_CAP], opt[BB_STEP_WORK_CAP];
    int nmicro, nopt;
    size_t params;             /* the model's parameters */
} bb_step_work;
/* The work of cfg's step at micro-batch B on a device of kind `device`,
 * one device (large: allocate it). Fails as bb_plan_memory. */
bb_status bb_plan_step_work(const bb_model_config *cfg, int micro_batch, bb_optimizer_kind opt, bb_device_kind device,
                            bb_step_work *out);

typedef struct bb_plan_request {
    bb_model_config model;     /* shape filled from the data; its checkpoint policy only when fixed_recompute */
    int devices, global_batch;
    uint64_t device_mem;       /* per device; 0: no limit (the fastest choice wins) */
    bb_optimizer_kind optimizer;
    bb_device_kind device;
    int loader_threads;        /* for loader_slots; 0: train's default */
    uint32_t record_size;      /* the data's bytes per record, for loader_slots; 0: the widest the model takes */
    int fixed_micro_batch;     /* > 0: only this micro-batch */
    bool fixed_recompute;     /* only model's checkpoint policy (recompute_every, recompute_plan); else any */
    double margin;             /* kept free, a fraction of device_mem (default 0.05 when 0) */
    int zero;                  /* train --zero: 1 the optimizer state sharded over the devices, 2 the gradients
                                  too, 3 the weights too; BB_ZERO_AUTO: the lowest stage at which a candidate fits */
    int zero_top;              /* the highest stage --zero auto may pick (the trainer's reach); 0: 3 */
    bb_offload offload;        /* train --offload: BB_OFFLOAD_OPTIMIZER the optimizer on the host; AUTO: only
                                  when no stage fits without it */
    uint64_t host_mem;         /* train --host-mem: the host bytes offload may pin per device; 0: no cap */
    double link_gbps;          /* --link-gbps: the host link's GB/s, which prices activation offload (policy
                                  'o'); 0: the calibration's measure. With neither, or on a kind whose memory
                                  is the host's, or without a calibration, the planner does not offer 'o' */
    bb_param_shard_rule zero_shards; /* how (train --zero-shards); 0: the optimizer's rule */
    double bucket_mib;         /* the reducer's buckets, which the shards follow; 0: train's default */
    const bb_calibration *calibration; /* the device kind's op costs; NULL: the FLOP rule */
} bb_plan_request;

typedef struct bb_plan_row {
    int micro_batch, accumulation, recompute_every;
    char recompute_plan[BB_RECOMPUTE_MAX_BLOCKS + 1]; /* with recompute_every: bb_model_config's */
    char recompute[BB_RECOMPUTE_NAME_MAX]; /* as --checkpoint: "none", "selective", "blocks", "every:3", "plan:s*2,f*2" */
    bb_memory_breakdown memory;
    double relative_time;      /* 1.0: the whole per-device batch at once, no checkpointing */
    double step_ms;            /* predicted step time of the model's work (calibrated); 0 without */
    int loss_chunk;            /* tokens per chunk of the fused head + loss (bb_model_loss_chunk); 0: none */
    bool fits, chosen;
} bb_plan_row;

typedef struct bb_plan {
    bb_plan_row *rows;
    int count;
    int chosen;                /* index of the chosen row, -1 when nothing fits */
    uint64_t budget;           /* device_mem minus the margin */
    int zero;                  /* the ZeRO stage of the rows: the request's, or --zero auto's pick */
    bool offload;              /* the rows offload the optimizer: the request's, or --offload auto's pick */
    double link_gbps;          /* the link that priced offloaded blocks (policy 'o'); 0: 'o' not offered */
    char why_nothing_fits[512];
    char why_zero[1100];       /* --zero auto: why each stage below the pick did not fit ("" at stage 0) */
} bb_plan;

/* Every (micro-batch dividing G/devices, checkpoint policy) candidate,
 * the fastest that fits chosen (ties: the larger micro-batch); under
 * --zero auto, those of the lowest stage at which one fits (out->zero). Fails with
 * BB_ERR_ARG when G is not a multiple of devices or the model cannot be
 * built, BB_ERR_NOMEM. */
bb_status bb_plan_make(const bb_plan_request *q, bb_plan *out);
void bb_plan_free(bb_plan *p);

/* plan --largest: the widest member of q->model's shape family
 * (bb_model_scaled: the same head size, blocks per width and, for a llama,
 * grouping and SwiGLU share) for which bb_plan_make finds a plan under q
 * (its devices, --device-mem, global batch, ZeRO stage or auto), found by
 * doubling the member then halving the gap; its plan, and the next member,
 * which does not fit, with the planner's reason. Fails with BB_ERR_ARG
 * without q->device_mem, BB_ERR_UNSUPPORTED for kinds without a family,
 * BB_ERR_OOM when not even member 1 fits (the reason), as bb_plan_make. */
typedef struct bb_largest {
    int member;                   /* k of bb_model_scaled */
    bb_model_config model, next;  /* the largest that fits; the next member, which does not */
    size_t parameters, next_parameters;
    bb_plan plan;                 /* the largest's */
    char why_next[512];
} bb_largest;
bb_status bb_plan_largest(const bb_plan_request *q, bb_largest *out);
void bb_largest_free(bb_largest *l);

/* The per-block plan of an L-block model (kinds with bb_model_block_costs)
 * that costs least while its device activations exceed keeping everything
 * by at most `room` bytes (negative: must save that much). `t` weighs one
 * block's policy (any unit): a selective block's and a full block's
 * recomputation, an offloaded block's copies that compute does not hide
 * (offload < 0: 'o' is not offered); max_offloaded > 0 caps the 'o' blocks
 * (their host memory). A dynamic program over the blocks
 * (block_plan.c). Writes the plan's letters (BB_RECOMPUTE_*, L of them and
 * a NUL) into `plan`, its extra bytes and time; returns false when no plan
 * fits (or out of memory). The planner checks its pick on the counting
 * backend like every candidate. */
typedef struct bb_block_times {
    double selective, full, offload;
    int max_offloaded; /* 0: no cap */
} bb_block_times;
bool bb_plan_best_blocks(int L, const bb_block_costs *k, int64_t room, const bb_block_times *t, char *plan,
                         int64_t *bytes, double *time);

#endif /* BIGBATCH_PLAN_H */
