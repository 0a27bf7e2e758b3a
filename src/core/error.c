/* error.c — status names and the per-thread error message. */
#include "bigbatch/core.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static const char *const status_names[BB_STATUS_COUNT] = {
    [BB_OK] = "ok",
    [BB_ERR_ARG] = "invalid argument",
    [BB_ERR_IO] = "input/output error",
    [BB_ERR_CORRUPT] = "corrupt data",
    [BB_ERR_FORMAT] = "unrecognized format",
    [BB_ERR_NOMEM] = "out of host memory",
    [BB_ERR_OOM] = "out of device memory",
    [BB_ERR_UNSUPPORTED] = "unsupported",
    [BB_ERR_INTERRUPTED] = "interrupted",
    [BB_ERR_CLOSED] = "closed",
    [BB_ERR_DEVICE] = "device error",
    [BB_ERR_NONFINITE] = "non-finite value",
    [BB_ERR_INTERNAL] = "internal error",
};

/* One record per thread: the loader and worker threads fail independently. */
static _Thread_local struct {
    bb_status status;
    char message[1024];
    char origin[96];
} last_error;

const char *bb_status_name(bb_status status)
{
    if ((unsigned)status >= BB_STATUS_COUNT) return "unknown status";
    return status_names[status];
}

static void set_origin(const char *file, int line)
{
    const char *base = strrchr(file, '/');
    snprintf(last_error.origin, sizeof last_error.origin, "%s:%d", base ? base + 1 : file, line);
}

static bb_status set_message(bb_status status, const char *file, int line, const char *suffix,
                             const char *fmt, va_list ap)
{
    /* Format into a scratch buffer: the arguments may point into last_error. */
    char msg[sizeof last_error.message];
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    if (suffix && n >= 0 && (size_t)n < sizeof msg)
        snprintf(msg + n, sizeof msg - (size_t)n, ": %s", suffix);
    memcpy(last_error.message, msg, sizeof msg);
    last_error.status = status;
    set_origin(file, line);
    BB_DEBUG("%s: %s", last_error.origin, last_error.message);
    return status;
}

bb_status bb_error_set_at(bb_status status, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_message(status, file, line, NULL, fmt, ap);
    va_end(ap);
    return status;
}

bb_status bb_error_set_errno_at(bb_status status, const char *file, int line, const char *fmt,
                                ...)
{
    int err = errno;
    va_list ap;
    va_start(ap, fmt);
    set_message(status, file, line, strerror(err), fmt, ap);
    va_end(ap);
    return status;
}

const char *bb_error_message(void)
{
    if (last_error.status == BB_OK) return "";
    return last_error.message[0] ? last_error.message : bb_status_name(last_error.status);
}

const char *bb_error_origin(void) { return last_error.status == BB_OK ? "" : last_error.origin; }

void bb_error_clear(void)
{
    last_error.status = BB_OK;
    last_error.message[0] = '\0';
    last_error.origin[0] = '\0';
}

bb_status bb_error_trace(bb_status status, const char *file, int line, const char *expr)
{
    if (last_error.status != status) {
        /* A status came back without a bb_fail(): keep at least its name. */
        last_error.status = status;
        snprintf(last_error.message, sizeof last_error.message, "%s", bb_status_name(status));
        set_origin(file, line);
    }
    BB_DEBUG("  from %s:%d: %s", file, line, expr);
    return status;
}
