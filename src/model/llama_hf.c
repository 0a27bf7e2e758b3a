/* llama_hf.c — the llama's transformers layout (hf.c reads and writes the
 * directories): a LlamaForCausalLM's config.json. Its tensors carry
 * bigbatch's names already (llama.c), stored as nn.Linear's [out, in];
 * rotary tables some files hold (rotary_emb.inv_freq) are skipped. A key
 * bigbatch cannot represent (another activation, biases, a head size that
 * is not hidden_size / num_attention_heads, rope scaling other than
 * llama3's) is refused, naming it. */
#include <math.h>
#include <string.h>

#include "model_internal.h"

/* obj[key]: a positive number, or `dflt`. */
static bb_status get_number(const json_t *cfg, const char *path, const char *key, double dflt, double *out)
{
    const json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return BB_OK;
    }
    if (!json_is_number(v) || !(json_number_value(v) > 0))
        return bb_fail(BB_ERR_FORMAT, "%s: %s is not a positive number", path, key);
    *out = json_number_value(v);
    return BB_OK;
}

/* rope_scaling: null, or Llama 3's {"rope_type": "llama3", ...}. */
static bb_status rope_scaling(const json_t *cfg, const char *path, bb_llama_config *g)
{
    const json_t *rs = json_object_get(cfg, "rope_scaling");
    if (!rs || json_is_null(rs)) return BB_OK;
    const char *type = json_string_value(json_object_get(rs, "rope_type"));
    if (!type) type = json_string_value(json_object_get(rs, "type"));
    if (!json_is_object(rs) || !type || strcmp(type, "llama3"))
        return bb_fail(BB_ERR_FORMAT, "%s: rope_scaling of type %s: bigbatch's llama has none or llama3's", path,
                       type ? type : "(none given)");
    BB_TRY(get_number(rs, path, "factor", -1, &g->rope_factor));
    BB_TRY(get_number(rs, path, "low_freq_factor", 1, &g->rope_low_freq_factor));
    BB_TRY(get_number(rs, path, "high_freq_factor", 4, &g->rope_high_freq_factor));
    BB_TRY(bb_hf_config_int(rs, path, "original_max_position_embeddings", 8192, &g->rope_original_positions));
    if (!(g->rope_factor > 0) || !(g->rope_high_freq_factor > g->rope_low_freq_factor))
        return bb_fail(BB_ERR_FORMAT, "%s: rope_scaling needs a positive factor and high_freq_factor above "
                       "low_freq_factor", path);
    return BB_OK;
}

static bb_status llama_read_config(const json_t *cfg, const char *path, bb_model_config *c, int *positions)
{
    bb_llama_config g = {0};
    const char *act = json_string_value(json_object_get(cfg, "hidden_act"));
    if (act && strcmp(act, "silu"))
        return bb_fail(BB_ERR_FORMAT, "%s: hidden_act %s: bigbatch's llama has SwiGLU (silu)", path, act);
    BB_TRY(bb_hf_config_int(cfg, path, "num_hidden_layers", -1, &g.layers));
    BB_TRY(bb_hf_config_int(cfg, path, "num_attention_heads", -1, &g.heads));
    BB_TRY(bb_hf_config_int(cfg, path, "num_key_value_heads", g.heads, &g.kv_heads));
    BB_TRY(bb_hf_config_int(cfg, path, "hidden_size", -1, &g.d_model));
    BB_TRY(bb_hf_config_int(cfg, path, "intermediate_size", -1, &g.ffn));
    BB_TRY(bb_hf_config_int(cfg, path, "vocab_size", -1, &g.vocab));
    BB_TRY(bb_hf_config_int(cfg, path, "max_position_embeddings", 2048, positions));
    BB_TRY(get_number(cfg, path, "rope_theta", 10000, &g.rope_theta));
    BB_TRY(get_number(cfg, path, "rms_norm_eps", 1e-6, &g.norm_eps));
    if (g.d_model % g.heads)
        return bb_fail(BB_ERR_FORMAT, "%s: num_attention_heads %d does not divide hidden_size %d", path, g.heads,
                       g.d_model);
    if (g.heads % g.kv_heads)
        return bb_fail(BB_ERR_FORMAT, "%s: num_key_value_heads %d does not divide num_attention_heads %d", path,
                       g.kv_heads, g.heads);
    int head_dim;
    BB_TRY(bb_hf_config_int(cfg, path, "head_dim", g.d_model / g.heads, &head_dim));
    if (head_dim != g.d_model / g.heads)
        return bb_fail(BB_ERR_FORMAT, "%s: head_dim is %d: bigbatch's llama has hidden_size / num_attention_heads "
                       "(%d)", path, head_dim, g.d_model / g.heads);
    const json_t *tie = json_object_get(cfg, "tie_word_embeddings");
    if (tie && !json_is_null(tie) && !json_is_boolean(tie))
        return bb_fail(BB_ERR_FORMAT, "%s: tie_word_embeddings is not a boolean", path);
    g.tied = json_is_true(tie);
    BB_TRY(bb_hf_config_bool(cfg, path, "attention_bias", false, "llama"));
    BB_TRY(bb_hf_config_bool(cfg, path, "mlp_bias", false, "llama"));
    BB_TRY(rope_scaling(cfg, path, &g));
    *c = (bb_model_config){.kind = &bb_model_kind_llama, .llama = g};
    c->llama.seq_len = *positions;
    return BB_OK;
}

static json_t *llama_write_config(const bb_model_config *c, int eos)
{
    const bb_llama_config *g = &c->llama;
    json_t *cfg = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:s, s:b, s:b, s:f, "
                            "s:f, s:i, s:b, s:s}",
                            "architectures", "LlamaForCausalLM", "model_type", "llama", "vocab_size", g->vocab,
                            "hidden_size", g->d_model, "intermediate_size", g->ffn, "num_hidden_layers", g->layers,
                            "num_attention_heads", g->heads, "num_key_value_heads", g->kv_heads,
                            "max_position_embeddings", g->seq_len, "rms_norm_eps", g->norm_eps, "rope_theta",
                            g->rope_theta, "tie_word_embeddings", g->tied, "hidden_act", "silu", "attention_bias",
                            false, "mlp_bias", false, "attention_dropout", 0.0, "initializer_range", 0.02,
                            "pretraining_tp", 1, "use_cache", true, "torch_dtype", "float32");
    json_t *rs = g->rope_factor > 0 ? json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor",
                                                g->rope_factor, "low_freq_factor", g->rope_low_freq_factor,
                                                "high_freq_factor", g->rope_high_freq_factor,
                                                "original_max_position_embeddings", g->rope_original_positions)
                                    : json_null();
    if (cfg && json_object_set_new(cfg, "rope_scaling", rs)) json_decref(cfg), cfg = NULL;
    if (cfg && eos >= 0 && eos < g->vocab &&
        (json_object_set_new(cfg, "bos_token_id", json_integer(eos)) ||
         json_object_set_new(cfg, "eos_token_id", json_integer(eos))))
        json_decref(cfg), cfg = NULL;
    return cfg;
}

static bool llama_skipped(const char *name)
{
    size_t n = strlen(name), k = strlen(".rotary_emb.inv_freq");
    return n > k && !strcmp(name + n - k, ".rotary_emb.inv_freq");
}

const bb_hf_layout bb_hf_llama = {
    .model_type = "llama",
    .architecture = "LlamaForCausalLM",
    .positions_key = "max_position_embeddings",
    .read_config = llama_read_config,
    .write_config = llama_write_config,
    .skipped = llama_skipped,
};
