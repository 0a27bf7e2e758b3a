/* report.h — one self-contained HTML page from a training run's files.
 *
 *   bb_report_options o = {.metrics = "run.jsonl", .trace = "trace.json", .out = "report.html"};
 *   if (bb_report_write(&o) != BB_OK) fprintf(stderr, "%s\n", bb_error_message());
 *
 * The page has inline SVG and CSS only (no script, no font or file from
 * the network; it opens from a file on a machine with no internet):
 * the run's configuration (from the metrics file's first line, which
 * `train --metrics` writes), loss and validation loss (accuracy for the
 * mlp) against step and against tokens or samples seen, throughput,
 * learning rate, gradient norm, where each step's time went (forward,
 * backward, reduce, optimizer, data wait, stacked), the reduction's
 * overlap, peak memory per device against --device-mem and, with a plan
 * (`plan --json`), the planner's breakdown; with a trace (`train --trace`)
 * one step's timeline, a lane per worker and the reducer. Runs given as
 * `compare` are overlaid on the loss and throughput plots.
 *
 * What is missing or damaged is said on the page (an empty trace, a
 * metrics file of an older bigbatch without its configuration line, a
 * truncated last line — the run may still be writing); what makes a page
 * impossible is an error. */
#ifndef BIGBATCH_REPORT_H
#define BIGBATCH_REPORT_H

#include <signal.h>

#include "bigbatch/core.h"

typedef struct bb_report_options {
    const char *metrics;              /* required: `train --metrics` JSON Lines */
    const char *trace;                /* optional: `train --trace` Chrome trace JSON */
    const char *plan;                 /* optional: `plan --json` output */
    const char *const *compare;       /* optional: other runs' metrics, overlaid */
    int compare_count;
    int trace_step;                   /* the step the timeline shows; 0: the median step */
    const char *out;                  /* the HTML file, written atomically (tmp + rename) */
    const char *out_name;             /* how messages name `out`; NULL: "--out" */
    volatile sig_atomic_t *interrupted; /* set (Ctrl-C, SIGTERM): stop, write nothing; NULL: none */
} bb_report_options;

/* Writes the page. Fails with BB_ERR_IO naming a file that cannot be read
 * or written, BB_ERR_FORMAT with "FILE: line N: ..." for a metrics file
 * that is not one (bench or plan output, a damaged line before the last,
 * no step at all) or a plan that is not `plan --json` output, BB_ERR_ARG
 * without metrics or out, or when `out` exists and is not a regular file or
 * is one of the inputs (bb_check_output), BB_ERR_INTERRUPTED once
 * *interrupted is set. Nothing is left at `out` on failure. */
bb_status bb_report_write(const bb_report_options *o);

#endif
