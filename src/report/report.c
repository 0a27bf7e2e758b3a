/* report.c — bb_report_write (report.h): reads the run's files
 * (report_read.c) and writes one HTML page of inline SVG charts (svg.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bigbatch/report.h"
#include "report_internal.h"
#include "svg.h"

static const char css[] =
    "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;max-width:980px;margin:1.5em auto;"
    "padding:0 1em;color:#1a1a1a}\n"
    "h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.15em;margin:1.6em 0 .3em;border-bottom:1px solid #ccc}\n"
    "table.config{border-collapse:collapse;font-size:.9em}table.config td{padding:2px 12px 2px 0;vertical-align:top}\n"
    "table.config td:first-child{color:#555}\n"
    ".note{background:#fff4d6;border-left:4px solid #E69F00;padding:.4em .8em;font-size:.9em}\n"
    "svg.chart{width:100%;height:auto;display:block;margin:.4em 0 1em}\n"
    "svg .title{font-size:14px;font-weight:600}svg .tick{font-size:11px;fill:#333}\n"
    "svg .axis{font-size:12px;fill:#222}svg .legend{font-size:11px;fill:#222}\n"
    "svg .grid{stroke:#e3e3e3;stroke-width:1}svg .frame{fill:none;stroke:#888;stroke-width:1}\n"
    "p.caption{font-size:.85em;color:#444;margin-top:-.6em}\n"
    "@media print{body{max-width:none}h2{break-after:avoid}svg.chart{break-inside:avoid}}\n";

typedef struct page {
    FILE *out;
    const bb_report_options *o;
    bb_report_run *runs; /* [0] the run, then the compared ones */
    int nruns;
} page;

static const char *run_label(const bb_report_run *r)
{
    const char *slash = strrchr(r->path, '/');
    return slash ? slash + 1 : r->path;
}

/* Min and max of a field over every run's finite values. */
typedef double (*field_fn)(const bb_report_run *r, int i);
static void range_of(const page *p, field_fn f, double *lo, double *hi)
{
    *lo = INFINITY, *hi = -INFINITY;
    for (int k = 0; k < p->nruns; k++)
        for (int i = 0; i < p->runs[k].count; i++) {
            double v = f(&p->runs[k], i);
            if (!isfinite(v)) continue;
            *lo = v < *lo ? v : *lo, *hi = v > *hi ? v : *hi;
        }
}

static double f_step(const bb_report_run *r, int i) { return r->rows[i].step; }
static double f_loss(const bb_report_run *r, int i) { return r->rows[i].loss; }
static double f_val(const bb_report_run *r, int i) { return r->rows[i].val_loss; }
static double f_acc(const bb_report_run *r, int i) { return 100 * r->rows[i].val_accuracy; }
static double f_lr(const bb_report_run *r, int i) { return r->rows[i].lr; }
static double f_norm(const bb_report_run *r, int i) { return r->rows[i].grad_norm; }
static double f_noise(const bb_report_run *r, int i) { return r->rows[i].noise_scale; }
static double f_overlap(const bb_report_run *r, int i) { return r->rows[i].overlap_pct; }
static bool tokens(const bb_report_run *r) { return r->count && isfinite(r->rows[0].tokens_per_s); }
static double f_speed(const bb_report_run *r, int i)
{
    return tokens(r) ? r->rows[i].tokens_per_s : r->rows[i].samples_per_s;
}
/* Examples (tokens for a gpt) seen by the end of the row's step. */
static double f_seen(const bb_report_run *r, int i)
{
    if (!r->has_config) return NAN;
    return r->rows[i].seen * (r->tokens_per_example > 0 ? r->tokens_per_example : 1);
}
/* The step's global batch: a ramp's, else the run's. */
static double f_batch(const bb_report_run *r, int i)
{
    return isfinite(r->rows[i].global_batch) ? r->rows[i].global_batch : r->has_config ? r->global_batch : NAN;
}

/* A horizontal line across a chart (hline_at NAN: none). */
typedef struct hline {
    double at;
    const char *label;
} hline;

/* A second line of the first run on a chart (y NULL: none). */
typedef struct second_line {
    field_fn y;
    const char *cls, *label;
} second_line;

/* One chart of field `y` against `x` for every run, series k for run k
 * (and a line at mark.at, when it is a number; and the first run's
 * `second` line, when given). */
static void runs_chart_marked(page *p, const char *title, const char *x_title, const char *y_title, field_fn x,
                              field_fn y, const char *cls, field_fn points_y, bool log_y, hline mark,
                              second_line second)
{
    double x0, x1, y0, y1, a, b;
    range_of(p, x, &x0, &x1);
    range_of(p, y, &y0, &y1);
    if (points_y) {
        range_of(p, points_y, &a, &b);
        y0 = a < y0 ? a : y0, y1 = b > y1 ? b : y1;
    }
    if (isfinite(mark.at) && isfinite(y0)) y0 = mark.at < y0 ? mark.at : y0, y1 = mark.at > y1 ? mark.at : y1;
    for (int i = 0; second.y && p->nruns && i < p->runs[0].count; i++) {
        double v = second.y(&p->runs[0], i);
        if (isfinite(v) && isfinite(y0)) y0 = v < y0 ? v : y0, y1 = v > y1 ? v : y1;
    }
    if (!isfinite(x0) || !isfinite(y0)) return;
    if (!log_y) y0 = y0 > 0 && y0 < 0.5 * y1 ? 0 : y0;
    bb_svg_chart c;
    bb_svg_chart_begin(&c, p->out, title, x_title, y_title, x0, x1, y0, y1 * 1.02, log_y ? BB_SVG_LOG_Y : 0);
    const char *names[8];
    int shown = p->nruns < 8 ? p->nruns : 8;
    for (int k = 0; k < p->nruns; k++) {
        bb_report_run *r = &p->runs[k];
        double *xs = malloc((size_t)r->count * sizeof *xs), *ys = malloc((size_t)r->count * sizeof *ys);
        if (!xs || !ys) {
            free(xs), free(ys);
            continue;
        }
        for (int i = 0; i < r->count; i++) xs[i] = x(r, i), ys[i] = y(r, i);
        bb_svg_line(&c, xs, ys, r->count, k, k ? "compare" : cls, run_label(r));
        if (!k && second.y) {
            for (int i = 0; i < r->count; i++) ys[i] = second.y(r, i);
            bb_svg_line(&c, xs, ys, r->count, 1, second.cls, second.label);
        }
        if (points_y) {
            for (int i = 0; i < r->count; i++) ys[i] = points_y(r, i);
            bb_svg_points(&c, xs, ys, r->count, k, "val", "validation");
        }
        free(xs), free(ys);
        if (k < shown) names[k] = run_label(r);
    }
    if (p->nruns > 1) bb_svg_legend(&c, names, shown, NULL);
    if (isfinite(mark.at)) bb_svg_hline(&c, mark.at, "#D55E00", mark.label);
    bb_svg_chart_end(&c);
}

static void runs_chart(page *p, const char *title, const char *x_title, const char *y_title, field_fn x, field_fn y,
                       const char *cls, field_fn points_y, bool log_y)
{
    runs_chart_marked(p, title, x_title, y_title, x, y, cls, points_y, log_y, (hline){NAN, NULL},
                      (second_line){NULL, NULL, NULL});
}

static void config_row(FILE *out, const char *key, const char *value)
{
    fprintf(out, "<tr><td>%s</td><td>", key);
    bb_svg_text(out, value);
    fprintf(out, "</td></tr>\n");
}

static void header(page *p)
{
    const bb_report_run *r = &p->runs[0];
    FILE *out = p->out;
    fprintf(out, "<h1>bigbatch report</h1>\n<table class=\"config\">\n");
    config_row(out, "metrics", r->path);
    if (r->has_config) {
        char v[BB_RECOMPUTE_NAME_MAX + 320];
        config_row(out, "model", r->describe);
        snprintf(v, sizeof v, "%s (%d device%s%s)", r->devices, r->device_count, r->device_count == 1 ? "" : "s",
                 r->processes > 1 ? ", several processes" : "");
        config_row(out, "devices", v);
        int n = r->ramp_from ? snprintf(v, sizeof v, "from %d over %d steps to ", r->ramp_from, r->ramp_steps) : 0;
        snprintf(v + n, sizeof v - (size_t)n, "G = %d = %d devices x %d micro-steps x %d", r->global_batch,
                 r->device_count * (r->processes > 0 ? r->processes : 1), r->accumulation, r->micro_batch);
        config_row(out, "global batch", v);
        snprintf(v, sizeof v, "%s, %s, lr %g, %llu steps%s", r->checkpoint, r->precision, r->lr,
                 (unsigned long long)r->steps, r->zero ? ", ZeRO-1" : "");
        config_row(out, "checkpointing, precision", v);
        config_row(out, "optimizer", r->optimizer);
        if (r->device_mem > 0) {
            snprintf(v, sizeof v, "%.1f MiB per device (--device-mem)", r->device_mem / 1048576.0);
            config_row(out, "memory cap", v);
        }
        config_row(out, "data", r->data);
        snprintf(v, sizeof v, "bigbatch %s, commit %s", r->version, r->commit);
        config_row(out, "binary", v);
    }
    char steps[64];
    snprintf(steps, sizeof steps, "%d (%g to %g)", r->count, r->rows[0].step, r->rows[r->count - 1].step);
    config_row(out, "steps in the file", steps);
    for (int k = 1; k < p->nruns; k++) config_row(out, "compared with", p->runs[k].path);
    fprintf(out, "</table>\n");
    for (int k = 0; k < p->nruns; k++)
        if (p->runs[k].notes[0]) {
            fprintf(out, "<p class=\"note\">");
            bb_svg_text(out, run_label(&p->runs[k]));
            fprintf(out, ": ");
            bb_svg_text(out, p->runs[k].notes);
            fprintf(out, "</p>\n");
        }
}

/* Forward, backward, reduce wait, optimizer and data wait per step, stacked. */
static const char *const part_names[] = {"forward", "backward", "reduce wait", "optimizer", "data wait", "other"};
/* the palette's first five (svg.c), then grey for "other" */
static const char *const part_colours[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#BBBBBB"};

static void time_chart(page *p)
{
    const bb_report_run *r = &p->runs[0];
    double top = 0, x0 = r->rows[0].step - 0.5, x1 = r->rows[r->count - 1].step + 0.5;
    double (*parts)[6] = calloc((size_t)r->count, sizeof *parts);
    if (!parts) return;
    for (int i = 0; i < r->count; i++) {
        const bb_report_row *w = &r->rows[i];
        double step_ms = r->global_batch > 0 && w->samples_per_s > 0 ? 1000.0 * r->global_batch / w->samples_per_s : NAN;
        double v[6] = {w->fwd_ms, w->bwd_ms, w->reduce_ms, w->opt_ms, isfinite(step_ms) ? step_ms * w->data_wait_pct / 100 : 0, 0};
        double sum = 0;
        for (int k = 0; k < 5; k++) sum += isfinite(v[k]) ? v[k] : 0;
        v[5] = isfinite(step_ms) && step_ms > sum ? step_ms - sum : 0;
        memcpy(parts[i], v, sizeof v);
        top = sum + v[5] > top ? sum + v[5] : top;
    }
    bb_svg_chart c;
    bb_svg_chart_begin(&c, p->out, "Where a step's time goes (device 0)", "step", "milliseconds", x0, x1, 0, top * 1.05,
                       BB_SVG_INTEGER_X);
    double width = (x1 - x0) / r->count * 0.8;
    for (int i = 0; i < r->count; i++) {
        double base = 0, x = r->rows[i].step;
        for (int k = 0; k < 6; k++) {
            double v = isfinite(parts[i][k]) ? parts[i][k] : 0;
            if (v <= 0) continue;
            char tip[96];
            snprintf(tip, sizeof tip, "step %g: %s %.1f ms", x, part_names[k], v);
            bb_svg_rect(&c, x - width / 2, x + width / 2, base, base + v, part_colours[k], tip);
            base += v;
        }
    }
    bb_svg_legend(&c, part_names, 6, part_colours);
    bb_svg_chart_end(&c);
    free(parts);
    double lo, hi;
    range_of(p, f_overlap, &lo, &hi);
    if (isfinite(lo)) {
        runs_chart(p, "Overlap of the gradient reduction with the backward", "step", "overlap (%)", f_step, f_overlap,
                   "overlap", NULL, false);
        fprintf(p->out, "<p class=\"caption\">The share of the reducer's work done while the backward still ran "
                        "(the last micro-step's).</p>\n");
    }
}

static void memory_chart(page *p, const bb_report_plan *plan)
{
    const bb_report_run *r = &p->runs[0];
    int n = r->peak_devices;
    if (!n) return;
    double top = r->device_mem > 0 ? r->device_mem : 0;
    for (int d = 0; d < n; d++) top = (double)r->peak[d] > top ? (double)r->peak[d] : top;
    if (plan->present) top = (double)plan->chosen.peak_bytes > top ? (double)plan->chosen.peak_bytes : top;
    double mib = 1048576.0;
    bb_svg_chart c;
    bb_svg_chart_begin(&c, p->out, "Peak memory per device", plan->present ? "device (last bar: the plan)" : "device",
                       "MiB", -0.5, n - 0.5 + (plan->present ? 1 : 0), 0, top / mib * 1.1, BB_SVG_INTEGER_X);
    for (int d = 0; d < n; d++) {
        char tip[64];
        snprintf(tip, sizeof tip, "device %d: %.1f MiB", d, (double)r->peak[d] / mib);
        bb_svg_rect(&c, d - 0.3, d + 0.3, 0, (double)r->peak[d] / mib, bb_svg_colour(0), tip);
    }
    if (plan->present) {
        const char *names[] = {"parameters", "gradients", "optimizer state", "batches", "activations", "workspace"};
        uint64_t v[] = {plan->parameters, plan->gradients, plan->optimizer, plan->batches, plan->activations,
                        plan->workspace};
        double base = 0;
        for (int k = 0; k < 6; k++) {
            char tip[96];
            snprintf(tip, sizeof tip, "plan: %s %.1f MiB", names[k], (double)v[k] / mib);
            bb_svg_rect(&c, n - 0.3, n + 0.3, base, base + (double)v[k] / mib, part_colours[k], tip);
            base += (double)v[k] / mib;
        }
        bb_svg_legend(&c, names, 6, part_colours);
    }
    if (r->device_mem > 0) bb_svg_hline(&c, r->device_mem / mib, "#D55E00", "--device-mem");
    bb_svg_chart_end(&c);
    if (!plan->present) return;
    const bb_report_choice *ch = &plan->chosen;
    fprintf(p->out, "<p class=\"caption\">The plan's choice: micro-batch %d, accumulation %d, checkpoint ",
            ch->micro_batch, ch->accumulation);
    bb_svg_text(p->out, ch->checkpoint);
    fprintf(p->out, "; predicted peak %.1f MiB, relative time %.2fx", (double)ch->peak_bytes / mib, ch->relative_time);
    if (isfinite(ch->step_ms)) fprintf(p->out, " (a step of %.0f ms predicted)", ch->step_ms);
    for (int i = 0; i < plan->runners_up; i++) {
        const bb_report_choice *u = &plan->runner_up[i];
        fprintf(p->out, "%s micro-batch %d, ", i ? ";" : ". Runners-up:", u->micro_batch);
        bb_svg_text(p->out, u->checkpoint);
        fprintf(p->out, " (%.1f MiB, %.2fx)", (double)u->peak_bytes / mib, u->relative_time);
    }
    fprintf(p->out, ".</p>\n");
}

static bb_status write_page(page *p, const bb_report_trace *trace, const bb_report_plan *plan)
{
    FILE *out = p->out;
    const bb_report_run *r = &p->runs[0];
    bool tok = tokens(r);
    fprintf(out, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
                 "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>bigbatch report: ");
    bb_svg_text(out, run_label(r));
    fprintf(out, "</title>\n<style>\n%s</style></head><body>\n", css);
    header(p);
    fprintf(out, "<h2>Loss</h2>\n");
    runs_chart(p, "Training loss (dots: validation loss)", "step", "loss", f_step, f_loss, "loss", f_val, false);
    double a, b;
    range_of(p, f_seen, &a, &b);
    if (isfinite(a))
        runs_chart(p, tok ? "Training loss against tokens seen" : "Training loss against samples seen",
                   tok ? "tokens seen" : "samples seen", "loss", f_seen, f_loss, "loss-seen", f_val, false);
    range_of(p, f_acc, &a, &b);
    if (isfinite(a)) runs_chart(p, "Validation accuracy", "step", "accuracy (%)", f_step, f_acc, "accuracy", f_acc, false);
    fprintf(out, "<h2>Speed and optimizer</h2>\n");
    runs_chart(p, "Throughput", "step", tok ? "tokens per second" : "samples per second", f_step,
               f_speed, "speed", NULL, false);
    runs_chart(p, "Learning rate", "step", "learning rate", f_step, f_lr, "lr", NULL, false);
    runs_chart(p, "Gradient norm (before clipping)", "step", "gradient norm", f_step, f_norm, "norm", NULL, true);
    range_of(p, f_noise, &a, &b);
    if (isfinite(a)) { /* the batch pays while it is below B_simple (McCandlish et al.) */
        const bb_report_run *r = &p->runs[0];
        bool ramp = r->count && isfinite(r->rows[0].global_batch); /* the batch changes: a line of it */
        hline batch = {!ramp && r->has_config && r->global_batch > 0 ? r->global_batch : NAN, "the global batch"};
        second_line ramped = {ramp ? f_batch : NULL, "batch", "the global batch (its ramp)"};
        runs_chart_marked(p, "Gradient noise scale B_simple (examples) against the batch in use", "step",
                          "B_simple (examples)", f_step, f_noise, "noise", NULL, true, batch, ramped);
    }
    fprintf(out, "<h2>Time</h2>\n");
    time_chart(p);
    fprintf(out, "<h2>Memory</h2>\n");
    memory_chart(p, plan);
    if (p->o->trace) {
        fprintf(out, "<h2>Timeline</h2>\n");
        bb_report_timeline(out, trace);
    }
    fprintf(out, "<p class=\"caption\">Written by bigbatch %s.</p>\n</body></html>\n", BB_VERSION);
    return BB_OK;
}

bb_status bb_report_write(const bb_report_options *o)
{
    if (!o->metrics || !o->out) return bb_fail(BB_ERR_ARG, "report: --metrics and --out are required");
    page p = {.o = o, .nruns = 1 + o->compare_count};
    bb_report_trace trace = {0};
    bb_report_plan plan = {0};
    p.runs = calloc((size_t)p.nruns, sizeof *p.runs);
    if (!p.runs) return bb_fail(BB_ERR_NOMEM, "out of memory");
    /* the page may replace a regular file only, never one it reads */
    const char *inputs[3 + BB_REPORT_MAX_DEVICES] = {o->metrics, o->trace, o->plan};
    int n_inputs = 3;
    for (int k = 0; k < o->compare_count && n_inputs < (int)(sizeof inputs / sizeof *inputs); k++)
        inputs[n_inputs++] = o->compare[k];
    char out[4096], tmp[4200];
    bb_status rc = bb_check_output(o->out_name ? o->out_name : "--out", o->out, inputs, n_inputs, out, sizeof out);
    int read = 0;
    for (; rc == BB_OK && read < p.nruns; read++)
        rc = bb_report_read_run(read ? o->compare[read - 1] : o->metrics, &p.runs[read]);
    if (rc == BB_OK && o->trace) rc = bb_report_read_trace(o->trace, o->trace_step, o->interrupted, &trace);
    if (rc == BB_OK && o->plan) rc = bb_report_read_plan(o->plan, &plan);
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", out, (int)getpid());
    if (rc == BB_OK) rc = bb_make_parents(out, NULL); /* missing directories are made, as for every output */
    if (rc == BB_OK && !(p.out = fopen(tmp, "w"))) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot create", out);
    int tracked = rc == BB_OK ? bb_temp_track(tmp) : -1; /* a second signal removes it */
    if (rc == BB_OK) {
        rc = write_page(&p, &trace, &plan);
        bool ok = fflush(p.out) == 0 && !ferror(p.out);
        if (fclose(p.out) != 0) ok = false;
        if (rc == BB_OK && !ok) rc = bb_fail_errno(BB_ERR_IO, "%s: write failed", tmp);
        if (rc == BB_OK && o->interrupted && *o->interrupted) rc = bb_fail(BB_ERR_INTERRUPTED, "interrupted");
        if (rc == BB_OK && rename(tmp, out) != 0) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot write", o->out);
        if (rc != BB_OK) unlink(tmp);
    }
    bb_temp_untrack(tracked);
    for (int k = 0; k < read; k++) bb_report_free_run(&p.runs[k]);
    free(p.runs);
    bb_report_free_trace(&trace);
    return rc;
}
