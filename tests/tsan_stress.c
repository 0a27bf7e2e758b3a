/* tsan_stress.c — the threaded code paths, run under ThreadSanitizer by
 * `make tsan`. Criterion cannot start under TSan (Snaipe/Criterion#274), so
 * this is a plain program: it exits non-zero on a wrong result, and TSan
 * (halt_on_error=1) on a race. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bigbatch/shard.h"
#include "tsan_check.h"


/* Parallel frame compression: write with 4 threads, read back, compare. */
static void writer_round_trip(const char *dir, uint64_t seed)
{
    bb_shard_meta m = {.kind = BB_RECORD_TOKENS_U16, .rank = 1, .shape = {65}, .record_size = 130,
                       .classes_or_vocab = 256};
    bb_writer_options o = {.level = 1, .frame_bytes = 2048, .shard_bytes = 64 << 10, .threads = 4};
    enum { N = 4000 };
    uint8_t *records = malloc((size_t)N * m.record_size);
    for (size_t i = 0; i < (size_t)N * m.record_size; i++) records[i] = (uint8_t)((i * 2654435761u + seed) >> 13);
    bb_dataset_writer_t *w;
    CHECK(bb_dataset_writer_create(dir, &m, &o, &w) == BB_OK, "create");
    CHECK(bb_dataset_writer_add(w, records, N) == BB_OK, "add");
    CHECK(bb_dataset_writer_finish(w, NULL) == BB_OK, "finish");
    bb_dataset_writer_destroy(w);

    bb_dataset_t *ds;
    bb_frame_decoder_t *dec;
    CHECK(bb_dataset_open(dir, &ds) == BB_OK, "open");
    CHECK(bb_frame_decoder_create(&dec) == BB_OK, "decoder");
    uint8_t buf[4096], *expect = records;
    for (uint32_t s = 0; s < bb_dataset_shard_count(ds); s++) {
        const bb_shard_t *sh = bb_dataset_shard(ds, s);
        for (uint32_t f = 0; f < bb_shard_frame_count(sh); f++) {
            CHECK(bb_shard_read_frame(sh, f, dec, buf, sizeof buf) == BB_OK, "read");
            uint32_t n = bb_shard_frame_at(sh, f)->raw_size;
            CHECK(memcmp(buf, expect, n) == 0, "shard %u frame %u differs", s, f);
            expect += n;
        }
    }
    CHECK(expect == records + (size_t)N * m.record_size, "record count");
    bb_frame_decoder_destroy(dec);
    bb_dataset_close(ds);
    free(records);
}

int main(void)
{
    for (uint64_t round = 0; round < 4; round++) {
        char dir[] = "/tmp/bigbatch-tsan-XXXXXX";
        CHECK(mkdtemp(dir) != NULL, "mkdtemp");
        writer_round_trip(dir, round);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        CHECK(system(cmd) == 0, "cleanup");
    }
    printf("tsan_stress: ok\n");
    return 0;
}
