/* test_cuda.c — the CUDA backend against the CPU backend, op by op, on
 * fresh random inputs (fp32: ≤ 1e-5 relative), a one-GPU NCCL reducer, and
 * short training runs on one GPU against the CPU (more GPUs:
 * test_cuda_train.c). In the emulated build (make cuda-emu, part of make
 * test) every test runs on emulated GPUs; in a CUDA build they run on the
 * machine's GPU, and say *skipped* without one. */
#include <math.h>

#include "bigbatch/train.h"
#include "test_util.h"

static bb_backend_t *cpu, *gpu;

static void need_gpu(void)
{
    bb_cuda_info info;
    bb_cuda_probe(&info);
    if (info.device_count == 0) cr_skip_test("skipped: no GPU (%s)", info.reason);
    bb_backend_options o = {0};
    cr_assert_eq(bb_backend_create_cpu(&o, &cpu), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_backend_create_cuda(&o, &gpu), BB_OK, "%s", bb_error_message());
}

static void down(void)
{
    bb_backend_destroy(gpu);
    bb_backend_destroy(cpu);
    gpu = cpu = NULL;
}

TestSuite(cuda, .fini = down);

Test(cuda, without_a_gpu_the_backend_says_why)
{
#ifdef BB_CUDA_EMU
    setenv("BB_CUDA_EMU_DEVICES", "0", 1); /* a machine without GPUs, before the first CUDA call */
#endif
    bb_cuda_info info;
    bb_cuda_probe(&info);
    if (info.device_count > 0) cr_skip_test("skipped: this machine has a GPU");
    bb_backend_options o = {0};
    bb_backend_t *b = (bb_backend_t *)1;
    cr_assert_eq(bb_backend_create_cuda(&o, &b), BB_ERR_UNSUPPORTED);
    cr_assert_null(b);
    cr_assert(strlen(bb_error_message()) > 10, "the error should say why: '%s'", bb_error_message());
}

/* ---- helpers: the same host data on both backends ----------------------- */
typedef struct twin {
    float *c, *g; /* on the CPU backend, on the GPU */
    size_t n;
} twin;

static float *random_host(size_t n, uint64_t seed, float scale)
{
    float *x = malloc(n * sizeof *x);
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) x[i] = (float)(((bb_splitmix64(&s) >> 11) / 9007199254740992.0) * 2 - 1) * scale;
    return x;
}

static twin upload(const void *host, size_t bytes)
{
    twin t = {.n = bytes / sizeof(float)};
    cr_assert_eq(bb_backend_alloc(cpu, bytes, "test", (void **)&t.c), BB_OK);
    cr_assert_eq(bb_backend_alloc(gpu, bytes, "test", (void **)&t.g), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_backend_copy(cpu, t.c, host, bytes, BB_COPY_H2D), BB_OK);
    cr_assert_eq(bb_backend_copy(gpu, t.g, host, bytes, BB_COPY_H2D), BB_OK, "%s", bb_error_message());
    return t;
}

static twin random_twin(size_t n, uint64_t seed, float scale)
{
    float *h = random_host(n, seed, scale);
    twin t = upload(h, n * sizeof *h);
    free(h);
    return t;
}

/* max |cpu - gpu| / max |cpu| over the twin's floats, asserted ≤ tol. */
static void expect_close(const char *what, twin t, double tol)
{
    float *a = malloc(t.n * sizeof *a), *b = malloc(t.n * sizeof *b);
    cr_assert_eq(bb_backend_synchronize(gpu), BB_OK, "%s: %s", what, bb_error_message());
    cr_assert_eq(bb_backend_copy(cpu, a, t.c, t.n * sizeof *a, BB_COPY_D2H), BB_OK);
    cr_assert_eq(bb_backend_copy(gpu, b, t.g, t.n * sizeof *b, BB_COPY_D2H), BB_OK, "%s", bb_error_message());
    double diff = 0, norm = 0;
    for (size_t i = 0; i < t.n; i++) {
        cr_assert(isfinite(b[i]), "%s: element %zu is %f on the GPU", what, i, b[i]);
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        norm = fmax(norm, fabs((double)a[i]));
    }
    double rel = diff / (norm > 0 ? norm : 1);
    cr_log_info("%-28s max relative difference %.2e", what, rel);
    cr_assert(rel <= tol, "%s: CUDA differs from CPU by %.3e relative (max |cpu| %.3e)", what, rel, norm);
    free(a), free(b);
}

/* The same bytes on both (integer outputs, and sums made in the same order). */
static void expect_same_bits(const char *what, twin t)
{
    size_t bytes = t.n * sizeof(float);
    uint8_t *a = malloc(bytes), *b = malloc(bytes);
    cr_assert_eq(bb_backend_synchronize(gpu), BB_OK, "%s: %s", what, bb_error_message());
    cr_assert_eq(bb_backend_copy(cpu, a, t.c, bytes, BB_COPY_D2H), BB_OK);
    cr_assert_eq(bb_backend_copy(gpu, b, t.g, bytes, BB_COPY_D2H), BB_OK, "%s", bb_error_message());
    size_t first = 0;
    while (first < bytes && a[first] == b[first]) first++;
    cr_assert_eq(first, bytes, "%s: CUDA differs from CPU from byte %zu on", what, first);
    cr_log_info("%-28s bitwise equal", what);
    free(a), free(b);
}

/* ---- ops ---------------------------------------------------------------- */
Test(cuda, linear_matches_cpu)
{
    need_gpu();
    int N = 37, IC = 29, OC = 23;
    twin in = random_twin((size_t)N * IC, 1, 1), w = random_twin((size_t)OC * IC, 2, 0.5f), b = random_twin(OC, 3, 0.5f);
    twin out = random_twin((size_t)N * OC, 4, 1), dout = random_twin((size_t)N * OC, 5, 1);
    twin din = random_twin((size_t)N * IC, 6, 1), dw = random_twin((size_t)OC * IC, 7, 1), db = random_twin(OC, 8, 1);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        bb_op_linear_forward(cpu, out.c, in.c, w.c, with_bias ? b.c : NULL, N, IC, OC);
        bb_op_linear_forward(gpu, out.g, in.g, w.g, with_bias ? b.g : NULL, N, IC, OC);
        expect_close("linear_forward", out, 1e-5);
    }
    for (int acc = 0; acc < 2; acc++) {
        bb_op_linear_backward(cpu, din.c, dw.c, db.c, dout.c, in.c, w.c, N, IC, OC, acc);
        bb_op_linear_backward(gpu, din.g, dw.g, db.g, dout.g, in.g, w.g, N, IC, OC, acc);
        expect_close("linear_backward din", din, 1e-5);
        expect_close(acc ? "linear_backward dw (+=)" : "linear_backward dw", dw, 1e-5);
        expect_close(acc ? "linear_backward dbias (+=)" : "linear_backward dbias", db, 1e-5);
    }
}

Test(cuda, elementwise_ops_match_cpu)
{
    need_gpu();
    size_t n = 10007;
    twin x = random_twin(n, 11, 4), y = random_twin(n, 12, 4), out = random_twin(n, 13, 1), d = random_twin(n, 14, 1);
    bb_op_relu_forward(cpu, out.c, x.c, n), bb_op_relu_forward(gpu, out.g, x.g, n);
    expect_close("relu_forward", out, 1e-6);
    bb_op_relu_backward(cpu, out.c, d.c, x.c, n), bb_op_relu_backward(gpu, out.g, d.g, x.g, n);
    expect_close("relu_backward", out, 1e-6);
    bb_op_gelu_forward(cpu, out.c, x.c, n), bb_op_gelu_forward(gpu, out.g, x.g, n);
    expect_close("gelu_forward", out, 1e-5);
    bb_op_gelu_backward(cpu, out.c, d.c, x.c, n), bb_op_gelu_backward(gpu, out.g, d.g, x.g, n);
    expect_close("gelu_backward", out, 1e-5);
    bb_op_add(cpu, out.c, x.c, y.c, n), bb_op_add(gpu, out.g, x.g, y.g, n);
    expect_close("add", out, 1e-6);
    double sc = bb_op_sum_squares(cpu, x.c, n), sg = bb_op_sum_squares(gpu, x.g, n);
    cr_assert(fabs(sc - sg) <= 1e-9 * sc, "sum_squares %.12g vs %.12g", sc, sg);
    twin big = random_twin(600001, 15, 1); /* more blocks than the partial sums hold */
    sc = bb_op_sum_squares(cpu, big.c, big.n), sg = bb_op_sum_squares(gpu, big.g, big.n);
    cr_assert(fabs(sc - sg) <= 1e-9 * sc, "sum_squares of %zu: %.12g vs %.12g", big.n, sc, sg);
}

/* Random bit patterns (NaNs, infinities and subnormals among them; every
 * fourth an exact tie) and the edge cases, rounded with and without
 * packing: the same bits on both backends. */
Test(cuda, bf16_storage_matches_cpu_to_the_bit)
{
    need_gpu();
    enum { N = 100003 };
    const float special[] = {0.0f, -0.0f, 1.00390625f, 1.01171875f, 3.4028235e38f, -3.3895e38f, 1e-40f, INFINITY,
                             -INFINITY, NAN};
    float *h = malloc(N * sizeof *h);
    uint64_t s = 16;
    for (int i = 0; i < N; i++) {
        uint32_t bits = (uint32_t)(bb_splitmix64(&s) >> 32);
        if (i % 4 == 1) bits = (bits & 0xffff0000u) | 0x8000u;
        memcpy(&h[i], &bits, sizeof bits);
        if (i < (int)(sizeof special / sizeof *special)) h[i] = special[i];
    }
    twin x = upload(h, N * sizeof *h), unpacked = upload(h, N * sizeof *h), back = random_twin(N, 17, 1);
    uint16_t *pc, *pg, *hc = malloc(N * sizeof *hc), *hg = malloc(N * sizeof *hg);
    float *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    cr_assert_eq(bb_backend_alloc(cpu, N * sizeof *pc, "test", (void **)&pc), BB_OK);
    cr_assert_eq(bb_backend_alloc(gpu, N * sizeof *pg, "test", (void **)&pg), BB_OK);
    bb_op_bf16_round(cpu, x.c, pc, N), bb_op_bf16_round(gpu, x.g, pg, N);
    bb_op_bf16_round(cpu, unpacked.c, NULL, N), bb_op_bf16_round(gpu, unpacked.g, NULL, N);
    bb_op_bf16_unpack(cpu, back.c, pc, N), bb_op_bf16_unpack(gpu, back.g, pg, N);
    cr_assert_eq(bb_backend_synchronize(gpu), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_backend_copy(cpu, hc, pc, N * sizeof *hc, BB_COPY_D2H), BB_OK);
    cr_assert_eq(bb_backend_copy(gpu, hg, pg, N * sizeof *hg, BB_COPY_D2H), BB_OK, "%s", bb_error_message());
    cr_assert_eq(memcmp(hc, hg, N * sizeof *hc), 0, "packed bf16 bits differ");
    const twin *outs[] = {&x, &unpacked, &back};
    const char *names[] = {"bf16_round", "bf16_round (no packing)", "bf16_unpack"};
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(bb_backend_copy(cpu, a, outs[k]->c, N * sizeof *a, BB_COPY_D2H), BB_OK);
        cr_assert_eq(bb_backend_copy(gpu, b, outs[k]->g, N * sizeof *b, BB_COPY_D2H), BB_OK, "%s", bb_error_message());
        cr_assert_eq(memcmp(a, b, N * sizeof *a), 0, "%s: CUDA and CPU bits differ", names[k]);
    }
    bb_backend_free(cpu, pc), bb_backend_free(gpu, pg);
    free(h), free(hc), free(hg), free(a), free(b);
}

static void layernorm_case(int N, int C)
{
    twin in = random_twin((size_t)N * C, 21, 3), w = random_twin(C, 22, 1), b = random_twin(C, 23, 1);
    twin out = random_twin((size_t)N * C, 24, 1), mean = random_twin(N, 25, 1), rstd = random_twin(N, 26, 1);
    twin dout = random_twin((size_t)N * C, 27, 1), din = random_twin((size_t)N * C, 28, 1);
    twin dw = random_twin(C, 29, 1), db = random_twin(C, 30, 1);
    bb_op_layernorm_forward(cpu, out.c, mean.c, rstd.c, in.c, w.c, b.c, N, C);
    bb_op_layernorm_forward(gpu, out.g, mean.g, rstd.g, in.g, w.g, b.g, N, C);
    expect_close("layernorm_forward", out, 1e-5);
    expect_close("layernorm mean", mean, 1e-5);
    expect_close("layernorm rstd", rstd, 1e-5);
    for (int acc = 0; acc < 2; acc++) {
        bb_op_layernorm_backward(cpu, din.c, dw.c, db.c, dout.c, in.c, w.c, mean.c, rstd.c, N, C, acc);
        bb_op_layernorm_backward(gpu, din.g, dw.g, db.g, dout.g, in.g, w.g, mean.g, rstd.g, N, C, acc);
        expect_close("layernorm_backward din (+=)", din, 1e-5);
        expect_close("layernorm_backward dw", dw, 1e-5);
        expect_close("layernorm_backward dbias", db, 1e-5);
    }
}

Test(cuda, layernorm_matches_cpu)
{
    need_gpu();
    layernorm_case(19, 97);
    layernorm_case(300, 1500); /* rows wider than a block; more rows than column chunks */
}

Test(cuda, embedding_matches_cpu)
{
    need_gpu();
    int B = 3, T = 5, C = 16, V = 11, maxT = 8;
    int32_t tokens[15] = {1, 4, 1, 0, 2, 4, 4, 9, 10, 1, 3, 3, 3, 7, 0}; /* repeats: the scatter adds */
    twin tok = upload(tokens, sizeof tokens);
    twin wte = random_twin((size_t)V * C, 31, 1), wpe = random_twin((size_t)maxT * C, 32, 1);
    twin out = random_twin((size_t)B * T * C, 33, 1), dout = random_twin((size_t)B * T * C, 34, 1);
    twin dwte = random_twin((size_t)V * C, 35, 1), dwpe = random_twin((size_t)maxT * C, 36, 1);
    bb_op_embedding_forward(cpu, out.c, (int32_t *)tok.c, wte.c, wpe.c, B, T, C);
    bb_op_embedding_forward(gpu, out.g, (int32_t *)tok.g, wte.g, wpe.g, B, T, C);
    expect_close("embedding_forward", out, 1e-6);
    for (int acc = 0; acc < 2; acc++) {
        bb_op_embedding_backward(cpu, dwte.c, dwpe.c, dout.c, (int32_t *)tok.c, B, T, C, V, maxT, acc, acc);
        bb_op_embedding_backward(gpu, dwte.g, dwpe.g, dout.g, (int32_t *)tok.g, B, T, C, V, maxT, acc, acc);
        expect_same_bits("embedding_backward dwte", dwte); /* the same ordered sums */
        expect_same_bits("embedding_backward dwpe", dwpe);
    }
}

/* Deterministic at scale: many positions per token (a GPT-2 batch's
 * shape), twice the same bits, and the CPU's bits. */
Test(cuda, embedding_backward_is_deterministic_and_bitwise_the_cpu)
{
    need_gpu();
    int B = 8, T = 1024, C = 768, V = 50257;
    int32_t *tokens = malloc((size_t)B * T * sizeof *tokens);
    uint64_t st = 5;
    for (int i = 0; i < B * T; i++) tokens[i] = (int32_t)(bb_splitmix64(&st) % (i % 3 ? 64 : (uint64_t)V));
    twin tok = upload(tokens, (size_t)B * T * sizeof *tokens);
    twin dout = random_twin((size_t)B * T * C, 37, 1), dwte = random_twin((size_t)V * C, 38, 1);
    twin dwpe = random_twin((size_t)T * C, 39, 1);
    float *first = malloc((size_t)V * C * sizeof *first), *second = malloc((size_t)V * C * sizeof *second);
    for (int run = 0; run < 2; run++) {
        bb_op_embedding_backward(gpu, dwte.g, dwpe.g, dout.g, (int32_t *)tok.g, B, T, C, V, T, false, false);
        cr_assert_eq(bb_backend_copy(gpu, run ? second : first, dwte.g, (size_t)V * C * sizeof(float), BB_COPY_D2H),
                     BB_OK, "%s", bb_error_message());
    }
    cr_assert_eq(memcmp(first, second, (size_t)V * C * sizeof *first), 0, "two runs differ");
    bb_op_embedding_backward(cpu, dwte.c, dwpe.c, dout.c, (int32_t *)tok.c, B, T, C, V, T, false, false);
    expect_same_bits("embedding_backward dwte (GPT-2 shape)", dwte);
    free(first), free(second), free(tokens);
}

/* Loader records become the same batch on both backends. */
Test(cuda, records_to_batches_match_cpu)
{
    need_gpu();
    int B = 4, T = 9, count = 3, inputs = 10;
    for (int width = 2; width <= 4; width += 2) {
        size_t bytes = (size_t)count * (T + 1) * width;
        uint8_t *rec = calloc(1, bytes + 4);
        for (size_t i = 0; i < bytes; i++) rec[i] = (uint8_t)(i * 37 + width);
        twin r = upload(rec, (bytes + 3) / 4 * 4);
        twin tok = random_twin((size_t)B * T, 81, 1), tgt = random_twin((size_t)B * T, 82, 1);
        bb_op_records_to_tokens(cpu, (int32_t *)tok.c, (int32_t *)tgt.c, (uint8_t *)r.c, count, B, T, width);
        bb_op_records_to_tokens(gpu, (int32_t *)tok.g, (int32_t *)tgt.g, (uint8_t *)r.g, count, B, T, width);
        expect_same_bits("records_to_tokens inputs", tok);
        expect_same_bits("records_to_tokens targets", tgt);
        free(rec);
    }
    size_t bytes = (size_t)count * (inputs + 1);
    uint8_t *rec = calloc(1, bytes + 4);
    for (size_t i = 0; i < bytes; i++) rec[i] = (uint8_t)(i * 91);
    twin r = upload(rec, (bytes + 3) / 4 * 4);
    twin x = random_twin((size_t)B * inputs, 83, 1), y = random_twin((size_t)B, 84, 1);
    bb_op_records_to_images(cpu, x.c, (int32_t *)y.c, (uint8_t *)r.c, count, B, inputs);
    bb_op_records_to_images(gpu, x.g, (int32_t *)y.g, (uint8_t *)r.g, count, B, inputs);
    expect_same_bits("records_to_images features", x);
    expect_same_bits("records_to_images labels", y);
    free(rec);
}

/* A kernel that faults is reported by the next synchronizing call (and,
 * under CUDA_LAUNCH_BLOCKING=1, as gpu_check.sh runs this, named). */
Test(cuda, a_faulting_kernel_fails_the_next_synchronizing_call)
{
    need_gpu();
    float *x;
    cr_assert_eq(bb_backend_alloc(gpu, 64, "x", (void **)&x), BB_OK);
    bb_op_relu_forward(gpu, x, x, (size_t)1 << 32); /* far past the allocation: an illegal address */
    cr_assert_eq(bb_backend_synchronize(gpu), BB_ERR_DEVICE, "the fault was not reported");
    const char *blocking = getenv("CUDA_LAUNCH_BLOCKING");
    if (blocking && !strcmp(blocking, "1"))
        cr_assert(strstr(bb_error_message(), "relu_forward"), "the error should name the op: %s", bb_error_message());
    cr_assert_eq(bb_backend_synchronize(gpu), BB_ERR_DEVICE, "a failed device stays failed");
}

/* The tiled attention kernels against the CPU's tiled attention: the
 * output, the log-sum-exp and the gradient. The backward of each side
 * reads its own forward's output and lse. */
static void attention_case(int B, int T, int C, int NH, double tol)
{
    twin qkv = random_twin((size_t)B * T * 3 * C, 41, 1), out = random_twin((size_t)B * T * C, 42, 1);
    twin lse = random_twin((size_t)B * NH * T, 43, 1);
    twin dout = random_twin((size_t)B * T * C, 45, 1), dqkv = random_twin((size_t)B * T * 3 * C, 46, 1);
    bb_op_attention_forward(cpu, out.c, lse.c, qkv.c, B, T, C, NH);
    bb_op_attention_forward(gpu, out.g, lse.g, qkv.g, B, T, C, NH);
    expect_close("attention_forward", out, tol);
    expect_close("attention log-sum-exp", lse, tol);
    bb_op_attention_backward(cpu, dqkv.c, dout.c, qkv.c, out.c, lse.c, B, T, C, NH);
    bb_op_attention_backward(gpu, dqkv.g, dout.g, qkv.g, out.g, lse.g, B, T, C, NH);
    expect_close("attention_backward", dqkv, tol);
    /* incremental decoding: the last row of sequence 0 alone, on both, and the CPU's against its forward's row */
    twin dec = random_twin((size_t)C, 47, 1), scores = random_twin((size_t)NH * T, 48, 1);
    bb_op_attention_decode(cpu, dec.c, scores.c, qkv.c, T, C, NH);
    bb_op_attention_decode(gpu, dec.g, scores.g, qkv.g, T, C, NH);
    expect_close("attention_decode", dec, tol);
    double diff = 0;
    for (int i = 0; i < C; i++) diff = fmax(diff, fabs(dec.c[i] - out.c[(size_t)(T - 1) * C + i]));
    cr_assert(diff < 1e-5, "attention_decode differs from attention_forward's last row by %.3e", diff);
}

Test(cuda, attention_matches_cpu)
{
    need_gpu();
    attention_case(2, 7, 12, 3, 1e-5);
    attention_case(2, 70, 32, 4, 1e-5);    /* several key tiles and row blocks, a partial last tile */
    attention_case(1, 1024, 768, 12, 1e-5); /* GPT-2's heads (64 wide), T 1024 */
    attention_case(1, 300, 1024, 4, 1e-5);  /* heads of 256: more than 48 KiB of shared memory */
}

/* A gpt decoding token by token with its key/value cache on the GPU gives
 * the CPU's logits at every position. */
Test(cuda, decoding_with_the_cache_matches_cpu)
{
    need_gpu();
    bb_model_config c = bb_model_gpt_config(2, 2, 32, 24, 50);
    bb_model_t *mc, *mg;
    cr_assert_eq(bb_model_create(cpu, &c, 1, &mc), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_model_create(gpu, &c, 1, &mg), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_model_init(mc, 5), BB_OK);
    cr_assert_eq(bb_model_init(mg, 5), BB_OK);
    float lc[50], lg[50];
    for (int pos = 0; pos < c.seq_len; pos++) {
        int32_t token = (pos * 7 + 3) % c.vocab;
        cr_assert_eq(bb_model_decode(mc, token, pos, lc), BB_OK, "%s", bb_error_message());
        cr_assert_eq(bb_model_decode(mg, token, pos, lg), BB_OK, "%s", bb_error_message());
        double diff = 0, norm = 0;
        for (int v = 0; v < c.vocab; v++) diff = fmax(diff, fabs(lc[v] - lg[v])), norm = fmax(norm, fabs(lc[v]));
        cr_assert(diff <= 1e-5 * fmax(norm, 1e-3), "position %d: the GPU's logits differ by %.3e", pos, diff);
    }
    bb_model_destroy(mg), bb_model_destroy(mc);
}

Test(cuda, softmax_crossentropy_matches_cpu)
{
    need_gpu();
    int N = 9, V = 301;
    int32_t targets[9] = {3, 0, -1, 300, 17, 17, -1, 5, 299};
    twin tg = upload(targets, sizeof targets);
    twin logits = random_twin((size_t)N * V, 51, 6), dl = random_twin((size_t)N * V, 52, 1);
    double lc, lg;
    int vc, vg;
    bb_op_softmax_crossentropy(cpu, &lc, dl.c, logits.c, (int32_t *)tg.c, N, V, 7.0f, &vc);
    bb_op_softmax_crossentropy(gpu, &lg, dl.g, logits.g, (int32_t *)tg.g, N, V, 7.0f, &vg);
    cr_assert(fabs(lc - lg) <= 1e-5 * fabs(lc), "loss %.9g vs %.9g", lc, lg);
    cr_assert_eq(vc, vg);
    expect_close("softmax_crossentropy dlogits", dl, 1e-5);
    /* dlogits may alias the logits */
    bb_op_softmax_crossentropy(cpu, &lc, logits.c, logits.c, (int32_t *)tg.c, N, V, 7.0f, NULL);
    bb_op_softmax_crossentropy(gpu, &lg, logits.g, logits.g, (int32_t *)tg.g, N, V, 7.0f, NULL);
    expect_close("softmax_crossentropy in place", logits, 1e-5);
}

/* Argmax hits: ties (the first wins), NaNs (first and elsewhere), ignored
 * rows, and many rows, counted the same on both backends. */
Test(cuda, count_correct_matches_cpu)
{
    need_gpu();
    enum { N = 5003, V = 10 };
    float *h = random_host((size_t)N * V, 61, 3);
    int32_t *targets = malloc(N * sizeof *targets);
    for (int n = 0; n < N; n++) {
        targets[n] = n % 7 == 0 ? -1 : (int32_t)((n * 2654435761u) % V);
        if (n % 5 == 1) h[(size_t)n * V + 4] = h[(size_t)n * V + 7] = 10; /* a tie: 4 wins */
        if (n % 11 == 2) h[(size_t)n * V] = NAN;
        if (n % 13 == 3) h[(size_t)n * V + 2] = NAN;
    }
    twin logits = upload(h, (size_t)N * V * sizeof *h), tg = upload(targets, N * sizeof *targets);
    int c = bb_op_count_correct(cpu, logits.c, (int32_t *)tg.c, N, V);
    int g = bb_op_count_correct(gpu, logits.g, (int32_t *)tg.g, N, V);
    cr_assert_eq(bb_backend_synchronize(gpu), BB_OK, "%s", bb_error_message());
    cr_assert_eq(c, g, "count_correct: cpu %d, gpu %d", c, g);
    cr_assert_gt(c, N / V / 2, "a random classifier still hits some rows");
    free(h), free(targets);
}

Test(cuda, optimizers_match_cpu)
{
    need_gpu();
    size_t n = 5003;
    twin p = random_twin(n, 61, 1), g = random_twin(n, 62, 1), m = random_twin(n, 63, 0.1f), v = random_twin(n, 64, 0.1f);
    float *absv = malloc(n * sizeof *absv);
    bb_backend_copy(cpu, absv, v.c, n * sizeof *absv, BB_COPY_D2H);
    for (size_t i = 0; i < n; i++) absv[i] = fabsf(absv[i]); /* second moments are >= 0 */
    bb_backend_copy(cpu, v.c, absv, n * sizeof *absv, BB_COPY_H2D);
    bb_backend_copy(gpu, v.g, absv, n * sizeof *absv, BB_COPY_H2D);
    free(absv);
    for (int t = 1; t <= 3; t++) {
        bb_op_adamw(cpu, p.c, g.c, m.c, v.c, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f);
        bb_op_adamw(gpu, p.g, g.g, m.g, v.g, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f);
    }
    expect_close("adamw params", p, 1e-5);
    expect_close("adamw m", m, 1e-5);
    expect_close("adamw v", v, 1e-5);
    bb_op_sgd(cpu, p.c, g.c, m.c, n, 0.1f, 0.9f, 0.01f, 0.5f), bb_op_sgd(gpu, p.g, g.g, m.g, n, 0.1f, 0.9f, 0.01f, 0.5f);
    expect_close("sgd params", p, 1e-5);
}

Test(cuda, out_of_memory_says_how_much_is_free)
{
    need_gpu();
    void *p;
    cr_assert_eq(bb_backend_alloc(gpu, (size_t)1 << 50, "activations", &p), BB_ERR_OOM);
    const char *msg = bb_error_message();
    cr_assert(strstr(msg, "cuda:0") && strstr(msg, "free on the device") && strstr(msg, "--micro-batch") &&
                  strstr(msg, "--checkpoint"),
              "%s", msg);
    cr_assert_eq(bb_backend_synchronize(gpu), BB_OK, "an out-of-memory must not poison later calls: %s",
                 bb_error_message());
}

/* ---- a training run ----------------------------------------------------- */
static char *token_dataset(const char *root)
{
    enum { T = 32, RECORDS = 400, VOCAB = 64 };
    uint32_t rs = 2 * (T + 1);
    uint8_t *r = malloc((size_t)RECORDS * rs);
    for (size_t i = 0; i < RECORDS; i++)
        for (int t = 0; t <= T; t++) {
            uint16_t v = (uint16_t)((i * 5 + (size_t)t * 7 + (t % 3 == 0 ? i % 13 : 0)) % VOCAB);
            r[i * rs + 2 * t] = (uint8_t)v, r[i * rs + 2 * t + 1] = (uint8_t)(v >> 8);
        }
    bb_shard_meta m = {.kind = BB_RECORD_TOKENS_U16, .rank = 1, .shape = {T + 1}, .record_size = rs,
                       .classes_or_vocab = VOCAB};
    char *dir = tu_path(root, "tokens");
    tu_write_dataset(dir, &m, r, RECORDS);
    free(r);
    return dir;
}

/* Ten steps of a small gpt on `data`, on the CPU (switch o.device to run it on GPU 0). */
static bb_train_options ten_steps(const char *data)
{
    bb_train_options o;
    bb_train_defaults(&o);
    o.model = bb_model_gpt_config(2, 4, 64, 0, 0);
    o.data = data;
    o.devices = 1, o.global_batch = 32, o.micro_batch = 8; /* accumulation 4 */
    o.steps = 10, o.epochs = 0;
    o.opt.lr = 3e-3;
    o.progress = NULL;
    return o;
}

Test(cuda, ten_training_steps_match_the_cpu)
{
    need_gpu();
    char *root = tu_temp_dir(), *data = token_dataset(root);
    bb_train_options o = ten_steps(data);
    bb_train_result c, g;
    cr_assert_eq(bb_train_run(&o, &c), BB_OK, "cpu: %s", bb_error_message());
    o.device = BB_DEVICE_CUDA;
    o.device_ids[0] = 0;
    cr_assert_eq(bb_train_run(&o, &g), BB_OK, "cuda: %s", bb_error_message());
    for (int s = 0; s < 10; s++) {
        double rel = fabs(c.losses[s] - g.losses[s]) / fabs(c.losses[s]);
        cr_log_info("step %d: cpu %.7f cuda %.7f (rel %.1e)", s + 1, c.losses[s], g.losses[s], rel);
        cr_assert(rel <= 1e-4, "step %d: cpu loss %.9g, cuda %.9g", s + 1, c.losses[s], g.losses[s]);
    }
    /* --zero 1 on one GPU (its shard: everything): the same training */
    o.zero = 1;
    bb_train_result z;
    cr_assert_eq(bb_train_run(&o, &z), BB_OK, "cuda --zero 1: %s", bb_error_message());
    for (int s = 0; s < 10; s++)
        cr_assert(fabs(c.losses[s] - z.losses[s]) <= 1e-4 * fabs(c.losses[s]), "--zero 1 step %d: cpu %.9g, cuda %.9g",
                  s + 1, c.losses[s], z.losses[s]);
    bb_train_result_free(&z);
    o.zero = 0;
    /* --precision bf16: bf16 activations on both, bf16 products on the GPU */
    o.precision = BB_PRECISION_BF16;
    bb_train_result g16, c16;
    cr_assert_eq(bb_train_run(&o, &g16), BB_OK, "cuda bf16: %s", bb_error_message());
    o.device = BB_DEVICE_CPU;
    cr_assert_eq(bb_train_run(&o, &c16), BB_OK, "cpu bf16: %s", bb_error_message());
    for (int s = 0; s < 10; s++) {
        double rel = fabs(c16.losses[s] - g16.losses[s]) / fabs(c16.losses[s]);
        cr_log_info("bf16 step %d: cpu %.7f cuda %.7f (rel %.1e)", s + 1, c16.losses[s], g16.losses[s], rel);
        cr_assert(rel <= 2e-2, "bf16 step %d: cpu loss %.9g, cuda %.9g", s + 1, c16.losses[s], g16.losses[s]);
    }
    cr_assert_lt(g16.peak_bytes[0], g.peak_bytes[0], "bf16 activations should need less GPU memory");
    bb_train_result_free(&c), bb_train_result_free(&g), bb_train_result_free(&c16), bb_train_result_free(&g16);
    tu_rm_tree(root);
    free(data), free(root);
}

/* ---- bf16 matrix products: ≤ 2e-2 against the CPU's fp32 ---------------- */
Test(cuda, bf16_products_stay_within_2e_2_of_fp32)
{
    need_gpu();
    bb_backend_destroy(gpu);
    bb_backend_options o = {.precision = BB_PRECISION_BF16};
    cr_assert_eq(bb_backend_create_cuda(&o, &gpu), BB_OK, "%s", bb_error_message());
    int N = 64, IC = 96, OC = 80, B = 2, T = 16, C = 48, NH = 4;
    twin in = random_twin((size_t)N * IC, 71, 1), w = random_twin((size_t)OC * IC, 72, 0.5f), b = random_twin(OC, 73, 1);
    twin out = random_twin((size_t)N * OC, 74, 1), dout = random_twin((size_t)N * OC, 75, 1);
    twin din = random_twin((size_t)N * IC, 76, 1), dw = random_twin((size_t)OC * IC, 77, 1), db = random_twin(OC, 78, 1);
    bb_op_linear_forward(cpu, out.c, in.c, w.c, b.c, N, IC, OC);
    bb_op_linear_forward(gpu, out.g, in.g, w.g, b.g, N, IC, OC);
    expect_close("bf16 linear_forward", out, 2e-2);
    bb_op_linear_backward(cpu, din.c, dw.c, db.c, dout.c, in.c, w.c, N, IC, OC, false);
    bb_op_linear_backward(gpu, din.g, dw.g, db.g, dout.g, in.g, w.g, N, IC, OC, false);
    expect_close("bf16 linear_backward din", din, 2e-2);
    expect_close("bf16 linear_backward dw", dw, 2e-2);
    attention_case(B, T, C, NH, 2e-2);
}

/* ---- NCCL ------------------------------------------------------------------ */
#include "train/reducer.h"

/* NCCL is loaded when a multi-GPU reducer needs it, not when the binary
 * starts; a missing library is one clear error naming it. */
Test(cuda, nccl_loads_on_demand_and_a_missing_library_is_named)
{
    bb_cuda_info info;
    bb_cuda_probe(&info);
    setenv("BB_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
    int version = -1;
    cr_assert_eq(bb_reducer_load_nccl(&version), BB_ERR_UNSUPPORTED);
    unsetenv("BB_NCCL_LIBRARY");
    if (!info.compiled) {
        cr_assert(strstr(bb_error_message(), "CUDA build"), "%s", bb_error_message());
        return;
    }
    cr_assert(strstr(bb_error_message(), "/nonexistent/libnccl.so.2"), "%s", bb_error_message());
    cr_assert(strstr(bb_error_message(), "BB_NCCL_LIBRARY"), "the error should say how to point at NCCL: %s",
              bb_error_message());
}

Test(cuda, nccl_from_the_toolkit_loads_without_a_gpu)
{
    bb_cuda_info info;
    bb_cuda_probe(&info);
    if (!info.compiled) cr_skip_test("skipped: not a CUDA build");
    if (access("/usr/local/cuda/lib64/libnccl.so.2", R_OK) != 0 && !getenv("BB_NCCL_LIBRARY"))
        cr_skip_test("skipped: no libnccl.so.2 in the toolkit here");
    int version = 0;
    cr_assert_eq(bb_reducer_load_nccl(&version), BB_OK, "%s", bb_error_message());
    cr_assert_geq(version, 21400, "NCCL %d", version);
    cr_log_info("NCCL %d loaded with dlopen", version);
}

/* One GPU, one rank: NCCL is loaded, its communicator made (non-blocking),
 * and a step's buckets reduced (the average of one is itself); then an
 * abort ends the communicator without waiting. */
Test(cuda, a_one_gpu_nccl_reducer_reduces_and_aborts)
{
    need_gpu();
    bb_model_config c = bb_model_gpt_config(2, 2, 32, 8, 50);
    bb_model_t *m;
    cr_assert_eq(bb_model_create(gpu, &c, 2, &m), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_model_init(m, 1), BB_OK);
    size_t n = bb_model_param_count(m);
    float *host = random_host(n, 91, 1), *back = malloc(n * sizeof *back);
    float *grads[1] = {bb_model_grads(m)}, *params[1] = {bb_model_params(m)};
    cr_assert_eq(bb_backend_copy(gpu, grads[0], host, n * sizeof *host, BB_COPY_H2D), BB_OK);
    reducer_t *r;
    bb_device_spec spec = {.kind = BB_DEVICE_CUDA, .count = 1, .world = 1};
    reducer_args ra = {.spec = &spec, .model = m, .be = &gpu, .grads = grads, .params = params,
                       .bucket_bytes = 4096, .zero = 1};
    cr_assert_eq(bb_reducer_create_nccl(&ra, &r), BB_OK, "%s", bb_error_message());
    cr_assert_gt(bb_reducer_bucket_count(r), 1);
    for (int step = 0; step < 3; step++) {
        bb_reducer_post(r, 0, n / 2);
        bb_reducer_post(r, 0, 0);
        bb_reducer_wait(r, 0);
        cr_assert(!bb_reducer_aborted(r), "%s", r->failure_message);
    }
    cr_assert_eq(bb_backend_copy(gpu, back, grads[0], n * sizeof *back, BB_COPY_D2H), BB_OK, "%s", bb_error_message());
    cr_assert_eq(memcmp(host, back, n * sizeof *back), 0, "the average over one GPU changed the gradients");
    cr_assert_eq(bb_reducer_allreduce_scalar(r, 0, 2.5), 2.5, "the mean over one GPU of 2.5");
    cr_assert(bb_reducer_broadcast_stop(r, 0, true) && !bb_reducer_broadcast_stop(r, 0, false));
    /* ZeRO-1's gather over one GPU: its own slices, the weights unchanged */
    float *before = malloc(n * sizeof *before);
    cr_assert_eq(bb_backend_copy(gpu, before, params[0], n * sizeof *before, BB_COPY_D2H), BB_OK);
    cr_assert(bb_reducer_allgather(r, 0), "%s", r->failure_message);
    cr_assert_eq(bb_backend_copy(gpu, back, params[0], n * sizeof *back, BB_COPY_D2H), BB_OK, "%s", bb_error_message());
    cr_assert_eq(memcmp(before, back, n * sizeof *back), 0, "the gather over one GPU changed the weights");
    free(before);
    bb_reducer_abort(r);
    cr_assert(bb_reducer_aborted(r));
    bb_reducer_post(r, 0, 0); /* after an abort: returns at once */
    bb_reducer_wait(r, 0);
    bb_reducer_destroy(r);
    bb_model_destroy(m);
    free(host), free(back);
}

/* Resume is bitwise on the GPU too (deterministic ops: item 5 of issue 13). */
Test(cuda, resume_on_the_gpu_is_bitwise)
{
    need_gpu();
    char *root = tu_temp_dir(), *data = token_dataset(root), *ckpt = tu_path(root, "ckpt");
    bb_train_options o;
    bb_train_defaults(&o);
    o.model = bb_model_gpt_config(2, 4, 64, 0, 0);
    o.data = data;
    o.devices = 1, o.global_batch = 32, o.micro_batch = 8;
    o.steps = 6, o.epochs = 0;
    o.progress = NULL;
    o.device = BB_DEVICE_CUDA;
    o.device_ids[0] = 0;
    bb_train_result whole, first, second;
    cr_assert_eq(bb_train_run(&o, &whole), BB_OK, "%s", bb_error_message());
    o.save_dir = ckpt, o.stop_after = 3;
    cr_assert_eq(bb_train_run(&o, &first), BB_OK, "%s", bb_error_message());
    o.save_dir = NULL, o.stop_after = 0, o.resume_dir = ckpt, o.set = BB_TRAIN_SET(BB_TRAIN_SAVE);
    cr_assert_eq(bb_train_run(&o, &second), BB_OK, "%s", bb_error_message());
    cr_assert_eq(memcmp(whole.losses + 3, second.losses, 3 * sizeof *whole.losses), 0, "losses after the resume differ");
    cr_assert_eq(memcmp(whole.params, second.params, whole.param_count * sizeof *whole.params), 0,
                 "weights after the resume differ");
    bb_train_result_free(&whole), bb_train_result_free(&first), bb_train_result_free(&second);
    tu_rm_tree(root);
    free(data), free(ckpt), free(root);
}

/* The binary starts without NCCL: it is not among the libraries it needs. */
Test(cuda, the_binary_does_not_link_nccl)
{
    if (system("command -v readelf > /dev/null 2>&1") != 0) cr_skip_test("skipped: no readelf on this machine");
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "readelf -d '%s' 2>&1", tu_bigbatch_bin());
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char line[512];
    int needed = 0;
    while (fgets(line, sizeof line, p)) {
        if (strstr(line, "(NEEDED)")) needed++;
        cr_assert_null(strstr(line, "libnccl"), "bin/bigbatch links NCCL: %s", line);
    }
    cr_assert_eq(pclose(p), 0, "readelf failed");
    cr_assert_gt(needed, 0, "readelf listed no libraries: is %s an ELF binary?", tu_bigbatch_bin());
}
