/* cpu_pool.c — the CPU backend's worker threads (cpu_pool.h). One
 * generation per bb_cpu_parallel call: the caller publishes the job and
 * wakes the workers that sleep, everyone takes task indices from one
 * atomic counter, and the caller waits until every worker has left the
 * job. Waits spin briefly before they sleep (SPINS). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu_pool.h"

typedef struct worker_arg {
    struct cpu_pool *pool;
    int thread;
} worker_arg;

typedef struct cpu_pool {
    int threads; /* the caller + workers */
    pthread_t *workers;
    worker_arg *args;
    int started;
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    atomic_uint_fast64_t generation; /* one per job; written under lock */
    atomic_int busy;                 /* workers still in the current job */
    int sleepers;                    /* workers waiting on `wake`, under lock */
    bool waiting;                    /* the caller waits on `done`, under lock */
    bool stop;
    /* the job */
    bb_cpu_task_fn fn;
    void *ctx;
    int tasks;
    atomic_int next;
} cpu_pool;

/* How long a thread spins for the next job (or for the job's last task)
 * before it sleeps: ops follow each other within microseconds during a
 * step, and waking a sleeping thread costs more than that on a VM, while
 * between steps (or when the pool is idle) nobody spins long. */
enum { SPINS = 1 << 15 };

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Set on a thread while it runs tasks: a task that splits again runs its
 * tasks itself (as the same thread) instead of waiting for a pool that is
 * busy with it. */
static __thread bool in_task;
static __thread int task_thread;

static void run_tasks(cpu_pool *p, int thread)
{
    in_task = true, task_thread = thread;
    for (int i; (i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed)) < p->tasks;)
        p->fn(p->ctx, i, thread);
    in_task = false;
}

static void *worker_main(void *arg)
{
    worker_arg *a = arg;
    cpu_pool *p = a->pool;
    uint64_t seen = 0;
    for (;;) {
        for (int spin = 0; spin < SPINS && atomic_load_explicit(&p->generation, memory_order_acquire) == seen; spin++)
            relax();
        if (atomic_load_explicit(&p->generation, memory_order_acquire) == seen) {
            pthread_mutex_lock(&p->lock);
            p->sleepers++;
            while (!p->stop && atomic_load_explicit(&p->generation, memory_order_relaxed) == seen)
                pthread_cond_wait(&p->wake, &p->lock);
            p->sleepers--;
            bool stop = p->stop;
            pthread_mutex_unlock(&p->lock);
            if (stop) return NULL;
        }
        seen = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (p->stop) return NULL; /* set before the generation that wakes for it */
        run_tasks(p, a->thread);
        if (atomic_fetch_sub_explicit(&p->busy, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->lock);
            if (p->waiting) pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->lock);
        }
    }
}

static int budget(const bb_backend_t *b)
{
    int n = b->opt.threads > 0 ? b->opt.threads : bb_cpu_count();
    return n < 1 ? 1 : n > 256 ? 256 : n;
}

/* The backend's pool, made on first use; NULL when it cannot be (the
 * caller then runs the tasks alone). */
static cpu_pool *pool_of(bb_backend_t *b)
{
    if (b->impl || budget(b) == 1) return b->impl;
    cpu_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->threads = budget(b);
    p->workers = calloc((size_t)p->threads, sizeof *p->workers);
    p->args = calloc((size_t)p->threads, sizeof *p->args);
    if (!p->workers || !p->args || pthread_mutex_init(&p->lock, NULL)) goto fail;
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int t = 1; t < p->threads; t++) {
        p->args[t] = (worker_arg){p, t};
        if (pthread_create(&p->workers[p->started], NULL, worker_main, &p->args[t])) break;
        p->started++;
    }
    p->threads = p->started + 1;
    b->impl = p;
    return p;
fail:
    free(p->workers), free(p->args), free(p);
    return NULL;
}

int bb_cpu_threads(bb_backend_t *b)
{
    cpu_pool *p = pool_of(b);
    return p ? p->threads : 1;
}

void bb_cpu_parallel(bb_backend_t *b, int tasks, bb_cpu_task_fn fn, void *ctx)
{
    cpu_pool *p = in_task ? NULL : pool_of(b);
    if (!p || p->started == 0 || tasks <= 1) {
        int thread = in_task ? task_thread : 0;
        for (int i = 0; i < tasks; i++) fn(ctx, i, thread);
        return;
    }
    pthread_mutex_lock(&p->lock);
    p->fn = fn, p->ctx = ctx, p->tasks = tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->busy, p->started, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    if (p->sleepers) pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    run_tasks(p, 0);
    for (int spin = 0; spin < SPINS && atomic_load_explicit(&p->busy, memory_order_acquire); spin++) relax();
    if (atomic_load_explicit(&p->busy, memory_order_acquire)) {
        pthread_mutex_lock(&p->lock);
        p->waiting = true;
        while (atomic_load_explicit(&p->busy, memory_order_acquire)) pthread_cond_wait(&p->done, &p->lock);
        p->waiting = false;
        pthread_mutex_unlock(&p->lock);
    }
}

void bb_cpu_pool_destroy(bb_backend_t *b)
{
    cpu_pool *p = b ? b->impl : NULL;
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int t = 0; t < p->started; t++) pthread_join(p->workers[t], NULL);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->workers), free(p->args), free(p);
    b->impl = NULL;
}
