/* queue.h — bounded lock-free single-producer/single-consumer ring and the
 * futex wait strategy behind its blocking operations.
 *
 * How to use (one producer thread, one consumer thread):
 *   bb_spsc q;
 *   BB_TRY(bb_spsc_init(&q, 64));               // capacity: a power of two
 *   // producer                               // consumer
 *   BB_TRY(bb_spsc_push(&q, item));            void *item;
 *   bb_spsc_close(&q);                         while (bb_spsc_pop(&q, &item) == BB_OK) use(item);
 *   ...                                        // BB_ERR_CLOSED: closed and drained
 *   bb_spsc_fini(&q);                          // after both sides are done
 *
 * Items are pointers. The try_* calls never block and never take a lock:
 * the producer publishes with a release store of `tail`, the consumer
 * takes items with an acquire load of it (and the reverse for `head`); each
 * side keeps a cached copy of the other's index so that it touches the other
 * side's cache line only when the ring looks full (empty).
 *
 * The blocking calls spin briefly, then sleep on a futex, so an idle side
 * uses no CPU. Every successful push or pop then checks whether the other
 * side sleeps and wakes it only then. That check (a store followed by a load
 * of another location, on both sides) is the one place where acquire/release
 * is not enough; spsc.c explains how it is ordered.
 *
 * bb_spsc_close() may be called by either side or by a third thread; it wakes
 * both sides. After it, pushes fail with BB_ERR_CLOSED, and pops return the
 * items still queued, then BB_ERR_CLOSED. (A push racing with a close from a
 * third thread may still land after the consumer saw BB_ERR_CLOSED: a
 * shutdown, not a hand-over.)
 */
#ifndef BIGBATCH_QUEUE_H
#define BIGBATCH_QUEUE_H

#include <stdalign.h>
#include <stdatomic.h>

#include "bigbatch/core.h"

#define BB_CACHE_LINE 64

/* Caller-owned; all fields are private. Its members are cache-line
 * aligned: a heap object holding one needs aligned_alloc(BB_CACHE_LINE, ...). */
typedef struct bb_spsc {
    /* read-only after init */
    alignas(BB_CACHE_LINE) void **items;
    uint64_t mask;
    bool asymmetric;                  /* sleepers issue membarrier(2); see spsc.c */
    /* written by the producer */
    alignas(BB_CACHE_LINE) _Atomic uint64_t tail;
    uint64_t head_cache;              /* producer's last view of head */
    /* written by the consumer */
    alignas(BB_CACHE_LINE) _Atomic uint64_t head;
    uint64_t tail_cache;              /* consumer's last view of tail */
    /* sleeping and shutdown: touched only on the slow paths */
    alignas(BB_CACHE_LINE) _Atomic uint32_t items_seq;  /* futex: bumped when items arrive */
    _Atomic uint32_t space_seq;                         /* futex: bumped when space frees */
    _Atomic uint32_t consumer_sleeping;
    _Atomic uint32_t producer_sleeping;
    _Atomic uint32_t closed;
} bb_spsc;

/* Prepares an empty ring of `capacity` items. Fails with BB_ERR_ARG when
 * capacity is not a power of two in [1, 2^30], BB_ERR_NOMEM. */
bb_status bb_spsc_init(bb_spsc *q, uint32_t capacity);
/* Frees the ring; both sides must have stopped using it. Accepts a zeroed q. */
void bb_spsc_fini(bb_spsc *q);

uint32_t bb_spsc_capacity(const bb_spsc *q);
/* Items queued now; exact only when neither side is running. */
uint32_t bb_spsc_size(const bb_spsc *q);

/* ---- non-blocking (producer: push; consumer: pop) ---------------------- */
/* True when `item` was queued; false when the ring is full or closed. */
bool bb_spsc_try_push(bb_spsc *q, void *item);
/* True when an item was taken into *item; false when the ring is empty. */
bool bb_spsc_try_pop(bb_spsc *q, void **item);
/* Queue up to n items in order; returns how many (0 when full or closed). */
uint32_t bb_spsc_try_push_n(bb_spsc *q, void *const *items, uint32_t n);
/* Take up to n items in order into out; returns how many (0 when empty). */
uint32_t bb_spsc_try_pop_n(bb_spsc *q, void **out, uint32_t n);

/* ---- blocking: spin briefly, then sleep -------------------------------- */
/* Waits for space, then queues `item`. Fails with BB_ERR_CLOSED (no message
 * set: the caller knows why it closed) once the ring is closed. */
bb_status bb_spsc_push(bb_spsc *q, void *item);
/* Queues all n items in order, waiting for space as needed. Fails with
 * BB_ERR_CLOSED when the ring closes first; *pushed (may be NULL) then tells
 * how many were queued. */
bb_status bb_spsc_push_n(bb_spsc *q, void *const *items, uint32_t n, uint32_t *pushed);
/* Waits for an item. Fails with BB_ERR_CLOSED when the ring is closed and
 * empty. */
bb_status bb_spsc_pop(bb_spsc *q, void **item);
/* Waits for at least one item, then takes up to n (>= 1, else BB_ERR_ARG);
 * *popped gets the count. Fails with BB_ERR_CLOSED when the ring is closed
 * and empty. */
bb_status bb_spsc_pop_n(bb_spsc *q, void **out, uint32_t n, uint32_t *popped);

/* Marks the ring closed and wakes both sides. Idempotent. */
void bb_spsc_close(bb_spsc *q);
bool bb_spsc_is_closed(const bb_spsc *q);

/* ---- the wait primitives, for other lock-free structures --------------- */
/* Sleeps while *word == expected (returns at once otherwise; spurious
 * returns are possible: callers re-check their condition). */
void bb_futex_wait(_Atomic uint32_t *word, uint32_t expected);
/* Same, for at most timeout_ns nanoseconds (0: no limit). */
void bb_futex_wait_timeout(_Atomic uint32_t *word, uint32_t expected, uint64_t timeout_ns);
/* Wakes up to `count` threads sleeping on word (INT32_MAX: all). */
void bb_futex_wake(_Atomic uint32_t *word, int count);
/* A CPU hint for spin loops (x86 `pause`). */
static inline void bb_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif /* BIGBATCH_QUEUE_H */
