/* svg.c — the chart writer of svg.h. */
#include <math.h>
#include <string.h>

#include "svg.h"

/* Okabe & Ito (2008), "Color Universal Design": told apart by readers with
 * every common colour-vision deficiency. Black last. */
static const char *const palette[BB_SVG_COLOURS] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                                    "#E69F00", "#56B4E9", "#F0E442", "#000000"};
static const char *const dashes[4] = {"", "6 3", "2 2", "8 3 2 3"};

const char *bb_svg_colour(int i) { return palette[(i % BB_SVG_COLOURS + BB_SVG_COLOURS) % BB_SVG_COLOURS]; }
const char *bb_svg_dash(int i) { return dashes[(i % 4 + 4) % 4]; }

void bb_svg_text(FILE *out, const char *s)
{
    for (; s && *s; s++) switch (*s) {
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '&': fputs("&amp;", out); break;
        case '"': fputs("&quot;", out); break;
        default: fputc(*s, out);
        }
}

static double plot_w(void) { return BB_SVG_W - BB_SVG_LEFT - BB_SVG_RIGHT; }
static double plot_h(void) { return BB_SVG_H - BB_SVG_TOP - BB_SVG_BOTTOM; }

double bb_svg_px(const bb_svg_chart *c, double x)
{
    double f = (x - c->x0) / (c->x1 - c->x0);
    f = f < 0 ? 0 : f > 1 ? 1 : f;
    return BB_SVG_LEFT + f * plot_w();
}

double bb_svg_py(const bb_svg_chart *c, double y)
{
    double f = c->log_y ? (log10(y > 0 ? y : c->y0) - log10(c->y0)) / (log10(c->y1) - log10(c->y0))
                        : (y - c->y0) / (c->y1 - c->y0);
    f = f < 0 ? 0 : f > 1 ? 1 : f;
    return BB_SVG_TOP + (1 - f) * plot_h();
}

/* A tick step of 1, 2 or 5 x 10^k giving about `want` ticks over span. */
static double nice_step(double span, int want)
{
    double raw = span / want, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

/* A tick label: short, without trailing zeros; k/M/G for big values. */
static void tick_label(double v, double step, char *buf, size_t cap)
{
    double a = fabs(v);
    const char *unit = "";
    if (a >= 1e9 && step >= 1e8) v /= 1e9, step /= 1e9, unit = "G";
    else if (a >= 1e6 && step >= 1e5) v /= 1e6, step /= 1e6, unit = "M";
    else if (a >= 1e4 && step >= 1e3) v /= 1e3, step /= 1e3, unit = "k";
    int decimals = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    snprintf(buf, cap, "%.*f%s", decimals > 6 ? 6 : decimals, v, unit);
}

static void widen(double *lo, double *hi)
{
    if (!isfinite(*lo) || !isfinite(*hi)) *lo = 0, *hi = 1;
    if (*hi <= *lo) {
        double pad = *lo != 0 ? fabs(*lo) * 0.05 : 0.5;
        *lo -= pad, *hi += pad;
    }
}

void bb_svg_chart_begin(bb_svg_chart *c, FILE *out, const char *title, const char *x_title, const char *y_title,
                        double x0, double x1, double y0, double y1, int flags)
{
    widen(&x0, &x1);
    widen(&y0, &y1);
    /* a log scale within less than a decade would have no 1-2-5 ticks */
    *c = (bb_svg_chart){out, x0, x1, y0, y1, (flags & BB_SVG_LOG_Y) && y0 > 0 && y1 / y0 >= 10,
                        (flags & BB_SVG_INTEGER_X) != 0};
    fprintf(out, "<svg class=\"chart\" viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"", BB_SVG_W, BB_SVG_H);
    bb_svg_text(out, title);
    fprintf(out, "\">\n<text class=\"title\" x=\"%d\" y=\"18\">", BB_SVG_LEFT);
    bb_svg_text(out, title);
    fprintf(out, "</text>\n");
    /* grid and ticks */
    char label[32];
    double step = nice_step(x1 - x0, 6);
    if (c->integer_x && step < 1) step = 1;
    for (double v = ceil(x0 / step) * step; v <= x1 + step * 1e-9; v += step) {
        double px = bb_svg_px(c, v);
        tick_label(fabs(v) < step * 1e-6 ? 0 : v, step, label, sizeof label);
        fprintf(out, "<line class=\"grid\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%.1f\"/>", px, BB_SVG_TOP, px,
                BB_SVG_TOP + plot_h());
        fprintf(out, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", px,
                BB_SVG_TOP + plot_h() + 16, label);
    }
    if (c->log_y) {
        for (double d = floor(log10(y0)); d <= ceil(log10(y1)); d++)
            for (int m = 0; m < 3; m++) { /* 1, 2, 5 per decade */
                double v = (m == 0 ? 1 : m == 1 ? 2 : 5) * pow(10, d);
                if (v < y0 * (1 - 1e-9) || v > y1 * (1 + 1e-9)) continue;
                double py = bb_svg_py(c, v);
                tick_label(v, v / 10, label, sizeof label);
                fprintf(out, "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", BB_SVG_LEFT, py,
                        BB_SVG_LEFT + plot_w(), py);
                fprintf(out, "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                        BB_SVG_LEFT - 6, py + 4, label);
            }
    } else if (*y_title) {
        step = nice_step(y1 - y0, 5);
        for (double v = ceil(y0 / step) * step; v <= y1 + step * 1e-9; v += step) {
            double py = bb_svg_py(c, v);
            tick_label(fabs(v) < step * 1e-6 ? 0 : v, step, label, sizeof label);
            fprintf(out, "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", BB_SVG_LEFT, py,
                    BB_SVG_LEFT + plot_w(), py);
            fprintf(out, "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", BB_SVG_LEFT - 6,
                    py + 4, label);
        }
    }
    fprintf(out, "<rect class=\"frame\" x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\"/>\n", BB_SVG_LEFT, BB_SVG_TOP,
            plot_w(), plot_h());
    fprintf(out, "<text class=\"axis\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">", BB_SVG_LEFT + plot_w() / 2,
            BB_SVG_H - 6);
    bb_svg_text(out, x_title);
    fprintf(out, "</text>\n<text class=\"axis\" transform=\"translate(14 %.1f) rotate(-90)\" text-anchor=\"middle\">",
            BB_SVG_TOP + plot_h() / 2);
    bb_svg_text(out, y_title);
    fprintf(out, "%s</text>\n", c->log_y ? " (log scale)" : "");
}

void bb_svg_chart_end(bb_svg_chart *c) { fprintf(c->out, "</svg>\n"); }

static void series_attrs(bb_svg_chart *c, int series, const char *cls)
{
    fprintf(c->out, " class=\"series-%s\" stroke=\"%s\"", cls, bb_svg_colour(series));
    if (*bb_svg_dash(series)) fprintf(c->out, " stroke-dasharray=\"%s\"", bb_svg_dash(series));
}

void bb_svg_line(bb_svg_chart *c, const double *x, const double *y, int n, int series, const char *cls,
                 const char *label)
{
    bool open = false;
    for (int i = 0; i <= n; i++) {
        bool ok = i < n && isfinite(x[i]) && isfinite(y[i]) && (!c->log_y || y[i] > 0);
        if (!ok && open) { /* the segment ends */
            fprintf(c->out, "\"><title>");
            bb_svg_text(c->out, label);
            fprintf(c->out, "</title></polyline>\n");
            open = false;
        }
        if (!ok) continue;
        if (!open) {
            fprintf(c->out, "<polyline fill=\"none\" stroke-width=\"1.8\"");
            series_attrs(c, series, cls);
            fprintf(c->out, " points=\"");
            open = true;
        }
        fprintf(c->out, "%.1f,%.1f ", bb_svg_px(c, x[i]), bb_svg_py(c, y[i]));
    }
}

void bb_svg_points(bb_svg_chart *c, const double *x, const double *y, int n, int series, const char *cls,
                   const char *label)
{
    for (int i = 0; i < n; i++) {
        if (!isfinite(x[i]) || !isfinite(y[i])) continue;
        fprintf(c->out, "<circle r=\"4\" fill=\"%s\" cx=\"%.1f\" cy=\"%.1f\" class=\"series-%s\"><title>",
                bb_svg_colour(series), bb_svg_px(c, x[i]), bb_svg_py(c, y[i]), cls);
        bb_svg_text(c->out, label);
        fprintf(c->out, " %g</title></circle>\n", y[i]);
    }
}

void bb_svg_rect(bb_svg_chart *c, double x0, double x1, double y0, double y1, const char *fill, const char *tip)
{
    double a = bb_svg_px(c, x0), b = bb_svg_px(c, x1), top = bb_svg_py(c, y1), bottom = bb_svg_py(c, y0);
    fprintf(c->out, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"><title>", a, top,
            b - a > 0.3 ? b - a : 0.3, bottom - top, fill);
    bb_svg_text(c->out, tip);
    fprintf(c->out, "</title></rect>\n");
}

void bb_svg_hline(bb_svg_chart *c, double y, const char *colour, const char *label)
{
    double py = bb_svg_py(c, y);
    fprintf(c->out, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-dasharray=\"6 3\"/>",
            BB_SVG_LEFT, py, BB_SVG_LEFT + plot_w(), py, colour);
    fprintf(c->out, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">", BB_SVG_LEFT + plot_w() - 4,
            py - 4);
    bb_svg_text(c->out, label);
    fprintf(c->out, "</text>\n");
}

void bb_svg_legend(bb_svg_chart *c, const char *const *entries, int n, const char *const *colours)
{
    double x = BB_SVG_W - BB_SVG_RIGHT;
    for (int i = n - 1; i >= 0; i--) { /* right-aligned, last entry rightmost */
        double w = 14 + 6.2 * (double)strlen(entries[i]);
        x -= w + 12;
        const char *col = colours ? colours[i] : bb_svg_colour(i);
        fprintf(c->out, "<rect x=\"%.1f\" y=\"26\" width=\"10\" height=\"10\" fill=\"%s\"/>", x, col);
        fprintf(c->out, "<text class=\"legend\" x=\"%.1f\" y=\"35\">", x + 14);
        bb_svg_text(c->out, entries[i]);
        fprintf(c->out, "</text>\n");
    }
}
