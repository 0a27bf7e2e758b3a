/* cmd_train.c — `bigbatch train`: flags to bb_train_options, then the run. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bigbatch/backend.h"
#include "bigbatch/report.h"
#include "bigbatch/train.h"
#include "bigbatch/world.h"
#include "commands.h"
#include "model_flags.h"

static const char usage[] =
    "bigbatch train [--model gpt|mlp ...] [--data DIR] [--devices cpu:N] [--global-batch G --micro-batch B]\n"
    "               [--checkpoint none|blocks|every:K] [--steps N | --epochs E] [--save DIR] [--resume DIR] ...";
static const char summary[] =
    "Trains a model with data parallelism over N devices (one worker thread and one full\n"
    "replica each), gradient accumulation (G / (N x B) micro-steps per optimizer step) and\n"
    "optional activation checkpointing. Each device computes the loss of its own records;\n"
    "a reducer averages the gradients bucket by bucket while the backward still runs.\n"
    "--data DIR may be a dataset or a directory with train/ and val/ (or test/) inside;\n"
    "the defaults train the gpt on data/kjv on one CPU device. Ctrl-C finishes the\n"
    "current step, saves when --save is set, and exits with status 130.";

/* The value of --resume in argv, or NULL. */
static const char *resume_arg(int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--")) break;
        if (!strcmp(argv[i], "--resume") && i + 1 < argc) return argv[i + 1];
        if (!strncmp(argv[i], "--resume=", 9)) return argv[i] + 9;
    }
    return NULL;
}

_Static_assert(BB_DEVICES_MAX <= BB_TRAIN_MAX_DEVICES, "--devices lists what the trainer holds");

/* `--report FILE` runs `bigbatch report` on the run's metrics (a temporary
 * file beside FILE when --metrics was not given) and trace, once the run
 * ended or was interrupted; rank 0 writes it. The run's own failure stays
 * the one reported. */
static bb_status train_with_report(bb_train_options *o, const char *report)
{
    char tmp[4200] = "";
    if (report && !o->metrics_path) {
        snprintf(tmp, sizeof tmp, "%s.metrics-%d.jsonl", report, (int)getpid());
        o->metrics_path = tmp;
    }
    bb_status rc = bb_train_run(o, NULL);
    if (report && bb_world_get()->rank == 0 && (rc == BB_OK || rc == BB_ERR_INTERRUPTED)) {
        bb_report_options ro = {.metrics = o->metrics_path, .trace = o->trace_path, .out = report};
        bb_status wrote = bb_report_write(&ro);
        if (wrote == BB_OK && o->progress) fprintf(o->progress, "train: report written to %s\n", report);
        if (rc == BB_OK) rc = wrote;
        else if (wrote != BB_OK && o->progress) fprintf(o->progress, "train: no report: %s\n", bb_error_message());
    }
    if (tmp[0]) unlink(tmp);
    return rc;
}

int bb_cmd_train(int argc, char **argv)
{
    bb_train_options o;
    bb_train_defaults(&o);
    model_flags mf = MODEL_FLAGS_DEFAULT;
    const char *attention = "auto";
    const char *devices = "cpu:1", *precision = "fp32", *optimizer = "adamw", *schedule = "cosine", *data = "data/kjv", *val = NULL;
    const char *micro_batch = "8", *report = NULL;
    int64_t global_batch = o.global_batch, steps = 0, epochs = 0, warmup = 0,
            seed = (int64_t)o.seed, stop_after = 0, loader_threads = o.loader_threads, eval_every = 0, save_every = 0,
            log_every = (int64_t)o.log_every, keep = o.keep;
    bool no_overlap = false, quiet = false, val_given = false, seed_given = false, init_given = false,
         steps_given = false, epochs_given = false;
    const char *on_nonfinite = "stop", *io = "auto";
    int64_t shuffle_frames = 8, zero = 0;
    /* --resume DIR continues the run as it was: what the checkpoint recorded
     * is the default of every flag not given. */
    bb_checkpoint_info info;
    char micro_text[24];
    const char *resume = resume_arg(argc, argv);
    bool resuming = resume && bb_checkpoint_read_info(resume, &info) == BB_OK;
    if (resuming) {
        data = info.data;
        if (info.val_data[0]) val = info.val_data;
        if (info.devices[0]) devices = info.devices;
        precision = bb_precision_name(info.model.precision);
        global_batch = info.global_batch;
        if (info.micro_batch > 0) {
            snprintf(micro_text, sizeof micro_text, "%d", info.micro_batch);
            micro_batch = micro_text;
        }
        steps = (int64_t)info.total_steps;
        optimizer = bb_optimizer_kind_name(info.opt.kind);
        schedule = info.opt.schedule == BB_LR_CONSTANT ? "constant" : "cosine";
        o.opt = info.opt;
        warmup = (int64_t)info.opt.warmup;
        seed = (int64_t)info.seed;
        if (info.shuffle_frames) shuffle_frames = info.shuffle_frames;
    }
    const bb_opt opts[] = {
        MODEL_FLAG_OPTS(mf),
        {"--data", BB_OPT_STRING, &data, "DIR", "training data: a dataset, or a directory with train/ inside"},
        {"--val-data", BB_OPT_STRING, &val, "DIR", "evaluated every --eval-every steps and at the end (default: "
         "val/ or test/ beside train/)", .given = &val_given},
        {"--devices", BB_OPT_STRING, &devices, "LIST", "cpu:N (N worker threads, the cores divided among "
         "them), cuda:all or cuda:0,1; under mpirun/srun, each process's own (cuda:local: one GPU a process)"},
        {"--precision", BB_OPT_CHOICE, &precision, "P", "fp32, or bf16: gpt activations stored in bf16 (about "
         "half the activation memory) and, on GPUs, matrix products on bf16 tensor cores; weights, gradients "
         "and optimizer state stay fp32", .choices = "fp32|bf16"},
        {"--attention", BB_OPT_CHOICE, &attention, "WHO", "GPUs, bf16: auto (cuDNN's fused attention where it "
         "loads, else bigbatch's kernels after one warning), cudnn (or fail), kernels (bigbatch's always)",
         .choices = "auto|cudnn|kernels"},
        {"--global-batch", BB_OPT_INT, &global_batch, "G", "examples per optimizer step", .min = 1, .max = 1 << 30},
        {"--micro-batch", BB_OPT_STRING, &micro_batch, "B|auto", "examples per device per micro-step (what must "
         "fit in memory); auto: the planner's choice for --device-mem (see bigbatch plan)"},
        {"--steps", BB_OPT_INT, &steps, "N", "optimizer steps, counted from step 0 of the run (also when "
         "resuming)", .min = 1, .max = 1e15, .given = &steps_given},
        {"--stop-after", BB_OPT_INT, &stop_after, "N", "end this run after step N, keeping the schedule of "
         "--steps (for time-boxed jobs; continue with --resume)", .min = 1, .max = 1e15},
        {"--epochs", BB_OPT_INT, &epochs, "E", "passes over the data when --steps is not given (default 1)",
         .min = 1, .max = 1e9, .given = &epochs_given},
        {"--optimizer", BB_OPT_CHOICE, &optimizer, "NAME", "adamw or sgd", .choices = "adamw|sgd"},
        {"--lr", BB_OPT_DOUBLE, &o.opt.lr, "LR", "peak learning rate", .min = 0, .max = 1e3},
        {"--lr-schedule", BB_OPT_CHOICE, &schedule, "KIND", "cosine (down to lr/10 at the last step) or constant",
         .choices = "cosine|constant"},
        {"--warmup", BB_OPT_INT, &warmup, "STEPS", "linear warm-up steps", .min = 0, .max = 1e15},
        {"--weight-decay", BB_OPT_DOUBLE, &o.opt.weight_decay, "WD", "decoupled weight decay on matrices (not "
         "biases, norms)", .min = 0, .max = 1e3},
        {"--momentum", BB_OPT_DOUBLE, &o.opt.momentum, "M", "sgd: momentum", .min = 0, .max = 1},
        {"--beta2", BB_OPT_DOUBLE, &o.opt.beta2, "B2", "adamw: second-moment decay", .min = 0, .max = 1},
        {"--grad-clip", BB_OPT_DOUBLE, &o.opt.grad_clip, "NORM", "clip the global gradient norm; 0: off", .min = 0,
         .max = 1e9},
        {"--on-nonfinite", BB_OPT_CHOICE, &on_nonfinite, "WHAT", "when a step's loss or gradient norm is NaN or "
         "infinite: stop (exit 1 naming the step, its update not applied, nothing of it saved) or skip the step "
         "(counted in the progress line, the metrics and at the end)", .choices = "stop|skip"},
        {"--seed", BB_OPT_INT, &seed, "S", "initialisation and data order", .min = 0, .max = 9.2e18,
         .given = &seed_given},
        {"--loader-threads", BB_OPT_INT, &loader_threads, "N", "threads reading and decompressing shards",
         .min = 1, .max = 256},
        {"--io", BB_OPT_CHOICE, &io, "MODE", "how the loader reads frames: auto (io_uring, else pread), uring or "
         "pread", .choices = "auto|uring|pread"},
        {"--direct", BB_OPT_FLAG, &o.direct, NULL, "read shards with O_DIRECT (bypasses the page cache)"},
        {"--shuffle-frames", BB_OPT_INT, &shuffle_frames, "W", "frames per shuffle window (the data order "
         "depends on it)", .min = 1, .max = 1 << 20},
        {"--bucket-mib", BB_OPT_DOUBLE, &o.bucket_mib, "MIB", "gradient bucket size for the reducer (the first "
         "bucket is 1 MiB, as in PyTorch DDP)", .min = 0.001, .max = 65536},
        {"--no-overlap", BB_OPT_FLAG, &no_overlap, NULL, "all-reduce only after the whole backward (to measure "
         "what overlap gains)"},
        {"--timeout", BB_OPT_DOUBLE, &o.timeout_s, "SECONDS", "end the job, naming the rank and what it waits "
         "in, when no device of a process moved for this long (a peer stopped, stalled or died; must exceed the "
         "longest step, evaluation or save); 0: never (default 600, as PyTorch's collective timeout)",
         .min = 0, .max = 1e9},
        {"--zero", BB_OPT_INT, &zero, "0|1", "1: ZeRO-1, each device keeps the optimizer state of its shard only "
         "(saves (N-1)/N of it on N devices) and the updated weights are gathered", .min = 0, .max = 1},
        {"--eval-every", BB_OPT_INT, &eval_every, "N", "evaluate on --val-data every N steps; 0: at the end only",
         .min = 0, .max = 1e15},
        {"--save", BB_OPT_STRING, &o.save_dir, "DIR", "write checkpoints here (atomically; DIR/latest is the "
         "newest)"},
        {"--save-every", BB_OPT_INT, &save_every, "N", "save every N steps; 0: at the end (and on Ctrl-C) only",
         .min = 0, .max = 1e15},
        {"--keep", BB_OPT_INT, &keep, "N", "keep the newest N checkpoints in --save DIR (older ones are removed "
         "once a newer one is safely written; 2 leaves a fallback if the newest is damaged)", .min = 1, .max = 1e6},
        {"--force", BB_OPT_FLAG, &o.force, NULL, "save into a --save DIR that holds another run's checkpoints "
         "(refused otherwise, unless --resume names it); they count towards --keep"},
        {"--resume", BB_OPT_STRING, &o.resume_dir, "DIR", "continue exactly from DIR's latest checkpoint (or "
         "DIR/step-N): model, data, devices, batch, optimizer, schedule, --steps and seed are the run's unless given"},
        {"--init-from", BB_OPT_STRING, &o.init_from, "FILE", "start from these weights (.safetensors, PyTorch "
         "names)", .given = &init_given},
        {"--metrics", BB_OPT_STRING, &o.metrics_path, "FILE", "one JSON object per step (JSON Lines), after a first "
         "line with the run's configuration"},
        {"--report", BB_OPT_STRING, &report, "FILE", "write `bigbatch report`'s HTML page of the run here when it ends "
         "(also on Ctrl-C); with --trace, its timeline too"},
        {"--trace", BB_OPT_STRING, &o.trace_path, "FILE", "Chrome trace JSON (open in ui.perfetto.dev)"},
        {"--device-mem", BB_OPT_BYTES, &o.device_mem, "BYTES", "cap each device's memory (e.g. 512MiB); 0: none"},
        {"--log-every", BB_OPT_INT, &log_every, "N", "progress line every N steps; 0: only evaluations and the "
         "end", .min = 0, .max = 1e15},
        {"--quiet", BB_OPT_FLAG, &quiet, NULL, "no progress output"},
        {0}};
    bb_status rc = bb_cli_parse("train", opts, argc, argv, NULL);
    if (rc == BB_OK && !strcmp(mf.checkpoint, "auto")) { /* the planner picks the policy */
        o.auto_checkpoint = true;
        mf.checkpoint = "none";
    }
    if (rc == BB_OK && steps_given && epochs_given)
        rc = bb_fail(BB_ERR_ARG, "--steps and --epochs both set the run's length: give one");
    if (rc == BB_OK) rc = model_flags_config(&mf, &o.model);
    if (rc == BB_OK && resuming) {
        if (seed_given)
            rc = bb_fail(BB_ERR_ARG, "--seed with --resume: the run goes on with its seed %llu (the data order "
                         "depends on it)", (unsigned long long)info.seed);
        else if (init_given)
            rc = bb_fail(BB_ERR_ARG, "--init-from with --resume: the weights come from the checkpoint");
        if (!model_flags_shape_given(&mf)) { /* the checkpoint's model, with --checkpoint if given */
            int every = o.model.checkpoint_every;
            o.model = info.model;
            if (mf.checkpoint_given) o.model.checkpoint_every = every;
            if (rc == BB_OK) rc = loss_chunk_flag(&mf, &o.model);
        }
        if (epochs_given && !steps_given) steps = 0; /* --epochs replaces the run's --steps */
    }
    if (rc == BB_OK && !strcmp(micro_batch, "auto")) {
        o.auto_micro_batch = true;
        o.micro_batch = 0;
    } else if (rc == BB_OK) {
        int64_t b;
        rc = bb_parse_int("--micro-batch", micro_batch, &b);
        if (rc == BB_OK && (b < 1 || b > 1 << 24)) rc = bb_fail(BB_ERR_ARG, "--micro-batch must be 1 to %d, or auto", 1 << 24);
        o.micro_batch = (int)b;
    }
    if (rc == BB_OK) rc = devices_flag_parse(devices, true, &o.devices, &o.device, o.device_ids);
    if (rc == BB_OK) rc = bb_precision_parse(precision, &o.precision);
    if (rc == BB_OK) rc = bb_attention_parse(attention, &o.attention);
    if (rc == BB_OK) {
        const char *train = resolve_split(data, "train");
        o.data = train ? train : data;
        o.val_data = val;
        if (!val_given && train) {
            o.val_data = resolve_split(data, "val");
            if (!o.val_data) o.val_data = resolve_split(data, "test");
        }
        o.global_batch = (int)global_batch;
        o.steps = (uint64_t)steps;
        o.stop_after = (uint64_t)stop_after;
        o.epochs = steps ? 0 : epochs ? (uint64_t)epochs : 1;
        o.opt.kind = strcmp(optimizer, "sgd") ? BB_OPTIMIZER_ADAMW : BB_OPTIMIZER_SGD;
        o.opt.schedule = strcmp(schedule, "constant") ? BB_LR_COSINE : BB_LR_CONSTANT;
        o.opt.warmup = (uint64_t)warmup;
        o.seed = (uint64_t)seed;
        o.loader_threads = (int)loader_threads;
        o.no_overlap = no_overlap;
        o.zero = (int)zero;
        o.eval_every = (uint64_t)eval_every;
        o.save_every = (uint64_t)save_every;
        o.keep = (int)keep;
        o.skip_nonfinite = !strcmp(on_nonfinite, "skip");
        o.shuffle_frames = (uint32_t)shuffle_frames;
        rc = bb_io_mode_parse(io, &o.io);
    }
    if (rc == BB_OK) {
        o.log_every = (uint64_t)log_every;
        o.progress = quiet ? NULL : stderr;
        o.interrupted = &bb_cli_interrupted;
        rc = train_with_report(&o, report);
    }
    int code = bb_cli_report(rc, usage, summary, opts);
    bb_cli_free(opts, NULL);
    return code;
}
