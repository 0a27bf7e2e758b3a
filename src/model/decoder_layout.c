/* decoder_layout.c — where each block's activations live under its
 * recompute policy (see decoder.c), allocated once when the model is made,
 * and what each policy costs a block (the planner's block costs, exact
 * against this allocator: tests/test_recompute.c).
 *
 * Per token, a block's backward reads the saved tensors of its layout
 * (the gpt: 16 d-wide floats) and its statistics (the gpt: 4 + heads).
 * 'n' saves them all; 's' saves all but the dropped ones, whose fp32
 * scratch every selective block shares; 'f' saves its input (or nothing
 * more when the previous block's output is saved anyway), and the
 * recomputed blocks run in slots shared by every 'f' segment; 'o' saves
 * them all in pinned host memory and runs in one of two slots the
 * offloaded blocks take in turn, the next block keeping its input on the
 * device (a saved input, as after an 'f' segment). Tensors are
 * of the activation dtype (2 bytes an element under bf16, 4 under fp32),
 * statistics fp32. */
#include <stdlib.h>
#include <string.h>

#include "decoder_state.h"

size_t bb_decoder_saved_count(const bb_model_t *m, int k)
{
    const decoder_state *g = m->impl;
    return (size_t)m->B * g->d.seq_len * (size_t)g->lay.width[k];
}

/* An activation buffer, counted by the model and remembered for the destroy. */
static bb_status alloc_act(bb_model_t *m, void **out, size_t bytes, const char *what)
{
    decoder_state *g = m->impl;
    if (g->owned_count == g->owned_cap) {
        int cap = g->owned_cap ? 2 * g->owned_cap : 64;
        void **grown = realloc(g->owned, (size_t)cap * sizeof *grown);
        if (!grown) return bb_fail(BB_ERR_NOMEM, "out of memory");
        g->owned = grown, g->owned_cap = cap;
    }
    BB_TRY(bb_model_alloc_activation(m, bytes, what, out));
    g->owned[g->owned_count++] = *out;
    return BB_OK;
}

/* A tensor of `count` elements of the activation dtype. */
static bb_status alloc_tensor(bb_model_t *m, bb_tensor *out, size_t count, const char *what)
{
    bb_dtype dtype = ((const decoder_state *)m->impl)->dtype;
    *out = (bb_tensor){NULL, dtype};
    return alloc_act(m, &out->data, count * bb_dtype_size(dtype), what);
}

static bb_status alloc_floats(bb_model_t *m, float **out, size_t count, const char *what)
{
    return alloc_act(m, (void **)out, count * sizeof(float), what);
}

/* A slot: its statistics, and its saved tensors but those of `shared_mask`
 * (bits of the layout's tensors), which are `shared`'s. */
static bb_status alloc_slot(bb_model_t *m, bb_block_acts *a, const bb_block_acts *shared, unsigned shared_mask)
{
    const decoder_state *g = m->impl;
    size_t BT = (size_t)m->B * g->d.seq_len;
    for (int k = 0; k < g->lay.saved; k++) {
        if (shared_mask >> k & 1) a->t[k] = shared->t[k];
        else BB_TRY(alloc_tensor(m, &a->t[k], bb_decoder_saved_count(m, k), "activations"));
    }
    for (int s = 0; s < g->lay.stats; s++)
        BB_TRY(alloc_floats(m, &a->stat[s], BT * (size_t)g->lay.stat_width[s], "activations"));
    return BB_OK;
}

#define ALL_SAVED(lay) ((1u << (lay).saved) - 1)

/* Blocks into segments: each 'n' or 's' block alone, 'f' blocks alone
 * (plan:...) or in runs of recompute_every (every:K). Returns the longest
 * recomputed segment (the recompute slots it takes). */
static int make_segments(bb_model_t *m, decoder_state *g)
{
    const bb_model_config *c = &m->cfg;
    bool plan = c->recompute_plan[0] != 0;
    int run = !plan && c->recompute_every > 0 ? c->recompute_every : 1, longest = 0;
    for (int l = 0; l < g->L; l++) g->policy[l] = bb_model_block_recompute(c, l);
    for (int l = 0; l < g->L;) {
        bool recompute = g->policy[l] == BB_RECOMPUTE_FULL;
        int end = recompute ? (l + run < g->L ? l + run : g->L) : l + 1;
        g->segs[g->S] = (segment){l, end, recompute};
        if (recompute && end - l > longest) longest = end - l;
        for (; l < end; l++) g->seg_of[l] = g->S;
        g->S++;
    }
    return longest;
}

/* An offloaded block's copy in pinned host memory: one allocation, its
 * tensors then its statistics. */
static bb_status alloc_host_slot(bb_model_t *m, bb_block_acts *a)
{
    decoder_state *g = m->impl;
    size_t BT = (size_t)m->B * g->d.seq_len, bytes = 0, es = bb_dtype_size(g->dtype);
    for (int k = 0; k < g->lay.saved; k++) bytes += bb_decoder_saved_count(m, k) * es;
    for (int s = 0; s < g->lay.stats; s++) bytes += BT * (size_t)g->lay.stat_width[s] * sizeof(float);
    if (g->host_count == g->L) return bb_fail(BB_ERR_INTERNAL, "more offloaded blocks than blocks");
    uint8_t *p;
    BB_TRY(bb_backend_host_alloc(m->be, bytes, (void **)&p));
    g->host_owned[g->host_count] = p, g->host_owned_bytes[g->host_count++] = bytes;
    g->host_bytes += bytes;
    for (int k = 0; k < g->lay.saved; k++) {
        a->t[k] = (bb_tensor){p, g->dtype};
        p += bb_decoder_saved_count(m, k) * es;
    }
    for (int s = 0; s < g->lay.stats; s++) {
        a->stat[s] = (float *)(void *)p;
        p += BT * (size_t)g->lay.stat_width[s] * sizeof(float);
    }
    return BB_OK;
}

bb_status bb_decoder_offload_copy(bb_model_t *m, int l, bool to_host)
{
    decoder_state *g = m->impl;
    const bb_block_acts *dev = g->act[l], *host = &g->host_acts[l];
    size_t BT = (size_t)m->B * g->d.seq_len, es = bb_dtype_size(g->dtype);
    for (int k = 0; k < g->lay.saved; k++) {
        size_t bytes = bb_decoder_saved_count(m, k) * es;
        BB_TRY(to_host ? bb_backend_copy_async(m->be, host->t[k].data, dev->t[k].data, bytes, BB_COPY_D2H, BB_STREAM_COPY)
                       : bb_backend_copy_async(m->be, dev->t[k].data, host->t[k].data, bytes, BB_COPY_H2D, BB_STREAM_COPY));
    }
    for (int s = 0; s < g->lay.stats; s++) {
        size_t bytes = BT * (size_t)g->lay.stat_width[s] * sizeof(float);
        BB_TRY(to_host ? bb_backend_copy_async(m->be, host->stat[s], dev->stat[s], bytes, BB_COPY_D2H, BB_STREAM_COPY)
                       : bb_backend_copy_async(m->be, dev->stat[s], host->stat[s], bytes, BB_COPY_H2D, BB_STREAM_COPY));
    }
    return BB_OK;
}

/* Each block's activations: saving blocks a slot of their own, recomputed
 * ones the recompute slot of their place in the segment, offloaded ones
 * one of two shared slots in turn (and a copy on the host). */
static bb_status alloc_blocks(bb_model_t *m, decoder_state *g, int pool)
{
    const bb_block_layout *lay = &g->lay;
    bb_block_acts sel = {0}; /* selective blocks' scratch */
    int saving = 0, offloaded = 0;
    for (int l = 0; l < g->L; l++) {
        saving += g->policy[l] == BB_RECOMPUTE_NONE || g->policy[l] == BB_RECOMPUTE_SELECTIVE;
        offloaded += g->policy[l] == BB_RECOMPUTE_OFFLOAD;
    }
    if (memchr(g->policy, BB_RECOMPUTE_SELECTIVE, (size_t)g->L))
        for (int k = 0; k < lay->saved; k++) {
            if (!(lay->dropped >> k & 1)) continue;
            if (lay->reuse[k] >= 0) sel.t[k] = sel.t[lay->reuse[k]]; /* dead before this one is recomputed */
            else BB_TRY(alloc_tensor(m, &sel.t[k], bb_decoder_saved_count(m, k), "activations (selective recompute)"));
        }
    int oslots = offloaded < 2 ? offloaded : 2;
    g->slot_count = saving + pool + oslots;
    bool *made = calloc((size_t)g->slot_count + 1, sizeof *made);
    if (!made || !(g->slots = calloc((size_t)g->slot_count + 1, sizeof *g->slots))) {
        free(made);
        return bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    bb_status rc = BB_OK;
    for (int l = 0, next = 0, o = 0; l < g->L && rc == BB_OK; l++) {
        const segment *s = &g->segs[g->seg_of[l]];
        bool off = g->policy[l] == BB_RECOMPUTE_OFFLOAD;
        if (off) g->oslot[l] = o % 2;
        int at = off ? saving + pool + o++ % 2 : s->recompute ? saving + (l - s->first) : next++;
        g->act[l] = &g->slots[at];
        if (off) rc = alloc_host_slot(m, &g->host_acts[l]);
        if (rc != BB_OK || made[at]) continue; /* a shared slot already made */
        made[at] = true;
        unsigned shared = g->policy[l] == BB_RECOMPUTE_SELECTIVE ? lay->dropped : 0;
        rc = alloc_slot(m, g->act[l], &sel, shared);
    }
    free(made);
    for (int j = 0; rc == BB_OK && j < oslots; j++) {
        g->otenant[j] = -1;
        if ((rc = bb_backend_event_create(m->be, &g->oev_compute[j])) == BB_OK &&
            (rc = bb_backend_event_create(m->be, &g->oev_out[j])) == BB_OK)
            rc = bb_backend_event_create(m->be, &g->oev_in[j]);
    }
    m->host_activation_bytes = g->host_bytes;
    return rc;
}

/* The kind's position table, made on the host once and kept on the device. */
static bb_status position_table(bb_model_t *m, decoder_state *g)
{
    if (!g->k->position_table) return BB_OK;
    size_t n = g->k->position_table(&m->cfg, NULL) * (size_t)g->d.seq_len;
    float *host = malloc(n * sizeof *host);
    if (!host) return bb_fail(BB_ERR_NOMEM, "out of memory for a position table of %zu floats", n);
    g->k->position_table(&m->cfg, host);
    bb_status rc = alloc_floats(m, &g->positions, n, "position table");
    if (rc == BB_OK) rc = bb_backend_copy(m->be, g->positions, host, n * sizeof *host, BB_COPY_H2D);
    free(host);
    return rc;
}

/* The tensors: the stem's, each block's, then the final ones (the head's
 * last when it is not tied). */
static bb_status add_tensors(bb_model_t *m, decoder_state *g)
{
    const bb_decoder_kind *k = g->k;
    BB_TRY(k->add_stem_tensors(m));
    for (int l = 0; l < g->L; l++) {
        g->block_tensor[l] = m->tensor_count;
        BB_TRY(k->block->add_tensors(m, l));
    }
    g->block_tensor[g->L] = m->tensor_count;
    BB_TRY(k->add_final_tensors(m));
    g->head = k->tied_head(&m->cfg) ? 0 : m->tensor_count - 1;
    return bb_model_alloc_parameters(m);
}

bb_status bb_decoder_create(bb_model_t *m)
{
    const bb_model_config *c = &m->cfg;
    decoder_state *g = m->impl = calloc(1, sizeof *g);
    if (!g) return bb_fail(BB_ERR_NOMEM, "out of memory");
    g->k = c->kind->decoder;
    g->k->dims(c, &g->d);
    BB_TRY(g->k->check(c));
    if ((int64_t)m->B * g->d.seq_len > INT32_MAX / 4)
        return bb_fail(BB_ERR_ARG, "micro-batch %d x --seq-len %d tokens is too many for one micro-step", m->B,
                       g->d.seq_len);
    g->L = g->d.layers;
    g->dtype = model_act_dtype(m);
    g->k->block->layout(c, &g->lay);
    g->segs = calloc((size_t)g->L, sizeof *g->segs);
    g->seg_of = calloc((size_t)g->L, sizeof *g->seg_of);
    g->policy = calloc((size_t)g->L, 1);
    g->block_tensor = calloc((size_t)g->L + 1, sizeof *g->block_tensor);
    g->act = calloc((size_t)g->L, sizeof *g->act);
    g->seg_in = calloc((size_t)g->L, sizeof *g->seg_in);
    g->host_acts = calloc((size_t)g->L, sizeof *g->host_acts);
    g->oslot = malloc((size_t)g->L * sizeof *g->oslot);
    g->host_owned = calloc((size_t)g->L, sizeof *g->host_owned);
    g->host_owned_bytes = calloc((size_t)g->L, sizeof *g->host_owned_bytes);
    if (!g->segs || !g->seg_of || !g->policy || !g->block_tensor || !g->act || !g->seg_in || !g->host_acts ||
        !g->oslot || !g->host_owned || !g->host_owned_bytes)
        return bb_fail(BB_ERR_NOMEM, "out of memory");
    for (int l = 0; l < g->L; l++) g->oslot[l] = -1;
    BB_TRY(add_tensors(m, g));
    BB_TRY(position_table(m, g));
    int pool = make_segments(m, g);
    size_t BT = (size_t)m->B * g->d.seq_len, C = (size_t)g->d.d_model;
    g->chunk = bb_model_loss_chunk(c, m->B, bb_backend_transient_budget(m->be));
    g->chunks = (int)((BT + (size_t)g->chunk - 1) / (size_t)g->chunk);
    for (int s = 0; s < g->S; s++) {
        /* the previous block's output is saved, and stays on the device */
        if (s > 0 && !g->segs[s - 1].recompute && g->policy[g->segs[s - 1].first] != BB_RECOMPUTE_OFFLOAD) continue;
        BB_TRY(alloc_tensor(m, &g->seg_in[s], BT * C, "saved block inputs"));
    }
    BB_TRY(alloc_blocks(m, g, pool));
    BB_TRY(alloc_tensor(m, &g->normed, BT * C, "activations"));
    for (int s = 0; s < g->k->norm_stats; s++) BB_TRY(alloc_floats(m, &g->norm_stat[s], BT, "activations"));
    size_t logits = (size_t)g->chunk * bb_model_logits_stride(g->d.vocab);
    BB_TRY(alloc_tensor(m, &g->logits, logits, "logits (one chunk)")); /* their gradient is written over them */
    BB_TRY(alloc_act(m, (void **)&g->row_loss, BT * sizeof(double), "per-token losses"));
    BB_TRY(alloc_tensor(m, &g->dres, BT * C, "backward scratch"));
    BB_TRY(alloc_tensor(m, &g->dln, BT * C, "backward scratch"));
    g->computed_segment = g->last_block = -1;
    return BB_OK;
}

void bb_decoder_destroy(bb_model_t *m)
{
    decoder_state *g = m->impl;
    if (!g) return;
    /* The buffers belong to the backend's accounting: free them there. */
    bb_decoder_cache_destroy(m);
    for (int i = 0; i < g->owned_count; i++) bb_backend_free(m->be, g->owned[i]);
    for (int i = 0; i < g->host_count; i++) bb_backend_host_free(m->be, g->host_owned[i], g->host_owned_bytes[i]);
    for (int j = 0; j < 2; j++) {
        bb_backend_event_destroy(m->be, g->oev_compute[j]);
        bb_backend_event_destroy(m->be, g->oev_out[j]);
        bb_backend_event_destroy(m->be, g->oev_in[j]);
    }
    free(g->owned), free(g->host_owned), free(g->host_owned_bytes), free(g->host_acts), free(g->oslot);
    free(g->segs), free(g->seg_of), free(g->policy), free(g->block_tensor), free(g->act), free(g->slots);
    free(g->seg_in);
    free(g);
    m->impl = NULL;
}

/* The bytes bb_decoder_create allocates per block under each policy (see
 * the layout above; bb_model_block_costs). */
void bb_decoder_block_costs(const bb_model_config *c, int micro_batch, bb_block_costs *out)
{
    const bb_decoder_kind *k = c->kind->decoder;
    bb_decoder_dims d;
    bb_block_layout lay;
    k->dims(c, &d);
    k->block->layout(c, &lay);
    uint64_t BT = (uint64_t)micro_batch * d.seq_len, widths = 0, kept = 0, scratch = 0, stat_widths = 0;
    for (int i = 0; i < lay.saved; i++) {
        bool dropped = lay.dropped >> i & 1;
        widths += (uint64_t)lay.width[i];
        if (!dropped) kept += (uint64_t)lay.width[i];
        else if (lay.reuse[i] < 0) scratch += (uint64_t)lay.width[i];
    }
    for (int s = 0; s < lay.stats; s++) stat_widths += (uint64_t)lay.stat_width[s];
    uint64_t stats = BT * stat_widths * 4, tensors = BT * widths, selective = BT * kept;
    uint64_t output = BT * (uint64_t)lay.width[lay.saved - 1];
    enum { N, S, F, O };
    uint64_t es = c->precision == BB_PRECISION_BF16 ? 2 : 4; /* bytes of a tensor's element */
    memset(out, 0, sizeof *out);
    out->own[N] = out->own_last[N] = stats + es * tensors;
    out->own[S] = out->own_last[S] = stats + es * selective;
    out->once[S] = BT * scratch * es;                /* the dropped tensors' shared scratch */
    out->once[F] = stats + es * tensors;             /* the recompute slot */
    out->once[O] = stats + es * tensors;             /* a device slot (of two) */
    out->host = stats + es * tensors;                /* an offloaded block's pinned copy */
    out->after_full = output * es;                   /* the saved input of the next block */
    out->last_full_spared = true;                    /* no later 'f' overwrites the recompute slot */
}
