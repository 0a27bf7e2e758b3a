/* tokenizer_internal.h — private to the tokenizer (tokenizer.c encodes and
 * decodes, tokenizer_train.c trains): GPT-2's byte-to-unicode map, the
 * pre-tokenizer's pattern, and two open-addressing hash maps (pair of ids →
 * value; byte string → value). */
#ifndef BIGBATCH_TOKENIZER_INTERNAL_H
#define BIGBATCH_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "bigbatch/tokenizer.h"

/* GPT-2's pre-tokenizer (`tokenizers`' ByteLevel with use_regex). */
#define BB_GPT2_PATTERN "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* The code point GPT-2's byte-level alphabet writes byte b as. */
void bb_bytelevel_codepoints(uint32_t cp[256]);
/* Appends the UTF-8 of code point c to out (at least 4 bytes free); returns the bytes written. */
int bb_utf8_put(uint32_t c, char *out);

/* A compiled pre-tokenizer pattern (Unicode properties, JIT when the
 * library has it). Fails with BB_ERR_FORMAT naming `what` and PCRE2's
 * message. */
bb_status bb_pretok_compile(const char *pattern, const char *what, pcre2_code **out);
/* Calls fn(ctx, piece, len) for every piece of text: each match, and each
 * run of bytes between matches (bytes that are not UTF-8). Per-thread
 * state is made here. Fails with BB_ERR_NOMEM, BB_ERR_INTERNAL on a PCRE2
 * error, or what fn returns. */
typedef bb_status (*bb_piece_fn)(void *ctx, const uint8_t *piece, size_t len);
bb_status bb_pretok_each(const pcre2_code *re, const uint8_t *text, size_t n, bb_piece_fn fn, void *ctx);
/* Chunks of about `target` bytes (at least) that text may be cut into
 * without changing its pieces: each cut is just after a '\n' that a
 * printable ASCII character follows. *cuts (malloc'd) gets *count + 1
 * offsets, 0 first and n last. Fails with BB_ERR_NOMEM. */
bb_status bb_pretok_cuts(const uint8_t *text, size_t n, size_t target, size_t **cuts, int *count);

/* ---- pair of ids → u64 ---------------------------------------------------- */
typedef struct bb_pair_map {
    uint64_t *keys, *vals; /* keys: (a << 32) | b; UINT64_MAX: empty */
    size_t cap, count;     /* cap: a power of two */
} bb_pair_map;

static inline uint64_t bb_pair_key(uint32_t a, uint32_t b) { return (uint64_t)a << 32 | b; }
static inline size_t bb_pair_slot(const bb_pair_map *m, uint64_t k)
{
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 17) & (m->cap - 1);
    while (m->keys[i] != UINT64_MAX && m->keys[i] != k) i = (i + 1) & (m->cap - 1);
    return i;
}
/* NULL when absent. */
static inline uint64_t *bb_pair_find(const bb_pair_map *m, uint64_t k)
{
    if (!m->cap) return NULL;
    size_t i = bb_pair_slot(m, k);
    return m->keys[i] == k ? &m->vals[i] : NULL;
}
bool bb_pair_grow(bb_pair_map *m);
/* The value of k, inserted as `init` when absent; NULL when out of memory. */
static inline uint64_t *bb_pair_get(bb_pair_map *m, uint64_t k, uint64_t init)
{
    if ((m->count + 1) * 2 > m->cap && !bb_pair_grow(m)) return NULL;
    size_t i = bb_pair_slot(m, k);
    if (m->keys[i] != k) m->keys[i] = k, m->vals[i] = init, m->count++;
    return &m->vals[i];
}
void bb_pair_free(bb_pair_map *m);

/* ---- byte string → u64 ---------------------------------------------------- */
typedef struct bb_str_map {
    struct bb_str_slot { uint64_t hash, val; size_t off; uint32_t len; bool used; } *slots;
    size_t cap, count;
    uint8_t *arena; /* the keys, back to back */
    size_t arena_len, arena_cap;
} bb_str_map;

uint64_t bb_str_hash(const uint8_t *s, size_t n);
/* NULL when absent. */
uint64_t *bb_str_find(const bb_str_map *m, const uint8_t *s, size_t n);
/* The value of s, inserted as `init` when absent; NULL when out of memory. */
uint64_t *bb_str_get(bb_str_map *m, const uint8_t *s, size_t n, uint64_t init);
void bb_str_free(bb_str_map *m);

#endif /* BIGBATCH_TOKENIZER_INTERNAL_H */
