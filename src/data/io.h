/* io.h — private: how a loader thread reads compressed frames. One bb_io_t
 * per thread: io_uring with up to `depth` reads in flight, or pread one read
 * at a time, into the io's own staging buffers (4 KiB aligned, registered
 * with io_uring when RLIMIT_MEMLOCK allows). */
#ifndef BIGBATCH_DATA_IO_H
#define BIGBATCH_DATA_IO_H

#include "bigbatch/loader.h"

typedef struct bb_io bb_io_t;

typedef struct bb_io_request {
    int fd;
    uint64_t offset;
    uint32_t length;
    const char *path; /* for messages */
    uint32_t frame;   /* for messages */
} bb_io_request;

/* Called for each finished read with its request index and bytes (valid
 * until the callback returns). A non-OK return stops further callbacks. */
typedef bb_status (*bb_io_done_fn)(void *ctx, uint32_t index, const uint8_t *data);

/* Sets up reads of up to `buffer_bytes` each. mode BB_IO_AUTO tries io_uring
 * and, when its setup fails, falls back to pread and sets *fell_back (the
 * caller warns once). `direct` readers align offsets and lengths to 4 KiB.
 * Fails with BB_ERR_UNSUPPORTED when mode is BB_IO_URING and io_uring cannot
 * start, BB_ERR_NOMEM. */
bb_status bb_io_create(bb_io_mode mode, uint32_t depth, uint32_t buffer_bytes, bool direct, bb_io_t **out,
                       bool *fell_back);
void bb_io_destroy(bb_io_t *io);
/* "io_uring (registered buffers)", "io_uring" or "pread". */
const char *bb_io_describe(const bb_io_t *io);
uint32_t bb_io_depth(const bb_io_t *io);

/* Reads requests[0..n) (n <= depth) and calls done() for each as it
 * completes. Every read has finished when it returns. Fails with BB_ERR_IO
 * naming path, frame and offset on a read error or short file, or with the
 * first error done() returned. */
bb_status bb_io_read(bb_io_t *io, const bb_io_request *requests, uint32_t n, bb_io_done_fn done, void *ctx);

#endif
