/* bench.h — private: the `bigbatch bench` subcommands and their helpers. */
#ifndef BIGBATCH_CLI_BENCH_H
#define BIGBATCH_CLI_BENCH_H

#include "commands.h"

int bb_bench_queue(int argc, char **argv);
int bb_bench_loader(int argc, char **argv);
int bb_bench_model(int argc, char **argv);
int bb_bench_copy(int argc, char **argv);
int bb_bench_attention(int argc, char **argv);

/* Median of values[0..n) (sorts them in place); 0 when n is 0. */
double bb_bench_median(double *values, int n);

#endif
