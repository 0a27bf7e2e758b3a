/* sgd.c — SGD with momentum (PyTorch's rule: buf = momentum·buf + g + wd·p):
 * one fp32 momentum per parameter, updated element by element, so a shard
 * may be any run of floats. */
#include <math.h>

#include "bigbatch/optim.h"

static bb_status sgd_check(const bb_optimizer_config *c, const bb_optimizer_names *names)
{
    char n[64];
    if (!(c->momentum >= 0 && c->momentum <= 1))
        return bb_fail(BB_ERR_ARG, "%s %g: must be in [0, 1] (above 1 the momentum grows without bound)",
                       bb_optimizer_param_name(&bb_optimizer_sgd, names, "momentum", n, sizeof n), c->momentum);
    return BB_OK;
}

static void sgd_describe(const bb_optimizer_config *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "momentum %.17g", c->momentum);
}

static void sgd_step(bb_backend_t *be, const bb_optimizer_config *c, const bb_optimizer_piece *p, float lr,
                     uint64_t step, float grad_scale)
{
    (void)step;
    float wd = p->decay ? (float)c->weight_decay : 0.0f;
    bb_op_sgd(be, p->params, p->grads, p->state[0], p->n, lr, (float)c->momentum, wd, grad_scale);
}

const bb_optimizer_desc bb_optimizer_sgd = {
    .name = "sgd",
    .title = "SGD",
    .state = "momentum",
    .version = 1,
    .state_buffers = 1,
    .shard = BB_PARAM_SHARD_ELEMENTS,
    .check = sgd_check,
    .describe = sgd_describe,
    .step = sgd_step,
};
