/* largest.c — plan --largest: the widest member of a model's shape family
 * (bb_model_scaled) for which the planner finds a plan (plan.h). */
#include <stdlib.h>

#include "bigbatch/plan.h"

/* Member k: the largest that fits so far (*fit), or the smallest that
 * does not (*miss, and the planner's reason). */
static bb_status try_member(const bb_plan_request *q, int k, int *fit, int *miss, bb_largest *out)
{
    bb_plan_request one = *q;
    BB_TRY(bb_model_scaled(&q->model, k, &one.model));
    bb_plan p;
    BB_TRY(bb_plan_make(&one, &p));
    if (p.chosen >= 0) *fit = k;
    else *miss = k, snprintf(out->why_next, sizeof out->why_next, "%s", p.why_nothing_fits);
    bb_plan_free(&p);
    return BB_OK;
}

static bb_status count_parameters(const bb_model_config *c, bb_device_kind device, size_t *out)
{
    bb_backend_t *be;
    BB_TRY(bb_backend_create_counting(device, NULL, &be));
    bb_model_t *m;
    bb_status rc = bb_model_create(be, c, 1, &m);
    if (rc == BB_OK) *out = bb_model_param_count(m), bb_model_destroy(m);
    bb_backend_destroy(be);
    return rc;
}

bb_status bb_plan_largest(const bb_plan_request *q, bb_largest *out)
{
    *out = (bb_largest){0};
    if (!q->device_mem)
        return bb_fail(BB_ERR_ARG, "--largest needs --device-mem: without a limit every size fits");
    bb_model_config probe;
    BB_TRY(bb_model_scaled(&q->model, 1, &probe)); /* a kind with a family */
    /* Doubling until a member does not fit, then halving the gap: memory
     * grows with the width (and the blocks, which follow it). */
    int fit = 0, miss = 0;
    for (int k = 1; !miss; k *= 2) {
        BB_TRY(try_member(q, k, &fit, &miss, out));
        if (k >= 1 << 14 && !miss) return bb_fail(BB_ERR_ARG, "--largest: member %d of the family still fits", k);
    }
    if (!fit)
        return bb_fail(BB_ERR_OOM, "plan --largest: not even the smallest of the family fits: %s", out->why_next);
    while (miss - fit > 1) BB_TRY(try_member(q, fit + (miss - fit) / 2, &fit, &miss, out));
    out->member = fit;
    BB_TRY(bb_model_scaled(&q->model, fit, &out->model));
    BB_TRY(bb_model_scaled(&q->model, miss, &out->next));
    BB_TRY(count_parameters(&out->model, q->device, &out->parameters));
    BB_TRY(count_parameters(&out->next, q->device, &out->next_parameters));
    bb_plan_request one = *q;
    one.model = out->model;
    return bb_plan_make(&one, &out->plan);
}

void bb_largest_free(bb_largest *l) { bb_plan_free(&l->plan); }
