/* batch.c — the model's batches: two sets of device buffers, each with two
 * events, so that the upload of the next micro-batch (copy stream)
 * overlaps the compute of this one.
 *
 * Loader records go to the device as they are: the upload reads the
 * loader's slot (pinned memory) straight into the set's records buffer,
 * and an op on the compute stream turns them into inputs and targets, so
 * no host copy is made. Where device memory is host memory (the CPU) the op
 * reads the slot itself and there is no copy at all.
 *
 * A set goes: staged (records checked on the host, their upload queued
 * after the compute stream released the set) → used (the compute stream
 * waits for the upload and converts; the set becomes current) → released
 * (when the next set is used, an event on the compute stream marks the end
 * of its reads). On the CPU events are no-ops and copies happen at once. */
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

struct batch_set {
    float *features;          /* device: mlp (B, inputs) */
    int32_t *tokens, *targets; /* device: gpt (B, T); targets (B) or (B, T) */
    uint8_t *records;         /* device: raw records, (B, record bytes); NULL where host is device */
    const uint8_t *source;    /* the records to convert: `records`, or the caller's where host is device */
    int count, width;         /* records staged; bytes per token (gpt) */
    int targets_valid;
    bb_event_t *copied;       /* its upload finished (copy stream) */
    bb_event_t *released;     /* the compute stream stopped reading it */
};

int bb_model_batch_rows(const bb_model_t *m) { return m->cfg.kind == BB_MODEL_GPT ? m->B * m->cfg.seq_len : m->B; }

size_t bb_model_record_buffer_bytes(const bb_model_config *c, int micro_batch)
{
    /* the widest records a model takes: u32 tokens, or a label and the pixels */
    size_t record = c->kind == BB_MODEL_GPT ? ((size_t)c->seq_len + 1) * 4 : (size_t)c->inputs + 1;
    return (size_t)micro_batch * record;
}

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
    size_t input_bytes = gpt ? (size_t)n * sizeof(int32_t) : (size_t)m->B * m->cfg.inputs * sizeof(float);
    for (int i = 0; i < 2; i++) {
        struct batch_set *s = &m->batch_sets[i];
        void *in;
        BB_TRY(bb_backend_alloc(m->be, input_bytes, gpt ? "tokens" : "features", &in));
        /* Zeroed, so that a forward before the first batch indexes row 0. */
        BB_TRY(bb_backend_memset(m->be, in, 0, input_bytes));
        if (gpt) s->tokens = in;
        else s->features = in;
        BB_TRY(bb_backend_alloc(m->be, (size_t)n * sizeof(int32_t), "targets", (void **)&s->targets));
        BB_TRY(bb_backend_memset(m->be, s->targets, 0, (size_t)n * sizeof(int32_t)));
        if (!bb_backend_host_is_device(m->be))
            BB_TRY(bb_backend_alloc(m->be, bb_model_record_buffer_bytes(&m->cfg, m->B), "records",
                                    (void **)&s->records));
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
        bb_backend_free(m->be, s->records);
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
    size_t input_bytes = gpt ? (size_t)n * sizeof(int32_t) : (size_t)m->B * m->cfg.inputs * sizeof(float);
    BB_TRY(bb_backend_copy(m->be, gpt ? (void *)s->tokens : (void *)s->features, inputs, input_bytes, BB_COPY_H2D));
    return bb_backend_copy(m->be, s->targets, targets, (size_t)n * sizeof(int32_t), BB_COPY_H2D);
}

/* ---- loader records ------------------------------------------------------- */
/* Checks `count` records against the model, on the host (the device
 * indexes tables with them); *width gets a gpt's bytes per token. Reads
 * the records, writes nothing. */
static bb_status check_records(const bb_model_t *m, const bb_shard_meta *meta, const uint8_t *records, int count,
                               int *width)
{
    const bb_model_config *c = &m->cfg;
    if (c->kind == BB_MODEL_MLP) {
        size_t pixels = meta->record_size - 1;
        if (meta->kind != BB_RECORD_IMAGE_U8 || pixels != (size_t)c->inputs)
            return bb_fail(BB_ERR_ARG, "mlp with %d inputs cannot take %s records of %zu pixels", c->inputs,
                           bb_record_kind_name(meta->kind), pixels);
        for (int b = 0; b < count; b++) {
            uint8_t label = records[(size_t)b * meta->record_size];
            if (label >= c->classes) return bb_fail(BB_ERR_ARG, "label %u is not below %d classes", label, c->classes);
        }
        return BB_OK;
    }
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

bb_status bb_model_stage_records(bb_model_t *m, const bb_shard_meta *meta, const uint8_t *records, int count)
{
    if (count < 1 || count > m->B)
        return bb_fail(BB_ERR_ARG, "batch of %d records for a micro-batch of %d", count, m->B);
    struct batch_set *s = &m->batch_sets[m->current ^ 1];
    int width = 0;
    BB_TRY(check_records(m, meta, records, count, &width));
    BB_TRY(bb_backend_event_synchronize(m->be, s->copied)); /* the set's last upload is done */
    s->count = count;
    s->width = width;
    s->targets_valid = m->cfg.kind == BB_MODEL_GPT ? count * m->cfg.seq_len : count;
    if (!s->records) { /* host is device: the op reads the records where they are */
        s->source = records;
        return BB_OK;
    }
    BB_TRY(bb_backend_stream_wait(m->be, BB_STREAM_COPY, s->released));
    BB_TRY(bb_backend_copy_async(m->be, s->records, records, (size_t)count * meta->record_size, BB_COPY_H2D,
                                 BB_STREAM_COPY));
    s->source = s->records;
    return bb_backend_event_record(m->be, s->copied, BB_STREAM_COPY);
}

bb_status bb_model_use_staged(bb_model_t *m)
{
    int next = m->current ^ 1;
    struct batch_set *s = &m->batch_sets[next];
    BB_TRY(bb_backend_stream_wait(m->be, BB_STREAM_COMPUTE, s->copied));
    BB_TRY(bb_backend_event_record(m->be, m->batch_sets[m->current].released, BB_STREAM_COMPUTE));
    point_at(m, next);
    if (m->cfg.kind == BB_MODEL_GPT)
        bb_op_records_to_tokens(m->be, s->tokens, s->targets, s->source, s->count, m->B, m->cfg.seq_len, s->width);
    else
        bb_op_records_to_images(m->be, s->features, s->targets, s->source, s->count, m->B, m->cfg.inputs);
    return BB_OK;
}

bb_status bb_model_set_batch_from_records(bb_model_t *m, const bb_shard_meta *meta, const uint8_t *records, int count)
{
    BB_TRY(bb_model_stage_records(m, meta, records, count));
    BB_TRY(bb_model_use_staged(m));
    /* the caller may release the records when this returns */
    return bb_backend_event_synchronize(m->be, m->batch_sets[m->current].copied);
}
