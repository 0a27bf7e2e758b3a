/* loader_thread.c — one loader thread: take a free slot, find the unit's
 * records in the epoch order, make sure their frames are decompressed
 * (claiming and reading them if nobody has), copy the records, hand the slot
 * to its device. See loader_internal.h for the scheme. */
#include <stdlib.h>
#include <string.h>

#include "loader_internal.h"
#include "stream.h"

/* Per-thread scratch for one unit. */
typedef struct unit_scratch {
    bb_record_ref *refs;       /* (micro_batch) */
    uint32_t *uses;            /* order frames the unit touches */
    uint32_t use_count;
    uint32_t *per_frame;       /* (frames) records the unit takes from each; zero between units */
    bb_order_cursor cursor;
    bb_io_request *requests;   /* (io depth) */
    uint32_t *request_frames;  /* order frame of each request */
} unit_scratch;

static bb_status loader_error(struct bb_loader *l)
{
    pthread_mutex_lock(&l->error_lock);
    bb_status rc = bb_fail(l->error ? l->error : BB_ERR_INTERNAL, "%s", l->error_message);
    pthread_mutex_unlock(&l->error_lock);
    return rc;
}

typedef struct read_ctx {
    thread_state *ts;
    epoch_table *table;
    unit_scratch *scratch;
} read_ctx;

/* io callback: decompress one frame into a pool buffer and publish it. */
static bb_status on_frame_read(void *arg, uint32_t index, const uint8_t *compressed)
{
    read_ctx *ctx = arg;
    struct bb_loader *l = ctx->ts->loader;
    uint32_t j = ctx->scratch->request_frames[index];
    const bb_sampler_frame *f = bb_sampler_frame_at(l->sampler, ctx->table->order->frames[j]);
    const bb_shard_t *shard = bb_dataset_shard(l->ds, f->shard);
    uint8_t *buffer = bb_loader_pool_get(l);
    if (!buffer) return bb_fail(BB_ERR_NOMEM, "out of memory for a frame buffer of %u bytes", l->max_frame_bytes);
    uint64_t t0 = bb_clock_ns();
    bb_status rc = bb_shard_decode_frame(shard, f->frame, ctx->ts->decoder, compressed, buffer, l->max_frame_bytes);
    atomic_fetch_add_explicit(&ctx->ts->decompress_ns, bb_clock_ns() - t0, memory_order_relaxed);
    if (rc != BB_OK) {
        bb_loader_pool_put(l, buffer);
        return rc;
    }
    const bb_shard_frame *sf = bb_shard_frame_at(shard, f->frame);
    atomic_fetch_add_explicit(&ctx->ts->frames, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&ctx->ts->compressed_bytes, sf->compressed_size, memory_order_relaxed);
    atomic_fetch_add_explicit(&ctx->ts->raw_bytes, sf->raw_size, memory_order_relaxed);
    frame_entry *e = &ctx->table->entries[j];
    e->data = buffer;
    atomic_store_explicit(&e->state, FRAME_READY, memory_order_release);
    bb_futex_wake(&e->state, INT32_MAX);
    return BB_OK;
}

/* Reads and publishes order frames [first, first + n), which this thread
 * has claimed. On failure every one of them not yet READY becomes FAILED
 * (after the error is recorded, so that waiters find its message). */
static bb_status load_frames(thread_state *ts, epoch_table *table, unit_scratch *u, uint32_t first, uint32_t n)
{
    struct bb_loader *l = ts->loader;
    uint32_t m = 0;
    for (uint32_t j = first; j < first + n; j++) {
        frame_entry *e = &table->entries[j];
        if (atomic_load_explicit(&e->remaining, memory_order_relaxed) == 0) {
            /* Only dropped records live here: nobody will ask for it. */
            atomic_store_explicit(&e->state, FRAME_READY, memory_order_release);
            continue;
        }
        const bb_sampler_frame *f = bb_sampler_frame_at(l->sampler, table->order->frames[j]);
        const bb_shard_t *shard = bb_dataset_shard(l->ds, f->shard);
        const bb_shard_frame *sf = bb_shard_frame_at(shard, f->frame);
        u->request_frames[m] = j;
        u->requests[m++] = (bb_io_request){
            .fd = l->direct_fds ? l->direct_fds[f->shard] : bb_shard_fd(shard),
            .offset = sf->offset, .length = sf->compressed_size, .path = bb_shard_path(shard), .frame = f->frame};
    }
    bb_status rc = BB_OK;
    for (uint32_t i = 0; i < m && rc == BB_OK; i++) { /* a streamed shard's bytes: there, or waited for */
        const bb_sampler_frame *f = bb_sampler_frame_at(l->sampler, table->order->frames[u->request_frames[i]]);
        rc = bb_dataset_await_frame(l->ds, f->shard, f->frame, &l->stopping);
    }
    read_ctx ctx = {ts, table, u};
    /* the reads' time: bb_io_read's, less the decompression its callbacks did */
    uint64_t t0 = bb_clock_ns(), decompressed = atomic_load_explicit(&ts->decompress_ns, memory_order_relaxed);
    if (rc == BB_OK) rc = bb_io_read(ts->io, u->requests, m, on_frame_read, &ctx);
    uint64_t spent = bb_clock_ns() - t0;
    uint64_t in_callbacks = atomic_load_explicit(&ts->decompress_ns, memory_order_relaxed) - decompressed;
    atomic_fetch_add_explicit(&ts->io_ns, spent > in_callbacks ? spent - in_callbacks : 0, memory_order_relaxed);
    if (rc != BB_OK) {
        if (rc != BB_ERR_CLOSED) bb_loader_record_error(l, rc); /* closed: the loader is stopping */
        for (uint32_t i = 0; i < m; i++) {
            frame_entry *e = &table->entries[u->request_frames[i]];
            if (atomic_load_explicit(&e->state, memory_order_relaxed) != FRAME_READY) {
                atomic_store_explicit(&e->state, FRAME_FAILED, memory_order_release);
                bb_futex_wake(&e->state, INT32_MAX);
            }
        }
    }
    return rc;
}

/* Claims the next batch of frames in the epoch's frame order and loads it,
 * unless the claim cursor is already past `limit`. Batches are a share of a
 * window, so the threads arriving at a new window decompress it in
 * parallel. Sets *claimed to whether it loaded anything. */
static bb_status claim_next(thread_state *ts, epoch_table *table, unit_scratch *u, uint32_t limit, bool *claimed)
{
    struct bb_loader *l = ts->loader;
    uint32_t window = bb_sampler_window_frames(l->sampler);
    uint32_t batch = window / l->opt.threads + (window % l->opt.threads != 0);
    if (batch > bb_io_depth(ts->io)) batch = bb_io_depth(ts->io);
    uint32_t cursor = atomic_load_explicit(&table->claim_cursor, memory_order_relaxed);
    *claimed = false;
    while (cursor <= limit && cursor < l->frames) {
        uint32_t n = l->frames - cursor < batch ? l->frames - cursor : batch;
        if (atomic_compare_exchange_weak_explicit(&table->claim_cursor, &cursor, cursor + n, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *claimed = true;
            return load_frames(ts, table, u, cursor, n);
        }
    }
    return BB_OK;
}

/* Returns once every frame the unit uses is decompressed. First it loads
 * unclaimed frames up to the furthest one it needs; then, while a frame
 * another thread is loading is not ready, it reads ahead (up to one window
 * past what it needs) instead of sleeping, and sleeps only when there is
 * nothing left to read. */
static bb_status frames_ready(thread_state *ts, epoch_table *table, unit_scratch *u)
{
    uint32_t last = 0;
    for (uint32_t k = 0; k < u->use_count; k++)
        if (u->uses[k] > last) last = u->uses[k];
    for (bool claimed = true; claimed;) BB_TRY(claim_next(ts, table, u, last, &claimed));
    uint64_t ahead = (uint64_t)last + bb_sampler_window_frames(ts->loader->sampler);
    uint32_t lookahead = ahead < ts->loader->frames ? (uint32_t)ahead : ts->loader->frames;
    for (uint32_t k = 0; k < u->use_count; k++) {
        frame_entry *e = &table->entries[u->uses[k]];
        uint32_t state;
        uint64_t t0 = 0;
        while ((state = atomic_load_explicit(&e->state, memory_order_acquire)) == FRAME_EMPTY) {
            bool claimed;
            BB_TRY(claim_next(ts, table, u, lookahead, &claimed));
            if (claimed) continue;
            if (!t0) t0 = bb_clock_ns();
            bb_futex_wait(&e->state, FRAME_EMPTY);
        }
        if (t0) atomic_fetch_add_explicit(&ts->frame_wait_ns, bb_clock_ns() - t0, memory_order_relaxed);
        if (state == FRAME_FAILED) /* no error recorded: its reader stopped with the loader */
            return atomic_load(&ts->loader->failed) ? loader_error(ts->loader) : BB_ERR_CLOSED;
    }
    return BB_OK;
}

/* Copies the unit's records into the slot. */
static bb_status fill_slot(thread_state *ts, epoch_table *table, unit_scratch *u, slot *s)
{
    struct bb_loader *l = ts->loader;
    uint32_t b = l->opt.micro_batch, rs = l->record_size;
    uint64_t device = (uint64_t)l->opt.first_device + s->device; /* among the job's */
    uint64_t first = s->step * l->global_batch + ((uint64_t)s->micro_step * l->world_devices + device) * b;
    BB_TRY(bb_order_cursor_get(&u->cursor, first, b, u->refs));
    u->use_count = 0;
    for (uint32_t i = 0; i < b; i++)
        if (u->per_frame[u->refs[i].order_frame]++ == 0) u->uses[u->use_count++] = u->refs[i].order_frame;
    bb_status rc = frames_ready(ts, table, u);
    if (rc == BB_OK) {
        uint64_t t0 = bb_clock_ns();
        for (uint32_t i = 0; i < b; i++) {
            const frame_entry *e = &table->entries[u->refs[i].order_frame];
            memcpy(s->data + (size_t)i * rs, e->data + (size_t)u->refs[i].index * rs, rs);
            s->ids[i] = bb_order_record_id(table->order, u->refs[i]);
        }
        atomic_fetch_add_explicit(&ts->copy_ns, bb_clock_ns() - t0, memory_order_relaxed);
    }
    for (uint32_t k = 0; k < u->use_count; k++) {
        uint32_t j = u->uses[k], taken = u->per_frame[j];
        u->per_frame[j] = 0;
        frame_entry *e = &table->entries[j];
        if (rc == BB_OK && atomic_fetch_sub_explicit(&e->remaining, taken, memory_order_acq_rel) == taken) {
            bb_loader_pool_put(l, e->data);
            e->data = NULL;
        }
    }
    return rc;
}

static bb_status scratch_init(struct bb_loader *l, thread_state *ts, unit_scratch *u)
{
    *u = (unit_scratch){0};
    bb_order_cursor_init(&u->cursor, NULL);
    uint32_t depth = bb_io_depth(ts->io);
    u->refs = malloc(l->opt.micro_batch * sizeof *u->refs);
    u->uses = malloc(l->opt.micro_batch * sizeof *u->uses);
    u->per_frame = calloc(l->frames, sizeof *u->per_frame);
    u->requests = malloc(depth * sizeof *u->requests);
    u->request_frames = malloc(depth * sizeof *u->request_frames);
    if (!u->refs || !u->uses || !u->per_frame || !u->requests || !u->request_frames)
        return bb_fail(BB_ERR_NOMEM, "out of memory for a loader thread");
    return BB_OK;
}

static void scratch_fini(unit_scratch *u)
{
    bb_order_cursor_fini(&u->cursor);
    free(u->refs);
    free(u->uses);
    free(u->per_frame);
    free(u->requests);
    free(u->request_frames);
}

void *bb_loader_thread_main(void *arg)
{
    thread_state *ts = arg;
    struct bb_loader *l = ts->loader;
    uint32_t T = l->opt.threads, D = l->opt.devices, A = l->opt.accumulation;
    unit_scratch u;
    epoch_table *table = NULL;
    bb_status rc = scratch_init(l, ts, &u);
    if (rc != BB_OK) bb_loader_record_error(l, rc);
    for (uint64_t unit = ts->index; rc == BB_OK && unit < l->total_units; unit += T) {
        if (atomic_load_explicit(&l->stopping, memory_order_acquire) ||
            atomic_load_explicit(&l->failed, memory_order_acquire))
            break;
        uint32_t d = (uint32_t)(unit % D);
        pair_rings *p = &l->pairs[ts->index * D + d];
        slot *s;
        if (!bb_spsc_try_pop(&p->free, (void **)&s)) {
            uint64_t t0 = bb_clock_ns();
            if (bb_spsc_pop(&p->free, (void **)&s) != BB_OK) break; /* closed: shutting down */
            atomic_fetch_add_explicit(&ts->slot_wait_ns, bb_clock_ns() - t0, memory_order_relaxed);
        }
        uint64_t step = l->first_unit_step + unit / ((uint64_t)A * D);
        s->unit = unit;
        s->epoch = step / l->steps_per_epoch;
        s->step = step % l->steps_per_epoch;
        s->micro_step = (uint32_t)(unit / D % A);
        if (!table || table->epoch != s->epoch) {
            rc = bb_loader_enter_epoch(l, ts->index, s->epoch, &table);
            if (rc == BB_ERR_CLOSED) break;
            if (rc == BB_OK) {
                bb_order_cursor_fini(&u.cursor);
                bb_order_cursor_init(&u.cursor, table->order);
            }
        }
        if (rc == BB_OK) rc = fill_slot(ts, table, &u, s);
        if (rc == BB_ERR_CLOSED) break;
        if (rc != BB_OK) bb_loader_record_error(l, rc);
        s->status = rc;
        if (bb_spsc_push(&p->ready, s) != BB_OK) break;
    }
    /* Consumers drain what is queued, then see the end (or the error). */
    for (uint32_t d = 0; d < D; d++) bb_spsc_close(&l->pairs[ts->index * D + d].ready);
    bb_loader_enter_epoch(l, ts->index, UINT64_MAX, NULL);
    scratch_fini(&u);
    return NULL;
}
