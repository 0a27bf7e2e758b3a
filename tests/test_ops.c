/* test_ops.c — every op of ops.def on every backend this build has, held to
 * the CPU backend (tests/test_cpu_ops.c holds the CPU to finite differences
 * and written-out rules), in the manner of ggml's test-backend-ops: each op
 * has a case that makes its inputs, runs it, and names its outputs with a
 * tolerance, over several shapes. The harness runs a case on the CPU (one
 * thread: the reference) and on the backend under test from the same
 * inputs, and again on the backend under test, then compares:
 *
 *   cpu:3     three threads: every output within its tolerance of one
 *             thread's, and the same bits twice (deterministic);
 *   counting  the planner's backend: the same work counted (calls, FLOPs
 *             and elements of every op, from ops.def) as the CPU's profile
 *             measured, with memory that is never touched (its
 *             addresses are unmapped: a touch crashes the case);
 *   cuda      the GPU (emulated in `make cuda-emu`): every output within
 *             its tolerance, the same bits twice; skipped without a GPU.
 *
 * A case names its activation tensors (tc_act: the ones ops.def's ACT
 * lets be bf16); every other float tensor is f32 (convert's bf16 side is
 * bytes). The bf16 passes run each op that has activations with them in
 * bf16 on one or both sides, from inputs both sides share (rounded to
 * bf16 first):
 *
 *   cpu bf16  three threads on bf16 tensors against one thread's fp32:
 *             every output within bf16's tolerance, the same bits twice;
 *   counting  the same work counted on bf16 tensors;
 *   cuda bf16 the GPU on bf16 tensors against the CPU on bf16 tensors.
 *
 * An op given a dtype it does not take fails, naming it (the last tests). `every_op_has_a_case` keeps the table and
 * the cases in step: adding an op to ops.def fails it until the op has a
 * case here. The harness (buffers, sides, comparisons) is op_harness.h. */
#include "op_harness.h"

TestSuite(ops);

/* ---- the cases, one per op ---------------------------------------------- */
#define BE side_be(t)
#define D(i) (t->dims[i])

static void case_linear_forward(tc *t)
{
    int N = D(0), IC = D(1), OC = D(2), ldo = D(5) ? D(5) : OC;
    buf in = tc_act(t, tc_floats(t, "in", (size_t)N * IC, 1)), w = tc_act(t, tc_floats(t, "w", (size_t)OC * IC, 0.5f));
    buf bias = tc_floats(t, "bias", OC, 0.5f), out = tc_out(t, tc_floats(t, "out", (size_t)N * ldo, 1), 1e-5);
    if (!D(4)) tc_act(t, out); /* else f32 from bf16: the logits */
    TC_RUN(t, bb_op_linear_forward(BE, tc_t(t, out), tc_t(t, in), tc_t(t, w), D(3) ? tc_t(t, bias) : bb_no_tensor(),
                                   N, IC, OC, ldo));
}

static void case_linear_backward(tc *t)
{
    int N = D(0), IC = D(1), OC = D(2), ldd = D(5) ? D(5) : OC;
    bool acc = D(3), with_din = D(4);
    buf dout = tc_act(t, tc_floats(t, "dout", (size_t)N * ldd, 1)), in = tc_act(t, tc_floats(t, "in", (size_t)N * IC, 1));
    buf w = tc_act(t, tc_floats(t, "w", (size_t)OC * IC, 0.5f));
    buf din = tc_act(t, tc_out(t, tc_floats(t, "din", (size_t)N * IC, 1), 1e-5));
    buf dw = tc_out(t, tc_floats(t, "dw", (size_t)OC * IC, 1), 1e-5), db = tc_out(t, tc_floats(t, "dbias", OC, 1), 1e-5);
    TC_RUN(t, bb_op_linear_backward(BE, with_din ? tc_t(t, din) : bb_no_tensor(), tc_t(t, dw),
                                    with_din && ldd == OC ? tc_t(t, db) : bb_no_tensor(), tc_t(t, dout), tc_t(t, in),
                                    tc_t(t, w), N, IC, OC, ldd, acc));
}

static void case_linear_activation_forward(tc *t)
{
    int N = D(0), IC = D(1), OC = D(2);
    buf in = tc_act(t, tc_floats(t, "in", (size_t)N * IC, 1)), w = tc_act(t, tc_floats(t, "w", (size_t)OC * IC, 0.5f));
    buf bias = tc_floats(t, "bias", OC, 0.5f), out = tc_act(t, tc_out(t, tc_floats(t, "out", (size_t)N * OC, 1), 1e-5));
    buf pre = tc_act(t, tc_out(t, tc_floats(t, "pre", (size_t)N * OC, 1), 1e-5));
    TC_RUN(t, bb_op_linear_activation_forward(BE, (bb_activation)D(4), tc_t(t, out), D(5) ? tc_t(t, pre) : bb_no_tensor(),
                                              tc_t(t, in), tc_t(t, w), D(3) ? tc_t(t, bias) : bb_no_tensor(), N, IC,
                                              OC));
}

static void case_activation_linear_backward(tc *t)
{
    int N = D(0), IC = D(1), OC = D(2);
    bool acc = D(3), with_dbias = D(4);
    buf dout = tc_act(t, tc_floats(t, "dout", (size_t)N * OC, 1)), in = tc_act(t, tc_floats(t, "in", (size_t)N * IC, 1));
    buf w = tc_act(t, tc_floats(t, "w", (size_t)OC * IC, 0.5f)), pre = tc_act(t, tc_floats(t, "pre", (size_t)N * IC, 3));
    buf dpre = tc_act(t, tc_out(t, tc_floats(t, "dpre", (size_t)N * IC, 1), 1e-5));
    buf dw = tc_out(t, tc_floats(t, "dw", (size_t)OC * IC, 1), 1e-5), db = tc_out(t, tc_floats(t, "dbias", OC, 1), 1e-5);
    TC_RUN(t, bb_op_activation_linear_backward(BE, (bb_activation)D(5), tc_t(t, dpre), tc_t(t, dw),
                                               with_dbias ? tc_t(t, db) : bb_no_tensor(), tc_t(t, dout), tc_t(t, in),
                                               tc_t(t, w), tc_t(t, pre), N, IC, OC, acc));
}

static void case_activation_forward(tc *t)
{
    size_t n = (size_t)D(0);
    buf in = tc_act(t, tc_floats(t, "in", n, 4)), out = tc_act(t, tc_out(t, tc_floats(t, "out", n, 1), 1e-5));
    TC_RUN(t, bb_op_activation_forward(BE, (bb_activation)D(1), tc_t(t, out), tc_t(t, in), n));
}

static void case_activation_backward(tc *t)
{
    size_t n = (size_t)D(0);
    buf in = tc_act(t, tc_floats(t, "in", n, 4)), dout = tc_act(t, tc_floats(t, "dout", n, 1));
    buf din = tc_act(t, tc_out(t, tc_floats(t, "din", n, 1), 1e-5));
    TC_RUN(t, bb_op_activation_backward(BE, (bb_activation)D(1), tc_t(t, din), tc_t(t, dout), tc_t(t, in), n));
}

static void case_add(tc *t)
{
    size_t n = (size_t)D(0);
    buf x = tc_act(t, tc_floats(t, "x", n, 4)), y = tc_act(t, tc_floats(t, "y", n, 4));
    buf out = tc_act(t, tc_out(t, tc_floats(t, "out", n, 1), 0));
    TC_RUN(t, bb_op_add(BE, tc_t(t, out), tc_t(t, x), tc_t(t, y), n));
}

static void case_layernorm_forward(tc *t)
{
    int N = D(0), C = D(1);
    buf in = tc_act(t, tc_floats(t, "in", (size_t)N * C, 3)), w = tc_floats(t, "w", C, 1), b = tc_floats(t, "bias", C, 1);
    buf out = tc_act(t, tc_out(t, tc_floats(t, "out", (size_t)N * C, 1), 1e-5));
    buf mean = tc_out(t, tc_floats(t, "mean", N, 1), 1e-5);
    buf rstd = tc_out(t, tc_floats(t, "rstd", N, 1), 1e-5);
    TC_RUN(t, bb_op_layernorm_forward(BE, tc_t(t, out), tc_p(t, mean), tc_p(t, rstd), tc_t(t, in), tc_t(t, w),
                                      tc_t(t, b), N, C));
}

/* res into its own buffer, or over x (the block's residual: res = x + y in place). */
static void case_residual_layernorm_forward(tc *t)
{
    int N = D(0), C = D(1);
    bool over_x = D(2);
    size_t n = (size_t)N * C;
    buf x = tc_act(t, tc_floats(t, "x", n, 3)), y = tc_act(t, tc_floats(t, "y", n, 3));
    buf w = tc_floats(t, "w", C, 1), b = tc_floats(t, "bias", C, 1);
    buf res = over_x ? tc_out(t, x, 0) : tc_act(t, tc_out(t, tc_floats(t, "res", n, 1), 0));
    buf out = tc_act(t, tc_out(t, tc_floats(t, "out", n, 1), 1e-5));
    buf mean = tc_out(t, tc_floats(t, "mean", N, 1), 1e-5), rstd = tc_out(t, tc_floats(t, "rstd", N, 1), 1e-5);
    TC_RUN(t, bb_op_residual_layernorm_forward(BE, tc_t(t, res), tc_t(t, out), tc_p(t, mean), tc_p(t, rstd),
                                               tc_t(t, x), tc_t(t, y), tc_t(t, w), tc_t(t, b), N, C));
}

/* The statistics the backward reads come from a forward on each side. */
static void case_layernorm_backward(tc *t)
{
    int N = D(0), C = D(1);
    buf in = tc_act(t, tc_floats(t, "in", (size_t)N * C, 3)), w = tc_floats(t, "w", C, 1), b = tc_floats(t, "bias", C, 1);
    buf out = tc_act(t, tc_floats(t, "out", (size_t)N * C, 1)), dout = tc_act(t, tc_floats(t, "dout", (size_t)N * C, 1));
    buf mean = tc_floats(t, "mean", N, 1), rstd = tc_floats(t, "rstd", N, 1);
    buf din = tc_act(t, tc_out(t, tc_floats(t, "din", (size_t)N * C, 1), 1e-5));
    buf dw = tc_out(t, tc_floats(t, "dw", C, 1), 1e-5), db = tc_out(t, tc_floats(t, "dbias", C, 1), 1e-5);
    TC_RUN(t, {
        bb_op_layernorm_forward(BE, tc_t(t, out), tc_p(t, mean), tc_p(t, rstd), tc_t(t, in), tc_t(t, w), tc_t(t, b),
                                N, C);
        bb_op_layernorm_backward(BE, tc_t(t, din), tc_t(t, dw), tc_t(t, db), tc_t(t, dout), tc_t(t, in), tc_t(t, w),
                                 tc_p(t, mean), tc_p(t, rstd), N, C, D(2));
    });
}

static void case_rmsnorm_forward(tc *t)
{
    int N = D(0), C = D(1);
    buf in = tc_act(t, tc_floats(t, "in", (size_t)N * C, 3)), w = tc_floats(t, "w", C, 1);
    buf out = tc_act(t, tc_out(t, tc_floats(t, "out", (size_t)N * C, 1), 1e-5));
    buf rstd = tc_out(t, tc_floats(t, "rstd", N, 1), 1e-5);
    TC_RUN(t, bb_op_rmsnorm_forward(BE, tc_t(t, out), tc_p(t, rstd), tc_t(t, in), tc_t(t, w), N, C, 1e-6f));
}

static void case_residual_rmsnorm_forward(tc *t)
{
    int N = D(0), C = D(1);
    size_t n = (size_t)N * C;
    buf x = tc_act(t, tc_floats(t, "x", n, 3)), y = tc_act(t, tc_floats(t, "y", n, 3)), w = tc_floats(t, "w", C, 1);
    buf res = D(2) ? tc_out(t, x, 0) : tc_act(t, tc_out(t, tc_floats(t, "res", n, 1), 0));
    buf out = tc_act(t, tc_out(t, tc_floats(t, "out", n, 1), 1e-5)), rstd = tc_out(t, tc_floats(t, "rstd", N, 1), 1e-5);
    TC_RUN(t, bb_op_residual_rmsnorm_forward(BE, tc_t(t, res), tc_t(t, out), tc_p(t, rstd), tc_t(t, x), tc_t(t, y),
                                             tc_t(t, w), N, C, 1e-5f));
}

static void case_rmsnorm_backward(tc *t)
{
    int N = D(0), C = D(1);
    buf in = tc_act(t, tc_floats(t, "in", (size_t)N * C, 3)), w = tc_floats(t, "w", C, 1);
    buf out = tc_act(t, tc_floats(t, "out", (size_t)N * C, 1)), dout = tc_act(t, tc_floats(t, "dout", (size_t)N * C, 1));
    buf rstd = tc_floats(t, "rstd", N, 1);
    buf din = tc_act(t, tc_out(t, tc_floats(t, "din", (size_t)N * C, 1), 1e-5));
    buf dw = tc_out(t, tc_floats(t, "dw", C, 1), 1e-5);
    TC_RUN(t, {
        bb_op_rmsnorm_forward(BE, tc_t(t, out), tc_p(t, rstd), tc_t(t, in), tc_t(t, w), N, C, 1e-5f);
        bb_op_rmsnorm_backward(BE, tc_t(t, din), tc_t(t, dw), tc_t(t, dout), tc_t(t, in), tc_t(t, w), tc_p(t, rstd), N,
                               C, D(2));
    });
}

/* B, T, heads, key/value heads, head size, first position: q and k turned in place, v kept. */
static void case_rope(tc *t, bool backward)
{
    int B = D(0), T = D(1), NH = D(2), KVH = D(3), HS = D(4), pos0 = D(5), W = (NH + 2 * KVH) * HS;
    buf table = tc_floats(t, "table", (size_t)(pos0 + T) * HS, 1);
    buf qkv = tc_act(t, tc_out(t, tc_floats(t, "qkv", (size_t)B * T * W, 2), 1e-6));
    if (backward) TC_RUN(t, bb_op_rope_backward(BE, tc_t(t, qkv), tc_p(t, table), B, T, NH, KVH, HS, pos0));
    else TC_RUN(t, bb_op_rope_forward(BE, tc_t(t, qkv), tc_p(t, table), B, T, NH, KVH, HS, pos0));
}
static void case_rope_forward(tc *t) { case_rope(t, false); }
static void case_rope_backward(tc *t) { case_rope(t, true); }

static void case_swiglu_forward(tc *t)
{
    int N = D(0), F = D(1);
    buf gu = tc_act(t, tc_floats(t, "gu", (size_t)N * 2 * F, 4));
    buf out = tc_act(t, tc_out(t, tc_floats(t, "out", (size_t)N * F, 1), 1e-5));
    TC_RUN(t, bb_op_swiglu_forward(BE, tc_t(t, out), tc_t(t, gu), N, F));
}

/* dgu into its own buffer, or over gu (the block's way). */
static void case_swiglu_backward(tc *t)
{
    int N = D(0), F = D(1);
    buf gu = tc_act(t, tc_floats(t, "gu", (size_t)N * 2 * F, 4)), dout = tc_act(t, tc_floats(t, "dout", (size_t)N * F, 1));
    buf dgu = D(2) ? tc_out(t, gu, 1e-5) : tc_act(t, tc_out(t, tc_floats(t, "dgu", (size_t)N * 2 * F, 1), 1e-5));
    TC_RUN(t, bb_op_swiglu_backward(BE, tc_t(t, dgu), tc_t(t, dout), tc_t(t, gu), N, F));
}

/* Tokens with repeats (the scatter adds); B, T, C, V, positions (0: none). */
static buf tokens_buf(tc *t, int n, int V, int repeat_every)
{
    int32_t *tok = malloc((size_t)n * sizeof *tok);
    uint64_t s = t->seed++;
    uint64_t few = V < 64 ? (uint64_t)V : 64; /* most positions: few tokens, many repeats */
    for (int i = 0; i < n; i++) tok[i] = (int32_t)(bb_splitmix64(&s) % (i % repeat_every ? few : (uint64_t)V));
    buf b = tc_bytes(t, "tokens", tok, (size_t)n * sizeof *tok);
    free(tok);
    return b;
}

static void case_embedding_forward(tc *t)
{
    int B = D(0), T = D(1), C = D(2), V = D(3), maxT = D(4);
    buf tok = tokens_buf(t, B * T, V, 3), wte = tc_floats(t, "wte", (size_t)V * C, 1);
    buf wpe = tc_floats(t, "wpe", (size_t)(maxT ? maxT : 1) * C, 1);
    buf out = tc_act(t, tc_out(t, tc_floats(t, "out", (size_t)B * T * C, 1), 0));
    TC_RUN(t, bb_op_embedding_forward(BE, tc_t(t, out), tc_p(t, tok), tc_t(t, wte), maxT ? tc_t(t, wpe) : bb_no_tensor(),
                                      B, T, C));
}

/* The token table's gradient is the same ordered sum everywhere: bitwise. */
static void case_embedding_backward(tc *t)
{
    int B = D(0), T = D(1), C = D(2), V = D(3), maxT = D(4);
    bool acc = D(5);
    buf tok = tokens_buf(t, B * T, V, 3), dout = tc_act(t, tc_floats(t, "dout", (size_t)B * T * C, 1));
    buf dwte = tc_out(t, tc_floats(t, "dwte", (size_t)V * C, 1), 0);
    buf dwpe = tc_out(t, tc_floats(t, "dwpe", (size_t)(maxT ? maxT : 1) * C, 1), 0);
    TC_RUN(t, bb_op_embedding_backward(BE, tc_t(t, dwte), maxT ? tc_t(t, dwpe) : bb_no_tensor(), tc_t(t, dout),
                                       tc_p(t, tok), B, T, C, V, maxT, acc, acc));
}

/* B, T, query heads, key/value heads, head size. */
static void case_attention_forward(tc *t)
{
    int B = D(0), T = D(1), NH = D(2), KVH = D(3), HS = D(4), W = (NH + 2 * KVH) * HS;
    buf qkv = tc_act(t, tc_floats(t, "qkv", (size_t)B * T * W, 1));
    buf out = tc_act(t, tc_out(t, tc_floats(t, "out", (size_t)B * T * NH * HS, 1), 1e-5));
    buf lse = tc_out(t, tc_floats(t, "lse", (size_t)B * NH * T, 1), 1e-5);
    TC_RUN(t, bb_op_attention_forward(BE, tc_t(t, out), tc_p(t, lse), tc_t(t, qkv), B, T, NH, KVH, HS));
}

/* The backward of each side reads its own forward's output and lse. */
static void case_attention_backward(tc *t)
{
    int B = D(0), T = D(1), NH = D(2), KVH = D(3), HS = D(4), W = (NH + 2 * KVH) * HS;
    buf qkv = tc_act(t, tc_floats(t, "qkv", (size_t)B * T * W, 1));
    buf out = tc_act(t, tc_floats(t, "out", (size_t)B * T * NH * HS, 1)), lse = tc_floats(t, "lse", (size_t)B * NH * T, 1);
    buf dout = tc_act(t, tc_floats(t, "dout", (size_t)B * T * NH * HS, 1));
    buf dqkv = tc_act(t, tc_out(t, tc_floats(t, "dqkv", (size_t)B * T * W, 1), 1e-5));
    TC_RUN(t, {
        bb_op_attention_forward(BE, tc_t(t, out), tc_p(t, lse), tc_t(t, qkv), B, T, NH, KVH, HS);
        bb_op_attention_backward(BE, tc_t(t, dqkv), tc_t(t, dout), tc_t(t, qkv), tc_t(t, out), tc_p(t, lse), B, T, NH,
                                 KVH, HS);
    });
}

/* The cache's rows 0..T-2 and the new row; the cache (its row T-1 written) and the output compared. */
static void case_attention_decode(tc *t)
{
    int T = D(1), NH = D(2), KVH = D(3), HS = D(4), W = (NH + 2 * KVH) * HS;
    buf kv = tc_out(t, tc_floats(t, "kv", (size_t)T * 2 * KVH * HS, 1), 0), qkv = tc_floats(t, "qkv", (size_t)W, 1);
    buf out = tc_out(t, tc_floats(t, "out", (size_t)NH * HS, 1), 1e-5), scores = tc_floats(t, "scores", (size_t)NH * T, 1);
    TC_RUN(t, bb_op_attention_decode(BE, tc_t(t, out), tc_p(t, scores), tc_t(t, kv), tc_t(t, qkv), T, NH, KVH, HS));
}

/* Targets in range, some -1 (ignored). */
static buf targets_buf(tc *t, int N, int V)
{
    int32_t *y = malloc((size_t)N * sizeof *y);
    for (int n = 0; n < N; n++) y[n] = n % 7 == 2 ? -1 : (int32_t)((n * 2654435761u) % (unsigned)V);
    buf b = tc_bytes(t, "targets", y, (size_t)N * sizeof *y);
    free(y);
    return b;
}

/* In place (dlogits = logits) or not; with the row count or without. */
static void case_softmax_crossentropy(tc *t)
{
    int N = D(0), V = D(1);
    bool in_place = D(2);
    buf logits = tc_floats(t, "logits", (size_t)N * V, 6), tg = targets_buf(t, N, V);
    buf dl = tc_out(t, tc_floats(t, "dlogits", (size_t)N * V, 1), 1e-5);
    if (in_place) tc_act(t, tc_out(t, logits, 1e-5)); /* bf16: the fused classifier's bf16 logits */
    else tc_act(t, dl); /* from fp32 logits */
    TC_RUN(t, {
        double loss;
        int valid;
        bb_op_softmax_crossentropy(BE, &loss, tc_t(t, in_place ? logits : dl), tc_t(t, logits), tc_p(t, tg), N, V,
                                   7.0f, in_place ? NULL : &valid);
        tc_value(t, "loss", loss, 1e-5);
        if (!in_place) tc_value(t, "valid rows", valid, 0);
    });
}

static void case_crossentropy_rows(tc *t)
{
    int N = D(0), V = D(1), ld = D(3) ? D(3) : V;
    bool in_place = D(2); /* the decoder's head: the gradient over the logits (bf16 ones under bf16) */
    buf logits = tc_floats(t, "logits", (size_t)N * ld, 6), tg = targets_buf(t, N, V);
    buf dl = in_place ? tc_act(t, tc_out(t, logits, 1e-5))
                      : tc_act(t, tc_out(t, tc_floats(t, "dlogits", (size_t)N * ld, 1), 1e-5));
    buf rows = tc_bytes(t, "row_loss", NULL, (size_t)N * sizeof(double));
    TC_RUN(t, {
        bb_op_crossentropy_rows(BE, tc_p(t, rows), tc_t(t, dl), tc_t(t, logits), tc_p(t, tg), N, V, ld, 3.0f);
        tc_value(t, "the rows' sum", bb_op_sum_rows(BE, tc_p(t, rows), (size_t)N), 1e-6);
    });
}

static void case_sum_rows(tc *t)
{
    size_t n = (size_t)D(0);
    double *x = malloc(n * sizeof *x);
    uint64_t s = t->seed++;
    for (size_t i = 0; i < n; i++) x[i] = uniform(&s, 100) * 1e-3 * (double)(i % 97);
    buf rows = tc_bytes(t, "rows", x, n * sizeof *x);
    free(x);
    /* non-negative terms summed in another order: within n·2⁻⁵³ (1.1e-11 at n 100003) of each other */
    TC_RUN(t, tc_value(t, "sum", bb_op_sum_rows(BE, tc_p(t, rows), n), (double)n * 0x1p-53));
}

/* Ties (the first wins), NaNs (first and elsewhere), ignored rows. */
static void case_count_correct(tc *t)
{
    int N = D(0), V = D(1);
    float *h = malloc((size_t)N * V * sizeof *h);
    uint64_t s = t->seed++;
    for (size_t i = 0; i < (size_t)N * V; i++) h[i] = uniform(&s, 3);
    for (int n = 0; n < N; n++) {
        if (n % 5 == 1) h[(size_t)n * V + 1] = h[(size_t)n * V + V - 1] = 10;
        if (n % 11 == 2) h[(size_t)n * V] = NAN;
        if (n % 13 == 3) h[(size_t)n * V + V / 2] = NAN;
    }
    buf logits = tc_given(t, "logits", h, (size_t)N * V), tg = targets_buf(t, N, V);
    free(h);
    TC_RUN(t, tc_value(t, "hits", bb_op_count_correct(BE, tc_t(t, logits), tc_p(t, tg), N, V), 0));
}

/* An Adam-family step's buffers: parameters, gradients and two moments
 * (the second ones >= 0), the moments and parameters outputs. */
typedef struct moments {
    buf p, g, m, v;
} moments;

static moments moment_buffers(tc *t, size_t n)
{
    moments b = {.p = tc_out(t, tc_floats(t, "params", n, 1), 1e-5), .g = tc_floats(t, "grads", n, 1)};
    b.m = tc_out(t, tc_floats(t, "m", n, 0.1f), 1e-5);
    b.v = tc_out(t, tc_floats(t, "v", n, 0.1f), 1e-5);
    float *vh = t->bufs[b.v].init;
    for (size_t i = 0; i < n; i++) vh[i] = fabsf(vh[i]);
    return b;
}

/* Three steps. */
static void case_adamw(tc *t)
{
    size_t n = (size_t)D(0);
    moments b = moment_buffers(t, n);
    TC_RUN(t, for (int step = 1; step <= 3; step++)
                  bb_op_adamw(BE, tc_p(t, b.p), tc_p(t, b.g), tc_p(t, b.m), tc_p(t, b.v), n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                              0.1f, step, 0.5f));
}

static void case_sgd(tc *t)
{
    size_t n = (size_t)D(0);
    buf p = tc_out(t, tc_floats(t, "params", n, 1), 1e-5);
    buf g = tc_floats(t, "grads", n, 1), m = tc_out(t, tc_floats(t, "momentum", n, 0.1f), 1e-5);
    TC_RUN(t, for (int step = 0; step < 2; step++)
                  bb_op_sgd(BE, tc_p(t, p), tc_p(t, g), tc_p(t, m), n, 0.1f, D(1) ? 0.9f : 0.0f, 0.01f, 0.5f));
}

/* Three steps of one tensor (more elements than a slice, and than the
 * GPU's partial sums cover at one a thread), with decay or without. */
static void case_lamb(tc *t)
{
    size_t n = (size_t)D(0);
    moments b = moment_buffers(t, n);
    TC_RUN(t, for (int step = 1; step <= 3; step++)
                  bb_op_lamb(BE, tc_p(t, b.p), tc_p(t, b.g), tc_p(t, b.m), tc_p(t, b.v), n, 1e-2f, 0.9f, 0.999f, 1e-6f,
                             D(1) ? 0.1f : 0.0f, step, 0.5f));
}

/* Two steps, adapted (trust coefficient 0.001) or not (0), with momentum or without. */
static void case_lars(tc *t)
{
    size_t n = (size_t)D(0);
    buf p = tc_out(t, tc_floats(t, "params", n, 1), 1e-5);
    buf g = tc_floats(t, "grads", n, 1), m = tc_out(t, tc_floats(t, "momentum", n, 0.1f), 1e-5);
    TC_RUN(t, for (int step = 0; step < 2; step++)
                  bb_op_lars(BE, tc_p(t, p), tc_p(t, g), tc_p(t, m), n, 0.5f, D(2) ? 0.9f : 0.0f, 0.01f,
                             D(1) ? 1e-3f : 0.0f, 0.5f));
}

/* Two steps of one matrix, wide (rows <= cols: X Xᵀ) or tall (on Xᵀ),
 * with decay or without; its work is scratch (not compared). */
static void case_muon(tc *t)
{
    int rows = D(0), cols = D(1);
    size_t n = (size_t)rows * cols;
    buf p = tc_out(t, tc_floats(t, "params", n, 1), 1e-4);
    buf g = tc_floats(t, "grads", n, 1), m = tc_out(t, tc_floats(t, "momentum", n, 0.1f), 1e-5);
    buf work = tc_floats(t, "work", bb_muon_work_floats(rows, cols), 0);
    TC_RUN(t, for (int step = 0; step < 2; step++)
                  bb_op_muon(BE, tc_p(t, p), tc_p(t, g), tc_p(t, m), tc_p(t, work), rows, cols, 0.02f, 0.95f,
                             D(2) ? 0.1f : 0.0f, 0.2f * sqrtf((float)(rows > cols ? rows : cols)), 0.5f));
}

/* Ranges of a buffer (a shard's): every third 1000 floats, and one range. */
static void case_sum_squares_ranges(tc *t)
{
    size_t n = (size_t)D(0), lo[64], hi[64];
    int ranges = 0;
    for (size_t a = 0; a < n && ranges < 64 && D(1); a += 3000) lo[ranges] = a, hi[ranges++] = a + 1000 < n ? a + 1000 : n;
    if (!D(1)) lo[0] = 0, hi[0] = n, ranges = 1;
    buf x = tc_floats(t, "x", n, 1);
    TC_RUN(t, tc_value(t, "sum of squares", bb_op_sum_squares_ranges(BE, tc_p(t, x), lo, hi, ranges), 1e-9));
}

/* Into memory the device writes, read after the backend's synchronization. */
static void case_sum_squares_into(tc *t)
{
    size_t n = (size_t)D(0);
    buf x = tc_floats(t, "x", n, 1);
    TC_RUN(t, {
        double *out = NULL; /* each side's own pinned memory (the counting backend's is never touched) */
        cr_assert_eq(bb_backend_host_alloc(BE, sizeof *out, (void **)&out), BB_OK);
        bb_op_sum_squares_into(BE, tc_p(t, x), n, out);
        cr_assert_eq(bb_backend_synchronize(BE), BB_OK);
        tc_value(t, "sum of squares", t->counting ? 0 : *out, 1e-9);
        bb_backend_host_free(BE, out, sizeof *out);
    });
}

/* Random bit patterns (NaNs, infinities and subnormals among them; every
 * fourth an exact tie) and the edge cases, with and without packing. */
static buf special_floats(tc *t, size_t n)
{
    static const float special[] = {0.0f, -0.0f, 1.00390625f, 1.01171875f, 3.4028235e38f, -3.3895e38f, 1e-40f,
                                    INFINITY, -INFINITY, NAN};
    float *h = malloc(n * sizeof *h);
    uint64_t s = t->seed++;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)(bb_splitmix64(&s) >> 32);
        if (i % 4 == 1) bits = (bits & 0xffff0000u) | 0x8000u;
        memcpy(&h[i], &bits, sizeof bits);
        if (i < sizeof special / sizeof *special) h[i] = special[i];
    }
    buf b = tc_given(t, "x", h, n);
    free(h);
    return b;
}

/* n, direction: 0 f32 to bf16 (special values among them), 1 bf16 to f32,
 * 2 f32 to f32 (a copy); the same bits on every backend. */
static void case_convert(tc *t)
{
    size_t n = (size_t)D(0);
    if (D(1) == 0) {
        buf x = special_floats(t, n);
        buf packed = tc_out(t, tc_bytes(t, "packed", NULL, n * sizeof(uint16_t)), 0);
        TC_RUN(t, bb_op_convert(BE, bb_bf16(tc_p(t, packed)), tc_t(t, x), n));
    } else if (D(1) == 1) {
        uint16_t *h = malloc(n * sizeof *h);
        uint64_t s = t->seed++;
        for (size_t i = 0; i < n; i++) h[i] = (uint16_t)bb_splitmix64(&s);
        buf packed = tc_bytes(t, "packed", h, n * sizeof *h), out = tc_out(t, tc_floats(t, "out", n, 1), 0);
        free(h);
        TC_RUN(t, bb_op_convert(BE, tc_t(t, out), bb_bf16(tc_p(t, packed)), n));
    } else {
        buf x = tc_floats(t, "x", n, 1), out = tc_out(t, tc_floats(t, "out", n, 1), 0);
        TC_RUN(t, bb_op_convert(BE, tc_t(t, out), tc_t(t, x), n));
    }
}

static buf records_buf(tc *t, size_t bytes, unsigned mul)
{
    uint8_t *rec = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) rec[i] = (uint8_t)(i * mul + 7);
    buf b = tc_bytes(t, "records", rec, bytes);
    free(rec);
    return b;
}

/* B rows, T tokens, `count` records of T+1 tokens, `width` bytes each. */
static void case_records_to_tokens(tc *t)
{
    int B = D(0), T = D(1), count = D(2), width = D(3);
    buf rec = records_buf(t, (size_t)count * (T + 1) * width, 37);
    buf tok = tc_out(t, tc_bytes(t, "tokens", NULL, (size_t)B * T * 4), 0);
    buf tgt = tc_out(t, tc_bytes(t, "targets", NULL, (size_t)B * T * 4), 0);
    TC_RUN(t, bb_op_records_to_tokens(BE, tc_p(t, tok), tc_p(t, tgt), tc_p(t, rec), count, B, T, width));
}

static void case_records_to_images(tc *t)
{
    int B = D(0), inputs = D(1), count = D(2);
    buf rec = records_buf(t, (size_t)count * (inputs + 1), 91);
    buf x = tc_out(t, tc_floats(t, "features", (size_t)B * inputs, 1), 0);
    buf y = tc_out(t, tc_bytes(t, "labels", NULL, (size_t)B * 4), 0);
    TC_RUN(t, bb_op_records_to_images(BE, tc_t(t, x), tc_p(t, y), tc_p(t, rec), count, B, inputs));
}

/* Each op, its case and its shapes (the case's D(0), D(1), ...). */
static const op_case cases[] = {
    /* N, IC, OC, bias, out f32 (from bf16: the logits), out's row stride (0: OC; the head's padded rows) */
    {"linear_forward", case_linear_forward, 6,
     {{1, 1, 1, 1}, {37, 29, 23, 0}, {37, 29, 23, 1}, {130, 70, 300, 1}, {37, 29, 23, 1, 1}, {37, 29, 23, 0, 0, 64}}},
    /* N, IC, OC, accumulate, din and dbias (dbias: packed rows only), dout's row stride (0: OC) */
    {"linear_backward", case_linear_backward, 4,
     {{37, 29, 23, 0, 1}, {37, 29, 23, 1, 1}, {16, 8, 12, 1, 0}, {37, 29, 23, 1, 1, 64}}},
    /* N, IC, OC, bias, activation, pre kept (widths of 8s take cuBLASLt's epilogues on a GPU, 23 its fallback) */
    {"linear_activation_forward", case_linear_activation_forward, 6,
     {{37, 29, 23, 1, BB_ACTIVATION_GELU_TANH, 1},
      {64, 48, 96, 1, BB_ACTIVATION_GELU_TANH, 1},
      {64, 48, 96, 0, BB_ACTIVATION_GELU_TANH, 1},
      {64, 48, 96, 1, BB_ACTIVATION_GELU_TANH, 0},
      {64, 48, 96, 0, BB_ACTIVATION_GELU_TANH, 0},
      {37, 29, 23, 1, BB_ACTIVATION_RELU, 1}}},
    /* N, IC, OC, accumulate, dbias, activation */
    {"activation_linear_backward", case_activation_linear_backward, 5,
     {{37, 29, 23, 0, 1, BB_ACTIVATION_GELU_TANH},
      {64, 96, 48, 1, 1, BB_ACTIVATION_GELU_TANH},
      {64, 96, 48, 0, 1, BB_ACTIVATION_GELU_TANH},
      {64, 96, 48, 1, 0, BB_ACTIVATION_GELU_TANH},
      {16, 8, 12, 1, 1, BB_ACTIVATION_SILU}}},
    /* n, activation */
    {"activation_forward", case_activation_forward, 3,
     {{100003, BB_ACTIVATION_RELU}, {100003, BB_ACTIVATION_GELU_TANH}, {100003, BB_ACTIVATION_SILU}}},
    {"activation_backward", case_activation_backward, 3,
     {{100003, BB_ACTIVATION_RELU}, {100003, BB_ACTIVATION_GELU_TANH}, {100003, BB_ACTIVATION_SILU}}},
    {"add", case_add, 2, {{1}, {100003}}},
    /* N, C (rows wider than a block; more rows than column chunks) */
    {"layernorm_forward", case_layernorm_forward, 3, {{19, 97}, {300, 1500}, {64, 768}}},
    /* N, C, res over x */
    {"residual_layernorm_forward", case_residual_layernorm_forward, 3, {{19, 97, 0}, {300, 1500, 1}, {64, 768, 1}}},
    {"layernorm_backward", case_layernorm_backward, 2, {{19, 97, 0}, {300, 1500, 1}}},
    /* N, C (, res over x; accumulate) */
    {"rmsnorm_forward", case_rmsnorm_forward, 3, {{19, 97}, {300, 1500}, {64, 576}}},
    {"residual_rmsnorm_forward", case_residual_rmsnorm_forward, 2, {{19, 97, 0}, {300, 1500, 1}}},
    {"rmsnorm_backward", case_rmsnorm_backward, 2, {{19, 97, 0}, {300, 1500, 1}}},
    /* B, T, heads, key/value heads, head size, first position: multi-head, grouped-query, multi-query, decoding's one row */
    {"rope_forward", case_rope_forward, 4, {{2, 7, 3, 3, 4, 0}, {2, 33, 4, 2, 64, 0}, {1, 45, 6, 1, 16, 5}, {1, 1, 4, 2, 8, 90}}},
    {"rope_backward", case_rope_backward, 4, {{2, 7, 3, 3, 4, 0}, {2, 33, 4, 2, 64, 0}, {1, 45, 6, 1, 16, 5}, {1, 1, 4, 2, 8, 90}}},
    /* N, F (, dgu over gu) */
    {"swiglu_forward", case_swiglu_forward, 2, {{1, 1}, {37, 1537}}},
    {"swiglu_backward", case_swiglu_backward, 2, {{37, 1537, 0}, {37, 1537, 1}}},
    /* B, T, C, V, positions (0: none), accumulate */
    {"embedding_forward", case_embedding_forward, 2, {{3, 5, 16, 11, 8}, {3, 5, 16, 11, 0}}},
    {"embedding_backward", case_embedding_backward, 4,
     {{3, 5, 16, 11, 8, 0}, {3, 5, 16, 11, 8, 1}, {3, 5, 16, 11, 0, 0}, {8, 1024, 768, 50257, 1024, 0}},
     .large = 1u << 3},
    /* B, T, heads, key/value heads, head size: several key tiles and row blocks, GPT-2's heads (64 wide) at
     * T 1024, heads of 256 (more than 48 KiB of shared memory), grouped-query, multi-query */
    {"attention_forward", case_attention_forward, 6,
     {{2, 7, 3, 3, 4}, {2, 70, 4, 4, 8}, {1, 1024, 12, 12, 64}, {1, 300, 4, 4, 256}, {2, 70, 4, 2, 8},
      {1, 45, 6, 1, 16}}, .large = 1u << 2},
    {"attention_backward", case_attention_backward, 6,
     {{2, 7, 3, 3, 4}, {2, 70, 4, 4, 8}, {1, 1024, 12, 12, 64}, {1, 300, 4, 4, 256}, {2, 70, 4, 2, 8},
      {1, 45, 6, 1, 16}}, .large = 1u << 2},
    /* 1, T, heads, key/value heads, head size: one split of keys, several (300 and 1000 keys; GPT-2's heads),
     * grouped and multi-query, a head too wide for the split kernel's shared memory (the two-pass kernels) */
    {"attention_decode", case_attention_decode, 6,
     {{1, 7, 3, 3, 4}, {1, 70, 4, 2, 8}, {1, 300, 12, 12, 64}, {1, 33, 6, 1, 16}, {1, 1000, 4, 2, 16},
      {1, 5, 2, 1, 2000}}},
    /* N, V, in place (, the rows' stride: the head's padded rows); V past a block's threads: each thread's own
     * maximum and sum, rescaled */
    {"softmax_crossentropy", case_softmax_crossentropy, 3, {{9, 301, 0}, {9, 301, 1}, {4, 5003, 0}}},
    {"crossentropy_rows", case_crossentropy_rows, 4, {{9, 301, 0}, {1000, 50, 0}, {7, 3001, 1}, {7, 3001, 1, 3008}}},
    {"sum_rows", case_sum_rows, 2, {{1}, {100003}}},
    /* N, V */
    {"count_correct", case_count_correct, 2, {{7, 3}, {5003, 10}}},
    {"adamw", case_adamw, 2, {{1}, {5003}}},
    /* n, momentum */
    {"sgd", case_sgd, 2, {{5003, 1}, {5003, 0}}},
    /* n, weight decay */
    {"lamb", case_lamb, 3, {{1, 1}, {5003, 0}, {300007, 1}}},
    /* n, trust coefficient, momentum */
    {"lars", case_lars, 3, {{1, 1, 1}, {5003, 0, 1}, {300007, 1, 0}}},
    /* rows, cols, weight decay: wide, tall, more than a slice (two on the CPU's pool), one row */
    {"muon", case_muon, 4, {{8, 24, 1}, {40, 12, 0}, {96, 513, 1}, {1, 7, 0}}},
    /* n, ranges (0: one); more blocks than the GPU's partial sums hold */
    {"sum_squares_ranges", case_sum_squares_ranges, 3, {{10007, 0}, {600001, 0}, {100003, 1}}},
    {"sum_squares_into", case_sum_squares_into, 2, {{1}, {600001}}},
    /* n, packed */
    {"convert", case_convert, 3, {{100003, 0}, {100003, 1}, {1003, 2}}},
    /* B, T, count, width */
    {"records_to_tokens", case_records_to_tokens, 3, {{4, 9, 3, 2}, {4, 9, 3, 4}, {2, 5, 2, 2}}},
    /* B, inputs, count */
    {"records_to_images", case_records_to_images, 2, {{4, 10, 3}, {3, 784, 3}}},
};
enum { CASES = sizeof cases / sizeof *cases };

Test(ops, every_op_has_a_case)
{
    cr_assert_gt(bb_op_count(), 20);
    for (int i = 0; i < bb_op_count(); i++) {
        int k = 0;
        while (k < CASES && strcmp(cases[k].op, bb_op_name(i))) k++;
        cr_assert_lt(k, CASES, "ops.def's %s has no case in tests/test_ops.c", bb_op_name(i));
    }
    for (int k = 0; k < CASES; k++) {
        int i = 0;
        while (i < bb_op_count() && strcmp(cases[k].op, bb_op_name(i))) i++;
        cr_assert_lt(i, bb_op_count(), "the case %s names no op of ops.def", cases[k].op);
    }
}

static void free_bufs(tc *t)
{
    for (int i = 0; i < t->nbufs; i++) {
        buf_state *b = &t->bufs[i];
        for (int s = 0; s < 2; s++) bb_backend_free(t->be[s], b->dev[s]);
        for (int s = 0; s < SIDES; s++) free(b->result[s]);
        free(b->init);
    }
    t->nbufs = t->nvalues = 0;
}

/* How a backend under test is held to the CPU. */
typedef struct pass {
    bool counting;     /* it counts: the profiles are compared */
    const char *only;  /* the ops whose names start with this (NULL: all) */
    bool small;        /* without the full-size shapes */
    double tol_floor;  /* no output closer than this asked */
    bool bf16[2];      /* activations in bf16 on the reference, on the backend under test */
} pass;

/* Every case and shape of `p` on `dut`, held to a one-thread CPU. */
static void run_cases(bb_backend_t *dut, pass p)
{
    bb_backend_t *ref;
    cr_assert_eq(bb_backend_create_cpu(&(bb_backend_options){.threads = 1, .profile_ops = true}, &ref), BB_OK);
    int runs = 0, left = 0, fp32_only = 0;
    for (int k = 0; k < CASES; k++)
        for (int s = 0; s < cases[k].shapes && (!p.only || !strncmp(cases[k].op, p.only, strlen(p.only))); s++) {
            if (p.small && (cases[k].large >> s & 1)) {
                left++;
                continue;
            }
            tc t = {.be = {ref, dut}, .counting = p.counting, .dims = cases[k].dims[s], .tol_floor = p.tol_floor,
                    .bf16 = {p.bf16[0], p.bf16[1]}, .seed = (uint64_t)(k * 16 + s + 1)};
            snprintf(t.what, sizeof t.what, "%s (shape %d: %d,%d,%d,%d,%d,%d)%s", cases[k].op, s, t.dims[0],
                     t.dims[1], t.dims[2], t.dims[3], t.dims[4], t.dims[5], p.bf16[1] ? " in bf16" : "");
            cases[k].run(&t);
            free_bufs(&t);
            t.skipped ? fp32_only++ : runs++;
        }
    cr_assert_gt(runs, 0, "%s: no case ran", bb_backend_name(dut));
    cr_log_info("%s: %d op cases%s, every one as the CPU's%s%s", bb_backend_name(dut), runs,
                p.bf16[1] ? " on bf16 tensors" : "", left ? " (full-size shapes left to the fp32 pass)" : "",
                fp32_only ? " (ops without activations left to the fp32 pass)" : "");
    bb_backend_destroy(ref);
}

static void run_all(bb_backend_t *dut, bool counting) { run_cases(dut, (pass){.counting = counting}); }

static void need_gpu(void)
{
    bb_cuda_info info;
    bb_cuda_probe(&info);
    if (info.device_count == 0) cr_skip_test("skipped: no GPU (%s)", info.reason);
}

/* The CPU's own cases run in the CPU build's pass of this suite; the
 * emulated build's pass runs the GPU's. */
static void cpu_pass(void)
{
#ifdef BB_CUDA_EMU
    cr_skip_test("skipped: the CPU build's pass runs it");
#endif
}

Test(ops, every_op_on_three_cpu_threads_is_the_cpu_s)
{
    cpu_pass();
    bb_backend_t *b;
    cr_assert_eq(bb_backend_create_cpu(&(bb_backend_options){.threads = 3}, &b), BB_OK);
    run_all(b, false);
    bb_backend_destroy(b);
}

Test(ops, the_counting_backend_counts_every_op_s_work_and_touches_nothing)
{
    cpu_pass();
    bb_backend_t *b;
    cr_assert_eq(bb_backend_create_counting(BB_DEVICE_CPU, &(bb_backend_options){0}, &b), BB_OK);
    run_all(b, true);
    run_cases(b, (pass){.counting = true, .bf16 = {true, true}});
    bb_backend_destroy(b);
}

/* bf16 tensors in, fp32 inside, rounded once out: every activation op
 * within bf16's tolerance of the same op in fp32 on the same (bf16)
 * inputs, on three threads, the same bits twice. */
Test(ops, every_op_on_bf16_tensors_is_within_bf16_s_tolerance_of_fp32)
{
    cpu_pass();
    bb_backend_t *b;
    cr_assert_eq(bb_backend_create_cpu(&(bb_backend_options){.threads = 3, .precision = BB_PRECISION_BF16}, &b), BB_OK);
    run_cases(b, (pass){.tol_floor = BF16_TOL, .bf16 = {false, true}});
    bb_backend_destroy(b);
}

Test(ops, every_op_on_the_gpu_is_the_cpu_s)
{
    need_gpu();
    bb_backend_t *b;
    cr_assert_eq(bb_backend_create_cuda(&(bb_backend_options){0}, &b), BB_OK, "%s", bb_error_message());
    run_all(b, false);
    bb_backend_destroy(b);
}

/* The GPU on bf16 tensors, as the CPU on the same bf16 tensors: the same
 * rounding of (nearly) the same fp32 results. */
Test(ops, every_op_on_bf16_tensors_on_the_gpu_is_the_cpu_s)
{
    need_gpu();
    bb_backend_t *b;
    cr_assert_eq(bb_backend_create_cuda(&(bb_backend_options){.precision = BB_PRECISION_BF16}, &b), BB_OK, "%s",
                 bb_error_message());
    run_cases(b, (pass){.small = true, .tol_floor = BF16_TOL, .bf16 = {true, true}});
    bb_backend_destroy(b);
}

/* --precision bf16 on a GPU: the products and attention on bf16 tensor
 * cores (fp32 in and out), within 2e-2 of the CPU's fp32; the full-size
 * shapes, a minute on the emulated GPU, are the fp32 pass's. */
Test(ops, the_products_of_a_bf16_gpu_stay_within_2e_2_of_fp32)
{
    need_gpu();
    bb_backend_t *b;
    cr_assert_eq(bb_backend_create_cuda(&(bb_backend_options){.precision = BB_PRECISION_BF16}, &b), BB_OK, "%s",
                 bb_error_message());
    run_cases(b, (pass){.only = "linear_", .small = true, .tol_floor = 2e-2});
    run_cases(b, (pass){.only = "attention_", .small = true, .tol_floor = 2e-2});
    bb_backend_destroy(b);
}

/* ---- dtypes --------------------------------------------------------------- */
/* An op given a tensor of a dtype it does not take does nothing and fails
 * the next synchronizing call, naming the op, the argument and both dtypes;
 * the backend stays failed. */
Test(ops, a_tensor_of_a_dtype_the_op_does_not_take_is_refused_by_name)
{
    cpu_pass();
    bb_backend_t *b;
    cr_assert_eq(bb_backend_create_cpu(&(bb_backend_options){.threads = 1}, &b), BB_OK);
    float out[4] = {7, 7, 7, 7}, w[4] = {1, 2, 3, 4};
    uint16_t in[2] = {0x3f80, 0x4000};
    bb_op_linear_forward(b, bb_f32(out), bb_bf16(in), bb_f32(w), bb_no_tensor(), 2, 1, 2, 2);
    cr_assert_eq(out[0], 7.0f, "the op ran");
    cr_assert_eq(bb_backend_synchronize(b), BB_ERR_UNSUPPORTED);
    cr_assert(strstr(bb_error_message(),
                     "linear_forward: `in` is a bf16 tensor and `w` a f32 one; this op takes them of one dtype"),
              "%s", bb_error_message());
    cr_assert_eq(bb_backend_synchronize(b), BB_ERR_UNSUPPORTED, "a failed backend stays failed");
    bb_backend_destroy(b);

    cr_assert_eq(bb_backend_create_cpu(&(bb_backend_options){.threads = 1}, &b), BB_OK);
    int32_t targets[2] = {0, 1};
    cr_assert_eq(bb_op_count_correct(b, bb_bf16(in), targets, 1, 2), 0); /* logits are fp32 */
    cr_assert_eq(bb_backend_synchronize(b), BB_ERR_UNSUPPORTED);
    cr_assert(strstr(bb_error_message(), "count_correct: `logits` is a bf16 tensor; this op takes f32"), "%s",
              bb_error_message());
    bb_backend_destroy(b);
}

/* A tensor views its memory at an element offset in its own dtype. */
Test(ops, tensors_know_their_dtype_s_size)
{
    float f[4];
    uint16_t h[4];
    cr_assert_eq(bb_tensor_at(bb_f32(f), 3).data, (void *)&f[3]);
    cr_assert_eq(bb_tensor_at(bb_bf16(h), 3).data, (void *)&h[3]);
    cr_assert_null(bb_tensor_at(bb_no_tensor(), 3).data, "no tensor stays none");
    cr_assert_str_eq(bb_dtype_name(BB_DTYPE_BF16), "bf16");
    cr_assert_eq(bb_dtype_size(BB_DTYPE_F32), 4);
}
