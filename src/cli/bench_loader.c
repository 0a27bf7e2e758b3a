/* bench_loader.c — `bigbatch bench loader`: will this dataset keep N GPUs
 * busy? The loader's speed at every thread count up to --loader-threads,
 * with the page cache warm and cold (a scaling table), the time to the
 * first batch and where the loader threads' time goes; with --consumer,
 * simulated GPUs that take batches at a token rate, the share of time they
 * would wait for data and the largest rate at which they wait < 1%. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "bigbatch/backend.h"
#include "bigbatch/json.h"
#include "bigbatch/loader.h"
#include "data_flags.h"
#include "model_flags.h"

static const char usage[] =
    "bigbatch bench loader --data DIR [--loader-threads N] [--io auto|uring|pread] [--micro-batch B]\n"
    "                      [--seconds S] [--warm | --cold] [--no-scaling] [--direct] [--pinned]\n"
    "                      [--consumer RATE | --gpus N --tokens-per-s RATE] [--json]\n"
    "       bigbatch bench loader --data DIR --order [--global-batch G] [--shuffle-frames W] [--order-version V]";
static const char summary[] =
    "Runs the loader on DIR with consumers that take and release batches and prints, for\n"
    "every thread count from 1 to --loader-threads, with the page cache warm (--seconds of\n"
    "reading) and cold (the shards dropped from it with posix_fadvise DONTNEED, then one\n"
    "epoch): records/s, tokens/s, raw MB/s (record bytes delivered), compressed MB/s (shard\n"
    "bytes read), the time to the first batch, and the share of the loader threads' time\n"
    "spent waiting on reads, decompressing, copying into batch slots, and waiting for frames\n"
    "other threads read or for free slots (MB = 10^6 bytes; rates count from the end of the\n"
    "loader's setup).\n\n"
    "--consumer RATE (or --gpus N --tokens-per-s RATE) simulates N GPUs, each consuming RATE\n"
    "tokens/s (samples/s for images) of micro-batches at --loader-threads threads, warm: it\n"
    "reports the share of time a GPU waits for data and the largest rate per GPU at which\n"
    "they wait < 1% (found by bisection, --seconds per probe).\n"
    "perf/loader_bench.sh runs it beside `zstd -d` and `cat`, perf/loader_peers.sh beside\n"
    "PyTorch's DataLoader, WebDataset, MosaicML Streaming and LitData.\n\n"
    "--order measures the data order instead of the speed: over epoch 0, how many distinct\n"
    "frames each global batch of G records draws from (min, median, max; at most min(G,\n"
    "frames)) and how far apart in the source its records lie (the spread of their indices,\n"
    "a share of the dataset): what a shuffle window of W frames (--shuffle-frames) gives.\n\n"
    "example: bigbatch bench loader --data data/kjv/train --loader-threads 2\n"
    "         bigbatch bench loader --data build/kjv-bpe/train --order --global-batch 32\n"
    "         bigbatch bench loader --data data/kjv/train --loader-threads 1 --gpus 8 --tokens-per-s 500000";

/* Drops the shards' pages from the page cache; fails when the kernel refuses. */
static bb_status drop_cache(const bb_dataset_t *ds)
{
    for (uint32_t i = 0; i < bb_dataset_shard_count(ds); i++) {
        const bb_shard_t *sh = bb_dataset_shard(ds, i);
        int err = posix_fadvise(bb_shard_fd(sh), 0, 0, POSIX_FADV_DONTNEED);
        if (err) {
            errno = err;
            return bb_fail_errno(BB_ERR_IO, "%s: posix_fadvise(DONTNEED) failed", bb_shard_path(sh));
        }
    }
    return BB_OK;
}

static uint64_t disk_read_bytes(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (uint64_t)ru.ru_inblock * 512;
}

/* One configuration: threads, warm or cold, and `gpus` consumers taking
 * batches as fast as they come (rate 0) or at `rate` records/s each. */
typedef struct run_config {
    uint32_t threads, gpus;
    bool cold;
    double rate, seconds;
} run_config;

typedef struct bench_result {
    double seconds, records, raw_bytes, startup_seconds, first_batch_seconds;
    double wait_pct, worst_wait_pct; /* of the consumers' time: the mean, the worst */
    uint64_t steps_per_epoch, dropped, disk_bytes;
    bb_loader_stats stats;
    char io[64];
} bench_result;

/* A consumer (a simulated GPU): takes its device's batches and, with a
 * rate, computes on each for count / rate seconds from when it arrived (a
 * GPU cannot start before its data), so that it waits only when the loader
 * is behind. Past the deadline it drains without counting (no loader thread
 * may wait on its slots) until the last consumer past it stops the loader. */
typedef struct consumer {
    bb_loader_t *l;
    uint32_t device, gpus;
    double rate;
    bool one_epoch;
    uint64_t deadline_ns, first_ns, end_ns, wait_ns;
    double records, raw_bytes;
    _Atomic uint32_t *past;
    bb_status rc;
    char error[512];
} consumer;

static void sleep_until(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
}

static void stop_counting(consumer *c, uint64_t now)
{
    c->end_ns = now;
    if (atomic_fetch_add(c->past, 1) + 1 == c->gpus) bb_loader_stop(c->l);
}

static void *consume(void *arg)
{
    consumer *c = arg;
    bool counting = true;
    prctl(PR_SET_TIMERSLACK, 1UL); /* its sleeps end on time (the default slack is 50 us) */
    for (;;) {
        bb_batch b;
        bb_status rc = bb_loader_next(c->l, c->device, &b);
        uint64_t got = bb_clock_ns();
        if (rc != BB_OK) { /* closed: the epoch ended (cold), or the last consumer stopped the loader */
            bool expected = rc == BB_ERR_CLOSED && (c->one_epoch || !counting);
            if (!expected) snprintf(c->error, sizeof c->error, "%s", bb_error_message());
            c->rc = expected ? BB_OK : rc;
            if (counting) stop_counting(c, got);
            return NULL;
        }
        if (counting) {
            if (!c->first_ns) c->first_ns = got; /* the first batch's wait is the time to it, reported apart */
            else c->wait_ns += b.wait_ns; /* blocked for data (not the call's own ~1 us) */
            c->records += b.count;
            c->raw_bytes += (double)b.count * b.record_size;
        }
        bb_loader_release(c->l, &b);
        uint64_t due = got + (uint64_t)(b.count / (c->rate > 0 ? c->rate : 1e300) * 1e9), now = bb_clock_ns();
        if (counting && due > now) sleep_until(due), now = bb_clock_ns();
        if (counting && (bb_cli_interrupted || (!c->one_epoch && now >= c->deadline_ns))) {
            counting = false;
            stop_counting(c, now);
        }
    }
}

enum { MAX_GPUS = 1024 };

static bb_status run(const bb_dataset_t *ds, const bb_loader_options *base, const run_config *c, bench_result *r)
{
    *r = (bench_result){0};
    if (c->cold) BB_TRY(drop_cache(ds));
    uint64_t disk0 = disk_read_bytes();
    bb_loader_options lo = *base;
    lo.threads = c->threads, lo.devices = c->gpus;
    if (c->cold) lo.steps = bb_dataset_record_count(ds) / ((uint64_t)lo.micro_batch * c->gpus); /* one epoch */
    bb_loader_t *l;
    uint64_t created = bb_clock_ns();
    BB_TRY(bb_loader_create(ds, &lo, &l));
    /* Throughput counts from here: setting up io_uring (rings, registered
     * buffers) costs ~0.7 ms more than pread, once; it is reported apart. */
    uint64_t t0 = bb_clock_ns();
    r->startup_seconds = (t0 - created) / 1e9;
    snprintf(r->io, sizeof r->io, "%s", bb_loader_io_description(l));
    r->steps_per_epoch = bb_loader_steps_per_epoch(l);
    r->dropped = bb_loader_dropped_per_epoch(l);
    consumer *cs = calloc(c->gpus, sizeof *cs);
    pthread_t *threads = calloc(c->gpus, sizeof *threads);
    if (!cs || !threads) {
        free(cs), free(threads);
        bb_loader_destroy(l);
        return bb_fail(BB_ERR_NOMEM, "out of memory for %u consumers", c->gpus);
    }
    _Atomic uint32_t past = 0;
    uint32_t started = 0;
    bb_status rc = BB_OK;
    for (uint32_t d = 0; d < c->gpus; d++) {
        cs[d] = (consumer){.l = l, .device = d, .gpus = c->gpus, .rate = c->rate, .one_epoch = c->cold,
                           .deadline_ns = t0 + (uint64_t)(c->seconds * 1e9), .past = &past};
        if (pthread_create(&threads[d], NULL, consume, &cs[d]) != 0) {
            rc = bb_fail(BB_ERR_INTERNAL, "cannot start consumer %u", d);
            bb_loader_stop(l); /* the started ones end at once */
            break;
        }
        started++;
    }
    for (uint32_t d = 0; d < started; d++) pthread_join(threads[d], NULL);
    uint64_t end = t0, first = UINT64_MAX;
    double waited = 0;
    for (uint32_t d = 0; d < started; d++) {
        const consumer *x = &cs[d];
        if (x->rc != BB_OK && rc == BB_OK) rc = bb_fail(x->rc, "%s", x->error);
        if (x->end_ns > end) end = x->end_ns;
        if (x->first_ns && x->first_ns < first) first = x->first_ns;
        r->records += x->records, r->raw_bytes += x->raw_bytes;
        double share = x->first_ns && x->end_ns > x->first_ns
                           ? 100.0 * (double)x->wait_ns / (double)(x->end_ns - x->first_ns) : 0;
        waited += share / c->gpus;
        if (share > r->worst_wait_pct) r->worst_wait_pct = share;
    }
    r->seconds = (end - t0) / 1e9;
    r->first_batch_seconds = first == UINT64_MAX ? 0 : (first - created) / 1e9;
    r->wait_pct = waited;
    bb_loader_get_stats(l, &r->stats);
    r->disk_bytes = disk_read_bytes() - disk0;
    bb_loader_destroy(l);
    free(cs), free(threads);
    if (rc == BB_OK && bb_cli_interrupted) rc = bb_fail(BB_ERR_INTERRUPTED, "interrupted");
    return rc;
}

/* What a record is worth in the unit rates are given in: a token
 * record's targets (T of its T + 1 tokens, as training counts them), else
 * one sample. */
typedef struct units {
    double per_record;
    bool tokens;
} units;

static units units_of(const bb_dataset_t *ds)
{
    const bb_shard_meta *m = bb_dataset_meta(ds);
    bool tokens = m->kind == BB_RECORD_TOKENS_U16 || m->kind == BB_RECORD_TOKENS_U32;
    return (units){.per_record = tokens && m->shape[0] > 1 ? m->shape[0] - 1 : 1, .tokens = tokens};
}

/* A progress line on a terminal, in place. */
static void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void progress(const char *fmt, ...)
{
    if (!isatty(STDERR_FILENO)) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "\r\033[K");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fflush(stderr);
}

static void progress_done(void)
{
    if (isatty(STDERR_FILENO)) fprintf(stderr, "\r\033[K"), fflush(stderr);
}

/* The share (%) of the loader threads' time in each of their phases. */
typedef struct time_shares {
    double io, decompress, copy, frame_wait, slot_wait;
} time_shares;

static time_shares shares_of(const bench_result *r, uint32_t threads)
{
    double ns = r->seconds > 0 ? r->seconds * 1e9 * threads / 100 : 1e300; /* 1% of the threads' time */
    const bb_loader_stats *st = &r->stats;
    return (time_shares){st->io_ns / ns, st->decompress_ns / ns, st->copy_ns / ns, st->frame_wait_ns / ns,
                         st->slot_wait_ns / ns};
}

static json_t *row_json(const run_config *c, const bench_result *r, units u, bool pinned, int micro_batch)
{
    double s = r->seconds > 0 ? r->seconds : 1e-9, rec = r->records / s;
    time_shares t = shares_of(r, c->threads);
    json_t *time = json_pack("{s:o, s:o, s:o, s:o, s:o}", "io_pct", bb_json_fixed(t.io, 1), "decompress_pct",
                             bb_json_fixed(t.decompress, 1), "copy_pct", bb_json_fixed(t.copy, 1), "frame_wait_pct",
                             bb_json_fixed(t.frame_wait, 1), "slot_wait_pct", bb_json_fixed(t.slot_wait, 1));
    return json_pack("{s:o, s:o, s:o, s:o, s:s, s:b, s:I, s:I, s:o, s:o, s:b, s:o, s:o, s:o, s:o, s:o}",
                     "records_per_s", bb_json_fixed(rec, 0), "tokens_per_s",
                     u.tokens ? bb_json_fixed(rec * u.per_record, 0) : json_null(), "raw_mb_per_s",
                     bb_json_fixed(r->raw_bytes / s / 1e6, 1), "compressed_mb_per_s",
                     bb_json_fixed(r->stats.compressed_bytes / s / 1e6, 1), "io", r->io, "pinned", pinned, "threads",
                     (json_int_t)c->threads, "micro_batch", (json_int_t)micro_batch, "records",
                     bb_json_fixed(r->records, 0), "seconds", bb_json_fixed(r->seconds, 4), "cold", c->cold,
                     "data_wait_pct", bb_json_fixed(r->wait_pct, 1), "disk_read_mb",
                     bb_json_fixed(r->disk_bytes / 1e6, 1), "startup_ms", bb_json_fixed(r->startup_seconds * 1e3, 2),
                     "first_batch_ms", bb_json_fixed(r->first_batch_seconds * 1e3, 2), "loader_time", time);
}

static void row_text(const run_config *c, const bench_result *r, units u)
{
    double s = r->seconds > 0 ? r->seconds : 1e-9, rec = r->records / s;
    time_shares t = shares_of(r, c->threads);
    char per_s[32] = "-";
    if (u.tokens) snprintf(per_s, sizeof per_s, "%.0f", rec * u.per_record);
    printf("  %7u  %-5s %11.0f %12s %9.1f %11.1f %9.2f ms %5.1f%% %9.1f%% %5.1f%% %8.1f%% %8.1f%% %8.1f%%\n",
           c->threads, c->cold ? "cold" : "warm", rec, per_s, r->raw_bytes / s / 1e6,
           r->stats.compressed_bytes / s / 1e6, r->first_batch_seconds * 1e3, t.io, t.decompress, t.copy,
           t.frame_wait, t.slot_wait, r->wait_pct);
}

/* The scaling table: threads 1..N (or N alone), warm and/or cold. */
static bb_status scaling(const bb_dataset_t *ds, const bb_loader_options *o, const run_config *asked, units u,
                         bool warm, bool cold, bool only, json_t *rows)
{
    for (uint32_t t = only ? asked->threads : 1; t <= asked->threads; t++)
        for (int k = 0; k < 2; k++) {
            run_config c = *asked;
            c.threads = t, c.cold = k == 1;
            if ((c.cold && !cold) || (!c.cold && !warm)) continue;
            progress("bench loader: %u thread%s, %s cache...", t, t > 1 ? "s" : "", c.cold ? "cold" : "warm");
            bench_result r;
            BB_TRY(run(ds, o, &c, &r));
            if (rows) json_array_append_new(rows, row_json(&c, &r, u, o->host_alloc != NULL, (int)o->micro_batch));
            else progress_done(), row_text(&c, &r, u);
        }
    progress_done();
    return BB_OK;
}

/* The consumer simulation: the asked rate, the loader at full speed, then
 * a bisection for the largest rate per GPU that waits < 1%. */
static bb_status simulate(const bb_dataset_t *ds, const bb_loader_options *o, const run_config *asked, units u,
                          json_t **out)
{
    double upr = u.per_record;
    const char *unit = u.tokens ? "tokens" : "samples";
    run_config c = *asked;
    bench_result at, full, probe;
    progress("bench loader: %u GPU%s at %.0f %s/s each...", c.gpus, c.gpus > 1 ? "s" : "", c.rate * upr, unit);
    BB_TRY(run(ds, o, &c, &at));
    c.rate = 0;
    progress("bench loader: the loader at full speed...");
    BB_TRY(run(ds, o, &c, &full));
    double lo = 0, hi = full.records / full.seconds / c.gpus; /* records/s per GPU */
    for (int i = 0; i < 6; i++) {
        c.rate = (lo + hi) / 2;
        progress("bench loader: probing %.0f %s/s per GPU (%d of 6)...", c.rate * upr, unit, i + 1);
        BB_TRY(run(ds, o, &c, &probe));
        if (probe.wait_pct < 1) lo = c.rate;
        else hi = c.rate;
    }
    progress_done();
    *out = json_pack("{s:s, s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:s}", "unit", unit,
                     "gpus", (json_int_t)asked->gpus, "loader_threads", (json_int_t)asked->threads, "rate_per_gpu",
                     bb_json_fixed(asked->rate * upr, 0), "delivered_per_s",
                     bb_json_fixed(at.records / at.seconds * upr, 0), "wait_pct", bb_json_fixed(at.wait_pct, 2),
                     "worst_wait_pct", bb_json_fixed(at.worst_wait_pct, 2), "max_rate_per_gpu",
                     bb_json_fixed(lo * upr, 0), "full_speed_per_s",
                     bb_json_fixed(full.records / full.seconds * upr, 0), "io", at.io);
    return *out ? BB_OK : bb_fail(BB_ERR_NOMEM, "out of memory");
}

static void simulation_text(const json_t *s)
{
    const char *unit = json_string_value(json_object_get(s, "unit"));
    double gpus = json_number_value(json_object_get(s, "gpus"));
    double rate = json_number_value(json_object_get(s, "rate_per_gpu"));
    double most = json_number_value(json_object_get(s, "max_rate_per_gpu"));
    printf("  simulated GPUs   %.0f x %.0f %s/s\n", gpus, rate, unit);
    printf("  delivered        %.0f %s/s\n", json_number_value(json_object_get(s, "delivered_per_s")), unit);
    printf("  GPUs waited      %.2f%% of the time (the worst %.2f%%)\n",
           json_number_value(json_object_get(s, "wait_pct")), json_number_value(json_object_get(s, "worst_wait_pct")));
    printf("  sustains         %.0f %s/s per GPU with < 1%% waiting (%.0f for %.0f GPUs; full speed %.0f)\n", most,
           unit, most * gpus, gpus, json_number_value(json_object_get(s, "full_speed_per_s")));
}

/* --order: bb_sampler_order_stats over epoch 0, as text or {"order": {...}}. */
static bb_status order_statistic(const bb_dataset_t *ds, const char *data, const bb_loader_options *o, uint64_t seed,
                                 uint64_t G, uint32_t version, bool json)
{
    bb_sampler_t *s;
    bb_order_stats st;
    BB_TRY(bb_sampler_create(ds, seed, o->shuffle_frames, version, &s));
    bb_status rc = bb_sampler_order_stats(s, 0, G, &st);
    bb_sampler_destroy(s);
    BB_TRY(rc);
    uint32_t could = G < st.frames ? (uint32_t)G : st.frames;
    if (!json) {
        printf("data order: %s, %u frames, shuffle windows of %u frames (order version %u), global batch %llu: "
               "%llu batches an epoch\n", data, st.frames, o->shuffle_frames, version, (unsigned long long)G,
               (unsigned long long)st.batches);
        printf("  frames a batch draws from   min %u  median %u  max %u  (of %u it could)\n", st.frames_per_batch_min,
               st.frames_per_batch_median, st.frames_per_batch_max, could);
        printf("  spread in the source        min %.3f  median %.3f  (of the dataset)\n", st.spread_min,
               st.spread_median);
        return BB_OK;
    }
    json_t *j = json_pack("{s:s, s:{s:I, s:i, s:i, s:i, s:I, s:I, s:i, s:i, s:i, s:f, s:f}}", "data", data, "order",
                          "global_batch", (json_int_t)G, "version", (int)version, "shuffle_frames",
                          (int)o->shuffle_frames, "frames", (int)st.frames, "batches", (json_int_t)st.batches,
                          "frames_possible", (json_int_t)could, "frames_per_batch_min", (int)st.frames_per_batch_min,
                          "frames_per_batch_median", (int)st.frames_per_batch_median, "frames_per_batch_max",
                          (int)st.frames_per_batch_max, "spread_min", st.spread_min, "spread_median",
                          st.spread_median);
    bb_status wrote = j ? bb_json_write_line(stdout, j) : bb_fail(BB_ERR_NOMEM, "out of memory");
    json_decref(j);
    return wrote;
}

int bb_bench_loader(int argc, char **argv)
{
    const char *data = NULL;
    int threads = BB_LOADER_THREADS_DEFAULT;
    int64_t micro_batch = 256, seed = 1, prefetch = 0, gpus = 0; /* train's seed */
    double seconds = 3, consumer = 0, tokens_per_s = 0;
    bool cold = false, warm = false, only = false, json = false, pinned = false, order = false;
    int64_t global_batch = 64, order_version = BB_ORDER_CURRENT;
    bb_loader_options o;
    bb_loader_defaults(&o);
    data_flags df = DATA_FLAGS_DEFAULT;
    const bb_opt opts[] = {
        {"--data", BB_OPT_STRING, &data, "DIR|URL", "dataset directory (or one shard), or an s3:// or https:// "
         "dataset (mirrored first: the rates are the cache's)", .required = true},
        DATA_FLAGS_OPTS(df),
        LOADER_FLAG_OPTS(threads, o.io, o.direct, o.shuffle_frames, NULL, NULL),
        {"--micro-batch", BB_OPT_INT, &micro_batch, "B", "records per batch", .min = 1, .max = 1 << 24},
        {"--prefetch", BB_OPT_INT, &prefetch, "N", "batches prepared ahead of each consumer (0: 16, fewer for "
         "large batches)", .min = 0, .max = 1024},
        {"--seed", BB_OPT_INT, &seed, "N", "sampler seed", .min = 0, .max = (double)INT64_MAX},
        {"--seconds", BB_OPT_DOUBLE, &seconds, "S", "how long each warm run (and each probe) lasts", .min = 0.01,
         .max = 3600},
        {"--warm", BB_OPT_FLAG, &warm, NULL, "only the warm runs"},
        {"--cold", BB_OPT_FLAG, &cold, NULL, "only the cold runs: the shards dropped from the page cache, then one "
         "epoch"},
        {"--no-scaling", BB_OPT_FLAG, &only, NULL, "only --loader-threads, not every count from 1"},
        {"--consumer", BB_OPT_DOUBLE, &consumer, "RATE", "simulate GPUs consuming RATE tokens/s each (samples/s "
         "for images); with --gpus N, N of them", .min = 1e-3, .max = 1e15},
        {"--gpus", BB_OPT_INT, &gpus, "N", "simulated GPUs (with --consumer or --tokens-per-s; default 1)", .min = 1,
         .max = MAX_GPUS},
        {"--tokens-per-s", BB_OPT_DOUBLE, &tokens_per_s, "RATE", "the same as --consumer RATE", .min = 1e-3,
         .max = 1e15},
        {"--pinned", BB_OPT_FLAG, &pinned, NULL, "batch slots in pinned memory of cuda:0 (as training on GPUs does)"},
        {"--order", BB_OPT_FLAG, &order, NULL, "measure the data order, not the speed (see above)"},
        {"--global-batch", BB_OPT_INT, &global_batch, "G", "--order: records a step (default 64)", .min = 1,
         .max = 1 << 30},
        {"--order-version", BB_OPT_INT, &order_version, "V", "--order: the order's version (1: windows of W frames "
         "and the remainder; 2: balanced windows, the default)", .min = BB_ORDER_FIXED_WINDOWS,
         .max = BB_ORDER_BALANCED},
        {"--json", BB_OPT_FLAG, &json, NULL, "print one JSON object: {\"rows\": [...]}, {\"consumer\": {...}} or "
         "{\"order\": {...}}"},
        {0}};
    bb_dataset_t *ds = NULL;
    bb_backend_t *gpu = NULL;
    json_t *out = NULL, *rows = NULL, *sim = NULL;
    bb_status rc = bb_cli_parse("bench loader", opts, argc, argv, NULL);
    if (rc == BB_OK && consumer > 0 && tokens_per_s > 0 && consumer != tokens_per_s)
        rc = bb_fail(BB_ERR_ARG, "--consumer %g and --tokens-per-s %g name two rates: give one", consumer,
                     tokens_per_s);
    double rate = consumer > 0 ? consumer : tokens_per_s;
    if (rc == BB_OK && gpus && !(rate > 0))
        rc = bb_fail(BB_ERR_ARG, "--gpus %lld needs the rate they consume: --tokens-per-s RATE (or --consumer RATE)",
                     (long long)gpus);
    if (rc == BB_OK && rate > 0 && (warm || cold))
        rc = bb_fail(BB_ERR_ARG, "the consumer simulation runs warm: --%s does not apply", cold ? "cold" : "warm");
    if (rc == BB_OK && warm && cold) rc = bb_fail(BB_ERR_ARG, "--warm and --cold: give one (or neither for both)");
    const char *url = data;
    if (rc == BB_OK) rc = data_flags_resolve(&df, &data, false);
    if (rc == BB_OK) rc = bb_dataset_open(data, &ds);
    if (rc == BB_OK && order) {
        rc = order_statistic(ds, data, &o, (uint64_t)seed, (uint64_t)global_batch, (uint32_t)order_version, json);
        bb_dataset_close(ds);
        return rc == BB_OK ? BB_EXIT_OK : bb_cli_report(rc, usage, summary, opts);
    }
    if (rc == BB_OK) {
        o.micro_batch = (uint32_t)micro_batch;
        o.seed = (uint64_t)seed;
        o.prefetch = (uint32_t)prefetch;
        if (pinned) {
            bb_backend_options bo = {0};
            rc = bb_backend_create_cuda(&bo, &gpu);
            o.host_alloc = bb_backend_slot_alloc, o.host_free = bb_backend_slot_free, o.host_ctx = gpu;
        }
    }
    units u = ds ? units_of(ds) : (units){.per_record = 1};
    run_config asked = {.threads = (uint32_t)threads, .gpus = gpus ? (uint32_t)gpus : 1, .rate = rate / u.per_record,
                        .seconds = seconds};
    if (rc == BB_OK && !json) {
        const bb_shard_meta *m = bb_dataset_meta(ds);
        printf("loader benchmark: %s (%llu records of %u bytes, %s), micro-batch %lld, %llu batches an epoch, "
               "%llu records dropped at its end\n", data, (unsigned long long)bb_dataset_record_count(ds),
               m->record_size, bb_record_kind_name(m->kind), (long long)micro_batch,
               (unsigned long long)(bb_dataset_record_count(ds) / (uint64_t)micro_batch),
               (unsigned long long)(bb_dataset_record_count(ds) % (uint64_t)micro_batch));
        if (df.used) {
            char b[16];
            printf("  from %s: %llu files, %s downloaded into the cache in %.3f s (the rates below read the cache)\n",
                   url, (unsigned long long)df.stats[0].files, bb_format_bytes(df.stats[0].bytes, b, sizeof b),
                   df.stats[0].seconds);
        }
        if (!(rate > 0))
            printf("  threads  cache   records/s     tokens/s  raw MB/s  compr. MB/s  first batch   I/O  decompress  "
                   "copy  frame wait  slot wait  data wait\n");
    }
    if (rc == BB_OK && rate > 0) {
        rc = simulate(ds, &o, &asked, u, &sim);
    } else if (rc == BB_OK) {
        rows = json ? json_array() : NULL;
        rc = scaling(ds, &o, &asked, u, !cold, !warm, only, rows);
    }
    if (rc == BB_OK && json) {
        out = json_pack("{s:s, s:I, s:I, s:o}", "data", data, "records", (json_int_t)bb_dataset_record_count(ds),
                        "record_bytes", (json_int_t)bb_dataset_meta(ds)->record_size, "tokens_per_record",
                        u.tokens ? json_integer((json_int_t)u.per_record) : json_null());
        if (out) json_object_set_new(out, sim ? "consumer" : "rows", sim ? json_incref(sim) : json_incref(rows));
        if (out && df.used) /* the mirror before the loader ran: a cold remote epoch costs both */
            json_object_set_new(out, "remote", json_pack("{s:s, s:I, s:I, s:o}", "url", url, "downloaded_files",
                                                         (json_int_t)df.stats[0].files, "downloaded_bytes",
                                                         (json_int_t)df.stats[0].bytes, "mirror_s",
                                                         bb_json_fixed(df.stats[0].seconds, 3)));
        rc = out ? bb_json_write_line(stdout, out) : bb_fail(BB_ERR_NOMEM, "out of memory");
    } else if (rc == BB_OK && sim) {
        simulation_text(sim);
    }
    json_decref(out), json_decref(rows), json_decref(sim);
    bb_dataset_close(ds);
    bb_backend_destroy(gpu);
    return rc == BB_OK ? BB_EXIT_OK : bb_cli_report(rc, usage, summary, opts);
}
