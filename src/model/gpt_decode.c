/* gpt_decode.c — incremental decoding: one token at a time, each block's
 * rows of q, k and v cached per position, so that position p costs one
 * row of every product and one query's attention over p+1 cached rows
 * (bb_op_attention_decode) instead of a forward over the whole context.
 * The cache (layers × T × 3C floats) and the one-row buffers are made at
 * the first call and freed with the model; the ops are the forward's, on
 * one row. */
#include <stdlib.h>

#include "gpt_internal.h"

struct gpt_decode {
    float *cache;                         /* (L, T, 3C): each block's qkv rows */
    float *x, *ln, *att, *res2, *fch, *fch_gelu, *mean, *rstd, *scores, *logits;
    int32_t *token;                       /* (1), on the device */
    int next;                             /* the position the next call continues at */
};

static bb_status decode_create(bb_model_t *m, gpt_decode **out)
{
    const bb_model_config *c = &m->cfg;
    size_t C = (size_t)c->d_model;
    gpt_decode *d = calloc(1, sizeof *d);
    if (!d) return bb_fail(BB_ERR_NOMEM, "out of memory");
    *out = d;
    float **rows[] = {&d->x, &d->ln, &d->att, &d->res2, &d->fch, &d->fch_gelu, &d->mean, &d->rstd, &d->scores,
                      &d->logits};
    size_t count[] = {C, C, C, C, 4 * C, 4 * C, 1, 1, (size_t)c->heads * c->seq_len, (size_t)c->vocab};
    BB_TRY(bb_backend_alloc(m->be, (size_t)c->layers * c->seq_len * 3 * C * sizeof(float), "decode cache",
                            (void **)&d->cache));
    for (int i = 0; i < 10; i++)
        BB_TRY(bb_backend_alloc(m->be, count[i] * sizeof(float), "decode rows", (void **)rows[i]));
    return bb_backend_alloc(m->be, sizeof(int32_t), "decode token", (void **)&d->token);
}

void bb_gpt_decode_destroy(bb_model_t *m, gpt_decode *d)
{
    if (!d) return;
    void *bufs[] = {d->cache, d->x, d->ln, d->att, d->res2, d->fch, d->fch_gelu, d->mean, d->rstd, d->scores,
                    d->logits, d->token};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) bb_backend_free(m->be, bufs[i]);
    free(d);
}

#define W(k) model_param(m, BLOCK_TENSOR(l, k))

bb_status bb_gpt_decode(bb_model_t *m, int32_t token, int pos, float *host_logits)
{
    gpt_state *g = m->impl;
    const bb_model_config *c = &m->cfg;
    bb_backend_t *be = m->be;
    int C = c->d_model, T = c->seq_len;
    if (!g->decode) BB_TRY(decode_create(m, &g->decode));
    gpt_decode *d = g->decode;
    if (pos != 0 && pos != d->next)
        return bb_fail(BB_ERR_ARG, "decode at position %d: the cache holds positions 0 to %d (start again at 0)", pos,
                       d->next - 1);
    BB_TRY(bb_backend_copy(be, d->token, &token, sizeof token, BB_COPY_H2D));
    bb_op_embedding_forward(be, d->x, d->token, model_param(m, WTE), model_param(m, WPE) + (size_t)pos * C, 1, 1, C);
    for (int l = 0; l < c->layers; l++) {
        float *rows = d->cache + (size_t)l * T * 3 * C; /* this block's rows 0..pos */
        bb_op_layernorm_forward(be, d->ln, d->mean, d->rstd, d->x, W(LN1_W), W(LN1_B), 1, C);
        bb_op_linear_forward(be, rows + (size_t)pos * 3 * C, d->ln, W(ATTN_W), W(ATTN_B), 1, C, 3 * C);
        bb_op_attention_decode(be, d->att, d->scores, rows, pos + 1, C, c->heads);
        bb_op_linear_forward(be, d->res2, d->att, W(PROJ_W), W(PROJ_B), 1, C, C);
        bb_op_add(be, d->res2, d->res2, d->x, (size_t)C);
        bb_op_layernorm_forward(be, d->ln, d->mean, d->rstd, d->res2, W(LN2_W), W(LN2_B), 1, C);
        bb_op_linear_forward(be, d->fch, d->ln, W(FC_W), W(FC_B), 1, C, 4 * C);
        bb_op_gelu_forward(be, d->fch_gelu, d->fch, (size_t)4 * C);
        bb_op_linear_forward(be, d->x, d->fch_gelu, W(FCPROJ_W), W(FCPROJ_B), 1, 4 * C, C);
        bb_op_add(be, d->x, d->x, d->res2, (size_t)C);
    }
    int lnf = FIRST_BLOCK + c->layers * PER_BLOCK;
    bb_op_layernorm_forward(be, d->ln, d->mean, d->rstd, d->x, model_param(m, lnf), model_param(m, lnf + 1), 1, C);
    bb_op_linear_forward(be, d->logits, d->ln, model_param(m, WTE), NULL, 1, C, c->vocab);
    BB_TRY(bb_backend_copy(be, host_logits, d->logits, (size_t)c->vocab * sizeof(float), BB_COPY_D2H));
    d->next = pos + 1;
    return BB_OK;
}
#undef W
