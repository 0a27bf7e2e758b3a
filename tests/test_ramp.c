/* test_ramp.c — --global-batch ramp:B0..B1[:STEPS]: the batch follows its
 * schedule (whole micro-steps, linear, then B1) and --lr-scale follows the
 * batch; the data order is the positions' order (the ramp's first steps
 * are the fixed batch's, bitwise, and two splits of the same chunks train
 * the same model); a resume mid-ramp is the run that never stopped,
 * bitwise; --epochs holds the steps whose chunks fit; and what cannot ramp
 * says so in one line. Helpers: train_fixture.h. */
#include "train_fixture.h"

TestSuite(ramp, .init = fixture_setup, .fini = fixture_teardown);

static void refused(const bb_train_options *o, const char *message)
{
    bb_train_result r;
    cr_assert_eq(bb_train_run(o, &r), BB_ERR_ARG, "expected a refusal naming \"%s\"", message);
    cr_assert(strstr(bb_error_message(), message), "%s", bb_error_message());
}

/* A run that continues `ckpt` with everything the checkpoint says. */
static bb_train_options resuming(const char *ckpt)
{
    bb_train_options o;
    bb_train_defaults(&o);
    o.resume_dir = ckpt, o.progress = NULL, o.loader_threads = 1;
    return o;
}

/* 2 devices x micro-batch 4: chunks of 8; from 8 to 32 over 6 steps. */
static bb_train_options ramped(const char *tokens, uint64_t steps)
{
    bb_train_options o = gpt_options(tokens, 2, 4, 32);
    o.ramp_from = 8, o.ramp_steps = 6, o.steps = steps;
    o.opt.schedule = BB_LR_CONSTANT;
    return o;
}

Test(ramp, the_batch_follows_its_schedule_and_the_scaled_rate_follows_the_batch)
{
    char *tokens = make_tokens("tokens", 300), *metrics = tu_path(tmp, "ramp.jsonl");
    bb_train_options o = ramped(tokens, 9);
    o.opt.lr = 1e-3, o.opt.lr_scale = BB_LR_SCALE_LINEAR, o.opt.base_batch = 8;
    o.metrics_path = metrics;
    bb_train_result r = train(&o);
    cr_assert_eq(r.steps_done, 9);
    double batch[16], lr[16];
    cr_assert_eq(metric_values(metrics, "global_batch", 1, batch, 16), 9);
    cr_assert_eq(metric_values(metrics, "lr", 1, lr, 16), 9);
    const int want[9] = {8, 8, 16, 16, 24, 24, 32, 32, 32}; /* 1 + 3 s / 6 chunks, then 4 */
    for (int s = 0; s < 9; s++) {
        cr_assert_eq((int)batch[s], want[s], "step %d: batch %g, want %d", s + 1, batch[s], want[s]);
        cr_assert(fabs(lr[s] - 1e-3 * want[s] / 8) <= 1e-6 * lr[s], "step %d: lr %g, want %g", s + 1, lr[s],
                  1e-3 * want[s] / 8);
    }
    char *m = (char *)tu_read_file(metrics, NULL);
    cr_assert(strstr(m, "\"batch_ramp\": {\"from\": 8, \"steps\": 6, \"auto\": false}"), "the run line names the ramp");
    free(m);
    bb_train_result_free(&r);
    free(tokens), free(metrics);
}

/* The ramp's steps take the positions after the previous steps': its
 * first two steps (batch 8) are a fixed batch 8's, bitwise; the same
 * chunks split as 1 device x 8 instead of 2 x 4 give the same model
 * within float rounding (other records would move it far more). */
Test(ramp, the_data_order_is_the_positions_order)
{
    char *tokens = make_tokens("tokens", 300);
    bb_train_options o = ramped(tokens, 9);
    bb_train_result ramp = train(&o);
    bb_train_options f = o;
    f.ramp_from = 0, f.ramp_steps = 0, f.global_batch = 8;
    bb_train_result fixed = train(&f);
    for (int s = 0; s < 2; s++)
        cr_assert_eq(ramp.losses[s], fixed.losses[s], "step %d: %.9g vs the fixed batch's %.9g", s + 1,
                     ramp.losses[s], fixed.losses[s]);
    cr_assert_neq(ramp.losses[3], fixed.losses[3], "step 4 ramped to 16: other records than the fixed 8's");
    bb_train_options one = o;
    one.devices = 1, one.micro_batch = 8;
    bb_train_result single = train(&one);
    for (int s = 0; s < 9; s++)
        cr_assert(fabs(single.losses[s] - ramp.losses[s]) <= 1e-5 * fabs(ramp.losses[s]),
                  "step %d: 1 device %.9g, 2 devices %.9g", s + 1, single.losses[s], ramp.losses[s]);
    double d = relative_distance(single.params, ramp.params, ramp.param_count);
    cr_assert(d <= 1e-5, "1 device x 8 and 2 x 4 ramped to other weights (%.2e)", d);
    bb_train_result_free(&ramp), bb_train_result_free(&fixed), bb_train_result_free(&single);
    free(tokens);
}

Test(ramp, a_resume_mid_ramp_is_the_run_that_never_stopped)
{
    char *tokens = make_tokens("tokens", 300), *ckpt = tu_path(tmp, "ckpt");
    bb_train_options o = ramped(tokens, 9);
    bb_train_result straight = train(&o);
    bb_train_options first = o;
    first.save_dir = ckpt, first.stop_after = 3; /* at batch 16 of the ramp */
    bb_train_result part = train(&first);
    bb_train_options rest = resuming(ckpt);
    bb_train_result second = train(&rest);
    cr_assert_eq(second.first_step, 3);
    cr_assert_eq(second.steps_done, 9, "the resume takes the run's --steps and ramp");
    cr_assert_eq(memcmp(second.losses, straight.losses + 3, 6 * sizeof *second.losses), 0,
                 "the resumed steps' losses differ from the run that never stopped");
    cr_assert_eq(memcmp(second.params, straight.params, straight.param_count * sizeof(float)), 0,
                 "resumed mid-ramp: not bitwise the run that never stopped");
    bb_train_options other = rest;
    other.global_batch = 32, other.ramp_from = 16, other.ramp_steps = 6;
    other.set |= BB_TRAIN_SET(BB_TRAIN_GLOBAL_BATCH);
    bb_train_result refused;
    cr_assert_eq(bb_train_run(&other, &refused), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "a batch ramp from 8 over 6 steps, this run asks for a batch ramp from 16"), "%s",
              bb_error_message());
    bb_train_result_free(&straight), bb_train_result_free(&part), bb_train_result_free(&second);
    free(tokens), free(ckpt);
}

/* 300 records in chunks of 8: 37 an epoch; two epochs, 74 chunks: the
 * ramp's six steps take 1+1+2+2+3+3 = 12, then (74 - 12) / 4 = 15 steps. */
Test(ramp, epochs_hold_the_steps_whose_chunks_fit)
{
    char *tokens = make_tokens("tokens", 300);
    bb_train_options o = ramped(tokens, 0);
    o.epochs = 2;
    bb_train_result r = train(&o);
    cr_assert_eq(r.steps_done, 21);
    bb_train_result_free(&r);
    free(tokens);
}

Test(ramp, what_cannot_ramp_says_so_in_one_line)
{
    bb_train_options o;
    bb_train_defaults(&o);
    const char *bad[] = {"ramp:32..8", "ramp:8..", "ramp:8..32:0", "ramp:x..32", "ramp:8-32"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(bb_train_parse_global_batch("--global-batch", bad[i], &o), BB_ERR_ARG, "%s", bad[i]);
        cr_assert(strstr(bb_error_message(), "--global-batch ramp:"), "%s", bb_error_message());
    }
    cr_assert_eq(bb_train_parse_global_batch("--global-batch", "ramp:32..512:1000", &o), BB_OK);
    cr_assert(o.ramp_from == 32 && o.global_batch == 512 && o.ramp_steps == 1000);
    cr_assert_eq(bb_train_parse_global_batch("--global-batch", "ramp:32..512", &o), BB_OK);
    cr_assert(o.ramp_from == 32 && o.global_batch == 512 && o.ramp_steps == 0, "STEPS absent: the whole run");
    cr_assert_eq(bb_train_parse_global_batch("--global-batch", "96", &o), BB_OK);
    cr_assert(o.ramp_from == 0 && o.global_batch == 96, "a plain number is a fixed batch");
    char *tokens = make_tokens("tokens", 300);
    bb_train_options r = ramped(tokens, 9);
    r.ramp_from = 12;
    refused(&r, "B0 12 is not a whole number of micro-batches of 4 on 2 devices (a multiple of 8)");
    r = ramped(tokens, 9), r.zero = 2;
    refused(&r, "ZeRO-2 reduces every micro-step");
    r = ramped(tokens, 0), r.ramp_steps = 0, r.epochs = 1;
    refused(&r, "give ramp:8..32:STEPS");
    free(tokens);
}

/* --global-batch auto: each step's batch is the previous step's noise
 * scale in whole chunks, never shrinking, within B0..B1 (read back from
 * the metrics); a resume goes on from the chunks taken and the batch
 * reached, bitwise; it needs --steps, and on one device micro-steps. */
Test(ramp, auto_follows_the_noise_scale_and_a_resume_is_exact)
{
    char *images = make_images("images", 1300, 1), *metrics = tu_path(tmp, "auto.jsonl"), *ckpt = tu_path(tmp, "ckpt");
    bb_train_options o = mlp_options(images, 2, 4, 64);
    o.auto_batch = true, o.ramp_from = 8, o.steps = 12, o.metrics_path = metrics;
    bb_train_result straight = train(&o);
    double batch[16], noise[16];
    cr_assert_eq(metric_values(metrics, "global_batch", 1, batch, 16), 12);
    cr_assert_eq(metric_values(metrics, "noise_scale", 1, noise, 16), 12);
    cr_assert_eq(batch[0], 8, "B0 first");
    for (int s = 1; s < 12; s++) {
        double want = batch[s - 1];
        if (isfinite(noise[s - 1]) && ceil(noise[s - 1] / 8) * 8 > want) want = ceil(noise[s - 1] / 8) * 8;
        want = want < 64 ? want : 64;
        cr_assert_eq(batch[s], want, "step %d: batch %g after a noise scale of %g (batch %g before)", s + 1, batch[s],
                     noise[s - 1], batch[s - 1]);
    }
    cr_assert_gt(batch[11], batch[0], "the batch grew (noise scales %g .. %g)", noise[0], noise[11]);
    bb_train_options first = o;
    first.save_dir = ckpt, first.stop_after = 5, first.metrics_path = NULL;
    bb_train_result part = train(&first);
    bb_train_options rest = resuming(ckpt);
    bb_train_result second = train(&rest);
    cr_assert_eq(second.steps_done, 12);
    cr_assert_eq(memcmp(second.params, straight.params, straight.param_count * sizeof(float)), 0,
                 "auto resumed at step 5: not bitwise the run that never stopped");
    bb_train_result_free(&straight), bb_train_result_free(&part), bb_train_result_free(&second);
    bb_train_options r = mlp_options(images, 2, 4, 64);
    r.auto_batch = true, r.ramp_from = 8, r.steps = 0, r.epochs = 1;
    refused(&r, "auto: the steps' batches follow the run");
    r = mlp_options(images, 1, 4, 64);
    r.auto_batch = true, r.ramp_from = 4, r.steps = 5;
    refused(&r, "start at B0 >= 8 (two micro-batches of 4)");
    free(images), free(metrics), free(ckpt);
}

/* The CLI's ramp: the banner says it, the progress line shows the batch,
 * and the report draws the batch beside the noise scale and counts the
 * examples seen step by step. */
Test(ramp, the_cli_and_the_report_show_the_ramp)
{
    char *tokens = make_tokens("tokens", 300), *metrics = tu_path(tmp, "m.jsonl"), *html = tu_path(tmp, "r.html");
    tu_run r = tu_bigbatch("train", "--data", tokens, "--layers", "1", "--d-model", "16", "--heads", "2", "--devices",
                           "cpu:2", "--global-batch", "ramp:8..24:4", "--micro-batch", "4", "--steps", "6",
                           "--log-every", "1", "--metrics", metrics, "--report", html);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.err, "global batch 8..24 over 4 steps (linear, in whole micro-steps), then 24"), "%s", r.err);
    cr_assert(strstr(r.err, "batch 16"), "the progress line shows the step's batch: %s", r.err);
    tu_run_free(&r);
    char *page = (char *)tu_read_file(html, NULL);
    cr_assert(strstr(page, "from 8 over 4 steps to G = 24"), "the report's header lacks the ramp");
    cr_assert(strstr(page, "the global batch (its ramp)"), "the noise scale panel lacks the ramp's line");
    free(page);
    r = tu_bigbatch("train", "--data", tokens, "--global-batch", "ramp:8..24:x", "--steps", "2");
    tu_assert_error(&r, "--global-batch ramp:8..24:x", "expected ramp:B0..B1 or ramp:B0..B1:STEPS");
    tu_run_free(&r);
    free(tokens), free(metrics), free(html);
}
