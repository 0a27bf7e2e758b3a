/* stream.h — private: a remote dataset's shards filled while the loader
 * reads them (remote.h says what a user sees).
 *
 * bb_remote_stream_open makes a staging tree whose streamed shards are
 * sparse files holding, at first, only their metadata and seek tables; a
 * thread of the stream downloads their bytes in chunks with range
 * requests: the chunks a reader waits for first, then those the loader
 * said it will read (in the order it will), then the rest. A dataset
 * opened inside the staging tree finds its stream (bb_stream_of), and the
 * loader asks before each frame read:
 *
 *   bb_dataset_want_frame(ds, shard, frame);            // when an epoch's order is known
 *   BB_TRY(bb_dataset_await_frame(ds, shard, frame, &stop));  // before reading it
 *
 * Both are no-ops for local data and for shards the cache held whole. */
#ifndef BIGBATCH_DATA_STREAM_H
#define BIGBATCH_DATA_STREAM_H

#include <stdatomic.h>

#include "bigbatch/remote.h"
#include "bigbatch/shard.h"

/* The open stream whose staging tree holds `path`, or NULL. */
bb_remote_stream_t *bb_stream_of(const char *path);
/* The stream's index of the file at `path` (a shard in its staging tree),
 * or UINT32_MAX when that file is not streamed (the cache held it). */
uint32_t bb_stream_file(const bb_remote_stream_t *s, const char *path);
/* Puts bytes [offset, offset + length) of file `file` in the download
 * order, after those already asked for. Never fails. */
void bb_stream_want(bb_remote_stream_t *s, uint32_t file, uint64_t offset, uint64_t length);
/* Returns once those bytes are on disk. Fails with the stream's error (a
 * download past its deadline, an HTTP error, a file whose hash differs
 * from its index: BB_ERR_IO, BB_ERR_CORRUPT), or BB_ERR_CLOSED as soon as
 * *stop is set. */
bb_status bb_stream_await(bb_remote_stream_t *s, uint32_t file, uint64_t offset, uint64_t length,
                          const _Atomic bool *stop);

/* dataset.c: the same for a dataset's frame (no-ops unless streamed). */
void bb_dataset_want_frame(const bb_dataset_t *ds, uint32_t shard, uint32_t frame);
bb_status bb_dataset_await_frame(const bb_dataset_t *ds, uint32_t shard, uint32_t frame, const _Atomic bool *stop);

#endif /* BIGBATCH_DATA_STREAM_H */
