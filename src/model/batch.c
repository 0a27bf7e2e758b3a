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
    void *inputs;             /* device: the kind's inputs (B, inputs per example) */
    int32_t *targets;         /* device: (B, targets per example) */
    uint8_t *records;         /* device: raw records, (B, record bytes); NULL where host is device */
    const uint8_t *source;    /* the records to convert: `records`, or the caller's where host is device */
    int count, width;         /* records staged; the kind's detail (gpt: bytes per token) */
    int targets_valid;
    bb_event_t *copied;       /* its upload finished (copy stream) */
    bb_event_t *released;     /* the compute stream stopped reading it */
};

int bb_model_batch_rows(const bb_model_t *m) { return m->B * m->cfg.kind->family->targets_per_example(&m->cfg); }

static size_t input_bytes(const bb_model_t *m)
{
    return (size_t)m->B * (size_t)m->cfg.kind->family->inputs_per_example(&m->cfg) * m->cfg.kind->family->input_size;
}

size_t bb_model_record_buffer_bytes(const bb_model_config *c, int micro_batch)
{
    return (size_t)micro_batch * c->kind->family->record_bytes(c);
}

static void point_at(bb_model_t *m, int set)
{
    struct batch_set *s = &m->batch_sets[set];
    m->current = set;
    m->inputs = s->inputs, m->targets = s->targets;
    m->targets_valid = s->targets_valid;
}

bb_status bb_model_alloc_batches(bb_model_t *m)
{
    if (!(m->batch_sets = calloc(2, sizeof *m->batch_sets))) return bb_fail(BB_ERR_NOMEM, "out of memory");
    int n = bb_model_batch_rows(m);
    for (int i = 0; i < 2; i++) {
        struct batch_set *s = &m->batch_sets[i];
        BB_TRY(bb_backend_alloc(m->be, input_bytes(m), m->cfg.kind->family->input_name, &s->inputs));
        /* Zeroed, so that a forward before the first batch indexes row 0. */
        BB_TRY(bb_backend_memset(m->be, s->inputs, 0, input_bytes(m)));
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
        bb_backend_free(m->be, s->inputs);
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
    int32_t classes = bb_model_outputs(&m->cfg);
    /* Checked here, on the host: the ops index tables with these. */
    for (int i = 0; i < n; i++)
        if (targets[i] < -1 || targets[i] >= classes)
            return bb_fail(BB_ERR_ARG, "target %d at position %d is not -1 (ignored) or below %d", targets[i], i,
                           classes);
    if (m->cfg.kind->family->check_inputs)
        BB_TRY(m->cfg.kind->family->check_inputs(&m->cfg, inputs, (size_t)m->B * m->cfg.kind->family->inputs_per_example(&m->cfg)));
    struct batch_set *s = &m->batch_sets[m->current];
    s->targets_valid = 0;
    for (int i = 0; i < n; i++) s->targets_valid += targets[i] >= 0;
    m->targets_valid = s->targets_valid;
    BB_TRY(bb_backend_copy(m->be, s->inputs, inputs, input_bytes(m), BB_COPY_H2D));
    return bb_backend_copy(m->be, s->targets, targets, (size_t)n * sizeof(int32_t), BB_COPY_H2D);
}

bb_status bb_model_set_synthetic_batch(bb_model_t *m)
{
    size_t n = (size_t)bb_model_batch_rows(m), count = input_bytes(m) / m->cfg.kind->family->input_size;
    uint64_t outputs = (uint64_t)bb_model_outputs(&m->cfg);
    void *inputs = malloc(input_bytes(m));
    int32_t *targets = malloc(n * sizeof *targets);
    bb_status rc = inputs && targets ? BB_OK : bb_fail(BB_ERR_NOMEM, "out of memory");
    for (size_t i = 0; rc == BB_OK && i < n; i++) targets[i] = (int32_t)((i * 2654435761u) % outputs);
    for (size_t i = 0; rc == BB_OK && i < count; i++) { /* tokens spread over the vocabulary, or pixels in [0, 1] */
        if (m->cfg.kind->family->targets_are_tokens) ((int32_t *)inputs)[i] = (int32_t)((i * 40503u) % outputs);
        else ((float *)inputs)[i] = (float)(i % 255) / 255.0f;
    }
    if (rc == BB_OK) rc = bb_model_set_batch(m, inputs, targets);
    free(inputs), free(targets);
    return rc;
}

/* ---- loader records ------------------------------------------------------- */
bb_status bb_model_stage_records(bb_model_t *m, const bb_record_format *f, const uint8_t *records, int count)
{
    if (count < 1 || count > m->B)
        return bb_fail(BB_ERR_ARG, "batch of %d records for a micro-batch of %d", count, m->B);
    struct batch_set *s = &m->batch_sets[m->current ^ 1];
    int width = 0;
    BB_TRY(m->cfg.kind->family->check_records(&m->cfg, f, records, count, &width));
    BB_TRY(bb_backend_event_synchronize(m->be, s->copied)); /* the set's last upload is done */
    s->count = count;
    s->width = width;
    s->targets_valid = count * m->cfg.kind->family->targets_per_example(&m->cfg);
    if (!s->records) { /* host is device: the op reads the records where they are */
        s->source = records;
        return BB_OK;
    }
    BB_TRY(bb_backend_stream_wait(m->be, BB_STREAM_COPY, s->released));
    BB_TRY(bb_backend_copy_async(m->be, s->records, records, (size_t)count * f->record_size, BB_COPY_H2D,
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
    m->cfg.kind->family->convert(m, s->inputs, s->targets, s->source, s->count, s->width);
    return BB_OK;
}

bb_status bb_model_set_batch_from_records(bb_model_t *m, const bb_record_format *f, const uint8_t *records,
                                          int count)
{
    BB_TRY(bb_model_stage_records(m, f, records, count));
    BB_TRY(bb_model_use_staged(m));
    /* the caller may release the records when this returns */
    return bb_backend_event_synchronize(m->be, m->batch_sets[m->current].copied);
}
