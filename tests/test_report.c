/* test_report.c — `bigbatch report` and `train --report`: a real short run
 * rendered by headless Chromium (Debian's `chromium`, which `make deps`
 * installs; the test says *skipped* without it) and its PNG checked, the
 * HTML's self-containment, and bad inputs that give one-line errors or a
 * page that says what is missing. The screenshot is kept as
 * build/report-screenshot.png; with BB_REPORT_PAGE=FILE.html the test
 * screenshots and checks that page instead of its own run's (how `make
 * report-screenshot` makes the README's picture from the demo's report). */
#include <sys/stat.h>
#include <sys/wait.h>
#include <zlib.h>

#include "train_fixture.h"

TestSuite(report, .init = fixture_setup, .fini = fixture_teardown);

enum { SHOT_W = 1000, SHOT_H = 2600, STEPS = 7 };

/* ---- a PNG's pixels (8-bit RGB or RGBA, not interlaced: Chromium's) ------ */
static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; }

static int paeth(int a, int b, int c)
{
    int p = a + b - c, pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
    return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

/* Decodes `path` into *rgb (w*h*3 bytes); asserts on what it does not read. */
static void png_read(const char *path, int *w, int *h, uint8_t **rgb)
{
    size_t size;
    uint8_t *f = tu_read_file(path, &size), *idat = NULL;
    cr_assert(size > 33 && !memcmp(f, "\x89PNG\r\n\x1a\n", 8), "%s is not a PNG", path);
    size_t idat_len = 0, at = 8;
    int depth = 0, colour = -1, interlace = 0;
    while (at + 12 <= size) {
        uint32_t len = be32(f + at);
        const uint8_t *type = f + at + 4, *data = f + at + 8;
        cr_assert(at + 12 + len <= size, "%s: a chunk runs past the end", path);
        if (!memcmp(type, "IHDR", 4)) {
            *w = (int)be32(data), *h = (int)be32(data + 4);
            depth = data[8], colour = data[9], interlace = data[12];
        } else if (!memcmp(type, "IDAT", 4)) {
            idat = realloc(idat, idat_len + len);
            memcpy(idat + idat_len, data, len);
            idat_len += len;
        }
        at += 12 + len;
    }
    cr_assert(depth == 8 && (colour == 2 || colour == 6) && !interlace, "%s: depth %d colour %d interlace %d", path,
              depth, colour, interlace);
    int channels = colour == 6 ? 4 : 3;
    size_t stride = (size_t)*w * channels;
    uLongf raw_len = (uLongf)((stride + 1) * *h);
    uint8_t *raw = malloc(raw_len), *px = malloc(stride * *h);
    cr_assert_eq(uncompress(raw, &raw_len, idat, idat_len), Z_OK, "%s: IDAT does not inflate", path);
    for (int y = 0; y < *h; y++) {
        const uint8_t *in = raw + y * (stride + 1) + 1;
        uint8_t *row = px + y * stride, *up = y ? row - stride : NULL;
        int filter = in[-1];
        for (size_t i = 0; i < stride; i++) {
            int a = i >= (size_t)channels ? row[i - channels] : 0, b = up ? up[i] : 0,
                c = up && i >= (size_t)channels ? up[i - channels] : 0;
            int pred = filter == 1 ? a : filter == 2 ? b : filter == 3 ? (a + b) / 2 : filter == 4 ? paeth(a, b, c) : 0;
            row[i] = (uint8_t)(in[i] + pred);
        }
    }
    *rgb = malloc((size_t)*w * *h * 3);
    for (size_t p = 0; p < (size_t)*w * *h; p++) memcpy(*rgb + 3 * p, px + p * channels, 3);
    free(f), free(idat), free(raw), free(px);
}

/* Whether `program` is on PATH. */
static bool have(const char *program)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "command -v %s > /dev/null 2>&1", program);
    int rc = system(cmd);
    return rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0;
}

/* The number of points in the polyline of class `cls` (the first one). */
static int polyline_points(const char *html, const char *cls)
{
    char needle[64];
    snprintf(needle, sizeof needle, "class=\"series-%s\"", cls);
    const char *p = strstr(html, needle), *pts = p ? strstr(p, "points=\"") : NULL;
    if (!pts) return -1;
    int n = 0;
    for (pts += 8; *pts && *pts != '"'; pts++)
        if (*pts == ',') n++;
    return n;
}

/* A short real run: 2 devices, accumulation 2, an evaluation halfway. */
static void short_run(char *data, char *metrics, char *trace, char *report)
{
    char steps[8];
    snprintf(steps, sizeof steps, "%d", STEPS);
    tu_run r = tu_bigbatch("train", "--data", data, "--val-data", data, "--layers", "1", "--d-model", "16", "--heads",
                           "2", "--devices", "cpu:2", "--global-batch", "16", "--micro-batch", "4", "--steps", steps,
                           "--eval-every", "3", "--quiet", "--metrics", metrics, "--trace", trace, "--report", report);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
}

Test(report, a_real_run_renders_in_headless_chromium, .timeout = 120)
{
    char *data = make_tokens("tokens", 200), *metrics = tu_path(tmp, "m.jsonl"), *trace = tu_path(tmp, "t.json"),
         *html = tu_path(tmp, "report.html"), *shot = tu_path(tmp, "shot.png");
    short_run(data, metrics, trace, html);
    char *page = (char *)tu_read_file(html, NULL);
    /* self-contained: nothing fetched, no script */
    cr_assert_null(strstr(page, "<script"), "the page has a script");
    for (const char *p = page; (p = strstr(p, "http")); p++)
        cr_assert(strncmp(p, "http://", 7) && strncmp(p, "https://", 8), "a network reference: %.60s", p);
    cr_assert_eq(polyline_points(page, "loss"), STEPS, "the loss plot should have one point per step");
    cr_assert_not_null(strstr(page, "G = 16 = 2 devices x 2 micro-steps x 4"), "the header lacks the batch split");
    cr_assert_not_null(strstr(page, "Step "), "no timeline");
    cr_assert_not_null(strstr(page, "Gradient noise scale B_simple"), "no noise scale panel");
    cr_assert_gt(polyline_points(page, "noise"), 0, "the noise scale panel has no point");
    cr_assert_not_null(strstr(page, "the global batch"), "the noise scale panel lacks the batch in use");
    if (!have("chromium")) {
        free(page), free(data), free(metrics), free(trace), free(html), free(shot);
        fixture_skip("skipped: chromium is not installed (make deps installs it); the HTML checks passed");
    }
    const char *shown = getenv("BB_REPORT_PAGE") ? getenv("BB_REPORT_PAGE") : html;
    char *profile = tu_path(tmp, "chromium-profile"), cmd[13000];
    /* root needs --no-sandbox; containers often have a small /dev/shm */
    snprintf(cmd, sizeof cmd,
             "timeout 90 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars "
             "--user-data-dir='%s' --window-size=%d,%d --screenshot='%s' 'file://%s' > /dev/null 2>&1",
             profile, SHOT_W, SHOT_H, shot, shown);
    free(profile);
    int rc = system(cmd);
    cr_assert(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "chromium failed: %s", cmd);
    int w, h;
    uint8_t *rgb;
    png_read(shot, &w, &h, &rgb);
    cr_assert_eq(w, SHOT_W);
    cr_assert_eq(h, SHOT_H);
    /* not blank: the grey level varies (axes, text and lines on white) */
    double sum = 0, sq = 0, n = (double)w * h;
    size_t coloured = 0;
    for (size_t p = 0; p < (size_t)w * h; p++) {
        const uint8_t *c = rgb + 3 * p;
        double g = (c[0] + c[1] + c[2]) / 3.0;
        sum += g, sq += g * g;
        coloured += abs(c[0] - c[2]) > 60; /* the series' blue and vermilion */
    }
    double variance = sq / n - (sum / n) * (sum / n);
    cr_log_info("screenshot %dx%d: grey variance %.0f, %zu coloured pixels", w, h, variance, coloured);
    cr_assert_gt(variance, 100, "the screenshot looks blank (variance %.1f)", variance);
    cr_assert_gt(coloured, 2000, "no coloured plot lines in the screenshot");
    /* kept for the README (make report-screenshot copies it) */
    size_t png_size;
    uint8_t *png = tu_read_file(shot, &png_size);
    mkdir("build", 0755);
    tu_write_file("build/report-screenshot.png", png, png_size);
    free(png), free(rgb), free(page), free(data), free(metrics), free(trace), free(html), free(shot);
}

/* ---- bad input ---------------------------------------------------------- */
Test(report, bad_input_is_a_one_line_error_or_a_note_and_never_a_crash, .timeout = 120)
{
    char *data = make_tokens("tokens", 200), *metrics = tu_path(tmp, "m.jsonl"), *trace = tu_path(tmp, "t.json"),
         *html = tu_path(tmp, "r.html"), *out = tu_path(tmp, "out.html");
    short_run(data, metrics, trace, html);
    size_t size;
    char *m = (char *)tu_read_file(metrics, &size);
    /* a truncated last line (a run still writing): a page with a note */
    char *cut = tu_path(tmp, "cut.jsonl");
    tu_write_file(cut, m, size - 25);
    tu_run r = tu_bigbatch("report", "--metrics", cut, "--out", out);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char *page = (char *)tu_read_file(out, NULL);
    cr_assert_not_null(strstr(page, "is incomplete and was left out"), "no note about the cut line");
    cr_assert_eq(polyline_points(page, "loss"), STEPS - 1);
    free(page);
    tu_run_free(&r);
    /* a damaged line before the last: an error naming the line, no page */
    char *mid = tu_path(tmp, "mid.jsonl");
    char *second = strchr(m, '\n') + 1, *third = strchr(second, '\n') + 1;
    FILE *f = fopen(mid, "w");
    fwrite(m, 1, (size_t)(second - m), f);
    fwrite(second, 1, (size_t)(third - second) / 2, f);
    fputs("\n", f);
    fputs(third, f);
    fclose(f);
    unlink(out);
    r = tu_bigbatch("report", "--metrics", mid, "--out", out);
    tu_assert_error(&r, "mid.jsonl: line 2: not a metrics row");
    cr_assert(!tu_exists(out), "a page was written after an error");
    tu_run_free(&r);
    /* a file of another kind: bench --json output */
    char *bench = tu_path(tmp, "bench.jsonl");
    const char *line = "{\"model\": \"gpt\", \"step_ms\": 12.5, \"tokens_per_s\": 1000}\n";
    tu_write_file(bench, line, strlen(line));
    r = tu_bigbatch("report", "--metrics", bench, "--out", out);
    tu_assert_error(&r, "bench.jsonl: line 1: not a `bigbatch train --metrics` file");
    tu_run_free(&r);
    /* an empty trace: a page that says there is no timeline */
    char *empty = tu_path(tmp, "empty.json");
    tu_write_file(empty, "", 0);
    r = tu_bigbatch("report", "--metrics", metrics, "--trace", empty, "--out", out);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    page = (char *)tu_read_file(out, NULL);
    cr_assert_not_null(strstr(page, "is empty or not a Chrome trace: no timeline"), "no note about the empty trace");
    free(page);
    tu_run_free(&r);
    /* a plan --json: the memory panel names its choice, per-block plan and all, and the runners-up */
    char *plan = tu_path(tmp, "plan.json");
    const char *rows =
        "[{\"micro_batch\": 1, \"accumulation\": 8, \"checkpoint\": \"plan:n,f*3\", \"peak_bytes\": 18980000, "
        "\"relative_time\": 1.25, \"step_ms\": 812.5, \"fits\": true, \"chosen\": true, "
        "\"activations_bytes\": 5000000},\n"
        " {\"micro_batch\": 1, \"accumulation\": 8, \"checkpoint\": \"blocks\", \"peak_bytes\": 17000000, "
        "\"relative_time\": 1.35, \"step_ms\": 870.0, \"fits\": true, \"chosen\": false},\n"
        " {\"micro_batch\": 1, \"accumulation\": 8, \"checkpoint\": \"every:2\", \"peak_bytes\": 18874368, "
        "\"relative_time\": 1.26, \"step_ms\": 815.0, \"fits\": true, \"chosen\": false},\n"
        " {\"micro_batch\": 2, \"accumulation\": 4, \"checkpoint\": \"none\", \"peak_bytes\": 31000000, "
        "\"relative_time\": 1.1, \"step_ms\": null, \"fits\": false, \"chosen\": false}]\n";
    tu_write_file(plan, rows, strlen(rows));
    r = tu_bigbatch("report", "--metrics", metrics, "--plan", plan, "--out", out);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    page = (char *)tu_read_file(out, NULL);
    cr_assert_not_null(strstr(page, "checkpoint plan:n,f*3; predicted peak 18.1 MiB, relative time 1.25x (a step of "
                                    "812 ms predicted). Runners-up: micro-batch 1, every:2 (18.0 MiB, 1.26x); "
                                    "micro-batch 1, blocks (16.2 MiB, 1.35x)."),
                       "the memory panel's caption");
    free(page), free(plan);
    tu_run_free(&r);
    /* a plan that is not plan --json; a file that does not exist */
    r = tu_bigbatch("report", "--metrics", metrics, "--plan", metrics, "--out", out);
    tu_assert_error(&r, "not `bigbatch plan --json` output");
    tu_run_free(&r);
    r = tu_bigbatch("report", "--metrics", "/nonexistent/m.jsonl", "--out", out);
    tu_assert_error(&r, "/nonexistent/m.jsonl: cannot open");
    tu_run_free(&r);
    /* an older metrics file without the configuration line: a page, with a note */
    char *old = tu_path(tmp, "old.jsonl");
    tu_write_file(old, strchr(m, '\n') + 1, size - (size_t)(strchr(m, '\n') + 1 - m));
    r = tu_bigbatch("report", "--metrics", old, "--compare", metrics, "--out", out);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    page = (char *)tu_read_file(out, NULL);
    cr_assert_not_null(strstr(page, "No configuration line"));
    cr_assert_not_null(strstr(page, "series-compare"), "the compared run is not drawn");
    free(page);
    tu_run_free(&r);
    /* every step twice (two runs in one file): a page, a note and a warning saying so */
    char *twice = tu_path(tmp, "twice.jsonl");
    f = fopen(twice, "w");
    fwrite(m, 1, size, f);
    fwrite(second, 1, size - (size_t)(second - m), f); /* the step rows again */
    fclose(f);
    r = tu_bigbatch("report", "--metrics", twice, "--out", out);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "rows repeat or go back in steps"), "no warning: %s", r.err);
    page = (char *)tu_read_file(out, NULL);
    cr_assert_not_null(strstr(page, "rows repeat or go back in steps, the first at line"), "no note about the repeats");
    free(page);
    tu_run_free(&r);
    free(m), free(cut), free(mid), free(bench), free(empty), free(old), free(twice);
    free(data), free(metrics), free(trace), free(html), free(out);
}

/* A large trace (issue 29, item 7): read in time linear in its size, and
 * Ctrl-C or SIGTERM end the report promptly, with 130 and nothing written. */
Test(report, a_large_trace_reads_in_linear_time_and_sigterm_ends_it_with_130, .timeout = 120)
{
    char *data = make_tokens("tokens", 200), *metrics = tu_path(tmp, "m.jsonl"), *trace = tu_path(tmp, "t.json");
    char *out = tu_path(tmp, "big.html"), *o = tu_path(tmp, "o"), *e = tu_path(tmp, "e"), *first = tu_path(tmp, "r.html");
    short_run(data, metrics, trace, first);
    /* 300 000 spans over 3 000 steps (about 40 MB): the old reader's scan per step took minutes */
    FILE *f = fopen(trace, "w");
    fprintf(f, "{\"traceEvents\": [\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 0, \"args\": "
               "{\"name\": \"worker 0 (cpu:0)\"}}");
    for (int i = 0; i < 300000; i++)
        fprintf(f, ",\n{\"name\": \"%s\", \"ph\": \"X\", \"pid\": 1, \"tid\": 0, \"ts\": %d.5, \"dur\": %d.25, "
                   "\"args\": {\"step\": %d, \"micro_step\": %d}}", i % 2 ? "backward" : "forward", i * 10,
                8 + (i / 100) % 5, 1 + i / 100, i % 100);
    fprintf(f, "\n]}\n");
    fclose(f);
    double t0 = now_s();
    tu_run r = tu_bigbatch("report", "--metrics", metrics, "--trace", trace, "--out", out);
    double seconds = now_s() - t0;
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    cr_log_info("a 40 MB trace of 300000 spans reported in %.1f s (its speed: perf/trace_read_bench.sh)", seconds);
    unlink(out);
    char *const argv[] = {(char *)tu_bigbatch_bin(), "report", "--metrics", metrics, "--trace", trace, "--out", out,
                          NULL};
    pid_t pid = start_logged(argv, o, e);
    cr_assert(catches(pid, SIGTERM, 10), "report never installed its SIGTERM handler");
    usleep(50000); /* inside the first of its passes over the trace */
    kill(pid, SIGTERM);
    int code = exit_within(pid, 10);
    char *err = (char *)tu_read_file(e, NULL);
    cr_assert_eq(code, 130, "SIGTERM should end it with 130 (exit %d): %s", code, err);
    cr_assert_eq(access(out, F_OK), -1, "a page was written after SIGTERM");
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -q tmp", tmp);
    cr_assert_neq(system(cmd), 0, "a temporary file was left");
    free(err), free(first), free(e), free(o), free(out), free(trace), free(metrics), free(data);
}
