/* test_util.h — helpers shared by the Criterion suites: temporary
 * directories, files, running the bigbatch CLI and capturing its output. */
#ifndef BIGBATCH_TEST_UTIL_H
#define BIGBATCH_TEST_UTIL_H

#include <criterion/criterion.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bigbatch/shard.h"

extern char **environ;

/* A fresh directory under $TMPDIR (or /tmp); removed by tu_rm_tree. */
static inline char *tu_temp_dir(void)
{
    const char *base = getenv("TMPDIR");
    char *path = malloc(4096);
    snprintf(path, 4096, "%s/bigbatch-test-XXXXXX", base && *base ? base : "/tmp");
    cr_assert_not_null(mkdtemp(path), "mkdtemp failed");
    return path;
}

static inline void tu_rm_tree(const char *path)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    cr_assert_eq(system(cmd), 0);
}

static inline char *tu_path(const char *dir, const char *name)
{
    char *p = malloc(4096);
    snprintf(p, 4096, "%s/%s", dir, name);
    return p;
}

static inline void tu_write_file(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    cr_assert_eq(fwrite(data, 1, size, f), size);
    cr_assert_eq(fclose(f), 0);
}

/* Whole file in a malloc'ed buffer (NUL-terminated); *size gets its length. */
static inline uint8_t *tu_read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = 0;
    fclose(f);
    if (size) *size = (size_t)n;
    return buf;
}

/* Writes `count` records as a dataset in the new directory `dir`
 * (small frames, one shard). */
static inline void tu_write_dataset(const char *dir, const bb_shard_meta *meta, const void *records, uint64_t count)
{
    cr_assert_eq(mkdir(dir, 0755), 0, "cannot create %s", dir);
    bb_writer_options o = {.level = 1, .frame_bytes = 64 * meta->record_size, .shard_bytes = 1 << 20, .threads = 1};
    bb_dataset_writer_t *w;
    cr_assert_eq(bb_dataset_writer_create(dir, meta, &o, &w), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_dataset_writer_add(w, records, count), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_dataset_writer_finish(w, NULL), BB_OK, "%s", bb_error_message());
    bb_dataset_writer_destroy(w);
}

static inline bool tu_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* XORs `mask` into the byte at `offset` of the file. */
static inline void tu_flip_byte(const char *path, long offset, uint8_t mask)
{
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    fseek(f, offset, SEEK_SET);
    int c = fgetc(f);
    cr_assert_neq(c, EOF);
    fseek(f, offset, SEEK_SET);
    fputc(c ^ mask, f);
    fclose(f);
}

static inline void tu_truncate(const char *path, long size) { cr_assert_eq(truncate(path, size), 0); }

/* Deterministic pseudo-random bytes (xorshift), so failures reproduce. */
static inline void tu_fill_random(void *dst, size_t size, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    uint8_t *p = dst;
    for (size_t i = 0; i < size; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (uint8_t)(x >> 24);
    }
}

typedef struct tu_run {
    int exit_code;
    char *out, *err; /* captured stdout and stderr, NUL-terminated */
} tu_run;

static inline const char *tu_bigbatch_bin(void)
{
    const char *bin = getenv("BIGBATCH_BIN");
    if (!bin || !*bin) bin = "bin/bigbatch";
    cr_assert(access(bin, X_OK) == 0, "bigbatch binary %s not found; run the tests with `make test`", bin);
    return bin;
}

/* Runs argv (argv[0] is the program; NULL-terminated) and captures its output. */
static inline tu_run tu_run_argv(char *const argv[])
{
    char *dir = tu_temp_dir();
    char *out_path = tu_path(dir, "stdout"), *err_path = tu_path(dir, "stderr");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid;
    cr_assert_eq(posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ), 0, "cannot run %s", argv[0]);
    posix_spawn_file_actions_destroy(&fa);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    tu_run r = {.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)};
    r.out = (char *)tu_read_file(out_path, NULL);
    r.err = (char *)tu_read_file(err_path, NULL);
    tu_rm_tree(dir);
    free(out_path), free(err_path), free(dir);
    return r;
}

/* Runs `bigbatch ARGS...`; the list ends with NULL. */
#define tu_bigbatch(...) tu_run_argv((char *const[]){(char *)tu_bigbatch_bin(), __VA_ARGS__, NULL})

static inline void tu_run_free(tu_run *r)
{
    free(r->out);
    free(r->err);
}

/* Asserts the run failed with exactly one line on stderr that contains every
 * string of the NULL-terminated list. */
static inline void tu_assert_one_line_error(const tu_run *r, const char *const *needles)
{
    cr_assert_neq(r->exit_code, 0, "expected failure; stderr: %s", r->err);
    size_t len = strlen(r->err);
    cr_assert(len > 0 && r->err[len - 1] == '\n', "stderr should end with a newline: '%s'", r->err);
    cr_assert_null(memchr(r->err, '\n', len - 1), "stderr should be one line: '%s'", r->err);
    cr_assert(strncmp(r->err, "bigbatch: error: ", 17) == 0, "stderr: '%s'", r->err);
    for (const char *const *n = needles; *n; n++)
        cr_assert_not_null(strstr(r->err, *n), "stderr '%s' should mention '%s'", r->err, *n);
}
#define tu_assert_error(r, ...) tu_assert_one_line_error((r), (const char *const[]){__VA_ARGS__, NULL})

/* Seconds on the monotonic clock. */
static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The calling thread's id (for tu_wait_blocked). */
static inline pid_t tu_thread_id(void) { return (pid_t)syscall(SYS_gettid); }

/* Waits up to `seconds` until thread `tid` of this process sleeps in the
 * kernel (state S in /proc/self/task/TID/stat: blocked in a futex or a
 * condition wait, not spinning nor running): the readiness signal of a test
 * that must wake a blocked thread. False when it never slept. */
static inline bool tu_wait_blocked(pid_t tid, double seconds)
{
    char path[64], text[512];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
    for (double t0 = now_s(); now_s() - t0 <= seconds; nanosleep(&(struct timespec){0, 200000}, NULL)) {
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
        if (f) fclose(f);
        text[n] = 0;
        const char *paren = strrchr(text, ')'); /* the name may hold spaces */
        if (paren && paren[1] == ' ' && paren[2] == 'S') return true;
    }
    return false;
}

#endif
