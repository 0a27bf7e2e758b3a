/* param_window.c — ZeRO-3's parameter window (model.h): the weights of a
 * bucket exist on the device only while a pass uses them, gathered into a
 * slot by the window's hook (the trainer's: from the owners' shards). */
#include <stdlib.h>

#include "model_internal.h"

struct param_window {
    bb_buckets buckets;
    int ring;             /* slots the buckets below the last cycle through */
    float *memory;        /* one allocation: the ring's slots, then the last bucket's */
    uint16_t *memory16;   /* bf16: the same slots' bf16 copies; else NULL */
    size_t floats;        /* of every slot together */
    float **slot;         /* per bucket: its slot */
    uint16_t **slot16;    /* per bucket: its bf16 slot; NULL without bf16 */
    int *bucket_of;       /* per tensor */
    int *tenant;          /* per slot (the ring's, then the last bucket's): the bucket it holds; -1: none */
    bool *ready;          /* per slot: its tenant waited for (and converted to bf16) */
    int *slot_of;         /* per bucket */
    int ahead;            /* buckets gathered ahead: the widest layer's */
    int previous;         /* the last bucket below the last one a pass used; -1: none yet */
    bb_status failed;     /* the first fill that failed since the pass began */
    uint64_t gathers, prefetched; /* gathers issued, and those issued ahead of their first use */
    bb_param_window_fn hook;
    void *hook_ctx;
};

/* The most buckets below the last one (which has its own slot) that one
 * layer's tensors (or the stem's, or the final ones') span: a pass uses
 * them together, so they must not share a slot. */
static int widest_group(const bb_model_t *m, const int *bucket_of, int last)
{
    const bb_model_family *f = m->cfg.kind->family;
    int layers = f->layers(&m->cfg), widest = 1;
    for (int l = -1; l <= layers; l++) {
        int first = l < 0 ? 0 : f->layer_tensor(m, l), end = l < 0 ? f->layer_tensor(m, 0)
                                                      : l == layers ? m->tensor_count
                                                                    : f->layer_tensor(m, l + 1);
        int top = end > first && bucket_of[first] < last ? bucket_of[first] : last - 1;
        int span = end > first ? top - bucket_of[end - 1] + 1 : 0;
        if (span > widest) widest = span;
    }
    return widest;
}

bb_status bb_param_window_alloc(bb_model_t *m)
{
    struct param_window *w = calloc(1, sizeof *w);
    if (!w) return bb_fail(BB_ERR_NOMEM, "out of memory");
    m->pwindow = w;
    BB_TRY(bb_buckets_make(m, m->cfg.param_window_bytes, &w->buckets));
    int n = w->buckets.count, last = n - 1;
    w->slot = calloc((size_t)n, sizeof *w->slot);
    w->slot16 = calloc((size_t)n, sizeof *w->slot16);
    w->slot_of = calloc((size_t)n, sizeof *w->slot_of);
    w->bucket_of = calloc((size_t)m->tensor_count, sizeof *w->bucket_of);
    if (!w->slot || !w->slot16 || !w->slot_of || !w->bucket_of) return bb_fail(BB_ERR_NOMEM, "out of memory");
    bb_window_layout(m, &w->buckets, 0, w->bucket_of, NULL); /* each tensor's bucket, for the ring's width */
    /* the ring: the widest group's buckets (the last bucket has its own)
     * and as many gathered ahead, at least BB_PARAM_WINDOW_RING, at most a
     * slot a bucket */
    w->ahead = widest_group(m, w->bucket_of, last);
    w->ring = 2 * w->ahead > BB_PARAM_WINDOW_RING ? 2 * w->ahead : BB_PARAM_WINDOW_RING;
    if (w->ring > last) w->ring = last > 0 ? last : 1;
    w->tenant = malloc((size_t)(w->ring + 1) * sizeof *w->tenant);
    w->ready = calloc((size_t)w->ring + 1, sizeof *w->ready);
    size_t *at = calloc((size_t)w->ring + 2, sizeof *at);
    if (!w->tenant || !w->ready || !at) {
        free(at);
        return bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    bb_window_layout(m, &w->buckets, w->ring, w->bucket_of, at);
    w->floats = at[w->ring + 1];
    for (int b = 0; b < n; b++) w->slot_of[b] = b < last ? b % w->ring : w->ring;
    bb_status rc = bb_backend_alloc(m->be, w->floats * sizeof(float), "parameters (ZeRO-3 window)", (void **)&w->memory);
    if (rc == BB_OK && m->cfg.precision == BB_PRECISION_BF16)
        rc = bb_backend_alloc(m->be, w->floats * sizeof(uint16_t), "parameters (ZeRO-3 window, bf16 copy)",
                              (void **)&w->memory16);
    for (int b = 0; rc == BB_OK && b < n; b++) {
        w->slot[b] = w->memory + at[w->slot_of[b]];
        w->slot16[b] = w->memory16 ? w->memory16 + at[w->slot_of[b]] : NULL;
    }
    free(at);
    bb_param_window_invalidate(m);
    return rc;
}

void bb_param_window_free(bb_model_t *m)
{
    struct param_window *w = m->pwindow;
    if (!w) return;
    bb_backend_free(m->be, w->memory);
    bb_backend_free(m->be, w->memory16);
    bb_buckets_free(&w->buckets);
    free(w->slot), free(w->slot16), free(w->slot_of), free(w->bucket_of), free(w->tenant), free(w->ready);
    free(w);
    m->pwindow = NULL;
}

void bb_param_window_invalidate(bb_model_t *m)
{
    struct param_window *w = m->pwindow;
    if (!w) return;
    for (int j = 0; j <= w->ring; j++) w->tenant[j] = -1;
}

static void issue(bb_model_t *m, struct param_window *w, int b, bool ahead);

void bb_param_window_start(bb_model_t *m, int direction)
{
    struct param_window *w = m->pwindow;
    if (!w) return;
    int last = w->buckets.count - 1;
    w->failed = BB_OK;
    w->previous = direction < 0 ? last : -1; /* as if it came from there */
    for (int k = 0; k < w->ahead && k < last; k++) issue(m, w, direction < 0 ? last - 1 - k : k, true);
}

bb_status bb_param_window_check(const bb_model_t *m)
{
    return m->pwindow ? m->pwindow->failed : BB_OK;
}

static void note_failure(struct param_window *w, bb_status rc)
{
    if (rc != BB_OK && w->failed == BB_OK) w->failed = rc;
}

static bb_status no_hook(const bb_model_t *m)
{
    return bb_fail(BB_ERR_INTERNAL, "the %s's weights are sharded (ZeRO-3) and nothing gathers them: set the "
                   "window's hook (model.h) before a pass", m->cfg.kind->name);
}

/* Bucket b's gather into its slot, unless the slot holds or awaits it. */
static void issue(bb_model_t *m, struct param_window *w, int b, bool ahead)
{
    int s = w->slot_of[b];
    if (w->tenant[s] == b) return;
    w->tenant[s] = -1;
    size_t n = w->buckets.hi[b] - w->buckets.lo[b];
    bb_status rc = w->hook ? w->hook(w->hook_ctx, BB_GATHER_ISSUE, b, w->buckets.lo[b], n, w->slot[b]) : no_hook(m);
    note_failure(w, rc);
    if (rc != BB_OK) return;
    w->tenant[s] = b;
    w->ready[s] = false;
    w->gathers++;
    w->prefetched += ahead;
}

/* Bucket b, for use now: gathered (issued now unless it was ahead), waited
 * for, and its bf16 copy made. A bucket below the last one, used next to
 * the one before in a pass, has the next `ahead` in the same direction
 * issued: the next layer's buckets, while this one's run. */
static void fill(bb_model_t *m, struct param_window *w, int b)
{
    int s = w->slot_of[b], last = w->buckets.count - 1;
    if (w->tenant[s] != b || !w->ready[s]) {
        issue(m, w, b, false);
        if (w->tenant[s] != b) return;
        note_failure(w, w->hook(w->hook_ctx, BB_GATHER_WAIT, b, w->buckets.lo[b], w->buckets.hi[b] - w->buckets.lo[b],
                                w->slot[b]));
        if (w->memory16)
            bb_op_convert(m->be, bb_bf16(w->slot16[b]), bb_f32(w->slot[b]), w->buckets.hi[b] - w->buckets.lo[b]);
        w->ready[s] = true;
    }
    if (b == last || b == w->previous) return;
    int step = w->previous == b + 1 ? -1 : w->previous == b - 1 ? 1 : 0;
    w->previous = b;
    for (int k = 1; step && k <= w->ahead; k++) {
        int next = b + step * k;
        if (next < 0 || next >= last) break;
        issue(m, w, next, true);
    }
}

float *bb_param_window_tensor(bb_model_t *m, int tensor)
{
    struct param_window *w = m->pwindow;
    int b = w->bucket_of[tensor];
    fill(m, w, b);
    return w->slot[b] + (m->tensors[tensor].offset - w->buckets.lo[b]);
}

bb_tensor bb_param_window_weight(bb_model_t *m, int tensor)
{
    struct param_window *w = m->pwindow;
    int b = w->bucket_of[tensor];
    fill(m, w, b);
    size_t at = m->tensors[tensor].offset - w->buckets.lo[b];
    return w->slot16[b] ? bb_bf16(w->slot16[b] + at) : bb_f32(w->slot[b] + at);
}

void bb_model_set_param_window_hook(bb_model_t *m, bb_param_window_fn fn, void *ctx)
{
    if (!m->pwindow) return;
    m->pwindow->hook = fn;
    m->pwindow->hook_ctx = ctx;
    bb_param_window_invalidate(m); /* another source: what the slots hold may differ */
}

uint64_t bb_param_window_bytes(const bb_model_t *m)
{
    const struct param_window *w = m->pwindow;
    return w->floats * (sizeof(float) + (w->memory16 ? sizeof(uint16_t) : 0));
}

int bb_model_param_window_ring(const bb_model_t *m) { return m->pwindow ? m->pwindow->ring : 0; }

void bb_model_param_window_gathers(const bb_model_t *m, uint64_t *gathers, uint64_t *prefetched)
{
    *gathers = m->pwindow ? m->pwindow->gathers : 0;
    *prefetched = m->pwindow ? m->pwindow->prefetched : 0;
}
