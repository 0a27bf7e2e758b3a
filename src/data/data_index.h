/* data_index.h — reading index.json (remote.h says what it is), for the
 * mirror and the tests.
 *
 *   bb_index ix;
 *   BB_TRY(bb_index_load("cache/x/index.json", "https://host/kjv/index.json", &ix));
 *   const bb_index_file *f = bb_index_find(&ix, "shard-00000.bbs");
 *   bb_index_free(&ix);
 */
#ifndef BIGBATCH_DATA_INDEX_H
#define BIGBATCH_DATA_INDEX_H

#include "bigbatch/remote.h"

typedef struct bb_index_file {
    char *name;
    uint64_t bytes;
    uint64_t xxh64; /* of the whole file, seed 0 */
} bb_index_file;

typedef struct bb_index {
    char **dirs;    /* subdirectories with an index of their own */
    size_t dir_count;
    bb_index_file *files;
    size_t file_count;
} bb_index;

/* Loads the index at `path`; `what` names it in errors (its URL). Fails
 * with BB_ERR_IO (cannot read), BB_ERR_FORMAT (not JSON, not an index,
 * a name with a slash or a hidden one, files not sorted by name or one
 * twice, a malformed hash), BB_ERR_NOMEM. */
bb_status bb_index_load(const char *path, const char *what, bb_index *out);
/* Frees what load allocated; accepts a zeroed index. */
void bb_index_free(bb_index *index);
/* The entry called `name` (a binary search: load keeps them sorted), or NULL. */
const bb_index_file *bb_index_find(const bb_index *index, const char *name);
/* Size and XXH64 (seed 0) of a whole file. Fails with BB_ERR_IO naming it. */
bb_status bb_index_hash_file(const char *path, uint64_t *bytes, uint64_t *hash);

#endif /* BIGBATCH_DATA_INDEX_H */
