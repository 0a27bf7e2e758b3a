/* trace.c — span storage per track and the Chrome trace writer. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bigbatch/trace.h"

#ifdef BB_NVTX
#include <nvtx3/nvToolsExt.h> /* header-only; free unless Nsight is attached */
void bb_trace_range_push(const char *name) { nvtxRangePushA(name); }
void bb_trace_range_pop(void) { nvtxRangePop(); }
#else
void bb_trace_range_push(const char *name) { (void)name; }
void bb_trace_range_pop(void) {}
#endif

typedef struct span {
    const char *name;   /* a string that outlives the trace: "forward" */
    uint64_t start_ns;  /* bb_clock_ns() */
    uint64_t end_ns;
    int64_t step;       /* training step (1-based), or -1 */
    int32_t detail;     /* micro-step or bucket index, or -1 */
} span;

typedef struct track {
    char name[48];
    span *spans;
    size_t count, capacity;
    size_t dropped;
} track;

struct bb_trace {
    int count;
    track *tracks;
};

bb_status bb_trace_create(int tracks, bb_trace_t **out)
{
    *out = NULL;
    bb_trace_t *t = calloc(1, sizeof *t);
    if (t) t->tracks = calloc((size_t)(tracks > 0 ? tracks : 1), sizeof *t->tracks);
    if (!t || !t->tracks) {
        free(t);
        return bb_fail(BB_ERR_NOMEM, "out of memory for the trace");
    }
    t->count = tracks;
    for (int i = 0; i < tracks; i++) snprintf(t->tracks[i].name, sizeof t->tracks[i].name, "track %d", i);
    *out = t;
    return BB_OK;
}

void bb_trace_destroy(bb_trace_t *t)
{
    if (!t) return;
    for (int i = 0; i < t->count; i++) free(t->tracks[i].spans);
    free(t->tracks);
    free(t);
}

void bb_trace_name_track(bb_trace_t *t, int i, const char *name)
{
    if (t && i >= 0 && i < t->count) snprintf(t->tracks[i].name, sizeof t->tracks[i].name, "%s", name);
}

void bb_trace_add(bb_trace_t *t, int i, const char *name, uint64_t start_ns, uint64_t end_ns, int64_t step,
                  int32_t detail)
{
    if (!t || i < 0 || i >= t->count) return;
    track *k = &t->tracks[i];
    if (k->count == k->capacity) {
        size_t cap = k->capacity ? 2 * k->capacity : 1024;
        span *s = realloc(k->spans, cap * sizeof *s);
        if (!s) {
            k->dropped++;
            return;
        }
        k->spans = s;
        k->capacity = cap;
    }
    k->spans[k->count++] = (span){name, start_ns, end_ns, step, detail};
}

bb_status bb_trace_write(const bb_trace_t *t, const char *path)
{
    uint64_t origin = UINT64_MAX;
    size_t dropped = 0, total = 0;
    for (int i = 0; i < t->count; i++) {
        dropped += t->tracks[i].dropped;
        total += t->tracks[i].count;
        if (t->tracks[i].count && t->tracks[i].spans[0].start_ns < origin) origin = t->tracks[i].spans[0].start_ns;
    }
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid()) >= (int)sizeof tmp)
        return bb_fail(BB_ERR_ARG, "trace path too long: %s", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return bb_fail_errno(BB_ERR_IO, "%s: cannot create", tmp);
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    for (int i = 0; i < t->count; i++) {
        fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":", i);
        bb_json_write_string(f, t->tracks[i].name);
        fprintf(f, "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"sort_index\":%d}}", i, i);
        fprintf(f, i + 1 < t->count || total ? ",\n" : "\n");
    }
    for (int i = 0; i < t->count; i++) {
        const track *k = &t->tracks[i];
        for (size_t j = 0; j < k->count; j++) {
            const span *s = &k->spans[j];
            bool reduce = !strcmp(s->name, "reduce");
            fprintf(f, "{\"name\":\"%s", s->name);
            if (reduce) fprintf(f, " bucket %d", s->detail);
            fprintf(f, "\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"step\":%lld,\"%s\":%d}}",
                    i, (double)(s->start_ns - origin) / 1e3, (double)(s->end_ns - s->start_ns) / 1e3,
                    (long long)s->step, reduce ? "bucket" : "micro_step", s->detail);
            bool last = j + 1 == k->count;
            for (int n = i + 1; last && n < t->count; n++) last = t->tracks[n].count == 0;
            fprintf(f, last ? "\n" : ",\n");
        }
    }
    fprintf(f, "]}\n");
    bool ok = !ferror(f);
    if (fclose(f) != 0) ok = false;
    if (!ok || rename(tmp, path) != 0) {
        bb_status rc = bb_fail_errno(BB_ERR_IO, "%s: cannot write the trace", path);
        unlink(tmp);
        return rc;
    }
    if (dropped) BB_WARN("%s: %zu spans were dropped (out of memory)", path, dropped);
    return BB_OK;
}
