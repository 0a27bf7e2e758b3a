/* pack.h — `bigbatch pack`: turns Fashion-MNIST IDX files, text or llm.c
 * token files into a dataset of .bbs shards (DIR, or DIR/train + DIR/val).
 *
 *   bb_pack_options o = bb_pack_defaults();
 *   o.format = BB_PACK_TEXT; o.inputs = files; o.input_count = 1;
 *   o.seq_len = 256; o.out_dir = "data/kjv"; o.val_fraction = 0.1;
 *   bb_pack_report r;
 *   BB_TRY(bb_pack(&o, &r));
 *
 * Input headers, sizes and (for text and llm.c) every token are validated
 * before any output is created; gzipped IDX contents (truncation, labels)
 * are checked while streaming. Output is written under a temporary name and
 * renamed into place at the end: on any failure or interrupt nothing is left
 * behind at out_dir.
 */
#ifndef BIGBATCH_PACK_H
#define BIGBATCH_PACK_H

#include <signal.h>

#include "bigbatch/shard.h"

typedef enum bb_pack_format {
    BB_PACK_FMNIST, /* IDX images + labels (gzipped or not) -> image_u8, 10 classes */
    BB_PACK_TEXT,   /* bytes -> tokens_u16, vocabulary 256; with a tokenizer its tokens (u16, or u32
                     * past 65536 ids), and a copy of it in the dataset (and in each split) */
    BB_PACK_LLMC,   /* llm.c .bin (magic 20240520, version 1) -> tokens_u16 */
} bb_pack_format;

/* --val-split: SPREAD draws floor(F·N) records uniformly over the whole
 * input (a seeded selection sampling, Knuth's Algorithm S: any input
 * order, one pass); TAIL takes the last ones (for an input in order — a
 * book — validation then measures its end only). */
typedef enum bb_val_split { BB_VAL_SPREAD = 0, BB_VAL_TAIL } bb_val_split;

typedef struct bb_pack_options {
    bb_pack_format format;
    const char *images, *labels;       /* fmnist */
    const char *const *inputs;         /* text, llmc: concatenated in order */
    int input_count;
    uint32_t seq_len;                  /* text, llmc: record = seq_len + 1 tokens, stride seq_len */
    uint32_t vocab;                    /* llmc: vocabulary size; every token must be below it */
    const char *tokenizer;             /* text: a byte-level BPE tokenizer.json; NULL: bytes */
    const char *out_dir;
    double val_fraction;               /* 0: one dataset in out_dir; else out_dir/{train,val} */
    bb_val_split val_split;            /* which records go to val (default spread) */
    uint64_t val_seed;                 /* spread: the draw's seed (default 1) */
    bool force;                        /* replace an existing out_dir that holds only shards */
    bb_writer_options writer;
    const volatile sig_atomic_t *interrupted; /* optional: nonzero aborts with BB_ERR_INTERRUPTED */
    void (*progress)(void *ctx, uint64_t done, uint64_t total); /* optional, after each chunk */
    void *progress_ctx;
} bb_pack_options;

typedef struct bb_pack_report {
    bb_dataset_summary train, val;     /* val.records == 0 without a split */
    uint64_t unused_tokens;            /* text, llmc: tail tokens that fill no record */
    double seconds;
} bb_pack_report;

/* zstd levels pack picks when none is given: images' pixels leave zstd
 * little to match and much to entropy-code, and its fast levels store the
 * literals raw (Fashion-MNIST: 1.69 instead of 1.76 to 1, decoded 1.7x as
 * fast); tokens compress by matches, which level 3 finds better (the KJV:
 * 4.8 against 4.2 to 1) at the same decoding speed. */
#define BB_PACK_LEVEL_IMAGES (-1)
#define BB_PACK_LEVEL_TOKENS 3
#define BB_PACK_LEVEL_BY_KIND INT32_MIN /* writer.level: pick by the records' kind */

/* Defaults: level by kind (above), 256 KiB frames, 256 MiB shards, one thread per CPU (at most 32), vocab 50257. */
bb_pack_options bb_pack_defaults(void);

/* Packs per `opts`. Fails with BB_ERR_ARG (bad options, out_dir not empty
 * without force, too few records), BB_ERR_FORMAT / BB_ERR_CORRUPT (bad input,
 * naming the file and offset), BB_ERR_IO, BB_ERR_NOMEM or BB_ERR_INTERRUPTED;
 * on failure out_dir is left as it was. */
bb_status bb_pack(const bb_pack_options *opts, bb_pack_report *report);

#endif /* BIGBATCH_PACK_H */
