/* data_index.c — index.json: what a directory of a dataset holds, for
 * readers that cannot list it (an object store, a web server). See remote.h. */
#include "data_index.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH64_state_t on the stack */
#include <xxhash.h>

#include "bigbatch/json.h"
#include "bigbatch/shard.h"

bb_status bb_index_hash_file(const char *path, uint64_t *bytes, uint64_t *hash)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot open", path);
    enum { CHUNK = 1 << 20 };
    uint8_t *buf = malloc(CHUNK);
    if (!buf) {
        close(fd);
        return bb_fail(BB_ERR_NOMEM, "%s: out of memory", path);
    }
    XXH64_state_t st;
    XXH64_reset(&st, 0);
    uint64_t total = 0;
    bb_status rc = BB_OK;
    for (;;) {
        ssize_t n = read(fd, buf, CHUNK);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            rc = bb_fail_errno(BB_ERR_IO, "%s: cannot read", path);
            break;
        }
        if (n == 0) break;
        XXH64_update(&st, buf, (size_t)n);
        total += (uint64_t)n;
    }
    free(buf);
    close(fd);
    *bytes = total;
    *hash = XXH64_digest(&st);
    return rc;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A name an index may list: no hidden file, nothing the mirror makes
 * itself (index.json, index.json.new, *.part), no path, room for ".part". */
static bool index_entry_name(const char *name)
{
    size_t n = strlen(name);
    return n && n <= 200 && name[0] != '.' && strncmp(name, BB_INDEX_FILE, strlen(BB_INDEX_FILE)) &&
           !strchr(name, '/') && !(n > 5 && !strcmp(name + n - 5, ".part"));
}

/* The names in dir passing `want` (regular files, or directories), sorted. */
static bb_status list_names(const char *dir, bool dirs, char ***out, size_t *count)
{
    *out = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return bb_fail_errno(BB_ERR_IO, "%s: cannot list directory", dir);
    char **names = NULL;
    size_t n = 0, cap = 0;
    bb_status rc = BB_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!index_entry_name(e->d_name)) continue;
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &st) != 0 || (dirs ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **grown = realloc(names, cap * sizeof *names);
            if (!grown) {
                rc = bb_fail(BB_ERR_NOMEM, "%s: out of memory", dir);
                break;
            }
            names = grown;
        }
        if (!(names[n] = strdup(e->d_name))) {
            rc = bb_fail(BB_ERR_NOMEM, "%s: out of memory", dir);
            break;
        }
        n++;
    }
    closedir(d);
    if (rc == BB_OK && n) qsort(names, n, sizeof *names, by_name);
    *out = names;
    *count = n;
    return rc;
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
}

bb_status bb_index_write(const char *dir, bool recursive)
{
    char **files = NULL, **dirs = NULL;
    size_t nfiles = 0, ndirs = 0;
    json_t *root = json_object(), *jdirs = json_array(), *jfiles = json_array();
    bb_status rc = root && jdirs && jfiles ? BB_OK : bb_fail(BB_ERR_NOMEM, "%s: out of memory", dir);
    if (rc == BB_OK) rc = list_names(dir, false, &files, &nfiles);
    if (rc == BB_OK && recursive) rc = list_names(dir, true, &dirs, &ndirs);
    bool shards = false;
    for (size_t i = 0; rc == BB_OK && i < ndirs; i++) {
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", dir, dirs[i]);
        rc = bb_index_write(sub, false);
        if (rc == BB_ERR_FORMAT) { /* not a dataset: not listed */
            bb_error_clear();
            rc = BB_OK;
            continue;
        }
        if (rc == BB_OK) json_array_append_new(jdirs, json_string(dirs[i]));
    }
    for (size_t i = 0; rc == BB_OK && i < nfiles; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        uint64_t bytes, hash;
        rc = bb_index_hash_file(path, &bytes, &hash);
        if (rc != BB_OK) break;
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
        json_array_append_new(jfiles, json_pack("{s:s, s:I, s:s}", "name", files[i], "bytes", (json_int_t)bytes,
                                                "xxh64", hex));
        shards |= bb_shard_is_file_name(files[i]);
    }
    if (rc == BB_OK && !shards && json_array_size(jdirs) == 0)
        rc = bb_fail(BB_ERR_FORMAT, "%s: no *%s shards and no dataset directories in it: nothing to index", dir,
                     BB_SHARD_EXT);
    if (rc == BB_OK) {
        json_object_set_new(root, "format", json_string("bigbatch-index"));
        json_object_set_new(root, "version", json_integer(1));
        json_object_set(root, "dirs", jdirs);
        json_object_set(root, "files", jfiles);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, BB_INDEX_FILE);
        rc = bb_json_write_file(root, path);
    }
    json_decref(jdirs);
    json_decref(jfiles);
    json_decref(root);
    free_names(files, nfiles);
    free_names(dirs, ndirs);
    return rc;
}

bb_status bb_index_load(const char *path, const char *what, bb_index *out)
{
    *out = (bb_index){0};
    json_t *root;
    BB_TRY(bb_json_load_file(path, true, &root));
    bb_status rc = BB_OK;
    const json_t *format = json_object_get(root, "format"), *dirs = json_object_get(root, "dirs"),
                 *files = json_object_get(root, "files");
    int version = 0;
    if (!json_is_string(format) || strcmp(json_string_value(format), "bigbatch-index") || !json_is_array(dirs) ||
        !json_is_array(files) || bb_json_req_int(root, what, "version", &version) != BB_OK || version != 1) {
        bb_error_clear();
        json_decref(root);
        return bb_fail(BB_ERR_FORMAT, "%s: not a bigbatch index (version 1: format, dirs, files)", what);
    }
    out->dir_count = json_array_size(dirs);
    out->file_count = json_array_size(files);
    out->dirs = calloc(out->dir_count + 1, sizeof *out->dirs);
    out->files = calloc(out->file_count + 1, sizeof *out->files);
    if (!out->dirs || !out->files) rc = bb_fail(BB_ERR_NOMEM, "%s: out of memory", what);
    for (size_t i = 0; rc == BB_OK && i < out->dir_count; i++) {
        const char *name = json_string_value(json_array_get(dirs, i));
        if (!name || !index_entry_name(name))
            rc = bb_fail(BB_ERR_FORMAT, "%s: dirs[%zu] is not a plain directory name", what, i);
        else if (!(out->dirs[i] = strdup(name)))
            rc = bb_fail(BB_ERR_NOMEM, "%s: out of memory", what);
        for (size_t k = 0; rc == BB_OK && k < i; k++)
            if (!strcmp(out->dirs[k], name)) rc = bb_fail(BB_ERR_FORMAT, "%s: dirs lists %s twice", what, name);
    }
    for (size_t i = 0; rc == BB_OK && i < out->file_count; i++) {
        const json_t *f = json_array_get(files, i);
        char name[256], hex[17], *end;
        uint64_t bytes = 0;
        if (bb_json_req_string(f, what, "name", name, sizeof name) != BB_OK ||
            bb_json_req_u64(f, what, "bytes", &bytes) != BB_OK ||
            bb_json_req_string(f, what, "xxh64", hex, sizeof hex) != BB_OK || !index_entry_name(name)) {
            bb_error_clear();
            rc = bb_fail(BB_ERR_FORMAT, "%s: files[%zu] needs a plain name, bytes and a 16-digit xxh64", what, i);
            break;
        }
        uint64_t hash = strtoull(hex, &end, 16);
        if (strlen(hex) != 16 || *end) {
            rc = bb_fail(BB_ERR_FORMAT, "%s: files[%zu] (%s): xxh64 \"%s\" is not 16 hex digits", what, i, name, hex);
            break;
        }
        if (i && strcmp(out->files[i - 1].name, name) >= 0) { /* sorted (FORMAT.md): no name twice, found by halves */
            rc = bb_fail(BB_ERR_FORMAT, "%s: files[%zu] (%s) does not sort after %s: names sorted, each once", what, i,
                         name, out->files[i - 1].name);
            break;
        }
        out->files[i] = (bb_index_file){.name = strdup(name), .bytes = bytes, .xxh64 = hash};
        if (!out->files[i].name) rc = bb_fail(BB_ERR_NOMEM, "%s: out of memory", what);
    }
    json_decref(root);
    if (rc != BB_OK) bb_index_free(out);
    return rc;
}

void bb_index_free(bb_index *index)
{
    for (size_t i = 0; index->dirs && i < index->dir_count; i++) free(index->dirs[i]);
    for (size_t i = 0; index->files && i < index->file_count; i++) free(index->files[i].name);
    free(index->dirs);
    free(index->files);
    *index = (bb_index){0};
}

static int by_file_name(const void *key, const void *entry)
{
    return strcmp(key, ((const bb_index_file *)entry)->name);
}

const bb_index_file *bb_index_find(const bb_index *index, const char *name)
{
    return index->file_count ? bsearch(name, index->files, index->file_count, sizeof *index->files, by_file_name)
                             : NULL;
}
