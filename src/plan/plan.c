/* plan.c — memory measured on a counting backend, and the candidate
 * table (see plan.h). */
#include <math.h>
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
    return bb_plan_memory_sharded(c, micro_batch, opt, device, NULL, out);
}

/* The largest of `owners` shards under `rule` (AUTO: the optimizer's;
 * equal slices differ by the padding, whole tensors by up to a tensor). */
static bb_status largest_shard(const bb_model_t *m, int owners, size_t bucket_bytes, bb_optimizer_kind opt,
                               bb_param_shard_rule rule, bb_param_shard *out)
{
    *out = (bb_param_shard){0};
    bb_param_shards all;
    BB_TRY(bb_param_shards_make(m, bucket_bytes, owners, bb_param_shard_rule_for(opt, rule), &all));
    bb_status rc = BB_OK;
    for (int k = 0; rc == BB_OK && k < owners; k++) {
        bb_param_shard s;
        if ((rc = bb_param_shard_of(&all, k, &s)) != BB_OK) break;
        if (s.floats > out->floats || !out->lo) bb_param_shard_free(out), *out = s;
        else bb_param_shard_free(&s);
    }
    bb_param_shards_free(&all);
    if (rc != BB_OK) bb_param_shard_free(out);
    return rc;
}

/* ZeRO-3's window on the counting backend: a gather moves nothing there
 * (its bytes are the slots, allocated with the model). */
static bb_status no_gather(void *ctx, bb_gather_phase phase, int bucket, size_t lo, size_t n, float *slot)
{
    return (void)ctx, (void)phase, (void)bucket, (void)lo, (void)n, (void)slot, BB_OK;
}

/* bb_plan_memory_sharded, and the work of the step (work may be NULL). */
static bb_status measure(const bb_model_config *c, int micro_batch, bb_optimizer_kind opt, bb_device_kind device,
                         const bb_plan_zero *zero, bb_memory_breakdown *out, bb_step_work *work)
{
    memset(out, 0, sizeof *out);
    bb_backend_t *be = NULL, *host = NULL;
    bb_model_t *m = NULL;
    bb_optimizer o = {0};
    double loss;
    bb_status rc;
    bool sharded = zero && zero->stage > 0 && zero->devices > 1;
    bb_model_config mc = *c;
    if (sharded && zero->stage >= 2) mc.grad_window_bytes = zero->bucket_bytes;
    if (sharded && zero->stage == 3) mc.param_window_bytes = zero->bucket_bytes;
    BB_TRY_GOTO(bb_backend_create_counting(device, NULL, &be), rc, done);
    BB_TRY_GOTO(bb_model_create(be, &mc, micro_batch, &m), rc, done);
    uint64_t model_bytes = bb_backend_bytes_in_use(be), P = bb_model_gradient_bytes(m),
             weights = bb_model_parameter_bytes(m);
    bb_param_shard shard = {0};
    if (sharded) BB_TRY_GOTO(largest_shard(m, zero->devices, zero->bucket_bytes, opt, zero->rule, &shard), rc, done);
    shard.gradients = sharded && zero->stage >= 2;
    shard.parameters = sharded && zero->stage == 3;
    /* offloaded: the state and master weights on a host of their own (counted, not allocated), ZeRO-2's
     * shard gradients still on the device */
    bool offload = zero && zero->offload;
    if (offload) BB_TRY_GOTO(bb_backend_create_counting(BB_DEVICE_CPU, NULL, &host), rc, done);
    BB_TRY_GOTO(bb_optimizer_create(offload ? host : be, &(bb_optimizer_config){.kind = opt}, m,
                                    sharded ? &shard : NULL, &o), rc, done);
    /* ZeRO-2's shard gradients and ZeRO-3's master weights, in the optimizer */
    uint64_t shard_grads = o.grads ? o.count * sizeof(float) : 0, shard_params = o.params ? o.count * sizeof(float) : 0;
    if (offload) {
        out->offloaded = bb_optimizer_offload_bytes(&o);
        void *grads;
        if (shard_grads) BB_TRY_GOTO(bb_backend_alloc(be, shard_grads, "gradients", &grads), rc, done);
        shard_params = 0;
    }
    out->optimizer = bb_backend_bytes_in_use(be) - model_bytes - shard_grads - shard_params;
    bb_model_set_param_window_hook(m, no_gather, NULL);
    BB_TRY_GOTO(bb_model_forward(m, 1.0f, &loss, NULL), rc, done);
    BB_TRY_GOTO(bb_model_backward(m, false), rc, done);
    out->parameters = weights + shard_params; /* bf16: and their bf16 copy; ZeRO-3: the window's slots */
    out->gradients = P + shard_grads;
    out->activations = bb_model_activation_bytes(m);
    out->offloaded_activations = bb_model_host_activation_bytes(m);
    out->offloaded += out->offloaded_activations;
    out->batches = model_bytes - weights - P - out->activations;
    out->workspace = bb_backend_workspace_bytes(be);
    out->total = bb_backend_peak_bytes(be) + out->workspace;
    out->loader_slots = loader_slots(c, micro_batch, 1, 0, 0);
    bb_model_recompute_counts(m, &out->recomputed_layers, &out->selective_recomputes);
    if (work) {
        work->params = bb_model_param_count(m);
        work->nmicro = bb_backend_op_profile(be, work->micro, BB_STEP_WORK_CAP);
        bb_backend_op_profile_reset(be);
        double lr;
        bb_optimizer_sum_squares(be, m, &o);
        bb_optimizer_apply(host ? host : be, m, &o, 0, 1, 1.0, &lr); /* offloaded: no device work */
        work->nopt = bb_backend_op_profile(be, work->opt, BB_STEP_WORK_CAP);
    }
done:
    if (be) bb_optimizer_destroy(host ? host : be, &o);
    bb_model_destroy(m);
    bb_backend_destroy(host);
    bb_backend_destroy(be);
    return rc;
}

bb_status bb_plan_step_work(const bb_model_config *c, int micro_batch, bb_optimizer_kind opt, bb_device_kind device,
                            bb_step_work *out)
{
    bb_memory_breakdown mem;
    return measure(c, micro_batch, opt, device, NULL, &mem, out);
}

bb_status bb_plan_memory_sharded(const bb_model_config *c, int micro_batch, bb_optimizer_kind opt,
                                 bb_device_kind device, const bb_plan_zero *zero, bb_memory_breakdown *out)
{
    return measure(c, micro_batch, opt, device, zero, out, NULL);
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
    if (q->fixed_recompute) {
        out[n++] = q->model;
        return n;
    }
    static const char *const names[] = {"none", "selective", "blocks"};
    for (size_t i = 0; i < sizeof names / sizeof *names && n < cap; i++) {
        out[n] = q->model;
        if (bb_model_parse_recompute(names[i], &out[n]) == BB_OK && bb_model_check_recompute(&out[n]) == BB_OK) n++;
    }
    for (int k = 2; k < layers && n < cap; k = k < 4 ? k + 1 : k * 2) {
        out[n] = q->model;
        out[n].recompute_plan[0] = 0;
        out[n++].recompute_every = k;
    }
    bb_error_clear();
    return n;
}

/* Calibrated: a step of `accumulation` micro-steps of `micro_batch`, and the optimizer's. */
static double step_ms(const bb_calibration *cal, const bb_step_work *w, int micro_batch, int accumulation)
{
    return accumulation * bb_calibration_ms(cal, w->micro, w->nmicro, micro_batch) +
           bb_calibration_ms(cal, w->opt, w->nopt, micro_batch);
}

/* Calibrated: the predicted time of relative time 1.0, the per-device batch
 * in one micro-step without checkpointing. */
static bb_status reference_step(const bb_plan_request *q, int per_device, double *ms)
{
    bb_model_config c = q->model;
    BB_TRY(bb_model_parse_recompute("none", &c));
    c.loss_chunk = bb_model_loss_chunk(&c, per_device, bb_device_transient_budget(q->device, q->device_mem));
    bb_memory_breakdown mem;
    bb_step_work *w = malloc(sizeof *w);
    if (!w) return bb_fail(BB_ERR_NOMEM, "out of memory");
    bb_status rc = measure(&c, per_device, q->optimizer, q->device, NULL, &mem, w);
    if (rc == BB_OK) *ms = step_ms(q->calibration, w, per_device, 1);
    free(w);
    BB_TRY(rc);
    if (!(*ms > 0)) return bb_fail(BB_ERR_ARG, "the calibration weighs this model's step at 0 ms: recalibrate");
    return BB_OK;
}

/* What prices the candidates' time, found as the rows need it. */
typedef struct timing {
    double reference_ms; /* calibrated: relative time 1.0 */
    int forward_b;       /* the micro-batch block_ms is of; 0: none yet */
    double block_ms;     /* calibrated: one block's forward, ms a micro-step */
} timing;

/* The link's GB/s that prices policy 'o': the stated, else the
 * calibration's; 0 when 'o' is not offered (the host is the device, no
 * calibration to weigh it against, no link). */
static double priced_link_gbps(const bb_plan_request *q)
{
    if (bb_device_host_is_device(q->device) || !q->calibration) return 0;
    return q->link_gbps > 0 ? q->link_gbps : q->calibration->link_gbps;
}

/* Calibrated: one block's forward at micro-batch b, ms a micro-step: what
 * recomputing every block adds over none, per block recomputed. */
static bb_status block_forward_ms(const bb_plan_request *q, int b, timing *tm)
{
    if (tm->forward_b == b) return BB_OK;
    double ms[2] = {0, 0};
    int recomputed = 0;
    bb_step_work *w = malloc(sizeof *w);
    if (!w) return bb_fail(BB_ERR_NOMEM, "out of memory");
    bb_status rc = BB_OK;
    for (int i = 0; i < 2 && rc == BB_OK; i++) {
        bb_model_config c = q->model;
        bb_memory_breakdown mem;
        if ((rc = bb_model_parse_recompute(i ? "blocks" : "none", &c)) != BB_OK) break;
        c.loss_chunk = bb_model_loss_chunk(&c, b, bb_device_transient_budget(q->device, q->device_mem));
        if ((rc = measure(&c, b, q->optimizer, q->device, NULL, &mem, w)) != BB_OK) break;
        ms[i] = bb_calibration_ms(q->calibration, w->micro, w->nmicro, b);
        recomputed = mem.recomputed_layers;
    }
    free(w);
    BB_TRY(rc);
    tm->forward_b = b;
    tm->block_ms = recomputed ? (ms[1] - ms[0]) / recomputed : 0;
    return BB_OK;
}

/* One offloaded block's copies that compute does not hide, ms a micro-step
 * at micro-batch b: its bytes go to the host while the next block's
 * forward runs and come back while the backward of the block above runs
 * (two forwards' work), on one copy stream; and a millionth of the step,
 * so that a plan offloads only to fit (the copies still take host memory
 * and the link). -1: not priced (priced_link_gbps). */
static bb_status offload_ms(const bb_plan_request *q, int b, timing *tm, double *ms)
{
    *ms = -1;
    double gbps = priced_link_gbps(q);
    bb_block_costs k;
    if (!(gbps > 0)) return BB_OK;
    if (bb_model_block_costs(&q->model, b, &k) != BB_OK) {
        bb_error_clear();
        return BB_OK;
    }
    BB_TRY(block_forward_ms(q, b, tm));
    double copy = (double)k.host / (gbps * 1e6), f = tm->block_ms;
    *ms = fmax(0, copy - f) + fmax(0, copy - 2 * f) + 1e-6 * tm->reference_ms;
    return BB_OK;
}

/* One candidate: its exact memory and work on the counting backend, and
 * its relative time; chosen when it is the fastest that fits so far. */
static bb_status add_row(const bb_plan_request *q, bb_plan *out, const bb_model_config *policy, int b, int per_device,
                         size_t bucket_bytes, timing *tm)
{
    bb_plan_row *r = &out->rows[out->count++];
    bb_model_config c = *policy;
    /* the loss chunk the run's model will take */
    c.loss_chunk = r->loss_chunk = bb_model_loss_chunk(&c, b, bb_device_transient_budget(q->device, q->device_mem));
    r->micro_batch = b;
    r->accumulation = per_device / b;
    r->recompute_every = c.recompute_every;
    memcpy(r->recompute_plan, c.recompute_plan, sizeof r->recompute_plan);
    bb_model_recompute_name(&c, r->recompute, sizeof r->recompute);
    bb_step_work *w = malloc(sizeof *w);
    if (!w) return bb_fail(BB_ERR_NOMEM, "out of memory");
    bb_plan_zero zero = {.stage = q->zero, .devices = q->devices, .bucket_bytes = bucket_bytes, .rule = q->zero_shards,
                         .offload = q->offload == BB_OFFLOAD_OPTIMIZER};
    bb_status rc = measure(&c, b, q->optimizer, q->device, &zero, &r->memory, w);
    if (rc == BB_OK && q->calibration) {
        r->step_ms = step_ms(q->calibration, w, b, r->accumulation);
        if (!(tm->reference_ms > 0)) rc = reference_step(q, per_device, &tm->reference_ms);
    }
    free(w);
    BB_TRY(rc);
    int offloaded = 0;
    for (int l = 0; l < bb_model_layers(&c); l++) offloaded += bb_model_block_recompute(&c, l) == BB_RECOMPUTE_OFFLOAD;
    double copies = 0; /* calibrated and priced: the offloaded blocks' copies compute does not hide */
    if (offloaded && q->calibration) BB_TRY(offload_ms(q, b, tm, &copies));
    if (copies > 0) r->step_ms += r->accumulation * offloaded * copies;
    r->memory.loader_slots = loader_slots(&c, b, q->devices, q->loader_threads, q->record_size);
    r->relative_time = q->calibration ? r->step_ms / tm->reference_ms : relative_time(&c, &r->memory, b, r->accumulation);
    r->fits = r->memory.total <= out->budget && (!q->host_mem || r->memory.offloaded <= q->host_mem);
    if (r->fits && (out->chosen < 0 || r->relative_time < out->rows[out->chosen].relative_time - 1e-12))
        out->chosen = out->count - 1; /* ties keep the earlier, larger micro-batch */
    return BB_OK;
}

static const bb_plan_row *row_named(const bb_plan *p, int from, const char *name)
{
    for (int i = from; i < p->count; i++)
        if (!strcmp(p->rows[i].recompute, name)) return &p->rows[i];
    return NULL;
}

/* The fastest per-block plan at micro-batch b that fits (bb_plan_best_blocks),
 * its costs per recomputed block taken from the uniform rows of b (from
 * rows[from] on), as a candidate of its own unless it is one of them. */
static bb_status add_block_plan(const bb_plan_request *q, bb_plan *out, int from, int b, int per_device,
                                size_t bucket_bytes, timing *tm)
{
    const bb_plan_row *none = row_named(out, from, "none"), *sel = row_named(out, from, "selective"),
                      *full = row_named(out, from, "blocks");
    bb_block_costs k;
    if (!none || !sel || !full || out->budget == UINT64_MAX || bb_model_block_costs(&q->model, b, &k) != BB_OK) {
        bb_error_clear();
        return BB_OK;
    }
    int ns = sel->memory.selective_recomputes, nf = full->memory.recomputed_layers; /* per recomputed block: */
    bb_block_times t = {.selective = ns ? (sel->relative_time - none->relative_time) / ns : 0,
                        .full = nf ? (full->relative_time - none->relative_time) / nf : 0};
    double copies;
    BB_TRY(offload_ms(q, b, tm, &copies)); /* ms a micro-step, per block; -1: not offered */
    t.offload = copies >= 0 ? none->accumulation * copies / tm->reference_ms : -1;
    if (t.offload >= 0 && q->host_mem) { /* --host-mem: as many offloaded blocks as it holds besides the optimizer's */
        uint64_t held = none->memory.offloaded, fit = q->host_mem > held ? (q->host_mem - held) / k.host : 0;
        t.max_offloaded = fit < (uint64_t)bb_model_layers(&q->model) ? (int)fit : 0;
        if (!fit) t.offload = -1;
    }
    char letters[BB_RECOMPUTE_MAX_BLOCKS + 1];
    int64_t bytes;
    double time;
    int64_t room = (int64_t)out->budget - (int64_t)none->memory.total;
    if (!bb_plan_best_blocks(bb_model_layers(&q->model), &k, room, &t, letters, &bytes, &time)) return BB_OK;
    bb_model_config c = q->model;
    c.recompute_every = 0;
    snprintf(c.recompute_plan, sizeof c.recompute_plan, "%s", letters);
    char name[BB_RECOMPUTE_NAME_MAX];
    bb_model_recompute_name(&c, name, sizeof name);
    if (row_named(out, from, name)) return BB_OK; /* a uniform policy: already a candidate */
    return add_row(q, out, &c, b, per_device, bucket_bytes, tm);
}

/* bb_plan_make at one ZeRO stage. */
static bb_status make_stage(const bb_plan_request *q, bool suggest, bb_plan *out)
{
    memset(out, 0, sizeof *out);
    out->zero = q->zero;
    out->offload = q->offload == BB_OFFLOAD_OPTIMIZER;
    out->chosen = -1;
    if (q->devices < 1 || q->global_batch < 1 || q->global_batch % q->devices)
        return bb_fail(BB_ERR_ARG, "--global-batch %d does not split over %d devices", q->global_batch, q->devices);
    if (!bb_optimizer_desc_of(q->optimizer))
        return bb_fail(BB_ERR_ARG, "optimizer %d is not one of %s", (int)q->optimizer, bb_optimizer_choices());
    if ((q->zero == 2 || q->zero == 3) && q->devices < 2)
        return bb_fail(BB_ERR_ARG, "--zero %d shards the %s among the devices, and there is one: it saves "
                       "nothing (plan with --zero 0, or on more devices)", q->zero,
                       q->zero == 2 ? "gradients" : "weights and gradients");
    int per_device = q->global_batch / q->devices;
    size_t bucket_bytes = bb_bucket_bytes(q->bucket_mib);
    bb_model_config *policies = calloc(16, sizeof *policies);
    if (!policies) return bb_fail(BB_ERR_NOMEM, "out of memory");
    int np = candidate_policies(q, policies, 16);
    int cap = 0;
    for (int b = 1; b <= per_device; b++) cap += per_device % b == 0;
    out->rows = calloc((size_t)cap * (size_t)(np + 1), sizeof *out->rows); /* + the per-block plan */
    if (!out->rows) {
        free(policies);
        return bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    double margin = q->margin > 0 ? q->margin : 0.05;
    out->budget = q->device_mem ? (uint64_t)((double)q->device_mem * (1.0 - margin)) : UINT64_MAX;
    timing tm = {0};
    out->link_gbps = priced_link_gbps(q);
    bb_status rc = BB_OK;
    for (int b = per_device; b >= 1 && rc == BB_OK; b--) {
        if (per_device % b || (q->fixed_micro_batch > 0 && b != q->fixed_micro_batch)) continue;
        int from = out->count;
        for (int i = 0; i < np && rc == BB_OK; i++)
            rc = add_row(q, out, &policies[i], b, per_device, bucket_bytes, &tm);
        if (rc == BB_OK && !q->fixed_recompute)
            rc = add_block_plan(q, out, from, b, per_device, bucket_bytes, &tm);
    }
    free(policies);
    if (rc != BB_OK) {
        bb_plan_free(out);
        return rc;
    }
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
                 "(--device-mem less a %.0f%% margin); a smaller model or more memory is needed%s%s",
                 bb_optimizer_desc_of(q->optimizer)->title, fixed, have, 100 * margin,
                 suggest && q->devices > 1 && q->zero < 3 ? ", or a higher --zero (auto picks the lowest that fits)" : "",
                 suggest && q->offload == BB_OFFLOAD_NONE ? ", or --offload optimizer (the state in host memory)" : "");
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

/* --zero auto and --offload auto: the lowest stage at which a candidate
 * fits (its fastest), first without offload, then with it; with what did
 * not fit before; none: the last table tried. */
bb_status bb_plan_make(const bb_plan_request *q, bb_plan *out)
{
    if (q->zero != BB_ZERO_AUTO && q->offload != BB_OFFLOAD_AUTO) return make_stage(q, true, out);
    int top = q->devices < 2 ? 0 : q->zero_top > 0 && q->zero_top < 3 ? q->zero_top : 3; /* one device: sharding saves nothing */
    int first = q->zero == BB_ZERO_AUTO ? 0 : q->zero, last = q->zero == BB_ZERO_AUTO ? top : q->zero;
    bb_offload from = q->offload == BB_OFFLOAD_AUTO ? BB_OFFLOAD_NONE : q->offload;
    bb_offload to = q->offload == BB_OFFLOAD_AUTO ? BB_OFFLOAD_OPTIMIZER : q->offload;
    char why[sizeof out->why_zero] = "";
    size_t len = 0;
    for (bb_offload off = from;; off++) {
        for (int stage = first;; stage++) {
            bb_plan_request one = *q;
            one.zero = stage, one.offload = off;
            BB_TRY(make_stage(&one, false, out)); /* the search itself tries the higher stages */
            if (out->chosen >= 0 || (stage == last && off == to)) goto done;
            if (stage == last) break;
            len += (size_t)snprintf(why + len, len < sizeof why ? sizeof why - len : 0, "%s--zero %d%s: %s",
                                    len ? "; " : "", stage, off ? " --offload optimizer" : "", out->why_nothing_fits);
            bb_plan_free(out);
        }
        len += (size_t)snprintf(why + len, len < sizeof why ? sizeof why - len : 0, "%s--zero %d: %s", len ? "; " : "",
                                last, out->why_nothing_fits);
        bb_plan_free(out);
    }
done:
    snprintf(out->why_zero, sizeof out->why_zero, "%s", why);
    if (out->chosen < 0) {
        char tail[sizeof out->why_nothing_fits];
        snprintf(tail, sizeof tail, "%s", out->why_nothing_fits);
        const char *offload = to ? "" : ", or --offload optimizer (the state in host memory)";
        if (last > 0 || to)
            snprintf(out->why_nothing_fits, sizeof out->why_nothing_fits, "not even with --zero %d%s: %.400s%s", last,
                     to ? " --offload optimizer" : "", tail, offload);
        else
            snprintf(out->why_nothing_fits, sizeof out->why_nothing_fits, "%.450s%s", tail, offload);
    }
    return BB_OK;
}
