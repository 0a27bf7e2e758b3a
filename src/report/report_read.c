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

/* obj[key] into out, or "?" when it is absent or not a string. */
static void get_str(const json_t *obj, const char *key, char *out, size_t cap)
{
    const char *v = json_string_value(json_object_get(obj, key));
    snprintf(out, cap, "%s", v ? v : "?");
}

static int get_int(const json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_integer(v) ? (int)json_integer_value(v) : 0;
}

static void read_config(const json_t *run, bb_report_run *r)
{
    r->has_config = true;
    get_str(run, "model", r->model, sizeof r->model);
    get_str(run, "describe", r->describe, sizeof r->describe);
    get_str(run, "devices", r->devices, sizeof r->devices);
    get_str(run, "checkpoint", r->checkpoint, sizeof r->checkpoint);
    get_str(run, "precision", r->precision, sizeof r->precision);
    get_str(run, "optimizer", r->optimizer, sizeof r->optimizer);
    get_str(run, "data", r->data, sizeof r->data);
    get_str(run, "version", r->version, sizeof r->version);
    get_str(run, "commit", r->commit, sizeof r->commit);
    r->device_count = get_int(run, "device_count");
    r->processes = get_int(run, "processes");
    r->global_batch = get_int(run, "global_batch");
    r->accumulation = get_int(run, "accumulation");
    r->micro_batch = get_int(run, "micro_batch");
    r->tokens_per_example = get_int(run, "tokens_per_example");
    r->zero = get_int(run, "zero");
    r->ramp_from = get_int(json_object_get(run, "batch_ramp"), "from"); /* 0: no ramp */
    r->ramp_steps = get_int(json_object_get(run, "batch_ramp"), "steps");
    json_t *steps = json_object_get(run, "steps");
    r->steps = json_is_integer(steps) && json_integer_value(steps) > 0 ? (uint64_t)json_integer_value(steps) : 0;
    r->lr = bb_json_number_or_nan(run, "lr");
    r->device_mem = bb_json_number_or_nan(run, "device_mem");
}

/* "peak_mem_bytes": [a, b, ...] into the run's per-device maxima. */
static void read_peaks(const json_t *row, bb_report_run *r)
{
    const json_t *peaks = json_object_get(row, "peak_mem_bytes");
    for (size_t d = 0; d < json_array_size(peaks) && d < BB_REPORT_MAX_DEVICES; d++) {
        json_t *v = json_array_get(peaks, d);
        uint64_t bytes = json_is_integer(v) && json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v) : 0;
        if (bytes > r->peak[d]) r->peak[d] = bytes;
        if ((int)d + 1 > r->peak_devices) r->peak_devices = (int)d + 1;
    }
}

/* A row: an object with a step, a loss (a number, or null when it was not
 * finite) and the peaks. */
static bool read_row(const json_t *row, bb_report_row *w)
{
    w->step = bb_json_number_or_nan(row, "step");
    w->loss = bb_json_number_or_nan(row, "loss");
    if (isnan(w->step) || !json_object_get(row, "loss") || !json_is_array(json_object_get(row, "peak_mem_bytes")))
        return false;
    w->lr = bb_json_number_or_nan(row, "lr");
    w->grad_norm = bb_json_number_or_nan(row, "grad_norm");
    w->noise_scale = bb_json_number_or_nan(row, "noise_scale"); /* absent before the noise scale: NaN */
    w->global_batch = bb_json_number_or_nan(row, "global_batch"); /* only under a batch ramp */
    w->samples_per_s = bb_json_number_or_nan(row, "samples_per_s");
    w->tokens_per_s = bb_json_number_or_nan(row, "tokens_per_s");
    w->data_wait_pct = bb_json_number_or_nan(row, "data_wait_pct");
    w->overlap_pct = bb_json_number_or_nan(row, "overlap_pct");
    w->fwd_ms = bb_json_number_or_nan(row, "fwd_ms");
    w->bwd_ms = bb_json_number_or_nan(row, "bwd_ms");
    w->reduce_ms = bb_json_number_or_nan(row, "reduce_ms");
    w->opt_ms = bb_json_number_or_nan(row, "opt_ms");
    w->val_loss = bb_json_number_or_nan(row, "val_loss");
    w->val_accuracy = bb_json_number_or_nan(row, "val_accuracy");
    w->skipped = json_is_true(json_object_get(row, "skipped"));
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
    int bad_line = 0, back_line = 0;
    bool bad_last = false;
    size_t backwards = 0; /* rows whose step is not past the row before's */
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
        json_t *obj = json_loadb(line, len, JSON_REJECT_DUPLICATES, NULL);
        json_t *run = json_object_get(obj, "run");
        if (number == 1 && json_is_object(run)) {
            read_config(run, r);
            json_decref(obj);
            continue;
        }
        bb_report_row w;
        bool complete = json_is_object(obj); /* else damaged, or a last line still being written */
        if (!complete || !read_row(obj, &w)) {
            if (r->count == 0 && complete) /* a whole first line of something else */
                rc = bb_fail(BB_ERR_FORMAT,
                             "%s: line %d: not a `bigbatch train --metrics` file (no step, loss and peak memory: "
                             "bench --json or plan --json output?)",
                             path, number);
            json_decref(obj);
            bad_line = number, bad_last = true;
            continue;
        }
        bad_last = false;
        if (!grow((void **)&r->rows, &cap_rows, r->count, sizeof *r->rows)) {
            json_decref(obj);
            rc = bb_fail(BB_ERR_NOMEM, "%s: out of memory at line %d", path, number);
            break;
        }
        if (r->count && !(w.step > r->rows[r->count - 1].step) && !backwards++) back_line = number;
        /* examples seen: the steps since the previous row at this row's batch (a ramp's), else the run's */
        double batch = isfinite(w.global_batch) ? w.global_batch : r->global_batch > 0 ? r->global_batch : NAN;
        double before = r->count ? r->rows[r->count - 1].seen : 0, from = r->count ? r->rows[r->count - 1].step : 0;
        w.seen = before + (w.step - from) * batch;
        r->rows[r->count++] = w;
        read_peaks(obj, r);
        json_decref(obj);
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
    if (rc == BB_OK && backwards) {
        char text[240];
        snprintf(text, sizeof text, "%zu of %d rows repeat or go back in steps, the first at line %d (two runs in "
                 "one file?): they are plotted in the file's order.", backwards, r->count, back_line);
        note(r->notes, sizeof r->notes, text);
        BB_WARN("%s: %s", path, text);
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

/* ---- trace ---------------------------------------------------------------
 * Two passes over the file, one event in memory at a time: the first finds
 * the lanes and each step's bounds, the second keeps the spans of the step
 * shown. Memory: the steps' bounds and one step's spans, whatever the
 * trace's size. */
typedef struct step_span {
    double t0, t1;
} step_span;

/* An "X" event's lane, step, start and duration; false for other events. */
static bool read_span(const json_t *ev, bb_report_span *s)
{
    const char *ph = json_string_value(json_object_get(ev, "ph"));
    const char *name = json_string_value(json_object_get(ev, "name"));
    json_t *tid = json_object_get(ev, "tid");
    if (!ph || strcmp(ph, "X") || !name || !json_is_integer(tid)) return false;
    *s = (bb_report_span){.lane = (int)json_integer_value(tid), .ts_us = bb_json_number_or_nan(ev, "ts"),
                          .dur_us = bb_json_number_or_nan(ev, "dur")};
    double step = bb_json_number_or_nan(json_object_get(ev, "args"), "step");
    if (s->lane < 0 || s->lane > BB_REPORT_MAX_DEVICES || isnan(s->ts_us) || isnan(s->dur_us) || isnan(step) ||
        step < 0 || step >= 1 << 24)
        return false;
    s->step = (long long)step;
    snprintf(s->name, sizeof s->name, "%s", name);
    return true;
}

/* A thread_name event into t's lane names. */
static void read_lane(const json_t *ev, bb_report_trace *t)
{
    const char *name = json_string_value(json_object_get(ev, "name"));
    json_t *tid = json_object_get(ev, "tid");
    const char *lane = json_string_value(json_object_get(json_object_get(ev, "args"), "name"));
    if (!name || strcmp(name, "thread_name") || !json_is_integer(tid) || !lane) return;
    int k = (int)json_integer_value(tid);
    if (k < 0 || k > BB_REPORT_MAX_DEVICES) return;
    snprintf(t->lane_name[k], sizeof t->lane_name[k], "%s", lane);
    if (k + 1 > t->lanes) t->lanes = k + 1;
}

/* One pass: `keep` < 0 collects lanes and the steps' bounds into
 * *bounds (*nsteps entries, indexed by step), else the spans of step `keep`. */
static bb_status trace_pass(const char *path, volatile sig_atomic_t *interrupted, bb_report_trace *t, long long keep,
                            step_span **bounds, size_t *nsteps, bool *found)
{
    bb_json_stream *in;
    BB_TRY(bb_json_stream_open(path, "traceEvents", &in));
    size_t cap_spans = 0, cap_steps = *nsteps;
    json_t *ev;
    bb_status rc;
    while ((rc = bb_json_stream_next(in, &ev)) == BB_OK && ev) {
        if (interrupted && *interrupted) {
            json_decref(ev);
            rc = bb_fail(BB_ERR_INTERRUPTED, "%s: interrupted while reading it", path);
            break;
        }
        bb_report_span s;
        if (keep < 0) read_lane(ev, t);
        bool span = read_span(ev, &s);
        json_decref(ev);
        if (!span) continue;
        if (s.lane + 1 > t->lanes) t->lanes = s.lane + 1;
        if (keep >= 0) {
            if (s.step != keep) continue;
            if (!grow((void **)&t->spans, &cap_spans, t->count, sizeof *t->spans)) {
                rc = bb_fail(BB_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            t->spans[t->count++] = s;
            continue;
        }
        while ((size_t)s.step >= *nsteps) {
            if (!grow((void **)bounds, &cap_steps, (int)*nsteps, sizeof **bounds)) {
                rc = bb_fail(BB_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            (*bounds)[(*nsteps)++] = (step_span){INFINITY, -INFINITY};
        }
        if (rc != BB_OK) break;
        step_span *b = &(*bounds)[s.step];
        b->t0 = s.ts_us < b->t0 ? s.ts_us : b->t0;
        b->t1 = s.ts_us + s.dur_us > b->t1 ? s.ts_us + s.dur_us : b->t1;
        t->count++;
    }
    *found = bb_json_stream_found(in);
    bb_json_stream_close(in);
    return rc;
}

static int by_duration(const void *a, const void *b)
{
    double x = ((const double *)a)[0], y = ((const double *)b)[0];
    return (x > y) - (x < y);
}

/* The step whose duration is the median of all steps' (the lower one);
 * -1 when out of memory. */
static long long median_step(const step_span *bounds, size_t n)
{
    double(*d)[2] = calloc(n ? n : 1, sizeof *d);
    if (!d) return -1;
    size_t k = 0;
    for (size_t s = 0; s < n; s++)
        if (isfinite(bounds[s].t0)) d[k][0] = bounds[s].t1 - bounds[s].t0, d[k][1] = (double)s, k++;
    qsort(d, k, sizeof *d, by_duration);
    long long chosen = k ? (long long)d[(k - 1) / 2][1] : -1;
    free(d);
    return chosen;
}

bb_status bb_report_read_trace(const char *path, int want, volatile sig_atomic_t *interrupted, bb_report_trace *t)
{
    *t = (bb_report_trace){0};
    step_span *bounds = NULL;
    size_t nsteps = 0;
    bool found;
    bb_status rc = trace_pass(path, interrupted, t, -1, &bounds, &nsteps, &found);
    int spans = t->count;
    long long step = -1;
    if (rc == BB_OK && spans) step = want > 0 ? want : median_step(bounds, nsteps);
    if (rc == BB_OK && spans && step < 0) rc = bb_fail(BB_ERR_NOMEM, "%s: out of memory", path);
    free(bounds);
    t->count = 0;
    t->step = step, t->median = want <= 0, t->all_spans = spans;
    if (rc == BB_OK && step >= 0) rc = trace_pass(path, interrupted, t, step, &bounds, &nsteps, &found);
    if (rc == BB_OK && !found)
        snprintf(t->note, sizeof t->note, "%s is empty or not a Chrome trace: no timeline.", path);
    else if (rc == BB_OK && spans == 0)
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

/* ---- plan --json ------------------------------------------------------------ */
static uint64_t get_u64(const json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_integer(v) && json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v) : 0;
}

bb_status bb_report_read_plan(const char *path, bb_report_plan *p)
{
    *p = (bb_report_plan){0};
    json_t *rows;
    bb_status rc = bb_json_load_file(path, false, &rows);
    if (rc == BB_ERR_FORMAT) { /* it says where */
        char where[600];
        snprintf(where, sizeof where, "%s", bb_error_message());
        return bb_fail(BB_ERR_FORMAT, "not `bigbatch plan --json` output: %s", where);
    }
    if (rc != BB_OK) return rc;
    bool any = false;
    for (size_t i = 0; i < json_array_size(rows); i++) {
        const json_t *r = json_array_get(rows, i);
        if (!json_is_integer(json_object_get(r, "micro_batch"))) continue;
        any = true;
        bb_report_choice c = {.micro_batch = get_int(r, "micro_batch"), .accumulation = get_int(r, "accumulation"),
                              .peak_bytes = get_u64(r, "peak_bytes"),
                              .relative_time = bb_json_number_or_nan(r, "relative_time"),
                              .step_ms = bb_json_number_or_nan(r, "step_ms")};
        get_str(r, "checkpoint", c.checkpoint, sizeof c.checkpoint);
        if (!json_is_true(json_object_get(r, "chosen"))) { /* keep the two fastest others that fit */
            if (!json_is_true(json_object_get(r, "fits")) || !isfinite(c.relative_time)) continue;
            int at = p->runners_up;
            while (at > 0 && c.relative_time < p->runner_up[at - 1].relative_time) at--;
            if (at >= 2) continue;
            if (p->runners_up < 2) p->runners_up++;
            memmove(&p->runner_up[at + 1], &p->runner_up[at], (size_t)(p->runners_up - 1 - at) * sizeof c);
            p->runner_up[at] = c;
            continue;
        }
        p->present = true;
        p->chosen = c;
        p->parameters = get_u64(r, "parameters_bytes");
        p->gradients = get_u64(r, "gradients_bytes");
        p->optimizer = get_u64(r, "optimizer_bytes");
        p->batches = get_u64(r, "batches_bytes");
        p->activations = get_u64(r, "activations_bytes");
        p->workspace = get_u64(r, "workspace_bytes");
    }
    json_decref(rows);
    if (!any) return bb_fail(BB_ERR_FORMAT, "%s: not `bigbatch plan --json` output (no rows)", path);
    return BB_OK;
}
