/* test_queue.c — the SPSC ring: semantics, a 10^8-item two-thread stress,
 * blocking, sleeping and close. */
#include <pthread.h>
#include <time.h>

#include <jansson.h>

#include "bigbatch/queue.h"
#include "test_util.h"

#define ITEM(i) ((void *)(uintptr_t)(i))

Test(queue, rejects_capacities_that_are_not_powers_of_two)
{
    bb_spsc q;
    cr_assert_eq(bb_spsc_init(&q, 0), BB_ERR_ARG);
    cr_assert_eq(bb_spsc_init(&q, 12), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "power of two"));
    cr_assert_eq(bb_spsc_init(&q, 1), BB_OK);
    cr_assert_eq(bb_spsc_capacity(&q), 1);
    bb_spsc_fini(&q);
}

Test(queue, fifo_order_full_and_empty)
{
    bb_spsc q;
    cr_assert_eq(bb_spsc_init(&q, 4), BB_OK);
    void *item;
    cr_assert_not(bb_spsc_try_pop(&q, &item));
    for (uintptr_t i = 1; i <= 4; i++) cr_assert(bb_spsc_try_push(&q, ITEM(i)));
    cr_assert_not(bb_spsc_try_push(&q, ITEM(5)), "a full ring accepted a fifth item");
    cr_assert_eq(bb_spsc_size(&q), 4);
    /* Many rounds so the indices wrap the 4-slot array again and again. */
    for (uintptr_t i = 1; i <= 1000; i++) {
        cr_assert(bb_spsc_try_pop(&q, &item));
        cr_assert_eq((uintptr_t)item, i);
        cr_assert(bb_spsc_try_push(&q, ITEM(i + 4)));
    }
    cr_assert_eq(bb_spsc_size(&q), 4);
    bb_spsc_fini(&q);
}

Test(queue, batched_operations_are_partial_at_the_edges)
{
    bb_spsc q;
    cr_assert_eq(bb_spsc_init(&q, 8), BB_OK);
    void *in[12], *out[12];
    for (uintptr_t i = 0; i < 12; i++) in[i] = ITEM(100 + i);
    cr_assert_eq(bb_spsc_try_push_n(&q, in, 5), 5);
    cr_assert_eq(bb_spsc_try_push_n(&q, in + 5, 7), 3, "only 3 slots were free");
    cr_assert_eq(bb_spsc_try_push_n(&q, in + 8, 4), 0);
    cr_assert_eq(bb_spsc_try_pop_n(&q, out, 6), 6);
    cr_assert_eq(bb_spsc_try_push_n(&q, in + 8, 4), 4);
    cr_assert_eq(bb_spsc_try_pop_n(&q, out + 6, 12), 6);
    for (uintptr_t i = 0; i < 12; i++) cr_assert_eq((uintptr_t)out[i], 100 + i, "item %zu", (size_t)i);
    cr_assert_eq(bb_spsc_try_pop_n(&q, out, 12), 0);
    uint32_t popped = 7;
    cr_assert_eq(bb_spsc_try_push_n(&q, in, 1), 1);
    cr_assert_eq(bb_spsc_pop_n(&q, out, 0, &popped), BB_ERR_ARG, "n = 0 must not spin for ever");
    cr_assert_eq(popped, 0);
    bb_spsc_fini(&q);
}

Test(queue, close_drains_then_reports_closed)
{
    bb_spsc q;
    cr_assert_eq(bb_spsc_init(&q, 4), BB_OK);
    cr_assert_eq(bb_spsc_push(&q, ITEM(7)), BB_OK);
    bb_spsc_close(&q);
    bb_spsc_close(&q);
    cr_assert(bb_spsc_is_closed(&q));
    cr_assert_eq(bb_spsc_push(&q, ITEM(8)), BB_ERR_CLOSED);
    cr_assert_not(bb_spsc_try_push(&q, ITEM(8)));
    void *item;
    cr_assert_eq(bb_spsc_pop(&q, &item), BB_OK);
    cr_assert_eq((uintptr_t)item, 7);
    cr_assert_eq(bb_spsc_pop(&q, &item), BB_ERR_CLOSED);
    bb_spsc_fini(&q);
}

/* ---- two threads ------------------------------------------------------ */
struct stress {
    bb_spsc q;
    uint64_t count;
    uint64_t received;
    uint64_t first_bad; /* index of the first out-of-order item, or UINT64_MAX */
    bb_status push_status; /* threads record, the test thread asserts */
    uint32_t pause_every;   /* when non-zero, each side naps now and then so the other sleeps */
};

static void nap(void)
{
    struct timespec ts = {0, 300000};
    nanosleep(&ts, NULL);
}

/* Pushes 1..count with a mix of single and batched blocking pushes. */
static void *stress_producer(void *arg)
{
    struct stress *s = arg;
    void *batch[61];
    uint64_t next = 1;
    while (next <= s->count) {
        uint32_t n = (uint32_t)(next % 61) + 1;
        if (n > s->count - next + 1) n = (uint32_t)(s->count - next + 1);
        for (uint32_t i = 0; i < n; i++) batch[i] = ITEM(next + i);
        if (s->pause_every && next % s->pause_every < n) nap();
        s->push_status = n == 1 ? bb_spsc_push(&s->q, batch[0]) : bb_spsc_push_n(&s->q, batch, n, NULL);
        if (s->push_status != BB_OK) break;
        next += n;
    }
    bb_spsc_close(&s->q);
    return NULL;
}

static void *stress_consumer(void *arg)
{
    struct stress *s = arg;
    void *out[64];
    uint64_t expect = 1;
    s->first_bad = UINT64_MAX;
    for (uint32_t round = 0;; round++) {
        uint32_t n = 1;
        bb_status st = (round & 3) == 0 ? bb_spsc_pop(&s->q, out) : bb_spsc_pop_n(&s->q, out, 1 + round % 64, &n);
        if (st == BB_ERR_CLOSED) break;
        if (s->pause_every && round % (s->pause_every + 17) == 0) nap();
        for (uint32_t i = 0; i < n; i++, expect++)
            if ((uintptr_t)out[i] != expect && s->first_bad == UINT64_MAX) s->first_bad = expect;
    }
    s->received = expect - 1;
    return NULL;
}

static void run_stress(uint64_t count, uint32_t capacity, bool asymmetric, uint32_t pause_every)
{
    struct stress s = {.count = count, .pause_every = pause_every};
    cr_assert_eq(bb_spsc_init(&s.q, capacity), BB_OK);
    if (!asymmetric) s.q.asymmetric = false; /* the fallback without membarrier(2) */
    pthread_t p, c;
    cr_assert_eq(pthread_create(&c, NULL, stress_consumer, &s), 0);
    cr_assert_eq(pthread_create(&p, NULL, stress_producer, &s), 0);
    pthread_join(p, NULL);
    pthread_join(c, NULL);
    cr_assert_eq(s.push_status, BB_OK);
    cr_assert_eq(s.first_bad, UINT64_MAX, "item %llu arrived out of order", (unsigned long long)s.first_bad);
    cr_assert_eq(s.received, count, "received %llu of %llu items", (unsigned long long)s.received,
                 (unsigned long long)count);
    bb_spsc_fini(&s.q);
}

Test(queue, two_threads_pass_1e8_items_in_order, .timeout = 240)
{
    run_stress(100000000, 1024, true, 0);
}

/* Small rings where each side naps now and then, long enough for the other
 * to go to sleep in the futex: a lost wake-up hangs here (and hits the
 * timeout). Once with membarrier(2) ordering the handshake, once without. */
Test(queue, sleeping_sides_never_lose_a_wakeup, .timeout = 120)
{
    run_stress(200000, 1, true, 0);
    run_stress(1000000, 4, true, 1000);
}

Test(queue, sleeping_sides_without_membarrier, .timeout = 120)
{
    run_stress(200000, 1, false, 0);
    run_stress(1000000, 4, false, 1000);
}

struct blocked {
    bb_spsc *q;
    bb_status status;
    _Atomic pid_t tid; /* set once the thread runs */
};

static void *blocked_pop(void *arg)
{
    struct blocked *b = arg;
    void *item;
    atomic_store(&b->tid, tu_thread_id());
    b->status = bb_spsc_pop(b->q, &item);
    return NULL;
}

static void *blocked_push(void *arg)
{
    struct blocked *b = arg;
    atomic_store(&b->tid, tu_thread_id());
    b->status = bb_spsc_push(b->q, ITEM(2));
    return NULL;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void close_wakes(void *(*side)(void *), bool fill_first)
{
    bb_spsc q;
    cr_assert_eq(bb_spsc_init(&q, 1), BB_OK);
    if (fill_first) cr_assert(bb_spsc_try_push(&q, ITEM(1)));
    struct blocked b = {.q = &q, .status = BB_OK};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, side, &b), 0);
    while (!atomic_load(&b.tid)) sleep_ms(1);
    cr_assert(tu_wait_blocked(atomic_load(&b.tid), 10), "the thread never slept in the futex"); /* past the spin phase */
    bb_spsc_close(&q);
    pthread_join(t, NULL);
    cr_assert_eq(b.status, BB_ERR_CLOSED);
    bb_spsc_fini(&q);
}

Test(queue, close_wakes_a_blocked_consumer, .timeout = 20) { close_wakes(blocked_pop, false); }

Test(queue, close_wakes_a_blocked_producer, .timeout = 20) { close_wakes(blocked_push, true); }

/* The wait strategy: a consumer blocked on an empty ring sleeps instead of
 * spinning. Over 300 ms it may use its short spin phase, nothing close to
 * the 300 ms a busy loop would burn. */
Test(queue, blocked_consumer_sleeps, .timeout = 20)
{
    bb_spsc q;
    cr_assert_eq(bb_spsc_init(&q, 8), BB_OK);
    struct blocked b = {.q = &q};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, blocked_pop, &b), 0);
    while (!atomic_load(&b.tid)) sleep_ms(1);
    clockid_t clock;
    cr_assert_eq(pthread_getcpuclockid(t, &clock), 0);
    struct timespec a, z;
    cr_assert(tu_wait_blocked(atomic_load(&b.tid), 10), "the consumer never slept in the futex"); /* past the spin phase */
    clock_gettime(clock, &a);
    sleep_ms(300);
    clock_gettime(clock, &z);
    double cpu_ms = (z.tv_sec - a.tv_sec) * 1e3 + (z.tv_nsec - a.tv_nsec) / 1e6;
    cr_assert_lt(cpu_ms, 15.0, "the blocked consumer used %.1f ms of CPU in 300 ms", cpu_ms);
    cr_assert_eq(bb_spsc_push(&q, ITEM(9)), BB_OK);
    pthread_join(t, NULL);
    cr_assert_eq(b.status, BB_OK, "the pushed item woke the consumer");
    bb_spsc_fini(&q);
}

/* `bigbatch bench queue --json`: the keys perf/ and users read, with
 * plausible values (the figures themselves belong in perf/RESULTS.md). No
 * .timeout: with Criterion 2.4.1, two overlapping tests with timeouts under
 * --jobs 2 can leak the runner's timer, which LeakSanitizer reports. */
Test(queue, bench_queue_json)
{
    tu_run r = tu_bigbatch("bench", "queue", "--json", "--seconds", "0.02", "--runs", "1");
    cr_assert_eq(r.exit_code, 0, "stderr: %s", r.err);
    json_error_t jerr;
    json_t *doc = json_loads(r.out, 0, &jerr);
    cr_assert_not_null(doc, "not JSON (%s): %s", jerr.text, r.out);
    /* counts, not speeds: how fast is perf/'s business, on a quiet machine */
    const char *rates[] = {"spsc_items_per_s", "mutex_items_per_s"};
    for (size_t i = 0; i < 2; i++) {
        json_t *v = json_object_get(doc, rates[i]);
        cr_assert(json_is_number(v) && json_number_value(v) > 0, "%s missing or not positive in %s", rates[i], r.out);
    }
    json_t *idle = json_object_get(doc, "idle_consumer_cpu_pct");
    cr_assert(json_is_number(idle), "no idle_consumer_cpu_pct in %s", r.out);
    double pct = json_number_value(idle);
    cr_assert(pct >= 0 && pct < 10, "a blocked consumer used %g%% of a core", pct);
    json_decref(doc);
    tu_run_free(&r);
    r = tu_bigbatch("bench", "queue", "--capacity", "1000");
    tu_assert_error(&r, "power of two");
    tu_run_free(&r);
}
