/* batch.c — the model's batches: two sets of device buffers, each with a
 * host staging area (pinned on CUDA) and two events, so that the upload of
 * the next micro-batch (copy stream) overlaps the compute of this one.
 *
 * A set goes: staged (records converted into its staging area, copy queued
 * after the compute stream released the set) → used (the compute stream
 * waits for the copy; the set becomes current) → released (when the next
 * set is used, an event on the compute stream marks the end of its reads).
 * On the CPU events are no-ops and copies happen at once. */
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

struct batch_set {
    float *features;          /* device: mlp (B, inputs) */
    int32_t *tokens, *targets; /* device: gpt (B, T); targets (B) or (B, T) */
    uint8_t *staging;         /* host: inputs, then targets */
    size_t input_bytes, target_bytes;
    int targets_valid;
    bb_event_t *copied;       /* its upload finished (copy stream) */
    bb_event_t *released;     /* the compute stream stopped reading it */
};

int bb_model_batch_rows(const bb_model_t *m) { return m->cfg.kind == BB_MODEL_GPT ? m->B * m->cfg.seq_len : m->B; }

static void point_at(bb_model_t *m, int set)
{
    struct batch_set *s = &m->batch_sets[set];
    m->current = set;
    m->features = s->features, m->tokens = s->tokens, m->targets = s->targets;
    m->targets_valid = s->targets_valid;
}

bb_status bb_model_alloc_batches(bb_model_t *m)
{
    if (!(m->batch_sets = calloc(2, sizeof *m->batch_sets))) return bb_fail(BB_ERR_NOMEM, "out of memory");
    bool gpt = m->cfg.kind == BB_MODEL_GPT;
    int n = bb_model_batch_rows(m);
    for (int i = 0; i < 2; i++) {
        struct batch_set *s = &m->batch_sets[i];
        s->target_bytes = (size_t)n * sizeof(int32_t);
        s->input_bytes = gpt ? (size_t)n * sizeof(int32_t) : (size_t)m->B * m->cfg.inputs * sizeof(float);
        void *in;
        BB_TRY(bb_backend_alloc(m->be, s->input_bytes, gpt ? "tokens" : "features", &in));
        /* Zeroed, so that a forward before the first batch indexes row 0. */
        BB_TRY(bb_backend_memset(m->be, in, 0, s->input_bytes));
        if (gpt) s->tokens = in;
        else s->features = in;
        BB_TRY(bb_backend_alloc(m->be, s->target_bytes, "targets", (void **)&s->targets));
        BB_TRY(bb_backend_memset(m->be, s->targets, 0, s->target_bytes));
        BB_TRY(bb_backend_host_alloc(m->be, s->input_bytes + s->target_bytes, (void **)&s->staging));
        BB_TRY(bb_backend_event_create(m->be, &s->copied));
        BB_TRY(bb_backend_event_create(m->be, &s->released));
    }
    point_at(m, 0);
    return BB_OK;
}

void bb_model_free_batches(bb_model_t *m)
{
    for (int i = 0; m->batch_sets && i < 2; i++) {
        struct batch_set *s = &m->batch_sets[i];
        bb_backend_free(m->be, s->features);
        bb_backend_free(m->be, s->tokens);
        bb_backend_free(m->be, s->targets);
        if (s->staging) bb_backend_host_free(m->be, s->staging, s->input_bytes + s->target_bytes);
        bb_backend_event_destroy(m->be, s->copied);
        bb_backend_event_destroy(m->be, s->released);
    }
    free(m->batch_sets);
    m->batch_sets = NULL;
}

/* ---- host arrays --------------------------------------------------------- */
bb_status bb_model_set_batch(bb_model_t *m, const void *inputs, const int32_t *targets)
{
    int n = bb_model_batch_rows(m);
    bool gpt = m->cfg.kind == BB_MODEL_GPT;
    int32_t classes = gpt ? m->cfg.vocab : m->cfg.classes;
    /* Checked here, on the host: the ops index tables with these. */
    for (int i = 0; i < n; i++) {
        if (targets[i] < -1 || targets[i] >= classes)
            return bb_fail(BB_ERR_ARG, "target %d at position %d is not -1 (ignored) or below %d", targets[i], i,
                           classes);
        if (gpt && (((const int32_t *)inputs)[i] < 0 || ((const int32_t *)inputs)[i] >= classes))
            return bb_fail(BB_ERR_ARG, "token %d at position %d is not below the vocabulary %d",
                           ((const int32_t *)inputs)[i], i, classes);
    }
    struct batch_set *s = &m->batch_sets[m->current];
    s->targets_valid = 0;
    for (int i = 0; i < n; i++) s->targets_valid += targets[i] >= 0;
    m->targets_valid = s->targets_valid;
    BB_TRY(bb_backend_copy(m->be, gpt ? (void *)s->tokens : (void *)s->features, inputs, s->input_bytes, BB_COPY_H2D));
    return bb_backend_copy(m->be, s->targets, targets, s->target_bytes, BB_COPY_H2D);
}

/* ---- loader records ------------------------------------------------------- */
/* Converts `count` records into inputs and targets (B rows; padding past
 * count: zero inputs, ignored targets). */
static bb_status convert(const bb_model_t *m, const bb_shard_meta *meta, const uint8_t *records, int count,
                         void *inputs, int32_t *targets)
{
    const bb_model_config *c = &m->cfg;
    int n = bb_model_batch_rows(m);
    for (int i = 0; i < n; i++) targets[i] = -1;
    if (c->kind == BB_MODEL_MLP) {
        size_t pixels = meta->record_size - 1;
        if (meta->kind != BB_RECORD_IMAGE_U8 || pixels != (size_t)c->inputs)
            return bb_fail(BB_ERR_ARG, "mlp with %d inputs cannot take %s records of %zu pixels", c->inputs,
                           bb_record_kind_name(meta->kind), pixels);
        float *x = inputs;
        memset(x, 0, (size_t)m->B * c->inputs * sizeof *x);
        for (int b = 0; b < count; b++) {
            const uint8_t *r = records + (size_t)b * meta->record_size;
            if (r[0] >= c->classes) return bb_fail(BB_ERR_ARG, "label %u is not below %d classes", r[0], c->classes);
            targets[b] = r[0];
            for (int i = 0; i < c->inputs; i++) x[(size_t)b * c->inputs + i] = r[1 + i] / 255.0f;
        }
        return BB_OK;
    }
    int T = c->seq_len;
    size_t width = meta->kind == BB_RECORD_TOKENS_U16 ? 2 : meta->kind == BB_RECORD_TOKENS_U32 ? 4 : 0;
    if (!width || meta->shape[0] != (uint32_t)T + 1)
        return bb_fail(BB_ERR_ARG, "gpt with --seq-len %d needs token records of %d tokens, not %s [%u]", T, T + 1,
                       bb_record_kind_name(meta->kind), meta->shape[0]);
    int32_t *tok = inputs;
    memset(tok, 0, (size_t)n * sizeof *tok);
    for (int b = 0; b < count; b++)
        for (int t = 0; t <= T; t++) {
            const uint8_t *p = records + (size_t)b * meta->record_size + (size_t)t * width;
            uint32_t v = width == 2 ? (uint32_t)(p[0] | p[1] << 8)
                                    : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            if (v >= (uint32_t)c->vocab) return bb_fail(BB_ERR_ARG, "token %u is not below the vocabulary %d", v, c->vocab);
            if (t < T) tok[b * T + t] = (int32_t)v;
            if (t > 0) targets[b * T + t - 1] = (int32_t)v;
        }
    return BB_OK;
}

bb_status bb_model_stage_records(bb_model_t *m, const bb_shard_meta *meta, const uint8_t *records, int count)
{
    if (count < 1 || count > m->B)
        return bb_fail(BB_ERR_ARG, "batch of %d records for a micro-batch of %d", count, m->B);
    struct batch_set *s = &m->batch_sets[m->current ^ 1];
    BB_TRY(bb_backend_event_synchronize(m->be, s->copied)); /* its staging area is free again */
    int32_t *targets = (int32_t *)(s->staging + s->input_bytes);
    BB_TRY(convert(m, meta, records, count, s->staging, targets));
    s->targets_valid = 0;
    for (int i = 0; i < bb_model_batch_rows(m); i++) s->targets_valid += targets[i] >= 0;
    BB_TRY(bb_backend_stream_wait(m->be, BB_STREAM_COPY, s->released));
    void *inputs = m->cfg.kind == BB_MODEL_GPT ? (void *)s->tokens : (void *)s->features;
    BB_TRY(bb_backend_copy_async(m->be, inputs, s->staging, s->input_bytes, BB_COPY_H2D, BB_STREAM_COPY));
    BB_TRY(bb_backend_copy_async(m->be, s->targets, targets, s->target_bytes, BB_COPY_H2D, BB_STREAM_COPY));
    return bb_backend_event_record(m->be, s->copied, BB_STREAM_COPY);
}

bb_status bb_model_use_staged(bb_model_t *m)
{
    int next = m->current ^ 1;
    BB_TRY(bb_backend_stream_wait(m->be, BB_STREAM_COMPUTE, m->batch_sets[next].copied));
    BB_TRY(bb_backend_event_record(m->be, m->batch_sets[m->current].released, BB_STREAM_COMPUTE));
    point_at(m, next);
    return BB_OK;
}

bb_status bb_model_set_batch_from_records(bb_model_t *m, const bb_shard_meta *meta, const uint8_t *records, int count)
{
    BB_TRY(bb_model_stage_records(m, meta, records, count));
    return bb_model_use_staged(m);
}
