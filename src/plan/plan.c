/* plan.c — memory measured on a counting backend, and the candidate
 * table (see plan.h). */
#include <stdlib.h>
#include <string.h>

#include "bigbatch/plan.h"
#include "bigbatch/optim.h"

/* Loader slots (host memory, per device) for the request's devices,
 * loader threads and records. */
static uint64_t loader_slots(const bb_model_config *c, int micro_batch, int devices, int threads, uint32_t record)
{
    bb_loader_options lo;
    bb_loader_training_options(devices, micro_batch, threads, &lo);
    return bb_loader_slot_bytes(&lo, record ? record : bb_model_record_buffer_bytes(c, 1));
}

/* Builds the model and the optimizer on a counting backend of the device
 * kind and runs one micro-step there: what they allocate is what a run
 * does (plan.h). */
bb_status bb_plan_memory(const bb_model_config *c, int micro_batch, bb_optimizer_kind opt, bb_device_kind device,
                         bb_memory_breakdown *out)
{
    return bb_plan_memory_sharded(c, micro_batch, opt, device, 1, 0, out);
}

/* The largest of `shards` shards (they differ by a float per bucket). */
static bb_status largest_shard(const bb_model_t *m, int shards, size_t bucket_bytes, bb_shard *out)
{
    *out = (bb_shard){0};
    for (int k = 0; k < shards; k++) {
        bb_shard s;
        bb_status rc = bb_shard_make(m, bucket_bytes, shards, k, &s);
        if (rc != BB_OK) {
            bb_shard_free(out);
            return rc;
        }
        if (s.floats > out->floats || !out->lo) bb_shard_free(out), *out = s;
        else bb_shard_free(&s);
    }
    return BB_OK;
}

enum { WORK_CAP = 64 };

/* bb_plan_memory_sharded, and the work of the micro-step per op (work may be NULL). */
static bb_status measure(const bb_model_config *c, int micro_batch, bb_optimizer_kind opt, bb_device_kind device,
                         int shards, size_t bucket_bytes, bb_memory_breakdown *out, bb_op_time *work, int *nwork)
{
    memset(out, 0, sizeof *out);
    bb_backend_t *be = NULL;
    bb_model_t *m = NULL;
    bb_optimizer o = {0};
    double loss;
    bb_status rc;
    BB_TRY_GOTO(bb_backend_create_counting(device, NULL, &be), rc, done);
    BB_TRY_GOTO(bb_model_create(be, c, micro_batch, &m), rc, done);
    uint64_t model_bytes = bb_backend_bytes_in_use(be), P = bb_model_param_count(m) * sizeof(float);
    bb_shard shard = {0};
    if (shards > 1) BB_TRY_GOTO(largest_shard(m, shards, bucket_bytes, &shard), rc, done);
    BB_TRY_GOTO(bb_optimizer_create(be, &(bb_optimizer_config){.kind = opt}, bb_model_param_count(m),
                                    shards > 1 ? &shard : NULL, &o), rc, done);
    out->optimizer = bb_backend_bytes_in_use(be) - model_bytes;
    BB_TRY_GOTO(bb_model_forward(m, 1.0f, &loss, NULL), rc, done);
    BB_TRY_GOTO(bb_model_backward(m, false), rc, done);
    out->parameters = out->gradients = P;
    out->activations = bb_model_activation_bytes(m);
    out->batches = model_bytes - 2 * P - out->activations;
    out->workspace = bb_backend_workspace_bytes(be);
    out->total = bb_backend_peak_bytes(be) + out->workspace;
    out->loader_slots = loader_slots(c, micro_batch, 1, 0, 0);
    bb_model_recompute_counts(m, &out->recomputed_layers, &out->selective_recomputes);
    if (work) *nwork = bb_backend_op_profile(be, work, WORK_CAP);
done:
    if (be) bb_optimizer_destroy(be, &o);
    bb_model_destroy(m);
    bb_backend_destroy(be);
    return rc;
}

bb_status bb_plan_memory_sharded(const bb_model_config *c, int micro_batch, bb_optimizer_kind opt,
                                 bb_device_kind device, int shards, size_t bucket_bytes, bb_memory_breakdown *out)
{
    return measure(c, micro_batch, opt, device, shards, bucket_bytes, out, NULL, NULL);
}

/* ---- candidates -------------------------------------------------------- */
/* Per micro-step overhead (launches, the loader hand-off, small-matrix
 * inefficiency), in examples' worth of compute: an assumption, checked
 * against measurements in perf/RESULTS.md. */
#define MICRO_STEP_COST 0.25

static double relative_time(const bb_model_config *c, const bb_memory_breakdown *mem, int micro_batch,
                            int accumulation)
{
    double layers = bb_model_layers(c); /* shares of a forward done again: */
    double recompute = (mem->recomputed_layers + BB_PLAN_SELECTIVE_COST * mem->selective_recomputes) / layers;
    double examples = (double)micro_batch * accumulation;
    return (3.0 + recompute) / 3.0 * (examples + MICRO_STEP_COST * accumulation) / (examples + MICRO_STEP_COST);
}

/* The checkpoint policies a request tries: its own when fixed, else none,
 * selective (kinds with per-block policies), blocks, and every:K for K
 * dividing into fewer segments. */
static int candidate_policies(const bb_plan_request *q, bb_model_config *out, int cap)
{
    int layers = bb_model_layers(&q->model), n = 0;
    if (q->fixed_checkpoint) {
        out[n++] = q->model;
        return n;
    }
    static const char *const names[] = {"none", "selective", "blocks"};
    for (size_t i = 0; i < sizeof names / sizeof *names && n < cap; i++) {
        out[n] = q->model;
        if (bb_model_parse_checkpoint(names[i], &out[n]) == BB_OK && bb_model_check_checkpoint(&out[n]) == BB_OK) n++;
    }
    for (int k = 2; k < layers && n < cap; k = k < 4 ? k + 1 : k * 2) {
        out[n] = q->model;
        out[n].checkpoint_plan[0] = 0;
        out[n++].checkpoint_every = k;
    }
    bb_error_clear();
    return n;
}

/* Calibrated: the predicted time of relative time 1.0, the per-device batch
 * in one micro-step without checkpointing. */
static bb_status reference_step(const bb_plan_request *q, int per_device, size_t bucket_bytes, double *ms)
{
    bb_model_config c = q->model;
    BB_TRY(bb_model_parse_checkpoint("none", &c));
    c.loss_chunk = bb_model_loss_chunk(&c, per_device, bb_device_head_budget(q->device, q->device_mem));
    bb_memory_breakdown mem;
    bb_op_time work[WORK_CAP];
    int n = 0;
    BB_TRY(measure(&c, per_device, q->optimizer, q->device, 1, bucket_bytes, &mem, work, &n));
    *ms = bb_calibration_ms(q->calibration, work, n, per_device);
    if (!(*ms > 0)) return bb_fail(BB_ERR_ARG, "the calibration weighs this model's step at 0 ms: recalibrate");
    return BB_OK;
}

bb_status bb_plan_make(const bb_plan_request *q, bb_plan *out)
{
    memset(out, 0, sizeof *out);
    out->chosen = -1;
    if (q->devices < 1 || q->global_batch < 1 || q->global_batch % q->devices)
        return bb_fail(BB_ERR_ARG, "--global-batch %d does not split over %d devices", q->global_batch, q->devices);
    int per_device = q->global_batch / q->devices;
    size_t bucket_bytes = bb_bucket_bytes(q->bucket_mib);
    bb_model_config *policies = calloc(16, sizeof *policies);
    if (!policies) return bb_fail(BB_ERR_NOMEM, "out of memory");
    int np = candidate_policies(q, policies, 16);
    int cap = 0;
    for (int b = 1; b <= per_device; b++) cap += per_device % b == 0;
    out->rows = calloc((size_t)cap * (size_t)np, sizeof *out->rows);
    if (!out->rows) {
        free(policies);
        return bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    double margin = q->margin > 0 ? q->margin : 0.05;
    out->budget = q->device_mem ? (uint64_t)((double)q->device_mem * (1.0 - margin)) : UINT64_MAX;
    double reference_ms = 0;
    for (int b = per_device; b >= 1; b--) {
        if (per_device % b || (q->fixed_micro_batch > 0 && b != q->fixed_micro_batch)) continue;
        for (int i = 0; i < np; i++) {
            bb_plan_row *r = &out->rows[out->count++];
            bb_model_config c = policies[i];
            c.loss_chunk = r->loss_chunk = bb_model_loss_chunk(&c, b, bb_device_head_budget(q->device, q->device_mem)); /* as the run's model will */
            r->micro_batch = b;
            r->accumulation = per_device / b;
            r->checkpoint_every = c.checkpoint_every;
            memcpy(r->checkpoint_plan, c.checkpoint_plan, sizeof r->checkpoint_plan);
            bb_model_checkpoint_name(&c, r->checkpoint, sizeof r->checkpoint);
            bb_op_time work[WORK_CAP];
            int nwork = 0;
            bb_status rc = measure(&c, b, q->optimizer, q->device, q->zero ? q->devices : 1, bucket_bytes, &r->memory,
                                   work, &nwork);
            if (rc == BB_OK && q->calibration) {
                r->step_ms = r->accumulation * bb_calibration_ms(q->calibration, work, nwork, b);
                if (!(reference_ms > 0)) rc = reference_step(q, per_device, bucket_bytes, &reference_ms);
            }
            if (rc != BB_OK) {
                free(policies);
                bb_plan_free(out);
                return rc;
            }
            r->memory.loader_slots = loader_slots(&c, b, q->devices, q->loader_threads, q->record_size);
            r->relative_time = q->calibration ? r->step_ms / reference_ms : relative_time(&c, &r->memory, b, r->accumulation);
            r->fits = r->memory.total <= out->budget;
            if (r->fits && (out->chosen < 0 || r->relative_time < out->rows[out->chosen].relative_time - 1e-12))
                out->chosen = out->count - 1; /* ties keep the earlier, larger micro-batch */
        }
    }
    free(policies);
    if (out->chosen >= 0) {
        out->rows[out->chosen].chosen = true;
        return BB_OK;
    }
    char need[24], have[24], fixed[24];
    bb_format_bytes(out->budget, have, sizeof have);
    if (!out->count) {
        snprintf(out->why_nothing_fits, sizeof out->why_nothing_fits,
                 "no candidate: the fixed --micro-batch %d does not divide the %d examples per device",
                 q->fixed_micro_batch, per_device);
        return BB_OK;
    }
    const bb_memory_breakdown *m = &out->rows[out->count - 1].memory; /* the smallest candidate */
    uint64_t state = m->parameters + m->gradients + m->optimizer;
    bb_format_bytes(state, fixed, sizeof fixed);
    uint64_t least = UINT64_MAX;
    for (int i = 0; i < out->count; i++) least = out->rows[i].memory.total < least ? out->rows[i].memory.total : least;
    bb_format_bytes(least, need, sizeof need);
    if (state > out->budget)
        snprintf(out->why_nothing_fits, sizeof out->why_nothing_fits,
                 "nothing fits: the parameters, gradients and %s state alone take %s, more than the %s usable "
                 "(--device-mem less a %.0f%% margin); a smaller model or more memory is needed",
                 q->optimizer == BB_OPTIMIZER_SGD ? "SGD" : "AdamW", fixed, have, 100 * margin);
    else
        snprintf(out->why_nothing_fits, sizeof out->why_nothing_fits,
                 "nothing fits: even the smallest candidate (micro-batch 1, the most checkpointing) needs %s, "
                 "more than the %s usable (--device-mem less a %.0f%% margin)",
                 need, have, 100 * margin);
    return BB_OK;
}

void bb_plan_free(bb_plan *p)
{
    free(p->rows);
    p->rows = NULL;
    p->count = 0;
}
