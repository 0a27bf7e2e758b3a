/* model_flags.c — the model and data flags shared by train, eval, sample. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bigbatch/backend.h"
#include "bigbatch/shard.h"
#include "bigbatch/train.h"
#include "model_flags.h"

bb_status devices_flag_parse(const char *s, bool must_exist, int *count, bb_device_kind *kind, int *ids)
{
    return bb_devices_parse("--devices", s, must_exist, count, kind, ids);
}

bb_status loss_chunk_flag(const model_flags *f, bb_model_config *c)
{
    c->loss_chunk = (int)f->loss_chunk;
    if (f->loss_chunk_given && !bb_model_chunks_loss(c))
        return bb_fail(BB_ERR_ARG, "--loss-chunk sizes a gpt's LM head; the %s's loss runs whole",
                       bb_model_kind_name(c->kind));
    return BB_OK;
}

bb_status model_flags_config(const model_flags *f, bb_model_config *out)
{
    bb_model_flags shape = f->shape;
    shape.hidden = (const char *const *)f->hidden.items, shape.hidden_count = f->hidden.count;
    BB_TRY(bb_model_config_from_flags(f->kind, &shape, out));
    BB_TRY(bb_model_parse_recompute(f->checkpoint, out));
    BB_TRY(loss_chunk_flag(f, out));
    BB_TRY(bb_model_check_recompute(out));
    int layers = bb_model_layers(out);
    if (out->recompute_every > layers)
        BB_WARN("--checkpoint %s: the %s has %d layers, so every:%d (one segment: only the first layer's input is "
                "kept) is what runs", f->checkpoint, bb_model_kind_name(out->kind), layers, layers);
    return BB_OK;
}

bb_status model_flags_hf_shape(const model_flags *f, const char *dir, bb_model_config *c)
{
    if (model_flags_shape_given(f))
        return bb_fail(BB_ERR_ARG, "--init-from %s: its config.json gives the shape; drop --model, --layers, --heads, "
                       "--d-model and the llama flags", dir);
    bb_model_config hf;
    int positions;
    BB_TRY(bb_model_hf_config(dir, &hf, &positions));
    bb_model_config_take_shape(c, &hf); /* the data, when given, gives T and V */
    return BB_OK;
}

bb_record_format token_records(int T, uint32_t V)
{
    uint32_t width = V > 65536 ? 4 : 2, tokens = (uint32_t)T + 1;
    return (bb_record_format){.kind = width == 4 ? BB_RECORD_TOKENS_U32 : BB_RECORD_TOKENS_U16, .rank = 1,
                              .shape = {tokens}, .record_size = tokens * width, .classes_or_vocab = V};
}

bb_status model_config_from_data(const char *path, bb_model_config *c, uint32_t *record_size)
{
    bb_dataset_t *ds;
    BB_TRY(bb_dataset_open(path, &ds));
    bb_status rc = bb_model_config_from_data(c, bb_dataset_format(ds), path);
    if (record_size) *record_size = bb_dataset_format(ds)->record_size;
    bb_dataset_close(ds);
    return rc;
}

bb_status device_flag_parse_one(const char *s, bb_device_kind *kind, int *id)
{
    int ids[BB_DEVICES_MAX], count;
    BB_TRY(devices_flag_parse(s, true, &count, kind, ids));
    if (count != 1) return bb_fail(BB_ERR_ARG, "--devices %s: this command runs on one device (cpu or cuda:N)", s);
    *id = ids[0];
    return BB_OK;
}

bb_status default_data_present(const char *data, bool given)
{
    char cwd[4096];
    if (given || access(data, F_OK) == 0) return BB_OK;
    if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, "?");
    return bb_fail(BB_ERR_ARG, "no --data given, and its default %s (the repository's embedded data, relative to the "
                   "current directory, %s) is not here: pass --data DIR, or run from the repository's root", data,
                   cwd);
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
