/* model_flags.c — the model and data flags shared by train, eval, sample. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bigbatch/backend.h"
#include "bigbatch/shard.h"
#include "bigbatch/world.h"
#include "model_flags.h"

bb_status devices_flag_parse(const char *s, bool must_exist, int *count, bb_device_kind *kind, int *ids)
{
    *count = 0;
    *kind = BB_DEVICE_CPU;
    if (!strcmp(s, "cpu")) return *count = 1, ids[0] = 0, BB_OK;
    if (!strncmp(s, "cpu:", 4)) {
        int64_t n;
        BB_TRY(bb_parse_int("--devices", s + 4, &n));
        if (n < 1 || n > BB_DEVICES_MAX) return bb_fail(BB_ERR_ARG, "--devices cpu:N needs 1 <= N <= %d", BB_DEVICES_MAX);
        for (*count = 0; *count < n; (*count)++) ids[*count] = *count;
        return BB_OK;
    }
    if (strncmp(s, "cuda:", 5) || !s[5])
        return bb_fail(BB_ERR_ARG, "--devices: '%s' is not cpu:N, cuda:all or cuda:0,1,... (or cuda:local under "
                       "mpirun)", s);
    bb_cuda_info info;
    bb_cuda_probe(&info);
    *kind = BB_DEVICE_CUDA;
    if (!strcmp(s + 5, "local")) { /* one process per GPU: the GPU of this process's local rank */
        int id = bb_world_get()->local_rank;
        if (must_exist && id >= info.device_count)
            return bb_fail(info.device_count ? BB_ERR_ARG : BB_ERR_UNSUPPORTED, "--devices cuda:local: local rank %d, "
                           "but %s", id, info.device_count ? "no such GPU on this machine" : info.reason);
        ids[(*count)++] = id;
        return BB_OK;
    }
    if (!strcmp(s + 5, "all")) {
        if (!info.device_count) return bb_fail(BB_ERR_UNSUPPORTED, "--devices cuda:all: no GPU (%s)", info.reason);
        for (int d = 0; d < info.device_count && d < BB_DEVICES_MAX; d++) ids[(*count)++] = d;
        return BB_OK;
    }
    for (const char *p = s + 5; *p;) {
        char *end;
        long id = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',') || id < 0 || *count == BB_DEVICES_MAX)
            return bb_fail(BB_ERR_ARG, "--devices: '%s' is not cpu:N, cuda:all or cuda:0,1,... (or cuda:local under "
                       "mpirun)", s);
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
    bb_model_flags shape = {.layers = f->layers, .heads = f->heads, .d_model = f->d_model,
                            .layers_given = f->layers_given, .heads_given = f->heads_given,
                            .d_model_given = f->d_model_given, .hidden = (const char *const *)f->hidden.items,
                            .hidden_count = f->hidden.count};
    BB_TRY(bb_model_config_from_flags(f->kind, &shape, out));
    BB_TRY(bb_model_parse_checkpoint(f->checkpoint, &out->checkpoint_every));
    BB_TRY(loss_chunk_flag(f, out));
    int layers = bb_model_layers(out);
    if (out->checkpoint_every > layers)
        BB_WARN("--checkpoint %s: the %s has %d layers, so every:%d (one segment: only the first layer's input is "
                "kept) is what runs", f->checkpoint, bb_model_kind_name(out->kind), layers, layers);
    return BB_OK;
}

bb_status model_config_from_data(const char *path, bb_model_config *c, uint32_t *record_size)
{
    bb_dataset_t *ds;
    BB_TRY(bb_dataset_open(path, &ds));
    bb_status rc = bb_model_config_from_data(c, bb_dataset_meta(ds), path);
    if (record_size) *record_size = bb_dataset_meta(ds)->record_size;
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
