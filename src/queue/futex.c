/* futex.c — sleep/wake on a 32-bit word (Linux futex, private to the process). */
#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "bigbatch/queue.h"

void bb_futex_wait_timeout(_Atomic uint32_t *word, uint32_t expected, uint64_t timeout_ns)
{
    struct timespec ts = {(time_t)(timeout_ns / 1000000000u), (long)(timeout_ns % 1000000000u)};
    /* EAGAIN (the word moved), EINTR and ETIMEDOUT are ordinary: callers re-check. */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, timeout_ns ? &ts : NULL, NULL, 0);
}

void bb_futex_wait(_Atomic uint32_t *word, uint32_t expected) { bb_futex_wait_timeout(word, expected, 0); }

void bb_futex_wake(_Atomic uint32_t *word, int count)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}
