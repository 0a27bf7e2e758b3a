/* step_end.c — the end of a step, on worker 0 while the others wait: the
 * step's figures (progress line, metrics row), evaluation, checkpoint and
 * the decision to stop. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bigbatch/world.h"
#include "trainer.h"

typedef struct step_figures {
    double loss, lr, grad_norm, noise_scale, seconds, samples_per_s, tokens_per_s, data_wait_pct, overlap_pct;
    int batch; /* the step's global batch (a ramp's or auto's moves) */
    double fwd_ms, bwd_ms, reduce_ms, opt_ms;
    bool has_overlap;
} step_figures;

static step_figures measure(trainer *t, uint64_t step0, uint64_t now)
{
    const worker_stats *s0 = &t->replicas[0].stats;
    /* the loss: the mean of the devices' equal shares, through the reducer (worker.c) */
    step_figures f = {.loss = t->step_loss, .lr = s0->lr, .grad_norm = s0->grad_norm};
    uint64_t last_backward = 0;
    double wait = 0;
    int D = t->spec.count;
    for (int d = 0; d < D; d++) { /* this process's timings */
        const worker_stats *s = &t->replicas[d].stats;
        wait += (double)s->wait_ns / D;
        f.fwd_ms += (double)s->fwd_ns / 1e6 / D;
        f.bwd_ms += (double)s->bwd_ns / 1e6 / D;
        f.opt_ms += (double)s->opt_ns / 1e6 / D;
        if (s->backward_end_ns > last_backward) last_backward = s->backward_end_ns;
    }
    f.seconds = (double)(now - t->last_step_end_ns) / 1e9;
    f.batch = trainer_batch_at(t, step0);
    f.samples_per_s = f.batch / f.seconds;
    f.tokens_per_s = bb_model_targets_are_tokens(&t->cfg) ? f.samples_per_s * bb_model_targets_per_example(&t->cfg) : 0;
    f.data_wait_pct = 100.0 * wait / 1e9 / f.seconds;
    if (t->reducer) {
        uint64_t busy, overlapped;
        bb_reducer_last_step(t->reducer, last_backward, &busy, &overlapped);
        f.reduce_ms = (double)busy / 1e6;
        f.overlap_pct = busy ? 100.0 * (double)overlapped / (double)busy : 0;
        f.has_overlap = true;
    }
    return f;
}

/* One metrics row: null where a figure does not apply (tokens for mlp,
 * overlap on one device) or is not finite. */
static bb_status write_metrics(trainer *t, uint64_t step, const step_figures *f, const bb_eval_result *ev,
                               bool skipped)
{
    json_t *peaks = json_array();
    for (int d = 0; d < t->spec.count; d++)
        json_array_append_new(peaks, json_integer((json_int_t)bb_backend_peak_bytes(t->replicas[d].be)));
    json_t *row = json_pack("{s:I, s:o, s:o, s:o, s:o, s:o}", "step", (json_int_t)step, "loss",
                            bb_json_real(f->loss, 7), "lr", bb_json_real(f->lr, 7), "grad_norm",
                            bb_json_real(f->grad_norm, 7), "noise_scale", bb_json_real(f->noise_scale, 6),
                            "samples_per_s",
                            bb_json_fixed(f->samples_per_s, 1));
    if (row && skipped) json_object_set_new(row, "skipped", json_true());
    if (row && t->ramp_accumulation) json_object_set_new(row, "global_batch", json_integer(f->batch));
    int fail = !row || json_object_update_new(row, json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
        "tokens_per_s", bb_model_targets_are_tokens(&t->cfg) ? bb_json_fixed(f->tokens_per_s, 1) : json_null(),
        "data_wait_pct", bb_json_fixed(f->data_wait_pct, 3),
        "overlap_pct", f->has_overlap ? bb_json_fixed(f->overlap_pct, 2) : json_null(),
        "fwd_ms", bb_json_fixed(f->fwd_ms, 3), "bwd_ms", bb_json_fixed(f->bwd_ms, 3),
        "reduce_ms", bb_json_fixed(f->reduce_ms, 3), "opt_ms", bb_json_fixed(f->opt_ms, 3), "peak_mem_bytes", peaks));
    if (!fail && ev) fail = json_object_set_new(row, "val_loss", bb_json_real(ev->loss, 7));
    if (!fail && ev && !isnan(ev->bits_per_byte))
        fail = json_object_set_new(row, "val_bits_per_byte", bb_json_real(ev->bits_per_byte, 7));
    if (!fail && ev && !isnan(ev->accuracy))
        fail = json_object_set_new(row, "val_accuracy", bb_json_fixed(ev->accuracy, 6));
    bb_status rc = fail ? bb_fail(BB_ERR_NOMEM, "out of memory") : bb_json_write_line(t->metrics, row);
    json_decref(row);
    if (rc == BB_OK && (fflush(t->metrics) != 0 || ferror(t->metrics))) rc = BB_ERR_IO;
    if (rc == BB_ERR_IO)
        return bb_fail_errno(BB_ERR_IO, "%s %s: write failed", bb_train_option_name(t->o, BB_TRAIN_METRICS),
                             t->o->metrics_path);
    return rc;
}

/* "1.234", "NaN", "inf" or "-inf" (printf's "-nan" says nothing more). */
static const char *number_text(char *buf, size_t cap, double v)
{
    if (isnan(v)) snprintf(buf, cap, "NaN");
    else snprintf(buf, cap, "%.4g", v);
    return buf;
}

static void format_duration(double s, char *buf, size_t cap)
{
    long long n = s < 9.2e18 ? (long long)s : (long long)9.2e18;
    if (s < 60) snprintf(buf, cap, "%.0fs", s);
    else if (s < 3600) snprintf(buf, cap, "%lldm%02llds", n / 60, n % 60);
    else if (s < 86400) snprintf(buf, cap, "%lldh%02lldm", n / 3600, n / 60 % 60);
    else snprintf(buf, cap, "%lldd%02lldh", n / 86400, n / 3600 % 24);
}

static void progress_line(trainer *t, uint64_t step, const step_figures *f, uint64_t now)
{
    FILE *p = t->o->progress;
    char rate[48], eta[32], peak[24];
    if (bb_model_targets_are_tokens(&t->cfg)) snprintf(rate, sizeof rate, "%.0f tok/s", f->tokens_per_s);
    else snprintf(rate, sizeof rate, "%.0f samples/s", f->samples_per_s);
    double per_step = (double)(now - t->run_start_ns) / 1e9 / (double)(step - t->first_step);
    /* to the end of this run: --stop-after ends it early */
    uint64_t end = t->o->stop_after && t->o->stop_after < t->total_steps ? t->o->stop_after : t->total_steps;
    format_duration(per_step * (double)(end - step), eta, sizeof eta);
    fprintf(p, "%sstep %llu/%llu  loss %.4f  lr %.2e  %s  data-wait %.1f%%", t->tty ? "\r\033[K" : "",
            (unsigned long long)step, (unsigned long long)t->total_steps, f->loss, f->lr, rate, f->data_wait_pct);
    if (t->skipped) fprintf(p, "  skipped %llu", (unsigned long long)t->skipped);
    if (isfinite(f->noise_scale)) fprintf(p, "  noise %.3g", f->noise_scale);
    if (t->ramp_accumulation) fprintf(p, "  batch %d", f->batch);
    if (f->has_overlap) fprintf(p, "  overlap %.0f%%", f->overlap_pct);
    fprintf(p, "  peak");
    for (int d = 0; d < t->spec.count; d++)
        fprintf(p, "%s%s", d ? "," : " ", bb_format_bytes(bb_backend_peak_bytes(t->replicas[d].be), peak, sizeof peak));
    fprintf(p, "  ETA %s%s", eta, t->tty ? "" : "\n");
    fflush(p);
}

/* The stop asked of this process (Ctrl-C, a preemption), agreed over the
 * processes: the largest request of any rank, so that a signal that
 * reached one rank only still stops every rank at the same step, with one
 * checkpoint. One small collective per step (and after an evaluation). */
static bb_status agree_stop(trainer *t, int *request)
{
    const bb_train_options *o = t->o;
    *request = o->interrupted ? (int)*o->interrupted : BB_STOP_NONE;
    return t->spec.world > 1 ? bb_world_max_int(request) : BB_OK;
}

bb_status bb_trainer_whole_weights(trainer *t, float **out)
{
    size_t n = bb_model_param_count(t->replicas[0].model);
    float *host = *out = calloc(n, sizeof *host); /* zero where another process holds the shard */
    if (!host) return bb_fail(BB_ERR_NOMEM, "out of memory for the %zu weights (ZeRO-3 gathers them to save)", n);
    bb_status rc = BB_OK;
    for (int d = 0; rc == BB_OK && d < t->spec.count; d++)
        rc = bb_optimizer_get_params(t->replicas[d].be, &t->replicas[d].opt, host);
    if (rc == BB_OK && t->spec.world > 1) rc = bb_world_sum_floats(host, n);
    if (rc != BB_OK) {
        free(host);
        *out = NULL;
    }
    return rc;
}

/* ZeRO-3's evaluation: a bucket of weights from the whole weights on the host. */
typedef struct host_source {
    bb_backend_t *be;
    const float *weights;
} host_source;

static bb_status from_host(void *ctx, bb_gather_phase phase, int bucket, size_t lo, size_t n, float *slot)
{
    const host_source *h = ctx;
    (void)bucket;
    return phase == BB_GATHER_WAIT ? BB_OK : bb_backend_copy(h->be, slot, h->weights + lo, n * sizeof *slot, BB_COPY_H2D);
}

/* bb_evaluate on replica 0; under ZeRO-3 its window reads `weights`, the
 * whole weights gathered on the host (the other replicas wait at the
 * barrier: no gather can run), then the shards again. */
static bb_status evaluate(trainer *t, const float *weights, const bb_eval_options *eo, bb_eval_result *ev)
{
    replica *r = &t->replicas[0];
    if (!weights) return bb_evaluate(r->model, t->val, eo, ev);
    host_source src = {r->be, weights};
    bb_model_set_param_window_hook(r->model, from_host, &src);
    bb_status rc = bb_evaluate(r->model, t->val, eo, ev);
    bb_trainer_window_from_shards(r);
    return rc;
}

/* Whether the end of step `step` (1-based) saves: a saving run's last
 * step, one asked to stop, and every save_every; the same on every rank. */
static bool saves_at(const trainer *t, uint64_t step, int request)
{
    const bb_train_options *o = t->o;
    bool last = step == t->total_steps || step == o->stop_after;
    return t->saves && (last || request || (o->save_every && step % o->save_every == 0));
}

static bb_status save(trainer *t, uint64_t step, double loss)
{
    checkpoint_state st = {.step = step, .epoch = step / t->steps_per_epoch, .step_in_epoch = step % t->steps_per_epoch,
                           .seed = t->seed, .total_steps = t->total_steps, .global_batch = t->global_batch,
                           .ramp_from = trainer_ramp_from(t),
                           .ramp_steps = t->ramp_steps, .auto_batch = t->auto_batch,
                           .auto_chunks = t->auto_chunks, .auto_accumulation = t->auto_accumulation,
                           .micro_batch = t->micro_batch,
                           .shuffle_frames = t->shuffle_frames, .order = t->order,
                           .loss = loss, .noise = t->noise, .data = t->o->data,
                           .val_data = t->o->val_data, .data_url = t->o->data_url,
                           .val_data_url = t->o->val_data_url, .devices = t->devices_text, .keep = t->o->keep,
                           .data_identity = t->data_identity, .tokenizer = t->tokenizer,
                           .save_every = t->o->save_every};
    if (t->ramp_accumulation) { /* a ramp: where the data stands, in the loader's chunks */
        uint64_t chunks = bb_trainer_chunks_before(t, step);
        st.epoch = chunks / t->chunks_per_epoch, st.step_in_epoch = chunks % t->chunks_per_epoch;
    }
    uint64_t t0 = bb_clock_ns();
    char name[64];
    /* the optimizer state: replica 0's, or with ZeRO-1 every replica's shard
     * (over processes: every process's, the others contributing theirs) */
    bb_backend_t *be[BB_TRAIN_MAX_DEVICES];
    const bb_optimizer *opt[BB_TRAIN_MAX_DEVICES];
    int n = t->zero ? t->spec.count : 1;
    for (int d = 0; d < n; d++) be[d] = t->replicas[d].be, opt[d] = &t->replicas[d].opt;
    bb_state_gather gather = bb_reducer_state_gather();
    st.gather = t->gather_saves ? &gather : NULL;
    /* rank 0 writes; the other ranks contribute their shards (ZeRO-1) or nothing */
    /* ZeRO-3: the model's weights from the shards (every rank joins) */
    float *weights = NULL;
    if (t->zero == 3) BB_TRY(bb_trainer_whole_weights(t, &weights));
    bb_model_lend_host_weights(t->replicas[0].model, weights);
    bb_status rc = t->o->save_dir ? bb_checkpoint_save(t->o->save_dir, &st, t->replicas[0].model, be, opt, n,
                                                       t->o->keep, name, sizeof name)
                   : t->gather_saves ? bb_optimizer_save(be, opt, n, bb_model_param_count(t->replicas[0].model),
                                                         &gather, NULL)
                                     : BB_OK;
    bb_model_lend_host_weights(t->replicas[0].model, NULL);
    free(weights);
    BB_TRY(rc);
    t->saved = t->result->saved = true;
    if (!t->o->save_dir) return BB_OK;
    if (t->o->progress)
        fprintf(t->o->progress, "%ssaved step %llu to %s/%s (%.0f ms)\n", t->tty ? "\r\033[K" : "",
                (unsigned long long)step, t->o->save_dir, name, (double)(bb_clock_ns() - t0) / 1e6);
    return BB_OK;
}

/* The step's loss into the result (grown as steps are done: no allocation
 * scales with --steps). */
static bb_status record_loss(trainer *t, uint64_t step0, double loss)
{
    bb_train_result *r = t->result;
    size_t i = (size_t)(step0 - t->first_step);
    if (i >= t->losses_cap) {
        size_t cap = t->losses_cap ? 2 * t->losses_cap : 1024;
        double *grown = realloc(r->losses, cap * sizeof *grown);
        if (!grown) return bb_fail(BB_ERR_NOMEM, "out of memory for the losses of %zu steps", cap);
        r->losses = grown;
        t->losses_cap = cap;
    }
    r->losses[i] = loss;
    return BB_OK;
}

/* A step whose loss or gradient norm is NaN or infinite had its update
 * withheld (bb_optimizer_apply): it ends the run, before anything of it is
 * saved, or (skip_nonfinite) is counted and passed over. *nonfinite tells. */
static bb_status check_finite(trainer *t, uint64_t step, const step_figures *f, bool *nonfinite)
{
    const bb_train_options *o = t->o;
    *nonfinite = !isfinite(f->loss) || !isfinite(f->grad_norm);
    if (!*nonfinite) return BB_OK;
    if (o->skip_nonfinite) {
        t->result->skipped_steps = ++t->skipped;
        return BB_OK;
    }
    if (t->metrics) write_metrics(t, step, f, NULL, false);
    char loss[32], norm[32];
    return bb_fail(BB_ERR_NONFINITE,
                   "step %llu: the loss is %s and the gradient norm %s: stopping with the weights of step %llu "
                   "(nothing of step %llu is saved; a lower %s or a %s may help, %s passes over such steps)",
                   (unsigned long long)step, number_text(loss, sizeof loss, f->loss),
                   number_text(norm, sizeof norm, f->grad_norm), (unsigned long long)step - 1, (unsigned long long)step,
                   bb_train_option_name(o, BB_TRAIN_LR), bb_train_option_name(o, BB_TRAIN_GRAD_CLIP),
                   bb_train_option_name(o, BB_TRAIN_SKIP_NONFINITE));
}

/* Evaluates after step `step` when due (and no stop was asked); *ran
 * tells. A stop asked during it, on any rank, ends it: agreed, then the
 * step is saved (*saved) if it was not. */
static bb_status maybe_evaluate(trainer *t, uint64_t step, bool last, double loss, int *request, bool *saved,
                                bb_eval_result *ev, bool *ran)
{
    const bb_train_options *o = t->o;
    *ran = false;
    if (*request || !(last || (o->eval_every && step % o->eval_every == 0))) return BB_OK;
    float *weights = NULL; /* ZeRO-3: gathered from every process's shards, every rank joining */
    if (t->zero == 3 && t->evaluates) BB_TRY(bb_trainer_whole_weights(t, &weights));
    if (t->val) { /* rank 0's: the others wait in the agreement below */
        char label[48];
        snprintf(label, sizeof label, "eval step %llu", (unsigned long long)step);
        bb_eval_options eo = {.progress = o->progress, .label = label, .interrupted = o->interrupted,
                              .token_bytes = t->val_token_bytes};
        bb_status rc = evaluate(t, weights, &eo, ev);
        free(weights), weights = NULL;
        if (rc != BB_ERR_INTERRUPTED) BB_TRY(rc);
        else if (o->progress) /* the step was saved before it, if it saves */
            fprintf(o->progress, "%s%s: stopped (%s)\n", t->tty ? "\r\033[K" : "", label, bb_error_message());
        if ((*ran = rc == BB_OK)) {
            t->result->val_loss = ev->loss;
            t->result->val_accuracy = ev->accuracy;
        }
    }
    free(weights);
    BB_TRY(agree_stop(t, request));
    if (*request && !*saved && saves_at(t, step, *request)) {
        BB_TRY(save(t, step, loss));
        *saved = true;
    }
    return BB_OK;
}

/* The progress line (every log_every steps, at the end, after an
 * evaluation or Ctrl-C) and the evaluation's. */
static void report_progress(trainer *t, uint64_t step, const step_figures *f, uint64_t now, bool last,
                            bool interrupted, const bb_eval_result *ev)
{
    const bb_train_options *o = t->o;
    if (!o->progress || !(last || ev || interrupted || (o->log_every && step % o->log_every == 0))) return;
    progress_line(t, step, f, now);
    if (ev) {
        fprintf(o->progress, "%seval step %llu: val loss %.4f", t->tty ? "\n" : "", (unsigned long long)step, ev->loss);
        if (!isnan(ev->bits_per_byte)) fprintf(o->progress, ", %.4f bits per byte", ev->bits_per_byte);
        if (!isnan(ev->accuracy)) fprintf(o->progress, ", val accuracy %.2f%%", 100 * ev->accuracy);
        fprintf(o->progress, " (%llu records)\n", (unsigned long long)ev->records);
    }
    if (t->tty && last && !ev) fprintf(o->progress, "\n");
}

/* Whether the run stops after this step: its last, or a stop asked (the
 * same on every rank). A preemption says so once, at the end (train.h). */
static void decide_stop(trainer *t, uint64_t step, bool last, int request)
{
    const bb_train_options *o = t->o;
    t->stop = last || request;
    t->result->interrupted = request != BB_STOP_NONE;
    t->result->preempted = request == BB_STOP_PREEMPT;
    if (request == BB_STOP_INTERRUPT && o->progress)
        fprintf(o->progress, "%sinterrupted after step %llu%s\n", t->tty ? "\n" : "", (unsigned long long)step,
                t->saves ? "; saved" : "");
}

/* A failure to write the metrics must not cost the run's work: a save of
 * this step first (when there is a save_dir, the step is not saved yet and
 * this process may save alone), then the failure, which stays the one
 * reported. */
static bb_status keep_the_work(trainer *t, uint64_t step, double loss, bool saved, bb_status failure)
{
    if (!t->o->save_dir || saved || t->gather_saves) return failure;
    char first[1024];
    snprintf(first, sizeof first, "%s", bb_error_message());
    if (save(t, step, loss) == BB_OK && t->o->progress)
        fprintf(t->o->progress, "%strain: saved step %llu before stopping\n", t->tty ? "\n" : "",
                (unsigned long long)step);
    return bb_fail(failure, "%s", first);
}

bb_status bb_trainer_end_of_step(trainer *t, uint64_t step0)
{
    const bb_train_options *o = t->o;
    uint64_t step = step0 + 1, now = bb_clock_ns();
    step_figures f = measure(t, step0, now);
    int request;
    BB_TRY(agree_stop(t, &request)); /* first: every rank decides the same below */
    bool nonfinite;
    BB_TRY(record_loss(t, step0, f.loss));
    BB_TRY(check_finite(t, step, &f, &nonfinite));
    const worker_stats *s0 = &t->replicas[0].stats; /* the same on every device */
    if (!nonfinite) bb_noise_scale_add(&t->noise, s0->small_squares, s0->b_small, f.grad_norm * f.grad_norm,
                                       f.batch);
    f.noise_scale = t->result->noise_scale = bb_noise_scale_value(&t->noise);
    if (t->auto_batch) bb_trainer_follow_noise(t, f.noise_scale); /* before a save, which records where it goes */
    t->result->steps_done = step;
    t->result->saved = false;
    bool last = step == t->total_steps || step == o->stop_after;
    /* Saved first: an evaluation that fails must not cost the checkpoint.
     * ZeRO-1 over processes: every rank joins. */
    bool saved = saves_at(t, step, request);
    if (saved) BB_TRY(save(t, step, f.loss));
    bb_eval_result ev;
    bool evaluated;
    BB_TRY(maybe_evaluate(t, step, last, f.loss, &request, &saved, &ev, &evaluated));
    if (t->metrics) {
        bb_status rc = write_metrics(t, step, &f, evaluated ? &ev : NULL, nonfinite);
        if (rc != BB_OK) return keep_the_work(t, step, f.loss, saved, rc);
    }
    report_progress(t, step, &f, now, last, request != BB_STOP_NONE, evaluated ? &ev : NULL);
    decide_stop(t, step, last, request);
    t->last_step_end_ns = bb_clock_ns(); /* evaluation and saving are not the next step's time */
    return BB_OK;
}
