/* llama.c — the Llama-family decoder (Llama 2 and 3, SmolLM, TinyLlama,
 * Mistral-style dense): pre-RMSNorm blocks, rotary positions on q and k,
 * grouped-query attention, a SwiGLU MLP, no biases, an LM head of its own
 * or tied to the token table. The kind: its configuration, presets, JSON
 * and initialisation, and its block for the decoder stack (decoder.h),
 * which does the rest (segments, recompute, bf16, the head, decoding).
 *
 * Tensors carry transformers' LlamaForCausalLM names. q, k and v are three
 * tensors next to each other in the parameters, so they are one matrix of
 * (heads + 2 kv_heads) · head-size rows and one product; gate and up are
 * one matrix of 2 · ffn rows the same way.
 *
 * A block saves, per token: RMSNorm 1's output, qkv (q and k rotated),
 * the attention output, the residual, RMSNorm 2's output, gate|up (2 ffn;
 * at least qkv wide: its backward writes d(qkv) there), SwiGLU's output
 * (ffn) and the block's output, and heads + 2 statistics; a selective block
 * drops both RMSNorm outputs (one shared buffer) and SwiGLU's output. The
 * position table holds each position's RoPE cosines and sines (head-size
 * floats), made once on the host as transformers makes them, in fp32. */
#include <math.h>
#include <string.h>

#include "decoder.h"

enum { N1_W, Q_W, K_W, V_W, O_W, N2_W, GATE_W, UP_W, DOWN_W, PER_BLOCK };
enum { EMBED = 0 };
enum { S_N1, S_QKV, S_ATTY, S_RES2, S_N2, S_GU, S_H, S_OUT, SAVED };
enum { LSE, RSTD1, RSTD2, STATS };
enum { MAX_HEAD = 2048 }; /* floats of a head (the position table's rows) */

#define F(p) bb_f32(p)

/* ---- the configuration ---------------------------------------------------- */
int bb_llama_ffn(int d_model)
{
    int hidden = 2 * (4 * d_model) / 3;
    return (hidden + 255) / 256 * 256;
}

bb_model_config bb_model_llama_config(int layers, int heads, int d_model, int seq_len, int vocab)
{
    return (bb_model_config){.kind = &bb_model_kind_llama,
                             .llama = {.layers = layers, .heads = heads, .kv_heads = heads, .d_model = d_model,
                                       .ffn = bb_llama_ffn(d_model), .seq_len = seq_len, .vocab = vocab,
                                       .rope_theta = 10000.0, .norm_eps = 1e-6}};
}

/* Their published config.json's (the hub's), T left to the data or --seq-len. */
static const struct {
    const char *name;
    bb_llama_config c;
} presets[] = {
    {"smollm2-135m", {.layers = 30, .heads = 9, .kv_heads = 3, .d_model = 576, .ffn = 1536, .vocab = 49152,
                      .tied = true, .rope_theta = 100000.0, .norm_eps = 1e-5}},
    {"smollm2-360m", {.layers = 32, .heads = 15, .kv_heads = 5, .d_model = 960, .ffn = 2560, .vocab = 49152,
                      .tied = true, .rope_theta = 100000.0, .norm_eps = 1e-5}},
    {"tinyllama-1.1b", {.layers = 22, .heads = 32, .kv_heads = 4, .d_model = 2048, .ffn = 5632, .vocab = 32000,
                        .rope_theta = 10000.0, .norm_eps = 1e-5}},
    {"llama-3.2-1b", {.layers = 16, .heads = 32, .kv_heads = 8, .d_model = 2048, .ffn = 8192, .vocab = 128256,
                      .tied = true, .rope_theta = 500000.0, .norm_eps = 1e-5, .rope_factor = 32.0,
                      .rope_low_freq_factor = 1.0, .rope_high_freq_factor = 4.0, .rope_original_positions = 8192}},
    {"llama-3.2-3b", {.layers = 28, .heads = 24, .kv_heads = 8, .d_model = 3072, .ffn = 8192, .vocab = 128256,
                      .tied = true, .rope_theta = 500000.0, .norm_eps = 1e-5, .rope_factor = 32.0,
                      .rope_low_freq_factor = 1.0, .rope_high_freq_factor = 4.0, .rope_original_positions = 8192}},
    {"llama-3.1-8b", {.layers = 32, .heads = 32, .kv_heads = 8, .d_model = 4096, .ffn = 14336, .vocab = 128256,
                      .rope_theta = 500000.0, .norm_eps = 1e-5, .rope_factor = 8.0, .rope_low_freq_factor = 1.0,
                      .rope_high_freq_factor = 4.0, .rope_original_positions = 8192}},
};
enum { PRESETS = sizeof presets / sizeof *presets };

const char *bb_llama_preset_choices(void)
{
    return "smollm2-135m|smollm2-360m|tinyllama-1.1b|llama-3.2-1b|llama-3.2-3b|llama-3.1-8b";
}

bool bb_llama_preset(const char *name, bb_llama_config *out)
{
    for (int i = 0; i < PRESETS; i++)
        if (!strcmp(presets[i].name, name)) {
            *out = presets[i].c;
            return true;
        }
    return false;
}

bool bb_model_flags_llama_given(const bb_model_flags *f, const char **flag)
{
    *flag = f->preset_given ? "--preset" : f->kv_heads_given ? "--kv-heads" : f->ffn_given ? "--ffn"
          : f->rope_theta_given ? "--rope-theta" : f->norm_eps_given ? "--norm-eps"
          : f->tie_given ? "--tie-embeddings" : NULL;
    return *flag != NULL;
}

/* The preset (or transformers' defaults), then each flag given over it. */
static bb_status llama_from_flags(const bb_model_flags *f, bb_model_config *out)
{
    if (f->hidden_count) return bb_fail(BB_ERR_ARG, "--hidden sizes an mlp's layers; this is a llama (--model mlp?)");
    *out = bb_model_llama_config((int)f->layers, (int)f->heads, (int)f->d_model, 0, 0);
    bb_llama_config *c = &out->llama;
    if (f->preset_given) {
        if (!bb_llama_preset(f->preset, c))
            return bb_fail(BB_ERR_ARG, "--preset %s is not one of %s", f->preset, bb_llama_preset_choices());
        if (f->layers_given) c->layers = (int)f->layers;
        if (f->heads_given) c->heads = c->kv_heads = (int)f->heads;
        if (f->d_model_given) c->d_model = (int)f->d_model;
    }
    if (!f->preset_given && f->d_model_given) c->ffn = bb_llama_ffn(c->d_model);
    if (f->kv_heads_given) c->kv_heads = (int)f->kv_heads;
    if (f->ffn_given) c->ffn = (int)f->ffn;
    if (f->rope_theta_given) c->rope_theta = f->rope_theta;
    if (f->norm_eps_given) c->norm_eps = f->norm_eps;
    if (f->tie_given) c->tied = !strcmp(f->tie, "yes");
    return BB_OK;
}

/* T from the data; its vocabulary too, unless a preset gave one (which must hold the data's ids). */
static bb_status llama_from_data(bb_model_config *c, const bb_record_format *f, const char *path)
{
    int vocab;
    BB_TRY(bb_decoder_token_shape(f, path, "llama", &c->llama.seq_len, &vocab));
    if (c->llama.vocab && vocab > c->llama.vocab)
        return bb_fail(BB_ERR_ARG, "%s has a vocabulary of %d tokens, more than the llama's %d", path, vocab,
                       c->llama.vocab);
    if (!c->llama.vocab) c->llama.vocab = vocab;
    return BB_OK;
}

static void llama_describe(const bb_model_config *c, char *buf, size_t cap)
{
    const bb_llama_config *g = &c->llama;
    snprintf(buf, cap, "llama (%d layer%s, %d head%s / %d kv, d %d, ffn %d, T %d, vocab %d%s)", g->layers,
             g->layers > 1 ? "s" : "", g->heads, g->heads > 1 ? "s" : "", g->kv_heads, g->d_model, g->ffn, g->seq_len,
             g->vocab, g->tied ? ", tied" : "");
}

static bool llama_same_shape(const bb_model_config *a, const bb_model_config *b)
{
    const bb_llama_config *x = &a->llama, *y = &b->llama;
    return x->layers == y->layers && x->heads == y->heads && x->kv_heads == y->kv_heads && x->d_model == y->d_model &&
           x->ffn == y->ffn && x->seq_len == y->seq_len && x->vocab == y->vocab && x->tied == y->tied &&
           x->rope_theta == y->rope_theta && x->norm_eps == y->norm_eps && x->rope_factor == y->rope_factor &&
           x->rope_low_freq_factor == y->rope_low_freq_factor &&
           x->rope_high_freq_factor == y->rope_high_freq_factor &&
           x->rope_original_positions == y->rope_original_positions;
}

static int llama_to_json(json_t *obj, const bb_model_config *c)
{
    const bb_llama_config *g = &c->llama;
    json_t *v = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:f, s:f}", "layers", g->layers, "heads", g->heads,
                          "kv_heads", g->kv_heads, "d_model", g->d_model, "ffn", g->ffn, "seq_len", g->seq_len,
                          "vocab", g->vocab, "tied", g->tied, "rope_theta", g->rope_theta, "norm_eps",
                          g->norm_eps);
    if (v && g->rope_factor > 0 &&
        json_object_set_new(v, "rope_scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor",
                                      g->rope_factor, "low_freq_factor", g->rope_low_freq_factor,
                                      "high_freq_factor", g->rope_high_freq_factor,
                                      "original_max_position_embeddings", g->rope_original_positions))) {
        json_decref(v);
        v = NULL;
    }
    return json_object_update_new(obj, v);
}

static bb_status llama_from_json(const json_t *obj, const char *file, bb_model_config *c)
{
    bb_llama_config *g = &c->llama;
    const char *ints[] = {"layers", "heads", "kv_heads", "d_model", "ffn", "seq_len", "vocab"};
    int *dst[] = {&g->layers, &g->heads, &g->kv_heads, &g->d_model, &g->ffn, &g->seq_len, &g->vocab};
    for (int i = 0; i < 7; i++) BB_TRY(bb_json_req_int(obj, file, ints[i], dst[i]));
    const json_t *tied = json_object_get(obj, "tied");
    if (!json_is_boolean(tied)) return bb_fail(BB_ERR_FORMAT, "%s: tied is missing or not a boolean", file);
    g->tied = json_is_true(tied);
    BB_TRY(bb_json_req_double(obj, file, "rope_theta", &g->rope_theta));
    BB_TRY(bb_json_req_double(obj, file, "norm_eps", &g->norm_eps));
    const json_t *rs = json_object_get(obj, "rope_scaling");
    if (!rs) return BB_OK;
    BB_TRY(bb_json_req_double(rs, file, "factor", &g->rope_factor));
    BB_TRY(bb_json_req_double(rs, file, "low_freq_factor", &g->rope_low_freq_factor));
    BB_TRY(bb_json_req_double(rs, file, "high_freq_factor", &g->rope_high_freq_factor));
    return bb_json_req_int(rs, file, "original_max_position_embeddings", &g->rope_original_positions);
}

static int head_size(const bb_llama_config *g) { return g->heads ? g->d_model / g->heads : 0; }
static int qkv_width(const bb_llama_config *g) { return (g->heads + 2 * g->kv_heads) * head_size(g); }

static void llama_dims(const bb_model_config *c, bb_decoder_dims *out)
{
    *out = (bb_decoder_dims){.layers = c->llama.layers, .seq_len = c->llama.seq_len, .d_model = c->llama.d_model,
                             .vocab = c->llama.vocab, .kv_width = c->llama.kv_heads * head_size(&c->llama)};
}

static bb_status llama_check(const bb_model_config *c)
{
    const bb_llama_config *g = &c->llama;
    if (g->layers < 1 || g->heads < 1 || g->kv_heads < 1 || g->d_model < 1 || g->ffn < 1 || g->seq_len < 1 ||
        g->vocab < 1)
        return bb_fail(BB_ERR_ARG, "llama needs positive --layers, --heads, --kv-heads, --d-model, --ffn, --seq-len "
                       "and a vocabulary");
    if (g->d_model % g->heads)
        return bb_fail(BB_ERR_ARG, "--d-model %d is not divisible by --heads %d", g->d_model, g->heads);
    if (g->heads % g->kv_heads)
        return bb_fail(BB_ERR_ARG, "--kv-heads %d does not divide --heads %d (each key/value head serves a group of "
                       "query heads)", g->kv_heads, g->heads);
    if ((g->d_model / g->heads) % 2 || g->d_model / g->heads > MAX_HEAD)
        return bb_fail(BB_ERR_ARG, "the head size %d (--d-model / --heads) is odd or above %d: RoPE turns pairs of it",
                       g->d_model / g->heads, MAX_HEAD);
    if (!(g->rope_theta > 1) || !(g->norm_eps > 0))
        return bb_fail(BB_ERR_ARG, "--rope-theta must be above 1 and --norm-eps above 0");
    if (g->rope_factor > 0 && (!(g->rope_high_freq_factor > g->rope_low_freq_factor) ||
                               !(g->rope_low_freq_factor > 0) || g->rope_original_positions < 1))
        return bb_fail(BB_ERR_ARG, "llama3 rope scaling needs high_freq_factor > low_freq_factor > 0 and "
                       "original_max_position_embeddings >= 1");
    return BB_OK;
}

/* ---- tensors, positions and initialisation --------------------------------- */
static bb_status add_stem_tensors(bb_model_t *m)
{
    return bb_model_add_tensor(m, "model.embed_tokens.weight", m->cfg.llama.vocab, m->cfg.llama.d_model, true);
}

static bb_status add_block_tensors(bb_model_t *m, int l)
{
    const bb_llama_config *g = &m->cfg.llama;
    int C = g->d_model, kv = g->kv_heads * head_size(g);
    const struct {
        const char *name;
        int rows, cols; /* cols 0: a vector */
    } block[PER_BLOCK] = {
        {"input_layernorm.weight", C, 0},   {"self_attn.q_proj.weight", C, C}, {"self_attn.k_proj.weight", kv, C},
        {"self_attn.v_proj.weight", kv, C}, {"self_attn.o_proj.weight", C, C}, {"post_attention_layernorm.weight", C, 0},
        {"mlp.gate_proj.weight", g->ffn, C}, {"mlp.up_proj.weight", g->ffn, C}, {"mlp.down_proj.weight", C, g->ffn},
    };
    for (int k = 0; k < PER_BLOCK; k++) {
        char name[80];
        snprintf(name, sizeof name, "model.layers.%d.%s", l, block[k].name);
        BB_TRY(bb_model_add_tensor(m, name, block[k].rows, block[k].cols, block[k].cols != 0));
        /* k and v: one product with q; up: one with gate */
        m->tensors[m->tensor_count - 1].joined = k == 2 || k == 3 || k == 7;
        m->tensors[m->tensor_count - 1].hidden = block[k].cols != 0;
    }
    return BB_OK;
}

static bb_status add_final_tensors(bb_model_t *m)
{
    const bb_llama_config *g = &m->cfg.llama;
    BB_TRY(bb_model_add_tensor(m, "model.norm.weight", g->d_model, 0, false));
    return g->tied ? BB_OK : bb_model_add_tensor(m, "lm_head.weight", g->vocab, g->d_model, true);
}

static const char *llama_tied_head(const bb_model_config *c) { return c->llama.tied ? "lm_head.weight" : NULL; }

/* transformers' inverse frequencies, in fp32 as it computes them, with
 * Llama 3's scaling where the configuration has it. */
static void inverse_frequencies(const bb_llama_config *g, float *inv)
{
    int HS = head_size(g);
    const float pi = 3.14159265358979323846f;
    for (int i = 0; i < HS / 2; i++) {
        float f = 1.0f / powf((float)g->rope_theta, (float)(2 * i) / (float)HS);
        if (g->rope_factor > 0) {
            float factor = (float)g->rope_factor, low = (float)g->rope_low_freq_factor;
            float old = (float)g->rope_original_positions, wavelen = 2.0f * pi / f;
            float low_wavelen = (float)(g->rope_original_positions / g->rope_low_freq_factor);
            float high_wavelen = (float)(g->rope_original_positions / g->rope_high_freq_factor);
            float scaled = wavelen > low_wavelen ? f / factor : f;
            float smooth = (old / wavelen - low) / (float)(g->rope_high_freq_factor - g->rope_low_freq_factor);
            if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen))
                scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
            f = scaled;
        }
        inv[i] = f;
    }
}

/* Per position: the head's HS/2 cosines, then its HS/2 sines. */
static size_t llama_position_table(const bb_model_config *c, float *host)
{
    const bb_llama_config *g = &c->llama;
    int HS = head_size(g), half = HS / 2;
    if (!host) return (size_t)HS;
    float inv[MAX_HEAD / 2];
    inverse_frequencies(g, inv);
    for (int p = 0; p < g->seq_len; p++)
        for (int i = 0; i < half; i++) {
            float angle = (float)p * inv[i];
            host[(size_t)p * HS + i] = cosf(angle);
            host[(size_t)p * HS + half + i] = sinf(angle);
        }
    return (size_t)HS;
}

/* transformers' LlamaPreTrainedModel: normal 0.02 for every matrix, RMSNorm weights 1. */
static bb_status llama_init(bb_model_t *m, uint64_t seed, float *host)
{
    init_rng r = {seed};
    for (int i = 0; i < m->tensor_count; i++) {
        const bb_tensor_info *t = &m->tensors[i];
        float *p = host + t->offset;
        for (size_t j = 0; j < t->count; j++) p[j] = t->rank == 2 ? bb_init_normal(&r, 0.02f) : 1.0f;
    }
    return BB_OK;
}

/* ---- the stem and the final norm ----------------------------------------- */
static void llama_embed(bb_model_t *m, bb_tensor out, const int32_t *tokens, int B, int T, int pos0)
{
    (void)pos0; /* positions enter through RoPE */
    bb_op_embedding_forward(m->be, out, tokens, F(model_param(m, EMBED)), bb_no_tensor(), B, T, m->cfg.llama.d_model);
}

static void llama_embed_backward(bb_model_t *m, bb_tensor dout, const int32_t *tokens, bool acc, bool started)
{
    const bb_llama_config *g = &m->cfg.llama;
    bb_op_embedding_backward(m->be, F(model_grad(m, EMBED)), bb_no_tensor(), dout, tokens, m->B, g->seq_len,
                             g->d_model, g->vocab, g->seq_len, started || acc, acc);
}

static void llama_norm_forward(bb_model_t *m, bb_tensor out, float *const *stats, bb_tensor in, int n)
{
    bb_op_rmsnorm_forward(m->be, out, stats[0], in, F(model_param(m, bb_decoder_final_tensor(m))), n,
                          m->cfg.llama.d_model, (float)m->cfg.llama.norm_eps);
}

/* RMSNorm's backward adds into din: it starts from zero. */
static bb_status llama_norm_backward(bb_model_t *m, bb_tensor din, bb_tensor dout, bb_tensor in, float *const *stats,
                                     int n, bool acc)
{
    int w = bb_decoder_final_tensor(m), C = m->cfg.llama.d_model;
    BB_TRY(bb_backend_memset(m->be, din.data, 0, (size_t)n * C * bb_dtype_size(din.dtype)));
    bb_op_rmsnorm_backward(m->be, din, F(model_grad(m, w)), dout, in, F(model_param(m, w)), stats[0], n, C, acc);
    return BB_OK;
}

/* ---- the block ------------------------------------------------------------ */
static void llama_layout(const bb_model_config *c, bb_block_layout *out)
{
    const bb_llama_config *g = &c->llama;
    int C = g->d_model, QKV = qkv_width(g), GU = 2 * g->ffn > QKV ? 2 * g->ffn : QKV;
    const struct {
        int width;
        bool dropped;
    } saved[SAVED] = {[S_N1] = {C, true},   [S_QKV] = {QKV, false}, [S_ATTY] = {C, false}, [S_RES2] = {C, false},
                      [S_N2] = {C, true},   [S_GU] = {GU, false},   [S_H] = {g->ffn, true}, [S_OUT] = {C, false}};
    *out = (bb_block_layout){.saved = SAVED, .stats = STATS};
    for (int k = 0; k < SAVED; k++) {
        out->width[k] = saved[k].width;
        out->dropped |= (unsigned)saved[k].dropped << k;
        out->reuse[k] = -1;
    }
    out->reuse[S_N2] = S_N1; /* RMSNorm 2's output is dead before RMSNorm 1's is recomputed */
    out->stat_width[LSE] = g->heads;
    out->stat_width[RSTD1] = out->stat_width[RSTD2] = 1;
}

#define CFG(p) (&(p)->m->cfg.llama)
#define W(k) F(model_param(p->m, p->tensor + (k)))
#define PW(k) model_weight(p->m, p->tensor + (k))
#define D(k) F(model_grad(p->m, p->tensor + (k)))

static void norm1_forward(bb_block_pass *p)
{
    bb_op_rmsnorm_forward(p->be, p->a->t[S_N1], p->a->stat[RSTD1], p->x, W(N1_W), p->BT, CFG(p)->d_model,
                          (float)CFG(p)->norm_eps);
}

static void norm2_forward(bb_block_pass *p)
{
    bb_op_rmsnorm_forward(p->be, p->a->t[S_N2], p->a->stat[RSTD2], p->a->t[S_RES2], W(N2_W), p->BT, CFG(p)->d_model,
                          (float)CFG(p)->norm_eps);
}

static void llama_block_forward(bb_block_pass *p)
{
    const bb_llama_config *c = CFG(p);
    bb_backend_t *be = p->be;
    bb_block_acts *a = p->a;
    int C = c->d_model, BT = p->BT, HS = head_size(c), QKV = qkv_width(c), Fw = c->ffn;
    norm1_forward(p);
    bb_op_linear_forward(be, a->t[S_QKV], a->t[S_N1], PW(Q_W), bb_no_tensor(), BT, C, QKV, QKV);
    bb_op_rope_forward(be, a->t[S_QKV], p->positions, p->B, p->T, c->heads, c->kv_heads, HS, 0);
    bb_op_attention_forward(be, a->t[S_ATTY], a->stat[LSE], a->t[S_QKV], p->B, p->T, c->heads, c->kv_heads, HS);
    bb_op_linear_forward(be, a->t[S_RES2], a->t[S_ATTY], PW(O_W), bb_no_tensor(), BT, C, C, C);
    bb_op_residual_rmsnorm_forward(be, a->t[S_RES2], a->t[S_N2], a->stat[RSTD2], a->t[S_RES2], p->x, W(N2_W), BT, C,
                                   (float)c->norm_eps);
    bb_op_linear_forward(be, a->t[S_GU], a->t[S_N2], PW(GATE_W), bb_no_tensor(), BT, C, 2 * Fw, 2 * Fw);
    bb_op_swiglu_forward(be, a->t[S_H], a->t[S_GU], BT, Fw);
    bb_op_linear_forward(be, a->t[S_OUT], a->t[S_H], PW(DOWN_W), bb_no_tensor(), BT, Fw, C, C);
    bb_op_add(be, a->t[S_OUT], a->t[S_OUT], a->t[S_RES2], (size_t)BT * C);
}

/* dres holds d(loss)/d(block output) on entry, d(loss)/d(block input) on
 * exit. The slot is spent as it goes: d(SwiGLU output) overwrites that
 * output once the down product's weight gradient is formed, d(gate|up)
 * overwrites gate|up in place, and d(qkv) (rotated back by RoPE's
 * inverse) takes gate|up's place. A selective block recomputes SwiGLU's
 * output and both RMSNorm outputs right before they are read, unless its
 * forward ran last and left them (RMSNorm 1's shares RMSNorm 2's buffer:
 * always recomputed). */
static void llama_block_backward(bb_block_pass *p)
{
    const bb_llama_config *c = CFG(p);
    bb_backend_t *be = p->be;
    bb_block_acts *a = p->a;
    int C = c->d_model, BT = p->BT, HS = head_size(c), QKV = qkv_width(c), Fw = c->ffn;
    bool acc = p->accumulate, recompute = p->selective && !p->fresh;
    bb_tensor dqkv = a->t[S_GU];
    if (recompute) bb_op_swiglu_forward(be, a->t[S_H], a->t[S_GU], BT, Fw);
    bb_op_linear_backward(be, a->t[S_H], D(DOWN_W), bb_no_tensor(), p->dres, a->t[S_H], PW(DOWN_W), BT, Fw, C, C, acc);
    bb_op_swiglu_backward(be, a->t[S_GU], a->t[S_H], a->t[S_GU], BT, Fw);
    if (recompute) norm2_forward(p);
    bb_op_linear_backward(be, p->dln, D(GATE_W), bb_no_tensor(), a->t[S_GU], a->t[S_N2], PW(GATE_W), BT, C, 2 * Fw,
                          2 * Fw, acc);
    bb_op_rmsnorm_backward(be, p->dres, D(N2_W), p->dln, a->t[S_RES2], W(N2_W), a->stat[RSTD2], BT, C, acc);
    bb_op_linear_backward(be, p->dln, D(O_W), bb_no_tensor(), p->dres, a->t[S_ATTY], PW(O_W), BT, C, C, C, acc);
    bb_op_attention_backward(be, dqkv, p->dln, a->t[S_QKV], a->t[S_ATTY], a->stat[LSE], p->B, p->T, c->heads,
                             c->kv_heads, HS);
    bb_op_rope_backward(be, dqkv, p->positions, p->B, p->T, c->heads, c->kv_heads, HS, 0);
    if (p->selective && (!p->fresh || a->t[S_N1].data == a->t[S_N2].data)) norm1_forward(p);
    bb_op_linear_backward(be, p->dln, D(Q_W), bb_no_tensor(), dqkv, a->t[S_N1], PW(Q_W), BT, C, QKV, QKV, acc);
    bb_op_rmsnorm_backward(be, p->dres, D(N1_W), p->dln, p->x, W(N1_W), a->stat[RSTD1], BT, C, acc);
}
#undef W
#undef PW
#undef D
#undef CFG

/* ---- decoding: a position caches its keys and values (kv_heads wide) ------- */
/* One row each: RMSNorm output, q|k|v, attention output, residual,
 * gate|up, SwiGLU output, 1/rms, then the scores (heads × T); 64-float
 * aligned. */
enum { D_N, D_QKV, D_ATT, D_RES2, D_GU, D_H, D_RSTD, D_SCORES, D_PARTS };
static void decode_offsets(const bb_model_config *c, size_t at[D_PARTS + 1])
{
    const bb_llama_config *g = &c->llama;
    size_t C = (size_t)g->d_model, Fw = (size_t)g->ffn;
    size_t sizes[D_PARTS] = {C, (size_t)qkv_width(g), C, C, 2 * Fw, Fw, 1, (size_t)g->heads * g->seq_len};
    at[0] = 0;
    for (int i = 0; i < D_PARTS; i++) at[i + 1] = at[i] + (sizes[i] + 63) / 64 * 64;
}

static size_t llama_decode_scratch(const bb_model_config *c)
{
    size_t at[D_PARTS + 1];
    decode_offsets(c, at);
    return at[D_PARTS];
}

#define W(k) F(model_param(d->m, d->tensor + (k)))
static void llama_block_decode(bb_block_decode *d)
{
    const bb_llama_config *c = &d->m->cfg.llama;
    bb_backend_t *be = d->be;
    int C = c->d_model, pos = d->pos, HS = head_size(c), QKV = qkv_width(c), Fw = c->ffn;
    size_t at[D_PARTS + 1];
    decode_offsets(&d->m->cfg, at);
    float *part[D_PARTS];
    for (int i = 0; i < D_PARTS; i++) part[i] = d->scratch + at[i];
    bb_tensor x = F(d->x), n = F(part[D_N]), att = F(part[D_ATT]), res2 = F(part[D_RES2]), gu = F(part[D_GU]),
              h = F(part[D_H]), qkv = F(part[D_QKV]);
    bb_op_rmsnorm_forward(be, n, part[D_RSTD], x, W(N1_W), 1, C, (float)c->norm_eps);
    bb_op_linear_forward(be, qkv, n, W(Q_W), bb_no_tensor(), 1, C, QKV, QKV);
    bb_op_rope_forward(be, qkv, d->positions, 1, 1, c->heads, c->kv_heads, HS, pos);
    bb_op_attention_decode(be, att, part[D_SCORES], F(d->rows), qkv, pos + 1, c->heads, c->kv_heads, HS);
    bb_op_linear_forward(be, res2, att, W(O_W), bb_no_tensor(), 1, C, C, C);
    bb_op_residual_rmsnorm_forward(be, res2, n, part[D_RSTD], res2, x, W(N2_W), 1, C, (float)c->norm_eps);
    bb_op_linear_forward(be, gu, n, W(GATE_W), bb_no_tensor(), 1, C, 2 * Fw, 2 * Fw);
    bb_op_swiglu_forward(be, h, gu, 1, Fw);
    bb_op_linear_forward(be, x, h, W(DOWN_W), bb_no_tensor(), 1, Fw, C, C);
    bb_op_add(be, x, x, res2, (size_t)C);
}
#undef W

static const bb_decoder_block llama_block = {
    .layout = llama_layout,
    .add_tensors = add_block_tensors,
    .forward = llama_block_forward,
    .backward = llama_block_backward,
    .decode_scratch = llama_decode_scratch,
    .decode = llama_block_decode,
};

static const bb_decoder_kind llama_decoder = {
    .dims = llama_dims,
    .check = llama_check,
    .block = &llama_block,
    .add_stem_tensors = add_stem_tensors,
    .add_final_tensors = add_final_tensors,
    .embed = llama_embed,
    .embed_backward = llama_embed_backward,
    .norm_stats = 1,
    .norm_forward = llama_norm_forward,
    .norm_backward = llama_norm_backward,
    .tied_head = llama_tied_head,
    .position_table = llama_position_table,
    .init = llama_init,
};

static void llama_scaled(const bb_model_config *c, int k, bb_model_config *out)
{
    const bb_llama_config *g = &c->llama;
    int head = g->d_model / g->heads, group = g->heads / g->kv_heads, d = k * group * head;
    double per_block = (double)g->d_model / g->layers, ffn = (double)g->ffn / g->d_model * d;
    *out = *c;
    out->llama.kv_heads = k, out->llama.heads = k * group, out->llama.d_model = d;
    out->llama.ffn = 64 * (int)((ffn + 63) / 64);
    out->llama.layers = (int)(d / per_block + 0.5) > 0 ? (int)(d / per_block + 0.5) : 1;
}

const bb_model_kind bb_model_kind_llama = {
    .name = "llama",
    .takes = "tokens",
    .from_flags = llama_from_flags,
    .from_data = llama_from_data,
    .describe = llama_describe,
    .same_shape = llama_same_shape,
    .to_json = llama_to_json,
    .from_json = llama_from_json,
    .scaled = llama_scaled,
    .family = &bb_decoder_family,
    .decoder = &llama_decoder,
    .hf = &bb_hf_llama,
};
