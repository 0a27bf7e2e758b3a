/* trainer.c — bb_train_run: checks the options against the data, builds
 * one backend, replica and optimizer per device, the loader, the reducer
 * and the trace, starts the workers and cleans up after them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "bigbatch/plan.h"
#include "bigbatch/tokenizer.h"
#include "bigbatch/world.h"
#include "trainer.h"

/* Field `field` of the options `o` as its messages name it. */
#define NAME(field) bb_train_option_name(o, BB_TRAIN_##field)

/* `devices`: the job's (every process's). */
static bb_status check_split(const bb_train_options *o, int global_batch, int devices, int micro_batch,
                             int *accumulation)
{
    int per_step = devices * micro_batch;
    if (global_batch > 0 && micro_batch > 0 && global_batch % per_step == 0) {
        *accumulation = global_batch / per_step;
        return BB_OK;
    }
    char valid[512] = "";
    size_t len = 0;
    for (int b = 1; b <= global_batch / devices && len + 16 < sizeof valid; b++)
        if (global_batch % (devices * b) == 0) len += (size_t)snprintf(valid + len, sizeof valid - len, "%s%d", len ? ", " : "", b);
    if (!len) { /* no micro-batch helps: the global batch must change */
        int below = global_batch / devices * devices, above = below + devices;
        return bb_fail(BB_ERR_ARG,
                       "%s %d does not split over %d devices: it must be a multiple of %d (e.g. %d)",
                       NAME(GLOBAL_BATCH), global_batch, devices, devices, below ? below : above);
    }
    return bb_fail(BB_ERR_ARG,
                   "%s %d is not a whole number of micro-batches of %d on %d device%s; valid %s values: %s",
                   NAME(GLOBAL_BATCH), global_batch, micro_batch, devices, devices > 1 ? "s" : "", NAME(MICRO_BATCH),
                   valid);
}

/* Checks the checkpoint resumed from against the options (those it did
 * not supply, bb_train_options_resume); the run continues at its step. */
static bb_status check_resume(trainer *t, const bb_checkpoint_info *info)
{
    const bb_train_options *o = t->o;
    char want[160], have[160];
    bb_model_describe(&t->cfg, want, sizeof want);
    bb_model_describe(&info->model, have, sizeof have);
    if (!bb_model_same_shape(&t->cfg, &info->model))
        return bb_fail(BB_ERR_ARG, "%s %s: the checkpoint holds a %s, the options ask for a %s", NAME(RESUME),
                       o->resume_dir, have, want);
    if (info->global_batch != t->global_batch)
        return bb_fail(BB_ERR_ARG, "%s %s: the checkpoint was trained with %s %d, not %d (the data order and the "
                       "step count depend on it)", NAME(RESUME), o->resume_dir, NAME(GLOBAL_BATCH), info->global_batch,
                       t->global_batch);
    int from = trainer_ramp_from(t);
    if (info->ramp_from != from || info->auto_batch != t->auto_batch ||
        (from && !t->auto_batch && info->ramp_steps != t->ramp_steps))
        return bb_fail(BB_ERR_ARG, "%s %s: the checkpoint was trained with %s from %d over %llu steps, this run asks "
                       "for %s from %d over %llu (B0 0: a fixed batch; the data order depends on it)", NAME(RESUME),
                       o->resume_dir, info->auto_batch ? "an auto batch" : "a batch ramp", info->ramp_from,
                       (unsigned long long)info->ramp_steps, t->auto_batch ? "an auto batch" : "a batch ramp", from,
                       (unsigned long long)t->ramp_steps);
    if (info->opt.kind != o->opt.kind)
        return bb_fail(BB_ERR_ARG, "%s %s: the checkpoint's optimizer is %s, not %s", NAME(RESUME), o->resume_dir,
                       bb_optimizer_kind_name(info->opt.kind), bb_optimizer_kind_name(o->opt.kind));
    /* Hyperparameters may change on purpose; say that the run is no longer exact. */
    const bb_optimizer_config *a = &o->opt, *b = &info->opt;
    static const bb_train_field fields[] = {BB_TRAIN_LR, BB_TRAIN_LR_SCALE, BB_TRAIN_BASE_BATCH, BB_TRAIN_WARMUP,
                                            BB_TRAIN_LR_SCHEDULE, BB_TRAIN_WEIGHT_DECAY, BB_TRAIN_GRAD_CLIP};
    bool differ[] = {a->lr != b->lr, a->lr_scale != b->lr_scale,
                     a->lr_scale != BB_LR_SCALE_NONE && a->base_batch != b->base_batch, a->warmup != b->warmup,
                     a->schedule != b->schedule, a->weight_decay != b->weight_decay, a->grad_clip != b->grad_clip};
    for (size_t i = 0; i < sizeof differ / sizeof *differ; i++)
        if (differ[i])
            BB_WARN("%s: %s differs from the checkpoint's; the run continues, but not as the saved run would have",
                    NAME(RESUME), bb_train_option_name(o, fields[i]));
    const bb_optimizer_desc *desc = bb_optimizer_desc_of(a->kind);
    char mine[160], then[160];
    desc->describe(a, mine, sizeof mine), desc->describe(b, then, sizeof then);
    if (strcmp(mine, then))
        BB_WARN("%s: %s's %s differ from the checkpoint's %s; the run continues, but not as the saved run would have",
                NAME(RESUME), desc->title, mine, then);
    if (info->model.precision != t->cfg.precision)
        BB_WARN("%s: the checkpoint's run used %s %s, this one %s: the run continues, but not as the saved run would "
                "have", NAME(RESUME), NAME(PRECISION), bb_precision_name(info->model.precision),
                bb_precision_name(t->cfg.precision));
    if (info->total_steps != t->total_steps)
        BB_WARN("%s: the checkpoint's run had %llu steps, this one has %llu: the learning-rate schedule changes",
                NAME(RESUME), (unsigned long long)info->total_steps, (unsigned long long)t->total_steps);
    char identity[24];
    snprintf(identity, sizeof identity, "%016llx", (unsigned long long)t->data_identity);
    bool same_url = info->data_url[0] && o->data_url && !strcmp(info->data_url, o->data_url); /* another cache */
    if (strcmp(info->data, o->data) && !same_url)
        BB_WARN("%s: the checkpoint trained on %s, this run reads %s", NAME(RESUME), info->data, o->data);
    else if (info->data_identity[0] && strcmp(info->data_identity, identity))
        BB_WARN("%s: %s holds other records than when the checkpoint was saved (dataset identity %s then, %s now): "
                "the run continues, but not on the data the saved run would have read", NAME(RESUME), o->data,
                info->data_identity, identity);
    uint32_t frames = t->shuffle_frames, saved = bb_shuffle_frames_or_default(info->shuffle_frames);
    if (frames != saved)
        BB_WARN("%s: the checkpoint's run shuffled windows of %u frames, this one %u: the data order changes",
                NAME(RESUME), saved, frames);
    if (info->step > t->total_steps)
        return bb_fail(BB_ERR_ARG, "%s %s: the checkpoint is at step %llu, past %s %llu", NAME(RESUME), o->resume_dir,
                       (unsigned long long)info->step, NAME(STEPS), (unsigned long long)t->total_steps);
    if (o->stop_after && o->stop_after <= info->step)
        return bb_fail(BB_ERR_ARG, "%s %llu: the checkpoint is already at step %llu", NAME(STOP_AFTER),
                       (unsigned long long)o->stop_after, (unsigned long long)info->step);
    t->first_step = info->step;
    return BB_OK;
}

/* The validation records must be laid out like the training records. */
static bb_status open_val(trainer *t)
{
    const bb_train_options *o = t->o;
    BB_TRY(bb_dataset_open(o->val_data, &t->val));
    const bb_shard_meta *a = bb_dataset_meta(t->data), *b = bb_dataset_meta(t->val);
    if (a->kind != b->kind || a->record_size != b->record_size || a->classes_or_vocab != b->classes_or_vocab)
        return bb_fail(BB_ERR_ARG, "%s %s holds %s records of %u bytes (%u classes or tokens); the training data %s "
                       "holds %s records of %u bytes (%u)", NAME(VAL_DATA), o->val_data, bb_record_kind_name(b->kind),
                       b->record_size, b->classes_or_vocab, o->data, bb_record_kind_name(a->kind), a->record_size,
                       a->classes_or_vocab);
    bb_tokenizer_t *tok; /* its text's bytes per token: val loss in bits per byte too */
    BB_TRY(bb_tokenizer_of_dataset(o->val_data, &tok));
    if (tok && !(t->val_token_bytes = bb_tokenizer_byte_lengths(tok))) BB_WARN("out of memory: no bits per byte");
    bb_tokenizer_destroy(tok);
    return BB_OK;
}

enum { RUN_INPUTS = 6 };
/* What a run reads, which no output may replace or lie inside: its data,
 * validation data and --init-from, and with `resume` (may be NULL) the
 * checkpoint step it continues and the data that recorded. Their count. */
static int run_inputs(const bb_train_options *o, const bb_checkpoint_info *resume, const char *inputs[RUN_INPUTS])
{
    int n = 0;
    const char *all[RUN_INPUTS] = {o->data, o->val_data, o->init_from, resume ? resume->dir : NULL,
                                   resume && resume->data[0] ? resume->data : NULL,
                                   resume && resume->val_data[0] ? resume->val_data : NULL};
    for (int i = 0; i < RUN_INPUTS; i++)
        if (all[i]) inputs[n++] = all[i];
    return n;
}

static bb_status check_run_output(const bb_train_options *o, const bb_checkpoint_info *resume, const char *what,
                                  const char *path, char *resolved, size_t cap)
{
    const char *inputs[RUN_INPUTS];
    return bb_check_output(what, path, inputs, run_inputs(o, resume, inputs), resolved, cap);
}

bb_status bb_train_check_output(const bb_train_options *o, const char *what, const char *path, char *resolved,
                                size_t cap)
{
    bb_checkpoint_info *info = o->resume_dir ? malloc(sizeof *info) : NULL;
    bool resumes = info && bb_checkpoint_read_info(o->resume_dir, info) == BB_OK;
    if (info && !resumes) bb_error_clear(); /* no checkpoint to resume yet: nothing of it to protect */
    bb_status rc = check_run_output(o, resumes ? info : NULL, what, path, resolved, cap);
    free(info);
    return rc;
}

/* Fails now rather than after hours of training: `path` must be a regular
 * file or absent, no input of the run nor inside one (check_run_output;
 * `resolved` gets it through symbolic links) and writable; *created tells
 * whether the probe made the file. */
static bb_status probe_writable(const trainer *t, const char *path, const char *flag, char *resolved, size_t cap,
                                bool *created)
{
    *created = false;
    BB_TRY(check_run_output(t->o, t->resume, flag, path, resolved, cap));
    BB_TRY(bb_make_parents(resolved, NULL)); /* missing directories are made, as for every output */
    *created = access(resolved, F_OK) != 0;
    FILE *f = fopen(resolved, "a");
    if (!f) {
        *created = false;
        return bb_fail_errno(BB_ERR_IO, "%s %s: cannot write", flag, path);
    }
    fclose(f);
    return BB_OK;
}

/* The metrics file's first line: the run's configuration, for `bigbatch
 * report` (rows are the lines with a "step"). */
static bb_status write_run_line(const trainer *t)
{
    const bb_train_options *o = t->o;
    char describe[160], checkpoint[BB_RECOMPUTE_NAME_MAX];
    bb_model_describe(&t->cfg, describe, sizeof describe);
    bb_model_recompute_name(&t->cfg, checkpoint, sizeof checkpoint);
    json_t *run = json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:s, s:i, s:s, s:o, s:s, s:I, "
                            "s:I, s:s, s:s, s:s}", "kind", "train", "model", bb_model_kind_name(t->cfg.kind), "describe",
                            describe, "devices", t->devices_text, "device_count", t->spec.count, "processes",
                            t->spec.world > 1 ? t->spec.world : 1, "global_batch", t->global_batch, "accumulation",
                            t->accumulation, "micro_batch", t->micro_batch, "tokens_per_example",
                            bb_model_targets_are_tokens(&t->cfg) ? bb_model_targets_per_example(&t->cfg) : 1,
                            "checkpoint", checkpoint, "precision", bb_precision_name(t->cfg.precision), "zero",
                            t->zero, "optimizer", bb_optimizer_kind_name(o->opt.kind), "lr", bb_json_real(bb_lr_peak(&t->opt), 7),
                            "lr_scale", bb_lr_scale_name(t->opt.lr_scale), "steps", (json_int_t)t->total_steps, "device_mem", (json_int_t)o->device_mem, "data",
                            o->data, "version", BB_VERSION, "commit", bb_commit());
    if (run && o->data_url) json_object_set_new(run, "data_url", json_string(o->data_url)); /* mirrored from */
    if (run && t->ramp_accumulation)
        json_object_set_new(run, "batch_ramp", json_pack("{s:i, s:I, s:b}", "from",
                                                         trainer_ramp_from(t),
                                                         "steps", (json_int_t)t->ramp_steps, "auto", t->auto_batch));
    json_t *line = run ? json_pack("{s:o}", "run", run) : NULL;
    bb_status rc = bb_json_write_line(t->metrics, line);
    json_decref(line);
    return rc;
}

/* The step of a metrics row of the file being continued; -1 for another line. */
static long long row_step(const char *line)
{
    json_t *row = json_loads(line, 0, NULL);
    json_t *step = json_object_get(row, "step");
    long long n = json_is_integer(step) ? (long long)json_integer_value(step) : -1;
    json_decref(row);
    return n;
}

/* A resumed run's metrics continue the file: rows past the checkpoint's
 * step (from the run that went on after it) are dropped, and the first
 * line is this run's configuration. */
static bb_status open_metrics(trainer *t)
{
    const char *path = t->metrics_path, *flag = bb_train_option_name(t->o, BB_TRAIN_METRICS);
    FILE *old = t->o->resume_dir ? fopen(path, "r") : NULL;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid());
    if (bb_make_parents(path, NULL) != BB_OK) { /* missing directories are made, as for every output */
        if (old) fclose(old);
        return BB_ERR_IO;
    }
    if (!(t->metrics = fopen(old ? tmp : path, "w"))) {
        if (old) fclose(old);
        return bb_fail_errno(BB_ERR_IO, "%s %s: cannot write", flag, path);
    }
    bool ok = write_run_line(t) == BB_OK;
    if (!old) return ok && fflush(t->metrics) == 0 ? BB_OK : bb_fail_errno(BB_ERR_IO, "%s %s: cannot write", flag, path);
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, old) > 0) {
        long long step = row_step(line);
        if (step >= 0 && (uint64_t)step <= t->first_step) fputs(line, t->metrics);
    }
    free(line);
    fclose(old);
    if (!ok || fflush(t->metrics) != 0 || rename(tmp, path) != 0)
        return bb_fail_errno(BB_ERR_IO, "%s %s: cannot write", flag, path);
    return BB_OK;
}

static size_t bucket_bytes(const bb_train_options *o) { return bb_bucket_bytes(o->bucket_mib); }

/* --micro-batch auto / --checkpoint auto: the planner's choice (plan.h). */
static bb_status apply_plan(trainer *t)
{
    const bb_train_options *o = t->o;
    bb_plan_request q = {.model = t->cfg, .devices = trainer_world_devices(t), .global_batch = o->global_batch,
                         .device_mem = o->device_mem, .optimizer = o->opt.kind, .device = o->device,
                         .loader_threads = o->loader_threads, .record_size = bb_dataset_meta(t->data)->record_size,
                         .fixed_micro_batch = o->auto_micro_batch ? 0 : o->micro_batch,
                         .fixed_recompute = !o->auto_recompute,
                         .zero = o->zero, .zero_shards = o->zero_shards, .bucket_mib = o->bucket_mib,
                         .offload = o->offload, .host_mem = o->host_mem, .link_gbps = o->link_gbps,
                         .zero_top = t->spec.world < 2 || o->device != BB_DEVICE_CPU || bb_world_get()->thread_multiple
                                         ? 3 : 2}; /* ZeRO-3's reach (train's refusal below) */
    bb_calibration cal; /* the device kind's op costs, when plan --calibrate cached them */
    if (bb_calibration_cached(o->device, &cal)) q.calibration = &cal;
    bb_plan p;
    BB_TRY(bb_plan_make(&q, &p));
    if (p.chosen < 0) {
        bb_status rc = bb_fail(BB_ERR_OOM, "plan: %s", p.why_nothing_fits);
        bb_plan_free(&p);
        return rc;
    }
    const bb_plan_row *r = &p.rows[p.chosen];
    t->zero = p.zero;
    t->offload = p.offload;
    t->micro_batch = r->micro_batch;
    t->cfg.recompute_every = r->recompute_every;
    memcpy(t->cfg.recompute_plan, r->recompute_plan, sizeof t->cfg.recompute_plan);
    if (o->progress) {
        char peak[24], mem[24];
        fprintf(o->progress, "plan: micro-batch %d x accumulation %d, checkpoint %s, predicted peak %s", r->micro_batch,
                r->accumulation, r->recompute, bb_format_bytes(r->memory.total, peak, sizeof peak));
        if (o->device_mem) fprintf(o->progress, " of %s", bb_format_bytes(o->device_mem, mem, sizeof mem));
        else fprintf(o->progress, " (no --device-mem: the fastest)");
        if (o->zero == BB_ZERO_AUTO || o->offload == BB_OFFLOAD_AUTO)
            fprintf(o->progress, ", --zero %d%s (the lowest stage that fits%s%s)", p.zero,
                    p.offload ? " --offload optimizer" : "", p.why_zero[0] ? ": " : "", p.why_zero);
        fprintf(o->progress, "\n");
    }
    bb_plan_free(&p);
    return BB_OK;
}

/* The optimizer's hyperparameters as the options name them (--beta2). */
static const char *hyperparameter_name(void *ctx, const char *hp)
{
    const bb_train_options *o = ctx;
    static const struct {
        const char *hp;
        bb_train_field field;
    } fields[] = {{"lr", BB_TRAIN_LR}, {"lr_scale", BB_TRAIN_LR_SCALE}, {"base_batch", BB_TRAIN_BASE_BATCH},
                  {"beta2", BB_TRAIN_BETA2}, {"momentum", BB_TRAIN_MOMENTUM},
                  {"trust_coefficient", BB_TRAIN_TRUST_COEFFICIENT}};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        if (!strcmp(hp, fields[i].hp)) return bb_train_option_name(o, fields[i].field);
    return NULL;
}

/* What the options alone can tell is wrong, before anything is opened. */
static bb_status check_options(const bb_train_options *o)
{
    if (o->devices < 1 || o->devices > BB_TRAIN_MAX_DEVICES)
        return bb_fail(BB_ERR_ARG, "%s cpu:N needs 1 <= N <= %d", NAME(DEVICES), BB_TRAIN_MAX_DEVICES);
    if ((o->micro_batch < 1 && !o->auto_micro_batch) || (o->global_batch < 1 && !o->auto_batch))
        return bb_fail(BB_ERR_ARG, "%s and %s must be >= 1", NAME(GLOBAL_BATCH), NAME(MICRO_BATCH));
    if (o->auto_batch && !o->global_batch && o->auto_micro_batch)
        return bb_fail(BB_ERR_ARG, "%s auto needs a micro-batch to count in: give auto:B0..B1 with %s auto",
                       NAME(GLOBAL_BATCH), NAME(MICRO_BATCH));
    if (o->ramp_from < 0 || (o->ramp_from && o->ramp_from >= o->global_batch))
        return bb_fail(BB_ERR_ARG, "%s ramp:%d..%d: a ramp grows from B0 >= 1 to a larger B1", NAME(GLOBAL_BATCH),
                       o->ramp_from, o->global_batch);
    if (o->loader_threads < 1) return bb_fail(BB_ERR_ARG, "%s must be >= 1", NAME(LOADER_THREADS));
    if (!(o->bucket_mib > 0)) return bb_fail(BB_ERR_ARG, "%s must be positive", NAME(BUCKET_MIB));
    if (o->zero < 0 || o->zero > BB_ZERO_AUTO)
        return bb_fail(BB_ERR_ARG, "%s %d: 0 (none), 1 (shard the optimizer state), 2 (and the gradients), 3 (and the "
                       "weights) or auto", NAME(ZERO), o->zero);
    if ((o->zero == 2 || o->zero == 3) && o->no_overlap)
        return bb_fail(BB_ERR_ARG, "%s %d frees each gradient bucket once it is reduced, during the backward: it cannot "
                       "run with %s", NAME(ZERO), o->zero, NAME(NO_OVERLAP));
    const bb_optimizer_desc *d = bb_optimizer_desc_of(o->opt.kind);
    if (d && d->shard == BB_PARAM_SHARD_TENSORS && o->zero_shards == BB_PARAM_SHARD_ELEMENTS)
        return bb_fail(BB_ERR_ARG, "%s elements cuts tensors, and %s's step needs each whole (its trust ratio is a "
                       "tensor's): give %s tensors or auto", NAME(ZERO_SHARDS), d->title, NAME(ZERO_SHARDS));
    if (!o->steps && !o->epochs) return bb_fail(BB_ERR_ARG, "give %s N or %s E", NAME(STEPS), NAME(EPOCHS));
    if (o->keep < 1) return bb_fail(BB_ERR_ARG, "%s must be at least 1", NAME(KEEP));
    /* Bounds outside which the optimizer cannot work (it would divide by zero, or diverge). */
    bb_optimizer_names names = {hyperparameter_name, (void *)o};
    return bb_optimizer_check(&o->opt, &names);
}

/* The device spec, its text (as --devices takes it: the progress line and
 * state.json say it so), and the same count in every process. */
static bb_status setup_devices(trainer *t)
{
    const bb_train_options *o = t->o;
    const bb_world *w = bb_world_get();
    t->spec = (bb_device_spec){.kind = o->device, .count = o->devices, .rank = w->rank, .world = w->size};
    for (int d = 0; d < o->devices; d++) t->spec.ids[d] = o->device == BB_DEVICE_CPU ? d : o->device_ids[d];
    bool listed = o->device != BB_DEVICE_CPU;
    int n = listed ? snprintf(t->devices_text, sizeof t->devices_text, "%s:", bb_device_kind_name(o->device))
                   : snprintf(t->devices_text, sizeof t->devices_text, "cpu:%d", o->devices);
    for (int d = 0; listed && d < o->devices && n < (int)sizeof t->devices_text - 12; d++)
        n += snprintf(t->devices_text + n, sizeof t->devices_text - (size_t)n, "%s%d", d ? "," : "", t->spec.ids[d]);
    t->saves = o->save_dir != NULL;
    t->evaluates = o->val_data != NULL;
    if ((o->zero == 2 || o->zero == 3) && o->devices * w->size < 2)
        return bb_fail(BB_ERR_ARG, "%s %d shards the %s among the job's devices, and this job has one: there is "
                       "nothing to shard (train with %s 0, or on more devices)", NAME(ZERO), o->zero,
                       o->zero == 2 ? "gradients" : "weights and gradients", NAME(ZERO));
    if (w->size < 2) return BB_OK;
    BB_TRY(bb_world_broadcast_bytes(&t->saves, sizeof t->saves, 0)); /* rank 0 writes (options_of_rank) */
    BB_TRY(bb_world_broadcast_bytes(&t->evaluates, sizeof t->evaluates, 0)); /* and evaluates */
    bool same; /* before any collective that counts on it (NCCL's ranks) */
    BB_TRY(bb_world_all_equal((uint64_t)o->devices, &same));
    if (!same)
        return bb_fail(BB_ERR_ARG, "%s gives this process %d device%s and another process a different count: every "
                       "process must train on as many", NAME(DEVICES), o->devices, o->devices > 1 ? "s" : "");
    return BB_OK;
}

/* Every process of a job reads the same dataset (wherever it lies). */
static bb_status check_same_data(const trainer *t)
{
    const bb_train_options *o = t->o;
    if (t->spec.world < 2) return BB_OK;
    uint64_t mine = t->data_identity, first = mine;
    bool same;
    BB_TRY(bb_world_broadcast_bytes(&first, sizeof first, 0));
    BB_TRY(bb_world_all_equal(mine != first, &same));
    if (mine != first)
        return bb_fail(BB_ERR_ARG, "%s %s holds other records than rank 0's data (dataset identity %016llx here, "
                       "%016llx on rank 0): every process of a job must train on the same dataset", NAME(DATA),
                       o->data, (unsigned long long)mine, (unsigned long long)first);
    if (!same) return bb_fail(BB_ERR_ARG, "another process of the job reads other data (it names it)");
    return BB_OK;
}

/* The data, the model's configuration from it, the batch split and the
 * run's length. */
static bb_status setup_data(trainer *t)
{
    const bb_train_options *o = t->o;
    t->micro_batch = o->micro_batch;
    t->global_batch = o->global_batch;
    t->opt = o->opt;
    t->opt.batch = t->global_batch;
    t->seed = o->seed;
    BB_TRY(bb_dataset_open(o->data, &t->data));
    t->data_identity = bb_dataset_identity(t->data);
    bb_trainer_choose_order(t);
    if (!bb_tokenizer_file_of_dataset(o->data, t->tokenizer, sizeof t->tokenizer)) t->tokenizer[0] = '\0';
    BB_TRY(check_same_data(t));
    t->cfg = o->model;
    BB_TRY(bb_model_config_from_data(&t->cfg, bb_dataset_format(t->data), o->data));
    t->cfg.precision = o->precision;
    t->zero = o->zero;
    t->offload = o->offload == BB_OFFLOAD_OPTIMIZER;
    if (o->auto_micro_batch || o->auto_recompute || o->zero == BB_ZERO_AUTO || o->offload == BB_OFFLOAD_AUTO)
        BB_TRY(apply_plan(t));
    if (t->zero == 3 && t->spec.world > 1 && t->spec.kind == BB_DEVICE_CPU && !bb_world_get()->thread_multiple)
        return bb_fail(BB_ERR_UNSUPPORTED, "%s 3 over processes on CPU devices gathers on each device's thread, and "
                       "this MPI library gives no MPI_THREAD_MULTIPLE: use %s 2 (which shards the gradients and the "
                       "optimizer state), or an MPI built with thread support", NAME(ZERO), NAME(ZERO));
    t->gather_saves = t->zero && t->spec.world > 1;
    if (o->auto_batch && !o->global_batch) t->global_batch = 64 * trainer_world_devices(t) * t->micro_batch;
    BB_TRY(check_split(o, t->global_batch, trainer_world_devices(t), t->micro_batch, &t->accumulation));
    uint64_t records = bb_dataset_record_count(t->data);
    t->steps_per_epoch = records / (uint64_t)t->global_batch;
    if (!t->steps_per_epoch)
        return bb_fail(BB_ERR_ARG, "%s holds %llu records, fewer than one %s of %d", o->data,
                       (unsigned long long)records, NAME(GLOBAL_BATCH), t->global_batch);
    t->total_steps = o->steps ? o->steps : o->epochs * t->steps_per_epoch;
    return o->ramp_from || o->auto_batch ? bb_trainer_setup_ramp(t, records) : BB_OK;
}

static bb_status setup(trainer *t)
{
    const bb_train_options *o = t->o;
    BB_TRY(check_options(o));
    BB_TRY(bb_train_options_agree(o)); /* before anything depends on them */
    BB_TRY(setup_devices(t));
    BB_TRY(setup_data(t));
    if (t->resume) BB_TRY(check_resume(t, t->resume));
    if (t->resume) t->noise = t->resume->noise;
    if (t->resume && t->first_step == t->total_steps) { /* a finished run: nothing to pretend */
        t->finished = true;
        return BB_OK;
    }
    if (o->val_data) BB_TRY(open_val(t));
    const char *inputs[RUN_INPUTS]; /* --save never writes into what the run reads */
    for (int i = 0, n = o->save_dir ? run_inputs(o, t->resume, inputs) : 0; i < n; i++)
        if (bb_path_inside(o->save_dir, inputs[i]))
            return bb_fail(BB_ERR_IO, "%s %s is inside %s, which the run reads: its checkpoints would change it; "
                           "nothing written", NAME(SAVE), o->save_dir, inputs[i]);
    if (o->save_dir)
        BB_TRY(bb_checkpoint_prepare(o, t->resume ? t->resume->root : NULL, &t->save_dir_created, &t->save_lock));
    if (o->trace_path)
        BB_TRY(probe_writable(t, o->trace_path, NAME(TRACE), t->trace_path, sizeof t->trace_path,
                              &t->trace_created));
    if (o->metrics_path) /* opened (and created) once the run is set up */
        BB_TRY(check_run_output(o, t->resume, NAME(METRICS), o->metrics_path, t->metrics_path,
                                sizeof t->metrics_path));
    int D = t->spec.count;
    if (o->timeout_s > 0 && (D > 1 || t->spec.world > 1)) { /* before NCCL's set-up, which waits for every rank */
        for (int d = 0; d < D; d++) {
            snprintf(t->device_names[d], sizeof t->device_names[d], "%s:%d", bb_device_kind_name(t->spec.kind),
                     t->spec.ids[d]);
            t->device_name_of[d] = t->device_names[d];
        }
        BB_TRY(bb_watchdog_start(&(bb_watchdog_options){.timeout_s = o->timeout_s, .devices = D,
                                                        .device_names = t->device_name_of},
                                 &t->watchdog));
    }
    BB_TRY(bb_trainer_build_replicas(t, t->resume));
    if (o->trace_path) {
        BB_TRY(bb_trace_create(D + 1, &t->trace));
        for (int d = 0; d < D; d++) {
            char name[48];
            int n = t->spec.world > 1 ? snprintf(name, sizeof name, "rank %d ", t->spec.rank) : 0;
            snprintf(name + n, sizeof name - (size_t)n, "worker %d (%s:%d)", d, bb_device_kind_name(t->spec.kind),
                     t->spec.ids[d]);
            bb_trace_name_track(t->trace, d, name);
        }
        char name[32] = "reducer";
        if (t->spec.world > 1) snprintf(name, sizeof name, "rank %d reducer", t->spec.rank);
        bb_trace_name_track(t->trace, D, name);
    }
    bb_backend_t *be[BB_TRAIN_MAX_DEVICES];
    float *grads[BB_TRAIN_MAX_DEVICES], *params[BB_TRAIN_MAX_DEVICES], *shard_grads[BB_TRAIN_MAX_DEVICES],
        *shard_params[BB_TRAIN_MAX_DEVICES];
    bb_model_t *models[BB_TRAIN_MAX_DEVICES];
    for (int d = 0; d < D; d++) {
        be[d] = t->replicas[d].be;
        models[d] = t->replicas[d].model;
        grads[d] = bb_model_grads(t->replicas[d].model);
        params[d] = bb_model_params(t->replicas[d].model);
        shard_grads[d] = t->replicas[d].opt.grads;
        shard_params[d] = t->replicas[d].opt.params;
    }
    reducer_args ra = {.spec = &t->spec, .model = t->replicas[0].model, .be = be, .grads = grads, .params = params,
                       .bucket_bytes = bucket_bytes(o), .shards = t->zero ? &t->shards : NULL,
                       .window_models = t->zero >= 2 ? models : NULL, .shard_grads = shard_grads,
                       .shard_params = t->zero == 3 ? shard_params : NULL,
                       .accumulation = t->accumulation,
                       .first_step = t->first_step,
                       .trace = t->trace, .track = D, .watchdog = t->watchdog, .timeout_s = o->timeout_s};
    BB_TRY(bb_reducer_create(&ra, &t->reducer));
    if (o->metrics_path) BB_TRY(open_metrics(t));
    return bb_trainer_start_loader(t);
}

/* "optimizer lamb, lr 0.001 x 4096/256 = 0.016 (--lr-scale linear from
 * --base-batch 256), warm-up 100 steps, cosine to a tenth, clip 1". */
static void print_optimizer(const trainer *t, FILE *p)
{
    const bb_train_options *o = t->o;
    const bb_optimizer_config *c = &t->opt;
    fprintf(p, "\ntrain: optimizer %s, lr %g", bb_optimizer_kind_name(c->kind), c->lr);
    if (c->lr_scale != BB_LR_SCALE_NONE)
        fprintf(p, " x %s%d/%d%s = %g (%s %s from %s %d)", c->lr_scale == BB_LR_SCALE_SQRT ? "sqrt(" : "", c->batch,
                c->base_batch, c->lr_scale == BB_LR_SCALE_SQRT ? ")" : "", bb_lr_peak(c), NAME(LR_SCALE),
                bb_lr_scale_name(c->lr_scale), NAME(BASE_BATCH), c->base_batch);
    if (c->warmup) fprintf(p, ", warm-up %llu step%s", (unsigned long long)c->warmup, c->warmup > 1 ? "s" : "");
    fprintf(p, ", %s", c->schedule == BB_LR_COSINE ? "cosine to a tenth" : "constant");
    if (c->grad_clip > 0) fprintf(p, ", clip %g", c->grad_clip);
}

static void print_start(const trainer *t)
{
    FILE *p = t->o->progress;
    if (!p) return;
    char model[160], params[24];
    bb_model_describe(&t->cfg, model, sizeof model);
    size_t n = bb_model_param_count(t->replicas[0].model);
    snprintf(params, sizeof params, n >= 1000000 ? "%.2fM" : "%.1fk", n >= 1000000 ? n / 1e6 : n / 1e3);
    fprintf(p, "train: %s, %s parameters, on %s", model, params, t->devices_text);
    if (t->spec.world > 1) fprintf(p, " in each of %d processes", t->spec.world);
    fprintf(p, "\ntrain: global batch ");
    int from = trainer_ramp_from(t);
    if (t->auto_batch)
        fprintf(p, "from %d, following the noise scale (in whole micro-steps, never shrinking), at most ", from);
    else if (t->ramp_accumulation)
        fprintf(p, "%d..%d over %llu steps (linear, in whole micro-steps), then ", from, t->global_batch,
                (unsigned long long)t->ramp_steps);
    fprintf(p, "%d = %d device%s x %d micro-step%s x %d; %llu step%s (%llu per epoch%s), steps %llu..%llu",
            t->global_batch, trainer_world_devices(t), trainer_world_devices(t) > 1 ? "s" : "", t->accumulation,
            t->accumulation > 1 ? "s" : "",
            t->micro_batch, (unsigned long long)t->total_steps, t->total_steps > 1 ? "s" : "",
            (unsigned long long)t->steps_per_epoch, t->ramp_accumulation ? " at the last batch" : "",
            (unsigned long long)t->first_step + 1, (unsigned long long)t->total_steps);
    if (t->reducer)
        fprintf(p, "; %d gradient bucket%s%s", bb_reducer_bucket_count(t->reducer), bb_reducer_bucket_count(t->reducer) > 1 ? "s" : "",
                t->o->no_overlap ? ", no overlap" : "");
    static const char *const sharded[] = {"", "the optimizer state", "the optimizer state and the gradients",
                                          "the optimizer state, the gradients and the weights"};
    if (t->zero) fprintf(p, "; ZeRO-%d: %s sharded over %d devices", t->zero, sharded[t->zero], trainer_world_devices(t));
    if (t->offload) {
        char bytes[24];
        fprintf(p, "; optimizer offloaded: %s of host memory a device, its step on the host",
                bb_format_bytes(bb_optimizer_offload_bytes(&t->replicas[0].opt), bytes, sizeof bytes));
    }
    print_optimizer(t, p);
    char act[24];
    fprintf(p, "\ntrain: data %s (%s); activations %s per device%s", t->o->data, bb_loader_io_description(t->loader),
            bb_format_bytes(bb_model_activation_bytes(t->replicas[0].model), act, sizeof act),
            t->cfg.precision == BB_PRECISION_BF16 ? " (bf16)" : "");
    uint32_t frames = bb_sampler_frame_count_of(t->data);
    if (t->shuffle_frames >= frames)
        fprintf(p, "\ntrain: order: one shuffle of every record (%u frames)", frames);
    else
        fprintf(p, "\ntrain: order: shuffled in %s windows of about %u frames (%u frames)",
                t->order == BB_ORDER_BALANCED ? "balanced" : "fixed", t->shuffle_frames, frames);
    if (t->order != BB_ORDER_CURRENT) fprintf(p, ", order version %u (the checkpoint's)", t->order);
    bb_backend_t *be = t->replicas[0].be;
    if (t->cfg.precision == BB_PRECISION_BF16) fprintf(p, "; products: %s", bb_backend_bf16_products(be));
    if (!bb_backend_host_is_device(be)) fprintf(p, "; attention: %s", bb_backend_attention_engine(be));
    fputc('\n', p);
    fflush(p);
}

static bb_status run_workers(trainer *t)
{
    const bb_train_options *o = t->o;
    pthread_t threads[BB_TRAIN_MAX_DEVICES];
    int started = 0;
    t->run_start_ns = t->last_step_end_ns = bb_clock_ns();
    for (int d = 0; d < t->spec.count; d++) {
        int err = pthread_create(&threads[d], NULL, bb_trainer_worker_main, &t->replicas[d]);
        if (err) {
            bb_fail(BB_ERR_INTERNAL, "cannot start worker %d: error %d", d, err);
            bb_trainer_fail(t, BB_ERR_INTERNAL);
            break;
        }
        started++;
    }
    for (int d = 0; d < started; d++) pthread_join(threads[d], NULL);
    bb_watchdog_stand_down(t->watchdog); /* every worker is done: nothing waits for a peer now */
    t->result->seconds = (double)(bb_clock_ns() - t->run_start_ns) / 1e9;
    if (t->fail_status != BB_OK) return bb_fail(t->fail_status, "%s", t->fail_message);
    /* Work still queued on a device (a GPU's last kernels) must not fail
     * unseen: the run succeeds only if every device finished cleanly. */
    for (int d = 0; d < t->spec.count; d++) BB_TRY(bb_backend_synchronize(t->replicas[d].be));
    const bb_train_result *r = t->result;
    unsigned long long step = (unsigned long long)r->steps_done;
    if (!r->interrupted) return BB_OK;
    if (!r->preempted || !r->saved)
        return bb_fail(BB_ERR_INTERRUPTED, "%s after step %llu%s%s", r->preempted ? "preempted" : "interrupted", step,
                       r->saved ? ", saved in " : ", nothing saved", r->saved && o->save_dir ? o->save_dir : "");
    if (!o->save_dir) return bb_fail(BB_ERR_INTERRUPTED, "preempted after step %llu, saved by rank 0", step);
    return bb_fail(BB_ERR_INTERRUPTED, "preempted: saved step %llu to %s; continue with: bigbatch train %s %s", step,
                   o->save_dir, NAME(RESUME), o->save_dir);
}

static void teardown(trainer *t)
{
    bb_loader_destroy(t->loader);
    bb_reducer_destroy(t->reducer); /* it unhooks itself from the watchdog */
    t->reducer = NULL;
    bb_watchdog_stop(t->watchdog);
    for (int d = 0; d < t->spec.count; d++) {
        replica *r = &t->replicas[d];
        if (r->be) bb_optimizer_destroy(r->be, &r->opt);
        bb_model_destroy(r->model);
        bb_backend_destroy(r->be);
        bb_backend_destroy(r->host);
    }
    bb_param_shards_free(&t->shards);
    bb_trace_destroy(t->trace);
    if (t->metrics) fclose(t->metrics);
    bb_dataset_close(t->data);
    bb_dataset_close(t->val);
    free(t->val_token_bytes);
    pthread_mutex_destroy(&t->fail_lock);
    pthread_mutex_destroy(&t->barrier.lock);
    pthread_cond_destroy(&t->barrier.cond);
}

/* A job of several processes: rank 0 reports, evaluates and saves; every
 * rank may trace, rank r > 0 into FILE.rankR.EXT. */
static void options_of_rank(const bb_train_options *o, int rank, bb_train_options *mine, char *trace, size_t cap)
{
    *mine = *o;
    if (!rank) return;
    mine->progress = NULL;
    mine->metrics_path = mine->save_dir = mine->val_data = NULL;
    if (!o->trace_path) return;
    const char *dot = strrchr(o->trace_path, '.'), *slash = strrchr(o->trace_path, '/');
    if (!dot || (slash && dot < slash)) dot = o->trace_path + strlen(o->trace_path);
    snprintf(trace, cap, "%.*s.rank%d%s", (int)(dot - o->trace_path), o->trace_path, rank, dot);
    mine->trace_path = trace;
}

/* Every rank ends with the same parameters, bitwise: checked by their hash. */
static bb_status check_ranks_agree(const trainer *t, const float *params, size_t count)
{
    if (t->spec.world < 2) return BB_OK;
    uint64_t h = XXH64(params, count * sizeof *params, 0);
    bool same;
    BB_TRY(bb_world_all_equal(h, &same));
    if (!same) return bb_fail(BB_ERR_INTERNAL, "rank %d: the processes ended with different parameters", t->spec.rank);
    if (t->o->progress)
        fprintf(t->o->progress, "train: the %d processes' parameters are identical (xxh64 %016llx)\n", t->spec.world,
                (unsigned long long)h);
    return BB_OK;
}

bb_status bb_train_run(const bb_train_options *options, bb_train_result *result)
{
    /* A resumed run's options: those the caller chose, the checkpoint's
     * for the rest (the same for the library as for the command line). */
    bb_train_options resumed = *options, mine;
    bb_checkpoint_info *resume = NULL;
    if (options->resume_dir && bb_checkpoint_none_yet(options->resume_dir)) {
        /* a job script's --resume on its first run: the run starts, saving there */
        if (!resumed.save_dir) resumed.save_dir = options->resume_dir;
        resumed.resume_dir = NULL;
        if (options->progress && bb_world_get()->rank == 0)
            fprintf(options->progress, "train: %s %s holds no checkpoint yet: starting the run, saving into %s\n",
                    bb_train_option_name(options, BB_TRAIN_RESUME), options->resume_dir, resumed.save_dir);
    } else if (options->resume_dir) {
        resume = malloc(sizeof *resume);
        bb_status rc = resume ? bb_checkpoint_read_info(options->resume_dir, resume)
                              : bb_fail(BB_ERR_NOMEM, "out of memory");
        if (rc == BB_OK) rc = bb_train_options_resume(options, resume, &resumed);
        if (rc != BB_OK) {
            free(resume);
            return rc;
        }
    }
    char trace[4200];
    options_of_rank(&resumed, bb_world_get()->rank, &mine, trace, sizeof trace);
    const bb_train_options *o = &mine;
    bb_train_result local;
    bb_train_result *r = result ? result : &local;
    memset(r, 0, sizeof *r);
    r->val_loss = r->val_accuracy = r->noise_scale = NAN;
    trainer *t = calloc(1, sizeof *t);
    if (!t) {
        free(resume);
        return bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    t->o = o;
    t->resume = resume;
    t->save_lock = -1;
    t->result = r;
    t->tty = o->progress && isatty(fileno(o->progress));
    pthread_mutex_init(&t->fail_lock, NULL);
    pthread_mutex_init(&t->barrier.lock, NULL);
    pthread_cond_init(&t->barrier.cond, NULL);
    t->barrier.parties = o->devices;
    bb_status rc;
    BB_TRY_GOTO(setup(t), rc, done);
    r->devices = t->spec.count;
    r->first_step = r->steps_done = t->first_step;
    if (t->finished) {
        if (o->progress)
            fprintf(o->progress, "train: %s %s: already at step %llu of %llu; nothing to train\n", NAME(RESUME),
                    o->resume_dir,
                    (unsigned long long)t->first_step, (unsigned long long)t->total_steps);
        goto done;
    }
    print_start(t);
    rc = run_workers(t);
    if (t->skipped && o->progress)
        fprintf(o->progress, "train: skipped %llu step%s whose loss or gradient norm was not finite "
                "(--on-nonfinite skip)\n", (unsigned long long)t->skipped, t->skipped > 1 ? "s" : "");
    if (t->trace) {
        /* The run's own failure (a save's, say) stays the one reported. */
        char first[1024];
        snprintf(first, sizeof first, "%s", bb_error_message());
        bb_status trc = bb_trace_write(t->trace, t->trace_path);
        if (rc == BB_OK) rc = trc;
        else if (trc != BB_OK) bb_fail(rc, "%s", first);
        if (trc == BB_OK) t->trace_created = false; /* written: it stays */
    }
    for (int d = 0; d < t->spec.count; d++) r->peak_bytes[d] = bb_backend_peak_bytes(t->replicas[d].be);
    r->param_count = bb_model_param_count(t->replicas[0].model);
    /* A failed run returns no weights rather than possibly wrong ones (an
     * interrupted run's are those of its last step). */
    if (rc == BB_OK || rc == BB_ERR_INTERRUPTED) {
        bb_status copied;
        if (t->zero == 3) {
            copied = bb_trainer_whole_weights(t, &r->params);
        } else {
            r->params = malloc(r->param_count * sizeof *r->params);
            copied = !r->params ? bb_fail(BB_ERR_NOMEM, "out of memory")
                                : bb_backend_copy(t->replicas[0].be, r->params, bb_model_params(t->replicas[0].model),
                                                  r->param_count * sizeof *r->params, BB_COPY_D2H);
        }
        if (copied != BB_OK) {
            free(r->params);
            r->params = NULL;
            rc = copied;
        }
        if (rc == BB_OK) rc = check_ranks_agree(t, r->params, r->param_count);
    }
done:;
    /* nothing half-made stays behind; checkpoints always do */
    bool failed = rc != BB_OK && rc != BB_ERR_INTERRUPTED, unused_dir = failed && t->save_dir_created && !t->saved;
    if (failed && t->trace_created) unlink(t->trace_path);
    bb_checkpoint_unlock(t->save_lock, o->save_dir, unused_dir);
    if (unused_dir) rmdir(o->save_dir); /* only if empty */
    teardown(t);
    free(t);
    free(resume);
    if (r == &local) bb_train_result_free(r);
    return rc;
}

void bb_train_result_free(bb_train_result *r)
{
    if (!r) return;
    free(r->losses);
    free(r->params);
    r->losses = NULL;
    r->params = NULL;
}
