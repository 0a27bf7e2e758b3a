/* gpt_layout.c — the gpt's tensors and where each block's activations
 * live under its checkpoint policy (see gpt.c), allocated once when the
 * model is made; and the GPT-2 initialisation.
 *
 * Per token, a block's backward reads 16 d-wide floats (LayerNorm 1, qkv
 * 3, attention output, residual, LayerNorm 2, fc 4, GELU 4, output) and
 * 4 + heads statistics: 'n' keeps them all; 's' keeps 10 (all but the
 * LayerNorm and GELU outputs, which share one scratch of 5 for every
 * selective block in fp32, the work buffers in bf16); 'f' keeps its input
 * (1, or nothing more when the previous block's output is kept anyway),
 * and the recomputed blocks run in slots shared by every 'f' segment. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"

static bb_status add_tensors(bb_model_t *m)
{
    const bb_model_config *c = &m->cfg;
    int C = c->d_model;
    BB_TRY(bb_model_add_tensor(m, "transformer.wte.weight", c->vocab, C, true));
    BB_TRY(bb_model_add_tensor(m, "transformer.wpe.weight", c->seq_len, C, true));
    static const struct {
        const char *name;
        int rows, cols; /* in multiples of C; cols 0: a vector */
        bool decay;
    } block[PER_BLOCK] = {
        {"ln_1.weight", 1, 0, false},     {"ln_1.bias", 1, 0, false},      {"attn.c_attn.weight", 3, 1, true},
        {"attn.c_attn.bias", 3, 0, false}, {"attn.c_proj.weight", 1, 1, true}, {"attn.c_proj.bias", 1, 0, false},
        {"ln_2.weight", 1, 0, false},     {"ln_2.bias", 1, 0, false},      {"mlp.c_fc.weight", 4, 1, true},
        {"mlp.c_fc.bias", 4, 0, false},   {"mlp.c_proj.weight", 1, 4, true}, {"mlp.c_proj.bias", 1, 0, false},
    };
    for (int l = 0; l < c->layers; l++)
        for (int k = 0; k < PER_BLOCK; k++) {
            char name[64];
            snprintf(name, sizeof name, "transformer.h.%d.%s", l, block[k].name);
            BB_TRY(bb_model_add_tensor(m, name, block[k].rows * C, block[k].cols * C, block[k].decay));
        }
    BB_TRY(bb_model_add_tensor(m, "transformer.ln_f.weight", C, 0, false));
    return bb_model_add_tensor(m, "transformer.ln_f.bias", C, 0, false);
}

size_t bb_gpt_kept_count(const bb_model_t *m, int k)
{
    const bb_model_config *c = &m->cfg;
    size_t BT = (size_t)m->B * c->seq_len, C = (size_t)c->d_model;
    switch (k) {
    case KEPT_QKV: return BT * 3 * C;
    case KEPT_FCH:
    case KEPT_GELU: return BT * 4 * C;
    default: return BT * C;
    }
}

/* An activation buffer, counted by the model and remembered for the destroy. */
static bb_status alloc_act(bb_model_t *m, void *out, size_t bytes, const char *what)
{
    gpt_state *g = m->impl;
    if (g->owned_count == g->owned_cap) {
        int cap = g->owned_cap ? 2 * g->owned_cap : 64;
        void **grown = realloc(g->owned, (size_t)cap * sizeof *grown);
        if (!grown) return bb_fail(BB_ERR_NOMEM, "out of memory");
        g->owned = grown, g->owned_cap = cap;
    }
    void **p = out;
    BB_TRY(bb_model_alloc_activation(m, bytes, what, p));
    g->owned[g->owned_count++] = *p;
    return BB_OK;
}

static bb_status alloc_floats(bb_model_t *m, float **out, size_t count, const char *what)
{
    return alloc_act(m, out, count * sizeof(float), what);
}

/* A slot: its statistics, and its kept tensors but those of `shared_mask`
 * (bits KEPT_*), which are `shared`'s. */
static bb_status alloc_slot(bb_model_t *m, block_acts *a, const block_acts *shared, unsigned shared_mask)
{
    size_t BT = (size_t)m->B * m->cfg.seq_len;
    for (int k = 0; k < KEPT; k++) {
        if (shared_mask >> k & 1) *gpt_kept_tensor(a, k) = *gpt_kept_tensor((block_acts *)shared, k);
        else BB_TRY(alloc_floats(m, gpt_kept_tensor(a, k), bb_gpt_kept_count(m, k), "activations"));
    }
    BB_TRY(alloc_floats(m, &a->lse, BT * m->cfg.heads, "activations"));
    BB_TRY(alloc_floats(m, &a->ln1_mean, BT, "activations"));
    BB_TRY(alloc_floats(m, &a->ln1_rstd, BT, "activations"));
    BB_TRY(alloc_floats(m, &a->ln2_mean, BT, "activations"));
    return alloc_floats(m, &a->ln2_rstd, BT, "activations");
}

#define RECOMPUTED (1u << KEPT_LN1 | 1u << KEPT_LN2 | 1u << KEPT_GELU) /* what a selective block does not keep */
#define ALL_KEPT ((1u << KEPT) - 1)

/* Blocks into segments: each 'n' or 's' block alone, 'f' blocks alone
 * (plan:...) or in runs of checkpoint_every (every:K). */
static int make_segments(bb_model_t *m, gpt_state *g)
{
    const bb_model_config *c = &m->cfg;
    bool plan = c->checkpoint_plan[0] != 0;
    int run = !plan && c->checkpoint_every > 0 ? c->checkpoint_every : 1, longest = 0;
    for (int l = 0; l < g->L; l++) g->keep[l] = bb_model_block_keep(c, l);
    for (int l = 0; l < g->L;) {
        bool recompute = g->keep[l] == BB_KEEP_INPUT;
        int end = recompute ? (l + run < g->L ? l + run : g->L) : l + 1;
        g->segs[g->S] = (segment){l, end, recompute};
        if (recompute && end - l > longest) longest = end - l;
        for (; l < end; l++) g->seg_of[l] = g->S;
        g->S++;
    }
    return longest;
}

/* Each block's activations: kept blocks a slot of their own, recomputed
 * ones the recompute slot of their place in the segment. */
static bb_status alloc_blocks(bb_model_t *m, gpt_state *g, int pool)
{
    size_t BT = (size_t)m->B * m->cfg.seq_len, C = m->cfg.d_model;
    block_acts sel = {0}, *work = NULL; /* fp32: selective blocks' scratch; bf16: the shared fp32 buffers */
    int kept = 0;
    for (int l = 0; l < g->L; l++) kept += g->keep[l] != BB_KEEP_INPUT;
    if (!g->bf16 && memchr(g->keep, BB_KEEP_SELECTIVE, (size_t)g->L)) {
        BB_TRY(alloc_floats(m, &sel.ln1, BT * C, "activations (selective recompute)"));
        BB_TRY(alloc_floats(m, &sel.fch_gelu, BT * 4 * C, "activations (selective recompute)"));
        sel.ln2 = sel.ln1; /* LayerNorm 2's output is dead before LayerNorm 1's is recomputed */
    }
    g->slot_count = kept + pool;
    if (!(g->slots = calloc((size_t)g->slot_count, sizeof *g->slots))) return bb_fail(BB_ERR_NOMEM, "out of memory");
    int next = 0;
    for (int l = 0; l < g->L; l++) {
        const segment *s = &g->segs[g->seg_of[l]];
        int at = s->recompute ? kept + (l - s->first) : next++;
        g->act[l] = &g->slots[at];
        if (g->act[l]->lse) continue; /* a recompute slot already made */
        unsigned shared = work ? ALL_KEPT : g->keep[l] == BB_KEEP_SELECTIVE && !g->bf16 ? RECOMPUTED : 0;
        BB_TRY(alloc_slot(m, g->act[l], work ? work : &sel, shared));
        if (g->bf16 && !work) work = g->act[l];
    }
    return BB_OK;
}

static bb_status alloc_bf16(bb_model_t *m, uint16_t **out, size_t count, const char *what)
{
    return alloc_act(m, out, count * sizeof(uint16_t), what);
}

/* bf16: where each block's kept tensors are packed (gpt_state.stash). */
static bb_status alloc_stash(bb_model_t *m, gpt_state *g, int pool)
{
    uint16_t **shared = calloc((size_t)(pool > 1 ? pool - 1 : 1) * KEPT, sizeof *shared); /* recompute slots' */
    if (!shared) return bb_fail(BB_ERR_NOMEM, "out of memory");
    bb_status rc = BB_OK;
    for (int i = 0; i < (pool - 1) * KEPT && rc == BB_OK; i++)
        rc = alloc_bf16(m, &shared[i], bb_gpt_kept_count(m, i % KEPT), "activations (bf16)");
    for (int l = 0; l < g->L && rc == BB_OK; l++) {
        int si = g->seg_of[l];
        const segment *s = &g->segs[si];
        for (int k = 0; k < KEPT && rc == BB_OK; k++) {
            uint16_t **at = &g->stash[l * KEPT + k];
            if (s->recompute && l + 1 < s->end) *at = shared[(l - s->first) * KEPT + k];
            else if (s->recompute) *at = k == KEPT_RES3 && si + 1 < g->S ? g->seg_packed[si + 1] : NULL;
            else if (l + 1 < g->L && !(g->keep[l] == BB_KEEP_SELECTIVE && RECOMPUTED >> k & 1))
                rc = alloc_bf16(m, at, bb_gpt_kept_count(m, k), "activations (bf16)");
        }
    }
    free(shared);
    return rc;
}

bb_status bb_gpt_create(bb_model_t *m)
{
    const bb_model_config *c = &m->cfg;
    if (c->layers < 1 || c->heads < 1 || c->d_model < 1 || c->seq_len < 1 || c->vocab < 1)
        return bb_fail(BB_ERR_ARG, "gpt needs positive --layers, --heads, --d-model, --seq-len and a vocabulary");
    if (c->d_model % c->heads)
        return bb_fail(BB_ERR_ARG, "--d-model %d is not divisible by --heads %d", c->d_model, c->heads);
    if ((int64_t)m->B * c->seq_len > INT32_MAX / 4)
        return bb_fail(BB_ERR_ARG, "micro-batch %d x --seq-len %d tokens is too many for one micro-step", m->B,
                       c->seq_len);
    BB_TRY(add_tensors(m));
    BB_TRY(bb_model_alloc_parameters(m));
    gpt_state *g = m->impl = calloc(1, sizeof *g);
    if (!g) return bb_fail(BB_ERR_NOMEM, "out of memory");
    g->L = c->layers;
    g->bf16 = c->precision == BB_PRECISION_BF16;
    g->segs = calloc((size_t)g->L, sizeof *g->segs);
    g->seg_of = calloc((size_t)g->L, sizeof *g->seg_of);
    g->keep = calloc((size_t)g->L, 1);
    g->act = calloc((size_t)g->L, sizeof *g->act);
    g->seg_in = calloc((size_t)g->L, sizeof *g->seg_in);
    g->seg_packed = calloc((size_t)g->L, sizeof *g->seg_packed);
    g->stash = calloc((size_t)g->L * KEPT, sizeof *g->stash);
    if (!g->segs || !g->seg_of || !g->keep || !g->act || !g->seg_in || !g->seg_packed || !g->stash)
        return bb_fail(BB_ERR_NOMEM, "out of memory");
    int pool = make_segments(m, g);
    size_t BT = (size_t)m->B * c->seq_len, C = c->d_model;
    g->chunk = bb_model_loss_chunk(c, m->B, bb_backend_head_budget(m->be));
    g->chunks = (int)((BT + (size_t)g->chunk - 1) / (size_t)g->chunk);
    for (int s = 0; s < g->S; s++) {
        if (s > 0 && !g->segs[s - 1].recompute) continue; /* the previous block's output is kept */
        if (g->bf16) BB_TRY(alloc_bf16(m, &g->seg_packed[s], BT * C, "checkpointed block inputs"));
        else BB_TRY(alloc_floats(m, &g->seg_in[s], BT * C, "checkpointed block inputs"));
    }
    BB_TRY(alloc_blocks(m, g, pool));
    if (g->bf16) {
        BB_TRY(alloc_floats(m, &g->x, BT * C, "activations"));
        BB_TRY(alloc_stash(m, g, pool));
    }
    BB_TRY(alloc_floats(m, &g->lnf, BT * C, "activations"));
    BB_TRY(alloc_floats(m, &g->lnf_mean, BT, "activations"));
    BB_TRY(alloc_floats(m, &g->lnf_rstd, BT, "activations"));
    BB_TRY(alloc_floats(m, &g->logits, (size_t)g->chunk * c->vocab, "logits (one chunk)"));
    BB_TRY(alloc_act(m, &g->row_loss, BT * sizeof(double), "per-token losses"));
    BB_TRY(alloc_floats(m, &g->dres, BT * C, "backward scratch"));
    BB_TRY(alloc_floats(m, &g->dln, BT * C, "backward scratch"));
    g->computed_segment = g->last_block = -1;
    return BB_OK;
}

void bb_gpt_destroy(bb_model_t *m)
{
    gpt_state *g = m->impl;
    if (!g) return;
    /* The buffers belong to the backend's accounting: free them there. */
    bb_gpt_decode_destroy(m, g->decode);
    for (int i = 0; i < g->owned_count; i++) bb_backend_free(m->be, g->owned[i]);
    free(g->owned);
    free(g->segs), free(g->seg_of), free(g->keep), free(g->act), free(g->slots);
    free(g->seg_in), free(g->seg_packed), free(g->stash);
    free(g);
}

/* The bytes bb_gpt_create allocates per block under each policy (see the
 * layout above; bb_model_block_costs). */
void bb_gpt_block_costs(const bb_model_config *c, int micro_batch, bb_block_costs *out)
{
    uint64_t BT = (uint64_t)micro_batch * c->seq_len, C = (uint64_t)c->d_model;
    uint64_t stats = BT * (4 + (uint64_t)c->heads) * 4, tensors = BT * 16 * C, selective = BT * 10 * C;
    enum { N, S, F };
    memset(out, 0, sizeof *out);
    if (c->precision == BB_PRECISION_BF16) { /* fp32 work buffers shared; kept tensors stashed in 2 bytes */
        out->own[N] = stats + 2 * tensors, out->own[S] = stats + 2 * selective;
        out->own_last[N] = out->own_last[S] = stats; /* the last block stays in the work buffers */
        out->once[F] = stats;                        /* the recompute slot's statistics */
        out->after_full = BT * C * 2;                /* the packed input of the next block */
    } else {
        out->own[N] = out->own_last[N] = stats + 4 * tensors;
        out->own[S] = out->own_last[S] = stats + 4 * selective;
        out->once[S] = BT * 5 * C * 4;               /* LayerNorm and GELU scratch */
        out->once[F] = stats + 4 * tensors;          /* the recompute slot */
        out->after_full = BT * C * 4;                /* the saved input of the next block */
        out->last_full_spared = true;                /* no later 'f' overwrites the recompute slot */
    }
}

bb_status bb_gpt_init(bb_model_t *m, uint64_t seed, float *host)
{
    init_rng r = {seed};
    float proj_std = 0.02f / sqrtf(2.0f * m->cfg.layers);
    for (int i = 0; i < m->tensor_count; i++) {
        const bb_tensor_info *t = &m->tensors[i];
        float *p = host + t->offset;
        bool proj = strstr(t->name, "c_proj.weight") != NULL;
        bool norm = strstr(t->name, "ln_") != NULL && strstr(t->name, ".weight") != NULL;
        for (size_t j = 0; j < t->count; j++)
            p[j] = t->rank == 2 ? bb_init_normal(&r, proj ? proj_std : 0.02f) : norm ? 1.0f : 0.0f;
    }
    return BB_OK;
}
