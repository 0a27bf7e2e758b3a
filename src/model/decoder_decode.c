/* decoder_decode.c — incremental decoding: one token at a time, each
 * block's rows (the gpt: q, k and v) cached per position, so that position
 * p costs one row of every product and one query's attention over p+1
 * cached rows (bb_op_attention_decode) instead of a forward over the whole
 * context. The cache (layers × T × the block's cache width floats) and the
 * one-row buffers are made at the first call and freed with the model; the
 * ops are the forward's, on one row. A token costs the host one wait for
 * the device: its logits' read-back (the token goes up from pinned memory
 * without waiting, after the previous token's read-back, which its stream
 * orders after the previous upload). From the second token on, a token's
 * work (the upload, every op) is one graph of the backend's
 * (bb_backend_graph_begin: on a GPU one launch for its ≈14 kernels a
 * layer); the first runs as issued, so that the ops' scratch is made. */
#include <stdlib.h>
#include <string.h>

#include "decoder_state.h"

struct decoder_cache {
    float *rows;                          /* (L, T, width): each block's cached rows */
    size_t width;
    float *x, *normed, *scratch, *logits; /* one position's */
    float *stat[BB_BLOCK_MAX_STATS];
    int32_t *token;                       /* (1), on the device */
    int32_t *host_token;                  /* (1), pinned: its upload's source */
    float *host_logits;                   /* (V), pinned: the read-back's target (one wait) */
    int next;                             /* the position the next call continues at */
    bool warm;                            /* a token ran: its ops' scratch is made (graphs from now) */
};

static bb_status cache_alloc(bb_model_t *m, decoder_state *g, struct decoder_cache *d)
{
    const bb_model_config *c = &m->cfg;
    const bb_decoder_block *blk = g->k->block;
    size_t C = (size_t)g->d.d_model;
    d->width = 2 * (size_t)g->d.kv_width; /* keys, then values */
    BB_TRY(bb_backend_alloc(m->be, (size_t)g->L * g->d.seq_len * d->width * sizeof(float), "decode cache",
                            (void **)&d->rows));
    float **rows[] = {&d->x, &d->normed, &d->scratch, &d->logits};
    size_t count[] = {C, C, blk->decode_scratch(c), (size_t)g->d.vocab};
    for (int i = 0; i < 4; i++)
        BB_TRY(bb_backend_alloc(m->be, (count[i] ? count[i] : 1) * sizeof(float), "decode rows", (void **)rows[i]));
    for (int s = 0; s < g->k->norm_stats; s++)
        BB_TRY(bb_backend_alloc(m->be, sizeof(float), "decode rows", (void **)&d->stat[s]));
    BB_TRY(bb_backend_host_alloc(m->be, sizeof(int32_t), (void **)&d->host_token));
    BB_TRY(bb_backend_host_alloc(m->be, (size_t)g->d.vocab * sizeof(float), (void **)&d->host_logits));
    return bb_backend_alloc(m->be, sizeof(int32_t), "decode token", (void **)&d->token);
}

/* g->cache only when all of it was made: a failed call leaves none. */
static bb_status cache_create(bb_model_t *m, decoder_state *g)
{
    if (!(g->cache = calloc(1, sizeof *g->cache))) return bb_fail(BB_ERR_NOMEM, "out of memory");
    bb_status rc = cache_alloc(m, g, g->cache);
    if (rc != BB_OK) bb_decoder_cache_destroy(m);
    return rc;
}

void bb_decoder_cache_destroy(bb_model_t *m)
{
    decoder_state *g = m->impl;
    struct decoder_cache *d = g->cache;
    if (!d) return;
    void *bufs[] = {d->rows, d->x, d->normed, d->scratch, d->logits, d->token};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) bb_backend_free(m->be, bufs[i]);
    for (int s = 0; s < BB_BLOCK_MAX_STATS; s++) bb_backend_free(m->be, d->stat[s]);
    if (d->host_token) bb_backend_host_free(m->be, d->host_token, sizeof(int32_t));
    if (d->host_logits) bb_backend_host_free(m->be, d->host_logits, (size_t)g->d.vocab * sizeof(float));
    free(d);
    g->cache = NULL;
}

/* A token's work on the device, from the upload of *host_token to its logits. */
static bb_status issue_token(bb_model_t *m, decoder_state *g, int pos)
{
    bb_backend_t *be = m->be;
    struct decoder_cache *d = g->cache;
    int C = g->d.d_model, T = g->d.seq_len, V = g->d.vocab;
    BB_TRY(bb_backend_copy_async(be, d->token, d->host_token, sizeof(int32_t), BB_COPY_H2D, BB_STREAM_COMPUTE));
    g->k->embed(m, bb_f32(d->x), d->token, 1, 1, pos);
    for (int l = 0; l < g->L; l++) {
        bb_block_decode bd = {.m = m, .be = be, .l = l, .pos = pos, .tensor = g->block_tensor[l], .x = d->x,
                              .rows = d->rows + (size_t)l * T * d->width, .scratch = d->scratch,
                              .positions = g->positions};
        g->k->block->decode(&bd);
    }
    g->k->norm_forward(m, bb_f32(d->normed), d->stat, bb_f32(d->x), 1);
    bb_op_linear_forward(be, bb_f32(d->logits), bb_f32(d->normed), bb_f32(model_param(m, g->head)), bb_no_tensor(), 1,
                         C, V, V);
    return BB_OK;
}

bb_status bb_decoder_decode(bb_model_t *m, int32_t token, int pos, float *host_logits)
{
    decoder_state *g = m->impl;
    bb_backend_t *be = m->be;
    int V = g->d.vocab;
    if (!g->cache) BB_TRY(cache_create(m, g));
    struct decoder_cache *d = g->cache;
    if (pos != 0 && pos != d->next)
        return bb_fail(BB_ERR_ARG, "decode at position %d: the cache holds positions 0 to %d (start again at 0)", pos,
                       d->next - 1);
    *d->host_token = token; /* the previous upload is done: the previous read-back waited for it */
    if (d->warm && bb_backend_graph_begin(be)) {
        bb_status rc = issue_token(m, g, pos);
        if (!bb_backend_graph_end(be) && rc == BB_OK) rc = issue_token(m, g, pos); /* nothing ran: again */
        BB_TRY(rc);
    } else {
        BB_TRY(issue_token(m, g, pos));
    }
    d->warm = true;
    BB_TRY(bb_backend_copy(be, d->host_logits, d->logits, (size_t)V * sizeof(float), BB_COPY_D2H));
    memcpy(host_logits, d->host_logits, (size_t)V * sizeof(float));
    d->next = pos + 1;
    return BB_OK;
}
