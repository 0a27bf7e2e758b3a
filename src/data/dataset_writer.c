/* dataset_writer.c — cuts records into frames, compresses frames in parallel
 * and writes them, in order, into shards of bounded size. */
#include "shard_format.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH64_state_t in the writer */
#include <xxhash.h>

typedef struct frame_slot {
    uint8_t *raw;           /* records, up to frame_cap bytes */
    size_t raw_size;
    uint8_t *compressed;    /* ZSTD_compressBound(frame_cap) bytes */
    size_t compressed_size; /* or a zstd error code */
    uint32_t checksum;
} frame_slot;

typedef struct open_shard {
    int fd;
    char path[4096];
    uint8_t *entries;       /* seek-table entries, frame 0 = metadata */
    uint32_t entry_count, entry_cap;
    uint64_t bytes;         /* written so far */
    uint64_t records;
} open_shard;

struct bb_dataset_writer {
    char *dir;
    bb_shard_meta meta;      /* template; counts updated per shard */
    bb_writer_options opts;
    size_t frame_cap;        /* records_per_frame * record_size */
    frame_slot *slots;       /* a batch compressed together */
    int slot_count, filled;  /* slots with complete frames; slots[filled] is being filled */
    ZSTD_CCtx **cctx;        /* one per compression thread */
    atomic_int next_slot;    /* work distribution during a batch */
    open_shard shard;
    uint64_t *shard_records; /* records of each finished shard, to stamp their metadata */
    uint32_t shard_cap;
    XXH64_state_t records_hash; /* of every record added, in order: the dataset's identity */
    bb_dataset_summary total;
    bb_status failed;        /* first error: the writer refuses further work */
};

static void compress_slot(bb_dataset_writer_t *w, ZSTD_CCtx *cctx, frame_slot *s)
{
    s->checksum = bb_shard_checksum(s->raw, s->raw_size);
    s->compressed_size = ZSTD_compress2(cctx, s->compressed, ZSTD_compressBound(w->frame_cap),
                                        s->raw, s->raw_size);
}

typedef struct compress_job {
    bb_dataset_writer_t *w;
    int thread;
} compress_job;

static void *compress_worker(void *arg)
{
    compress_job *job = arg;
    bb_dataset_writer_t *w = job->w;
    for (;;) {
        int i = atomic_fetch_add_explicit(&w->next_slot, 1, memory_order_relaxed);
        if (i >= w->filled) return NULL;
        compress_slot(w, w->cctx[job->thread], &w->slots[i]);
    }
}

/* Compresses slots[0..filled) with up to opts.threads threads. Each frame is
 * compressed independently, so the bytes do not depend on the thread count. */
static bb_status compress_batch(bb_dataset_writer_t *w)
{
    int threads = w->opts.threads < w->filled ? w->opts.threads : w->filled;
    pthread_t tid[threads > 1 ? threads - 1 : 1];
    compress_job jobs[threads > 0 ? threads : 1];
    atomic_store(&w->next_slot, 0);
    int started = 0;
    for (int t = 1; t < threads; t++) {
        jobs[t] = (compress_job){w, t};
        if (pthread_create(&tid[t - 1], NULL, compress_worker, &jobs[t]) != 0) break;
        started++;
    }
    jobs[0] = (compress_job){w, 0};
    compress_worker(&jobs[0]);
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
    for (int i = 0; i < w->filled; i++)
        if (ZSTD_isError(w->slots[i].compressed_size))
            return bb_fail(BB_ERR_INTERNAL, "zstd failed to compress a frame: %s",
                           ZSTD_getErrorName(w->slots[i].compressed_size));
    return BB_OK;
}

static bb_status push_entry(open_shard *s, uint32_t csize, uint32_t dsize, uint32_t checksum)
{
    if (s->entry_count == s->entry_cap) {
        uint32_t cap = s->entry_cap ? 2 * s->entry_cap : 256;
        uint8_t *grown = realloc(s->entries, (size_t)cap * BB_SHARD_ENTRY_SIZE);
        if (!grown) return bb_fail(BB_ERR_NOMEM, "%s: cannot grow the seek table", s->path);
        s->entries = grown;
        s->entry_cap = cap;
    }
    uint8_t *e = s->entries + (size_t)s->entry_count++ * BB_SHARD_ENTRY_SIZE;
    bb_put_le32(e, csize);
    bb_put_le32(e + 4, dsize);
    bb_put_le32(e + 8, checksum);
    return BB_OK;
}

static bb_status shard_begin(bb_dataset_writer_t *w)
{
    open_shard *s = &w->shard;
    snprintf(s->path, sizeof s->path, "%s/shard-%05u%s", w->dir, w->total.shards, BB_SHARD_EXT);
    s->fd = open(s->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (s->fd < 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot create", s->path);
    s->entry_count = 0;
    s->records = 0;
    /* A skippable frame with an empty payload holds the place of the metadata,
     * known only when the shard ends: an unfinished shard never reads as valid. */
    uint8_t meta[BB_SHARD_META_FRAME_SIZE] = {0};
    bb_put_le32(meta, BB_SHARD_META_MAGIC);
    bb_put_le32(meta + 4, BB_SHARD_META_SIZE);
    BB_TRY(bb_write_all(s->fd, s->path, meta, sizeof meta, -1));
    s->bytes = sizeof meta;
    return push_entry(s, BB_SHARD_META_FRAME_SIZE, 0, bb_shard_checksum(NULL, 0));
}

static uint64_t seek_table_bytes(uint32_t entries)
{
    return 8 + (uint64_t)entries * BB_SHARD_ENTRY_SIZE + BB_SHARD_FOOTER_SIZE;
}

static bb_status shard_end(bb_dataset_writer_t *w)
{
    open_shard *s = &w->shard;
    uint64_t table_size = seek_table_bytes(s->entry_count);
    uint8_t *table = malloc(table_size);
    if (!table) return bb_fail(BB_ERR_NOMEM, "%s: cannot allocate the seek table", s->path);
    bb_put_le32(table, BB_SHARD_SEEK_MAGIC);
    bb_put_le32(table + 4, (uint32_t)(table_size - 8));
    memcpy(table + 8, s->entries, (size_t)s->entry_count * BB_SHARD_ENTRY_SIZE);
    uint8_t *footer = table + table_size - BB_SHARD_FOOTER_SIZE;
    bb_put_le32(footer, s->entry_count);
    footer[4] = 0x80; /* Checksum_Flag */
    bb_put_le32(footer + 5, BB_SHARD_SEEKABLE_MAGIC);
    bb_status rc = bb_write_all(s->fd, s->path, table, table_size, -1);
    free(table);
    BB_TRY(rc);

    if (w->total.shards == w->shard_cap) {
        uint32_t cap = w->shard_cap ? 2 * w->shard_cap : 16;
        uint64_t *grown = realloc(w->shard_records, cap * sizeof *grown);
        if (!grown) return bb_fail(BB_ERR_NOMEM, "%s: out of memory", s->path);
        w->shard_records = grown, w->shard_cap = cap;
    }
    w->shard_records[w->total.shards] = s->records;
    w->meta.record_count = s->records;
    w->meta.shard_index = w->total.shards;
    uint8_t meta[BB_SHARD_META_FRAME_SIZE];
    bb_shard_meta_encode(&w->meta, meta);
    BB_TRY(bb_write_all(s->fd, s->path, meta, sizeof meta, 0));
    if (fsync(s->fd) != 0) return bb_fail_errno(BB_ERR_IO, "%s: fsync failed", s->path);
    int fd = s->fd;
    s->fd = -1;
    if (close(fd) != 0) return bb_fail_errno(BB_ERR_IO, "%s: close failed", s->path);

    w->total.shards++;
    w->total.frames += s->entry_count - 1;
    w->total.file_bytes += s->bytes + table_size;
    w->meta.first_record += s->records;
    return BB_OK;
}

/* Writes compressed slots in order, starting a new shard when the next frame
 * would push the file past shard_bytes (a shard always gets one frame). */
static bb_status write_batch(bb_dataset_writer_t *w)
{
    open_shard *s = &w->shard;
    for (int i = 0; i < w->filled; i++) {
        frame_slot *f = &w->slots[i];
        if (s->fd >= 0 && s->entry_count > 1 &&
            (s->bytes + f->compressed_size + seek_table_bytes(s->entry_count + 1) > w->opts.shard_bytes ||
             s->entry_count == BB_SHARD_MAX_FRAMES))
            BB_TRY(shard_end(w));
        if (s->fd < 0) BB_TRY(shard_begin(w));
        BB_TRY(bb_write_all(s->fd, s->path, f->compressed, f->compressed_size, -1));
        BB_TRY(push_entry(s, (uint32_t)f->compressed_size, (uint32_t)f->raw_size, f->checksum));
        s->bytes += f->compressed_size;
        s->records += f->raw_size / w->meta.record_size;
        f->raw_size = 0;
    }
    w->filled = 0;
    return BB_OK;
}

static bb_status flush_batch(bb_dataset_writer_t *w)
{
    if (w->filled == 0) return BB_OK;
    BB_TRY(compress_batch(w));
    return write_batch(w);
}

bb_status bb_dataset_writer_create(const char *dir, const bb_shard_meta *meta,
                                   const bb_writer_options *opts, bb_dataset_writer_t **out)
{
    *out = NULL;
    bb_shard_meta m = *meta;
    if (m.record_size > BB_SHARD_MAX_FRAME_BYTES)
        return bb_fail(BB_ERR_ARG, "records of %u bytes exceed the %u MiB frame limit", m.record_size,
                       BB_SHARD_MAX_FRAME_BYTES >> 20);
    if (opts->threads < 1 || opts->frame_bytes == 0 || opts->shard_bytes == 0)
        return bb_fail(BB_ERR_ARG, "writer options: threads, frame size and shard size must be positive");
    if (opts->level < ZSTD_minCLevel() || opts->level > ZSTD_maxCLevel())
        return bb_fail(BB_ERR_ARG, "zstd level %d is out of range [%d, %d]", opts->level, ZSTD_minCLevel(),
                       ZSTD_maxCLevel());
    m.records_per_frame = m.record_size ? opts->frame_bytes / m.record_size : 0;
    if (m.records_per_frame == 0) m.records_per_frame = 1;
    m.record_count = m.first_record = m.shard_index = 0;
    BB_TRY(bb_shard_meta_check("shard writer", &m, BB_ERR_ARG));

    bb_status rc = BB_OK;
    bb_dataset_writer_t *w = calloc(1, sizeof *w);
    if (!w) return bb_fail(BB_ERR_NOMEM, "out of memory");
    w->shard.fd = -1;
    w->meta = m;
    w->meta.dataset_id = 0; /* stamped by finish */
    XXH64_reset(&w->records_hash, 0);
    w->opts = *opts;
    w->frame_cap = (size_t)m.records_per_frame * m.record_size;
    /* Enough frames to keep every thread busy, within a bounded footprint. */
    w->slot_count = 4 * opts->threads;
    size_t max_slots = (512u << 20) / w->frame_cap;
    if ((size_t)w->slot_count > max_slots) w->slot_count = max_slots > 2 ? (int)max_slots : 2;
    if (!(w->dir = strdup(dir)) || !(w->slots = calloc((size_t)w->slot_count, sizeof *w->slots)) ||
        !(w->cctx = calloc((size_t)opts->threads, sizeof *w->cctx)))
        goto nomem;
    for (int i = 0; i < w->slot_count; i++)
        if (!(w->slots[i].raw = malloc(w->frame_cap)) ||
            !(w->slots[i].compressed = malloc(ZSTD_compressBound(w->frame_cap))))
            goto nomem;
    for (int t = 0; t < opts->threads; t++) {
        if (!(w->cctx[t] = ZSTD_createCCtx())) goto nomem;
        /* The seek table carries the checksum: no second one inside each frame. */
        size_t e1 = ZSTD_CCtx_setParameter(w->cctx[t], ZSTD_c_compressionLevel, opts->level);
        size_t e2 = ZSTD_CCtx_setParameter(w->cctx[t], ZSTD_c_checksumFlag, 0);
        size_t e3 = ZSTD_CCtx_setParameter(w->cctx[t], ZSTD_c_contentSizeFlag, 1);
        if (ZSTD_isError(e1) || ZSTD_isError(e2) || ZSTD_isError(e3)) {
            rc = bb_fail(BB_ERR_ARG, "zstd rejected level %d", opts->level);
            goto fail;
        }
    }
    *out = w;
    return BB_OK;
nomem:
    rc = bb_fail(BB_ERR_NOMEM, "cannot allocate %d frame buffers of %zu bytes", w->slot_count, w->frame_cap);
fail:
    bb_dataset_writer_destroy(w);
    return rc;
}

static bb_status add_records(bb_dataset_writer_t *w, const uint8_t *p, uint64_t count)
{
    if (count > UINT64_MAX / w->meta.record_size) return bb_fail(BB_ERR_ARG, "%s: record count overflows", w->dir);
    uint64_t bytes = count * w->meta.record_size;
    XXH64_update(&w->records_hash, p, (size_t)bytes);
    while (bytes > 0) {
        frame_slot *s = &w->slots[w->filled];
        size_t take = w->frame_cap - s->raw_size;
        if (take > bytes) take = (size_t)bytes;
        memcpy(s->raw + s->raw_size, p, take);
        s->raw_size += take, p += take, bytes -= take;
        if (s->raw_size == w->frame_cap && ++w->filled == w->slot_count) BB_TRY(flush_batch(w));
    }
    w->total.records += count;
    return BB_OK;
}

/* The identity is known only once every record is in: rewrite each shard's
 * metadata frame with it (the frame's size does not change). */
static bb_status stamp_identity(bb_dataset_writer_t *w)
{
    bb_shard_meta m = w->meta;
    m.dataset_id = w->total.dataset_id;
    m.first_record = 0;
    for (uint32_t i = 0; i < w->total.shards; i++) {
        char path[sizeof w->shard.path];
        snprintf(path, sizeof path, "%s/shard-%05u%s", w->dir, i, BB_SHARD_EXT);
        m.shard_index = i, m.record_count = w->shard_records[i];
        uint8_t meta[BB_SHARD_META_FRAME_SIZE];
        bb_shard_meta_encode(&m, meta);
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot reopen to write its metadata", path);
        bb_status rc = bb_write_all(fd, path, meta, sizeof meta, 0);
        if (rc == BB_OK && fsync(fd) != 0) rc = bb_fail_errno(BB_ERR_IO, "%s: fsync failed", path);
        if (close(fd) != 0 && rc == BB_OK) rc = bb_fail_errno(BB_ERR_IO, "%s: close failed", path);
        BB_TRY(rc);
        m.first_record += m.record_count;
    }
    return BB_OK;
}

static bb_status finish(bb_dataset_writer_t *w, bb_dataset_summary *summary)
{
    if (w->total.records == 0) return bb_fail(BB_ERR_ARG, "%s: no records to write", w->dir);
    if (w->slots[w->filled].raw_size > 0) w->filled++;
    BB_TRY(flush_batch(w));
    if (w->shard.fd >= 0) BB_TRY(shard_end(w));
    w->total.dataset_id = XXH64_digest(&w->records_hash);
    BB_TRY(stamp_identity(w));
    w->total.raw_bytes = w->total.records * w->meta.record_size;
    if (summary) *summary = w->total;
    return BB_OK;
}

/* After a failure the buffers are in an unknown state: repeat the error. */
static bb_status sticky(bb_dataset_writer_t *w, bb_status rc)
{
    if (rc != BB_OK) w->failed = rc;
    return rc;
}

bb_status bb_dataset_writer_add(bb_dataset_writer_t *w, const void *records, uint64_t count)
{
    if (w->failed) return bb_fail(w->failed, "%s: the writer failed earlier", w->dir);
    return sticky(w, add_records(w, records, count));
}

bb_status bb_dataset_writer_finish(bb_dataset_writer_t *w, bb_dataset_summary *summary)
{
    if (w->failed) return bb_fail(w->failed, "%s: the writer failed earlier", w->dir);
    return sticky(w, finish(w, summary));
}

void bb_dataset_writer_destroy(bb_dataset_writer_t *w)
{
    if (!w) return;
    if (w->shard.fd >= 0) close(w->shard.fd);
    free(w->shard.entries);
    free(w->shard_records);
    for (int i = 0; w->slots && i < w->slot_count; i++) {
        free(w->slots[i].raw);
        free(w->slots[i].compressed);
    }
    for (int t = 0; w->cctx && t < w->opts.threads; t++) ZSTD_freeCCtx(w->cctx[t]);
    free(w->cctx);
    free(w->slots);
    free(w->dir);
    free(w);
}
