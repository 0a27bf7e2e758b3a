/* options.c — bb_train_options' defaults, the names its messages give its
 * fields, --devices' lists, and the resume policy: which options a
 * checkpoint supplies to the run that continues it (train.h). */
#include <stdlib.h>
#include <string.h>

#include "bigbatch/json.h"
#include "bigbatch/plan.h"
#include "bigbatch/train.h"
#include "bigbatch/world.h"

void bb_train_defaults(bb_train_options *o)
{
    *o = (bb_train_options){
        .model = bb_model_gpt_config(BB_GPT_DEFAULT_LAYERS, BB_GPT_DEFAULT_HEADS, BB_GPT_DEFAULT_D_MODEL, 0, 0),
        .data = "data/kjv/train",
        .devices = 1,
        .global_batch = 64,
        .micro_batch = 8,
        .epochs = 1,
        .opt = bb_optimizer_defaults(),
        .seed = 1,
        .loader_threads = BB_LOADER_THREADS_DEFAULT,
        .shuffle_frames = BB_SHUFFLE_FRAMES_DEFAULT,
        .shuffle_memory = BB_SHUFFLE_MEMORY_DEFAULT,
        .bucket_mib = BB_BUCKET_MIB_DEFAULT,
        .timeout_s = 600, /* PyTorch's collective timeout */
        .log_every = 10,
        .keep = 2,
    };
}

/* One whole number of `what` within [lo, hi] from s (which ends at `end`). */
static bool whole(const char *s, const char *end, int64_t lo, int64_t hi, int64_t *out)
{
    char text[32];
    size_t n = (size_t)(end - s);
    if (!n || n >= sizeof text) return false;
    memcpy(text, s, n), text[n] = 0;
    char *stop;
    long long v = strtoll(text, &stop, 10);
    if (*stop || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bb_status bb_train_parse_global_batch(const char *flag, const char *s, bb_train_options *o)
{
    int64_t b0, b1, steps = 0;
    o->auto_batch = false;
    if (!strcmp(s, "auto")) {
        o->global_batch = 0, o->ramp_from = 0, o->ramp_steps = 0, o->auto_batch = true;
        return BB_OK;
    }
    if (!strncmp(s, "auto:", 5)) {
        const char *from = s + 5, *dots = strstr(from, "..");
        if (!dots || !whole(from, dots, 1, 1 << 30, &b0) || !whole(dots + 2, dots + 2 + strlen(dots + 2), 1, 1 << 30, &b1))
            return bb_fail(BB_ERR_ARG, "%s %s: expected auto or auto:B0..B1 (e.g. auto:32..4096: from 32 examples, "
                           "following the noise scale up to 4096)", flag, s);
        if (b0 >= b1)
            return bb_fail(BB_ERR_ARG, "%s %s: B0 %lld must be below B1 %lld", flag, s, (long long)b0, (long long)b1);
        o->global_batch = (int)b1, o->ramp_from = (int)b0, o->ramp_steps = 0, o->auto_batch = true;
        return BB_OK;
    }
    if (strncmp(s, "ramp:", 5)) {
        BB_TRY(bb_parse_int(flag, s, &b1));
        if (b1 < 1 || b1 > 1 << 30) return bb_fail(BB_ERR_ARG, "%s %s: must be 1 to %d", flag, s, 1 << 30);
        o->global_batch = (int)b1, o->ramp_from = 0, o->ramp_steps = 0;
        return BB_OK;
    }
    const char *from = s + 5, *dots = strstr(from, ".."), *to = dots ? dots + 2 : NULL;
    const char *colon = to ? strchr(to, ':') : NULL, *end = colon ? colon : to ? to + strlen(to) : NULL;
    if (!dots || !whole(from, dots, 1, 1 << 30, &b0) || !whole(to, end, 1, 1 << 30, &b1) ||
        (colon && !whole(colon + 1, colon + 1 + strlen(colon + 1), 1, (int64_t)1 << 50, &steps)))
        return bb_fail(BB_ERR_ARG, "%s %s: expected ramp:B0..B1 or ramp:B0..B1:STEPS (e.g. ramp:32..512:1000: from "
                       "32 to 512 examples over the first 1000 steps)", flag, s);
    if (b0 >= b1)
        return bb_fail(BB_ERR_ARG, "%s %s: a ramp grows: B0 %lld must be below B1 %lld", flag, s, (long long)b0,
                       (long long)b1);
    o->global_batch = (int)b1, o->ramp_from = (int)b0, o->ramp_steps = (uint64_t)steps;
    return BB_OK;
}

static const char *const field_names[BB_TRAIN_FIELDS] = {
    [BB_TRAIN_MODEL] = "model",           [BB_TRAIN_RECOMPUTE] = "checkpoint",
    [BB_TRAIN_LOSS_CHUNK] = "loss_chunk", [BB_TRAIN_DATA] = "data",
    [BB_TRAIN_VAL_DATA] = "val_data",     [BB_TRAIN_DEVICES] = "devices",
    [BB_TRAIN_PRECISION] = "precision",   [BB_TRAIN_GLOBAL_BATCH] = "global_batch",
    [BB_TRAIN_MICRO_BATCH] = "micro_batch", [BB_TRAIN_STEPS] = "steps",
    [BB_TRAIN_EPOCHS] = "epochs",         [BB_TRAIN_OPTIMIZER] = "optimizer",
    [BB_TRAIN_LR] = "lr",                 [BB_TRAIN_LR_SCHEDULE] = "lr_schedule",
    [BB_TRAIN_LR_SCALE] = "lr_scale",     [BB_TRAIN_BASE_BATCH] = "base_batch",
    [BB_TRAIN_WARMUP] = "warmup",         [BB_TRAIN_WEIGHT_DECAY] = "weight_decay",
    [BB_TRAIN_MOMENTUM] = "momentum",     [BB_TRAIN_BETA2] = "beta2",
    [BB_TRAIN_TRUST_COEFFICIENT] = "trust_coefficient",
    [BB_TRAIN_GRAD_CLIP] = "grad_clip",   [BB_TRAIN_SEED] = "seed",
    [BB_TRAIN_SHUFFLE_FRAMES] = "shuffle_frames", [BB_TRAIN_INIT_FROM] = "init_from",
    [BB_TRAIN_RESUME] = "resume_dir",         [BB_TRAIN_STOP_AFTER] = "stop_after",
    [BB_TRAIN_KEEP] = "keep",             [BB_TRAIN_SAVE] = "save_dir", [BB_TRAIN_SAVE_EVERY] = "save_every",
    [BB_TRAIN_FORCE] = "force",           [BB_TRAIN_SKIP_NONFINITE] = "skip_nonfinite",
    [BB_TRAIN_METRICS] = "metrics_path",  [BB_TRAIN_TRACE] = "trace_path",
    [BB_TRAIN_LOADER_THREADS] = "loader_threads", [BB_TRAIN_BUCKET_MIB] = "bucket_mib",
    [BB_TRAIN_ZERO] = "zero",             [BB_TRAIN_ZERO_SHARDS] = "zero_shards",
    [BB_TRAIN_ATTENTION] = "attention",
    [BB_TRAIN_DEVICE_MEM] = "device_mem", [BB_TRAIN_NO_OVERLAP] = "no_overlap",
    [BB_TRAIN_OFFLOAD] = "offload",       [BB_TRAIN_HOST_MEM] = "host_mem",
    [BB_TRAIN_LINK_GBPS] = "link_gbps",
};

const char *bb_train_option_name(const bb_train_options *o, bb_train_field f)
{
    const char *name = o && o->field_name ? o->field_name(f) : NULL;
    return name ? name : f >= 0 && f < BB_TRAIN_FIELDS ? field_names[f] : "?";
}

/* ---- --devices -------------------------------------------------------------- */
static bb_status not_a_list(const char *what, const char *s)
{
    return bb_fail(BB_ERR_ARG, "%s: '%s' is not cpu:N, cuda:all or cuda:0,1,... (or cuda:local under mpirun)", what, s);
}

bb_status bb_devices_parse(const char *what, const char *s, bool must_exist, int *count, bb_device_kind *kind,
                           int *ids)
{
    *count = 0;
    *kind = BB_DEVICE_CPU;
    if (!strcmp(s, "cpu")) return *count = 1, ids[0] = 0, BB_OK;
    if (!strncmp(s, "cpu:", 4)) {
        int64_t n;
        BB_TRY(bb_parse_int(what, s + 4, &n));
        if (n < 1 || n > BB_DEVICES_MAX)
            return bb_fail(BB_ERR_ARG, "%s cpu:N needs 1 <= N <= %d", what, BB_DEVICES_MAX);
        for (*count = 0; *count < n; (*count)++) ids[*count] = *count;
        return BB_OK;
    }
    if (strncmp(s, "cuda:", 5) || !s[5]) return not_a_list(what, s);
    bb_cuda_info info;
    bb_cuda_probe(&info);
    *kind = BB_DEVICE_CUDA;
    if (!strcmp(s + 5, "local")) { /* one process per GPU: the GPU of this process's local rank */
        int id = bb_world_get()->local_rank;
        if (must_exist && id >= info.device_count)
            return bb_fail(info.device_count ? BB_ERR_ARG : BB_ERR_UNSUPPORTED, "%s cuda:local: local rank %d, but %s",
                           what, id, info.device_count ? "no such GPU on this machine" : info.reason);
        ids[(*count)++] = id;
        return BB_OK;
    }
    if (!strcmp(s + 5, "all")) {
        if (!info.device_count) return bb_fail(BB_ERR_UNSUPPORTED, "%s cuda:all: no GPU (%s)", what, info.reason);
        for (int d = 0; d < info.device_count && d < BB_DEVICES_MAX; d++) ids[(*count)++] = d;
        return BB_OK;
    }
    for (const char *p = s + 5; *p;) {
        char *end;
        long id = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',') || id < 0 || *count == BB_DEVICES_MAX) return not_a_list(what, s);
        for (int i = 0; i < *count; i++)
            if (ids[i] == id) return bb_fail(BB_ERR_ARG, "%s %s names cuda:%ld twice", what, s, id);
        if (must_exist && id >= info.device_count)
            return bb_fail(info.device_count ? BB_ERR_ARG : BB_ERR_UNSUPPORTED, "%s %s: %s", what, s,
                           info.device_count ? "no such GPU on this machine" : info.reason);
        ids[(*count)++] = (int)id;
        p = *end ? end + 1 : end;
    }
    return BB_OK;
}

/* ---- resuming ------------------------------------------------------------ */
static bool is_set(const bb_train_options *o, bb_train_field f) { return (o->set & BB_TRAIN_SET(f)) != 0; }

/* The checkpoint's devices, kept where it recorded them. */
static bb_status take_devices(const bb_checkpoint_info *ck, bb_train_options *out)
{
    if (!ck->devices[0]) return BB_OK;
    char what[4200];
    snprintf(what, sizeof what, "%s %s (the checkpoint's %s)", bb_train_option_name(out, BB_TRAIN_RESUME),
             out->resume_dir, bb_train_option_name(out, BB_TRAIN_DEVICES));
    return bb_devices_parse(what, ck->devices, true, &out->devices, &out->device, out->device_ids);
}

/* The optimizer and each hyperparameter not set. beta1 and eps have no
 * flag: always the checkpoint's. */
static void take_optimizer(const bb_checkpoint_info *ck, bb_train_options *out)
{
    const bb_optimizer_config *c = &ck->opt;
    bb_optimizer_config *o = &out->opt;
    if (!is_set(out, BB_TRAIN_OPTIMIZER)) o->kind = c->kind;
    if (!is_set(out, BB_TRAIN_LR)) o->lr = c->lr;
    if (!is_set(out, BB_TRAIN_LR_SCALE)) o->lr_scale = c->lr_scale;
    if (!is_set(out, BB_TRAIN_BASE_BATCH)) o->base_batch = c->base_batch;
    if (!is_set(out, BB_TRAIN_LR_SCHEDULE)) o->schedule = c->schedule;
    if (!is_set(out, BB_TRAIN_WARMUP)) o->warmup = c->warmup;
    if (!is_set(out, BB_TRAIN_WEIGHT_DECAY)) o->weight_decay = c->weight_decay;
    if (!is_set(out, BB_TRAIN_MOMENTUM)) o->momentum = c->momentum;
    if (!is_set(out, BB_TRAIN_BETA2)) o->beta2 = c->beta2;
    if (!is_set(out, BB_TRAIN_TRUST_COEFFICIENT)) o->trust_coefficient = c->trust_coefficient;
    if (!is_set(out, BB_TRAIN_GRAD_CLIP)) o->grad_clip = c->grad_clip;
    o->beta1 = c->beta1, o->eps = c->eps;
}

bb_status bb_train_options_resume(const bb_train_options *given, const bb_checkpoint_info *ck, bb_train_options *out)
{
    *out = *given;
    const char *resume = bb_train_option_name(out, BB_TRAIN_RESUME);
    if (is_set(out, BB_TRAIN_SEED))
        return bb_fail(BB_ERR_ARG, "%s with %s: the run goes on with its seed %llu (the data order depends on it)",
                       bb_train_option_name(out, BB_TRAIN_SEED), resume, (unsigned long long)ck->seed);
    if (is_set(out, BB_TRAIN_INIT_FROM))
        return bb_fail(BB_ERR_ARG, "%s with %s: the weights come from the checkpoint",
                       bb_train_option_name(out, BB_TRAIN_INIT_FROM), resume);
    out->seed = ck->seed;
    if (!is_set(out, BB_TRAIN_DATA)) out->data = ck->data;
    if (!is_set(out, BB_TRAIN_VAL_DATA) && !is_set(out, BB_TRAIN_DATA))
        out->val_data = ck->val_data[0] ? ck->val_data : NULL;
    if (!is_set(out, BB_TRAIN_DEVICES)) BB_TRY(take_devices(ck, out));
    if (!is_set(out, BB_TRAIN_PRECISION)) out->precision = ck->model.precision;
    if (!is_set(out, BB_TRAIN_GLOBAL_BATCH))
        out->global_batch = ck->global_batch, out->ramp_from = ck->ramp_from, out->ramp_steps = ck->ramp_steps,
        out->auto_batch = ck->auto_batch;
    if (!is_set(out, BB_TRAIN_MICRO_BATCH) && ck->micro_batch > 0)
        out->micro_batch = ck->micro_batch, out->auto_micro_batch = false;
    if (!is_set(out, BB_TRAIN_STEPS)) /* --epochs replaces the run's --steps */
        out->steps = is_set(out, BB_TRAIN_EPOCHS) ? 0 : ck->total_steps;
    if (!is_set(out, BB_TRAIN_SHUFFLE_FRAMES) && ck->shuffle_frames) out->shuffle_frames = ck->shuffle_frames;
    if (!is_set(out, BB_TRAIN_SAVE)) out->save_dir = ck->root; /* goes on saving where it did */
    if (!is_set(out, BB_TRAIN_KEEP) && ck->keep > 0) out->keep = ck->keep;
    if (!is_set(out, BB_TRAIN_SAVE_EVERY)) out->save_every = ck->save_every;
    take_optimizer(ck, out);
    if (!is_set(out, BB_TRAIN_MODEL)) { /* the checkpoint's model, with a checkpoint policy and loss chunk if set */
        bb_model_config m = ck->model;
        if (is_set(out, BB_TRAIN_RECOMPUTE)) {
            m.recompute_every = out->model.recompute_every;
            memcpy(m.recompute_plan, out->model.recompute_plan, sizeof m.recompute_plan);
        }
        else out->auto_recompute = false;
        m.loss_chunk = is_set(out, BB_TRAIN_LOSS_CHUNK) ? out->model.loss_chunk : 0;
        out->model = m;
    }
    return BB_OK;
}

/* ---- the processes of a job agree ------------------------------------------ */
enum { AGREE_TEXT = 320 }; /* a model of BB_RECOMPUTE_MAX_BLOCKS blocks' plan fits */

typedef struct agreed {
    bb_train_field field;
    char text[AGREE_TEXT];
} agreed;

/* The fields that shape the run, as text; returns how many. */
static int describe(const bb_train_options *o, agreed *a)
{
    int n = 0;
#define FIELD(f, ...) (a[n].field = BB_TRAIN_##f, snprintf(a[n].text, AGREE_TEXT, __VA_ARGS__), n++)
    json_t *m = json_object();
    char *shape = m && bb_model_config_to_json(m, &o->model) == BB_OK ? json_dumps(m, JSON_COMPACT) : NULL;
    FIELD(MODEL, "%s", shape ? shape : "?");
    free(shape);
    json_decref(m);
    const bb_optimizer_config *c = &o->opt;
    FIELD(RECOMPUTE, "%d %s%s", o->model.recompute_every, o->model.recompute_plan, o->auto_recompute ? " (auto)" : "");
    FIELD(LOSS_CHUNK, "%d", o->model.loss_chunk);
    FIELD(PRECISION, "%s", bb_precision_name(o->precision));
    FIELD(ATTENTION, "%s", bb_attention_name(o->attention));
    if (o->ramp_from || o->auto_batch)
        FIELD(GLOBAL_BATCH, "%s:%d..%d (over %llu steps)", o->auto_batch ? "auto" : "ramp", o->ramp_from,
              o->global_batch, (unsigned long long)o->ramp_steps);
    else
        FIELD(GLOBAL_BATCH, "%d", o->global_batch);
    FIELD(MICRO_BATCH, "%d%s", o->micro_batch, o->auto_micro_batch ? " (auto)" : "");
    FIELD(STEPS, "%llu", (unsigned long long)o->steps);
    FIELD(EPOCHS, "%llu", (unsigned long long)o->epochs);
    FIELD(STOP_AFTER, "%llu", (unsigned long long)o->stop_after);
    char own[160] = "";
    const bb_optimizer_desc *desc = bb_optimizer_desc_of(c->kind);
    if (desc) desc->describe(c, own, sizeof own);
    FIELD(OPTIMIZER, "%s (%s)", bb_optimizer_kind_name(c->kind), own);
    FIELD(LR, "%.17g", c->lr);
    FIELD(LR_SCALE, "%s", bb_lr_scale_name(c->lr_scale));
    FIELD(BASE_BATCH, "%d", c->base_batch);
    FIELD(LR_SCHEDULE, "%s", bb_lr_schedule_name(c->schedule));
    FIELD(WARMUP, "%llu", (unsigned long long)c->warmup);
    FIELD(WEIGHT_DECAY, "%.17g", c->weight_decay);
    FIELD(MOMENTUM, "%.17g", c->momentum);
    FIELD(BETA2, "%.17g", c->beta2);
    FIELD(TRUST_COEFFICIENT, "%.17g", c->trust_coefficient);
    FIELD(GRAD_CLIP, "%.17g", c->grad_clip);
    FIELD(SEED, "%llu", (unsigned long long)o->seed);
    /* not asked for: the global shuffle's budget decides the order too */
    FIELD(SHUFFLE_FRAMES, "%u (all frames within %llu bytes: %s)", bb_shuffle_frames_or_default(o->shuffle_frames),
          (unsigned long long)o->shuffle_memory, is_set(o, BB_TRAIN_SHUFFLE_FRAMES) ? "no" : "yes");
    FIELD(ZERO, "%s", o->zero == BB_ZERO_AUTO ? "auto" : (const char *[]){"0", "1", "2", "3"}[o->zero & 3]);
    FIELD(ZERO_SHARDS, "%s", bb_param_shard_rule_name(o->zero_shards));
    FIELD(BUCKET_MIB, "%.17g", o->bucket_mib);
    FIELD(NO_OVERLAP, "%s", o->no_overlap ? "yes" : "no");
    FIELD(SKIP_NONFINITE, "%s", o->skip_nonfinite ? "yes" : "no");
    FIELD(DEVICE_MEM, "%llu", (unsigned long long)o->device_mem);
    FIELD(OFFLOAD, "%s", (const char *[]){"none", "optimizer", "auto"}[o->offload % 3]);
    FIELD(HOST_MEM, "%llu", (unsigned long long)o->host_mem);
    FIELD(LINK_GBPS, "%.17g", o->link_gbps);
    FIELD(SAVE_EVERY, "%llu", (unsigned long long)o->save_every);
    FIELD(INIT_FROM, "%s", o->init_from ? o->init_from : "");
    FIELD(RESUME, "%s", o->resume_dir ? o->resume_dir : "");
#undef FIELD
    return n;
}

bb_status bb_train_options_agree(const bb_train_options *o)
{
    const bb_world *w = bb_world_get();
    if (w->size < 2) return BB_OK;
    agreed mine[BB_TRAIN_FIELDS], first[BB_TRAIN_FIELDS];
    int n = describe(o, mine);
    memcpy(first, mine, sizeof mine);
    BB_TRY(bb_world_broadcast_bytes(first, sizeof first, 0));
    char why[1024] = "";
    size_t len = 0;
    int differ = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(mine[i].text, first[i].text)) continue;
        if (differ++ < 3 && len < sizeof why)
            len += (size_t)snprintf(why + len, sizeof why - len, "%s%s is %s here, %s on rank 0", len ? "; " : "",
                                    bb_train_option_name(o, mine[i].field), mine[i].text, first[i].text);
    }
    bool same;
    BB_TRY(bb_world_all_equal((uint64_t)(differ > 0), &same));
    if (differ)
        return bb_fail(BB_ERR_ARG, "started with other options than rank 0: %s%s: every process of a job must be "
                       "given the same options", why, differ > 3 ? " (and more)" : "");
    if (!same)
        return bb_fail(BB_ERR_ARG, "another process of the job was started with other options (it names them): "
                       "every process of a job must be given the same options");
    return BB_OK;
}
