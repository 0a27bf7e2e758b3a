/* eval.c — the loss (and mlp accuracy) of a model over every record of a
 * dataset, read frame by frame in order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bigbatch/train.h"

typedef struct eval_sums {
    double loss;
    uint64_t targets, correct, records, bytes;
} eval_sums;

/* The bytes of text the targets of `count` token records stand for
 * (tokens 1..T of each). */
static uint64_t target_bytes(const bb_record_format *meta, const uint8_t *records, int count, const uint32_t *len)
{
    uint64_t n = 0;
    uint32_t T1 = meta->shape[0], vocab = meta->classes_or_vocab;
    for (int r = 0; r < count; r++)
        for (uint32_t i = 1; i < T1; i++) {
            uint32_t id; /* little-endian, as the host (import_tokens.c asserts it) */
            uint16_t id16;
            if (meta->kind == BB_RECORD_TOKENS_U32) memcpy(&id, records + ((size_t)r * T1 + i) * 4, 4);
            else memcpy(&id16, records + ((size_t)r * T1 + i) * 2, 2), id = id16;
            n += id < vocab ? len[id] : 0;
        }
    return n;
}

static bb_status run_batch(bb_model_t *m, const bb_record_format *meta, const uint8_t *records, int count,
                           const uint32_t *token_bytes, eval_sums *s)
{
    if (token_bytes) s->bytes += target_bytes(meta, records, count, token_bytes);
    double loss;
    int correct;
    BB_TRY(bb_model_set_batch_from_records(m, meta, records, count));
    BB_TRY(bb_model_forward(m, 1.0f, &loss, &correct));
    s->loss += loss;
    s->targets += (uint64_t)bb_model_batch_targets(m);
    s->correct += correct > 0 ? (uint64_t)correct : 0;
    s->records += (uint64_t)count;
    return BB_OK;
}

/* Records done and the time left, in place on a terminal, else a line
 * every 10 s. */
typedef struct eval_progress {
    FILE *out;
    const char *label;
    bool tty, shown;
    uint64_t total, start_ns, last_ns;
} eval_progress;

static void show_progress(eval_progress *p, uint64_t done)
{
    uint64_t now = bb_clock_ns();
    if (!p->out || now - p->last_ns < (p->tty ? 1000000000ull : 10000000000ull)) return;
    p->last_ns = now;
    p->shown = true;
    double seconds = (double)(now - p->start_ns) / 1e9;
    fprintf(p->out, "%s%s: %llu of %llu records (%.0f%%), %.0fs left%s", p->tty ? "\r\033[K" : "", p->label,
            (unsigned long long)done, (unsigned long long)p->total, 100.0 * (double)done / (double)p->total,
            seconds * (double)(p->total - done) / (double)done, p->tty ? "" : "\n");
    fflush(p->out);
}

/* Clears the in-place line: the caller prints the result. */
static void end_progress(const eval_progress *p)
{
    if (p->tty && p->shown) fprintf(p->out, "\r\033[K");
}

bb_status bb_evaluate(bb_model_t *m, const bb_dataset_t *ds, const bb_eval_options *o, bb_eval_result *out)
{
    eval_progress progress = {.out = o ? o->progress : NULL, .label = o && o->label ? o->label : "eval",
                              .total = bb_dataset_record_count(ds), .start_ns = bb_clock_ns()};
    progress.last_ns = progress.start_ns;
    progress.tty = progress.out && isatty(fileno(progress.out));
    volatile sig_atomic_t *interrupted = o ? o->interrupted : NULL;
    const bb_record_format *meta = bb_dataset_format(ds);
    bool tokens = bb_record_token_bytes(meta->kind) != 0;
    const uint32_t *token_bytes = tokens && o ? o->token_bytes : NULL;
    int B = bb_model_micro_batch(m);
    size_t rs = meta->record_size, cap = 0;
    for (uint32_t i = 0; i < bb_dataset_shard_count(ds); i++)
        if (bb_shard_max_frame_bytes(bb_dataset_shard(ds, i)) > cap) cap = bb_shard_max_frame_bytes(bb_dataset_shard(ds, i));
    uint8_t *frame = malloc(cap ? cap : 1), *batch = malloc((size_t)B * rs);
    bb_frame_decoder_t *dec = NULL;
    bb_status rc = !frame || !batch ? bb_fail(BB_ERR_NOMEM, "out of memory for evaluation") : bb_frame_decoder_create(&dec);
    eval_sums s = {0};
    int filled = 0;
    for (uint32_t i = 0; rc == BB_OK && i < bb_dataset_shard_count(ds); i++) {
        const bb_shard_t *sh = bb_dataset_shard(ds, i);
        for (uint32_t f = 0; rc == BB_OK && f < bb_shard_frame_count(sh); f++) {
            rc = bb_shard_read_frame(sh, f, dec, frame, cap);
            size_t n = rc == BB_OK ? bb_shard_frame_at(sh, f)->raw_size / rs : 0;
            for (size_t r = 0; rc == BB_OK && r < n; r++) {
                memcpy(batch + (size_t)filled * rs, frame + r * rs, rs);
                if (++filled == B) {
                    rc = run_batch(m, meta, batch, B, token_bytes, &s);
                    filled = 0;
                    if (interrupted && *interrupted)
                        rc = bb_fail(BB_ERR_INTERRUPTED, "interrupted after %llu of %llu records",
                                     (unsigned long long)s.records, (unsigned long long)progress.total);
                    show_progress(&progress, s.records);
                }
            }
        }
    }
    if (rc == BB_OK && filled) rc = run_batch(m, meta, batch, filled, token_bytes, &s); /* padded */
    end_progress(&progress);
    bb_frame_decoder_destroy(dec);
    free(frame);
    free(batch);
    BB_TRY(rc);
    out->records = s.records;
    out->loss = s.targets ? s.loss / (double)s.targets : NAN;
    out->bits_per_byte = NAN;
    if (tokens && (token_bytes || meta->classes_or_vocab == 256)) { /* no table: a token is a byte */
        uint64_t bytes = token_bytes ? s.bytes : s.targets;
        out->bits_per_byte = bytes ? s.loss / (double)bytes / log(2.0) : NAN;
    }
    out->accuracy = bb_model_counts_correct(bb_model_get_config(m)) && s.records ? (double)s.correct / (double)s.records : NAN;
    return BB_OK;
}
