/* io.c — frame reads for the loader: io_uring (liburing) or pread. */
#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io.h"

#define IO_ALIGN 4096u

struct bb_io {
    bb_io_mode mode; /* BB_IO_URING or BB_IO_PREAD once created */
    uint32_t depth;
    size_t buffer_bytes;
    bool direct;
    bool registered;
    bool ring_ready;
    bool broken;      /* reads may still be in flight: buffers must not be freed */
    uint8_t *buffers; /* depth * buffer_bytes, IO_ALIGN-aligned */
    struct io_uring ring;
};

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static bb_status start_uring(bb_io_t *io, int *err)
{
    int rc = io_uring_queue_init(io->depth, &io->ring, 0);
    if (rc < 0) {
        *err = -rc;
        return BB_ERR_UNSUPPORTED;
    }
    io->ring_ready = true;
    /* Registered buffers skip per-read page pinning; they count against
     * RLIMIT_MEMLOCK, so when the limit is too low plain reads do. */
    struct iovec *iov = malloc(io->depth * sizeof *iov);
    if (!iov) return bb_fail(BB_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; i < io->depth; i++)
        iov[i] = (struct iovec){io->buffers + i * io->buffer_bytes, io->buffer_bytes};
    rc = io_uring_register_buffers(&io->ring, iov, io->depth);
    free(iov);
    io->registered = rc == 0;
    if (rc < 0)
        BB_DEBUG("io_uring: %u buffers of %zu bytes not registered (%s); using unregistered reads", io->depth,
                 io->buffer_bytes, strerror(-rc));
    return BB_OK;
}

bb_status bb_io_create(bb_io_mode mode, uint32_t depth, uint32_t buffer_bytes, bool direct, bb_io_t **out,
                       bool *fell_back)
{
    *out = NULL;
    *fell_back = false;
    if (depth == 0) return bb_fail(BB_ERR_ARG, "io depth must be at least 1");
    bb_io_t *io = calloc(1, sizeof *io);
    if (!io) return bb_fail(BB_ERR_NOMEM, "out of memory");
    io->depth = mode == BB_IO_PREAD ? 1 : depth;
    io->direct = direct;
    /* O_DIRECT reads start one alignment unit early and end one late at most. */
    io->buffer_bytes = round_up(buffer_bytes + (direct ? 2 * IO_ALIGN : 0), IO_ALIGN);
    io->buffers = aligned_alloc(IO_ALIGN, io->depth * io->buffer_bytes);
    if (!io->buffers) {
        bb_io_destroy(io);
        return bb_fail(BB_ERR_NOMEM, "out of memory for %u read buffers of %zu bytes", io->depth, io->buffer_bytes);
    }
    io->mode = BB_IO_PREAD;
    if (mode != BB_IO_PREAD) {
        int err = 0;
        bb_status rc = start_uring(io, &err);
        if (rc == BB_OK) {
            io->mode = BB_IO_URING;
        } else if (rc == BB_ERR_UNSUPPORTED && mode == BB_IO_AUTO) {
            if (io->ring_ready) io_uring_queue_exit(&io->ring);
            io->ring_ready = false;
            io->depth = 1;
            *fell_back = true;
            bb_fail(BB_ERR_UNSUPPORTED, "io_uring is not available (%s)", strerror(err));
        } else {
            bb_io_destroy(io);
            if (rc == BB_ERR_UNSUPPORTED)
                return bb_fail(rc, "--io uring: io_uring cannot start: %s%s", strerror(err),
                               err == EPERM ? " (disabled by kernel.io_uring_disabled or a seccomp policy)" : "");
            return rc;
        }
    }
    *out = io;
    return BB_OK;
}

void bb_io_destroy(bb_io_t *io)
{
    if (!io) return;
    if (io->ring_ready) io_uring_queue_exit(&io->ring);
    if (io->broken)
        BB_WARN("io_uring failed with reads in flight; leaking %zu bytes of read buffers",
                io->depth * io->buffer_bytes);
    else
        free(io->buffers);
    free(io);
}

const char *bb_io_describe(const bb_io_t *io)
{
    if (io->mode == BB_IO_PREAD) return "pread";
    return io->registered ? "io_uring (registered buffers)" : "io_uring";
}

uint32_t bb_io_depth(const bb_io_t *io) { return io->depth; }

/* Where a request's read starts and how long it is, after alignment. */
static void span(const bb_io_t *io, const bb_io_request *r, uint64_t *start, size_t *length, size_t *skip)
{
    *start = io->direct ? r->offset / IO_ALIGN * IO_ALIGN : r->offset;
    *skip = (size_t)(r->offset - *start);
    *length = io->direct ? round_up(*skip + r->length, IO_ALIGN) : r->length;
}

/* Completes a read with pread from byte `got` on; fails on an error or when
 * the file ends before the frame does. */
static bb_status finish_with_pread(const bb_io_t *io, const bb_io_request *r, uint8_t *buf, size_t got)
{
    uint64_t start;
    size_t length, skip;
    span(io, r, &start, &length, &skip);
    if (io->direct) got = got / IO_ALIGN * IO_ALIGN; /* O_DIRECT continues at aligned positions */
    while (got < skip + r->length) {
        ssize_t n = pread(r->fd, buf + got, length - got, (off_t)(start + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)
            return bb_fail_errno(BB_ERR_IO, "%s: frame %u at offset %llu: read failed", r->path, r->frame,
                                 (unsigned long long)r->offset);
        if (n == 0)
            return bb_fail(BB_ERR_IO, "%s: frame %u at offset %llu: the file ends after %zu of %u bytes", r->path,
                           r->frame, (unsigned long long)r->offset, got > skip ? got - skip : 0, r->length);
        got += (size_t)n;
    }
    return BB_OK;
}

static bb_status read_with_pread(bb_io_t *io, const bb_io_request *requests, uint32_t n, bb_io_done_fn done,
                                 void *ctx)
{
    for (uint32_t i = 0; i < n; i++) {
        uint64_t start;
        size_t length, skip;
        span(io, &requests[i], &start, &length, &skip);
        BB_TRY(finish_with_pread(io, &requests[i], io->buffers, 0));
        BB_TRY(done(ctx, i, io->buffers + skip));
    }
    return BB_OK;
}

static void prepare(bb_io_t *io, const bb_io_request *r, uint32_t i)
{
    uint64_t start;
    size_t length, skip;
    span(io, r, &start, &length, &skip);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring); /* never NULL: n <= depth entries */
    uint8_t *buf = io->buffers + i * io->buffer_bytes;
    if (io->registered)
        io_uring_prep_read_fixed(sqe, r->fd, buf, (unsigned)length, start, (int)i);
    else
        io_uring_prep_read(sqe, r->fd, buf, (unsigned)length, start);
    io_uring_sqe_set_data64(sqe, i);
}

/* Submits every prepared SQE; returns how many are now in flight, or a
 * negative errno when the kernel refuses (the rest stay unsubmitted, and
 * the ring is marked broken). */
static int submit_all(bb_io_t *io, int prepared)
{
    int in_flight = 0;
    while (in_flight < prepared) {
        int n = io_uring_submit(&io->ring);
        if (n == -EINTR || n == -EAGAIN || n == -EBUSY) continue;
        if (n <= 0) {
            io->broken = true;
            return in_flight ? in_flight : (n < 0 ? n : -EIO);
        }
        in_flight += n;
    }
    return in_flight;
}

static bb_status read_with_uring(bb_io_t *io, const bb_io_request *requests, uint32_t n, bb_io_done_fn done,
                                 void *ctx)
{
    if (io->broken) return bb_fail(BB_ERR_IO, "%s: io_uring failed earlier", requests[0].path);
    for (uint32_t i = 0; i < n; i++) prepare(io, &requests[i], i);
    int in_flight = submit_all(io, (int)n);
    if (in_flight < 0) {
        errno = -in_flight;
        return bb_fail_errno(BB_ERR_IO, "%s: io_uring_submit failed", requests[0].path);
    }
    bb_status rc = in_flight == (int)n ? BB_OK
                                        : bb_fail(BB_ERR_IO, "%s: io_uring took %d of %u reads", requests[0].path,
                                                  in_flight, n);
    /* Every read in flight is reaped before returning, even after an error:
     * the kernel may write into the buffers until it completes. */
    while (in_flight > 0) {
        struct io_uring_cqe *cqe;
        int w = io_uring_wait_cqe(&io->ring, &cqe);
        if (w == -EINTR) continue;
        if (w < 0) {
            io->broken = true;
            errno = -w;
            return bb_fail_errno(BB_ERR_IO, "%s: io_uring_wait_cqe failed", requests[0].path);
        }
        uint32_t i = (uint32_t)io_uring_cqe_get_data64(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&io->ring, cqe);
        if ((res == -EAGAIN || res == -EINTR) && rc == BB_OK) {
            prepare(io, &requests[i], i);
            if (submit_all(io, 1) == 1) continue;
            res = -EIO;
        }
        in_flight--;
        if (rc != BB_OK) continue;
        const bb_io_request *r = &requests[i];
        uint8_t *buf = io->buffers + i * io->buffer_bytes;
        if (res < 0) {
            errno = -res;
            rc = bb_fail_errno(BB_ERR_IO, "%s: frame %u at offset %llu: read failed", r->path, r->frame,
                               (unsigned long long)r->offset);
            continue;
        }
        uint64_t start;
        size_t length, skip;
        span(io, r, &start, &length, &skip);
        rc = finish_with_pread(io, r, buf, (size_t)res); /* rare short reads */
        if (rc == BB_OK) rc = done(ctx, i, buf + skip);
    }
    return rc;
}

bb_status bb_io_read(bb_io_t *io, const bb_io_request *requests, uint32_t n, bb_io_done_fn done, void *ctx)
{
    if (n > io->depth) return bb_fail(BB_ERR_INTERNAL, "%u reads requested, depth is %u", n, io->depth);
    if (n == 0) return BB_OK;
    return io->mode == BB_IO_URING ? read_with_uring(io, requests, n, done, ctx)
                                   : read_with_pread(io, requests, n, done, ctx);
}
