/* grad_window.c — the gradient buckets every reducer shares, and ZeRO-2's
 * gradient window (model.h): a slot per bucket only while the bucket is
 * written and reduced, instead of a whole gradient buffer. */
#include <stdlib.h>

#include "model_internal.h"

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
        if (((hi - lo) * sizeof(float) >= cap && !bb_model_tensor(m, t)->joined) || t == 0) {
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

void bb_window_layout(const bb_model_t *m, const bb_buckets *b, int ring, int *bucket_of, size_t *at)
{
    int last = b->count - 1;
    for (int t = 0, k = last; t < m->tensor_count; t++) {
        while (k > 0 && m->tensors[t].offset >= b->hi[k]) k--;
        bucket_of[t] = k;
    }
    if (!at) return;
    /* slot j: as wide as the widest bucket k = j mod the ring (a bucket
     * holds at least a tensor: a large head widens one slot only) */
    for (int j = 0; j <= ring + 1; j++) at[j] = 0;
    for (int k = 0; k < last; k++)
        if (b->hi[k] - b->lo[k] > at[k % ring + 1]) at[k % ring + 1] = b->hi[k] - b->lo[k];
    at[ring + 1] = b->hi[last] - b->lo[last];
    for (int j = 1; j <= ring + 1; j++) at[j] += at[j - 1];
}

struct grad_window {
    bb_buckets buckets;
    float *memory;        /* one allocation: the ring's slots, then the last bucket's */
    size_t bytes;
    float **slot;         /* per bucket: its slot */
    int *bucket_of;       /* per tensor */
    bool *written;        /* per bucket: written this backward */
    int highest;          /* the highest bucket below the last first written this backward; -1: none */
    int late;             /* a bucket first written after the hook had called it final; -1: none */
    bb_grad_window_fn hook;
    void *hook_ctx;
};

bb_status bb_grad_window_alloc(bb_model_t *m)
{
    struct grad_window *w = calloc(1, sizeof *w);
    if (!w) return bb_fail(BB_ERR_NOMEM, "out of memory");
    m->window = w;
    BB_TRY(bb_buckets_make(m, m->cfg.grad_window_bytes, &w->buckets));
    int n = w->buckets.count, last = n - 1;
    w->slot = calloc((size_t)n, sizeof *w->slot);
    w->written = calloc((size_t)n, sizeof *w->written);
    w->bucket_of = calloc((size_t)m->tensor_count, sizeof *w->bucket_of);
    if (!w->slot || !w->written || !w->bucket_of) return bb_fail(BB_ERR_NOMEM, "out of memory");
    size_t at[BB_GRAD_WINDOW_RING + 2];
    bb_window_layout(m, &w->buckets, BB_GRAD_WINDOW_RING, w->bucket_of, at);
    w->bytes = at[BB_GRAD_WINDOW_RING + 1] * sizeof(float);
    BB_TRY(bb_backend_alloc(m->be, w->bytes, "gradients", (void **)&w->memory));
    BB_TRY(bb_backend_memset(m->be, w->memory, 0, w->bytes));
    for (int b = 0; b < last; b++) w->slot[b] = w->memory + at[b % BB_GRAD_WINDOW_RING];
    w->slot[last] = w->memory + at[BB_GRAD_WINDOW_RING];
    return BB_OK;
}

void bb_grad_window_free(bb_model_t *m)
{
    struct grad_window *w = m->window;
    if (!w) return;
    bb_backend_free(m->be, w->memory);
    bb_buckets_free(&w->buckets);
    free(w->slot), free(w->written), free(w->bucket_of);
    free(w);
    m->window = NULL;
}

void bb_grad_window_start(bb_model_t *m)
{
    struct grad_window *w = m->window;
    for (int b = 0; b < w->buckets.count; b++) w->written[b] = false;
    w->highest = w->late = -1;
}

bb_status bb_grad_window_check(const bb_model_t *m)
{
    const struct grad_window *w = m->window;
    if (!w || w->late < 0) return BB_OK;
    return bb_fail(BB_ERR_INTERNAL, "the %s's backward first wrote gradient bucket %d after a later one had made it "
                   "final: its gradients went out unfinished (the window, model.h, needs the buckets written from "
                   "the last tensor to the first, one bucket of slack)", m->cfg.kind->name, w->late);
}

float *bb_grad_window_tensor(bb_model_t *m, int tensor)
{
    struct grad_window *w = m->window;
    int b = w->bucket_of[tensor], last = w->buckets.count - 1;
    if (!w->written[b]) {
        w->written[b] = true;
        if (b < last && b < w->highest - 1 && w->late < 0) w->late = b;
        if (b < last && b > w->highest) w->highest = b;
        /* one bucket of slack: what lies from hi[b - 1] on is final */
        size_t final_from = b > 0 && b < last ? w->buckets.hi[b - 1] : m->param_count;
        if (w->hook) w->hook(w->hook_ctx, b, final_from);
    }
    return w->slot[b] + (m->tensors[tensor].offset - w->buckets.lo[b]);
}

void bb_model_set_grad_window_hook(bb_model_t *m, bb_grad_window_fn fn, void *ctx)
{
    if (!m->window) return;
    m->window->hook = fn;
    m->window->hook_ctx = ctx;
}

uint64_t bb_model_gradient_bytes(const bb_model_t *m)
{
    return m->window ? m->window->bytes : (uint64_t)m->param_count * sizeof(float);
}

float *bb_model_grad_bucket(bb_model_t *m, size_t bucket_bytes, int bucket)
{
    struct grad_window *w = m->window;
    if (!w) return NULL;
    return bucket >= 0 && bucket < w->buckets.count && m->cfg.grad_window_bytes == bucket_bytes ? w->slot[bucket] : NULL;
}
