/* worker.c — one thread per device: micro-steps (load, copy, forward,
 * backward), the reducer hand-off on the last one, the optimizer step, and
 * the two barriers that end a step (worker 0 reports, evaluates and saves
 * between them, so every replica sees the same decision to stop). */
#include <math.h>
#include <string.h>

#include "trainer.h"

bb_status bb_step_barrier_wait(step_barrier *b)
{
    pthread_mutex_lock(&b->lock);
    uint64_t gen = b->generation;
    if (++b->waiting == b->parties) {
        b->waiting = 0;
        b->generation++;
        pthread_cond_broadcast(&b->cond);
    } else {
        while (gen == b->generation && !b->aborted) pthread_cond_wait(&b->cond, &b->lock);
    }
    bool aborted = b->aborted;
    pthread_mutex_unlock(&b->lock);
    return aborted ? BB_ERR_CLOSED : BB_OK;
}

void bb_trainer_fail(trainer *t, bb_status status)
{
    pthread_mutex_lock(&t->fail_lock);
    /* A worker that stops because another failed reports BB_ERR_CLOSED:
     * keep the first real error. */
    if (t->fail_status == BB_OK || (t->fail_status == BB_ERR_CLOSED && status != BB_ERR_CLOSED)) {
        t->fail_status = status;
        snprintf(t->fail_message, sizeof t->fail_message, "%s", bb_error_message());
    }
    pthread_mutex_unlock(&t->fail_lock);
    bb_loader_stop(t->loader);
    if (t->reducer) bb_reducer_abort(t->reducer);
    pthread_mutex_lock(&t->barrier.lock);
    t->barrier.aborted = true;
    pthread_cond_broadcast(&t->barrier.cond);
    pthread_mutex_unlock(&t->barrier.lock);
}

typedef struct post_ctx {
    reducer_t *reducer;
    int device;
} post_ctx;

static void post_ready(void *ctx, size_t ready_from)
{
    post_ctx *p = ctx;
    bb_reducer_post(p->reducer, p->device, ready_from);
}

/* ZeRO-2: before the backward writes a bucket of its gradient window. */
static void window_write(void *ctx, int bucket, size_t final_from)
{
    post_ctx *p = ctx;
    bb_reducer_window_write(p->reducer, p->device, bucket, final_from);
}

/* ZeRO-3: a bucket of weights, gathered from the owners' shards. */
static bb_status gather_weights(void *ctx, bb_gather_phase phase, int bucket, size_t lo, size_t n, float *slot)
{
    replica *r = ctx;
    return bb_reducer_gather(r->t->reducer, r->index, phase, bucket, lo, n, slot);
}

void bb_trainer_window_from_shards(replica *r)
{
    if (r->t->reducer) bb_model_set_param_window_hook(r->model, gather_weights, r);
}

/* Tells the watchdog (watchdog.h) which phase of which step this worker
 * enters (what a timeout names). */
static void watch_phase(const replica *r, uint64_t step, const char *phase)
{
    bb_watchdog_at(r->t->watchdog, r->index, step, phase);
}

static void span(trainer *t, int d, const char *name, uint64_t start, uint64_t end, uint64_t step, int detail)
{
    bb_trace_add(t->trace, d, name, start, end, (int64_t)step + 1, detail);
}

/* The loader batches a worker keeps: a staged batch's upload reads its
 * slot until the stage after the next one returns (model.h), so the last
 * two stay held (the loader's hold is 3). */
typedef struct held_batches {
    bb_batch b[2];
    int n;
} held_batches;

static void release_held(trainer *t, held_batches *h)
{
    for (int i = 0; i < h->n; i++) bb_loader_release(t->loader, &h->b[i]);
    h->n = 0;
}

/* Takes micro-step k's batch from the loader and stages it on the device
 * (its upload queued on the copy stream, straight from the loader's slot). */
static bb_status stage(replica *r, uint64_t step, int k, held_batches *h)
{
    trainer *t = r->t;
    int d = r->index;
    worker_stats *st = &r->stats;
    bb_batch b;
    uint64_t t0 = bb_clock_ns();
    bb_trace_range_push("load");
    bb_status rc = bb_loader_next(t->loader, (uint32_t)d, &b);
    bb_trace_range_pop();
    BB_TRY(rc);
    uint64_t t1 = bb_clock_ns();
    bb_trace_range_push("copy");
    rc = bb_model_stage_records(r->model, bb_dataset_format(t->data), b.data, (int)b.count);
    bb_trace_range_pop();
    if (rc != BB_OK) {
        bb_loader_release(t->loader, &b);
        return rc;
    }
    if (h->n == 2) { /* the batch staged two calls ago has been uploaded */
        bb_loader_release(t->loader, &h->b[0]);
        h->b[0] = h->b[1];
        h->n = 1;
    }
    h->b[h->n++] = b;
    uint64_t t2 = bb_clock_ns();
    st->wait_ns += t1 - t0, st->copy_ns += t2 - t1;
    span(t, d, "load", t0, t1, step, k);
    span(t, d, "copy", t1, t2, step, k);
    return BB_OK;
}

/* Micro-steps of step `step`: the first overwrites the gradients, the
 * others add to them; on the last one the backward posts buckets (ZeRO-2:
 * on every one, each micro-step reduced into the shards' gradients). The next
 * micro-batch is staged before this one's forward, so on a GPU its upload
 * overlaps this compute (double buffering, batch.c). */
static bb_status micro_steps(replica *r, uint64_t step, device_clock *clk, held_batches *h)
{
    trainer *t = r->t;
    int d = r->index;
    worker_stats *st = &r->stats;
    bb_model_t *m = r->model;
    post_ctx post = {t->reducer, d};
    int accumulation = trainer_accumulation_at(t, step);
    float normalizer = trainer_normalizer_at(t, step);
    watch_phase(r, step, "the loader's first micro-batch");
    BB_TRY(stage(r, step, 0, h));
    for (int k = 0; k < accumulation; k++) {
        watch_phase(r, step, "a micro-step (loading, forward and backward)");
        BB_TRY(bb_model_use_staged(m));
        bool last = k == accumulation - 1;
        if (!last) BB_TRY(stage(r, step, k + 1, h));
        uint64_t t2 = bb_clock_ns();
        double loss;
        BB_TRY(bb_device_clock_mark(clk, 3 * k));
        bb_trace_range_push("forward");
        bb_status rc = bb_model_forward(m, normalizer, &loss, NULL);
        bb_trace_range_pop();
        BB_TRY(rc);
        BB_TRY(bb_device_clock_mark(clk, 3 * k + 1));
        uint64_t t3 = bb_clock_ns();
        bool window = t->zero >= 2;
        if ((last || window) && t->reducer && !t->o->no_overlap) bb_model_set_grad_ready(m, post_ready, &post);
        if (window) bb_model_set_grad_window_hook(m, window_write, &post);
        bb_trace_range_push("backward");
        rc = bb_model_backward(m, k > 0);
        bb_trace_range_pop();
        bb_model_set_grad_ready(m, NULL, NULL);
        bb_model_set_grad_window_hook(m, NULL, NULL);
        BB_TRY(rc);
        if (k == 0 && !last && r->first_micro_squares) /* one device: the noise scale's small batch (small_batch) */
            bb_op_sum_squares_into(r->be, bb_model_grads(m), bb_model_param_count(m), r->first_micro_squares);
        BB_TRY(bb_device_clock_mark(clk, 3 * k + 2));
        uint64_t t4 = bb_clock_ns();
        st->loss += loss;
        st->fwd_ns += t3 - t2, st->bwd_ns += t4 - t3;
        st->backward_end_ns = t4;
        if (!clk->on) { /* on GPUs these are queueing times: device_spans() writes the real ones */
            span(t, d, "forward", t2, t3, step, k);
            span(t, d, "backward", t3, t4, step, k);
        }
    }
    return BB_OK;
}

/* The step's compute spans in device time (GPUs with --trace). */
static bb_status device_spans(trainer *t, int d, uint64_t step, device_clock *clk)
{
    uint64_t at[3];
    for (int k = 0; k < trainer_accumulation_at(t, step); k++) {
        for (int i = 0; i < 3; i++) BB_TRY(bb_device_clock_time(clk, 3 * k + i, &at[i]));
        span(t, d, "forward", at[0], at[1], step, k);
        span(t, d, "backward", at[1], at[2], step, k);
    }
    BB_TRY(bb_device_clock_time(clk, 3 * t->accumulation, &at[0]));
    BB_TRY(bb_device_clock_time(clk, 3 * t->accumulation + 1, &at[1]));
    span(t, d, "optimizer", at[0], at[1], step, -1);
    return BB_OK;
}

/* The step's loss, the mean of the replicas' shares, and the decision to
 * stop, replica 0's: through the reducer, which all replicas call. */
static bb_status step_loss(replica *r, double *loss)
{
    reducer_t *red = r->t->reducer;
    *loss = red ? bb_reducer_allreduce_scalar(red, r->index, r->stats.loss) : r->stats.loss;
    return red && bb_reducer_aborted(red) ? bb_reducer_failure(red) : BB_OK;
}

/* The noise scale's small batches (train.h): each device's own gradients
 * as the reduction took them, b_small = G / (devices x rounds) examples
 * (rounds: the reductions of a step, ZeRO-2's micro-steps, else one; each
 * round's gradient is 1/rounds of the device's mean, hence rounds x the
 * mean of the rounds' squares); on one device the first micro-step's
 * (accumulation A: A² x its squares, b_small the micro-batch). NaN where no
 * batch is smaller than the step's (one device, one micro-step). Every
 * device calls it. */
static bb_status small_batch(replica *r, uint64_t step)
{
    trainer *t = r->t;
    worker_stats *st = &r->stats;
    reducer_t *red = t->reducer;
    int accumulation = trainer_accumulation_at(t, step);
    st->small_squares = NAN, st->b_small = 0;
    if (!red) { /* after the step's wait for the device, which wrote it */
        if (r->first_micro_squares && accumulation > 1)
            st->small_squares = (double)accumulation * accumulation * *r->first_micro_squares,
            st->b_small = t->micro_batch;
        return BB_OK;
    }
    double own = NAN;
    if (!bb_reducer_device_squares(red, r->index, &own)) own = NAN;
    int rounds = t->zero >= 2 ? accumulation : 1;
    st->small_squares = rounds * bb_reducer_allreduce_scalar(red, r->index, own);
    st->b_small = (double)trainer_batch_at(t, step) / ((double)trainer_world_devices(t) * rounds);
    return bb_reducer_aborted(red) ? bb_reducer_failure(red) : BB_OK;
}

static bb_status decide_stop(replica *r, bool *stop)
{
    reducer_t *red = r->t->reducer;
    *stop = red ? bb_reducer_broadcast_stop(red, r->index, r->index == 0 && r->t->stop) : r->t->stop;
    return red && bb_reducer_aborted(red) ? bb_reducer_failure(red) : BB_OK;
}

/* The optimizer step. ZeRO-1: the norm adds the shards' sums of squares
 * over the devices, each replica updates its shard, and the reducer
 * gathers the updated weights into every replica. */
static bb_status optimizer_step(replica *r, uint64_t step)
{
    trainer *t = r->t;
    worker_stats *st = &r->stats;
    reducer_t *red = t->reducer;
    /* The norm: the CPU reducer's, added up as it averaged; else a pass
     * over this replica's gradients (with ZeRO-1 its shard's, summed over
     * the devices). Then one pass that clips and updates. */
    double sum;
    if (!red || !bb_reducer_sum_squares(red, &sum)) {
        sum = bb_optimizer_sum_squares(r->be, r->model, &r->opt);
        if (red && t->zero) sum = bb_reducer_allreduce_scalar(red, r->index, sum) * trainer_world_devices(t);
    }
    st->grad_norm = sqrt(sum);
    r->opt.cfg.batch = trainer_batch_at(t, step); /* --lr-scale scales to the step's batch (a ramp's grows) */
    bb_optimizer_apply(r->be, r->model, &r->opt, step, t->total_steps, st->grad_norm, &st->lr);
    if (red && t->zero && !bb_reducer_allgather(red, r->index)) return bb_reducer_failure(red);
    bb_model_weights_changed(r->model);
    return BB_OK;
}

static bb_status worker_loop(replica *r, device_clock *clk, held_batches *h)
{
    trainer *t = r->t;
    int d = r->index;
    for (uint64_t step = t->first_step; step < t->total_steps; step++) {
        worker_stats *st = &r->stats;
        memset(st, 0, sizeof *st);
        BB_TRY(bb_device_clock_start(clk));
        BB_TRY(micro_steps(r, step, clk, h));
        if (t->reducer) {
            watch_phase(r, step, "the gradient all-reduce");
            bb_trace_range_push("reduce");
            if (t->o->no_overlap) bb_reducer_post(t->reducer, d, 0);
            st->reduce_wait_ns = bb_reducer_wait(t->reducer, d);
            bb_trace_range_pop();
            if (bb_reducer_aborted(t->reducer)) return bb_reducer_failure(t->reducer);
        }
        uint64_t t0 = bb_clock_ns();
        BB_TRY(bb_device_clock_mark(clk, 3 * t->accumulation));
        watch_phase(r, step, "the optimizer step");
        bb_trace_range_push("optimizer");
        bb_status rc = optimizer_step(r, step);
        bb_trace_range_pop();
        BB_TRY(rc);
        BB_TRY(bb_device_clock_mark(clk, 3 * t->accumulation + 1));
        uint64_t t1 = bb_clock_ns();
        st->opt_ns = t1 - t0;
        if (clk->on) BB_TRY(device_spans(t, d, step, clk));
        else span(t, d, "optimizer", t0, t1, step, -1);
        /* A device fault in this step (the backward or the optimizer, which
         * nothing has waited for yet) fails it here, before it is reported
         * or saved. */
        watch_phase(r, step, "the wait for its device (the step's kernels and collectives)");
        BB_TRY(bb_backend_synchronize(r->be));
        double loss;
        watch_phase(r, step, "the loss's all-reduce");
        BB_TRY(step_loss(r, &loss));
        watch_phase(r, step, "the noise scale's all-reduce");
        BB_TRY(small_batch(r, step));
        watch_phase(r, step, "the step's first barrier");
        BB_TRY(bb_step_barrier_wait(&t->barrier));
        if (d == 0) {
            watch_phase(r, step, "the step's report, evaluation or save");
            t->step_loss = loss;
            BB_TRY(bb_trainer_end_of_step(t, step));
        }
        bool stop;
        watch_phase(r, step, "the stop's broadcast");
        BB_TRY(decide_stop(r, &stop));
        watch_phase(r, step, "the step's last barrier");
        BB_TRY(bb_step_barrier_wait(&t->barrier));
        if (stop) break;
    }
    return BB_OK;
}

void *bb_trainer_worker_main(void *arg)
{
    replica *r = arg;
    trainer *t = r->t;
    device_clock clk = {0};
    held_batches held = {0};
    bb_status rc = t->trace ? bb_device_clock_init(&clk, r->be, t->accumulation) : BB_OK;
    bb_trainer_window_from_shards(r);
    /* one device with micro-steps: the first one's squares, which the device writes in place (no wait) */
    if (rc == BB_OK && !t->reducer && t->accumulation > 1)
        rc = bb_backend_host_alloc(r->be, sizeof(double), (void **)&r->first_micro_squares);
    if (rc == BB_OK) rc = worker_loop(r, &clk, &held);
    if (rc != BB_OK) bb_trainer_fail(t, rc); /* first: the others stop before this one waits for its device */
    bb_backend_synchronize(r->be);          /* no upload still reads a held slot (it waits even after a failure) */
    if (r->first_micro_squares) bb_backend_host_free(r->be, r->first_micro_squares, sizeof(double));
    r->first_micro_squares = NULL;
    release_held(t, &held);
    bb_device_clock_destroy(&clk);
    return NULL;
}
