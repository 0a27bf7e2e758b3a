/* trace.c — span storage per track and the Chrome trace writer. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bigbatch/json.h"
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

/* Writes one event (its reference taken) on a line of its own. */
static bool event(FILE *f, json_t *e, bool *first)
{
    bool ok = e && (*first || fputs(",\n", f) >= 0) && bb_json_write(f, e) == BB_OK;
    *first = false;
    json_decref(e);
    return ok;
}

bb_status bb_trace_write(const bb_trace_t *t, const char *path)
{
    uint64_t origin = UINT64_MAX;
    size_t dropped = 0;
    for (int i = 0; i < t->count; i++) {
        dropped += t->tracks[i].dropped;
        if (t->tracks[i].count && t->tracks[i].spans[0].start_ns < origin) origin = t->tracks[i].spans[0].start_ns;
    }
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid()) >= (int)sizeof tmp)
        return bb_fail(BB_ERR_ARG, "trace path too long: %s", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return bb_fail_errno(BB_ERR_IO, "%s: cannot create", tmp);
    int tracked = bb_temp_track(tmp); /* a second signal removes it */
    /* One event per line: a reader streams it element by element. */
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    bool ok = true, first = true;
    for (int i = 0; ok && i < t->count; i++) {
        json_t *name = json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "name", "thread_name", "ph", "M", "pid", 1, "tid", i,
                                 "args", "name", t->tracks[i].name);
        json_t *sort = json_pack("{s:s, s:s, s:i, s:i, s:{s:i}}", "name", "thread_sort_index", "ph", "M", "pid", 1,
                                 "tid", i, "args", "sort_index", i);
        ok = event(f, name, &first) && event(f, sort, &first);
    }
    for (int i = 0; ok && i < t->count; i++) {
        const track *k = &t->tracks[i];
        for (size_t j = 0; ok && j < k->count; j++) {
            const span *s = &k->spans[j];
            bool reduce = !strcmp(s->name, "reduce");
            char name[64];
            snprintf(name, sizeof name, reduce ? "%s bucket %d" : "%s", s->name, s->detail);
            json_t *e = json_pack("{s:s, s:s, s:i, s:i, s:o, s:o, s:{s:I, s:i}}", "name", name, "ph", "X", "pid", 1,
                                  "tid", i, "ts", bb_json_fixed((double)(s->start_ns - origin) / 1e3, 3), "dur",
                                  bb_json_fixed((double)(s->end_ns - s->start_ns) / 1e3, 3), "args", "step",
                                  (json_int_t)s->step, reduce ? "bucket" : "micro_step", s->detail);
            ok = event(f, e, &first);
        }
    }
    fprintf(f, "\n]}\n");
    ok = ok && !ferror(f);
    if (fclose(f) != 0) ok = false;
    if (!ok || rename(tmp, path) != 0) {
        bb_status rc = bb_fail_errno(BB_ERR_IO, "%s: cannot write the trace", path);
        unlink(tmp);
        bb_temp_untrack(tracked);
        return rc;
    }
    bb_temp_untrack(tracked);
    if (dropped) BB_WARN("%s: %zu spans were dropped (out of memory)", path, dropped);
    return BB_OK;
}
