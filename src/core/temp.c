/* temp.c — the temporaries being written (a checkpoint's step directory
 * before its rename, a file's NAME.tmp-PID), so that a second signal,
 * which ends the process at once, removes them before it exits
 * (bb_temp_remove, from the handler: only async-signal-safe calls). */
#include "bigbatch/core.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

enum { SLOTS = BB_TEMP_SLOTS, FREE = 0, CLAIMED = 1, READY = 2 };
static struct {
    atomic_int state;
    char path[4096];
} slots[SLOTS];

int bb_temp_track(const char *path)
{
    size_t n = strlen(path);
    if (n >= sizeof slots[0].path) return -1;
    for (int i = 0; i < SLOTS; i++) {
        int expected = FREE;
        if (!atomic_compare_exchange_strong(&slots[i].state, &expected, CLAIMED)) continue;
        memcpy(slots[i].path, path, n + 1);
        atomic_store(&slots[i].state, READY);
        return i;
    }
    return -1; /* all taken: not removed by a second signal, still removed by the next run */
}

void bb_temp_untrack(int slot)
{
    if (slot >= 0 && slot < SLOTS) atomic_store(&slots[slot].state, FREE);
}

/* A directory's entries (a flat one: files and links) then the directory;
 * or the file. getdents64 rather than readdir, which may allocate. */
static void remove_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        unlink(path);
        return;
    }
    char buf[4096];
    for (long got; (got = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0;)
        for (long at = 0; at < got;) {
            /* struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name */
            unsigned short reclen;
            memcpy(&reclen, buf + at + 16, sizeof reclen);
            const char *name = buf + at + 19;
            if (strcmp(name, ".") && strcmp(name, "..")) unlinkat(fd, name, 0);
            at += reclen;
        }
    close(fd);
    rmdir(path);
}

bool bb_temp_remove(int slot)
{
    const char *path = bb_temp_path(slot);
    if (!path || access(path, F_OK) != 0) return false;
    remove_path(path);
    return true;
}

const char *bb_temp_path(int slot)
{
    return slot >= 0 && slot < SLOTS && atomic_load(&slots[slot].state) == READY ? slots[slot].path : NULL;
}
