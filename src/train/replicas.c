/* replicas.c — each device's replica: its backend, its model (initialised,
 * loaded from --init-from or from the checkpoint resumed) and its optimizer
 * (ZeRO's shard of it, offloaded or not). */
#include <stdlib.h>

#include "bigbatch/world.h"
#include "trainer.h"

/* Replica d's weights: initialised, or --init-from's, or the checkpoint's.
 * Under ZeRO-3 only replica 0 reads them, into the lent host buffer, from
 * which every replica's optimizer takes its shard. */
static bb_status load_weights(trainer *t, replica *r, const bb_checkpoint_info *resume)
{
    if (t->zero == 3 && r->index > 0) return BB_OK;
    BB_TRY(bb_model_init(r->model, t->seed));
    if (t->o->init_from) BB_TRY(bb_model_load_weights(r->model, t->o->init_from));
    return resume ? bb_checkpoint_load_weights(resume, r->model) : BB_OK;
}

/* One replica per device: backend, model (initialised, or loaded), optimizer.
 * ZeRO-3: *host, the whole weights on the host for the optimizers to take
 * their shards from (the caller frees it). */
static bb_status build_each(trainer *t, const bb_checkpoint_info *resume, float **host)
{
    const bb_train_options *o = t->o;
    /* Each CPU device's threads (its pool): the cores divided among the
     * workers of every process on this machine. */
    int workers = t->spec.count * bb_world_get()->local_size;
    int threads = bb_cpu_count() / workers > 1 ? bb_cpu_count() / workers : 1;
    for (int d = 0; d < t->spec.count; d++) {
        replica *r = &t->replicas[d];
        *r = (replica){.t = t, .index = d};
        bb_backend_options bo = {.device = t->spec.ids[d], .device_mem = o->device_mem, .threads = threads,
                                 .precision = o->precision, .attention = o->attention};
        BB_TRY(bb_backend_create(t->spec.kind, &bo, &r->be));
        bb_model_config mc = t->cfg;
        /* the gradients (ZeRO-2) and the weights (ZeRO-3) bucket by bucket (model.h) */
        if (t->zero >= 2) mc.grad_window_bytes = bb_bucket_bytes(o->bucket_mib);
        if (t->zero == 3) mc.param_window_bytes = bb_bucket_bytes(o->bucket_mib);
        BB_TRY(bb_model_create(r->be, &mc, t->micro_batch, &r->model));
        size_t params = bb_model_param_count(r->model);
        if (t->zero == 3 && d == 0 && !(*host = malloc(params * sizeof **host)))
            return bb_fail(BB_ERR_NOMEM, "out of memory for the %zu weights to shard (ZeRO-3)", params);
        bb_model_lend_host_weights(r->model, *host);
        bb_status rc = load_weights(t, r, resume);
        bb_model_lend_host_weights(r->model, NULL);
        BB_TRY(rc);
        bb_param_shard shard = {0};
        if (t->zero && d == 0) { /* the cut of every bucket among all the job's devices */
            bb_param_shard_rule rule = bb_param_shard_rule_for(o->opt.kind, o->zero_shards);
            BB_TRY(bb_param_shards_make(r->model, bb_bucket_bytes(o->bucket_mib), trainer_world_devices(t), rule, &t->shards));
        }
        if (t->zero) BB_TRY(bb_param_shard_of(&t->shards, t->spec.rank * t->spec.count + d, &shard));
        shard.gradients = t->zero >= 2;
        shard.parameters = t->zero == 3;
        if (t->offload) /* the step on the host's cores, as the device's share of them */
            BB_TRY(bb_backend_create_cpu(&(bb_backend_options){.threads = threads}, &r->host));
        BB_TRY(bb_optimizer_create_offloaded(r->be, r->host, o->host_mem, &t->opt, r->model, t->zero ? &shard : NULL,
                                             &r->opt));
        if (t->zero == 3) BB_TRY(bb_optimizer_put_params(r->be, &r->opt, *host));
        if (resume) BB_TRY(bb_checkpoint_load_optimizer(resume, r->be, &r->opt, params));
    }
    return BB_OK;
}

bb_status bb_trainer_build_replicas(trainer *t, const bb_checkpoint_info *resume)
{
    float *host = NULL;
    bb_status rc = build_each(t, resume, &host);
    free(host);
    return rc;
}
