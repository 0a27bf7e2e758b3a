/* optimizer.c — the optimizer's names and defaults, the learning-rate
 * schedule, gradient buckets and shards, gradient clipping, AdamW and SGD
 * over a replica's parameters, and the optimizer state file (optim.h). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "bigbatch/optim.h"
#include "bigbatch/world.h"

bb_optimizer_config bb_optimizer_defaults(void)
{
    return (bb_optimizer_config){.kind = BB_OPTIMIZER_ADAMW, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                                 .momentum = 0.9, .weight_decay = 0.0, .schedule = BB_LR_COSINE, .grad_clip = 1.0};
}

static const char *const kind_names[] = {[BB_OPTIMIZER_ADAMW] = "adamw", [BB_OPTIMIZER_SGD] = "sgd"};
static const char *const schedule_names[] = {[BB_LR_COSINE] = "cosine", [BB_LR_CONSTANT] = "constant"};

const char *bb_optimizer_kind_name(bb_optimizer_kind k) { return kind_names[k == BB_OPTIMIZER_SGD]; }
const char *bb_lr_schedule_name(bb_lr_schedule s) { return schedule_names[s == BB_LR_CONSTANT]; }

static int find_name(const char *const *names, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], s)) return i;
    return -1;
}

bb_status bb_optimizer_kind_parse(const char *s, bb_optimizer_kind *out)
{
    int i = find_name(kind_names, 2, s);
    if (i < 0) return bb_fail(BB_ERR_ARG, "unknown optimizer '%s' (adamw or sgd)", s);
    *out = (bb_optimizer_kind)i;
    return BB_OK;
}

bb_status bb_lr_schedule_parse(const char *s, bb_lr_schedule *out)
{
    int i = find_name(schedule_names, 2, s);
    if (i < 0) return bb_fail(BB_ERR_ARG, "unknown learning-rate schedule '%s' (cosine or constant)", s);
    *out = (bb_lr_schedule)i;
    return BB_OK;
}

double bb_lr_at(const bb_optimizer_config *o, uint64_t step, uint64_t total)
{
    if (step < o->warmup) return o->lr * (double)(step + 1) / (double)o->warmup;
    if (o->schedule == BB_LR_CONSTANT || total <= o->warmup + 1) return o->lr;
    /* cosine from lr (first step after warm-up) to lr/10 (last step) */
    double p = (double)(step - o->warmup) / (double)(total - o->warmup - 1), min = o->lr * 0.1;
    return min + 0.5 * (o->lr - min) * (1.0 + cos(M_PI * p));
}

bb_status bb_buckets_make(const bb_model_t *m, size_t bucket_bytes, bb_buckets *out)
{
    int tensors = bb_model_tensor_count(m);
    *out = (bb_buckets){.lo = calloc((size_t)tensors, sizeof *out->lo), .hi = calloc((size_t)tensors, sizeof *out->hi)};
    if (!out->lo || !out->hi) {
        bb_buckets_free(out);
        return bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    /* Tensors from the last to the first; a bucket closes once it holds
     * its share (1 MiB for the first, so that reducing starts early). */
    size_t hi = bb_model_param_count(m), cap = bucket_bytes < (1u << 20) ? bucket_bytes : (size_t)1 << 20;
    for (int t = tensors - 1; t >= 0; t--) {
        size_t lo = bb_model_tensor(m, t)->offset;
        if ((hi - lo) * sizeof(float) >= cap || t == 0) {
            out->lo[out->count] = lo;
            out->hi[out->count++] = hi;
            hi = lo;
            cap = bucket_bytes;
        }
    }
    return BB_OK;
}

void bb_buckets_free(bb_buckets *b)
{
    free(b->lo), free(b->hi);
    *b = (bb_buckets){0};
}

bb_status bb_shard_make(const bb_model_t *m, size_t bucket_bytes, int owners, int owner, bb_shard *out)
{
    *out = (bb_shard){0};
    bb_buckets buckets;
    BB_TRY(bb_buckets_make(m, bucket_bytes, &buckets));
    out->lo = calloc((size_t)buckets.count + 1, sizeof *out->lo);
    out->hi = calloc((size_t)buckets.count + 1, sizeof *out->hi);
    out->at = calloc((size_t)buckets.count + 1, sizeof *out->at);
    bb_status rc = !out->lo || !out->hi || !out->at ? bb_fail(BB_ERR_NOMEM, "out of memory") : BB_OK;
    for (int b = 0; rc == BB_OK && b < buckets.count; b++) {
        bb_bucket_slice(buckets.lo, buckets.hi, b, owner, owners, &out->lo[b], &out->hi[b]);
        out->at[b] = out->floats;
        out->floats += out->hi[b] - out->lo[b];
    }
    out->ranges = rc == BB_OK ? buckets.count : 0;
    bb_buckets_free(&buckets);
    if (rc != BB_OK) bb_shard_free(out);
    return rc;
}

void bb_shard_free(bb_shard *s)
{
    free(s->lo), free(s->hi), free(s->at);
    *s = (bb_shard){0};
}

/* The optimizer's ranges of parameters: its shard's, or one of all. */
static int ranges_of(const bb_optimizer *o) { return o->shard.ranges ? o->shard.ranges : 1; }
static size_t range_lo(const bb_optimizer *o, int r) { return o->shard.ranges ? o->shard.lo[r] : 0; }
static size_t range_hi(const bb_optimizer *o, int r) { return o->shard.ranges ? o->shard.hi[r] : o->count; }
static size_t range_at(const bb_optimizer *o, int r) { return o->shard.ranges ? o->shard.at[r] : 0; }

bb_status bb_optimizer_create(bb_backend_t *be, const bb_optimizer_config *c, size_t count, bb_shard *shard,
                              bb_optimizer *o)
{
    *o = (bb_optimizer){.cfg = *c, .count = count};
    if (shard) {
        o->shard = *shard, *shard = (bb_shard){0};
        o->count = count = o->shard.floats;
    }
    size_t bytes = count * sizeof(float);
    BB_TRY(bb_backend_alloc(be, bytes, "optimizer state", (void **)&o->m));
    BB_TRY(bb_backend_memset(be, o->m, 0, bytes));
    if (c->kind == BB_OPTIMIZER_ADAMW) {
        BB_TRY(bb_backend_alloc(be, bytes, "optimizer state", (void **)&o->v));
        BB_TRY(bb_backend_memset(be, o->v, 0, bytes));
    }
    return BB_OK;
}

void bb_optimizer_destroy(bb_backend_t *be, bb_optimizer *o)
{
    bb_backend_free(be, o->m);
    bb_backend_free(be, o->v);
    o->m = o->v = NULL;
    bb_shard_free(&o->shard);
}

double bb_optimizer_sum_squares(bb_backend_t *be, bb_model_t *m, const bb_optimizer *o)
{
    size_t whole_lo = 0, whole_hi = o->count;
    if (!o->shard.ranges) return bb_op_sum_squares_ranges(be, bb_model_grads(m), &whole_lo, &whole_hi, 1);
    return bb_op_sum_squares_ranges(be, bb_model_grads(m), o->shard.lo, o->shard.hi, o->shard.ranges);
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
    int adam_t = step + 1 < INT_MAX ? (int)(step + 1) : INT_MAX; /* bias corrections are 1 long before */
    for (int r = 0; r < ranges_of(o); r++) {
        size_t lo = range_lo(o, r), hi = range_hi(o, r);
        for (int i = 0; i < bb_model_tensor_count(m); i++) { /* the range's pieces, tensor by tensor */
            const bb_tensor_info *t = bb_model_tensor(m, i);
            size_t a = t->offset > lo ? t->offset : lo, b = t->offset + t->count < hi ? t->offset + t->count : hi;
            if (a >= b) continue;
            size_t at = range_at(o, r) + (a - lo);
            float wd = t->decay ? (float)c->weight_decay : 0.0f;
            if (c->kind == BB_OPTIMIZER_ADAMW)
                bb_op_adamw(be, params + a, grads + a, o->m + at, o->v + at, b - a, lr, (float)c->beta1,
                            (float)c->beta2, (float)c->eps, wd, adam_t, scale);
            else
                bb_op_sgd(be, params + a, grads + a, o->m + at, b - a, lr, (float)c->momentum, wd, scale);
        }
    }
}

/* ---- optimizer.bin ----------------------------------------------------- */
static const char magic[8] = "BBOPTIM1";

typedef struct file_header {
    char magic[8];
    uint32_t buffers, reserved;
    uint64_t count, checksum; /* floats per buffer; XXH64 of all floats */
} file_header;

static int buffer_count(const bb_optimizer *o) { return o->v ? 2 : 1; }

/* Between the whole state on the host (`host`: param_count floats per
 * buffer) and o's part of it on the device. */
static bb_status copy_state(bb_backend_t *be, const bb_optimizer *o, float *host, size_t param_count, bool to_host)
{
    float *buffers[2] = {o->m, o->v};
    for (int k = 0; k < buffer_count(o); k++)
        for (int r = 0; r < ranges_of(o); r++) {
            float *h = host + k * param_count + range_lo(o, r), *d = buffers[k] + range_at(o, r);
            size_t bytes = (range_hi(o, r) - range_lo(o, r)) * sizeof *h;
            BB_TRY(to_host ? bb_backend_copy(be, h, d, bytes, BB_COPY_D2H) : bb_backend_copy(be, d, h, bytes, BB_COPY_H2D));
        }
    return BB_OK;
}

bb_status bb_optimizer_save(bb_backend_t *const *be, const bb_optimizer *const *o, int n, size_t param_count,
                            bool across_processes, const char *path)
{
    int buffers = buffer_count(o[0]);
    size_t floats = param_count * (size_t)buffers;
    float *host = calloc(floats, sizeof *host); /* every float is some optimizer's: the shards cover the parameters */
    if (!host) return bb_fail(BB_ERR_NOMEM, "out of memory saving %s", path);
    bb_status rc = BB_OK;
    for (int i = 0; rc == BB_OK && i < n; i++) rc = copy_state(be[i], o[i], host, param_count, true);
    if (rc == BB_OK && across_processes) rc = bb_world_sum_floats(host, floats); /* zeros elsewhere: exact */
    if (rc != BB_OK || !path) {
        free(host);
        return rc;
    }
    file_header h = {.buffers = (uint32_t)buffers, .count = param_count};
    memcpy(h.magic, magic, sizeof magic);
    h.checksum = XXH64(host, floats * sizeof *host, 0);
    FILE *f = rc == BB_OK ? fopen(path, "wb") : NULL;
    if (rc == BB_OK && !f) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot create", path);
    if (f) {
        bool ok = fwrite(&h, sizeof h, 1, f) == 1 && fwrite(host, sizeof *host, floats, f) == floats &&
                  fflush(f) == 0 && fsync(fileno(f)) == 0;
        if (fclose(f) != 0) ok = false;
        if (!ok) rc = bb_fail_errno(BB_ERR_IO, "%s: write failed", path);
    }
    free(host);
    return rc;
}

bb_status bb_optimizer_load(bb_backend_t *be, bb_optimizer *o, size_t param_count, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return bb_fail_errno(BB_ERR_IO, "%s: cannot open", path);
    file_header h;
    int n = buffer_count(o);
    size_t floats = param_count * (size_t)n;
    bb_status rc = BB_OK;
    if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, magic, sizeof magic))
        rc = bb_fail(BB_ERR_FORMAT, "%s: not a bigbatch optimizer state", path);
    else if (h.buffers != (uint32_t)n || h.count != param_count)
        rc = bb_fail(BB_ERR_FORMAT, "%s: holds %u buffers of %llu floats; this %s run needs %d of %zu", path,
                     h.buffers, (unsigned long long)h.count, o->v ? "AdamW" : "SGD", n, param_count);
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
