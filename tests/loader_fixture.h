/* loader_fixture.h — what the loader's and the sampler's suites share
 * (test_loader.c, test_sampler.c): a small dataset of many frames and
 * shards whose every record names itself, fresh for every test. */
#ifndef BIGBATCH_LOADER_FIXTURE_H
#define BIGBATCH_LOADER_FIXTURE_H

#include "data/sampler.h"
#include "bigbatch/loader.h"
#include "test_util.h"

/* The test dataset: RECORDS records of 4 u32 tokens; record i holds i, then
 * three words derived from i, so a payload names its record. Frames hold 7
 * records (the last of each shard fewer) and shards are small, so frames and
 * shards of different sizes all appear. */
enum { RECORDS = 1000, RECORD_WORDS = 4, RECORD_SIZE = 16 };

static inline void make_record(uint64_t id, uint32_t *words)
{
    words[0] = (uint32_t)id;
    for (int k = 1; k < RECORD_WORDS; k++) words[k] = (uint32_t)((id + 1) * 2654435761u * (uint32_t)k) ^ 0x5bd1e995u;
}

static inline char *make_dataset(void)
{
    char *path = tu_temp_dir();
    bb_shard_meta m = {.kind = BB_RECORD_TOKENS_U32, .rank = 1, .shape = {RECORD_WORDS}, .record_size = RECORD_SIZE,
                       .classes_or_vocab = UINT32_MAX};
    bb_writer_options o = {.level = 1, .frame_bytes = 7 * RECORD_SIZE, .shard_bytes = 3000, .threads = 1};
    uint32_t *records = malloc((size_t)RECORDS * RECORD_SIZE);
    for (uint64_t i = 0; i < RECORDS; i++) make_record(i, records + i * RECORD_WORDS);
    bb_dataset_writer_t *w;
    cr_assert_eq(bb_dataset_writer_create(path, &m, &o, &w), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_dataset_writer_add(w, records, RECORDS), BB_OK);
    bb_dataset_summary sum;
    cr_assert_eq(bb_dataset_writer_finish(w, &sum), BB_OK, "%s", bb_error_message());
    bb_dataset_writer_destroy(w);
    cr_assert_gt(sum.shards, 3, "the test wants several shards, got %u", sum.shards);
    free(records);
    return path;
}

static inline bb_dataset_t *open_dataset(const char *path)
{
    bb_dataset_t *opened;
    cr_assert_eq(bb_dataset_open(path, &opened), BB_OK, "%s", bb_error_message());
    return opened;
}

/* Every test gets a fresh dataset in its own directory. */
static char *dir;
static bb_dataset_t *ds;

static inline void dataset_up(void)
{
    dir = make_dataset();
    ds = open_dataset(dir);
}

static inline void dataset_down(void)
{
    if (ds) bb_dataset_close(ds);
    if (dir) tu_rm_tree(dir);
    free(dir);
    ds = NULL, dir = NULL;
}

#endif
