/* hf.c — Hugging Face `transformers` directories, in and out, for every
 * kind with a layout (model_internal.h's bb_hf_layout: gpt_hf.c's
 * GPT2LMHeadModel, llama_hf.c's LlamaForCausalLM): config.json, and the
 * weights in one model.safetensors or in shards listed by
 * model.safetensors.index.json (its weight_map: tensor -> file), as
 * save_pretrained writes them past its max_shard_size. Tensors are F32,
 * F16 or BF16 in, F32 out; a kind's layout names them, says which are
 * stored transposed and which file tensors are no parameters. */
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model_internal.h"

#define INDEX_FILE "model.safetensors.index.json"

/* ---- the configuration ------------------------------------------------------ */
bb_status bb_hf_config_int(const json_t *cfg, const char *path, const char *key, int dflt, int *out)
{
    const json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) {
        if (dflt < 0) return bb_fail(BB_ERR_FORMAT, "%s: %s is missing", path, key);
        *out = dflt;
        return BB_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1 << 24)
        return bb_fail(BB_ERR_FORMAT, "%s: %s is not a positive integer", path, key);
    *out = (int)json_integer_value(v);
    return BB_OK;
}

bb_status bb_hf_config_bool(const json_t *cfg, const char *path, const char *key, bool want, const char *kind)
{
    const json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v) || (json_is_boolean(v) && json_is_true(v) == want)) return BB_OK;
    return bb_fail(BB_ERR_FORMAT, "%s: %s is %s: bigbatch's %s cannot represent it (it needs %s)", path, key,
                   json_is_true(v) ? "true" : json_is_false(v) ? "false" : "not a boolean", kind,
                   want ? "true" : "false");
}

bb_status bb_model_hf_config(const char *dir, bb_model_config *c, int *positions)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *cfg;
    BB_TRY(bb_json_load_file(path, true, &cfg));
    const char *type = json_string_value(json_object_get(cfg, "model_type"));
    const bb_model_kind *k = type ? bb_model_kind_of_hf(type) : NULL;
    bb_status rc = k ? k->hf->read_config(cfg, path, c, positions)
                     : bb_fail(BB_ERR_FORMAT, "%s: model_type %s is not supported (bigbatch reads %s)", path,
                               type ? type : "(missing)", bb_model_hf_types());
    json_decref(cfg);
    if (rc == BB_OK) c->kind = k;
    return rc;
}

bb_status bb_model_load_weights(bb_model_t *m, const char *path)
{
    return bb_model_is_hf_dir(path) ? bb_model_load_hf(m, path) : bb_model_load_safetensors(m, path);
}

bool bb_model_is_hf_dir(const char *path)
{
    char config[4200];
    struct stat st;
    snprintf(config, sizeof config, "%s/config.json", path);
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode) && access(config, F_OK) == 0;
}

/* ---- the weights' files -------------------------------------------------------- */
typedef struct hf_files {
    bb_st_file *f;
    char (*path)[4200];
    int count;
    json_t *map; /* the index's weight_map (sharded); NULL: one file */
} hf_files;

static void files_close(hf_files *h)
{
    for (int i = 0; i < h->count; i++) bb_st_unmap(&h->f[i]);
    free(h->f), free(h->path);
    json_decref(h->map);
    memset(h, 0, sizeof *h);
}

static bb_status files_add(hf_files *h, const char *path)
{
    bb_st_file *f = realloc(h->f, (size_t)(h->count + 1) * sizeof *f);
    if (f) h->f = f;
    char(*p)[4200] = realloc(h->path, (size_t)(h->count + 1) * sizeof *p);
    if (p) h->path = p;
    if (!f || !p) return bb_fail(BB_ERR_NOMEM, "out of memory");
    snprintf(h->path[h->count], sizeof h->path[0], "%s", path);
    BB_TRY(bb_st_map(path, &h->f[h->count]));
    h->count++;
    return BB_OK;
}

/* model.safetensors, or the shards of the index (each file once). */
static bb_status files_open(const char *dir, hf_files *h)
{
    char path[4200];
    memset(h, 0, sizeof *h);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!access(path, F_OK)) return files_add(h, path);
    snprintf(path, sizeof path, "%s/%s", dir, INDEX_FILE);
    if (access(path, F_OK)) {
        snprintf(path, sizeof path, "%s/pytorch_model.bin", dir);
        if (!access(path, F_OK))
            return bb_fail(BB_ERR_FORMAT, "%s: bigbatch reads model.safetensors, not PyTorch pickles (save_pretrained "
                           "writes safetensors; or convert it with the safetensors package)", path);
        return bb_fail(BB_ERR_IO, "%s: neither model.safetensors nor %s is there", dir, INDEX_FILE);
    }
    json_t *index;
    BB_TRY(bb_json_load_file(path, true, &index));
    json_t *map = json_object_get(index, "weight_map");
    bb_status rc = json_is_object(map) && json_object_size(map)
                       ? BB_OK
                       : bb_fail(BB_ERR_FORMAT, "%s: weight_map is missing or empty", path);
    if (rc == BB_OK) h->map = json_incref(map);
    json_decref(index);
    const char *name;
    json_t *file;
    json_object_foreach(h->map, name, file) {
        const char *base = json_string_value(file);
        if (rc != BB_OK) break;
        if (!base || !*base || strchr(base, '/')) {
            rc = bb_fail(BB_ERR_FORMAT, "%s: weight_map's %s is not a file name beside it", path, name);
            break;
        }
        char shard[4200];
        snprintf(shard, sizeof shard, "%s/%s", dir, base);
        bool open = false;
        for (int i = 0; !open && i < h->count; i++) open = !strcmp(h->path[i], shard);
        if (!open) rc = files_add(h, shard);
    }
    if (rc != BB_OK) files_close(h);
    return rc;
}

/* The file tensor called `name` (as the index says where it is); its file in *file. */
static const bb_st_entry *files_find(const hf_files *h, const char *name, int *file)
{
    const char *base = h->map ? json_string_value(json_object_get(h->map, name)) : NULL;
    for (int i = 0; i < h->count; i++) {
        const char *slash = strrchr(h->path[i], '/');
        if (base && strcmp(slash ? slash + 1 : h->path[i], base)) continue;
        const bb_st_entry *e = bb_st_find(&h->f[i], name);
        if (e) {
            *file = i;
            return e;
        }
    }
    return NULL;
}

/* The file tensor of model tensor `name`, under it or the layout's alias. */
static const bb_st_entry *layout_find(const bb_hf_layout *lay, const hf_files *h, const char *name, int *file)
{
    const bb_st_entry *e = files_find(h, name, file);
    const char *alias = !e && lay->alias ? lay->alias(name) : NULL;
    return alias ? files_find(h, alias, file) : e;
}

/* ---- tensors ---------------------------------------------------------------------- */
/* Element i of a tensor of `dtype` as a float. */
static float element(const uint8_t *p, const char *dtype, size_t i)
{
    if (!strcmp(dtype, "F32")) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    uint32_t bits;
    if (!strcmp(dtype, "BF16")) bits = (uint32_t)h << 16;
    else { /* F16 */
        uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
        if (exp == 0x1F) bits = sign | 0x7F800000u | man << 13;
        else if (exp) bits = sign | (exp + 112) << 23 | man << 13;
        else if (!man) bits = sign;
        else { /* subnormal: normalise */
            int e = -1;
            do man <<= 1, e++;
            while (!(man & 0x400));
            bits = sign | (uint32_t)(112 - e) << 23 | (man & 0x3FF) << 13;
        }
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static size_t dtype_size(const char *dtype)
{
    return !strcmp(dtype, "F32") ? 4 : !strcmp(dtype, "F16") || !strcmp(dtype, "BF16") ? 2 : 0;
}

/* Checks entry e against model tensor t (transposed where the layout says;
 * the positions tensor: at least T rows) and converts it into
 * host[t->offset...]. */
static bb_status hf_tensor(const bb_hf_layout *lay, const char *path, const bb_st_file *f, const bb_st_entry *e,
                           const bb_tensor_info *t, int vocab, int T, float *host)
{
    size_t es = dtype_size(e->dtype);
    if (!es) return bb_fail(BB_ERR_FORMAT, "%s: tensor %s is %s: bigbatch reads F32, F16 and BF16", path, e->name,
                            e->dtype);
    bool conv = lay->transposed && lay->transposed(t->name);
    bool pos = lay->positions_tensor && !strcmp(t->name, lay->positions_tensor);
    uint64_t rows = t->rank == 2 ? (uint64_t)t->shape[conv ? 1 : 0] : (uint64_t)t->shape[0];
    uint64_t cols = t->rank == 2 ? (uint64_t)t->shape[conv ? 0 : 1] : 1;
    bool ok = e->rank == t->rank && (pos ? e->shape[0] >= rows : e->shape[0] == rows) &&
              (t->rank == 1 || e->shape[1] == cols);
    if (t->offset == 0 && e->rank == 2 && e->shape[0] != rows && e->shape[1] == cols)
        return bb_fail(BB_ERR_ARG, "%s: the embedding holds %llu tokens, the data's vocabulary is %d: the data was "
                       "packed with another tokenizer", path, (unsigned long long)e->shape[0], vocab);
    if (pos && e->rank == 2 && e->shape[0] < rows)
        return bb_fail(BB_ERR_ARG, "%s: %s has %llu positions, fewer than the data's T of %d", path, e->name,
                       (unsigned long long)e->shape[0], T);
    if (!ok) {
        char has[96], wants[96];
        const uint64_t want[2] = {rows, cols};
        return bb_fail(BB_ERR_FORMAT, "%s: tensor %s has shape %s, the model wants %s", path, e->name,
                       bb_st_shape_text(e->shape, e->rank, has, sizeof has),
                       bb_st_shape_text(want, t->rank, wants, sizeof wants));
    }
    uint64_t have = (e->end - e->begin) / es, want = e->rank == 2 ? e->shape[0] * e->shape[1] : e->shape[0];
    if (have != want || (e->end - e->begin) % es)
        return bb_fail(BB_ERR_CORRUPT, "%s: tensor %s: its data offsets hold %llu elements, its shape %llu", path,
                       e->name, (unsigned long long)have, (unsigned long long)want);
    const uint8_t *p = f->data + e->begin;
    float *out = host + t->offset;
    if (conv) /* [in, out] → [out, in] */
        for (uint64_t i = 0; i < rows; i++)
            for (uint64_t o = 0; o < cols; o++) out[o * rows + i] = element(p, e->dtype, i * cols + o);
    else
        for (size_t i = 0; i < t->count; i++) out[i] = element(p, e->dtype, i); /* positions: the first T rows */
    return BB_OK;
}

/* A file tensor that no model tensor read: the tied head (equal to the
 * embedding), a skipped buffer, or a refusal. */
static bb_status leftover(bb_model_t *m, const bb_hf_layout *lay, const hf_files *h, const char *path,
                          const bb_st_entry *e, const float *host)
{
    const char *head = bb_model_tied_head(&m->cfg);
    if (head && !strcmp(e->name, head)) {
        const bb_tensor_info *emb = &m->tensors[0];
        bb_tensor_info probe = *emb;
        probe.offset = 0;
        float *copy = malloc(emb->count * sizeof *copy);
        bb_status rc = copy ? BB_OK : bb_fail(BB_ERR_NOMEM, "out of memory");
        int file = 0;
        files_find(h, e->name, &file);
        if (rc == BB_OK) rc = hf_tensor(lay, h->path[file], &h->f[file], e, &probe, 0, 0, copy);
        if (rc == BB_OK && memcmp(copy, host + emb->offset, emb->count * sizeof *copy))
            rc = bb_fail(BB_ERR_FORMAT, "%s: %s differs from %s: this %s ties its head to the embedding "
                         "(tie_word_embeddings)", path, e->name, emb->name, m->cfg.kind->name);
        free(copy);
        return rc;
    }
    if (lay->skipped && lay->skipped(e->name)) return BB_OK;
    for (int i = 0; i < m->tensor_count; i++) {
        int file;
        if (layout_find(lay, h, m->tensors[i].name, &file) == e) return BB_OK;
    }
    return bb_fail(BB_ERR_FORMAT, "%s: tensor %s is not part of bigbatch's %s (another model, or more layers than "
                   "config.json says?)", path, e->name, m->cfg.kind->name);
}

bb_status bb_model_load_hf(bb_model_t *m, const char *dir)
{
    const bb_hf_layout *lay = m->cfg.kind->hf;
    if (!lay) return bb_fail(BB_ERR_UNSUPPORTED, "%s: a %s has no transformers layout", dir, m->cfg.kind->name);
    bb_model_config hf;
    int positions, V = bb_model_outputs(&m->cfg), T = bb_model_targets_per_example(&m->cfg);
    BB_TRY(bb_model_hf_config(dir, &hf, &positions));
    if (hf.kind != m->cfg.kind)
        return bb_fail(BB_ERR_ARG, "%s/config.json: model_type %s, the model is a %s", dir, hf.kind->hf->model_type,
                       m->cfg.kind->name);
    if (positions < T)
        return bb_fail(BB_ERR_ARG, "%s/config.json: %s %d is fewer than the data's T of %d", dir, lay->positions_key,
                       positions, T);
    hf_files h;
    BB_TRY(files_open(dir, &h));
    int file;
    bb_status rc = BB_OK;
    const bb_st_entry *pos = lay->positions_tensor ? layout_find(lay, &h, lay->positions_tensor, &file) : NULL;
    if (pos && pos->shape[0] != (uint64_t)positions)
        rc = bb_fail(BB_ERR_FORMAT, "%s: %s has %llu rows, config.json's %s is %d", h.path[file], pos->name,
                     (unsigned long long)pos->shape[0], lay->positions_key, positions);
    const bb_st_entry *emb = rc == BB_OK ? layout_find(lay, &h, m->tensors[0].name, &file) : NULL;
    int hf_vocab = bb_model_outputs(&hf);
    if (emb && emb->rank == 2 && emb->shape[0] != (uint64_t)hf_vocab)
        rc = bb_fail(BB_ERR_FORMAT, "%s: %s has %llu rows, config.json's vocab_size is %d", h.path[file], emb->name,
                     (unsigned long long)emb->shape[0], hf_vocab);
    float *host = rc == BB_OK ? malloc(m->param_count * sizeof *host) : NULL;
    if (rc == BB_OK && !host) rc = bb_fail(BB_ERR_NOMEM, "out of memory for %s's weights", dir);
    for (int i = 0; rc == BB_OK && i < m->tensor_count; i++) {
        const bb_tensor_info *t = &m->tensors[i];
        const bb_st_entry *e = layout_find(lay, &h, t->name, &file);
        if (!e) rc = bb_fail(BB_ERR_FORMAT, "%s: no tensor %s (is it a %s of this shape?)", h.map ? dir : h.path[0],
                             t->name, lay->architecture);
        else rc = hf_tensor(lay, h.path[file], &h.f[file], e, t, V, T, host);
    }
    for (int k = 0; rc == BB_OK && k < h.count; k++)
        for (int j = 0; rc == BB_OK && j < h.f[k].count; j++)
            rc = leftover(m, lay, &h, h.path[k], &h.f[k].entries[j], host);
    if (rc == BB_OK) rc = bb_model_weights_in(m, 0, host, m->param_count);
    free(host);
    files_close(&h);
    return rc;
}

/* ---- writing ------------------------------------------------------------------------ */
static bb_status write_json(json_t *v, const char *dir, const char *name)
{
    char path[4200], tmp[4300]; /* written beside, then renamed: no half-written file */
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid());
    bb_status rc = v ? bb_json_write_file(v, tmp) : bb_fail(BB_ERR_NOMEM, "out of memory");
    if (rc == BB_OK && rename(tmp, path) != 0) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot rename into place", path);
    if (rc != BB_OK) unlink(tmp);
    return rc;
}

bool bb_model_hf_file(const char *name)
{
    unsigned a, b;
    int end = 0;
    return !strcmp(name, "config.json") || !strcmp(name, "model.safetensors") || !strcmp(name, INDEX_FILE) ||
           (sscanf(name, "model-%5u-of-%5u.safetensors%n", &a, &b, &end) == 2 && name[end] == 0 && a <= b);
}

/* After a write of `shards` files: an earlier export's weights that are
 * not this one's (a single file, an index, shards of another count) go,
 * so that the directory holds one model. */
static void remove_stale(const char *dir, int shards)
{
    DIR *d = opendir(dir);
    char keep[64], path[4200];
    snprintf(keep, sizeof keep, "-of-%05d.safetensors", shards);
    for (struct dirent *e; d && (e = readdir(d));) {
        const char *n = e->d_name;
        bool shard = bb_model_hf_file(n) && !strncmp(n, "model-", 6);
        bool stale = shards == 1 ? shard || !strcmp(n, INDEX_FILE)
                                 : !strcmp(n, "model.safetensors") || (shard && !strstr(n, keep));
        if (stale && snprintf(path, sizeof path, "%s/%s", dir, n) < (int)sizeof path) unlink(path);
    }
    if (d) closedir(d);
}

/* Shards of at most `shard_bytes` (a tensor larger than that alone), the
 * index naming each tensor's; one model.safetensors when all fit. */
static bb_status write_weights(const char *dir, const bb_st_tensor *ts, int n, uint64_t shard_bytes)
{
    int *first = malloc(((size_t)n + 1) * sizeof *first), shards = 0;
    if (!first) return bb_fail(BB_ERR_NOMEM, "out of memory");
    uint64_t total = 0, in_shard = 0;
    for (int i = 0; i < n; i++) {
        uint64_t bytes = ts[i].count * sizeof(float);
        if (i == 0 || (shard_bytes && in_shard + bytes > shard_bytes && in_shard > 0)) first[shards++] = i, in_shard = 0;
        in_shard += bytes, total += bytes;
    }
    first[shards] = n;
    char path[4200];
    bb_status rc = BB_OK;
    if (shards == 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = bb_st_write(path, ts, n);
        if (rc == BB_OK) remove_stale(dir, 1);
        free(first);
        return rc;
    }
    json_t *map = json_object();
    for (int s = 0; rc == BB_OK && s < shards; s++) {
        char base[64];
        snprintf(base, sizeof base, "model-%05d-of-%05d.safetensors", s + 1, shards);
        snprintf(path, sizeof path, "%s/%s", dir, base);
        rc = bb_st_write(path, ts + first[s], first[s + 1] - first[s]);
        for (int i = first[s]; rc == BB_OK && i < first[s + 1]; i++)
            if (!map || json_object_set_new(map, ts[i].name, json_string(base))) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    json_t *index = rc == BB_OK ? json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
                                            "weight_map", map)
                                : NULL;
    if (!index) json_decref(map);
    if (rc == BB_OK) rc = write_json(index, dir, INDEX_FILE); /* last: the shards are all in place */
    if (rc == BB_OK) remove_stale(dir, shards);
    json_decref(index);
    free(first);
    return rc;
}

bb_status bb_model_save_hf(bb_model_t *m, const char *dir, int eos, uint64_t shard_bytes)
{
    const bb_model_config *c = &m->cfg;
    const bb_hf_layout *lay = c->kind->hf;
    if (!lay)
        return bb_fail(BB_ERR_UNSUPPORTED, "a %s has no transformers layout (export --format hf takes %s)",
                       c->kind->name, bb_model_hf_types());
    float *host = malloc(m->param_count * sizeof *host), *conv = malloc(m->param_count * sizeof *conv);
    bb_st_tensor *ts = calloc((size_t)m->tensor_count, sizeof *ts);
    bb_status rc = host && conv && ts ? BB_OK : bb_fail(BB_ERR_NOMEM, "out of memory");
    if (rc == BB_OK) rc = bb_model_weights_out(m, host, 0, m->param_count);
    for (int i = 0; rc == BB_OK && i < m->tensor_count; i++) {
        const bb_tensor_info *t = &m->tensors[i];
        ts[i] = (bb_st_tensor){t->name, t->rank, {t->shape[0], t->shape[1]}, host + t->offset, t->count};
        if (!lay->transposed || !lay->transposed(t->name)) continue;
        float *out = conv + t->offset; /* [out, in] → [in, out] */
        for (int o = 0; o < t->shape[0]; o++)
            for (int k = 0; k < t->shape[1]; k++) out[(size_t)k * t->shape[0] + o] = host[t->offset + (size_t)o * t->shape[1] + k];
        ts[i].shape[0] = t->shape[1], ts[i].shape[1] = t->shape[0], ts[i].data = out;
    }
    if (rc == BB_OK) rc = write_weights(dir, ts, m->tensor_count, shard_bytes);
    free(ts), free(conv), free(host);
    if (rc != BB_OK) return rc;
    json_t *cfg = lay->write_config(c, eos);
    rc = write_json(cfg, dir, "config.json");
    json_decref(cfg);
    return rc;
}
