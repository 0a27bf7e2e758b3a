/* main.c — `bigbatch <command>`: dispatch, signals, exit codes. */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "bigbatch/backend.h"
#include "bigbatch/train.h"
#include "bigbatch/world.h"
#include "commands.h"

volatile sig_atomic_t bb_cli_interrupted;

static void say(const char *s)
{
    ssize_t ignored = write(STDERR_FILENO, s, strlen(s));
    (void)ignored;
}

/* The first Ctrl-C, SIGTERM, SIGHUP (a closed terminal or ssh session) or
 * SIGUSR1 asks the command to stop at a safe point (train: after the step,
 * saved); a second one stops at once: what it was writing is never
 * published (checkpoints, shards and reports appear by rename only) and
 * its temporaries are removed first (bb_temp_track), named on the line. */
static void on_signal(int sig)
{
    if (bb_cli_interrupted) {
        say("\nbigbatch: interrupted again: stopping now");
        for (int i = 0; i < BB_TEMP_SLOTS; i++) {
            const char *path = bb_temp_path(i);
            if (path && bb_temp_remove(i)) say(" (removed the unfinished "), say(path), say(")");
        }
        /* Again: the thread still writing may have made one anew meanwhile
         * (a file's writer makes its missing directories). */
        for (int i = 0; i < BB_TEMP_SLOTS; i++) bb_temp_remove(i);
        say("\n");
        _exit(BB_EXIT_INTERRUPTED);
    }
    bb_cli_interrupted = sig == SIGINT ? BB_STOP_INTERRUPT : BB_STOP_PREEMPT;
}

static const struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"train", bb_cmd_train, "train a model: data parallel, accumulation, checkpointing, save/resume"},
    {"plan", bb_cmd_plan, "which micro-batch and checkpointing fit a device's memory for a global batch"},
    {"eval", bb_cmd_eval, "loss (and accuracy) of a checkpoint or safetensors file on a dataset"},
    {"sample", bb_cmd_sample, "generate text from a gpt or llama checkpoint"},
    {"report", bb_cmd_report, "one HTML page of plots from a run's --metrics (and --trace, plan --json)"},
    {"export", bb_cmd_export, "write a checkpoint's weights as one .safetensors file"},
    {"pack", bb_cmd_pack, "turn Fashion-MNIST, text or llm.c token files into .bbs shards"},
    {"tokenizer", bb_cmd_tokenizer, "train a byte-level BPE tokenizer.json on text; encode text with one"},
    {"inspect", bb_cmd_inspect, "describe shards or a dataset; --verify checks every frame"},
    {"bench", bb_cmd_bench, "measure the queue, the loader, a model's steps, host-to-GPU copies (perf/ runs them "
                            "beside their peers)"},
    {"version", bb_cmd_version, "print the version and what this build can run on"},
};

static void print_usage(FILE *out)
{
    fprintf(out, "usage: bigbatch <command> [options]\n\n"
                 "bigbatch trains with batches larger than device memory: gradient accumulation,\n"
                 "activation checkpointing and data parallel over streamed, compressed shards.\n\n"
                 "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n'bigbatch <command> --help' explains a command's options.\n"
                 "BB_LOG=error|warn|info|debug sets how much is logged to stderr (default warn).\n");
}

int bb_cli_report(bb_status status, const char *usage, const char *summary, const bb_opt *opts)
{
    if (status == BB_OK) return BB_EXIT_OK;
    if (bb_cli_help_requested()) {
        bb_cli_help(stdout, usage, summary, opts);
        return BB_EXIT_OK;
    }
    if (status == BB_ERR_INTERRUPTED) { /* asked for, not an error: what was done is said already */
        fprintf(stderr, "bigbatch: %sstopped as asked (%s)\n", bb_log_prefix(), bb_error_message());
        return BB_EXIT_INTERRUPTED;
    }
    fprintf(stderr, "bigbatch: %serror: %s\n", bb_log_prefix(), bb_error_message());
    return status == BB_ERR_ARG ? BB_EXIT_USAGE : BB_EXIT_ERROR;
}

static int run(int argc, char **argv);

/* What a command printed reached its file: a write error on stdout (a full
 * disk, a closed pipe's EPIPE) is the command's failure, one line, exit 1,
 * never a silently truncated output. */
static int finish_stdout(int code)
{
    int flushed = fflush(stdout), saved = errno;
    if (code != BB_EXIT_OK || (flushed == 0 && !ferror(stdout))) return code; /* a failure has said its line */
    fprintf(stderr, "bigbatch: %serror: writing the standard output: %s\n", bb_log_prefix(),
            flushed ? strerror(saved) : "a write failed");
    return BB_EXIT_ERROR;
}

/* Under mpirun/srun every process runs the command; a process that fails
 * ends the whole job (the others may wait for it in a collective), after
 * its one-line error naming its rank. */
int main(int argc, char **argv)
{
    bb_cpu_fix_blas_core(argv);
    if (bb_world_init(&argc, &argv) != BB_OK) {
        fprintf(stderr, "bigbatch: error: %s\n", bb_error_message());
        return BB_EXIT_ERROR;
    }
    const bb_world *w = bb_world_get();
    char name[32];
    snprintf(name, sizeof name, "rank %d", w->rank);
    if (w->size > 1) bb_log_set_prefix(name);
    int code = finish_stdout(run(argc, argv));
    if (w->size > 1 && code != BB_EXIT_OK && code != BB_EXIT_INTERRUPTED && code != BB_EXIT_PREEMPTED) {
        fflush(stdout), fflush(stderr);
        bb_world_abort(code);
    }
    bb_world_finalize();
    return code;
}

static int run(int argc, char **argv)
{
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);

    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        print_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? BB_EXIT_USAGE : BB_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) return bb_cmd_version(0, NULL);
    const char *name = argv[1];
    bool help = !strcmp(name, "help");
    if (help) {
        if (argc < 3) {
            print_usage(stdout);
            return BB_EXIT_OK;
        }
        name = argv[2];
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
        if (strcmp(name, commands[i].name) != 0) continue;
        if (help) {
            char *args[] = {"--help", NULL};
            return commands[i].run(1, args);
        }
        return commands[i].run(argc - 2, argv + 2);
    }
    fprintf(stderr, "bigbatch: error: unknown command '%s'\n\n", name);
    print_usage(stderr);
    return BB_EXIT_USAGE;
}
