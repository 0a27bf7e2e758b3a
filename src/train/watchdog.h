/* watchdog.h — private: the deadline that ends a stuck job (train
 * --timeout). A process whose peer stopped (SIGSTOP, a debugger), stalled
 * (a hung kernel, a dead node) or died without MPI_Abort would otherwise
 * wait in a collective forever. One thread per process watches its
 * devices' progress: when none of them has moved for `timeout_s` seconds it
 * writes one line — the rank, the device that is furthest behind, the step
 * and what that device is in (a collective, say) — runs the abort hooks
 * (NCCL: every communicator aborted) and ends the process: MPI_Abort when
 * there are several processes (mpirun then ends every rank), else exit 1.
 * The same thread polls the checks (NCCL's asynchronous errors) every
 * 100 ms, so an error in one communicator ends the run even while every
 * thread waits on the GPU.
 *
 * How to use:
 *   bb_watchdog *w;
 *   BB_TRY(bb_watchdog_start(&(bb_watchdog_options){.timeout_s = 600, .devices = 2,
 *                                                   .device_names = names}, &w));
 *   bb_watchdog_at(w, d, step, "the gradient all-reduce");  // each phase a device enters
 *   bb_watchdog_add_hook(w, poll, abort, ctx);               // the NCCL reducer's
 *   bb_watchdog_stand_down(w);                               // the workers are done
 *   bb_watchdog_stop(w);                                     // after the hooks' owners removed them
 *
 * Progress is an atomic store (no lock); the line names the phases as the
 * workers last set them. Time spent in a save or an evaluation on rank 0 is
 * time the others wait in a collective: --timeout must exceed the longest
 * of those too (PyTorch's collective timeout has the same rule). */
#ifndef BIGBATCH_TRAIN_WATCHDOG_H
#define BIGBATCH_TRAIN_WATCHDOG_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "bigbatch/core.h"

#define BB_WATCHDOG_MAX_DEVICES 64

typedef struct bb_watchdog bb_watchdog;

typedef struct bb_watchdog_options {
    double timeout_s;                /* > 0 */
    int devices;                     /* this process's, 1..BB_WATCHDOG_MAX_DEVICES */
    const char *const *device_names; /* "cuda:1", ...; outlive the watchdog */
} bb_watchdog_options;

/* Starts the thread; every device at step 0, in "the set-up". Fails with
 * BB_ERR_ARG (a bad option), BB_ERR_NOMEM, BB_ERR_INTERNAL (no thread). */
bb_status bb_watchdog_start(const bb_watchdog_options *o, bb_watchdog **out);
/* Device d enters `phase` (a string that outlives the watchdog) of step
 * `step` (0-based). Accepts a NULL watchdog. */
void bb_watchdog_at(bb_watchdog *w, int d, uint64_t step, const char *phase);
/* poll (may be NULL) runs on the watchdog's thread every 100 ms; abort
 * (may be NULL) runs there once, before the process ends on a timeout.
 * At most 4 hooks; false when there is no room. */
bool bb_watchdog_add_hook(bb_watchdog *w, void (*poll)(void *ctx), void (*abort)(void *ctx), void *ctx);
/* Removes every hook with this ctx (before what it points to is freed). */
void bb_watchdog_remove_hooks(bb_watchdog *w, void *ctx);
/* The workers are done: no deadline from now on (the polls go on until
 * bb_watchdog_stop, after whoever added hooks removed them). Accepts NULL. */
void bb_watchdog_stand_down(bb_watchdog *w);
/* Stops and frees the watchdog; accepts NULL. */
void bb_watchdog_stop(bb_watchdog *w);

#ifdef __cplusplus
}
#endif

#endif
