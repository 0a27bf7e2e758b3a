/* train_fixture.h — what the trainer's suites (test_train.c, test_safety.c)
 * share: tiny datasets in a per-test temporary directory, option presets,
 * and helpers to run the CLI as a child process and read what it left. */
#ifndef BIGBATCH_TRAIN_FIXTURE_H
#define BIGBATCH_TRAIN_FIXTURE_H

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
static inline char *write_dataset(const char *name, bb_shard_meta *meta, uint8_t *records, uint64_t count)
{
    snprintf(meta->source, sizeof meta->source, "test %s", name);
    char *dir = tu_path(tmp, name);
    tu_write_dataset(dir, meta, records, count);
    free(records);
    return dir;
}

/* Images whose class is the brightest quadrant: learnable, deterministic. */
static inline char *make_images(const char *name, uint64_t count, uint64_t seed)
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
static inline char *make_tokens(const char *name, uint64_t count)
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

static inline void fixture_setup(void) { tmp = tu_temp_dir(); }
static inline void fixture_teardown(void)
{
    if (tmp) tu_rm_tree(tmp);
    free(tmp);
    tmp = NULL;
}

/* cr_skip_test for the suites of this fixture: Criterion runs no .fini
 * after a skip, so the temporary directory goes first. */
#define fixture_skip(...)                                                                                              \
    do {                                                                                                               \
        fixture_teardown();                                                                                            \
        cr_skip_test(__VA_ARGS__);                                                                                     \
    } while (0)

static inline bb_train_options mlp_options(const char *data, int devices, int micro_batch, int global_batch)
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

static inline bb_train_options gpt_options(const char *data, int devices, int micro_batch, int global_batch)
{
    bb_train_options o = mlp_options(data, devices, micro_batch, global_batch);
    o.model = bb_model_gpt_config(2, 2, 16, 0, 0);
    o.opt.lr = 3e-3;
    return o;
}

/* Grouped-query attention (4 heads over 2 key/value heads), untied. */
static inline bb_train_options llama_options(const char *data, int devices, int micro_batch, int global_batch)
{
    bb_train_options o = gpt_options(data, devices, micro_batch, global_batch);
    o.model = bb_model_llama_config(2, 4, 16, 0, 0);
    o.model.llama.kv_heads = 2, o.model.llama.ffn = 32;
    return o;
}

static inline bb_train_result train(const bb_train_options *o)
{
    bb_train_result r;
    bb_status rc = bb_train_run(o, &r);
    cr_assert_eq(rc, BB_OK, "%s", bb_error_message());
    return r;
}

static inline double relative_distance(const float *a, const float *b, size_t n)
{
    double diff = 0, norm = 0;
    for (size_t i = 0; i < n; i++) diff += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), norm += (double)a[i] * a[i];
    return sqrt(diff / norm);
}
/* ---- child processes ------------------------------------------------------ */
/* Starts argv, its stdout and stderr into files; returns the pid. */
static inline pid_t start_logged(char *const argv[], const char *out_path, const char *err_path)
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

/* The exit code of pid within `seconds` (128 + signal when killed), or -1
 * after killing it when it has not exited by then. */
static inline int exit_within(pid_t pid, double seconds)
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

/* The union of the signal masks of /proc/PID/status's lines that start
 * with `a` or `b` (b may be NULL): "SigPnd", "ShdPnd", "SigCgt". */
static inline unsigned long long signal_mask(pid_t pid, const char *a, const char *b)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    unsigned long long mask = 0;
    size_t la = strlen(a), lb = b ? strlen(b) : 0;
    while (f && fgets(line, sizeof line, f))
        if ((!strncmp(line, a, la) && line[la] == ':') || (b && !strncmp(line, b, lb) && line[lb] == ':'))
            mask |= strtoull(strchr(line, ':') + 1, NULL, 16);
    if (f) fclose(f);
    return mask;
}

/* Signal `sig` pending for process `pid`: sent, and not yet delivered to a
 * handler. */
static inline bool signal_pending(pid_t pid, int sig) { return signal_mask(pid, "SigPnd", "ShdPnd") >> (sig - 1) & 1; }

/* Sends `sig` to `pid` and waits (up to 10 s) until it is delivered, so that
 * a second one is a second signal and not the same pending one. */
static inline bool kill_delivered(pid_t pid, int sig)
{
    if (kill(pid, sig) != 0) return false;
    for (double t0 = now_s(); now_s() - t0 < 10; usleep(500))
        if (!signal_pending(pid, sig)) return true;
    return false;
}

/* Waits up to `seconds` until process `pid` catches signal `sig` (its
 * handler is installed: SigCgt), so that the signal sent next meets the
 * handler and not the default action (a process may take a while to
 * start: bigbatch re-executes itself when OpenBLAS picks generic kernels).
 * False when it never did. */
static inline bool catches(pid_t pid, int sig, double seconds)
{
    for (double t0 = now_s(); now_s() - t0 < seconds; usleep(2000))
        if (signal_mask(pid, "SigCgt", NULL) >> (sig - 1) & 1) return true;
    return false;
}

static inline bool running(pid_t pid)
{
    int status;
    return waitpid(pid, &status, WNOHANG) == 0;
}

static inline bool has_temp_step_dir(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "ls -a '%s' 2>/dev/null | grep -q '^\\.step-.*\\.tmp-'", dir);
    return system(cmd) == 0;
}

/* Step directories in `dir`, in name order, as "step-00000004 step-00000005". */
static inline char *step_dirs(const char *dir)
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

/* The "loss" of each line of a metrics file, as text, one per line. */
static inline char *metric_losses(const char *path, unsigned long long from_step)
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

/* The numbers under `key` ("loss", "samples_per_s", ...) of a metrics
 * file's step lines, from step `from` on; returns how many (at most cap). */
static inline int metric_values(const char *path, const char *key, int from, double *out, int cap)
{
    char *m = (char *)tu_read_file(path, NULL), needle[64];
    snprintf(needle, sizeof needle, "\"%s\": ", key);
    int n = 0;
    for (char *line = strtok(m, "\n"); line && n < cap; line = strtok(NULL, "\n")) {
        int step;
        char *at = strstr(line, needle);
        if (sscanf(line, "{\"step\": %d", &step) == 1 && step >= from && at)
            out[n++] = strtod(at + strlen(needle), NULL);
    }
    free(m);
    return n;
}

/* The two metrics files' losses from step `from` on agree within 1e-5 (relative). */
static inline void expect_metrics_losses(const char *want_path, const char *got_path, int from, const char *what)
{
    double want[64], got[64];
    int n = metric_values(want_path, "loss", from, want, 64), m = metric_values(got_path, "loss", from, got, 64);
    cr_assert(n > 0 && n == m, "%s: %d losses, the reference %d", what, m, n);
    for (int i = 0; i < n; i++)
        cr_assert(fabs(got[i] - want[i]) <= 1e-5 * fabs(want[i]), "%s: step %d loss %.9g, the reference %.9g", what,
                  from + i, got[i], want[i]);
}

/* The step N of "preempted: saved step N to DIR; continue with: bigbatch
 * train --resume DIR" in stderr, the line asserted whole and once; 0 when
 * absent. */
static inline unsigned long long preempted_step(const char *err, const char *dir)
{
    const char *at = strstr(err, "bigbatch: preempted: saved step ");
    if (!at) return 0;
    unsigned long long step = strtoull(at + 32, NULL, 10);
    char expect[8600];
    snprintf(expect, sizeof expect, "bigbatch: preempted: saved step %llu to %s; continue with: bigbatch train "
             "--resume %s\n", step, dir, dir);
    cr_assert_not_null(strstr(err, expect), "the preemption line should read '%s': %s", expect, err);
    cr_assert_null(strstr(at + 1, "bigbatch: preempted"), "one preemption line: %s", err);
    return step;
}

#endif
