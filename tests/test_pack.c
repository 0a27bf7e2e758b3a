/* test_pack.c — `pack` through the library: round trips for text, llm.c and
 * Fashion-MNIST (generated, and the real files when installed), splits,
 * output replacement and interruption. */
#include <dirent.h>
#include <zlib.h>

#include <xxhash.h>

#include "bigbatch/json.h"
#include "bigbatch/pack.h"
#include "test_util.h"

TestSuite(pack);

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

/* Reads every record of the dataset at `path` into one buffer. */
static uint8_t *read_all_records(const char *path, uint64_t *count, bb_shard_meta *meta)
{
    bb_dataset_t *ds;
    cr_assert_eq(bb_dataset_open(path, &ds), BB_OK, "%s", bb_error_message());
    *meta = *bb_dataset_meta(ds);
    *count = bb_dataset_record_count(ds);
    uint8_t *all = malloc(*count * meta->record_size + 1), *p = all;
    bb_frame_decoder_t *dec;
    cr_assert_eq(bb_frame_decoder_create(&dec), BB_OK);
    for (uint32_t s = 0; s < bb_dataset_shard_count(ds); s++) {
        const bb_shard_t *sh = bb_dataset_shard(ds, s);
        for (uint32_t f = 0; f < bb_shard_frame_count(sh); f++) {
            cr_assert_eq(bb_shard_read_frame(sh, f, dec, p, bb_shard_frame_at(sh, f)->raw_size), BB_OK, "%s",
                         bb_error_message());
            p += bb_shard_frame_at(sh, f)->raw_size;
        }
    }
    cr_assert_eq((uint64_t)(p - all), *count * meta->record_size);
    bb_frame_decoder_destroy(dec);
    bb_dataset_close(ds);
    return all;
}

static bb_pack_options options(const char *out)
{
    bb_pack_options o = bb_pack_defaults();
    o.out_dir = out;
    o.writer.frame_bytes = 8192;
    return o;
}

/* Writes 3000 random bytes (seed) to `in` and returns the options that pack
 * them as text of 32-token records into `out`; inputs[0] becomes `in`. */
static bb_pack_options random_text(const char *in, const char *out, uint64_t seed, const char *inputs[1])
{
    uint8_t text[3000];
    tu_fill_random(text, sizeof text, seed);
    tu_write_file(in, text, sizeof text);
    bb_pack_options o = options(out);
    inputs[0] = in;
    o.format = BB_PACK_TEXT, o.inputs = inputs, o.input_count = 1, o.seq_len = 32;
    return o;
}

/* Checks record r of `records` against the token stream: tokens [r*T, r*T+T]. */
static void assert_windows(const uint8_t *records, uint64_t count, uint64_t first, const uint16_t *stream,
                           uint32_t seq_len)
{
    for (uint64_t r = 0; r < count; r++) {
        const uint16_t *rec = (const uint16_t *)(const void *)(records + r * 2 * (seq_len + 1));
        cr_assert_eq(memcmp(rec, stream + (first + r) * seq_len, 2 * (seq_len + 1)), 0, "record %llu",
                     (unsigned long long)(first + r));
    }
}

/* n random bytes of text, and the token stream they are (one token a byte). */
static void random_stream(uint8_t *text, uint16_t *stream, int n, uint64_t seed)
{
    tu_fill_random(text, (size_t)n, seed);
    for (int i = 0; i < n; i++) stream[i] = text[i];
}

Test(pack, text_round_trip_with_split_across_files)
{
    char *dir = tu_temp_dir();
    enum { N = 10000, T = 64 };
    uint8_t text[N];
    uint16_t stream[N];
    random_stream(text, stream, N, 11);
    char *a = tu_path(dir, "a.txt"), *b = tu_path(dir, "b.txt"), *out = tu_path(dir, "out");
    tu_write_file(a, text, 6001);
    tu_write_file(b, text + 6001, N - 6001);
    bb_pack_options o = options(out);
    const char *inputs[] = {a, b};
    o.format = BB_PACK_TEXT, o.inputs = inputs, o.input_count = 2, o.seq_len = T, o.val_fraction = 0.2;
    o.val_split = BB_VAL_TAIL;
    bb_pack_report r;
    cr_assert_eq(bb_pack(&o, &r), BB_OK, "%s", bb_error_message());
    uint64_t total = (N - 1) / T, val = total / 5;
    cr_assert_eq(r.train.records, total - val);
    cr_assert_eq(r.val.records, val);
    cr_assert_eq(r.unused_tokens, N - 1 - total * T);

    char *train_dir = tu_path(out, "train"), *val_dir = tu_path(out, "val");
    bb_shard_meta m;
    uint64_t n;
    uint8_t *train = read_all_records(train_dir, &n, &m);
    cr_assert_eq(n, total - val);
    cr_assert_eq(m.kind, BB_RECORD_TOKENS_U16);
    cr_assert_eq(m.shape[0], T + 1);
    cr_assert_eq(m.classes_or_vocab, 256);
    cr_assert_str_eq(m.source, "a.txt +1 more");
    assert_windows(train, n, 0, stream, T);
    uint8_t *valr = read_all_records(val_dir, &n, &m);
    cr_assert_eq(n, val);
    assert_windows(valr, n, total - val, stream, T); /* the tail of the input */
    free(train), free(valr), free(train_dir), free(val_dir), free(a), free(b), free(out);
    tu_rm_tree(dir);
    free(dir);
}

/* The record index of a T-window of `stream` (each record is window i:
 * tokens [i·T, i·T + T]). */
static uint64_t window_of(const uint8_t *rec, const uint16_t *stream, uint64_t total, uint32_t seq_len)
{
    for (uint64_t i = 0; i < total; i++)
        if (!memcmp(rec, stream + i * seq_len, 2 * (seq_len + 1))) return i;
    cr_assert_fail("a record that is no window of the input");
    return 0;
}

/* --val-split spread (the default): exactly floor(F·N) records, drawn over
 * the whole input (seeded: the same seed the same split, another seed
 * another), train and val each in input order and together every record
 * once. */
Test(pack, a_spread_validation_split_draws_over_the_whole_input)
{
    char *dir = tu_temp_dir();
    enum { N = 20000, T = 32 };
    uint8_t text[N];
    uint16_t stream[N];
    random_stream(text, stream, N, 21);
    char *in = tu_path(dir, "in.txt"), *out = tu_path(dir, "out"), *other = tu_path(dir, "other");
    tu_write_file(in, text, N);
    bb_pack_options o = options(out);
    const char *inputs[] = {in};
    o.format = BB_PACK_TEXT, o.inputs = inputs, o.input_count = 1, o.seq_len = T, o.val_fraction = 0.1;
    bb_pack_report r;
    cr_assert_eq(bb_pack(&o, &r), BB_OK, "%s", bb_error_message());
    uint64_t total = (N - 1) / T, val = total / 10;
    cr_assert_eq(r.val.records, val);
    cr_assert_eq(r.train.records, total - val);
    char *train_dir = tu_path(out, "train"), *val_dir = tu_path(out, "val");
    bb_shard_meta m;
    uint64_t nt, nv;
    uint8_t *train = read_all_records(train_dir, &nt, &m), *valr = read_all_records(val_dir, &nv, &m);
    bool *seen = calloc(total, sizeof *seen);
    uint64_t prev = 0, lo = total, hi = 0;
    for (uint64_t k = 0; k < nv; k++) {
        uint64_t i = window_of(valr + k * 2 * (T + 1), stream, total, T);
        cr_assert(k == 0 || i > prev, "val out of input order at %llu", (unsigned long long)k);
        prev = i, seen[i] = true, lo = i < lo ? i : lo, hi = i > hi ? i : hi;
    }
    cr_assert(lo < total / 10 && hi > total * 9 / 10, "val spans records %llu..%llu of %llu: not spread",
              (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)total);
    for (uint64_t k = 0, last = 0; k < nt; k++) {
        uint64_t i = window_of(train + k * 2 * (T + 1), stream, total, T);
        cr_assert(k == 0 || i > last, "train out of input order at %llu", (unsigned long long)k);
        cr_assert_not(seen[i], "record %llu is in both splits", (unsigned long long)i);
        seen[i] = true, last = i;
    }
    for (uint64_t i = 0; i < total; i++) cr_assert(seen[i], "record %llu is in neither split", (unsigned long long)i);
    o.out_dir = other, o.val_seed = 2;
    cr_assert_eq(bb_pack(&o, &r), BB_OK, "%s", bb_error_message());
    char *other_val = tu_path(other, "val");
    uint64_t n2;
    uint8_t *v2 = read_all_records(other_val, &n2, &m);
    cr_assert_eq(n2, nv);
    cr_assert_neq(memcmp(v2, valr, nv * 2 * (T + 1)), 0, "another seed drew the same split");
    free(seen), free(train), free(valr), free(v2), free(train_dir), free(val_dir), free(other_val);
    free(in), free(out), free(other);
    tu_rm_tree(dir);
    free(dir);
}

static void write_llmc(const char *path, const uint16_t *tokens, int32_t count, int32_t magic)
{
    int32_t header[256] = {magic, 1, count};
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    fwrite(header, sizeof header, 1, f);
    fwrite(tokens, 2, (size_t)count, f);
    fclose(f);
}

Test(pack, llmc_round_trip_across_files)
{
    char *dir = tu_temp_dir();
    enum { N = 5000, T = 100, VOCAB = 50257 };
    uint16_t stream[N];
    tu_fill_random(stream, sizeof stream, 12);
    for (int i = 0; i < N; i++) stream[i] %= VOCAB;
    char *a = tu_path(dir, "a.bin"), *b = tu_path(dir, "b.bin"), *out = tu_path(dir, "out");
    write_llmc(a, stream, 1234, 20240520);
    write_llmc(b, stream + 1234, N - 1234, 20240520);
    bb_pack_options o = options(out);
    const char *inputs[] = {a, b};
    o.format = BB_PACK_LLMC, o.inputs = inputs, o.input_count = 2, o.seq_len = T, o.vocab = VOCAB;
    bb_pack_report r;
    cr_assert_eq(bb_pack(&o, &r), BB_OK, "%s", bb_error_message());
    bb_shard_meta m;
    uint64_t n;
    uint8_t *records = read_all_records(out, &n, &m);
    cr_assert_eq(n, (N - 1) / T);
    cr_assert_eq(m.classes_or_vocab, VOCAB);
    assert_windows(records, n, 0, stream, T);
    free(records);

    /* A token at or above --vocab names the file and byte offset. */
    stream[1234 + 10] = VOCAB;
    write_llmc(b, stream + 1234, N - 1234, 20240520);
    char *out2 = tu_path(dir, "out2");
    o.out_dir = out2;
    cr_assert_eq(bb_pack(&o, &r), BB_ERR_CORRUPT);
    cr_assert_not_null(strstr(bb_error_message(), b));
    cr_assert_not_null(strstr(bb_error_message(), "token 50257 at offset 1044"), "%s", bb_error_message());
    cr_assert_not(tu_exists(out2));
    /* Also in the tail that fills no record: checked before any output. */
    stream[1234 + 10] = 7;
    stream[4990] = VOCAB;
    write_llmc(b, stream + 1234, N - 1234, 20240520);
    cr_assert_eq(bb_pack(&o, &r), BB_ERR_CORRUPT);
    cr_assert_not_null(strstr(bb_error_message(), "at offset 8536"), "%s", bb_error_message());
    free(a), free(b), free(out), free(out2);
    tu_rm_tree(dir);
    free(dir);
}

/* Writes IDX files (gzipped when gz) for `n` images of rows x cols. */
static void write_idx(const char *images, const char *labels, const uint8_t *pix, const uint8_t *lab, uint32_t n,
                      uint32_t rows, uint32_t cols, bool gz)
{
    uint8_t ih[16] = {0, 0, 8, 3, n >> 24, n >> 16, n >> 8, n, 0, 0, rows >> 8, rows, 0, 0, cols >> 8, cols};
    uint8_t lh[8] = {0, 0, 8, 1, n >> 24, n >> 16, n >> 8, n};
    gzFile fi = gzopen(images, gz ? "wb" : "wbT"), fl = gzopen(labels, gz ? "wb" : "wbT");
    cr_assert(fi && fl);
    gzwrite(fi, ih, sizeof ih);
    gzwrite(fi, pix, n * rows * cols);
    gzwrite(fl, lh, sizeof lh);
    gzwrite(fl, lab, n);
    gzclose(fi), gzclose(fl);
}

Test(pack, fmnist_round_trip_plain_and_gzipped)
{
    enum { N = 700, PX = 28 * 28 };
    uint8_t *pix = malloc(N * PX), lab[N];
    tu_fill_random(pix, N * PX, 13);
    for (int i = 0; i < N; i++) lab[i] = (uint8_t)(i * 7 % 10);
    for (int gz = 0; gz < 2; gz++) {
        char *dir = tu_temp_dir();
        char *im = tu_path(dir, "img"), *lb = tu_path(dir, "lab"), *out = tu_path(dir, "out");
        write_idx(im, lb, pix, lab, N, 28, 28, gz);
        bb_pack_options o = options(out);
        o.format = BB_PACK_FMNIST, o.images = im, o.labels = lb;
        bb_pack_report r;
        cr_assert_eq(bb_pack(&o, &r), BB_OK, "%s", bb_error_message());
        bb_shard_meta m;
        uint64_t n;
        uint8_t *records = read_all_records(out, &n, &m);
        cr_assert_eq(n, N);
        cr_assert_eq(m.kind, BB_RECORD_IMAGE_U8);
        cr_assert_eq(m.classes_or_vocab, 10);
        cr_assert_eq(m.shape[0], 28);
        cr_assert_eq(m.shape[1], 28);
        for (int i = 0; i < N; i++) {
            cr_assert_eq(records[i * (PX + 1)], lab[i], "label %d", i);
            cr_assert_eq(memcmp(records + i * (PX + 1) + 1, pix + i * PX, PX), 0, "image %d", i);
        }
        free(records), free(im), free(lb), free(out);
        tu_rm_tree(dir);
        free(dir);
    }
    free(pix);
}

/* Reads a real IDX.gz independently of the importer (plain zlib). */
static uint8_t *gunzip_all(const char *path, size_t header, size_t *size)
{
    gzFile f = gzopen(path, "rb");
    cr_assert_not_null(f);
    size_t cap = 64 << 20;
    uint8_t *buf = malloc(cap);
    int n = gzread(f, buf, (unsigned)cap);
    gzclose(f);
    cr_assert_gt(n, (int)header);
    *size = (size_t)n - header;
    memmove(buf, buf + header, *size);
    return buf;
}

Test(pack, fmnist_real_files_round_trip)
{
    if (access(FMNIST_DIR "/t10k-images-idx3-ubyte.gz", R_OK) != 0)
        cr_skip_test("skipped: Debian's dataset-fashion-mnist is not installed (make data-fmnist installs it)");
    const char *sets[][2] = {{FMNIST_DIR "/t10k-images-idx3-ubyte.gz", FMNIST_DIR "/t10k-labels-idx1-ubyte.gz"},
                             {FMNIST_DIR "/train-images-idx3-ubyte.gz", FMNIST_DIR "/train-labels-idx1-ubyte.gz"}};
    const uint64_t counts[] = {10000, 60000};
    for (int k = 0; k < 2; k++) {
        char *dir = tu_temp_dir(), *out = tu_path(dir, "out");
        bb_pack_options o = options(out);
        o.writer.frame_bytes = 256 << 10;
        o.format = BB_PACK_FMNIST, o.images = sets[k][0], o.labels = sets[k][1];
        bb_pack_report r;
        cr_assert_eq(bb_pack(&o, &r), BB_OK, "%s", bb_error_message());
        size_t npix, nlab;
        uint8_t *pix = gunzip_all(sets[k][0], 16, &npix), *lab = gunzip_all(sets[k][1], 8, &nlab);
        cr_assert_eq(nlab, counts[k]);
        cr_assert_eq(npix, counts[k] * 784);
        bb_shard_meta m;
        uint64_t n;
        uint8_t *records = read_all_records(out, &n, &m);
        cr_assert_eq(n, counts[k]);
        for (uint64_t i = 0; i < n; i++) {
            cr_assert_eq(records[i * 785], lab[i]);
            cr_assert_eq(memcmp(records + i * 785 + 1, pix + i * 784, 784), 0, "image %llu", (unsigned long long)i);
        }
        free(records), free(pix), free(lab), free(out);
        tu_rm_tree(dir);
        free(dir);
    }
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

Test(pack, existing_output_needs_force_and_only_holds_shards)
{
    char *dir = tu_temp_dir();
    char *in = tu_path(dir, "in.txt"), *out = tu_path(dir, "out"), *marker = tu_path(out, "notes.txt");
    const char *inputs[1];
    bb_pack_options o = random_text(in, out, 14, inputs);
    bb_pack_report r;
    cr_assert_eq(bb_pack(&o, &r), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_pack(&o, &r), BB_ERR_ARG);
    cr_assert_not_null(strstr(bb_error_message(), "--force"), "%s", bb_error_message());
    o.force = true;
    o.seq_len = 16; /* a different dataset replaces the old one */
    cr_assert_eq(bb_pack(&o, &r), BB_OK, "%s", bb_error_message());
    bb_shard_meta m;
    uint64_t n;
    free(read_all_records(out, &n, &m));
    cr_assert_eq(m.shape[0], 17);
    tu_write_file(marker, "mine", 4);
    cr_assert_eq(bb_pack(&o, &r), BB_ERR_IO); /* bad input (exit 1), not usage */
    cr_assert_not_null(strstr(bb_error_message(), "not bigbatch shards"), "%s", bb_error_message());
    cr_assert(tu_exists(marker));
    cr_assert_eq(count_entries(dir), 2, "no temporary directory may remain");
    free(in), free(out), free(marker);
    tu_rm_tree(dir);
    free(dir);
}

Test(pack, interrupt_leaves_nothing_behind)
{
    char *dir = tu_temp_dir();
    char *in = tu_path(dir, "in.txt"), *out = tu_path(dir, "new/deeper/out");
    uint8_t text[3000];
    tu_fill_random(text, sizeof text, 15);
    tu_write_file(in, text, sizeof text);
    bb_pack_options o = options(out);
    const char *inputs[] = {in};
    volatile sig_atomic_t stop = 1;
    o.format = BB_PACK_TEXT, o.inputs = inputs, o.input_count = 1, o.seq_len = 32, o.interrupted = &stop;
    bb_pack_report r;
    cr_assert_eq(bb_pack(&o, &r), BB_ERR_INTERRUPTED);
    cr_assert_eq(count_entries(dir), 1, "only the input may remain (created parents are removed too)");
    /* Parents created before a later one fails are removed as well. */
    char long_name[300];
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    char *too_long = malloc(4096);
    snprintf(too_long, 4096, "%s/new/%s/out", dir, long_name);
    o.out_dir = too_long;
    cr_assert_eq(bb_pack(&o, &r), BB_ERR_IO);
    cr_assert_eq(count_entries(dir), 1, "%s", bb_error_message());
    free(too_long);
    o.out_dir = out;
    stop = 0;
    cr_assert_eq(bb_pack(&o, &r), BB_OK, "%s", bb_error_message());
    cr_assert(tu_exists(out));
    free(in), free(out);
    tu_rm_tree(dir);
    free(dir);
}

Test(pack, val_fraction_must_leave_both_splits)
{
    char *dir = tu_temp_dir();
    char *in = tu_path(dir, "in.txt"), *out = tu_path(dir, "out");
    tu_write_file(in, "abcdefghijklmnopqrstuvwxyz", 26); /* 5 records of 5 tokens */
    bb_pack_options o = options(out);
    const char *inputs[] = {in};
    o.format = BB_PACK_TEXT, o.inputs = inputs, o.input_count = 1, o.seq_len = 5, o.val_fraction = 0.1;
    bb_pack_report r;
    cr_assert_eq(bb_pack(&o, &r), BB_ERR_ARG);
    cr_assert_not_null(strstr(bb_error_message(), "empty split"), "%s", bb_error_message());
    cr_assert_not(tu_exists(out));
    o.val_fraction = 0.2;
    cr_assert_eq(bb_pack(&o, &r), BB_OK, "%s", bb_error_message());
    cr_assert_eq(r.train.records, 4);
    cr_assert_eq(r.val.records, 1);
    free(in), free(out);
    tu_rm_tree(dir);
    free(dir);
}

/* The committed default data decodes to exactly the windows of the text
 * that data/README.md names as its source. */
Test(pack, embedded_kjv_matches_its_source)
{
    if (access("/usr/bin/bible", X_OK) != 0)
        cr_skip_test("skipped: Debian's bible-kjv is not installed (make deps installs it)");
    char *dir = tu_temp_dir(), *txt = tu_path(dir, "kjv.txt");
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "bible -f gen1:1-rev22:21 > %s", txt);
    cr_assert_eq(system(cmd), 0);
    size_t n;
    uint8_t *text = tu_read_file(txt, &n);
    uint16_t *stream = malloc(n * sizeof *stream);
    for (size_t i = 0; i < n; i++) stream[i] = text[i];
    bb_shard_meta m;
    uint64_t train_n, val_n;
    uint8_t *train = read_all_records("data/kjv/train", &train_n, &m);
    cr_assert_eq(m.shape[0], 257);
    uint8_t *val = read_all_records("data/kjv/val", &val_n, &m);
    cr_assert_eq(train_n + val_n, (n - 1) / 256);
    cr_assert_eq(val_n, (train_n + val_n) / 10);
    assert_windows(train, train_n, 0, stream, 256);
    assert_windows(val, val_n, train_n, stream, 256);
    free(train), free(val), free(stream), free(text), free(txt);
    tu_rm_tree(dir);
    free(dir);
}

/* A pack killed with -9 leaves its ".out.partial-PID"; the next pack into
 * the same --out removes it once that process is gone (issue 29, item 8),
 * and leaves one that holds anything but shards. */
Test(pack, a_killed_packs_partial_directory_is_removed_by_the_next_pack)
{
    char *dir = tu_temp_dir();
    char *in = tu_path(dir, "in.txt"), *out = tu_path(dir, "out");
    char *stale = tu_path(dir, ".out.partial-999999999"), *shard = tu_path(stale, "shard-00000.bbs");
    char *mine = tu_path(dir, ".out.partial-999999998"), *notes = tu_path(mine, "notes.txt");
    cr_assert_eq(mkdir(stale, 0755), 0);
    tu_write_file(shard, "x", 1);
    cr_assert_eq(mkdir(mine, 0755), 0);
    tu_write_file(notes, "mine", 4);
    const char *inputs[1];
    bb_pack_options o = random_text(in, out, 15, inputs);
    bb_pack_report r;
    cr_assert_eq(bb_pack(&o, &r), BB_OK, "%s", bb_error_message());
    cr_assert(!tu_exists(stale), "the killed pack's partial directory stayed");
    cr_assert(tu_exists(notes), "a directory with more than shards was removed");
    free(notes), free(mine), free(shard), free(stale), free(in), free(out);
    tu_rm_tree(dir);
    free(dir);
}

/* Every directory pack makes gets an index.json (what a copy in object
 * storage is read by, remote.h): its files with their sizes and XXH64, the
 * splits listed by the top one; `pack --index` writes the same for a dataset
 * packed without; a directory of no dataset is refused. */
Test(pack, pack_writes_the_index_of_each_directory)
{
    char *dir = tu_temp_dir(), *in = tu_path(dir, "in.txt"), *out = tu_path(dir, "out");
    const char *inputs[1];
    bb_pack_options o = random_text(in, out, 31, inputs);
    o.val_fraction = 0.2;
    bb_pack_report r;
    cr_assert_eq(bb_pack(&o, &r), BB_OK, "%s", bb_error_message());
    char *top = tu_path(out, "index.json"), *train = tu_path(out, "train/index.json");
    char *text = (char *)tu_read_file(top, NULL);
    cr_assert_not_null(strstr(text, "\"dirs\": [\n    \"train\",\n    \"val\"\n  ]"), "%s", text);
    free(text);
    json_t *ix;
    cr_assert_eq(bb_json_load_file(train, true, &ix), BB_OK, "%s", bb_error_message());
    json_t *files = json_object_get(ix, "files");
    cr_assert_eq(json_array_size(files), 1);
    json_t *f = json_array_get(files, 0);
    cr_assert_str_eq(json_string_value(json_object_get(f, "name")), "shard-00000.bbs");
    char *shard = tu_path(out, "train/shard-00000.bbs");
    size_t size;
    uint8_t *bytes = tu_read_file(shard, &size);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH64(bytes, size, 0));
    cr_assert_eq((size_t)json_integer_value(json_object_get(f, "bytes")), size);
    cr_assert_str_eq(json_string_value(json_object_get(f, "xxh64")), hex);
    json_decref(ix);
    /* an older dataset: the same index from `pack --index` */
    size_t before_size;
    uint8_t *before = tu_read_file(train, &before_size);
    cr_assert_eq(unlink(train), 0);
    cr_assert_eq(unlink(top), 0);
    tu_run run = tu_bigbatch("pack", "--index", out);
    cr_assert_eq(run.exit_code, 0, "%s", run.err);
    tu_run_free(&run);
    size_t after_size;
    uint8_t *after = tu_read_file(train, &after_size);
    cr_assert(before_size == after_size && !memcmp(before, after, after_size));
    cr_assert(tu_exists(top));
    run = tu_bigbatch("pack", "--index", in); /* a file, not a directory */
    tu_assert_error(&run, in, "cannot list directory");
    tu_run_free(&run);
    char *empty = tu_path(dir, "empty");
    cr_assert_eq(mkdir(empty, 0755), 0);
    run = tu_bigbatch("pack", "--index", empty);
    tu_assert_error(&run, empty, "nothing to index");
    tu_run_free(&run);
    run = tu_bigbatch("pack", "--index", out, "--level", "3");
    tu_assert_error(&run, "--index DIR takes no other option");
    tu_run_free(&run);
    free(before), free(after), free(bytes), free(shard), free(top), free(train), free(empty), free(in), free(out);
    tu_rm_tree(dir);
    free(dir);
}
