/* version.c — bb_commit (core.h): the commit the Makefile found at build time. */
#include "bb_commit.h"
#include "bigbatch/core.h"

const char *bb_commit(void) { return BB_COMMIT; }
