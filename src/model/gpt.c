/* gpt.c — the decoder-only transformer of GPT-2's shape: pre-LayerNorm
 * blocks, causal multi-head attention, a GELU MLP of 4x, learned positions,
 * tied token embedding and LM head. The kind: its configuration, JSON and
 * initialisation, and its block for the decoder stack (decoder.h), which
 * does the rest (segments, recompute, bf16, the head, decoding).
 *
 * A block saves, per token, 16 d-wide floats its backward reads (LayerNorm
 * 1, qkv 3, attention output, residual, LayerNorm 2, fc 4, GELU 4,
 * output) and 4 + heads statistics; a selective block drops the LayerNorm
 * and GELU outputs (6 of the 16: cheap to recompute, large), LayerNorm 2's
 * fp32 scratch reusing LayerNorm 1's. */
#include <math.h>
#include <string.h>

#include "decoder.h"

enum { LN1_W, LN1_B, ATTN_W, ATTN_B, PROJ_W, PROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCPROJ_W, FCPROJ_B, PER_BLOCK };
enum { WTE = 0, WPE = 1 };
/* What a block saves (the layout's order; the output last) and its statistics. */
enum { S_LN1, S_QKV, S_ATTY, S_RES2, S_LN2, S_FCH, S_GELU, S_RES3, SAVED };
enum { LSE, LN1_MEAN, LN1_RSTD, LN2_MEAN, LN2_RSTD, STATS };

#define F(p) bb_f32(p)

/* ---- the configuration ---------------------------------------------------- */
bb_model_config bb_model_gpt_config(int layers, int heads, int d_model, int seq_len, int vocab)
{
    return (bb_model_config){.kind = &bb_model_kind_gpt,
                             .gpt = {.layers = layers, .heads = heads, .d_model = d_model, .seq_len = seq_len,
                                     .vocab = vocab}};
}

static bb_status gpt_from_flags(const bb_model_flags *f, bb_model_config *out)
{
    const char *flag;
    if (f->hidden_count) return bb_fail(BB_ERR_ARG, "--hidden sizes an mlp's layers; this is a gpt (--model mlp?)");
    if (bb_model_flags_llama_given(f, &flag))
        return bb_fail(BB_ERR_ARG, "%s shapes a llama; this is a gpt (--model llama?)", flag);
    *out = bb_model_gpt_config((int)f->layers, (int)f->heads, (int)f->d_model, 0, 0);
    return BB_OK;
}

static bb_status gpt_from_data(bb_model_config *c, const bb_record_format *f, const char *path)
{
    return bb_decoder_token_shape(f, path, "gpt", &c->gpt.seq_len, &c->gpt.vocab);
}

static void gpt_describe(const bb_model_config *c, char *buf, size_t cap)
{
    const bb_gpt_config *g = &c->gpt;
    snprintf(buf, cap, "gpt (%d layer%s, %d head%s, d %d, T %d, vocab %d)", g->layers, g->layers > 1 ? "s" : "",
             g->heads, g->heads > 1 ? "s" : "", g->d_model, g->seq_len, g->vocab);
}

static bool gpt_same_shape(const bb_model_config *a, const bb_model_config *b)
{
    return !memcmp(&a->gpt, &b->gpt, sizeof a->gpt);
}

static int gpt_to_json(json_t *obj, const bb_model_config *c)
{
    const bb_gpt_config *g = &c->gpt;
    return json_object_update_new(obj, json_pack("{s:i, s:i, s:i, s:i, s:i}", "layers", g->layers, "heads", g->heads,
                                                 "d_model", g->d_model, "seq_len", g->seq_len, "vocab", g->vocab));
}

static bb_status gpt_from_json(const json_t *obj, const char *file, bb_model_config *c)
{
    BB_TRY(bb_json_req_int(obj, file, "layers", &c->gpt.layers));
    BB_TRY(bb_json_req_int(obj, file, "heads", &c->gpt.heads));
    BB_TRY(bb_json_req_int(obj, file, "d_model", &c->gpt.d_model));
    BB_TRY(bb_json_req_int(obj, file, "seq_len", &c->gpt.seq_len));
    return bb_json_req_int(obj, file, "vocab", &c->gpt.vocab);
}

static void gpt_dims(const bb_model_config *c, bb_decoder_dims *out)
{
    *out = (bb_decoder_dims){.layers = c->gpt.layers, .seq_len = c->gpt.seq_len, .d_model = c->gpt.d_model,
                             .vocab = c->gpt.vocab, .kv_width = c->gpt.d_model};
}

static bb_status gpt_check(const bb_model_config *c)
{
    const bb_gpt_config *g = &c->gpt;
    if (g->layers < 1 || g->heads < 1 || g->d_model < 1 || g->seq_len < 1 || g->vocab < 1)
        return bb_fail(BB_ERR_ARG, "gpt needs positive --layers, --heads, --d-model, --seq-len and a vocabulary");
    if (g->d_model % g->heads)
        return bb_fail(BB_ERR_ARG, "--d-model %d is not divisible by --heads %d", g->d_model, g->heads);
    return BB_OK;
}

/* ---- tensors and initialisation ------------------------------------------- */
static bb_status add_stem_tensors(bb_model_t *m)
{
    const bb_gpt_config *g = &m->cfg.gpt;
    BB_TRY(bb_model_add_tensor(m, "transformer.wte.weight", g->vocab, g->d_model, true));
    return bb_model_add_tensor(m, "transformer.wpe.weight", g->seq_len, g->d_model, true);
}

static bb_status add_block_tensors(bb_model_t *m, int l)
{
    int C = m->cfg.gpt.d_model;
    static const struct {
        const char *name;
        int rows, cols; /* in multiples of C; cols 0: a vector */
        bool decay;
    } block[PER_BLOCK] = {
        {"ln_1.weight", 1, 0, false},     {"ln_1.bias", 1, 0, false},      {"attn.c_attn.weight", 3, 1, true},
        {"attn.c_attn.bias", 3, 0, false}, {"attn.c_proj.weight", 1, 1, true}, {"attn.c_proj.bias", 1, 0, false},
        {"ln_2.weight", 1, 0, false},     {"ln_2.bias", 1, 0, false},      {"mlp.c_fc.weight", 4, 1, true},
        {"mlp.c_fc.bias", 4, 0, false},   {"mlp.c_proj.weight", 1, 4, true}, {"mlp.c_proj.bias", 1, 0, false},
    };
    for (int k = 0; k < PER_BLOCK; k++) {
        char name[64];
        snprintf(name, sizeof name, "transformer.h.%d.%s", l, block[k].name);
        BB_TRY(bb_model_add_tensor(m, name, block[k].rows * C, block[k].cols * C, block[k].decay));
        m->tensors[m->tensor_count - 1].hidden = block[k].cols != 0;
    }
    return BB_OK;
}

static bb_status add_final_tensors(bb_model_t *m)
{
    int C = m->cfg.gpt.d_model;
    BB_TRY(bb_model_add_tensor(m, "transformer.ln_f.weight", C, 0, false));
    return bb_model_add_tensor(m, "transformer.ln_f.bias", C, 0, false);
}

/* GPT-2's: normal 0.02, residual projections 0.02/sqrt(2·layers), zero
 * biases, unit LayerNorm weights. */
static bb_status gpt_init(bb_model_t *m, uint64_t seed, float *host)
{
    init_rng r = {seed};
    float proj_std = 0.02f / sqrtf(2.0f * m->cfg.gpt.layers);
    for (int i = 0; i < m->tensor_count; i++) {
        const bb_tensor_info *t = &m->tensors[i];
        float *p = host + t->offset;
        bool proj = strstr(t->name, "c_proj.weight") != NULL;
        bool norm = strstr(t->name, "ln_") != NULL && strstr(t->name, ".weight") != NULL;
        for (size_t j = 0; j < t->count; j++)
            p[j] = t->rank == 2 ? bb_init_normal(&r, proj ? proj_std : 0.02f) : norm ? 1.0f : 0.0f;
    }
    return BB_OK;
}

/* ---- the stem and the final norm ----------------------------------------- */
static void gpt_embed(bb_model_t *m, bb_tensor out, const int32_t *tokens, int B, int T, int pos0)
{
    int C = m->cfg.gpt.d_model;
    bb_op_embedding_forward(m->be, out, tokens, F(model_param(m, WTE)),
                            F(model_param(m, WPE) + (size_t)pos0 * C), B, T, C);
}

static void gpt_embed_backward(bb_model_t *m, bb_tensor dout, const int32_t *tokens, bool acc, bool wte_started)
{
    const bb_gpt_config *g = &m->cfg.gpt;
    bb_op_embedding_backward(m->be, F(model_grad(m, WTE)), F(model_grad(m, WPE)), dout, tokens, m->B, g->seq_len,
                             g->d_model, g->vocab, g->seq_len, wte_started || acc, acc);
}

static void gpt_norm_forward(bb_model_t *m, bb_tensor out, float *const *stats, bb_tensor in, int n)
{
    int lnf = bb_decoder_final_tensor(m);
    bb_op_layernorm_forward(m->be, out, stats[0], stats[1], in, F(model_param(m, lnf)), F(model_param(m, lnf + 1)),
                            n, m->cfg.gpt.d_model);
}

/* LayerNorm's backward adds into din: it starts from zero. */
static bb_status gpt_norm_backward(bb_model_t *m, bb_tensor din, bb_tensor dout, bb_tensor in, float *const *stats,
                                   int n, bool acc)
{
    int lnf = bb_decoder_final_tensor(m), C = m->cfg.gpt.d_model;
    BB_TRY(bb_backend_memset(m->be, din.data, 0, (size_t)n * C * bb_dtype_size(din.dtype)));
    bb_op_layernorm_backward(m->be, din, F(model_grad(m, lnf)), F(model_grad(m, lnf + 1)), dout, in,
                             F(model_param(m, lnf)), stats[0], stats[1], n, C, acc);
    return BB_OK;
}

/* ---- the block ------------------------------------------------------------ */
/* W: a norm's weight or a bias (fp32); PW: a product's weight (bf16 under bf16). */
static void gpt_layout(const bb_model_config *c, bb_block_layout *out)
{
    static const struct {
        int width; /* in multiples of d */
        bool dropped;
    } saved[SAVED] = {[S_LN1] = {1, true},   [S_QKV] = {3, false}, [S_ATTY] = {1, false}, [S_RES2] = {1, false},
                      [S_LN2] = {1, true},   [S_FCH] = {4, false}, [S_GELU] = {4, true},  [S_RES3] = {1, false}};
    int C = c->gpt.d_model;
    *out = (bb_block_layout){.saved = SAVED, .stats = STATS};
    for (int k = 0; k < SAVED; k++) {
        out->width[k] = saved[k].width * C;
        out->dropped |= (unsigned)saved[k].dropped << k;
        out->reuse[k] = -1;
    }
    out->reuse[S_LN2] = S_LN1; /* LayerNorm 2's output is dead before LayerNorm 1's is recomputed */
    out->stat_width[LSE] = c->gpt.heads;
    for (int s = LN1_MEAN; s < STATS; s++) out->stat_width[s] = 1;
}

#define W(k) F(model_param(p->m, p->tensor + (k)))
#define PW(k) model_weight(p->m, p->tensor + (k))
#define D(k) F(model_grad(p->m, p->tensor + (k)))

static void ln1_forward(bb_block_pass *p)
{
    bb_block_acts *a = p->a;
    bb_op_layernorm_forward(p->be, a->t[S_LN1], a->stat[LN1_MEAN], a->stat[LN1_RSTD], p->x, W(LN1_W), W(LN1_B), p->BT,
                            p->m->cfg.gpt.d_model);
}

static void ln2_forward(bb_block_pass *p)
{
    bb_block_acts *a = p->a;
    bb_op_layernorm_forward(p->be, a->t[S_LN2], a->stat[LN2_MEAN], a->stat[LN2_RSTD], a->t[S_RES2], W(LN2_W),
                            W(LN2_B), p->BT, p->m->cfg.gpt.d_model);
}

static void gelu_forward(bb_block_pass *p)
{
    bb_op_activation_forward(p->be, BB_ACTIVATION_GELU_TANH, p->a->t[S_GELU], p->a->t[S_FCH],
                             (size_t)p->BT * 4 * p->m->cfg.gpt.d_model);
}

static void gpt_block_forward(bb_block_pass *p)
{
    const bb_gpt_config *c = &p->m->cfg.gpt;
    bb_backend_t *be = p->be;
    bb_block_acts *a = p->a;
    int C = c->d_model, BT = p->BT;
    size_t n = (size_t)BT * C;
    ln1_forward(p);
    bb_op_linear_forward(be, a->t[S_QKV], a->t[S_LN1], PW(ATTN_W), W(ATTN_B), BT, C, 3 * C, 3 * C);
    bb_op_attention_forward(be, a->t[S_ATTY], a->stat[LSE], a->t[S_QKV], p->B, p->T, c->heads, c->heads,
                            C / c->heads);
    bb_op_linear_forward(be, a->t[S_RES2], a->t[S_ATTY], PW(PROJ_W), W(PROJ_B), BT, C, C, C);
    bb_op_residual_layernorm_forward(be, a->t[S_RES2], a->t[S_LN2], a->stat[LN2_MEAN], a->stat[LN2_RSTD],
                                     a->t[S_RES2], p->x, W(LN2_W), W(LN2_B), BT, C);
    bb_op_linear_activation_forward(be, BB_ACTIVATION_GELU_TANH, a->t[S_GELU], a->t[S_FCH], a->t[S_LN2], PW(FC_W),
                                    W(FC_B), BT, C, 4 * C);
    bb_op_linear_forward(be, a->t[S_RES3], a->t[S_GELU], PW(FCPROJ_W), W(FCPROJ_B), BT, 4 * C, C, C);
    bb_op_add(be, a->t[S_RES3], a->t[S_RES3], a->t[S_RES2], n);
}

/* dres holds d(loss)/d(block output) on entry, d(loss)/d(block input) on
 * exit. The block's slot is spent as it goes: d(fch) overwrites the GELU
 * output once its product's weight gradient is formed (one op with GELU's
 * backward, which reads fch), and d(qkv) takes fch's place. A selective
 * block recomputes its GELU and LayerNorm outputs right before they are
 * read (both LayerNorms share one buffer), unless its forward was
 * the last one to run and left them in place. */
static void gpt_block_backward(bb_block_pass *p)
{
    const bb_gpt_config *c = &p->m->cfg.gpt;
    bb_backend_t *be = p->be;
    bb_block_acts *a = p->a;
    int C = c->d_model, BT = p->BT;
    bool acc = p->accumulate, recompute = p->selective && !p->fresh;
    bb_tensor dfch = a->t[S_GELU], dqkv = a->t[S_FCH]; /* (BT,4C) and (BT,3C) */
    if (recompute) gelu_forward(p);
    bb_op_activation_linear_backward(be, BB_ACTIVATION_GELU_TANH, dfch, D(FCPROJ_W), D(FCPROJ_B), p->dres,
                                     a->t[S_GELU], PW(FCPROJ_W), a->t[S_FCH], BT, 4 * C, C, acc);
    if (recompute) ln2_forward(p);
    bb_op_linear_backward(be, p->dln, D(FC_W), D(FC_B), dfch, a->t[S_LN2], PW(FC_W), BT, C, 4 * C, 4 * C, acc);
    bb_op_layernorm_backward(be, p->dres, D(LN2_W), D(LN2_B), p->dln, a->t[S_RES2], W(LN2_W), a->stat[LN2_MEAN],
                             a->stat[LN2_RSTD], BT, C, acc);
    bb_op_linear_backward(be, p->dln, D(PROJ_W), D(PROJ_B), p->dres, a->t[S_ATTY], PW(PROJ_W), BT, C, C, C, acc);
    bb_op_attention_backward(be, dqkv, p->dln, a->t[S_QKV], a->t[S_ATTY], a->stat[LSE], p->B, p->T, c->heads,
                             c->heads, C / c->heads);
    if (p->selective && (!p->fresh || a->t[S_LN1].data == a->t[S_LN2].data)) ln1_forward(p);
    bb_op_linear_backward(be, p->dln, D(ATTN_W), D(ATTN_B), dqkv, a->t[S_LN1], PW(ATTN_W), BT, C, 3 * C, 3 * C, acc);
    bb_op_layernorm_backward(be, p->dres, D(LN1_W), D(LN1_B), p->dln, p->x, W(LN1_W), a->stat[LN1_MEAN],
                             a->stat[LN1_RSTD], BT, C, acc);
}
#undef W
#undef PW
#undef D

/* ---- decoding: a position caches its keys and values (2d floats) ---------- */
/* One row each: LayerNorm output, q|k|v, attention output, residual, fc 4,
 * GELU 4, mean, 1/std, then the scores (heads × T); every part 64-float
 * aligned. at[D_PARTS] is the whole scratch. */
enum { D_LN, D_QKV, D_ATT, D_RES2, D_FCH, D_GELU, D_MEAN, D_RSTD, D_SCORES, D_PARTS };
static void decode_offsets(const bb_model_config *c, size_t at[D_PARTS + 1])
{
    size_t C = (size_t)c->gpt.d_model;
    size_t sizes[D_PARTS] = {C, 3 * C, C, C, 4 * C, 4 * C, 1, 1, (size_t)c->gpt.heads * c->gpt.seq_len};
    at[0] = 0;
    for (int i = 0; i < D_PARTS; i++) at[i + 1] = at[i] + (sizes[i] + 63) / 64 * 64;
}

static size_t gpt_decode_scratch(const bb_model_config *c)
{
    size_t at[D_PARTS + 1];
    decode_offsets(c, at);
    return at[D_PARTS];
}

#define W(k) F(model_param(d->m, d->tensor + (k)))
static void gpt_block_decode(bb_block_decode *d)
{
    const bb_model_config *mc = &d->m->cfg;
    const bb_gpt_config *c = &mc->gpt;
    bb_backend_t *be = d->be;
    int C = c->d_model, pos = d->pos;
    size_t at[D_PARTS + 1];
    float *part[D_PARTS];
    decode_offsets(mc, at);
    for (int i = 0; i < D_PARTS; i++) part[i] = d->scratch + at[i];
    bb_tensor x = F(d->x), ln = F(part[D_LN]), qkv = F(part[D_QKV]), att = F(part[D_ATT]), res2 = F(part[D_RES2]),
              fch = F(part[D_FCH]), gelu = F(part[D_GELU]);
    bb_op_layernorm_forward(be, ln, part[D_MEAN], part[D_RSTD], x, W(LN1_W), W(LN1_B), 1, C);
    bb_op_linear_forward(be, qkv, ln, W(ATTN_W), W(ATTN_B), 1, C, 3 * C, 3 * C);
    bb_op_attention_decode(be, att, part[D_SCORES], F(d->rows), qkv, pos + 1, c->heads, c->heads, C / c->heads);
    bb_op_linear_forward(be, res2, att, W(PROJ_W), W(PROJ_B), 1, C, C, C);
    bb_op_residual_layernorm_forward(be, res2, ln, part[D_MEAN], part[D_RSTD], res2, x, W(LN2_W), W(LN2_B), 1, C);
    bb_op_linear_forward(be, fch, ln, W(FC_W), W(FC_B), 1, C, 4 * C, 4 * C);
    bb_op_activation_forward(be, BB_ACTIVATION_GELU_TANH, gelu, fch, (size_t)4 * C);
    bb_op_linear_forward(be, x, gelu, W(FCPROJ_W), W(FCPROJ_B), 1, 4 * C, C, C);
    bb_op_add(be, x, x, res2, (size_t)C);
}
#undef W

static const char *gpt_tied_head(const bb_model_config *c)
{
    (void)c;
    return "lm_head.weight";
}

static const bb_decoder_block gpt_block = {
    .layout = gpt_layout,
    .add_tensors = add_block_tensors,
    .forward = gpt_block_forward,
    .backward = gpt_block_backward,
    .decode_scratch = gpt_decode_scratch,
    .decode = gpt_block_decode,
};

static const bb_decoder_kind gpt_decoder = {
    .dims = gpt_dims,
    .check = gpt_check,
    .block = &gpt_block,
    .add_stem_tensors = add_stem_tensors,
    .add_final_tensors = add_final_tensors,
    .embed = gpt_embed,
    .embed_backward = gpt_embed_backward,
    .norm_stats = 2,
    .norm_forward = gpt_norm_forward,
    .norm_backward = gpt_norm_backward,
    .tied_head = gpt_tied_head,
    .init = gpt_init,
};

static void gpt_scaled(const bb_model_config *c, int k, bb_model_config *out)
{
    const bb_gpt_config *g = &c->gpt;
    int head = g->d_model / g->heads, d = k * head;
    double per_block = (double)g->d_model / g->layers;
    *out = *c;
    out->gpt.heads = k, out->gpt.d_model = d;
    out->gpt.layers = (int)(d / per_block + 0.5) > 0 ? (int)(d / per_block + 0.5) : 1;
}

const bb_model_kind bb_model_kind_gpt = {
    .name = "gpt",
    .takes = "tokens",
    .from_flags = gpt_from_flags,
    .from_data = gpt_from_data,
    .describe = gpt_describe,
    .same_shape = gpt_same_shape,
    .to_json = gpt_to_json,
    .from_json = gpt_from_json,
    .scaled = gpt_scaled,
    .family = &bb_decoder_family,
    .decoder = &gpt_decoder,
    .hf = &bb_hf_gpt2,
};
