/* lamb.c — LAMB (You et al., "Large Batch Optimization for Deep Learning:
 * Training BERT in 76 minutes", arXiv 1904.00962, Algorithm 2): AdamW's
 * two bias-corrected moments, then each tensor's step scaled by its trust
 * ratio ||w|| / ||r|| (r: the Adam direction plus the weight decay; 1 where
 * either norm is 0). The ratio needs a whole tensor, so ZeRO cuts its state
 * at tensor boundaries. Weight decay applies to matrices only (biases,
 * LayerNorm and RMSNorm weights excluded, as AdamW here); the trust ratio
 * to every tensor, as the paper's algorithm. */
#include <limits.h>

#include "bigbatch/optim.h"

static bb_status lamb_check(const bb_optimizer_config *c, const bb_optimizer_names *names)
{
    return bb_optimizer_check_moments(&bb_optimizer_lamb, c, names);
}

static void lamb_step(bb_backend_t *be, const bb_optimizer_config *c, const bb_optimizer_piece *p, float lr,
                      uint64_t step, float grad_scale)
{
    int t = step + 1 < INT_MAX ? (int)(step + 1) : INT_MAX;
    float wd = p->decay ? (float)c->weight_decay : 0.0f;
    bb_op_lamb(be, p->params, p->grads, p->state[0], p->state[1], p->n, lr, (float)c->beta1, (float)c->beta2,
               (float)c->eps, wd, t, grad_scale);
}

const bb_optimizer_desc bb_optimizer_lamb = {
    .name = "lamb",
    .title = "LAMB",
    .state = "two moments, a trust ratio per tensor",
    .version = 1,
    .state_buffers = 2,
    .shard = BB_PARAM_SHARD_TENSORS,
    .eps = 1e-6, /* the paper's */
    .check = lamb_check,
    .describe = bb_optimizer_describe_moments,
    .step = lamb_step,
};
