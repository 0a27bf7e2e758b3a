/* commands.h — private: the bigbatch subcommands. Each takes the arguments
 * after its name and returns the process exit status. */
#ifndef BIGBATCH_CLI_COMMANDS_H
#define BIGBATCH_CLI_COMMANDS_H

#include <signal.h>

#include "bigbatch/core.h"

/* 75 is sysexits.h's EX_TEMPFAIL ("try again later"): train was preempted
 * and saved, and a job script may requeue it with --resume. */
enum { BB_EXIT_OK = 0, BB_EXIT_ERROR = 1, BB_EXIT_USAGE = 2, BB_EXIT_PREEMPTED = 75, BB_EXIT_INTERRUPTED = 130 };

/* A bb_stop_request (train.h), set by the first signal: SIGINT gives
 * BB_STOP_INTERRUPT, SIGTERM and SIGUSR1 (a scheduler's preemption)
 * BB_STOP_PREEMPT; a second signal exits at once (130). Long-running
 * commands stop cleanly when it is set. */
extern volatile sig_atomic_t bb_cli_interrupted;

/* Prints "bigbatch: error: <message>" for the thread's last error (or the
 * help for a usage error when help was requested) and maps the status to an
 * exit code. */
int bb_cli_report(bb_status status, const char *usage, const char *summary, const bb_opt *opts);

int bb_cmd_pack(int argc, char **argv);
int bb_cmd_tokenizer(int argc, char **argv);
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
