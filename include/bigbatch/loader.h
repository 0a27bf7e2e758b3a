/* loader.h — the deterministic sampler and the streaming loader: shard
 * frames read with io_uring (or pread), decompressed once per epoch, records
 * copied into batch slots and handed to each device's worker over lock-free
 * rings.
 *
 * How to use (one consumer thread per device):
 *   bb_loader_options o;
 *   bb_loader_defaults(&o);
 *   o.devices = 2; o.accumulation = 4; o.micro_batch = 32;   // G = 256
 *   bb_loader_t *l;
 *   BB_TRY(bb_loader_create(ds, &o, &l));
 *   bb_batch b;                                   // on device d's thread:
 *   while (bb_loader_next(l, d, &b) == BB_OK) {   // BB_ERR_CLOSED: all steps done
 *       train_on(b.data, b.count);                // b.step, b.micro_step, b.record_ids
 *       bb_loader_release(l, &b);
 *   }
 *   bb_loader_destroy(l);                         // also fine mid-epoch
 *
 * The epoch order is a pure function of (seed, epoch, dataset layout):
 *   1. the dataset's data frames (all shards, in order) are permuted with a
 *      Fisher-Yates shuffle driven by splitmix64(seed, epoch);
 *   2. the permutation is cut into W = ceil(F / shuffle_frames) windows of
 *      consecutive frames whose sizes differ by one frame at most (order
 *      version 2, BB_ORDER_BALANCED; version 1, BB_ORDER_FIXED_WINDOWS,
 *      cut runs of exactly shuffle_frames with the remainder last: a run
 *      resumed from a checkpoint of before keeps it); the records of window
 *      w are shuffled among themselves (splitmix64(seed, epoch, w)); the
 *      epoch's order is window 0's records, then window 1's, and so on.
 *      shuffle_frames >= F is one window: a global record shuffle.
 * Global step s of an epoch owns positions [s*G, (s+1)*G) with
 * G = devices * accumulation * micro_batch; micro-step m of device d takes
 * positions s*G + (m*devices + d)*micro_batch onward. The set of records in a
 * step therefore does not depend on how G is split, nor on thread count, io
 * backend or timing. The last N mod G records of each epoch are dropped.
 */
#ifndef BIGBATCH_LOADER_H
#define BIGBATCH_LOADER_H

#include "bigbatch/shard.h"

/* ---- the sampler ------------------------------------------------------- */
typedef struct bb_sampler bb_sampler_t;

/* The order's versions (above); BB_ORDER_CURRENT is what new runs use. */
enum { BB_ORDER_FIXED_WINDOWS = 1, BB_ORDER_BALANCED = 2, BB_ORDER_CURRENT = BB_ORDER_BALANCED };

/* Describes `ds` (which must outlive the sampler) for ordering under
 * `order` (a version above). Fails with BB_ERR_ARG when shuffle_frames is
 * 0 or the version unknown, BB_ERR_NOMEM. */
bb_status bb_sampler_create(const bb_dataset_t *ds, uint64_t seed, uint32_t shuffle_frames, uint32_t order,
                            bb_sampler_t **out);
/* How well one epoch's global batches (G consecutive positions, the last
 * N mod G records dropped) mix the data: the distinct frames a batch's
 * records come from (at most min(G, frames)), and how far apart in the
 * source (dataset-wide record index) they lie, as a share of the dataset. */
typedef struct bb_order_stats {
    uint64_t batches;
    uint32_t frames;                /* the dataset's */
    uint32_t frames_per_batch_min, frames_per_batch_median, frames_per_batch_max;
    double spread_min, spread_median; /* (largest - smallest index) / records, per batch */
} bb_order_stats;
/* Over epoch `epoch` of `s`. Fails with BB_ERR_ARG when G is 0 or above
 * the record count, BB_ERR_NOMEM. */
bb_status bb_sampler_order_stats(const bb_sampler_t *s, uint64_t epoch, uint64_t G, bb_order_stats *out);
void bb_sampler_destroy(bb_sampler_t *s);
uint64_t bb_sampler_record_count(const bb_sampler_t *s);
/* The data frames of a dataset: what a shuffle window counts. */
uint32_t bb_sampler_frame_count_of(const bb_dataset_t *ds);
uint32_t bb_sampler_frame_count(const bb_sampler_t *s);
/* Dataset-wide record indices at positions [first, first + count) of
 * `epoch`'s order. Fails with BB_ERR_ARG past the end, BB_ERR_NOMEM. */
bb_status bb_sampler_epoch_ids(const bb_sampler_t *s, uint64_t epoch, uint64_t first, uint64_t count,
                               uint64_t *ids);

/* ---- the loader -------------------------------------------------------- */
typedef enum bb_io_mode {
    BB_IO_AUTO = 0, /* io_uring; pread with one warning when io_uring cannot start */
    BB_IO_URING,    /* io_uring or fail */
    BB_IO_PREAD,
} bb_io_mode;

/* The parser for --io: "auto", "uring", "pread". */
bb_status bb_io_mode_parse(const char *s, bb_io_mode *out);

#define BB_SHUFFLE_FRAMES_DEFAULT 8 /* frames per shuffle window: the data order depends on it */
/* What train lets the loader hold for a global shuffle (one window of every
 * frame) when no window is asked for: 1 GiB, small beside a training
 * node's RAM, and past Fashion-MNIST (47 MB), CIFAR-10 (150 MB) or 256M
 * tokens of uint16 (512 MB). */
#define BB_SHUFFLE_MEMORY_DEFAULT ((uint64_t)1 << 30)
#define BB_LOADER_THREADS_DEFAULT 2
#define BB_LOADER_HOLD_TRAINING 3   /* a training device's batches: one in use, two whose uploads may still read them */

typedef struct bb_loader_options {
    uint64_t seed;
    uint32_t shuffle_frames;  /* frames per shuffle window (default BB_SHUFFLE_FRAMES_DEFAULT) */
    uint32_t order;           /* the order's version (BB_ORDER_*); 0: BB_ORDER_CURRENT */
    uint32_t devices;         /* consumers, one per device (default 1) */
    uint32_t world_devices;   /* the devices of every process of the job; 0: `devices` (alone) */
    uint32_t first_device;    /* this process's first device among world_devices: its devices
                                 d take global device first_device + d's records, and the
                                 loader reads only frames that hold some of them */
    uint32_t accumulation;    /* micro-steps per step (default 1) */
    uint32_t micro_batch;     /* records per batch (default 32) */
    uint64_t start_epoch;     /* first batch delivered: (start_epoch, start_step) */
    uint64_t start_step;
    uint64_t steps;           /* global steps to deliver; 0: until destroyed */
    uint32_t threads;         /* loader threads (default BB_LOADER_THREADS_DEFAULT) */
    uint32_t prefetch;        /* batches prepared ahead per device; 0 (default): 16,
                                 fewer for batches over 4 MiB */
    uint32_t hold;            /* batches a device may keep unreleased at once (default 2) */
    bb_io_mode io;
    uint32_t io_depth;        /* reads in flight per thread (default 8) */
    bool direct;              /* O_DIRECT reads through aligned buffers */
    /* Slot memory (pinned on CUDA); NULL: page-aligned host memory. */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *ptr, size_t bytes);
    void *host_ctx;
} bb_loader_options;

void bb_loader_defaults(bb_loader_options *o);
/* The prefetch policy of training: the defaults for `devices` devices at
 * `micro_batch` with `threads` loader threads (0: the default), each device
 * holding BB_LOADER_HOLD_TRAINING batches — what the trainer runs and the
 * planner counts as host memory. */
void bb_loader_training_options(int devices, int micro_batch, int threads, bb_loader_options *o);
/* The shuffle window a run uses for `frames` (0: the default). */
static inline uint32_t bb_shuffle_frames_or_default(uint32_t frames)
{
    return frames ? frames : BB_SHUFFLE_FRAMES_DEFAULT;
}
/* Host bytes of one device's batch slots (data and record ids) for records
 * of `record_size` bytes under options `o` (threads, devices, micro_batch,
 * prefetch, hold): what the loader allocates per device, its prefetched
 * batches plus `hold` per thread serving the device. Never fails. */
uint64_t bb_loader_slot_bytes(const bb_loader_options *o, size_t record_size);

typedef struct bb_loader bb_loader_t;

/* Starts the loader threads on `ds` (which must outlive the loader). Fails
 * with BB_ERR_ARG on bad options or when the dataset holds fewer records
 * than one global batch, BB_ERR_UNSUPPORTED when io is BB_IO_URING and
 * io_uring cannot start or --direct is not supported by the filesystem,
 * BB_ERR_IO, BB_ERR_NOMEM. */
bb_status bb_loader_create(const bb_dataset_t *ds, const bb_loader_options *o, bb_loader_t **out);
/* Stops the loader without freeing it: every thread blocked in
 * bb_loader_next() returns BB_ERR_CLOSED. Call it when a device's thread
 * gives up (the others would wait for ever for batches stuck behind it),
 * then join the device threads, then destroy. */
void bb_loader_stop(bb_loader_t *l);
/* Stops and joins the loader threads, frees every slot and buffer; accepts
 * NULL. No thread may be inside bb_loader_next/release (see
 * bb_loader_stop). Batches not yet released become invalid. */
void bb_loader_destroy(bb_loader_t *l);

typedef struct bb_batch {
    uint64_t epoch;
    uint64_t step;             /* within the epoch */
    uint32_t micro_step;       /* 0 .. accumulation-1 */
    uint32_t device;
    uint32_t count;            /* records: the micro-batch size */
    uint32_t record_size;      /* bytes per record */
    const uint8_t *data;       /* (count, record_size) in slot memory */
    const uint64_t *record_ids; /* (count) dataset-wide record indices */
    uint64_t wait_ns;          /* time bb_loader_next waited for this batch */
    void *slot;                /* private */
} bb_batch;

/* Waits for device's next batch (micro-steps in order, step after step).
 * Call it and bb_loader_release for one device from one thread at a time.
 * Fails with BB_ERR_CLOSED after the last requested step or after
 * bb_loader_stop, with the error a loader thread met (e.g. BB_ERR_CORRUPT
 * naming file, frame and offset; every later call fails the same way), or
 * with BB_ERR_ARG when the device already holds `hold` unreleased batches. */
bb_status bb_loader_next(bb_loader_t *l, uint32_t device, bb_batch *batch);
/* Gives the batch's slot back to the loader. */
void bb_loader_release(bb_loader_t *l, bb_batch *batch);

uint64_t bb_loader_steps_per_epoch(const bb_loader_t *l);
/* Records dropped at the end of every epoch (N mod G). */
uint64_t bb_loader_dropped_per_epoch(const bb_loader_t *l);
/* The io in use after any fallback: "io_uring", "io_uring (registered
 * buffers)" or "pread", with " O_DIRECT" appended when direct. */
const char *bb_loader_io_description(const bb_loader_t *l);

typedef struct bb_loader_stats {
    uint64_t frames;           /* frames read and decompressed */
    uint64_t compressed_bytes; /* bytes read from shards */
    uint64_t raw_bytes;        /* bytes decompressed */
    uint64_t batches;          /* batches handed to consumers */
    uint64_t wait_ns;          /* total time consumers waited in bb_loader_next */
    uint64_t frame_wait_ns;    /* loader threads waiting for frames other threads read */
    uint64_t slot_wait_ns;     /* loader threads waiting for consumers to free a slot */
    uint64_t io_ns;            /* loader threads waiting for their reads (pread, io_uring) */
    uint64_t decompress_ns;    /* loader threads decompressing and checking frames */
    uint64_t copy_ns;          /* loader threads copying records into batch slots */
} bb_loader_stats;

/* Counters so far (exact once the threads are idle). */
void bb_loader_get_stats(const bb_loader_t *l, bb_loader_stats *stats);

#endif /* BIGBATCH_LOADER_H */
