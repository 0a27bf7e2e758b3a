/* calibrate.h — what each op costs on a device kind, measured once and
 * cached, so that the planner predicts step times from counted work
 * rather than from a rule of thumb.
 *
 * How to use:
 *   bb_calibration cal;
 *   BB_TRY(bb_calibrate(&cfg, BB_DEVICE_CPU, &backend_options, &cal)); // runs a few micro-steps
 *   BB_TRY(bb_calibration_save(&cal, bb_calibration_path(BB_DEVICE_CPU, path, sizeof path)));
 *   ...later: if (bb_calibration_load(path, &cal) == BB_OK) q.calibration = &cal;
 *
 * A calibration runs the model's forward and backward (with selective
 * recompute, so that every op the policies use runs) and AdamW's step at
 * micro-batches 1, 2, 4 and 8 on the device, every op timed (backend.h's
 * op profile), and keeps for
 * each op its milliseconds per unit of work: per FLOP for the products and
 * attention, per element for the rest. The planner counts each
 * candidate's work per op on its counting backend and weighs it with these
 * rates (interpolated between the measured micro-batches on a log scale), so
 * recomputation, small matrices and element-wise ops cost what they cost
 * on that device. On a device kind whose memory is not the host's it also
 * measures the link to pinned host memory (what an offloaded block's
 * copies cost, plan.h). The rates belong to the device kind and, loosely, to the
 * model's width: recalibrate after a change of machine or model size.
 */
#ifndef BIGBATCH_CALIBRATE_H
#define BIGBATCH_CALIBRATE_H

#include "bigbatch/model.h"

#define BB_CALIBRATION_OPS 32
#define BB_CALIBRATION_POINTS 4

typedef struct bb_calibration_op {
    char op[32];            /* "linear_forward", ... */
    bool per_flop;          /* the rate's unit: FLOPs (products, attention) or elements */
    double ms_per_unit[BB_CALIBRATION_POINTS]; /* at each of micro_batch[] */
} bb_calibration_op;

typedef struct bb_calibration {
    char device[16];        /* bb_device_kind_name */
    char model[160];        /* bb_model_describe of what was measured */
    char precision[8];
    int threads;            /* the CPU backend's threads (0: all) */
    int points;             /* micro-batches measured, 2 to BB_CALIBRATION_POINTS, increasing */
    int micro_batch[BB_CALIBRATION_POINTS];
    int ops;
    bb_calibration_op op[BB_CALIBRATION_OPS];
    double link_gbps;       /* GB/s between the device and pinned host memory, the slower way; 0: not
                               measured (a CPU device, or a calibration from before) */
} bb_calibration;

/* Measures c (its shape; checkpointing is chosen here) on a backend of
 * kind `device` made with `bo`: micro-batches 1, 2, 4 and 8, two warm-up
 * micro-steps each, then as many timed as make the work of three at 8
 * (24 at 1); then, where the host is not the device, five copies of 64 MiB
 * each way between device and pinned host memory on the copy stream (the
 * fastest of each way, the slower way kept). Fails as bb_backend_create and
 * bb_model_create do. */
bb_status bb_calibrate(const bb_model_config *c, bb_device_kind device, const bb_backend_options *bo,
                       bb_calibration *out);
/* $BB_CACHE_DIR, else $XDG_CACHE_HOME/bigbatch, else ~/.cache/bigbatch,
 * then "calibration-<kind>.json"; returns buf. */
const char *bb_calibration_path(bb_device_kind device, char *buf, size_t cap);
/* Writes (creating the directory) or reads a calibration. Load fails with
 * BB_ERR_IO when there is none, BB_ERR_FORMAT naming the file and key on a
 * damaged one. */
bb_status bb_calibration_save(const bb_calibration *cal, const char *path);
bb_status bb_calibration_load(const char *path, bb_calibration *out);
/* The calibration cached for `device` (bb_calibration_path), when there is
 * a readable one: true and *out filled; false otherwise (no error kept). */
bool bb_calibration_cached(bb_device_kind device, bb_calibration *out);
/* Predicted milliseconds of the work `work[0..n)` (a counting backend's
 * op table) at micro-batch B. An op the calibration lacks is weighed at
 * the rate of one it has of the same unit (the products' for FLOPs, add's
 * for elements). */
double bb_calibration_ms(const bb_calibration *cal, const bb_op_time *work, int n, int micro_batch);

#endif /* BIGBATCH_CALIBRATE_H */
