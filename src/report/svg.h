/* svg.h — private: a small writer of inline SVG charts for report.c.
 *
 *   bb_svg_chart c;
 *   bb_svg_chart_begin(&c, out, "Loss", "step", "loss", x_min, x_max, y_min, y_max, 0);
 *   bb_svg_line(&c, xs, ys, n, 0, "loss", "run.jsonl");     // series 0's colour
 *   bb_svg_chart_end(&c);
 *
 * A chart is a 720 x 310 viewBox (it scales to the page's width) with
 * axes, "nice" ticks and their labels, the axis titles with their units,
 * and a grid. Colours come from a colour-blind-safe palette (Okabe–Ito) by
 * series index; series also differ in dash pattern, so they stay apart in
 * grey print. Points outside the ranges are clamped; NaN points break a
 * line. Nothing here fails: the writer prints to `out` and the caller
 * checks the stream once at the end. */
#ifndef BIGBATCH_REPORT_SVG_H
#define BIGBATCH_REPORT_SVG_H

#include <stdbool.h>
#include <stdio.h>

enum { BB_SVG_W = 720, BB_SVG_H = 310, BB_SVG_LEFT = 70, BB_SVG_RIGHT = 20, BB_SVG_TOP = 44, BB_SVG_BOTTOM = 45, BB_SVG_COLOURS = 8 };
/* bb_svg_chart_begin's flags */
enum { BB_SVG_LOG_Y = 1, BB_SVG_INTEGER_X = 2 /* ticks at whole numbers only (devices, lanes) */ };

typedef struct bb_svg_chart {
    FILE *out;
    double x0, x1, y0, y1; /* data ranges */
    bool log_y;            /* y on a log10 scale (y0 > 0) */
    bool integer_x;
} bb_svg_chart;

/* Okabe–Ito's colour i (mod BB_SVG_COLOURS) and a dash pattern for series i. */
const char *bb_svg_colour(int i);
const char *bb_svg_dash(int i);
/* Ranges are widened when empty; BB_SVG_LOG_Y needs y0 > 0 and a decade
 * or more (else linear);
 * an empty y_title draws no y ticks (lanes label themselves). */
void bb_svg_chart_begin(bb_svg_chart *c, FILE *out, const char *title, const char *x_title, const char *y_title, double x0,
                     double x1, double y0, double y1, int flags);
void bb_svg_chart_end(bb_svg_chart *c);
/* Data coordinates to the viewBox's. */
double bb_svg_px(const bb_svg_chart *c, double x);
double bb_svg_py(const bb_svg_chart *c, double y);
/* A polyline of series `series` (class "series-<cls>"), one point per
 * finite (x, y); NaN in y ends a segment and starts another element. */
void bb_svg_line(bb_svg_chart *c, const double *x, const double *y, int n, int series, const char *cls, const char *label);
/* Markers (circles) at finite points. */
void bb_svg_points(bb_svg_chart *c, const double *x, const double *y, int n, int series, const char *cls, const char *label);
/* A filled rectangle in data coordinates, with a tooltip. */
void bb_svg_rect(bb_svg_chart *c, double x0, double x1, double y0, double y1, const char *fill, const char *tip);
/* A horizontal line across the plot at y, labelled. */
void bb_svg_hline(bb_svg_chart *c, double y, const char *colour, const char *label);
/* A legend row under the title, right-aligned: entries[i] in series i's
 * colour, or in `colours` when given. */
void bb_svg_legend(bb_svg_chart *c, const char *const *entries, int n, const char *const *colours);
/* Text escaped for XML. */
void bb_svg_text(FILE *out, const char *s);

#endif
