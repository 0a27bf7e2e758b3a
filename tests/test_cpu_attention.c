/* test_cpu_attention.c — the CPU backend's tiled attention (multi-head,
 * grouped- and multi-query): the forward against the softmax rule written
 * out in double, the backward against central finite differences,
 * decoding against the forward's last row, the same bits on any thread
 * count, and heads that do not divide refused. Helpers: fd_fixture.h. */
#include "bigbatch/backend.h"
#include "fd_fixture.h"

TestSuite(cpu_attention, .init = backend_up, .fini = backend_down);

/* ---- attention --------------------------------------------------------- */
typedef struct attention_ctx {
    int B, T, NH, KVH, HS, W;     /* W: qkv's row, (NH + 2·KVH)·HS */
    float *qkv, *out, *lse, *r;
} attention_ctx;

static size_t attention_out(const attention_ctx *c) { return (size_t)c->B * c->T * c->NH * c->HS; }

static double attention_loss(void *arg)
{
    attention_ctx *c = arg;
    bb_op_attention_forward(be, F(c->out), c->lse, F(c->qkv), c->B, c->T, c->NH, c->KVH, c->HS);
    return dot(c->out, c->r, attention_out(c));
}

/* The written-out rule: per (b, h, i), softmax over keys j <= i of
 * q_(i,h)·k_(j,g) / sqrt(hs), g = h / (NH / KVH) the head's key/value
 * head, times v_(j,g); lse = log Σ exp of the scores. In double. */
static void attention_reference(const attention_ctx *c, double *out, double *lse)
{
    int hs = c->HS, C = c->NH * hs, W = c->W, koff = C, voff = C + c->KVH * hs;
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->NH; h++)
            for (int i = 0; i < c->T; i++) {
                int g = h / (c->NH / c->KVH);
                const float *q = c->qkv + ((size_t)b * c->T + i) * W + h * hs;
                double *s = malloc((size_t)(i + 1) * sizeof *s), mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    const float *k = c->qkv + ((size_t)b * c->T + j) * W + koff + g * hs;
                    double d = 0;
                    for (int e = 0; e < hs; e++) d += (double)q[e] * k[e];
                    s[j] = d / sqrt((double)hs), mx = fmax(mx, s[j]);
                }
                for (int j = 0; j <= i; j++) sum += exp(s[j] - mx);
                lse[((size_t)b * c->NH + h) * c->T + i] = mx + log(sum);
                for (int e = 0; e < hs; e++) {
                    double o = 0;
                    for (int j = 0; j <= i; j++)
                        o += exp(s[j] - mx) / sum * c->qkv[((size_t)b * c->T + j) * W + voff + g * hs + e];
                    out[((size_t)b * c->T + i) * C + h * hs + e] = o;
                }
                free(s);
            }
}

static attention_ctx attention_make(int B, int T, int NH, int KVH, int HS, uint64_t seed)
{
    attention_ctx c = {B, T, NH, KVH, HS, (NH + 2 * KVH) * HS};
    c.qkv = random_floats((size_t)B * T * c.W, seed, 1);
    c.out = malloc(attention_out(&c) * sizeof(float)), c.lse = malloc((size_t)B * NH * T * sizeof(float));
    c.r = random_floats(attention_out(&c), seed + 1, 1);
    return c;
}

static void attention_free(attention_ctx *c) { free(c->qkv), free(c->out), free(c->lse), free(c->r); }

/* B, T, query heads, key/value heads, head size: shapes around the tiles
 * (64 rows and keys), one partial tile, several with a partial last one,
 * heads of 4 and of 80; grouped-query (2 query heads a key/value head) and
 * multi-query (one key/value head). */
static const int attention_shapes[][5] = {{2, 5, 2, 2, 4}, {1, 130, 4, 4, 4}, {2, 67, 2, 2, 80},
                                          {2, 70, 4, 2, 8}, {1, 45, 6, 1, 8}};

Test(cpu_attention, tiled_attention_is_the_softmax_rule)
{
    for (size_t s = 0; s < sizeof attention_shapes / sizeof *attention_shapes; s++) {
        const int *d = attention_shapes[s];
        attention_ctx c = attention_make(d[0], d[1], d[2], d[3], d[4], 30 + s);
        size_t n_out = attention_out(&c), n_lse = (size_t)c.B * c.NH * c.T;
        double *out = malloc(n_out * sizeof *out), *lse = malloc(n_lse * sizeof *lse), worst = 0;
        attention_loss(&c);
        attention_reference(&c, out, lse);
        for (size_t i = 0; i < n_out; i++) worst = fmax(worst, fabs(out[i] - c.out[i]));
        for (size_t i = 0; i < n_lse; i++) worst = fmax(worst, fabs(lse[i] - c.lse[i]) / fmax(1.0, fabs(lse[i])));
        cr_assert_lt(worst, 2e-5, "B %d T %d NH %d KVH %d HS %d: worst difference %.3e", c.B, c.T, c.NH, c.KVH, c.HS,
                     worst);
        free(out), free(lse);
        attention_free(&c);
    }
}

Test(cpu_attention, attention_backward_matches_finite_differences)
{
    /* T 70: two key tiles, the second partial, and rows on both sides; then grouped-query and multi-query */
    const int shapes[][5] = {{2, 5, 2, 2, 4}, {1, 70, 2, 2, 4}, {1, 70, 4, 2, 4}, {2, 9, 3, 1, 4}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int *d = shapes[s];
        attention_ctx c = attention_make(d[0], d[1], d[2], d[3], d[4], 14);
        size_t n_qkv = (size_t)c.B * c.T * c.W;
        attention_loss(&c);
        /* causal: position 0 attends only to itself (lse = its own score) */
        float q0k0 = 0;
        for (int e = 0; e < c.HS; e++) q0k0 += c.qkv[e] * c.qkv[c.NH * c.HS + e];
        cr_assert_float_eq(c.lse[0], q0k0 / sqrtf((float)c.HS), 1e-5);
        float *dqkv = malloc(n_qkv * sizeof(float));
        bb_op_attention_backward(be, F(dqkv), F(c.r), F(c.qkv), F(c.out), c.lse, c.B, c.T, c.NH, c.KVH, c.HS);
        char name[64];
        snprintf(name, sizeof name, "attention.qkv (%d/%d heads)", c.NH, c.KVH);
        fd_check(name, c.qkv, n_qkv, dqkv, attention_loss, &c, 1e-2f, 2e-3);
        free(dqkv);
        attention_free(&c);
    }
}

/* Decoding: the last row of the forward, alone, from a cache of the
 * earlier rows' keys and values, to which it appends the last row's. */
Test(cpu_attention, attention_decode_is_the_forward_s_last_row)
{
    for (size_t s = 0; s < sizeof attention_shapes / sizeof *attention_shapes; s++) {
        const int *d = attention_shapes[s];
        attention_ctx c = attention_make(1, d[1], d[2], d[3], d[4], 50 + s);
        size_t C = (size_t)c.NH * c.HS, KV = 2 * (size_t)c.KVH * c.HS; /* a row: q (C), then its keys and values */
        float *row = malloc(C * sizeof *row), *scores = malloc((size_t)c.NH * c.T * sizeof *scores);
        float *kv = calloc((size_t)c.T * KV, sizeof *kv);
        for (int t = 0; t < c.T - 1; t++) memcpy(kv + t * KV, c.qkv + (size_t)t * c.W + C, KV * sizeof *kv);
        const float *last = c.qkv + (size_t)(c.T - 1) * c.W;
        attention_loss(&c);
        bb_op_attention_decode(be, F(row), scores, F(kv), F((float *)last), c.T, c.NH, c.KVH, c.HS);
        double diff = 0;
        for (size_t i = 0; i < C; i++) diff = fmax(diff, fabs(row[i] - c.out[(size_t)(c.T - 1) * C + i]));
        cr_assert_lt(diff, 1e-5, "T %d NH %d KVH %d: decode differs from the forward's last row by %.3e", c.T, c.NH,
                     c.KVH, diff);
        cr_assert_eq(memcmp(kv + (size_t)(c.T - 1) * KV, last + C, KV * sizeof *kv), 0,
                     "T %d: the new row's keys and values are not the cache's last row", c.T);
        free(row), free(scores), free(kv);
        attention_free(&c);
    }
}

Test(cpu_attention, key_value_heads_that_do_not_divide_the_heads_are_refused)
{
    bb_backend_t *own;
    cr_assert_eq(bb_backend_create_cpu(&(bb_backend_options){.threads = 1}, &own), BB_OK);
    float qkv[3 * 10 * 4], out[3 * 4], lse[3];
    bb_op_attention_forward(own, F(out), lse, F(qkv), 1, 1, 3, 2, 4);
    cr_assert_eq(bb_backend_synchronize(own), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "2 key/value heads do not divide 3 query heads"), "%s", bb_error_message());
    bb_backend_destroy(own);
}

/* Heads and row tiles run on the backend's threads: any thread count gives
 * the same bits (multi-head and grouped-query). */
Test(cpu_attention, attention_is_bitwise_the_same_on_any_thread_count)
{
    const int shapes[][5] = {{2, 150, 4, 4, 8}, {2, 150, 4, 2, 8}};
    for (int k = 0; k < 2; k++) {
        const int *d = shapes[k];
        attention_ctx c = attention_make(d[0], d[1], d[2], d[3], d[4], 60);
        size_t n_out = attention_out(&c), n_qkv = (size_t)c.B * c.T * c.W;
        float *out1 = malloc(n_out * 4), *d1 = malloc(n_qkv * 4), *d3 = malloc(n_qkv * 4);
        bb_backend_t *one, *three;
        cr_assert_eq(bb_backend_create_cpu(&(bb_backend_options){.threads = 1}, &one), BB_OK);
        cr_assert_eq(bb_backend_create_cpu(&(bb_backend_options){.threads = 3}, &three), BB_OK);
        bb_op_attention_forward(one, F(c.out), c.lse, F(c.qkv), c.B, c.T, c.NH, c.KVH, c.HS);
        memcpy(out1, c.out, n_out * 4);
        bb_op_attention_backward(one, F(d1), F(c.r), F(c.qkv), F(c.out), c.lse, c.B, c.T, c.NH, c.KVH, c.HS);
        bb_op_attention_forward(three, F(c.out), c.lse, F(c.qkv), c.B, c.T, c.NH, c.KVH, c.HS);
        cr_assert_eq(memcmp(out1, c.out, n_out * 4), 0);
        bb_op_attention_backward(three, F(d3), F(c.r), F(c.qkv), F(c.out), c.lse, c.B, c.T, c.NH, c.KVH, c.HS);
        cr_assert_eq(memcmp(d1, d3, n_qkv * 4), 0);
        bb_backend_destroy(one), bb_backend_destroy(three);
        free(out1), free(d1), free(d3);
        attention_free(&c);
    }
}
