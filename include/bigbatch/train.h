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

#define BB_TRAIN_MAX_DEVICES BB_DEVICES_MAX

typedef enum bb_optimizer_kind { BB_OPTIMIZER_ADAMW = 0, BB_OPTIMIZER_SGD } bb_optimizer_kind;
typedef enum bb_lr_schedule { BB_LR_COSINE = 0, BB_LR_CONSTANT } bb_lr_schedule;

typedef struct bb_optimizer_config {
    bb_optimizer_kind kind;
    double lr;             /* peak learning rate */
    double beta1, beta2, eps; /* AdamW */
    double momentum;       /* SGD */
    double weight_decay;   /* on matrices only (bb_tensor_info.decay) */
    uint64_t warmup;       /* steps of linear warm-up from lr/warmup to lr */
    bb_lr_schedule schedule; /* cosine: from lr down to lr/10 at the last step */
    double grad_clip;      /* clip the global gradient norm to this; 0: off */
} bb_optimizer_config;

/* The loader options of a run on `devices` devices at `micro_batch` with
 * `loader_threads` threads: the threads and the batches each device may
 * hold that the trainer uses, the rest the loader's defaults (what the
 * planner counts as host memory). */
void bb_train_loader_options(int devices, int micro_batch, int loader_threads, bb_loader_options *lo);
/* "adamw", "sgd" (--optimizer's names). */
const char *bb_optimizer_kind_name(bb_optimizer_kind k);
/* The learning rate of step `step` (0-based) of a `total`-step run. */
double bb_lr_at(const bb_optimizer_config *o, uint64_t step, uint64_t total);

typedef struct bb_train_options {
    /* the model: kind and shape flags; seq_len/vocab (gpt) and
     * inputs/classes (mlp) are taken from the data when 0 */
    bb_model_config model;
    const char *data;          /* training dataset directory */
    const char *val_data;      /* evaluated every eval_every steps and at the end; NULL: none */
    int devices;               /* worker threads: CPU virtual devices, or GPUs */
    bb_device_kind device;     /* BB_DEVICE_CUDA: GPUs device_ids[0..devices); CPU: virtual devices */
    int device_ids[BB_TRAIN_MAX_DEVICES];
    bb_precision precision;    /* bf16: gpt activations kept in bf16; on GPUs also bf16 products */
    bb_attention attention;    /* GPUs, bf16: cuDNN's fused attention or bigbatch's kernels (backend.h) */
    int global_batch, micro_batch; /* accumulation = G / (devices * micro_batch) */
    bool auto_micro_batch;     /* --micro-batch auto: the planner picks it (plan.h) */
    bool auto_checkpoint;      /* --checkpoint auto: the planner picks model.checkpoint_every */
    uint64_t steps;            /* run ends after step `steps`; 0: use epochs */
    uint64_t epochs;           /* when steps is 0 */
    uint64_t stop_after;       /* end this run after this step, the schedule still
                                  spanning `steps` (time-boxed jobs); 0: none */
    bb_optimizer_config opt;
    uint64_t seed;             /* initialisation and data order */
    int loader_threads;
    bb_io_mode io;             /* how the loader reads frames (loader.h) */
    bool direct;               /* O_DIRECT reads */
    uint32_t shuffle_frames;   /* frames per shuffle window; 0: the loader's default (8) */
    double bucket_mib;         /* reducer bucket size (the first one is 1 MiB, as DDP) */
    bool no_overlap;           /* all-reduce after the whole backward, for comparison */
    double timeout_s;          /* the job ends (one line, exit 1) when no device of a process has moved
                                  for this long: a peer stopped, stalled or died (watchdog.h); 0: never */
    int zero;                  /* 1: ZeRO-1, each device keeps and updates the optimizer state of its
                                  shard of every bucket, and the updated weights are gathered; 0: none */
    uint64_t eval_every, save_every, log_every;
    const char *save_dir, *resume_dir, *init_from, *metrics_path, *trace_path;
    int keep;                  /* step directories kept in save_dir, the newest (default 2) */
    bool skip_nonfinite;       /* a step whose loss or gradient norm is not finite is skipped
                                  (counted), not the end of the run (BB_ERR_NONFINITE) */
    bool force;                /* save into a save_dir that holds another run's checkpoints */
    uint64_t device_mem;       /* per-device cap in bytes; 0: none */
    FILE *progress;            /* progress lines (in place on a TTY); NULL: quiet */
    volatile sig_atomic_t *interrupted; /* set by Ctrl-C: finish the step, save, stop */
} bb_train_options;

void bb_train_defaults(bb_train_options *o);

typedef struct bb_train_result {
    uint64_t first_step, steps_done; /* steps_done counts from 0, like --steps */
    double *losses;            /* (steps_done - first_step) per-step mean losses */
    float *params;             /* device 0's final parameters (param_count floats) */
    size_t param_count;
    int devices;
    uint64_t peak_bytes[BB_TRAIN_MAX_DEVICES]; /* allocator peak per device */
    double val_loss, val_accuracy; /* last evaluation; NaN when none (accuracy: mlp) */
    double seconds;            /* wall time of the training loop */
    uint64_t skipped_steps;    /* non-finite steps skipped (skip_nonfinite) */
    bool interrupted;
} bb_train_result;

/* Trains as configured. Fails with BB_ERR_ARG on bad options (the message
 * lists valid micro-batch sizes when G does not split), a checkpoint that
 * conflicts with the options, BB_ERR_OOM when a device's memory (or
 * --device-mem) is too small, BB_ERR_NONFINITE when a step's loss or
 * gradient norm is NaN or infinite (named; that step's update is not
 * applied and nothing of it is saved) unless skip_nonfinite, BB_ERR_INTERRUPTED after Ctrl-C (the step
 * finished and, with save_dir, saved), and the loader's errors (e.g. a
 * corrupt shard). `result` (may be NULL) is filled as far as the run went. */
bb_status bb_train_run(const bb_train_options *o, bb_train_result *result);
void bb_train_result_free(bb_train_result *r);

/* ---- evaluation -------------------------------------------------------- */
typedef struct bb_eval_result {
    double loss;      /* mean cross-entropy per example (mlp) or token (gpt) */
    double accuracy;  /* mlp: argmax hits / examples; NaN for gpt */
    uint64_t records;
} bb_eval_result;

typedef struct bb_eval_options {
    FILE *progress;                     /* records done and ETA about every second, in place on a
                                           terminal (a line every 10 s elsewhere); NULL: quiet */
    const char *label;                  /* the progress lines' prefix, e.g. "eval step 40" */
    volatile sig_atomic_t *interrupted; /* set (Ctrl-C): stop at the next micro-batch */
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
    bb_model_config model;
    uint64_t step;             /* steps done */
    uint64_t seed;
    int global_batch;
    bb_optimizer_config opt;   /* the optimizer (opt.kind) and hyperparameters the run was saved with */
    uint64_t total_steps;      /* its --steps (the schedule's length) */
    char data[4096];           /* its training data */
    char val_data[4096];       /* its validation data; "" when none (or not recorded) */
    char devices[256];         /* its --devices, e.g. "cpu:2"; "" when not recorded */
    int micro_batch;           /* 0 when not recorded */
    uint32_t shuffle_frames;   /* 0 when not recorded (then the loader's default) */
} bb_checkpoint_info;

/* Reads a checkpoint's state.json: `path` is a checkpoint directory (its
 * `latest` is read), DIR/latest or a step directory DIR/step-N. Fails with
 * BB_ERR_IO when there is no checkpoint, BB_ERR_FORMAT on a state file
 * bigbatch did not write. */
bb_status bb_checkpoint_read_info(const char *ckpt_dir, bb_checkpoint_info *info);
/* Loads the checkpoint's weights into `m` (created with info->model). */
bb_status bb_checkpoint_load_weights(const bb_checkpoint_info *info, bb_model_t *m);

#endif /* BIGBATCH_TRAIN_H */
