/* loader_internal.h — private: the loader's shared state.
 *
 * Work is cut into units, one per (step, micro-step, device) in delivery
 * order: unit u of the run goes to device u % devices and is filled by
 * thread u % threads. Each (thread, device) pair has its own SPSC rings:
 * "ready" (thread -> device) and "free" (device -> thread), so every ring
 * keeps one producer and one consumer, and the device reads unit u from the
 * ready ring of thread u % threads.
 *
 * Frames are decompressed once per epoch into a per-epoch frame table shared
 * by the threads: a thread that needs a frame nobody has claimed claims the
 * next few frames of the epoch's frame order (a CAS on `claim_cursor`),
 * reads them in one io batch and publishes each as READY; threads needing a
 * claimed frame sleep on its state word. A claimer waits for nothing but a
 * streamed shard's bytes while it holds claims (bb_dataset_await_frame:
 * the download waits on no loader thread), so frame waits never form a
 * cycle (and epoch waits cannot either, see bb_loader_enter_epoch). Each frame counts the records
 * still to be copied out of it and is freed when that reaches 0.
 */
#ifndef BIGBATCH_DATA_LOADER_INTERNAL_H
#define BIGBATCH_DATA_LOADER_INTERNAL_H

#include <pthread.h>

#include "bigbatch/queue.h"
#include "io.h"
#include "sampler.h"

enum { FRAME_EMPTY = 0, FRAME_READY = 1, FRAME_FAILED = 2 };

typedef struct frame_entry {
    _Atomic uint32_t state;      /* FRAME_*: futex word */
    _Atomic uint32_t remaining;  /* records still to copy out this epoch */
    uint8_t *data;               /* decompressed frame while remaining > 0 */
} frame_entry;

typedef struct epoch_table {
    uint64_t epoch;              /* UINT64_MAX: unused */
    bb_epoch_order_t *order;
    frame_entry *entries;        /* (frames) by order position */
    _Atomic uint32_t claim_cursor; /* order positions below it are claimed */
} epoch_table;

typedef struct slot {
    uint8_t *data;               /* micro_batch * record_size, host memory */
    uint64_t *ids;               /* (micro_batch) */
    uint32_t thread, device;
    uint64_t unit;
    uint64_t epoch, step;
    uint32_t micro_step;
    bb_status status;            /* not BB_OK: the unit failed; see loader error */
} slot;

typedef struct pair_rings {
    bb_spsc ready, free;
    slot *slots;                 /* NULL for pairs that never carry a unit */
    uint32_t slot_count;
} pair_rings;

typedef struct thread_state {
    struct bb_loader *loader;
    uint32_t index;
    pthread_t thread;
    bool started;
    bb_io_t *io;
    bb_frame_decoder_t *decoder;
    /* counters, written by this thread only */
    _Atomic uint64_t frames, compressed_bytes, raw_bytes;
    _Atomic uint64_t frame_wait_ns, slot_wait_ns;
    _Atomic uint64_t io_ns, decompress_ns, copy_ns; /* where its time went (bb_loader_stats) */
} thread_state;

struct bb_loader {
    const bb_dataset_t *ds;
    bb_loader_options opt;
    bb_sampler_t *sampler;
    uint32_t record_size, frames, max_frame_bytes;
    uint64_t global_batch, steps_per_epoch, dropped;
    uint32_t world_devices;                    /* opt.world_devices, or opt.devices */
    uint64_t units_per_epoch, first_unit_step; /* the run starts at absolute step first_unit_step */
    uint64_t total_units;                      /* UINT64_MAX when steps == 0 */
    int *direct_fds;                           /* (shards) when opt.direct */
    char io_description[64];

    thread_state *threads;
    pair_rings *pairs;                         /* [thread * devices + device] */
    uint64_t *next_unit;                       /* (devices) each consumer's next unit */
    uint32_t *held;                            /* (devices) batches taken, not yet released */
    _Atomic uint64_t *wait_ns;                 /* (devices) */
    _Atomic uint64_t batches;

    /* epochs: two tables, recycled once every thread has moved past */
    pthread_mutex_t epoch_lock;
    pthread_cond_t epoch_changed;
    epoch_table tables[2];
    uint64_t *thread_epoch;                    /* (threads) epoch each thread works in */

    /* decompressed-frame buffers */
    pthread_mutex_t pool_lock;
    uint8_t **pool;
    uint32_t pool_count, pool_capacity;

    /* first error, shared with every consumer */
    pthread_mutex_t error_lock;
    bb_status error;
    char error_message[512];
    _Atomic bool failed, stopping;
};

/* loader_thread.c */
void *bb_loader_thread_main(void *arg);

/* loader.c, used by the threads */
bb_status bb_loader_enter_epoch(struct bb_loader *l, uint32_t thread, uint64_t epoch, epoch_table **table);
void bb_loader_record_error(struct bb_loader *l, bb_status status);
uint8_t *bb_loader_pool_get(struct bb_loader *l);
void bb_loader_pool_put(struct bb_loader *l, uint8_t *buffer);

#endif
