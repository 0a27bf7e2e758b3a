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

bb_status bb_st_write(const char *path, const bb_st_tensor *ts, int n)
{
    XXH64_state_t st; /* of the tensor bytes as written, in order */
    XXH64_reset(&st, 0);
    for (int i = 0; i < n; i++) XXH64_update(&st, ts[i].data, ts[i].count * sizeof(float));
    char producer[64], xxh64[24];
    snprintf(producer, sizeof producer, "bigbatch %s", BB_VERSION);
    snprintf(xxh64, sizeof xxh64, "%016llx", (unsigned long long)XXH64_digest(&st));
    json_t *header =
        json_pack("{s:{s:s, s:s, s:s}}", "__metadata__", "format", "pt", "producer", producer, "xxh64", xxh64);
    size_t offset = 0;
    for (int i = 0; header && i < n; i++) {
        const bb_st_tensor *t = &ts[i];
        size_t bytes = t->count * sizeof(float);
        json_t *shape = t->rank == 2 ? json_pack("[i, i]", t->shape[0], t->shape[1]) : json_pack("[i]", t->shape[0]);
        json_t *entry = json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape, "data_offsets",
                                  (json_int_t)offset, (json_int_t)(offset + bytes));
        if (json_object_set_new(header, t->name, entry)) json_decref(header), header = NULL;
        offset += bytes;
    }
    char *json = header ? json_dumps(header, JSON_COMPACT) : NULL;
    json_decref(header);
    size_t len = json ? strlen(json) : 0;
    char *padded = json ? realloc(json, len + 8) : NULL;
    if (!padded) {
        free(json);
        return bb_fail(BB_ERR_NOMEM, "out of memory for %s", path);
    }
    json = padded;
    while (len % 8) json[len++] = ' '; /* align the data to 8 bytes */
    /* Written beside the target, then renamed: no half-written weights. */
    char *tmp = malloc(strlen(path) + 16);
    if (tmp) sprintf(tmp, "%s.tmp-%d", path, (int)getpid());
    bb_status rc = bb_make_parents(path, NULL); /* missing directories are made, as for every output */
    FILE *f = rc == BB_OK && tmp ? fopen(tmp, "wb") : NULL;
    if (rc == BB_OK && !f) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot create", path);
    int tracked = f ? bb_temp_track(tmp) : -1; /* a second signal removes it */
    if (f) {
        uint8_t head[8];
        for (int i = 0; i < 8; i++) head[i] = (uint8_t)((uint64_t)len >> (8 * i));
        bool ok = write_all(f, head, 8) && write_all(f, json, len);
        for (int i = 0; ok && i < n; i++) ok = write_all(f, ts[i].data, ts[i].count * sizeof(float));
        ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0; /* on disk before the rename makes it visible */
        if (fclose(f) != 0) ok = false;
        if (!ok) rc = bb_fail_errno(BB_ERR_IO, "%s: write failed", path);
        if (ok && rename(tmp, path) != 0) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot rename into place", path);
        if (ok && rc == BB_OK) rc = bb_fsync_dir_of(path);
        if (rc != BB_OK) unlink(tmp);
    }
    bb_temp_untrack(tracked);
    free(tmp);
    free(json);
    return rc;
}

bb_status bb_model_save_safetensors(bb_model_t *m, const char *path)
{
    const char *head = bb_model_tied_head(&m->cfg); /* gpt: lm_head.weight, tied to tensor 0 (wte): written twice */
    float *host = malloc(m->param_count * sizeof *host);
    bb_st_tensor *ts = calloc((size_t)m->tensor_count + 1, sizeof *ts);
    if (!host || !ts) {
        free(host), free(ts);
        return bb_fail(BB_ERR_NOMEM, "out of memory for %s", path);
    }
    bb_status rc = bb_model_weights_out(m, host, 0, m->param_count);
    int n = 0;
    for (int i = 0; i <= m->tensor_count; i++) {
        if (i == m->tensor_count && !head) break;
        const bb_tensor_info *t = &m->tensors[i < m->tensor_count ? i : 0];
        ts[n++] = (bb_st_tensor){i < m->tensor_count ? t->name : head, t->rank, {t->shape[0], t->shape[1]},
                                 host + t->offset, t->count};
    }
    if (rc == BB_OK) rc = bb_st_write(path, ts, n);
    free(ts);
    free(host);
    return rc;
}

/* ---- reading ----------------------------------------------------------- */
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
static bool read_entry(const char *name, const json_t *v, bb_st_entry *e)
{
    *e = (bb_st_entry){0};
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

static bb_status parse_header(const char *path, const uint8_t *file, size_t size, bb_st_entry **out, int *count,
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
    bb_st_entry *e = calloc(json_object_size(h) + 1, sizeof *e);
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

const char *bb_st_shape_text(const uint64_t *shape, int rank, char *buf, size_t cap)
{
    size_t at = 0;
    at += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < rank && i < 4 && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%llu", i ? ", " : "", (unsigned long long)shape[i]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
    return buf;
}

static bb_status check_tensor(const char *path, const bb_st_entry *e, const bb_tensor_info *t, size_t data_size)
{
    if (strcmp(e->dtype, "F32"))
        return bb_fail(BB_ERR_FORMAT, "%s: tensor %s is %s, bigbatch reads F32", path, t->name, e->dtype);
    bool same = e->rank == t->rank && e->shape[0] == (uint64_t)t->shape[0] &&
                (t->rank == 1 || e->shape[1] == (uint64_t)t->shape[1]);
    if (!same) {
        char has[96], wants[96];
        const uint64_t want[2] = {(uint64_t)t->shape[0], (uint64_t)t->shape[1]};
        return bb_fail(BB_ERR_FORMAT, "%s: tensor %s has shape %s, the model wants %s", path, t->name,
                       bb_st_shape_text(e->shape, e->rank, has, sizeof has),
                       bb_st_shape_text(want, t->rank, wants, sizeof wants));
    }
    if (e->end < e->begin || e->end > data_size || e->end - e->begin != t->count * sizeof(float))
        return bb_fail(BB_ERR_CORRUPT, "%s: tensor %s: data offsets [%llu, %llu] do not hold %zu floats", path,
                       t->name, (unsigned long long)e->begin, (unsigned long long)e->end, t->count);
    return BB_OK;
}

bb_status bb_st_map(const char *path, bb_st_file *f)
{
    memset(f, 0, sizeof *f);
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
    f->size = (size_t)st.st_size;
    f->map = f->size ? mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (f->size && f->map == MAP_FAILED) {
        f->map = NULL, f->size = 0;
        return bb_fail_errno(BB_ERR_IO, "%s: cannot map", path);
    }
    char xxh64[32] = "";
    size_t start = 0;
    bb_status rc = parse_header(path, f->map, f->size, &f->entries, &f->count, &start, xxh64, sizeof xxh64);
    f->data = f->map + start, f->data_size = f->size - start;
    if (rc == BB_OK && xxh64[0]) { /* bigbatch's own file: the bytes must be what was written */
        char actual[17];
        snprintf(actual, sizeof actual, "%016llx", (unsigned long long)XXH64(f->data, f->data_size, 0));
        if (strcmp(actual, xxh64))
            rc = bb_fail(BB_ERR_CORRUPT, "%s: the weights do not match their checksum (xxh64 %s, the file's data has "
                         "%s): the file is damaged", path, xxh64, actual);
    }
    for (int a = 0; rc == BB_OK && a < f->count; a++) { /* a tensor's bytes are its own, inside the file */
        const bb_st_entry *x = &f->entries[a];
        if (x->end < x->begin || x->end > f->data_size)
            rc = bb_fail(BB_ERR_CORRUPT, "%s: tensor %s: data offsets [%llu, %llu] run past the file's %zu bytes of "
                         "data", path, x->name, (unsigned long long)x->begin, (unsigned long long)x->end, f->data_size);
        for (int b = a + 1; rc == BB_OK && b < f->count; b++) {
            const bb_st_entry *y = &f->entries[b];
            if (x->begin < y->end && y->begin < x->end && x->begin < x->end && y->begin < y->end)
                rc = bb_fail(BB_ERR_CORRUPT, "%s: tensors %s [%llu, %llu) and %s [%llu, %llu) overlap in the data",
                             path, x->name, (unsigned long long)x->begin, (unsigned long long)x->end, y->name,
                             (unsigned long long)y->begin, (unsigned long long)y->end);
        }
    }
    if (rc != BB_OK) bb_st_unmap(f);
    return rc;
}

void bb_st_unmap(bb_st_file *f)
{
    free(f->entries);
    if (f->size) munmap((void *)f->map, f->size);
    memset(f, 0, sizeof *f);
}

const bb_st_entry *bb_st_find(const bb_st_file *f, const char *name)
{
    for (int k = 0; k < f->count; k++)
        if (!strcmp(f->entries[k].name, name)) return &f->entries[k];
    return NULL;
}

bb_status bb_model_load_safetensors(bb_model_t *m, const char *path)
{
    bb_st_file f;
    BB_TRY(bb_st_map(path, &f));
    bb_status rc = BB_OK;
    /* Every tensor is checked before any is copied: a bad file leaves the
     * model as it was. A tensor the model does not have means another
     * shape (e.g. more layers): refused, naming the first. */
    const char *head = bb_model_tied_head(&m->cfg);
    for (int k = 0; rc == BB_OK && k < f.count; k++) {
        bool known = head && !strcmp(f.entries[k].name, head);
        for (int i = 0; !known && i < m->tensor_count; i++) known = !strcmp(f.entries[k].name, m->tensors[i].name);
        if (!known) {
            char model[160];
            bb_model_describe(&m->cfg, model, sizeof model);
            rc = bb_fail(BB_ERR_FORMAT, "%s: tensor %s is not in the model (%s): is the file for another shape?",
                         path, f.entries[k].name, model);
        }
    }
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; rc == BB_OK && i < m->tensor_count; i++) {
            const bb_tensor_info *t = &m->tensors[i];
            const bb_st_entry *e = bb_st_find(&f, t->name);
            /* A GPT trained elsewhere may carry the tied weight only as lm_head. */
            if (!e && i == 0 && head) e = bb_st_find(&f, head);
            if (!e)
                rc = bb_fail(BB_ERR_FORMAT, "%s: no tensor %s (the file has %d tensors; is it for this model shape?)",
                             path, t->name, f.count);
            else
                rc = pass == 0 ? check_tensor(path, e, t, f.data_size)
                               : bb_model_weights_in(m, t->offset, f.data + e->begin, t->count);
        }
    bb_st_unmap(&f);
    return rc;
}
