/* util.c — clocks, byte formatting, CPU count, directory fsync, JSON strings. */
#include "bigbatch/core.h"

#include <fcntl.h>
#include <math.h>
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

void bb_json_write_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\r': fputs("\\r", out); break;
        case '\t': fputs("\\t", out); break;
        default:
            if (*p < 0x20)
                fprintf(out, "\\u%04x", *p);
            else
                fputc(*p, out);
        }
    }
    fputc('"', out);
}

const char *bb_json_number(char *buf, size_t cap, const char *fmt, double v)
{
    if (!isfinite(v)) snprintf(buf, cap, "null");
    else snprintf(buf, cap, fmt, v);
    return buf;
}

uint64_t bb_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
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

/* ---- reading the flat JSON objects bigbatch writes (state.json) ---- */
static const char *find_value(const char *json, const char *key)
{
    char pattern[80];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *p = strstr(json, pattern);
    if (!p) return NULL;
    for (p += strlen(pattern); *p == ' '; p++) {}
    return p;
}

bool bb_json_get_u64(const char *json, const char *key, uint64_t *out)
{
    const char *p = find_value(json, key);
    char *end;
    if (!p || *p < '0' || *p > '9') return false;
    *out = strtoull(p, &end, 10);
    return end != p;
}

bool bb_json_get_int(const char *json, const char *key, int *out)
{
    uint64_t v;
    if (!bb_json_get_u64(json, key, &v) || v > (1u << 30)) return false;
    *out = (int)v;
    return true;
}

bool bb_json_get_double(const char *json, const char *key, double *out)
{
    const char *p = find_value(json, key);
    char *end;
    if (!p) return false;
    *out = strtod(p, &end);
    return end != p;
}

bool bb_json_get_string(const char *json, const char *key, char *out, size_t cap)
{
    const char *p = find_value(json, key);
    if (!p || *p != '"') return false;
    const char *end = strchr(p + 1, '"');
    if (!end || (size_t)(end - p - 1) >= cap) return false;
    memcpy(out, p + 1, (size_t)(end - p - 1));
    out[end - p - 1] = 0;
    return true;
}
