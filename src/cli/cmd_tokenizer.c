/* cmd_tokenizer.c — `bigbatch tokenizer train|encode`: byte-level BPE
 * vocabularies made from text, and text turned into their tokens. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bigbatch/tokenizer.h"
#include "commands.h"

static int train(int argc, char **argv)
{
    static const char usage[] = "bigbatch tokenizer train --in FILE... --vocab N --out tokenizer.json [--threads N]";
    static const char summary[] =
        "Trains a byte-level BPE tokenizer (GPT-2's: its pre-tokenizer splits the text into\n"
        "words, the 256 bytes are ids 0..255, then each merge of the most frequent adjacent\n"
        "pair is the next id; <|endoftext|> is the last id). Writes a Hugging Face\n"
        "tokenizer.json, which `pack --tokenizer` and the `tokenizers` package both read.\n\n"
        "example: bigbatch tokenizer train --in kjv.txt --vocab 2048 --out kjv-bpe.json";
    bb_str_list inputs = {0};
    const char *out = NULL;
    int64_t vocab = 0, threads = bb_cpu_count();
    const bb_opt opts[] = {
        {"--in", BB_OPT_LIST, &inputs, "FILE...", "text files to learn from", .required = true},
        {"--vocab", BB_OPT_INT, &vocab, "N", "ids in all: the 256 bytes, the merges and <|endoftext|>", .min = 258,
         .max = 1 << 24, .required = true},
        {"--out", BB_OPT_STRING, &out, "FILE", "the tokenizer.json to write (replaced when it exists)",
         .required = true},
        {"--threads", BB_OPT_INT, &threads, "N", "threads counting words", .min = 1, .max = 256},
        {0}};
    bb_status rc = bb_cli_parse("tokenizer train", opts, argc, argv, NULL);
    char target[4096];
    if (rc == BB_OK) rc = bb_check_output("--out", out, (const char *const *)inputs.items, inputs.count, target,
                                          sizeof target);
    bb_tokenizer_train_options o = {.inputs = (const char *const *)inputs.items, .input_count = inputs.count,
                                    .vocab = (uint32_t)vocab, .threads = (int)threads, .out = target,
                                    .interrupted = &bb_cli_interrupted, .progress = stderr};
    bb_tokenizer_train_report r;
    if (rc == BB_OK) rc = bb_tokenizer_train(&o, &r);
    if (rc == BB_OK)
        printf("%s: %u merges from %.1f MB (%llu words, %llu distinct): words counted in %.2f s, merged in %.2f s\n",
               out, r.merges, r.bytes / 1e6, (unsigned long long)r.words, (unsigned long long)r.unique_words,
               r.count_seconds, r.merge_seconds);
    uint32_t ids = 256 + r.merges + 1; /* the bytes, the merges, <|endoftext|> */
    if (rc == BB_OK && ids < (uint32_t)vocab)
        BB_WARN("--vocab %lld: the text has only %u merges to learn (no pair of tokens is left), so %s has %u ids, "
                "not %lld: give it more text, or ask for fewer", (long long)vocab, r.merges, out, ids,
                (long long)vocab);
    int code = bb_cli_report(rc, usage, summary, opts);
    bb_cli_free(opts, NULL);
    return code;
}

static int encode(int argc, char **argv)
{
    static const char usage[] = "bigbatch tokenizer encode --tokenizer FILE --in FILE [--threads N] [--stats]";
    static const char summary[] =
        "Prints the token ids of a file's text (one line, separated by spaces), or with --stats\n"
        "only how many tokens and bytes there are and how fast they were encoded.";
    const char *tok = NULL, *in = NULL;
    int64_t threads = 1;
    bool stats = false;
    const bb_opt opts[] = {
        {"--tokenizer", BB_OPT_STRING, &tok, "FILE", "a byte-level BPE tokenizer.json", .required = true},
        {"--in", BB_OPT_STRING, &in, "FILE", "the text to encode", .required = true},
        {"--threads", BB_OPT_INT, &threads, "N", "threads encoding (the tokens are the same for any N)", .min = 1,
         .max = 256},
        {"--stats", BB_OPT_FLAG, &stats, NULL, "print counts and MB/s instead of the ids"},
        {0}};
    bb_tokenizer_t *t = NULL;
    bb_tokens ids = {0};
    const uint8_t *text = NULL;
    size_t n = 0;
    bb_status rc = bb_cli_parse("tokenizer encode", opts, argc, argv, NULL);
    if (rc == BB_OK) rc = bb_tokenizer_load(tok, &t);
    int fd = rc == BB_OK ? open(in, O_RDONLY | O_CLOEXEC) : -1;
    struct stat st;
    if (rc == BB_OK && (fd < 0 || fstat(fd, &st))) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot open", in);
    else if (rc == BB_OK && !S_ISREG(st.st_mode)) rc = bb_fail(BB_ERR_IO, "%s: not a regular file", in);
    if (rc == BB_OK && (n = (size_t)st.st_size) &&
        (text = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED)
        text = NULL, rc = bb_fail_errno(BB_ERR_IO, "%s: cannot map", in);
    if (fd >= 0) close(fd);
    double t0 = bb_clock_seconds();
    if (rc == BB_OK) rc = bb_tokenizer_encode_parallel(t, text, n, (int)threads, &ids);
    double dt = bb_clock_seconds() - t0;
    if (rc == BB_OK && stats)
        printf("%s: %zu bytes, %zu tokens (%.4f tokens per byte), %.2f s, %.2f MB/s on %d thread%s\n", in, n, ids.n,
               n ? (double)ids.n / (double)n : 0.0, dt, n / 1e6 / dt, (int)threads, threads == 1 ? "" : "s");
    for (size_t i = 0; rc == BB_OK && !stats && i < ids.n; i++) printf(i ? " %u" : "%u", ids.v[i]);
    if (rc == BB_OK && !stats) putchar('\n');
    if (text) munmap((void *)text, n);
    bb_tokens_free(&ids);
    bb_tokenizer_destroy(t);
    int code = bb_cli_report(rc, usage, summary, opts);
    bb_cli_free(opts, NULL);
    return code;
}

int bb_cmd_tokenizer(int argc, char **argv)
{
    static const char help[] = "usage: bigbatch tokenizer <train|encode> [options]\n\n"
                               "  train    learn a byte-level BPE vocabulary from text: a tokenizer.json\n"
                               "  encode   the token ids of a file's text (--stats: counts and speed)\n\n"
                               "'bigbatch tokenizer <what> --help' explains its options; `pack --tokenizer`\n"
                               "packs text with one.\n";
    if (argc >= 1 && !strcmp(argv[0], "train")) return train(argc - 1, argv + 1);
    if (argc >= 1 && !strcmp(argv[0], "encode")) return encode(argc - 1, argv + 1);
    bool asked = argc >= 1 && (!strcmp(argv[0], "-h") || !strcmp(argv[0], "--help"));
    if (argc >= 1 && !asked) fprintf(stderr, "bigbatch: error: unknown tokenizer command '%s'\n\n", argv[0]);
    fputs(help, asked ? stdout : stderr);
    return asked ? BB_EXIT_OK : BB_EXIT_USAGE;
}
