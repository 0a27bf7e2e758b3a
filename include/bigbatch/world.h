/* world.h — the processes of one training job: one process alone, or P
 * processes started by `mpirun` / `srun` (MPI), each driving its own
 * devices.
 *
 * How to use (main):
 *   BB_TRY(bb_world_init(&argc, &argv));   // MPI only when launched by mpirun/srun
 *   const bb_world *w = bb_world_get();    // rank, size, local rank
 *   ... on a failure with w->size > 1: print it naming w->rank, then
 *   bb_world_abort(1);                     // ends every process of the job
 *   bb_world_finalize();
 *
 * Without a launcher nothing changes: size 1, and MPI is not initialised.
 * MPI is initialised with MPI_THREAD_SERIALIZED: calls may come from any
 * thread but never two at once — the trainer's collectives happen at fixed
 * points of a step (the reducer thread's buckets during the backward, the
 * workers' scalars after the optimizer), never together. A build without
 * MPI refuses to run under a launcher that started several processes
 * (each would train alone). */
#ifndef BIGBATCH_WORLD_H
#define BIGBATCH_WORLD_H

#include "bigbatch/core.h"

typedef struct bb_world {
    int rank, size;             /* this process among `size` (0 and 1 alone) */
    int local_rank, local_size; /* among the processes of this machine */
    bool mpi;                   /* MPI is initialised */
    bool thread_multiple;       /* with MPI_THREAD_MULTIPLE: threads may call collectives at once (on channels) */
} bb_world;

/* Fails with BB_ERR_UNSUPPORTED when several processes were launched and
 * this build has no MPI (or the MPI library lacks thread support),
 * BB_ERR_INTERNAL when MPI cannot start. */
bb_status bb_world_init(int *argc, char ***argv);
/* The world; size 1 before bb_world_init. */
const bb_world *bb_world_get(void);
void bb_world_finalize(void);
/* Ends every process of the job with `code` (MPI_Abort); exit() alone. */
void bb_world_abort(int code) __attribute__((noreturn));
/* "Open MPI v4.1.4" (the library's own words), or "none" in a build without MPI. */
const char *bb_world_library(void);

/* Collectives over the processes (size 1: nothing to do). Every process
 * calls each, in the same order. Fail with BB_ERR_DEVICE naming the call. */
bb_status bb_world_sum_floats(float *x, size_t n);     /* in place: x = the sum over processes */
bb_status bb_world_sum_doubles(double *x, size_t n);
bb_status bb_world_broadcast_doubles(double *x, size_t n, int root);
bb_status bb_world_broadcast_bytes(void *x, size_t n, int root);
bb_status bb_world_max_int(int *x);                    /* in place: x = the largest over processes */
/* In place in x: process p's floats [lo[p], hi[p]) (parts in rank order,
 * each starting where the previous ends) into every process (an
 * all-gather). Fails with BB_ERR_ARG when the parts span 2^31 floats or
 * more, BB_ERR_NOMEM, and as the other collectives when MPI does. */
bb_status bb_world_allgather_floats(float *x, const size_t *lo, const size_t *hi);
/* Channels: n copies of the world's communicator (MPI_Comm_dup; every
 * process calls it), one for each thread that runs collectives of its own
 * while other threads run theirs (ZeRO-3's gathers: one a local device).
 * Opened once for the process (a larger n adds), freed at finalize. Fails
 * with BB_ERR_UNSUPPORTED without MPI_THREAD_MULTIPLE, as the collectives
 * when MPI does. */
bb_status bb_world_open_channels(int n);
/* bb_world_allgather_floats on channel `channel` (one thread's own). Fails
 * as it, with BB_ERR_INTERNAL for a channel not opened. */
bb_status bb_world_allgather_floats_on(int channel, float *x, const size_t *lo, const size_t *hi);
/* In place in x: the sum over the processes of each process's own part
 * [lo[rank], hi[rank]) (parts as above) into that part (a reduce-scatter:
 * half an all-reduce's traffic; the rest of x is left undefined). Fails
 * as bb_world_allgather_floats. */
bb_status bb_world_reduce_scatter_floats(float *x, const size_t *lo, const size_t *hi);
/* *out (on every process): whether every process passed the same `value`. */
bb_status bb_world_all_equal(uint64_t value, bool *out);

#endif /* BIGBATCH_WORLD_H */
