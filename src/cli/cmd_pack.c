/* cmd_pack.c — `bigbatch pack`. */
#include <string.h>
#include <unistd.h>

#include "bigbatch/pack.h"
#include "bigbatch/remote.h"
#include "commands.h"

static const char usage[] =
    "bigbatch pack --format fmnist --images FILE --labels FILE --out DIR [options]\n"
    "       bigbatch pack --format text|llmc --in FILE... --seq-len T --out DIR [--tokenizer FILE] [options]\n"
    "       bigbatch pack --index DIR";
static const char summary[] =
    "Packs a dataset into .bbs shards: zstd seekable-format files with a checksummed\n"
    "seek table (data/FORMAT.md), readable by `zstd -d`. Records:\n"
    "  fmnist  IDX images + labels (gzipped or not): label u8 + pixels u8, 10 classes\n"
    "  text    bytes of the concatenated inputs as u16 tokens (vocabulary 256), or with\n"
    "          --tokenizer the tokens of a byte-level BPE tokenizer.json (Hugging Face's,\n"
    "          GPT-2's, or `bigbatch tokenizer train`'s): u16, or u32 past 65536 ids; the\n"
    "          dataset (and each split) keeps a copy of it, for sample to decode with\n"
    "  llmc    llm.c .bin token files (magic 20240520, version 1) as u16 tokens\n"
    "A token record holds T+1 tokens (inputs and shifted targets); windows advance\n"
    "by T. With --val-fraction F a share F of the records goes to DIR/val (drawn over the whole\n"
    "input, or with --val-split tail the last ones), the rest to DIR/train.\n"
    "Output appears at DIR only when everything succeeded.\n\n"
    "example: bigbatch pack --format text --in kjv.txt --seq-len 256 --val-fraction 0.1 --out data/kjv";

typedef struct progress_state {
    bool tty;
    double last;
} progress_state;

static void show_progress(void *ctx, uint64_t done, uint64_t total)
{
    progress_state *p = ctx;
    double now = bb_clock_seconds();
    if (!p->tty || (now - p->last < 0.25 && done < total)) return;
    p->last = now;
    fprintf(stderr, "\rpacking: %3.0f%% (%llu of %llu records)%s", 100.0 * (double)done / (double)total,
            (unsigned long long)done, (unsigned long long)total, done == total ? "\n" : "");
}

static void print_split(const char *dir, const char *name, const bb_dataset_summary *s)
{
    char raw[32], file[32];
    fprintf(stdout, "%s%s%s: %llu records in %u shard%s (%u frame%s): %s raw -> %s, ratio %.2f\n", dir,
            *name ? "/" : "", name, (unsigned long long)s->records, s->shards, s->shards == 1 ? "" : "s",
            s->frames, s->frames == 1 ? "" : "s", bb_format_bytes(s->raw_bytes, raw, sizeof raw),
            bb_format_bytes(s->file_bytes, file, sizeof file), (double)s->raw_bytes / (double)s->file_bytes);
}

static bb_status check_format_flags(const char *format, const bb_pack_options *o, bool has_seq_len,
                                    bool has_vocab)
{
    if (o->tokenizer && strcmp(format, "text"))
        return bb_fail(BB_ERR_ARG, "--tokenizer applies only to --format text (%s holds tokens already)", format);
    bool fmnist = !strcmp(format, "fmnist");
    if (fmnist) {
        if (!o->images || !o->labels)
            return bb_fail(BB_ERR_ARG, "--format fmnist needs --images FILE and --labels FILE");
        if (o->input_count || has_seq_len || has_vocab)
            return bb_fail(BB_ERR_ARG, "--in, --seq-len and --vocab apply to --format text and llmc, not fmnist");
        return BB_OK;
    }
    if (o->images || o->labels) return bb_fail(BB_ERR_ARG, "--images and --labels apply only to --format fmnist");
    if (!o->input_count) return bb_fail(BB_ERR_ARG, "--format %s needs --in FILE...", format);
    if (!has_seq_len) return bb_fail(BB_ERR_ARG, "--format %s needs --seq-len T (tokens per training sequence)", format);
    if (has_vocab && strcmp(format, "llmc") != 0)
        return bb_fail(BB_ERR_ARG, "--vocab applies only to --format llmc (text has 256 byte tokens)");
    return BB_OK;
}

int bb_cmd_pack(int argc, char **argv)
{
    bb_pack_options o = bb_pack_defaults();
    const char *format = NULL, *index_dir = NULL;
    bb_str_list inputs = {0};
    bool has_seq_len = false, has_vocab = false, has_level = false;
    int64_t seq_len = 0, vocab = o.vocab, level = o.writer.level, frame_kib = o.writer.frame_bytes >> 10,
            shard_mib = (int64_t)(o.writer.shard_bytes >> 20), threads = o.writer.threads;
    const bb_opt opts[] = {
        {"--format", BB_OPT_CHOICE, &format, "F", "input format (required but with --index)", .choices = "fmnist|text|llmc"},
        {"--images", BB_OPT_STRING, &o.images, "FILE", "fmnist: IDX image file (.gz or plain)"},
        {"--labels", BB_OPT_STRING, &o.labels, "FILE", "fmnist: IDX label file (.gz or plain)"},
        {"--in", BB_OPT_LIST, &inputs, "FILE...", "text, llmc: input files, concatenated in order"},
        {"--seq-len", BB_OPT_INT, &seq_len, "T", "text, llmc: tokens per sequence; a record holds T+1",
         .min = 1, .max = (BB_SHARD_MAX_FRAME_BYTES / 2) - 1, .given = &has_seq_len},
        {"--vocab", BB_OPT_INT, &vocab, "V", "llmc: vocabulary size; every token must be below it", .min = 2,
         .max = 65536, .given = &has_vocab},
        {"--tokenizer", BB_OPT_STRING, &o.tokenizer, "FILE", "text: encode with this byte-level BPE tokenizer.json "
         "(default: bytes)"},
        {"--out", BB_OPT_STRING, &o.out_dir, "DIR", "output directory (created; must not exist or be empty) (required but "
         "with --index)"},
        {"--val-fraction", BB_OPT_DOUBLE, &o.val_fraction, "F", "put F of the records in DIR/val (--val-split), the "
         "rest in DIR/train", .min = 0, .max = 0.99},
        {"--val-split", BB_OPT_ENUM, &o.val_split, "HOW", "spread: F of the records drawn over the whole input "
         "(seeded; validation then measures what training sees), or tail: the last F (the input's end only)",
         .choices = "spread|tail"},
        {"--val-seed", BB_OPT_U64, &o.val_seed, "S", "spread: the draw's seed", .min = 0, .max = 9.2e18},
        {"--level", BB_OPT_INT, &level, "L", "zstd compression level; negative: zstd's fast levels, down to -131072 "
         "(less compression, faster decoding; default: -1 for "
         "images, whose literals these store raw and decode 1.7x as fast; 3 for tokens, which compress by matches)",
         .min = -131072, .max = 22, .given = &has_level},
        {"--frame-kib", BB_OPT_INT, &frame_kib, "K", "raw KiB per zstd frame (whole records, at least one)", .min = 1, .max = 65536},
        {"--shard-mib", BB_OPT_INT, &shard_mib, "M", "start a new shard before a file exceeds M MiB", .min = 1, .max = 1 << 20},
        {"--threads", BB_OPT_INT, &threads, "N", "frames compressed in parallel (output is identical for any N)", .min = 1, .max = 256},
        {"--force", BB_OPT_FLAG, &o.force, NULL, "replace DIR if it holds only shards from an earlier pack"},
        {"--index", BB_OPT_STRING, &index_dir, "DIR", "only write DIR/index.json (and its splits' own) for a dataset "
         "packed before pack wrote them: the list of files and hashes by which `--data s3://...` or `https://...` "
         "reads a copy of DIR"},
        {0}};
    bb_status rc = bb_cli_parse("pack", opts, argc, argv, NULL);
    o.inputs = inputs.items;
    o.input_count = inputs.count;
    if (rc == BB_OK && index_dir) {
        if (argc != (strncmp(argv[0], "--index=", 8) ? 2 : 1)) rc = bb_fail(BB_ERR_ARG, "--index DIR takes no other option");
        if (rc == BB_OK) rc = bb_index_write(index_dir, true);
        if (rc == BB_OK) printf("%s/%s written\n", index_dir, BB_INDEX_FILE);
        int code = rc == BB_OK ? 0 : bb_cli_report(rc, usage, summary, opts);
        bb_cli_free(opts, NULL);
        return code;
    }
    if (rc == BB_OK && (!format || !o.out_dir))
        rc = bb_fail(BB_ERR_ARG, "%s is required (or --index DIR); see 'bigbatch pack --help'",
                     !format ? "--format F" : "--out DIR");
    if (rc == BB_OK) rc = check_format_flags(format, &o, has_seq_len, has_vocab);
    if (rc != BB_OK) {
        int code = bb_cli_report(rc, usage, summary, opts);
        bb_cli_free(opts, NULL);
        return code;
    }
    o.format = !strcmp(format, "fmnist") ? BB_PACK_FMNIST : !strcmp(format, "text") ? BB_PACK_TEXT : BB_PACK_LLMC;
    o.seq_len = (uint32_t)seq_len;
    o.vocab = (uint32_t)vocab;
    if (has_level) o.writer.level = (int)level;
    o.writer.frame_bytes = (uint32_t)frame_kib << 10;
    o.writer.shard_bytes = (uint64_t)shard_mib << 20;
    o.writer.threads = (int)threads;
    o.interrupted = &bb_cli_interrupted;
    progress_state progress = {.tty = isatty(STDERR_FILENO), .last = bb_clock_seconds()};
    o.progress = show_progress;
    o.progress_ctx = &progress;

    bb_pack_report r;
    rc = bb_pack(&o, &r);
    if (rc == BB_OK) {
        bool split = o.val_fraction > 0;
        print_split(o.out_dir, split ? "train" : "", &r.train);
        if (split) print_split(o.out_dir, "val", &r.val);
        if (o.format != BB_PACK_FMNIST)
            fprintf(stdout, "%llu tail tokens fill no record and were left out\n", (unsigned long long)r.unused_tokens);
        uint64_t raw = r.train.raw_bytes + r.val.raw_bytes;
        fprintf(stdout, "packed in %.2f s (%.1f MB/s of records, %d threads)\n", r.seconds,
                (double)raw / 1e6 / r.seconds, o.writer.threads);
    }
    int code = bb_cli_report(rc, usage, summary, opts);
    bb_cli_free(opts, NULL);
    return code;
}
