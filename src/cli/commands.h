/* commands.h — private: the bigbatch subcommands. Each takes the arguments
 * after its name and returns the process exit status. */
#ifndef BIGBATCH_CLI_COMMANDS_H
#define BIGBATCH_CLI_COMMANDS_H

#include <signal.h>

#include "bigbatch/core.h"

enum { BB_EXIT_OK = 0, BB_EXIT_ERROR = 1, BB_EXIT_USAGE = 2, BB_EXIT_INTERRUPTED = 130 };

/* Set by SIGINT/SIGTERM; long-running commands stop cleanly when it is set. */
extern volatile sig_atomic_t bb_cli_interrupted;

/* Prints "bigbatch: error: <message>" for the thread's last error (or the
 * help for a usage error when help was requested) and maps the status to an
 * exit code. */
int bb_cli_report(bb_status status, const char *usage, const char *summary, const bb_opt *opts);

int bb_cmd_pack(int argc, char **argv);
int bb_cmd_inspect(int argc, char **argv);
int bb_cmd_version(int argc, char **argv);
int bb_cmd_bench(int argc, char **argv);
int bb_cmd_train(int argc, char **argv);
int bb_cmd_eval(int argc, char **argv);
int bb_cmd_export(int argc, char **argv);
int bb_cmd_sample(int argc, char **argv);
int bb_cmd_plan(int argc, char **argv);
int bb_cmd_report(int argc, char **argv);

#endif
