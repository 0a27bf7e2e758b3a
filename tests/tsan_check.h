/* tsan_check.h — CHECK() for the plain TSan programs (tests/tsan_*.c):
 * on failure, prints where and the last bigbatch error, and exits 1. */
#ifndef BIGBATCH_TSAN_CHECK_H
#define BIGBATCH_TSAN_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "bigbatch/core.h"

#define CHECK(cond, ...)                                                \
    do {                                                                \
        if (!(cond)) {                                                  \
            fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);             \
            fprintf(stderr, __VA_ARGS__);                               \
            fprintf(stderr, " (%s)\n", bb_error_message());             \
            exit(1);                                                    \
        }                                                               \
    } while (0)

#endif
