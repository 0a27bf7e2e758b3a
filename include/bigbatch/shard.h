/* shard.h — the .bbs shard format: writer, reader and datasets of shards.
 *
 * A shard is a zstd seekable-format file (see data/FORMAT.md): a metadata
 * skippable frame, N zstd frames of whole records, and a checksummed seek
 * table. `zstd -d` decodes it to the concatenated raw records.
 *
 * Reading one frame:
 *   bb_shard_t *sh;  bb_frame_decoder_t *dec;
 *   BB_TRY(bb_shard_open("data/kjv/train/shard-00000.bbs", &sh));
 *   BB_TRY(bb_frame_decoder_create(&dec));
 *   uint8_t *buf = malloc(bb_shard_max_frame_bytes(sh));
 *   BB_TRY(bb_shard_read_frame(sh, 0, dec, buf, bb_shard_max_frame_bytes(sh)));
 *   // buf holds bb_shard_frame_at(sh, 0)->raw_size bytes of records
 *
 * Writing a dataset (a directory of shards):
 *   bb_dataset_writer_t *w;
 *   BB_TRY(bb_dataset_writer_create(dir, &meta, &opts, &w));
 *   BB_TRY(bb_dataset_writer_add(w, records, count));   // any number of times
 *   BB_TRY(bb_dataset_writer_finish(w, &summary));
 *   bb_dataset_writer_destroy(w);
 *
 * A bb_shard_t is immutable once open: threads may share it, each with its
 * own bb_frame_decoder_t. Frame indices count data frames from 0 (the
 * metadata frame is not counted); they are the indices in error messages.
 */
#ifndef BIGBATCH_SHARD_H
#define BIGBATCH_SHARD_H

#include "bigbatch/core.h"

/* ---- format constants (normative: data/FORMAT.md) ---------------------- */
#define BB_SHARD_META_MAGIC 0x184D2A50u      /* zstd skippable frame, variant 0 */
#define BB_SHARD_SEEK_MAGIC 0x184D2A5Eu      /* zstd skippable frame, variant 0xE */
#define BB_SHARD_SEEKABLE_MAGIC 0x8F92EAB1u  /* last 4 bytes of every shard */
#define BB_SHARD_HEADER_MAGIC 0x48534242u    /* "BBSH": start of the metadata payload */
#define BB_SHARD_VERSION 2                   /* written; versions 1 and 2 are read */
#define BB_SHARD_META_SIZE 128               /* metadata payload bytes, every version */
#define BB_SHARD_FOOTER_SIZE 9
#define BB_SHARD_ENTRY_SIZE 12
#define BB_SHARD_SOURCE_MAX 52               /* bytes of source name, NUL-padded (60 in version 1) */
#define BB_SHARD_SOURCE_MAX_V1 60
#define BB_SHARD_MAX_FRAME_BYTES (64u << 20) /* largest decompressed frame */
#define BB_SHARD_MAX_FRAMES 0x8000000u       /* seekable-format limit */
#define BB_SHARD_MAX_RANK BB_RECORD_MAX_RANK
#define BB_SHARD_EXT ".bbs"

/* Record kinds and formats: core.h's bb_record_format (a shard's metadata
 * holds one, bb_shard_meta_format). */

typedef struct bb_shard_meta {
    uint32_t kind;               /* bb_record_kind */
    uint32_t rank;               /* dimensions used in shape, 1..4 */
    uint32_t shape[BB_SHARD_MAX_RANK];
    uint32_t record_size;        /* bytes per record */
    uint64_t record_count;       /* records in this shard */
    uint32_t records_per_frame;  /* every data frame but the last holds exactly this many */
    uint32_t classes_or_vocab;   /* class count (images) or vocabulary size (tokens) */
    uint32_t shard_index;        /* position of the shard in its dataset */
    uint64_t first_record;       /* dataset-wide index of this shard's first record */
    char source[BB_SHARD_SOURCE_MAX_V1 + 1]; /* where the records came from (written: 52 bytes at most) */
    uint64_t dataset_id;         /* XXH64 of the whole dataset's records, in order (its identity);
                                  * 0 in version-1 shards, which have none */
} bb_shard_meta;

/* Record size implied by kind and shape, or 0 when they are inconsistent. */
uint64_t bb_shard_meta_record_size(const bb_shard_meta *meta);
/* What one record holds, as core's type (what the models read). */
bb_record_format bb_shard_meta_format(const bb_shard_meta *meta);

/* ---- reader ------------------------------------------------------------ */
typedef struct bb_shard bb_shard_t;

typedef struct bb_shard_frame {
    uint64_t offset;          /* byte offset of the zstd frame in the file */
    uint64_t first_record;    /* index within the shard of the frame's first record */
    uint32_t compressed_size; /* bytes in the file */
    uint32_t raw_size;        /* decompressed bytes: a whole number of records */
    uint32_t checksum;        /* low 32 bits of XXH64(raw bytes, seed 0) */
} bb_shard_frame;

/* Opens `path`, reads and validates the footer, seek table and metadata.
 * Fails with BB_ERR_IO (cannot open/read), BB_ERR_FORMAT (not a shard, wrong
 * version) or BB_ERR_CORRUPT (inconsistent sizes, bad metadata checksum);
 * the message names the file and, where one applies, the frame and offset. */
bb_status bb_shard_open(const char *path, bb_shard_t **out);
/* Closes the file and frees the shard; accepts NULL. */
void bb_shard_close(bb_shard_t *shard);

const char *bb_shard_path(const bb_shard_t *shard);
const bb_shard_meta *bb_shard_get_meta(const bb_shard_t *shard);
uint64_t bb_shard_file_size(const bb_shard_t *shard);
/* Read-only descriptor of the open file, for callers issuing their own reads. */
int bb_shard_fd(const bb_shard_t *shard);
uint32_t bb_shard_frame_count(const bb_shard_t *shard);
/* Frame `index` (< bb_shard_frame_count), never NULL for a valid index. */
const bb_shard_frame *bb_shard_frame_at(const bb_shard_t *shard, uint32_t index);
/* Largest raw_size and compressed_size over the shard's data frames. */
uint32_t bb_shard_max_frame_bytes(const bb_shard_t *shard);
uint32_t bb_shard_max_compressed_bytes(const bb_shard_t *shard);
/* Sum of the data frames' raw sizes (= record_count * record_size). */
uint64_t bb_shard_raw_bytes(const bb_shard_t *shard);

/* Per-thread decoding state: a reused ZSTD_DCtx and a staging buffer. */
typedef struct bb_frame_decoder bb_frame_decoder_t;
bb_status bb_frame_decoder_create(bb_frame_decoder_t **out);
void bb_frame_decoder_destroy(bb_frame_decoder_t *dec);

/* Decompresses frame `index` from `compressed` (its compressed_size bytes,
 * read by the caller) into dst and verifies size and checksum. Fails with
 * BB_ERR_ARG when dst_cap < raw_size, BB_ERR_CORRUPT naming file, frame and
 * offset when zstd rejects the frame, the size differs or the checksum does
 * not match. */
bb_status bb_shard_decode_frame(const bb_shard_t *shard, uint32_t index, bb_frame_decoder_t *dec,
                                const void *compressed, void *dst, size_t dst_cap);
/* Reads frame `index` with pread into the decoder's staging buffer, then
 * bb_shard_decode_frame(). Also fails with BB_ERR_IO on a read error or a
 * short read. */
bb_status bb_shard_read_frame(const bb_shard_t *shard, uint32_t index, bb_frame_decoder_t *dec,
                              void *dst, size_t dst_cap);

/* ---- datasets: a directory of shards ----------------------------------- */
typedef struct bb_dataset bb_dataset_t;

/* True for the file names a dataset is made of: not hidden, ending in ".bbs". */
bool bb_shard_is_file_name(const char *name);

/* Opens every *.bbs in `path` (a directory, sorted by name) or the single
 * shard `path`. Fails when there is none, or when the shards disagree on
 * kind, shape, record size, classes/vocabulary, source or dataset identity
 * (naming both files), or do not follow each other. */
bb_status bb_dataset_open(const char *path, bb_dataset_t **out);
void bb_dataset_close(bb_dataset_t *ds);
const char *bb_dataset_path(const bb_dataset_t *ds);
uint32_t bb_dataset_shard_count(const bb_dataset_t *ds);
const bb_shard_t *bb_dataset_shard(const bb_dataset_t *ds, uint32_t index);
uint64_t bb_dataset_record_count(const bb_dataset_t *ds);
/* Metadata of the first shard (shared fields agree across shards). */
const bb_shard_meta *bb_dataset_meta(const bb_dataset_t *ds);
/* Its records' format (the first shard's, which all share). */
const bb_record_format *bb_dataset_format(const bb_dataset_t *ds);
/* What the dataset is, independent of where it lies: an XXH64 of every
 * shard's metadata (source, layout, counts, the records' hash that pack
 * wrote) and frame sizes, so that two copies of one dataset agree and
 * another dataset of the same layout does not (the processes of a job
 * compare it; checkpoints record it). Never fails. */
uint64_t bb_dataset_identity(const bb_dataset_t *ds);

/* ---- writer ------------------------------------------------------------ */
typedef struct bb_dataset_writer bb_dataset_writer_t;

typedef struct bb_writer_options {
    int level;            /* zstd level */
    uint32_t frame_bytes; /* target raw bytes per frame (whole records, at least one) */
    uint64_t shard_bytes; /* start a new shard before a shard's file exceeds this */
    int threads;          /* frames compressed in parallel; output is identical for any count */
} bb_writer_options;

typedef struct bb_dataset_summary {
    uint64_t records;
    uint64_t raw_bytes;        /* records * record_size */
    uint64_t file_bytes;       /* all shard files, metadata and seek tables included */
    uint32_t shards;
    uint32_t frames;
    uint64_t dataset_id;       /* XXH64 of the records, written into every shard */
} bb_dataset_summary;

/* Prepares to write shards "shard-00000.bbs", ... into the existing directory
 * `dir`. `meta` gives kind, rank, shape, record size, classes/vocab and
 * source; the counts are filled in by the writer. Fails with BB_ERR_ARG on
 * inconsistent metadata or options. */
bb_status bb_dataset_writer_create(const char *dir, const bb_shard_meta *meta,
                                   const bb_writer_options *opts, bb_dataset_writer_t **out);
/* Appends `count` records (count * record_size bytes). Fails with BB_ERR_IO
 * on a write error, BB_ERR_NOMEM, or BB_ERR_INTERNAL if zstd fails. */
bb_status bb_dataset_writer_add(bb_dataset_writer_t *w, const void *records, uint64_t count);
/* Flushes the last frame, writes every seek table and metadata frame, then
 * stamps every shard's metadata with the dataset's identity (the XXH64 of
 * all records added, in order), and fills `summary` (may be NULL). Fails
 * with BB_ERR_ARG when no record was added, BB_ERR_IO on a write error. */
bb_status bb_dataset_writer_finish(bb_dataset_writer_t *w, bb_dataset_summary *summary);
/* Frees the writer; files of an unfinished writer stay incomplete (callers
 * write into a temporary directory). Accepts NULL. */
void bb_dataset_writer_destroy(bb_dataset_writer_t *w);

#endif /* BIGBATCH_SHARD_H */
