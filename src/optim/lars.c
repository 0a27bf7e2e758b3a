/* lars.c — LARS (You, Gitman and Ginsburg, "Large Batch Training of
 * Convolutional Networks", arXiv 1708.03888): SGD with momentum whose
 * every matrix's update is scaled by its layer-wise trust ratio
 * trust_coefficient · ||w|| / (||g|| + weight_decay · ||w||) (1 where a
 * norm is 0), the rate applied after the momentum as PyTorch's SGD does.
 * Biases and normalization weights take neither the decay nor the ratio
 * (as Goyal et al. and the common implementations). The ratio needs a
 * whole tensor, so ZeRO cuts its state at tensor boundaries. */
#include "bigbatch/optim.h"

static bb_status lars_check(const bb_optimizer_config *c, const bb_optimizer_names *names)
{
    char n[64];
    if (!(c->momentum >= 0 && c->momentum <= 1))
        return bb_fail(BB_ERR_ARG, "%s %g: must be in [0, 1] (above 1 the momentum grows without bound)",
                       bb_optimizer_param_name(&bb_optimizer_lars, names, "momentum", n, sizeof n), c->momentum);
    if (!(c->trust_coefficient > 0 && c->trust_coefficient <= 1))
        return bb_fail(BB_ERR_ARG, "%s %g: must be in (0, 1] (the paper's 0.001 is the usual)",
                       bb_optimizer_param_name(&bb_optimizer_lars, names, "trust_coefficient", n, sizeof n),
                       c->trust_coefficient);
    return BB_OK;
}

static void lars_describe(const bb_optimizer_config *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "momentum %.17g, trust_coefficient %.17g", c->momentum, c->trust_coefficient);
}

static void lars_step(bb_backend_t *be, const bb_optimizer_config *c, const bb_optimizer_piece *p, float lr,
                      uint64_t step, float grad_scale)
{
    (void)step;
    float wd = p->decay ? (float)c->weight_decay : 0.0f, coefficient = p->decay ? (float)c->trust_coefficient : 0.0f;
    bb_op_lars(be, p->params, p->grads, p->state[0], p->n, lr, (float)c->momentum, wd, coefficient, grad_scale);
}

const bb_optimizer_desc bb_optimizer_lars = {
    .name = "lars",
    .title = "LARS",
    .state = "momentum, a trust ratio per matrix",
    .version = 1,
    .state_buffers = 1,
    .shard = BB_PARAM_SHARD_TENSORS,
    .check = lars_check,
    .describe = lars_describe,
    .step = lars_step,
};
