/* trainer.h — private: the trainer's state, shared by trainer.c (set-up
 * and teardown), worker.c (one thread per replica), step_end.c (the end of
 * a step) and device_clock.c.
 *
 * A run has one replica per local device: its backend, model, optimizer
 * and step figures. Worker thread i runs replica i; replica 0 also
 * reports, evaluates and saves between the step's two barriers. What
 * crosses devices goes through the reducer: the gradients (bucketed,
 * overlapping the backward), the step's loss (bb_reducer_allreduce_scalar)
 * and the decision to stop (bb_reducer_broadcast_stop).
 */
#ifndef BIGBATCH_TRAIN_TRAINER_H
#define BIGBATCH_TRAIN_TRAINER_H

#include <pthread.h>

#include "bigbatch/trace.h"
#include "checkpoint.h"
#include "reducer.h"
#include "watchdog.h"

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
    /* the noise scale's small batches (train.h): |G_small|² (the mean over
     * the job's devices) at b_small examples; NaN when none is smaller
     * than the step's */
    double small_squares, b_small;
} worker_stats;

struct trainer;

/* One device's copy of the model: what its worker thread owns. */
typedef struct replica {
    struct trainer *t;
    int index;               /* among this process's devices: 0..spec.count */
    bb_backend_t *be;
    bb_model_t *model;
    bb_optimizer opt;
    bb_backend_t *host;      /* --offload optimizer: the CPU backend its optimizer steps on; else NULL */
    double *first_micro_squares; /* one device with micro-steps: the first one's gradients' sum of squares
                                  * (pinned host memory the device writes; the noise scale's); else NULL */
    worker_stats stats;
} replica;

typedef struct trainer {
    const bb_train_options *o; /* on ranks but 0: without progress, metrics, saves, evaluation */
    bb_model_config cfg;
    bb_dataset_t *data, *val;
    bb_device_spec spec;     /* the devices: kind, local ids, rank and world */
    int accumulation, micro_batch, global_batch; /* under a ramp: its last step's (the largest) */
    /* --global-batch ramp:B0..B1[:STEPS]: step s's micro-steps grow from
     * ramp_accumulation (B0's) to accumulation over ramp_steps steps
     * (trainer_accumulation_at), and the loader hands out chunks of one
     * micro-batch on every device of the job, chunks_per_epoch an epoch;
     * ramp_accumulation 0: no ramp */
    int ramp_accumulation;
    uint64_t ramp_steps, chunks_per_epoch;
    /* --global-batch auto: the current step's micro-steps, which replica 0
     * moves between a step's barriers (bb_trainer_follow_noise), and the
     * chunks the steps before it took */
    bool auto_batch;
    int auto_accumulation;
    uint64_t auto_chunks;
    bb_optimizer_config opt; /* the options', its rate scaled to global_batch (opt.batch) */
    bb_noise_scale noise;    /* the gradient noise scale's averages (a resumed run's go on) */
    int zero;                /* the ZeRO stage in use: the options', or the planner's under --zero auto */
    bool offload;            /* the optimizer offloaded: the options', or the planner's under --offload auto */
    char devices_text[256];  /* "cpu:2", "cuda:0,1" */
    uint64_t first_step, total_steps, steps_per_epoch, seed;
    uint32_t shuffle_frames, order; /* the data order: its window (all frames: a global shuffle) and version */
    uint64_t data_identity;  /* bb_dataset_identity of the training data, once: ranks, resume, saves */
    uint32_t *val_token_bytes; /* the validation data's bytes per token id; NULL: none (bytes) */
    char tokenizer[4200];    /* the training data's tokenizer.json, which saves copy; "" when it has none */
    replica replicas[BB_TRAIN_MAX_DEVICES];
    bb_loader_t *loader;
    reducer_t *reducer;      /* NULL with one device in a world of one */
    bb_param_shards shards;  /* ZeRO-1: the buckets' cut among the job's devices */
    bb_watchdog *watchdog;   /* where there is a reducer and --timeout: the deadline */
    char device_names[BB_TRAIN_MAX_DEVICES][32]; /* "cuda:1", for the watchdog's line */
    const char *device_name_of[BB_TRAIN_MAX_DEVICES];
    bb_trace_t *trace;       /* NULL without --trace */
    step_barrier barrier;
    /* the first failure of any worker */
    pthread_mutex_t fail_lock;
    bb_status fail_status;
    char fail_message[1024];
    /* replica 0's, between the two barriers of a step */
    double step_loss;        /* the mean of the replicas' shares (through the reducer) */
    bool stop;
    bool gather_saves;       /* ZeRO-1 over processes: every rank joins a save (its shards) */
    bool saves;              /* the run saves (rank 0 has a save_dir): known on every rank */
    bool evaluates;          /* the run evaluates (rank 0 has val data): known on every rank */
    bool saved;              /* a checkpoint was written (on every rank: rank 0 wrote it) */
    uint64_t skipped;        /* non-finite steps skipped */
    bool finished;           /* --resume of a run already at its last step */
    const bb_checkpoint_info *resume; /* the checkpoint resumed from; NULL: none */
    size_t losses_cap;       /* result->losses holds this many */
    bool save_dir_created, trace_created; /* by this run: removed if it fails before using them */
    int save_lock;           /* save_dir's lock (bb_checkpoint_prepare), held for the run; -1: none */
    char trace_path[4096], metrics_path[4096]; /* the options', through symbolic links (bb_check_output) */
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

/* The job's devices: every process's. */
static inline int trainer_world_devices(const trainer *t) { return t->spec.count * t->spec.world; }

/* Step `step`'s micro-steps: under a ramp ramp_accumulation + (accumulation
 * - ramp_accumulation) x step / ramp_steps, rounded down, and accumulation
 * from step ramp_steps on; under auto the current step's (`step` must be
 * it); else accumulation. */
static inline int trainer_accumulation_at(const trainer *t, uint64_t step)
{
    if (t->auto_batch) return t->auto_accumulation; /* the current step's */
    if (!t->ramp_accumulation || step >= t->ramp_steps) return t->accumulation;
    return t->ramp_accumulation +
           (int)((uint64_t)(t->accumulation - t->ramp_accumulation) * step / t->ramp_steps);
}
/* Its global batch, and each device's share of its examples (tokens): the
 * loss's normalizer. */
static inline int trainer_batch_at(const trainer *t, uint64_t step)
{
    return trainer_accumulation_at(t, step) * trainer_world_devices(t) * t->micro_batch;
}
/* A ramp's (or auto's) first batch, B0; 0 without one. */
static inline int trainer_ramp_from(const trainer *t)
{
    return t->ramp_accumulation * trainer_world_devices(t) * t->micro_batch;
}
static inline float trainer_normalizer_at(const trainer *t, uint64_t step)
{
    int examples = trainer_accumulation_at(t, step) * t->micro_batch;
    return (float)examples * (float)bb_model_targets_per_example(&t->cfg);
}
/* Under a ramp, the loader's chunks the steps before `step` took (their
 * micro-steps summed): where step `step`'s data begins (trainer.c; under
 * auto known for the current step only). */
uint64_t bb_trainer_chunks_before(const trainer *t, uint64_t step);
/* --global-batch auto, after the current step (replica 0, between the
 * barriers; every process decides the same): its chunks are behind, and
 * the next step's micro-steps are B_simple (`noise`, examples) in whole
 * chunks, never fewer than now, at most accumulation. */
void bb_trainer_follow_noise(trainer *t, double noise);
/* schedule.c, while the trainer is set up: the data order (t->order,
 * t->shuffle_frames; never fails), and a ramp's or auto's schedule (B0 in
 * whole micro-steps, a ZeRO stage that allows it, its steps, the loader's
 * chunks of `records`, and with --epochs the run's length): BB_ERR_ARG
 * naming the option. */
void bb_trainer_choose_order(trainer *t);
bb_status bb_trainer_setup_ramp(trainer *t, uint64_t records);
/* The loader of the run's data from its first step (schedule.c): fails as
 * bb_loader_create. */
bb_status bb_trainer_start_loader(trainer *t);

bb_status bb_step_barrier_wait(step_barrier *b);
/* Records the failure (first one wins) and wakes every thread. */
void bb_trainer_fail(trainer *t, bb_status status);
/* A worker thread's body: its argument is its replica. */
void *bb_trainer_worker_main(void *replica);
/* Replica 0, after every worker finished step `step` (0-based): reporting,
 * evaluation, saving, and the decision to stop (t->stop). Fails with
 * BB_ERR_NONFINITE (a non-finite step, unless skip_nonfinite), a save's,
 * an evaluation's or the metrics file's error. */
bb_status bb_trainer_end_of_step(trainer *t, uint64_t step);
/* replicas.c: one replica per local device (trainer.h's replica), each
 * model initialised or loaded (init_from, then `resume`'s weights; under
 * ZeRO-3 into the host, from which each optimizer takes its shard) and
 * each optimizer made (resume: its state loaded). Fails like the backend's,
 * the model's and the optimizer's creation and loads; what it made is
 * freed by the trainer's teardown. */
bb_status bb_trainer_build_replicas(trainer *t, const bb_checkpoint_info *resume);
/* ZeRO-3 (worker.c): replica r's parameter window gathers from the owners'
 * shards through the reducer (what training passes read). Never fails. */
void bb_trainer_window_from_shards(replica *r);
/* ZeRO-3 (step_end.c): the whole weights on the host (*out, the caller
 * frees it), from every local optimizer's master shard and, over processes,
 * every process's (every rank joins). Fails with BB_ERR_NOMEM, a copy's or
 * a collective's error. */
bb_status bb_trainer_whole_weights(trainer *t, float **out);

#endif
