/* gpt_hf.c — the gpt as a Hugging Face `transformers` GPT2LMHeadModel
 * directory: config.json and model.safetensors in, and out.
 *
 * The gpt is GPT-2's architecture (pre-LayerNorm blocks with eps 1e-5,
 * tanh GELU, an MLP of 4C, a tied LM head) and its tensors carry GPT-2's
 * names, so the mapping is the layout only: GPT-2's four block matrices
 * (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) are Conv1D weights,
 * stored [in, out], where bigbatch keeps nn.Linear's [out, in]; the
 * position table has n_positions rows, of which the model uses its T. Files
 * may name the tensors with or without "transformer." (GPT2Model's own),
 * hold the causal-mask buffers (attn.bias, attn.masked_bias: skipped) and
 * be F32, F16 or BF16. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model_internal.h"

static bool is_conv1d(const char *name)
{
    static const char *const conv[] = {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight",
                                       ".mlp.c_proj.weight"};
    size_t n = strlen(name);
    for (int i = 0; i < 4; i++) {
        size_t k = strlen(conv[i]);
        if (n > k && !strcmp(name + n - k, conv[i])) return true;
    }
    return false;
}

/* obj[key] as an integer, or `dflt` when absent (-1: required). */
static bb_status config_int(const json_t *cfg, const char *path, const char *key, int dflt, int *out)
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

/* A boolean key that must be `want` (absent: the default, which is want). */
static bb_status config_bool(const json_t *cfg, const char *path, const char *key, bool want)
{
    const json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v) || (json_is_boolean(v) && json_is_true(v) == want)) return BB_OK;
    return bb_fail(BB_ERR_FORMAT, "%s: %s is %s: bigbatch's gpt cannot represent it (it needs %s)", path, key,
                   json_is_true(v) ? "true" : json_is_false(v) ? "false" : "not a boolean", want ? "true" : "false");
}

bb_status bb_model_hf_config(const char *dir, bb_model_config *c, int *positions)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *cfg;
    BB_TRY(bb_json_load_file(path, true, &cfg));
    bb_status rc = BB_OK;
    const char *type = json_string_value(json_object_get(cfg, "model_type"));
    const char *act = json_string_value(json_object_get(cfg, "activation_function"));
    int layers = 0, heads = 0, d = 0, vocab = 0, inner = 0;
    if (!type || strcmp(type, "gpt2"))
        rc = bb_fail(BB_ERR_FORMAT, "%s: model_type %s is not supported (gpt2: a GPT2LMHeadModel)", path,
                     type ? type : "(missing)");
    if (rc == BB_OK && act && strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh"))
        rc = bb_fail(BB_ERR_FORMAT, "%s: activation_function %s: bigbatch's gpt has GPT-2's tanh GELU (gelu_new)",
                     path, act);
    if (rc == BB_OK) rc = config_int(cfg, path, "n_layer", -1, &layers);
    if (rc == BB_OK) rc = config_int(cfg, path, "n_head", -1, &heads);
    if (rc == BB_OK) rc = config_int(cfg, path, "n_embd", -1, &d);
    if (rc == BB_OK) rc = config_int(cfg, path, "vocab_size", -1, &vocab);
    if (rc == BB_OK) rc = config_int(cfg, path, "n_positions", -1, positions);
    if (rc == BB_OK) rc = config_int(cfg, path, "n_inner", 4 * d, &inner);
    if (rc == BB_OK && d % heads)
        rc = bb_fail(BB_ERR_FORMAT, "%s: n_head %d does not divide n_embd %d (the heads split the width)", path, heads,
                     d);
    if (rc == BB_OK && inner != 4 * d)
        rc = bb_fail(BB_ERR_FORMAT, "%s: n_inner is %d: bigbatch's gpt has an MLP of 4 x n_embd (%d)", path, inner,
                     4 * d);
    double eps = bb_json_number_or_nan(cfg, "layer_norm_epsilon");
    if (rc == BB_OK && !isnan(eps) && fabs(eps - 1e-5) > 1e-12)
        rc = bb_fail(BB_ERR_FORMAT, "%s: layer_norm_epsilon is %g: bigbatch's LayerNorm has 1e-05", path, eps);
    if (rc == BB_OK) rc = config_bool(cfg, path, "tie_word_embeddings", true);
    if (rc == BB_OK) rc = config_bool(cfg, path, "scale_attn_weights", true);
    if (rc == BB_OK) rc = config_bool(cfg, path, "scale_attn_by_inverse_layer_idx", false);
    if (rc == BB_OK) rc = config_bool(cfg, path, "add_cross_attention", false);
    json_decref(cfg);
    if (rc == BB_OK) *c = bb_model_gpt_config(layers, heads, d, *positions, vocab);
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

/* The file's tensor for model tensor `name`: under it, or without "transformer.". */
static const bb_st_entry *hf_entry(const bb_st_file *f, const char *name)
{
    const bb_st_entry *e = bb_st_find(f, name);
    return e ? e : bb_st_find(f, name + strlen("transformer."));
}

/* Checks entry e against model tensor t (Conv1D: transposed; the position
 * table: at least T rows) and converts it into host[t->offset...]. */
static bb_status hf_tensor(const char *path, const bb_st_file *f, const bb_st_entry *e, const bb_tensor_info *t,
                           const bb_model_config *c, float *host)
{
    size_t es = dtype_size(e->dtype);
    if (!es) return bb_fail(BB_ERR_FORMAT, "%s: tensor %s is %s: bigbatch reads F32, F16 and BF16", path, e->name,
                            e->dtype);
    bool conv = is_conv1d(t->name), wpe = !strcmp(t->name, "transformer.wpe.weight");
    uint64_t rows = t->rank == 2 ? (uint64_t)t->shape[conv ? 1 : 0] : (uint64_t)t->shape[0];
    uint64_t cols = t->rank == 2 ? (uint64_t)t->shape[conv ? 0 : 1] : 1;
    bool ok = e->rank == t->rank && (wpe ? e->shape[0] >= rows : e->shape[0] == rows) &&
              (t->rank == 1 || e->shape[1] == cols);
    if (!strcmp(t->name, "transformer.wte.weight") && e->rank == 2 && e->shape[0] != rows && e->shape[1] == cols)
        return bb_fail(BB_ERR_ARG, "%s: the embedding holds %llu tokens, the data's vocabulary is %d: the data was "
                       "packed with another tokenizer", path, (unsigned long long)e->shape[0], c->gpt.vocab);
    if (wpe && e->rank == 2 && e->shape[0] < rows)
        return bb_fail(BB_ERR_ARG, "%s: %s has %llu positions, fewer than the data's T of %d", path, e->name,
                       (unsigned long long)e->shape[0], c->gpt.seq_len);
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
        for (size_t i = 0; i < t->count; i++) out[i] = element(p, e->dtype, i); /* wpe: its first T rows */
    return BB_OK;
}

bb_status bb_model_load_hf(bb_model_t *m, const char *dir)
{
    if (!m->cfg.kind->hf_model_type)
        return bb_fail(BB_ERR_UNSUPPORTED, "%s: a %s has no transformers layout", dir, m->cfg.kind->name);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (access(path, F_OK)) {
        snprintf(path, sizeof path, "%s/pytorch_model.bin", dir);
        if (!access(path, F_OK))
            return bb_fail(BB_ERR_FORMAT, "%s: bigbatch reads model.safetensors, not PyTorch pickles (save_pretrained "
                           "writes safetensors; or convert it with the safetensors package)", path);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
    }
    bb_model_config hf;
    int positions;
    BB_TRY(bb_model_hf_config(dir, &hf, &positions));
    if (positions < m->cfg.gpt.seq_len)
        return bb_fail(BB_ERR_ARG, "%s/config.json: n_positions %d is fewer than the data's T of %d", dir, positions,
                       m->cfg.gpt.seq_len);
    bb_st_file f;
    BB_TRY(bb_st_map(path, &f));
    const bb_st_entry *wpe = hf_entry(&f, "transformer.wpe.weight");
    if (wpe && wpe->shape[0] != (uint64_t)positions) {
        bb_status rc = bb_fail(BB_ERR_FORMAT, "%s: %s has %llu rows, config.json's n_positions is %d", path, wpe->name,
                               (unsigned long long)wpe->shape[0], positions);
        bb_st_unmap(&f);
        return rc;
    }
    const bb_st_entry *wte = hf_entry(&f, "transformer.wte.weight");
    if (wte && wte->rank == 2 && wte->shape[0] != (uint64_t)hf.gpt.vocab) {
        bb_status rc = bb_fail(BB_ERR_FORMAT, "%s: %s has %llu rows, config.json's vocab_size is %d", path, wte->name,
                               (unsigned long long)wte->shape[0], hf.gpt.vocab);
        bb_st_unmap(&f);
        return rc;
    }
    float *host = malloc(m->param_count * sizeof *host);
    bb_status rc = host ? BB_OK : bb_fail(BB_ERR_NOMEM, "out of memory for %s", path);
    int used = 0;
    for (int i = 0; rc == BB_OK && i < m->tensor_count; i++) {
        const bb_tensor_info *t = &m->tensors[i];
        const bb_st_entry *e = hf_entry(&f, t->name);
        if (!e) rc = bb_fail(BB_ERR_FORMAT, "%s: no tensor %s (is it a GPT2LMHeadModel of this shape?)", path, t->name);
        else rc = hf_tensor(path, &f, e, t, &m->cfg, host), used++;
    }
    /* What else the file holds: the tied head (equal to the embedding), the mask buffers, or a refusal. */
    for (int k = 0; rc == BB_OK && k < f.count; k++) {
        const bb_st_entry *e = &f.entries[k];
        const char *n = e->name, *dot = strrchr(n, '.');
        if (!strcmp(n, "lm_head.weight")) {
            const bb_tensor_info *wte = &m->tensors[0];
            bb_tensor_info probe = *wte;
            float *copy = malloc(wte->count * sizeof *copy);
            probe.offset = 0;
            rc = copy ? hf_tensor(path, &f, e, &probe, &m->cfg, copy) : bb_fail(BB_ERR_NOMEM, "out of memory");
            if (rc == BB_OK && memcmp(copy, host + wte->offset, wte->count * sizeof *copy))
                rc = bb_fail(BB_ERR_FORMAT, "%s: lm_head.weight differs from transformer.wte.weight: bigbatch's gpt "
                             "ties its head to the embedding (tie_word_embeddings)", path);
            free(copy);
        } else if (!(dot && (!strcmp(dot, ".bias") || !strcmp(dot, ".masked_bias")) && strstr(n, ".attn.") &&
                     !strstr(n, "c_attn") && !strstr(n, "c_proj"))) {
            bool ours = false;
            for (int i = 0; !ours && i < m->tensor_count; i++) ours = hf_entry(&f, m->tensors[i].name) == e;
            if (!ours)
                rc = bb_fail(BB_ERR_FORMAT, "%s: tensor %s is not part of bigbatch's gpt (another model, or more "
                             "layers than config.json says?)", path, n);
        }
    }
    if (rc == BB_OK) rc = bb_backend_copy(m->be, m->params, host, m->param_count * sizeof *host, BB_COPY_H2D);
    m->weights_stale = true;
    free(host);
    bb_st_unmap(&f);
    return rc;
}

bb_status bb_model_save_hf(bb_model_t *m, const char *dir, int eos)
{
    const bb_model_config *c = &m->cfg;
    if (!c->kind->hf_model_type)
        return bb_fail(BB_ERR_UNSUPPORTED, "a %s has no transformers layout (export --format hf takes a gpt)",
                       c->kind->name);
    float *host = malloc(m->param_count * sizeof *host), *conv = malloc(m->param_count * sizeof *conv);
    bb_st_tensor *ts = calloc((size_t)m->tensor_count, sizeof *ts);
    bb_status rc = host && conv && ts ? BB_OK : bb_fail(BB_ERR_NOMEM, "out of memory");
    if (rc == BB_OK) rc = bb_backend_copy(m->be, host, m->params, m->param_count * sizeof *host, BB_COPY_D2H);
    for (int i = 0; rc == BB_OK && i < m->tensor_count; i++) {
        const bb_tensor_info *t = &m->tensors[i];
        ts[i] = (bb_st_tensor){t->name, t->rank, {t->shape[0], t->shape[1]}, host + t->offset, t->count};
        if (!is_conv1d(t->name)) continue;
        float *out = conv + t->offset; /* [out, in] → [in, out] */
        for (int o = 0; o < t->shape[0]; o++)
            for (int k = 0; k < t->shape[1]; k++) out[(size_t)k * t->shape[0] + o] = host[t->offset + (size_t)o * t->shape[1] + k];
        ts[i].shape[0] = t->shape[1], ts[i].shape[1] = t->shape[0], ts[i].data = out;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (rc == BB_OK) rc = bb_st_write(path, ts, m->tensor_count);
    free(ts), free(conv), free(host);
    if (rc != BB_OK) return rc;
    json_t *cfg = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:n, s:s, s:f, s:b, s:f, s:f, s:f, s:f, s:b, "
                            "s:b, s:s}",
                            "architectures", "GPT2LMHeadModel", "model_type", "gpt2", "vocab_size", c->gpt.vocab,
                            "n_positions", c->gpt.seq_len, "n_embd", c->gpt.d_model, "n_layer", c->gpt.layers, "n_head", c->gpt.heads,
                            "n_inner", "activation_function", "gelu_new", "layer_norm_epsilon", 1e-5,
                            "tie_word_embeddings", true, "initializer_range", 0.02, "resid_pdrop", 0.0, "embd_pdrop",
                            0.0, "attn_pdrop", 0.0, "scale_attn_weights", true, "use_cache", true, "torch_dtype", "float32");
    if (cfg && eos >= 0 && eos < c->gpt.vocab &&
        (json_object_set_new(cfg, "bos_token_id", json_integer(eos)) ||
         json_object_set_new(cfg, "eos_token_id", json_integer(eos)))) {
        json_decref(cfg);
        cfg = NULL;
    }
    char tmp[4300]; /* written beside, then renamed: no half-written config */
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid());
    rc = cfg ? bb_json_write_file(cfg, tmp) : bb_fail(BB_ERR_NOMEM, "out of memory");
    json_decref(cfg);
    if (rc == BB_OK && rename(tmp, path) != 0) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot rename into place", path);
    if (rc != BB_OK) unlink(tmp);
    return rc;
}
