/* train_internal.h — private: the optimizer state of one replica and the
 * training-checkpoint files, shared by trainer.c, optimizer.c and
 * checkpoint.c. */
#ifndef BIGBATCH_TRAIN_INTERNAL_H
#define BIGBATCH_TRAIN_INTERNAL_H

#include "bigbatch/train.h"

/* One replica's optimizer: AdamW moments (m, v) or the SGD momentum (m). */
typedef struct optimizer {
    bb_optimizer_config cfg;
    float *m, *v;  /* device memory, param_count floats; v NULL for SGD */
    size_t count;
} optimizer;

bb_status bb_optimizer_create(bb_backend_t *be, const bb_optimizer_config *c, size_t count, optimizer *o);
void bb_optimizer_destroy(bb_backend_t *be, optimizer *o);
/* Clips the gradients to cfg.grad_clip (when set) and updates the
 * parameters for step `step` (0-based) of `total`. Returns the gradient
 * norm before clipping; *lr gets the rate used. A norm that is not finite
 * (NaN or infinite gradients) leaves the parameters and the optimizer
 * state untouched. */
double bb_optimizer_step(bb_backend_t *be, bb_model_t *m, optimizer *o, uint64_t step, uint64_t total, double *lr);
/* optimizer.bin: magic, buffer count, float count, XXH64 of the floats, then
 * the floats. Load fails with BB_ERR_FORMAT/BB_ERR_CORRUPT naming the file. */
bb_status bb_optimizer_save(bb_backend_t *be, const optimizer *o, const char *path);
bb_status bb_optimizer_load(bb_backend_t *be, optimizer *o, const char *path);

/* What a checkpoint records besides the weights and the optimizer. */
typedef struct checkpoint_state {
    uint64_t step, epoch, step_in_epoch, seed, total_steps;
    int global_batch, micro_batch;
    uint32_t shuffle_frames;
    double loss;
    const char *data, *val_data, *devices;
} checkpoint_state;

/* Writes a step directory under `dir` and switches `latest` to it (see
 * train.h; its name goes to `name`); then keeps the newest `keep` step directories (this one
 * included) and removes what failed or killed saves left. A failed save
 * removes its own partial directory. */
bb_status bb_checkpoint_save(const char *dir, const checkpoint_state *st, bb_model_t *m, bb_backend_t *be,
                          const optimizer *o, int keep, char *name, size_t name_cap);
/* Creates `dir` (and its parents; *created tells whether `dir` itself was
 * made) and checks it is writable: called before training, so a bad
 * --save path fails at once. Fails with BB_ERR_ARG when `dir` holds
 * checkpoints, unless it is `resume_root` (the checkpoint directory the run
 * resumes from) or `force` is set. */
bb_status bb_checkpoint_prepare(const char *dir, const char *resume_root, bool force, bool *created);
/* Loads the optimizer state of the checkpoint `info` names. */
bb_status bb_checkpoint_load_optimizer(const bb_checkpoint_info *info, bb_backend_t *be, optimizer *o);

#endif

/* ---- the trainer's shared state (trainer.c, worker.c, report.c) -------- */
#include <pthread.h>

#include "bigbatch/trace.h"
#include "reducer.h"

/* A barrier that a failing worker can open for everyone. */
typedef struct step_barrier {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int parties, waiting;
    uint64_t generation;
    bool aborted;
} step_barrier;

/* What one worker measured in the current step. */
typedef struct worker_stats {
    double loss;             /* its share: sum over micro-steps of loss / its normalizer */
    double grad_norm, lr;
    uint64_t wait_ns, copy_ns, fwd_ns, bwd_ns, reduce_wait_ns, opt_ns;
    uint64_t backward_end_ns; /* end of the last micro-step's backward */
} worker_stats;

typedef struct trainer {
    const bb_train_options *o;
    bb_model_config cfg;
    bb_dataset_t *data, *val;
    int devices, accumulation, micro_batch, global_batch;
    char devices_text[256];  /* "cpu:2", "cuda:0,1" */
    uint64_t first_step, total_steps, steps_per_epoch, seed;
    float normalizer;        /* each device's share of the examples (tokens) of a step */
    bb_backend_t *be[BB_TRAIN_MAX_DEVICES];
    bb_model_t *model[BB_TRAIN_MAX_DEVICES];
    optimizer opt[BB_TRAIN_MAX_DEVICES];
    worker_stats stats[BB_TRAIN_MAX_DEVICES];
    bb_loader_t *loader;
    reducer_t *reducer;      /* NULL with one device */
    bb_trace_t *trace;       /* NULL without --trace */
    step_barrier barrier;
    /* the first failure of any worker */
    pthread_mutex_t fail_lock;
    bb_status fail_status;
    char fail_message[1024];
    /* worker 0's, between the two barriers of a step */
    bool stop;
    bool saved;              /* a checkpoint was written */
    uint64_t skipped;        /* non-finite steps skipped */
    bool finished;           /* --resume of a run already at its last step */
    size_t losses_cap;       /* result->losses holds this many */
    bool save_dir_created, trace_created; /* by this run: removed if it fails before using them */
    FILE *metrics;
    bool tty;
    uint64_t run_start_ns, last_step_end_ns;
    bb_train_result *result;
} trainer;

/* Device times of a worker's phases for the trace (device_clock.c): marks
 * 3k, 3k+1, 3k+2 are micro-step k's forward start, forward end and
 * backward end; 3A and 3A+1 the optimizer's start and end. Off (every call
 * a no-op) on backends whose work is done when a call returns. */
typedef struct device_clock {
    bool on;
    bb_backend_t *be;
    bb_event_t *anchor, **marks;
    int count;
    uint64_t anchor_ns;       /* host time of the anchor */
} device_clock;

bb_status bb_device_clock_init(device_clock *c, bb_backend_t *be, int accumulation);
void bb_device_clock_destroy(device_clock *c);
/* Ties the clocks: waits for the device to reach this point. */
bb_status bb_device_clock_start(device_clock *c);
bb_status bb_device_clock_mark(device_clock *c, int i);
/* Host-clock time at which mark i happened on the device (waits for it). */
bb_status bb_device_clock_time(device_clock *c, int i, uint64_t *ns);

bb_status bb_step_barrier_wait(step_barrier *b);
/* Records the failure (first one wins) and wakes every thread. */
void bb_trainer_fail(trainer *t, bb_status status);
/* Worker d's thread body. */
void *bb_trainer_worker_main(void *arg);
/* Worker 0, after every worker finished step `step` (0-based): reporting,
 * evaluation, saving, and the decision to stop. */
bb_status bb_trainer_end_of_step(trainer *t, uint64_t step);
