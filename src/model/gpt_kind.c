/* gpt_kind.c — the gpt's kind descriptor: its configuration, JSON and
 * batches; the passes are gpt.c's, the activations' layout gpt_layout.c's. */
#include <stdlib.h>
#include <string.h>

#include "gpt_internal.h"

bb_model_config bb_model_gpt_config(int layers, int heads, int d_model, int seq_len, int vocab)
{
    return (bb_model_config){.kind = &bb_model_kind_gpt, .layers = layers, .heads = heads, .d_model = d_model,
                             .seq_len = seq_len, .vocab = vocab};
}

static bb_status gpt_from_flags(const bb_model_flags *f, bb_model_config *out)
{
    if (f->hidden_count) return bb_fail(BB_ERR_ARG, "--hidden sizes an mlp's layers; this is a gpt (--model mlp?)");
    *out = bb_model_gpt_config((int)f->layers, (int)f->heads, (int)f->d_model, 0, 0);
    return BB_OK;
}

static bb_status gpt_from_data(bb_model_config *c, const bb_shard_meta *meta, const char *path)
{
    if (meta->kind != BB_RECORD_TOKENS_U16 && meta->kind != BB_RECORD_TOKENS_U32)
        return bb_fail(BB_ERR_ARG, "%s holds %s records; --model gpt needs token records", path,
                       bb_record_kind_name(meta->kind));
    c->seq_len = (int)meta->shape[0] - 1;
    c->vocab = (int)meta->classes_or_vocab;
    return BB_OK;
}

static void gpt_describe(const bb_model_config *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "gpt (%d layer%s, %d head%s, d %d, T %d, vocab %d)", c->layers, c->layers > 1 ? "s" : "",
             c->heads, c->heads > 1 ? "s" : "", c->d_model, c->seq_len, c->vocab);
}

static bool gpt_same_shape(const bb_model_config *a, const bb_model_config *b)
{
    return a->layers == b->layers && a->heads == b->heads && a->d_model == b->d_model && a->seq_len == b->seq_len &&
           a->vocab == b->vocab;
}

static int gpt_layers(const bb_model_config *c) { return c->layers; }
static int gpt_tokens(const bb_model_config *c) { return c->seq_len; }
static int gpt_outputs(const bb_model_config *c) { return c->vocab; }

static int gpt_to_json(json_t *obj, const bb_model_config *c)
{
    return json_object_update_new(obj, json_pack("{s:i, s:i, s:i, s:i, s:i}", "layers", c->layers, "heads", c->heads,
                                             "d_model", c->d_model, "seq_len", c->seq_len, "vocab", c->vocab));
}

static bb_status gpt_from_json(const json_t *obj, const char *file, bb_model_config *c)
{
    BB_TRY(bb_json_req_int(obj, file, "layers", &c->layers));
    BB_TRY(bb_json_req_int(obj, file, "heads", &c->heads));
    BB_TRY(bb_json_req_int(obj, file, "d_model", &c->d_model));
    BB_TRY(bb_json_req_int(obj, file, "seq_len", &c->seq_len));
    return bb_json_req_int(obj, file, "vocab", &c->vocab);
}

/* the widest records it takes: T + 1 u32 tokens */
static size_t gpt_record_bytes(const bb_model_config *c) { return ((size_t)c->seq_len + 1) * 4; }

static bb_status gpt_check_records(const bb_model_config *c, const bb_shard_meta *meta, const uint8_t *records,
                                   int count, int *width)
{
    int T = c->seq_len;
    *width = meta->kind == BB_RECORD_TOKENS_U16 ? 2 : meta->kind == BB_RECORD_TOKENS_U32 ? 4 : 0;
    if (!*width || meta->shape[0] != (uint32_t)T + 1) {
        char shape[64] = "";
        for (uint32_t i = 0; i < meta->rank && i < 4; i++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%u", i ? "x" : "", meta->shape[i]);
        return bb_fail(BB_ERR_ARG, "this gpt (T %d) takes token records of %d tokens, not %s records of %s", T, T + 1,
                       bb_record_kind_name(meta->kind), shape);
    }
    size_t tokens = (size_t)count * (T + 1);
    uint32_t top = 0;
    if (*width == 2)
        for (size_t i = 0; i < tokens; i++) {
            uint32_t v = (uint32_t)(records[2 * i] | records[2 * i + 1] << 8);
            top = v > top ? v : top;
        }
    else
        for (size_t i = 0; i < tokens; i++) {
            const uint8_t *p = records + 4 * i;
            uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            top = v > top ? v : top;
        }
    if (top >= (uint32_t)c->vocab) return bb_fail(BB_ERR_ARG, "token %u is not below the vocabulary %d", top, c->vocab);
    return BB_OK;
}

static bb_status gpt_check_inputs(const bb_model_config *c, const void *inputs, size_t n)
{
    const int32_t *tokens = inputs;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab)
            return bb_fail(BB_ERR_ARG, "token %d at position %zu is not below the vocabulary %d", tokens[i], i,
                           c->vocab);
    return BB_OK;
}

static void gpt_convert(bb_model_t *m, void *inputs, int32_t *targets, const uint8_t *records, int count, int width)
{
    bb_op_records_to_tokens(m->be, inputs, targets, records, count, m->B, m->cfg.seq_len, width);
}

const bb_model_kind bb_model_kind_gpt = {
    .name = "gpt",
    .takes = "tokens",
    .from_flags = gpt_from_flags,
    .from_data = gpt_from_data,
    .describe = gpt_describe,
    .same_shape = gpt_same_shape,
    .layers = gpt_layers,
    .targets_per_example = gpt_tokens,
    .outputs = gpt_outputs,
    .targets_are_tokens = true,
    .chunks_loss = true,
    .checkpoint_plans = true,
    .block_costs = bb_gpt_block_costs,
    .tied_head = "lm_head.weight",
    .hf_model_type = "gpt2",
    .to_json = gpt_to_json,
    .from_json = gpt_from_json,
    .inputs_per_example = gpt_tokens,
    .input_size = sizeof(int32_t),
    .input_name = "tokens",
    .record_bytes = gpt_record_bytes,
    .check_records = gpt_check_records,
    .check_inputs = gpt_check_inputs,
    .convert = gpt_convert,
    .create = bb_gpt_create,
    .init = bb_gpt_init,
    .forward = bb_gpt_forward,
    .logits = bb_gpt_logits,
    .decode = bb_gpt_decode,
    .backward = bb_gpt_backward,
    .destroy = bb_gpt_destroy,
};
