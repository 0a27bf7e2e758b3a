/* report_timeline.c — one step of a `train --trace` file as lanes of spans
 * (report_internal.h): a lane per worker and the reducer, so that the
 * reduce buckets' overlap with the backward shows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "report_internal.h"
#include "svg.h"

/* Kinds of work, coloured as the step-time chart of report.c has them:
 * kind i in the palette's colour i. */
static const char *const kinds[] = {"forward", "backward", "reduce", "optimizer", "load", "copy"};
enum { KINDS = sizeof kinds / sizeof *kinds };

static const char *part_colour(const char *name)
{
    for (int i = 0; i < KINDS; i++)
        if (!strncmp(name, kinds[i], strlen(kinds[i]))) return bb_svg_colour(i);
    return "#999999";
}

/* [*t0, *t1) of the step's spans. */
static void step_bounds(const bb_report_trace *t, double *t0, double *t1)
{
    *t0 = INFINITY, *t1 = -INFINITY;
    for (int i = 0; i < t->count; i++) {
        const bb_report_span *s = &t->spans[i];
        *t0 = s->ts_us < *t0 ? s->ts_us : *t0;
        *t1 = s->ts_us + s->dur_us > *t1 ? s->ts_us + s->dur_us : *t1;
    }
}

void bb_report_timeline(FILE *out, const bb_report_trace *t)
{
    if (t->all_spans == 0) {
        fprintf(out, "<p class=\"note\">");
        bb_svg_text(out, t->note[0] ? t->note : "The trace has no spans: no timeline.");
        fprintf(out, "</p>\n");
        return;
    }
    long long step = t->step;
    double t0, t1;
    step_bounds(t, &t0, &t1);
    if (t->count == 0) {
        fprintf(out, "<p class=\"note\">The trace has no spans of step %lld: no timeline.</p>\n", step);
        return;
    }
    int lanes = t->lanes > 0 ? t->lanes : 1;
    char title[96];
    snprintf(title, sizeof title, "Step %lld%s, one lane per thread", step, t->median ? " (the median step)" : "");
    bb_svg_chart c;
    /* y: lane k occupies [lanes - k - 1, lanes - k) so lane 0 is on top */
    bb_svg_chart_begin(&c, out, title, "milliseconds from the step's start", "", 0, (t1 - t0) / 1000, 0, lanes, 0);
    for (int i = 0; i < t->count; i++) {
        const bb_report_span *s = &t->spans[i];
        double y = lanes - s->lane - 1;
        char tip[128];
        snprintf(tip, sizeof tip, "%s: %s, %.2f ms", t->lane_name[s->lane][0] ? t->lane_name[s->lane] : "thread", s->name,
                 s->dur_us / 1000);
        bb_svg_rect(&c, (s->ts_us - t0) / 1000, (s->ts_us + s->dur_us - t0) / 1000, y + 0.08, y + 0.72,
                    part_colour(s->name), tip);
    }
    for (int k = 0; k < lanes; k++) {
        fprintf(out, "<text class=\"legend\" x=\"%d\" y=\"%.1f\">", BB_SVG_LEFT + 4, bb_svg_py(&c, lanes - k) + 14);
        bb_svg_text(out, t->lane_name[k][0] ? t->lane_name[k] : "thread");
        fprintf(out, "</text>\n");
    }
    bb_svg_legend(&c, kinds, KINDS, NULL);
    bb_svg_chart_end(&c);
    fprintf(out, "<p class=\"caption\">Reduce spans on the reducer's lane that sit under a worker's backward are "
                 "the overlap: the gradients of the layers already done are averaged while the earlier layers' "
                 "backward still runs.</p>\n");
}
