/* tokenizer.h — BPE tokenizers: GPT-2's and Llama 3's byte-level BPE and
 * the SentencePiece-style BPE of Llama 2, Mistral and TinyLlama; Hugging
 * Face's `tokenizer.json` read (byte-level also written), text encoded to
 * tokens and tokens decoded to text, and a trainer for new vocabularies.
 *
 *   bb_tokenizer_t *t;
 *   BB_TRY(bb_tokenizer_load("gpt2/tokenizer.json", &t));
 *   bb_tokens ids = {0};
 *   BB_TRY(bb_tokenizer_encode(t, text, len, &ids));  // appends to ids
 *   size_t n;
 *   const uint8_t *bytes = bb_tokenizer_token_bytes(t, ids.v[0], &n);
 *   bb_tokens_free(&ids);
 *   bb_tokenizer_destroy(t);
 *
 * What is read: a `model` of type BPE, its `vocab` and `merges` (strings
 * "a b" or pairs ["a", "b"]), `ignore_merges`, and the `added_tokens`
 * (split out of the text before anything else, as `tokenizers` does; no
 * post-processor runs: no <s> or <|begin_of_text|> is added). Then one of:
 *
 *   byte-level    symbols are bytes in GPT-2's byte-to-unicode alphabet (all
 *                 256 in the vocabulary); the pre-tokenizer is ByteLevel with
 *                 use_regex (GPT-2's split pattern) or a Sequence of a Split on
 *                 a regex (isolated) and a ByteLevel without one (GPT-4's and
 *                 Llama 3's style); the regexes run on PCRE2 with Unicode
 *                 properties. Bytes that are not UTF-8 match no pattern: each
 *                 run of them is one piece of its own.
 *   SentencePiece symbols are characters as the vocabulary writes them (a space
 *                 as U+2581), written by a normalizer of Prepend and Replace
 *                 steps (no pre-tokenizer: the text between added tokens is one
 *                 piece) or by a Metaspace pre-tokenizer (prepend_scheme
 *                 always, first or never; split or not); a character out of the
 *                 vocabulary is its bytes' <0xNN> tokens with byte_fallback,
 *                 else <unk> (a run of them one <unk> with fuse_unk); its
 *                 decoder is Metaspace or a Sequence of Replace, ByteFallback,
 *                 Fuse and Strip. A token's bytes are its text with U+2581 as a
 *                 space (the Strip of the decoded text's first space is left to
 *                 the caller: sample prints the prompt as given).
 *
 * What cannot be represented is refused with one line naming the key:
 * another model type, another normalizer or pre-tokenizer, a Regex Replace,
 * add_prefix_space on ByteLevel, dropout, a subword prefix or suffix, byte
 * fallback in a byte-level BPE.
 */
#ifndef BIGBATCH_TOKENIZER_H
#define BIGBATCH_TOKENIZER_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "bigbatch/core.h"

typedef struct bb_tokenizer bb_tokenizer_t;

/* What a dataset packed with a tokenizer (and a checkpoint trained on one)
 * keeps beside its files: a copy of the tokenizer.json. */
#define BB_TOKENIZER_FILE "tokenizer.json"

/* A growable array of token ids. */
typedef struct bb_tokens {
    uint32_t *v;
    size_t n, cap;
} bb_tokens;
void bb_tokens_free(bb_tokens *t);
/* Appends one id; false when out of memory. */
bool bb_tokens_push(bb_tokens *t, uint32_t id);

/* Reads a `tokenizer.json`. Fails with BB_ERR_IO (cannot read),
 * BB_ERR_FORMAT (not JSON, or a tokenizer this one cannot represent: one
 * line naming the file and the key or the type), BB_ERR_NOMEM. */
bb_status bb_tokenizer_load(const char *path, bb_tokenizer_t **out);
void bb_tokenizer_destroy(bb_tokenizer_t *t);

/* Ids run 0 .. vocab-1 (the largest id plus one, added tokens included). */
uint32_t bb_tokenizer_vocab(const bb_tokenizer_t *t);
/* XXH64 of the file's bytes: what a dataset and a checkpoint record. */
uint64_t bb_tokenizer_hash(const bb_tokenizer_t *t);
/* The path it was loaded from. */
const char *bb_tokenizer_path(const bb_tokenizer_t *t);

/* Appends the tokens of `text` (n bytes) to `out`. Safe to call from
 * several threads at once on one tokenizer. Fails with BB_ERR_NOMEM, or
 * BB_ERR_INTERNAL when PCRE2 reports an error (its message included). */
bb_status bb_tokenizer_encode(const bb_tokenizer_t *t, const uint8_t *text, size_t n, bb_tokens *out);
/* Encodes `n` bytes on `threads` threads, splitting the text only where
 * the pre-tokenizer cannot join across the split (after a newline that a
 * printable ASCII character follows): the tokens are those of one call.
 * Fails as bb_tokenizer_encode. */
bb_status bb_tokenizer_encode_parallel(const bb_tokenizer_t *t, const uint8_t *text, size_t n, int threads,
                                       bb_tokens *out);
/* The bytes token `id` stands for (*len of them); NULL for an id outside
 * the vocabulary or one that no token holds. */
const uint8_t *bb_tokenizer_token_bytes(const bb_tokenizer_t *t, uint32_t id, size_t *len);

/* Where the tokenizer a dataset was packed with lies (DIR/tokenizer.json,
 * or beside the shard `data` names) into path (cap bytes); false when it
 * has none. */
bool bb_tokenizer_file_of_dataset(const char *data, char *path, size_t cap);
/* The tokenizer a dataset was packed with: DIR/tokenizer.json, loaded
 * into *out; *out NULL (and BB_OK) when `data` (a dataset directory, or
 * a shard file) has none. Fails as bb_tokenizer_load. */
bb_status bb_tokenizer_of_dataset(const char *data, bb_tokenizer_t **out);
/* A table of (vocab) byte lengths, one per id (0 for ids no token holds),
 * for bits-per-byte figures; malloc'd, NULL when out of memory. */
uint32_t *bb_tokenizer_byte_lengths(const bb_tokenizer_t *t);

/* ---- training ------------------------------------------------------------
 * Byte-level BPE as `tokenizers`' BpeTrainer makes it: the text is split
 * by GPT-2's pattern, the 256 bytes are ids 0..255, then each merge of the
 * most frequent adjacent pair (ties: the smaller pair of ids) is the next
 * id, until `vocab` ids exist with the special tokens, which come last
 * (default "<|endoftext|>"). The result is a `tokenizer.json` that
 * `tokenizers` loads and that encodes to the same tokens as this encoder. */
typedef struct bb_tokenizer_train_options {
    const char *const *inputs; /* text files, read whole */
    int input_count;
    uint32_t vocab;            /* 257 .. 1<<24, specials included */
    const char *const *specials; /* NULL: "<|endoftext|>" */
    int special_count;
    int threads;               /* for the word counts; 0: one per CPU */
    const char *out;           /* tokenizer.json, written through a temporary file */
    const volatile sig_atomic_t *interrupted; /* optional: nonzero stops with BB_ERR_INTERRUPTED, nothing written */
    FILE *progress;            /* optional: a line per input read, and every 2 s of merging */
} bb_tokenizer_train_options;

typedef struct bb_tokenizer_train_report {
    uint64_t bytes, words, unique_words;
    uint32_t merges;           /* may be fewer than asked when no pair is left */
    double count_seconds, merge_seconds;
} bb_tokenizer_train_report;

/* Fails with BB_ERR_ARG (bad options), BB_ERR_IO (an input unreadable, the
 * output unwritable), BB_ERR_NOMEM, BB_ERR_INTERRUPTED; out is written only
 * on success. */
bb_status bb_tokenizer_train(const bb_tokenizer_train_options *o, bb_tokenizer_train_report *report);

#endif /* BIGBATCH_TOKENIZER_H */
