/* shard_format.h — private byte-level helpers shared by the shard writer and
 * reader: little-endian access, the metadata payload codec, the checksum. */
#ifndef BIGBATCH_SHARD_FORMAT_H
#define BIGBATCH_SHARD_FORMAT_H

#include "bigbatch/shard.h"

/* Metadata frame as stored: skippable header (8 bytes) + payload. */
#define BB_SHARD_META_FRAME_SIZE (8 + BB_SHARD_META_SIZE)

static inline uint16_t bb_le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t bb_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t bb_le64(const uint8_t *p) { return bb_le32(p) | (uint64_t)bb_le32(p + 4) << 32; }
static inline void bb_put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}
static inline void bb_put_le64(uint8_t *p, uint64_t v)
{
    bb_put_le32(p, (uint32_t)v);
    bb_put_le32(p + 4, (uint32_t)(v >> 32));
}

/* Low 32 bits of XXH64(data, seed 0): the seekable format's frame checksum. */
uint32_t bb_shard_checksum(const void *data, size_t size);

/* Writes the whole metadata frame (BB_SHARD_META_FRAME_SIZE bytes). */
void bb_shard_meta_encode(const bb_shard_meta *meta, uint8_t out[BB_SHARD_META_FRAME_SIZE]);
/* Parses and validates a metadata frame read from offset 0 of `path`. */
bb_status bb_shard_meta_decode(const char *path, const uint8_t in[BB_SHARD_META_FRAME_SIZE],
                               bb_shard_meta *meta);
/* Checks the fields a writer sets (kind, rank, shape, record size, frame
 * size, classes/vocab); fails with `code` and a message prefixed by `who`. */
bb_status bb_shard_meta_check(const char *who, const bb_shard_meta *meta, bb_status code);

/* Writes `size` bytes at `offset` (or at the file position when offset < 0),
 * retrying short writes; fails with BB_ERR_IO naming `path`. */
bb_status bb_write_all(int fd, const char *path, const void *data, size_t size, int64_t offset);
/* Reads exactly `size` bytes at `offset`; BB_ERR_IO on error or end of file. */
bb_status bb_pread_all(int fd, const char *path, void *data, size_t size, uint64_t offset);

#endif
