/* test_train.c — the trainer: partition invariance, checkpointing and
 * resume bitwise, the reducer's overlap in the trace, crash-safe saves,
 * memory errors and balance, and the train/eval/export/sample commands. */
#include <math.h>
#include <signal.h>
#include <time.h>

#include "bigbatch/train.h"
#include "test_util.h"

/* ---- tiny datasets ----------------------------------------------------- */
#define IMAGE_SIDE 8
#define IMAGE_CLASSES 4
#define TOKENS_T 16
#define TOKENS_VOCAB 32

static char *tmp;

/* Writes `count` records as dataset `name` under tmp; frees `records`;
 * returns the directory. */
static char *write_dataset(const char *name, bb_shard_meta *meta, uint8_t *records, uint64_t count)
{
    snprintf(meta->source, sizeof meta->source, "test %s", name);
    char *dir = tu_path(tmp, name);
    tu_write_dataset(dir, meta, records, count);
    free(records);
    return dir;
}

/* Images whose class is the brightest quadrant: learnable, deterministic. */
static char *make_images(const char *name, uint64_t count, uint64_t seed)
{
    uint32_t rs = 1 + IMAGE_SIDE * IMAGE_SIDE;
    uint8_t *r = malloc(count * rs);
    tu_fill_random(r, count * rs, seed);
    for (uint64_t i = 0; i < count; i++) {
        uint8_t *rec = r + i * rs;
        int label = (int)(i % IMAGE_CLASSES), qy = label / 2, qx = label % 2;
        rec[0] = (uint8_t)label;
        for (int y = 0; y < IMAGE_SIDE / 2; y++)
            for (int x = 0; x < IMAGE_SIDE / 2; x++) rec[1 + (qy * 4 + y) * IMAGE_SIDE + qx * 4 + x] |= 0xc0;
    }
    bb_shard_meta m = {.kind = BB_RECORD_IMAGE_U8, .rank = 2, .shape = {IMAGE_SIDE, IMAGE_SIDE}, .record_size = rs,
                       .classes_or_vocab = IMAGE_CLASSES};
    return write_dataset(name, &m, r, count);
}

/* Token windows of a repeating pattern with noise. */
static char *make_tokens(const char *name, uint64_t count)
{
    uint32_t rs = 2 * (TOKENS_T + 1);
    uint8_t *r = malloc(count * rs);
    for (uint64_t i = 0; i < count; i++)
        for (int t = 0; t <= TOKENS_T; t++) {
            uint16_t v = (uint16_t)((i * 7 + (uint64_t)t * 3 + (t % 5 == 0 ? i % 11 : 0)) % TOKENS_VOCAB);
            r[i * rs + 2 * t] = (uint8_t)v, r[i * rs + 2 * t + 1] = (uint8_t)(v >> 8);
        }
    bb_shard_meta m = {.kind = BB_RECORD_TOKENS_U16, .rank = 1, .shape = {TOKENS_T + 1}, .record_size = rs,
                       .classes_or_vocab = TOKENS_VOCAB};
    return write_dataset(name, &m, r, count);
}

static void setup(void) { tmp = tu_temp_dir(); }
static void teardown(void)
{
    tu_rm_tree(tmp);
    free(tmp);
}
/* No .timeout: Criterion 2.4.1 leaks a timer when two tests with timeouts
 * overlap under --jobs 2, and LeakSanitizer (make asan) reports it. */
TestSuite(train, .init = setup, .fini = teardown);

static bb_train_options mlp_options(const char *data, int devices, int micro_batch, int global_batch)
{
    bb_train_options o;
    bb_train_defaults(&o);
    int hidden[] = {32, 16};
    o.model = bb_model_mlp_config(0, hidden, 2, 0);
    o.data = data;
    o.devices = devices, o.micro_batch = micro_batch, o.global_batch = global_batch;
    o.steps = 5, o.epochs = 0;
    o.loader_threads = 1;
    o.opt.lr = 1e-2;
    o.progress = NULL;
    return o;
}

static bb_train_options gpt_options(const char *data, int devices, int micro_batch, int global_batch)
{
    bb_train_options o = mlp_options(data, devices, micro_batch, global_batch);
    o.model = bb_model_gpt_config(2, 2, 16, 0, 0);
    o.opt.lr = 3e-3;
    return o;
}

static bb_train_result train(const bb_train_options *o)
{
    bb_train_result r;
    bb_status rc = bb_train_run(o, &r);
    cr_assert_eq(rc, BB_OK, "%s", bb_error_message());
    return r;
}

static double relative_distance(const float *a, const float *b, size_t n)
{
    double diff = 0, norm = 0;
    for (size_t i = 0; i < n; i++) diff += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), norm += (double)a[i] * a[i];
    return sqrt(diff / norm);
}

/* ---- partition invariance ---------------------------------------------- */
static void check_splits(bb_train_options (*make)(const char *, int, int, int), const char *data, int G,
                         const int (*splits)[2], int count)
{
    bb_train_options o = make(data, 1, G, G);
    bb_train_result ref = train(&o);
    cr_assert_eq(ref.steps_done, 5);
    for (int i = 0; i < count; i++) {
        int devices = splits[i][0], micro = splits[i][1];
        o = make(data, devices, micro, G);
        bb_train_result r = train(&o);
        for (int s = 0; s < 5; s++) {
            double rel = fabs(r.losses[s] - ref.losses[s]) / fabs(ref.losses[s]);
            cr_assert(rel <= 1e-5, "%d x %d x %d: step %d loss %.9g vs %.9g (rel %.2e)", devices,
                      G / (devices * micro), micro, s + 1, r.losses[s], ref.losses[s], rel);
        }
        double d = relative_distance(ref.params, r.params, r.param_count);
        cr_assert(d <= 1e-5, "%d x %d x %d: final parameters differ by %.2e (relative)", devices,
                  G / (devices * micro), micro, d);
        cr_log_info("%d x %d x %d: losses within 1e-5, parameters within %.1e", devices, G / (devices * micro), micro, d);
        bb_train_result_free(&r);
    }
    cr_assert(ref.losses[4] < ref.losses[0], "training should lower the loss: %g -> %g", ref.losses[0], ref.losses[4]);
    bb_train_result_free(&ref);
}

Test(train, mlp_partition_invariance_of_G_256)
{
    char *data = make_images("images", 1300, 1);
    static const int splits[][2] = {{1, 32}, {2, 32}, {4, 32}}; /* 1x8x32, 2x4x32, 4x2x32 */
    check_splits(mlp_options, data, 256, splits, 3);
    free(data);
}

Test(train, gpt_partition_invariance_of_G_32)
{
    char *data = make_tokens("tokens", 170);
    static const int splits[][2] = {{1, 8}, {2, 8}, {4, 8}, {2, 4}}; /* 1x4x8, 2x2x8, 4x1x8, 2x4x4 */
    check_splits(gpt_options, data, 32, splits, 4);
    free(data);
}

/* ---- checkpointing and resume are exact -------------------------------- */
static void assert_bitwise(const bb_train_result *a, const bb_train_result *b, const char *what)
{
    cr_assert_eq(a->steps_done, b->steps_done);
    size_t steps = a->steps_done - a->first_step;
    size_t from = b->first_step - a->first_step; /* b may start later (resumed) */
    cr_assert_eq(memcmp(a->losses + from, b->losses, (steps - from) * sizeof *a->losses), 0, "%s: losses differ", what);
    cr_assert_eq(a->param_count, b->param_count);
    cr_assert_eq(memcmp(a->params, b->params, a->param_count * sizeof *a->params), 0, "%s: parameters differ", what);
}

Test(train, checkpoint_blocks_is_bitwise_the_same)
{
    char *data = make_tokens("tokens", 170);
    bb_train_options o = gpt_options(data, 2, 4, 32);
    o.model.layers = 3;
    bb_train_result none = train(&o);
    o.model.checkpoint_every = 1;
    bb_train_result blocks = train(&o);
    assert_bitwise(&none, &blocks, "--checkpoint blocks");
    bb_train_result_free(&none), bb_train_result_free(&blocks);
    free(data);
}

/* --precision bf16 (activations stored in bf16; the CPU's products stay
 * fp32): the losses follow fp32's within 1e-2, the loss falls, and
 * checkpointing is still bitwise free of effect. */
Test(train, bf16_activations_track_fp32_and_checkpointing_stays_exact)
{
    char *data = make_tokens("tokens", 340);
    bb_train_options o = gpt_options(data, 2, 4, 32);
    o.model.layers = 3;
    o.steps = 10;
    bb_train_result fp32 = train(&o);
    o.precision = BB_PRECISION_BF16;
    bb_train_result bf16 = train(&o);
    double worst = 0;
    for (int s = 0; s < 10; s++) {
        double rel = fabs(bf16.losses[s] - fp32.losses[s]) / fp32.losses[s];
        worst = rel > worst ? rel : worst;
    }
    cr_log_info("bf16 vs fp32 over 10 steps: worst loss difference %.2e (relative), loss %.4f -> %.4f", worst,
                bf16.losses[0], bf16.losses[9]);
    cr_assert_lt(worst, 1e-2);
    cr_assert_gt(worst, 0.0, "bf16 gave fp32's losses bit for bit: nothing was rounded");
    cr_assert_lt(bf16.losses[9], bf16.losses[0]);
    cr_assert_lt(bf16.peak_bytes[0], fp32.peak_bytes[0]);
    o.model.checkpoint_every = 1;
    bb_train_result blocks = train(&o);
    assert_bitwise(&bf16, &blocks, "bf16 with --checkpoint blocks");
    bb_train_result_free(&fp32), bb_train_result_free(&bf16), bb_train_result_free(&blocks);
    free(data);
}

Test(train, resume_continues_bitwise)
{
    char *data = make_tokens("tokens", 100); /* 3 steps per epoch: the resume crosses epochs */
    char *ckpt = tu_path(tmp, "ckpt");
    bb_train_options o = gpt_options(data, 2, 4, 32);
    o.steps = 10;
    bb_train_result whole = train(&o);
    o.save_dir = ckpt;
    o.stop_after = 5; /* the first 5 steps of the 10-step schedule, saved */
    bb_train_result first = train(&o);
    cr_assert_eq(first.steps_done, 5);
    o.stop_after = 0;
    o.save_dir = NULL;
    o.resume_dir = ckpt;
    bb_train_result second = train(&o);
    cr_assert_eq(second.first_step, 5);
    assert_bitwise(&whole, &second, "resume at step 5");
    cr_assert_eq(memcmp(whole.losses, first.losses, 5 * sizeof *first.losses), 0);
    bb_train_result_free(&whole), bb_train_result_free(&first), bb_train_result_free(&second);
    free(ckpt);
    free(data);
}

/* ---- the reducer overlaps the backward --------------------------------- */
typedef struct span_line {
    char name[32];
    int tid;
    double ts, dur;
    long step;
    int detail;
} span_line;

/* Reads the "X" events of a trace bb_trace_write wrote (one per line). */
static span_line *read_trace(const char *path, int *count)
{
    char *text = (char *)tu_read_file(path, NULL);
    span_line *spans = calloc(100000, sizeof *spans);
    *count = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        span_line s;
        char key[16];
        if (sscanf(line, "{\"name\":\"%31[^\"]\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%lf,\"dur\":%lf,\"args\":{\"step\":%ld,\"%15[a-z_]\":%d",
                   s.name, &s.tid, &s.ts, &s.dur, &s.step, key, &s.detail) == 7 && *count < 100000)
            spans[(*count)++] = s;
    }
    free(text);
    return spans;
}

/* Steps in which some reduce span started before the last backward span
 * (the last micro-step's, on any worker) ended. */
static int overlapped_steps(const char *path, int steps, int accumulation)
{
    int n, overlapped = 0;
    span_line *s = read_trace(path, &n);
    cr_assert(n > 0, "no spans in %s", path);
    for (int step = 1; step <= steps; step++) {
        double backward_end = 0, first_reduce = 1e300;
        int reduces = 0;
        for (int i = 0; i < n; i++) {
            if (s[i].step != step) continue;
            if (!strcmp(s[i].name, "backward") && s[i].detail == accumulation - 1 && s[i].ts + s[i].dur > backward_end)
                backward_end = s[i].ts + s[i].dur;
            if (!strncmp(s[i].name, "reduce bucket", 13)) {
                reduces++;
                if (s[i].ts < first_reduce) first_reduce = s[i].ts;
            }
        }
        cr_assert_gt(reduces, 1, "step %d: expected several reduce buckets", step);
        cr_assert_gt(backward_end, 0, "step %d: no backward span", step);
        overlapped += first_reduce < backward_end;
    }
    free(s);
    return overlapped;
}

Test(train, trace_shows_reduce_overlapping_backward_unless_no_overlap)
{
    char *data = make_tokens("tokens", 170);
    char *trace = tu_path(tmp, "trace.json");
    bb_train_options o = gpt_options(data, 2, 8, 32); /* accumulation 2 */
    o.model = bb_model_gpt_config(4, 2, 64, 0, 0);
    o.bucket_mib = 0.02; /* several buckets even for this small model */
    o.trace_path = trace;
    bb_train_result r = train(&o);
    bb_train_result_free(&r);
    int with = overlapped_steps(trace, 5, 2);
    o.no_overlap = true;
    r = train(&o);
    bb_train_result_free(&r);
    int without = overlapped_steps(trace, 5, 2);
    cr_log_info("steps with a reduce before the backward ended: %d of 5 (overlap), %d of 5 (--no-overlap)", with, without);
    cr_assert_gt(with, 0, "no step reduced a bucket while the backward ran");
    cr_assert_eq(without, 0, "--no-overlap reduced a bucket before the backward ended");
    free(trace);
    free(data);
}

/* ---- memory: clear errors, balanced devices ----------------------------- */
Test(train, device_mem_too_small_is_a_clear_error)
{
    char *data = make_tokens("tokens", 170);
    tu_run r = tu_bigbatch("train", "--data", data, "--layers", "2", "--d-model", "32", "--global-batch", "32",
                           "--micro-batch", "8", "--steps", "2", "--device-mem", "200KiB");
    tu_assert_error(&r, "out of memory", "--device-mem", "--micro-batch", "--checkpoint");
    cr_assert_eq(r.exit_code, 1);
    tu_run_free(&r);
    free(data);
}

Test(train, four_devices_hold_the_same_memory)
{
    char *data = make_tokens("tokens", 170);
    bb_train_options o = gpt_options(data, 4, 4, 32);
    bb_train_result r = train(&o);
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int d = 0; d < 4; d++) {
        cr_assert_gt(r.peak_bytes[d], 0);
        lo = r.peak_bytes[d] < lo ? r.peak_bytes[d] : lo;
        hi = r.peak_bytes[d] > hi ? r.peak_bytes[d] : hi;
    }
    cr_log_info("peak bytes per device: %llu .. %llu", (unsigned long long)lo, (unsigned long long)hi);
    cr_assert((double)(hi - lo) <= 0.02 * (double)hi, "peaks differ: %llu vs %llu", (unsigned long long)lo,
              (unsigned long long)hi);
    bb_train_result_free(&r);
    free(data);
}

/* ---- saves survive kill -9 --------------------------------------------- */
/* Starts argv in the background with stdout and stderr to /dev/null. */
static int spawn_quiet(pid_t *pid, char *const argv[])
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    int rc = posix_spawn(pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    return rc;
}

static bool has_temp_step_dir(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "ls -a '%s' 2>/dev/null | grep -q '^\\.step-.*\\.tmp-'", dir);
    return system(cmd) == 0;
}

Test(train, kill_during_save_leaves_the_previous_checkpoint_loadable)
{
    char *data = make_images("images", 600, 2);
    char *ckpt = tu_path(tmp, "ckpt");
    char *latest = tu_path(ckpt, "latest");
    int mid_write = 0;
    for (int attempt = 0; attempt < 8; attempt++) {
        /* a 4.5M-parameter mlp on micro-batches of 1: a step takes far less
         * time than writing its 54 MB checkpoint, so most kills land in a save */
        tu_rm_tree(ckpt);
        pid_t pid;
        char *argv[] = {(char *)tu_bigbatch_bin(), "train", "--model", "mlp", "--hidden", "1500,1500,1000", "--data",
                        data, "--global-batch", "1", "--micro-batch", "1", "--steps", "100000", "--save", ckpt,
                        "--save-every", "1", "--quiet", NULL};
        cr_assert_eq(spawn_quiet(&pid, argv), 0);
        while (!tu_exists(latest)) usleep(5000); /* the first checkpoint */
        struct timespec nap = {0, (long)(17 + 23 * attempt) * 1000000L};
        nanosleep(&nap, NULL);
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        cr_assert(WIFSIGNALED(status), "the trainer should have been killed");
        mid_write += has_temp_step_dir(ckpt); /* a step directory the kill left half-written */
        tu_run r = tu_bigbatch("eval", "--ckpt", ckpt, "--data", data, "--json");
        cr_assert_eq(r.exit_code, 0, "after kill %d the checkpoint does not load: %s", attempt, r.err);
        cr_assert_not_null(strstr(r.out, "\"loss\""));
        tu_run_free(&r);
    }
    cr_log_info("%d of 8 kills found a checkpoint being written", mid_write);
    cr_assert_gt(mid_write, 0, "no kill landed during a save; the test proved nothing");
    free(latest), free(ckpt), free(data);
}

/* ---- the commands ------------------------------------------------------- */
Test(train, uneven_split_lists_valid_micro_batches)
{
    char *data = make_tokens("tokens", 170);
    tu_run r = tu_bigbatch("train", "--data", data, "--devices", "cpu:2", "--global-batch", "24", "--micro-batch",
                           "5", "--steps", "1");
    tu_assert_error(&r, "--global-batch 24", "2 devices", "valid --micro-batch values: 1, 2, 3, 4, 6, 12");
    cr_assert_eq(r.exit_code, 2);
    tu_run_free(&r);
    free(data);
}

Test(train, save_export_eval_sample_and_resume_conflicts)
{
    char *data = make_tokens("tokens", 170);
    char *ckpt = tu_path(tmp, "ckpt"), *weights = tu_path(tmp, "w.safetensors"), *metrics = tu_path(tmp, "m.jsonl");
    tu_run r = tu_bigbatch("train", "--data", data, "--layers", "2", "--d-model", "16", "--heads", "2",
                           "--global-batch", "32", "--micro-batch", "8", "--devices", "cpu:2", "--steps", "3",
                           "--save", ckpt, "--metrics", metrics, "--val-data", data, "--log-every", "1");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "step 3/3"), "%s", r.err);
    cr_assert_not_null(strstr(r.err, "val loss"), "%s", r.err);
    tu_run_free(&r);
    /* metrics: one JSON object per step with every key; eval on the last */
    char *m = (char *)tu_read_file(metrics, NULL);
    static const char *const keys[] = {"\"step\": 3", "\"loss\"", "\"lr\"", "\"grad_norm\"", "\"samples_per_s\"",
                                       "\"tokens_per_s\"", "\"data_wait_pct\"", "\"overlap_pct\"", "\"fwd_ms\"",
                                       "\"bwd_ms\"", "\"reduce_ms\"", "\"opt_ms\"", "\"peak_mem_bytes\": [",
                                       "\"val_loss\""};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) cr_assert_not_null(strstr(m, keys[i]), "metrics lack %s", keys[i]);
    int lines = 0;
    for (char *p = m; *p; p++) lines += *p == '\n';
    cr_assert_eq(lines, 3);
    free(m);
    /* export, then the same loss from the checkpoint and from the file */
    r = tu_bigbatch("export", "--ckpt", ckpt, "--out", weights);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    tu_run a = tu_bigbatch("eval", "--ckpt", ckpt, "--data", data, "--json");
    tu_run b = tu_bigbatch("eval", "--init-from", weights, "--data", data, "--layers", "2", "--d-model", "16",
                           "--heads", "2", "--json");
    cr_assert_eq(a.exit_code, 0, "%s", a.err);
    cr_assert_eq(b.exit_code, 0, "%s", b.err);
    cr_assert_str_eq(a.out, b.out);
    cr_assert_not_null(strstr(a.out, "\"records\": 170"), "%s", a.out);
    tu_run_free(&a), tu_run_free(&b);
    /* a checkpoint with another shape or global batch is a clear error */
    r = tu_bigbatch("train", "--data", data, "--layers", "3", "--d-model", "16", "--heads", "2", "--global-batch",
                    "32", "--micro-batch", "8", "--steps", "4", "--resume", ckpt);
    tu_assert_error(&r, "--resume", "3 layers", "2 layers");
    tu_run_free(&r);
    r = tu_bigbatch("train", "--data", data, "--layers", "2", "--d-model", "16", "--heads", "2", "--global-batch",
                    "16", "--micro-batch", "8", "--steps", "4", "--resume", ckpt);
    tu_assert_error(&r, "--global-batch 32, not 16");
    tu_run_free(&r);
    free(ckpt), free(weights), free(metrics), free(data);
}

Test(train, mlp_learns_and_eval_reports_accuracy)
{
    char *data = make_images("images", 1024, 3), *val = make_images("val", 200, 4);
    bb_train_options o = mlp_options(data, 2, 16, 64);
    o.val_data = val;
    o.steps = 30;
    bb_train_result r = train(&o);
    cr_log_info("mlp: loss %.3f -> %.3f, val accuracy %.3f", r.losses[0], r.losses[29], r.val_accuracy);
    cr_assert_gt(r.val_accuracy, 0.9, "the quadrant task should be learned: %.3f", r.val_accuracy);
    bb_train_result_free(&r);
    free(data), free(val);
}

Test(train, interrupt_finishes_the_step_saves_and_exits_130)
{
    char *data = make_tokens("tokens", 170);
    char *ckpt = tu_path(tmp, "ckpt"), *latest = tu_path(ckpt, "latest");
    pid_t pid;
    char *argv[] = {(char *)tu_bigbatch_bin(), "train", "--data", data, "--layers", "2", "--d-model", "16", "--heads",
                    "2", "--global-batch", "32", "--micro-batch", "8", "--steps", "100000", "--save", ckpt,
                    "--save-every", "2", "--quiet", NULL};
    cr_assert_eq(spawn_quiet(&pid, argv), 0);
    while (!tu_exists(latest)) usleep(5000);
    kill(pid, SIGINT);
    int status;
    waitpid(pid, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 130, "exit status %d", status);
    bb_checkpoint_info info;
    cr_assert_eq(bb_checkpoint_read_info(ckpt, &info), BB_OK, "%s", bb_error_message());
    cr_assert_gt(info.step, 0);
    cr_assert_eq(info.model.layers, 2);
    free(ckpt), free(latest), free(data);
}

Test(train, bad_paths_and_data_fail_before_training)
{
    char *tokens = make_tokens("tokens", 170), *images = make_images("images", 100, 5);
    char *bad_save = tu_path(tmp, "file/ckpt"), *file = tu_path(tmp, "file");
    tu_write_file(file, "x", 1); /* a file where a directory is needed */
    tu_run r = tu_bigbatch("train", "--data", tokens, "--layers", "1", "--d-model", "16", "--heads", "2",
                           "--global-batch", "32", "--micro-batch", "8", "--steps", "2", "--val-data", images);
    tu_assert_error(&r, "--val-data", "image_u8", "tokens_u16");
    cr_assert_null(strstr(r.err, "step 1"), "trained before failing: %s", r.err);
    tu_run_free(&r);
    r = tu_bigbatch("train", "--data", tokens, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch",
                    "32", "--micro-batch", "8", "--steps", "2", "--save", bad_save);
    tu_assert_error(&r, "--save", "cannot create");
    tu_run_free(&r);
    r = tu_bigbatch("train", "--data", tokens, "--devices", "cudaXYZ", "--steps", "2");
    tu_assert_error(&r, "--devices", "cudaXYZ");
    cr_assert_eq(r.exit_code, 2);
    tu_run_free(&r);
    free(bad_save), free(file), free(tokens), free(images);
}

Test(train, resume_keeps_metrics_in_step_order_and_warns_on_changed_settings)
{
    char *data = make_tokens("tokens", 170);
    char *ckpt = tu_path(tmp, "ckpt"), *metrics = tu_path(tmp, "m.jsonl");
#define TINY "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch", "32", \
             "--micro-batch", "8", "--steps", "4", "--save", ckpt, "--metrics", metrics, "--quiet"
    tu_run r = tu_bigbatch("train", TINY, "--stop-after", "2");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    /* rows a later, lost part of the run wrote after the checkpoint */
    FILE *f = fopen(metrics, "a");
    fprintf(f, "{\"step\": 3, \"loss\": 99}\n");
    fclose(f);
    r = tu_bigbatch("train", TINY, "--resume", ckpt, "--lr", "0.01", "--precision", "bf16");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "--lr differs"), "%s", r.err);
    cr_assert_not_null(strstr(r.err, "used --precision fp32, this one bf16"), "%s", r.err);
    tu_run_free(&r);
    char *m = (char *)tu_read_file(metrics, NULL);
    unsigned long long step, expect = 1;
    for (char *line = strtok(m, "\n"); line; line = strtok(NULL, "\n"), expect++) {
        cr_assert_eq(sscanf(line, "{\"step\": %llu", &step), 1, "%s", line);
        cr_assert_eq(step, expect, "metrics rows out of order: %s", line);
        cr_assert_null(strstr(line, "\"loss\": 99"), "a stale row survived: %s", line);
    }
    cr_assert_eq(expect, 5, "expected rows for steps 1..4");
    free(m);
    /* the same step saved again by another run (--force: see
     * a_new_run_refuses_another_runs_checkpoints) replaces what `latest` shows */
    r = tu_bigbatch("train", TINY, "--stop-after", "2", "--lr", "0.02", "--force");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    r = tu_bigbatch("train", TINY, "--stop-after", "2", "--lr", "0.03", "--force");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    bb_checkpoint_info info;
    cr_assert_eq(bb_checkpoint_read_info(ckpt, &info), BB_OK, "%s", bb_error_message());
    cr_assert_eq(info.step, 2);
    cr_assert_float_eq(info.opt.lr, 0.03, 1e-12, "latest shows lr %g, not the last run's", info.opt.lr);
    r = tu_bigbatch("train", TINY, "--resume", ckpt, "--stop-after", "2", "--lr", "0.03");
    tu_assert_error(&r, "--stop-after 2", "already at step 2");
    tu_run_free(&r);
#undef TINY
    free(ckpt), free(metrics), free(data);
}

/* ---- device faults ------------------------------------------------------- */
/* A fault in the last step's optimizer (on a GPU it would surface only at
 * the next synchronizing call, after the run "ended") fails the run: no
 * weights are returned, and no checkpoint of that step is written; the
 * step before it stays the latest. BB_FAULT injects it (backend.h). */
Test(train, a_device_fault_in_the_last_step_fails_the_run)
{
    char *data = make_tokens("tokens", 100);
    char *ckpt = tu_path(tmp, "ckpt");
    for (int devices = 1; devices <= 2; devices++) {
        bb_train_options o = gpt_options(data, devices, 4, 16);
        o.steps = 3;
        o.save_dir = ckpt;
        o.save_every = 1;
        setenv("BB_FAULT", "sum_squares:3", 1); /* every replica's third optimizer step: the last */
        bb_train_result r;
        bb_status rc = bb_train_run(&o, &r);
        unsetenv("BB_FAULT");
        cr_assert_eq(rc, BB_ERR_DEVICE, "%d device(s): the run should fail, not return %d", devices, rc);
        cr_assert(strstr(bb_error_message(), "sum_squares failed: injected fault"), "%s", bb_error_message());
        cr_assert_null(r.params, "no weights from a failed device");
        cr_assert_eq(r.steps_done, 2, "step 3 is not done");
        bb_checkpoint_info info;
        cr_assert_eq(bb_checkpoint_read_info(ckpt, &info), BB_OK, "%s", bb_error_message());
        cr_assert_eq(info.step, 2, "the latest checkpoint is the last good step, not %llu",
                     (unsigned long long)info.step);
        bb_train_result_free(&r);
        tu_rm_tree(ckpt);
    }
    free(ckpt);
    free(data);
}

/* ---- never lose a user's work (issue 14) ------------------------------------ */
/* Step directories in `dir`, in name order, as "step-00000004 step-00000005". */
static char *step_dirs(const char *dir)
{
    char cmd[4200], *out = calloc(1, 4096);
    snprintf(cmd, sizeof cmd, "ls '%s' 2>/dev/null | grep '^step-' | tr '\\n' ' '", dir);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, 4095, p);
    pclose(p);
    while (n > 0 && out[n - 1] == ' ') out[--n] = 0;
    return out;
}

Test(train, a_new_run_refuses_another_runs_checkpoints)
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

Test(train, save_keeps_the_newest_keep_checkpoints)
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
Test(train, a_failed_save_leaves_nothing_behind_and_is_the_error_reported)
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

Test(train, a_run_that_fails_before_step_1_leaves_no_save_directory_or_trace)
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
Test(train, a_damaged_checkpoint_is_refused_by_every_command)
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

Test(train, a_non_finite_step_stops_the_run_and_nothing_of_it_is_saved)
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

Test(train, on_nonfinite_skip_passes_over_such_steps_and_counts_them)
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
    o.steps = 30, o.opt.kind = BB_OPT_SGD, o.opt.lr = 1000, o.opt.grad_clip = 0, o.skip_nonfinite = true;
    bb_train_result res = train(&o);
    cr_assert_gt(res.skipped_steps, 0);
    for (size_t i = 0; i < res.param_count; i++) cr_assert(isfinite(res.params[i]), "weight %zu is %f", i, res.params[i]);
    bb_train_result_free(&res);
    free(ckpt), free(metrics), free(data);
}
#undef DIVERGING

Test(train, optimizer_settings_that_cannot_work_are_refused)
{
    char *data = make_tokens("tokens", 170);
    tu_run r = tu_bigbatch("train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2",
                           "--global-batch", "32", "--micro-batch", "8", "--steps", "2", "--beta2", "1");
    tu_assert_error(&r, "--beta2 1", "[0, 1)");
    tu_run_free(&r);
    free(data);
}

/* ---- Ctrl-C (issue 14, items 5 and 6) ------------------------------------- */
/* Starts argv, its stdout and stderr into files; returns the pid. */
static pid_t start_logged(char *const argv[], const char *out_path, const char *err_path)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid;
    cr_assert_eq(posix_spawn(&pid, argv[0], &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    return pid;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The exit code of pid within `seconds` (128 + signal when killed), or -1
 * after killing it when it has not exited by then. */
static int exit_within(pid_t pid, double seconds)
{
    double end = now_s() + seconds;
    int status;
    while (now_s() < end) {
        if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

static bool running(pid_t pid)
{
    int status;
    return waitpid(pid, &status, WNOHANG) == 0;
}

/* Runs argv, sends one SIGINT after `after` seconds, and asserts that it
 * exits with 130 within 5 s of it. */
static void ctrl_c_exits_130(const char *what, char *const argv[], double after)
{
    char *out = tu_path(tmp, "out"), *err = tu_path(tmp, "err");
    pid_t pid = start_logged(argv, out, err);
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

Test(train, ctrl_c_ends_eval_sample_bench_and_train_promptly_with_130)
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
Test(train, a_second_ctrl_c_stops_at_once)
{
    char *out = tu_path(tmp, "out"), *err = tu_path(tmp, "err");
    char *argv[] = {(char *)tu_bigbatch_bin(), "train", "--data", "data/kjv", "--global-batch", "256", "--micro-batch",
                    "128", "--steps", "1000", "--quiet", NULL}; /* steps of a few seconds on 2 cores */
    for (int attempt = 0;; attempt++) {
        pid_t pid = start_logged(argv, out, err);
        usleep(1500000);
        kill(pid, SIGINT);
        usleep(100000);
        if (!running(pid)) { /* the first Ctrl-C met the end of a step: try again */
            exit_within(pid, 1);
            cr_assert_lt(attempt, 3, "every first Ctrl-C ended the run within 0.1 s: no step was long enough");
            continue;
        }
        double t0 = now_s();
        kill(pid, SIGINT);
        int code = exit_within(pid, 1);
        char *e = (char *)tu_read_file(err, NULL);
        cr_assert_eq(code, 130, "exit %d within 1 s of the second Ctrl-C; stderr: %s", code, e);
        cr_assert_not_null(strstr(e, "interrupted again"), "%s", e);
        cr_log_info("exit 130 %.3f s after the second Ctrl-C", now_s() - t0);
        free(e);
        break;
    }
    free(out), free(err);
}

/* On a terminal, evaluation shows how far it is (in place); a save says
 * where it went. */
Test(train, progress_for_evaluation_and_saves)
{
    if (system("command -v script > /dev/null 2>&1") != 0) cr_skip_test("skipped: no script(1) for a terminal");
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
/* The "loss" of each line of a metrics file, as text, one per line. */
static char *metric_losses(const char *path, unsigned long long from_step)
{
    char *m = (char *)tu_read_file(path, NULL), *out = calloc(1, strlen(m) + 1);
    for (char *line = strtok(m, "\n"); line; line = strtok(NULL, "\n")) {
        unsigned long long step;
        char *loss = strstr(line, "\"loss\": ");
        if (sscanf(line, "{\"step\": %llu", &step) == 1 && step >= from_step && loss)
            strncat(out, loss, (size_t)(strchr(loss, ',') - loss + 1));
    }
    free(m);
    return out;
}

Test(train, resume_with_no_other_flags_continues_the_run)
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

Test(train, resume_takes_the_directory_its_latest_or_a_step_directory)
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
        r = tu_bigbatch("train", "--resume", from[i], "--stop-after", "6", "--log-every", "0");
        cr_assert_eq(r.exit_code, 0, "--resume %s: %s", from[i], r.err);
        cr_assert_not_null(strstr(r.err, expect[i]), "--resume %s: %s", from[i], r.err);
        tu_run_free(&r);
    }
    free(step4), free(latest), free(ckpt), free(data);
}

/* ---- one interface (issue 14, items 9 and 10) ------------------------------ */
Test(train, devices_mean_the_same_in_plan_train_and_bench)
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

Test(train, train_takes_the_loader_options)
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

Test(train, numbers_read_and_printed_as_a_user_means_them)
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
Test(train, messages_point_the_right_way)
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

/* ---- --help and flags that mean nothing (issue 14, item 12) ----------------- */
Test(train, help_and_flags_say_what_they_mean)
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
