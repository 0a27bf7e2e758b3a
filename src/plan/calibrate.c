/* calibrate.c — per-op costs measured on a device kind, cached as JSON
 * (see calibrate.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bigbatch/calibrate.h"
#include "bigbatch/optim.h"

enum { WARMUP = 2, ROUNDS = 3, PROFILE_CAP = 64 };

static double units(const bb_op_time *t) { return t->flops > 0 ? t->flops : t->elements; }

/* One micro-batch: after WARMUP micro-steps, ROUNDS rounds of the same
 * work (one micro-step at the largest micro-batch, more at the smaller);
 * each op's rate is its fastest round's. A preempted or interrupted round
 * only adds time, so the minimum is what the op costs; a sum or a mean
 * would let one stall weigh a small op at many times its cost (and rank
 * the checkpoint policies by the machine's noise). */
static bb_status measure(const bb_model_config *c, bb_device_kind device, const bb_backend_options *bo, int B,
                         int slot, bb_calibration *out)
{
    bb_backend_options o = *bo;
    o.profile_ops = true;
    bb_backend_t *be = NULL;
    bb_model_t *m = NULL;
    bb_optimizer opt = {0};
    bb_status rc;
    double loss, lr;
    BB_TRY_GOTO(bb_backend_create(device, &o, &be), rc, done);
    BB_TRY_GOTO(bb_model_create(be, c, B, &m), rc, done);
    BB_TRY_GOTO(bb_model_init(m, 1), rc, done);
    BB_TRY_GOTO(bb_model_set_synthetic_batch(m), rc, done);
    bb_optimizer_config oc = bb_optimizer_defaults();
    BB_TRY_GOTO(bb_optimizer_create(be, &oc, m, NULL, &opt), rc, done);
    int per_round = (1 << (BB_CALIBRATION_POINTS - 1)) / B, steps = WARMUP + ROUNDS * per_round;
    for (int s = 0; s < steps; s++) { /* a micro-step and AdamW's step */
        BB_TRY_GOTO(bb_model_forward(m, 1.0f, &loss, NULL), rc, done);
        BB_TRY_GOTO(bb_model_backward(m, false), rc, done);
        double norm = bb_optimizer_sum_squares(be, m, &opt);
        bb_optimizer_apply(be, m, &opt, (uint64_t)s, (uint64_t)steps, norm, &lr);
        if (s < WARMUP - 1 || (s - WARMUP + 1) % per_round) continue;
        BB_TRY_GOTO(bb_backend_synchronize(be), rc, done);
        if (s >= WARMUP) { /* a round ended: its rates */
            bb_op_time t[PROFILE_CAP];
            int n = bb_backend_op_profile(be, t, PROFILE_CAP);
            for (int i = 0; i < n; i++) {
                if (units(&t[i]) <= 0) continue;
                int k = 0;
                while (k < out->ops && strcmp(out->op[k].op, t[i].op)) k++;
                if (k == out->ops) {
                    if (out->ops == BB_CALIBRATION_OPS) continue;
                    snprintf(out->op[out->ops++].op, sizeof out->op[0].op, "%s", t[i].op);
                }
                double rate = t[i].ms / units(&t[i]), *best = &out->op[k].ms_per_unit[slot];
                out->op[k].per_flop = t[i].flops > 0;
                if (!(*best > 0) || rate < *best) *best = rate;
            }
        }
        bb_backend_op_profile_reset(be); /* the next round's */
    }
done:
    if (be) bb_optimizer_destroy(be, &opt);
    bb_model_destroy(m);
    bb_backend_destroy(be);
    return rc;
}

/* The link between the device and pinned host memory: each way the fastest
 * of LINK_COPIES copies of LINK_BYTES on the copy stream, the slower way's
 * GB/s (calibrate.h). */
enum { LINK_COPIES = 5 };
#define LINK_BYTES ((size_t)64 << 20)

static bb_status measure_link(bb_device_kind device, const bb_backend_options *bo, double *gbps)
{
    bb_backend_t *be = NULL;
    void *dev = NULL, *host = NULL;
    double best[2] = {0, 0};
    bb_status rc;
    BB_TRY_GOTO(bb_backend_create(device, bo, &be), rc, done);
    BB_TRY_GOTO(bb_backend_alloc(be, LINK_BYTES, "link calibration", &dev), rc, done);
    BB_TRY_GOTO(bb_backend_host_alloc(be, LINK_BYTES, &host), rc, done);
    memset(host, 1, LINK_BYTES);
    for (int i = 0; i <= LINK_COPIES; i++) /* the first of each way warms up */
        for (int way = 0; way < 2; way++) {
            uint64_t t0 = bb_clock_ns();
            BB_TRY_GOTO(way ? bb_backend_copy_async(be, host, dev, LINK_BYTES, BB_COPY_D2H, BB_STREAM_COPY)
                            : bb_backend_copy_async(be, dev, host, LINK_BYTES, BB_COPY_H2D, BB_STREAM_COPY), rc, done);
            BB_TRY_GOTO(bb_backend_synchronize(be), rc, done);
            double s = (double)(bb_clock_ns() - t0) / 1e9, rate = s > 0 ? (double)LINK_BYTES / s / 1e9 : 0;
            if (i && rate > best[way]) best[way] = rate;
        }
    *gbps = best[0] < best[1] ? best[0] : best[1];
done:
    if (host) bb_backend_host_free(be, host, LINK_BYTES);
    if (dev) bb_backend_free(be, dev);
    bb_backend_destroy(be);
    return rc;
}

bb_status bb_calibrate(const bb_model_config *c, bb_device_kind device, const bb_backend_options *bo,
                       bb_calibration *out)
{
    memset(out, 0, sizeof *out);
    bb_model_config m = *c;
    /* selective recompute runs every op the policies use, once more */
    if (bb_model_parse_recompute("selective", &m) != BB_OK || bb_model_check_recompute(&m) != BB_OK) {
        bb_error_clear();
        bb_model_parse_recompute("none", &m);
    }
    snprintf(out->device, sizeof out->device, "%s", bb_device_kind_name(device));
    bb_model_describe(c, out->model, sizeof out->model);
    snprintf(out->precision, sizeof out->precision, "%s", bb_precision_name(c->precision));
    out->threads = bo->threads;
    out->points = BB_CALIBRATION_POINTS;
    for (int slot = 0; slot < out->points; slot++) {
        out->micro_batch[slot] = 1 << slot;
        BB_TRY(measure(&m, device, bo, out->micro_batch[slot], slot, out));
    }
    if (!bb_device_host_is_device(device)) BB_TRY(measure_link(device, bo, &out->link_gbps));
    for (int k = 0; k < out->ops; k++) { /* an op missed at a micro-batch: its rate at the nearest one measured */
        bb_calibration_op *op = &out->op[k];
        for (int slot = 0; slot < out->points; slot++)
            for (int d = 1; !(op->ms_per_unit[slot] > 0) && d < out->points; d++) {
                if (slot - d >= 0 && op->ms_per_unit[slot - d] > 0) op->ms_per_unit[slot] = op->ms_per_unit[slot - d];
                else if (slot + d < out->points && op->ms_per_unit[slot + d] > 0)
                    op->ms_per_unit[slot] = op->ms_per_unit[slot + d];
            }
    }
    return BB_OK;
}

const char *bb_calibration_path(bb_device_kind device, char *buf, size_t cap)
{
    const char *dir = getenv("BB_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char base[4096];
    if (dir && *dir) snprintf(base, sizeof base, "%s", dir);
    else if (xdg && *xdg) snprintf(base, sizeof base, "%s/bigbatch", xdg);
    else snprintf(base, sizeof base, "%s/.cache/bigbatch", home && *home ? home : ".");
    snprintf(buf, cap, "%s/calibration-%s.json", base, bb_device_kind_name(device));
    return buf;
}

bb_status bb_calibration_save(const bb_calibration *cal, const char *path)
{
    json_t *ops = json_object(), *sizes = json_array();
    for (int i = 0; sizes && i < cal->points; i++) json_array_append_new(sizes, json_integer(cal->micro_batch[i]));
    for (int k = 0; ops && k < cal->ops; k++) {
        json_t *rates = json_array();
        for (int i = 0; rates && i < cal->points; i++)
            json_array_append_new(rates, json_real(cal->op[k].ms_per_unit[i]));
        const char *unit = cal->op[k].per_flop ? "flop" : "element";
        json_object_set_new(ops, cal->op[k].op, json_pack("{s:s, s:o}", "unit", unit, "ms_per_unit", rates));
    }
    json_t *j = ops && sizes ? json_pack("{s:s, s:s, s:s, s:i, s:o, s:o, s:f}", "device", cal->device, "model",
                                         cal->model, "precision", cal->precision, "threads", cal->threads,
                                         "micro_batch", sizes, "ops", ops, "link_gb_per_s", cal->link_gbps)
                             : NULL;
    bb_status rc = j ? bb_make_parents(path, NULL) : bb_fail(BB_ERR_NOMEM, "%s: out of memory", path);
    if (rc == BB_OK) rc = bb_json_write_file(j, path);
    json_decref(j);
    return rc;
}

bb_status bb_calibration_load(const char *path, bb_calibration *out)
{
    memset(out, 0, sizeof *out);
    json_t *j;
    BB_TRY(bb_json_load_file(path, true, &j));
    bb_status rc = BB_OK;
    json_t *mb = json_object_get(j, "micro_batch"), *ops = json_object_get(j, "ops");
    BB_TRY_GOTO(bb_json_req_string(j, path, "device", out->device, sizeof out->device), rc, done);
    BB_TRY_GOTO(bb_json_req_string(j, path, "model", out->model, sizeof out->model), rc, done);
    BB_TRY_GOTO(bb_json_req_string(j, path, "precision", out->precision, sizeof out->precision), rc, done);
    BB_TRY_GOTO(bb_json_req_int(j, path, "threads", &out->threads), rc, done);
    size_t points = json_array_size(mb);
    if (!json_is_array(mb) || points < 2 || points > BB_CALIBRATION_POINTS || !json_is_object(ops)) {
        rc = bb_fail(BB_ERR_FORMAT, "%s: \"micro_batch\" must be 2 to %d sizes and \"ops\" an object", path,
                     BB_CALIBRATION_POINTS);
        goto done;
    }
    out->points = (int)points;
    for (int s = 0; s < out->points; s++) {
        out->micro_batch[s] = (int)json_integer_value(json_array_get(mb, (size_t)s));
        if (out->micro_batch[s] < 1 || (s && out->micro_batch[s] <= out->micro_batch[s - 1])) {
            rc = bb_fail(BB_ERR_FORMAT, "%s: \"micro_batch\" must be increasing sizes >= 1", path);
            goto done;
        }
    }
    const char *name;
    json_t *v;
    bool any = false; /* a rate above 0 */
    json_object_foreach(ops, name, v)
    {
        if (out->ops == BB_CALIBRATION_OPS) break;
        bb_calibration_op *op = &out->op[out->ops++];
        snprintf(op->op, sizeof op->op, "%s", name);
        json_t *rates = json_object_get(v, "ms_per_unit");
        const char *unit = json_string_value(json_object_get(v, "unit"));
        op->per_flop = unit && !strcmp(unit, "flop");
        bool good = unit && json_array_size(rates) == points;
        for (int s = 0; good && s < out->points; s++) {
            json_t *r = json_array_get(rates, (size_t)s);
            op->ms_per_unit[s] = json_is_number(r) ? json_number_value(r) : NAN;
            good = op->ms_per_unit[s] >= 0 && op->ms_per_unit[s] < 1e3; /* a second a unit: no device measured that */
            any = any || op->ms_per_unit[s] > 0;
        }
        if (!good) {
            rc = bb_fail(BB_ERR_FORMAT, "%s: \"ops\".\"%s\" needs a \"unit\" and a rate in [0, 1000) ms per unit "
                         "for each micro-batch", path, name);
            goto done;
        }
    }
    if (!any) rc = bb_fail(BB_ERR_FORMAT, "%s: every op's rate is 0: not a measurement", path);
    json_t *link = json_object_get(j, "link_gb_per_s"); /* absent from calibrations made before it */
    if (rc == BB_OK && link && (!json_is_number(link) || !(json_number_value(link) >= 0)))
        rc = bb_fail(BB_ERR_FORMAT, "%s: \"link_gb_per_s\" must be a number >= 0", path);
    else if (link) out->link_gbps = json_number_value(link);
done:
    json_decref(j);
    return rc;
}

bool bb_calibration_cached(bb_device_kind device, bb_calibration *out)
{
    char path[4200];
    bb_calibration_path(device, path, sizeof path);
    if (access(path, F_OK) != 0) return false; /* none made yet: the FLOP rule, without a word */
    if (bb_calibration_load(path, out) == BB_OK) return true;
    BB_WARN("%s; the planner uses the FLOP rule instead (`bigbatch plan --calibrate` measures the costs again)",
            bb_error_message());
    bb_error_clear();
    return false;
}

/* The rate of op k at micro-batch B: log-linear between the two measured
 * micro-batches around B, held constant outside them. */
static double rate_at(const bb_calibration *cal, const bb_calibration_op *op, int B)
{
    int n = cal->points;
    if (B <= cal->micro_batch[0]) return op->ms_per_unit[0];
    if (B >= cal->micro_batch[n - 1]) return op->ms_per_unit[n - 1];
    int i = 0;
    while (B > cal->micro_batch[i + 1]) i++;
    double lo = log(cal->micro_batch[i]), hi = log(cal->micro_batch[i + 1]), f = (log(B) - lo) / (hi - lo);
    return op->ms_per_unit[i] + f * (op->ms_per_unit[i + 1] - op->ms_per_unit[i]);
}

static const bb_calibration_op *find(const bb_calibration *cal, const char *name)
{
    for (int k = 0; k < cal->ops; k++)
        if (!strcmp(cal->op[k].op, name)) return &cal->op[k];
    return NULL;
}

double bb_calibration_ms(const bb_calibration *cal, const bb_op_time *work, int n, int micro_batch)
{
    double ms = 0;
    for (int i = 0; i < n; i++) {
        bool per_flop = work[i].flops > 0;
        const bb_calibration_op *op = find(cal, work[i].op);
        if (!op || op->per_flop != per_flop) op = find(cal, per_flop ? "linear_forward" : "add");
        if (op) ms += rate_at(cal, op, micro_batch) * (per_flop ? work[i].flops : work[i].elements);
    }
    return ms;
}
