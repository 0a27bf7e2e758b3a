/* adamw.c — AdamW (decoupled weight decay, bias-corrected moments; PyTorch's
 * torch.optim.AdamW): two fp32 moments per parameter, updated element by
 * element, so a shard may be any run of floats; and the checks and words
 * of the moments it shares with LAMB. */
#include <limits.h>
#include <math.h>

#include "bigbatch/optim.h"

bb_status bb_optimizer_check_moments(const bb_optimizer_desc *d, const bb_optimizer_config *c,
                                     const bb_optimizer_names *names)
{
    char n[64];
    const double betas[2] = {c->beta1, c->beta2};
    for (int i = 0; i < 2; i++)
        if (!(betas[i] >= 0 && betas[i] < 1))
            return bb_fail(BB_ERR_ARG, "%s %g: must be in [0, 1) (1 makes %s's bias correction divide by zero)",
                           bb_optimizer_param_name(d, names, i ? "beta2" : "beta1", n, sizeof n), betas[i], d->title);
    if (!(c->eps > 0))
        return bb_fail(BB_ERR_ARG, "%s %g: must be positive (0 divides zero by zero for unused weights)",
                       bb_optimizer_param_name(d, names, "eps", n, sizeof n), c->eps);
    return BB_OK;
}

void bb_optimizer_describe_moments(const bb_optimizer_config *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "beta1 %.17g, beta2 %.17g, eps %.17g", c->beta1, c->beta2, c->eps);
}

static bb_status adamw_check(const bb_optimizer_config *c, const bb_optimizer_names *names)
{
    return bb_optimizer_check_moments(&bb_optimizer_adamw, c, names);
}

static void adamw_step(bb_backend_t *be, const bb_optimizer_config *c, const bb_optimizer_piece *p, float lr,
                       uint64_t step, float grad_scale)
{
    int t = step + 1 < INT_MAX ? (int)(step + 1) : INT_MAX; /* bias corrections are 1 long before */
    float wd = p->decay ? (float)c->weight_decay : 0.0f;
    bb_op_adamw(be, p->params, p->grads, p->state[0], p->state[1], p->n, lr, (float)c->beta1, (float)c->beta2,
                (float)c->eps, wd, t, grad_scale);
}

const bb_optimizer_desc bb_optimizer_adamw = {
    .name = "adamw",
    .title = "AdamW",
    .state = "two moments of state",
    .version = 1,
    .state_buffers = 2,
    .shard = BB_PARAM_SHARD_ELEMENTS,
    .eps = 1e-8, /* PyTorch's */
    .check = adamw_check,
    .describe = bb_optimizer_describe_moments,
    .step = adamw_step,
};
