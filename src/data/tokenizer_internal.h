/* tokenizer_internal.h — private to the tokenizer (tokenizer.c encodes and
 * decodes, tokenizer_sp.c reads the SentencePiece style, tokenizer_train.c
 * trains): GPT-2's byte-to-unicode map, the pre-tokenizer's pattern, the
 * SentencePiece style's rules, and two open-addressing hash maps (pair of
 * ids → value; byte string → value). */
#ifndef BIGBATCH_TOKENIZER_INTERNAL_H
#define BIGBATCH_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "bigbatch/json.h"
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

/* A tokenizer.json object's "type" ("(none)" when it has none), for messages and choices. */
static inline const char *bb_tok_type(const json_t *obj)
{
    const char *t = json_string_value(json_object_get(obj, "type"));
    return t ? t : "(none)";
}

/* ---- the SentencePiece style (tokenizer_sp.c) ----------------------------- */
/* Llama 2's, Mistral's and TinyLlama's tokenizer.json: a BPE over
 * characters as the vocabulary writes them (a space as U+2581, written by a
 * normalizer of Prepend and Replace steps or by a Metaspace pre-tokenizer),
 * a character out of the vocabulary as its bytes' <0xNN> tokens
 * (byte_fallback), else <unk> (a run of them one <unk> with fuse_unk). */
enum { BB_SP_EDITS = 4 };
enum { BB_SP_NEVER, BB_SP_FIRST, BB_SP_ALWAYS }; /* Metaspace's prepend_scheme; first: the text's first segment */
typedef struct bb_sp_edit {
    char *from, *to; /* from NULL: Prepend `to` (to a segment that is not empty) */
} bb_sp_edit;
typedef struct bb_sp_style {
    bool on;                         /* false: byte-level BPE */
    bb_sp_edit edit[BB_SP_EDITS];    /* the normalizer's steps, in order */
    int edits;
    char *meta;                      /* Metaspace's replacement; NULL: no Metaspace */
    int meta_prepend;                /* BB_SP_NEVER, _FIRST, _ALWAYS (unless the segment starts with it) */
    bool meta_split;                 /* a piece starts at each replacement */
    char *dec_from, *dec_to;         /* the decoder's Replace (Metaspace's: its replacement by " ") */
    bool byte_fallback, fuse_unk;
    uint32_t fallback[256], unk;     /* the ids of <0x00>..<0xFF> and of <unk>; UINT32_MAX: none */
} bb_sp_style;
typedef struct bb_sp_buf {
    uint8_t *p;
    size_t cap;
} bb_sp_buf;

/* Reads the normalizer, pre-tokenizer, decoder and the model's byte_fallback
 * and fuse_unk when root is of the SentencePiece style (a normalizer, no
 * pre-tokenizer or Metaspace, or byte_fallback); sp->on false when not.
 * Fails with BB_ERR_FORMAT naming path and what cannot be represented,
 * BB_ERR_NOMEM. bb_sp_free frees what it read. */
bb_status bb_sp_read(const json_t *root, const json_t *model, const char *path, bb_sp_style *sp);
void bb_sp_free(bb_sp_style *sp);
/* The bytes vocabulary key `key` (of id `id`) decodes to, malloc'd, *len
 * of them: <0xNN> with byte_fallback is byte NN (and sp->fallback[NN] is set
 * to id), anything else the key with the decoder's Replace. NULL: out of
 * memory. */
uint8_t *bb_sp_token_bytes(bb_sp_style *sp, const char *key, uint32_t id, size_t *len);
/* Calls fn(ctx, piece, len) for each piece of the segment seg (n bytes, the
 * text between added tokens; at_start: it starts the text) once normalized
 * and pre-tokenized; bufs: two scratch buffers, grown here, freed by the
 * caller. Fails with BB_ERR_NOMEM or what fn returns. */
bb_status bb_sp_each(const bb_sp_style *sp, const uint8_t *seg, size_t n, bool at_start, bb_sp_buf bufs[2],
                     bb_piece_fn fn, void *ctx);
/* The first symbols of a piece (n bytes; at most n of them, into ids): its
 * characters' ids in `pieces` (vocabulary key → id), else their bytes'
 * fallback ids, else <unk>; a byte that starts no UTF-8 character is a
 * character of its own. Returns how many. */
size_t bb_sp_symbols(const bb_sp_style *sp, const bb_str_map *pieces, const uint8_t *p, size_t n, uint32_t *ids);

#endif /* BIGBATCH_TOKENIZER_INTERNAL_H */
