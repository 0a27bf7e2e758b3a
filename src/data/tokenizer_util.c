/* tokenizer_util.c — what the encoder and the trainer share: the byte-level
 * alphabet, the pre-tokenizer on PCRE2, and the hash maps. */
#include <pthread.h>
#include <xxhash.h>

#include "tokenizer_internal.h"

void bb_bytelevel_codepoints(uint32_t cp[256])
{
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp[b] = printable ? b : 256 + n++;
    }
}

int bb_utf8_put(uint32_t c, char *out)
{
    if (c < 0x80) return out[0] = (char)c, 1;
    if (c < 0x800) return out[0] = (char)(0xC0 | c >> 6), out[1] = (char)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | c >> 12), out[1] = (char)(0x80 | ((c >> 6) & 0x3F)), out[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | c >> 18), out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3F)), out[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* `tokenizers` runs its patterns on Oniguruma, whose \s also matches U+0085
 * (NEL); PCRE2's does not. The pattern is rewritten so that both agree:
 * \s outside a class becomes [\s\x{85}], \S becomes [^\s\x{85}], and a
 * class holding \s gets \x{85} beside it. */
static char *onig_spaces(const char *p)
{
    size_t n = strlen(p);
    char *out = malloc(n * 10 + 1), *o = out;
    if (!out) return NULL;
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\\' && i + 1 < n) {
            char e = p[++i];
            if (e == 's') o = stpcpy(o, in_class ? "\\s\\x{85}" : "[\\s\\x{85}]");
            else if (e == 'S' && !in_class) o = stpcpy(o, "[^\\s\\x{85}]");
            else *o++ = '\\', *o++ = e;
            continue;
        }
        if (p[i] == '[' && !in_class) in_class = true;
        else if (p[i] == ']' && in_class) in_class = false;
        *o++ = p[i];
    }
    *o = '\0';
    return out;
}

bb_status bb_pretok_compile(const char *pattern, const char *what, pcre2_code **out)
{
    char *p = onig_spaces(pattern);
    if (!p) return bb_fail(BB_ERR_NOMEM, "out of memory");
    int err;
    PCRE2_SIZE at;
    *out = pcre2_compile((PCRE2_SPTR)p, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                         &err, &at, NULL);
    free(p);
    if (!*out) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return bb_fail(BB_ERR_FORMAT, "%s: the pattern does not compile (PCRE2: %s at offset %zu)", what,
                       (const char *)msg, (size_t)at);
    }
    pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE); /* without JIT (a build lacking it) the interpreter runs */
    return BB_OK;
}

bb_status bb_pretok_each(const pcre2_code *re, const uint8_t *text, size_t n, bb_piece_fn fn, void *ctx)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    pcre2_match_context *mc = pcre2_match_context_create(NULL);
    pcre2_jit_stack *js = pcre2_jit_stack_create(32 << 10, 8 << 20, NULL);
    bb_status rc = BB_OK;
    if (!md || !mc || !js) {
        rc = bb_fail(BB_ERR_NOMEM, "out of memory for the pre-tokenizer");
        goto done;
    }
    pcre2_jit_stack_assign(mc, NULL, js);
    for (size_t off = 0; off < n && rc == BB_OK;) {
        int r = pcre2_match(re, text, n, off, 0, md, mc);
        if (r == PCRE2_ERROR_NOMATCH) {
            rc = fn(ctx, text + off, n - off);
            break;
        }
        if (r < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(r, msg, sizeof msg);
            rc = bb_fail(BB_ERR_INTERNAL, "pre-tokenizer: PCRE2 error at byte %zu: %s", off, (const char *)msg);
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t s = ov[0], e = ov[1] > ov[0] ? ov[1] : ov[0] + 1; /* no pattern of a tokenizer matches empty */
        if (s > off) rc = fn(ctx, text + off, s - off);
        if (rc == BB_OK) rc = fn(ctx, text + s, e - s);
        off = e;
    }
done:
    pcre2_jit_stack_free(js);
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
    return rc;
}

/* The first cut at or after `from`; n if none. */
static size_t pretok_cut(const uint8_t *text, size_t n, size_t from)
{
    for (size_t i = from ? from : 1; i < n; i++) {
        const uint8_t *nl = memchr(text + i - 1, '\n', n - i);
        if (!nl) return n;
        i = (size_t)(nl - text) + 1;
        if (i < n && text[i] > ' ' && text[i] < 0x7F) return i;
    }
    return n;
}

bb_status bb_pretok_cuts(const uint8_t *text, size_t n, size_t target, size_t **cuts, int *count)
{
    *count = 0;
    if (!(*cuts = malloc((n / target + 2) * sizeof **cuts))) return bb_fail(BB_ERR_NOMEM, "out of memory");
    for (size_t at = 0; at < n; ++*count) {
        (*cuts)[*count] = at;
        at = pretok_cut(text, n, at + target < n ? at + target : n);
    }
    (*cuts)[*count] = n;
    return BB_OK;
}

bool bb_pair_grow(bb_pair_map *m)
{
    size_t cap = m->cap ? m->cap * 2 : 1024;
    uint64_t *k = malloc(cap * sizeof *k), *v = malloc(cap * sizeof *v);
    if (!k || !v) {
        free(k), free(v);
        return false;
    }
    memset(k, 0xFF, cap * sizeof *k);
    bb_pair_map g = {k, v, cap, m->count};
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i] != UINT64_MAX) {
            size_t j = bb_pair_slot(&g, m->keys[i]);
            k[j] = m->keys[i], v[j] = m->vals[i];
        }
    free(m->keys), free(m->vals);
    *m = g;
    return true;
}

void bb_pair_free(bb_pair_map *m)
{
    free(m->keys), free(m->vals);
    memset(m, 0, sizeof *m);
}

uint64_t bb_str_hash(const uint8_t *s, size_t n) { return XXH3_64bits(s, n); }

static size_t str_slot(const bb_str_map *m, const uint8_t *s, size_t n, uint64_t h)
{
    size_t i = (size_t)h & (m->cap - 1);
    while (m->slots[i].used &&
           !(m->slots[i].hash == h && m->slots[i].len == n && !memcmp(m->arena + m->slots[i].off, s, n)))
        i = (i + 1) & (m->cap - 1);
    return i;
}

uint64_t *bb_str_find(const bb_str_map *m, const uint8_t *s, size_t n)
{
    if (!m->cap) return NULL;
    size_t i = str_slot(m, s, n, bb_str_hash(s, n));
    return m->slots[i].used ? &m->slots[i].val : NULL;
}

static bool str_grow(bb_str_map *m)
{
    size_t cap = m->cap ? m->cap * 2 : 1024;
    struct bb_str_slot *s = calloc(cap, sizeof *s);
    if (!s) return false;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].used) {
            size_t j = (size_t)m->slots[i].hash & (cap - 1);
            while (s[j].used) j = (j + 1) & (cap - 1);
            s[j] = m->slots[i];
        }
    free(m->slots);
    m->slots = s, m->cap = cap;
    return true;
}

uint64_t *bb_str_get(bb_str_map *m, const uint8_t *s, size_t n, uint64_t init)
{
    if ((m->count + 1) * 2 > m->cap && !str_grow(m)) return NULL;
    uint64_t h = bb_str_hash(s, n);
    size_t i = str_slot(m, s, n, h);
    if (m->slots[i].used) return &m->slots[i].val;
    if (m->arena_len + n > m->arena_cap) {
        size_t cap = m->arena_cap ? m->arena_cap : 4096;
        while (cap < m->arena_len + n) cap *= 2;
        uint8_t *a = realloc(m->arena, cap);
        if (!a) return NULL;
        m->arena = a, m->arena_cap = cap;
    }
    memcpy(m->arena + m->arena_len, s, n);
    m->slots[i] = (struct bb_str_slot){h, init, m->arena_len, (uint32_t)n, true};
    m->arena_len += n;
    m->count++;
    return &m->slots[i].val;
}

void bb_str_free(bb_str_map *m)
{
    free(m->slots), free(m->arena);
    memset(m, 0, sizeof *m);
}
