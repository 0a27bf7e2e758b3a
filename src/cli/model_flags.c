/* model_flags.c — the model and data flags shared by train, eval, sample. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bigbatch/shard.h"
#include "model_flags.h"

bb_status model_flags_config(const model_flags *f, bb_model_config *out)
{
    if (!strcmp(f->kind, "gpt")) {
        *out = bb_model_gpt_config((int)f->layers, (int)f->heads, (int)f->d_model, 0, 0);
    } else {
        int sizes[BB_MLP_MAX_HIDDEN] = {1024, 1024}, n = f->hidden.count ? 0 : 2;
        for (int i = 0; i < f->hidden.count; i++) {
            /* "1024,512" and "1024 512" both work */
            for (const char *p = f->hidden.items[i]; *p;) {
                char *end;
                long v = strtol(p, &end, 10);
                if (end == p || v < 1 || v > 1 << 20 || n == BB_MLP_MAX_HIDDEN)
                    return bb_fail(BB_ERR_ARG, "--hidden: '%s' is not a list of at most %d sizes >= 1",
                                   f->hidden.items[i], BB_MLP_MAX_HIDDEN);
                sizes[n++] = (int)v;
                p = *end == ',' ? end + 1 : end;
                if (*end && *end != ',') return bb_fail(BB_ERR_ARG, "--hidden: bad size list '%s'", f->hidden.items[i]);
            }
        }
        *out = bb_model_mlp_config(0, sizes, n, 0);
    }
    return bb_model_parse_checkpoint(f->checkpoint, &out->checkpoint_every);
}

bb_status model_config_from_data(const char *path, bb_model_config *c)
{
    bb_dataset_t *ds;
    BB_TRY(bb_dataset_open(path, &ds));
    const bb_shard_meta *m = bb_dataset_meta(ds);
    bb_status rc = BB_OK;
    if (c->kind == BB_MODEL_GPT && (m->kind == BB_RECORD_TOKENS_U16 || m->kind == BB_RECORD_TOKENS_U32)) {
        c->seq_len = (int)m->shape[0] - 1;
        c->vocab = (int)m->classes_or_vocab;
    } else if (c->kind == BB_MODEL_MLP && m->kind == BB_RECORD_IMAGE_U8) {
        c->inputs = (int)m->record_size - 1;
        c->classes = (int)m->classes_or_vocab;
    } else {
        rc = bb_fail(BB_ERR_ARG, "%s holds %s records, which a %s cannot take", path, bb_record_kind_name(m->kind),
                     c->kind == BB_MODEL_GPT ? "gpt" : "mlp");
    }
    bb_dataset_close(ds);
    return rc;
}

const char *resolve_split(const char *dir, const char *sub)
{
    struct stat st;
    size_t n = strlen(dir) + strlen(sub) + 2;
    char *path = malloc(n);
    if (!path) return dir;
    snprintf(path, n, "%s/%s", dir, sub);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return path;
    free(path);
    return NULL;
}
