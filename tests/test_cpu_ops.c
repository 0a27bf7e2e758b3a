/* test_cpu_ops.c — the CPU backend, the reference every other backend is
 * held to (tests/test_ops.c): every op's backward against central finite
 * differences (small shapes; the relative error of each gradient tensor is
 * printed), the optimizers against rules written out in double, and the
 * allocator's accounting and out-of-memory message. Attention is
 * test_cpu_attention.c's. Helpers: fd_fixture.h. */
#include "bigbatch/backend.h"
#include "fd_fixture.h"

TestSuite(cpu_ops, .init = backend_up, .fini = backend_down);

/* ---- linear ------------------------------------------------------------ */
enum { LN_N = 6, LN_IC = 5, LN_OC = 4 };
typedef struct linear_ctx {
    float *in, *w, *bias, *out, *r;
} linear_ctx;

static double linear_loss(void *arg)
{
    linear_ctx *c = arg;
    bb_op_linear_forward(be, F(c->out), F(c->in), F(c->w), F(c->bias), LN_N, LN_IC, LN_OC, LN_OC);
    return dot(c->out, c->r, LN_N * LN_OC);
}

Test(cpu_ops, linear_backward_matches_finite_differences)
{
    linear_ctx c = {random_floats(LN_N * LN_IC, 1, 1), random_floats(LN_OC * LN_IC, 2, 1),
                    random_floats(LN_OC, 3, 1), malloc(LN_N * LN_OC * sizeof(float)),
                    random_floats(LN_N * LN_OC, 4, 1)};
    float din[LN_N * LN_IC], dw[LN_OC * LN_IC], db[LN_OC];
    bb_op_linear_backward(be, F(din), F(dw), F(db), F(c.r), F(c.in), F(c.w), LN_N, LN_IC, LN_OC, LN_OC, false);
    fd_check("linear.in", c.in, LN_N * LN_IC, din, linear_loss, &c, 1e-2f, 1e-3);
    fd_check("linear.weight", c.w, LN_OC * LN_IC, dw, linear_loss, &c, 1e-2f, 1e-3);
    fd_check("linear.bias", c.bias, LN_OC, db, linear_loss, &c, 1e-2f, 1e-3);
    /* accumulate = true adds a second micro-step's gradient */
    float dw2[LN_OC * LN_IC], db2[LN_OC];
    memcpy(dw2, dw, sizeof dw), memcpy(db2, db, sizeof db);
    bb_op_linear_backward(be, NONE, F(dw2), F(db2), F(c.r), F(c.in), F(c.w), LN_N, LN_IC, LN_OC, LN_OC, true);
    for (int i = 0; i < LN_OC * LN_IC; i++) cr_assert_float_eq(dw2[i], 2 * dw[i], 1e-5);
    for (int i = 0; i < LN_OC; i++) cr_assert_float_eq(db2[i], 2 * db[i], 1e-5);
    free(c.in), free(c.w), free(c.bias), free(c.out), free(c.r);
}

/* Products split over the backend's threads (by rows when the output is
 * taller than wide, else by columns), each task starting its rows from the
 * bias, and the bias gradient split by columns: the written-out rule, and
 * the bias gradient the same bits on any thread count. */
Test(cpu_ops, linear_layers_split_over_threads_are_the_rule)
{
    const int shapes[2][3] = {{1024, 48, 200}, {40, 48, 1024}}; /* N, IC, OC: rows split, columns split */
    bb_backend_t *three;
    cr_assert_eq(bb_backend_create_cpu(&(bb_backend_options){.threads = 3}, &three), BB_OK);
    for (int k = 0; k < 2; k++) {
        int N = shapes[k][0], IC = shapes[k][1], OC = shapes[k][2];
        float *in = random_floats((size_t)N * IC, 30, 1), *w = random_floats((size_t)OC * IC, 31, 1),
              *bias = random_floats(OC, 32, 1), *dout = random_floats((size_t)N * OC, 33, 1),
              *out = malloc((size_t)N * OC * 4), *dw = malloc((size_t)OC * IC * 4), *db1 = malloc(OC * 4),
              *db3 = malloc(OC * 4), *din = malloc((size_t)N * IC * 4);
        bb_op_linear_forward(three, F(out), F(in), F(w), F(bias), N, IC, OC, OC);
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) {
                double ref = bias[o];
                for (int i = 0; i < IC; i++) ref += (double)in[(size_t)n * IC + i] * w[(size_t)o * IC + i];
                cr_assert_float_eq(out[(size_t)n * OC + o], ref, 1e-4, "shape %d: out[%d][%d]", k, n, o);
            }
        for (int o = 0; o < OC; o++) db1[o] = db3[o] = 0.5f; /* accumulate onto a previous micro-step's */
        bb_op_linear_backward(be, NONE, F(dw), F(db1), F(dout), F(in), F(w), N, IC, OC, OC, true);
        bb_op_linear_backward(three, F(din), F(dw), F(db3), F(dout), F(in), F(w), N, IC, OC, OC, true);
        cr_assert_eq(memcmp(db1, db3, OC * 4), 0, "shape %d: the bias gradient depends on the threads", k);
        for (int o = 0; o < OC; o++) {
            double ref = 0.5;
            for (int n = 0; n < N; n++) ref += dout[(size_t)n * OC + o];
            cr_assert_float_eq(db3[o], ref, 1e-3, "shape %d: dbias[%d]", k, o);
        }
        free(in), free(w), free(bias), free(dout), free(out), free(dw), free(db1), free(db3), free(din);
    }
    bb_backend_destroy(three);
}

/* ---- elementwise activations ------------------------------------------ */
enum { ACT_N = 64 };
typedef struct act_ctx {
    bb_activation act;
    float *in, *out, *r;
} act_ctx;

static double act_loss(void *arg)
{
    act_ctx *c = arg;
    bb_op_activation_forward(be, c->act, F(c->out), F(c->in), ACT_N);
    return dot(c->out, c->r, ACT_N);
}

/* The backward against finite differences, and the forward at a few
 * points against PyTorch's values. */
static void check_activation(bb_activation act, const float x[3], const float expect[3])
{
    act_ctx c = {act, random_floats(ACT_N, 5, 3), malloc(ACT_N * sizeof(float)), random_floats(ACT_N, 6, 1)};
    for (int i = 0; i < ACT_N; i++)
        if (fabsf(c.in[i]) < 0.05f) c.in[i] = 0.5f; /* ReLU has no derivative at 0 */
    float din[ACT_N];
    bb_op_activation_backward(be, act, F(din), F(c.r), F(c.in), ACT_N);
    fd_check(bb_activation_name(act), c.in, ACT_N, din, act_loss, &c, 1e-3f, 1e-3);
    float y[3];
    bb_op_activation_forward(be, act, F(y), F(x), 3);
    for (int i = 0; i < 3; i++)
        cr_assert_float_eq(y[i], expect[i], 1e-6, "%s(%g) = %.8f", bb_activation_name(act), x[i], y[i]);
    free(c.in), free(c.out), free(c.r);
}

static const float act_points[3] = {-1.0f, 0.5f, 2.0f};

Test(cpu_ops, relu_backward_matches_finite_differences)
{
    check_activation(BB_ACTIVATION_RELU, act_points, (const float[3]){0.0f, 0.5f, 2.0f});
}

/* The tanh form (PyTorch GELU(approximate='tanh')). */
Test(cpu_ops, gelu_backward_matches_finite_differences)
{
    check_activation(BB_ACTIVATION_GELU_TANH, act_points, (const float[3]){-0.15880801f, 0.34571401f, 1.95459769f});
}

/* torch.nn.functional.silu. */
Test(cpu_ops, silu_backward_matches_finite_differences)
{
    check_activation(BB_ACTIVATION_SILU, act_points, (const float[3]){-0.26894142f, 0.31122967f, 1.76159416f});
}

Test(cpu_ops, an_unknown_activation_fails_the_next_synchronizing_call)
{
    bb_backend_t *own;
    cr_assert_eq(bb_backend_create_cpu(&(bb_backend_options){.threads = 1}, &own), BB_OK);
    float x[4] = {1, 2, 3, 4};
    bb_op_activation_forward(own, (bb_activation)7, F(x), F(x), 4);
    cr_assert_eq(bb_backend_synchronize(own), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "activation 7"), "%s", bb_error_message());
    bb_backend_destroy(own);
}

/* ---- layernorm --------------------------------------------------------- */
enum { LNORM_N = 5, LNORM_C = 8 };
typedef struct layernorm_ctx {
    float *in, *w, *bias, *out, *r, mean[LNORM_N], rstd[LNORM_N];
} layernorm_ctx;

static double layernorm_loss(void *arg)
{
    layernorm_ctx *c = arg;
    bb_op_layernorm_forward(be, F(c->out), c->mean, c->rstd, F(c->in), F(c->w), F(c->bias), LNORM_N, LNORM_C);
    return dot(c->out, c->r, LNORM_N * LNORM_C);
}

Test(cpu_ops, layernorm_backward_matches_finite_differences)
{
    layernorm_ctx c = {random_floats(LNORM_N * LNORM_C, 7, 2), random_floats(LNORM_C, 8, 1),
                       random_floats(LNORM_C, 9, 1), malloc(LNORM_N * LNORM_C * sizeof(float)),
                       random_floats(LNORM_N * LNORM_C, 10, 1)};
    layernorm_loss(&c);
    float din[LNORM_N * LNORM_C] = {0}, dw[LNORM_C], db[LNORM_C];
    bb_op_layernorm_backward(be, F(din), F(dw), F(db), F(c.r), F(c.in), F(c.w), c.mean, c.rstd, LNORM_N, LNORM_C,
                             false);
    fd_check("layernorm.in", c.in, LNORM_N * LNORM_C, din, layernorm_loss, &c, 1e-2f, 2e-3);
    fd_check("layernorm.weight", c.w, LNORM_C, dw, layernorm_loss, &c, 1e-2f, 1e-3);
    fd_check("layernorm.bias", c.bias, LNORM_C, db, layernorm_loss, &c, 1e-2f, 1e-3);
    free(c.in), free(c.w), free(c.bias), free(c.out), free(c.r);
}

/* ---- rmsnorm ------------------------------------------------------------ */
typedef struct rmsnorm_ctx {
    float *in, *w, *out, *r, rstd[LNORM_N];
} rmsnorm_ctx;

static double rmsnorm_loss(void *arg)
{
    rmsnorm_ctx *c = arg;
    bb_op_rmsnorm_forward(be, F(c->out), c->rstd, F(c->in), F(c->w), LNORM_N, LNORM_C, 1e-6f);
    return dot(c->out, c->r, LNORM_N * LNORM_C);
}

Test(cpu_ops, rmsnorm_is_llama_s_rule_and_its_backward_matches_finite_differences)
{
    rmsnorm_ctx c = {random_floats(LNORM_N * LNORM_C, 17, 2), random_floats(LNORM_C, 18, 1),
                     malloc(LNORM_N * LNORM_C * sizeof(float)), random_floats(LNORM_N * LNORM_C, 19, 1)};
    rmsnorm_loss(&c);
    for (int n = 0; n < LNORM_N; n++) { /* out = w · x / sqrt(mean(x²) + eps), in double */
        double ss = 0;
        for (int i = 0; i < LNORM_C; i++) ss += (double)c.in[n * LNORM_C + i] * c.in[n * LNORM_C + i];
        double r = 1.0 / sqrt(ss / LNORM_C + 1e-6);
        cr_assert_float_eq(c.rstd[n], r, 1e-5 * r);
        for (int i = 0; i < LNORM_C; i++)
            cr_assert_float_eq(c.out[n * LNORM_C + i], c.w[i] * c.in[n * LNORM_C + i] * r, 1e-5);
    }
    float din[LNORM_N * LNORM_C] = {0}, dw[LNORM_C];
    bb_op_rmsnorm_backward(be, F(din), F(dw), F(c.r), F(c.in), F(c.w), c.rstd, LNORM_N, LNORM_C, false);
    fd_check("rmsnorm.in", c.in, LNORM_N * LNORM_C, din, rmsnorm_loss, &c, 1e-2f, 2e-3);
    fd_check("rmsnorm.weight", c.w, LNORM_C, dw, rmsnorm_loss, &c, 1e-2f, 1e-3);
    free(c.in), free(c.w), free(c.out), free(c.r);
}

/* ---- rope ----------------------------------------------------------------- */
enum { RP_B = 2, RP_T = 5, RP_NH = 4, RP_KVH = 2, RP_HS = 6, RP_W = (RP_NH + 2 * RP_KVH) * RP_HS, RP_POS0 = 3 };
typedef struct rope_ctx {
    float *x, *y, *r, table[(RP_POS0 + RP_T) * RP_HS];
} rope_ctx;

static double rope_loss(void *arg)
{
    rope_ctx *c = arg;
    memcpy(c->y, c->x, RP_B * RP_T * RP_W * sizeof(float));
    bb_op_rope_forward(be, F(c->y), c->table, RP_B, RP_T, RP_NH, RP_KVH, RP_HS, RP_POS0);
    return dot(c->y, c->r, RP_B * RP_T * RP_W);
}

/* transformers' rotate-half rule on q and k at positions pos0.., v untouched;
 * the backward is the forward's gradient (finite differences) and its inverse. */
Test(cpu_ops, rope_is_the_rotate_half_rule_and_its_backward_is_its_inverse)
{
    size_t n = RP_B * RP_T * RP_W;
    rope_ctx c = {random_floats(n, 21, 1), malloc(n * sizeof(float)), random_floats(n, 22, 1)};
    for (int p = 0; p < RP_POS0 + RP_T; p++)
        for (int i = 0; i < RP_HS / 2; i++) {
            float angle = (float)p * powf(10000.0f, -2.0f * i / RP_HS);
            c.table[p * RP_HS + i] = cosf(angle), c.table[p * RP_HS + RP_HS / 2 + i] = sinf(angle);
        }
    rope_loss(&c);
    for (size_t row = 0; row < RP_B * RP_T; row++) {
        int pos = RP_POS0 + (int)(row % RP_T);
        for (int h = 0; h < RP_NH + 2 * RP_KVH; h++)
            for (int i = 0; i < RP_HS; i++) {
                size_t at = row * RP_W + (size_t)h * RP_HS;
                double a = c.x[at + i], other = i < RP_HS / 2 ? -c.x[at + i + RP_HS / 2] : c.x[at + i - RP_HS / 2];
                double theta = pos * pow(10000.0, -2.0 * (i % (RP_HS / 2)) / RP_HS);
                double want = h < RP_NH + RP_KVH ? a * cos(theta) + other * sin(theta) : a;
                cr_assert_float_eq(c.y[at + i], want, 1e-5, "row %zu head %d %d", row, h, i);
            }
    }
    float *g = malloc(n * sizeof(float));
    memcpy(g, c.r, n * sizeof(float));
    bb_op_rope_backward(be, F(g), c.table, RP_B, RP_T, RP_NH, RP_KVH, RP_HS, RP_POS0);
    fd_check("rope.qkv", c.x, n, g, rope_loss, &c, 1e-2f, 1e-3);
    rope_loss(&c);
    memcpy(g, c.y, n * sizeof(float)); /* the backward undoes the forward */
    bb_op_rope_backward(be, F(g), c.table, RP_B, RP_T, RP_NH, RP_KVH, RP_HS, RP_POS0);
    for (size_t i = 0; i < n; i++) cr_assert_float_eq(g[i], c.x[i], 1e-6);
    free(c.x), free(c.y), free(c.r), free(g);
}

/* ---- swiglu ------------------------------------------------------------- */
enum { SG_N = 3, SG_F = 5 };
typedef struct swiglu_ctx {
    float *gu, *out, *r;
} swiglu_ctx;

static double swiglu_loss(void *arg)
{
    swiglu_ctx *c = arg;
    bb_op_swiglu_forward(be, F(c->out), F(c->gu), SG_N, SG_F);
    return dot(c->out, c->r, SG_N * SG_F);
}

Test(cpu_ops, swiglu_is_silu_gate_times_up_and_its_backward_matches_finite_differences)
{
    swiglu_ctx c = {random_floats(SG_N * 2 * SG_F, 31, 3), malloc(SG_N * SG_F * sizeof(float)),
                    random_floats(SG_N * SG_F, 32, 1)};
    swiglu_loss(&c);
    for (int n = 0; n < SG_N; n++)
        for (int i = 0; i < SG_F; i++) {
            double g = c.gu[n * 2 * SG_F + i], u = c.gu[n * 2 * SG_F + SG_F + i];
            cr_assert_float_eq(c.out[n * SG_F + i], g / (1 + exp(-g)) * u, 1e-5);
        }
    float dgu[SG_N * 2 * SG_F];
    bb_op_swiglu_backward(be, F(dgu), F(c.r), F(c.gu), SG_N, SG_F);
    fd_check("swiglu.gate_up", c.gu, SG_N * 2 * SG_F, dgu, swiglu_loss, &c, 1e-2f, 1e-3);
    bb_op_swiglu_backward(be, F(c.gu), F(c.r), F(c.gu), SG_N, SG_F); /* in place: the same */
    for (int i = 0; i < SG_N * 2 * SG_F; i++) cr_assert_eq(c.gu[i], dgu[i]);
    free(c.gu), free(c.out), free(c.r);
}

/* ---- embedding --------------------------------------------------------- */
enum { EMB_B = 2, EMB_T = 3, EMB_C = 4, EMB_V = 5 };
static const int32_t emb_tokens[EMB_B * EMB_T] = {1, 4, 1, 0, 2, 4};
typedef struct embedding_ctx {
    float *wte, *wpe, *out, *r;
} embedding_ctx;

static double embedding_loss(void *arg)
{
    embedding_ctx *c = arg;
    bb_op_embedding_forward(be, F(c->out), emb_tokens, F(c->wte), F(c->wpe), EMB_B, EMB_T, EMB_C);
    return dot(c->out, c->r, EMB_B * EMB_T * EMB_C);
}

Test(cpu_ops, embedding_backward_matches_finite_differences)
{
    embedding_ctx c = {random_floats(EMB_V * EMB_C, 11, 1), random_floats(EMB_T * EMB_C, 12, 1),
                       malloc(EMB_B * EMB_T * EMB_C * sizeof(float)), random_floats(EMB_B * EMB_T * EMB_C, 13, 1)};
    /* Poisoned: without accumulation every row must be overwritten (token 3
     * appears in no batch position, so its row must come out 0). */
    float dwte[EMB_V * EMB_C], dwpe[EMB_T * EMB_C];
    for (size_t i = 0; i < EMB_V * EMB_C; i++) dwte[i] = NAN;
    for (size_t i = 0; i < EMB_T * EMB_C; i++) dwpe[i] = NAN;
    bb_op_embedding_backward(be, F(dwte), F(dwpe), F(c.r), emb_tokens, EMB_B, EMB_T, EMB_C, EMB_V, EMB_T, false, false);
    for (int k = 0; k < EMB_C; k++) cr_assert_eq(dwte[3 * EMB_C + k], 0.0f);
    fd_check("embedding.wte", c.wte, EMB_V * EMB_C, dwte, embedding_loss, &c, 1e-2f, 1e-3);
    fd_check("embedding.wpe", c.wpe, EMB_T * EMB_C, dwpe, embedding_loss, &c, 1e-2f, 1e-3);
    free(c.wte), free(c.wpe), free(c.out), free(c.r);
}

/* Without a position table: the token rows alone, and only their gradient. */
Test(cpu_ops, an_embedding_without_positions_is_the_token_table)
{
    float *wte = random_floats(EMB_V * EMB_C, 14, 1), *dout = random_floats(EMB_B * EMB_T * EMB_C, 15, 1);
    float out[EMB_B * EMB_T * EMB_C], dwte[EMB_V * EMB_C];
    bb_op_embedding_forward(be, F(out), emb_tokens, F(wte), NONE, EMB_B, EMB_T, EMB_C);
    for (int i = 0; i < EMB_B * EMB_T; i++)
        cr_assert_eq(memcmp(out + i * EMB_C, wte + emb_tokens[i] * EMB_C, EMB_C * sizeof *out), 0, "row %d", i);
    bb_op_embedding_backward(be, F(dwte), NONE, F(dout), emb_tokens, EMB_B, EMB_T, EMB_C, EMB_V, EMB_T, false, false);
    for (int v = 0; v < EMB_V; v++)
        for (int c = 0; c < EMB_C; c++) {
            float want = 0;
            for (int i = 0; i < EMB_B * EMB_T; i++) want += emb_tokens[i] == v ? dout[i * EMB_C + c] : 0.0f;
            cr_assert_eq(dwte[v * EMB_C + c], want, "dwte[%d][%d]", v, c);
        }
    cr_assert_eq(bb_backend_synchronize(be), BB_OK);
    free(wte), free(dout);
}

/* The token table's gradient is an ordered reduction: per token, the rows
 * of its positions summed in position order, onto what the table held.
 * This reference does it the way the CUDA kernel does (a stable sort of
 * positions by token, then each run in order); the CPU op must agree to
 * the bit, and the CUDA op is held to the CPU's bits (test_cuda.c). */
static int by_token_then_position(const void *a, const void *b)
{
    const int32_t *x = a, *y = b;
    return x[0] != y[0] ? (x[0] > y[0]) - (x[0] < y[0]) : (x[1] > y[1]) - (x[1] < y[1]);
}

Test(cpu_ops, embedding_backward_is_an_ordered_sum_per_token)
{
    enum { B = 4, T = 33, C = 7, V = 9 };
    int32_t tokens[B * T], pairs[B * T][2];
    for (int i = 0; i < B * T; i++) tokens[i] = (int32_t)((i * i + 3 * i) % V) % 4; /* few tokens, many repeats */
    float *dout = random_floats(B * T * C, 21, 1e3f), *base = random_floats(V * C, 22, 1);
    float dwte[V * C], ref[V * C], dwpe[T * C];
    for (int accumulate = 0; accumulate < 2; accumulate++) {
        memcpy(dwte, base, sizeof dwte);
        for (int i = 0; i < V * C; i++) ref[i] = accumulate ? base[i] : 0.0f;
        for (int i = 0; i < B * T; i++) pairs[i][0] = tokens[i], pairs[i][1] = i;
        qsort(pairs, B * T, sizeof *pairs, by_token_then_position);
        for (int k = 0; k < B * T; k++)
            for (int c = 0; c < C; c++) ref[pairs[k][0] * C + c] += dout[(size_t)pairs[k][1] * C + c];
        bb_op_embedding_backward(be, F(dwte), F(dwpe), F(dout), tokens, B, T, C, V, T, accumulate, false);
        cr_assert_eq(memcmp(dwte, ref, sizeof ref), 0, "accumulate %d: the CPU's sum order is not position order",
                     accumulate);
    }
    free(dout), free(base);
}

/* ---- softmax + cross-entropy ------------------------------------------ */
enum { CE_N = 4, CE_V = 7 };
static const int32_t ce_targets[CE_N] = {3, 0, -1, 6};
typedef struct ce_ctx {
    float *logits;
} ce_ctx;

static double ce_loss(void *arg)
{
    ce_ctx *c = arg;
    double loss;
    bb_op_softmax_crossentropy(be, &loss, NONE, F(c->logits), ce_targets, CE_N, CE_V, 3.0f, NULL);
    return loss;
}

Test(cpu_ops, softmax_crossentropy_gradient_matches_finite_differences)
{
    ce_ctx c = {random_floats(CE_N * CE_V, 16, 3)};
    float dlogits[CE_N * CE_V];
    double loss;
    int valid;
    bb_op_softmax_crossentropy(be, &loss, F(dlogits), F(c.logits), ce_targets, CE_N, CE_V, 3.0f, &valid);
    cr_assert_eq(valid, 3, "the row with target -1 is ignored");
    cr_assert_float_eq(loss, ce_loss(&c), 1e-12, "forward-only and fused give the same loss");
    fd_check("softmax_crossentropy", c.logits, CE_N * CE_V, dlogits, ce_loss, &c, 1e-2f, 1e-3);
    /* in place: dlogits may alias logits */
    float copy[CE_N * CE_V];
    memcpy(copy, c.logits, sizeof copy);
    double loss2;
    bb_op_softmax_crossentropy(be, &loss2, F(copy), F(copy), ce_targets, CE_N, CE_V, 3.0f, NULL);
    cr_assert_eq(loss2, loss);
    cr_assert_eq(memcmp(copy, dlogits, sizeof copy), 0);
    free(c.logits);
}

/* ---- optimizers, norms ------------------------------------------------- */
Test(cpu_ops, adamw_and_sgd_match_a_double_precision_reference)
{
    enum { N = 33 };
    float *p = random_floats(N, 17, 1), *g = random_floats(N, 18, 1), m[N] = {0}, v[N] = {0}, buf[N] = {0};
    double rp[N], rm[N] = {0}, rv[N] = {0};
    for (int i = 0; i < N; i++) rp[i] = p[i];
    const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    for (int t = 1; t <= 5; t++) {
        bb_op_adamw(be, p, g, m, v, N, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd, t, 1.0f);
        for (int i = 0; i < N; i++) {
            rm[i] = b1 * rm[i] + (1 - b1) * g[i];
            rv[i] = b2 * rv[i] + (1 - b2) * g[i] * g[i];
            double mhat = rm[i] / (1 - pow(b1, t)), vhat = rv[i] / (1 - pow(b2, t));
            rp[i] -= lr * (mhat / (sqrt(vhat) + eps) + wd * rp[i]);
        }
    }
    for (int i = 0; i < N; i++) cr_assert_float_eq(p[i], rp[i], 1e-5, "adamw param %d: %g vs %g", i, p[i], rp[i]);

    float *q = random_floats(N, 19, 1);
    double rq[N], rb[N] = {0};
    for (int i = 0; i < N; i++) rq[i] = q[i];
    for (int t = 0; t < 3; t++) {
        bb_op_sgd(be, q, g, buf, N, 0.1f, 0.9f, 0.01f, 1.0f);
        for (int i = 0; i < N; i++) {
            rb[i] = 0.9 * rb[i] + g[i] + 0.01 * rq[i];
            rq[i] -= 0.1 * rb[i];
        }
    }
    for (int i = 0; i < N; i++) cr_assert_float_eq(q[i], rq[i], 1e-5, "sgd param %d", i);
    double ss = bb_op_sum_squares(be, g, N), ref = 0;
    for (int i = 0; i < N; i++) ref += (double)g[i] * g[i];
    cr_assert_float_eq(ss, ref, 1e-9);
    for (int i = 0; i < N; i++) g[i] *= 0.5f; /* the CPU backend's memory is the host's */
    cr_assert_float_eq(bb_op_sum_squares(be, g, N), ref / 4, 1e-9);
    free(p), free(g), free(q);
}

/* The clip folded into the update (grad_scale) is the old clip-then-update:
 * AdamW to the bit, SGD within rounding (where g·scale + wd·p compiles to a
 * fused multiply-add, the product g·scale is not rounded on its own); the
 * gradients are left as they were. */
Test(cpu_ops, an_update_with_grad_scale_equals_scaling_the_gradients_first)
{
    enum { N = 1000 };
    const float s = 0.3712f;
    float *g = random_floats(N, 21, 1), *gs = random_floats(N, 21, 1), *keep = random_floats(N, 21, 1);
    for (int i = 0; i < N; i++) gs[i] *= s; /* the CPU backend's memory is the host's */
    for (int kind = 0; kind < 2; kind++) {
        float *p1 = random_floats(N, 22, 1), *p2 = random_floats(N, 22, 1), m1[N] = {0}, m2[N] = {0}, v1[N] = {0},
              v2[N] = {0};
        for (int t = 1; t <= 3; t++) {
            if (kind == 0) {
                bb_op_adamw(be, p1, g, m1, v1, N, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t, s);
                bb_op_adamw(be, p2, gs, m2, v2, N, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 1.0f);
            } else {
                bb_op_sgd(be, p1, g, m1, N, 0.1f, 0.9f, 0.01f, s);
                bb_op_sgd(be, p2, gs, m2, N, 0.1f, 0.9f, 0.01f, 1.0f);
            }
        }
        if (kind == 0) {
            cr_assert_eq(memcmp(p1, p2, sizeof(float) * N), 0, "adamw: params differ");
            cr_assert_eq(memcmp(m1, m2, sizeof m1), 0);
            cr_assert_eq(memcmp(v1, v2, sizeof v1), 0);
        } else
            for (int i = 0; i < N; i++) {
                cr_assert_float_eq(p1[i], p2[i], 1e-6f * (1 + fabsf(p2[i])), "sgd param %d", i);
                cr_assert_float_eq(m1[i], m2[i], 1e-6f * (1 + fabsf(m2[i])), "sgd momentum %d", i);
            }
        free(p1), free(p2);
    }
    cr_assert_eq(memcmp(g, keep, sizeof(float) * N), 0, "the gradients were changed");
    free(g), free(gs), free(keep);
}

/* Argmax hits against the rule written out: the first largest logit wins,
 * a NaN never beats anything (a NaN first logit keeps 0), -1 never counts. */
Test(cpu_ops, count_correct_is_the_first_argmax_rule)
{
    enum { V = 4 };
    const float logits[][V] = {
        {0, 3, 1, 2}, /* 1 */        {5, 5, 1, 2}, /* tie: 0 */   {NAN, 9, 9, 1}, /* NaN first: 0 */
        {1, NAN, 0, 2}, /* 3 */      {-1, -2, -3, -4}, /* 0 */   {0, 1, 2, 3}, /* 3, target -1 */
    };
    const int32_t hit[] = {1, 0, 0, 3, 0, -1}, miss[] = {2, 1, 1, 1, 3, 0};
    int N = (int)(sizeof hit / sizeof *hit);
    cr_assert_eq(bb_op_count_correct(be, F(&logits[0][0]), hit, N, V), N - 1);
    cr_assert_eq(bb_op_count_correct(be, F(&logits[0][0]), miss, N, V), 0);
    cr_assert_eq(bb_op_count_correct(be, F(&logits[0][0]), hit, 2, V), 2, "only the first N rows");
}

/* ---- memory accounting ------------------------------------------------- */
Test(cpu_ops, allocations_are_counted_and_capped)
{
    bb_backend_t *capped;
    bb_backend_options o = {.device_mem = 1 << 20};
    cr_assert_eq(bb_backend_create_cpu(&o, &capped), BB_OK);
    void *a, *b, *c;
    cr_assert_eq(bb_backend_alloc(capped, 600 << 10, "activations", &a), BB_OK);
    cr_assert_eq(bb_backend_alloc(capped, 300 << 10, "gradients", &b), BB_OK);
    cr_assert_eq(bb_backend_bytes_in_use(capped), 900 << 10);
    cr_assert_eq(bb_backend_alloc(capped, 200 << 10, "optimizer state", &c), BB_ERR_OOM);
    const char *msg = bb_error_message();
    const char *needles[] = {"200.0 KiB", "optimizer state", "900.0 KiB in use", "1.0 MiB", "--micro-batch",
                             "--checkpoint"};
    for (size_t i = 0; i < sizeof needles / sizeof *needles; i++)
        cr_assert(strstr(msg, needles[i]), "'%s' should mention '%s'", msg, needles[i]);
    bb_backend_free(capped, a);
    cr_assert_eq(bb_backend_bytes_in_use(capped), 300 << 10);
    cr_assert_eq(bb_backend_peak_bytes(capped), 900 << 10);
    cr_assert_eq(bb_backend_alloc(capped, 200 << 10, "optimizer state", &c), BB_OK);
    bb_backend_reset_peak(capped);
    cr_assert_eq(bb_backend_peak_bytes(capped), 500 << 10);
    bb_backend_destroy(capped); /* frees b and c */
}

/* Copies, memset, host memory, and streams/events (no-ops on the CPU). */
Test(cpu_ops, cpu_copies_and_events)
{
    float *dev, *host;
    cr_assert_eq(bb_backend_alloc(be, 64 * sizeof(float), "buffer", (void **)&dev), BB_OK);
    cr_assert_eq(bb_backend_host_alloc(be, 64 * sizeof(float), (void **)&host), BB_OK);
    for (int i = 0; i < 64; i++) host[i] = (float)i;
    cr_assert_eq(bb_backend_copy(be, dev, host, 64 * sizeof(float), BB_COPY_H2D), BB_OK);
    cr_assert_eq(bb_backend_memset(be, host, 0, 64 * sizeof(float)), BB_OK);
    bb_event_t *e;
    cr_assert_eq(bb_backend_event_create(be, &e), BB_OK);
    cr_assert_eq(bb_backend_event_record(be, e, BB_STREAM_COPY), BB_OK);
    cr_assert_eq(bb_backend_stream_wait(be, BB_STREAM_COMPUTE, e), BB_OK);
    cr_assert_eq(bb_backend_event_synchronize(be, e), BB_OK);
    bb_backend_event_destroy(be, e);
    cr_assert_eq(bb_backend_copy(be, host, dev, 64 * sizeof(float), BB_COPY_D2H), BB_OK);
    cr_assert_eq(bb_backend_synchronize(be), BB_OK);
    for (int i = 0; i < 64; i++) cr_assert_eq(host[i], (float)i);
    cr_assert_str_eq(bb_backend_name(be), "cpu");
    bb_backend_host_free(be, host, 64 * sizeof(float));
    bb_backend_free(be, dev);
    cr_assert_eq(bb_backend_bytes_in_use(be), 0);
}

/* ---- bf16 storage ------------------------------------------------------ */
/* The nearest bf16, worked out from the two neighbours in double (ties to
 * the even one; past the largest bf16 by half a step or more: infinity). */
static float reference_bf16(float x)
{
    if (isnan(x) || isinf(x)) return x;
    uint32_t u, down_bits;
    memcpy(&u, &x, sizeof u);
    down_bits = u & 0xffff0000u; /* toward zero */
    float down;
    memcpy(&down, &down_bits, sizeof down);
    int e = (int)((u >> 23) & 0xff);
    double step = ldexp(1.0, (e ? e : 1) - 127 - 7), away = fabs((double)down) + step;
    double below = fabs((double)x) - fabs((double)down), above = away - fabs((double)x);
    bool up = above < below || (above == below && ((down_bits >> 16) & 1));
    if (!up) return down;
    float r = away >= ldexp(1.0, 128) ? INFINITY : (float)away;
    return signbit(x) ? -r : r;
}

Test(cpu_ops, bf16_conversion_is_nearest_even_and_widens_exactly)
{
    enum { N = 1 << 17, SPECIAL = 14 };
    float *x = malloc(N * sizeof *x), *want = malloc(N * sizeof *want), *back = malloc(N * sizeof *back);
    uint16_t *packed = malloc(N * sizeof *packed);
    const float special[SPECIAL] = {0.0f, -0.0f, 1.0f, 1.00390625f /* tie: down to 1 */,
                                    1.01171875f /* tie: up to 1.015625 */, -3.0f, 3.4028235e38f /* to inf */,
                                    -3.3895e38f, 1e-40f /* subnormal */, 1.17549435e-38f, INFINITY, -INFINITY,
                                    NAN, 65504.0f};
    uint64_t s = 99;
    for (int i = 0; i < N; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        uint32_t bits = (uint32_t)(s >> 32);
        if (i % 4 == 1) bits = (bits & 0xffff0000u) | 0x8000u; /* exact ties */
        memcpy(&x[i], &bits, sizeof bits);
        if (i < SPECIAL) x[i] = special[i];
        want[i] = reference_bf16(x[i]);
    }
    bb_op_convert(be, bb_bf16(packed), F(x), N);
    bb_op_convert(be, F(back), bb_bf16(packed), N);
    int nans = 0;
    for (int i = 0; i < N; i++) {
        if (isnan(want[i])) {
            cr_assert(isnan(back[i]), "element %d: NaN must stay NaN", i);
            nans++;
            continue;
        }
        cr_assert(back[i] == want[i] && signbit(back[i]) == signbit(want[i]), "element %d: %a rounded to %a, want %a",
                  i, (double)x[i], (double)back[i], (double)want[i]);
    }
    cr_assert_gt(nans, 0, "the random patterns should include NaNs");
    cr_assert_eq(back[3], 1.0f);
    cr_assert_eq(back[4], 1.015625f);
    cr_assert(isinf(back[6]));
    bb_op_convert(be, bb_bf16(packed), F(back), N); /* rounding a rounded value changes nothing */
    bb_op_convert(be, F(x), bb_bf16(packed), N);
    for (int i = 0; i < N; i++) cr_assert(isnan(x[i]) || back[i] == x[i]);
    free(x), free(want), free(back), free(packed);
}
