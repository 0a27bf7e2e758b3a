/* cmd_train.c — `bigbatch train`: flags to bb_train_options, then the run. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bigbatch/backend.h"
#include "bigbatch/report.h"
#include "bigbatch/train.h"
#include "bigbatch/world.h"
#include "commands.h"
#include "data_flags.h"
#include "model_flags.h"

static const char usage[] =
    "bigbatch train [--model gpt|llama|mlp ...] [--data DIR] [--devices cpu:N] [--global-batch G --micro-batch B]\n"
    "               [--checkpoint none|blocks|every:K] [--steps N | --epochs E] [--save DIR] [--resume DIR] ...";
static const char summary[] =
    "Trains a model with data parallelism over N devices (one worker thread and one full\n"
    "replica each), gradient accumulation (G / (N x B) micro-steps per optimizer step) and\n"
    "optional activation checkpointing. Each device computes the loss of its own records;\n"
    "a reducer averages the gradients bucket by bucket while the backward still runs.\n"
    "--data DIR may be a dataset or a directory with train/ and val/ (or test/) inside;\n"
    "the defaults train the gpt on data/kjv on one CPU device.\n\n"
    "Stopping: Ctrl-C finishes the current step, saves when --save is set and exits 130.\n"
    "SIGTERM or SIGUSR1 (a scheduler's preemption, e.g. Slurm's --signal=USR1@120) does the\n"
    "same and exits 75 (EX_TEMPFAIL): requeue the job with --resume DIR. Under mpirun or\n"
    "srun a signal to any one rank stops every rank after the same step, with one checkpoint.\n"
    "A second signal exits at once (130); the previous checkpoint stays whole. --resume DIR\n"
    "of a directory that holds no checkpoint yet starts the run there, so a job script can\n"
    "always pass it.";

_Static_assert(BB_DEVICES_MAX <= BB_TRAIN_MAX_DEVICES, "--devices lists what the trainer holds");

/* `--report FILE` runs `bigbatch report` on the run's metrics (a temporary
 * file beside FILE when --metrics was not given) and trace, once the run
 * ended or was interrupted; rank 0 writes it. The run's own failure stays
 * the one reported. */
static bb_status train_with_report(bb_train_options *o, const char *report, bb_train_result *result)
{
    char tmp[4200] = "", resolved[4096];
    int tracked = -1;
    if (report) BB_TRY(bb_train_check_output(o, "--report", report, resolved, sizeof resolved)); /* before the work */
    if (report && !o->metrics_path) {
        snprintf(tmp, sizeof tmp, "%s.metrics-%d.jsonl", report, (int)getpid());
        o->metrics_path = tmp;
        tracked = bb_temp_track(tmp); /* a second signal removes it */
    }
    bb_status rc = bb_train_run(o, result);
    if (report && bb_world_get()->rank == 0 && (rc == BB_OK || rc == BB_ERR_INTERRUPTED)) {
        bb_report_options ro = {.metrics = o->metrics_path, .trace = o->trace_path, .out = report,
                                .out_name = "--report"}; /* after a Ctrl-C too: that one was for training */
        bb_status wrote = bb_report_write(&ro);
        if (wrote == BB_OK && o->progress) fprintf(o->progress, "train: report written to %s\n", report);
        if (rc == BB_OK) rc = wrote;
        else if (wrote != BB_OK && o->progress) fprintf(o->progress, "train: no report: %s\n", bb_error_message());
    }
    if (tmp[0]) unlink(tmp);
    bb_temp_untrack(tracked);
    return rc;
}

/* The flags that are not a field of bb_train_options, and which fields
 * were given: given[f] for BB_TRAIN_* field f (bb_train_options.set). */
typedef struct train_flags {
    model_flags mf;
    data_flags df;                      /* --data as a URL */
    char resumed_url[2][4096];          /* --resume alone: the run's data URLs (state.json) */
    char split_url[4096];               /* the URL of the split taken as validation data */
    const char *devices, *data, *global_batch, *micro_batch, *report;
    bool quiet, given[BB_TRAIN_FIELDS];
    int on_nonfinite; /* 0: stop, 1: skip */
} train_flags;

/* The flag that names each field in messages: the option row whose
 * `given` is given[f] (filled by train_table), the model's own rows. */
static const char *flag_of[BB_TRAIN_FIELDS] = {
    [BB_TRAIN_MODEL] = "--model", [BB_TRAIN_RECOMPUTE] = "--checkpoint", [BB_TRAIN_LOSS_CHUNK] = "--loss-chunk",
    [BB_TRAIN_SKIP_NONFINITE] = "--on-nonfinite skip", [BB_TRAIN_ATTENTION] = "--attention",
    [BB_TRAIN_DEVICE_MEM] = "--device-mem", [BB_TRAIN_NO_OVERLAP] = "--no-overlap"};
static const char *flag_name(bb_train_field f) { return f >= 0 && f < BB_TRAIN_FIELDS ? flag_of[f] : NULL; }

#define GIVEN(field) .given = &f->given[BB_TRAIN_##field]
enum { TRAIN_OPTS = 72 };

/* train's option table into opts (TRAIN_OPTS rows at most, ending in {0}). */
static void train_table(train_flags *f, bb_train_options *o, bb_opt *opts)
{
    const bb_opt rows[] = {
        MODEL_FLAG_OPTS(f->mf),
        {"--data", BB_OPT_STRING, &f->data, "DIR|URL", "training data: a dataset, or a directory with train/ inside; "
         "or the same in object storage (s3://bucket/prefix/) or on a web server (https://...), mirrored into "
         "--cache-dir, the training shards while training reads them", GIVEN(DATA)},
        DATA_FLAGS_OPTS(f->df),
        DATA_FLAGS_WAIT_OPT(f->df),
        {"--val-data", BB_OPT_STRING, &o->val_data, "DIR|URL", "evaluated every --eval-every steps and at the end "
         "(default: val/ or test/ beside train/)", GIVEN(VAL_DATA)},
        DEVICES_FLAG_OPT(f->devices, &f->given[BB_TRAIN_DEVICES]),
        PRECISION_FLAG_OPT(o->precision, &f->given[BB_TRAIN_PRECISION]),
        ATTENTION_FLAG_OPT(o->attention),
        {"--global-batch", BB_OPT_STRING, &f->global_batch, "G|ramp:B0..B1[:STEPS]|auto[:B0..B1]", "examples per "
         "optimizer step (default 64); ramp: from B0 to B1 linearly over the first STEPS steps (default: all of "
         "--steps), then B1; auto: from B0 (default: one micro-batch on every device, two on one device) the batch "
         "follows the measured noise scale B_simple, never shrinking, up to B1 (default: 64 micro-steps). Both "
         "move in whole micro-steps of --micro-batch on every device; the data order stays the positions' order "
         "(a resume is exact); not with --zero 2 or 3", GIVEN(GLOBAL_BATCH)},
        {"--micro-batch", BB_OPT_STRING, &f->micro_batch, "B|auto", "examples per device per micro-step (what must "
         "fit in memory); auto: the planner's choice for --device-mem (see bigbatch plan)", GIVEN(MICRO_BATCH)},
        {"--steps", BB_OPT_U64, &o->steps, "N", "optimizer steps, counted from step 0 of the run (also when "
         "resuming)", .min = 1, .max = 1e15, GIVEN(STEPS)},
        {"--stop-after", BB_OPT_U64, &o->stop_after, "N", "end this run after step N, keeping the schedule of "
         "--steps (for time-boxed jobs; continue with --resume)", .min = 1, .max = 1e15, GIVEN(STOP_AFTER)},
        {"--epochs", BB_OPT_U64, &o->epochs, "E", "passes over the data when --steps is not given (default 1)",
         .min = 1, .max = 1e9, GIVEN(EPOCHS)},
        OPTIMIZER_FLAG_OPT(o->opt.kind, &f->given[BB_TRAIN_OPTIMIZER]),
        {"--lr", BB_OPT_DOUBLE, &o->opt.lr, "LR", "peak learning rate (with --lr-scale: at --base-batch)", .min = 0,
         .max = 1e3, GIVEN(LR)},
        {"--lr-scale", BB_OPT_ENUM, &o->opt.lr_scale, "RULE", "scale --lr from --base-batch to --global-batch: "
         "linear (lr x G/B0, Goyal et al.; pair it with --warmup) or sqrt (lr x sqrt(G/B0)); the banner prints the "
         "rate it gives", .choices = "none|linear|sqrt", GIVEN(LR_SCALE)},
        {"--base-batch", BB_OPT_I32, &o->opt.base_batch, "B0", "the global batch --lr was tuned for (--lr-scale)",
         .min = 1, .max = 1 << 30, GIVEN(BASE_BATCH)},
        {"--lr-schedule", BB_OPT_ENUM, &o->opt.schedule, "KIND", "cosine (down to lr/10 at the last step) or "
         "constant", .choices = "cosine|constant", GIVEN(LR_SCHEDULE)},
        {"--warmup", BB_OPT_U64, &o->opt.warmup, "STEPS", "linear warm-up steps", .min = 0, .max = 1e15,
         GIVEN(WARMUP)},
        {"--weight-decay", BB_OPT_DOUBLE, &o->opt.weight_decay, "WD", "decoupled weight decay on matrices (not "
         "biases, norms)", .min = 0, .max = 1e3, GIVEN(WEIGHT_DECAY)},
        {"--momentum", BB_OPT_DOUBLE, &o->opt.momentum, "M", "sgd, lars, muon: momentum (default 0.9; muon's 0.95)", .min = 0, .max = 1,
         GIVEN(MOMENTUM)},
        {"--beta2", BB_OPT_DOUBLE, &o->opt.beta2, "B2", "adamw, lamb, muon's AdamW part: second-moment decay", .min = 0, .max = 1,
         GIVEN(BETA2)},
        {"--trust-coefficient", BB_OPT_DOUBLE, &o->opt.trust_coefficient, "ETA", "lars: the trust ratio's factor "
         "(default 0.001, the paper's)", .min = 0, .max = 1, GIVEN(TRUST_COEFFICIENT)},
        {"--grad-clip", BB_OPT_DOUBLE, &o->opt.grad_clip, "NORM", "clip the global gradient norm; 0: off", .min = 0,
         .max = 1e9, GIVEN(GRAD_CLIP)},
        {"--on-nonfinite", BB_OPT_ENUM, &f->on_nonfinite, "WHAT", "when a step's loss or gradient norm is NaN or "
         "infinite: stop (exit 1 naming the step, its update not applied, nothing of it saved) or skip the step "
         "(counted in the progress line, the metrics and at the end)", .choices = "stop|skip"},
        {"--seed", BB_OPT_U64, &o->seed, "S", "initialisation and data order", .min = 0, .max = 9.2e18, GIVEN(SEED)},
        {"--shuffle-memory", BB_OPT_BYTES, &o->shuffle_memory, "BYTES", "without --shuffle-frames, shuffle every "
         "record of the epoch together (one window of every frame) when the decompressed data fits this much host "
         "memory, which the loader then holds (default 1GiB)"},
        LOADER_FLAG_OPTS(o->loader_threads, o->io, o->direct, o->shuffle_frames,
                         &f->given[BB_TRAIN_LOADER_THREADS], &f->given[BB_TRAIN_SHUFFLE_FRAMES]),
        {"--no-overlap", BB_OPT_FLAG, &o->no_overlap, NULL, "all-reduce only after the whole backward (to measure "
         "what overlap gains)"},
        {"--timeout", BB_OPT_DOUBLE, &o->timeout_s, "SECONDS", "end the job, naming the rank and what it waits "
         "in, when no device of a process moved for this long (a peer stopped, stalled or died; must exceed the "
         "longest step, evaluation or save); 0: never (default 600, as PyTorch's collective timeout)",
         .min = 0, .max = 1e9},
        MEMORY_FLAG_OPTS(o->device_mem, o->zero, o->zero_shards, o->bucket_mib, o->offload, o->host_mem,
                         o->link_gbps, &f->given[BB_TRAIN_ZERO],
                         &f->given[BB_TRAIN_ZERO_SHARDS], &f->given[BB_TRAIN_BUCKET_MIB]),
        {"--eval-every", BB_OPT_U64, &o->eval_every, "N", "evaluate on --val-data every N steps; 0: at the end only",
         .min = 0, .max = 1e15},
        {"--save", BB_OPT_STRING, &o->save_dir, "DIR", "write checkpoints here (atomically; DIR/latest is the "
         "newest)", GIVEN(SAVE)},
        {"--save-every", BB_OPT_U64, &o->save_every, "N", "save every N steps; 0: at the end (and on Ctrl-C) only",
         .min = 0, .max = 1e15, GIVEN(SAVE_EVERY)},
        {"--keep", BB_OPT_I32, &o->keep, "N", "keep the newest N checkpoints in --save DIR (older ones are removed "
         "once a newer one is safely written; 2 leaves a fallback if the newest is damaged)", .min = 1, .max = 1e6,
         GIVEN(KEEP)},
        {"--force", BB_OPT_FLAG, &o->force, NULL, "save into a --save DIR that holds another run's checkpoints "
         "(refused otherwise, unless --resume names it); they count towards --keep", GIVEN(FORCE)},
        {"--resume", BB_OPT_STRING, &o->resume_dir, "DIR", "continue exactly from DIR's latest checkpoint (or "
         "DIR/step-N): model, data, devices, batch, optimizer, schedule, --steps and seed are the run's unless given, "
         "and it goes on saving into DIR with the run's --keep and --save-every unless --save is given",
         GIVEN(RESUME)},
        {"--init-from", BB_OPT_STRING, &o->init_from, "PATH", "start from these weights: a .safetensors file "
         "(PyTorch names), or a transformers GPT2LMHeadModel or LlamaForCausalLM directory (config.json and "
         "model.safetensors or its shards), whose "
         "config.json gives the shape", GIVEN(INIT_FROM)},
        {"--metrics", BB_OPT_STRING, &o->metrics_path, "FILE", "one JSON object per step (JSON Lines), after a "
         "first line with the run's configuration", GIVEN(METRICS)},
        {"--report", BB_OPT_STRING, &f->report, "FILE", "write `bigbatch report`'s HTML page of the run here when it "
         "ends (also on Ctrl-C); with --trace, its timeline too"},
        {"--trace", BB_OPT_STRING, &o->trace_path, "FILE", "Chrome trace JSON (open in ui.perfetto.dev)",
         GIVEN(TRACE)},
        {"--log-every", BB_OPT_U64, &o->log_every, "N", "progress line every N steps; 0: only evaluations and the "
         "end", .min = 0, .max = 1e15},
        {"--quiet", BB_OPT_FLAG, &f->quiet, NULL, "no progress output"},
        {0}};
    _Static_assert(sizeof rows / sizeof *rows <= TRAIN_OPTS, "room for train's table");
    memcpy(opts, rows, sizeof rows);
    for (const bb_opt *r = opts; r->name; r++)
        if (r->given >= f->given && r->given < f->given + BB_TRAIN_FIELDS) flag_of[r->given - f->given] = r->name;
}
#undef GIVEN

/* --resume DIR without --data: when the run read remote data, its URLs
 * (mirrored again: this node's cache may not hold them, or lie elsewhere).
 * A checkpoint that cannot be read is left to the resume itself to report. */
static void resumed_urls(train_flags *f, bb_train_options *o)
{
    bb_checkpoint_info *info = malloc(sizeof *info);
    if (info && bb_checkpoint_read_info(o->resume_dir, info) == BB_OK) {
        if (info->data_url[0]) {
            snprintf(f->resumed_url[0], sizeof f->resumed_url[0], "%s", info->data_url);
            f->data = f->resumed_url[0];
            f->given[BB_TRAIN_DATA] = true;
        }
        if (info->val_data_url[0] && !f->given[BB_TRAIN_VAL_DATA]) {
            snprintf(f->resumed_url[1], sizeof f->resumed_url[1], "%s", info->val_data_url);
            o->val_data = f->resumed_url[1];
            f->given[BB_TRAIN_VAL_DATA] = true;
        }
    }
    bb_error_clear();
    free(info);
}

/* The flags into the options: the model, the data's splits, the batch,
 * the devices, and which fields were given (o->set). */
static bb_status apply_flags(train_flags *f, bb_train_options *o)
{
    model_flags *mf = &f->mf;
    if (!strcmp(mf->checkpoint, "auto")) { /* the planner picks the policy */
        o->auto_recompute = true;
        mf->checkpoint = "none";
    }
    if (f->given[BB_TRAIN_STEPS] && f->given[BB_TRAIN_EPOCHS])
        return bb_fail(BB_ERR_ARG, "--steps and --epochs both set the run's length: give one");
    BB_TRY(model_flags_config(mf, &o->model));
    if (o->init_from && bb_model_is_hf_dir(o->init_from)) BB_TRY(model_flags_hf_shape(mf, o->init_from, &o->model));
    f->given[BB_TRAIN_MODEL] = model_flags_shape_given(mf);
    f->given[BB_TRAIN_RECOMPUTE] = mf->checkpoint_given;
    f->given[BB_TRAIN_LOSS_CHUNK] = mf->loss_chunk_given;
    if (f->global_batch) BB_TRY(bb_train_parse_global_batch("--global-batch", f->global_batch, o));
    if (!strcmp(f->micro_batch, "auto")) {
        o->auto_micro_batch = true;
        o->micro_batch = 0;
    } else {
        int64_t b;
        BB_TRY(bb_parse_int("--micro-batch", f->micro_batch, &b));
        if (b < 1 || b > 1 << 24) return bb_fail(BB_ERR_ARG, "--micro-batch must be 1 to %d, or auto", 1 << 24);
        o->micro_batch = (int)b;
    }
    BB_TRY(devices_flag_parse(f->devices, true, &o->devices, &o->device, o->device_ids));
    if (o->resume_dir && !f->given[BB_TRAIN_DATA]) resumed_urls(f, o);
    o->data_url = bb_remote_is_url(f->data) ? f->data : NULL; /* recorded as given: train/ is found again */
    o->val_data_url = bb_remote_is_url(o->val_data) ? o->val_data : NULL;
    /* the validation URL first: a stream holds its mirror's lock, and waiting for another mirror's lock
     * while holding it could wait on a job that waits on this one */
    BB_TRY(data_flags_resolve(&f->df, &o->val_data, false));
    BB_TRY(data_flags_resolve(&f->df, &f->data, true));
    BB_TRY(default_data_present(f->data, f->given[BB_TRAIN_DATA] || o->resume_dir)); /* resumed: the run's data */
    const char *train = resolve_split(f->data, "train");
    o->data = train ? train : f->data;
    if (!f->given[BB_TRAIN_VAL_DATA] && train) { /* the data's own: chosen with it */
        const char *split = "val";
        o->val_data = resolve_split(f->data, split);
        if (!o->val_data) o->val_data = resolve_split(f->data, split = "test");
        f->given[BB_TRAIN_VAL_DATA] = f->given[BB_TRAIN_DATA];
        if (o->val_data && o->data_url) { /* recorded as the split's own URL: eval --ckpt, a resume elsewhere */
            size_t n = strlen(o->data_url);
            snprintf(f->split_url, sizeof f->split_url, "%s%s%s/", o->data_url, n && o->data_url[n - 1] == '/' ? "" : "/",
                     split);
            o->val_data_url = f->split_url;
        }
    }
    if (f->given[BB_TRAIN_STEPS]) o->epochs = 0;
    o->opt.eps = bb_optimizer_defaults_for(o->opt.kind).eps; /* no flag: the optimizer's (LAMB's 1e-6) */
    if (!f->given[BB_TRAIN_MOMENTUM]) o->opt.momentum = bb_optimizer_defaults_for(o->opt.kind).momentum; /* Muon's 0.95 */
    o->skip_nonfinite = f->on_nonfinite == 1;
    for (int i = 0; i < BB_TRAIN_FIELDS; i++)
        if (f->given[i]) o->set |= BB_TRAIN_SET(i);
    o->progress = f->quiet ? NULL : stderr;
    o->interrupted = &bb_cli_interrupted;
    o->field_name = flag_name;
    return BB_OK;
}

int bb_cmd_train(int argc, char **argv)
{
    bb_train_options o;
    bb_train_defaults(&o);
    /* --resume DIR continues the run as it was: the library takes what the
     * checkpoint recorded for every field not given (bb_train_options_resume). */
    train_flags f = {.mf = MODEL_FLAGS_DEFAULT, .df = DATA_FLAGS_DEFAULT, .devices = "cpu:1", .data = "data/kjv", .micro_batch = "8"};
    bb_opt opts[TRAIN_OPTS];
    train_table(&f, &o, opts);
    bb_status rc = bb_cli_parse("train", opts, argc, argv, NULL);
    if (rc == BB_OK) rc = apply_flags(&f, &o);
    bb_train_result r = {0};
    if (rc == BB_OK) rc = train_with_report(&o, f.report, &r);
    int code;
    if (rc == BB_ERR_INTERRUPTED && r.preempted) { /* rank 0 says how to continue; every rank exits 75 */
        if (bb_world_get()->rank == 0) fprintf(stderr, "bigbatch: %s\n", bb_error_message());
        code = BB_EXIT_PREEMPTED;
    } else {
        code = bb_cli_report(rc, usage, summary, opts);
    }
    data_flags_close(&f.df); /* after the report: what it says is the run's */
    bb_train_result_free(&r);
    bb_cli_free(opts, NULL);
    return code;
}

_Static_assert(sizeof(bb_precision) == sizeof(int) && sizeof(bb_attention) == sizeof(int) &&
                   sizeof(bb_optimizer_kind) == sizeof(int) && sizeof(bb_lr_schedule) == sizeof(int) &&
                   sizeof(bb_io_mode) == sizeof(int) && sizeof(bb_param_shard_rule) == sizeof(int),
               "BB_OPT_ENUM stores an int");
