/* decoder.c — the decoder stack's passes and the decoder family (decoder.h):
 * embedding, blocks in segments, final norm, and the fused LM head + loss;
 * what a decoder takes from the data and its batches.
 *
 * Blocks form segments (decoder_layout.c). A saving segment is one block
 * that keeps, in storage of its own, what its backward reads: everything
 * ('n'), or all but what its layout drops ('s', selective), which its
 * backward recomputes from what is saved. A recomputed segment ('f', full;
 * every:K's segments of K blocks) saves only its input; its blocks run in
 * the shared recompute slots, and the backward re-runs the segment there
 * before its backward unless the slots still hold it.
 *
 * bf16 (--precision bf16): every activation and activation gradient is a
 * bf16 tensor (decoder_layout.c allocates them in the activation dtype),
 * the products take the model's bf16 copy of the weights, and the logits
 * are bf16 too: the fused loss reads them (its statistics in fp32 and
 * double) and writes their gradient over them, the head's backward
 * operand (llm.c's fused classifier). Statistics, the loss, weight gradients and
 * master weights stay fp32 (ARCHITECTURE.md's table). Recomputed tensors
 * are the same bits as the first time, so every policy gives the same
 * gradients.
 *
 * The LM head and the loss run fused, in chunks of `chunk` tokens
 * (bb_model_loss_chunk): per chunk the logits, in place their gradient,
 * and each token's loss at its place in row_loss, which the forward sums
 * once (its one wait for the device); at most one chunk's logits exist,
 * in rows padded to bb_model_logits_stride (aligned for the products; the
 * padding never computed). The backward walks the chunks in reverse: the last one is still in the
 * buffer, the others are recomputed from the final norm's output (one more
 * head product for all chunks but the last), and each adds its part to
 * the input's and the head's (tied: the token table's) gradients. */
#include <stdlib.h>
#include <string.h>

#include "decoder_state.h"

#define F(p) bb_f32(p)

int bb_decoder_final_tensor(const bb_model_t *m)
{
    const decoder_state *g = m->impl;
    return g->block_tensor[g->L];
}

/* ---- forward ----------------------------------------------------------- */
/* Chunk k of the head's tokens: the first, and how many (the last chunk
 * may be short). */
static int chunk_tokens(const bb_model_t *m, int k, int *first)
{
    const decoder_state *g = m->impl;
    int BT = m->B * g->d.seq_len;
    *first = k * g->chunk;
    return BT - *first < g->chunk ? BT - *first : g->chunk;
}

/* Chunk k of the head: its logits from the final norm's output, then in
 * place d(loss)/d(logits), and its tokens' losses at their place in
 * row_loss. Nothing waits for the device. */
static void head_chunk(bb_model_t *m, int k)
{
    decoder_state *g = m->impl;
    int C = g->d.d_model, V = g->d.vocab, ld = bb_model_logits_stride(V), first, n = chunk_tokens(m, k, &first);
    bb_op_linear_forward(m->be, g->logits, bb_tensor_at(g->normed, (size_t)first * C), model_weight(m, g->head),
                         bb_no_tensor(), n, C, V, ld);
    bb_op_crossentropy_rows(m->be, g->row_loss + first, g->logits, g->logits, m->targets + first, n, V, ld,
                            g->normalizer);
}

/* The input of block l: its segment's saved input, or block l-1's output. */
static bb_tensor block_input(const decoder_state *g, int l)
{
    int s = g->seg_of[l];
    return l == g->segs[s].first && g->seg_in[s].data ? g->seg_in[s] : g->act[l - 1]->t[g->lay.saved - 1];
}

static bb_block_pass pass_of(bb_model_t *m, int l)
{
    decoder_state *g = m->impl;
    int T = g->d.seq_len;
    return (bb_block_pass){.m = m, .be = m->be, .l = l, .B = m->B, .T = T, .BT = m->B * T,
                           .tensor = g->block_tensor[l], .a = g->act[l], .x = block_input(g, l), .dres = g->dres,
                           .dln = g->dln, .positions = g->positions};
}

/* ---- offloaded blocks ('o') ----------------------------------------------
 * Block l's slot j: its forward first waits for the copy of the slot's
 * previous block to the host, then its saved tensors go to the host on the
 * copy stream. Its backward needs them back in the slot: fetched there on
 * the copy stream one offloaded block ahead (while the blocks above run
 * their backward; the slot's previous block is done), and the compute
 * stream waits for them. On the CPU every copy is done when it returns. */
static bb_status offload_copy(bb_model_t *m, int l, bool to_host)
{
    decoder_state *g = m->impl;
    int j = g->oslot[l];
    BB_TRY(bb_backend_event_record(m->be, g->oev_compute[j], BB_STREAM_COMPUTE)); /* what came before is done */
    BB_TRY(bb_backend_stream_wait(m->be, BB_STREAM_COPY, g->oev_compute[j]));
    BB_TRY(bb_decoder_offload_copy(m, l, to_host));
    BB_TRY(bb_backend_event_record(m->be, to_host ? g->oev_out[j] : g->oev_in[j], BB_STREAM_COPY));
    g->otenant[j] = l, g->ofetched[j] = !to_host;
    return BB_OK;
}

/* Before block l's backward: its tensors in its slot, and the next
 * offloaded block below it on its way into the other slot. */
static bb_status offload_fetch(bb_model_t *m, int l)
{
    decoder_state *g = m->impl;
    int j = g->oslot[l], below = l - 1;
    if (j >= 0) {
        if (g->otenant[j] != l) BB_TRY(offload_copy(m, l, false));
        if (g->ofetched[j]) BB_TRY(bb_backend_stream_wait(m->be, BB_STREAM_COMPUTE, g->oev_in[j]));
        g->ofetched[j] = false;
    }
    while (below >= 0 && g->oslot[below] < 0) below--;
    if (below >= 0 && g->oslot[below] != j && g->otenant[g->oslot[below]] != below)
        BB_TRY(offload_copy(m, below, false));
    return BB_OK;
}

/* Runs segment s's blocks; saves its output where the next segment's
 * input is kept (a copy after a recomputed or an offloaded block). */
static bb_status segment_forward(bb_model_t *m, int s)
{
    decoder_state *g = m->impl;
    const segment *seg = &g->segs[s];
    for (int l = seg->first; l < seg->end; l++) {
        int j = g->oslot[l];
        if (j >= 0 && g->otenant[j] >= 0) /* the slot's previous block is on the host */
            BB_TRY(bb_backend_stream_wait(m->be, BB_STREAM_COMPUTE, g->oev_out[j]));
        bb_block_pass p = pass_of(m, l);
        g->k->block->forward(&p);
        g->last_block = l;
    }
    if (seg->recompute) g->computed_segment = s; /* the recompute slots hold this segment now */
    if (s + 1 < g->S && g->seg_in[s + 1].data)
        BB_TRY(bb_backend_copy(m->be, g->seg_in[s + 1].data, g->act[seg->end - 1]->t[g->lay.saved - 1].data,
                               bb_decoder_saved_count(m, g->lay.saved - 1) * bb_dtype_size(g->dtype), BB_COPY_D2D));
    if (g->oslot[seg->first] >= 0) BB_TRY(offload_copy(m, seg->first, true)); /* an offloaded block: one a segment */
    return BB_OK;
}

static bb_tensor final_output(const decoder_state *g) { return g->act[g->L - 1]->t[g->lay.saved - 1]; }

static bb_status decoder_forward(bb_model_t *m, float normalizer, double *loss, int *correct)
{
    (void)correct;
    decoder_state *g = m->impl;
    int B = m->B, T = g->d.seq_len, BT = B * T;
    g->k->embed(m, g->seg_in[0], (const int32_t *)m->inputs, B, T, 0);
    g->forward_done = false;
    for (int s = 0; s < g->S; s++) BB_TRY(segment_forward(m, s));
    g->k->norm_forward(m, g->normed, g->norm_stat, final_output(g), BT);
    if (!loss) return BB_OK; /* the head runs in decoder_logits: no backward */
    g->normalizer = normalizer;
    for (int k = 0; k < g->chunks; k++) head_chunk(m, k);
    *loss = bb_op_sum_rows(m->be, g->row_loss, (size_t)BT) / normalizer; /* the forward's one wait */
    g->forward_done = true;
    return BB_OK;
}

/* ---- backward ---------------------------------------------------------- */
static bb_status decoder_backward(bb_model_t *m, bool acc)
{
    decoder_state *g = m->impl;
    int C = g->d.d_model, V = g->d.vocab, BT = m->B * g->d.seq_len;
    if (!g->forward_done) return bb_fail(BB_ERR_INTERNAL, "%s backward without a forward", m->cfg.kind->name);
    g->forward_done = false;
    /* The head, chunk by chunk from the last (whose gradient the forward
     * left in the buffer): d(final norm) rows, and the head's gradient. */
    for (int k = g->chunks - 1; k >= 0; k--) {
        if (k < g->chunks - 1) head_chunk(m, k);
        int first, n = chunk_tokens(m, k, &first);
        bb_op_linear_backward(m->be, bb_tensor_at(g->dln, (size_t)first * C), F(model_grad(m, g->head)),
                              bb_no_tensor(), g->logits, bb_tensor_at(g->normed, (size_t)first * C),
                              model_weight(m, g->head), n, C, V, bb_model_logits_stride(V), acc || k < g->chunks - 1);
    }
    if (g->head != 0) model_grads_ready(m, g->head); /* a head of its own is the last tensor */
    BB_TRY(offload_fetch(m, g->L - 1)); /* the final norm reads the last block's output */
    BB_TRY(g->k->norm_backward(m, g->dres, g->dln, final_output(g), g->norm_stat, BT, acc));
    model_grads_ready(m, g->block_tensor[g->L]);
    for (int s = g->S - 1; s >= 0; s--) {
        const segment *seg = &g->segs[s];
        if (seg->recompute && g->computed_segment != s) { /* full: re-run it */
            BB_TRY(segment_forward(m, s));
            m->recomputed_layers += seg->end - seg->first;
        }
        for (int l = seg->end - 1; l >= seg->first; l--) {
            BB_TRY(offload_fetch(m, l));
            bb_block_pass p = pass_of(m, l);
            p.selective = g->policy[l] == BB_RECOMPUTE_SELECTIVE;
            p.fresh = g->last_block == l;
            p.accumulate = acc;
            m->selective_recomputes += p.selective && !p.fresh;
            g->k->block->backward(&p);
            g->last_block = -1; /* its buffers are spent */
            model_grads_ready(m, g->block_tensor[l]);
        }
        if (seg->recompute) g->computed_segment = -1;
    }
    g->k->embed_backward(m, g->dres, (const int32_t *)m->inputs, acc, g->head == 0);
    model_grads_ready(m, 0);
    return BB_OK;
}

/* The logits at `position` of every example, one row at a time through
 * the chunk buffer (after a forward without loss). */
static bb_status decoder_logits(bb_model_t *m, int position, float *host)
{
    decoder_state *g = m->impl;
    int C = g->d.d_model, V = g->d.vocab, T = g->d.seq_len;
    bool bf16 = g->logits.dtype == BB_DTYPE_BF16;
    uint16_t *row = bf16 ? malloc((size_t)V * sizeof *row) : NULL;
    if (bf16 && !row) return bb_fail(BB_ERR_NOMEM, "out of memory for a row of %d logits", V);
    bb_status rc = BB_OK;
    for (int b = 0; rc == BB_OK && b < m->B; b++) {
        float *out = host + (size_t)b * V;
        bb_op_linear_forward(m->be, g->logits, bb_tensor_at(g->normed, ((size_t)b * T + position) * C),
                             model_weight(m, g->head), bb_no_tensor(), 1, C, V, V);
        rc = bb_backend_copy(m->be, bf16 ? (void *)row : out, g->logits.data, (size_t)V * (bf16 ? 2 : 4), BB_COPY_D2H);
        for (int v = 0; rc == BB_OK && bf16 && v < V; v++) out[v] = bb_bf16_to_float(row[v]);
    }
    free(row);
    return rc;
}

static bb_status decoder_init(bb_model_t *m, uint64_t seed, float *host)
{
    return m->cfg.kind->decoder->init(m, seed, host);
}

/* ---- the family: counts, batches ---------------------------------------- */
static bb_decoder_dims dims_of(const bb_model_config *c)
{
    bb_decoder_dims d;
    c->kind->decoder->dims(c, &d);
    return d;
}

static int decoder_layers(const bb_model_config *c) { return dims_of(c).layers; }
static int decoder_layer_tensor(const bb_model_t *m, int l) { return ((const decoder_state *)m->impl)->block_tensor[l]; }
static int decoder_tokens(const bb_model_config *c) { return dims_of(c).seq_len; }
static int decoder_outputs(const bb_model_config *c) { return dims_of(c).vocab; }
/* the widest records it takes: T + 1 u32 tokens */
static size_t decoder_record_bytes(const bb_model_config *c) { return ((size_t)dims_of(c).seq_len + 1) * 4; }

bb_status bb_decoder_token_shape(const bb_record_format *f, const char *path, const char *kind, int *seq_len,
                                 int *vocab)
{
    if (!bb_record_token_bytes(f->kind))
        return bb_fail(BB_ERR_ARG, "%s holds %s records; --model %s needs token records", path,
                       bb_record_kind_name(f->kind), kind);
    *seq_len = (int)f->shape[0] - 1;
    *vocab = (int)f->classes_or_vocab;
    return BB_OK;
}

static bb_status decoder_check_records(const bb_model_config *c, const bb_record_format *f, const uint8_t *records,
                                       int count, int *width)
{
    bb_decoder_dims d = dims_of(c);
    int T = d.seq_len;
    *width = bb_record_token_bytes(f->kind);
    if (!*width || f->shape[0] != (uint32_t)T + 1) {
        char shape[64];
        return bb_fail(BB_ERR_ARG, "this %s (T %d) takes token records of %d tokens, not %s records of %s",
                       c->kind->name, T, T + 1, bb_record_kind_name(f->kind), bb_record_shape(f, shape, sizeof shape));
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
    if (top >= (uint32_t)d.vocab) return bb_fail(BB_ERR_ARG, "token %u is not below the vocabulary %d", top, d.vocab);
    return BB_OK;
}

static bb_status decoder_check_inputs(const bb_model_config *c, const void *inputs, size_t n)
{
    const int32_t *tokens = inputs;
    int vocab = dims_of(c).vocab;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return bb_fail(BB_ERR_ARG, "token %d at position %zu is not below the vocabulary %d", tokens[i], i,
                           vocab);
    return BB_OK;
}

static void decoder_convert(bb_model_t *m, void *inputs, int32_t *targets, const uint8_t *records, int count,
                            int width)
{
    bb_op_records_to_tokens(m->be, inputs, targets, records, count, m->B, dims_of(&m->cfg).seq_len, width);
}

const bb_model_family bb_decoder_family = {
    .layers = decoder_layers,
    .layer_tensor = decoder_layer_tensor,
    .targets_per_example = decoder_tokens,
    .outputs = decoder_outputs,
    .targets_are_tokens = true,
    .chunks_loss = true,
    .recompute_plans = true,
    .block_costs = bb_decoder_block_costs,
    .inputs_per_example = decoder_tokens,
    .input_size = sizeof(int32_t),
    .input_name = "tokens",
    .record_bytes = decoder_record_bytes,
    .check_records = decoder_check_records,
    .check_inputs = decoder_check_inputs,
    .convert = decoder_convert,
    .create = bb_decoder_create,
    .init = decoder_init,
    .forward = decoder_forward,
    .logits = decoder_logits,
    .decode = bb_decoder_decode,
    .backward = decoder_backward,
    .destroy = bb_decoder_destroy,
};
