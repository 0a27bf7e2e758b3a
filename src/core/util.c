/* util.c — clocks, byte formatting, CPU count, directory fsync. */
#include "bigbatch/core.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

uint64_t bb_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

double bb_clock_seconds(void) { return (double)bb_clock_ns() * 1e-9; }

const char *bb_format_bytes(uint64_t bytes, char *buf, size_t cap)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, cap, "%.1f %s", v, units[u]);
    return buf;
}

int bb_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

uint64_t bb_host_available_bytes(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kib;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
            fclose(f);
            return (uint64_t)kib * 1024;
        }
    if (f) fclose(f);
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : UINT64_MAX;
}

uint64_t bb_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The real path of the nearest existing directory that holds `path`
 * (its parent, or that parent's, ...), into out; false when none resolves. */
static bool real_parent(const char *path, char *out, size_t cap)
{
    char buf[4096];
    if ((size_t)snprintf(buf, sizeof buf, "%s", path) >= sizeof buf) return false;
    for (;;) {
        char *slash = strrchr(buf, '/');
        if (!slash) snprintf(buf, sizeof buf, ".");
        else if (slash == buf) buf[1] = 0;
        else *slash = 0;
        char *real = realpath(buf, NULL);
        if (real) {
            bool fits = (size_t)snprintf(out, cap, "%s", real) < cap;
            free(real);
            return fits;
        }
        if (!strcmp(buf, ".") || !strcmp(buf, "/")) return false;
    }
}

bool bb_path_inside(const char *path, const char *dir)
{
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    char *real_dir = realpath(dir, NULL), parent[4096];
    char *real = realpath(path, NULL); /* an existing directory: itself; else the directory that would hold it */
    bool in = real_dir && (real ? (size_t)snprintf(parent, sizeof parent, "%s", real) < sizeof parent
                                : real_parent(path, parent, sizeof parent));
    free(real);
    if (in) {
        size_t n = strlen(real_dir);
        in = !strncmp(parent, real_dir, n) && (parent[n] == '/' || parent[n] == 0 || !strcmp(real_dir, "/"));
    }
    free(real_dir);
    return in;
}

/* `path` lies inside none of the inputs that are directories. */
static bb_status outside_inputs(const char *what, const char *path, const char *const *inputs, int n)
{
    for (int i = 0; i < n; i++)
        if (inputs[i] && bb_path_inside(path, inputs[i]))
            return bb_fail(BB_ERR_IO, "%s %s is inside %s, one of the command's inputs: writing there would change "
                           "it; nothing written", what, path, inputs[i]);
    return BB_OK;
}

bb_status bb_check_output(const char *what, const char *path, const char *const *inputs, int n, char *resolved,
                          size_t cap)
{
    struct stat st;
    if ((size_t)snprintf(resolved, cap, "%s", path) >= cap)
        return bb_fail(BB_ERR_IO, "%s %s: path too long", what, path);
    if (lstat(path, &st) != 0) return outside_inputs(what, path, inputs, n); /* absent: created */
    if (S_ISLNK(st.st_mode)) {
        char *target = realpath(path, NULL);
        if (!target || stat(target, &st) != 0) {
            free(target);
            return bb_fail(BB_ERR_IO, "%s %s: a symbolic link to nothing that exists; nothing written", what, path);
        }
        bool fits = (size_t)snprintf(resolved, cap, "%s", target) < cap;
        free(target);
        if (!fits) return bb_fail(BB_ERR_IO, "%s %s: path too long", what, path);
    }
    if (!S_ISREG(st.st_mode))
        return bb_fail(BB_ERR_IO, "%s %s exists and is not a regular file (%s): nothing written", what, path,
                       S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "a socket");
    for (int i = 0; i < n; i++) {
        struct stat in;
        if (inputs[i] && stat(inputs[i], &in) == 0 && in.st_dev == st.st_dev && in.st_ino == st.st_ino)
            return bb_fail(BB_ERR_IO, "%s %s is one of the command's inputs (%s): it would be overwritten; nothing "
                           "written", what, path, inputs[i]);
    }
    return outside_inputs(what, resolved, inputs, n); /* where a link leads */
}

bb_status bb_make_parents(const char *path, size_t *created)
{
    char buf[4096];
    size_t made = 0;
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return bb_fail(BB_ERR_ARG, "path too long: %s", path);
    bb_status rc = BB_OK;
    for (char *p = buf + 1; *p && rc == BB_OK; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) == 0) {
            if (!made) made = (size_t)(p - buf);
        } else if (errno != EEXIST) {
            rc = bb_fail_errno(BB_ERR_IO, "%s: cannot create directory", buf);
        }
        *p = '/';
    }
    if (created) *created = made;
    return rc;
}

void bb_list_add(char *buf, size_t cap, int i, int n, const char *name, const char *detail)
{
    size_t len = strnlen(buf, cap);
    if (len + 1 >= cap) return;
    if (!detail) snprintf(buf + len, cap - len, "%s%s", i ? "|" : "", name);
    else snprintf(buf + len, cap - len, "%s%s (%s)", i == 0 ? "" : i == n - 1 ? " or " : ", ", name, detail);
}

bb_status bb_copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY | O_CLOEXEC), out = -1;
    if (in < 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot open", from);
    bb_status rc = BB_OK;
    if ((out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0)
        rc = bb_fail_errno(BB_ERR_IO, "%s: cannot create", to);
    char buf[1 << 16];
    for (ssize_t n; rc == BB_OK && (n = read(in, buf, sizeof buf)) != 0;) {
        if (n < 0) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot read", from);
        for (ssize_t done = 0, w; rc == BB_OK && done < n; done += w)
            if ((w = write(out, buf + done, (size_t)(n - done))) < 0) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot write", to);
    }
    if (rc == BB_OK && fsync(out) != 0) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot sync", to);
    if (out >= 0 && close(out) != 0 && rc == BB_OK) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot write", to);
    close(in);
    if (rc != BB_OK && out >= 0) unlink(to);
    return rc;
}

bb_status bb_fsync_dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) return bb_fail(BB_ERR_NOMEM, "out of memory");
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    bb_status rc = fd < 0 || fsync(fd) != 0 ? bb_fail_errno(BB_ERR_IO, "%s: cannot sync the directory", dir) : BB_OK;
    if (fd >= 0) close(fd);
    free(dir);
    return rc;
}

const char *bb_record_kind_name(uint32_t kind)
{
    switch (kind) {
    case BB_RECORD_IMAGE_U8: return "image_u8";
    case BB_RECORD_TOKENS_U16: return "tokens_u16";
    case BB_RECORD_TOKENS_U32: return "tokens_u32";
    }
    return "unknown";
}

int bb_record_token_bytes(uint32_t kind)
{
    return kind == BB_RECORD_TOKENS_U16 ? 2 : kind == BB_RECORD_TOKENS_U32 ? 4 : 0;
}

const char *bb_record_shape(const bb_record_format *f, char *buf, size_t cap)
{
    size_t n = 0;
    if (cap) buf[0] = 0;
    for (uint32_t i = 0; i < f->rank && i < BB_RECORD_MAX_RANK && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%u", i ? "x" : "", f->shape[i]);
    return buf;
}
