/* eval.c — the loss (and mlp accuracy) of a model over every record of a
 * dataset, read frame by frame in order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bigbatch/train.h"

typedef struct eval_sums {
    double loss;
    uint64_t targets, correct, records;
} eval_sums;

static bb_status run_batch(bb_model_t *m, const bb_shard_meta *meta, const uint8_t *records, int count, eval_sums *s)
{
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

bb_status bb_evaluate(bb_model_t *m, const bb_dataset_t *ds, bb_eval_result *out)
{
    const bb_shard_meta *meta = bb_dataset_meta(ds);
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
                    rc = run_batch(m, meta, batch, B, &s);
                    filled = 0;
                }
            }
        }
    }
    if (rc == BB_OK && filled) rc = run_batch(m, meta, batch, filled, &s); /* padded */
    bb_frame_decoder_destroy(dec);
    free(frame);
    free(batch);
    BB_TRY(rc);
    out->records = s.records;
    out->loss = s.targets ? s.loss / (double)s.targets : NAN;
    out->accuracy = bb_model_get_config(m)->kind == BB_MODEL_MLP && s.records ? (double)s.correct / (double)s.records : NAN;
    return BB_OK;
}
