/* pack.c — the pack driver: validates the input, streams records into
 * writers under a temporary directory, and renames it into place. */
#include "bigbatch/remote.h"
#include "bigbatch/tokenizer.h"
#include "import.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK_BYTES (4u << 20) /* records handed to the writer per call */

bb_pack_options bb_pack_defaults(void)
{
    return (bb_pack_options){
        .format = BB_PACK_TEXT,
        .vocab = 50257,
        .val_seed = 1,
        .writer = {.level = BB_PACK_LEVEL_BY_KIND, .frame_bytes = 256u << 10, .shard_bytes = 256ull << 20,
                   .threads = bb_cpu_count() < 32 ? bb_cpu_count() : 32},
    };
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static int remove_tree(const char *path)
{
    return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* True when `dir` holds only shards (the tokenizer's copy, the index) and split
 * directories of them, i.e. output of an earlier pack that --force may
 * replace. */
static bool holds_only_shards(const char *dir, int depth)
{
    DIR *d = opendir(dir);
    if (!d) return false;
    bool ok = true;
    struct dirent *e;
    while (ok && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(sub, &st) != 0)
            ok = false;
        else if (S_ISREG(st.st_mode))
            ok = bb_shard_is_file_name(e->d_name) || !strcmp(e->d_name, BB_TOKENIZER_FILE) ||
                 !strcmp(e->d_name, BB_INDEX_FILE);
        else
            ok = S_ISDIR(st.st_mode) && depth == 0 && holds_only_shards(sub, 1);
    }
    closedir(d);
    return ok;
}

static bool dir_is_empty(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return false;
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n == 0;
}

/* Removes the parents that make_parents() created, deepest first. */
static void remove_parents(const char *path, size_t created)
{
    if (!created) return;
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = strrchr(buf, '/'); p && (size_t)(p - buf) >= created; p = strrchr(buf, '/')) {
        *p = '\0';
        rmdir(buf); /* every level down to `created` is ours or never existed; rmdir spares non-empty ones */
    }
}

/* Creates the missing parents of `path`; *created: see bb_make_parents.
 * On failure those it made are removed again. */
static bb_status make_parents(const char *path, size_t *created)
{
    bb_status rc = bb_make_parents(path, created);
    if (rc != BB_OK) {
        remove_parents(path, *created);
        *created = 0;
    }
    return rc;
}

typedef struct output_plan {
    char final[4096];   /* out_dir without trailing slashes */
    char temp[4096];    /* sibling ".NAME.partial-PID" */
    bool replace;       /* final exists and must be swapped out */
    size_t parents_created; /* see make_parents() */
} output_plan;

/* Removes what killed packs into the same --out left: sibling
 * ".NAME.partial-PID" directories (and their ".old") of processes that are
 * gone, when they hold only shards. */
static void remove_stale_partials(const char *final, int dir_len)
{
    char parent[4096], prefix[4200];
    snprintf(parent, sizeof parent, "%.*s", dir_len ? dir_len : 1, dir_len ? final : ".");
    int n = snprintf(prefix, sizeof prefix, ".%s.partial-", final + dir_len);
    DIR *d = opendir(parent);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, (size_t)n)) continue;
        char *end;
        long pid = strtol(e->d_name + n, &end, 10);
        if (pid <= 0 || (*end && strcmp(end, ".old")) || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char path[8400];
        snprintf(path, sizeof path, "%s/%s", parent, e->d_name);
        if (holds_only_shards(path, 0) && remove_tree(path) == 0) BB_INFO("removed %s, left by a killed pack", path);
    }
    if (d) closedir(d);
}

static bb_status plan_output(const bb_pack_options *o, output_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    size_t len = strlen(o->out_dir);
    while (len > 1 && o->out_dir[len - 1] == '/') len--;
    if (len == 0 || len >= sizeof plan->final - 64) return bb_fail(BB_ERR_ARG, "--out: unusable path '%s'", o->out_dir);
    memcpy(plan->final, o->out_dir, len);
    const char *slash = strrchr(plan->final, '/');
    int dir_len = slash ? (int)(slash - plan->final) + 1 : 0;
    int n = snprintf(plan->temp, sizeof plan->temp, "%.*s.%s.partial-%d", dir_len, plan->final,
                     plan->final + dir_len, (int)getpid());
    if (n < 0 || (size_t)n >= sizeof plan->temp) return bb_fail(BB_ERR_ARG, "--out: path too long");
    remove_stale_partials(plan->final, dir_len);
    struct stat st;
    if (stat(plan->final, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) return bb_fail(BB_ERR_IO, "--out %s exists and is not a directory", plan->final);
        if (!dir_is_empty(plan->final)) {
            if (!o->force)
                return bb_fail(BB_ERR_ARG, "--out %s already exists and is not empty; pass --force to replace it", plan->final);
            if (!holds_only_shards(plan->final, 0))
                return bb_fail(BB_ERR_IO, "--out %s holds files that are not bigbatch shards; refusing to replace it even with --force",
                               plan->final);
        }
        plan->replace = true;
    }
    return make_parents(plan->temp, &plan->parents_created);
}

/* Makes the renames in `dir` durable. */
static void sync_dir(const char *path)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    int fd = open(slash ? (*dir ? dir : "/") : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* Swaps the finished temporary directory into place. */
static bb_status commit_output(const output_plan *plan)
{
    char old[sizeof plan->temp + 8];
    if (plan->replace) {
        snprintf(old, sizeof old, "%s.old", plan->temp);
        if (rename(plan->final, old) != 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot move aside", plan->final);
    }
    if (rename(plan->temp, plan->final) != 0) {
        bb_status rc = bb_fail_errno(BB_ERR_IO, "%s: cannot rename to %s", plan->temp, plan->final);
        if (plan->replace) rename(old, plan->final);
        return rc;
    }
    sync_dir(plan->final);
    if (plan->replace && remove_tree(old) != 0)
        BB_WARN("%s: could not remove the replaced dataset; delete it by hand", old);
    return BB_OK;
}

typedef struct split {
    const char *dir;
    uint64_t records;
    bb_dataset_writer_t *writer;
} split;

/* --val-split spread: each record of the input in order goes to val with
 * probability (val left) / (records left) — exactly `val` of them, every
 * subset as likely — in runs to the two writers. */
static bb_status stream_spread(const bb_pack_options *o, bb_record_source *src, split *splits, uint8_t *chunk,
                               uint64_t per_chunk)
{
    uint64_t rng = o->val_seed, left = src->record_count, val_left = splits[1].records, done = 0;
    size_t rs = src->meta.record_size;
    bool *to_val = malloc(per_chunk * sizeof *to_val);
    bb_status rc = to_val ? BB_OK : bb_fail(BB_ERR_NOMEM, "out of memory");
    while (left > 0 && rc == BB_OK) {
        if (o->interrupted && *o->interrupted) {
            rc = bb_fail(BB_ERR_INTERRUPTED, "interrupted; %s was not written", o->out_dir);
            break;
        }
        uint64_t n = left < per_chunk ? left : per_chunk;
        rc = src->read(src, n, chunk);
        for (uint64_t i = 0; rc == BB_OK && i < n; i++) {
            double u = (double)(bb_splitmix64(&rng) >> 11) * 0x1.0p-53; /* uniform in [0, 1) */
            to_val[i] = u * (double)(left - i) < (double)val_left;
            val_left -= to_val[i];
        }
        for (uint64_t i = 0, j; rc == BB_OK && i < n; i = j) { /* runs bound for one split */
            for (j = i + 1; j < n && to_val[j] == to_val[i]; j++) {}
            rc = bb_dataset_writer_add(splits[to_val[i] ? 1 : 0].writer, chunk + i * rs, j - i);
        }
        left -= n, done += n;
        if (rc == BB_OK && o->progress) o->progress(o->progress_ctx, done, src->record_count);
    }
    free(to_val);
    return rc;
}

static bb_status stream_records(const bb_pack_options *o, bb_record_source *src, split *splits, int nsplits)
{
    uint64_t per_chunk = CHUNK_BYTES / src->meta.record_size;
    if (per_chunk == 0) per_chunk = 1;
    uint8_t *chunk = malloc(per_chunk * src->meta.record_size);
    if (!chunk) return bb_fail(BB_ERR_NOMEM, "cannot allocate %llu bytes of records", (unsigned long long)(per_chunk * src->meta.record_size));
    if (nsplits == 2 && o->val_split == BB_VAL_SPREAD) {
        bb_status rc = stream_spread(o, src, splits, chunk, per_chunk);
        free(chunk);
        return rc;
    }
    bb_status rc = BB_OK;
    uint64_t done = 0;
    for (int s = 0; s < nsplits && rc == BB_OK; s++) {
        for (uint64_t left = splits[s].records; left > 0 && rc == BB_OK;) {
            if (o->interrupted && *o->interrupted) {
                rc = bb_fail(BB_ERR_INTERRUPTED, "interrupted; %s was not written", o->out_dir);
                break;
            }
            uint64_t n = left < per_chunk ? left : per_chunk;
            rc = src->read(src, n, chunk);
            if (rc == BB_OK) rc = bb_dataset_writer_add(splits[s].writer, chunk, n);
            left -= n, done += n;
            if (o->progress) o->progress(o->progress_ctx, done, src->record_count);
        }
    }
    free(chunk);
    return rc;
}

bb_status bb_pack(const bb_pack_options *o, bb_pack_report *report)
{
    double t0 = bb_clock_seconds();
    memset(report, 0, sizeof *report);
    if (!o->out_dir) return bb_fail(BB_ERR_ARG, "--out DIR is required");
    if (!(o->val_fraction >= 0 && o->val_fraction < 1))
        return bb_fail(BB_ERR_ARG, "--val-fraction %g must be in [0, 1)", o->val_fraction);

    bb_record_source src = {0};
    bb_status rc = o->format == BB_PACK_FMNIST ? bb_import_fmnist_open(o->images, o->labels, &src)
                                               : bb_import_tokens_open(o, &src);
    if (rc != BB_OK) return rc;

    split splits[2] = {{.dir = "", .records = src.record_count}};
    int nsplits = 1;
    if (o->val_fraction > 0) {
        uint64_t val = (uint64_t)floor((double)src.record_count * o->val_fraction);
        if (val == 0 || val == src.record_count) {
            rc = bb_fail(BB_ERR_ARG, "--val-fraction %g of %llu records leaves an empty split", o->val_fraction,
                         (unsigned long long)src.record_count);
            goto done_src;
        }
        /* tail: no record of val comes from the text between two training
         * records; spread: val records sit among them (stream_spread) */
        splits[0] = (split){.dir = "train", .records = src.record_count - val};
        splits[1] = (split){.dir = "val", .records = val};
        nsplits = 2;
    }

    output_plan plan;
    BB_TRY_GOTO(plan_output(o, &plan), rc, done_src);
    if (mkdir(plan.temp, 0755) != 0) {
        rc = bb_fail_errno(BB_ERR_IO, "%s: cannot create directory", plan.temp);
        remove_parents(plan.temp, plan.parents_created);
        goto done_src;
    }
    int tracked = bb_temp_track(plan.temp); /* a second signal removes it */
    for (int s = 0; s < nsplits; s++) {
        char dir[sizeof plan.temp + 16];
        snprintf(dir, sizeof dir, "%s%s%s", plan.temp, *splits[s].dir ? "/" : "", splits[s].dir);
        if (*splits[s].dir && mkdir(dir, 0755) != 0) {
            rc = bb_fail_errno(BB_ERR_IO, "%s: cannot create directory", dir);
            goto done_out;
        }
        bb_writer_options wo = o->writer;
        if (wo.level == BB_PACK_LEVEL_BY_KIND)
            wo.level = src.meta.kind == BB_RECORD_IMAGE_U8 ? BB_PACK_LEVEL_IMAGES : BB_PACK_LEVEL_TOKENS;
        BB_TRY_GOTO(bb_dataset_writer_create(dir, &src.meta, &wo, &splits[s].writer), rc, done_out);
        char copy[sizeof dir + 32];
        snprintf(copy, sizeof copy, "%s/%s", dir, BB_TOKENIZER_FILE);
        if (o->tokenizer) BB_TRY_GOTO(bb_copy_file(o->tokenizer, copy), rc, done_out); /* every split decodes alone */
    }
    if (o->tokenizer && nsplits == 2) {
        char copy[sizeof plan.temp + 32];
        snprintf(copy, sizeof copy, "%s/%s", plan.temp, BB_TOKENIZER_FILE);
        BB_TRY_GOTO(bb_copy_file(o->tokenizer, copy), rc, done_out);
    }
    BB_TRY_GOTO(stream_records(o, &src, splits, nsplits), rc, done_out);
    BB_TRY_GOTO(bb_dataset_writer_finish(splits[0].writer, &report->train), rc, done_out);
    if (nsplits == 2) BB_TRY_GOTO(bb_dataset_writer_finish(splits[1].writer, &report->val), rc, done_out);
    BB_TRY_GOTO(bb_index_write(plan.temp, true), rc, done_out); /* what a copy in object storage is read by */
    BB_TRY_GOTO(commit_output(&plan), rc, done_out);
    report->unused_tokens = src.unused_tokens;
    report->seconds = bb_clock_seconds() - t0;
done_out:
    for (int s = 0; s < nsplits; s++) bb_dataset_writer_destroy(splits[s].writer);
    if (rc != BB_OK) {
        remove_tree(plan.temp);
        remove_parents(plan.temp, plan.parents_created);
    }
    bb_temp_untrack(tracked);
done_src:
    src.close(&src);
    return rc;
}
