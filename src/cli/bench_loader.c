/* bench_loader.c — `bigbatch bench loader`: how fast the loader delivers a
 * dataset to one consumer that does nothing but take and release batches. */
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>

#include "bench.h"
#include "bigbatch/json.h"
#include "bigbatch/backend.h"
#include "bigbatch/loader.h"
#include "model_flags.h"

static const char usage[] =
    "bigbatch bench loader --data DIR [--loader-threads N] [--io auto|uring|pread] [--micro-batch B]\n"
    "                      [--seconds S] [--cold] [--direct] [--pinned] [--json]";
static const char summary[] =
    "Runs the loader on DIR with one consumer that only takes and releases batches,\n"
    "and prints records/s, raw MB/s (record bytes delivered) and compressed MB/s\n"
    "(shard bytes read), with MB = 10^6 bytes, timed from the end of the loader's\n"
    "setup (reported apart). --cold first drops the shards from\n"
    "the page cache (posix_fadvise DONTNEED) and then reads exactly one epoch.\n"
    "perf/loader_bench.sh runs it beside `zstd -d` and `cat` on the same files.\n\n"
    "example: bigbatch bench loader --data data/kjv/train --loader-threads 2";

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

typedef struct bench_result {
    double seconds, records, raw_bytes, wait_seconds, startup_seconds;
    uint64_t steps_per_epoch, dropped;
    bb_loader_stats stats;
    uint64_t disk_bytes;
    char io[64];
} bench_result;

static bb_status run(const bb_dataset_t *ds, const bb_loader_options *o, double seconds, bool cold, bench_result *r)
{
    if (cold) BB_TRY(drop_cache(ds));
    uint64_t disk0 = disk_read_bytes();
    bb_loader_options lo = *o;
    if (cold) { /* exactly one epoch */
        uint64_t g = (uint64_t)o->micro_batch;
        lo.steps = bb_dataset_record_count(ds) / (g ? g : 1);
    }
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
    uint64_t deadline = t0 + (uint64_t)(seconds * 1e9);
    bb_status rc;
    bb_batch b;
    while ((rc = bb_loader_next(l, 0, &b)) == BB_OK) {
        r->records += b.count;
        r->raw_bytes += (double)b.count * b.record_size;
        bb_loader_release(l, &b);
        if (bb_cli_interrupted) {
            rc = bb_fail(BB_ERR_INTERRUPTED, "interrupted");
            break;
        }
        if (!cold && bb_clock_ns() >= deadline) break;
    }
    r->seconds = (bb_clock_ns() - t0) / 1e9;
    bb_loader_get_stats(l, &r->stats);
    r->wait_seconds = r->stats.wait_ns / 1e9;
    r->disk_bytes = disk_read_bytes() - disk0;
    bb_loader_destroy(l);
    if (rc == BB_ERR_CLOSED && cold) rc = BB_OK; /* the epoch ended */
    return rc;
}

int bb_bench_loader(int argc, char **argv)
{
    const char *data = NULL;
    int threads = BB_LOADER_THREADS_DEFAULT;
    int64_t micro_batch = 256, seed = 1, prefetch = 0; /* train's seed */
    double seconds = 3;
    bool cold = false, json = false, pinned = false;
    bb_loader_options o;
    bb_loader_defaults(&o);
    const bb_opt opts[] = {
        {"--data", BB_OPT_STRING, &data, "DIR", "dataset directory (or one shard)", .required = true},
        LOADER_FLAG_OPTS(threads, o.io, o.direct, o.shuffle_frames, NULL, NULL),
        {"--micro-batch", BB_OPT_INT, &micro_batch, "B", "records per batch", .min = 1, .max = 1 << 24},
        {"--prefetch", BB_OPT_INT, &prefetch, "N", "batches prepared ahead of the consumer (0: 16, fewer for large batches)", .min = 0, .max = 1024},
        {"--seed", BB_OPT_INT, &seed, "N", "sampler seed", .min = 0, .max = (double)INT64_MAX},
        {"--seconds", BB_OPT_DOUBLE, &seconds, "S", "how long to run (without --cold)", .min = 0.01, .max = 3600},
        {"--cold", BB_OPT_FLAG, &cold, NULL, "drop the shards from the page cache, then read one epoch"},
        {"--pinned", BB_OPT_FLAG, &pinned, NULL, "batch slots in pinned memory of cuda:0 (as training on GPUs does)"},
        {"--json", BB_OPT_FLAG, &json, NULL, "print one JSON object"},
        {0}};
    bb_dataset_t *ds = NULL;
    bb_backend_t *gpu = NULL;
    bench_result r = {0};
    bb_status rc = bb_cli_parse("bench loader", opts, argc, argv, NULL);
    if (rc == BB_OK) rc = bb_dataset_open(data, &ds);
    if (rc == BB_OK) {
        o.threads = (uint32_t)threads, o.micro_batch = (uint32_t)micro_batch;
        o.seed = (uint64_t)seed;
        o.prefetch = (uint32_t)prefetch;
        if (pinned) {
            bb_backend_options bo = {0};
            rc = bb_backend_create_cuda(&bo, &gpu);
            o.host_alloc = bb_backend_slot_alloc, o.host_free = bb_backend_slot_free, o.host_ctx = gpu;
        }
        if (rc == BB_OK) rc = run(ds, &o, seconds, cold, &r);
    }
    if (rc != BB_OK) {
        bb_dataset_close(ds);
        bb_backend_destroy(gpu);
        return bb_cli_report(rc, usage, summary, opts);
    }
    double records_per_s = r.records / r.seconds, raw = r.raw_bytes / r.seconds / 1e6;
    double compressed = r.stats.compressed_bytes / r.seconds / 1e6, wait_pct = 100 * r.wait_seconds / r.seconds;
    if (json) {
        json_t *o = json_pack("{s:o, s:o, s:o, s:s, s:b, s:I, s:I, s:o, s:o, s:b, s:o, s:o, s:o}", "records_per_s",
                              bb_json_fixed(records_per_s, 0), "raw_mb_per_s", bb_json_fixed(raw, 1),
                              "compressed_mb_per_s", bb_json_fixed(compressed, 1), "io", r.io, "pinned", pinned,
                              "threads", (json_int_t)threads, "micro_batch", (json_int_t)micro_batch, "records",
                              bb_json_fixed(r.records, 0), "seconds", bb_json_fixed(r.seconds, 4), "cold", cold,
                              "data_wait_pct", bb_json_fixed(wait_pct, 1), "disk_read_mb",
                              bb_json_fixed(r.disk_bytes / 1e6, 1), "startup_ms",
                              bb_json_fixed(r.startup_seconds * 1e3, 2));
        bb_json_write_line(stdout, o);
        json_decref(o);
    } else {
        const bb_shard_meta *m = bb_dataset_meta(ds);
        printf("loader benchmark: %s (%llu records of %u bytes, %s)\n", data,
               (unsigned long long)bb_dataset_record_count(ds), m->record_size, bb_record_kind_name(m->kind));
        printf("  %s%s, %lld thread%s, micro-batch %lld, %.2f s%s (after %.2f ms of setup)\n", r.io,
               pinned ? ", pinned slots" : "",
               (long long)threads, threads == 1 ? "" : "s", (long long)micro_batch, r.seconds,
               cold ? ", one cold epoch" : "", r.startup_seconds * 1e3);
        printf("  %llu batches per epoch, %llu records dropped at the end of each\n",
               (unsigned long long)r.steps_per_epoch, (unsigned long long)r.dropped);
        printf("  records/s        %12.0f\n", records_per_s);
        printf("  raw MB/s         %12.1f\n", raw);
        printf("  compressed MB/s  %12.1f\n", compressed);
        printf("  consumer waited  %11.1f%% of the time\n", wait_pct);
        printf("  loader threads waited for frames %.1f%%, for free slots %.1f%% of their time\n",
               100 * r.stats.frame_wait_ns / 1e9 / r.seconds / threads,
               100 * r.stats.slot_wait_ns / 1e9 / r.seconds / threads);
        if (cold) printf("  read from disk   %9.1f MB\n", r.disk_bytes / 1e6);
    }
    bb_dataset_close(ds);
    bb_backend_destroy(gpu);
    return BB_EXIT_OK;
}
