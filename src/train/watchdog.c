/* watchdog.c — the step deadline's thread; see watchdog.h. */
#include "watchdog.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "bigbatch/world.h"

enum { MAX_HOOKS = 4, POLL_MS = 100 };

typedef struct device_progress {
    uint64_t step, since_ns, moves; /* moves: phases entered so far */
    const char *phase;
} device_progress;

typedef struct hook {
    void (*poll)(void *ctx);
    void (*abort)(void *ctx);
    void *ctx;
} hook;

struct bb_watchdog {
    bb_watchdog_options o;
    device_progress dev[BB_WATCHDOG_MAX_DEVICES]; /* written by the workers with __atomic stores */
    hook hooks[MAX_HOOKS];                        /* under lock */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stopping;
    int stood_down; /* __atomic: no deadline any more */
    pthread_t thread;
};

void bb_watchdog_at(bb_watchdog *w, int d, uint64_t step, const char *phase)
{
    if (!w || d < 0 || d >= w->o.devices) return;
    device_progress *p = &w->dev[d];
    __atomic_store_n(&p->phase, phase, __ATOMIC_RELAXED);
    __atomic_store_n(&p->step, step, __ATOMIC_RELAXED);
    __atomic_store_n(&p->since_ns, bb_clock_ns(), __ATOMIC_RELAXED);
    __atomic_add_fetch(&p->moves, 1, __ATOMIC_RELEASE);
}

bool bb_watchdog_add_hook(bb_watchdog *w, void (*poll)(void *ctx), void (*abort)(void *ctx), void *ctx)
{
    bool added = false;
    pthread_mutex_lock(&w->lock);
    for (int i = 0; i < MAX_HOOKS && !added; i++)
        if (!w->hooks[i].ctx) w->hooks[i] = (hook){poll, abort, ctx}, added = true;
    pthread_mutex_unlock(&w->lock);
    return added;
}

void bb_watchdog_remove_hooks(bb_watchdog *w, void *ctx)
{
    if (!w) return;
    pthread_mutex_lock(&w->lock);
    for (int i = 0; i < MAX_HOOKS; i++)
        if (w->hooks[i].ctx == ctx) w->hooks[i] = (hook){0};
    pthread_mutex_unlock(&w->lock);
}

/* The device furthest behind: the lowest step, then the fewest phases
 * entered (every device enters the same phases in the same order). */
static int laggard(const bb_watchdog *w)
{
    int worst = 0;
    for (int d = 1; d < w->o.devices; d++) {
        const device_progress *a = &w->dev[d], *b = &w->dev[worst];
        uint64_t as = __atomic_load_n(&a->step, __ATOMIC_RELAXED), bs = __atomic_load_n(&b->step, __ATOMIC_RELAXED);
        if (as < bs || (as == bs && __atomic_load_n(&a->moves, __ATOMIC_RELAXED) <
                                        __atomic_load_n(&b->moves, __ATOMIC_RELAXED)))
            worst = d;
    }
    return worst;
}

/* The newest progress of any device. */
static uint64_t last_move_ns(const bb_watchdog *w)
{
    uint64_t last = 0;
    for (int d = 0; d < w->o.devices; d++) {
        uint64_t t = __atomic_load_n(&w->dev[d].since_ns, __ATOMIC_RELAXED);
        last = t > last ? t : last;
    }
    return last;
}

/* The deadline passed: one line, the abort hooks, the end of the process
 * (called with the lock held). */
__attribute__((noreturn)) static void expire(bb_watchdog *w, double idle_s)
{
    int d = laggard(w);
    const device_progress *p = &w->dev[d];
    const bb_world *world = bb_world_get();
    fprintf(stderr,
            "bigbatch: %serror: no progress for %.0f s (--timeout %g): %s is furthest behind, in %s of step %llu; "
            "%s stopped, stalled or died: ending the job\n",
            bb_log_prefix(), idle_s, w->o.timeout_s, w->o.device_names[d], __atomic_load_n(&p->phase, __ATOMIC_RELAXED),
            (unsigned long long)__atomic_load_n(&p->step, __ATOMIC_RELAXED) + 1,
            world->size > 1 ? "a process or device" : "a device");
    fflush(stderr);
    /* A hook or MPI_Abort that itself hangs must not keep the job alive. */
    alarm(10);
    for (int i = 0; i < MAX_HOOKS; i++) /* the caller holds the lock */
        if (w->hooks[i].abort) w->hooks[i].abort(w->hooks[i].ctx);
    if (world->size > 1) bb_world_abort(1);
    _exit(1);
}

static void *watch(void *arg)
{
    bb_watchdog *w = arg;
    uint64_t timeout_ns = (uint64_t)(w->o.timeout_s * 1e9), last_poll = bb_clock_ns();
    pthread_mutex_lock(&w->lock);
    while (!w->stopping) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += POLL_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        int rc = pthread_cond_timedwait(&w->cond, &w->lock, &until);
        if (w->stopping) break;
        if (rc != ETIMEDOUT) continue;
        /* Under the lock: a hook's owner removes it (bb_watchdog_remove_hooks) before freeing its ctx. */
        for (int i = 0; i < MAX_HOOKS; i++)
            if (w->hooks[i].poll) w->hooks[i].poll(w->hooks[i].ctx);
        uint64_t now = bb_clock_ns(), last = last_move_ns(w);
        /* A poll that comes a second late: this process itself was stopped
         * (SIGSTOP, a debugger) — its peers time out, not it. */
        if (now - last_poll > 1000000000ull)
            for (int d = 0; d < w->o.devices; d++) __atomic_store_n(&w->dev[d].since_ns, now, __ATOMIC_RELAXED);
        else if (now > last && now - last > timeout_ns && !__atomic_load_n(&w->stood_down, __ATOMIC_RELAXED))
            expire(w, (double)(now - last) / 1e9);
        last_poll = now;
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

bb_status bb_watchdog_start(const bb_watchdog_options *o, bb_watchdog **out)
{
    *out = NULL;
    if (!(o->timeout_s > 0) || o->devices < 1 || o->devices > BB_WATCHDOG_MAX_DEVICES)
        return bb_fail(BB_ERR_ARG, "watchdog: timeout %g s over %d devices", o->timeout_s, o->devices);
    bb_watchdog *w = calloc(1, sizeof *w);
    if (!w) return bb_fail(BB_ERR_NOMEM, "out of memory");
    w->o = *o;
    uint64_t now = bb_clock_ns();
    for (int d = 0; d < o->devices; d++) w->dev[d] = (device_progress){.since_ns = now, .phase = "the set-up"};
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cond, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&w->lock, NULL);
    int err = pthread_create(&w->thread, NULL, watch, w);
    if (err) {
        pthread_cond_destroy(&w->cond);
        pthread_mutex_destroy(&w->lock);
        free(w);
        return bb_fail(BB_ERR_INTERNAL, "cannot start the watchdog thread: error %d", err);
    }
    *out = w;
    return BB_OK;
}

void bb_watchdog_stand_down(bb_watchdog *w)
{
    if (w) __atomic_store_n(&w->stood_down, 1, __ATOMIC_RELAXED);
}

void bb_watchdog_stop(bb_watchdog *w)
{
    if (!w) return;
    pthread_mutex_lock(&w->lock);
    w->stopping = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->lock);
    free(w);
}
