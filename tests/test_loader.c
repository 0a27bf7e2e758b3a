/* test_loader.c — the loader: every record exactly once, in the same
 * per-step sets whatever the split, threads or io; determinism; exact
 * resume; errors at the consumer; io_uring fallback; shutdown; bench
 * loader. (The sampler's order: test_sampler.c.) */
#include <errno.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>


#include "loader_fixture.h"

TestSuite(loader, .init = dataset_up, .fini = dataset_down);

/* ---- loader: exactly once, same step sets ------------------------------ */
static bb_loader_t *start(const bb_loader_options *o)
{
    bb_loader_t *l;
    cr_assert_eq(bb_loader_create(ds, o, &l), BB_OK, "%s", bb_error_message());
    return l;
}
typedef struct split {
    uint32_t devices, accumulation, micro_batch;
} split;

static const split splits[] = {{1, 1, 32}, {2, 2, 8}, {4, 1, 8}, {1, 4, 8}, {2, 4, 4}, {4, 8, 1}};

/* Consumes `steps` steps starting at (epoch, step) as the trainer would (for
 * each step, each micro-step, each device) and checks every batch against
 * the sampler's order and every payload against its id. Returns how many
 * records came, and marks each id in `seen` (may be NULL). */
static uint64_t consume_and_check(bb_loader_t *l, const bb_loader_options *o, uint64_t epoch,
                                  uint64_t step, uint64_t steps, uint32_t *seen)
{
    uint32_t W = o->world_devices ? o->world_devices : o->devices; /* the job's devices; ours from first_device */
    uint64_t G = (uint64_t)W * o->accumulation * o->micro_batch, S = RECORDS / G;
    bb_sampler_t *s;
    cr_assert_eq(bb_sampler_create(ds, o->seed, o->shuffle_frames, o->order ? o->order : BB_ORDER_CURRENT, &s), BB_OK);
    uint64_t *expect = malloc(G * sizeof *expect), records = 0;
    for (uint64_t n = 0; n < steps; n++, step++) {
        if (step == S) epoch++, step = 0;
        cr_assert_eq(bb_sampler_epoch_ids(s, epoch, step * G, G, expect), BB_OK);
        for (uint32_t m = 0; m < o->accumulation; m++)
            for (uint32_t d = 0; d < o->devices; d++) {
                bb_batch b;
                cr_assert_eq(bb_loader_next(l, d, &b), BB_OK, "epoch %llu step %llu micro %u device %u: %s",
                             (unsigned long long)epoch, (unsigned long long)step, m, d, bb_error_message());
                cr_assert_eq(b.epoch, epoch);
                cr_assert_eq(b.step, step);
                cr_assert_eq(b.micro_step, m);
                cr_assert_eq(b.device, d);
                cr_assert_eq(b.count, o->micro_batch);
                cr_assert_eq(b.record_size, RECORD_SIZE);
                uint64_t base = ((uint64_t)m * W + o->first_device + d) * o->micro_batch;
                for (uint32_t i = 0; i < b.count; i++) {
                    cr_assert_eq(b.record_ids[i], expect[base + i], "step %llu position %llu",
                                 (unsigned long long)step, (unsigned long long)(base + i));
                    uint32_t words[RECORD_WORDS];
                    make_record(b.record_ids[i], words);
                    cr_assert_eq(memcmp(b.data + (size_t)i * RECORD_SIZE, words, RECORD_SIZE), 0,
                                 "payload of record %llu", (unsigned long long)b.record_ids[i]);
                    if (seen) seen[b.record_ids[i]]++;
                }
                records += b.count;
                bb_loader_release(l, &b);
            }
    }
    free(expect);
    bb_sampler_destroy(s);
    return records;
}

static void check_one_epoch(split sp, uint32_t threads, bb_io_mode io, bool direct)
{
    bb_loader_options o;
    bb_loader_defaults(&o);
    o.seed = 11;
    o.devices = sp.devices, o.accumulation = sp.accumulation, o.micro_batch = sp.micro_batch;
    o.threads = threads, o.io = io, o.direct = direct;
    uint64_t G = (uint64_t)sp.devices * sp.accumulation * sp.micro_batch, S = RECORDS / G;
    o.steps = S;
    bb_loader_t *l = start(&o);
    cr_assert_eq(bb_loader_steps_per_epoch(l), S);
    cr_assert_eq(bb_loader_dropped_per_epoch(l), RECORDS - S * G);
    uint32_t seen[RECORDS] = {0};
    uint64_t got = consume_and_check(l, &o, 0, 0, S, seen);
    cr_assert_eq(got, S * G);
    uint64_t once = 0;
    for (int i = 0; i < RECORDS; i++) {
        cr_assert_leq(seen[i], 1, "record %d delivered %u times", i, seen[i]);
        once += seen[i];
    }
    cr_assert_eq(once, RECORDS - bb_loader_dropped_per_epoch(l));
    bb_batch b;
    for (uint32_t d = 0; d < sp.devices; d++) {
        cr_assert_eq(bb_loader_next(l, d, &b), BB_ERR_CLOSED, "device %u: a batch past the last step", d);
        cr_assert(strstr(bb_error_message(), "every requested step"), "%s", bb_error_message());
    }
    /* Each frame was read and decompressed once in the epoch: the frames
     * holding only dropped records not at all. */
    bb_loader_stats st;
    bb_loader_get_stats(l, &st);
    uint32_t frames = 0;
    for (uint32_t s = 0; s < bb_dataset_shard_count(ds); s++) frames += bb_shard_frame_count(bb_dataset_shard(ds, s));
    cr_assert_leq(st.frames, frames, "%llu frames decompressed, the dataset has %u", (unsigned long long)st.frames,
                  frames);
    cr_assert_geq(st.frames + (RECORDS - S * G), frames, "too few frames decompressed: %llu of %u",
                  (unsigned long long)st.frames, frames);
    cr_assert_eq(st.batches, S * sp.accumulation * sp.devices);
    bb_loader_destroy(l);
}

static void every_split(uint32_t threads, bb_io_mode io, bool direct)
{
    for (size_t i = 0; i < sizeof splits / sizeof *splits; i++) check_one_epoch(splits[i], threads, io, direct);
}

Test(loader, exactly_once_1_thread_pread) { every_split(1, BB_IO_PREAD, false); }
Test(loader, exactly_once_2_threads_pread) { every_split(2, BB_IO_PREAD, false); }
Test(loader, exactly_once_4_threads_pread) { every_split(4, BB_IO_PREAD, false); }
Test(loader, exactly_once_1_thread_uring) { every_split(1, BB_IO_URING, false); }
Test(loader, exactly_once_2_threads_uring) { every_split(2, BB_IO_URING, false); }
Test(loader, exactly_once_4_threads_uring) { every_split(4, BB_IO_URING, false); }
Test(loader, exactly_once_o_direct) { every_split(2, BB_IO_URING, true), every_split(3, BB_IO_PREAD, true); }

/* Several epochs with a small prefetch: epoch tables are recycled while
 * threads straddle epochs; the epoch after is another permutation. */
Test(loader, many_epochs_in_one_run)
{
    bb_loader_options o;
    bb_loader_defaults(&o);
    o.devices = 2, o.accumulation = 3, o.micro_batch = 16, o.threads = 3, o.prefetch = 1, o.shuffle_frames = 3;
    uint64_t S = RECORDS / 96;
    o.steps = 4 * S + 3;
    bb_loader_t *l = start(&o);
    cr_assert_eq(consume_and_check(l, &o, 0, 0, o.steps, NULL), o.steps * 96);
    bb_loader_destroy(l);
}

/* Starting at (epoch, step) yields what the full run yields there: the
 * batches are checked against the sampler's order, which the full runs
 * above match. */
Test(loader, resume_at_epoch_and_step)
{
    bb_loader_options o;
    bb_loader_defaults(&o);
    o.seed = 5, o.devices = 2, o.accumulation = 2, o.micro_batch = 8;
    o.start_epoch = 3, o.start_step = 29, o.steps = 6; /* crosses into epoch 4 */
    bb_loader_t *l = start(&o);
    cr_assert_eq(consume_and_check(l, &o, 3, 29, 6, NULL), 6 * 32);
    bb_loader_destroy(l);

    o.start_step = RECORDS / 32;
    cr_assert_eq(bb_loader_create(ds, &o, &l), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "past the epoch"), "%s", bb_error_message());
}

/* More threads than units in an epoch: a thread's next unit can lie two or
 * more epochs ahead, and the epoch tables must still be recycled without
 * anyone waiting in a cycle. */
Test(loader, more_threads_than_units_per_epoch, .timeout = 60)
{
    const uint32_t micro_batches[] = {1000, 500, 400};
    for (uint32_t threads = 3; threads <= 8; threads++)
        for (size_t k = 0; k < 3; k++) {
            bb_loader_options o;
            bb_loader_defaults(&o);
            o.micro_batch = micro_batches[k], o.threads = threads, o.steps = 3 * threads + 1;
            bb_loader_t *l = start(&o);
            cr_assert_eq(consume_and_check(l, &o, 0, 0, o.steps, NULL), o.steps * o.micro_batch);
            bb_loader_destroy(l);
        }
}

/* Resuming near the end of an epoch reads only the frames around the
 * resume point, not everything before it. */
Test(loader, resume_reads_only_what_it_needs)
{
    bb_loader_options o;
    bb_loader_defaults(&o);
    o.micro_batch = 10, o.start_step = 95, o.steps = 5, o.threads = 1;
    bb_loader_t *l = start(&o);
    cr_assert_eq(consume_and_check(l, &o, 0, 95, 5, NULL), 50);
    bb_loader_stats st;
    bb_loader_get_stats(l, &st);
    /* 50 records span at most 2 windows of 8 frames; one more window may be
     * read ahead. The whole epoch has 140-odd frames. */
    cr_assert_leq(st.frames, 24, "resuming at step 95 of 100 decompressed %llu frames",
                  (unsigned long long)st.frames);
    bb_loader_destroy(l);
}

/* A device may keep `hold` batches unreleased; asking for more fails at
 * once instead of waiting for ever for a slot it holds itself. */
Test(loader, holding_too_many_batches_is_an_error_not_a_hang, .timeout = 20)
{
    bb_loader_options o;
    bb_loader_defaults(&o);
    o.micro_batch = 4, o.threads = 1, o.prefetch = 1, o.hold = 3;
    bb_loader_t *l = start(&o);
    bb_batch held[3], extra;
    for (int i = 0; i < 3; i++) cr_assert_eq(bb_loader_next(l, 0, &held[i]), BB_OK, "batch %d", i);
    cr_assert_eq(bb_loader_next(l, 0, &extra), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "holds 3 unreleased batches"), "%s", bb_error_message());
    bb_loader_release(l, &held[0]);
    cr_assert_eq(bb_loader_next(l, 0, &extra), BB_OK, "%s", bb_error_message());
    cr_assert_eq(extra.step, 3, "the refused call must not skip a batch");
    bb_loader_destroy(l);
}

/* When one device's thread stops consuming, another device's thread ends
 * up blocked behind it; bb_loader_stop() wakes it with BB_ERR_CLOSED. */
struct device_thread {
    bb_loader_t *loader;
    uint64_t batches;
    bb_status status;
    _Atomic pid_t tid;
};

static void *consume_device_1(void *arg)
{
    struct device_thread *t = arg;
    bb_batch b;
    atomic_store(&t->tid, tu_thread_id());
    while ((t->status = bb_loader_next(t->loader, 1, &b)) == BB_OK) {
        t->batches++;
        bb_loader_release(t->loader, &b);
    }
    return NULL;
}

Test(loader, stop_wakes_a_device_blocked_behind_another, .timeout = 20)
{
    bb_loader_options o;
    bb_loader_defaults(&o);
    o.devices = 2, o.micro_batch = 4, o.threads = 1, o.prefetch = 1;
    bb_loader_t *l = start(&o);
    struct device_thread t = {.loader = l};
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, consume_device_1, &t), 0);
    while (!atomic_load(&t.tid)) nanosleep(&(struct timespec){0, 100000}, NULL);
    /* device 0 never consumes: device 1 blocks behind it */
    cr_assert(tu_wait_blocked(atomic_load(&t.tid), 10), "device 1 never blocked");
    bb_loader_stop(l);
    pthread_join(thread, NULL);
    cr_assert_eq(t.status, BB_ERR_CLOSED);
    cr_assert_lt(t.batches, 100, "device 1 should have stalled behind device 0");
    bb_loader_destroy(l);
}

Test(loader, rejects_a_global_batch_larger_than_the_dataset)
{
    bb_loader_options o;
    bb_loader_defaults(&o);
    o.devices = 2, o.accumulation = 4, o.micro_batch = 200;
    bb_loader_t *l;
    cr_assert_eq(bb_loader_create(ds, &o, &l), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "fewer than one global batch of 1600"), "%s", bb_error_message());
    o.micro_batch = 0;
    cr_assert_eq(bb_loader_create(ds, &o, &l), BB_ERR_ARG);
}

/* A corrupt frame in the middle of the epoch: the batches before it arrive
 * intact, then the consumer gets the error naming file and frame. */
static void corrupt_frame_reaches_consumer(bb_io_mode io, uint32_t threads)
{
    char *shard = tu_path(dir, "shard-00002.bbs");
    const bb_shard_frame *f = bb_shard_frame_at(bb_dataset_shard(ds, 2), 3);
    tu_flip_byte(shard, (long)(f->offset + f->compressed_size / 2), 0x5a); /* under the open dataset */
    bb_loader_options o;
    bb_loader_defaults(&o);
    o.micro_batch = 10, o.threads = threads, o.io = io, o.steps = RECORDS / 10;
    bb_loader_t *l = start(&o);
    bb_batch b;
    bb_status rc;
    uint64_t good = 0;
    while ((rc = bb_loader_next(l, 0, &b)) == BB_OK) {
        good++;
        bb_loader_release(l, &b);
    }
    cr_assert_eq(rc, BB_ERR_CORRUPT, "got %s: %s", bb_status_name(rc), bb_error_message());
    cr_assert_lt(good, RECORDS / 10, "every batch arrived despite the corrupt frame");
    cr_assert(strstr(bb_error_message(), "shard-00002.bbs"), "%s", bb_error_message());
    cr_assert(strstr(bb_error_message(), "frame 3"), "%s", bb_error_message());
    cr_assert_eq(bb_loader_next(l, 0, &b), BB_ERR_CORRUPT, "a later call must fail the same way");
    bb_loader_destroy(l);
    free(shard);
}

Test(loader, corrupt_frame_surfaces_at_the_consumer_uring) { corrupt_frame_reaches_consumer(BB_IO_URING, 2); }
Test(loader, corrupt_frame_surfaces_at_the_consumer_pread) { corrupt_frame_reaches_consumer(BB_IO_PREAD, 3); }

/* A truncated shard (its seek table intact elsewhere is impossible, so cut
 * a frame's bytes out from under the loader after opening) is a read error
 * naming the file. */
Test(loader, shard_shrunk_under_the_loader_is_an_io_error)
{
    char *shard = tu_path(dir, "shard-00001.bbs");
    tu_truncate(shard, 40);
    bb_loader_options o;
    bb_loader_defaults(&o);
    o.micro_batch = 10, o.steps = RECORDS / 10;
    bb_loader_t *l = start(&o);
    bb_batch b;
    bb_status rc;
    while ((rc = bb_loader_next(l, 0, &b)) == BB_OK) bb_loader_release(l, &b);
    cr_assert_eq(rc, BB_ERR_IO, "got %s: %s", bb_status_name(rc), bb_error_message());
    cr_assert(strstr(bb_error_message(), "shard-00001.bbs: frame"), "%s", bb_error_message());
    bb_loader_destroy(l);
    free(shard);
}

/* Destroying mid-epoch, with a batch still held and threads blocked on full
 * rings, joins everything and frees everything (ASan checks the frees). */
Test(loader, destroy_mid_epoch)
{
    for (uint32_t threads = 1; threads <= 4; threads++) {
        bb_loader_options o;
        bb_loader_defaults(&o);
        o.devices = 2, o.micro_batch = 4, o.threads = threads;
        bb_loader_t *l;
        cr_assert_eq(bb_loader_create(ds, &o, &l), BB_OK, "%s", bb_error_message());
        bb_batch held, b;
        cr_assert_eq(bb_loader_next(l, 0, &held), BB_OK);
        cr_assert_eq(bb_loader_next(l, 1, &b), BB_OK);
        bb_loader_release(l, &b);
        cr_assert_eq(bb_loader_next(l, 0, &b), BB_OK);
        bb_loader_release(l, &b);
        bb_loader_destroy(l);
    }
    bb_loader_destroy(NULL);
}

/* A job of several processes: each process's loader serves its own
 * devices of the job's (world_devices, first_device) and delivers exactly
 * their records; together they deliver the epoch once, as one loader for
 * all the devices would, also when resumed mid-epoch. */
Test(loader, processes_split_the_job_s_devices)
{
    static const uint32_t layouts[][3] = {{4, 2, 2}, {3, 1, 1}}; /* world devices, per process, resume step */
    for (size_t k = 0; k < 2; k++) {
        uint32_t W = layouts[k][0], N = layouts[k][1], from = layouts[k][2];
        uint32_t seen[RECORDS] = {0};
        uint64_t got = 0, G = (uint64_t)W * 2 * 8, S = RECORDS / G;
        for (uint32_t first = 0; first < W; first += N) {
            bb_loader_options o;
            bb_loader_defaults(&o);
            o.seed = 5, o.devices = N, o.world_devices = W, o.first_device = first;
            o.accumulation = 2, o.micro_batch = 8, o.threads = 2, o.start_step = from, o.steps = S - from;
            bb_loader_t *l = start(&o);
            cr_assert_eq(bb_loader_steps_per_epoch(l), S);
            got += consume_and_check(l, &o, 0, from, S - from, seen);
            bb_loader_destroy(l);
        }
        cr_assert_eq(got, (S - from) * G, "%u devices in processes of %u: %llu records", W, N, (unsigned long long)got);
        for (int i = 0; i < RECORDS; i++) cr_assert_leq(seen[i], 1, "record %d delivered %u times", i, seen[i]);
    }
    bb_loader_options o;
    bb_loader_defaults(&o);
    o.devices = 2, o.world_devices = 3, o.first_device = 2;
    bb_loader_t *l;
    cr_assert_eq(bb_loader_create(ds, &o, &l), BB_ERR_ARG, "devices 2..3 of a job of 3");
}

/* bb_loader_slot_bytes (what the planner counts) is what the loader
 * allocates for each device's slots: their data through the host_alloc
 * hook, and an 8-byte id per record. */
static void *counting_alloc(void *ctx, size_t bytes)
{
    *(uint64_t *)ctx += bytes;
    return malloc(bytes);
}
static void counting_free(void *ctx, void *ptr, size_t bytes) { (void)ctx, (void)bytes, free(ptr); }

Test(loader, slot_bytes_are_what_the_loader_allocates)
{
    for (uint32_t threads = 1; threads <= 4; threads++)
        for (uint32_t devices = 1; devices <= 3; devices++)
            for (uint32_t prefetch = 0; prefetch <= 5; prefetch += 5) {
                uint64_t data = 0;
                bb_loader_options o;
                bb_loader_defaults(&o);
                o.devices = devices, o.micro_batch = 4, o.threads = threads, o.prefetch = prefetch, o.hold = 3;
                o.host_alloc = counting_alloc, o.host_free = counting_free, o.host_ctx = &data;
                bb_loader_t *l;
                cr_assert_eq(bb_loader_create(ds, &o, &l), BB_OK, "%s", bb_error_message());
                bb_loader_destroy(l);
                uint64_t want = bb_loader_slot_bytes(&o, RECORD_SIZE) * devices;
                uint64_t got = data / RECORD_SIZE * (RECORD_SIZE + sizeof(uint64_t)); /* and their ids */
                cr_assert_eq(got, want, "%u threads, %u devices, prefetch %u: the loader allocated %llu bytes of "
                             "slots, bb_loader_slot_bytes says %llu", threads, devices, prefetch,
                             (unsigned long long)got, (unsigned long long)want);
            }
}

/* Registered io_uring buffers count against RLIMIT_MEMLOCK: with a limit
 * that fits the ring but not 8 buffers of 4 KiB or more (and CAP_IPC_LOCK
 * dropped, which would bypass it) the loader reads into unregistered
 * buffers, and the data is the same. */
Test(loader, unregistered_reads_when_memlock_is_too_small)
{
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct caps[2];
    cr_assert_eq(syscall(SYS_capget, &header, caps), 0);
    caps[0].effective &= ~(1u << CAP_IPC_LOCK);
    cr_assert_eq(syscall(SYS_capset, &header, caps), 0, "cannot drop CAP_IPC_LOCK");
    struct rlimit small = {24 << 10, 24 << 10};
    cr_assert_eq(setrlimit(RLIMIT_MEMLOCK, &small), 0);
    bb_loader_options o;
    bb_loader_defaults(&o);
    o.io = BB_IO_URING, o.micro_batch = 8, o.steps = RECORDS / 8;
    bb_loader_t *l;
    bb_status rc = bb_loader_create(ds, &o, &l);
    /* Ring memory may count against the same per-user limit, shared with
     * other io_uring users of this uid (not root's: CAP_IPC_LOCK). */
    if (rc == BB_ERR_UNSUPPORTED && getuid() != 0) {
        dataset_down(); /* Criterion runs no .fini after a skip */
        cr_skip_test("skipped: the io_uring ring itself does not fit in 24 KiB of locked memory for this uid: %s",
                     bb_error_message());
    }
    cr_assert_eq(rc, BB_OK, "%s", bb_error_message());
    cr_assert_str_eq(bb_loader_io_description(l), "io_uring");
    cr_assert_eq(consume_and_check(l, &o, 0, 0, o.steps, NULL), o.steps * 8);
    bb_loader_destroy(l);
}

/* ---- bigbatch bench loader ---------------------------------------------- */
static double json_number(const char *json, const char *key)
{
    char needle[64];
    snprintf(needle, sizeof needle, "\"%s\": ", key);
    const char *p = strstr(json, needle);
    cr_assert_not_null(p, "no %s in %s", key, json);
    return strtod(p + strlen(needle), NULL);
}

Test(loader, bench_loader_json_and_errors)
{
    tu_run r = tu_bigbatch("bench", "loader", "--data", dir, "--micro-batch", "16", "--seconds", "0.2", "--warm",
                           "--no-scaling", "--json");
    cr_assert_eq(r.exit_code, 0, "stderr: %s", r.err);
    double records = json_number(r.out, "records_per_s"), raw = json_number(r.out, "raw_mb_per_s");
    cr_assert_gt(records, 0);
    cr_assert_gt(json_number(r.out, "compressed_mb_per_s"), 0);
    cr_assert_eq(json_number(r.out, "threads"), 2);
    cr_assert(strstr(r.out, "\"io\": \"io_uring"), "%s", r.out);
    cr_assert_float_eq(raw, records * RECORD_SIZE / 1e6, raw * 0.01 + 0.1, "raw MB/s %g vs %g records/s", raw, records);
    tu_run_free(&r);

    /* --cold reads exactly one epoch: RECORDS / 16 batches of 16. */
    r = tu_bigbatch("bench", "loader", "--data", dir, "--micro-batch", "16", "--cold", "--no-scaling", "--io", "pread",
                    "--json");
    cr_assert_eq(r.exit_code, 0, "stderr: %s", r.err);
    cr_assert(strstr(r.out, "\"io\": \"pread\"") && strstr(r.out, "\"cold\": true"), "%s", r.out);
    cr_assert_eq(json_number(strstr(r.out, "\"rows\""), "records"), RECORDS / 16 * 16, "%s", r.out);
    tu_run_free(&r);

    r = tu_bigbatch("bench", "loader", "--data", dir, "--micro-batch", "5000");
    tu_assert_error(&r, dir, "1000 records", "fewer than one global batch of 5000");
    tu_run_free(&r);
    r = tu_bigbatch("bench", "loader", "--seconds", "1");
    tu_assert_error(&r, "--data");
    tu_run_free(&r);
    r = tu_bigbatch("bench", "loader", "--data", dir, "--io", "mmap");
    tu_assert_error(&r, "--io", "mmap");
    tu_run_free(&r);
}

/* --order: the order's statistic, as the sampler computes it (version 1's
 * remainder window of one frame is its worst batch). */
Test(loader, bench_loader_order_reports_the_frames_a_batch_draws_from)
{
    tu_run r = tu_bigbatch("bench", "loader", "--data", dir, "--order", "--global-batch", "32", "--shuffle-frames",
                           "4", "--json");
    cr_assert_eq(r.exit_code, 0, "stderr: %s", r.err);
    bb_sampler_t *s;
    bb_order_stats want;
    cr_assert_eq(bb_sampler_create(ds, 1, 4, BB_ORDER_CURRENT, &s), BB_OK);
    cr_assert_eq(bb_sampler_order_stats(s, 0, 32, &want), BB_OK);
    bb_sampler_destroy(s);
    const char *order = strstr(r.out, "\"order\": {");
    cr_assert_not_null(order, "%s", r.out);
    cr_assert_eq(json_number(order, "frames_per_batch_min"), want.frames_per_batch_min, "%s", r.out);
    cr_assert_eq(json_number(order, "frames_per_batch_median"), want.frames_per_batch_median, "%s", r.out);
    cr_assert_eq(json_number(order, "version"), BB_ORDER_BALANCED);
    tu_run_free(&r);
    r = tu_bigbatch("bench", "loader", "--data", dir, "--order", "--global-batch", "32", "--order-version", "1",
                    "--shuffle-frames", "4");
    cr_assert_eq(r.exit_code, 0, "stderr: %s", r.err);
    cr_assert(strstr(r.out, "frames a batch draws from") && strstr(r.out, "order version 1"), "%s", r.out);
    tu_run_free(&r);
    r = tu_bigbatch("bench", "loader", "--data", dir, "--order", "--global-batch", "2000");
    tu_assert_error(&r, "global batch of 2000 from 1000 records");
    tu_run_free(&r);
}

/* The scaling table: every thread count up to --loader-threads, warm and
 * cold (a cold row reads one epoch exactly), each with its time to the
 * first batch and where the loader threads' time went. */
Test(loader, bench_loader_scaling_table_warm_and_cold)
{
    tu_run r = tu_bigbatch("bench", "loader", "--data", dir, "--micro-batch", "16", "--loader-threads", "2",
                           "--seconds", "0.2", "--json");
    cr_assert_eq(r.exit_code, 0, "stderr: %s", r.err);
    static const char *const rows[] = {"\"threads\": 1, \"micro_batch\": 16, \"records\"",
                                       "\"threads\": 2, \"micro_batch\": 16, \"records\""};
    const char *at = strstr(r.out, "\"rows\": [");
    cr_assert_not_null(at, "%s", r.out);
    for (int t = 0; t < 2; t++)
        for (int cold = 0; cold < 2; cold++) {
            at = strstr(at, "{\"records_per_s\": ");
            cr_assert_not_null(at, "row %d of 4 missing: %s", 2 * t + cold + 1, r.out);
            const char *end = strchr(strstr(at, "\"loader_time\""), '}');
            char row[2048];
            snprintf(row, sizeof row, "%.*s", (int)(end - at + 1), at);
            cr_assert_not_null(strstr(row, rows[t]), "row %d should have %d threads: %s", 2 * t + cold + 1, t + 1, row);
            cr_assert_not_null(strstr(row, cold ? "\"cold\": true" : "\"cold\": false"), "%s", row);
            cr_assert_gt(json_number(row, "records_per_s"), 0, "%s", row);
            cr_assert_gt(json_number(row, "tokens_per_s"), 0, "%s", row);
            cr_assert_gt(json_number(row, "first_batch_ms"), 0, "%s", row);
            cr_assert_gt(json_number(row, "decompress_pct"), 0, "%s", row);
            if (cold) cr_assert_eq(json_number(row, "records"), RECORDS / 16 * 16, "one epoch: %s", row);
            at = end;
        }
    cr_assert_eq(json_number(r.out, "tokens_per_record"), RECORD_WORDS - 1);
    tu_run_free(&r);
    r = tu_bigbatch("bench", "loader", "--data", dir, "--micro-batch", "16", "--loader-threads", "2",
                    "--seconds", "0.1");
    cr_assert_eq(r.exit_code, 0, "stderr: %s", r.err);
    cr_assert_not_null(strstr(r.out, "first batch"), "the table's header: %s", r.out);
    int lines = 0;
    for (const char *p = r.out; (p = strstr(p, " ms ")); p++) lines++;
    cr_assert_eq(lines, 4, "4 rows: %s", r.out);
    tu_run_free(&r);
}

/* Simulated GPUs: at a rate no loader reaches they wait most of the time;
 * at a modest one the figures are consistent (what they consume, never
 * more than they ask; how fast they are fed at which rates is
 * perf/loader_consumer.sh's, not a timed test's); bad values are one-line
 * errors. */
Test(loader, bench_loader_consumer_simulation)
{
    tu_run r = tu_bigbatch("bench", "loader", "--data", dir, "--micro-batch", "16", "--loader-threads", "1",
                           "--seconds", "0.2", "--consumer", "1e12", "--json");
    cr_assert_eq(r.exit_code, 0, "stderr: %s", r.err);
    double wait = json_number(r.out, "wait_pct"), most = json_number(r.out, "max_rate_per_gpu");
    double full = json_number(r.out, "full_speed_per_s");
    cr_assert_gt(wait, 20, "a GPU asking 1e12 tokens/s should wait most of the time: %s", r.out);
    cr_assert(most > 0 && most <= full, "the largest rate with < 1%% waiting is below full speed: %s", r.out);
    cr_log_info("1 loader thread: a GPU at 1e12 tokens/s waits %.0f%%; < 1%% waiting up to %.0f tokens/s (full "
                "speed %.0f)", wait, most, full);
    tu_run_free(&r);
    r = tu_bigbatch("bench", "loader", "--data", dir, "--micro-batch", "16", "--gpus", "4", "--tokens-per-s", "2000",
                    "--seconds", "0.3", "--json");
    cr_assert_eq(r.exit_code, 0, "stderr: %s", r.err);
    cr_assert_eq(json_number(r.out, "gpus"), 4);
    double worst = json_number(r.out, "worst_wait_pct"), delivered = json_number(r.out, "delivered_per_s");
    cr_assert(worst >= 0 && worst <= 100, "a share of the time: %s", r.out);
    /* each consumer sleeps a batch's tokens / rate after each batch: 4 × 2000 tokens/s at most (the clock's slack) */
    cr_assert(delivered > 0 && delivered < 4 * 2000 * 1.1, "they consume at most 8000 tokens/s: %s", r.out);
    tu_run_free(&r);
    static const char *const bad[][3] = {{"--consumer", "0", "--consumer"}, {"--gpus", "0", "--gpus"},
                                         {"--gpus", "2", "needs the rate"}, {"--consumer", "-5", "--consumer"},
                                         {"--tokens-per-s", "abc", "--tokens-per-s"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        r = tu_bigbatch("bench", "loader", "--data", dir, (char *)bad[i][0], (char *)bad[i][1]);
        tu_assert_error(&r, bad[i][2]);
        cr_assert_eq(r.exit_code, 2, "%s %s: exit %d", bad[i][0], bad[i][1], r.exit_code);
        tu_run_free(&r);
    }
    r = tu_bigbatch("bench", "loader", "--data", dir, "--consumer", "5", "--tokens-per-s", "6");
    tu_assert_error(&r, "two rates");
    tu_run_free(&r);
    r = tu_bigbatch("bench", "loader", "--data", dir, "--consumer", "5", "--cold");
    tu_assert_error(&r, "runs warm");
    tu_run_free(&r);
    r = tu_bigbatch("bench", "loader", "--data", dir, "--warm", "--cold");
    tu_assert_error(&r, "--warm and --cold");
    tu_run_free(&r);
}

/* ---- io_uring refused: seccomp makes io_uring_setup fail --------------- */
static void deny_io_uring(int err)
{
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (err & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof filter / sizeof *filter, filter};
    cr_assert_eq(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
    cr_assert_eq(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog), 0, "cannot install the seccomp filter");
}

static void falls_back_when_io_uring_fails(int err, const char *reason)
{
    deny_io_uring(err); /* this test's process and the CLI it starts */
    bb_log_set_threshold(BB_LOG_ERROR); /* the CLI below checks the warning */
    check_one_epoch(splits[1], 2, BB_IO_AUTO, false);

    tu_run r = tu_bigbatch("bench", "loader", "--data", dir, "--seconds", "0.2", "--micro-batch", "8", "--warm",
                           "--no-scaling", "--json");
    cr_assert_eq(r.exit_code, 0, "stderr: %s", r.err);
    cr_assert(strstr(r.out, "\"io\": \"pread\""), "stdout: %s", r.out);
    cr_assert(strncmp(r.err, "bigbatch: warn: io_uring is not available", 41) == 0, "stderr: %s", r.err);
    cr_assert(strstr(r.err, reason) && strstr(r.err, "reading with pread"), "stderr: %s", r.err);
    cr_assert_null(strchr(r.err, '\n') ? strchr(strchr(r.err, '\n') + 1, '\n') : NULL, "one warning line: %s",
                   r.err);
    tu_run_free(&r);

    r = tu_bigbatch("bench", "loader", "--data", dir, "--io", "uring", "--seconds", "0.2");
    tu_assert_error(&r, "--io uring", "io_uring cannot start", reason);
    tu_run_free(&r);
}

Test(loader, falls_back_to_pread_on_enosys) { falls_back_when_io_uring_fails(ENOSYS, "Function not implemented"); }
Test(loader, falls_back_to_pread_on_eperm) { falls_back_when_io_uring_fails(EPERM, "Operation not permitted"); }
Test(loader, falls_back_to_pread_on_enomem) { falls_back_when_io_uring_fails(ENOMEM, "Cannot allocate memory"); }
