/* tsan_loader.c — the loader under ThreadSanitizer (`make tsan`): loader
 * threads, two consumer threads (one per device, as the trainer runs them),
 * epochs recycled, both io backends, and a destroy mid-epoch. Exits non-zero
 * when a batch differs from the sampler's order; TSan stops it on a race. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bigbatch/loader.h"
#include "tsan_check.h"


enum { RECORDS = 3000, RECORD_SIZE = 8 };

typedef struct consumer {
    bb_loader_t *loader;
    const bb_sampler_t *sampler;
    const bb_loader_options *o;
    uint32_t device;
    uint64_t steps, batches;
} consumer;

static void *consume(void *arg)
{
    consumer *c = arg;
    const bb_loader_options *o = c->o;
    uint64_t G = (uint64_t)o->devices * o->accumulation * o->micro_batch, S = RECORDS / G;
    uint64_t *expect = malloc(o->micro_batch * sizeof *expect);
    for (uint64_t n = 0; n < c->steps; n++)
        for (uint32_t m = 0; m < o->accumulation; m++) {
            bb_batch b;
            CHECK(bb_loader_next(c->loader, c->device, &b) == BB_OK, "device %u step %llu", c->device,
                  (unsigned long long)n);
            uint64_t first = (n % S) * G + ((uint64_t)m * o->devices + c->device) * o->micro_batch;
            CHECK(bb_sampler_epoch_ids(c->sampler, n / S, first, o->micro_batch, expect) == BB_OK, "ids");
            for (uint32_t i = 0; i < b.count; i++) {
                uint64_t payload;
                memcpy(&payload, b.data + (size_t)i * RECORD_SIZE, sizeof payload);
                CHECK(b.record_ids[i] == expect[i] && payload == expect[i], "device %u step %llu record %u",
                      c->device, (unsigned long long)n, i);
            }
            c->batches++;
            bb_loader_release(c->loader, &b);
        }
    free(expect);
    return NULL;
}

static void run(const bb_dataset_t *ds, bb_io_mode io, uint32_t threads)
{
    bb_loader_options o;
    bb_loader_defaults(&o);
    o.devices = 2, o.accumulation = 2, o.micro_batch = 5, o.threads = threads, o.io = io, o.prefetch = 2;
    o.shuffle_frames = 3;
    uint64_t steps = 3 * (RECORDS / 20) + 7; /* into the fourth epoch */
    o.steps = steps;
    bb_sampler_t *s;
    CHECK(bb_sampler_create(ds, o.seed, o.shuffle_frames, BB_ORDER_CURRENT, &s) == BB_OK, "sampler");
    bb_loader_t *l;
    CHECK(bb_loader_create(ds, &o, &l) == BB_OK, "create");
    consumer c[2];
    pthread_t t[2];
    for (uint32_t d = 0; d < 2; d++) {
        c[d] = (consumer){.loader = l, .sampler = s, .o = &o, .device = d, .steps = steps};
        pthread_create(&t[d], NULL, consume, &c[d]);
    }
    for (uint32_t d = 0; d < 2; d++) pthread_join(t[d], NULL);
    bb_batch b;
    CHECK(bb_loader_next(l, 0, &b) == BB_ERR_CLOSED, "end of steps");
    bb_loader_destroy(l);

    /* Destroy while the threads are busy and a batch is held. */
    o.steps = 0;
    CHECK(bb_loader_create(ds, &o, &l) == BB_OK, "create");
    CHECK(bb_loader_next(l, 0, &b) == BB_OK, "first batch");
    bb_loader_destroy(l);
    bb_sampler_destroy(s);
}

int main(void)
{
    char dir[] = "/tmp/bigbatch-tsan-loader-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    bb_shard_meta m = {.kind = BB_RECORD_TOKENS_U32, .rank = 1, .shape = {2}, .record_size = RECORD_SIZE,
                       .classes_or_vocab = UINT32_MAX};
    bb_writer_options wo = {.level = 1, .frame_bytes = 13 * RECORD_SIZE, .shard_bytes = 8192, .threads = 1};
    uint64_t *records = malloc(RECORDS * sizeof *records);
    for (uint64_t i = 0; i < RECORDS; i++) records[i] = i;
    bb_dataset_writer_t *w;
    CHECK(bb_dataset_writer_create(dir, &m, &wo, &w) == BB_OK, "writer");
    CHECK(bb_dataset_writer_add(w, records, RECORDS) == BB_OK, "add");
    CHECK(bb_dataset_writer_finish(w, NULL) == BB_OK, "finish");
    bb_dataset_writer_destroy(w);
    free(records);
    bb_dataset_t *ds;
    CHECK(bb_dataset_open(dir, &ds) == BB_OK, "open");
    run(ds, BB_IO_URING, 3);
    run(ds, BB_IO_PREAD, 4);
    run(ds, BB_IO_AUTO, 1);
    bb_dataset_close(ds);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "cleanup");
    printf("tsan_loader: ok\n");
    return 0;
}
