/* report_read.c — the run's files as report.c draws them
 * (report_internal.h): metrics JSON Lines, a Chrome trace, plan --json. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "report_internal.h"

/* A file's lines, of any length. */
typedef struct lines {
    FILE *f;
    char *buf;
    size_t cap, len; /* len: the current line's, newline included */
    int number;      /* the current line's, from 1 */
} lines;

static bb_status lines_open(const char *path, lines *l)
{
    *l = (lines){.f = fopen(path, "r")};
    return l->f ? BB_OK : bb_fail_errno(BB_ERR_IO, "%s: cannot open", path);
}

/* The next line, or NULL at the end of the file (or a read error). */
static char *lines_next(lines *l)
{
    ssize_t n = getline(&l->buf, &l->cap, l->f);
    if (n < 0) return NULL;
    l->len = (size_t)n;
    l->number++;
    return l->buf;
}

static bb_status lines_close(lines *l, const char *path)
{
    bool failed = ferror(l->f);
    free(l->buf);
    fclose(l->f);
    return failed ? bb_fail_errno(BB_ERR_IO, "%s: read failed", path) : BB_OK;
}

static double get_num(const char *line, const char *key)
{
    double v;
    return bb_json_get_double(line, key, &v) ? v : NAN;
}

/* Room for item `count` in *items (capacity *cap, doubling); false when
 * out of memory (*items unchanged). */
static bool grow(void **items, size_t *cap, int count, size_t size)
{
    if ((size_t)count < *cap) return true;
    size_t n = *cap ? 2 * *cap : 256;
    void *grown = realloc(*items, n * size);
    if (!grown) return false;
    *items = grown, *cap = n;
    return true;
}

static void get_str(const char *line, const char *key, char *out, size_t cap)
{
    if (!bb_json_get_string(line, key, out, cap)) snprintf(out, cap, "?");
}

static void read_config(const char *line, bb_report_run *r)
{
    r->has_config = true;
    get_str(line, "model", r->model, sizeof r->model);
    get_str(line, "describe", r->describe, sizeof r->describe);
    get_str(line, "devices", r->devices, sizeof r->devices);
    get_str(line, "checkpoint", r->checkpoint, sizeof r->checkpoint);
    get_str(line, "precision", r->precision, sizeof r->precision);
    get_str(line, "optimizer", r->optimizer, sizeof r->optimizer);
    get_str(line, "data", r->data, sizeof r->data);
    get_str(line, "version", r->version, sizeof r->version);
    get_str(line, "commit", r->commit, sizeof r->commit);
    bb_json_get_int(line, "device_count", &r->device_count);
    bb_json_get_int(line, "processes", &r->processes);
    bb_json_get_int(line, "global_batch", &r->global_batch);
    bb_json_get_int(line, "accumulation", &r->accumulation);
    bb_json_get_int(line, "micro_batch", &r->micro_batch);
    bb_json_get_int(line, "tokens_per_example", &r->tokens_per_example);
    bb_json_get_int(line, "zero", &r->zero);
    bb_json_get_u64(line, "steps", &r->steps);
    r->lr = get_num(line, "lr");
    r->device_mem = get_num(line, "device_mem");
}

/* "peak_mem_bytes": [a, b, ...] into the run's per-device maxima. */
static void read_peaks(const char *line, bb_report_run *r)
{
    const char *p = strstr(line, "\"peak_mem_bytes\": [");
    if (!p) return;
    p += strlen("\"peak_mem_bytes\": [");
    for (int d = 0; d < BB_REPORT_MAX_DEVICES; d++) {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p) break;
        if (v > r->peak[d]) r->peak[d] = v;
        if (d + 1 > r->peak_devices) r->peak_devices = d + 1;
        for (p = end; *p == ' ' || *p == ','; p++) {}
    }
}

static bool read_row(const char *line, bb_report_row *w)
{
    w->step = get_num(line, "step");
    w->loss = get_num(line, "loss");
    if (isnan(w->step) || !strstr(line, "\"loss\":") || !strstr(line, "\"peak_mem_bytes\":")) return false;
    w->lr = get_num(line, "lr");
    w->grad_norm = get_num(line, "grad_norm");
    w->samples_per_s = get_num(line, "samples_per_s");
    w->tokens_per_s = get_num(line, "tokens_per_s");
    w->data_wait_pct = get_num(line, "data_wait_pct");
    w->overlap_pct = get_num(line, "overlap_pct");
    w->fwd_ms = get_num(line, "fwd_ms");
    w->bwd_ms = get_num(line, "bwd_ms");
    w->reduce_ms = get_num(line, "reduce_ms");
    w->opt_ms = get_num(line, "opt_ms");
    w->val_loss = get_num(line, "val_loss");
    w->val_accuracy = get_num(line, "val_accuracy");
    w->skipped = strstr(line, "\"skipped\": true") != NULL;
    return true;
}

static void note(char *notes, size_t cap, const char *text)
{
    size_t n = strlen(notes);
    snprintf(notes + n, cap - n, "%s%s", n ? " " : "", text);
}

bb_status bb_report_read_run(const char *path, bb_report_run *r)
{
    *r = (bb_report_run){.path = path};
    lines in;
    BB_TRY(lines_open(path, &in));
    char *line;
    size_t cap_rows = 0;
    int bad_line = 0;
    bool bad_last = false;
    bb_status rc = BB_OK;
    while (rc == BB_OK && (line = lines_next(&in))) {
        int number = in.number;
        size_t len = in.len;
        if (bad_line) { /* a damaged line with more after it: not a truncated last line */
            rc = bb_fail(BB_ERR_FORMAT, "%s: line %d: not a metrics row (damaged?)", path, bad_line);
            break;
        }
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!len) continue;
        if (number == 1 && strstr(line, "\"run\": {")) {
            read_config(line, r);
            continue;
        }
        bb_report_row w;
        bool complete = line[len - 1] == '}';
        if (!complete || !read_row(line, &w)) {
            if (r->count == 0 && complete) /* a whole first line of something else */
                rc = bb_fail(BB_ERR_FORMAT,
                             "%s: line %d: not a `bigbatch train --metrics` file (no step, loss and peak memory: "
                             "bench --json or plan --json output?)",
                             path, number);
            bad_line = number, bad_last = true;
            continue;
        }
        bad_last = false;
        if (!grow((void **)&r->rows, &cap_rows, r->count, sizeof *r->rows)) {
            rc = bb_fail(BB_ERR_NOMEM, "%s: out of memory at line %d", path, number);
            break;
        }
        r->rows[r->count++] = w;
        read_peaks(line, r);
    }
    bb_status closed = lines_close(&in, path);
    if (rc == BB_OK) rc = closed;
    if (rc == BB_OK && r->count == 0)
        rc = bb_fail(BB_ERR_FORMAT, "%s: no step rows%s", path,
                     bad_line ? " (its only line is damaged)" : " (the run has not finished a step yet?)");
    if (rc == BB_OK && bad_last) {
        char text[96];
        snprintf(text, sizeof text, "Line %d is incomplete and was left out (the run may still be writing).",
                 bad_line);
        note(r->notes, sizeof r->notes, text);
    }
    if (rc == BB_OK && !r->has_config)
        note(r->notes, sizeof r->notes,
             "No configuration line (a metrics file of an older bigbatch): the header and the tokens axis are "
             "missing.");
    if (rc != BB_OK) bb_report_free_run(r);
    return rc;
}

void bb_report_free_run(bb_report_run *r)
{
    free(r->rows);
    r->rows = NULL;
    r->count = 0;
}

/* ---- trace -------------------------------------------------------------- */
bb_status bb_report_read_trace(const char *path, bb_report_trace *t)
{
    *t = (bb_report_trace){0};
    lines in;
    BB_TRY(lines_open(path, &in));
    char *line;
    size_t cap_spans = 0;
    bool any = false;
    bb_status rc = BB_OK;
    while (rc == BB_OK && (line = lines_next(&in))) {
        any = any || strstr(line, "traceEvents");
        int lane;
        if (!bb_json_get_int(line, "tid", &lane) || lane < 0 || lane > BB_REPORT_MAX_DEVICES) continue;
        if (strstr(line, "\"thread_name\"")) {
            const char *p = strstr(line, "\"args\":{\"name\":");
            if (p && bb_json_get_string(p + 7, "name", t->lane_name[lane], sizeof t->lane_name[lane]) &&
                lane + 1 > t->lanes)
                t->lanes = lane + 1;
            continue;
        }
        if (!strstr(line, "\"ph\":\"X\"")) continue;
        bb_report_span s = {.lane = lane, .ts_us = get_num(line, "ts"), .dur_us = get_num(line, "dur")};
        double step = get_num(line, "step");
        if (isnan(s.ts_us) || isnan(s.dur_us) || isnan(step) || !bb_json_get_string(line, "name", s.name, sizeof s.name))
            continue;
        s.step = (long long)step;
        if (!grow((void **)&t->spans, &cap_spans, t->count, sizeof *t->spans)) {
            rc = bb_fail(BB_ERR_NOMEM, "%s: out of memory", path);
            break;
        }
        t->spans[t->count++] = s;
        if (lane + 1 > t->lanes) t->lanes = lane + 1;
    }
    bb_status closed = lines_close(&in, path);
    if (rc == BB_OK) rc = closed;
    if (rc == BB_OK && !any)
        snprintf(t->note, sizeof t->note, "%s is empty or not a Chrome trace: no timeline.", path);
    else if (rc == BB_OK && t->count == 0)
        snprintf(t->note, sizeof t->note, "%s holds no spans: no timeline.", path);
    if (rc != BB_OK) bb_report_free_trace(t);
    return rc;
}

void bb_report_free_trace(bb_report_trace *t)
{
    free(t->spans);
    t->spans = NULL;
    t->count = 0;
}

/* ---- plan --json ---------------------------------------------------------- */
bb_status bb_report_read_plan(const char *path, bb_report_plan *p)
{
    *p = (bb_report_plan){0};
    lines in;
    BB_TRY(lines_open(path, &in));
    char *line;
    bool rows = false;
    while ((line = lines_next(&in))) {
        if (!strstr(line, "{\"micro_batch\":")) continue; /* a row of the list */
        rows = true;
        if (!strstr(line, "\"chosen\": true")) continue;
        p->present = true;
        bb_json_get_int(line, "micro_batch", &p->micro_batch);
        bb_json_get_int(line, "accumulation", &p->accumulation);
        get_str(line, "checkpoint", p->checkpoint, sizeof p->checkpoint);
        bb_json_get_u64(line, "peak_bytes", &p->peak_bytes);
        bb_json_get_u64(line, "parameters_bytes", &p->parameters);
        bb_json_get_u64(line, "gradients_bytes", &p->gradients);
        bb_json_get_u64(line, "optimizer_bytes", &p->optimizer);
        bb_json_get_u64(line, "batches_bytes", &p->batches);
        bb_json_get_u64(line, "activations_bytes", &p->activations);
        bb_json_get_u64(line, "workspace_bytes", &p->workspace);
    }
    BB_TRY(lines_close(&in, path));
    if (!rows) return bb_fail(BB_ERR_FORMAT, "%s: not `bigbatch plan --json` output (no rows)", path);
    return BB_OK;
}
