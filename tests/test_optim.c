/* test_optim.c — the optimizers' descriptors (names, choices, checks, a
 * step that is the op's, ten steps of each against a PyTorch reference
 * written from its paper, alone and as two ZeRO shards), ZeRO's cut of the gradient buckets under both
 * rules (every float owned once, equal slices equal, whole tensors never
 * cut), and optimizer.bin: it names its optimizer, another optimizer's
 * state is refused naming both, and files from before it did still load. */
#include <math.h>

#include "bigbatch/optim.h"
#include "model_fixture.h"

static char *tmp;

static void up(void)
{
    backend_up();
    tmp = tu_temp_dir();
}

static void down(void)
{
    backend_down();
    tu_rm_tree(tmp);
    free(tmp);
}

TestSuite(optim, .init = up, .fini = down);

static bb_model_t *tiny_gpt(void)
{
    bb_model_config c = bb_model_gpt_config(3, 2, 24, 10, 37); /* odd tensor sizes: biases of 24·3, a vocabulary of 37 */
    return make_model(&c, 1, 3);
}

Test(optim, every_optimizer_is_one_descriptor)
{
    cr_assert_str_eq(bb_optimizer_choices(), "adamw|sgd|lamb|lars|muon");
    cr_assert(strstr(bb_optimizer_help(), "adamw (two moments of state)"), "%s", bb_optimizer_help());
    for (int k = 0; k < BB_OPTIMIZER_COUNT; k++) {
        const bb_optimizer_desc *d = bb_optimizer_desc_of((bb_optimizer_kind)k);
        cr_assert_not_null(d);
        bb_optimizer_kind back;
        cr_assert_eq(bb_optimizer_kind_parse(d->name, &back), BB_OK);
        cr_assert_eq(back, (bb_optimizer_kind)k);
        cr_assert(d->state_buffers >= 1 && d->state_buffers <= BB_OPTIMIZER_MAX_STATE && d->version >= 1);
        bb_optimizer_config c = bb_optimizer_defaults_for((bb_optimizer_kind)k);
        cr_assert_eq(c.kind, (bb_optimizer_kind)k);
        cr_assert_eq(bb_optimizer_check(&c, NULL), BB_OK, "%s: the defaults: %s", d->name, bb_error_message());
    }
    bb_optimizer_kind k;
    cr_assert_eq(bb_optimizer_kind_parse("lion", &k), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "adamw|sgd|lamb|lars|muon"), "%s", bb_error_message());
    cr_assert_eq(bb_optimizer_defaults_for(BB_OPTIMIZER_LAMB).eps, 1e-6, "LAMB's paper's eps");
    cr_assert_eq(bb_optimizer_defaults().eps, 1e-8, "AdamW's (PyTorch's) eps");
    cr_assert_eq(bb_optimizer_defaults_for(BB_OPTIMIZER_MUON).momentum, 0.95, "modded-nanogpt's momentum");
    cr_assert_eq(bb_optimizer_defaults().momentum, 0.9, "SGD's (and LARS's) default momentum");
    cr_assert_null(bb_optimizer_desc_of(BB_OPTIMIZER_COUNT));
}

static const char *flag_of(void *ctx, const char *hp)
{
    (void)ctx;
    return !strcmp(hp, "beta2") ? "--beta2" : NULL;
}

/* Bounds beyond which an optimizer cannot work, named as the caller names
 * them (a flag) or in the optimizer's own words. */
Test(optim, hyperparameters_that_cannot_work_are_refused_by_name)
{
    bb_optimizer_config c = bb_optimizer_defaults();
    bb_optimizer_names flags = {flag_of, NULL};
    c.beta2 = 1;
    cr_assert_eq(bb_optimizer_check(&c, &flags), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "--beta2 1: must be in [0, 1)"), "%s", bb_error_message());
    c = bb_optimizer_defaults(), c.eps = 0;
    cr_assert_eq(bb_optimizer_check(&c, &flags), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "AdamW's eps 0"), "%s", bb_error_message());
    c = bb_optimizer_defaults(), c.kind = BB_OPTIMIZER_SGD, c.momentum = 1.5;
    cr_assert_eq(bb_optimizer_check(&c, NULL), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "SGD's momentum 1.5"), "%s", bb_error_message());
    c = bb_optimizer_defaults_for(BB_OPTIMIZER_LARS), c.trust_coefficient = 0;
    cr_assert_eq(bb_optimizer_check(&c, NULL), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "LARS's trust_coefficient 0: must be in (0, 1]"), "%s", bb_error_message());
    c = bb_optimizer_defaults_for(BB_OPTIMIZER_LAMB), c.beta1 = 1;
    cr_assert_eq(bb_optimizer_check(&c, NULL), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "LAMB's beta1 1: must be in [0, 1) (1 makes LAMB's"), "%s",
              bb_error_message());
    c = bb_optimizer_defaults(), c.lr = NAN;
    cr_assert_eq(bb_optimizer_check(&c, NULL), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "AdamW's lr nan"), "%s", bb_error_message());
}

/* --lr-scale: the peak rate from base_batch to batch, the warm-up and the
 * schedule from it; unscaled without base_batch or batch; a rule without
 * base_batch is refused by name. */
Test(optim, the_peak_rate_scales_from_the_base_batch)
{
    bb_optimizer_config c = bb_optimizer_defaults();
    c.lr = 1e-3, c.base_batch = 256, c.batch = 4096, c.warmup = 10, c.schedule = BB_LR_CONSTANT;
    cr_assert_float_eq(bb_lr_peak(&c), 1e-3, 0, "none: as given");
    c.lr_scale = BB_LR_SCALE_LINEAR;
    cr_assert_float_eq(bb_lr_peak(&c), 16e-3, 1e-15);
    cr_assert_float_eq(bb_lr_at(&c, 0, 100), 16e-3 / 10, 1e-15, "the warm-up climbs to the scaled peak");
    cr_assert_float_eq(bb_lr_at(&c, 50, 100), 16e-3, 1e-15);
    c.lr_scale = BB_LR_SCALE_SQRT;
    cr_assert_float_eq(bb_lr_peak(&c), 4e-3, 1e-15);
    c.schedule = BB_LR_COSINE;
    cr_assert_float_eq(bb_lr_at(&c, 99, 100), 4e-4, 1e-15, "cosine ends at a tenth of the scaled peak");
    c.batch = 0;
    cr_assert_float_eq(bb_lr_peak(&c), 1e-3, 0, "no batch to scale to: as given");
    bb_lr_scale s;
    cr_assert_eq(bb_lr_scale_parse("sqrt", &s), BB_OK);
    cr_assert_eq(s, BB_LR_SCALE_SQRT);
    cr_assert_str_eq(bb_lr_scale_name(BB_LR_SCALE_LINEAR), "linear");
    cr_assert_eq(bb_lr_scale_parse("cubic", &s), BB_ERR_ARG);
    c.base_batch = 0;
    cr_assert_eq(bb_optimizer_check(&c, NULL), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "lr_scale sqrt scales the rate") && strstr(bb_error_message(), "base_batch"),
              "%s", bb_error_message());
}

/* Every float of every bucket has one owner; equal slices are count[b]
 * long (the last ones cut to the bucket); whole-tensor slices start and end
 * at tensor boundaries; and a replica's shard is its slices in bucket order. */
Test(optim, zero_cuts_every_bucket_among_its_owners)
{
    bb_model_t *m = tiny_gpt();
    for (int rule = BB_PARAM_SHARD_ELEMENTS; rule <= BB_PARAM_SHARD_TENSORS; rule++)
        for (int owners = 1; owners <= 5; owners++) {
            bb_param_shards s;
            cr_assert_eq(bb_param_shards_make(m, 2048, owners, (bb_param_shard_rule)rule, &s), BB_OK);
            cr_assert_gt(s.buckets.count, 3, "small buckets: several of them");
            size_t floats = 0;
            for (int b = 0; b < s.buckets.count; b++) {
                size_t at = s.buckets.lo[b];
                for (int k = 0; k < owners; k++) {
                    size_t lo, hi;
                    bb_param_shards_slice(&s, b, k, &lo, &hi);
                    cr_assert_eq(lo, at, "rule %d, %d owners, bucket %d: owner %d starts at %zu, not %zu", rule,
                                 owners, b, k, lo, at);
                    cr_assert_geq(hi, lo);
                    if (rule == BB_PARAM_SHARD_ELEMENTS) {
                        cr_assert_leq(hi - lo, s.count[b]);
                        if (hi < s.buckets.hi[b]) cr_assert_eq(hi - lo, s.count[b], "an equal slice before the end");
                    } else {
                        bool lo_ok = false, hi_ok = hi == s.buckets.hi[b];
                        for (int t = 0; t < bb_model_tensor_count(m); t++) {
                            size_t start = bb_model_tensor(m, t)->offset;
                            lo_ok |= start == lo, hi_ok |= start == hi;
                        }
                        cr_assert(lo_ok && hi_ok, "rule tensors: slice [%zu, %zu) cuts a tensor", lo, hi);
                    }
                    at = hi;
                }
                cr_assert_eq(at, s.buckets.hi[b], "the owners cover bucket %d", b);
                if (rule == BB_PARAM_SHARD_ELEMENTS)
                    cr_assert_geq(s.count[b] * (size_t)owners, s.buckets.hi[b] - s.buckets.lo[b]);
                floats += s.buckets.hi[b] - s.buckets.lo[b];
            }
            cr_assert_eq(floats, bb_model_param_count(m));
            size_t sum = 0;
            for (int k = 0; k < owners; k++) {
                bb_param_shard one;
                cr_assert_eq(bb_param_shard_of(&s, k, &one), BB_OK);
                cr_assert_eq(one.ranges, s.buckets.count);
                sum += one.floats;
                bb_param_shard_free(&one);
            }
            cr_assert_eq(sum, bb_model_param_count(m), "the shards hold every parameter once");
            bb_param_shards_free(&s);
        }
    bb_model_destroy(m);
}

/* A step through the descriptor is the op's, piece by piece: AdamW's to the bit. */
Test(optim, the_step_is_the_optimizer_s_op)
{
    bb_model_t *m = tiny_gpt();
    size_t n = bb_model_param_count(m);
    float *g = bb_model_grads(m), *p = bb_model_params(m), *want = malloc(n * sizeof *want);
    float *mm = calloc(n, sizeof *mm), *vv = calloc(n, sizeof *vv);
    for (size_t i = 0; i < n; i++) g[i] = (float)sin((double)i) * 0.01f; /* the CPU's memory is the host's */
    memcpy(want, p, n * sizeof *want);
    bb_optimizer_config c = bb_optimizer_defaults();
    c.weight_decay = 0.1, c.grad_clip = 0;
    bb_optimizer o;
    cr_assert_eq(bb_optimizer_create(be, &c, m, NULL, &o), BB_OK);
    double lr;
    bb_optimizer_apply(be, m, &o, 0, 10, 1.0, &lr);
    for (int t = 0; t < bb_model_tensor_count(m); t++) {
        const bb_tensor_info *ti = bb_model_tensor(m, t);
        bb_op_adamw(be, want + ti->offset, g + ti->offset, mm + ti->offset, vv + ti->offset, ti->count, (float)lr,
                    0.9f, 0.999f, 1e-8f, ti->decay ? 0.1f : 0.0f, 1, 1.0f);
    }
    cr_assert_eq(memcmp(want, p, n * sizeof *want), 0, "the descriptor's step differs from bb_op_adamw's");
    bb_optimizer_destroy(be, &o);
    free(want), free(mm), free(vv);
    bb_model_destroy(m);
}

/* ---- against PyTorch -------------------------------------------------------
 * Ten steps of optimizer `kind` on a tiny gpt's tensors (decayed matrices,
 * undecayed biases and norms) with gradients that change every step and
 * are clipped on some, by one optimizer and by two ZeRO shards of it (one
 * model: each shard updates its own tensors) — the same bits — then
 * tests/optim_reference.py redoes them in float64 from the paper. */
static void write_floats(const char *dir, const char *name, const float *x, size_t n, const char *mode)
{
    char *path = tu_path(dir, name);
    FILE *f = fopen(path, mode);
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(x, sizeof *x, n, f), n);
    cr_assert_eq(fclose(f), 0);
    free(path);
}

enum { REFERENCE_STEPS = 10 };

/* The steps on `owners` shards (1: one whole optimizer); the parameters after them into `after`. */
static void reference_steps(bb_optimizer_config c, int owners, const float *init, float *after, const char *dir)
{
    bb_model_t *m = tiny_gpt();
    size_t n = bb_model_param_count(m);
    memcpy(bb_model_params(m), init, n * sizeof(float));
    bb_optimizer o[2];
    bb_param_shards all;
    cr_assert_eq(bb_param_shards_make(m, 8192, owners, bb_param_shard_rule_for(c.kind, BB_PARAM_SHARD_AUTO), &all),
                 BB_OK);
    for (int k = 0; k < owners; k++) {
        bb_param_shard one, *shard = NULL;
        if (owners > 1) {
            cr_assert_eq(bb_param_shard_of(&all, k, &one), BB_OK);
            shard = &one;
        }
        cr_assert_eq(bb_optimizer_create(be, &c, m, shard, &o[k]), BB_OK, "%s", bb_error_message());
    }
    char *lrs_path = dir ? tu_path(dir, "lrs.txt") : NULL;
    FILE *lrs = dir ? fopen(lrs_path, "w") : NULL;
    float *g = bb_model_grads(m);
    for (int step = 0; step < REFERENCE_STEPS; step++) {
        for (size_t i = 0; i < n; i++) /* every third step's norm is past the clip */
            g[i] = (float)(sin(0.37 * (double)i + step) * (step % 3 ? 0.002 : 0.05));
        if (dir) write_floats(dir, "grads.bin", g, n, step ? "ab" : "wb");
        double squares = 0, lr = 0;
        for (int k = 0; k < owners; k++) squares += bb_optimizer_sum_squares(be, m, &o[k]);
        for (int k = 0; k < owners; k++) bb_optimizer_apply(be, m, &o[k], (uint64_t)step, REFERENCE_STEPS,
                                                            sqrt(squares), &lr);
        if (lrs) fprintf(lrs, "%.17g\n", (double)(float)lr);
    }
    if (lrs) cr_assert_eq(fclose(lrs), 0);
    free(lrs_path);
    memcpy(after, bb_model_params(m), n * sizeof(float));
    for (int k = 0; k < owners; k++) bb_optimizer_destroy(be, &o[k]);
    bb_param_shards_free(&all);
    bb_model_destroy(m);
}

static void matches_reference(bb_optimizer_kind kind)
{
    if (system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0)
        cr_skip_test("skipped: /usr/bin/python3 cannot import torch (make deps installs python3-torch)");
    bb_model_t *m = tiny_gpt();
    size_t n = bb_model_param_count(m);
    float *init = malloc(n * sizeof *init), *one = malloc(n * sizeof *one), *two = malloc(n * sizeof *two);
    memcpy(init, bb_model_params(m), n * sizeof *init);
    char *path = tu_path(tmp, "tensors.txt");
    FILE *f = fopen(path, "w");
    for (int t = 0; t < bb_model_tensor_count(m); t++) {
        const bb_tensor_info *ti = bb_model_tensor(m, t);
        fprintf(f, "%zu %zu %d %d %d %d\n", ti->offset, ti->count, ti->decay ? 1 : 0, ti->hidden ? 1 : 0,
                ti->shape[0], ti->shape[1]);
    }
    cr_assert_eq(fclose(f), 0);
    free(path);
    bb_model_destroy(m);
    bb_optimizer_config c = bb_optimizer_defaults_for(kind);
    c.lr = kind == BB_OPTIMIZER_LARS || kind == BB_OPTIMIZER_SGD ? 0.5 : 1e-2, c.weight_decay = 0.1;
    c.beta2 = 0.99, c.trust_coefficient = 0.02;
    path = tu_path(tmp, "hp.json");
    f = fopen(path, "w");
    fprintf(f, "{\"beta1\": %.17g, \"beta2\": %.17g, \"eps\": %.17g, \"weight_decay\": %.17g, \"momentum\": %.17g, "
               "\"trust_coefficient\": %.17g, \"grad_clip\": %.17g}\n", (double)(float)c.beta1,
            (double)(float)c.beta2, (double)(float)c.eps,
            (double)(float)c.weight_decay, (double)(float)c.momentum, (double)(float)c.trust_coefficient, c.grad_clip);
    cr_assert_eq(fclose(f), 0);
    free(path);
    write_floats(tmp, "init.bin", init, n, "wb");
    reference_steps(c, 1, init, one, tmp);
    reference_steps(c, 2, init, two, NULL);
    cr_assert_eq(memcmp(one, two, n * sizeof *one), 0, "%s: two ZeRO shards stepped other bits than one optimizer",
                 bb_optimizer_kind_name(kind));
    cr_assert_neq(memcmp(one, init, n * sizeof *one), 0, "the steps changed nothing");
    write_floats(tmp, "after.bin", one, n, "wb");
    tu_run r = tu_run_argv((char *const[]){"/usr/bin/python3", "tests/optim_reference.py", tmp,
                                           (char *)bb_optimizer_kind_name(kind), NULL});
    cr_log_info("%s", r.out);
    cr_assert_eq(r.exit_code, 0, "%s against its reference:\n%s%s", bb_optimizer_kind_name(kind), r.out, r.err);
    tu_run_free(&r);
    free(init), free(one), free(two);
}

Test(optim, adamw_matches_torch_optim_adamw, .timeout = 60) { matches_reference(BB_OPTIMIZER_ADAMW); }
Test(optim, sgd_matches_torch_optim_sgd, .timeout = 60) { matches_reference(BB_OPTIMIZER_SGD); }
Test(optim, lamb_matches_a_reference_written_from_its_paper, .timeout = 60) { matches_reference(BB_OPTIMIZER_LAMB); }
Test(optim, lars_matches_a_reference_written_from_its_paper, .timeout = 60) { matches_reference(BB_OPTIMIZER_LARS); }
Test(optim, muon_matches_a_reference_written_as_modded_nanogpt_s, .timeout = 60) { matches_reference(BB_OPTIMIZER_MUON); }

/* optimizer.bin names its optimizer: another's is refused naming both; a
 * file of version 1 (no name: its buffer count says which) still loads. */
Test(optim, a_state_file_names_its_optimizer)
{
    bb_model_t *m = tiny_gpt();
    size_t n = bb_model_param_count(m);
    bb_optimizer_config adamw = bb_optimizer_defaults(), sgd = adamw;
    sgd.kind = BB_OPTIMIZER_SGD;
    bb_optimizer a, s;
    cr_assert_eq(bb_optimizer_create(be, &adamw, m, NULL, &a), BB_OK);
    cr_assert_eq(bb_optimizer_create(be, &sgd, m, NULL, &s), BB_OK);
    for (size_t i = 0; i < n; i++) a.state[0][i] = (float)i, a.state[1][i] = (float)(2 * i), s.state[0][i] = 0.5f;
    char *path = tu_path(tmp, "optimizer.bin");
    const bb_optimizer *one = &a;
    cr_assert_eq(bb_optimizer_save(&be, &one, 1, n, NULL, path), BB_OK, "%s", bb_error_message());
    size_t bytes;
    uint8_t *file = tu_read_file(path, &bytes);
    cr_assert_eq(memcmp(file, "BBOPTIM2", 8), 0);
    cr_assert_str_eq((const char *)file + 8, "adamw");
    cr_assert_eq(bb_optimizer_load(be, &s, n, path), BB_ERR_FORMAT);
    cr_assert(strstr(bb_error_message(), "holds the state of adamw; this run's optimizer is sgd"), "%s",
              bb_error_message());
    cr_assert_eq(s.state[0][1], 0.5f, "a refused file changed the state");
    memset(a.state[0], 0, n * sizeof(float));
    cr_assert_eq(bb_optimizer_load(be, &a, n, path), BB_OK, "%s", bb_error_message());
    cr_assert_eq(a.state[0][7], 7.0f);
    cr_assert_eq(a.state[1][7], 14.0f);
    /* the same state as version 1 wrote it: magic, buffers, a reserved word, count, checksum, the floats */
    size_t header = 8 + 16 + 4 + 4 + 8 + 8, floats = bytes - header;
    uint8_t *v1 = malloc(32 + floats);
    uint32_t buffers = 2, reserved = 0;
    uint64_t count = n;
    memcpy(v1, "BBOPTIM1", 8), memcpy(v1 + 8, &buffers, 4), memcpy(v1 + 12, &reserved, 4), memcpy(v1 + 16, &count, 8);
    memcpy(v1 + 24, file + header - 8, 8); /* the checksum */
    memcpy(v1 + 32, file + header, floats);
    char *old = tu_path(tmp, "old.bin");
    tu_write_file(old, v1, 32 + floats);
    memset(a.state[1], 0, n * sizeof(float));
    cr_assert_eq(bb_optimizer_load(be, &a, n, old), BB_OK, "%s", bb_error_message());
    cr_assert_eq(a.state[1][7], 14.0f);
    cr_assert_eq(bb_optimizer_load(be, &s, n, old), BB_ERR_FORMAT);
    cr_assert(strstr(bb_error_message(), "holds the state of adamw"), "%s", bb_error_message());
    bb_optimizer_destroy(be, &a), bb_optimizer_destroy(be, &s);
    free(v1), free(file), free(old), free(path);
    bb_model_destroy(m);
}
