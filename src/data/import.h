/* import.h — private: record sources that the pack driver streams into shards. */
#ifndef BIGBATCH_IMPORT_H
#define BIGBATCH_IMPORT_H

#include "bigbatch/pack.h"

typedef struct bb_record_source bb_record_source;
struct bb_record_source {
    bb_shard_meta meta;       /* kind, rank, shape, record_size, classes_or_vocab, source */
    uint64_t record_count;
    uint64_t unused_tokens;
    void *state;
    /* Writes the next `count` records (count * record_size bytes) to dst. */
    bb_status (*read)(bb_record_source *src, uint64_t count, uint8_t *dst);
    void (*close)(bb_record_source *src);
};

/* Each opener validates the whole input layout (magic numbers, counts,
 * sizes) before returning, so the driver creates no output for a bad input. */
bb_status bb_import_fmnist_open(const char *images, const char *labels, bb_record_source *out);
bb_status bb_import_tokens_open(const bb_pack_options *opts, bb_record_source *out);

/* "name" or "name +N more", cut to fit the metadata's source field. */
void bb_import_source_name(char out[BB_SHARD_SOURCE_MAX + 1], const char *first, int more);

#endif
