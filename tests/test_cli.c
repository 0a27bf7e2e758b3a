/* test_cli.c — the bigbatch binary: help, exit codes, and bad input as one
 * line naming the file (and frame and offset), with no output left behind. */
#include <glob.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "test_util.h"

TestSuite(cli);

typedef struct fixture {
    char *dir, *out;
} fixture;

static fixture setup(void)
{
    fixture f = {.dir = tu_temp_dir()};
    f.out = tu_path(f.dir, "out");
    return f;
}

static void teardown(fixture *f)
{
    tu_rm_tree(f->dir);
    free(f->dir), free(f->out);
}

/* Writes a text file of `n` random bytes and returns its path. */
static char *text_file(const fixture *f, const char *name, size_t n)
{
    char *path = tu_path(f->dir, name);
    uint8_t *buf = malloc(n ? n : 1);
    tu_fill_random(buf, n, n);
    tu_write_file(path, buf, n);
    free(buf);
    return path;
}

/* Packs a 3-shard text dataset into f->out and returns the first shard's path. */
static char *packed_shard(const fixture *f)
{
    char *in = text_file(f, "in.txt", 200000);
    tu_run r = tu_bigbatch("pack", "--format", "text", "--in", in, "--seq-len", "64", "--frame-kib", "16",
                           "--shard-mib", "1", "--out", f->out, "--level", "1");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    free(in);
    return tu_path(f->out, "shard-00000.bbs");
}

Test(cli, help_and_usage_errors)
{
    tu_run r = tu_bigbatch("--help");
    cr_assert_eq(r.exit_code, 0);
    cr_assert_not_null(strstr(r.out, "pack"));
    cr_assert_not_null(strstr(r.out, "inspect"));
    tu_run_free(&r);
    r = tu_bigbatch("pack", "--help");
    cr_assert_eq(r.exit_code, 0);
    cr_assert_not_null(strstr(r.out, "--val-fraction F"));
    cr_assert_not_null(strstr(r.out, "(default: 256)"));
    tu_run_free(&r);
    r = tu_bigbatch("help", "inspect");
    cr_assert_eq(r.exit_code, 0);
    cr_assert_not_null(strstr(r.out, "--verify"));
    tu_run_free(&r);
    r = tu_bigbatch("frobnicate");
    cr_assert_eq(r.exit_code, 2);
    tu_run_free(&r);
    r = tu_bigbatch("pack", "--format", "text", "--out", "x");
    cr_assert_eq(r.exit_code, 2);
    tu_assert_error(&r, "--format text needs --in");
    tu_run_free(&r);
    r = tu_bigbatch("pack", "--format", "fmnist", "--images", "a", "--labels", "b", "--seq-len", "8", "--out", "x");
    tu_assert_error(&r, "--seq-len", "not fmnist");
    tu_run_free(&r);
    r = tu_bigbatch("bench", "model", "--help");
    cr_assert_not_null(strstr(r.out, "--loss-chunk TOKENS"));
    tu_run_free(&r);
    r = tu_bigbatch("bench", "model", "--model", "mlp", "--loss-chunk", "10");
    tu_assert_error(&r, "--loss-chunk sizes a gpt's LM head", "mlp");
    tu_run_free(&r);
}

Test(cli, version_reports_cuda_state)
{
    tu_run r = tu_bigbatch("version");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.out, "bigbatch 0."));
    cr_assert_not_null(strstr(r.out, "cuda: "));
    cr_assert_not_null(strstr(r.out, "cpu: OpenBLAS "), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "; bf16 products: "), "%s", r.out);
    tu_run_free(&r);
}

Test(cli, pack_then_inspect_text_and_json)
{
    fixture f = setup();
    char *in = text_file(&f, "in.txt", 50000);
    tu_run r = tu_bigbatch("pack", "--format", "text", "--in", in, "--seq-len", "128", "--val-fraction", "0.1",
                           "--out", f.out);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.out, "/train: 351 records"), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "/val: 39 records"), "%s", r.out);
    tu_run_free(&r);
    r = tu_bigbatch("inspect", f.out, "--verify");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.out, "351 x tokens_u16 [129]"), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "verify   ok"), "%s", r.out);
    tu_run_free(&r);
    r = tu_bigbatch("inspect", f.out, "--json", "--verify");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char *json = tu_path(f.dir, "inspect.json");
    tu_write_file(json, r.out, strlen(r.out));
    tu_run_free(&r);
    /* A real JSON parser, and the keys scripts rely on. */
    r = tu_run_argv((char *const[]){"python3", "-c",
                                    "import json,sys; d=json.load(open(sys.argv[1])); s=d['splits'];"
                                    "assert s['train']['records']==351 and s['val']['records']==39;"
                                    "assert s['train']['verified'] is True and s['train']['kind']=='tokens_u16';"
                                    "assert s['val']['shape']==[129] and s['val']['vocab_size']==256",
                                    json, NULL});
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    free(in), free(json);
    teardown(&f);
}

/* ---- bad input: each one line naming the file, non-zero exit, no output ---- */

static void assert_pack_fails_cleanly(const fixture *f, const tu_run *r)
{
    cr_assert_neq(r->exit_code, 0);
    cr_assert_not(tu_exists(f->out), "output must not exist after a failed pack");
    char pattern[4200];
    glob_t g;
    snprintf(pattern, sizeof pattern, "%s/.out.partial-*", f->dir);
    cr_assert_eq(glob(pattern, 0, NULL, &g), GLOB_NOMATCH, "a temporary directory was left behind");
}

/* README, "Commands": exit status 2 when the command line itself is wrong
 * (a flag, a value, flags that contradict each other or the records they
 * name), 1 when a file is missing, of the wrong kind or damaged, or the
 * work fails. */
Test(cli, exit_status_2_is_the_command_line_1_is_a_file_or_a_failure)
{
    fixture f = setup();
    char *file = text_file(&f, "plain.txt", 100), *empty = text_file(&f, "empty.txt", 0), *dir = tu_path(f.dir, "no-shards");
    char *out = tu_path(f.dir, "out.file");
    cr_assert_eq(mkdir(dir, 0755), 0);
#define RUN(...) (char *const[]){(char *)tu_bigbatch_bin(), __VA_ARGS__, NULL}
#define TRAIN "train", "--layers", "1", "--d-model", "16", "--heads", "2", "--steps", "1"
    struct {
        int code;
        char *const *argv;
    } cases[] = {
        {2, RUN("train", "--frobnicate")},
        {2, RUN(TRAIN, "--global-batch", "8", "--micro-batch", "x")},
        {2, RUN(TRAIN, "--data", "data/kjv", "--global-batch", "30", "--micro-batch", "8")},
        {2, RUN(TRAIN, "--model", "mlp", "--data", "data/kjv", "--global-batch", "8", "--micro-batch", "8")},
        {2, RUN("pack", "--format", "text", "--in", file, "--seq-len", "8", "--out", dir)}, /* exists: --force */
        {1, RUN(TRAIN, "--data", "/nonexistent/data", "--global-batch", "8", "--micro-batch", "8")},
        {1, RUN("inspect", dir)},
        {1, RUN("inspect", file)},
        {1, RUN("eval", "--init-from", dir, "--data", "data/kjv")},
        {1, RUN("pack", "--format", "text", "--in", file, "--seq-len", "8", "--out", file)},
        /* every other command: an unknown flag or a missing one is 2, a file missing, empty or damaged is 1 */
        {2, RUN("eval", "--frobnicate")},
        {2, RUN("sample", "--frobnicate")},
        {2, RUN("export", "--ckpt", dir)}, /* no --out */
        {2, RUN("report", "--frobnicate")},
        {2, RUN("plan", "--frobnicate")},
        {2, RUN("inspect", "--frobnicate")},
        {2, RUN("bench", "frobnicate")},
        {2, RUN("tokenizer", "frobnicate")},
        {2, RUN("tokenizer", "train", "--in", file, "--out", out)}, /* no --vocab */
        {1, RUN("eval", "--ckpt", dir)},
        {1, RUN("sample", "--ckpt", "/nonexistent/ck")},
        {1, RUN("export", "--ckpt", "/nonexistent/ck", "--out", out)},
        {1, RUN("report", "--metrics", empty, "--out", out)},
        {1, RUN("plan", "--data", "/nonexistent/data", "--global-batch", "8")},
        {1, RUN("tokenizer", "train", "--in", empty, "--vocab", "300", "--out", out)},
        {1, RUN("tokenizer", "encode", "--tokenizer", file, "--in", file)},
    };
#undef TRAIN
#undef RUN
    char *inside = tu_path(dir, "x");
    cr_assert_eq(mkdir(inside, 0755), 0); /* not empty: pack needs --force */
    free(inside);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tu_run r = tu_run_argv(cases[i].argv);
        cr_assert_eq(r.exit_code, cases[i].code, "case %zu (%s %s): exit %d, expected %d: %s", i, cases[i].argv[1],
                     cases[i].argv[2] ? cases[i].argv[2] : "", r.exit_code, cases[i].code, r.err);
        tu_run_free(&r);
    }
    cr_assert(!tu_exists(out), "a failed command wrote its output");
    free(file), free(empty), free(dir), free(out);
    teardown(&f);
}

Test(cli, empty_input)
{
    fixture f = setup();
    char *in = text_file(&f, "empty.txt", 0);
    tu_run r = tu_bigbatch("pack", "--format", "text", "--in", in, "--seq-len", "8", "--out", f.out);
    tu_assert_error(&r, in, "empty input");
    assert_pack_fails_cleanly(&f, &r);
    tu_run_free(&r);
    r = tu_bigbatch("inspect", in);
    tu_assert_error(&r, in, "truncated");
    tu_run_free(&r);
    free(in);
    teardown(&f);
}

Test(cli, text_shorter_than_one_record)
{
    fixture f = setup();
    char *in = text_file(&f, "short.txt", 256);
    tu_run r = tu_bigbatch("pack", "--format", "text", "--in", in, "--seq-len", "256", "--out", f.out);
    tu_assert_error(&r, in, "256 tokens", "shorter than one record", "257 tokens");
    assert_pack_fails_cleanly(&f, &r);
    tu_run_free(&r);
    free(in);
    teardown(&f);
}

static char *idx_file(const fixture *f, const char *name, const uint8_t *header, size_t hsize, size_t body)
{
    char *path = tu_path(f->dir, name);
    uint8_t *buf = calloc(1, hsize + body);
    memcpy(buf, header, hsize);
    tu_write_file(path, buf, hsize + body);
    free(buf);
    return path;
}

Test(cli, idx_wrong_magic_and_mismatched_counts)
{
    fixture f = setup();
    const uint8_t images_h[16] = {0, 0, 8, 3, 0, 0, 0, 10, 0, 0, 0, 28, 0, 0, 0, 28};
    const uint8_t labels_h[8] = {0, 0, 8, 1, 0, 0, 0, 10};
    const uint8_t labels_9[8] = {0, 0, 8, 1, 0, 0, 0, 9};
    const uint8_t bad_magic[8] = {0, 0, 8, 3, 0, 0, 0, 10}; /* an image magic in a label file */
    char *im = idx_file(&f, "images", images_h, 16, 10 * 784);
    char *lb_bad = idx_file(&f, "labels-bad", bad_magic, 8, 10);
    char *lb_9 = idx_file(&f, "labels-9", labels_9, 8, 9);
    char *lb = idx_file(&f, "labels", labels_h, 8, 10);
    tu_run r = tu_bigbatch("pack", "--format", "fmnist", "--images", im, "--labels", lb_bad, "--out", f.out);
    tu_assert_error(&r, lb_bad, "wrong IDX magic 0x00000803 at offset 0", "expected 0x00000801");
    assert_pack_fails_cleanly(&f, &r);
    tu_run_free(&r);
    r = tu_bigbatch("pack", "--format", "fmnist", "--images", lb, "--labels", lb, "--out", f.out);
    tu_assert_error(&r, lb, "wrong IDX magic");
    tu_run_free(&r);
    r = tu_bigbatch("pack", "--format", "fmnist", "--images", im, "--labels", lb_9, "--out", f.out);
    tu_assert_error(&r, im, lb_9, "10 images", "9 labels");
    assert_pack_fails_cleanly(&f, &r);
    tu_run_free(&r);
    /* Counts agree but the image data ends early: found while packing, and
     * the partial output is removed. */
    char *im_short = idx_file(&f, "images-short", images_h, 16, 9 * 784);
    r = tu_bigbatch("pack", "--format", "fmnist", "--images", im_short, "--labels", lb, "--out", f.out);
    tu_assert_error(&r, im_short, "truncated", "offset 7072");
    assert_pack_fails_cleanly(&f, &r);
    tu_run_free(&r);
    /* More images than the header announces. */
    char *im_long = idx_file(&f, "images-long", images_h, 16, 11 * 784);
    r = tu_bigbatch("pack", "--format", "fmnist", "--images", im_long, "--labels", lb, "--out", f.out);
    tu_assert_error(&r, im_long, "data continues at offset 7856");
    assert_pack_fails_cleanly(&f, &r);
    tu_run_free(&r);
    r = tu_bigbatch("pack", "--format", "fmnist", "--images", im, "--labels", lb, "--out", f.out);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    free(im), free(lb_bad), free(lb_9), free(lb), free(im_short), free(im_long);
    teardown(&f);
}

Test(cli, llmc_wrong_magic_and_truncation)
{
    fixture f = setup();
    int32_t header[256] = {20240521, 1, 100};
    char *bad = tu_path(f.dir, "bad.bin");
    uint8_t *buf = calloc(1, 1024 + 200);
    memcpy(buf, header, sizeof header);
    tu_write_file(bad, buf, 1024 + 200);
    tu_run r = tu_bigbatch("pack", "--format", "llmc", "--in", bad, "--seq-len", "8", "--out", f.out);
    tu_assert_error(&r, bad, "not an llm.c token file", "magic 20240521 at offset 0");
    assert_pack_fails_cleanly(&f, &r);
    tu_run_free(&r);
    header[0] = 20240520;
    memcpy(buf, header, sizeof header);
    tu_write_file(bad, buf, 1024 + 150);
    r = tu_bigbatch("pack", "--format", "llmc", "--in", bad, "--seq-len", "8", "--out", f.out);
    tu_assert_error(&r, bad, "100 tokens", "1174 bytes", "truncated");
    assert_pack_fails_cleanly(&f, &r);
    tu_run_free(&r);
    free(buf), free(bad);
    teardown(&f);
}

Test(cli, verify_reports_flipped_byte_with_frame_and_offset)
{
    fixture f = setup();
    char *shard = packed_shard(&f);
    /* Frame 3's offset, from the seek table (data/FORMAT.md). */
    size_t size;
    uint8_t *file = tu_read_file(shard, &size);
    uint32_t frames, csize[5];
    memcpy(&frames, file + size - 9, 4);
    const uint8_t *table = file + size - (8 + 12 * (size_t)frames + 9) + 8;
    uint64_t offset = 0;
    for (int i = 0; i < 5; i++) memcpy(&csize[i], table + 12 * i, 4);
    for (int i = 0; i < 4; i++) offset += csize[i]; /* metadata + data frames 0..2 */
    free(file);
    tu_flip_byte(shard, (long)(offset + csize[4] / 2), 0x08);
    char where[64];
    snprintf(where, sizeof where, "frame 3 at offset %llu", (unsigned long long)offset);
    tu_run r = tu_bigbatch("inspect", f.out, "--verify");
    tu_assert_error(&r, shard, where);
    cr_assert_eq(r.exit_code, 1);
    cr_assert_not_null(strstr(r.out, "verify   FAILED after 3 good frames"), "%s", r.out);
    tu_run_free(&r);
    r = tu_bigbatch("inspect", f.out); /* without --verify the frames are not read */
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    free(shard);
    teardown(&f);
}

Test(cli, inspect_reports_truncated_and_wrong_footer)
{
    fixture f = setup();
    char *shard = packed_shard(&f);
    size_t size;
    free(tu_read_file(shard, &size));
    tu_flip_byte(shard, (long)size - 2, 0x20);
    tu_run r = tu_bigbatch("inspect", shard);
    tu_assert_error(&r, shard, "no seek table footer");
    tu_run_free(&r);
    tu_truncate(shard, (long)size / 2);
    r = tu_bigbatch("inspect", f.out, "--verify");
    tu_assert_error(&r, shard, "truncated");
    tu_run_free(&r);
    free(shard);
    teardown(&f);
}

Test(cli, packed_shards_decode_with_stock_zstd)
{
    fixture f = setup();
    free(packed_shard(&f));
    char *in = tu_path(f.dir, "in.txt"); /* packed_shard's input */
    /* zstd -d over all shards, in order, gives the records; compare with the
     * windows cut from the input. */
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cat %s/shard-*.bbs | zstd -q -d -c > %s/all.raw", f.out, f.dir);
    cr_assert_eq(system(cmd), 0);
    char *raw_path = tu_path(f.dir, "all.raw");
    size_t nraw, ntext;
    uint8_t *raw = tu_read_file(raw_path, &nraw), *text = tu_read_file(in, &ntext);
    size_t records = (ntext - 1) / 64;
    cr_assert_eq(nraw, records * 65 * 2);
    for (size_t r = 0; r < records; r++)
        for (size_t t = 0; t < 65; t++) {
            uint16_t tok;
            memcpy(&tok, raw + (r * 65 + t) * 2, 2);
            cr_assert_eq(tok, text[r * 64 + t], "record %zu token %zu", r, t);
        }
    free(raw), free(text), free(raw_path), free(in);
    teardown(&f);
}

/* Patches `size` bytes at `offset` of the file. */
static void patch(const char *path, long offset, const void *bytes, size_t size)
{
    FILE *fp = fopen(path, "r+b");
    cr_assert_not_null(fp);
    fseek(fp, offset, SEEK_SET);
    cr_assert_eq(fwrite(bytes, 1, size, fp), size);
    fclose(fp);
}

Test(cli, inspect_reports_inconsistent_seek_table_and_metadata)
{
    fixture f = setup();
    char *shard = packed_shard(&f);
    size_t size;
    uint8_t *file = tu_read_file(shard, &size);
    uint32_t frames;
    memcpy(&frames, file + size - 9, 4);
    long table = (long)size - (8 + 12 * (long)frames + 9);
    /* Seek-table sizes exceeding the file: data frame 0 claims 16 MiB more. */
    uint32_t huge = 16u << 20;
    patch(shard, table + 8 + 12 + 0, &huge, 4);
    tu_run r = tu_bigbatch("inspect", shard);
    tu_assert_error(&r, shard, "frame 0 at offset 136", "runs past the seek table");
    tu_run_free(&r);
    tu_write_file(shard, file, size);
    /* Metadata whose record size does not divide the frames: 65 tokens
     * (130 bytes) becomes 66 (132), re-checksummed so only the sizes disagree. */
    uint8_t payload[128];
    memcpy(payload, file + 8, sizeof payload);
    uint32_t tokens = 66, bytes = 132;
    memcpy(payload + 16, &tokens, 4);
    memcpy(payload + 32, &bytes, 4);
    uint32_t sum = (uint32_t)XXH64(payload, 124, 0);
    memcpy(payload + 124, &sum, 4);
    patch(shard, 8, payload, sizeof payload);
    r = tu_bigbatch("inspect", f.out, "--verify");
    tu_assert_error(&r, shard, "frame 0 at offset 136", "not a whole number of 132-byte records");
    tu_run_free(&r);
    free(file), free(shard);
    teardown(&f);
}
