/* shard_format.c — metadata payload codec, checksum and whole-buffer I/O. */
#include "shard_format.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* Payload layout, version 2 (data/FORMAT.md, "Metadata frame"); version 1
 * has the source up to the checksum and no dataset identity. */
enum {
    OFF_MAGIC = 0, OFF_VERSION = 4, OFF_HEADER_SIZE = 6, OFF_KIND = 8, OFF_RANK = 12,
    OFF_SHAPE = 16, OFF_RECORD_SIZE = 32, OFF_RECORDS_PER_FRAME = 36, OFF_RECORD_COUNT = 40,
    OFF_FIRST_RECORD = 48, OFF_CLASSES = 56, OFF_SHARD_INDEX = 60, OFF_SOURCE = 64,
    OFF_DATASET_ID = 116, OFF_CHECKSUM = 124,
};
_Static_assert(OFF_CHECKSUM + 4 == BB_SHARD_META_SIZE, "metadata layout");
_Static_assert(OFF_DATASET_ID - OFF_SOURCE == BB_SHARD_SOURCE_MAX, "source field");
_Static_assert(OFF_CHECKSUM - OFF_SOURCE == BB_SHARD_SOURCE_MAX_V1, "source field, version 1");

uint32_t bb_shard_checksum(const void *data, size_t size)
{
    return (uint32_t)XXH64(data, size, 0);
}

bb_record_format bb_shard_meta_format(const bb_shard_meta *meta)
{
    bb_record_format f = {.kind = meta->kind, .rank = meta->rank, .record_size = meta->record_size,
                          .classes_or_vocab = meta->classes_or_vocab};
    memcpy(f.shape, meta->shape, sizeof f.shape);
    return f;
}

uint64_t bb_shard_meta_record_size(const bb_shard_meta *meta)
{
    if (meta->rank < 1 || meta->rank > BB_SHARD_MAX_RANK) return 0;
    uint64_t elems = 1;
    for (uint32_t i = 0; i < BB_SHARD_MAX_RANK; i++) {
        if ((meta->shape[i] == 0) != (i >= meta->rank)) return 0; /* used dims > 0, unused = 0 */
        if (i >= meta->rank) continue;
        elems *= meta->shape[i];
        if (elems > BB_SHARD_MAX_FRAME_BYTES) return 0;
    }
    switch (meta->kind) {
    case BB_RECORD_IMAGE_U8: return 1 + elems;
    case BB_RECORD_TOKENS_U16: return meta->rank == 1 ? 2 * elems : 0;
    case BB_RECORD_TOKENS_U32: return meta->rank == 1 ? 4 * elems : 0;
    }
    return 0;
}

bb_status bb_shard_meta_check(const char *who, const bb_shard_meta *meta, bb_status code)
{
    if (!strcmp(bb_record_kind_name(meta->kind), "unknown"))
        return bb_fail(code, "%s: unknown record kind %u", who, meta->kind);
    uint64_t size = bb_shard_meta_record_size(meta);
    if (size == 0 || size != meta->record_size)
        return bb_fail(code, "%s: record size %u does not match kind %s with rank %u",
                       who, meta->record_size, bb_record_kind_name(meta->kind), meta->rank);
    if (meta->records_per_frame == 0 ||
        (uint64_t)meta->records_per_frame * meta->record_size > BB_SHARD_MAX_FRAME_BYTES)
        return bb_fail(code, "%s: %u records per frame of %u bytes exceeds the %u MiB frame limit",
                       who, meta->records_per_frame, meta->record_size, BB_SHARD_MAX_FRAME_BYTES >> 20);
    /* Labels are u8 and tokens u16/u32: the class or vocabulary count must fit. */
    uint64_t limit = meta->kind == BB_RECORD_IMAGE_U8 ? 256 : meta->kind == BB_RECORD_TOKENS_U16 ? 65536 : UINT32_MAX;
    if (meta->classes_or_vocab == 0 || meta->classes_or_vocab > limit)
        return bb_fail(code, "%s: %u %s does not fit %s records (1 to %llu)", who, meta->classes_or_vocab,
                       meta->kind == BB_RECORD_IMAGE_U8 ? "classes" : "vocabulary", bb_record_kind_name(meta->kind),
                       (unsigned long long)limit);
    return BB_OK;
}

void bb_shard_meta_encode(const bb_shard_meta *meta, uint8_t out[BB_SHARD_META_FRAME_SIZE])
{
    memset(out, 0, BB_SHARD_META_FRAME_SIZE);
    bb_put_le32(out, BB_SHARD_META_MAGIC);
    bb_put_le32(out + 4, BB_SHARD_META_SIZE);
    uint8_t *p = out + 8;
    bb_put_le32(p + OFF_MAGIC, BB_SHARD_HEADER_MAGIC);
    p[OFF_VERSION] = BB_SHARD_VERSION, p[OFF_VERSION + 1] = 0;
    p[OFF_HEADER_SIZE] = BB_SHARD_META_SIZE, p[OFF_HEADER_SIZE + 1] = 0;
    bb_put_le32(p + OFF_KIND, meta->kind);
    bb_put_le32(p + OFF_RANK, meta->rank);
    for (int i = 0; i < BB_SHARD_MAX_RANK; i++) bb_put_le32(p + OFF_SHAPE + 4 * i, meta->shape[i]);
    bb_put_le32(p + OFF_RECORD_SIZE, meta->record_size);
    bb_put_le32(p + OFF_RECORDS_PER_FRAME, meta->records_per_frame);
    bb_put_le64(p + OFF_RECORD_COUNT, meta->record_count);
    bb_put_le64(p + OFF_FIRST_RECORD, meta->first_record);
    bb_put_le32(p + OFF_CLASSES, meta->classes_or_vocab);
    bb_put_le32(p + OFF_SHARD_INDEX, meta->shard_index);
    memcpy(p + OFF_SOURCE, meta->source, strnlen(meta->source, BB_SHARD_SOURCE_MAX));
    bb_put_le64(p + OFF_DATASET_ID, meta->dataset_id);
    bb_put_le32(p + OFF_CHECKSUM, bb_shard_checksum(p, OFF_CHECKSUM));
}

bb_status bb_shard_meta_decode(const char *path, const uint8_t in[BB_SHARD_META_FRAME_SIZE],
                               bb_shard_meta *meta)
{
    const uint8_t *p = in + 8;
    if (bb_le32(in) != BB_SHARD_META_MAGIC || bb_le32(p + OFF_MAGIC) != BB_SHARD_HEADER_MAGIC)
        return bb_fail(BB_ERR_FORMAT,
                       "%s: not a bigbatch shard: frame 0 at offset 0 is not bigbatch metadata "
                       "(a zstd seekable file from another tool?)", path);
    unsigned version = p[OFF_VERSION] | p[OFF_VERSION + 1] << 8;
    unsigned header_size = p[OFF_HEADER_SIZE] | p[OFF_HEADER_SIZE + 1] << 8;
    /* The version comes before the checksum: a later version may lay out
     * (and checksum) the payload differently, and must read as unsupported. */
    if (version < 1 || version > BB_SHARD_VERSION)
        return bb_fail(BB_ERR_FORMAT, "%s: shard format version %u is not supported (this bigbatch reads versions "
                       "1 to %d)", path, version, BB_SHARD_VERSION);
    if (bb_le32(in + 4) != BB_SHARD_META_SIZE || header_size != BB_SHARD_META_SIZE)
        return bb_fail(BB_ERR_CORRUPT, "%s: metadata frame at offset 0: frame size %u and header size %u, expected %d",
                       path, bb_le32(in + 4), header_size, BB_SHARD_META_SIZE);
    uint32_t stored = bb_le32(p + OFF_CHECKSUM), actual = bb_shard_checksum(p, OFF_CHECKSUM);
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION /* let the fuzzer reach the checks below */
    if (stored != actual)
        return bb_fail(BB_ERR_CORRUPT, "%s: metadata frame at offset 0: checksum mismatch (stored 0x%08x, computed 0x%08x)",
                       path, stored, actual);
#endif
    memset(meta, 0, sizeof *meta);
    meta->kind = bb_le32(p + OFF_KIND);
    meta->rank = bb_le32(p + OFF_RANK);
    for (int i = 0; i < BB_SHARD_MAX_RANK; i++) meta->shape[i] = bb_le32(p + OFF_SHAPE + 4 * i);
    meta->record_size = bb_le32(p + OFF_RECORD_SIZE);
    meta->records_per_frame = bb_le32(p + OFF_RECORDS_PER_FRAME);
    meta->record_count = bb_le64(p + OFF_RECORD_COUNT);
    meta->first_record = bb_le64(p + OFF_FIRST_RECORD);
    meta->classes_or_vocab = bb_le32(p + OFF_CLASSES);
    meta->shard_index = bb_le32(p + OFF_SHARD_INDEX);
    if (version == 1) {
        memcpy(meta->source, p + OFF_SOURCE, BB_SHARD_SOURCE_MAX_V1);
    } else {
        memcpy(meta->source, p + OFF_SOURCE, BB_SHARD_SOURCE_MAX);
        meta->dataset_id = bb_le64(p + OFF_DATASET_ID);
    }
    char who[1024];
    snprintf(who, sizeof who, "%s: metadata", path);
    BB_TRY(bb_shard_meta_check(who, meta, BB_ERR_CORRUPT));
    if (meta->record_count == 0) return bb_fail(BB_ERR_CORRUPT, "%s: metadata says the shard holds no records", path);
    return BB_OK;
}

bb_status bb_write_all(int fd, const char *path, const void *data, size_t size, int64_t offset)
{
    const uint8_t *p = data;
    while (size > 0) {
        ssize_t n = offset < 0 ? write(fd, p, size) : pwrite(fd, p, size, (off_t)offset);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return bb_fail_errno(BB_ERR_IO, "%s: write failed", path);
        p += n, size -= (size_t)n;
        if (offset >= 0) offset += n;
    }
    return BB_OK;
}

bb_status bb_pread_all(int fd, const char *path, void *data, size_t size, uint64_t offset)
{
    uint8_t *p = data;
    while (size > 0) {
        ssize_t n = pread(fd, p, size, (off_t)offset);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return bb_fail_errno(BB_ERR_IO, "%s: read at offset %llu failed", path, (unsigned long long)offset);
        if (n == 0)
            return bb_fail(BB_ERR_IO, "%s: unexpected end of file at offset %llu (file truncated?)", path,
                           (unsigned long long)offset);
        p += n, size -= (size_t)n, offset += (uint64_t)n;
    }
    return BB_OK;
}
