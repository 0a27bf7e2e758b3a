/* log.c — leveled logging to stderr, threshold from BB_LOG. */
#include "bigbatch/core.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static atomic_int threshold = -1; /* -1: not yet read from the environment */

static bb_log_level level_from_env(void)
{
    const char *v = getenv("BB_LOG");
    if (!v || !*v) return BB_LOG_WARN;
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i <= BB_LOG_DEBUG; i++)
        if (strcasecmp(v, names[i]) == 0) return (bb_log_level)i;
    fprintf(stderr, "bigbatch: warn: BB_LOG=%s is not one of error|warn|info|debug; using warn\n", v);
    return BB_LOG_WARN;
}

bb_log_level bb_log_threshold(void)
{
    int t = atomic_load_explicit(&threshold, memory_order_relaxed);
    if (t < 0) {
        t = (int)level_from_env();
        atomic_store_explicit(&threshold, t, memory_order_relaxed);
    }
    return (bb_log_level)t;
}

void bb_log_set_threshold(bb_log_level level)
{
    atomic_store_explicit(&threshold, (int)level, memory_order_relaxed);
}

static char prefix[32]; /* "rank 1: " in a job of several processes; set once, before threads */

void bb_log_set_prefix(const char *p) { snprintf(prefix, sizeof prefix, "%s%s", p, *p ? ": " : ""); }
const char *bb_log_prefix(void) { return prefix; }

void bb_log(bb_log_level level, const char *fmt, ...)
{
    if (level > bb_log_threshold()) return;
    static const char *const tags[] = {"error", "warn", "info", "debug"};
    /* One fprintf per line: stdio's lock keeps lines from different threads whole. */
    char line[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "bigbatch: %s%s: %s\n", prefix, tags[level], line);
}
