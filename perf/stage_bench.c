/* stage_bench.c — host time to hand one micro-batch of loader records to a
 * model (bb_model_stage_records + bb_model_use_staged) on the CPU backend,
 * beside its peer, a memcpy of the same records, measured in the same run.
 * GPT-2's record shape: micro-batch 8 of 1025 u16 tokens (T 1024, V 50257).
 *
 *   perf/stage_bench.sh      # builds this against the library of a given
 *                            # commit and of the working tree, runs both
 *
 * Prints one JSON object: medians over `runs` runs of `iters` micro-batches
 * each, in microseconds per micro-batch, and their ratio to the memcpy. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bigbatch/model.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int runs = argc > 1 ? atoi(argv[1]) : 7, iters = argc > 2 ? atoi(argv[2]) : 300;
    enum { B = 8, T = 1024, V = 50257, SETS = 4 };
    bb_backend_options bo = {.threads = 1};
    bb_backend_t *be;
    bb_model_t *m;
    bb_model_config c = bb_model_gpt_config(1, 1, 64, T, V);
    if (bb_backend_create_cpu(&bo, &be) || bb_model_create(be, &c, B, &m)) {
        fprintf(stderr, "stage_bench: %s\n", bb_error_message());
        return 1;
    }
    bb_shard_meta meta = {.kind = BB_RECORD_TOKENS_U16, .rank = 1, .shape = {T + 1}, .record_size = 2 * (T + 1),
                          .classes_or_vocab = V};
    size_t bytes = (size_t)B * meta.record_size;
    uint8_t *records = malloc(SETS * bytes), *sink = malloc(bytes);
    uint64_t s = 1;
    for (size_t i = 0; i < SETS * bytes / 2; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint16_t v = (uint16_t)((s >> 33) % V);
        memcpy(records + 2 * i, &v, 2);
    }
    double *stage = malloc(runs * sizeof *stage), *peer = malloc(runs * sizeof *peer);
    for (int r = 0; r < runs; r++) { /* interleaved: the peer and the stage in every run */
        double t0 = now_us();
        for (int i = 0; i < iters; i++) {
            memcpy(sink, records + (size_t)(i % SETS) * bytes, bytes);
            __asm__ volatile("" : : "r"(sink) : "memory");
        }
        double t1 = now_us();
        for (int i = 0; i < iters; i++)
            if (bb_model_stage_records(m, &meta, records + (size_t)(i % SETS) * bytes, B) ||
                bb_model_use_staged(m)) {
                fprintf(stderr, "stage_bench: %s\n", bb_error_message());
                return 1;
            }
        double t2 = now_us();
        peer[r] = (t1 - t0) / iters, stage[r] = (t2 - t1) / iters;
    }
    double ratios[64];
    for (int r = 0; r < runs && r < 64; r++) ratios[r] = stage[r] / peer[r];
    qsort(stage, runs, sizeof *stage, cmp), qsort(peer, runs, sizeof *peer, cmp);
    qsort(ratios, runs < 64 ? runs : 64, sizeof *ratios, cmp);
    printf("{\"records_bytes\": %zu, \"runs\": %d, \"iters\": %d, \"stage_us\": %.2f, \"memcpy_us\": %.2f, "
           "\"stage_over_memcpy\": %.2f}\n",
           bytes, runs, iters, stage[runs / 2], peer[runs / 2], ratios[(runs < 64 ? runs : 64) / 2]);
    free(records), free(sink), free(stage), free(peer);
    bb_model_destroy(m);
    bb_backend_destroy(be);
    return 0;
}
