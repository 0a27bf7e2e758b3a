/* test_parity.c — the models against PyTorch: tests/torch_parity.py redoes
 * in PyTorch what the model did here (the loss, the gradients, a few AdamW
 * steps) on the weights and batch written out, and compares. */
#include "bigbatch/pack.h"
#include "model_fixture.h"

TestSuite(parity, .init = backend_up, .fini = backend_down);

/* ---- PyTorch parity ---------------------------------------------------- */
/* Writes the initial weights, the batch, the loss and gradients of one
 * forward/backward, every step's loss and the weights after `steps` AdamW
 * steps on that batch, for tests/torch_parity.py to redo in PyTorch and
 * compare (under torch.autocast when the model's precision is bf16). */
static void need_torch(void)
{
    if (system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0)
        cr_skip_test("skipped: /usr/bin/python3 cannot import torch (make deps installs python3-torch)");
}

/* On the batch `h` (make_batch's when NULL). */
static void parity_on(const bb_model_config *c, int B, int steps, const char *kind, const host_batch *batch)
{
    need_torch();
    char *dir = tu_temp_dir(), path[4200];
    bb_model_t *m = make_model(c, B, 42), *g = make_model(c, B, 42);
    host_batch h = batch ? *batch : make_batch(c, B, 43);
    snprintf(path, sizeof path, "%s/inputs.bin", dir), tu_write_file(path, h.inputs, h.input_bytes);
    snprintf(path, sizeof path, "%s/targets.bin", dir), tu_write_file(path, h.targets, h.target_count * 4);
    snprintf(path, sizeof path, "%s/init.safetensors", dir);
    cr_assert_eq(bb_model_save_safetensors(m, path), BB_OK);
    cr_assert_eq(bb_model_set_batch(m, h.inputs, h.targets), BB_OK);
    float normalizer = (float)bb_model_batch_targets(m);
    double loss = 0;
    snprintf(path, sizeof path, "%s/losses.txt", dir);
    FILE *losses = fopen(path, "w");
    cr_assert_not_null(losses);
    float *mom = calloc(bb_model_param_count(m), sizeof *mom), *var = calloc(bb_model_param_count(m), sizeof *var);
    for (int step = 1; step <= steps; step++) {
        double l;
        cr_assert_eq(bb_model_forward(m, normalizer, &l, NULL), BB_OK);
        cr_assert_eq(bb_model_backward(m, false), BB_OK);
        fprintf(losses, "%.17g\n", l);
        if (step == 1) {
            loss = l;
            memcpy(bb_model_params(g), bb_model_grads(m), bb_model_param_count(m) * sizeof(float));
            snprintf(path, sizeof path, "%s/grads.safetensors", dir);
            cr_assert_eq(bb_model_save_safetensors(g, path), BB_OK);
        }
        for (int t = 0; t < bb_model_tensor_count(m); t++) {
            const bb_tensor_info *ti = bb_model_tensor(m, t);
            bb_op_adamw(be, bb_model_params(m) + ti->offset, bb_model_grads(m) + ti->offset, mom + ti->offset,
                        var + ti->offset, ti->count, 1e-3f, 0.9f, 0.95f, 1e-8f, ti->decay ? 0.1f : 0.0f, step, 1.0f);
        }
    }
    cr_assert_eq(fclose(losses), 0);
    snprintf(path, sizeof path, "%s/after.safetensors", dir);
    cr_assert_eq(bb_model_save_safetensors(m, path), BB_OK);
    char spec[512];
    const bb_llama_config *l = &c->llama;
    if (c->kind == bb_model_kind_find("gpt"))
        snprintf(spec, sizeof spec, "gpt:%d:%d:%d:%d:%d:%d", c->gpt.layers, c->gpt.heads, c->gpt.d_model, c->gpt.seq_len, c->gpt.vocab, B);
    else if (c->kind == bb_model_kind_find("llama"))
        snprintf(spec, sizeof spec, "llama:%d:%d:%d:%d:%d:%d:%d:%d:%.17g:%.17g:%d", l->layers, l->heads, l->kv_heads,
                 l->d_model, l->ffn, l->seq_len, l->vocab, B, l->rope_theta, l->norm_eps, l->tied);
    else
        snprintf(spec, sizeof spec, "mlp:%d:%d,%d:%d:%d", c->mlp.inputs, c->mlp.hidden[0], c->mlp.hidden[1], c->mlp.classes, B);
    char loss_text[64], steps_text[16];
    snprintf(loss_text, sizeof loss_text, "%.17g", loss);
    snprintf(steps_text, sizeof steps_text, "%d", steps);
    tu_run r = tu_run_argv(
        (char *const[]){"/usr/bin/python3", "tests/torch_parity.py", dir, spec, loss_text, steps_text,
                        (char *)bb_precision_name(c->precision), NULL});
    printf("%s", r.out);
    cr_assert_eq(r.exit_code, 0, "%s parity with PyTorch failed:\n%s%s", kind, r.out, r.err);
    tu_run_free(&r);
    if (!batch) free(h.inputs), free(h.targets);
    free(mom), free(var);
    bb_model_destroy(m), bb_model_destroy(g);
    tu_rm_tree(dir);
    free(dir);
}

static void parity(const bb_model_config *c, int B, const char *kind) { parity_on(c, B, 10, kind, NULL); }

Test(parity, mlp_matches_pytorch, .timeout = 120)
{
    const int hidden[] = {32, 16};
    bb_model_config c = bb_model_mlp_config(20, hidden, 2, 10);
    parity(&c, 16, "mlp");
}

Test(parity, gpt_matches_pytorch, .timeout = 120)
{
    bb_model_config c = bb_model_gpt_config(2, 4, 32, 16, 37);
    parity(&c, 3, "gpt");
}

/* Grouped-query attention (4 heads, 2 key/value heads), an untied head, a
 * non-default RoPE base, T 24 (RoPE's angles past one turn). */
Test(parity, llama_matches_pytorch, .timeout = 120)
{
    bb_model_config c = bb_model_llama_config(2, 4, 32, 24, 37);
    c.llama.kv_heads = 2, c.llama.ffn = 48, c.llama.rope_theta = 500000, c.llama.norm_eps = 1e-5;
    parity(&c, 3, "llama");
}

/* Multi-query, tied, every block recomputed in two ways (a plan of
 * selective and full blocks): the same gradients as saving everything. */
Test(parity, a_tied_multi_query_llama_with_recompute_matches_pytorch, .timeout = 120)
{
    bb_model_config c = bb_model_llama_config(3, 4, 32, 16, 37);
    c.llama.kv_heads = 1, c.llama.tied = true;
    cr_assert_eq(bb_model_parse_recompute("plan:s,f,n", &c), BB_OK);
    parity(&c, 2, "llama (tied, multi-query, plan:s,f,n)");
}

Test(parity, bf16_llama_matches_pytorch_autocast_for_20_steps)
{
    bb_model_config c = bb_model_llama_config(2, 4, 32, 16, 37);
    c.llama.kv_heads = 2, c.llama.ffn = 48;
    c.precision = BB_PRECISION_BF16;
    parity_on(&c, 3, 20, "bf16 llama", NULL);
}

/* --precision bf16 against torch.autocast("cpu", dtype=torch.bfloat16) on
 * the same weights and batch: every one of 20 steps' losses within 2e-2. */
Test(parity, bf16_gpt_matches_pytorch_autocast_for_20_steps)
{
    bb_model_config c = bb_model_gpt_config(2, 4, 32, 16, 37);
    c.precision = BB_PRECISION_BF16;
    parity_on(&c, 3, 20, "bf16 gpt", NULL);
}

/* GPT-2's vocabulary, 12 heads and T 512 (8 tiles of attention rows and
 * keys), the head in 11 chunks of 100 tokens (the last one 24), on tokens
 * from an llm.c token file packed as `pack --format llmc` does; 3 AdamW
 * steps (the small gpt's 10 hold the optimizer; a step here takes seconds
 * on each side). (No .timeout: with a third timed test Criterion's runner
 * leaks 48 bytes, which ASan reports.) */
Test(parity, gpt_matches_pytorch_at_t512_with_gpt2_vocabulary)
{
    need_torch();
    enum { T = 512, B = 2, V = 50257 };
    char *dir = tu_temp_dir(), *bin = tu_path(dir, "tokens.bin"), *packed = tu_path(dir, "packed");
    size_t n = (size_t)B * T + 1;
    int32_t header[256] = {20240520, 1, (int32_t)n};
    uint8_t *file = malloc(sizeof header + 2 * n);
    memcpy(file, header, sizeof header);
    uint64_t s = 7;
    for (size_t i = 0; i < n; i++) {
        uint16_t t = (uint16_t)(bb_splitmix64(&s) % V);
        memcpy(file + sizeof header + 2 * i, &t, 2);
    }
    tu_write_file(bin, file, sizeof header + 2 * n);
    bb_pack_options o = bb_pack_defaults();
    o.format = BB_PACK_LLMC;
    o.inputs = (const char *const[]){bin};
    o.input_count = 1;
    o.seq_len = T;
    o.vocab = V;
    o.out_dir = packed;
    bb_pack_report report;
    cr_assert_eq(bb_pack(&o, &report), BB_OK, "%s", bb_error_message());
    cr_assert_eq(report.train.records, B);

    bb_dataset_t *ds;
    cr_assert_eq(bb_dataset_open(packed, &ds), BB_OK, "%s", bb_error_message());
    const bb_record_format *meta = bb_dataset_format(ds);
    bb_model_config c = bb_model_gpt_config(2, 12, 96, 0, 0);
    cr_assert_eq(bb_model_config_from_data(&c, meta, packed), BB_OK, "%s", bb_error_message());
    cr_assert(c.gpt.seq_len == T && c.gpt.vocab == V, "the packed data gives T %d, vocabulary %d", c.gpt.seq_len, c.gpt.vocab);
    c.loss_chunk = 100;
    uint16_t *records = malloc((size_t)B * (T + 1) * 2);
    bb_frame_decoder_t *dec;
    cr_assert_eq(bb_frame_decoder_create(&dec), BB_OK);
    cr_assert_eq(bb_shard_read_frame(bb_dataset_shard(ds, 0), 0, dec, records, (size_t)B * (T + 1) * 2), BB_OK,
                 "%s", bb_error_message());
    host_batch h = {.inputs = malloc((size_t)B * T * 4), .targets = malloc((size_t)B * T * 4),
                    .input_bytes = (size_t)B * T * 4, .target_count = (size_t)B * T};
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            ((int32_t *)h.inputs)[b * T + t] = records[b * (T + 1) + t];
            h.targets[b * T + t] = records[b * (T + 1) + t + 1];
        }
    parity_on(&c, B, 3, "gpt (T 512, 12 heads, vocabulary 50257, chunks of 100)", &h);
    bb_frame_decoder_destroy(dec);
    bb_dataset_close(ds);
    free(records), free(h.inputs), free(h.targets), free(file), free(bin), free(packed);
    tu_rm_tree(dir);
    free(dir);
}

