/* core.h — status codes, error messages, check macros, logging, clocks and
 * command-line helpers shared by every bigbatch module.
 *
 * How to use:
 *   bb_status open_thing(const char *path) {
 *       int fd = open(path, O_RDONLY);
 *       if (fd < 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot open", path);
 *       BB_TRY(parse_thing(fd));          // propagate, keeping the message
 *       ...
 *   }
 *   if (open_thing(p) != BB_OK) fprintf(stderr, "%s\n", bb_error_message());
 *
 * Errors are return values: 0 is success. The function that detects a
 * failure describes it once with bb_fail(); callers propagate the status with
 * BB_TRY/BB_TRY_GOTO, which record file:line at debug log level. The message
 * lives in thread-local storage until the next bb_fail() on that thread.
 * Library code never exits; only main() decides.
 */
#ifndef BIGBATCH_CORE_H
#define BIGBATCH_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define BB_VERSION "0.1.0"
/* The git commit this binary was built from ("1a2b3c4d5e6f", "+" appended
 * when the tree had changes; "unknown" outside a git checkout). */
const char *bb_commit(void);

typedef enum bb_status {
    BB_OK = 0,
    BB_ERR_ARG,         /* invalid argument, option or usage */
    BB_ERR_IO,          /* open/read/write failed (errno in the message) */
    BB_ERR_CORRUPT,     /* data fails an integrity check: checksum, sizes */
    BB_ERR_FORMAT,      /* input is not in the expected format: magic, version */
    BB_ERR_NOMEM,       /* host allocation failed */
    BB_ERR_OOM,         /* device allocation over the cap or out of memory */
    BB_ERR_UNSUPPORTED, /* valid request this build or machine cannot do */
    BB_ERR_INTERRUPTED, /* stopped by a signal (Ctrl-C) */
    BB_ERR_CLOSED,      /* the other side of a queue or pipeline shut down */
    BB_ERR_DEVICE,      /* CUDA, cuBLAS or NCCL reported an error */
    BB_ERR_NONFINITE,   /* a loss or gradient became NaN or infinite */
    BB_ERR_INTERNAL,    /* a bug: an invariant of bigbatch itself broke */
    BB_STATUS_COUNT
} bb_status;

/* Short human name of a status ("corrupt data"); never NULL. */
const char *bb_status_name(bb_status status);

/* Records `status` with a printf-style message for the calling thread and
 * returns `status`, so that `return bb_fail(...)` reads naturally. */
bb_status bb_error_set_at(bb_status status, const char *file, int line,
                          const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Same, with ": <strerror(errno)>" appended (errno read before anything else). */
bb_status bb_error_set_errno_at(bb_status status, const char *file, int line,
                                const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define bb_fail(status, ...) bb_error_set_at((status), __FILE__, __LINE__, __VA_ARGS__)
#define bb_fail_errno(status, ...) \
    bb_error_set_errno_at((status), __FILE__, __LINE__, __VA_ARGS__)

/* The calling thread's last error message; the status name when a status was
 * returned without a message; "" when no error was recorded. */
const char *bb_error_message(void);
/* "file.c:123" of the bb_fail() that set the message, "" when none. */
const char *bb_error_origin(void);
/* Forgets the calling thread's error. */
void bb_error_clear(void);
/* Used by the check macros: logs "<file>:<line>: <expr> failed" at debug level
 * and makes sure a message exists for `status`. Returns `status`. */
bb_status bb_error_trace(bb_status status, const char *file, int line, const char *expr);

#define BB_TRY(expr)                                                   \
    do {                                                               \
        bb_status bb_try_status_ = (expr);                             \
        if (bb_try_status_ != BB_OK)                                   \
            return bb_error_trace(bb_try_status_, __FILE__, __LINE__, #expr); \
    } while (0)

#define BB_TRY_GOTO(expr, rc, label)                                   \
    do {                                                               \
        (rc) = (expr);                                                 \
        if ((rc) != BB_OK) {                                           \
            bb_error_trace((rc), __FILE__, __LINE__, #expr);           \
            goto label;                                                \
        }                                                              \
    } while (0)

/* pthread_* functions return an errno value instead of setting errno. */
#define BB_PTHREAD(expr)                                               \
    do {                                                               \
        int bb_pthread_err_ = (expr);                                  \
        if (bb_pthread_err_ != 0)                                      \
            return bb_fail(BB_ERR_INTERNAL, "%s: error %d", #expr, bb_pthread_err_); \
    } while (0)

/* ---- logging ----------------------------------------------------------
 * BB_LOG=error|warn|info|debug selects what reaches stderr (default warn).
 * Lines look like "bigbatch: warn: message". */
typedef enum bb_log_level {
    BB_LOG_ERROR = 0,
    BB_LOG_WARN,
    BB_LOG_INFO,
    BB_LOG_DEBUG,
} bb_log_level;

bb_log_level bb_log_threshold(void);
void bb_log_set_threshold(bb_log_level level);
/* Names the process in every line ("rank 1" gives "bigbatch: rank 1: warn:
 * ..."); call before starting threads. "" (the default): no name. */
void bb_log_set_prefix(const char *prefix);
const char *bb_log_prefix(void);
void bb_log(bb_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define BB_WARN(...) bb_log(BB_LOG_WARN, __VA_ARGS__)
#define BB_INFO(...) bb_log(BB_LOG_INFO, __VA_ARGS__)
#define BB_DEBUG(...) \
    do { if (bb_log_threshold() >= BB_LOG_DEBUG) bb_log(BB_LOG_DEBUG, __VA_ARGS__); } while (0)

/* ---- clocks ----------------------------------------------------------- */
/* Monotonic time (CLOCK_MONOTONIC) in nanoseconds and in seconds. */
uint64_t bb_clock_ns(void);
double bb_clock_seconds(void);

/* ---- small helpers ---------------------------------------------------- */
/* Formats `bytes` as "7.6 MiB" into buf (at least 16 bytes); returns buf. */
const char *bb_format_bytes(uint64_t bytes, char *buf, size_t cap);
/* Appends item i of n to the list in buf (cap bytes, truncated at that):
 * "a|b|c" where detail is NULL, "a (x), b (y) or c (z)" with details —
 * how --help and messages list the choices of a table. Never fails. */
void bb_list_add(char *buf, size_t cap, int i, int n, const char *name, const char *detail);
/* Number of online CPUs, at least 1. */
int bb_cpu_count(void);
/* The host memory the kernel could give now without swapping
 * (/proc/meminfo's MemAvailable; else the free pages); UINT64_MAX when
 * neither can be read. Never fails. */
uint64_t bb_host_available_bytes(void);
/* splitmix64: advances *state and returns the next of its 64-bit outputs.
 * Every deterministic stream in bigbatch (epoch order, initialisation)
 * comes from it, so the same seed gives the same run everywhere. */
uint64_t bb_splitmix64(uint64_t *state);
/* Flushes the directory holding `path` to disk, so that a rename into it
 * survives a crash. Fails with BB_ERR_IO. */
bb_status bb_fsync_dir_of(const char *path);
/* Copies file `from` to `to` (created or truncated, synced). Fails with
 * BB_ERR_IO naming the file; a partial `to` is removed. */
bb_status bb_copy_file(const char *from, const char *to);
/* Creates the missing parents of `path` (mkdir -p of its dirname, mode
 * 0755); *created (may be NULL) gets the length of the shallowest one it
 * created, 0 for none, also on failure, so that a caller can remove them.
 * Fails with BB_ERR_IO naming the directory it could not create. */
bb_status bb_make_parents(const char *path, size_t *created);
/* Temporaries being written, for a second signal (which ends the process
 * at once) to remove before it exits:
 *
 *   int t = bb_temp_track(tmp);      // after creating tmp (a file, or a flat directory)
 *   ... write tmp, rename it into place or remove it ...
 *   bb_temp_untrack(t);
 *
 * bb_temp_track returns the slot to untrack, -1 when the path is too long
 * or all BB_TEMP_SLOTS are taken (it is then left for the next run's
 * clean-up). bb_temp_path names slot's path (NULL when free); bb_temp_remove
 * (async-signal-safe: for a signal handler) removes it, a directory with its
 * entries, and says whether it was there. Never fail. Any thread may track
 * and untrack. */
#define BB_TEMP_SLOTS 32
int bb_temp_track(const char *path);
void bb_temp_untrack(int slot);
const char *bb_temp_path(int slot);
bool bb_temp_remove(int slot);
/* `path` (which need not exist yet) is directory `dir` or lies inside it,
 * through symbolic links; false when `dir` is not a directory. Never fails. */
bool bb_path_inside(const char *path, const char *dir);
/* Checks `path` before a command writes it (through a temporary file
 * renamed into place): it must be absent or a regular file, none of the
 * `n` inputs (the same device and inode) and inside none of those that are
 * directories (a dataset, a checkpoint, a model directory; through links). A symbolic link to a regular
 * file is followed: `resolved` (cap bytes) gets the path to write, the link's
 * target, so that the link stays. Fails with BB_ERR_IO, one line naming
 * `what` (e.g. "--out") and the path, when the target is a device, a FIFO, a
 * directory or a socket, or is an input; nothing is changed. */
bb_status bb_check_output(const char *what, const char *path, const char *const *inputs, int n, char *resolved,
                          size_t cap);

/* ---- record formats -----------------------------------------------------
 * What one record of a dataset holds: the data module reads it from the
 * shards (bb_dataset_format), and a model kind says from it what it can
 * train on and checks its batches against it. */
typedef enum bb_record_kind {
    BB_RECORD_IMAGE_U8 = 1,   /* label u8, then prod(shape) pixels u8 */
    BB_RECORD_TOKENS_U16 = 2, /* shape[0] tokens, u16 little-endian */
    BB_RECORD_TOKENS_U32 = 3, /* shape[0] tokens, u32 little-endian */
} bb_record_kind;
#define BB_RECORD_MAX_RANK 4

typedef struct bb_record_format {
    uint32_t kind;             /* bb_record_kind */
    uint32_t rank;             /* dimensions used in shape, 1..4 */
    uint32_t shape[BB_RECORD_MAX_RANK];
    uint32_t record_size;      /* bytes per record */
    uint32_t classes_or_vocab; /* class count (images) or vocabulary size (tokens) */
} bb_record_format;

/* "image_u8", "tokens_u16", "tokens_u32"; "unknown" for another value. */
const char *bb_record_kind_name(uint32_t kind);
/* Bytes per token of a token kind; 0 for the others. */
int bb_record_token_bytes(uint32_t kind);
/* The shape as "257" or "28x28", into buf (cap bytes); returns buf. */
const char *bb_record_shape(const bb_record_format *f, char *buf, size_t cap);

/* ---- command-line parsing ---------------------------------------------
 * A command describes its options in a table ending with {0}; bb_cli_parse()
 * fills the destinations and bb_cli_help() prints --help from the same table,
 * with each option's default taken from its destination's initial value.
 *
 *   int level = 3; const char *out = NULL; bb_str_list in = {0}; bb_io_mode io = BB_IO_AUTO;
 *   const bb_opt opts[] = {
 *       {"--level", BB_OPT_I32, &level, "L", "zstd level", .min = 1, .max = 19},
 *       {"--io", BB_OPT_ENUM, &io, "MODE", "how to read", .choices = "auto|uring|pread"}, // bb_io_mode's order
 *       {"--in", BB_OPT_LIST, &in, "FILE...", "input files"},
 *       {"--out", BB_OPT_STRING, &out, "DIR", "output directory", .required = true},
 *       {0}};
 *   BB_TRY(bb_cli_parse("pack", opts, argc, argv, &positional));
 */
typedef enum bb_opt_kind {
    BB_OPT_FLAG,   /* bool*; no value */
    BB_OPT_INT,    /* int64_t*; range [min, max] when min < max */
    BB_OPT_DOUBLE, /* double*; range [min, max] when min < max */
    BB_OPT_STRING, /* const char **; points into argv */
    BB_OPT_LIST,   /* bb_str_list*; takes values up to the next argument starting with '-' */
    BB_OPT_BYTES,  /* uint64_t*; accepts 1048576, 64K, 256MiB, 1.5G */
    BB_OPT_CHOICE, /* const char **; value must be one of `choices` ("a|b|c") */
    BB_OPT_I32,    /* int*; range as BB_OPT_INT */
    BB_OPT_U32,    /* uint32_t*; range as BB_OPT_INT */
    BB_OPT_U64,    /* uint64_t*; range as BB_OPT_INT (up to 2^63) */
    BB_OPT_ENUM,   /* int* (or an enum's): the index of the value in `choices`, so "a|b|c" lists
                      an enum's names in its order; the default printed is the name it holds */
} bb_opt_kind;

typedef struct bb_str_list {
    const char **items; /* pointers into argv; the array is heap-owned */
    int count;
} bb_str_list;

typedef struct bb_opt {
    const char *name;    /* "--level" */
    bb_opt_kind kind;
    void *dest;
    const char *metavar; /* "L", "DIR", "FILE..." */
    const char *help;    /* one sentence */
    double min, max;     /* inclusive numeric range, used when min < max */
    const char *choices; /* BB_OPT_CHOICE: "fmnist|text|llmc" */
    bool required;
    bool *given;         /* optional: set to true when the option appears */
} bb_opt;

/* Parses argv[0..argc) (the arguments after the command name). Non-option
 * arguments go to `positional` (may be NULL when none are allowed); after a
 * bare "--" every argument is positional. "-h" or "--help" anywhere returns
 * BB_ERR_ARG and makes bb_cli_help_requested() true. Fails with BB_ERR_ARG and a
 * one-line message naming the option on unknown options, missing or malformed
 * values, values out of range and missing required options. */
bb_status bb_cli_parse(const char *command, const bb_opt *opts, int argc, char **argv,
                       bb_str_list *positional);
/* Prints usage, summary and the option table with defaults to `out`. */
void bb_cli_help(FILE *out, const char *usage, const char *summary, const bb_opt *opts);
/* True when the last bb_cli_parse() failure was a request for --help. */
bool bb_cli_help_requested(void);
/* Frees the arrays owned by BB_OPT_LIST destinations and `positional`. */
void bb_cli_free(const bb_opt *opts, bb_str_list *positional);

/* Parsers used by bb_cli_parse, exposed for other callers. They fail with
 * BB_ERR_ARG and a message naming `what` (e.g. "--level"). */
bb_status bb_parse_int(const char *what, const char *s, int64_t *out);
bb_status bb_parse_double(const char *what, const char *s, double *out);
bb_status bb_parse_bytes(const char *what, const char *s, uint64_t *out);

#endif /* BIGBATCH_CORE_H */
