/* plan.h — the memory planner: what a training step needs on each device,
 * and which (micro-batch, accumulation, checkpointing) to run when the
 * global batch does not fit.
 *
 * How to use:
 *   bb_plan_request q = {.model = cfg, .devices = 1, .global_batch = 1024,
 *                        .device_mem = 128 << 20, .optimizer = BB_OPT_ADAMW};
 *   bb_plan p;
 *   BB_TRY(bb_plan_make(&q, &p));        // every candidate, fitting or not
 *   if (p.chosen < 0) puts(p.why_nothing_fits);
 *   bb_plan_free(&p);
 *
 * The memory model mirrors what the models allocate (model.c, gpt.c,
 * mlp.c, batch.c) and what the trainer adds: parameters, gradients and
 * optimizer state (4 bytes each per parameter, AdamW two moments, SGD one),
 * two batch buffers, and the activations of the checkpoint policy: for gpt
 * with L blocks in segments of K, micro-batch B, sequence T, width C, H
 * heads and vocabulary V, one block's slot is 4·(B·T·(16C + 4) + B·H·T²)
 * bytes; a run keeps min(K, L) slots, ceil(L/K) segment inputs of 4·B·T·C,
 * and 4·(B·T·(10C + 2 + V) + B·H·T²) for the final norm, the logits and the
 * backward scratch. With bf16 activations one slot's tensors stay fp32 as
 * work buffers, min(K, L) − 1 more are kept at 2 bytes per element (the
 * LayerNorm statistics, 16·B·T per slot, stay fp32), segment inputs take
 * 2·B·T·C, and the block input 4·B·T·C more. On the CPU that is all of it (tests check the
 * prediction against the allocator); on a GPU the planner adds the
 * backend's small uncounted scratch and keeps a safety margin.
 *
 * Relative step time counts FLOPs: a step is forward (1) + backward (2) of
 * every example; checkpointing recomputes the forward of every segment but
 * the last, adding (S−1)·K/L of a forward; each micro-step also costs a
 * quarter of an example's compute (launches, the loader hand-off, smaller
 * matrices — an assumption, checked in perf/RESULTS.md).
 */
#ifndef BIGBATCH_PLAN_H
#define BIGBATCH_PLAN_H

#include "bigbatch/train.h"

typedef struct bb_memory_breakdown {
    uint64_t parameters, gradients, optimizer, batches, activations, workspace;
    uint64_t total;           /* device memory: the sum of the above */
    uint64_t loader_slots;    /* host memory (pinned on GPUs), not in total: the loader's
                                 batch slots for this device with its defaults */
} bb_memory_breakdown;

/* Device bytes one replica needs for `cfg` (seq_len/vocab or
 * inputs/classes filled) at micro-batch B with cfg->checkpoint_every. */
void bb_plan_memory(const bb_model_config *cfg, int micro_batch, bb_optimizer_kind opt, bool cuda,
                    bb_memory_breakdown *out);

typedef struct bb_plan_request {
    bb_model_config model;     /* shape filled from the data; checkpoint_every ignored */
    int devices, global_batch;
    uint64_t device_mem;       /* per device; 0: no limit (the fastest choice wins) */
    bb_optimizer_kind optimizer;
    bool cuda;
    int fixed_micro_batch;     /* > 0: only this micro-batch */
    int fixed_checkpoint;      /* >= 0: only this checkpoint_every; -1: any */
    double margin;             /* kept free, a fraction of device_mem (default 0.05 when 0) */
} bb_plan_request;

typedef struct bb_plan_row {
    int micro_batch, accumulation, checkpoint_every;
    char checkpoint[24];       /* "none", "blocks", "every:3" */
    bb_memory_breakdown memory;
    double relative_time;      /* 1.0: the whole per-device batch at once, no checkpointing */
    bool fits, chosen;
} bb_plan_row;

typedef struct bb_plan {
    bb_plan_row *rows;
    int count;
    int chosen;                /* index of the chosen row, -1 when nothing fits */
    uint64_t budget;           /* device_mem minus the margin */
    char why_nothing_fits[512];
} bb_plan;

/* Every (micro-batch dividing G/devices, checkpoint policy) candidate,
 * the fastest that fits chosen (ties: the larger micro-batch). Fails with
 * BB_ERR_ARG when G is not a multiple of devices, BB_ERR_NOMEM. */
bb_status bb_plan_make(const bb_plan_request *q, bb_plan *out);
void bb_plan_free(bb_plan *p);

#endif /* BIGBATCH_PLAN_H */
