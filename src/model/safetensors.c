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
    size_t cap = 256, len = 0, offset = 0;
    for (int i = 0; i < m->tensor_count; i++) cap += strlen(m->tensors[i].name) + 112; /* 112: keys, shape, offsets */
    cap += 128;                                                                        /* the tied head */
    char *json = malloc(cap);
    float *host = malloc(m->param_count * sizeof *host);
    if (!json || !host) {
        free(json), free(host);
        return bb_fail(BB_ERR_NOMEM, "out of memory for %s", path);
    }
    bb_status rc = bb_backend_copy(m->be, host, m->params, m->param_count * sizeof *host, BB_COPY_D2H);
    const float *tied_data = tied ? host + m->tensors[0].offset : NULL;
    size_t tied_count = tied ? m->tensors[0].count : 0;
    uint64_t sum = rc == BB_OK ? data_checksum(host, m->param_count, tied_data, tied_count) : 0;
    len += (size_t)snprintf(json + len, cap - len,
                            "{\"__metadata__\":{\"format\":\"pt\",\"producer\":\"bigbatch %s\",\"xxh64\":\"%016llx\"}",
                            BB_VERSION, (unsigned long long)sum);
    for (int i = 0; i <= m->tensor_count; i++) {
        const bb_tensor_info *t = &m->tensors[i < m->tensor_count ? i : 0];
        if (i == m->tensor_count && !tied) break;
        const char *name = i < m->tensor_count ? t->name : head; /* tied to tensor 0: written twice */
        size_t bytes = t->count * sizeof(float);
        len += (size_t)snprintf(json + len, cap - len, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%d", name, t->shape[0]);
        if (t->rank == 2) len += (size_t)snprintf(json + len, cap - len, ",%d", t->shape[1]);
        len += (size_t)snprintf(json + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", offset, offset + bytes);
        offset += bytes;
    }
    len += (size_t)snprintf(json + len, cap - len, "}");
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

/* ---- a small JSON reader for the header -------------------------------- */
typedef struct json {
    const char *p, *end;
} json;

static void skip_space(json *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\t' || *j->p == '\r')) j->p++;
}

static bool expect(json *j, char c)
{
    skip_space(j);
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return true;
    }
    return false;
}

/* Reads a string into out (truncated to cap-1); escapes are kept as is. */
static bool read_string(json *j, char *out, size_t cap)
{
    if (!expect(j, '"')) return false;
    size_t n = 0;
    while (j->p < j->end && *j->p != '"') {
        if (*j->p == '\\' && j->p + 1 < j->end) j->p++;
        if (n + 1 < cap) out[n++] = *j->p;
        j->p++;
    }
    out[n] = 0;
    return expect(j, '"');
}

static bool read_number(json *j, uint64_t *out)
{
    skip_space(j);
    if (j->p >= j->end || *j->p < '0' || *j->p > '9') return false;
    uint64_t v = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        if (v > (UINT64_MAX - 9) / 10) return false; /* would overflow */
        v = v * 10 + (uint64_t)(*j->p++ - '0');
    }
    *out = v;
    return true;
}

static bool skip_value_at(json *j, int depth);

/* Skips one value; nesting deeper than 64 is rejected, not recursed into. */
static bool skip_value(json *j) { return skip_value_at(j, 0); }

static bool skip_value_at(json *j, int depth)
{
    skip_space(j);
    if (depth > 64) return false;
    if (j->p >= j->end) return false;
    char c = *j->p;
    if (c == '"') {
        char tmp[8];
        return read_string(j, tmp, sizeof tmp);
    }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        if (expect(j, close)) return true;
        do {
            if (c == '{') {
                char key[8];
                if (!read_string(j, key, sizeof key) || !expect(j, ':')) return false;
            }
            if (!skip_value_at(j, depth + 1)) return false;
        } while (expect(j, ','));
        return expect(j, close);
    }
    while (j->p < j->end && *j->p != ',' && *j->p != '}' && *j->p != ']') j->p++; /* number, true, null */
    return true;
}

typedef struct entry {
    char name[128], dtype[16];
    uint64_t shape[4], begin, end;
    int rank;
} entry;

static bool read_uint_array(json *j, uint64_t *out, int cap, int *count)
{
    *count = 0;
    if (!expect(j, '[')) return false;
    if (expect(j, ']')) return true;
    do {
        uint64_t v;
        if (!read_number(j, &v)) return false;
        if (*count < cap) out[*count] = v;
        (*count)++;
    } while (expect(j, ','));
    return expect(j, ']');
}

static bool read_entry(json *j, entry *e)
{
    if (!expect(j, '{')) return false;
    int offsets = 0;
    uint64_t pair[2] = {0, 0};
    do {
        char key[32];
        if (!read_string(j, key, sizeof key) || !expect(j, ':')) return false;
        if (!strcmp(key, "dtype")) {
            if (!read_string(j, e->dtype, sizeof e->dtype)) return false;
        } else if (!strcmp(key, "shape")) {
            if (!read_uint_array(j, e->shape, 4, &e->rank) || e->rank > 4) return false;
        } else if (!strcmp(key, "data_offsets")) {
            if (!read_uint_array(j, pair, 2, &offsets) || offsets != 2) return false;
        } else if (!skip_value(j)) {
            return false;
        }
    } while (expect(j, ','));
    e->begin = pair[0], e->end = pair[1];
    return expect(j, '}');
}

/* __metadata__: an object of strings; keeps "xxh64" (empty when absent). */
static bool read_metadata(json *j, char *xxh64, size_t cap)
{
    if (!expect(j, '{')) return false;
    if (expect(j, '}')) return true;
    do {
        char key[16];
        if (!read_string(j, key, sizeof key) || !expect(j, ':')) return false;
        if (!strcmp(key, "xxh64")) {
            if (!read_string(j, xxh64, cap)) return false;
        } else if (!skip_value(j)) {
            return false;
        }
    } while (expect(j, ','));
    return expect(j, '}');
}

/* ---- reading ----------------------------------------------------------- */
static bb_status parse_header(const char *path, const uint8_t *file, size_t size, entry **out, int *count,
                              size_t *data_start, char *xxh64, size_t xxh64_cap)
{
    if (size < 8) return bb_fail(BB_ERR_CORRUPT, "%s: too short for a safetensors file", path);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)file[i] << (8 * i);
    if (n > size - 8) return bb_fail(BB_ERR_CORRUPT, "%s: header of %llu bytes runs past the end", path,
                                     (unsigned long long)n);
    json j = {(const char *)file + 8, (const char *)file + 8 + n};
    *data_start = 8 + n;
    int cap = 64;
    entry *e = malloc((size_t)cap * sizeof *e);
    *count = 0;
    bool ok = e && expect(&j, '{');
    bool empty = ok && expect(&j, '}');
    if (ok && !empty) do {
            if (*count == cap) {
                entry *bigger = realloc(e, (size_t)(cap *= 2) * sizeof *e);
                if (!bigger) { ok = false; break; }
                e = bigger;
            }
            entry *x = &e[*count];
            *x = (entry){0};
            if (!read_string(&j, x->name, sizeof x->name) || !expect(&j, ':')) { ok = false; break; }
            if (!strcmp(x->name, "__metadata__")) {
                ok = read_metadata(&j, xxh64, xxh64_cap);
            } else {
                ok = read_entry(&j, x);
                (*count)++;
            }
        } while (ok && expect(&j, ','));
    ok = ok && (empty || expect(&j, '}'));
    skip_space(&j);
    ok = ok && j.p == j.end;
    for (int a = 0; ok && a < *count; a++)
        for (int b = a + 1; ok && b < *count; b++) ok = strcmp(e[a].name, e[b].name) != 0;
    if (!ok) {
        free(e);
        return bb_fail(BB_ERR_CORRUPT, "%s: malformed safetensors header near byte %td", path,
                       j.p - (const char *)file);
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
        return bb_fail(BB_ERR_ARG, "%s is a directory, not a .safetensors file (a checkpoint directory is read with "
                       "--ckpt or --resume)", path);
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
