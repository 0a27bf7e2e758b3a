/* test_shard.c — the .bbs format: writer and reader round trips, the format
 * checked independently of our reader (and by the zstd CLI), and every kind
 * of damage reported with file, frame and offset. */
#include <zstd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <sys/resource.h>

#include "bigbatch/shard.h"
#include "test_util.h"

TestSuite(shard);

static void rewrite_meta_u32(const char *path, long payload_offset, uint32_t value);

static bb_shard_meta tokens_meta(uint32_t tokens_per_record)
{
    return (bb_shard_meta){.kind = BB_RECORD_TOKENS_U16, .rank = 1, .shape = {tokens_per_record},
                           .record_size = 2 * tokens_per_record, .classes_or_vocab = 1000,
                           .source = "generated"};
}

static bb_writer_options small_frames(void)
{
    return (bb_writer_options){.level = 3, .frame_bytes = 4096, .shard_bytes = 1ull << 30, .threads = 2};
}

/* Writes `count` random records into dir and returns them. */
static uint8_t *write_dataset(const char *dir, const bb_shard_meta *meta, const bb_writer_options *o,
                              uint64_t count, uint64_t seed, bb_dataset_summary *sum)
{
    uint8_t *records = malloc(count * meta->record_size);
    tu_fill_random(records, count * meta->record_size, seed);
    bb_dataset_writer_t *w;
    cr_assert_eq(bb_dataset_writer_create(dir, meta, o, &w), BB_OK, "%s", bb_error_message());
    /* Uneven pieces: frames must not depend on how records are handed over. */
    for (uint64_t done = 0; done < count;) {
        uint64_t n = (done % 7) + 1 < count - done ? (done % 7) + 1 : count - done;
        cr_assert_eq(bb_dataset_writer_add(w, records + done * meta->record_size, n), BB_OK);
        done += n;
    }
    cr_assert_eq(bb_dataset_writer_finish(w, sum), BB_OK, "%s", bb_error_message());
    bb_dataset_writer_destroy(w);
    return records;
}

static void assert_dataset_holds(const char *path, const uint8_t *records, uint64_t count, uint32_t record_size)
{
    bb_dataset_t *ds;
    cr_assert_eq(bb_dataset_open(path, &ds), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_dataset_record_count(ds), count);
    bb_frame_decoder_t *dec;
    cr_assert_eq(bb_frame_decoder_create(&dec), BB_OK);
    uint64_t seen = 0;
    for (uint32_t s = 0; s < bb_dataset_shard_count(ds); s++) {
        const bb_shard_t *sh = bb_dataset_shard(ds, s);
        cr_assert_eq(bb_shard_get_meta(sh)->first_record, seen);
        uint8_t *buf = malloc(bb_shard_max_frame_bytes(sh));
        for (uint32_t f = 0; f < bb_shard_frame_count(sh); f++) {
            const bb_shard_frame *fr = bb_shard_frame_at(sh, f);
            cr_assert_eq(bb_shard_read_frame(sh, f, dec, buf, bb_shard_max_frame_bytes(sh)), BB_OK, "%s",
                         bb_error_message());
            cr_assert_eq(fr->first_record, seen - bb_shard_get_meta(sh)->first_record);
            cr_assert_eq(memcmp(buf, records + seen * record_size, fr->raw_size), 0, "shard %u frame %u", s, f);
            seen += fr->raw_size / record_size;
        }
        free(buf);
    }
    cr_assert_eq(seen, count);
    bb_frame_decoder_destroy(dec);
    bb_dataset_close(ds);
}

/* One dataset of random token records in a fresh directory, with small frames. */
typedef struct sample {
    char *dir, *path; /* the directory and its first shard */
    uint8_t *records;
    bb_shard_meta meta;
} sample;

static sample write_sample(uint32_t tokens_per_record, uint64_t count, uint64_t seed)
{
    sample s = {.dir = tu_temp_dir(), .meta = tokens_meta(tokens_per_record)};
    bb_writer_options o = small_frames();
    s.records = write_dataset(s.dir, &s.meta, &o, count, seed, NULL);
    s.path = tu_path(s.dir, "shard-00000.bbs");
    return s;
}

static void free_sample(sample *s)
{
    tu_rm_tree(s->dir);
    free(s->dir), free(s->path), free(s->records);
}

Test(shard, round_trip_every_record_kind)
{
    const bb_shard_meta metas[] = {
        tokens_meta(33),
        {.kind = BB_RECORD_TOKENS_U32, .rank = 1, .shape = {17}, .record_size = 68, .classes_or_vocab = 100000},
        {.kind = BB_RECORD_IMAGE_U8, .rank = 2, .shape = {28, 28}, .record_size = 785, .classes_or_vocab = 10},
        {.kind = BB_RECORD_IMAGE_U8, .rank = 3, .shape = {3, 8, 8}, .record_size = 193, .classes_or_vocab = 100},
    };
    for (size_t k = 0; k < sizeof metas / sizeof *metas; k++) {
        char *dir = tu_temp_dir();
        bb_writer_options o = small_frames();
        bb_dataset_summary sum;
        uint8_t *records = write_dataset(dir, &metas[k], &o, 1000, k, &sum);
        uint32_t per_frame = 4096 / metas[k].record_size;
        cr_assert_eq(sum.records, 1000);
        cr_assert_eq(sum.shards, 1);
        cr_assert_eq(sum.frames, (1000 + per_frame - 1) / per_frame);
        cr_assert_eq(sum.raw_bytes, 1000ull * metas[k].record_size);
        assert_dataset_holds(dir, records, 1000, metas[k].record_size);
        bb_dataset_t *ds;
        cr_assert_eq(bb_dataset_open(dir, &ds), BB_OK);
        const bb_shard_meta *m = bb_dataset_meta(ds);
        cr_assert_eq(m->kind, metas[k].kind);
        cr_assert_eq(m->rank, metas[k].rank);
        cr_assert_eq(memcmp(m->shape, metas[k].shape, sizeof m->shape), 0);
        cr_assert_eq(m->records_per_frame, per_frame);
        cr_assert_eq(m->classes_or_vocab, metas[k].classes_or_vocab);
        bb_dataset_close(ds);
        free(records);
        tu_rm_tree(dir);
        free(dir);
    }
}

Test(shard, record_larger_than_frame_gets_a_frame_of_its_own)
{
    char *dir = tu_temp_dir();
    bb_shard_meta m = tokens_meta(5000); /* 10000-byte records, 4096-byte target frames */
    bb_writer_options o = small_frames();
    bb_dataset_summary sum;
    uint8_t *records = write_dataset(dir, &m, &o, 9, 1, &sum);
    cr_assert_eq(sum.frames, 9);
    assert_dataset_holds(dir, records, 9, m.record_size);
    free(records);
    tu_rm_tree(dir);
    free(dir);
}

Test(shard, shards_roll_over_at_the_size_limit)
{
    char *dir = tu_temp_dir();
    bb_shard_meta m = tokens_meta(33);
    bb_writer_options o = small_frames();
    o.shard_bytes = 20000; /* random records do not compress: ~4 frames per shard */
    bb_dataset_summary sum;
    uint8_t *records = write_dataset(dir, &m, &o, 2000, 2, &sum);
    cr_assert_gt(sum.shards, 5);
    bb_dataset_t *ds;
    cr_assert_eq(bb_dataset_open(dir, &ds), BB_OK);
    cr_assert_eq(bb_dataset_shard_count(ds), sum.shards);
    uint64_t file_bytes = 0;
    for (uint32_t s = 0; s < sum.shards; s++) {
        const bb_shard_t *sh = bb_dataset_shard(ds, s);
        cr_assert_leq(bb_shard_file_size(sh), o.shard_bytes, "shard %u", s);
        cr_assert_eq(bb_shard_get_meta(sh)->shard_index, s);
        file_bytes += bb_shard_file_size(sh);
    }
    cr_assert_eq(file_bytes, sum.file_bytes);
    bb_dataset_close(ds);
    assert_dataset_holds(dir, records, 2000, m.record_size);
    free(records);
    tu_rm_tree(dir);
    free(dir);
}

Test(shard, output_does_not_depend_on_thread_count)
{
    char *a = tu_temp_dir(), *b = tu_temp_dir();
    bb_shard_meta m = tokens_meta(129);
    bb_writer_options o = small_frames();
    o.threads = 1;
    free(write_dataset(a, &m, &o, 3000, 3, NULL));
    o.threads = 3;
    free(write_dataset(b, &m, &o, 3000, 3, NULL));
    char *pa = tu_path(a, "shard-00000.bbs"), *pb = tu_path(b, "shard-00000.bbs");
    size_t na, nb;
    uint8_t *da = tu_read_file(pa, &na), *db = tu_read_file(pb, &nb);
    cr_assert_eq(na, nb);
    cr_assert_eq(memcmp(da, db, na), 0);
    free(da), free(db), free(pa), free(pb);
    tu_rm_tree(a), tu_rm_tree(b);
    free(a), free(b);
}

Test(shard, writer_rejects_bad_metadata_and_no_records)
{
    char *dir = tu_temp_dir();
    bb_shard_meta m = tokens_meta(33);
    m.record_size = 65; /* 33 u16 tokens are 66 bytes */
    bb_writer_options o = small_frames();
    bb_dataset_writer_t *w;
    cr_assert_eq(bb_dataset_writer_create(dir, &m, &o, &w), BB_ERR_ARG);
    cr_assert_not_null(strstr(bb_error_message(), "record size 65"), "%s", bb_error_message());
    m = tokens_meta(33);
    m.shape[1] = 2; /* unused dimensions must be 0 */
    cr_assert_eq(bb_dataset_writer_create(dir, &m, &o, &w), BB_ERR_ARG);
    m = tokens_meta(33);
    m.classes_or_vocab = 70000; /* u16 tokens cannot reach it */
    cr_assert_eq(bb_dataset_writer_create(dir, &m, &o, &w), BB_ERR_ARG);
    cr_assert_not_null(strstr(bb_error_message(), "70000 vocabulary"), "%s", bb_error_message());
    m = tokens_meta(33);
    o.level = 99;
    cr_assert_eq(bb_dataset_writer_create(dir, &m, &o, &w), BB_ERR_ARG);
    o.level = 3;
    cr_assert_eq(bb_dataset_writer_create(dir, &m, &o, &w), BB_OK);
    cr_assert_eq(bb_dataset_writer_finish(w, NULL), BB_ERR_ARG);
    bb_dataset_writer_destroy(w);
    bb_dataset_writer_destroy(NULL);
    tu_rm_tree(dir);
    free(dir);
}

/* Parses the file per data/FORMAT.md without our reader and checks every
 * frame with plain ZSTD_decompress and XXH64. */
Test(shard, layout_matches_the_seekable_format)
{
    sample smp = write_sample(65, 500, 4);
    size_t size;
    uint8_t *file = tu_read_file(smp.path, &size);
#define LE32(p) ((uint32_t)(p)[0] | (uint32_t)(p)[1] << 8 | (uint32_t)(p)[2] << 16 | (uint32_t)(p)[3] << 24)
    const uint8_t *footer = file + size - 9;
    cr_assert_eq(LE32(footer + 5), 0x8F92EAB1u);
    cr_assert_eq(footer[4], 0x80);
    uint32_t n = LE32(footer);
    const uint8_t *table = file + size - (8 + 12 * (size_t)n + 9);
    cr_assert_eq(LE32(table), 0x184D2A5Eu);
    cr_assert_eq(LE32(table + 4), 12 * n + 9);
    /* Frame 0: the metadata skippable frame. */
    cr_assert_eq(LE32(file), 0x184D2A50u);
    cr_assert_eq(LE32(file + 4), 128);
    cr_assert_eq(memcmp(file + 8, "BBSH", 4), 0);
    cr_assert_eq(LE32(table + 8), 136);
    cr_assert_eq(LE32(table + 12), 0);
    cr_assert_eq(LE32(table + 16), (uint32_t)XXH64(NULL, 0, 0));
    cr_assert_eq(LE32(file + 8 + 124), (uint32_t)XXH64(file + 8, 124, 0));
    size_t offset = 136, raw_total = 0;
    uint8_t *raw = malloc(1 << 20);
    for (uint32_t i = 1; i < n; i++) {
        const uint8_t *e = table + 8 + 12 * (size_t)i;
        size_t got = ZSTD_decompress(raw, 1 << 20, file + offset, LE32(e));
        cr_assert(!ZSTD_isError(got), "frame %u: %s", i, ZSTD_getErrorName(got));
        cr_assert_eq(got, LE32(e + 4));
        cr_assert_eq((uint32_t)XXH64(raw, got, 0), LE32(e + 8));
        cr_assert_eq(memcmp(raw, smp.records + raw_total, got), 0);
        offset += LE32(e), raw_total += got;
    }
    cr_assert_eq(offset, (size_t)(table - file));
    cr_assert_eq(raw_total, 500u * smp.meta.record_size);
#undef LE32
    free(raw), free(file);
    free_sample(&smp);
}

Test(shard, zstd_cli_decodes_to_the_raw_records)
{
    sample smp = write_sample(257, 300, 5);
    char *out = tu_path(smp.dir, "decoded.raw");
    tu_run t = tu_run_argv((char *const[]){"zstd", "-q", "-t", smp.path, NULL});
    cr_assert_eq(t.exit_code, 0, "zstd -t rejected the shard: %s", t.err);
    tu_run_free(&t);
    t = tu_run_argv((char *const[]){"zstd", "-q", "-d", "-f", smp.path, "-o", out, NULL});
    cr_assert_eq(t.exit_code, 0, "zstd -d failed: %s", t.err);
    tu_run_free(&t);
    size_t size;
    uint8_t *decoded = tu_read_file(out, &size);
    cr_assert_eq(size, 300u * smp.meta.record_size);
    cr_assert_eq(memcmp(decoded, smp.records, size), 0);
    free(decoded), free(out);
    free_sample(&smp);
}

Test(shard, decode_checks_arguments)
{
    sample smp = write_sample(33, 100, 6);
    bb_shard_t *sh;
    bb_frame_decoder_t *dec;
    cr_assert_eq(bb_shard_open(smp.path, &sh), BB_OK);
    cr_assert_eq(bb_frame_decoder_create(&dec), BB_OK);
    uint8_t buf[8192];
    cr_assert_eq(bb_shard_read_frame(sh, 0, dec, buf, 100), BB_ERR_ARG);
    cr_assert_eq(bb_shard_read_frame(sh, bb_shard_frame_count(sh), dec, buf, sizeof buf), BB_ERR_ARG);
    cr_assert_null(bb_shard_frame_at(sh, bb_shard_frame_count(sh)));
    bb_frame_decoder_destroy(dec);
    bb_shard_close(sh);
    bb_shard_close(NULL);
    free_sample(&smp);
}

/* ---- damage: every kind is an error naming the file (frame, offset) ---- */

typedef struct damaged {
    sample s;
    const char *path;
    bb_shard_frame frames[4]; /* first frames, read before the damage */
    uint64_t size;
} damaged;

static damaged make_shard(void)
{
    damaged d = {.s = write_sample(33, 1000, 7)};
    d.path = d.s.path;
    bb_shard_t *sh;
    cr_assert_eq(bb_shard_open(d.path, &sh), BB_OK);
    for (uint32_t i = 0; i < 4; i++) d.frames[i] = *bb_shard_frame_at(sh, i);
    d.size = bb_shard_file_size(sh);
    bb_shard_close(sh);
    return d;
}

static void free_damaged(damaged *d) { free_sample(&d->s); }

static void assert_message_has(const char *const *needles)
{
    for (const char *const *n = needles; *n; n++)
        cr_assert_not_null(strstr(bb_error_message(), *n), "message '%s' lacks '%s'", bb_error_message(), *n);
}

#define assert_open_fails(path, status, ...)                                            \
    do {                                                                                \
        bb_shard_t *sh_ = NULL;                                                         \
        cr_assert_eq(bb_shard_open((path), &sh_), (status), "got: %s", bb_error_message()); \
        cr_assert_null(sh_);                                                            \
        assert_message_has((const char *const[]){(path), __VA_ARGS__, NULL});           \
    } while (0)

/* Opens the shard, reads every frame, and expects the first failure at frame `bad`. */
static void assert_frame_fails(const char *path, uint32_t bad, const char *const *needles)
{
    bb_shard_t *sh;
    cr_assert_eq(bb_shard_open(path, &sh), BB_OK, "%s", bb_error_message());
    bb_frame_decoder_t *dec;
    cr_assert_eq(bb_frame_decoder_create(&dec), BB_OK);
    uint8_t *buf = malloc(bb_shard_max_frame_bytes(sh));
    for (uint32_t f = 0; f < bb_shard_frame_count(sh); f++) {
        bb_status rc = bb_shard_read_frame(sh, f, dec, buf, bb_shard_max_frame_bytes(sh));
        if (f != bad) {
            cr_assert_eq(rc, BB_OK, "frame %u: %s", f, bb_error_message());
            continue;
        }
        cr_assert_eq(rc, BB_ERR_CORRUPT, "frame %u should fail", f);
        assert_message_has(needles);
    }
    free(buf);
    bb_frame_decoder_destroy(dec);
    bb_shard_close(sh);
}

Test(shard, flipped_byte_in_a_frame_is_a_checksum_mismatch)
{
    damaged d = make_shard();
    /* Random records are stored as raw zstd blocks: the flip decodes to a
     * wrong byte, which only the checksum can catch. */
    const bb_shard_frame *f = &d.frames[2];
    tu_flip_byte(d.path, (long)(f->offset + f->compressed_size / 2), 0x40);
    char offset[32];
    snprintf(offset, sizeof offset, "offset %llu", (unsigned long long)f->offset);
    assert_frame_fails(d.path, 2, (const char *const[]){d.path, "frame 2", offset, "checksum mismatch", NULL});
    free_damaged(&d);
}

Test(shard, damaged_frame_header_is_a_zstd_error_with_location)
{
    damaged d = make_shard();
    tu_flip_byte(d.path, (long)d.frames[1].offset, 0xff); /* the zstd frame magic */
    char offset[32];
    snprintf(offset, sizeof offset, "offset %llu", (unsigned long long)d.frames[1].offset);
    assert_frame_fails(d.path, 1, (const char *const[]){d.path, "frame 1", offset, "zstd", NULL});
    free_damaged(&d);
}

Test(shard, truncated_file)
{
    damaged d = make_shard();
    tu_truncate(d.path, (long)d.size - 1);
    assert_open_fails(d.path, BB_ERR_FORMAT, "no seek table footer", "truncated");
    tu_truncate(d.path, 5);
    assert_open_fails(d.path, BB_ERR_CORRUPT, "truncated", "5 bytes");
    tu_truncate(d.path, 0);
    assert_open_fails(d.path, BB_ERR_CORRUPT, "truncated", "0 bytes");
    free_damaged(&d);
}

Test(shard, wrong_footer_magic)
{
    damaged d = make_shard();
    tu_flip_byte(d.path, (long)d.size - 1, 0x01);
    char offset[32];
    snprintf(offset, sizeof offset, "offset %llu", (unsigned long long)d.size - 4);
    assert_open_fails(d.path, BB_ERR_FORMAT, "no seek table footer", offset, "0x8f92eab1");
    free_damaged(&d);
}

Test(shard, seek_table_sizes_exceeding_the_file)
{
    damaged d = make_shard();
    /* Entry 2 (data frame 1): raise its compressed size's high byte. */
    uint32_t frames = 0;
    FILE *f = fopen(d.path, "rb");
    fseek(f, (long)d.size - 9, SEEK_SET);
    cr_assert_eq(fread(&frames, 4, 1, f), 1);
    fclose(f);
    long table = (long)d.size - (8 + 12 * (long)frames + 9);
    tu_flip_byte(d.path, table + 8 + 12 * 2 + 3, 0x10);
    char offset[32];
    snprintf(offset, sizeof offset, "offset %llu", (unsigned long long)d.frames[1].offset);
    assert_open_fails(d.path, BB_ERR_CORRUPT, "frame 1", offset, "runs past the seek table");
    /* And a seek table claiming more frames than the file can hold. */
    tu_flip_byte(d.path, table + 8 + 12 * 2 + 3, 0x10);
    tu_flip_byte(d.path, (long)d.size - 9 + 2, 0x01);
    assert_open_fails(d.path, BB_ERR_CORRUPT, "seek table of", "truncated");
    free_damaged(&d);
}

static void rewrite_meta_u32(const char *path, long payload_offset, uint32_t value)
{
    size_t size;
    uint8_t *file = tu_read_file(path, &size);
    uint8_t *p = file + 8;
    memcpy(p + payload_offset, &value, 4);
    uint32_t sum = (uint32_t)XXH64(p, 124, 0);
    memcpy(p + 124, &sum, 4);
    tu_write_file(path, file, size);
    free(file);
}

Test(shard, record_size_not_dividing_a_frame)
{
    damaged d = make_shard();
    /* 33-token records (66 bytes) -> 34 tokens (68 bytes): 62 * 66 = 4092 is
     * not a multiple of 68. Offsets per data/FORMAT.md. */
    rewrite_meta_u32(d.path, 16, 34);
    rewrite_meta_u32(d.path, 32, 68);
    assert_open_fails(d.path, BB_ERR_CORRUPT, "frame 0 at offset 136", "not a whole number of 68-byte records");
    free_damaged(&d);
}

Test(shard, metadata_checksum_and_version)
{
    damaged d = make_shard();
    tu_flip_byte(d.path, 8 + 64, 0x01); /* a byte of the source name */
    assert_open_fails(d.path, BB_ERR_CORRUPT, "metadata frame at offset 0", "checksum mismatch");
    tu_flip_byte(d.path, 8 + 64, 0x01);
    rewrite_meta_u32(d.path, 4, 3 | 128u << 16); /* version 3 */
    assert_open_fails(d.path, BB_ERR_FORMAT, "version 3 is not supported", "versions 1 to 2");
    free_damaged(&d);
}

/* Every shard of a dataset carries the XXH64 of all the dataset's records,
 * in order (data/FORMAT.md): what `zstd -dc shard-*.bbs | xxhsum -H1` gives. */
Test(shard, every_shard_carries_the_xxh64_of_the_whole_datasets_records)
{
    char *dir = tu_temp_dir();
    bb_shard_meta m = tokens_meta(33);
    bb_writer_options o = small_frames();
    o.shard_bytes = 20000;
    bb_dataset_summary sum;
    uint8_t *records = write_dataset(dir, &m, &o, 1000, 21, &sum);
    uint64_t want = XXH64(records, 1000u * m.record_size, 0);
    cr_assert_eq(sum.dataset_id, want);
    bb_dataset_t *ds;
    cr_assert_eq(bb_dataset_open(dir, &ds), BB_OK, "%s", bb_error_message());
    cr_assert_gt(bb_dataset_shard_count(ds), 2);
    for (uint32_t i = 0; i < bb_dataset_shard_count(ds); i++)
        cr_assert_eq(bb_shard_get_meta(bb_dataset_shard(ds, i))->dataset_id, want, "shard %u", i);
    bb_dataset_close(ds);
    /* an identity that the records do not hash to: only --verify can tell */
    for (uint32_t i = 0; i < sum.shards; i++) {
        char name[32];
        snprintf(name, sizeof name, "shard-%05u.bbs", i);
        char *path = tu_path(dir, name);
        rewrite_meta_u32(path, 116, 0x1234);
        free(path);
    }
    tu_run r = tu_bigbatch("inspect", dir);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    r = tu_bigbatch("inspect", dir, "--verify");
    cr_assert_neq(r.exit_code, 0);
    cr_assert_not_null(strstr(r.out, "records hash to"), "%s", r.out);
    tu_run_free(&r);
    free(records);
    tu_rm_tree(dir);
    free(dir);
}

/* Version 1 (no identity, 60 bytes of source) still reads; mixed into a
 * version-2 dataset, its missing identity differs and it is refused. */
Test(shard, version_1_shards_still_read_and_do_not_mix_with_version_2)
{
    char *dir = tu_temp_dir();
    bb_shard_meta m = tokens_meta(33);
    bb_writer_options o = small_frames();
    o.shard_bytes = 20000;
    free(write_dataset(dir, &m, &o, 1000, 22, NULL));
    char *first = tu_path(dir, "shard-00000.bbs"), *second = tu_path(dir, "shard-00001.bbs");
    char *paths[2] = {first, second};
    for (int k = 0; k < 2; k++) {
        rewrite_meta_u32(paths[k], 4, 1 | 128u << 16); /* version 1 */
        rewrite_meta_u32(paths[k], 116, 0);             /* the source's last bytes, NUL */
        rewrite_meta_u32(paths[k], 120, 0);
        bb_shard_t *sh;
        cr_assert_eq(bb_shard_open(paths[k], &sh), BB_OK, "%s", bb_error_message());
        cr_assert_str_eq(bb_shard_get_meta(sh)->source, "generated");
        cr_assert_eq(bb_shard_get_meta(sh)->dataset_id, 0);
        bb_shard_close(sh);
        if (k == 0) {
            bb_dataset_t *ds = NULL;
            cr_assert_eq(bb_dataset_open(dir, &ds), BB_ERR_FORMAT);
            cr_assert_not_null(strstr(bb_error_message(), "belong to different datasets"), "%s", bb_error_message());
        }
    }
    free(first), free(second);
    tu_rm_tree(dir);
    free(dir);
}

Test(shard, plain_zstd_file_is_not_a_shard)
{
    char *dir = tu_temp_dir();
    char *raw = tu_path(dir, "x.raw"), *zst = tu_path(dir, "x.zst");
    tu_write_file(raw, "hello hello hello", 17);
    tu_run t = tu_run_argv((char *const[]){"zstd", "-q", raw, "-o", zst, NULL});
    cr_assert_eq(t.exit_code, 0);
    tu_run_free(&t);
    assert_open_fails(zst, BB_ERR_FORMAT, "not a bigbatch shard");
    assert_open_fails(dir, BB_ERR_IO, "not a regular file"); /* bad input, exit 1: not a usage error */
    free(raw), free(zst);
    tu_rm_tree(dir);
    free(dir);
}

Test(shard, dataset_detects_missing_and_foreign_shards)
{
    char *a = tu_temp_dir(), *b = tu_temp_dir();
    bb_shard_meta m = tokens_meta(33);
    bb_writer_options o = small_frames();
    o.shard_bytes = 20000;
    free(write_dataset(a, &m, &o, 1000, 8, NULL));
    bb_shard_meta other = tokens_meta(17);
    free(write_dataset(b, &other, &o, 100, 9, NULL));
    bb_dataset_t *ds = NULL;
    char *second = tu_path(a, "shard-00001.bbs"), *foreign = tu_path(b, "shard-00000.bbs");
    /* A shard from another dataset. */
    size_t size;
    uint8_t *bytes = tu_read_file(foreign, &size);
    tu_write_file(second, bytes, size);
    free(bytes);
    cr_assert_eq(bb_dataset_open(a, &ds), BB_ERR_FORMAT);
    cr_assert_not_null(strstr(bb_error_message(), "do not belong to one dataset"), "%s", bb_error_message());
    /* A missing shard. */
    cr_assert_eq(unlink(second), 0);
    cr_assert_eq(bb_dataset_open(a, &ds), BB_ERR_CORRUPT);
    cr_assert_not_null(strstr(bb_error_message(), "missing"), "%s", bb_error_message());
    cr_assert_null(ds);
    free(second), free(foreign);
    /* An empty directory. */
    char *empty = tu_temp_dir();
    cr_assert_eq(bb_dataset_open(empty, &ds), BB_ERR_FORMAT); /* bad input (exit 1), not usage */
    cr_assert_not_null(strstr(bb_error_message(), "no *.bbs shards"));
    tu_rm_tree(a), tu_rm_tree(b), tu_rm_tree(empty);
    free(a), free(b), free(empty);
}

Test(shard, unfinished_shard_never_reads_as_valid)
{
    char *dir = tu_temp_dir();
    bb_shard_meta m = tokens_meta(33);
    bb_writer_options o = small_frames();
    o.threads = 1; /* 4 slots: 300 records fill them and force a write */
    uint8_t records[300 * 66];
    tu_fill_random(records, sizeof records, 16);
    bb_dataset_writer_t *w;
    cr_assert_eq(bb_dataset_writer_create(dir, &m, &o, &w), BB_OK);
    cr_assert_eq(bb_dataset_writer_add(w, records, 300), BB_OK);
    bb_dataset_writer_destroy(w); /* no finish: as if the process died */
    char *path = tu_path(dir, "shard-00000.bbs");
    size_t size;
    uint8_t *file = tu_read_file(path, &size);
    cr_assert_gt(size, 136u);
    for (int i = 8; i < 136; i++) cr_assert_eq(file[i], 0, "metadata payload byte %d", i);
    bb_shard_t *sh;
    cr_assert_neq(bb_shard_open(path, &sh), BB_OK);
    free(file), free(path);
    tu_rm_tree(dir);
    free(dir);
}

/* A seek-table entry must cover exactly one zstd frame: an empty frame
 * appended to data frame 0 decodes fine with zstd alone, and is refused. */
Test(shard, entry_holding_two_zstd_frames_is_refused)
{
    sample smp = write_sample(33, 300, 17);
    size_t size;
    uint8_t *file = tu_read_file(smp.path, &size);
    uint8_t empty[32];
    size_t elen = ZSTD_compress(empty, sizeof empty, NULL, 0, 1);
    cr_assert(!ZSTD_isError(elen));
    uint32_t n, csize0;
    memcpy(&n, file + size - 9, 4);
    size_t table = size - (8 + 12 * (size_t)n + 9);
    memcpy(&csize0, file + table + 8 + 12, 4);
    uint8_t *out = malloc(size + elen);
    size_t at = 136 + csize0;
    memcpy(out, file, at);
    memcpy(out + at, empty, elen);
    memcpy(out + at + elen, file + at, size - at);
    uint32_t grown = csize0 + (uint32_t)elen;
    memcpy(out + elen + table + 8 + 12, &grown, 4);
    tu_write_file(smp.path, out, size + elen);
    assert_frame_fails(smp.path, 0, (const char *const[]){smp.path, "frame 0 at offset 136", "not one zstd frame", NULL});
    free(file), free(out);
    free_sample(&smp);
}

Test(shard, large_dataset_raises_the_open_file_limit)
{
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 400)
        cr_skip_test("skipped: hard open-file limit %llu", (unsigned long long)rl.rlim_max);
    char *dir = tu_temp_dir();
    bb_shard_meta m = tokens_meta(33);
    bb_writer_options o = small_frames();
    o.shard_bytes = 5000; /* one frame per shard: 81 shards */
    free(write_dataset(dir, &m, &o, 5000, 18, NULL));
    rl.rlim_cur = 40;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    bb_dataset_t *ds;
    cr_assert_eq(bb_dataset_open(dir, &ds), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_dataset_shard_count(ds), 81);
    bb_dataset_close(ds);
    tu_rm_tree(dir);
    free(dir);
}
