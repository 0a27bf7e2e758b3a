/* muon.c — Muon (Keller Jordan et al., "Muon: An optimizer for hidden
 * layers in neural networks", 2024, as modded-nanogpt runs it; the update's
 * scale as Moonlight's, Liu et al., arXiv 2502.16982): on every hidden
 * matrix (bb_tensor_info.hidden: a block's products) Nesterov momentum
 * (0.95) whose direction five Newton-Schulz iterations take near its
 * orthogonal factor, scaled by 0.2·sqrt(max(rows, cols)) so that its RMS
 * matches AdamW's (one --lr and one --weight-decay serve both parts), with
 * decoupled weight decay; on everything else (the embeddings, the head,
 * the MLP's first and last layers, biases and norms) AdamW, with --lr, the
 * betas and eps as --optimizer adamw's.
 *
 * The state is two buffers for every parameter: AdamW's two moments, or
 * Muon's momentum (its second buffer unused). The iteration needs a whole
 * matrix, so ZeRO cuts the state at tensor boundaries; it runs in fp32
 * (the products' bf16 where the backend runs bf16, as modded-nanogpt's). */
#include <math.h>

#include "bigbatch/optim.h"

/* Moonlight's factor: 0.2 · sqrt(max(A, B)) gives the update AdamW's RMS (about 0.2). */
#define MUON_RMS 0.2

static bb_status muon_check(const bb_optimizer_config *c, const bb_optimizer_names *names)
{
    char n[64];
    if (!(c->momentum >= 0 && c->momentum < 1))
        return bb_fail(BB_ERR_ARG, "%s %g: must be in [0, 1) (1 never lets the gradient in)",
                       bb_optimizer_param_name(&bb_optimizer_muon, names, "momentum", n, sizeof n), c->momentum);
    return bb_optimizer_check_moments(&bb_optimizer_muon, c, names);
}

static void muon_describe(const bb_optimizer_config *c, char *buf, size_t cap)
{
    char adam[160];
    bb_optimizer_describe_moments(c, adam, sizeof adam);
    snprintf(buf, cap, "momentum %.17g, %d Newton-Schulz steps; AdamW's %s", c->momentum, BB_MUON_NS_STEPS, adam);
}

static size_t muon_work_floats(const bb_tensor_info *t)
{
    return t->hidden && t->rank == 2 ? bb_muon_work_floats(t->shape[0], t->shape[1]) : 0;
}

static void muon_step(bb_backend_t *be, const bb_optimizer_config *c, const bb_optimizer_piece *p, float lr,
                      uint64_t step, float grad_scale)
{
    if (!p->hidden || !p->rows || !p->work) { /* never a part of a hidden matrix: ZeRO cuts at tensors */
        bb_optimizer_adamw.step(be, c, p, lr, step, grad_scale);
        return;
    }
    float wd = p->decay ? (float)c->weight_decay : 0.0f;
    float scale = (float)(MUON_RMS * sqrt((double)(p->rows > p->cols ? p->rows : p->cols)));
    bb_op_muon(be, p->params, p->grads, p->state[0], p->work, p->rows, p->cols, lr, (float)c->momentum, wd, scale,
               grad_scale);
}

const bb_optimizer_desc bb_optimizer_muon = {
    .name = "muon",
    .title = "Muon",
    .state = "momentum on hidden matrices, AdamW's two moments elsewhere",
    .version = 1,
    .state_buffers = 2,
    .shard = BB_PARAM_SHARD_TENSORS,
    .eps = 1e-8,     /* its AdamW's */
    .momentum = 0.95, /* modded-nanogpt's and Moonlight's */
    .work_floats = muon_work_floats,
    .check = muon_check,
    .describe = muon_describe,
    .step = muon_step,
};
