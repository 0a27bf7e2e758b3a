/* temp.c — the temporaries being written (a checkpoint's step directory
 * before its rename, a file's NAME.tmp-PID), so that a second signal,
 * which ends the process at once, removes them before it exits
 * (bb_temp_remove, from the handler: only async-signal-safe calls). */
#include "bigbatch/core.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
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

/* The entries of the directory open at fd, directories among them to
 * `depth` levels (a pack's splits: 1), with getdents64 rather than
 * readdir, which may allocate. */
static void remove_entries(int fd, int depth)
{
    char buf[4096];
    for (long got; (got = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0;)
        for (long at = 0; at < got;) {
            /* struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name */
            unsigned short reclen;
            memcpy(&reclen, buf + at + 16, sizeof reclen);
            unsigned char type = (unsigned char)buf[at + 18];
            const char *name = buf + at + 19;
            at += reclen;
            if (!strcmp(name, ".") || !strcmp(name, "..")) continue;
            int sub = type == DT_DIR && depth > 0 ? openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                                                  : -1;
            if (sub >= 0) {
                remove_entries(sub, depth - 1);
                close(sub);
            }
            unlinkat(fd, name, sub >= 0 ? AT_REMOVEDIR : 0);
        }
}

/* A directory with its entries (and their directories, one level down),
 * or the file. A directory is first renamed to PATH.removing: the handler
 * may run on another thread than the one writing into it, which could
 * otherwise create a file between the scan and the rmdir; past the rename
 * its writes by path fail. (The name keeps the prefix the next save's
 * clean-up removes, should anything be left.) */
static void remove_path(const char *path)
{
    static char doomed[sizeof slots[0].path + 16]; /* the handler's own: it runs once, then the process exits */
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        unlink(path);
        return;
    }
    size_t n = strlen(path);
    memcpy(doomed, path, n), memcpy(doomed + n, ".removing", sizeof ".removing");
    const char *at = rename(path, doomed) == 0 ? doomed : path;
    for (int tries = 0; tries < 3; tries++) { /* an entry made during the scan: scan again, from the start */
        lseek(fd, 0, SEEK_SET);
        remove_entries(fd, 1);
        if (rmdir(at) == 0) break;
    }
    close(fd);
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
