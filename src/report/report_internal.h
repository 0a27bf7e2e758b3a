/* report_internal.h — private: what report_read.c makes of a run's files
 * and report.c draws. Each reader fails with a one-line error naming the
 * file (and line); what it can do without is noted in `notes` instead. */
#ifndef BIGBATCH_REPORT_INTERNAL_H
#define BIGBATCH_REPORT_INTERNAL_H

#include <signal.h>
#include <stdio.h>

#include "bigbatch/json.h"
#include "bigbatch/model.h"

enum { BB_REPORT_MAX_DEVICES = 64 };

typedef struct bb_report_row {
    double step, loss, lr, grad_norm, noise_scale, samples_per_s, tokens_per_s, data_wait_pct, overlap_pct;
    double fwd_ms, bwd_ms, reduce_ms, opt_ms, val_loss, val_accuracy; /* NaN: absent or null */
    double global_batch;     /* a batch ramp's step's batch; NaN: the run's (absent) */
    double seen;             /* examples seen by the end of the step (the batches summed); NaN: unknown */
    bool skipped;
} bb_report_row;

/* One run's metrics file. */
typedef struct bb_report_run {
    const char *path;
    bool has_config;                  /* the "run" line of train --metrics */
    char model[16], describe[160], devices[48], checkpoint[BB_RECOMPUTE_NAME_MAX], precision[8], optimizer[8], data[256];
    char version[16], commit[48];
    int device_count, processes, global_batch, accumulation, micro_batch, tokens_per_example, zero;
    int ramp_from, ramp_steps;        /* --global-batch ramp:B0..B1:STEPS: B0 and STEPS; 0: none */
    double lr, device_mem;
    uint64_t steps;
    bb_report_row *rows;
    int count;
    uint64_t peak[BB_REPORT_MAX_DEVICES]; /* per device, the largest over the rows */
    int peak_devices;
    char notes[512];                  /* what was missing or skipped, for the page */
} bb_report_run;

/* One span of a trace ("X" events); lanes are the trace's threads. */
typedef struct bb_report_span {
    double ts_us, dur_us;
    int lane;
    long long step;
    char name[32];
} bb_report_span;

typedef struct bb_report_trace {
    char lane_name[BB_REPORT_MAX_DEVICES + 1][48];
    int lanes;
    bb_report_span *spans;            /* those of step `step` only */
    int count;
    long long step;                   /* the step shown: asked for, or the median one (`median`) */
    bool median;
    int all_spans;                    /* the trace's, of every step */
    char note[256];                   /* why there is no timeline, when there is none */
} bb_report_trace;

/* The planner's chosen row (`plan --json`). */
typedef struct bb_report_choice {
    int micro_batch, accumulation;
    char checkpoint[BB_RECOMPUTE_NAME_MAX];
    uint64_t peak_bytes;
    double relative_time, step_ms; /* step_ms: NAN when not calibrated */
} bb_report_choice;

typedef struct bb_report_plan {
    bool present;
    bb_report_choice chosen, runner_up[2]; /* the next fastest candidates that fit */
    int runners_up;
    uint64_t parameters, gradients, optimizer, batches, activations, workspace;
} bb_report_plan;

bb_status bb_report_read_run(const char *path, bb_report_run *run);
void bb_report_free_run(bb_report_run *run);
/* The spans of step `step` (0: the median step by duration), streamed
 * from the file twice in bounded memory. An empty or span-less trace is
 * not an error: trace->note says so. Fails with BB_ERR_FORMAT naming the
 * file and the byte where it is not JSON. */
bb_status bb_report_read_trace(const char *path, int step, volatile sig_atomic_t *interrupted,
                               bb_report_trace *trace);
void bb_report_free_trace(bb_report_trace *trace);
bb_status bb_report_read_plan(const char *path, bb_report_plan *plan);
/* The trace's step as lanes of spans, a lane per trace thread, or a note
 * saying why there is none. */
void bb_report_timeline(FILE *out, const bb_report_trace *trace);

#endif
