/* test_safety.c — never losing a user's work: checkpoint directories that
 * are refused or pruned, damaged weights, non-finite steps, failed saves,
 * Ctrl-C, resume that remembers the run, one --devices syntax, numbers,
 * messages, --help and the README's examples (run in test_cli.c). Helpers:
 * train_fixture.h. */
#include "train_fixture.h"

TestSuite(safety, .init = fixture_setup, .fini = fixture_teardown);

Test(safety, a_new_run_refuses_another_runs_checkpoints)
{
    char *data = make_tokens("tokens", 170);
    char *ckpt = tu_path(tmp, "ckpt");
#define TINY "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch", "32", \
             "--micro-batch", "8", "--save", ckpt, "--quiet"
    tu_run r = tu_bigbatch("train", TINY, "--steps", "2");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    char *before = step_dirs(ckpt);
    cr_assert_str_eq(before, "step-00000002");
    /* another run into the same directory: refused, nothing touched */
    r = tu_bigbatch("train", TINY, "--steps", "3", "--lr", "0.01");
    tu_assert_error(&r, "--save", "another run's checkpoints", "latest -> step-00000002", "--resume", "--force");
    tu_run_free(&r);
    char *after = step_dirs(ckpt);
    cr_assert_str_eq(after, before, "a refused run changed the directory");
    free(after);
    /* continuing it is fine, and so is --force */
    r = tu_bigbatch("train", TINY, "--steps", "3", "--resume", ckpt);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    r = tu_bigbatch("train", TINY, "--steps", "1", "--force");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
#undef TINY
    free(before), free(ckpt), free(data);
}

Test(safety, save_keeps_the_newest_keep_checkpoints)
{
    char *data = make_tokens("tokens", 170);
    for (int keep = 1; keep <= 3; keep++) {
        char name[16];
        snprintf(name, sizeof name, "ckpt%d", keep);
        char *ckpt = tu_path(tmp, name);
        bb_train_options o = gpt_options(data, 1, 8, 32);
        o.save_dir = ckpt, o.save_every = 1, o.keep = keep;
        bb_train_result r = train(&o);
        bb_train_result_free(&r);
        char *dirs = step_dirs(ckpt);
        const char *expect[] = {"", "step-00000005", "step-00000004 step-00000005",
                                "step-00000003 step-00000004 step-00000005"};
        cr_assert_str_eq(dirs, expect[keep], "--keep %d", keep);
        free(dirs), free(ckpt);
    }
    bb_train_options o = gpt_options(data, 1, 8, 32);
    o.keep = 0;
    bb_train_result r;
    cr_assert_eq(bb_train_run(&o, &r), BB_ERR_ARG);
    bb_train_result_free(&r);
    free(data);
}

/* A full disk (RLIMIT_FSIZE) fails the save: the save's error is the one
 * reported (not the trace's, which fails too), and no partial step
 * directory, empty --save directory or half-written trace stays. */
Test(safety, a_failed_save_leaves_nothing_behind_and_is_the_error_reported)
{
    char *data = make_tokens("tokens", 170);
    char *ckpt = tu_path(tmp, "ckpt"), *trace = tu_path(tmp, "t.json");
    char *argv[] = {"/bin/sh", "-c", "trap '' XFSZ; ulimit -f 1; exec \"$0\" \"$@\"", (char *)tu_bigbatch_bin(),
                    "train", "--data", data, "--layers", "1", "--d-model", "32", "--heads", "2", "--global-batch", "32",
                    "--micro-batch", "8", "--steps", "2", "--save", ckpt, "--trace", trace, "--quiet", NULL};
    tu_run r = tu_run_argv(argv);
    tu_assert_error(&r, "model.safetensors");
    cr_assert_null(strstr(r.err, "--trace"), "the trace's failure hid the save's: %s", r.err);
    cr_assert(!tu_exists(ckpt), "the --save directory this run created stayed behind");
    tu_run_free(&r);
    /* into an existing directory: it stays, without leftovers */
    cr_assert_eq(mkdir(ckpt, 0777), 0);
    r = tu_run_argv(argv);
    cr_assert_eq(r.exit_code, 1, "%s", r.err);
    tu_run_free(&r);
    cr_assert(tu_exists(ckpt));
    cr_assert(!has_temp_step_dir(ckpt), "a failed save left its temporary directory");
    free(ckpt), free(trace), free(data);
}

Test(safety, a_run_that_fails_before_step_1_leaves_no_save_directory_or_trace)
{
    char *data = make_tokens("tokens", 170);
    char *ckpt = tu_path(tmp, "sub/ckpt"), *trace = tu_path(tmp, "t.json");
    tu_run r = tu_bigbatch("train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch",
                           "32", "--micro-batch", "8", "--steps", "2", "--save", ckpt, "--trace", trace,
                           "--device-mem", "4KiB");
    tu_assert_error(&r, "out of memory");
    cr_assert(!tu_exists(ckpt), "an empty --save directory stayed behind");
    cr_assert(!tu_exists(trace), "an empty --trace file stayed behind");
    tu_run_free(&r);
    free(ckpt), free(trace), free(data);
}

/* A damaged model.safetensors in a checkpoint: every command that reads
 * it says so in one line, instead of using it. */
Test(safety, a_damaged_checkpoint_is_refused_by_every_command)
{
    char *data = make_tokens("tokens", 170);
    char *ckpt = tu_path(tmp, "ckpt"), *out = tu_path(tmp, "w.safetensors");
    tu_run r = tu_bigbatch("train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2",
                           "--global-batch", "32", "--micro-batch", "8", "--steps", "4", "--stop-after", "2", "--save",
                           ckpt, "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    char *weights = tu_path(ckpt, "latest/model.safetensors");
    struct stat st;
    cr_assert_eq(stat(weights, &st), 0);
    tu_flip_byte(weights, (long)st.st_size - 3, 0x10);
    r = tu_bigbatch("eval", "--ckpt", ckpt, "--data", data);
    tu_assert_error(&r, "model.safetensors", "checksum");
    tu_run_free(&r);
    r = tu_bigbatch("sample", "--ckpt", ckpt, "--tokens", "4", "--prompt", "a");
    tu_assert_error(&r, "model.safetensors", "checksum");
    tu_run_free(&r);
    r = tu_bigbatch("export", "--ckpt", ckpt, "--out", out);
    tu_assert_error(&r, "model.safetensors", "checksum");
    cr_assert(!tu_exists(out), "export wrote damaged weights");
    tu_run_free(&r);
    r = tu_bigbatch("train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch",
                    "32", "--micro-batch", "8", "--steps", "4", "--resume", ckpt, "--quiet");
    tu_assert_error(&r, "model.safetensors", "checksum");
    tu_run_free(&r);
    free(weights), free(out), free(ckpt), free(data);
}

/* Every line of a JSON Lines file parses as strict JSON (no NaN). */
static void assert_strict_json_lines(const char *path)
{
    char cmd[4300];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c 'import json,sys\n"
             "def bad(c): raise ValueError(\"not JSON: \" + c)\n"
             "[json.loads(l, parse_constant=bad) for l in open(sys.argv[1])]' '%s'", path);
    cr_assert_eq(system(cmd), 0, "%s is not strict JSON Lines", path);
}

/* SGD at lr 1000 without clipping diverges to NaN within a few steps. */
#define DIVERGING "--data", data, "--layers", "1", "--d-model", "32", "--heads", "2", "--global-batch", "16", \
                  "--micro-batch", "8", "--steps", "30", "--optimizer", "sgd", "--lr", "1000", "--grad-clip", "0", \
                  "--save", ckpt, "--save-every", "1", "--metrics", metrics, "--quiet"

Test(safety, a_non_finite_step_stops_the_run_and_nothing_of_it_is_saved)
{
    char *data = make_tokens("tokens", 1000);
    char *ckpt = tu_path(tmp, "ckpt"), *metrics = tu_path(tmp, "m.jsonl");
    tu_run r = tu_bigbatch("train", DIVERGING);
    tu_assert_error(&r, "step ", "NaN", "stopping with the weights of step", "--on-nonfinite skip");
    tu_run_free(&r);
    char *state = tu_path(ckpt, "latest/state.json");
    char *json = (char *)tu_read_file(state, NULL);
    cr_assert_null(strstr(json, "null"), "the saved step has a non-finite loss: %s", json);
    cr_assert_null(strstr(json, "nan"), "%s", json);
    assert_strict_json_lines(metrics);
    /* the saved weights are finite: they evaluate */
    r = tu_bigbatch("eval", "--ckpt", ckpt, "--data", data, "--json");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    free(json), free(state), free(ckpt), free(metrics), free(data);
}

Test(safety, on_nonfinite_skip_passes_over_such_steps_and_counts_them)
{
    char *data = make_tokens("tokens", 1000);
    char *ckpt = tu_path(tmp, "ckpt"), *metrics = tu_path(tmp, "m.jsonl");
    tu_run r = tu_bigbatch("train", DIVERGING, "--on-nonfinite", "skip", "--log-every", "0");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    r = tu_bigbatch("train", DIVERGING, "--on-nonfinite", "skip", "--force");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    assert_strict_json_lines(metrics);
    char *m = (char *)tu_read_file(metrics, NULL);
    cr_assert_not_null(strstr(m, "\"skipped\": true"), "no step was marked skipped: %s", m);
    free(m);
    /* the end says how many, and the weights kept are finite */
    bb_train_options o = gpt_options(data, 1, 8, 16);
    o.model = bb_model_gpt_config(1, 2, 32, 0, 0);
    o.steps = 30, o.opt.kind = BB_OPTIMIZER_SGD, o.opt.lr = 1000, o.opt.grad_clip = 0, o.skip_nonfinite = true;
    bb_train_result res = train(&o);
    cr_assert_gt(res.skipped_steps, 0);
    for (size_t i = 0; i < res.param_count; i++) cr_assert(isfinite(res.params[i]), "weight %zu is %f", i, res.params[i]);
    bb_train_result_free(&res);
    free(ckpt), free(metrics), free(data);
}
#undef DIVERGING

Test(safety, optimizer_settings_that_cannot_work_are_refused)
{
    char *data = make_tokens("tokens", 170);
    tu_run r = tu_bigbatch("train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2",
                           "--global-batch", "32", "--micro-batch", "8", "--steps", "2", "--beta2", "1");
    tu_assert_error(&r, "--beta2 1", "[0, 1)");
    tu_run_free(&r);
    free(data);
}

/* ---- Ctrl-C (issue 14, items 5 and 6) ------------------------------------- */
/* Runs argv, sends one SIGINT after `after` seconds, and asserts that it
 * exits with 130 within 5 s of it. */
static void ctrl_c_exits_130(const char *what, char *const argv[], double after)
{
    char *out = tu_path(tmp, "out"), *err = tu_path(tmp, "err");
    pid_t pid = start_logged(argv, out, err);
    cr_assert(catches(pid, SIGINT, 10), "%s never installed its Ctrl-C handler", what);
    usleep((useconds_t)(after * 1e6));
    cr_assert(running(pid), "%s ended before the Ctrl-C: make it longer", what);
    double t0 = now_s();
    kill(pid, SIGINT);
    int code = exit_within(pid, 5);
    char *e = (char *)tu_read_file(err, NULL);
    cr_assert_eq(code, 130, "%s: exit %d after Ctrl-C (130 expected, within 5 s); stderr: %s", what, code, e);
    cr_log_info("%s: exit 130 %.2f s after Ctrl-C", what, now_s() - t0);
    free(e), free(out), free(err);
}

/* A gpt that takes a while to evaluate 40000 records on 2 cores. */
static char *slow_eval_weights(void)
{
    bb_backend_options bo = {.threads = 1};
    bb_backend_t *be;
    bb_model_t *m;
    bb_model_config c = bb_model_gpt_config(4, 4, 128, TOKENS_T, TOKENS_VOCAB);
    cr_assert_eq(bb_backend_create_cpu(&bo, &be), BB_OK);
    cr_assert_eq(bb_model_create(be, &c, 8, &m), BB_OK);
    cr_assert_eq(bb_model_init(m, 1), BB_OK);
    char *path = tu_path(tmp, "w.safetensors");
    cr_assert_eq(bb_model_save_safetensors(m, path), BB_OK);
    bb_model_destroy(m);
    bb_backend_destroy(be);
    return path;
}

Test(safety, ctrl_c_ends_eval_sample_bench_and_train_promptly_with_130)
{
    char *big = make_tokens("big", 40000), *weights = slow_eval_weights();
    const char *bin = tu_bigbatch_bin();
    char *eval[] = {(char *)bin, "eval", "--init-from", weights, "--layers", "4", "--d-model", "128", "--heads", "4",
                    "--data", big, NULL};
    ctrl_c_exits_130("eval", eval, 1.0);
    char *bench[] = {(char *)bin, "bench", "queue", "--seconds", "10", "--runs", "5", NULL};
    ctrl_c_exits_130("bench queue", bench, 0.5);
    /* sample: a byte-level gpt trained for one step on the embedded data */
    char *ckpt = tu_path(tmp, "kjv-ckpt");
    tu_run r = tu_bigbatch("train", "--data", "data/kjv", "--layers", "1", "--d-model", "16", "--heads", "2",
                           "--global-batch", "8", "--micro-batch", "8", "--steps", "1", "--save", ckpt, "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    char *sample[] = {(char *)bin, "sample", "--ckpt", ckpt, "--tokens", "1000000", NULL};
    ctrl_c_exits_130("sample", sample, 1.0);
    /* train: saves, and does not start the (long) evaluation */
    char *save = tu_path(tmp, "ckpt");
    char *train_argv[] = {(char *)bin, "train", "--data", big, "--val-data", big, "--layers", "1", "--d-model", "16",
                          "--heads", "2", "--global-batch", "8", "--micro-batch", "8", "--steps", "100000", "--save",
                          save, "--save-every", "1000", "--eval-every", "1000", NULL};
    ctrl_c_exits_130("train", train_argv, 1.0);
    bb_checkpoint_info info;
    cr_assert_eq(bb_checkpoint_read_info(save, &info), BB_OK, "the interrupted run did not save: %s",
                 bb_error_message());
    free(save), free(ckpt), free(weights), free(big);
}

/* A second Ctrl-C ends a command at once, even in the middle of a long
 * step; the first would have let the step finish. */
Test(safety, a_second_ctrl_c_stops_at_once)
{
    char *out = tu_path(tmp, "out"), *err = tu_path(tmp, "err");
    char *argv[] = {(char *)tu_bigbatch_bin(), "train", "--data", "data/kjv", "--global-batch", "256", "--micro-batch",
                    "128", "--steps", "1000", "--quiet", NULL}; /* steps of a few seconds on 2 cores */
    for (int attempt = 0;; attempt++) {
        pid_t pid = start_logged(argv, out, err);
        cr_assert(catches(pid, SIGINT, 30), "train never installed its Ctrl-C handler");
        cr_assert(kill_delivered(pid, SIGINT), "the first Ctrl-C was never delivered");
        if (!running(pid)) { /* the first Ctrl-C met the end of a step: try again */
            exit_within(pid, 1);
            cr_assert_lt(attempt, 3, "every first Ctrl-C ended the run at once: no step was long enough");
            continue;
        }
        double t0 = now_s();
        kill(pid, SIGINT);
        int code = exit_within(pid, 10);
        char *e = (char *)tu_read_file(err, NULL);
        cr_assert_eq(code, 130, "exit %d after the second Ctrl-C; stderr: %s", code, e);
        cr_assert_not_null(strstr(e, "interrupted again"), "%s", e);
        cr_log_info("exit 130 %.3f s after the second Ctrl-C", now_s() - t0);
        free(e);
        break;
    }
    free(out), free(err);
}

/* On a terminal, evaluation shows how far it is (in place); a save says
 * where it went. */
Test(safety, progress_for_evaluation_and_saves)
{
    if (system("command -v script > /dev/null 2>&1") != 0) fixture_skip("skipped: no script(1) for a terminal");
    char *mid = make_tokens("mid", 12000), *weights = slow_eval_weights();
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "script -qec \"'%s' eval --init-from '%s' --layers 4 --d-model 128 --heads 4 --data '%s'\" /dev/null",
             tu_bigbatch_bin(), weights, mid);
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    tu_run r = tu_run_argv(argv);
    cr_assert_eq(r.exit_code, 0, "%s%s", r.out, r.err);
    cr_assert_not_null(strstr(r.out, "\r\033[Keval: "), "no progress on a terminal: %s", r.out);
    cr_assert_not_null(strstr(r.out, " of 12000 records ("), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "s left"), "%s", r.out);
    tu_run_free(&r);
    char *ckpt = tu_path(tmp, "ckpt");
    r = tu_bigbatch("train", "--data", mid, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch", "32",
                    "--micro-batch", "8", "--steps", "2", "--save", ckpt, "--save-every", "1");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char expect[4200];
    snprintf(expect, sizeof expect, "saved step 2 to %s/step-00000002", ckpt);
    cr_assert_not_null(strstr(r.err, expect), "%s", r.err);
    tu_run_free(&r);
    free(ckpt), free(mid), free(weights);
}

/* ---- resume that remembers (issue 14, item 7) ----------------------------- */
Test(safety, resume_with_no_other_flags_continues_the_run)
{
    char *data = make_tokens("tokens", 400), *val = make_tokens("val", 40);
    char *ckpt = tu_path(tmp, "ckpt"), *whole = tu_path(tmp, "w.jsonl"), *resumed = tu_path(tmp, "r.jsonl");
#define RUN "--data", data, "--val-data", val, "--layers", "1", "--d-model", "16", "--heads", "2", "--devices", "cpu:2", \
            "--global-batch", "32", "--micro-batch", "8", "--steps", "6", "--optimizer", "sgd", "--lr", "0.05",   \
            "--warmup", "2", "--lr-schedule", "constant", "--seed", "7", "--checkpoint", "blocks", "--quiet"
    tu_run r = tu_bigbatch("train", RUN, "--metrics", whole);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    r = tu_bigbatch("train", RUN, "--stop-after", "3", "--save", ckpt);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
#undef RUN
    /* nothing but --resume (and where to write): the same steps 4..6 */
    r = tu_bigbatch("train", "--resume", ckpt, "--save", ckpt, "--metrics", resumed);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_null(strstr(r.err, "differs"), "a remembered setting was not remembered: %s", r.err);
    cr_assert_not_null(strstr(r.err, "on cpu:2"), "%s", r.err);
    cr_assert_not_null(strstr(r.err, "steps 4..6"), "%s", r.err);
    cr_assert_not_null(strstr(r.err, "val loss"), "the validation data was not remembered: %s", r.err);
    tu_run_free(&r);
    char *a = metric_losses(whole, 4), *b = metric_losses(resumed, 4);
    cr_assert_str_eq(b, a, "the resumed run's losses differ from the uninterrupted one's");
    /* a finished run says so and trains nothing */
    r = tu_bigbatch("train", "--resume", ckpt);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "already at step 6 of 6"), "%s", r.err);
    cr_assert_null(strstr(r.err, "step 6/6"), "it pretended to train: %s", r.err);
    tu_run_free(&r);
    /* what cannot apply to a resumed run is an error, not ignored */
    r = tu_bigbatch("train", "--resume", ckpt, "--seed", "3");
    tu_assert_error(&r, "--seed with --resume");
    tu_run_free(&r);
    r = tu_bigbatch("train", "--resume", ckpt, "--init-from", whole);
    tu_assert_error(&r, "--init-from with --resume");
    tu_run_free(&r);
    free(a), free(b), free(ckpt), free(whole), free(resumed), free(data), free(val);
}

Test(safety, a_library_caller_with_only_resume_set_continues_as_the_command_line_does)
{
    char *data = make_tokens("tokens", 400);
    char *ckpt = tu_path(tmp, "ckpt"), *cli = tu_path(tmp, "cli.jsonl"), *lib = tu_path(tmp, "lib.jsonl");
    tu_run r = tu_bigbatch("train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--devices",
                           "cpu:2", "--global-batch", "32", "--micro-batch", "8", "--steps", "6", "--stop-after", "3",
                           "--optimizer", "sgd", "--lr", "0.05", "--seed", "7", "--save", ckpt, "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    char *elsewhere = tu_path(tmp, "elsewhere"); /* the checkpoint stays at step 3 for the library's run */
    r = tu_bigbatch("train", "--resume", ckpt, "--metrics", cli, "--save", elsewhere, "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    bb_train_options o;
    bb_train_defaults(&o); /* the defaults, which the checkpoint overrides: gpt 4/4/128, adamw, seed 1, cpu:1 */
    o.resume_dir = ckpt, o.metrics_path = lib;
    bb_train_result res = train(&o);
    cr_assert_eq(res.first_step, 3);
    cr_assert_eq(res.steps_done, 6);
    cr_assert_eq(res.devices, 2, "the checkpoint's devices");
    bb_train_result_free(&res);
    char *a = metric_losses(cli, 4), *b = metric_losses(lib, 4);
    cr_assert(strlen(a) > 0);
    cr_assert_str_eq(b, a, "bb_train_run with only resume set differs from train --resume");
    free(a), free(b), free(lib), free(cli), free(elsewhere), free(ckpt), free(data);
}

Test(safety, paths_with_spaces_quotes_backslashes_and_utf8_survive_save_and_resume)
{
    char *data = make_tokens("da ta \"q\" \\b \xc3\xa9", 400);
    char *ckpt = tu_path(tmp, "sa ve \"q\" \\b \xc3\xbc");
    tu_run r = tu_bigbatch("train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch",
                           "32", "--micro-batch", "8", "--steps", "4", "--stop-after", "2", "--save", ckpt, "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    bb_checkpoint_info info;
    cr_assert_eq(bb_checkpoint_read_info(ckpt, &info), BB_OK, "%s", bb_error_message());
    cr_assert_str_eq(info.data, data, "the data path came back different");
    r = tu_bigbatch("train", "--resume", ckpt, "--save", ckpt, "--log-every", "1");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "steps 3..4"), "%s", r.err);
    cr_assert_not_null(strstr(r.err, data), "it did not read the same data: %s", r.err);
    tu_run_free(&r);
    cr_assert_eq(bb_checkpoint_read_info(ckpt, &info), BB_OK, "%s", bb_error_message());
    cr_assert_eq(info.step, 4);
    free(ckpt), free(data);
}

Test(safety, resume_takes_the_directory_its_latest_or_a_step_directory)
{
    char *data = make_tokens("tokens", 400);
    char *ckpt = tu_path(tmp, "ckpt"), *latest = tu_path(ckpt, "latest"), *step4 = tu_path(ckpt, "step-00000004");
    tu_run r = tu_bigbatch("train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch",
                           "32", "--micro-batch", "8", "--steps", "8", "--stop-after", "5", "--save", ckpt,
                           "--save-every", "1", "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    char *from[] = {ckpt, latest, step4};
    const char *expect[] = {"steps 6..8", "steps 6..8", "steps 5..8"};
    for (int i = 0; i < 3; i++) {
        char name[32], *save;
        snprintf(name, sizeof name, "save-%d", i);
        save = tu_path(tmp, name); /* elsewhere: saving into ckpt would move its latest */
        r = tu_bigbatch("train", "--resume", from[i], "--stop-after", "6", "--log-every", "0", "--save", save);
        free(save);
        cr_assert_eq(r.exit_code, 0, "--resume %s: %s", from[i], r.err);
        cr_assert_not_null(strstr(r.err, expect[i]), "--resume %s: %s", from[i], r.err);
        tu_run_free(&r);
    }
    free(step4), free(latest), free(ckpt), free(data);
}

/* ---- one interface (issue 14, items 9 and 10) ------------------------------ */
Test(safety, devices_mean_the_same_in_plan_train_and_bench)
{
    char *data = make_tokens("tokens", 170);
    /* plan counts a list of GPUs, present or not */
    tu_run r = tu_bigbatch("plan", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--devices",
                           "cuda:0,1,2,3", "--device-mem", "1GiB", "--global-batch", "64");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.out, "on 4 devices"), "%s", r.out);
    tu_run_free(&r);
    r = tu_bigbatch("plan", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--devices", "cpu:2",
                    "--device-mem", "1GiB", "--global-batch", "64");
    cr_assert_not_null(strstr(r.out, "on 2 devices"), "%s", r.out);
    tu_run_free(&r);
    r = tu_bigbatch("plan", "--data", data, "--devices", "gpu:2", "--device-mem", "1GiB", "--global-batch", "64");
    tu_assert_error(&r, "--devices", "cpu:N, cuda:all or cuda:0,1");
    tu_run_free(&r);
    /* bench takes --devices, one device */
    r = tu_bigbatch("bench", "model", "--devices", "cpu", "--layers", "1", "--d-model", "16", "--heads", "2",
                    "--seq-len", "8", "--vocab", "16", "--steps", "1");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    r = tu_bigbatch("bench", "model", "--devices", "cpu:2", "--steps", "1");
    tu_assert_error(&r, "--devices cpu:2", "one device");
    tu_run_free(&r);
    free(data);
}

Test(safety, train_takes_the_loader_options)
{
    char *data = make_tokens("tokens", 400), *a = tu_path(tmp, "a.jsonl"), *b = tu_path(tmp, "b.jsonl");
#define RUN "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch", "32", \
            "--micro-batch", "8", "--steps", "3", "--log-every", "0"
    tu_run r = tu_bigbatch("train", RUN, "--io", "pread", "--metrics", a);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "(pread)"), "--io pread was not used: %s", r.err);
    tu_run_free(&r);
    r = tu_bigbatch("train", RUN, "--shuffle-frames", "1", "--metrics", b);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
#undef RUN
    char *la = metric_losses(a, 1), *lb = metric_losses(b, 1);
    cr_assert_str_neq(la, lb, "--shuffle-frames changed nothing");
    free(la), free(lb), free(a), free(b), free(data);
}

Test(safety, numbers_read_and_printed_as_a_user_means_them)
{
    char *data = make_tokens("tokens", 170);
    /* integer limits as integers; too large is too large */
    tu_run r = tu_bigbatch("sample", "--ckpt", data, "--tokens", "100000000");
    tu_assert_error(&r, "--tokens: 100000000 is out of range [1, 1048576]");
    tu_run_free(&r);
    r = tu_bigbatch("train", "--data", data, "--steps", "99999999999999999999");
    tu_assert_error(&r, "--steps", "too large");
    tu_run_free(&r);
    /* no allocation scales with --steps */
    r = tu_bigbatch("train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch", "32",
                    "--micro-batch", "8", "--steps", "1000000000000", "--stop-after", "2", "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    /* MB is 10^6 bytes, MiB 2^20 */
    tu_run mb = tu_bigbatch("plan", "--data", data, "--device-mem", "512MB", "--global-batch", "32");
    tu_run mib = tu_bigbatch("plan", "--data", data, "--device-mem", "512MiB", "--global-batch", "32");
    cr_assert_not_null(strstr(mb.out, "488.3 MiB per device"), "%s", mb.out);
    cr_assert_not_null(strstr(mib.out, "512.0 MiB per device"), "%s", mib.out);
    tu_run_free(&mb), tu_run_free(&mib);
    free(data);
}

/* ---- messages that point the right way (issue 14, item 11) ----------------- */
Test(safety, messages_point_the_right_way)
{
    char *tokens = make_tokens("tokens", 170), *images = make_images("images", 64, 3);
    char *ckpt = tu_path(tmp, "ckpt");
    /* no micro-batch can help: say what global batch would */
    tu_run r = tu_bigbatch("train", "--data", tokens, "--devices", "cpu:3", "--global-batch", "64", "--steps", "1");
    tu_assert_error(&r, "--global-batch 64 does not split over 3 devices", "multiple of 3", "63");
    tu_run_free(&r);
    /* a gpt on images: no --seq-len (which train does not have), the whole shape */
    r = tu_bigbatch("train", "--data", tokens, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch",
                    "32", "--micro-batch", "8", "--steps", "1", "--save", ckpt, "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    r = tu_bigbatch("eval", "--ckpt", ckpt, "--data", images);
    tu_assert_error(&r, "image", "8x8");
    cr_assert_null(strstr(r.err, "--seq-len"), "%s", r.err);
    tu_run_free(&r);
    /* a directory where a file is wanted */
    r = tu_bigbatch("eval", "--init-from", ckpt, "--data", tokens, "--layers", "1", "--d-model", "16", "--heads", "2");
    tu_assert_error(&r, "is a directory, not a .safetensors file");
    tu_run_free(&r);
    /* plan: nothing fits is an error, on stderr */
    r = tu_bigbatch("plan", "--data", tokens, "--device-mem", "64KiB", "--global-batch", "32");
    tu_assert_error(&r, "plan: nothing fits");
    tu_run_free(&r);
    /* one of a thing is not "1 steps" */
    r = tu_bigbatch("train", "--data", tokens, "--layers", "1", "--d-model", "16", "--heads", "2", "--devices", "cpu:2",
                    "--global-batch", "32", "--micro-batch", "16", "--steps", "1", "--log-every", "0");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "x 1 micro-step x 16; 1 step ("), "%s", r.err);
    cr_assert_not_null(strstr(r.err, "; 1 gradient bucket\n"), "%s", r.err);
    tu_run_free(&r);
    free(ckpt), free(tokens), free(images);
}

/* A damaged or dangling `latest` names the newest other checkpoint that
 * may load; eval checks a --checkpoint policy as train does (and says it
 * changes nothing for a forward pass). */
Test(safety, a_damaged_latest_points_to_the_step_before_and_eval_checks_its_policy)
{
    char *data = make_tokens("tokens", 170), *ck = tu_path(tmp, "ck-latest");
    tu_run r = tu_bigbatch("train", "--data", data, "--layers", "2", "--d-model", "16", "--heads", "2", "--global-batch",
                           "8", "--steps", "4", "--save-every", "2", "--save", ck, "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    char path[4200], older[4200];
    snprintf(path, sizeof path, "%s/step-00000004/state.json", ck);
    snprintf(older, sizeof older, "the newest other checkpoint there may load: %s/step-00000002", ck);
    tu_write_file(path, "garbage", 7);
    r = tu_bigbatch("eval", "--ckpt", ck, "--json");
    tu_assert_error(&r, "step-00000004/state.json", older);
    tu_run_free(&r);
    snprintf(path, sizeof path, "%s/step-00000002", ck);
    r = tu_bigbatch("eval", "--ckpt", path, "--json"); /* the way on loads */
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    static char *const bad[] = {"plan:x", "plan:n,s,f", "bogus"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        r = tu_bigbatch("eval", "--ckpt", path, "--checkpoint", bad[i], "--json");
        cr_assert_eq(r.exit_code, 2, "eval --checkpoint %s: exit %d: %s", bad[i], r.exit_code, r.err);
        tu_assert_error(&r, "--checkpoint");
        tu_run_free(&r);
    }
    r = tu_bigbatch("eval", "--ckpt", path, "--checkpoint", "plan:n,s", "--json");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "keep nothing for a backward"), "%s", r.err);
    tu_run_free(&r);
    free(data), free(ck);
}

/* A text too small for the vocabulary asked: the tokenizer is written with
 * the ids it has, and a warning says how many, not a silent shortfall. */
Test(safety, tokenizer_train_says_when_the_text_gives_fewer_ids_than_asked)
{
    char *text = tu_path(tmp, "small.txt"), *tok = tu_path(tmp, "small.json");
    tu_write_file(text, "the cat sat on the mat\n", 23);
    tu_run r = tu_bigbatch("tokenizer", "train", "--in", text, "--vocab", "5000", "--out", tok);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert(strstr(r.err, "--vocab 5000: the text has only") && strstr(r.err, "not 5000"), "%s", r.err);
    tu_run_free(&r);
    r = tu_bigbatch("tokenizer", "train", "--in", text, "--vocab", "260", "--out", tok);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_null(strstr(r.err, "the text has only"), "a vocabulary the text fills: %s", r.err);
    tu_run_free(&r);
    /* one id given to two tokens: decoding could not say which, so the file is refused */
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "python3 -c \"import json; p = '%s'; t = json.load(open(p)); v = t['model']['vocab']; "
             "v['a'] = v['b']; json.dump(t, open(p, 'w'))\"", tok);
    cr_assert_eq(system(cmd), 0);
    r = tu_bigbatch("tokenizer", "encode", "--tokenizer", tok, "--in", text);
    cr_assert_eq(r.exit_code, 1, "%s", r.err);
    tu_assert_error(&r, "model.vocab gives id", "and to another token");
    tu_run_free(&r);
    free(text), free(tok);
}

/* ---- --help and flags that mean nothing (issue 14, item 12) ----------------- */
Test(safety, help_and_flags_say_what_they_mean)
{
    tu_run r = tu_bigbatch("sample", "--help");
    char *line = strstr(r.out, "  --prompt TEXT ");
    cr_assert_not_null(line, "%s", r.out);
    cr_assert(!strncmp(strchr(line, '(') , "(default: \\n)", 13), "the default prompt is printed raw: %s", line);
    tu_run_free(&r);
    r = tu_bigbatch("plan", "--help");
    cr_assert_not_null(strstr(r.out, "only this micro-batch (default: any)\n"), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "(default: 1024,1024)"), "%s", r.out);
    tu_run_free(&r);
    r = tu_bigbatch("bench", "model", "--help");
    cr_assert(strstr(r.out, "--d-model D") && strstr(strstr(r.out, "--d-model D"), "(default: 128)"),
              "bench model's gpt is not train's: %s", r.out);
    tu_run_free(&r);
    r = tu_bigbatch("bench", "loader", "--help");
    cr_assert(strstr(strstr(r.out, "--seed N"), "(default: 1)"), "bench loader's seed is not train's: %s", r.out);
    tu_run_free(&r);
    r = tu_bigbatch("--help");
    cr_assert_not_null(strstr(r.out, "a model's steps"), "%s", r.out);
    tu_run_free(&r);
    /* flags that cannot apply are errors, or a warning when they still mean something */
    r = tu_bigbatch("train", "--hidden", "10", "--steps", "1");
    tu_assert_error(&r, "--hidden", "gpt");
    tu_run_free(&r);
    r = tu_bigbatch("train", "--model", "mlp", "--layers", "2", "--steps", "1");
    tu_assert_error(&r, "--layers", "mlp");
    tu_run_free(&r);
    r = tu_bigbatch("train", "--steps", "2", "--epochs", "1");
    tu_assert_error(&r, "--steps and --epochs");
    tu_run_free(&r);
    r = tu_bigbatch("train", "--layers", "1", "--d-model", "16", "--heads", "2", "--checkpoint", "every:5", "--steps",
                    "1", "--global-batch", "8", "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "warn: --checkpoint every:5: the gpt has 1 layers"), "%s", r.err);
    tu_run_free(&r);
}
