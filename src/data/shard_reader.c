/* shard_reader.c — opens a .bbs shard: footer, seek table, metadata; reads
 * and verifies frames. */
#include "shard_format.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

struct bb_shard {
    char *path;
    int fd;
    uint64_t file_size;
    bb_shard_meta meta;
    uint32_t frame_count;      /* data frames */
    bb_shard_frame *frames;    /* frame_count entries */
    uint32_t max_raw, max_compressed;
};

struct bb_frame_decoder {
    ZSTD_DCtx *dctx;
    uint8_t *staging;
    size_t staging_cap;
};

#define U64(x) ((unsigned long long)(x))

/* Checks the footer and returns the number of seek-table entries. */
static bb_status read_footer(bb_shard_t *sh, uint32_t *entries)
{
    if (sh->file_size < BB_SHARD_FOOTER_SIZE)
        return bb_fail(BB_ERR_CORRUPT, "%s: truncated: %llu bytes is too small for a shard (no seek table footer)",
                       sh->path, U64(sh->file_size));
    uint8_t footer[BB_SHARD_FOOTER_SIZE];
    uint64_t at = sh->file_size - BB_SHARD_FOOTER_SIZE;
    BB_TRY(bb_pread_all(sh->fd, sh->path, footer, sizeof footer, at));
    uint32_t magic = bb_le32(footer + 5);
    if (magic != BB_SHARD_SEEKABLE_MAGIC)
        return bb_fail(BB_ERR_FORMAT,
                       "%s: no seek table footer: bytes at offset %llu are 0x%08x, expected magic 0x%08x "
                       "(file truncated, or not a bigbatch shard)",
                       sh->path, U64(at + 5), magic, BB_SHARD_SEEKABLE_MAGIC);
    uint8_t descriptor = footer[4];
    if (!(descriptor & 0x80))
        return bb_fail(BB_ERR_FORMAT, "%s: seek table descriptor 0x%02x at offset %llu: no checksums; bigbatch requires them",
                       sh->path, descriptor, U64(at + 4));
    if (descriptor & 0x7c)
        return bb_fail(BB_ERR_FORMAT, "%s: seek table descriptor 0x%02x at offset %llu sets reserved bits",
                       sh->path, descriptor, U64(at + 4));
    *entries = bb_le32(footer);
    if (*entries < 2 || *entries > BB_SHARD_MAX_FRAMES)
        return bb_fail(BB_ERR_CORRUPT, "%s: seek table footer at offset %llu claims %u frames (need 2 to %u)",
                       sh->path, U64(at), *entries, BB_SHARD_MAX_FRAMES);
    return BB_OK;
}

/* Reads the seek table and fills sh->frames with offsets and sizes. */
static bb_status read_seek_table(bb_shard_t *sh, uint32_t entries)
{
    uint64_t payload = (uint64_t)entries * BB_SHARD_ENTRY_SIZE + BB_SHARD_FOOTER_SIZE;
    uint64_t table_size = 8 + payload;
    if (table_size > sh->file_size)
        return bb_fail(BB_ERR_CORRUPT, "%s: truncated: seek table of %u frames needs %llu bytes, the file has %llu",
                       sh->path, entries, U64(table_size), U64(sh->file_size));
    uint64_t table_at = sh->file_size - table_size;
    uint8_t *table = malloc(table_size);
    if (!table) return bb_fail(BB_ERR_NOMEM, "%s: cannot allocate %llu bytes for the seek table", sh->path, U64(table_size));
    bb_status rc = bb_pread_all(sh->fd, sh->path, table, table_size, table_at);
    if (rc != BB_OK) goto done;
    if (bb_le32(table) != BB_SHARD_SEEK_MAGIC || bb_le32(table + 4) != payload) {
        rc = bb_fail(BB_ERR_CORRUPT, "%s: seek table at offset %llu: bad skippable-frame header (magic 0x%08x, size %u; expected 0x%08x, %llu)",
                     sh->path, U64(table_at), bb_le32(table), bb_le32(table + 4), BB_SHARD_SEEK_MAGIC, U64(payload));
        goto done;
    }
    const uint8_t *e = table + 8;
    if (bb_le32(e) != BB_SHARD_META_FRAME_SIZE || bb_le32(e + 4) != 0 || bb_le32(e + 8) != bb_shard_checksum(NULL, 0)) {
        rc = bb_fail(BB_ERR_FORMAT, "%s: not a bigbatch shard: seek table entry 0 is not a %d-byte metadata frame",
                     sh->path, BB_SHARD_META_FRAME_SIZE);
        goto done;
    }
    sh->frame_count = entries - 1;
    sh->frames = calloc(sh->frame_count, sizeof *sh->frames);
    if (!sh->frames) {
        rc = bb_fail(BB_ERR_NOMEM, "%s: cannot allocate the frame table (%u frames)", sh->path, sh->frame_count);
        goto done;
    }
    uint64_t offset = BB_SHARD_META_FRAME_SIZE;
    for (uint32_t i = 0; i < sh->frame_count; i++) {
        e += BB_SHARD_ENTRY_SIZE;
        bb_shard_frame *f = &sh->frames[i];
        f->offset = offset;
        f->compressed_size = bb_le32(e);
        f->raw_size = bb_le32(e + 4);
        f->checksum = bb_le32(e + 8);
        if (f->compressed_size == 0) {
            rc = bb_fail(BB_ERR_CORRUPT, "%s: frame %u at offset %llu: compressed size is 0 in the seek table",
                         sh->path, i, U64(offset));
            goto done;
        }
        if (offset + f->compressed_size > table_at) {
            rc = bb_fail(BB_ERR_CORRUPT, "%s: frame %u at offset %llu: compressed size %u runs past the seek table "
                         "at offset %llu (seek table sizes exceed the file)",
                         sh->path, i, U64(offset), f->compressed_size, U64(table_at));
            goto done;
        }
        if (f->compressed_size > ZSTD_compressBound(f->raw_size)) {
            rc = bb_fail(BB_ERR_CORRUPT, "%s: frame %u at offset %llu: compressed size %u exceeds what %u raw bytes can take",
                         sh->path, i, U64(offset), f->compressed_size, f->raw_size);
            goto done;
        }
        offset += f->compressed_size;
    }
    if (offset != table_at)
        rc = bb_fail(BB_ERR_CORRUPT, "%s: %llu bytes at offset %llu belong to no frame of the seek table",
                     sh->path, U64(table_at - offset), U64(offset));
done:
    free(table);
    return rc;
}

/* Checks that the frames hold whole records in the layout the metadata states. */
static bb_status check_frames(bb_shard_t *sh)
{
    const bb_shard_meta *m = &sh->meta;
    uint64_t full = (uint64_t)m->records_per_frame * m->record_size, records = 0;
    for (uint32_t i = 0; i < sh->frame_count; i++) {
        bb_shard_frame *f = &sh->frames[i];
        if (f->raw_size % m->record_size != 0)
            return bb_fail(BB_ERR_CORRUPT, "%s: frame %u at offset %llu: %u raw bytes is not a whole number of %u-byte records",
                           sh->path, i, U64(f->offset), f->raw_size, m->record_size);
        bool last = i + 1 == sh->frame_count;
        if (last ? (f->raw_size == 0 || f->raw_size > full) : f->raw_size != full)
            return bb_fail(BB_ERR_CORRUPT, "%s: frame %u at offset %llu holds %u records; %s %u",
                           sh->path, i, U64(f->offset), f->raw_size / m->record_size,
                           last ? "the last frame must hold 1 to" : "every frame but the last must hold",
                           m->records_per_frame);
        f->first_record = records;
        records += f->raw_size / m->record_size;
        if (f->raw_size > sh->max_raw) sh->max_raw = f->raw_size;
        if (f->compressed_size > sh->max_compressed) sh->max_compressed = f->compressed_size;
    }
    if (records != m->record_count)
        return bb_fail(BB_ERR_CORRUPT, "%s: frames hold %llu records, metadata says %llu",
                       sh->path, U64(records), U64(m->record_count));
    return BB_OK;
}

bb_status bb_shard_open(const char *path, bb_shard_t **out)
{
    *out = NULL;
    bb_status rc = BB_OK;
    bb_shard_t *sh = calloc(1, sizeof *sh);
    if (!sh || !(sh->path = strdup(path))) {
        free(sh);
        return bb_fail(BB_ERR_NOMEM, "%s: out of memory", path);
    }
    sh->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block the open */
    if (sh->fd < 0) {
        rc = bb_fail_errno(BB_ERR_IO, "%s: cannot open", path);
        goto fail;
    }
    struct stat st;
    if (fstat(sh->fd, &st) != 0) {
        rc = bb_fail_errno(BB_ERR_IO, "%s: cannot stat", path);
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = bb_fail(BB_ERR_IO, "%s: not a regular file", path);
        goto fail;
    }
    sh->file_size = (uint64_t)st.st_size;
    uint32_t entries = 0;
    BB_TRY_GOTO(read_footer(sh, &entries), rc, fail);
    BB_TRY_GOTO(read_seek_table(sh, entries), rc, fail);
    uint8_t meta[BB_SHARD_META_FRAME_SIZE];
    BB_TRY_GOTO(bb_pread_all(sh->fd, path, meta, sizeof meta, 0), rc, fail);
    BB_TRY_GOTO(bb_shard_meta_decode(path, meta, &sh->meta), rc, fail);
    BB_TRY_GOTO(check_frames(sh), rc, fail);
    *out = sh;
    return BB_OK;
fail:
    bb_shard_close(sh);
    return rc;
}

void bb_shard_close(bb_shard_t *sh)
{
    if (!sh) return;
    if (sh->fd >= 0) close(sh->fd);
    free(sh->frames);
    free(sh->path);
    free(sh);
}

const char *bb_shard_path(const bb_shard_t *sh) { return sh->path; }
const bb_shard_meta *bb_shard_get_meta(const bb_shard_t *sh) { return &sh->meta; }
uint64_t bb_shard_file_size(const bb_shard_t *sh) { return sh->file_size; }
int bb_shard_fd(const bb_shard_t *sh) { return sh->fd; }
uint32_t bb_shard_frame_count(const bb_shard_t *sh) { return sh->frame_count; }
uint32_t bb_shard_max_frame_bytes(const bb_shard_t *sh) { return sh->max_raw; }
uint32_t bb_shard_max_compressed_bytes(const bb_shard_t *sh) { return sh->max_compressed; }
uint64_t bb_shard_raw_bytes(const bb_shard_t *sh) { return sh->meta.record_count * sh->meta.record_size; }

const bb_shard_frame *bb_shard_frame_at(const bb_shard_t *sh, uint32_t index)
{
    return index < sh->frame_count ? &sh->frames[index] : NULL;
}

bb_status bb_frame_decoder_create(bb_frame_decoder_t **out)
{
    bb_frame_decoder_t *dec = calloc(1, sizeof *dec);
    if (!dec || !(dec->dctx = ZSTD_createDCtx())) {
        free(dec);
        return bb_fail(BB_ERR_NOMEM, "cannot create a zstd decompression context");
    }
    *out = dec;
    return BB_OK;
}

void bb_frame_decoder_destroy(bb_frame_decoder_t *dec)
{
    if (!dec) return;
    ZSTD_freeDCtx(dec->dctx);
    free(dec->staging);
    free(dec);
}

bb_status bb_shard_decode_frame(const bb_shard_t *sh, uint32_t index, bb_frame_decoder_t *dec,
                                const void *compressed, void *dst, size_t dst_cap)
{
    const bb_shard_frame *f = bb_shard_frame_at(sh, index);
    if (!f) return bb_fail(BB_ERR_ARG, "%s: frame %u does not exist (%u frames)", sh->path, index, sh->frame_count);
    if (dst_cap < f->raw_size)
        return bb_fail(BB_ERR_ARG, "%s: frame %u needs %u bytes, buffer has %zu", sh->path, index, f->raw_size, dst_cap);
    /* Exactly one zstd frame per entry, declaring its size (data/FORMAT.md):
     * zstd alone would also accept concatenated or skippable frames. */
    size_t framed = ZSTD_findFrameCompressedSize(compressed, f->compressed_size);
    unsigned long long declared = ZSTD_getFrameContentSize(compressed, f->compressed_size);
    if (ZSTD_isError(framed))
        return bb_fail(BB_ERR_CORRUPT, "%s: frame %u at offset %llu: zstd cannot parse it: %s",
                       sh->path, index, U64(f->offset), ZSTD_getErrorName(framed));
    if (framed != f->compressed_size || declared != f->raw_size)
        return bb_fail(BB_ERR_CORRUPT, "%s: frame %u at offset %llu: not one zstd frame of %u bytes declaring %u raw bytes",
                       sh->path, index, U64(f->offset), f->compressed_size, f->raw_size);
    size_t n = ZSTD_decompressDCtx(dec->dctx, dst, f->raw_size, compressed, f->compressed_size);
    if (ZSTD_isError(n))
        return bb_fail(BB_ERR_CORRUPT, "%s: frame %u at offset %llu: zstd cannot decode it: %s",
                       sh->path, index, U64(f->offset), ZSTD_getErrorName(n));
    if (n != f->raw_size)
        return bb_fail(BB_ERR_CORRUPT, "%s: frame %u at offset %llu: decoded %zu bytes, seek table says %u",
                       sh->path, index, U64(f->offset), n, f->raw_size);
    uint32_t actual = bb_shard_checksum(dst, n);
    if (actual != f->checksum)
        return bb_fail(BB_ERR_CORRUPT, "%s: frame %u at offset %llu: checksum mismatch (seek table 0x%08x, data 0x%08x)",
                       sh->path, index, U64(f->offset), f->checksum, actual);
    return BB_OK;
}

bb_status bb_shard_read_frame(const bb_shard_t *sh, uint32_t index, bb_frame_decoder_t *dec,
                              void *dst, size_t dst_cap)
{
    const bb_shard_frame *f = bb_shard_frame_at(sh, index);
    if (!f) return bb_fail(BB_ERR_ARG, "%s: frame %u does not exist (%u frames)", sh->path, index, sh->frame_count);
    if (dec->staging_cap < f->compressed_size) {
        uint8_t *grown = realloc(dec->staging, f->compressed_size);
        if (!grown) return bb_fail(BB_ERR_NOMEM, "cannot allocate %u bytes for a compressed frame", f->compressed_size);
        dec->staging = grown;
        dec->staging_cap = f->compressed_size;
    }
    BB_TRY(bb_pread_all(sh->fd, sh->path, dec->staging, f->compressed_size, f->offset));
    return bb_shard_decode_frame(sh, index, dec, dec->staging, dst, dst_cap);
}
