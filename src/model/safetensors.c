/* safetensors.c — model weights in the safetensors format: an 8-byte
 * little-endian header length, a JSON header {"name": {"dtype": "F32",
 * "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}},
 * then the raw little-endian tensor bytes. Only what bigbatch writes is
 * needed to read: F32 tensors under the model's names. bigbatch's files
 * carry "xxh64" in __metadata__, the XXH64 of the tensor bytes, checked on
 * load; files from elsewhere without it load unchecked. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH64_state_t on the stack */
#include <xxhash.h>

#include "model_internal.h"

/* ---- writing ----------------------------------------------------------- */
static bool write_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n; }

/* XXH64 of the tensor bytes as written: the parameters, then (gpt) the
 * tied embedding again as lm_head.weight. */
static uint64_t data_checksum(const float *host, size_t count, const float *tied, size_t tied_count)
{
    XXH64_state_t st;
    XXH64_reset(&st, 0);
    XXH64_update(&st, host, count * sizeof *host);
    if (tied) XXH64_update(&st, tied, tied_count * sizeof *tied);
    return XXH64_digest(&st);
}

bb_status bb_model_save_safetensors(bb_model_t *m, const char *path)
{
    const char *head = m->cfg.kind->tied_head; /* gpt: lm_head.weight, tied to tensor 0 (wte) */
    bool tied = head != NULL;
    float *host = malloc(m->param_count * sizeof *host);
    if (!host) return bb_fail(BB_ERR_NOMEM, "out of memory for %s", path);
    bb_status rc = bb_backend_copy(m->be, host, m->params, m->param_count * sizeof *host, BB_COPY_D2H);
    const float *tied_data = tied ? host + m->tensors[0].offset : NULL;
    size_t tied_count = tied ? m->tensors[0].count : 0;
    uint64_t sum = rc == BB_OK ? data_checksum(host, m->param_count, tied_data, tied_count) : 0;
    char producer[64], xxh64[24];
    snprintf(producer, sizeof producer, "bigbatch %s", BB_VERSION);
    snprintf(xxh64, sizeof xxh64, "%016llx", (unsigned long long)sum);
    json_t *header =
        json_pack("{s:{s:s, s:s, s:s}}", "__metadata__", "format", "pt", "producer", producer, "xxh64", xxh64);
    size_t offset = 0;
    for (int i = 0; header && i <= m->tensor_count; i++) {
        const bb_tensor_info *t = &m->tensors[i < m->tensor_count ? i : 0];
        if (i == m->tensor_count && !tied) break;
        const char *name = i < m->tensor_count ? t->name : head; /* tied to tensor 0: written twice */
        size_t bytes = t->count * sizeof(float);
        json_t *shape = t->rank == 2 ? json_pack("[i, i]", t->shape[0], t->shape[1]) : json_pack("[i]", t->shape[0]);
        json_t *entry = json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape, "data_offsets",
                                  (json_int_t)offset, (json_int_t)(offset + bytes));
        if (json_object_set_new(header, name, entry)) json_decref(header), header = NULL;
        offset += bytes;
    }
    char *json = header ? json_dumps(header, JSON_COMPACT) : NULL;
    json_decref(header);
    size_t len = json ? strlen(json) : 0;
    char *padded = json ? realloc(json, len + 8) : NULL;
    if (!padded) {
        free(json), free(host);
        return bb_fail(BB_ERR_NOMEM, "out of memory for %s", path);
    }
    json = padded;
    while (len % 8) json[len++] = ' '; /* align the data to 8 bytes */
    /* Written beside the target, then renamed: no half-written weights. */
    char *tmp = malloc(strlen(path) + 16);
    if (tmp) sprintf(tmp, "%s.tmp-%d", path, (int)getpid());
    FILE *f = rc == BB_OK && tmp ? fopen(tmp, "wb") : NULL;
    if (rc == BB_OK && !f) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot create", tmp ? tmp : path);
    if (f) {
        uint8_t header[8];
        for (int i = 0; i < 8; i++) header[i] = (uint8_t)((uint64_t)len >> (8 * i));
        bool ok = write_all(f, header, 8) && write_all(f, json, len) &&
                  write_all(f, host, m->param_count * sizeof *host) &&
                  (!tied || write_all(f, tied_data, tied_count * sizeof *host));
        ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0; /* on disk before the rename makes it visible */
        if (fclose(f) != 0) ok = false;
        if (!ok) rc = bb_fail_errno(BB_ERR_IO, "%s: write failed", path);
        if (ok && rename(tmp, path) != 0) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot rename into place", path);
        if (ok && rc == BB_OK) rc = bb_fsync_dir_of(path);
        if (rc != BB_OK) unlink(tmp);
    }
    free(tmp);
    free(json);
    free(host);
    return rc;
}

/* ---- reading ----------------------------------------------------------- */
typedef struct entry {
    char name[128], dtype[16];
    uint64_t shape[4], begin, end;
    int rank;
} entry;

/* A non-negative integer array of at most `cap` into out; false otherwise. */
static bool read_uints(const json_t *a, uint64_t *out, int cap, int *count)
{
    *count = (int)json_array_size(a);
    if (!json_is_array(a) || *count > cap) return false;
    for (int i = 0; i < *count; i++) {
        json_t *v = json_array_get(a, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
        out[i] = (uint64_t)json_integer_value(v);
    }
    return true;
}

/* One tensor's {"dtype", "shape", "data_offsets"}; false when malformed. */
static bool read_entry(const char *name, const json_t *v, entry *e)
{
    *e = (entry){0};
    uint64_t pair[2];
    int offsets;
    const char *dtype = json_string_value(json_object_get(v, "dtype"));
    if (!dtype || strlen(name) >= sizeof e->name || strlen(dtype) >= sizeof e->dtype ||
        !read_uints(json_object_get(v, "shape"), e->shape, 4, &e->rank) ||
        !read_uints(json_object_get(v, "data_offsets"), pair, 2, &offsets) || offsets != 2)
        return false;
    snprintf(e->name, sizeof e->name, "%s", name);
    snprintf(e->dtype, sizeof e->dtype, "%s", dtype);
    e->begin = pair[0], e->end = pair[1];
    return true;
}

static bb_status parse_header(const char *path, const uint8_t *file, size_t size, entry **out, int *count,
                              size_t *data_start, char *xxh64, size_t xxh64_cap)
{
    if (size < 8) return bb_fail(BB_ERR_CORRUPT, "%s: too short for a safetensors file", path);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)file[i] << (8 * i);
    if (n > size - 8) return bb_fail(BB_ERR_CORRUPT, "%s: header of %llu bytes runs past the end", path,
                                     (unsigned long long)n);
    *data_start = 8 + n;
    json_error_t err;
    json_t *h = json_loadb((const char *)file + 8, n, JSON_REJECT_DUPLICATES, &err);
    if (!h) return bb_fail(BB_ERR_CORRUPT, "%s: malformed safetensors header near byte %d (%s)", path, 8 + err.position,
                           err.text);
    entry *e = calloc(json_object_size(h) + 1, sizeof *e);
    *count = 0;
    const char *key;
    json_t *v;
    bool ok = e != NULL;
    json_object_foreach(h, key, v) {
        if (!ok) break;
        if (!strcmp(key, "__metadata__")) { /* an object of strings; keeps "xxh64" */
            const char *sum = json_string_value(json_object_get(v, "xxh64"));
            ok = json_is_object(v);
            if (sum) snprintf(xxh64, xxh64_cap, "%s", sum);
            continue;
        }
        ok = read_entry(key, v, &e[*count]);
        if (ok) (*count)++;
    }
    json_decref(h);
    if (!ok) {
        free(e);
        return e ? bb_fail(BB_ERR_CORRUPT, "%s: malformed safetensors header (tensor %s)", path, key)
                 : bb_fail(BB_ERR_NOMEM, "%s: out of memory", path);
    }
    *out = e;
    return BB_OK;
}

static bb_status check_tensor(const char *path, const entry *e, const bb_tensor_info *t, size_t data_size)
{
    if (strcmp(e->dtype, "F32"))
        return bb_fail(BB_ERR_FORMAT, "%s: tensor %s is %s, bigbatch reads F32", path, t->name, e->dtype);
    bool same = e->rank == t->rank && e->shape[0] == (uint64_t)t->shape[0] &&
                (t->rank == 1 || e->shape[1] == (uint64_t)t->shape[1]);
    if (!same)
        return bb_fail(BB_ERR_FORMAT, "%s: tensor %s has shape [%llu%s%llu], the model wants [%d%s%d]", path, t->name,
                       (unsigned long long)e->shape[0], e->rank > 1 ? ", " : "",
                       e->rank > 1 ? (unsigned long long)e->shape[1] : 0ull, t->shape[0], t->rank > 1 ? ", " : "",
                       t->rank > 1 ? t->shape[1] : 0);
    if (e->end < e->begin || e->end > data_size || e->end - e->begin != t->count * sizeof(float))
        return bb_fail(BB_ERR_CORRUPT, "%s: tensor %s: data offsets [%llu, %llu] do not hold %zu floats", path,
                       t->name, (unsigned long long)e->begin, (unsigned long long)e->end, t->count);
    return BB_OK;
}

bb_status bb_model_load_safetensors(bb_model_t *m, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot open", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return bb_fail_errno(BB_ERR_IO, "%s: cannot stat", path);
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return bb_fail(BB_ERR_IO, "%s is a directory, not a .safetensors file (a checkpoint directory is read as "
                       "a checkpoint)", path);
    }
    size_t size = (size_t)st.st_size;
    const uint8_t *file = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (size && file == MAP_FAILED) return bb_fail_errno(BB_ERR_IO, "%s: cannot map", path);
    entry *entries = NULL;
    int count = 0;
    size_t data_start = 0;
    char xxh64[32] = "";
    bb_status rc = parse_header(path, file, size, &entries, &count, &data_start, xxh64, sizeof xxh64);
    if (rc == BB_OK && xxh64[0]) { /* bigbatch's own file: the bytes must be what was written */
        char actual[17];
        snprintf(actual, sizeof actual, "%016llx", (unsigned long long)XXH64(file + data_start, size - data_start, 0));
        if (strcmp(actual, xxh64))
            rc = bb_fail(BB_ERR_CORRUPT, "%s: the weights do not match their checksum (xxh64 %s, the file's data has "
                         "%s): the file is damaged", path, xxh64, actual);
    }
    /* Every tensor is checked before any is copied: a bad file leaves the
     * model as it was. A tensor the model does not have means another
     * shape (e.g. more layers): refused, naming the first. */
    for (int k = 0; rc == BB_OK && k < count; k++) {
        const char *head = m->cfg.kind->tied_head;
        bool known = head && !strcmp(entries[k].name, head);
        for (int i = 0; !known && i < m->tensor_count; i++) known = !strcmp(entries[k].name, m->tensors[i].name);
        if (!known) {
            char model[160];
            bb_model_describe(&m->cfg, model, sizeof model);
            rc = bb_fail(BB_ERR_FORMAT, "%s: tensor %s is not in the model (%s): is the file for another shape?",
                         path, entries[k].name, model);
        }
    }
    for (int a = 0; rc == BB_OK && a < count; a++) /* a tensor's bytes are its own */
        for (int b = a + 1; rc == BB_OK && b < count; b++)
            if (entries[a].begin < entries[b].end && entries[b].begin < entries[a].end &&
                entries[a].begin < entries[a].end && entries[b].begin < entries[b].end)
                rc = bb_fail(BB_ERR_CORRUPT, "%s: tensors %s [%llu, %llu) and %s [%llu, %llu) overlap in the data",
                             path, entries[a].name, (unsigned long long)entries[a].begin,
                             (unsigned long long)entries[a].end, entries[b].name, (unsigned long long)entries[b].begin,
                             (unsigned long long)entries[b].end);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; rc == BB_OK && i < m->tensor_count; i++) {
            const bb_tensor_info *t = &m->tensors[i];
            const entry *e = NULL;
            for (int k = 0; k < count && !e; k++)
                if (!strcmp(entries[k].name, t->name)) e = &entries[k];
            /* A GPT trained elsewhere may carry the tied weight only as lm_head. */
            if (!e && i == 0 && m->cfg.kind->tied_head)
                for (int k = 0; k < count && !e; k++)
                    if (!strcmp(entries[k].name, m->cfg.kind->tied_head)) e = &entries[k];
            if (!e)
                rc = bb_fail(BB_ERR_FORMAT, "%s: no tensor %s (the file has %d tensors; is it for this model shape?)",
                             path, t->name, count);
            else
                rc = pass == 0 ? check_tensor(path, e, t, size - data_start)
                               : bb_backend_copy(m->be, m->params + t->offset, file + data_start + e->begin,
                                                 t->count * sizeof(float), BB_COPY_H2D);
        }
    free(entries);
    if (size) munmap((void *)file, size);
    return rc;
}
