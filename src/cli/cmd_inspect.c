/* cmd_inspect.c — `bigbatch inspect`: describe and verify shards. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define XXH_STATIC_LINKING_ONLY /* XXH64_state_t on the stack */
#include <xxhash.h>

#include "bigbatch/shard.h"
#include "bigbatch/json.h"
#include "bigbatch/tokenizer.h"
#include "commands.h"
#include "data_flags.h"

static const char usage[] = "bigbatch inspect PATH [--verify] [--json]";
static const char summary[] =
    "Describes a shard, a dataset directory of shards, or a directory of splits\n"
    "(e.g. data/kjv with train/ and val/): record kind and shape, record count,\n"
    "frames, raw and compressed sizes. --verify decodes every frame and checks its\n"
    "checksum, stopping with a non-zero exit at the first bad frame, and checks the\n"
    "dataset's identity: the XXH64 of all its records, in order, that pack wrote\n"
    "into every shard (the same as `cat shard-*.bbs | zstd -dc | xxhsum -H1`).\n\n"
    "example: bigbatch inspect data/kjv --verify";

typedef struct verify_result {
    bool ran, ok;
    uint64_t frames, bytes;
    double seconds;
} verify_result;

static bb_status verify_dataset(const bb_dataset_t *ds, verify_result *v)
{
    v->ran = true;
    double t0 = bb_clock_seconds();
    bb_frame_decoder_t *dec = NULL;
    uint8_t *buf = NULL;
    size_t cap = 0;
    bb_status rc;
    XXH64_state_t hash;
    XXH64_reset(&hash, 0);
    BB_TRY_GOTO(bb_frame_decoder_create(&dec), rc, done);
    for (uint32_t s = 0; s < bb_dataset_shard_count(ds); s++) {
        const bb_shard_t *sh = bb_dataset_shard(ds, s);
        if (bb_shard_max_frame_bytes(sh) > cap) {
            free(buf);
            cap = bb_shard_max_frame_bytes(sh);
            if (!(buf = malloc(cap))) {
                rc = bb_fail(BB_ERR_NOMEM, "cannot allocate %zu bytes for a frame", cap);
                goto done;
            }
        }
        for (uint32_t f = 0; f < bb_shard_frame_count(sh); f++) {
            if (bb_cli_interrupted) {
                rc = bb_fail(BB_ERR_INTERRUPTED, "interrupted during --verify");
                goto done;
            }
            BB_TRY_GOTO(bb_shard_read_frame(sh, f, dec, buf, cap), rc, done);
            v->frames++;
            v->bytes += bb_shard_frame_at(sh, f)->raw_size;
            XXH64_update(&hash, buf, bb_shard_frame_at(sh, f)->raw_size);
        }
    }
    uint64_t id = bb_dataset_meta(ds)->dataset_id, got = XXH64_digest(&hash);
    if (id && got != id) {
        rc = bb_fail(BB_ERR_CORRUPT, "%s: the records hash to %016llx, but the shards say the dataset's identity is "
                     "%016llx: its shards were changed or swapped after pack", bb_dataset_path(ds),
                     (unsigned long long)got, (unsigned long long)id);
        goto done;
    }
    v->ok = true;
done:
    v->seconds = bb_clock_seconds() - t0;
    free(buf);
    bb_frame_decoder_destroy(dec);
    return rc;
}

static uint64_t dataset_file_bytes(const bb_dataset_t *ds, uint32_t *frames)
{
    uint64_t bytes = 0;
    *frames = 0;
    for (uint32_t s = 0; s < bb_dataset_shard_count(ds); s++) {
        bytes += bb_shard_file_size(bb_dataset_shard(ds, s));
        *frames += bb_shard_frame_count(bb_dataset_shard(ds, s));
    }
    return bytes;
}

static const char *base_name(const char *path)
{
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

static void print_text(const bb_dataset_t *ds, const verify_result *v, const char *error)
{
    const bb_shard_meta *m = bb_dataset_meta(ds);
    uint32_t frames;
    uint64_t file = dataset_file_bytes(ds, &frames), raw = bb_dataset_record_count(ds) * m->record_size;
    char a[32], b[32];
    printf("%s\n", bb_dataset_path(ds));
    printf("  records  %llu x %s [", (unsigned long long)bb_dataset_record_count(ds), bb_record_kind_name(m->kind));
    for (uint32_t i = 0; i < m->rank; i++) printf(i ? " x %u" : "%u", m->shape[i]);
    printf("] (%u bytes), %s %u\n", m->record_size, m->kind == BB_RECORD_IMAGE_U8 ? "classes" : "vocabulary",
           m->classes_or_vocab);
    printf("  source   %s\n", m->source);
    if (m->dataset_id)
        printf("  identity %016llx (XXH64 of the records)\n", (unsigned long long)m->dataset_id);
    else
        printf("  identity none (a version-1 shard)\n");
    bb_tokenizer_t *t = NULL;
    if (bb_tokenizer_of_dataset(bb_dataset_path(ds), &t) != BB_OK)
        printf("  tokenizer unreadable: %s\n", bb_error_message());
    else if (t)
        printf("  tokenizer %s: %u ids, XXH64 %016llx%s\n", bb_tokenizer_path(t), bb_tokenizer_vocab(t),
               (unsigned long long)bb_tokenizer_hash(t),
               bb_tokenizer_vocab(t) == m->classes_or_vocab ? "" : " (not the records' vocabulary)");
    bb_tokenizer_destroy(t);
    printf("  frames   %u in %u shard%s, %u records per frame\n", frames, bb_dataset_shard_count(ds),
           bb_dataset_shard_count(ds) == 1 ? "" : "s", m->records_per_frame);
    printf("  size     %s raw, %s on disk, ratio %.2f\n", bb_format_bytes(raw, a, sizeof a),
           bb_format_bytes(file, b, sizeof b), (double)raw / (double)file);
    for (uint32_t s = 0; s < bb_dataset_shard_count(ds); s++) {
        const bb_shard_t *sh = bb_dataset_shard(ds, s);
        const bb_shard_meta *sm = bb_shard_get_meta(sh);
        uint32_t nf = bb_shard_frame_count(sh);
        printf("  %-18s records %llu..%llu, %u frame%s, %s\n", base_name(bb_shard_path(sh)),
               (unsigned long long)sm->first_record, (unsigned long long)(sm->first_record + sm->record_count - 1),
               nf, nf == 1 ? "" : "s", bb_format_bytes(bb_shard_file_size(sh), a, sizeof a));
    }
    if (v->ran && v->ok)
        printf("  verify   ok: %llu frames, %s decoded and checksummed in %.2f s (%.0f MB/s)\n",
               (unsigned long long)v->frames, bb_format_bytes(v->bytes, a, sizeof a), v->seconds,
               (double)v->bytes / 1e6 / (v->seconds > 0 ? v->seconds : 1e-9));
    else if (v->ran)
        printf("  verify   FAILED after %llu good frames: %s\n", (unsigned long long)v->frames, error);
}

static json_t *dataset_json(const bb_dataset_t *ds, const verify_result *v, const char *error)
{
    const bb_shard_meta *m = bb_dataset_meta(ds);
    uint32_t frames;
    uint64_t file = dataset_file_bytes(ds, &frames), raw = bb_dataset_record_count(ds) * m->record_size;
    json_t *shape = json_array(), *shards = json_array();
    for (uint32_t i = 0; i < m->rank; i++) json_array_append_new(shape, json_integer(m->shape[i]));
    for (uint32_t s = 0; s < bb_dataset_shard_count(ds); s++) {
        const bb_shard_t *sh = bb_dataset_shard(ds, s);
        const bb_shard_meta *sm = bb_shard_get_meta(sh);
        json_array_append_new(shards, json_pack("{s:s, s:i, s:I, s:I, s:i, s:I, s:I}", "path", bb_shard_path(sh),
                                                "shard_index", (int)sm->shard_index, "first_record",
                                                (json_int_t)sm->first_record, "records", (json_int_t)sm->record_count,
                                                "frames", (int)bb_shard_frame_count(sh), "raw_bytes",
                                                (json_int_t)bb_shard_raw_bytes(sh), "file_bytes",
                                                (json_int_t)bb_shard_file_size(sh)));
    }
    json_t *o = json_pack("{s:s, s:s, s:o, s:i, s:I, s:i, s:s, s:i, s:i, s:I, s:I, s:o, s:o, s:b}", "path",
                          bb_dataset_path(ds), "kind", bb_record_kind_name(m->kind), "shape", shape, "record_size",
                          (int)m->record_size, "records", (json_int_t)bb_dataset_record_count(ds),
                          m->kind == BB_RECORD_IMAGE_U8 ? "classes" : "vocab_size", (int)m->classes_or_vocab, "source",
                          m->source, "records_per_frame", (int)m->records_per_frame, "frames", (int)frames, "raw_bytes",
                          (json_int_t)raw, "file_bytes", (json_int_t)file, "ratio",
                          bb_json_fixed((double)raw / (double)file, 4), "shards", shards, "verified", v->ran && v->ok);
    char id[24];
    snprintf(id, sizeof id, "%016llx", (unsigned long long)m->dataset_id);
    if (o) json_object_set_new(o, "identity", m->dataset_id ? json_string(id) : json_null());
    bb_tokenizer_t *t = NULL;
    if (o && bb_tokenizer_of_dataset(bb_dataset_path(ds), &t) == BB_OK && t) {
        snprintf(id, sizeof id, "%016llx", (unsigned long long)bb_tokenizer_hash(t));
        json_object_set_new(o, "tokenizer", json_pack("{s:s, s:i, s:s}", "path", bb_tokenizer_path(t), "vocab",
                                                      (int)bb_tokenizer_vocab(t), "xxh64", id));
    } else if (o) {
        json_object_set_new(o, "tokenizer", json_null());
    }
    bb_tokenizer_destroy(t);
    if (o && v->ran) {
        json_t *ver = json_pack("{s:b, s:I, s:I, s:o}", "ok", v->ok, "frames", (json_int_t)v->frames, "bytes",
                                (json_int_t)v->bytes, "seconds", bb_json_fixed(v->seconds, 6));
        if (ver && !v->ok) json_object_set_new(ver, "error", json_string(error));
        json_object_set_new(o, "verify", ver);
    }
    return o;
}

static bool has_shards(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return false;
    bool found = false;
    for (struct dirent *e; !found && (e = readdir(d));) found = bb_shard_is_file_name(e->d_name);
    closedir(d);
    return found;
}

static int is_visible_dir_entry(const struct dirent *e) { return e->d_name[0] != '.'; }

/* Inspects one dataset and prints it, also when verification fails; only a
 * dataset that cannot be opened prints nothing. With `splits` (JSON of a
 * directory of splits) it goes there under `key` instead. */
static bb_status inspect_one(const char *path, bool verify, bool json, json_t *splits, const char *key, int *printed)
{
    bb_dataset_t *ds;
    BB_TRY(bb_dataset_open(path, &ds));
    if (!json && (*printed)++) printf("\n");
    verify_result v = {0};
    bb_status rc = verify ? verify_dataset(ds, &v) : BB_OK;
    char error[1024] = "";
    if (rc != BB_OK) snprintf(error, sizeof error, "%s", bb_error_message());
    if (json) {
        json_t *o = dataset_json(ds, &v, error);
        ++*printed;
        if (splits) json_object_set_new(splits, key, o);
        else if ((!o || bb_json_write_line(stdout, o) != BB_OK) && rc == BB_OK)
            rc = bb_fail(BB_ERR_IO, "stdout: write failed");
        if (!splits) json_decref(o);
    } else {
        print_text(ds, &v, error);
    }
    bb_dataset_close(ds);
    return rc;
}

static bb_status inspect_path(const char *path, bool verify, bool json)
{
    struct stat st;
    if (stat(path, &st) != 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot open", path);
    int found = 0;
    if (!S_ISDIR(st.st_mode) || has_shards(path)) return inspect_one(path, verify, json, NULL, NULL, &found);
    /* A directory of splits: each subdirectory holding shards is a dataset. */
    struct dirent **names;
    int n = scandir(path, &names, is_visible_dir_entry, alphasort);
    if (n < 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot list directory", path);
    bb_status rc = BB_OK;
    json_t *splits = json ? json_object() : NULL;
    for (int i = 0; i < n && rc == BB_OK; i++) {
        char sub[4096];
        snprintf(sub, sizeof sub, "%s%s%s", path, path[strlen(path) - 1] == '/' ? "" : "/", names[i]->d_name);
        if (stat(sub, &st) != 0 || !S_ISDIR(st.st_mode) || !has_shards(sub)) continue;
        rc = inspect_one(sub, verify, json, splits, names[i]->d_name, &found);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    if (json) {
        json_t *root = json_pack("{s:s, s:o}", "path", path, "splits", splits);
        bb_status wrote = root ? bb_json_write_line(stdout, root) : bb_fail(BB_ERR_NOMEM, "out of memory");
        if (rc == BB_OK) rc = wrote;
        json_decref(root);
    }
    if (rc == BB_OK && !found) return bb_fail(BB_ERR_FORMAT, "%s: no *%s shards here or in its subdirectories", path, BB_SHARD_EXT);
    return rc;
}

int bb_cmd_inspect(int argc, char **argv)
{
    bool verify = false, json = false;
    bb_str_list paths = {0};
    data_flags df = DATA_FLAGS_DEFAULT;
    const bb_opt opts[] = {
        {"--verify", BB_OPT_FLAG, &verify, NULL, "decode every frame and check its checksum"},
        {"--json", BB_OPT_FLAG, &json, NULL, "print one JSON object (per PATH) instead of text"},
        DATA_FLAGS_OPTS(df),
        {0}};
    bb_status rc = bb_cli_parse("inspect", opts, argc, argv, &paths);
    if (rc == BB_OK && paths.count == 0) rc = bb_fail(BB_ERR_ARG, "inspect needs a PATH; see 'bigbatch inspect --help'");
    for (int i = 0; rc == BB_OK && i < paths.count; i++) {
        if (i && !json) printf("\n");
        const char *path = paths.items[i];
        df.used = 0; /* one path at a time */
        rc = data_flags_resolve(&df, &path, false);
        if (rc == BB_OK) rc = inspect_path(path, verify, json);
    }
    int code = bb_cli_report(rc, usage, summary, opts);
    bb_cli_free(opts, &paths);
    return code;
}
