/* optimizer.c — the optimizers' table (each descriptor is in a file of its
 * own: adamw.c, sgd.c, lamb.c, lars.c, muon.c), their configuration and the learning-rate
 * schedule, gradient buckets and ZeRO's cut of them, a replica's state and
 * its step (the clip folded in), and the optimizer state file (optim.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "bigbatch/optim.h"

bb_optimizer_config bb_optimizer_defaults(void) { return bb_optimizer_defaults_for(BB_OPTIMIZER_ADAMW); }

bb_optimizer_config bb_optimizer_defaults_for(bb_optimizer_kind k)
{
    const bb_optimizer_desc *d = bb_optimizer_desc_of(k);
    return (bb_optimizer_config){.kind = k, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999,
                                 .eps = d && d->eps > 0 ? d->eps : 1e-8,
                                 .momentum = d && d->momentum > 0 ? d->momentum : 0.9,
                                 .trust_coefficient = 0.001, .weight_decay = 0.0, .schedule = BB_LR_COSINE,
                                 .grad_clip = 1.0};
}

/* ---- the optimizers ------------------------------------------------------ */
static const bb_optimizer_desc *const optimizers[BB_OPTIMIZER_COUNT] = {
    [BB_OPTIMIZER_ADAMW] = &bb_optimizer_adamw,
    [BB_OPTIMIZER_SGD] = &bb_optimizer_sgd,
    [BB_OPTIMIZER_LAMB] = &bb_optimizer_lamb,
    [BB_OPTIMIZER_LARS] = &bb_optimizer_lars,
    [BB_OPTIMIZER_MUON] = &bb_optimizer_muon,
};

const bb_optimizer_desc *bb_optimizer_desc_of(bb_optimizer_kind k)
{
    return k >= 0 && k < BB_OPTIMIZER_COUNT ? optimizers[k] : NULL;
}

const char *bb_optimizer_kind_name(bb_optimizer_kind k)
{
    const bb_optimizer_desc *d = bb_optimizer_desc_of(k);
    return d ? d->name : "(no optimizer)";
}

bb_status bb_optimizer_kind_parse(const char *s, bb_optimizer_kind *out)
{
    for (int k = 0; k < BB_OPTIMIZER_COUNT; k++)
        if (!strcmp(optimizers[k]->name, s)) {
            *out = (bb_optimizer_kind)k;
            return BB_OK;
        }
    return bb_fail(BB_ERR_ARG, "unknown optimizer '%s' (%s)", s, bb_optimizer_choices());
}

/* The first call fills the text; later ones read it. */
const char *bb_optimizer_choices(void)
{
    static char text[128];
    if (!text[0])
        for (int k = 0; k < BB_OPTIMIZER_COUNT; k++)
            bb_list_add(text, sizeof text, k, BB_OPTIMIZER_COUNT, optimizers[k]->name, NULL);
    return text;
}

const char *bb_optimizer_help(void)
{
    static char text[256];
    if (!text[0])
        for (int k = 0; k < BB_OPTIMIZER_COUNT; k++)
            bb_list_add(text, sizeof text, k, BB_OPTIMIZER_COUNT, optimizers[k]->name, optimizers[k]->state);
    return text;
}

const char *bb_optimizer_param_name(const bb_optimizer_desc *d, const bb_optimizer_names *names, const char *hp,
                                    char *buf, size_t cap)
{
    const char *given = names && names->name ? names->name(names->ctx, hp) : NULL;
    if (given) snprintf(buf, cap, "%s", given);
    else snprintf(buf, cap, "%s's %s", d->title, hp);
    return buf;
}

bb_status bb_optimizer_check(const bb_optimizer_config *c, const bb_optimizer_names *names)
{
    const bb_optimizer_desc *d = bb_optimizer_desc_of(c->kind);
    if (!d) return bb_fail(BB_ERR_ARG, "optimizer %d is not one of %s", (int)c->kind, bb_optimizer_choices());
    char lr[64], b0[64];
    if (!isfinite(c->lr) || c->lr < 0)
        return bb_fail(BB_ERR_ARG, "%s %g: must be finite and >= 0", bb_optimizer_param_name(d, names, "lr", lr, sizeof lr),
                       c->lr);
    if (c->lr_scale != BB_LR_SCALE_NONE && c->base_batch < 1)
        return bb_fail(BB_ERR_ARG, "%s %s scales the rate from the global batch it was given for: set %s",
                       bb_optimizer_param_name(d, names, "lr_scale", lr, sizeof lr), bb_lr_scale_name(c->lr_scale),
                       bb_optimizer_param_name(d, names, "base_batch", b0, sizeof b0));
    return d->check(c, names);
}

static const char *const schedule_names[] = {[BB_LR_COSINE] = "cosine", [BB_LR_CONSTANT] = "constant"};
const char *bb_lr_schedule_name(bb_lr_schedule s) { return schedule_names[s == BB_LR_CONSTANT]; }

bb_status bb_lr_schedule_parse(const char *s, bb_lr_schedule *out)
{
    int i = !strcmp(s, "cosine") ? BB_LR_COSINE : !strcmp(s, "constant") ? BB_LR_CONSTANT : -1;
    if (i < 0) return bb_fail(BB_ERR_ARG, "unknown learning-rate schedule '%s' (cosine or constant)", s);
    *out = (bb_lr_schedule)i;
    return BB_OK;
}

static const char *const scale_names[] = {[BB_LR_SCALE_NONE] = "none", [BB_LR_SCALE_LINEAR] = "linear",
                                           [BB_LR_SCALE_SQRT] = "sqrt"};
const char *bb_lr_scale_name(bb_lr_scale s)
{
    return s >= BB_LR_SCALE_NONE && s <= BB_LR_SCALE_SQRT ? scale_names[s] : "(no rule)";
}

bb_status bb_lr_scale_parse(const char *s, bb_lr_scale *out)
{
    for (int i = BB_LR_SCALE_NONE; i <= BB_LR_SCALE_SQRT; i++)
        if (!strcmp(s, scale_names[i])) return *out = (bb_lr_scale)i, BB_OK;
    return bb_fail(BB_ERR_ARG, "unknown learning-rate scaling '%s' (none, linear or sqrt)", s);
}

double bb_lr_peak(const bb_optimizer_config *o)
{
    if (o->lr_scale == BB_LR_SCALE_NONE || o->batch < 1 || o->base_batch < 1) return o->lr;
    double ratio = (double)o->batch / (double)o->base_batch;
    return o->lr * (o->lr_scale == BB_LR_SCALE_SQRT ? sqrt(ratio) : ratio);
}

double bb_lr_at(const bb_optimizer_config *o, uint64_t step, uint64_t total)
{
    double peak = bb_lr_peak(o);
    if (step < o->warmup) return peak * (double)(step + 1) / (double)o->warmup;
    if (o->schedule == BB_LR_CONSTANT || total <= o->warmup + 1) return peak;
    /* cosine from the peak (first step after warm-up) to a tenth of it (last step) */
    double p = (double)(step - o->warmup) / (double)(total - o->warmup - 1), min = peak * 0.1;
    return min + 0.5 * (peak - min) * (1.0 + cos(M_PI * p));
}

/* ---- ZeRO's cut ------------------------------------------------------------ */
bb_param_shard_rule bb_param_shard_rule_for(bb_optimizer_kind k, bb_param_shard_rule asked)
{
    const bb_optimizer_desc *d = bb_optimizer_desc_of(k);
    return asked != BB_PARAM_SHARD_AUTO || !d ? asked : d->shard;
}

const char *bb_param_shard_rule_name(bb_param_shard_rule r)
{
    static const char *const names[] = {[BB_PARAM_SHARD_AUTO] = "auto", [BB_PARAM_SHARD_ELEMENTS] = "elements",
                                        [BB_PARAM_SHARD_TENSORS] = "tensors"};
    return r >= BB_PARAM_SHARD_AUTO && r <= BB_PARAM_SHARD_TENSORS ? names[r] : "(no rule)";
}

/* Whole tensors: owner k's run ends at the tensor boundary nearest to k+1
 * owners' equal share of the bucket (never before the previous owner's). */
static void cut_tensors(const bb_model_t *m, size_t lo, size_t hi, int owners, size_t *slice_lo, size_t *slice_hi)
{
    size_t len = hi - lo, cut = lo;
    int first = 0;
    while (first < bb_model_tensor_count(m) && bb_model_tensor(m, first)->offset < lo) first++;
    for (int k = 0; k < owners; k++) {
        size_t target = lo + len * (size_t)(k + 1) / (size_t)owners, best = hi;
        for (int t = first; k + 1 < owners && t < bb_model_tensor_count(m); t++) {
            size_t at = bb_model_tensor(m, t)->offset;
            if (at >= hi) break;
            size_t d = at > target ? at - target : target - at, bd = best > target ? best - target : target - best;
            if (at >= cut && d < bd) best = at;
        }
        slice_lo[k] = cut, slice_hi[k] = cut = best;
    }
}

bb_status bb_param_shards_make(const bb_model_t *m, size_t bucket_bytes, int owners, bb_param_shard_rule rule,
                               bb_param_shards *out)
{
    *out = (bb_param_shards){.rule = rule, .owners = owners};
    BB_TRY(bb_buckets_make(m, bucket_bytes, &out->buckets));
    size_t n = (size_t)out->buckets.count * (size_t)owners;
    out->lo = calloc(n, sizeof *out->lo), out->hi = calloc(n, sizeof *out->hi);
    out->count = calloc((size_t)out->buckets.count, sizeof *out->count);
    if (!out->lo || !out->hi || !out->count) {
        bb_param_shards_free(out);
        return bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    for (int b = 0; b < out->buckets.count; b++) {
        size_t lo = out->buckets.lo[b], hi = out->buckets.hi[b], *slo = out->lo + (size_t)b * owners,
               *shi = out->hi + (size_t)b * owners;
        if (rule == BB_PARAM_SHARD_TENSORS) {
            cut_tensors(m, lo, hi, owners, slo, shi);
            continue;
        }
        size_t count = out->count[b] = (hi - lo + (size_t)owners - 1) / (size_t)owners;
        for (int k = 0; k < owners; k++) {
            size_t a = lo + count * (size_t)k, e = a + count;
            slo[k] = a < hi ? a : hi, shi[k] = e < hi ? e : hi;
        }
    }
    return BB_OK;
}

void bb_param_shards_free(bb_param_shards *s)
{
    bb_buckets_free(&s->buckets);
    free(s->lo), free(s->hi), free(s->count);
    *s = (bb_param_shards){0};
}

bb_status bb_param_shard_of(const bb_param_shards *all, int owner, bb_param_shard *out)
{
    int n = all->buckets.count;
    *out = (bb_param_shard){0};
    out->lo = calloc((size_t)n + 1, sizeof *out->lo);
    out->hi = calloc((size_t)n + 1, sizeof *out->hi);
    out->at = calloc((size_t)n + 1, sizeof *out->at);
    if (!out->lo || !out->hi || !out->at) {
        bb_param_shard_free(out);
        return bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    for (int b = 0; b < n; b++) {
        bb_param_shards_slice(all, b, owner, &out->lo[b], &out->hi[b]);
        out->at[b] = out->floats;
        out->floats += out->hi[b] - out->lo[b];
    }
    out->ranges = n;
    return BB_OK;
}

void bb_param_shard_free(bb_param_shard *s)
{
    free(s->lo), free(s->hi), free(s->at);
    *s = (bb_param_shard){0};
}

/* ---- one replica's optimizer ---------------------------------------------- */
/* The optimizer's ranges of parameters: its shard's, or one of all. */
static int ranges_of(const bb_optimizer *o) { return o->shard.ranges ? o->shard.ranges : 1; }
static size_t range_lo(const bb_optimizer *o, int r) { return o->shard.ranges ? o->shard.lo[r] : 0; }
static size_t range_hi(const bb_optimizer *o, int r) { return o->shard.ranges ? o->shard.hi[r] : o->count; }
static size_t range_at(const bb_optimizer *o, int r) { return o->shard.ranges ? o->shard.at[r] : 0; }

static bb_status offload_state(bb_backend_t *be, bb_backend_t *host, uint64_t host_cap, bb_model_t *m, bb_optimizer *o);

/* The step's scratch, on the backend it runs on: the most any tensor of
 * o's ranges needs. */
static bb_status alloc_work(bb_backend_t *be, const bb_model_t *m, bb_optimizer *o)
{
    for (int r = 0; o->desc->work_floats && r < ranges_of(o); r++)
        for (int i = 0; i < bb_model_tensor_count(m); i++) {
            const bb_tensor_info *t = bb_model_tensor(m, i);
            size_t need = o->desc->work_floats(t);
            if (t->offset < range_hi(o, r) && t->offset + t->count > range_lo(o, r) && need > o->work_floats)
                o->work_floats = need;
        }
    return o->work_floats ? bb_backend_alloc(be, o->work_floats * sizeof(float), "optimizer work", (void **)&o->work)
                          : BB_OK;
}

bb_status bb_optimizer_create_offloaded(bb_backend_t *be, bb_backend_t *host, uint64_t host_cap,
                                        const bb_optimizer_config *c, bb_model_t *m, bb_param_shard *shard,
                                        bb_optimizer *o)
{
    *o = (bb_optimizer){.cfg = *c, .desc = bb_optimizer_desc_of(c->kind), .count = bb_model_param_count(m)};
    if (shard) {
        o->shard = *shard, *shard = (bb_param_shard){0};
        o->count = o->shard.floats;
    }
    bb_status rc = o->desc ? BB_OK
                           : bb_fail(BB_ERR_ARG, "optimizer %d is not one of %s", (int)c->kind, bb_optimizer_choices());
    size_t bytes = o->count * sizeof(float);
    if (rc == BB_OK && host) rc = offload_state(be, host, host_cap, m, o);
    for (int k = 0; rc == BB_OK && !host && k < o->desc->state_buffers; k++)
        if ((rc = bb_backend_alloc(be, bytes, "optimizer state", (void **)&o->state[k])) == BB_OK)
            rc = bb_backend_memset(be, o->state[k], 0, bytes);
    if (rc == BB_OK && o->shard.gradients && (rc = bb_backend_alloc(be, bytes, "gradients", (void **)&o->grads)) == BB_OK)
        rc = bb_backend_memset(be, o->grads, 0, bytes);
    if (rc == BB_OK && !host && o->shard.parameters)
        rc = bb_backend_alloc(be, bytes, "parameters (ZeRO-3 master shard)", (void **)&o->params);
    if (rc == BB_OK) rc = alloc_work(host ? host : be, m, o);
    if (rc != BB_OK) bb_optimizer_destroy(be, o);
    return rc;
}

bb_status bb_optimizer_create(bb_backend_t *be, const bb_optimizer_config *c, const bb_model_t *m,
                              bb_param_shard *shard, bb_optimizer *o)
{
    return bb_optimizer_create_offloaded(be, NULL, 0, c, (bb_model_t *)m, shard, o);
}

static void free_offload(bb_backend_t *be, bb_optimizer *o);

void bb_optimizer_destroy(bb_backend_t *be, bb_optimizer *o)
{
    bb_backend_free(o->host ? o->host : be, o->work);
    o->work = NULL, o->work_floats = 0;
    if (o->host) {
        free_offload(be, o);
    } else {
        for (int k = 0; k < BB_OPTIMIZER_MAX_STATE; k++) bb_backend_free(be, o->state[k]);
        bb_backend_free(be, o->params);
    }
    for (int k = 0; k < BB_OPTIMIZER_MAX_STATE; k++) o->state[k] = NULL;
    bb_backend_free(be, o->grads);
    o->grads = o->params = NULL;
    bb_param_shard_free(&o->shard);
}

/* A copy between the host and o's buffers: memcpy when they are in host
 * memory (offloaded), else the device's copy. */
static bb_status copy_mine(bb_backend_t *be, const bb_optimizer *o, void *dst, const void *src, size_t bytes,
                           bb_copy_kind kind)
{
    if (!o->host) return bb_backend_copy(be, dst, src, bytes, kind);
    memcpy(dst, src, bytes);
    return BB_OK;
}

/* Between the whole weights on the host and o's master shard. */
/* Between a whole buffer on the host (parameter order) and one of o's
 * buffers laid out as its state (`mine`), range by range. */
static bb_status copy_ranges(bb_backend_t *be, const bb_optimizer *o, float *host, float *mine, bool to_host)
{
    for (int r = 0; r < ranges_of(o); r++) {
        float *h = host + range_lo(o, r), *d = mine + range_at(o, r);
        size_t bytes = (range_hi(o, r) - range_lo(o, r)) * sizeof *h;
        BB_TRY(to_host ? copy_mine(be, o, h, d, bytes, BB_COPY_D2H) : copy_mine(be, o, d, h, bytes, BB_COPY_H2D));
    }
    return BB_OK;
}

static bb_status copy_params(bb_backend_t *be, const bb_optimizer *o, float *host, bool to_host)
{
    if (!o->params) return bb_fail(BB_ERR_ARG, "this optimizer keeps no weights (only ZeRO-3's does)");
    return copy_ranges(be, o, host, o->params, to_host);
}

bb_status bb_optimizer_put_params(bb_backend_t *be, bb_optimizer *o, const float *host)
{
    return copy_params(be, o, (float *)host, false);
}

bb_status bb_optimizer_get_params(bb_backend_t *be, const bb_optimizer *o, float *host)
{
    return copy_params(be, o, host, true);
}

double bb_optimizer_sum_squares(bb_backend_t *be, bb_model_t *m, const bb_optimizer *o)
{
    size_t whole_lo = 0, whole_hi = o->count;
    if (o->grads) return bb_op_sum_squares_ranges(be, o->grads, &whole_lo, &whole_hi, 1);
    if (!o->shard.ranges) return bb_op_sum_squares_ranges(be, bb_model_grads(m), &whole_lo, &whole_hi, 1);
    return bb_op_sum_squares_ranges(be, bb_model_grads(m), o->shard.lo, o->shard.hi, o->shard.ranges);
}

/* The step's piece of tensor t: parameters [a, b) at `params`, their
 * gradients at `grads`, at `at` of o's state. */
static bb_optimizer_piece piece_of(const bb_optimizer *o, const bb_tensor_info *t, size_t a, size_t b, size_t at,
                                   float *params, const float *grads)
{
    bool matrix = t->rank == 2 && a == t->offset && b == t->offset + t->count;
    bb_optimizer_piece p = {.params = params, .grads = grads, .n = b - a, .decay = t->decay, .hidden = t->hidden,
                            .rows = matrix ? t->shape[0] : 0, .cols = matrix ? t->shape[1] : 0, .work = o->work};
    for (int k = 0; k < o->desc->state_buffers; k++) p.state[k] = o->state[k] + at;
    return p;
}

/* ---- offload ------------------------------------------------------------------
 * The offloaded step works in pieces (a range's run of one tensor, cut to
 * OFFLOAD_CHUNK floats where the optimizer updates elements) grouped into
 * chunks of about OFFLOAD_CHUNK floats: every chunk's gradients are queued
 * down on the compute stream (after the backward and the reduction) with an
 * event after each chunk; the host steps chunk c once its event happened
 * and queues its weights back up, while later chunks still come down. */
#define OFFLOAD_CHUNK ((size_t)1 << 22) /* floats: 16 MiB */

typedef struct offload_piece {
    size_t lo, at, n; /* the parameters [lo, lo + n), at `at` of the state */
    int tensor;       /* of the model's */
} offload_piece;

struct offload_plan {
    offload_piece *piece;
    int pieces, chunks;
    int *chunk_end;    /* per chunk: the end of its pieces */
    bb_event_t **down; /* per chunk: its gradients are on the host */
};

static bb_status plan_pieces(const bb_model_t *m, const bb_optimizer *o, struct offload_plan *p)
{
    size_t cut = o->desc->shard == BB_PARAM_SHARD_TENSORS ? SIZE_MAX : OFFLOAD_CHUNK;
    for (int pass = 0; pass < 2; pass++) { /* count, then fill */
        int n = 0, chunks = 0;
        size_t in_chunk = 0;
        for (int r = 0; r < ranges_of(o); r++) {
            size_t lo = range_lo(o, r), hi = range_hi(o, r);
            for (int i = 0; i < bb_model_tensor_count(m); i++) {
                const bb_tensor_info *t = bb_model_tensor(m, i);
                size_t a = t->offset > lo ? t->offset : lo, b = t->offset + t->count < hi ? t->offset + t->count : hi;
                for (; a < b; n++) {
                    size_t len = b - a < cut ? b - a : cut;
                    if (pass) p->piece[n] = (offload_piece){a, range_at(o, r) + (a - lo), len, i};
                    a += len, in_chunk += len;
                    if (in_chunk >= OFFLOAD_CHUNK) {
                        if (pass) p->chunk_end[chunks] = n + 1;
                        chunks++, in_chunk = 0;
                    }
                }
            }
        }
        if (in_chunk) {
            if (pass) p->chunk_end[chunks] = n;
            chunks++;
        }
        if (pass) break;
        p->pieces = n, p->chunks = chunks;
        p->piece = calloc((size_t)n + 1, sizeof *p->piece);
        p->chunk_end = calloc((size_t)chunks + 1, sizeof *p->chunk_end);
        p->down = calloc((size_t)chunks + 1, sizeof *p->down);
        if (!p->piece || !p->chunk_end || !p->down) return bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    return BB_OK;
}

uint64_t bb_optimizer_offload_bytes(const bb_optimizer *o)
{
    return (uint64_t)o->count * sizeof(float) * (uint64_t)(o->desc->state_buffers + 2);
}

static void free_offload(bb_backend_t *be, bb_optimizer *o)
{
    size_t bytes = o->count * sizeof(float);
    for (int k = 0; k < BB_OPTIMIZER_MAX_STATE; k++)
        if (o->state[k]) bb_backend_host_free(be, o->state[k], bytes);
    if (o->params) bb_backend_host_free(be, o->params, bytes);
    if (o->host_grads) bb_backend_host_free(be, o->host_grads, bytes);
    struct offload_plan *p = o->offload;
    for (int c = 0; p && p->down && c < p->chunks; c++) bb_backend_event_destroy(be, p->down[c]);
    if (p) free(p->piece), free(p->chunk_end), free(p->down);
    free(p);
    o->offload = NULL, o->host_grads = NULL, o->host = NULL;
}

/* The one line --offload fails with: the bytes it needs, and why not. */
static bb_status offload_refused(const bb_optimizer *o, const char *why)
{
    char needed[24];
    return bb_fail(BB_ERR_OOM, "--offload optimizer needs %s of pinned host memory for this device's %s state, master "
                   "weights and gradients; %s", bb_format_bytes(bb_optimizer_offload_bytes(o), needed, sizeof needed),
                   o->desc->title, why);
}

/* o's state, master weights and gradients' staging in pinned host memory
 * (o->count, o->desc and o->shard set; nothing on the device yet). */
static bb_status offload_state(bb_backend_t *be, bb_backend_t *host, uint64_t host_cap, bb_model_t *m, bb_optimizer *o)
{
    uint64_t need = bb_optimizer_offload_bytes(o), available = bb_host_available_bytes();
    char why[256], bytes_text[24];
    if (host_cap && need > host_cap) {
        snprintf(why, sizeof why, "--host-mem allows %s", bb_format_bytes(host_cap, bytes_text, sizeof bytes_text));
        return offload_refused(o, why);
    }
    if (need > available) { /* before the kernel's OOM killer would answer (each device's taken before the next asks) */
        snprintf(why, sizeof why, "the host has %s available", bb_format_bytes(available, bytes_text, sizeof bytes_text));
        return offload_refused(o, why);
    }
    o->host = host;
    size_t bytes = o->count * sizeof(float);
    bb_status rc = (o->offload = calloc(1, sizeof *o->offload)) ? plan_pieces(m, o, o->offload)
                                                                : bb_fail(BB_ERR_NOMEM, "out of memory");
    for (int c = 0; rc == BB_OK && c < o->offload->chunks; c++) rc = bb_backend_event_create(be, &o->offload->down[c]);
    for (int k = 0; rc == BB_OK && k < o->desc->state_buffers; k++)
        if ((rc = bb_backend_host_alloc(be, bytes, (void **)&o->state[k])) == BB_OK) memset(o->state[k], 0, bytes);
    if (rc == BB_OK) rc = bb_backend_host_alloc(be, bytes, (void **)&o->params);
    if (rc == BB_OK) rc = bb_backend_host_alloc(be, bytes, (void **)&o->host_grads);
    if (rc == BB_ERR_NOMEM) {
        snprintf(why, sizeof why, "it cannot be had (%s)", bb_error_message());
        return offload_refused(o, why);
    }
    /* the master weights: the model's of o's ranges (ZeRO-3's shard is put later, bb_optimizer_put_params) */
    float *weights = o->shard.parameters ? NULL : bb_model_params(m);
    for (int r = 0; rc == BB_OK && weights && r < ranges_of(o); r++)
        rc = bb_backend_copy(be, o->params + range_at(o, r), weights + range_lo(o, r),
                             (range_hi(o, r) - range_lo(o, r)) * sizeof(float), BB_COPY_D2H);
    return rc;
}

/* The offloaded step: see above. A copy or event that fails leaves the
 * backend's error pending, which the step's synchronization reports. */
static void apply_offloaded(bb_backend_t *be, bb_model_t *m, bb_optimizer *o, float lr, uint64_t step, float scale)
{
    const struct offload_plan *p = o->offload;
    const float *grads = o->grads ? o->grads : bb_model_grads(m);
    float *weights = o->shard.parameters ? NULL : bb_model_params(m); /* ZeRO-3: the window gathers from the host */
    bb_status rc = BB_OK;
    for (int c = 0, i = 0; rc == BB_OK && c < p->chunks; c++) {
        for (; rc == BB_OK && i < p->chunk_end[c]; i++) {
            const offload_piece *q = &p->piece[i];
            rc = bb_backend_copy_async(be, o->host_grads + q->at, grads + (o->grads ? q->at : q->lo),
                                       q->n * sizeof(float), BB_COPY_D2H, BB_STREAM_COMPUTE);
        }
        if (rc == BB_OK) rc = bb_backend_event_record(be, p->down[c], BB_STREAM_COMPUTE);
    }
    for (int c = 0, i = 0; rc == BB_OK && c < p->chunks; c++) {
        rc = bb_backend_event_synchronize(be, p->down[c]);
        for (; rc == BB_OK && i < p->chunk_end[c]; i++) {
            const offload_piece *q = &p->piece[i];
            bb_optimizer_piece piece = piece_of(o, bb_model_tensor(m, q->tensor), q->lo, q->lo + q->n, q->at,
                                                o->params + q->at, o->host_grads + q->at);
            o->desc->step(o->host, &o->cfg, &piece, lr, step, scale);
            if (weights)
                rc = bb_backend_copy_async(be, weights + q->lo, o->params + q->at, q->n * sizeof(float), BB_COPY_H2D,
                                           BB_STREAM_COMPUTE);
        }
    }
}

void bb_optimizer_apply(bb_backend_t *be, bb_model_t *m, bb_optimizer *o, uint64_t step, uint64_t total, double norm,
                        double *lr_out)
{
    const bb_optimizer_config *c = &o->cfg;
    float *params = bb_model_params(m), *grads = bb_model_grads(m);
    float lr = (float)bb_lr_at(c, step, total);
    *lr_out = lr;
    /* The norm is of the reduced gradients, the same on every replica,
     * which all make the same choice. */
    if (!isfinite(norm)) return;
    /* A clip scales the gradients as the update reads them: one pass. */
    float scale = c->grad_clip > 0 && norm > c->grad_clip ? (float)(c->grad_clip / norm) : 1.0f;
    if (o->host) {
        apply_offloaded(be, m, o, lr, step, scale);
        return;
    }
    for (int r = 0; r < ranges_of(o); r++) {
        size_t lo = range_lo(o, r), hi = range_hi(o, r);
        for (int i = 0; i < bb_model_tensor_count(m); i++) { /* the range's pieces, tensor by tensor */
            const bb_tensor_info *t = bb_model_tensor(m, i);
            size_t a = t->offset > lo ? t->offset : lo, b = t->offset + t->count < hi ? t->offset + t->count : hi;
            if (a >= b) continue;
            size_t at = range_at(o, r) + (a - lo);
            bb_optimizer_piece p = piece_of(o, t, a, b, at, o->params ? o->params + at : params + a,
                                            o->grads ? o->grads + at : grads + a);
            o->desc->step(be, c, &p, lr, step, scale);
        }
    }
}

/* ---- optimizer.bin ----------------------------------------------------- */
/* Version 2 names the optimizer and its state's version; version 1
 * (BBOPTIM1: buffers, a reserved word, count, checksum) did not, and its
 * buffer count says which optimizer wrote it. */
static const char magic_v1[8] = "BBOPTIM1", magic[8] = "BBOPTIM2";
enum { NAME_BYTES = 16 };

typedef struct file_header {
    char magic[8];
    char optimizer[NAME_BYTES]; /* its name, NUL-padded */
    uint32_t version, buffers;  /* of its state; state buffers */
    uint64_t count, checksum;   /* floats per buffer; XXH64 of all floats */
} file_header;

typedef struct file_header_v1 {
    char magic[8];
    uint32_t buffers, reserved;
    uint64_t count, checksum;
} file_header_v1;

/* Between the whole state on the host (`host`: param_count floats per
 * buffer) and o's part of it on the device. */
static bb_status copy_state(bb_backend_t *be, const bb_optimizer *o, float *host, size_t param_count, bool to_host)
{
    for (int k = 0; k < o->desc->state_buffers; k++) BB_TRY(copy_ranges(be, o, host + k * param_count, o->state[k], to_host));
    return BB_OK;
}

bb_status bb_optimizer_save(bb_backend_t *const *be, const bb_optimizer *const *o, int n, size_t param_count,
                            const bb_state_gather *gather, const char *path)
{
    if (n < 1) return bb_fail(BB_ERR_ARG, "saving %s: no optimizer state", path ? path : "the optimizer state");
    const bb_optimizer_desc *d = o[0]->desc;
    if (strlen(d->name) >= NAME_BYTES) /* a descriptor's mistake: the load's name check would refuse the file */
        return bb_fail(BB_ERR_ARG, "optimizer name '%s' is longer than optimizer.bin's %d bytes", d->name,
                       NAME_BYTES - 1);
    size_t floats = param_count * (size_t)d->state_buffers;
    float *host = calloc(floats, sizeof *host); /* every float is some optimizer's: the shards cover the parameters */
    if (!host) return bb_fail(BB_ERR_NOMEM, "out of memory saving %s", path ? path : "the optimizer state");
    bb_status rc = BB_OK;
    for (int i = 0; rc == BB_OK && i < n; i++) rc = copy_state(be[i], o[i], host, param_count, true);
    if (rc == BB_OK && gather) rc = gather->sum(gather->ctx, host, floats); /* zeros elsewhere: exact */
    if (rc != BB_OK || !path) {
        free(host);
        return rc;
    }
    file_header h = {.version = d->version, .buffers = (uint32_t)d->state_buffers, .count = param_count};
    memcpy(h.magic, magic, sizeof magic);
    snprintf(h.optimizer, sizeof h.optimizer, "%s", d->name);
    h.checksum = XXH64(host, floats * sizeof *host, 0);
    FILE *f = fopen(path, "wb");
    if (!f) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot create", path);
    if (f) {
        bool ok = fwrite(&h, sizeof h, 1, f) == 1 && fwrite(host, sizeof *host, floats, f) == floats &&
                  fflush(f) == 0 && fsync(fileno(f)) == 0;
        if (fclose(f) != 0) ok = false;
        if (!ok) rc = bb_fail_errno(BB_ERR_IO, "%s: write failed", path);
    }
    free(host);
    return rc;
}

/* The header, either version; fails with BB_ERR_FORMAT when the file is not
 * an optimizer state, or another optimizer's (or version's) than `d`. */
static bb_status read_header(FILE *f, const char *path, const bb_optimizer_desc *d, file_header *h)
{
    char head[sizeof(file_header)];
    size_t got = fread(head, 1, sizeof head, f);
    if (got >= sizeof(file_header_v1) && !memcmp(head, magic_v1, sizeof magic_v1)) {
        file_header_v1 v1;
        memcpy(&v1, head, sizeof v1);
        /* version 1 came from AdamW (2 buffers) or SGD (1) */
        if (v1.buffers != 1 && v1.buffers != 2)
            return bb_fail(BB_ERR_FORMAT, "%s: a version-1 optimizer state of %u buffers (AdamW's had 2, SGD's 1)",
                           path, v1.buffers);
        const char *who = v1.buffers == 2 ? "adamw" : "sgd";
        *h = (file_header){.version = 1, .buffers = v1.buffers, .count = v1.count, .checksum = v1.checksum};
        snprintf(h->optimizer, sizeof h->optimizer, "%s", who);
        if (fseek(f, (long)sizeof v1, SEEK_SET) != 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot read", path);
    } else if (got == sizeof(file_header) && !memcmp(head, magic, sizeof magic)) {
        memcpy(h, head, sizeof *h);
        h->optimizer[NAME_BYTES - 1] = 0;
    } else {
        return bb_fail(BB_ERR_FORMAT, "%s: not a bigbatch optimizer state", path);
    }
    if (strcmp(h->optimizer, d->name))
        return bb_fail(BB_ERR_FORMAT, "%s: holds the state of %s; this run's optimizer is %s (--optimizer %s resumes "
                       "it)", path, h->optimizer, d->name, h->optimizer);
    if (h->version != d->version)
        return bb_fail(BB_ERR_FORMAT, "%s: holds %s's state of version %u; this bigbatch reads version %u", path,
                       h->optimizer, h->version, d->version);
    return BB_OK;
}

bb_status bb_optimizer_load(bb_backend_t *be, bb_optimizer *o, size_t param_count, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return bb_fail_errno(BB_ERR_IO, "%s: cannot open", path);
    file_header h;
    int n = o->desc->state_buffers;
    size_t floats = param_count * (size_t)n;
    bb_status rc = read_header(f, path, o->desc, &h);
    if (rc == BB_OK && (h.buffers != (uint32_t)n || h.count != param_count))
        rc = bb_fail(BB_ERR_FORMAT, "%s: holds %u buffers of %llu floats; this %s run needs %d of %zu", path,
                     h.buffers, (unsigned long long)h.count, o->desc->title, n, param_count);
    float *host = rc == BB_OK ? malloc(floats * sizeof *host) : NULL;
    if (rc == BB_OK && !host) rc = bb_fail(BB_ERR_NOMEM, "out of memory loading %s", path);
    if (rc == BB_OK && fread(host, sizeof *host, floats, f) != floats)
        rc = bb_fail(BB_ERR_CORRUPT, "%s: truncated (expected %zu bytes of state)", path, floats * sizeof *host);
    if (rc == BB_OK && XXH64(host, floats * sizeof *host, 0) != h.checksum)
        rc = bb_fail(BB_ERR_CORRUPT, "%s: checksum mismatch: the optimizer state is damaged", path);
    if (rc == BB_OK) rc = copy_state(be, o, host, param_count, false);
    free(host);
    fclose(f);
    return rc;
}
