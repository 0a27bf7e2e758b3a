/* spsc.c — the bounded single-producer/single-consumer ring (see queue.h).
 *
 * Indices grow without bound (64 bits never wrap in practice) and are
 * reduced with `mask`; tail - head is the number of queued items. */
#include <linux/membarrier.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "bigbatch/queue.h"

/* How a blocked side waits: first it polls with `pause` (the other side is
 * likely running and about to act), then it polls with sched_yield() (the
 * other side may be waiting for our CPU: threads outnumber cores), then it
 * sleeps in the futex. About 10 microseconds of spinning plus a few yields:
 * an idle side sleeps almost at once. */
#define SPIN_ROUNDS 256
#define YIELD_ROUNDS 32

/* One round of waiting; false when it is time to sleep. */
static inline bool wait_round(unsigned round)
{
    if (round < SPIN_ROUNDS) {
        bb_cpu_relax();
        return true;
    }
    if (round < SPIN_ROUNDS + YIELD_ROUNDS) {
        sched_yield();
        return true;
    }
    return false;
}

/* The handshake with a sleeper is Dekker's: each side stores (our index,
 * its "sleeping" flag) and then loads what the other stored, so a store
 * must not pass the following load; acquire/release does not forbid that.
 * Where the kernel offers it, the sleeping side pays for the ordering with
 * membarrier(2), which makes every running thread of the process execute a
 * full barrier, and the hot path needs only a compiler barrier. Elsewhere
 * both sides use sequentially consistent accesses (a locked instruction per
 * call on x86, shared by all the items of a batch). */
static int asymmetric_state; /* 0: not probed, 1: membarrier usable, -1: not */

static bool asymmetric_barrier_available(void)
{
    int state = __atomic_load_n(&asymmetric_state, __ATOMIC_ACQUIRE);
    if (state == 0) {
        state = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 ? 1 : -1;
        __atomic_store_n(&asymmetric_state, state, __ATOMIC_RELEASE);
    }
    return state == 1;
}

/* Publishes our new index, then wakes the other side if it sleeps. */
static inline void publish_and_wake(bb_spsc *q, _Atomic uint64_t *index, uint64_t value,
                                    _Atomic uint32_t *sleeping, _Atomic uint32_t *seq)
{
    bool other_sleeps;
    if (q->asymmetric) {
        atomic_store_explicit(index, value, memory_order_release);
        atomic_signal_fence(memory_order_seq_cst);
        other_sleeps = atomic_load_explicit(sleeping, memory_order_relaxed);
    } else {
        atomic_store_explicit(index, value, memory_order_seq_cst);
        other_sleeps = atomic_load_explicit(sleeping, memory_order_seq_cst);
    }
    if (other_sleeps) {
        atomic_fetch_add_explicit(seq, 1, memory_order_release);
        bb_futex_wake(seq, 1);
    }
}

bb_status bb_spsc_init(bb_spsc *q, uint32_t capacity)
{
    *q = (bb_spsc){0};
    if (capacity == 0 || capacity > (1u << 30) || (capacity & (capacity - 1)) != 0)
        return bb_fail(BB_ERR_ARG, "queue capacity %u is not a power of two in [1, 2^30]", capacity);
    q->items = calloc(capacity, sizeof *q->items);
    if (!q->items) return bb_fail(BB_ERR_NOMEM, "queue of %u items: out of memory", capacity);
    q->mask = capacity - 1;
    q->asymmetric = asymmetric_barrier_available();
    return BB_OK;
}

void bb_spsc_fini(bb_spsc *q)
{
    free(q->items);
    *q = (bb_spsc){0};
}

uint32_t bb_spsc_capacity(const bb_spsc *q) { return (uint32_t)(q->mask + 1); }

uint32_t bb_spsc_size(const bb_spsc *q)
{
    uint64_t head = atomic_load_explicit(&q->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&q->tail, memory_order_acquire);
    return (uint32_t)(tail - head);
}

uint32_t bb_spsc_try_push_n(bb_spsc *q, void *const *items, uint32_t n)
{
    if (atomic_load_explicit(&q->closed, memory_order_relaxed)) return 0;
    uint64_t tail = atomic_load_explicit(&q->tail, memory_order_relaxed);
    uint64_t capacity = q->mask + 1;
    if (capacity - (tail - q->head_cache) < n)
        q->head_cache = atomic_load_explicit(&q->head, memory_order_acquire);
    uint64_t space = capacity - (tail - q->head_cache);
    if (n > space) n = (uint32_t)space;
    if (n == 0) return 0;
    for (uint32_t i = 0; i < n; i++) q->items[(tail + i) & q->mask] = items[i];
    publish_and_wake(q, &q->tail, tail + n, &q->consumer_sleeping, &q->items_seq);
    return n;
}

uint32_t bb_spsc_try_pop_n(bb_spsc *q, void **out, uint32_t n)
{
    uint64_t head = atomic_load_explicit(&q->head, memory_order_relaxed);
    if (q->tail_cache - head < n)
        q->tail_cache = atomic_load_explicit(&q->tail, memory_order_acquire);
    uint64_t avail = q->tail_cache - head;
    if (n > avail) n = (uint32_t)avail;
    if (n == 0) return 0;
    for (uint32_t i = 0; i < n; i++) out[i] = q->items[(head + i) & q->mask];
    publish_and_wake(q, &q->head, head + n, &q->producer_sleeping, &q->space_seq);
    return n;
}

bool bb_spsc_try_push(bb_spsc *q, void *item) { return bb_spsc_try_push_n(q, &item, 1) == 1; }

bool bb_spsc_try_pop(bb_spsc *q, void **item) { return bb_spsc_try_pop_n(q, item, 1) == 1; }

/* Sleeps until `seq` moves, unless the condition we wait for (re-read after
 * announcing ourselves) already holds. */
static void sleep_until_change(bb_spsc *q, _Atomic uint32_t *sleeping, _Atomic uint32_t *seq,
                               bool (*ready)(bb_spsc *q))
{
    uint32_t seen = atomic_load_explicit(seq, memory_order_acquire);
    atomic_store_explicit(sleeping, 1, memory_order_seq_cst);
    bool fenced = !q->asymmetric || syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0;
    /* Without the barrier (membarrier refused, e.g. by a seccomp policy set
     * after the probe) a wake-up may be missed: sleep 1 ms at most. */
    if (!ready(q)) bb_futex_wait_timeout(seq, seen, fenced ? 0 : 1000000);
    atomic_store_explicit(sleeping, 0, memory_order_relaxed);
}

static bool has_items_or_closed(bb_spsc *q)
{
    return atomic_load_explicit(&q->tail, memory_order_seq_cst) !=
               atomic_load_explicit(&q->head, memory_order_relaxed) ||
           atomic_load_explicit(&q->closed, memory_order_seq_cst);
}

static bool has_space_or_closed(bb_spsc *q)
{
    return atomic_load_explicit(&q->head, memory_order_seq_cst) + q->mask + 1 !=
               atomic_load_explicit(&q->tail, memory_order_relaxed) ||
           atomic_load_explicit(&q->closed, memory_order_seq_cst);
}

bb_status bb_spsc_push_n(bb_spsc *q, void *const *items, uint32_t n, uint32_t *pushed)
{
    uint32_t done = 0;
    for (unsigned spin = 0; done < n;) {
        if (atomic_load_explicit(&q->closed, memory_order_acquire)) break;
        uint32_t k = bb_spsc_try_push_n(q, items + done, n - done);
        done += k;
        if (k)
            spin = 0;
        else if (!wait_round(spin++))
            sleep_until_change(q, &q->producer_sleeping, &q->space_seq, has_space_or_closed);
    }
    if (pushed) *pushed = done;
    return done == n ? BB_OK : BB_ERR_CLOSED;
}

bb_status bb_spsc_push(bb_spsc *q, void *item) { return bb_spsc_push_n(q, &item, 1, NULL); }

bb_status bb_spsc_pop_n(bb_spsc *q, void **out, uint32_t n, uint32_t *popped)
{
    *popped = 0;
    if (n == 0) return bb_fail(BB_ERR_ARG, "bb_spsc_pop_n: n must be at least 1");
    for (unsigned spin = 0;; spin++) {
        uint32_t k = bb_spsc_try_pop_n(q, out, n);
        if (k) {
            *popped = k;
            return BB_OK;
        }
        if (atomic_load_explicit(&q->closed, memory_order_acquire)) {
            /* Items pushed just before the close are still ours. */
            *popped = bb_spsc_try_pop_n(q, out, n);
            return *popped ? BB_OK : BB_ERR_CLOSED;
        }
        if (!wait_round(spin))
            sleep_until_change(q, &q->consumer_sleeping, &q->items_seq, has_items_or_closed);
    }
}

bb_status bb_spsc_pop(bb_spsc *q, void **item)
{
    uint32_t popped;
    return bb_spsc_pop_n(q, item, 1, &popped);
}

void bb_spsc_close(bb_spsc *q)
{
    atomic_store_explicit(&q->closed, 1, memory_order_seq_cst);
    atomic_fetch_add_explicit(&q->items_seq, 1, memory_order_release);
    atomic_fetch_add_explicit(&q->space_seq, 1, memory_order_release);
    bb_futex_wake(&q->items_seq, INT32_MAX);
    bb_futex_wake(&q->space_seq, INT32_MAX);
}

bool bb_spsc_is_closed(const bb_spsc *q)
{
    return atomic_load_explicit(&q->closed, memory_order_acquire) != 0;
}
