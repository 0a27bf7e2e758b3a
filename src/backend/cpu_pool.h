/* cpu_pool.h — private: a CPU backend's worker threads for the ops that
 * split into independent tasks (attention's heads and row tiles).
 *
 * How to use:
 *   static void task(void *ctx, int index, int thread) { ... }   // index in [0, tasks)
 *   bb_cpu_parallel(be, tasks, task, ctx);   // returns when every task ran
 *
 * The pool belongs to the backend and has its thread budget
 * (bb_backend_options.threads, which the trainer divides among its CPU
 * devices; 0: every CPU): the calling thread plus threads-1 workers, made
 * on the first call. Between calls workers spin for a moment (ops follow
 * each other within microseconds in a step) and then sleep on a condition
 * variable; OpenBLAS runs single-threaded in the caller (cpu_ops.c splits
 * the products over the pool), so no other threads spin for these cores.
 * A task runs on one thread; tasks are handed out in index order. A task
 * that calls bb_cpu_parallel runs those tasks itself. Never fails: when no
 * worker can be started the calling thread runs every task. */
#ifndef BIGBATCH_CPU_POOL_H
#define BIGBATCH_CPU_POOL_H

#include "backend_impl.h"

typedef void (*bb_cpu_task_fn)(void *ctx, int index, int thread);

/* Runs fn(ctx, i, thread) for i in [0, tasks); `thread` is in
 * [0, bb_cpu_threads(b)) and no two tasks run at once on the same one (per-
 * thread scratch may be indexed by it). */
void bb_cpu_parallel(bb_backend_t *b, int tasks, bb_cpu_task_fn fn, void *ctx);
/* The threads bb_cpu_parallel may use (the pool's size once made). */
int bb_cpu_threads(bb_backend_t *b);
/* Stops and joins the workers (the backend's destroy). Accepts NULL. */
void bb_cpu_pool_destroy(bb_backend_t *b);

#endif
