/* optimizer.c — learning-rate schedule, gradient clipping, AdamW and SGD
 * over a replica's parameters, and the optimizer state file. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "optimizer.h"

const char *bb_optimizer_kind_name(bb_optimizer_kind k) { return k == BB_OPTIMIZER_SGD ? "sgd" : "adamw"; }

double bb_lr_at(const bb_optimizer_config *o, uint64_t step, uint64_t total)
{
    if (step < o->warmup) return o->lr * (double)(step + 1) / (double)o->warmup;
    if (o->schedule == BB_LR_CONSTANT || total <= o->warmup + 1) return o->lr;
    /* cosine from lr (first step after warm-up) to lr/10 (last step) */
    double p = (double)(step - o->warmup) / (double)(total - o->warmup - 1), min = o->lr * 0.1;
    return min + 0.5 * (o->lr - min) * (1.0 + cos(M_PI * p));
}

bb_status bb_optimizer_create(bb_backend_t *be, const bb_optimizer_config *c, size_t count, bb_optimizer *o)
{
    *o = (bb_optimizer){.cfg = *c, .count = count};
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
}

double bb_optimizer_step(bb_backend_t *be, bb_model_t *m, bb_optimizer *o, uint64_t step, uint64_t total, double *lr_out)
{
    const bb_optimizer_config *c = &o->cfg;
    float *params = bb_model_params(m), *grads = bb_model_grads(m);
    double norm = sqrt(bb_op_sum_squares(be, grads, o->count));
    float lr = (float)bb_lr_at(c, step, total);
    *lr_out = lr;
    /* The gradients are reduced, so every replica sees the same norm and
     * makes the same choice. */
    if (!isfinite(norm)) return norm;
    if (c->grad_clip > 0 && norm > c->grad_clip) bb_op_scale(be, grads, (float)(c->grad_clip / norm), o->count);
    int adam_t = step + 1 < INT_MAX ? (int)(step + 1) : INT_MAX; /* bias corrections are 1 long before */
    for (int i = 0; i < bb_model_tensor_count(m); i++) {
        const bb_tensor_info *t = bb_model_tensor(m, i);
        float wd = t->decay ? (float)c->weight_decay : 0.0f;
        if (c->kind == BB_OPTIMIZER_ADAMW)
            bb_op_adamw(be, params + t->offset, grads + t->offset, o->m + t->offset, o->v + t->offset, t->count, lr,
                        (float)c->beta1, (float)c->beta2, (float)c->eps, wd, adam_t);
        else
            bb_op_sgd(be, params + t->offset, grads + t->offset, o->m + t->offset, t->count, lr, (float)c->momentum,
                      wd);
    }
    return norm;
}

/* ---- optimizer.bin ----------------------------------------------------- */
static const char magic[8] = "BBOPTIM1";

typedef struct file_header {
    char magic[8];
    uint32_t buffers, reserved;
    uint64_t count, checksum; /* floats per buffer; XXH64 of all floats */
} file_header;

static int buffer_count(const bb_optimizer *o) { return o->v ? 2 : 1; }

bb_status bb_optimizer_save(bb_backend_t *be, const bb_optimizer *o, const char *path)
{
    int n = buffer_count(o);
    float *host = malloc(o->count * n * sizeof *host);
    if (!host) return bb_fail(BB_ERR_NOMEM, "out of memory saving %s", path);
    bb_status rc = bb_backend_copy(be, host, o->m, o->count * sizeof *host, BB_COPY_D2H);
    if (rc == BB_OK && o->v) rc = bb_backend_copy(be, host + o->count, o->v, o->count * sizeof *host, BB_COPY_D2H);
    file_header h = {.buffers = (uint32_t)n, .count = o->count};
    memcpy(h.magic, magic, sizeof magic);
    h.checksum = XXH64(host, o->count * n * sizeof *host, 0);
    FILE *f = rc == BB_OK ? fopen(path, "wb") : NULL;
    if (rc == BB_OK && !f) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot create", path);
    if (f) {
        bool ok = fwrite(&h, sizeof h, 1, f) == 1 && fwrite(host, sizeof *host, o->count * n, f) == o->count * n &&
                  fflush(f) == 0 && fsync(fileno(f)) == 0;
        if (fclose(f) != 0) ok = false;
        if (!ok) rc = bb_fail_errno(BB_ERR_IO, "%s: write failed", path);
    }
    free(host);
    return rc;
}

bb_status bb_optimizer_load(bb_backend_t *be, bb_optimizer *o, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return bb_fail_errno(BB_ERR_IO, "%s: cannot open", path);
    file_header h;
    int n = buffer_count(o);
    bb_status rc = BB_OK;
    if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, magic, sizeof magic))
        rc = bb_fail(BB_ERR_FORMAT, "%s: not a bigbatch optimizer state", path);
    else if (h.buffers != (uint32_t)n || h.count != o->count)
        rc = bb_fail(BB_ERR_FORMAT, "%s: holds %u buffers of %llu floats; this %s run needs %d of %zu", path,
                     h.buffers, (unsigned long long)h.count, o->v ? "AdamW" : "SGD", n, o->count);
    float *host = rc == BB_OK ? malloc(o->count * n * sizeof *host) : NULL;
    if (rc == BB_OK && !host) rc = bb_fail(BB_ERR_NOMEM, "out of memory loading %s", path);
    if (rc == BB_OK && fread(host, sizeof *host, o->count * n, f) != o->count * n)
        rc = bb_fail(BB_ERR_CORRUPT, "%s: truncated (expected %zu bytes of state)", path, o->count * n * sizeof *host);
    if (rc == BB_OK && XXH64(host, o->count * n * sizeof *host, 0) != h.checksum)
        rc = bb_fail(BB_ERR_CORRUPT, "%s: checksum mismatch: the optimizer state is damaged", path);
    if (rc == BB_OK) rc = bb_backend_copy(be, o->m, host, o->count * sizeof *host, BB_COPY_H2D);
    if (rc == BB_OK && o->v) rc = bb_backend_copy(be, o->v, host + o->count, o->count * sizeof *host, BB_COPY_H2D);
    free(host);
    fclose(f);
    return rc;
}
