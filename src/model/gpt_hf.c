/* gpt_hf.c — the gpt's transformers layout (hf.c reads and writes the
 * directories): a GPT2LMHeadModel's config.json and tensor names.
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

static bb_status gpt2_read_config(const json_t *cfg, const char *path, bb_model_config *c, int *positions)
{
    bb_status rc = BB_OK;
    const char *act = json_string_value(json_object_get(cfg, "activation_function"));
    int layers = 0, heads = 0, d = 0, vocab = 0, inner = 0;
    if (act && strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh"))
        rc = bb_fail(BB_ERR_FORMAT, "%s: activation_function %s: bigbatch's gpt has GPT-2's tanh GELU (gelu_new)",
                     path, act);
    if (rc == BB_OK) rc = bb_hf_config_int(cfg, path, "n_layer", -1, &layers);
    if (rc == BB_OK) rc = bb_hf_config_int(cfg, path, "n_head", -1, &heads);
    if (rc == BB_OK) rc = bb_hf_config_int(cfg, path, "n_embd", -1, &d);
    if (rc == BB_OK) rc = bb_hf_config_int(cfg, path, "vocab_size", -1, &vocab);
    if (rc == BB_OK) rc = bb_hf_config_int(cfg, path, "n_positions", -1, positions);
    if (rc == BB_OK) rc = bb_hf_config_int(cfg, path, "n_inner", 4 * d, &inner);
    if (rc == BB_OK && d % heads)
        rc = bb_fail(BB_ERR_FORMAT, "%s: n_head %d does not divide n_embd %d (the heads split the width)", path, heads,
                     d);
    if (rc == BB_OK && inner != 4 * d)
        rc = bb_fail(BB_ERR_FORMAT, "%s: n_inner is %d: bigbatch's gpt has an MLP of 4 x n_embd (%d)", path, inner,
                     4 * d);
    double eps = bb_json_number_or_nan(cfg, "layer_norm_epsilon");
    if (rc == BB_OK && !isnan(eps) && fabs(eps - 1e-5) > 1e-12)
        rc = bb_fail(BB_ERR_FORMAT, "%s: layer_norm_epsilon is %g: bigbatch's LayerNorm has 1e-05", path, eps);
    if (rc == BB_OK) rc = bb_hf_config_bool(cfg, path, "tie_word_embeddings", true, "gpt");
    if (rc == BB_OK) rc = bb_hf_config_bool(cfg, path, "scale_attn_weights", true, "gpt");
    if (rc == BB_OK) rc = bb_hf_config_bool(cfg, path, "scale_attn_by_inverse_layer_idx", false, "gpt");
    if (rc == BB_OK) rc = bb_hf_config_bool(cfg, path, "add_cross_attention", false, "gpt");
    if (rc == BB_OK) *c = bb_model_gpt_config(layers, heads, d, *positions, vocab);
    return rc;
}

static json_t *gpt2_write_config(const bb_model_config *c, int eos)
{
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
    return cfg;
}

static const char *gpt2_alias(const char *name)
{
    return strncmp(name, "transformer.", 12) ? NULL : name + strlen("transformer.");
}

/* The causal-mask buffers some files hold. */
static bool gpt2_skipped(const char *n)
{
    const char *dot = strrchr(n, '.');
    return dot && (!strcmp(dot, ".bias") || !strcmp(dot, ".masked_bias")) && strstr(n, ".attn.") &&
           !strstr(n, "c_attn") && !strstr(n, "c_proj");
}

const bb_hf_layout bb_hf_gpt2 = {
    .model_type = "gpt2",
    .architecture = "GPT2LMHeadModel",
    .positions_key = "n_positions",
    .read_config = gpt2_read_config,
    .write_config = gpt2_write_config,
    .alias = gpt2_alias,
    .transposed = is_conv1d,
    .skipped = gpt2_skipped,
    .positions_tensor = "transformer.wpe.weight",
};
