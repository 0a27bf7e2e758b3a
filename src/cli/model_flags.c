/* model_flags.c — the model and data flags shared by train, eval, sample. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bigbatch/backend.h"
#include "bigbatch/shard.h"
#include "model_flags.h"

bb_status devices_flag_parse(const char *s, bool must_exist, int *count, bool *cuda, int *ids)
{
    *count = 0;
    *cuda = false;
    if (!strcmp(s, "cpu")) return *count = 1, BB_OK;
    if (!strncmp(s, "cpu:", 4)) {
        int64_t n;
        BB_TRY(bb_parse_int("--devices", s + 4, &n));
        if (n < 1 || n > BB_DEVICES_MAX) return bb_fail(BB_ERR_ARG, "--devices cpu:N needs 1 <= N <= %d", BB_DEVICES_MAX);
        *count = (int)n;
        return BB_OK;
    }
    if (strncmp(s, "cuda:", 5) || !s[5])
        return bb_fail(BB_ERR_ARG, "--devices: '%s' is not cpu:N, cuda:all or cuda:0,1,...", s);
    bb_cuda_info info;
    bb_cuda_probe(&info);
    *cuda = true;
    if (!strcmp(s + 5, "all")) {
        if (!info.device_count) return bb_fail(BB_ERR_UNSUPPORTED, "--devices cuda:all: no GPU (%s)", info.reason);
        for (int d = 0; d < info.device_count && d < BB_DEVICES_MAX; d++) ids[(*count)++] = d;
        return BB_OK;
    }
    for (const char *p = s + 5; *p;) {
        char *end;
        long id = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',') || id < 0 || *count == BB_DEVICES_MAX)
            return bb_fail(BB_ERR_ARG, "--devices: '%s' is not cpu:N, cuda:all or cuda:0,1,...", s);
        for (int i = 0; i < *count; i++)
            if (ids[i] == id) return bb_fail(BB_ERR_ARG, "--devices %s names cuda:%ld twice", s, id);
        if (must_exist && id >= info.device_count)
            return bb_fail(info.device_count ? BB_ERR_ARG : BB_ERR_UNSUPPORTED, "--devices %s: %s", s,
                           info.device_count ? "no such GPU on this machine" : info.reason);
        ids[(*count)++] = (int)id;
        p = *end ? end + 1 : end;
    }
    return BB_OK;
}

bb_status model_flags_config(const model_flags *f, bb_model_config *out)
{
    const model_flags defaults = MODEL_FLAGS_DEFAULT;
    if (!strcmp(f->kind, "gpt")) {
        if (f->hidden.count) return bb_fail(BB_ERR_ARG, "--hidden sizes an mlp's layers; this is a gpt (--model mlp?)");
        *out = bb_model_gpt_config((int)f->layers, (int)f->heads, (int)f->d_model, 0, 0);
    } else {
        if (f->layers != defaults.layers || f->heads != defaults.heads || f->d_model != defaults.d_model)
            return bb_fail(BB_ERR_ARG, "--layers, --heads and --d-model shape a gpt; an mlp takes --hidden");
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
    BB_TRY(bb_model_parse_checkpoint(f->checkpoint, &out->checkpoint_every));
    if (out->kind == BB_MODEL_GPT && out->checkpoint_every > out->layers)
        BB_WARN("--checkpoint %s: the gpt has %d layers, so every:%d (one segment: only the first block's input is "
                "kept) is what runs", f->checkpoint, out->layers, out->layers);
    return BB_OK;
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

bb_status device_flag_parse_one(const char *s, bool *cuda, int *id)
{
    int ids[BB_DEVICES_MAX], count;
    BB_TRY(devices_flag_parse(s, true, &count, cuda, ids));
    if (count != 1) return bb_fail(BB_ERR_ARG, "--devices %s: this command runs on one device (cpu or cuda:N)", s);
    *id = *cuda ? ids[0] : 0;
    return BB_OK;
}

const char *resolve_split(const char *dir, const char *sub)
{
    /* The paths live as long as the command: kept here, not leaked. */
    static char paths[8][4096];
    static int used;
    struct stat st;
    if (used == 8) return NULL;
    char *path = paths[used];
    if ((size_t)snprintf(path, sizeof paths[0], "%s/%s", dir, sub) >= sizeof paths[0]) return NULL;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return NULL;
    used++;
    return path;
}
