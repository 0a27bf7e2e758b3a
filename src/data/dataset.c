/* dataset.c — a dataset is a directory of shards that agree on their records. */
#include "shard_format.h"
#include "stream.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#define XXH_STATIC_LINKING_ONLY /* XXH64_state_t on the stack */
#include <xxhash.h>

struct bb_dataset {
    char *path;
    bb_shard_t **shards;
    uint32_t shard_count;
    uint64_t record_count;
    bb_record_format format; /* the first shard's */
    bb_remote_stream_t *stream;  /* the shards are being downloaded (stream.h); else NULL */
    uint32_t *stream_file;       /* (shards) each one's file in the stream; UINT32_MAX: whole */
};

bool bb_shard_is_file_name(const char *name)
{
    size_t n = strlen(name), ext = strlen(BB_SHARD_EXT);
    return name[0] != '.' && n > ext && strcmp(name + n - ext, BB_SHARD_EXT) == 0;
}

static int is_shard_entry(const struct dirent *e) { return bb_shard_is_file_name(e->d_name); }

/* Shards of one dataset must describe the same records and follow each other
 * without gaps, so a missing or foreign shard is caught before training. */
static bb_status check_consistent(const bb_dataset_t *ds, uint32_t i)
{
    const bb_shard_meta *a = bb_shard_get_meta(ds->shards[0]), *b = bb_shard_get_meta(ds->shards[i]);
    const char *pa = bb_shard_path(ds->shards[0]), *pb = bb_shard_path(ds->shards[i]);
    if (a->kind != b->kind || a->rank != b->rank || memcmp(a->shape, b->shape, sizeof a->shape) != 0 ||
        a->classes_or_vocab != b->classes_or_vocab)
        return bb_fail(BB_ERR_FORMAT, "%s and %s hold different records (%s of %u bytes, %u classes/vocab vs %s of "
                       "%u bytes, %u): they do not belong to one dataset", pa, pb, bb_record_kind_name(a->kind),
                       a->record_size, a->classes_or_vocab, bb_record_kind_name(b->kind), b->record_size,
                       b->classes_or_vocab);
    if (strcmp(a->source, b->source))
        return bb_fail(BB_ERR_FORMAT, "%s and %s were packed from different sources (%s, %s): they do not belong to "
                       "one dataset", pa, pb, a->source, b->source);
    if (a->dataset_id != b->dataset_id)
        return bb_fail(BB_ERR_FORMAT, "%s and %s belong to different datasets (identity %016llx, %016llx): a shard "
                       "was replaced by one of another pack", pa, pb, (unsigned long long)a->dataset_id,
                       (unsigned long long)b->dataset_id);
    if (b->shard_index != i || b->first_record != ds->record_count)
        return bb_fail(BB_ERR_CORRUPT, "%s: shard index %u (first record %llu) found in position %u "
                       "(expected first record %llu): a shard of %s is missing or foreign",
                       pb, b->shard_index, (unsigned long long)b->first_record, i,
                       (unsigned long long)ds->record_count, ds->path);
    return BB_OK;
}

/* Each open shard holds a descriptor: raise the soft limit toward the hard
 * one when a large dataset needs it, as a user would with `ulimit -n`. */
static void ensure_descriptors(uint32_t shards)
{
    struct rlimit rl;
    rlim_t want = (rlim_t)shards + 256;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want) return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0) BB_INFO("raised the open-file limit to %llu for %u shards",
                                                    (unsigned long long)rl.rlim_cur, shards);
}

bb_status bb_dataset_open(const char *path, bb_dataset_t **out)
{
    *out = NULL;
    bb_status rc = BB_OK;
    struct dirent **names = NULL;
    int count = 0;
    bb_dataset_t *ds = calloc(1, sizeof *ds);
    if (!ds || !(ds->path = strdup(path))) {
        free(ds);
        return bb_fail(BB_ERR_NOMEM, "%s: out of memory", path);
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        rc = bb_fail_errno(BB_ERR_IO, "%s: cannot open", path);
        goto fail;
    }
    bool is_dir = S_ISDIR(st.st_mode);
    if (is_dir) {
        /* versionsort: shard-100000 comes after shard-99999, not after shard-10000. */
        count = scandir(path, &names, is_shard_entry, versionsort);
        if (count < 0) {
            rc = bb_fail_errno(BB_ERR_IO, "%s: cannot list directory", path);
            goto fail;
        }
        if (count == 0) {
            rc = bb_fail(BB_ERR_FORMAT, "%s: no *%s shards in this directory", path, BB_SHARD_EXT);
            goto fail;
        }
    }
    uint32_t n = is_dir ? (uint32_t)count : 1;
    ensure_descriptors(n);
    ds->shards = calloc(n, sizeof *ds->shards);
    if (!ds->shards) {
        rc = bb_fail(BB_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    for (uint32_t i = 0; i < n; i++) {
        char file[4096];
        if (is_dir)
            snprintf(file, sizeof file, "%s/%s", path, names[i]->d_name);
        else
            snprintf(file, sizeof file, "%s", path);
        BB_TRY_GOTO(bb_shard_open(file, &ds->shards[i]), rc, fail);
        ds->shard_count = i + 1;
        if (i == 0) ds->format = bb_shard_meta_format(bb_shard_get_meta(ds->shards[0]));
        if (is_dir) BB_TRY_GOTO(check_consistent(ds, i), rc, fail);
        ds->record_count += bb_shard_get_meta(ds->shards[i])->record_count;
    }
    if ((ds->stream = bb_stream_of(path))) {
        if (!(ds->stream_file = malloc(n * sizeof *ds->stream_file))) {
            rc = bb_fail(BB_ERR_NOMEM, "%s: out of memory", path);
            goto fail;
        }
        for (uint32_t i = 0; i < n; i++) ds->stream_file[i] = bb_stream_file(ds->stream, bb_shard_path(ds->shards[i]));
    }
    *out = ds;
fail:
    for (int i = 0; i < count; i++) free(names[i]);
    free(names);
    if (rc != BB_OK) bb_dataset_close(ds);
    return rc;
}

void bb_dataset_close(bb_dataset_t *ds)
{
    if (!ds) return;
    for (uint32_t i = 0; i < ds->shard_count; i++) bb_shard_close(ds->shards[i]);
    free(ds->shards);
    free(ds->stream_file);
    free(ds->path);
    free(ds);
}

const char *bb_dataset_path(const bb_dataset_t *ds) { return ds->path; }
uint32_t bb_dataset_shard_count(const bb_dataset_t *ds) { return ds->shard_count; }
uint64_t bb_dataset_record_count(const bb_dataset_t *ds) { return ds->record_count; }

uint64_t bb_dataset_identity(const bb_dataset_t *ds)
{
    XXH64_state_t st;
    XXH64_reset(&st, 0);
    for (uint32_t i = 0; i < bb_dataset_shard_count(ds); i++) {
        const bb_shard_t *sh = bb_dataset_shard(ds, i);
        const bb_shard_meta *m = bb_shard_get_meta(sh);
        uint64_t fields[] = {m->kind, m->rank, m->shape[0], m->shape[1], m->shape[2], m->shape[3], m->record_size,
                             m->record_count, m->records_per_frame, m->classes_or_vocab, m->shard_index,
                             m->first_record, bb_shard_frame_count(sh), bb_shard_raw_bytes(sh)};
        XXH64_update(&st, fields, sizeof fields);
        XXH64_update(&st, m->source, strlen(m->source));
        if (m->dataset_id) XXH64_update(&st, &m->dataset_id, sizeof m->dataset_id); /* version 2 */
        for (uint32_t f = 0; f < bb_shard_frame_count(sh); f++) {
            uint32_t bytes = bb_shard_frame_at(sh, f)->compressed_size;
            XXH64_update(&st, &bytes, sizeof bytes);
        }
    }
    return XXH64_digest(&st);
}
const bb_shard_meta *bb_dataset_meta(const bb_dataset_t *ds) { return bb_shard_get_meta(ds->shards[0]); }
const bb_record_format *bb_dataset_format(const bb_dataset_t *ds) { return &ds->format; }

const bb_shard_t *bb_dataset_shard(const bb_dataset_t *ds, uint32_t index)
{
    return index < ds->shard_count ? ds->shards[index] : NULL;
}

void bb_dataset_want_frame(const bb_dataset_t *ds, uint32_t shard, uint32_t frame)
{
    if (!ds->stream || ds->stream_file[shard] == UINT32_MAX) return;
    const bb_shard_frame *f = bb_shard_frame_at(ds->shards[shard], frame);
    bb_stream_want(ds->stream, ds->stream_file[shard], f->offset, f->compressed_size);
}

bb_status bb_dataset_await_frame(const bb_dataset_t *ds, uint32_t shard, uint32_t frame, const _Atomic bool *stop)
{
    if (!ds->stream || ds->stream_file[shard] == UINT32_MAX) return BB_OK;
    const bb_shard_frame *f = bb_shard_frame_at(ds->shards[shard], frame);
    return bb_stream_await(ds->stream, ds->stream_file[shard], f->offset, f->compressed_size, stop);
}
