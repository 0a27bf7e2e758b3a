/* bench_queue.c — `bigbatch bench queue`: the SPSC ring against a
 * mutex+condvar queue of the same capacity, in the same run, and the CPU a
 * blocked consumer burns. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "bench.h"
#include "bigbatch/json.h"
#include "bigbatch/queue.h"

static const char usage[] = "bigbatch bench queue [--capacity N] [--batch B] [--seconds S] [--runs R] [--json]";
static const char summary[] =
    "Moves pointer-sized items from one producer thread to one consumer thread for\n"
    "S seconds per measurement, R times each, and prints the median items/s of:\n"
    "  spsc (batched)   the lock-free ring with push_n/pop_n of B items\n"
    "  spsc (single)    the ring, one item per call\n"
    "  mutex (single)   a pthread mutex + condvar ring of the same capacity\n"
    "  mutex (batched)  the same, moving up to B items per lock\n"
    "and the CPU use of a consumer blocked on an empty ring for one second.\n"
    "Goals: spsc batched >= 100 M items/s and >= 10x mutex (single).";

/* ---- the peer: a textbook bounded queue under one mutex ---------------- */
typedef struct mutex_queue {
    pthread_mutex_t lock;
    pthread_cond_t not_empty, not_full;
    void **items;
    uint32_t capacity, head, count;
    bool closed;
} mutex_queue;

static void mq_push_n(mutex_queue *q, void *const *items, uint32_t n)
{
    for (uint32_t done = 0; done < n;) {
        pthread_mutex_lock(&q->lock);
        while (q->count == q->capacity) pthread_cond_wait(&q->not_full, &q->lock);
        for (; done < n && q->count < q->capacity; done++, q->count++)
            q->items[(q->head + q->count) % q->capacity] = items[done];
        pthread_cond_signal(&q->not_empty);
        pthread_mutex_unlock(&q->lock);
    }
}

/* Returns how many items were taken; 0 once closed and empty. */
static uint32_t mq_pop_n(mutex_queue *q, void **out, uint32_t n)
{
    pthread_mutex_lock(&q->lock);
    while (q->count == 0 && !q->closed) pthread_cond_wait(&q->not_empty, &q->lock);
    uint32_t k = 0;
    for (; k < n && q->count > 0; k++, q->count--, q->head = (q->head + 1) % q->capacity) out[k] = q->items[q->head];
    pthread_cond_signal(&q->not_full);
    pthread_mutex_unlock(&q->lock);
    return k;
}

static void mq_close(mutex_queue *q)
{
    pthread_mutex_lock(&q->lock);
    q->closed = true;
    pthread_cond_broadcast(&q->not_empty);
    pthread_mutex_unlock(&q->lock);
}

/* ---- one measurement --------------------------------------------------- */
typedef struct run {
    bool use_mutex;
    uint32_t batch;
    double seconds;
    bb_spsc ring;
    mutex_queue mq;
    uint64_t received, out_of_order;
} run;

static void *consumer(void *arg)
{
    run *r = arg;
    void *out[1024];
    uint64_t expect = 0;
    for (;;) {
        uint32_t n = 0;
        if (r->use_mutex) {
            if (!(n = mq_pop_n(&r->mq, out, r->batch))) break;
        } else if (bb_spsc_pop_n(&r->ring, out, r->batch, &n) != BB_OK) {
            break;
        }
        for (uint32_t i = 0; i < n; i++, expect++) r->out_of_order += (uintptr_t)out[i] != expect;
    }
    r->received = expect;
    return NULL;
}

/* Producer on the calling thread; returns items/s. */
static double measure(run *r)
{
    pthread_t t;
    r->received = r->out_of_order = 0;
    pthread_create(&t, NULL, consumer, r);
    void *batch[1024];
    uint64_t next = 0;
    uint64_t deadline = bb_clock_ns() + (uint64_t)(r->seconds * 1e9);
    uint64_t t0 = bb_clock_ns();
    for (uint32_t round = 0;; round++) {
        if ((round & 63) == 0 && (bb_clock_ns() >= deadline || bb_cli_interrupted)) break;
        for (uint32_t i = 0; i < r->batch; i++) batch[i] = (void *)(uintptr_t)(next + i);
        if (r->use_mutex)
            mq_push_n(&r->mq, batch, r->batch);
        else if (r->batch == 1)
            bb_spsc_push(&r->ring, batch[0]);
        else
            bb_spsc_push_n(&r->ring, batch, r->batch, NULL);
        next += r->batch;
    }
    if (r->use_mutex)
        mq_close(&r->mq);
    else
        bb_spsc_close(&r->ring);
    pthread_join(t, NULL);
    double elapsed = (bb_clock_ns() - t0) / 1e9;
    return r->received == next && r->out_of_order == 0 ? (double)next / elapsed : -1;
}

static bb_status measure_median(bool use_mutex, uint32_t capacity, uint32_t batch, double seconds, int runs,
                                double *median)
{
    double rates[64];
    for (int i = 0; i < runs; i++) {
        run r = {.use_mutex = use_mutex, .batch = batch, .seconds = seconds};
        if (use_mutex) {
            pthread_mutex_init(&r.mq.lock, NULL);
            pthread_cond_init(&r.mq.not_empty, NULL);
            pthread_cond_init(&r.mq.not_full, NULL);
            r.mq.capacity = capacity;
            if (!(r.mq.items = calloc(capacity, sizeof(void *)))) return bb_fail(BB_ERR_NOMEM, "out of memory");
        } else {
            BB_TRY(bb_spsc_init(&r.ring, capacity));
        }
        rates[i] = measure(&r);
        if (use_mutex) {
            free(r.mq.items);
            pthread_mutex_destroy(&r.mq.lock);
            pthread_cond_destroy(&r.mq.not_empty);
            pthread_cond_destroy(&r.mq.not_full);
        } else {
            bb_spsc_fini(&r.ring);
        }
        if (rates[i] < 0)
            return bb_fail(BB_ERR_INTERNAL, "%s queue lost or reordered items", use_mutex ? "mutex" : "spsc");
        if (bb_cli_interrupted) return bb_fail(BB_ERR_INTERRUPTED, "interrupted");
    }
    *median = bb_bench_median(rates, runs);
    return BB_OK;
}

/* ---- the idle consumer ------------------------------------------------- */
static void *idle_consumer(void *arg)
{
    void *item;
    bb_spsc_pop(arg, &item);
    return NULL;
}

static double thread_cpu_seconds(pthread_t t)
{
    clockid_t clock;
    struct timespec ts;
    if (pthread_getcpuclockid(t, &clock) != 0 || clock_gettime(clock, &ts) != 0) return 0;
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* CPU use, in percent of one core, of a consumer blocked on an empty ring for
 * `seconds` (its spin phase included: it starts the moment it blocks). */
static bb_status measure_idle_cpu(double seconds, double *pct)
{
    bb_spsc q;
    BB_TRY(bb_spsc_init(&q, 64));
    pthread_t t;
    pthread_create(&t, NULL, idle_consumer, &q);
    double c0 = thread_cpu_seconds(t), t0 = bb_clock_seconds();
    struct timespec pause = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    nanosleep(&pause, NULL);
    double c1 = thread_cpu_seconds(t), t1 = bb_clock_seconds();
    bb_spsc_close(&q);
    pthread_join(t, NULL);
    bb_spsc_fini(&q);
    *pct = 100.0 * (c1 - c0) / (t1 - t0);
    return BB_OK;
}

int bb_bench_queue(int argc, char **argv)
{
    int64_t capacity = 1024, batch = 64, runs = 5;
    double seconds = 0.3;
    bool json = false;
    const bb_opt opts[] = {
        {"--capacity", BB_OPT_INT, &capacity, "N", "ring capacity in items (a power of two)", .min = 1,
         .max = 1 << 30},
        {"--batch", BB_OPT_INT, &batch, "B", "items per push_n/pop_n in the batched runs", .min = 1, .max = 1024},
        {"--seconds", BB_OPT_DOUBLE, &seconds, "S", "length of one measurement", .min = 0.01, .max = 600},
        {"--runs", BB_OPT_INT, &runs, "R", "measurements per queue; the median is reported", .min = 1, .max = 64},
        {"--json", BB_OPT_FLAG, &json, NULL, "print one JSON object instead of the table"},
        {0}};
    bb_status rc = bb_cli_parse("bench queue", opts, argc, argv, NULL);
    double spsc_batched = 0, spsc_single = 0, mutex_single = 0, mutex_batched = 0, idle_pct = 0;
    if (rc == BB_OK) rc = measure_median(false, (uint32_t)capacity, (uint32_t)batch, seconds, (int)runs, &spsc_batched);
    if (rc == BB_OK) rc = measure_median(false, (uint32_t)capacity, 1, seconds, (int)runs, &spsc_single);
    if (rc == BB_OK) rc = measure_median(true, (uint32_t)capacity, 1, seconds, (int)runs, &mutex_single);
    if (rc == BB_OK) rc = measure_median(true, (uint32_t)capacity, (uint32_t)batch, seconds, (int)runs, &mutex_batched);
    if (rc == BB_OK) rc = measure_idle_cpu(1.0, &idle_pct);
    if (rc != BB_OK) return bb_cli_report(rc, usage, summary, opts);

    if (json) {
        json_t *j = json_pack("{s:o, s:o, s:o, s:o, s:o, s:I, s:I, s:I}", "spsc_items_per_s",
                              bb_json_fixed(spsc_batched, 0), "spsc_single_items_per_s", bb_json_fixed(spsc_single, 0),
                              "mutex_items_per_s", bb_json_fixed(mutex_single, 0), "mutex_batched_items_per_s",
                              bb_json_fixed(mutex_batched, 0), "idle_consumer_cpu_pct", bb_json_fixed(idle_pct, 3),
                              "capacity", (json_int_t)capacity, "batch", (json_int_t)batch, "runs", (json_int_t)runs);
        bb_status rc = bb_json_write_line(stdout, j);
        json_decref(j);
        return rc == BB_OK ? BB_EXIT_OK : bb_cli_report(rc, usage, summary, opts);
    }
    printf("queue benchmark: capacity %lld, batch %lld, median of %lld runs of %.2f s, %d CPUs\n",
           (long long)capacity, (long long)batch, (long long)runs, seconds, bb_cpu_count());
    printf("  %-16s %10s  %s\n", "queue", "M items/s", "vs mutex (single)");
    printf("  %-16s %10.1f  %.1fx\n", "spsc (batched)", spsc_batched / 1e6, spsc_batched / mutex_single);
    printf("  %-16s %10.1f  %.1fx\n", "spsc (single)", spsc_single / 1e6, spsc_single / mutex_single);
    printf("  %-16s %10.1f  1.0x\n", "mutex (single)", mutex_single / 1e6);
    printf("  %-16s %10.1f  %.1fx\n", "mutex (batched)", mutex_batched / 1e6, mutex_batched / mutex_single);
    printf("  blocked consumer: %.3f%% of a core over 1 s\n", idle_pct);
    return BB_EXIT_OK;
}
