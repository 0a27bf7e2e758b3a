/* test_model.c — the models on the CPU backend: gradients against finite
 * differences, checkpointing (bitwise-equal gradients, less activation
 * memory), the chunked LM head, gradient accumulation, safetensors and
 * batches. Parity with PyTorch is test_parity.c. */
#include <math.h>

#include "model_fixture.h"

TestSuite(model, .init = backend_up, .fini = backend_down);

enum { GPT_B = 2, GPT_T = 5, GPT_V = 11, MLP_B = 4, MLP_IN = 6, MLP_CLASSES = 3 };

static bb_model_config tiny_gpt(int layers, int recompute_every)
{
    bb_model_config c = bb_model_gpt_config(layers, 2, 8, GPT_T, GPT_V);
    c.recompute_every = recompute_every;
    return c;
}

/* Grouped-query (4 heads over 2), untied unless asked, RoPE base 500000. */
static bb_model_config tiny_llama(int layers, bool tied)
{
    bb_model_config c = bb_model_llama_config(layers, 4, 8, GPT_T, GPT_V);
    c.llama.kv_heads = 2, c.llama.ffn = 12, c.llama.tied = tied, c.llama.rope_theta = 500000.0;
    return c;
}

static bb_model_config tiny_mlp(int recompute_every)
{
    const int hidden[] = {7, 5};
    bb_model_config c = bb_model_mlp_config(MLP_IN, hidden, 2, MLP_CLASSES);
    c.recompute_every = recompute_every;
    return c;
}

static void set_batch(bb_model_t *m, int B, uint64_t seed)
{
    host_batch h = make_batch(bb_model_get_config(m), B, seed);
    cr_assert_eq(bb_model_set_batch(m, h.inputs, h.targets), BB_OK);
    free(h.inputs), free(h.targets);
}

static double loss_of(bb_model_t *m, float normalizer)
{
    double loss;
    cr_assert_eq(bb_model_forward(m, normalizer, &loss, NULL), BB_OK);
    return loss;
}

/* Central differences on a sample of every tensor's elements. */
static void check_gradients(bb_model_t *m, const char *label, float eps)
{
    float normalizer = 7.0f;
    loss_of(m, normalizer);
    cr_assert_eq(bb_model_backward(m, false), BB_OK);
    float *p = bb_model_params(m), *g = malloc(bb_model_param_count(m) * sizeof *g);
    memcpy(g, bb_model_grads(m), bb_model_param_count(m) * sizeof *g);
    double worst = 0;
    for (int t = 0; t < bb_model_tensor_count(m); t++) {
        const bb_tensor_info *ti = bb_model_tensor(m, t);
        double diff = 0, na = 0, nn = 0;
        size_t step = ti->count > 24 ? ti->count / 24 : 1;
        for (size_t i = 0; i < ti->count; i += step) {
            float *x = p + ti->offset + i, saved = *x;
            *x = saved + eps;
            double plus = loss_of(m, normalizer);
            *x = saved - eps;
            double minus = loss_of(m, normalizer);
            *x = saved;
            double numeric = (plus - minus) / (2.0 * eps), analytic = g[ti->offset + i];
            diff += (analytic - numeric) * (analytic - numeric);
            na += analytic * analytic, nn += numeric * numeric;
        }
        double rel = sqrt(diff) / fmax(fmax(sqrt(na), sqrt(nn)), 1e-9);
        printf("fd %s %-36s relative error %.2e\n", label, ti->name, rel);
        worst = fmax(worst, rel);
    }
    cr_assert_lt(worst, 2e-3, "%s: worst relative error %.3e", label, worst);
    free(g);
}

/* GPT-2's initialisation (std 0.02) leaves gradients so small that float32
 * differences drown in rounding; the check spreads the weights wider. */
static void spread_weights(bb_model_t *m)
{
    float *p = bb_model_params(m);
    uint64_t s = 99;
    for (int t = 0; t < bb_model_tensor_count(m); t++) {
        const bb_tensor_info *ti = bb_model_tensor(m, t);
        bool norm_weight = (strstr(ti->name, "ln_") || strstr(ti->name, "norm")) && strstr(ti->name, ".weight");
        for (size_t i = 0; i < ti->count; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            float u = (float)((s >> 40) % 2001) / 1000.0f - 1.0f;
            p[ti->offset + i] = norm_weight ? 1.0f + 0.3f * u : 0.3f * u;
        }
    }
}

/* The head and loss in one chunk, and in chunks of 3 of the 10 tokens. */
Test(model, gpt_gradients_match_finite_differences)
{
    for (int chunk = 0; chunk <= 3; chunk += 3) {
        bb_model_config c = tiny_gpt(2, 0);
        c.loss_chunk = chunk;
        bb_model_t *m = make_model(&c, GPT_B, 1);
        spread_weights(m);
        set_batch(m, GPT_B, 2);
        check_gradients(m, chunk ? "gpt, chunks of 3" : "gpt", 1e-2f);
        bb_model_destroy(m);
    }
}

/* RMSNorm, RoPE, SwiGLU and grouped-query attention in the model: untied
 * in one chunk, tied (the head's gradient added to the token table's) in
 * chunks of 3. */
Test(model, llama_gradients_match_finite_differences)
{
    for (int tied = 0; tied <= 1; tied++) {
        bb_model_config c = tiny_llama(2, tied);
        c.loss_chunk = tied ? 3 : 0;
        bb_model_t *m = make_model(&c, GPT_B, 1);
        spread_weights(m);
        set_batch(m, GPT_B, 2);
        check_gradients(m, tied ? "llama, tied, chunks of 3" : "llama", 3e-3f);
        bb_model_destroy(m);
    }
}

Test(model, mlp_gradients_match_finite_differences)
{
    bb_model_config c = tiny_mlp(0);
    bb_model_t *m = make_model(&c, MLP_B, 3);
    set_batch(m, MLP_B, 4);
    check_gradients(m, "mlp", 1e-3f); /* small: steps must not cross a ReLU kink */
    bb_model_destroy(m);
}

/* ---- checkpointing ----------------------------------------------------- */
static float *gradients_with(const bb_model_config *c, int B, uint64_t *activation_bytes, double *loss)
{
    bb_model_t *m = make_model(c, B, 5);
    set_batch(m, B, 6);
    cr_assert_eq(bb_model_forward(m, 3.0f, loss, NULL), BB_OK);
    cr_assert_eq(bb_model_backward(m, false), BB_OK);
    size_t n = bb_model_param_count(m);
    float *g = malloc(n * sizeof *g);
    memcpy(g, bb_model_grads(m), n * sizeof *g);
    *activation_bytes = bb_model_activation_bytes(m);
    bb_model_destroy(m);
    return g;
}

static void checkpointing_is_bitwise_equal(bb_model_config (*make)(int), const char *kind, int segments_of)
{
    bb_model_config none = make(0), every = make(segments_of);
    int B = none.kind == bb_model_kind_find("gpt") ? GPT_B : MLP_B;
    uint64_t bytes_none, bytes_ckpt;
    double loss_none, loss_ckpt;
    float *a = gradients_with(&none, B, &bytes_none, &loss_none);
    float *b = gradients_with(&every, B, &bytes_ckpt, &loss_ckpt);
    bb_model_t *m = make_model(&none, B, 1);
    size_t n = bb_model_param_count(m);
    bb_model_destroy(m);
    cr_assert_eq(loss_none, loss_ckpt, "%s: the loss changed with checkpointing", kind);
    cr_assert_eq(memcmp(a, b, n * sizeof *a), 0, "%s: gradients differ with checkpointing", kind);
    cr_assert_lt(bytes_ckpt, bytes_none, "%s: checkpointing should need less activation memory", kind);
    printf("checkpoint %s every:%d: activations %llu -> %llu bytes\n", kind, segments_of,
           (unsigned long long)bytes_none, (unsigned long long)bytes_ckpt);
    free(a), free(b);
}

static bb_model_config gpt4(int every) { return tiny_gpt(4, every); }

static bb_model_config gpt4_bf16(int every)
{
    bb_model_config c = tiny_gpt(4, every);
    c.precision = BB_PRECISION_BF16;
    return c;
}

/* the head and loss in chunks of 3 tokens (of 10) */
static bb_model_config gpt4_chunks(int every)
{
    bb_model_config c = tiny_gpt(4, every);
    c.loss_chunk = 3;
    return c;
}

Test(model, checkpointing_changes_memory_not_math)
{
    checkpointing_is_bitwise_equal(gpt4, "gpt", 1);
    checkpointing_is_bitwise_equal(gpt4, "gpt", 3);
    checkpointing_is_bitwise_equal(tiny_mlp, "mlp", 1);
    /* bf16 activations: segments of 1, of 2, and of 3 then 1 (a short last one) */
    checkpointing_is_bitwise_equal(gpt4_bf16, "gpt bf16", 1);
    checkpointing_is_bitwise_equal(gpt4_bf16, "gpt bf16", 2);
    checkpointing_is_bitwise_equal(gpt4_bf16, "gpt bf16", 3);
    checkpointing_is_bitwise_equal(gpt4_chunks, "gpt, loss in chunks of 3", 1);
}

/* ---- bf16 activations -------------------------------------------------- */
/* Rounding every kept activation to bf16 moves the loss and gradients by
 * about bf16's relative step (2^-8), not more; and it does move them (the
 * rounding happened). */
Test(model, bf16_activations_stay_close_to_fp32)
{
    bb_model_config c32 = bb_model_gpt_config(3, 2, 16, 12, 29), c16 = c32;
    c16.precision = BB_PRECISION_BF16;
    int B = 3;
    uint64_t bytes32, bytes16;
    double loss32, loss16;
    float *g32 = gradients_with(&c32, B, &bytes32, &loss32), *g16 = gradients_with(&c16, B, &bytes16, &loss16);
    bb_model_t *m = make_model(&c32, B, 1);
    size_t n = bb_model_param_count(m);
    bb_model_destroy(m);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < n; i++) diff += (g16[i] - g32[i]) * (double)(g16[i] - g32[i]), norm += (double)g32[i] * g32[i];
    double rel = sqrt(diff / norm), loss_rel = fabs(loss16 - loss32) / loss32;
    printf("bf16 activations: loss %.6f vs %.6f (relative %.2e), gradients relative %.2e, activations %llu -> %llu "
           "bytes\n", loss16, loss32, loss_rel, rel, (unsigned long long)bytes32, (unsigned long long)bytes16);
    cr_assert_lt(loss_rel, 1e-2);
    cr_assert_lt(rel, 2e-2, "gradients relative difference %.3e", rel);
    cr_assert_gt(rel, 0.0, "bf16 gave the fp32 gradients bit for bit: nothing was rounded");
    cr_assert_lt(bytes16, bytes32);
    free(g32), free(g16);
    /* the mlp refuses bf16 instead of ignoring it */
    bb_model_config mlp = tiny_mlp(0);
    mlp.precision = BB_PRECISION_BF16;
    cr_assert_eq(bb_model_create(be, &mlp, MLP_B, &m), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "--precision fp32"), "%s", bb_error_message());
}

/* bf16 on the CPU: the products are cut into slices fixed by their shape
 * (oneDNN on each), so one thread and three give the same loss and
 * gradients bit for bit (a shape big enough to be cut). */
Test(model, bf16_is_the_same_bits_on_one_and_three_threads)
{
    bb_model_config c = bb_model_gpt_config(2, 2, 64, 32, 61);
    c.precision = BB_PRECISION_BF16;
    int B = 4;
    uint64_t bytes;
    double loss1, loss3;
    float *g1 = gradients_with(&c, B, &bytes, &loss1);
    bb_backend_t *one = be;
    cr_assert_eq(bb_backend_create_cpu(&(bb_backend_options){.threads = 3}, &be), BB_OK);
    float *g3 = gradients_with(&c, B, &bytes, &loss3);
    bb_model_t *m = make_model(&c, B, 1);
    size_t n = bb_model_param_count(m);
    bb_model_destroy(m);
    bb_backend_destroy(be);
    be = one;
    cr_assert_eq(loss1, loss3, "bf16 loss: %.17g on one thread, %.17g on three", loss1, loss3);
    cr_assert_eq(memcmp(g1, g3, n * sizeof *g1), 0, "bf16 gradients differ between one thread and three");
    free(g1), free(g3);
}

/* Activation memory of gpt: without checkpointing L block slots; with
 * blocks, one slot plus L block inputs of B·T·C floats. Nothing grows
 * with T² (attention keeps one log-sum-exp per row and head) nor with
 * B·T·V (one chunk of logits). */
Test(model, gpt_checkpoint_memory_follows_the_formula)
{
    const int L = 6;
    bb_model_config none = tiny_gpt(L, 0), blocks = tiny_gpt(L, 1);
    bb_model_t *a = make_model(&none, GPT_B, 1), *b = make_model(&blocks, GPT_B, 1);
    size_t BT = GPT_B * GPT_T, C = 8, NH = 2, V = (size_t)bb_model_logits_stride(GPT_V); /* the logits' padded rows */
    size_t chunk = (size_t)bb_model_loss_chunk(&none, GPT_B, bb_device_transient_budget(BB_DEVICE_CPU, 0));
    cr_assert_eq(chunk, BT, "10 x 11 logits are far below 32 MiB: one chunk of every token");
    size_t slot = BT * (16 * C + 4 + NH) * 4;                     /* one block's activations and statistics */
    size_t fixed = (BT * (C + 2) + chunk * V + BT * 2 * C) * 4 + BT * 8; /* ln_f, a chunk of logits, scratch, losses */
    cr_assert_eq(bb_model_activation_bytes(a), L * slot + BT * C * 4 + fixed);
    cr_assert_eq(bb_model_activation_bytes(b), slot + L * BT * C * 4 + fixed);
    bb_model_destroy(a), bb_model_destroy(b);
    /* bf16: every tensor in 2 bytes (statistics in 4), the logits' chunk
     * too, with its gradient written over it; the same layout otherwise */
    bb_model_config every4 = tiny_gpt(L, 4); /* segments of 4 and 2: 4 recompute slots */
    none.precision = blocks.precision = every4.precision = BB_PRECISION_BF16;
    a = make_model(&none, GPT_B, 1), b = make_model(&blocks, GPT_B, 1);
    bb_model_t *e = make_model(&every4, GPT_B, 1);
    size_t slot16 = BT * 16 * C * 2 + BT * (4 + NH) * 4;
    size_t fixed16 = BT * C * 2 + BT * 2 * 4 + chunk * V * 2 + BT * 2 * C * 2 + BT * 8;
    cr_assert_eq(bb_model_activation_bytes(a), L * slot16 + BT * C * 2 + fixed16);
    cr_assert_eq(bb_model_activation_bytes(b), slot16 + L * BT * C * 2 + fixed16);
    cr_assert_eq(bb_model_activation_bytes(e), 4 * slot16 + 2 * BT * C * 2 + fixed16);
    bb_model_destroy(a), bb_model_destroy(b), bb_model_destroy(e);
}

/* ---- the fused, chunked LM head + loss ----------------------------------- */
static double loss_and_grads(bb_model_t *m, float *grads, bool twice)
{
    set_batch(m, GPT_B, 2);
    double loss = loss_of(m, 7.0f);
    cr_assert_eq(bb_model_backward(m, false), BB_OK);
    if (twice) { /* a second micro-step accumulates: chunk by chunk too */
        loss_of(m, 7.0f);
        cr_assert_eq(bb_model_backward(m, true), BB_OK);
    }
    memcpy(grads, bb_model_grads(m), bb_model_param_count(m) * sizeof *grads);
    return loss;
}

static double relative_distance(const float *a, const float *b, size_t n, float b_scale)
{
    double diff = 0, norm = 0;
    for (size_t i = 0; i < n; i++)
        diff += ((double)a[i] - b_scale * b[i]) * ((double)a[i] - b_scale * b[i]), norm += (double)a[i] * a[i];
    return sqrt(diff / norm);
}

/* Chunks of 1 and 3 tokens (of 10: the last one partial) give the loss and
 * gradients of one chunk of all, accumulate as one, and hold one chunk of
 * logits. */
Test(model, gpt_loss_chunks_change_memory_not_results)
{
    bb_model_config whole = tiny_gpt(2, 0);
    bb_model_t *ref = make_model(&whole, GPT_B, 1);
    size_t n = bb_model_param_count(ref), BT = GPT_B * GPT_T;
    float *g_ref = malloc(n * 4), *g = malloc(n * 4), *g_twice = malloc(n * 4);
    double loss_ref = loss_and_grads(ref, g_ref, false);
    uint64_t bytes_ref = bb_model_activation_bytes(ref);
    const int chunks[] = {1, 3};
    for (int k = 0; k < 2; k++) {
        bb_model_config c = whole;
        c.loss_chunk = chunks[k];
        cr_assert_eq(bb_model_loss_chunk(&c, GPT_B, 0), chunks[k]);
        bb_model_t *m = make_model(&c, GPT_B, 1);
        double loss = loss_and_grads(m, g, false);
        cr_assert_lt(fabs(loss - loss_ref) / loss_ref, 1e-7, "chunks of %d: loss %.17g vs %.17g", chunks[k], loss,
                     loss_ref);
        double rel = relative_distance(g_ref, g, n, 1.0f);
        cr_assert_lt(rel, 1e-6, "chunks of %d: gradients differ by %.3e", chunks[k], rel);
        loss_and_grads(m, g_twice, true);
        rel = relative_distance(g_twice, g, n, 2.0f);
        cr_assert_lt(rel, 1e-6, "chunks of %d: two accumulated micro-steps are not twice one (%.3e)", chunks[k], rel);
        cr_assert_eq(bb_model_activation_bytes(m),
                     bytes_ref - (BT - (size_t)chunks[k]) * (size_t)bb_model_logits_stride(GPT_V) * 4);
        bb_model_destroy(m);
    }
    bb_model_destroy(ref);
    free(g_ref), free(g), free(g_twice);
}

/* The default chunk: on the CPU 32 MiB of logits, a 64th of --device-mem
 * when that is smaller; on a GPU a 16th of its memory (the whole
 * micro-batch of GPT-2 124M on 40 GB); never more than the micro-batch's
 * tokens nor fewer than one. */
Test(model, the_loss_chunk_default_follows_its_rule)
{
    bb_model_config c = bb_model_gpt_config(12, 12, 768, 1024, 50257);
    uint64_t cpu = bb_device_transient_budget(BB_DEVICE_CPU, 0);
    cr_assert_eq(bb_model_logits_stride(50257), 50304, "llm.c's Vp");
    cr_assert_eq(bb_model_logits_stride(64), 64);
    cr_assert_eq(bb_model_loss_chunk(&c, 8, cpu), (32 << 20) / (50304 * 4)); /* 166 tokens of padded rows */
    cr_assert_eq(bb_model_loss_chunk(&c, 8, bb_device_transient_budget(BB_DEVICE_CPU, 1ull << 30)),
                 (16 << 20) / (50304 * 4));
    cr_assert_eq(bb_model_loss_chunk(&c, 8, bb_device_transient_budget(BB_DEVICE_CPU, 1 << 20)), 1);
    cr_assert_eq(bb_model_loss_chunk(&c, 8, bb_device_transient_budget(BB_DEVICE_CUDA, 40ull << 30)), 8 * 1024,
                 "one chunk on a 40 GB GPU");
    cr_assert_eq(bb_model_loss_chunk(&c, 8, bb_device_transient_budget(BB_DEVICE_CUDA, 8ull << 30)),
                 (512 << 20) / (50304 * 4), "a 16th of an 8 GiB GPU");
    cr_assert_eq(bb_model_loss_chunk(&c, 8, bb_device_transient_budget(BB_DEVICE_CUDA, 0)), 8 * 1024,
                 "a GPU of unknown memory: the whole micro-batch");
    c.gpt.vocab = 256;
    cr_assert_eq(bb_model_loss_chunk(&c, 8, cpu), 8 * 1024);
    c.loss_chunk = 100;
    cr_assert_eq(bb_model_loss_chunk(&c, 8, cpu), 100);
    cr_assert_eq(bb_model_loss_chunk(&c, 0 + 1, cpu), 100);
    c.gpt.seq_len = 50;
    cr_assert_eq(bb_model_loss_chunk(&c, 1, cpu), 50);
    bb_model_config mlp = tiny_mlp(0);
    cr_assert_eq(bb_model_loss_chunk(&mlp, 4, cpu), 0, "the mlp's loss runs whole");
}

/* bb_model_logits at one position is the head the loss sees: with one
 * target, the loss is log Σ exp(logits) - logits[target] of that row. */
Test(model, gpt_logits_at_a_position_are_what_the_loss_sees)
{
    bb_model_config c = tiny_gpt(2, 0);
    c.loss_chunk = 3;
    bb_model_t *m = make_model(&c, GPT_B, 1);
    host_batch h = make_batch(&c, GPT_B, 5);
    float logits[GPT_B * GPT_V];
    for (int pos = 0; pos < GPT_T; pos++) {
        cr_assert_eq(bb_model_set_batch(m, h.inputs, h.targets), BB_OK);
        cr_assert_eq(bb_model_logits(m, pos, logits), BB_OK);
        for (int b = 0; b < GPT_B; b++) {
            int32_t *targets = malloc(h.target_count * sizeof *targets);
            for (size_t i = 0; i < h.target_count; i++) targets[i] = -1;
            int t = (pos * 3 + b) % GPT_V;
            targets[b * GPT_T + pos] = t;
            cr_assert_eq(bb_model_set_batch(m, h.inputs, targets), BB_OK);
            double loss = loss_of(m, 1.0f), sum = 0;
            const float *row = logits + b * GPT_V;
            for (int v = 0; v < GPT_V; v++) sum += exp((double)row[v]);
            cr_assert_lt(fabs(loss - (log(sum) - row[t])), 1e-5, "example %d position %d", b, pos);
            free(targets);
        }
    }
    cr_assert_eq(bb_model_logits(m, GPT_T, logits), BB_ERR_ARG);
    free(h.inputs), free(h.targets);
    bb_model_destroy(m);
}

/* Incremental decoding: position by position, the logits of one row with
 * the cached keys and values are the full forward's at that position; a
 * new sequence starts at position 0; out of order is an error. */
/* The bytes a position of the decoding cache takes in a layer: what the
 * first decode allocates for a context of 9 less what it does for 5, a
 * quarter (the one-position buffers are the same for both). */
static size_t cache_bytes_per_position(bb_model_config c)
{
    size_t made[2];
    for (int i = 0; i < 2; i++) {
        bb_record_format f = {.kind = BB_RECORD_TOKENS_U16, .rank = 1, .shape = {i ? 10 : 6}, .record_size = 20,
                              .classes_or_vocab = GPT_V};
        cr_assert_eq(bb_model_config_from_data(&c, &f, "T"), BB_OK, "%s", bb_error_message());
        bb_model_t *m = make_model(&c, 1, 1);
        float logits[GPT_V];
        size_t before = bb_backend_bytes_in_use(be);
        cr_assert_eq(bb_model_decode(m, 1, 0, logits), BB_OK, "%s", bb_error_message());
        made[i] = bb_backend_bytes_in_use(be) - before;
        bb_model_destroy(m);
    }
    return (made[1] - made[0]) / 4 / 2; /* 4 positions more, 2 layers */
}

/* The gpt and a grouped-query llama (RoPE at each position); the cache
 * holds each position's keys and values only: 2 x kv-heads x head size
 * floats a layer (a llama's kv-heads, not its heads; no query). */
Test(model, decoding_with_the_cache_gives_the_forward_s_logits)
{
  for (int kind = 0; kind < 2; kind++) {
    bb_model_config c = kind ? tiny_llama(2, false) : tiny_gpt(2, 0);
    bb_model_t *m = make_model(&c, GPT_B, 1);
    spread_weights(m);
    host_batch h = make_batch(&c, GPT_B, 5);
    const int32_t *tokens = h.inputs; /* example 0's row */
    float full[GPT_B * GPT_V], step[GPT_V];
    for (int round = 0; round < 2; round++) /* the second: a new sequence over the same cache */
        for (int pos = 0; pos < GPT_T; pos++) {
            cr_assert_eq(bb_model_decode(m, tokens[pos], pos, step), BB_OK, "%s", bb_error_message());
            cr_assert_eq(bb_model_set_batch(m, h.inputs, h.targets), BB_OK);
            cr_assert_eq(bb_model_logits(m, pos, full), BB_OK);
            double diff = 0, norm = 0;
            for (int v = 0; v < GPT_V; v++)
                diff = fmax(diff, fabs(step[v] - full[v])), norm = fmax(norm, fabs(full[v]));
            cr_assert(diff <= 1e-5 * fmax(norm, 1), "round %d position %d: decode differs by %.3e", round, pos, diff);
        }
    cr_assert_eq(bb_model_decode(m, tokens[0], 3, step), BB_ERR_ARG, "position 3 after position %d", GPT_T - 1);
    cr_assert_eq(bb_model_decode(m, GPT_V, 0, step), BB_ERR_ARG, "a token outside the vocabulary");
    cr_assert_eq(bb_model_decode(m, tokens[0], GPT_T, step), BB_ERR_ARG, "a position past T");
    free(h.inputs), free(h.targets);
    bb_model_destroy(m);
    size_t row = cache_bytes_per_position(c), kv = kind ? 2 * 2 * 2 : 2 * 8; /* llama: 2 x 2 kv-heads x 2 */
    cr_assert_eq(row, kv * sizeof(float), "%s: the cache takes %zu bytes a position and layer, not %zu",
                 kind ? "llama" : "gpt", row, kv * sizeof(float));
  }
}

/* ---- accumulation ------------------------------------------------------ */
Test(model, eight_micro_batches_equal_one_big_batch)
{
    const int hidden[] = {16};
    bb_model_config c = bb_model_mlp_config(MLP_IN, hidden, 1, MLP_CLASSES);
    bb_model_t *big = make_model(&c, 256, 7), *small = make_model(&c, 32, 7);
    float *features = malloc(256 * MLP_IN * sizeof *features);
    int32_t labels[256];
    for (int i = 0; i < 256 * MLP_IN; i++) features[i] = (float)((i * 7919) % 1000) / 1000.0f;
    for (int i = 0; i < 256; i++) labels[i] = (i * 31) % MLP_CLASSES;
    double loss_big, loss_sum = 0, loss;
    cr_assert_eq(bb_model_set_batch(big, features, labels), BB_OK);
    cr_assert_eq(bb_model_forward(big, 256.0f, &loss_big, NULL), BB_OK);
    cr_assert_eq(bb_model_backward(big, false), BB_OK);
    for (int k = 0; k < 8; k++) {
        cr_assert_eq(bb_model_set_batch(small, features + k * 32 * MLP_IN, labels + k * 32), BB_OK);
        cr_assert_eq(bb_model_forward(small, 256.0f, &loss, NULL), BB_OK);
        cr_assert_eq(bb_model_backward(small, k > 0), BB_OK);
        loss_sum += loss;
    }
    cr_assert_float_eq(loss_sum, loss_big, 1e-6 * loss_big);
    const float *a = bb_model_grads(big), *b = bb_model_grads(small);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < bb_model_param_count(big); i++) diff += (a[i] - b[i]) * (a[i] - b[i]), norm += a[i] * a[i];
    cr_assert_lt(sqrt(diff / norm), 1e-5, "relative difference %.3e", sqrt(diff / norm));
    free(features);
    bb_model_destroy(big), bb_model_destroy(small);
}

/* ---- safetensors ------------------------------------------------------- */
Test(model, safetensors_round_trip_and_errors)
{
    char *dir = tu_temp_dir(), *path = tu_path(dir, "w.safetensors");
    bb_model_config c = tiny_gpt(2, 0);
    bb_model_t *a = make_model(&c, GPT_B, 11), *b = make_model(&c, GPT_B, 12);
    cr_assert_eq(bb_model_save_safetensors(a, path), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_model_load_safetensors(b, path), BB_OK, "%s", bb_error_message());
    cr_assert_eq(memcmp(bb_model_params(a), bb_model_params(b), bb_model_param_count(a) * sizeof(float)), 0);
    size_t size;
    char *file = (char *)tu_read_file(path, &size);
    cr_assert(strstr(file + 8, "\"lm_head.weight\"") && strstr(file + 8, "\"transformer.h.1.mlp.c_proj.weight\""));
    free(file);

    bb_model_config wider = bb_model_gpt_config(2, 2, 16, GPT_T, GPT_V);
    bb_model_t *w = make_model(&wider, GPT_B, 1);
    cr_assert_eq(bb_model_load_safetensors(w, path), BB_ERR_FORMAT);
    cr_assert(strstr(bb_error_message(), "transformer.wte.weight has shape [11, 8], the model wants [11, 16]"), "%s",
              bb_error_message());
    /* shapes of one and of three dimensions, each said whole */
    static const struct {
        const char *shape, *said;
    } odd[] = {{"[88]", "has shape [88], the model wants [11, 8]"}, {"[11, 8, 1]", "has shape [11, 8, 1], the model wants [11, 8]"}};
    char *one = tu_path(dir, "odd.safetensors");
    for (size_t k = 0; k < sizeof odd / sizeof *odd; k++) {
        char header[256];
        int n = snprintf(header, sizeof header, "{\"transformer.wte.weight\": {\"dtype\": \"F32\", \"shape\": %s, "
                         "\"data_offsets\": [0, 352]}}", odd[k].shape);
        while (n % 8) header[n++] = ' ';
        uint8_t blob[8 + 256 + 352] = {0};
        for (int i = 0; i < 8; i++) blob[i] = (uint8_t)((uint64_t)n >> (8 * i));
        memcpy(blob + 8, header, (size_t)n);
        tu_write_file(one, blob, 8 + (size_t)n + 352);
        cr_assert_eq(bb_model_load_safetensors(b, one), BB_ERR_FORMAT, "%s", odd[k].shape);
        cr_assert(strstr(bb_error_message(), odd[k].said), "%s", bb_error_message());
    }
    free(one);
    bb_model_config deeper = tiny_gpt(3, 0);
    bb_model_t *d = make_model(&deeper, GPT_B, 1);
    cr_assert_eq(bb_model_load_safetensors(d, path), BB_ERR_FORMAT);
    cr_assert(strstr(bb_error_message(), "no tensor transformer.h.2.ln_1.weight"), "%s", bb_error_message());
    tu_truncate(path, 20);
    cr_assert_eq(bb_model_load_safetensors(b, path), BB_ERR_CORRUPT);
    bb_model_destroy(a), bb_model_destroy(b), bb_model_destroy(w), bb_model_destroy(d);
    tu_rm_tree(dir);
    free(path), free(dir);
}

/* ---- loader records to batches ----------------------------------------- */
/* The records give the same loss as the batch written out by hand. */
static void assert_same_batch(bb_model_t *m, const bb_record_format *meta, const uint8_t *records, int count,
                              const void *inputs, const int32_t *targets, float normalizer)
{
    double from_records, direct;
    cr_assert_eq(bb_model_set_batch_from_records(m, meta, records, count), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_model_forward(m, normalizer, &from_records, NULL), BB_OK);
    cr_assert_eq(bb_model_set_batch(m, inputs, targets), BB_OK);
    cr_assert_eq(bb_model_forward(m, normalizer, &direct, NULL), BB_OK);
    cr_assert_float_eq(from_records, direct, 1e-12);
}

Test(model, batches_from_loader_records)
{
    /* mlp: image_u8 records are a label, then pixels scaled by 1/255 */
    bb_model_config c = tiny_mlp(0);
    bb_model_t *m = make_model(&c, 2, 21);
    bb_record_format img = {.kind = BB_RECORD_IMAGE_U8, .rank = 2, .shape = {2, 3}, .record_size = 7};
    const uint8_t images[14] = {2, 0, 255, 51, 102, 1, 7, 0, 10, 20, 30, 40, 50, 60};
    const float features[12] = {0, 1, 0.2f, 0.4f, 1 / 255.0f, 7 / 255.0f, 10 / 255.0f, 20 / 255.0f, 30 / 255.0f,
                                40 / 255.0f, 50 / 255.0f, 60 / 255.0f};
    const int32_t labels[2] = {2, 0};
    assert_same_batch(m, &img, images, 2, features, labels, 2.0f);
    uint8_t bad[14];
    memcpy(bad, images, sizeof bad);
    bad[7] = 3; /* label 3 of 3 classes */
    cr_assert_eq(bb_model_set_batch_from_records(m, &img, bad, 2), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "label 3 is not below 3 classes"), "%s", bb_error_message());
    cr_assert_eq(bb_model_set_batch_from_records(m, &img, images, 3), BB_ERR_ARG); /* more than B */
    cr_assert_eq(bb_model_set_batch_from_records(m, &img, images, 1), BB_OK, "%s", bb_error_message()); /* padded */
    cr_assert_eq(bb_model_batch_targets(m), 1);
    bb_model_destroy(m);

    /* gpt: T+1 tokens per record; inputs are the first T, targets the last T */
    bb_model_config g = tiny_gpt(1, 0);
    m = make_model(&g, 1, 22);
    bb_record_format tok = {.kind = BB_RECORD_TOKENS_U16, .rank = 1, .shape = {GPT_T + 1}, .record_size = 2 * (GPT_T + 1)};
    const uint8_t tokens[12] = {3, 0, 1, 0, 4, 0, 1, 0, 5, 0, 9, 0};
    const int32_t inputs[GPT_T] = {3, 1, 4, 1, 5}, targets[GPT_T] = {1, 4, 1, 5, 9};
    assert_same_batch(m, &tok, tokens, 1, inputs, targets, 5.0f);
    uint8_t out_of_vocab[12];
    memcpy(out_of_vocab, tokens, sizeof out_of_vocab);
    out_of_vocab[10] = GPT_V;
    cr_assert_eq(bb_model_set_batch_from_records(m, &tok, out_of_vocab, 1), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "token 11 is not below the vocabulary 11"), "%s", bb_error_message());
    bb_record_format longer = tok;
    longer.shape[0] = GPT_T + 2;
    cr_assert_eq(bb_model_set_batch_from_records(m, &longer, tokens, 1), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "this gpt (T 5) takes token records of 6 tokens"), "%s", bb_error_message());
    cr_assert_eq(bb_model_set_batch_from_records(m, &img, images, 1), BB_ERR_ARG); /* images into a gpt */
    bb_model_destroy(m);
}

/* A safetensors file with this header and `data_bytes` zero bytes after it. */
static void write_safetensors(const char *path, const char *header, size_t data_bytes)
{
    size_t n = strlen(header);
    uint8_t *file = calloc(1, 8 + n + data_bytes);
    for (int i = 0; i < 8; i++) file[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(file + 8, header, n);
    tu_write_file(path, file, 8 + n + data_bytes);
    free(file);
}

Test(model, malformed_safetensors_are_errors_and_change_nothing)
{
    char *dir = tu_temp_dir(), *path = tu_path(dir, "bad.safetensors");
    bb_model_config c = tiny_mlp(0);
    bb_model_t *m = make_model(&c, MLP_B, 31);
    size_t n = bb_model_param_count(m);
    float *before = malloc(n * sizeof *before);
    memcpy(before, bb_model_params(m), n * sizeof *before);

    char *deep = malloc(2000100);
    strcpy(deep, "{\"__metadata__\":");
    size_t len = strlen(deep);
    for (int i = 0; i < 1000000; i++) deep[len++] = '[';
    deep[len] = 0;
    const char *headers[] = {
        deep,                                                                             /* nesting */
        "{\"fc.0.bias\":{\"dtype\":\"F32\",\"shape\":[7],\"data_offsets\":[0,28]}",       /* no closing brace */
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",                  /* duplicate names */
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,99999999999999999999999]}}", /* overflow */
    };
    for (size_t i = 0; i < sizeof headers / sizeof *headers; i++) {
        write_safetensors(path, headers[i], 64);
        cr_assert_eq(bb_model_load_safetensors(m, path), BB_ERR_CORRUPT, "header %zu: %s", i, bb_error_message());
    }
    free(deep);

    /* Every tensor present and right but the last one's dtype: nothing is loaded. */
    char header[4096];
    size_t off = 0, hl = (size_t)snprintf(header, sizeof header, "{");
    for (int t = 0; t < bb_model_tensor_count(m); t++) {
        const bb_tensor_info *ti = bb_model_tensor(m, t);
        bool last = t + 1 == bb_model_tensor_count(m);
        hl += (size_t)snprintf(header + hl, sizeof header - hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%d%s",
                               t ? "," : "", ti->name, last ? "F16" : "F32", ti->shape[0], ti->rank == 2 ? "," : "");
        if (ti->rank == 2) hl += (size_t)snprintf(header + hl, sizeof header - hl, "%d", ti->shape[1]);
        hl += (size_t)snprintf(header + hl, sizeof header - hl, "],\"data_offsets\":[%zu,%zu]}", off,
                               off + ti->count * 4);
        off += ti->count * 4;
    }
    snprintf(header + hl, sizeof header - hl, "}");
    write_safetensors(path, header, off);
    cr_assert_eq(bb_model_load_safetensors(m, path), BB_ERR_FORMAT);
    cr_assert(strstr(bb_error_message(), "fc.2.bias is F16, bigbatch reads F32"), "%s", bb_error_message());
    cr_assert_eq(memcmp(before, bb_model_params(m), n * sizeof *before), 0, "a failed load changed the weights");
    free(before);
    bb_model_destroy(m);
    tu_rm_tree(dir);
    free(path), free(dir);
}

Test(model, batches_with_out_of_range_tokens_or_targets_are_refused)
{
    bb_model_config g = tiny_gpt(1, 0);
    bb_model_t *m = make_model(&g, 1, 23);
    int32_t tokens[GPT_T] = {1, 2, 3, 4, 5}, targets[GPT_T] = {1, 2, 3, 4, 5};
    cr_assert_eq(bb_model_set_batch(m, tokens, targets), BB_OK);
    targets[2] = GPT_V;
    cr_assert_eq(bb_model_set_batch(m, tokens, targets), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "target 11 at position 2"), "%s", bb_error_message());
    targets[2] = -2;
    cr_assert_eq(bb_model_set_batch(m, tokens, targets), BB_ERR_ARG);
    targets[2] = -1;
    tokens[4] = -1;
    cr_assert_eq(bb_model_set_batch(m, tokens, targets), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "token -1 at position 4"), "%s", bb_error_message());
    bb_model_destroy(m);
}

/* ---- no host copies, no allocation mid-step -------------------------------- */
/* Loader records reach the batch without a host copy: on the CPU the
 * conversion op reads them in place, so staging copies nothing (the old
 * path converted into a staging area and copied it: 2 copies a batch). */
Test(model, staged_records_make_no_host_copy)
{
    bb_model_config c = tiny_gpt(1, 0);
    bb_model_t *m = make_model(&c, GPT_B, 1);
    bb_record_format tok = {.kind = BB_RECORD_TOKENS_U16, .rank = 1, .shape = {GPT_T + 1}, .record_size = 2 * (GPT_T + 1),
                         .classes_or_vocab = GPT_V};
    uint8_t records[2][GPT_B * 2 * (GPT_T + 1)];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < GPT_B * (GPT_T + 1); i++) records[k][2 * i] = (uint8_t)((i * 3 + k) % GPT_V), records[k][2 * i + 1] = 0;
    uint64_t copies0, bytes0, copies, bytes;
    bb_backend_copy_stats(be, &copies0, &bytes0);
    for (int step = 0; step < 4; step++) {
        cr_assert_eq(bb_model_stage_records(m, &tok, records[step % 2], GPT_B), BB_OK, "%s", bb_error_message());
        cr_assert_eq(bb_model_use_staged(m), BB_OK);
        double loss;
        cr_assert_eq(bb_model_forward(m, GPT_B * GPT_T, &loss, NULL), BB_OK);
        cr_assert(isfinite(loss));
    }
    bb_backend_copy_stats(be, &copies, &bytes);
    cr_assert_eq(copies - copies0, 0, "staging made %llu host-to-device copies (%llu bytes)",
                 (unsigned long long)(copies - copies0), (unsigned long long)(bytes - bytes0));
    bb_model_destroy(m);
}

/* The model reserves the scratch of every op it calls: a whole micro-step
 * (forward, loss, backward) grows none (on a GPU, growing means
 * allocating mid-step). */
Test(model, a_micro_step_needs_no_scratch_beyond_the_reservation)
{
    bb_model_config configs[] = {tiny_gpt(2, 1), tiny_mlp(0)};
    int batch[] = {GPT_B, MLP_B};
    for (int i = 0; i < 2; i++) {
        bb_backend_t *b;
        bb_backend_options o = {.threads = 1};
        cr_assert_eq(bb_backend_create_cpu(&o, &b), BB_OK);
        bb_model_t *m;
        cr_assert_eq(bb_model_create(b, &configs[i], batch[i], &m), BB_OK, "%s", bb_error_message());
        cr_assert_eq(bb_model_init(m, 1), BB_OK);
        host_batch h = make_batch(&configs[i], batch[i], 3);
        cr_assert_eq(bb_model_set_batch(m, h.inputs, h.targets), BB_OK);
        double loss;
        cr_assert_eq(bb_model_forward(m, 10, &loss, NULL), BB_OK);
        cr_assert_eq(bb_model_backward(m, false), BB_OK);
        cr_assert_eq(bb_backend_scratch_grew(b), 0, "%s: an op needed scratch the model did not reserve",
                     i ? "mlp" : "gpt");
        free(h.inputs), free(h.targets);
        bb_model_destroy(m);
        bb_backend_destroy(b);
    }
}

/* bigbatch's weights carry their XXH64: one flipped bit in the data is a
 * clear error and changes nothing; a file from elsewhere (no checksum)
 * still loads. */
Test(model, damaged_weights_are_refused_by_their_checksum)
{
    char *dir = tu_temp_dir(), *path = tu_path(dir, "w.safetensors"), *foreign = tu_path(dir, "f.safetensors");
    bb_model_config c = tiny_mlp(0);
    bb_model_t *a = make_model(&c, MLP_B, 41), *b = make_model(&c, MLP_B, 42);
    size_t n = bb_model_param_count(b);
    float *before = malloc(n * sizeof *before);
    memcpy(before, bb_model_params(b), n * sizeof *before);
    cr_assert_eq(bb_model_save_safetensors(a, path), BB_OK, "%s", bb_error_message());
    size_t size;
    uint8_t *file = tu_read_file(path, &size);
    cr_assert_not_null(strstr((char *)file + 8, "\"xxh64\":\""), "no checksum in the header");
    /* the same file without the checksum, as another tool would write it */
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)file[i] << (8 * i);
    char *hdr = strndup((char *)file + 8, hlen), *x = strstr(hdr, ",\"xxh64\":\"");
    memset(x, ' ', strlen(",\"xxh64\":\"0123456789abcdef\"")); /* blanks: still valid JSON, same length */
    uint8_t *copy = malloc(size);
    memcpy(copy, file, size);
    memcpy(copy + 8, hdr, hlen);
    tu_write_file(foreign, copy, size);
    cr_assert_eq(bb_model_load_safetensors(b, foreign), BB_OK, "a file without a checksum: %s", bb_error_message());
    memcpy(bb_model_params(b), before, n * sizeof *before);
    /* one bit flipped in the last tensor's data */
    tu_flip_byte(path, (long)size - 1, 0x01);
    cr_assert_eq(bb_model_load_safetensors(b, path), BB_ERR_CORRUPT);
    cr_assert(strstr(bb_error_message(), "do not match their checksum"), "%s", bb_error_message());
    cr_assert_eq(memcmp(bb_model_params(b), before, n * sizeof *before), 0, "a damaged file changed the model");
    bb_model_destroy(a), bb_model_destroy(b);
    tu_rm_tree(dir);
    free(file), free(copy), free(hdr), free(before), free(path), free(foreign), free(dir);
}

/* A file with tensors the model lacks (a deeper model's) is refused too,
 * naming the first, and the model is unchanged. */
Test(model, weights_with_extra_tensors_are_refused_naming_the_first)
{
    char *dir = tu_temp_dir(), *path = tu_path(dir, "deep.safetensors");
    bb_model_config deep = tiny_gpt(4, 0), shallow = tiny_gpt(2, 0);
    bb_model_t *a = make_model(&deep, GPT_B, 51), *b = make_model(&shallow, GPT_B, 52);
    size_t n = bb_model_param_count(b);
    float *before = malloc(n * sizeof *before);
    memcpy(before, bb_model_params(b), n * sizeof *before);
    cr_assert_eq(bb_model_save_safetensors(a, path), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_model_load_safetensors(b, path), BB_ERR_FORMAT);
    cr_assert(strstr(bb_error_message(), "tensor transformer.h.2."), "%s", bb_error_message());
    cr_assert(strstr(bb_error_message(), "is not in the model (gpt"), "%s", bb_error_message());
    cr_assert_eq(memcmp(bb_model_params(b), before, n * sizeof *before), 0);
    bb_model_destroy(a), bb_model_destroy(b);
    tu_rm_tree(dir);
    free(before), free(path), free(dir);
}
