/* sampler.h — private: the epoch order the loader walks (see loader.h for
 * the definition of the order).
 *
 * bb_epoch_order_t is immutable once made, so loader threads share it; each
 * thread maps positions to records through its own bb_order_cursor, which
 * caches the shuffled records of one window. */
#ifndef BIGBATCH_DATA_SAMPLER_H
#define BIGBATCH_DATA_SAMPLER_H

#include "bigbatch/loader.h"

/* One data frame of the dataset. */
typedef struct bb_sampler_frame {
    uint32_t shard;      /* index in the dataset */
    uint32_t frame;      /* index in the shard */
    uint32_t records;    /* records it holds */
    uint64_t first_id;   /* dataset-wide index of its first record */
} bb_sampler_frame;

/* A record as the loader finds it: the frame's position in the epoch's frame
 * order (not its dataset index) and the record's index within the frame. */
typedef struct bb_record_ref {
    uint32_t order_frame;
    uint32_t index;
} bb_record_ref;

typedef struct bb_epoch_order {
    const bb_sampler_t *sampler;
    uint64_t epoch;
    uint32_t *frames;      /* (F) dataset frame at each order position */
    uint64_t *first_pos;   /* (F + 1) epoch position of each order frame's first record */
} bb_epoch_order_t;

const bb_sampler_frame *bb_sampler_frame_at(const bb_sampler_t *s, uint32_t frame);
/* The largest window's frames: shuffle_frames (or the frame count when
 * smaller); under BB_ORDER_BALANCED the frames split evenly over as many
 * windows, so at most that. */
uint32_t bb_sampler_window_frames(const bb_sampler_t *s);
/* Windows an epoch, and the order position of window w's first frame
 * (the frame count for w at or past the last). */
uint32_t bb_sampler_window_count(const bb_sampler_t *s);
uint32_t bb_sampler_window_first(const bb_sampler_t *s, uint64_t w);

/* Computes the frame permutation of `epoch`. Fails with BB_ERR_NOMEM. */
bb_status bb_epoch_order_create(const bb_sampler_t *s, uint64_t epoch, bb_epoch_order_t **out);
void bb_epoch_order_destroy(bb_epoch_order_t *order);
/* The window holding epoch position p (< the record count). */
uint64_t bb_epoch_order_window_of(const bb_epoch_order_t *order, uint64_t p);

typedef struct bb_order_cursor {
    const bb_epoch_order_t *order;
    uint64_t window;          /* cached window index, UINT64_MAX when none */
    uint64_t window_start;    /* epoch position of its first record */
    uint64_t window_count;    /* records in it */
    bb_record_ref *records;   /* (window_count) shuffled */
    uint64_t capacity;
} bb_order_cursor;

void bb_order_cursor_init(bb_order_cursor *c, const bb_epoch_order_t *order);
void bb_order_cursor_fini(bb_order_cursor *c);
/* Records at epoch positions [first, first + count), which must lie below
 * the dataset's record count. Fails with BB_ERR_NOMEM. */
bb_status bb_order_cursor_get(bb_order_cursor *c, uint64_t first, uint32_t count, bb_record_ref *out);
/* Dataset-wide index of a record. */
uint64_t bb_order_record_id(const bb_epoch_order_t *order, bb_record_ref ref);

#endif
