/* futex.c — sleep/wake on a 32-bit word (Linux futex, private to the process). */
#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "bigbatch/queue.h"

void bb_futex_wait(_Atomic uint32_t *word, uint32_t expected)
{
    /* EAGAIN (the word moved) and EINTR are ordinary: callers re-check. */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

void bb_futex_wake(_Atomic uint32_t *word, int count)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}
