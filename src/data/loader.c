/* loader.c — the loader's life cycle, the consumer side (next/release), the
 * per-epoch frame tables and the frame-buffer pool. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loader_internal.h"
#include "stream.h"

bb_status bb_io_mode_parse(const char *s, bb_io_mode *out)
{
    if (!strcmp(s, "auto")) *out = BB_IO_AUTO;
    else if (!strcmp(s, "uring")) *out = BB_IO_URING;
    else if (!strcmp(s, "pread")) *out = BB_IO_PREAD;
    else return bb_fail(BB_ERR_ARG, "--io: '%s' is not one of uring, pread, auto", s);
    return BB_OK;
}

void bb_loader_defaults(bb_loader_options *o)
{
    *o = (bb_loader_options){.shuffle_frames = BB_SHUFFLE_FRAMES_DEFAULT, .devices = 1, .accumulation = 1,
                             .micro_batch = 32, .threads = BB_LOADER_THREADS_DEFAULT, .prefetch = 0, .hold = 2,
                             .io = BB_IO_AUTO, .io_depth = 8};
}

void bb_loader_training_options(int devices, int micro_batch, int threads, bb_loader_options *o)
{
    bb_loader_defaults(o);
    o->devices = (uint32_t)devices;
    o->micro_batch = (uint32_t)micro_batch;
    if (threads > 0) o->threads = (uint32_t)threads;
    o->hold = BB_LOADER_HOLD_TRAINING;
}

/* ---- host memory for slots --------------------------------------------- */
static size_t page_round(size_t n) { return (n + 4095) / 4096 * 4096; }

static void *host_alloc(const struct bb_loader *l, size_t bytes)
{
    if (l->opt.host_alloc) return l->opt.host_alloc(l->opt.host_ctx, bytes);
    return aligned_alloc(4096, page_round(bytes));
}

static void host_free(const struct bb_loader *l, void *p, size_t bytes)
{
    if (!p) return;
    if (l->opt.host_free)
        l->opt.host_free(l->opt.host_ctx, p, bytes);
    else
        free(p);
}

/* ---- frame-buffer pool ------------------------------------------------- */
uint8_t *bb_loader_pool_get(struct bb_loader *l)
{
    uint8_t *b = NULL;
    pthread_mutex_lock(&l->pool_lock);
    if (l->pool_count) b = l->pool[--l->pool_count];
    pthread_mutex_unlock(&l->pool_lock);
    return b ? b : malloc(l->max_frame_bytes);
}

void bb_loader_pool_put(struct bb_loader *l, uint8_t *buffer)
{
    pthread_mutex_lock(&l->pool_lock);
    if (l->pool_count == l->pool_capacity) {
        uint32_t cap = l->pool_capacity ? 2 * l->pool_capacity : 16;
        uint8_t **p = realloc(l->pool, cap * sizeof *p);
        if (!p) {
            pthread_mutex_unlock(&l->pool_lock);
            free(buffer);
            return;
        }
        l->pool = p;
        l->pool_capacity = cap;
    }
    l->pool[l->pool_count++] = buffer;
    pthread_mutex_unlock(&l->pool_lock);
}

/* ---- errors ------------------------------------------------------------ */
void bb_loader_record_error(struct bb_loader *l, bb_status status)
{
    pthread_mutex_lock(&l->error_lock);
    if (l->error == BB_OK) {
        l->error = status;
        snprintf(l->error_message, sizeof l->error_message, "%s", bb_error_message());
    }
    pthread_mutex_unlock(&l->error_lock);
    atomic_store(&l->failed, true);
}

/* ---- epoch tables ------------------------------------------------------ */
/* Takes `count` records at epoch positions from `first` out of the frames'
 * remaining counts: the records this run will never copy. */
static bb_status forget_positions(epoch_table *t, uint64_t first, uint64_t count)
{
    bb_order_cursor c;
    bb_order_cursor_init(&c, t->order);
    bb_record_ref refs[256];
    bb_status rc = BB_OK;
    for (uint64_t done = 0; done < count && rc == BB_OK; done += 256) {
        uint32_t n = count - done < 256 ? (uint32_t)(count - done) : 256;
        rc = bb_order_cursor_get(&c, first + done, n, refs);
        for (uint32_t i = 0; rc == BB_OK && i < n; i++)
            atomic_fetch_sub_explicit(&t->entries[refs[i].order_frame].remaining, 1, memory_order_relaxed);
    }
    bb_order_cursor_fini(&c);
    return rc;
}

/* A run resumed at (epoch, step) starts the first epoch's claims at the
 * window holding its first position, and forgets the records before that
 * position in the window, so that nothing before the resume point is read. */
static bb_status skip_before_start(struct bb_loader *l, epoch_table *t, uint32_t *first_claim)
{
    uint64_t start = l->opt.start_step * l->global_batch;
    uint64_t window = bb_epoch_order_window_of(t->order, start);
    *first_claim = bb_sampler_window_first(l->sampler, window);
    uint64_t window_start = t->order->first_pos[*first_claim];
    return forget_positions(t, window_start, start - window_start);
}

/* In a job of several processes, the records of the other processes'
 * devices from step `from` on: this loader never copies them (and never
 * reads a frame that holds only such records). */
static bb_status forget_foreign(struct bb_loader *l, epoch_table *t, uint64_t from)
{
    uint64_t B = l->opt.micro_batch, W = l->world_devices, first = l->opt.first_device, D = l->opt.devices;
    if (W == D) return BB_OK;
    for (uint64_t s = from; s < l->steps_per_epoch; s++)
        for (uint64_t m = 0; m < l->opt.accumulation; m++) {
            uint64_t row = s * l->global_batch + m * W * B; /* micro-step m of every device */
            if (first) BB_TRY(forget_positions(t, row, first * B));
            if (first + D < W) BB_TRY(forget_positions(t, row + (first + D) * B, (W - first - D) * B));
        }
    return BB_OK;
}

/* Makes `t` describe `epoch`: its order, and for each frame the records the
 * epoch will take from it (all but those in the dropped tail and, in a job
 * of several processes, those of the other processes' devices). */
static bb_status reset_table(struct bb_loader *l, epoch_table *t, uint64_t epoch)
{
    for (uint32_t j = 0; j < l->frames; j++)
        if (t->entries[j].data) {
            bb_loader_pool_put(l, t->entries[j].data);
            t->entries[j].data = NULL;
        }
    bb_epoch_order_destroy(t->order);
    t->order = NULL;
    t->epoch = UINT64_MAX;
    BB_TRY(bb_epoch_order_create(l->sampler, epoch, &t->order));
    for (uint32_t j = 0; j < l->frames; j++) {
        atomic_store_explicit(&t->entries[j].state, FRAME_EMPTY, memory_order_relaxed);
        atomic_store_explicit(&t->entries[j].remaining,
                              bb_sampler_frame_at(l->sampler, t->order->frames[j])->records, memory_order_relaxed);
    }
    BB_TRY(forget_positions(t, l->steps_per_epoch * l->global_batch, l->dropped));
    uint32_t first_claim = 0;
    bool resumed = epoch == l->opt.start_epoch && l->opt.start_step > 0;
    if (resumed) BB_TRY(skip_before_start(l, t, &first_claim));
    BB_TRY(forget_foreign(l, t, resumed ? l->opt.start_step : 0));
    atomic_store_explicit(&t->claim_cursor, first_claim, memory_order_relaxed);
    t->epoch = epoch;
    for (uint32_t j = first_claim; j < l->frames; j++) { /* a streamed dataset downloads in this order */
        const bb_sampler_frame *f = bb_sampler_frame_at(l->sampler, t->order->frames[j]);
        if (atomic_load_explicit(&t->entries[j].remaining, memory_order_relaxed))
            bb_dataset_want_frame(l->ds, f->shard, f->frame);
    }
    return BB_OK;
}

static uint64_t slowest_thread_epoch(const struct bb_loader *l)
{
    uint64_t m = UINT64_MAX;
    for (uint32_t i = 0; i < l->opt.threads; i++)
        if (l->thread_epoch[i] < m) m = l->thread_epoch[i];
    return m;
}

/* Records that `thread` works in `epoch` from now on (UINT64_MAX: it is
 * done) and returns the epoch's table, preparing it when this thread is the
 * first to arrive. The table of parity e % 2 may take epoch e once no thread
 * can still need epoch e-2 or an earlier one of that parity: when the
 * slowest thread has reached e-1. (A thread may skip epochs when threads
 * outnumber the units of an epoch, so "nobody is in the old epoch" is not
 * enough.) The slowest thread never waits here, so this cannot deadlock.
 * Fails with BB_ERR_CLOSED when the loader stops. */
bb_status bb_loader_enter_epoch(struct bb_loader *l, uint32_t thread, uint64_t epoch, epoch_table **table)
{
    pthread_mutex_lock(&l->epoch_lock);
    l->thread_epoch[thread] = epoch;
    pthread_cond_broadcast(&l->epoch_changed);
    bb_status rc = BB_OK;
    if (epoch != UINT64_MAX) {
        epoch_table *t = &l->tables[epoch % 2];
        while (t->epoch != epoch && rc == BB_OK) {
            if (atomic_load(&l->stopping))
                rc = BB_ERR_CLOSED;
            else if (slowest_thread_epoch(l) + 1 >= epoch)
                rc = reset_table(l, t, epoch);
            else
                pthread_cond_wait(&l->epoch_changed, &l->epoch_lock);
        }
        *table = t;
    }
    pthread_mutex_unlock(&l->epoch_lock);
    return rc;
}

/* ---- create / destroy -------------------------------------------------- */
static bb_status check_options(const bb_dataset_t *ds, const bb_loader_options *o)
{
    if (o->devices < 1 || o->accumulation < 1 || o->micro_batch < 1)
        return bb_fail(BB_ERR_ARG, "devices, accumulation and micro-batch must each be at least 1");
    if (o->threads < 1 || o->threads > 256) return bb_fail(BB_ERR_ARG, "--loader-threads must be in 1..256");
    if (o->prefetch > 1024) return bb_fail(BB_ERR_ARG, "prefetch must be in 0 (auto)..1024");
    if (o->io_depth < 1 || o->io_depth > 256) return bb_fail(BB_ERR_ARG, "io depth must be in 1..256");
    if (o->shuffle_frames < 1) return bb_fail(BB_ERR_ARG, "--shuffle-frames must be at least 1");
    if (o->hold < 1 || o->hold > 1024) return bb_fail(BB_ERR_ARG, "hold must be in 1..1024");
    uint32_t world = o->world_devices ? o->world_devices : o->devices;
    if (o->world_devices && ((uint64_t)o->first_device + o->devices > o->world_devices))
        return bb_fail(BB_ERR_ARG, "devices %u..%u are not among the job's %u", o->first_device,
                       o->first_device + o->devices - 1, o->world_devices);
    uint64_t g, units;
    if (__builtin_mul_overflow((uint64_t)world * o->accumulation, o->micro_batch, &g) || g > UINT32_MAX)
        return bb_fail(BB_ERR_ARG, "global batch devices %u x accumulation %u x micro-batch %u is too large",
                       world, o->accumulation, o->micro_batch);
    if (__builtin_mul_overflow(o->steps, (uint64_t)o->devices * o->accumulation, &units))
        return bb_fail(BB_ERR_ARG, "%llu steps is too many", (unsigned long long)o->steps);
    if (g > bb_dataset_record_count(ds))
        return bb_fail(BB_ERR_ARG,
                       "%s holds %llu records, fewer than one global batch of %llu (devices %u x accumulation %u "
                       "x micro-batch %u)",
                       bb_dataset_path(ds), (unsigned long long)bb_dataset_record_count(ds), (unsigned long long)g,
                       world, o->accumulation, o->micro_batch);
    return BB_OK;
}

static bb_status open_direct(struct bb_loader *l)
{
    uint32_t n = bb_dataset_shard_count(l->ds);
    l->direct_fds = malloc(n * sizeof *l->direct_fds);
    if (!l->direct_fds) return bb_fail(BB_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; i < n; i++) l->direct_fds[i] = -1;
    for (uint32_t i = 0; i < n; i++) {
        const char *path = bb_shard_path(bb_dataset_shard(l->ds, i));
        l->direct_fds[i] = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
        if (l->direct_fds[i] < 0 && errno == EINVAL)
            return bb_fail(BB_ERR_UNSUPPORTED, "--direct: %s: the file system does not support O_DIRECT", path);
        if (l->direct_fds[i] < 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot open with O_DIRECT", path);
    }
    return BB_OK;
}

/* One io and decoder per thread. Under --io auto, when io_uring cannot
 * start for some thread (ring memory may count against RLIMIT_MEMLOCK, per
 * user), every thread reads with pread: one backend, one warning. */
static bb_status create_thread_state(struct bb_loader *l)
{
    uint32_t max_compressed = 0;
    for (uint32_t i = 0; i < bb_dataset_shard_count(l->ds); i++) {
        const bb_shard_t *sh = bb_dataset_shard(l->ds, i);
        if (bb_shard_max_compressed_bytes(sh) > max_compressed) max_compressed = bb_shard_max_compressed_bytes(sh);
        if (bb_shard_max_frame_bytes(sh) > l->max_frame_bytes) l->max_frame_bytes = bb_shard_max_frame_bytes(sh);
    }
    bb_io_mode mode = l->opt.io;
    for (uint32_t t = 0; t < l->opt.threads; t++) {
        thread_state *ts = &l->threads[t];
        ts->loader = l;
        ts->index = t;
        bool fell_back;
        BB_TRY(bb_io_create(mode, l->opt.io_depth, max_compressed, l->opt.direct, &ts->io, &fell_back));
        if (fell_back) {
            BB_WARN("%s; reading with pread (--io pread silences this)", bb_error_message());
            mode = BB_IO_PREAD;
            for (uint32_t k = 0; k < t; k++) {
                bb_io_destroy(l->threads[k].io);
                l->threads[k].io = NULL;
                BB_TRY(bb_io_create(mode, 1, max_compressed, l->opt.direct, &l->threads[k].io, &fell_back));
            }
        }
        BB_TRY(bb_frame_decoder_create(&ts->decoder));
    }
    /* Describe the least capable thread (registration may fail for some);
     * the descriptions grow with capability: pread, io_uring, io_uring
     * (registered buffers). */
    const char *io = bb_io_describe(l->threads[0].io);
    for (uint32_t t = 1; t < l->opt.threads; t++)
        if (strlen(bb_io_describe(l->threads[t].io)) < strlen(io)) io = bb_io_describe(l->threads[t].io);
    snprintf(l->io_description, sizeof l->io_description, "%s%s", io, l->opt.direct ? " O_DIRECT" : "");
    return BB_OK;
}

static uint32_t gcd(uint32_t a, uint32_t b) { return b ? gcd(b, a % b) : a; }

static uint32_t power_of_two_at_least(uint32_t n)
{
    uint32_t p = 1;
    while (p < n) p *= 2;
    return p;
}

/* Automatic prefetch: 16 batches per device, fewer when batches are large
 * (64 MiB of them at most). Fewer than ~12 let the loader threads stall
 * whenever the consumer waits for a CPU (perf/RESULTS.md). */
static uint32_t auto_prefetch(size_t batch_bytes)
{
    size_t n = ((size_t)64 << 20) / (batch_bytes ? batch_bytes : 1);
    return n >= 16 ? 16 : n < 2 ? 2 : (uint32_t)n;
}

/* Slots for each (thread, device) pair that carries units: its share of
 * `prefetch` ready batches, plus `hold` that the device may keep unreleased
 * (they may all come from one pair). A device therefore has about
 * prefetch + hold x (threads serving it) slots. */
static uint32_t pair_slots(const bb_loader_options *o, size_t data_bytes, uint32_t *serving)
{
    uint32_t prefetch = o->prefetch ? o->prefetch : auto_prefetch(data_bytes);
    *serving = o->threads / gcd(o->threads, o->devices); /* threads that fill units for one device */
    return (prefetch + *serving - 1) / *serving + o->hold;
}

uint64_t bb_loader_slot_bytes(const bb_loader_options *o, size_t record_size)
{
    uint32_t serving, per_pair = pair_slots(o, (size_t)o->micro_batch * record_size, &serving);
    return (uint64_t)serving * per_pair * o->micro_batch * (record_size + sizeof(uint64_t));
}

static bb_status create_pairs(struct bb_loader *l)
{
    uint32_t T = l->opt.threads, D = l->opt.devices, g = gcd(T, D), serving;
    size_t data_bytes = (size_t)l->opt.micro_batch * l->record_size;
    if (l->opt.prefetch == 0) l->opt.prefetch = auto_prefetch(data_bytes);
    uint32_t per_pair = pair_slots(&l->opt, data_bytes, &serving);
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t d = 0; d < D; d++) {
            pair_rings *p = &l->pairs[t * D + d];
            uint32_t cap = power_of_two_at_least(per_pair);
            BB_TRY(bb_spsc_init(&p->ready, cap));
            BB_TRY(bb_spsc_init(&p->free, cap));
            if (t % g != d % g) continue; /* never carries a unit */
            p->slots = calloc(per_pair, sizeof *p->slots);
            if (!p->slots) return bb_fail(BB_ERR_NOMEM, "out of memory");
            p->slot_count = per_pair;
            for (uint32_t i = 0; i < per_pair; i++) {
                slot *s = &p->slots[i];
                s->thread = t;
                s->device = d;
                s->data = host_alloc(l, data_bytes);
                s->ids = malloc(l->opt.micro_batch * sizeof *s->ids);
                if (!s->data || !s->ids)
                    return bb_fail(BB_ERR_NOMEM, "out of memory for a batch slot of %zu bytes", data_bytes);
                bb_spsc_try_push(&p->free, s);
            }
        }
    return BB_OK;
}

bb_status bb_loader_create(const bb_dataset_t *ds, const bb_loader_options *o, bb_loader_t **out)
{
    *out = NULL;
    BB_TRY(check_options(ds, o));
    struct bb_loader *l = calloc(1, sizeof *l);
    if (!l) return bb_fail(BB_ERR_NOMEM, "out of memory");
    l->ds = ds;
    l->opt = *o;
    pthread_mutex_init(&l->epoch_lock, NULL);
    pthread_cond_init(&l->epoch_changed, NULL);
    pthread_mutex_init(&l->pool_lock, NULL);
    pthread_mutex_init(&l->error_lock, NULL);
    l->tables[0].epoch = l->tables[1].epoch = UINT64_MAX;
    bb_status rc;
    uint32_t T = o->threads, D = o->devices;
    BB_TRY_GOTO(bb_sampler_create(ds, o->seed, o->shuffle_frames, o->order ? o->order : BB_ORDER_CURRENT,
                                  &l->sampler), rc, fail);
    l->record_size = bb_dataset_meta(ds)->record_size;
    l->frames = bb_sampler_frame_count(l->sampler);
    l->world_devices = o->world_devices ? o->world_devices : D;
    l->global_batch = (uint64_t)l->world_devices * o->accumulation * o->micro_batch;
    l->steps_per_epoch = bb_sampler_record_count(l->sampler) / l->global_batch;
    l->dropped = bb_sampler_record_count(l->sampler) % l->global_batch;
    if (o->start_step >= l->steps_per_epoch) {
        rc = bb_fail(BB_ERR_ARG, "start step %llu is past the epoch's %llu steps", (unsigned long long)o->start_step,
                     (unsigned long long)l->steps_per_epoch);
        goto fail;
    }
    if (__builtin_mul_overflow(o->start_epoch, l->steps_per_epoch, &l->first_unit_step) ||
        l->first_unit_step > UINT64_MAX / 2) {
        rc = bb_fail(BB_ERR_ARG, "start epoch %llu is too large", (unsigned long long)o->start_epoch);
        goto fail;
    }
    l->first_unit_step += o->start_step;
    l->total_units = o->steps ? o->steps * o->accumulation * D : UINT64_MAX;

    l->threads = calloc(T, sizeof *l->threads);
    /* bb_spsc is cache-line aligned, so the heap array must be as well. */
    size_t pairs_bytes = (size_t)T * D * sizeof *l->pairs;
    if ((l->pairs = aligned_alloc(BB_CACHE_LINE, pairs_bytes))) memset(l->pairs, 0, pairs_bytes);
    l->next_unit = calloc(D, sizeof *l->next_unit);
    l->held = calloc(D, sizeof *l->held);
    l->wait_ns = calloc(D, sizeof *l->wait_ns);
    l->thread_epoch = malloc(T * sizeof *l->thread_epoch);
    for (int i = 0; i < 2; i++) l->tables[i].entries = calloc(l->frames, sizeof(frame_entry));
    if (!l->threads || !l->pairs || !l->next_unit || !l->held || !l->wait_ns || !l->thread_epoch ||
        !l->tables[0].entries || !l->tables[1].entries) {
        rc = bb_fail(BB_ERR_NOMEM, "out of memory for the loader");
        goto fail;
    }
    for (uint32_t t = 0; t < T; t++) l->thread_epoch[t] = o->start_epoch;
    if (o->direct) BB_TRY_GOTO(open_direct(l), rc, fail);
    BB_TRY_GOTO(create_thread_state(l), rc, fail);
    BB_TRY_GOTO(create_pairs(l), rc, fail);
    for (uint32_t t = 0; t < T; t++) {
        int err = pthread_create(&l->threads[t].thread, NULL, bb_loader_thread_main, &l->threads[t]);
        if (err) {
            rc = bb_fail(BB_ERR_INTERNAL, "cannot start loader thread %u: %s", t, strerror(err));
            goto fail;
        }
        l->threads[t].started = true;
    }
    BB_INFO("loader: %u thread%s, %s, %llu steps of %llu records per epoch, %llu dropped", T, T == 1 ? "" : "s",
            l->io_description, (unsigned long long)l->steps_per_epoch, (unsigned long long)l->global_batch,
            (unsigned long long)l->dropped);
    *out = l;
    return BB_OK;
fail:
    bb_loader_destroy(l);
    return rc;
}

void bb_loader_stop(bb_loader_t *l)
{
    atomic_store(&l->stopping, true);
    uint32_t T = l->opt.threads, D = l->opt.devices;
    if (l->pairs)
        for (size_t i = 0; i < (size_t)T * D; i++) {
            if (l->pairs[i].ready.items) bb_spsc_close(&l->pairs[i].ready);
            if (l->pairs[i].free.items) bb_spsc_close(&l->pairs[i].free);
        }
    pthread_mutex_lock(&l->epoch_lock);
    pthread_cond_broadcast(&l->epoch_changed);
    pthread_mutex_unlock(&l->epoch_lock);
}

void bb_loader_destroy(bb_loader_t *l)
{
    if (!l) return;
    bb_loader_stop(l);
    uint32_t T = l->opt.threads, D = l->opt.devices;
    for (uint32_t t = 0; l->threads && t < T; t++) {
        if (l->threads[t].started) pthread_join(l->threads[t].thread, NULL);
        bb_io_destroy(l->threads[t].io);
        bb_frame_decoder_destroy(l->threads[t].decoder);
    }
    for (size_t i = 0; l->pairs && i < (size_t)T * D; i++) {
        pair_rings *p = &l->pairs[i];
        for (uint32_t s = 0; s < p->slot_count; s++) {
            host_free(l, p->slots[s].data, (size_t)l->opt.micro_batch * l->record_size);
            free(p->slots[s].ids);
        }
        free(p->slots);
        bb_spsc_fini(&p->ready);
        bb_spsc_fini(&p->free);
    }
    for (int i = 0; i < 2; i++) {
        for (uint32_t j = 0; l->tables[i].entries && j < l->frames; j++) free(l->tables[i].entries[j].data);
        free(l->tables[i].entries);
        bb_epoch_order_destroy(l->tables[i].order);
    }
    for (uint32_t i = 0; i < l->pool_count; i++) free(l->pool[i]);
    free(l->pool);
    if (l->direct_fds)
        for (uint32_t i = 0; i < bb_dataset_shard_count(l->ds); i++)
            if (l->direct_fds[i] >= 0) close(l->direct_fds[i]);
    free(l->direct_fds);
    free(l->threads);
    free(l->pairs);
    free(l->next_unit);
    free(l->held);
    free(l->wait_ns);
    free(l->thread_epoch);
    bb_sampler_destroy(l->sampler);
    pthread_mutex_destroy(&l->epoch_lock);
    pthread_cond_destroy(&l->epoch_changed);
    pthread_mutex_destroy(&l->pool_lock);
    pthread_mutex_destroy(&l->error_lock);
    free(l);
}

/* ---- the consumer side ------------------------------------------------- */
static bb_status stored_error_or(struct bb_loader *l, bb_status otherwise, const char *message)
{
    pthread_mutex_lock(&l->error_lock);
    bb_status rc = l->error ? bb_fail(l->error, "%s", l->error_message) : bb_fail(otherwise, "%s", message);
    pthread_mutex_unlock(&l->error_lock);
    return rc;
}

bb_status bb_loader_next(bb_loader_t *l, uint32_t device, bb_batch *batch)
{
    *batch = (bb_batch){0};
    uint32_t D = l->opt.devices;
    if (device >= D) return bb_fail(BB_ERR_ARG, "device %u: the loader serves %u devices", device, D);
    if (l->next_unit[device] == UINT64_MAX) return stored_error_or(l, BB_ERR_CLOSED, "the loader was stopped");
    uint64_t unit = l->next_unit[device] * D + device;
    if (unit >= l->total_units)
        return stored_error_or(l, BB_ERR_CLOSED, "the loader has delivered every requested step");
    pair_rings *p = &l->pairs[unit % l->opt.threads * D + device];
    if (l->held[device] == l->opt.hold)
        return bb_fail(BB_ERR_ARG, "device %u holds %u unreleased batches, the most the loader allows (hold); "
                       "release one before taking the next", device, l->opt.hold);
    slot *s;
    uint64_t waited = 0;
    if (!bb_spsc_try_pop(&p->ready, (void **)&s)) {
        uint64_t t0 = bb_clock_ns();
        bb_status rc = bb_spsc_pop(&p->ready, (void **)&s);
        waited = bb_clock_ns() - t0;
        atomic_fetch_add_explicit(&l->wait_ns[device], waited, memory_order_relaxed);
        if (rc != BB_OK) {
            l->next_unit[device] = UINT64_MAX; /* every later call fails the same way */
            return stored_error_or(l, BB_ERR_CLOSED, "the loader was stopped");
        }
    }
    if (s->status != BB_OK) {
        l->next_unit[device] = UINT64_MAX;
        return stored_error_or(l, s->status, "a loader thread failed");
    }
    if (s->unit != unit)
        return bb_fail(BB_ERR_INTERNAL, "device %u expected unit %llu, got %llu", device, (unsigned long long)unit,
                       (unsigned long long)s->unit);
    l->next_unit[device]++;
    l->held[device]++;
    atomic_fetch_add_explicit(&l->batches, 1, memory_order_relaxed);
    *batch = (bb_batch){.epoch = s->epoch, .step = s->step, .micro_step = s->micro_step, .device = device,
                        .count = l->opt.micro_batch, .record_size = l->record_size, .data = s->data,
                        .record_ids = s->ids, .wait_ns = waited, .slot = s};
    return BB_OK;
}

void bb_loader_release(bb_loader_t *l, bb_batch *batch)
{
    slot *s = batch->slot;
    if (!s) return;
    l->held[s->device]--;
    bb_spsc_try_push(&l->pairs[s->thread * l->opt.devices + s->device].free, s);
    batch->slot = NULL;
}

uint64_t bb_loader_steps_per_epoch(const bb_loader_t *l) { return l->steps_per_epoch; }
uint64_t bb_loader_dropped_per_epoch(const bb_loader_t *l) { return l->dropped; }
const char *bb_loader_io_description(const bb_loader_t *l) { return l->io_description; }

void bb_loader_get_stats(const bb_loader_t *l, bb_loader_stats *st)
{
    *st = (bb_loader_stats){.batches = atomic_load_explicit(&l->batches, memory_order_relaxed)};
    for (uint32_t t = 0; t < l->opt.threads; t++) {
        st->frames += atomic_load_explicit(&l->threads[t].frames, memory_order_relaxed);
        st->compressed_bytes += atomic_load_explicit(&l->threads[t].compressed_bytes, memory_order_relaxed);
        st->raw_bytes += atomic_load_explicit(&l->threads[t].raw_bytes, memory_order_relaxed);
        st->frame_wait_ns += atomic_load_explicit(&l->threads[t].frame_wait_ns, memory_order_relaxed);
        st->slot_wait_ns += atomic_load_explicit(&l->threads[t].slot_wait_ns, memory_order_relaxed);
        st->io_ns += atomic_load_explicit(&l->threads[t].io_ns, memory_order_relaxed);
        st->decompress_ns += atomic_load_explicit(&l->threads[t].decompress_ns, memory_order_relaxed);
        st->copy_ns += atomic_load_explicit(&l->threads[t].copy_ns, memory_order_relaxed);
    }
    for (uint32_t d = 0; d < l->opt.devices; d++)
        st->wait_ns += atomic_load_explicit(&l->wait_ns[d], memory_order_relaxed);
}
