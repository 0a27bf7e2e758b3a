/* tsan_queue.c — the SPSC ring under ThreadSanitizer (`make tsan`): a
 * two-thread stress with every push/pop variant, with and without
 * membarrier(2), and close while the consumer is blocked. Exits non-zero on
 * a wrong count or order; TSan (halt_on_error=1) stops it on a race. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bigbatch/queue.h"

enum { COUNT = 1000000 };

typedef struct stress {
    bb_spsc q;
    uint64_t received, bad;
} stress;

static void *producer(void *arg)
{
    stress *s = arg;
    void *batch[37];
    for (uint64_t next = 1; next <= COUNT;) {
        uint32_t n = (uint32_t)(next % 37) + 1;
        if (n > COUNT - next + 1) n = (uint32_t)(COUNT - next + 1);
        for (uint32_t i = 0; i < n; i++) batch[i] = (void *)(uintptr_t)(next + i);
        if (n == 1 && bb_spsc_try_push(&s->q, batch[0])) {
            next++;
            continue;
        }
        if ((n == 1 ? bb_spsc_push(&s->q, batch[0]) : bb_spsc_push_n(&s->q, batch, n, NULL)) != BB_OK) break;
        next += n;
        if (next % 50000 < n) nanosleep(&(struct timespec){0, 200000}, NULL); /* let the consumer sleep */
    }
    bb_spsc_close(&s->q);
    return NULL;
}

static void *consumer(void *arg)
{
    stress *s = arg;
    void *out[64];
    uint64_t expect = 1;
    for (uint32_t round = 0;; round++) {
        uint32_t n = 1;
        bb_status st = round % 3 == 0 ? bb_spsc_pop(&s->q, out) : bb_spsc_pop_n(&s->q, out, 1 + round % 64, &n);
        if (st != BB_OK) break;
        for (uint32_t i = 0; i < n; i++, expect++) s->bad += (uintptr_t)out[i] != expect;
        if (round % 40000 == 0) nanosleep(&(struct timespec){0, 200000}, NULL); /* let the producer sleep */
    }
    s->received = expect - 1;
    return NULL;
}

static int run(uint32_t capacity, bool asymmetric)
{
    stress s = {0};
    if (bb_spsc_init(&s.q, capacity) != BB_OK) return 1;
    if (!asymmetric) s.q.asymmetric = false;
    pthread_t p, c;
    pthread_create(&c, NULL, consumer, &s);
    pthread_create(&p, NULL, producer, &s);
    pthread_join(p, NULL);
    pthread_join(c, NULL);
    bb_spsc_fini(&s.q);
    if (s.received != COUNT || s.bad) {
        fprintf(stderr, "tsan_queue: capacity %u: received %llu of %d, %llu out of order\n", capacity,
                (unsigned long long)s.received, COUNT, (unsigned long long)s.bad);
        return 1;
    }
    return 0;
}

static void *blocked_pop(void *arg)
{
    void *item;
    return (void *)(uintptr_t)bb_spsc_pop(arg, &item);
}

int main(void)
{
    if (run(64, true) || run(4, true) || run(64, false)) return 1;
    bb_spsc q;
    if (bb_spsc_init(&q, 8) != BB_OK) return 1;
    pthread_t t;
    pthread_create(&t, NULL, blocked_pop, &q);
    nanosleep(&(struct timespec){0, 50000000}, NULL);
    bb_spsc_close(&q);
    void *status;
    pthread_join(t, &status);
    bb_spsc_fini(&q);
    if ((bb_status)(uintptr_t)status != BB_ERR_CLOSED) {
        fprintf(stderr, "tsan_queue: close did not wake the blocked consumer with BB_ERR_CLOSED\n");
        return 1;
    }
    printf("tsan_queue: ok\n");
    return 0;
}
