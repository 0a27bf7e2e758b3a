/* train.h — the trainer: one worker thread per device, each with a full
 * replica of the model, gradient accumulation, a reducer that all-reduces
 * gradient buckets while the backward still runs, the optimizer step,
 * evaluation, metrics, a Chrome trace, and training checkpoints that save
 * and resume exactly.
 *
 * How to use:
 *   bb_train_options o;
 *   bb_train_defaults(&o);                       // gpt on data/kjv, cpu:1
 *   o.devices = 2; o.global_batch = 64; o.micro_batch = 8;   // accumulation 4
 *   o.steps = 100; o.save_dir = "ckpt";
 *   bb_train_result r = {0};
 *   bb_status rc = bb_train_run(&o, &r);         // BB_ERR_INTERRUPTED after Ctrl-C
 *   bb_train_result_free(&r);
 *
 *   bb_train_defaults(&o);                       // continue that run: the checkpoint supplies
 *   o.resume_dir = "ckpt";                       // every field not in o.set (bb_train_options_resume)
 *   rc = bb_train_run(&o, NULL);
 *
 * Step s (0-based) takes records [s·G, (s+1)·G) of its epoch's order (see
 * loader.h); device d's micro-step k takes micro_batch of them. Each device
 * computes its loss over its own records normalised by its share (A·b
 * examples, times T tokens for gpt), and the reducer averages the gradients
 * over the devices, so every split of G gives the same step up to the
 * order of float sums. Besides the gradients only the step's loss and the
 * decision to stop cross devices, through the reducer.
 *
 * A checkpoint directory holds `latest` (a symbolic link) and the step
 * directory it names, `step-NNNNNNNN/` with model.safetensors (the weights
 * under PyTorch names), optimizer.bin (moments, checksummed) and state.json
 * (step, epoch, sampler position, seed, model, optimizer and data config).
 * A step directory is complete on disk (fsync) before `latest` is switched
 * to it by a rename, so a kill at any moment leaves the previous checkpoint
 * loadable. A run keeps its newest `keep` step directories, and refuses a
 * save_dir that holds another run's checkpoints unless it resumes from it
 * or `force` is set. A run that fails removes what it created and did not
 * fill (an empty save_dir, an unwritten trace).
 */
#ifndef BIGBATCH_TRAIN_H
#define BIGBATCH_TRAIN_H

#include <signal.h>

#include "bigbatch/loader.h"
#include "bigbatch/model.h"
#include "bigbatch/optim.h"

#define BB_TRAIN_MAX_DEVICES BB_DEVICES_MAX

/* The fields of bb_train_options that messages name and a checkpoint may
 * supply: bit BB_TRAIN_SET(f) of bb_train_options.set says the caller
 * chose field f (a resumed run keeps the checkpoint's for the others). */
typedef enum bb_train_field {
    BB_TRAIN_MODEL,          /* model: kind and shape */
    BB_TRAIN_RECOMPUTE,     /* model.recompute_every (or auto_recompute) */
    BB_TRAIN_LOSS_CHUNK,     /* model.loss_chunk */
    BB_TRAIN_DATA, BB_TRAIN_VAL_DATA, BB_TRAIN_DEVICES, BB_TRAIN_PRECISION, BB_TRAIN_GLOBAL_BATCH,
    BB_TRAIN_MICRO_BATCH, BB_TRAIN_STEPS, BB_TRAIN_EPOCHS, BB_TRAIN_OPTIMIZER, BB_TRAIN_LR, BB_TRAIN_LR_SCALE,
    BB_TRAIN_BASE_BATCH, BB_TRAIN_LR_SCHEDULE,
    BB_TRAIN_WARMUP, BB_TRAIN_WEIGHT_DECAY, BB_TRAIN_MOMENTUM, BB_TRAIN_BETA2, BB_TRAIN_TRUST_COEFFICIENT, BB_TRAIN_GRAD_CLIP,
    BB_TRAIN_SEED,
    BB_TRAIN_SHUFFLE_FRAMES, BB_TRAIN_INIT_FROM, BB_TRAIN_SAVE, BB_TRAIN_KEEP, BB_TRAIN_SAVE_EVERY,
    /* named in messages only */
    BB_TRAIN_RESUME, BB_TRAIN_STOP_AFTER, BB_TRAIN_FORCE, BB_TRAIN_SKIP_NONFINITE,
    BB_TRAIN_METRICS, BB_TRAIN_TRACE,
    BB_TRAIN_LOADER_THREADS, BB_TRAIN_BUCKET_MIB, BB_TRAIN_ZERO, BB_TRAIN_ZERO_SHARDS, BB_TRAIN_ATTENTION,
    BB_TRAIN_DEVICE_MEM, BB_TRAIN_NO_OVERLAP, BB_TRAIN_OFFLOAD, BB_TRAIN_HOST_MEM,
    BB_TRAIN_LINK_GBPS,
    BB_TRAIN_FIELDS
} bb_train_field;
#define BB_TRAIN_SET(f) (UINT64_C(1) << (f))

typedef struct bb_train_options {
    /* the model: kind and shape flags; seq_len/vocab (gpt) and
     * inputs/classes (mlp) are taken from the data when 0 */
    bb_model_config model;
    const char *data;          /* training dataset directory */
    const char *val_data;      /* evaluated every eval_every steps and at the end; NULL: none */
    const char *data_url;      /* the URL (remote.h) that data (and val_data, its split) was mirrored from; NULL:
                                * local. Recorded: a resume on a node without the cache fetches it again */
    const char *val_data_url;  /* the same for a val_data given on its own */
    int devices;               /* worker threads: CPU virtual devices, or GPUs */
    bb_device_kind device;     /* BB_DEVICE_CUDA: GPUs device_ids[0..devices); CPU: virtual devices */
    int device_ids[BB_TRAIN_MAX_DEVICES];
    bb_precision precision;    /* bf16: gpt activations kept in bf16; on GPUs also bf16 products */
    bb_attention attention;    /* GPUs, bf16: cuDNN's fused attention or bigbatch's kernels (backend.h) */
    int global_batch, micro_batch; /* accumulation = G / (devices * micro_batch) */
    int ramp_from;             /* --global-batch ramp:B0..B1[:STEPS]: the global batch grows linearly from
                                  ramp_from (B0) to global_batch (B1) over the first ramp_steps steps (0: all
                                  of --steps), in whole micro-steps; the data order stays a function of
                                  (seed, position); 0: a fixed batch */
    uint64_t ramp_steps;
    bool auto_batch;           /* --global-batch auto[:B0..B1]: from ramp_from the batch follows the measured
                                  noise scale B_simple (in whole micro-steps, never shrinking) up to
                                  global_batch; ramp_steps unused */
    bool auto_micro_batch;     /* --micro-batch auto: the planner picks it (plan.h) */
    bool auto_recompute;      /* --checkpoint auto: the planner picks model.recompute_every */
    uint64_t steps;            /* run ends after step `steps`; 0: use epochs */
    uint64_t epochs;           /* when steps is 0 */
    uint64_t stop_after;       /* end this run after this step, the schedule still
                                  spanning `steps` (time-boxed jobs); 0: none */
    bb_optimizer_config opt;
    uint64_t seed;             /* initialisation and data order */
    int loader_threads;
    bb_io_mode io;             /* how the loader reads frames (loader.h) */
    bool direct;               /* O_DIRECT reads */
    uint32_t shuffle_frames;   /* frames per shuffle window; 0: the loader's default (8); not chosen (set) by
                                  a new run: one window, a global shuffle, when the decompressed dataset fits
                                  shuffle_memory */
    uint64_t shuffle_memory;   /* bytes the loader may hold for a global shuffle (default 1 GiB) */
    uint32_t order;            /* the data order's version (loader.h, BB_ORDER_*); 0: the current one; a
                                  resume takes its checkpoint's */
    double bucket_mib;         /* reducer bucket size (the first one is 1 MiB, as DDP) */
    bool no_overlap;           /* all-reduce after the whole backward, for comparison */
    double timeout_s;          /* the job ends (one line, exit 1) when no device of a process has moved
                                  for this long: a peer stopped, stalled or died (watchdog.h); 0: never */
    int zero;                  /* 1: ZeRO-1, each device keeps and updates the optimizer state of its
                                  shard of every bucket, and the updated weights are gathered; 2: ZeRO-2,
                                  the gradients too (each micro-step reduced into the shards); 3: ZeRO-3,
                                  the weights too (gathered bucket by bucket ahead of use); 0: none;
                                  BB_ZERO_AUTO (plan.h): the lowest stage at which the planner fits */
    bb_param_shard_rule zero_shards; /* how ZeRO cuts the buckets (optim.h): the optimizer's rule, or one given */
    bb_offload offload;        /* BB_OFFLOAD_OPTIMIZER: the optimizer state and master weights in pinned host
                                  memory, the step on the host (optim.h: bb_optimizer_create_offloaded) */
    uint64_t host_mem;         /* per device: the host bytes offload may pin; 0: no cap */
    double link_gbps;          /* the host link's GB/s the planner prices activation offload with (--checkpoint
                                  auto); 0: the calibration's measure (plan.h: bb_plan_request.link_gbps) */
    uint64_t eval_every, save_every, log_every;
    const char *save_dir, *resume_dir, *init_from, *metrics_path, *trace_path;
    int keep;                  /* step directories kept in save_dir, the newest (default 2) */
    bool skip_nonfinite;       /* a step whose loss or gradient norm is not finite is skipped
                                  (counted), not the end of the run (BB_ERR_NONFINITE) */
    bool force;                /* save into a save_dir that holds another run's checkpoints */
    uint64_t device_mem;       /* per-device cap in bytes; 0: none */
    uint64_t set;              /* BB_TRAIN_SET bits: the fields chosen (see bb_train_options_resume) */
    /* How messages name field f ("--global-batch" on the command line);
     * NULL, or NULL returned: the field's name ("global_batch"). */
    const char *(*field_name)(bb_train_field f);
    FILE *progress;            /* progress lines (in place on a TTY); NULL: quiet */
    volatile sig_atomic_t *interrupted; /* a bb_stop_request: finish the step, save, stop (any rank's
                                           request stops every rank at the same step boundary) */
} bb_train_options;

/* What *bb_train_options.interrupted holds: nothing asked, Ctrl-C, or a
 * scheduler's preemption (SIGTERM, or Slurm's --signal=USR1@N): both
 * finish the step, save and stop; a preempted run says so
 * (bb_train_result.preempted), for a job script to requeue. */
typedef enum bb_stop_request { BB_STOP_NONE = 0, BB_STOP_INTERRUPT = 1, BB_STOP_PREEMPT = 2 } bb_stop_request;

void bb_train_defaults(bb_train_options *o);
/* --global-batch's value (named `flag` in messages): G,
 * ramp:B0..B1[:STEPS] (1 <= B0 < B1; STEPS >= 1, absent: the whole run,
 * ramp_steps 0), or auto[:B0..B1] (the batch follows the noise scale from
 * B0 to at most B1; plain auto: B0 0 and B1 0, which the trainer reads as
 * two micro-steps of the micro-batch on every device and 64), into
 * o->global_batch, o->ramp_from, o->ramp_steps and o->auto_batch. Fails
 * with BB_ERR_ARG naming the flag and what is wrong. */
bb_status bb_train_parse_global_batch(const char *flag, const char *s, bb_train_options *o);
/* Field f as o's messages name it (o->field_name, else "global_batch"). */
const char *bb_train_option_name(const bb_train_options *o, bb_train_field f);
/* A device list, as --devices takes it: cpu (one device), cpu:N (N CPU
 * devices), cuda:all (every GPU here), cuda:0,1 (those GPUs), cuda:local
 * (under mpirun/srun, one process per GPU: the GPU numbered as this
 * process's rank on its machine). `must_exist`: the GPUs must be on this
 * machine (a planner counts hypothetical ones, and needs real ones only for
 * cuda:all). Sets *count, *kind and ids[0..count) (at most BB_DEVICES_MAX).
 * Fails with BB_ERR_ARG naming `what` (e.g. "--devices"), BB_ERR_UNSUPPORTED
 * when a needed GPU is missing (saying why). */
bb_status bb_devices_parse(const char *what, const char *s, bool must_exist, int *count, bb_device_kind *kind,
                           int *ids);

/* ---- the gradient noise scale ----------------------------------------------
 * B_simple = tr(Σ) / |G|² (McCandlish et al., arXiv 1812.06162): the batch
 * past which a larger one stops paying, estimated for free from the squared
 * norms of gradients at two batch sizes (their Appendix A.1): |G_small|²
 * of a B_small-example gradient (each device's before the reduction; on
 * one device, the first micro-step's) and |G_big|² of the step's reduced
 * B_big-example one, since E|G_B|² = |G|² + tr(Σ)/B:
 *   |G|²  ≈ (B_big |G_big|² − B_small |G_small|²) / (B_big − B_small)
 *   tr(Σ) ≈ (|G_small|² − |G_big|²) / (1/B_small − 1/B_big)
 * each a noisy estimate, averaged (exponential moving averages of decay
 * BB_NOISE_EMA; the ratio of two averages started together needs no bias
 * correction) before the ratio. */
#define BB_NOISE_EMA 0.99
typedef struct bb_noise_scale {
    double g2, trace; /* the averages of |G|² and tr(Σ) */
    uint64_t steps;   /* the steps added */
} bb_noise_scale;
/* Adds one step's norms (squared) at batch sizes b_small < b_big; a step
 * whose norms are not finite, or whose sizes are not two, is left out
 * (returns false). Never fails. */
bool bb_noise_scale_add(bb_noise_scale *n, double small_sq, double b_small, double big_sq, double b_big);
/* B_simple in examples; NaN until a step was added, or while either
 * average is not positive (too few steps: a noise too large to see the
 * gradient through, or too small to see). Never fails. */
double bb_noise_scale_value(const bb_noise_scale *n);

typedef struct bb_train_result {
    uint64_t first_step, steps_done; /* steps_done counts from 0, like --steps */
    double *losses;            /* (steps_done - first_step) per-step mean losses */
    float *params;             /* device 0's final parameters (param_count floats) */
    size_t param_count;
    int devices;
    uint64_t peak_bytes[BB_TRAIN_MAX_DEVICES]; /* allocator peak per device */
    double val_loss, val_accuracy; /* last evaluation; NaN when none (accuracy: mlp) */
    double noise_scale;        /* B_simple after the last step (bb_noise_scale_value); NaN when not measured */
    double seconds;            /* wall time of the training loop */
    uint64_t skipped_steps;    /* non-finite steps skipped (skip_nonfinite) */
    bool interrupted;          /* stopped as asked (o->interrupted, on any rank) */
    bool preempted;            /* ... by a preemption (BB_STOP_PREEMPT on any rank) */
    bool saved;                /* a checkpoint of steps_done is in the save directory */
} bb_train_result;

/* Trains as configured. Fails with BB_ERR_ARG on bad options (the message
 * lists valid micro-batch sizes when G does not split), a checkpoint that
 * conflicts with the options, BB_ERR_OOM when a device's memory (or
 * --device-mem) is too small, BB_ERR_NONFINITE when a step's loss or
 * gradient norm is NaN or infinite (named; that step's update is not
 * applied and nothing of it is saved) unless skip_nonfinite, BB_ERR_INTERRUPTED after a stop request (the
 * step finished and, with save_dir, saved; result->preempted tells a preemption, and the message
 * then says how to continue), and the loader's errors (e.g. a
 * corrupt shard). `result` (may be NULL) is filled as far as the run went. */
bb_status bb_train_run(const bb_train_options *o, bb_train_result *result);
/* Checks an output of the run (--trace, --metrics, --report) against what it
 * reads: the data, the validation data, the weights it starts from and the
 * checkpoint step it resumes (bb_check_output: not one of them, nor inside
 * one); `resolved` (cap bytes) gets the path to write. Fails with BB_ERR_IO,
 * one line naming `what`. */
bb_status bb_train_check_output(const bb_train_options *o, const char *what, const char *path, char *resolved,
                                size_t cap);
void bb_train_result_free(bb_train_result *r);

/* ---- evaluation -------------------------------------------------------- */
typedef struct bb_eval_result {
    double loss;      /* mean cross-entropy per example (mlp) or token (gpt) */
    double accuracy;  /* mlp: argmax hits / examples; NaN for gpt */
    double bits_per_byte; /* gpt: the loss in bits per byte of the targets' text, comparable across
                           * tokenizers (o->token_bytes, or bytes: vocabulary 256); NaN when unknown */
    uint64_t records;
} bb_eval_result;

typedef struct bb_eval_options {
    FILE *progress;                     /* records done and ETA about every second, in place on a
                                           terminal (a line every 10 s elsewhere); NULL: quiet */
    const char *label;                  /* the progress lines' prefix, e.g. "eval step 40" */
    volatile sig_atomic_t *interrupted; /* set (Ctrl-C): stop at the next micro-batch */
    const uint32_t *token_bytes;        /* bytes each token id stands for (bb_tokenizer_byte_lengths),
                                           for bits_per_byte; NULL: tokens are bytes if the vocabulary is 256 */
} bb_eval_options;

/* Every record of `ds`, in order, through the model's forward in
 * micro-batches (the last one padded); `o` may be NULL. Fails with
 * BB_ERR_ARG when the records do not fit the model, BB_ERR_INTERRUPTED
 * when o->interrupted was set, the dataset's read errors. */
bb_status bb_evaluate(bb_model_t *m, const bb_dataset_t *ds, const bb_eval_options *o, bb_eval_result *out);

/* ---- checkpoints ------------------------------------------------------- */
typedef struct bb_checkpoint_info {
    char dir[4096];            /* the step directory read */
    char root[4096];           /* the checkpoint directory it is in (--save DIR) */
    bool via_latest;           /* dir is what root's `latest` names (not a step directory named itself) */
    bb_model_config model;
    uint64_t step;             /* steps done */
    uint64_t seed;
    int global_batch;
    int ramp_from;             /* its batch ramp (bb_train_options.ramp_from, .ramp_steps: the steps it spans,
                                  resolved); 0 when none (or not recorded) */
    uint64_t ramp_steps;
    bool auto_batch;           /* its batch followed the noise scale: */
    uint64_t auto_chunks;      /* the chunks its steps took (where the data stands) */
    int auto_accumulation;     /* and the micro-steps of its next step */
    bb_optimizer_config opt;   /* the optimizer (opt.kind) and hyperparameters the run was saved with */
    uint64_t total_steps;      /* its --steps (the schedule's length) */
    char data[4096];           /* its training data */
    char data_identity[24];    /* its bb_dataset_identity, hex; "" when not recorded */
    char val_data[4096];       /* its validation data; "" when none (or not recorded) */
    char data_url[4096];       /* the URLs they were mirrored from; "" when local (or not recorded) */
    char val_data_url[4096];
    char devices[256];         /* its --devices, e.g. "cpu:2"; "" when not recorded */
    int micro_batch;           /* 0 when not recorded */
    uint32_t shuffle_frames;   /* 0 when not recorded (then the loader's default) */
    uint32_t order;            /* the data order's version (loader.h, BB_ORDER_*); 0 when not recorded (1) */
    int keep;                  /* its keep; 0 when not recorded */
    uint64_t save_every;       /* its save_every (0: at the end only, or not recorded) */
    bb_noise_scale noise;      /* the noise scale's averages (zero when not recorded) */
} bb_checkpoint_info;

/* Reads a checkpoint's state.json: `path` is a checkpoint directory (its
 * `latest` is read), DIR/latest or a step directory DIR/step-N. Fails with
 * BB_ERR_IO when there is no checkpoint, BB_ERR_FORMAT on a state file
 * bigbatch did not write (one line naming the file, and the line and
 * column where it is not JSON or the key missing or of the wrong type). */
bb_status bb_checkpoint_read_info(const char *ckpt_dir, bb_checkpoint_info *info);
/* The processes of a job (world.h) were started with the same options:
 * every field that shapes the run (all but paths each process may see
 * differently and what only rank 0 does: data, val_data, metrics, trace,
 * save_dir, progress, the loader's threads), compared with rank 0's before
 * anything depends on them. Every process calls it. Fails with BB_ERR_ARG
 * on every process when one differs: that process names the fields and
 * both values ("started with other options than rank 0: lr is 0.01 here,
 * 0.001 on rank 0"), the others
 * say that another process was started otherwise; BB_ERR_DEVICE when a
 * collective fails. Alone: BB_OK at once. */
bb_status bb_train_options_agree(const bb_train_options *o);

/* The options of the run that continues checkpoint `ck` (bb_train_run
 * calls it when resume_dir is set): the checkpoint's data, validation
 * data, devices, precision, global and micro-batch, --steps, shuffle
 * window, optimizer and hyperparameters, model and seed for every field
 * not in given->set (beta1 and eps always the checkpoint's); it goes on
 * saving into the checkpoint's directory with its keep and save_every
 * unless save_dir, keep or save_every are set. Fails with
 * BB_ERR_ARG naming the field when a chosen one cannot apply: the seed
 * (the data order depends on it) or init_from (the weights are the
 * checkpoint's); bb_train_run then refuses a model, global batch or
 * optimizer that differ, and warns for the other settings that do. */
bb_status bb_train_options_resume(const bb_train_options *given, const bb_checkpoint_info *ck, bb_train_options *out);
/* Loads the checkpoint's weights into `m` (created with info->model). */
bb_status bb_checkpoint_load_weights(const bb_checkpoint_info *info, bb_model_t *m);

#endif /* BIGBATCH_TRAIN_H */
