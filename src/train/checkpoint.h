/* checkpoint.h — private: writing a training checkpoint (a step
 * directory with model.safetensors, optimizer.bin and state.json, see
 * train.h) and reading its optimizer state back.
 *
 * How to use:
 *   BB_TRY(bb_checkpoint_prepare(options, NULL, &created, &lock)); // before training: options->save_dir
 *   ...
 *   bb_checkpoint_unlock(lock, options->save_dir, false);          // at the end of the run
 *   BB_TRY(bb_checkpoint_save(dir, &state, model, bes, opts, n, keep, name, sizeof name));
 */
#ifndef BIGBATCH_TRAIN_CHECKPOINT_H
#define BIGBATCH_TRAIN_CHECKPOINT_H

#include "bigbatch/optim.h"
#include "bigbatch/train.h"

/* What a checkpoint records besides the weights and the optimizer. */
typedef struct checkpoint_state {
    uint64_t step, epoch, step_in_epoch, seed, total_steps;
    int global_batch, micro_batch;
    int ramp_from;                /* a batch ramp's B0 and the steps it spans (train.h); 0: none */
    uint64_t ramp_steps;
    bool auto_batch;              /* --global-batch auto: the chunks taken and the next step's micro-steps */
    uint64_t auto_chunks;
    int auto_accumulation;
    uint32_t shuffle_frames, order; /* the data order's window and version (loader.h) */
    uint64_t data_identity;       /* bb_dataset_identity of the training data */
    int keep;                     /* the run's keep and save_every: a resumed run saves as it did */
    uint64_t save_every;
    double loss;
    bb_noise_scale noise;         /* the noise scale's averages: a resumed run goes on with them */
    const char *data, *val_data, *devices;
    const char *data_url, *val_data_url; /* where they were mirrored from; NULL: local */
    const char *tokenizer;        /* the training data's tokenizer.json, copied into the checkpoint; NULL/"": none */
    const bb_state_gather *gather; /* ZeRO-1 over MPI: the optimizer state is gathered from every process */
} checkpoint_state;

/* Writes a step directory under `dir` and switches `latest` to it (see
 * train.h; its name goes to `name`); then keeps the newest `keep` step directories (this one
 * included) and removes what failed or killed saves left. A failed save
 * removes its own partial directory. The optimizer state is gathered from
 * `n` optimizers on their backends (one, or the ZeRO-1 shards). */
bb_status bb_checkpoint_save(const char *dir, const checkpoint_state *st, bb_model_t *m, bb_backend_t *const *be,
                             const bb_optimizer *const *o, int n, int keep, char *name, size_t name_cap);
/* Creates o->save_dir (and its parents; *created tells whether it was
 * made) and checks it is writable: called before training, so a bad path
 * fails at once. Fails with BB_ERR_IO, and BB_ERR_ARG when it holds
 * checkpoints, unless it is `resume_root` (the checkpoint directory the run
 * resumes from) or o->force is set; the messages name o's fields as o
 * names them. */
bb_status bb_checkpoint_prepare(const bb_train_options *o, const char *resume_root, bool *created, int *lock_fd);
/* The directory is one run's: bb_checkpoint_prepare locks DIR/.lock
 * (flock, held until bb_checkpoint_unlock; *lock_fd, -1 on failure) and
 * fails with BB_ERR_ARG naming the holder's PID and host while another
 * process holds it. Unlock closes it; `remove` also deletes the file (a run
 * that created the directory and saved nothing, before removing it). */
#define BB_CHECKPOINT_LOCK ".lock"
void bb_checkpoint_unlock(int fd, const char *dir, bool remove);
/* Whether `dir` is a checkpoint directory a run has yet to save into: it
 * does not exist, or is a directory with no `latest` and no step
 * directory (a .lock, or what a killed first save left, does not count).
 * A path that names a step directory or `latest` is never "none yet". */
bool bb_checkpoint_none_yet(const char *dir);
/* Loads o's part of the optimizer state of the checkpoint `info` names
 * (of a model of `param_count` parameters). */
bb_status bb_checkpoint_load_optimizer(const bb_checkpoint_info *info, bb_backend_t *be, bb_optimizer *o,
                                       size_t param_count);

#endif
