/* gpt.c — the decoder-only transformer (GPT-2 shape: pre-LayerNorm blocks,
 * causal attention, GELU MLP of 4x, tied token embedding and LM head):
 * forward, backward, and what each block keeps for its backward.
 *
 * Blocks form segments (gpt_layout.c). A kept segment is one block that
 * keeps, in storage of its own, what its backward reads: everything
 * ('n'), or all but its LayerNorm and GELU outputs ('s', selective), which
 * its backward recomputes from what is kept. A recomputed segment ('f',
 * full; every:K's segments of K blocks) keeps only its input; its blocks
 * run in the shared recompute slots, and the backward re-runs the segment
 * there before its backward unless the slots still hold it.
 *
 * bf16 activations (--precision bf16): the blocks share one set of fp32
 * work buffers (each keeps its own LayerNorm and attention statistics),
 * and each block's kept tensors are rounded to bf16 as they are computed
 * and packed into its stash; the backward unpacks a block into the work
 * buffers before its backward. A block whose backward comes right after
 * its own forward (the last block, the last block of a recomputed segment)
 * needs no stash. Segment inputs are packed too, and every block's input
 * is unpacked into one fp32 buffer `x`. Recomputed tensors are rounded as
 * they were the first time, so every policy gives the same gradients.
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

#include "gpt_internal.h"

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

/* bf16: rounds block l's just-computed tensor k (in a) and packs it into
 * its stash, if it has one. fp32: nothing. */
static void keep(bb_model_t *m, int l, block_acts *a, int k)
{
    gpt_state *g = m->impl;
    if (g->bf16) bb_op_bf16_round(m->be, *gpt_kept_tensor(a, k), g->stash[l * KEPT + k], bb_gpt_kept_count(m, k));
}

/* bf16: unpacks block l's input (its segment's saved input or block l-1's
 * output) into x. */
static void load_input(bb_model_t *m, int l)
{
    gpt_state *g = m->impl;
    const segment *s = &g->segs[g->seg_of[l]];
    const uint16_t *in = l == s->first && g->seg_packed[g->seg_of[l]] ? g->seg_packed[g->seg_of[l]]
                                                                      : g->stash[(l - 1) * KEPT + KEPT_RES3];
    bb_op_bf16_unpack(m->be, g->x, in, bb_gpt_kept_count(m, KEPT_RES3));
}

/* bf16: unpacks block l's stashed tensors (all it keeps but its output)
 * into the work buffers. */
static void load_block(bb_model_t *m, int l)
{
    gpt_state *g = m->impl;
    for (int k = 0; k < KEPT_RES3; k++)
        if (g->stash[l * KEPT + k])
            bb_op_bf16_unpack(m->be, *gpt_kept_tensor(g->act[l], k), g->stash[l * KEPT + k], bb_gpt_kept_count(m, k));
}

#define W(k) model_param(m, BLOCK_TENSOR(l, k))
#define D(k) model_grad(m, BLOCK_TENSOR(l, k))

static void ln1_forward(bb_model_t *m, int l, block_acts *a, const float *x)
{
    int BT = m->B * m->cfg.seq_len;
    bb_op_layernorm_forward(m->be, a->ln1, a->ln1_mean, a->ln1_rstd, x, W(LN1_W), W(LN1_B), BT, m->cfg.d_model);
    keep(m, l, a, KEPT_LN1);
}

static void ln2_forward(bb_model_t *m, int l, block_acts *a)
{
    int BT = m->B * m->cfg.seq_len;
    bb_op_layernorm_forward(m->be, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, W(LN2_W), W(LN2_B), BT,
                            m->cfg.d_model);
    keep(m, l, a, KEPT_LN2);
}

static void gelu_forward(bb_model_t *m, int l, block_acts *a)
{
    bb_op_gelu_forward(m->be, a->fch_gelu, a->fch, (size_t)m->B * m->cfg.seq_len * 4 * m->cfg.d_model);
    keep(m, l, a, KEPT_GELU);
}

static void block_forward(bb_model_t *m, int l, block_acts *a, const float *x)
{
    const bb_model_config *c = &m->cfg;
    bb_backend_t *be = m->be;
    int B = m->B, T = c->seq_len, C = c->d_model, BT = B * T;
    size_t n = (size_t)BT * C;
    ln1_forward(m, l, a, x);
    bb_op_linear_forward(be, a->qkv, a->ln1, W(ATTN_W), W(ATTN_B), BT, C, 3 * C);
    keep(m, l, a, KEPT_QKV);
    bb_op_attention_forward(be, a->atty, a->lse, a->qkv, B, T, C, c->heads);
    keep(m, l, a, KEPT_ATTY);
    bb_op_linear_forward(be, a->res2, a->atty, W(PROJ_W), W(PROJ_B), BT, C, C);
    bb_op_add(be, a->res2, a->res2, x, n);
    keep(m, l, a, KEPT_RES2);
    ln2_forward(m, l, a);
    bb_op_linear_forward(be, a->fch, a->ln2, W(FC_W), W(FC_B), BT, C, 4 * C);
    keep(m, l, a, KEPT_FCH);
    gelu_forward(m, l, a);
    bb_op_linear_forward(be, a->res3, a->fch_gelu, W(FCPROJ_W), W(FCPROJ_B), BT, 4 * C, C);
    bb_op_add(be, a->res3, a->res3, a->res2, n);
    keep(m, l, a, KEPT_RES3);
}

/* The input of block l: its segment's saved input, or block l-1's output
 * (bf16: x, once load_input has filled it). */
static const float *block_input(const gpt_state *g, int l)
{
    if (g->bf16) return g->x;
    int s = g->seg_of[l];
    return l == g->segs[s].first && g->seg_in[s] ? g->seg_in[s] : g->act[l - 1]->res3;
}

/* Runs segment s's blocks; saves its output where the next segment's
 * input is kept (fp32: a copy after a recomputed segment; bf16: packed by
 * keep()). */
static bb_status segment_forward(bb_model_t *m, int s)
{
    gpt_state *g = m->impl;
    const segment *seg = &g->segs[s];
    for (int l = seg->first; l < seg->end; l++) {
        if (g->bf16) load_input(m, l);
        block_forward(m, l, g->act[l], block_input(g, l));
        g->last_block = l;
    }
    /* the recompute slots hold this segment now, or (bf16) no longer any */
    if (seg->recompute) g->computed_segment = s;
    else if (g->bf16) g->computed_segment = -1;
    if (!g->bf16 && s + 1 < g->S && g->seg_in[s + 1])
        BB_TRY(bb_backend_copy(m->be, g->seg_in[s + 1], g->act[seg->end - 1]->res3,
                               (size_t)m->B * m->cfg.seq_len * m->cfg.d_model * sizeof(float), BB_COPY_D2D));
    return BB_OK;
}

static const float *final_output(const gpt_state *g) { return g->act[g->L - 1]->res3; }

bb_status bb_gpt_forward(bb_model_t *m, float normalizer, double *loss, int *correct)
{
    (void)correct;
    gpt_state *g = m->impl;
    const bb_model_config *c = &m->cfg;
    int B = m->B, T = c->seq_len, C = c->d_model, BT = B * T;
    float *embedded = g->bf16 ? g->x : g->seg_in[0];
    bb_op_embedding_forward(m->be, embedded, (const int32_t *)m->inputs, model_param(m, WTE), model_param(m, WPE), B, T, C);
    if (g->bf16) bb_op_bf16_round(m->be, embedded, g->seg_packed[0], (size_t)BT * C);
    g->forward_done = false;
    for (int s = 0; s < g->S; s++) BB_TRY(segment_forward(m, s));
    int lnf = FIRST_BLOCK + c->layers * PER_BLOCK;
    bb_op_layernorm_forward(m->be, g->lnf, g->lnf_mean, g->lnf_rstd, final_output(g), model_param(m, lnf),
                            model_param(m, lnf + 1), BT, C);
    if (!loss) return BB_OK; /* the head runs in gpt_logits: no backward */
    g->normalizer = normalizer;
    for (int k = 0; k < g->chunks; k++) head_chunk(m, k);
    *loss = bb_op_sum_rows(m->be, g->row_loss, (size_t)BT) / normalizer; /* the forward's one wait */
    g->forward_done = true;
    return BB_OK;
}

/* ---- backward ---------------------------------------------------------- */
/* dres holds d(loss)/d(block output) on entry, d(loss)/d(block input) on
 * exit. The block's slot is spent as it goes: d(fch) overwrites fch_gelu
 * once its product's weight gradient is formed, then fch once GELU's
 * backward has read it, and d(qkv) takes fch's place. A selective block
 * recomputes its GELU and LayerNorm outputs right before they are read
 * (fp32: both LayerNorms share one buffer), unless its forward was the
 * last one to run and left them in place. */
static void block_backward(bb_model_t *m, int l, block_acts *a, const float *x, bool acc)
{
    const bb_model_config *c = &m->cfg;
    gpt_state *g = m->impl;
    bb_backend_t *be = m->be;
    int B = m->B, T = c->seq_len, C = c->d_model, BT = B * T;
    float *dfch = a->fch, *dqkv = a->fch; /* (BT,4C) and (BT,3C) */
    bool selective = g->keep[l] == BB_KEEP_SELECTIVE, fresh = g->last_block == l;
    m->selective_recomputes += selective && !fresh;
    if (selective && !fresh) gelu_forward(m, l, a);
    bb_op_linear_backward(be, a->fch_gelu, D(FCPROJ_W), D(FCPROJ_B), g->dres, a->fch_gelu, W(FCPROJ_W), BT, 4 * C,
                          C, acc);
    bb_op_gelu_backward(be, dfch, a->fch_gelu, a->fch, (size_t)BT * 4 * C);
    if (selective && !fresh) ln2_forward(m, l, a);
    bb_op_linear_backward(be, g->dln, D(FC_W), D(FC_B), dfch, a->ln2, W(FC_W), BT, C, 4 * C, acc);
    bb_op_layernorm_backward(be, g->dres, D(LN2_W), D(LN2_B), g->dln, a->res2, W(LN2_W), a->ln2_mean, a->ln2_rstd,
                             BT, C, acc);
    bb_op_linear_backward(be, g->dln, D(PROJ_W), D(PROJ_B), g->dres, a->atty, W(PROJ_W), BT, C, C, acc);
    bb_op_attention_backward(be, dqkv, g->dln, a->qkv, a->atty, a->lse, B, T, C, c->heads);
    if (selective && (!fresh || a->ln1 == a->ln2)) ln1_forward(m, l, a, x);
    bb_op_linear_backward(be, g->dln, D(ATTN_W), D(ATTN_B), dqkv, a->ln1, W(ATTN_W), BT, C, 3 * C, acc);
    bb_op_layernorm_backward(be, g->dres, D(LN1_W), D(LN1_B), g->dln, x, W(LN1_W), a->ln1_mean, a->ln1_rstd, BT, C,
                             acc);
}
#undef W
#undef D

bb_status bb_gpt_backward(bb_model_t *m, bool acc)
{
    gpt_state *g = m->impl;
    const bb_model_config *c = &m->cfg;
    int B = m->B, T = c->seq_len, C = c->d_model, BT = B * T;
    if (!g->forward_done) return bb_fail(BB_ERR_INTERNAL, "gpt backward without a forward");
    g->forward_done = false;
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
    bb_op_layernorm_backward(m->be, g->dres, model_grad(m, lnf), model_grad(m, lnf + 1), g->dln, final_output(g),
                             model_param(m, lnf), g->lnf_mean, g->lnf_rstd, BT, C, acc);
    model_grads_ready(m, lnf);
    for (int s = g->S - 1; s >= 0; s--) {
        const segment *seg = &g->segs[s];
        if (seg->recompute && g->computed_segment != s) { /* full: re-run it */
            BB_TRY(segment_forward(m, s));
            m->recomputed_layers += seg->end - seg->first;
        }
        for (int l = seg->end - 1; l >= seg->first; l--) {
            if (g->bf16) {
                if (g->last_block != l) load_block(m, l); /* else its forward just left it in the work buffers */
                load_input(m, l);
                if (!seg->recompute) g->computed_segment = -1; /* the work buffers hold this block now */
            }
            block_backward(m, l, g->act[l], block_input(g, l), acc);
            g->last_block = -1; /* its buffers are spent */
            model_grads_ready(m, BLOCK_TENSOR(l, 0));
        }
        if (seg->recompute) g->computed_segment = -1;
    }
    /* The token embedding's gradient already holds the LM head's part. */
    bb_op_embedding_backward(m->be, model_grad(m, WTE), model_grad(m, WPE), g->dres, (const int32_t *)m->inputs, B, T, C, c->vocab, T,
                             true, acc);
    model_grads_ready(m, WTE);
    return BB_OK;
}

/* The logits at `position` of every example, one row at a time through
 * the chunk buffer (after a forward without loss). */
bb_status bb_gpt_logits(bb_model_t *m, int position, float *host)
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
