/* cmd_report.c — `bigbatch report`: a training run's files as one HTML page. */
#include "bigbatch/report.h"
#include "commands.h"

static const char usage[] =
    "bigbatch report --metrics run.jsonl [--trace trace.json] [--plan plan.json] [--compare other.jsonl ...]\n"
    "                [--step N] --out report.html";
static const char summary[] =
    "Writes one self-contained HTML page (inline SVG and CSS: no script, nothing from the\n"
    "network; open it from the file, print it) from `train --metrics` (and `--trace`, `plan\n"
    "--json`): the run's configuration, loss and validation loss against steps and against\n"
    "tokens or samples seen, throughput, learning rate, gradient norm, where each step's time\n"
    "went (forward, backward, reduce, optimizer, data wait), the reduction's overlap, peak\n"
    "memory per device (against --device-mem, and the planner's breakdown with --plan), and\n"
    "with --trace one step's timeline, a lane per worker and the reducer. --compare overlays\n"
    "other runs (e.g. two splits of one global batch, or --zero 0 and 1). `train --report\n"
    "FILE` writes the same page when a run ends.";

int bb_cmd_report(int argc, char **argv)
{
    const char *metrics = NULL, *trace = NULL, *plan = NULL, *out = NULL;
    bb_str_list compare = {0};
    int64_t step = 0;
    const bb_opt opts[] = {
        {"--metrics", BB_OPT_STRING, &metrics, "FILE", "the run's `train --metrics` file", .required = true},
        {"--trace", BB_OPT_STRING, &trace, "FILE", "its `train --trace` file: one step's timeline"},
        {"--plan", BB_OPT_STRING, &plan, "FILE", "`plan --json` output: the planner's memory breakdown"},
        {"--compare", BB_OPT_LIST, &compare, "FILE...", "other runs' metrics, overlaid on the loss and speed plots"},
        {"--step", BB_OPT_INT, &step, "N", "the step the timeline shows; 0: the median step", .min = 0, .max = 1e15},
        {"--out", BB_OPT_STRING, &out, "FILE", "the HTML file to write", .required = true},
        {0}};
    bb_status rc = bb_cli_parse("report", opts, argc, argv, NULL);
    if (rc == BB_OK) {
        bb_report_options o = {.metrics = metrics, .trace = trace, .plan = plan,
                               .compare = (const char *const *)compare.items, .compare_count = (int)compare.count,
                               .trace_step = (int)step, .out = out, .interrupted = &bb_cli_interrupted};
        rc = bb_report_write(&o);
        if (rc == BB_OK) printf("report: wrote %s\n", out);
    }
    int code = bb_cli_report(rc, usage, summary, opts);
    bb_cli_free(opts, NULL);
    return code;
}
