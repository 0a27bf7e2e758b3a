/* gpt.c — the decoder-only transformer (GPT-2 shape: pre-LayerNorm blocks,
 * causal attention, GELU MLP of 4x, tied token embedding and LM head),
 * with blocks grouped into checkpoint segments.
 *
 * Activations live in `K` block slots (K = blocks per segment; all blocks
 * without checkpointing) plus each segment's input. The forward runs the
 * segments in order, each one's blocks through the slots; the backward
 * walks the segments in reverse and re-runs a segment's forward from its
 * saved input unless the slots still hold it (the last segment always).
 *
 * bf16 activations (--precision bf16): the K slots share one set of fp32
 * work buffers (each slot keeps its own LayerNorm statistics), and each
 * block's kept tensors are rounded to bf16 as they are computed and packed
 * into a stash; the backward unpacks a block into the work buffers before
 * its backward. The last block of a segment needs no stash: the forward
 * (or the recomputation) leaves it in the work buffers right before its
 * backward. Segment inputs are packed too, and every block's input is
 * unpacked into one fp32 buffer `x`.
 *
 * Attention is tiled (bb_op_attention_*): a block keeps its output and one
 * log-sum-exp per row and head, nothing of size T×T. The LM head and the
 * loss run fused, in chunks of `chunk` tokens (bb_model_loss_chunk): per
 * chunk the logits, in place their gradient, and each token's loss at its
 * place in row_loss, which the forward sums once (its one wait for the
 * device); at most one chunk's logits exist. The backward walks the chunks in reverse: the
 * last one is still in the buffer, the others are recomputed from the
 * final LayerNorm's output (one more head product for all chunks but the
 * last), and each adds its part to the input's and the tied embedding's
 * gradients. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

enum { LN1_W, LN1_B, ATTN_W, ATTN_B, PROJ_W, PROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCPROJ_W, FCPROJ_B, PER_BLOCK };
enum { WTE = 0, WPE = 1, FIRST_BLOCK = 2 };
#define BLOCK_TENSOR(l, k) (FIRST_BLOCK + (l) * PER_BLOCK + (k))

typedef struct block_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (BT,C), (BT), (BT) */
    float *qkv;                       /* (BT,3C) */
    float *lse;                       /* (B,NH,T) attention's log-sum-exp per row; fp32 always */
    float *atty;                      /* (BT,C) */
    float *res2;                      /* (BT,C) after attention */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;            /* (BT,4C) */
    float *res3;                      /* (BT,C) block output */
} block_acts;

/* The tensors of a block that its backward (or the next block) reads,
 * in block_acts order: what bf16 packs. */
enum { KEPT_LN1, KEPT_QKV, KEPT_ATTY, KEPT_RES2, KEPT_LN2, KEPT_FCH, KEPT_GELU, KEPT_RES3, KEPT };

typedef struct gpt_state {
    int K, S;                /* blocks per segment, segments */
    float **seg_in;          /* (S) segment inputs (BT,C); seg_in[0] is the embedding; fp32 only */
    block_acts *slots;       /* (K) */
    bool bf16;
    uint16_t **stash;        /* bf16: K x KEPT slots, the first (K-1) x KEPT allocated; block l's at (l % K) * KEPT */
    uint16_t **seg_packed;   /* bf16: (S) segment inputs (BT,C) */
    float *x;                /* bf16: (BT,C) the input of the block being computed */
    float *lnf, *lnf_mean, *lnf_rstd;
    float *logits;           /* (chunk, V): one chunk's logits, then their gradient */
    double *row_loss;        /* (BT): each token's loss, chunk by chunk; summed once per forward */
    int chunk, chunks;       /* tokens per chunk of the head + loss, and their number */
    float normalizer;        /* the last forward's, for the backward's recomputed chunks */
    float *dres, *dln;       /* backward scratch; a block's other gradients reuse its own slot */
    int computed_segment;    /* whose activations the slots hold */
} gpt_state;

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

static bb_status alloc_floats(bb_model_t *m, float **out, size_t count, const char *what)
{
    return bb_model_alloc_activation(m, count * sizeof(float), what, (void **)out);
}

static float **kept_tensor(block_acts *a, int k)
{
    float **t[KEPT] = {&a->ln1, &a->qkv, &a->atty, &a->res2, &a->ln2, &a->fch, &a->fch_gelu, &a->res3};
    return t[k];
}

static size_t kept_count(const bb_model_t *m, int k)
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

/* A slot's buffers: its LayerNorm and attention statistics, and the kept
 * tensors unless it shares `work`'s (bf16). */
static bb_status alloc_slot(bb_model_t *m, block_acts *a, block_acts *work)
{
    size_t BT = (size_t)m->B * m->cfg.seq_len;
    for (int k = 0; k < KEPT; k++) {
        if (work) *kept_tensor(a, k) = *kept_tensor(work, k);
        else BB_TRY(alloc_floats(m, kept_tensor(a, k), kept_count(m, k), "activations"));
    }
    BB_TRY(alloc_floats(m, &a->lse, BT * m->cfg.heads, "activations"));
    BB_TRY(alloc_floats(m, &a->ln1_mean, BT, "activations"));
    BB_TRY(alloc_floats(m, &a->ln1_rstd, BT, "activations"));
    BB_TRY(alloc_floats(m, &a->ln2_mean, BT, "activations"));
    return alloc_floats(m, &a->ln2_rstd, BT, "activations");
}

static bb_status alloc_bf16(bb_model_t *m, uint16_t **out, size_t count, const char *what)
{
    return bb_model_alloc_activation(m, count * sizeof(uint16_t), what, (void **)out);
}

static bb_status gpt_create(bb_model_t *m)
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
    g->K = c->checkpoint_every > 0 && c->checkpoint_every < c->layers ? c->checkpoint_every : c->layers;
    g->S = (c->layers + g->K - 1) / g->K;
    g->bf16 = c->precision == BB_PRECISION_BF16;
    g->seg_in = calloc((size_t)g->S, sizeof *g->seg_in);
    g->slots = calloc((size_t)g->K, sizeof *g->slots);
    g->seg_packed = calloc((size_t)g->S, sizeof *g->seg_packed);
    g->stash = calloc((size_t)g->K * KEPT, sizeof *g->stash);
    if (!g->seg_in || !g->slots || !g->seg_packed || !g->stash) return bb_fail(BB_ERR_NOMEM, "out of memory");
    size_t BT = (size_t)m->B * c->seq_len, C = c->d_model;
    g->chunk = bb_model_loss_chunk(c, m->B, bb_backend_head_budget(m->be));
    g->chunks = (int)((BT + (size_t)g->chunk - 1) / (size_t)g->chunk);
    for (int s = 0; s < g->S; s++) {
        if (g->bf16) BB_TRY(alloc_bf16(m, &g->seg_packed[s], BT * C, "checkpointed block inputs"));
        else BB_TRY(alloc_floats(m, &g->seg_in[s], BT * C, "checkpointed block inputs"));
    }
    for (int k = 0; k < g->K; k++) BB_TRY(alloc_slot(m, &g->slots[k], g->bf16 && k ? &g->slots[0] : NULL));
    if (g->bf16) {
        BB_TRY(alloc_floats(m, &g->x, BT * C, "activations"));
        for (int i = 0; i < (g->K - 1) * KEPT; i++)
            BB_TRY(alloc_bf16(m, &g->stash[i], kept_count(m, i % KEPT), "activations (bf16)"));
    }
    BB_TRY(alloc_floats(m, &g->lnf, BT * C, "activations"));
    BB_TRY(alloc_floats(m, &g->lnf_mean, BT, "activations"));
    BB_TRY(alloc_floats(m, &g->lnf_rstd, BT, "activations"));
    BB_TRY(alloc_floats(m, &g->logits, (size_t)g->chunk * c->vocab, "logits (one chunk)"));
    BB_TRY(bb_model_alloc_activation(m, BT * sizeof(double), "per-token losses", (void **)&g->row_loss));
    BB_TRY(alloc_floats(m, &g->dres, BT * C, "backward scratch"));
    BB_TRY(alloc_floats(m, &g->dln, BT * C, "backward scratch"));
    g->computed_segment = -1;
    return BB_OK;
}

static void gpt_destroy(bb_model_t *m)
{
    gpt_state *g = m->impl;
    if (!g) return;
    /* The buffers belong to the backend's accounting: free them there. */
    float **all[] = {&g->lnf, &g->lnf_mean, &g->lnf_rstd, &g->logits, &g->dres, &g->dln};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) bb_backend_free(m->be, *all[i]);
    bb_backend_free(m->be, g->x);
    bb_backend_free(m->be, g->row_loss);
    for (int s = 0; g->seg_in && s < g->S; s++) bb_backend_free(m->be, g->seg_in[s]);
    for (int s = 0; g->seg_packed && s < g->S; s++) bb_backend_free(m->be, g->seg_packed[s]);
    for (int i = 0; g->stash && i < g->K * KEPT; i++) bb_backend_free(m->be, g->stash[i]);
    for (int k = 0; g->slots && k < g->K; k++) {
        block_acts *a = &g->slots[k];
        float *stats[] = {a->lse, a->ln1_mean, a->ln1_rstd, a->ln2_mean, a->ln2_rstd};
        for (size_t i = 0; i < sizeof stats / sizeof *stats; i++) bb_backend_free(m->be, stats[i]);
        for (int t = 0; t < KEPT && (k == 0 || !g->bf16); t++) bb_backend_free(m->be, *kept_tensor(a, t)); /* bf16: shared */
    }
    free(g->seg_in);
    free(g->seg_packed);
    free(g->stash);
    free(g->slots);
    free(g);
}

static bb_status gpt_init(bb_model_t *m, uint64_t seed, float *host)
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

/* ---- forward ----------------------------------------------------------- */
/* Chunk k of the head: its logits from the final LayerNorm's output, then
 * in place d(loss)/d(logits), and its tokens' losses at their place in
 * row_loss. Nothing waits for the device. */
static void head_chunk(bb_model_t *m, int k)
{
    gpt_state *g = m->impl;
    const bb_model_config *c = &m->cfg;
    int BT = m->B * c->seq_len, first = k * g->chunk, n = BT - first < g->chunk ? BT - first : g->chunk;
    bb_op_linear_forward(m->be, g->logits, g->lnf + (size_t)first * c->d_model, model_param(m, WTE), NULL, n,
                         c->d_model, c->vocab);
    bb_op_crossentropy_rows(m->be, g->row_loss + first, g->logits, g->logits, m->targets + first, n, c->vocab,
                            g->normalizer);
}

static int segment_end(const gpt_state *g, const bb_model_config *c, int s)
{
    return (s + 1) * g->K < c->layers ? (s + 1) * g->K : c->layers;
}

/* bf16: where block l's kept tensor k is packed. The last block of a
 * segment stays in the work buffers; its output is the next segment's input. */
static uint16_t *pack_target(const gpt_state *g, const bb_model_config *c, int l, int k)
{
    int s = l / g->K;
    if (l + 1 < segment_end(g, c, s)) return g->stash[(l % g->K) * KEPT + k];
    return k == KEPT_RES3 && s + 1 < g->S ? g->seg_packed[s + 1] : NULL;
}

/* bf16: rounds block l's just-computed tensor k (in a) and packs it. */
static void keep(bb_model_t *m, int l, block_acts *a, int k)
{
    gpt_state *g = m->impl;
    if (g->bf16) bb_op_bf16_round(m->be, *kept_tensor(a, k), pack_target(g, &m->cfg, l, k), kept_count(m, k));
}

/* bf16: unpacks block l's input (its segment's input or block l-1's
 * output) into x. */
static void load_input(bb_model_t *m, int l)
{
    gpt_state *g = m->impl;
    const uint16_t *in = l % g->K == 0 ? g->seg_packed[l / g->K] : g->stash[(l - 1) % g->K * KEPT + KEPT_RES3];
    bb_op_bf16_unpack(m->be, g->x, in, kept_count(m, KEPT_RES3));
}

/* bf16: unpacks block l's kept tensors (all but its output) into the work buffers. */
static void load_block(bb_model_t *m, int l)
{
    gpt_state *g = m->impl;
    block_acts *a = &g->slots[l % g->K];
    for (int k = 0; k < KEPT_RES3; k++)
        bb_op_bf16_unpack(m->be, *kept_tensor(a, k), g->stash[(l % g->K) * KEPT + k], kept_count(m, k));
}

static void block_forward(bb_model_t *m, int l, block_acts *a, const float *x)
{
    const bb_model_config *c = &m->cfg;
    bb_backend_t *be = m->be;
    int B = m->B, T = c->seq_len, C = c->d_model, BT = B * T;
    size_t n = (size_t)BT * C;
    bb_op_layernorm_forward(be, a->ln1, a->ln1_mean, a->ln1_rstd, x, model_param(m, BLOCK_TENSOR(l, LN1_W)),
                            model_param(m, BLOCK_TENSOR(l, LN1_B)), BT, C);
    keep(m, l, a, KEPT_LN1);
    bb_op_linear_forward(be, a->qkv, a->ln1, model_param(m, BLOCK_TENSOR(l, ATTN_W)),
                         model_param(m, BLOCK_TENSOR(l, ATTN_B)), BT, C, 3 * C);
    keep(m, l, a, KEPT_QKV);
    bb_op_attention_forward(be, a->atty, a->lse, a->qkv, B, T, C, c->heads);
    keep(m, l, a, KEPT_ATTY);
    bb_op_linear_forward(be, a->res2, a->atty, model_param(m, BLOCK_TENSOR(l, PROJ_W)),
                         model_param(m, BLOCK_TENSOR(l, PROJ_B)), BT, C, C);
    bb_op_add(be, a->res2, a->res2, x, n);
    keep(m, l, a, KEPT_RES2);
    bb_op_layernorm_forward(be, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, model_param(m, BLOCK_TENSOR(l, LN2_W)),
                            model_param(m, BLOCK_TENSOR(l, LN2_B)), BT, C);
    keep(m, l, a, KEPT_LN2);
    bb_op_linear_forward(be, a->fch, a->ln2, model_param(m, BLOCK_TENSOR(l, FC_W)),
                         model_param(m, BLOCK_TENSOR(l, FC_B)), BT, C, 4 * C);
    keep(m, l, a, KEPT_FCH);
    bb_op_gelu_forward(be, a->fch_gelu, a->fch, n * 4);
    keep(m, l, a, KEPT_GELU);
    bb_op_linear_forward(be, a->res3, a->fch_gelu, model_param(m, BLOCK_TENSOR(l, FCPROJ_W)),
                         model_param(m, BLOCK_TENSOR(l, FCPROJ_B)), BT, 4 * C, C);
    bb_op_add(be, a->res3, a->res3, a->res2, n);
    keep(m, l, a, KEPT_RES3);
}

/* The input of block l: its segment's saved input, or the previous slot's
 * output (bf16: x, once load_input has filled it). */
static const float *block_input(const gpt_state *g, int l)
{
    if (g->bf16) return g->x;
    return l % g->K == 0 ? g->seg_in[l / g->K] : g->slots[l % g->K - 1].res3;
}

/* Runs segment s's blocks; saves its output as the next segment's input. */
static bb_status segment_forward(bb_model_t *m, int s)
{
    gpt_state *g = m->impl;
    int end = segment_end(g, &m->cfg, s);
    for (int l = s * g->K; l < end; l++) {
        if (g->bf16) load_input(m, l);
        block_forward(m, l, &g->slots[l % g->K], block_input(g, l));
    }
    g->computed_segment = s;
    if (!g->bf16 && s + 1 < g->S)
        BB_TRY(bb_backend_copy(m->be, g->seg_in[s + 1], g->slots[(end - 1) % g->K].res3,
                               (size_t)m->B * m->cfg.seq_len * m->cfg.d_model * sizeof(float), BB_COPY_D2D));
    return BB_OK;
}

static const float *final_output(const gpt_state *g, const bb_model_config *c)
{
    return g->slots[(c->layers - 1) % g->K].res3;
}

static bb_status gpt_forward(bb_model_t *m, float normalizer, double *loss, int *correct)
{
    (void)correct;
    gpt_state *g = m->impl;
    const bb_model_config *c = &m->cfg;
    int B = m->B, T = c->seq_len, C = c->d_model, BT = B * T;
    float *embedded = g->bf16 ? g->x : g->seg_in[0];
    bb_op_embedding_forward(m->be, embedded, (const int32_t *)m->inputs, model_param(m, WTE), model_param(m, WPE), B, T, C);
    if (g->bf16) bb_op_bf16_round(m->be, embedded, g->seg_packed[0], (size_t)BT * C);
    for (int s = 0; s < g->S; s++) BB_TRY(segment_forward(m, s));
    int lnf = FIRST_BLOCK + c->layers * PER_BLOCK;
    bb_op_layernorm_forward(m->be, g->lnf, g->lnf_mean, g->lnf_rstd, final_output(g, c), model_param(m, lnf),
                            model_param(m, lnf + 1), BT, C);
    if (!loss) {
        g->computed_segment = -1; /* the head runs in gpt_logits: no backward */
        return BB_OK;
    }
    g->normalizer = normalizer;
    for (int k = 0; k < g->chunks; k++) head_chunk(m, k);
    *loss = bb_op_sum_rows(m->be, g->row_loss, (size_t)BT) / normalizer; /* the forward's one wait */
    return BB_OK;
}

/* ---- backward ---------------------------------------------------------- */
/* dres holds d(loss)/d(block output) on entry, d(loss)/d(block input) on
 * exit. The block's slot is spent as it goes: d(fch) overwrites fch_gelu
 * once its product's weight gradient is formed, then fch once GELU's
 * backward has read it, and d(qkv) takes fch's place. */
static void block_backward(bb_model_t *m, int l, const block_acts *a, const float *x, bool acc)
{
    const bb_model_config *c = &m->cfg;
    gpt_state *g = m->impl;
    bb_backend_t *be = m->be;
    int B = m->B, T = c->seq_len, C = c->d_model, BT = B * T;
    float *dfch = a->fch, *dqkv = a->fch; /* (BT,4C) and (BT,3C) */
#define W(k) model_param(m, BLOCK_TENSOR(l, k))
#define D(k) model_grad(m, BLOCK_TENSOR(l, k))
    bb_op_linear_backward(be, a->fch_gelu, D(FCPROJ_W), D(FCPROJ_B), g->dres, a->fch_gelu, W(FCPROJ_W), BT, 4 * C,
                          C, acc);
    bb_op_gelu_backward(be, dfch, a->fch_gelu, a->fch, (size_t)BT * 4 * C);
    bb_op_linear_backward(be, g->dln, D(FC_W), D(FC_B), dfch, a->ln2, W(FC_W), BT, C, 4 * C, acc);
    bb_op_layernorm_backward(be, g->dres, D(LN2_W), D(LN2_B), g->dln, a->res2, W(LN2_W), a->ln2_mean, a->ln2_rstd,
                             BT, C, acc);
    bb_op_linear_backward(be, g->dln, D(PROJ_W), D(PROJ_B), g->dres, a->atty, W(PROJ_W), BT, C, C, acc);
    bb_op_attention_backward(be, dqkv, g->dln, a->qkv, a->atty, a->lse, B, T, C, c->heads);
    bb_op_linear_backward(be, g->dln, D(ATTN_W), D(ATTN_B), dqkv, a->ln1, W(ATTN_W), BT, C, 3 * C, acc);
    bb_op_layernorm_backward(be, g->dres, D(LN1_W), D(LN1_B), g->dln, x, W(LN1_W), a->ln1_mean, a->ln1_rstd, BT, C,
                             acc);
#undef W
#undef D
}

static bb_status gpt_backward(bb_model_t *m, bool acc)
{
    gpt_state *g = m->impl;
    const bb_model_config *c = &m->cfg;
    int B = m->B, T = c->seq_len, C = c->d_model, BT = B * T;
    if (g->computed_segment != g->S - 1) return bb_fail(BB_ERR_INTERNAL, "gpt backward without a forward");
    int lnf = FIRST_BLOCK + c->layers * PER_BLOCK;
    /* The head, chunk by chunk from the last (whose gradient the forward
     * left in the buffer): d(lnf) rows, and the tied embedding's gradient. */
    for (int k = g->chunks - 1; k >= 0; k--) {
        if (k < g->chunks - 1) head_chunk(m, k);
        int first = k * g->chunk, n = BT - first < g->chunk ? BT - first : g->chunk;
        bb_op_linear_backward(m->be, g->dln + (size_t)first * C, model_grad(m, WTE), NULL, g->logits,
                              g->lnf + (size_t)first * C, model_param(m, WTE), n, C, c->vocab,
                              acc || k < g->chunks - 1);
    }
    BB_TRY(bb_backend_memset(m->be, g->dres, 0, (size_t)BT * C * sizeof(float)));
    bb_op_layernorm_backward(m->be, g->dres, model_grad(m, lnf), model_grad(m, lnf + 1), g->dln, final_output(g, c),
                             model_param(m, lnf), g->lnf_mean, g->lnf_rstd, BT, C, acc);
    model_grads_ready(m, lnf);
    for (int s = g->S - 1; s >= 0; s--) {
        if (g->computed_segment != s) BB_TRY(segment_forward(m, s)); /* recompute (checkpointing) */
        int end = segment_end(g, c, s);
        for (int l = end - 1; l >= s * g->K; l--) {
            if (g->bf16) {
                if (l + 1 < end) load_block(m, l); /* the segment's last block is still in the work buffers */
                load_input(m, l);
            }
            block_backward(m, l, &g->slots[l % g->K], block_input(g, l), acc);
            model_grads_ready(m, BLOCK_TENSOR(l, 0));
        }
    }
    /* The token embedding's gradient already holds the LM head's part. */
    bb_op_embedding_backward(m->be, model_grad(m, WTE), model_grad(m, WPE), g->dres, (const int32_t *)m->inputs, B, T, C, c->vocab, T,
                             true, acc);
    model_grads_ready(m, WTE);
    g->computed_segment = -1;
    return BB_OK;
}

/* The logits at `position` of every example, one row at a time through
 * the chunk buffer (after a forward without loss). */
static bb_status gpt_logits(bb_model_t *m, int position, float *host)
{
    gpt_state *g = m->impl;
    const bb_model_config *c = &m->cfg;
    for (int b = 0; b < m->B; b++) {
        bb_op_linear_forward(m->be, g->logits, g->lnf + ((size_t)b * c->seq_len + position) * c->d_model,
                             model_param(m, WTE), NULL, 1, c->d_model, c->vocab);
        BB_TRY(bb_backend_copy(m->be, host + (size_t)b * c->vocab, g->logits, (size_t)c->vocab * sizeof(float),
                               BB_COPY_D2H));
    }
    return BB_OK;
}

/* ---- the kind: configuration, JSON, batches ------------------------------ */
bb_model_config bb_model_gpt_config(int layers, int heads, int d_model, int seq_len, int vocab)
{
    return (bb_model_config){.kind = &bb_model_kind_gpt, .layers = layers, .heads = heads, .d_model = d_model,
                             .seq_len = seq_len, .vocab = vocab};
}

static bb_status gpt_from_flags(const bb_model_flags *f, bb_model_config *out)
{
    if (f->hidden_count) return bb_fail(BB_ERR_ARG, "--hidden sizes an mlp's layers; this is a gpt (--model mlp?)");
    *out = bb_model_gpt_config((int)f->layers, (int)f->heads, (int)f->d_model, 0, 0);
    return BB_OK;
}

static bb_status gpt_from_data(bb_model_config *c, const bb_shard_meta *meta, const char *path)
{
    if (meta->kind != BB_RECORD_TOKENS_U16 && meta->kind != BB_RECORD_TOKENS_U32)
        return bb_fail(BB_ERR_ARG, "%s holds %s records; --model gpt needs token records", path,
                       bb_record_kind_name(meta->kind));
    c->seq_len = (int)meta->shape[0] - 1;
    c->vocab = (int)meta->classes_or_vocab;
    return BB_OK;
}

static void gpt_describe(const bb_model_config *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "gpt (%d layer%s, %d head%s, d %d, T %d, vocab %d)", c->layers, c->layers > 1 ? "s" : "",
             c->heads, c->heads > 1 ? "s" : "", c->d_model, c->seq_len, c->vocab);
}

static bool gpt_same_shape(const bb_model_config *a, const bb_model_config *b)
{
    return a->layers == b->layers && a->heads == b->heads && a->d_model == b->d_model && a->seq_len == b->seq_len &&
           a->vocab == b->vocab;
}

static int gpt_layers(const bb_model_config *c) { return c->layers; }
static int gpt_tokens(const bb_model_config *c) { return c->seq_len; }
static int gpt_outputs(const bb_model_config *c) { return c->vocab; }

static int gpt_to_json(json_t *obj, const bb_model_config *c)
{
    return json_object_update_new(obj, json_pack("{s:i, s:i, s:i, s:i, s:i}", "layers", c->layers, "heads", c->heads,
                                             "d_model", c->d_model, "seq_len", c->seq_len, "vocab", c->vocab));
}

static bb_status gpt_from_json(const json_t *obj, const char *file, bb_model_config *c)
{
    BB_TRY(bb_json_req_int(obj, file, "layers", &c->layers));
    BB_TRY(bb_json_req_int(obj, file, "heads", &c->heads));
    BB_TRY(bb_json_req_int(obj, file, "d_model", &c->d_model));
    BB_TRY(bb_json_req_int(obj, file, "seq_len", &c->seq_len));
    return bb_json_req_int(obj, file, "vocab", &c->vocab);
}

/* the widest records it takes: T + 1 u32 tokens */
static size_t gpt_record_bytes(const bb_model_config *c) { return ((size_t)c->seq_len + 1) * 4; }

static bb_status gpt_check_records(const bb_model_config *c, const bb_shard_meta *meta, const uint8_t *records,
                                   int count, int *width)
{
    int T = c->seq_len;
    *width = meta->kind == BB_RECORD_TOKENS_U16 ? 2 : meta->kind == BB_RECORD_TOKENS_U32 ? 4 : 0;
    if (!*width || meta->shape[0] != (uint32_t)T + 1) {
        char shape[64] = "";
        for (uint32_t i = 0; i < meta->rank && i < 4; i++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%u", i ? "x" : "", meta->shape[i]);
        return bb_fail(BB_ERR_ARG, "this gpt (T %d) takes token records of %d tokens, not %s records of %s", T, T + 1,
                       bb_record_kind_name(meta->kind), shape);
    }
    size_t tokens = (size_t)count * (T + 1);
    uint32_t top = 0;
    if (*width == 2)
        for (size_t i = 0; i < tokens; i++) {
            uint32_t v = (uint32_t)(records[2 * i] | records[2 * i + 1] << 8);
            top = v > top ? v : top;
        }
    else
        for (size_t i = 0; i < tokens; i++) {
            const uint8_t *p = records + 4 * i;
            uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            top = v > top ? v : top;
        }
    if (top >= (uint32_t)c->vocab) return bb_fail(BB_ERR_ARG, "token %u is not below the vocabulary %d", top, c->vocab);
    return BB_OK;
}

static bb_status gpt_check_inputs(const bb_model_config *c, const void *inputs, size_t n)
{
    const int32_t *tokens = inputs;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab)
            return bb_fail(BB_ERR_ARG, "token %d at position %zu is not below the vocabulary %d", tokens[i], i,
                           c->vocab);
    return BB_OK;
}

static void gpt_convert(bb_model_t *m, void *inputs, int32_t *targets, const uint8_t *records, int count, int width)
{
    bb_op_records_to_tokens(m->be, inputs, targets, records, count, m->B, m->cfg.seq_len, width);
}

const bb_model_kind bb_model_kind_gpt = {
    .name = "gpt",
    .takes = "tokens",
    .from_flags = gpt_from_flags,
    .from_data = gpt_from_data,
    .describe = gpt_describe,
    .same_shape = gpt_same_shape,
    .layers = gpt_layers,
    .targets_per_example = gpt_tokens,
    .outputs = gpt_outputs,
    .targets_are_tokens = true,
    .chunks_loss = true,
    .tied_head = "lm_head.weight",
    .to_json = gpt_to_json,
    .from_json = gpt_from_json,
    .inputs_per_example = gpt_tokens,
    .input_size = sizeof(int32_t),
    .input_name = "tokens",
    .record_bytes = gpt_record_bytes,
    .check_records = gpt_check_records,
    .check_inputs = gpt_check_inputs,
    .convert = gpt_convert,
    .create = gpt_create,
    .init = gpt_init,
    .forward = gpt_forward,
    .logits = gpt_logits,
    .backward = gpt_backward,
    .destroy = gpt_destroy,
};
