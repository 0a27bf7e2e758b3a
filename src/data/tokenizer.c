/* tokenizer.c — BPE, byte-level or SentencePiece style: Hugging Face's
 * tokenizer.json in, text to tokens (added tokens, then the pre-tokenizer's
 * pieces, then the merges of lowest rank first, leftmost first among
 * equals, as `tokenizers` does), tokens to bytes. */
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdatomic.h>
#include <xxhash.h>

#include "bigbatch/json.h"
#include "tokenizer_internal.h"

typedef struct added_token {
    uint8_t *bytes;
    size_t len;
    uint32_t id;
} added_token;

struct bb_tokenizer {
    char path[4096];
    uint64_t hash;
    uint32_t vocab;
    uint8_t **bytes;        /* (vocab) what each id stands for; NULL: no token */
    uint32_t *bytes_len;
    uint32_t byte_id[256];  /* the token of each byte alone */
    bb_pair_map merges;     /* (a, b) → rank << 32 | merged id */
    bool ignore_merges;     /* a piece that is a token is that token, merges or not */
    bb_str_map whole;       /* each token as the encoder sees it → id: byte-level (with ignore_merges only) its
                               bytes, SentencePiece style its vocabulary key (U+2581 for a space) */
    bb_sp_style sp;         /* sp.on: SentencePiece style (characters, byte fallback, <unk>) */
    added_token *added;     /* longest first */
    int added_count;
    bool added_first[256];  /* some added token starts with this byte */
    pcre2_code *re;
};

void bb_tokens_free(bb_tokens *t)
{
    free(t->v);
    memset(t, 0, sizeof *t);
}

bool bb_tokens_push(bb_tokens *t, uint32_t id)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        uint32_t *v = realloc(t->v, cap * sizeof *v);
        if (!v) return false;
        t->v = v, t->cap = cap;
    }
    t->v[t->n++] = id;
    return true;
}

uint32_t bb_tokenizer_vocab(const bb_tokenizer_t *t) { return t->vocab; }
uint64_t bb_tokenizer_hash(const bb_tokenizer_t *t) { return t->hash; }
const char *bb_tokenizer_path(const bb_tokenizer_t *t) { return t->path; }

const uint8_t *bb_tokenizer_token_bytes(const bb_tokenizer_t *t, uint32_t id, size_t *len)
{
    if (id >= t->vocab || !t->bytes[id]) return NULL;
    *len = t->bytes_len[id];
    return t->bytes[id];
}

uint32_t *bb_tokenizer_byte_lengths(const bb_tokenizer_t *t)
{
    uint32_t *len = calloc(t->vocab, sizeof *len);
    for (uint32_t i = 0; len && i < t->vocab; i++) len[i] = t->bytes[i] ? t->bytes_len[i] : 0;
    return len;
}

bool bb_tokenizer_file_of_dataset(const char *data, char *path, size_t cap)
{
    struct stat st;
    if (stat(data, &st) != 0) return false; /* opening the dataset says what is wrong */
    if (S_ISDIR(st.st_mode)) snprintf(path, cap, "%s/%s", data, BB_TOKENIZER_FILE);
    else {
        const char *slash = strrchr(data, '/');
        snprintf(path, cap, "%.*s%s", slash ? (int)(slash - data + 1) : 0, data, BB_TOKENIZER_FILE);
    }
    return access(path, F_OK) == 0;
}

bb_status bb_tokenizer_of_dataset(const char *data, bb_tokenizer_t **out)
{
    *out = NULL;
    char path[4200];
    return bb_tokenizer_file_of_dataset(data, path, sizeof path) ? bb_tokenizer_load(path, out) : BB_OK;
}

void bb_tokenizer_destroy(bb_tokenizer_t *t)
{
    if (!t) return;
    for (uint32_t i = 0; t->bytes && i < t->vocab; i++) free(t->bytes[i]);
    free(t->bytes), free(t->bytes_len);
    for (int i = 0; i < t->added_count; i++) free(t->added[i].bytes);
    free(t->added);
    bb_pair_free(&t->merges);
    bb_str_free(&t->whole);
    bb_sp_free(&t->sp);
    pcre2_code_free(t->re);
    free(t);
}

/* ---- loading ------------------------------------------------------------ */
/* Decodes a byte-level token string (UTF-8 of the alphabet's code points)
 * into the bytes it stands for; false when a code point is not of the
 * alphabet or the UTF-8 is bad. */
static bool bytelevel_decode(const char *s, const uint8_t inverse_ok[512], const uint8_t inverse[512], uint8_t *out,
                             size_t *len)
{
    size_t n = 0;
    for (const uint8_t *p = (const uint8_t *)s; *p;) {
        uint32_t c;
        int k = *p < 0x80 ? 1 : (*p >> 5) == 6 ? 2 : (*p >> 4) == 14 ? 3 : 0;
        if (!k) return false;
        c = k == 1 ? *p : k == 2 ? *p & 0x1F : *p & 0x0F;
        for (int i = 1; i < k; i++) {
            if ((p[i] & 0xC0) != 0x80) return false;
            c = c << 6 | (p[i] & 0x3F);
        }
        if (c >= 512 || !inverse_ok[c]) return false;
        out[n++] = inverse[c];
        p += k;
    }
    *len = n;
    return true;
}

/* obj[key] must be absent, null, false or "" (what a byte-level BPE leaves unset). */
static bb_status require_unset(const json_t *obj, const char *path, const char *where, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v) || json_is_false(v) || (json_is_string(v) && !*json_string_value(v))) return BB_OK;
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    bb_status rc = bb_fail(BB_ERR_FORMAT, "%s: %s.%s is %s: only byte-level BPE without it can be read", path, where,
                           key, text ? text : "set");
    free(text);
    return rc;
}

/* The pre-tokenizer's pattern: ByteLevel with use_regex (GPT-2's), or a
 * Sequence of Split (isolated, not inverted) and ByteLevel without one. */
static bb_status read_pretokenizer(const json_t *root, const char *path, const char **pattern)
{
    const json_t *pt = json_object_get(root, "pre_tokenizer"), *bl = pt, *split = NULL;
    if (!json_is_object(pt))
        return bb_fail(BB_ERR_FORMAT, "%s: pre_tokenizer is missing: byte-level BPE needs ByteLevel", path);
    if (!strcmp(bb_tok_type(pt), "Sequence")) {
        const json_t *list = json_object_get(pt, "pretokenizers");
        if (json_array_size(list) != 2 || strcmp(bb_tok_type(json_array_get(list, 0)), "Split") ||
            strcmp(bb_tok_type(json_array_get(list, 1)), "ByteLevel"))
            return bb_fail(BB_ERR_FORMAT, "%s: pre_tokenizer Sequence must be [Split, ByteLevel] to be read", path);
        split = json_array_get(list, 0), bl = json_array_get(list, 1);
    } else if (strcmp(bb_tok_type(pt), "ByteLevel")) {
        return bb_fail(BB_ERR_FORMAT, "%s: pre_tokenizer type %s is not supported (ByteLevel, or Sequence of Split "
                       "and ByteLevel)", path, bb_tok_type(pt));
    }
    BB_TRY(require_unset(bl, path, "pre_tokenizer", "add_prefix_space"));
    const json_t *use_regex = json_object_get(bl, "use_regex");
    bool regex = !use_regex || json_is_true(use_regex);
    if (!split) {
        if (!regex) return bb_fail(BB_ERR_FORMAT, "%s: pre_tokenizer ByteLevel with use_regex false has no split", path);
        *pattern = BB_GPT2_PATTERN;
        return BB_OK;
    }
    if (regex) return bb_fail(BB_ERR_FORMAT, "%s: pre_tokenizer: a Split followed by ByteLevel with use_regex", path);
    const json_t *p = json_object_get(split, "pattern");
    const char *behavior = json_string_value(json_object_get(split, "behavior"));
    *pattern = json_string_value(json_object_get(p, "Regex"));
    if (!*pattern) return bb_fail(BB_ERR_FORMAT, "%s: pre_tokenizer Split: pattern.Regex is missing", path);
    if (!behavior || strcmp(behavior, "Isolated"))
        return bb_fail(BB_ERR_FORMAT, "%s: pre_tokenizer Split: behavior %s is not supported (Isolated)", path,
                       behavior ? behavior : "(none)");
    return require_unset(split, path, "pre_tokenizer", "invert");
}

static bb_status set_bytes(bb_tokenizer_t *t, uint32_t id, const uint8_t *b, size_t n)
{
    free(t->bytes[id]);
    if (!(t->bytes[id] = malloc(n ? n : 1))) return bb_fail(BB_ERR_NOMEM, "out of memory");
    memcpy(t->bytes[id], b, n);
    t->bytes_len[id] = (uint32_t)n;
    return BB_OK;
}

static bb_status read_vocab(bb_tokenizer_t *t, const json_t *vocab, const json_t *added, const char *path)
{
    uint32_t cp[256];
    uint8_t inverse[512] = {0}, ok[512] = {0};
    bb_bytelevel_codepoints(cp);
    for (int b = 0; b < 256; b++) inverse[cp[b]] = (uint8_t)b, ok[cp[b]] = 1;
    const char *key;
    json_t *v;
    uint64_t max = 0;
    json_object_foreach((json_t *)vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= 1 << 24)
            return bb_fail(BB_ERR_FORMAT, "%s: model.vocab[\"%s\"] is not an id in 0 .. 2^24-1", path, key);
        max = (uint64_t)json_integer_value(v) > max ? (uint64_t)json_integer_value(v) : max;
    }
    size_t i;
    json_array_foreach(added, i, v) {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        if (!json_is_string(json_object_get(v, "content")) || id < 0 || id >= 1 << 24)
            return bb_fail(BB_ERR_FORMAT, "%s: added_tokens[%zu] has no content or no id in 0 .. 2^24-1", path, i);
        static const char *const flags[] = {"single_word", "lstrip", "rstrip"};
        for (int f = 0; f < 3; f++) {
            char where[48];
            snprintf(where, sizeof where, "added_tokens[%zu]", i);
            BB_TRY(require_unset(v, path, where, flags[f]));
        }
        max = (uint64_t)id > max ? (uint64_t)id : max;
    }
    t->vocab = (uint32_t)max + 1;
    t->bytes = calloc(t->vocab, sizeof *t->bytes);
    t->bytes_len = calloc(t->vocab, sizeof *t->bytes_len);
    t->added = calloc(json_array_size(added) + 1, sizeof *t->added);
    if (!t->bytes || !t->bytes_len || !t->added) return bb_fail(BB_ERR_NOMEM, "out of memory");
    uint8_t buf[4096];
    json_object_foreach((json_t *)vocab, key, v) {
        size_t n;
        uint32_t id = (uint32_t)json_integer_value(v);
        if (t->bytes[id]) /* two strings for one id: decoding could not say which */
            return bb_fail(BB_ERR_FORMAT, "%s: model.vocab gives id %u to \"%.100s\" and to another token", path, id,
                           key);
        if (t->sp.on) { /* the key is the text (U+2581 for a space), <0xNN> a byte */
            uint8_t *b = bb_sp_token_bytes(&t->sp, key, id, &n);
            bb_status rc = b ? set_bytes(t, id, b, n) : bb_fail(BB_ERR_NOMEM, "out of memory");
            free(b);
            if (rc == BB_OK && !bb_str_get(&t->whole, (const uint8_t *)key, strlen(key), id))
                rc = bb_fail(BB_ERR_NOMEM, "out of memory");
            BB_TRY(rc);
            continue;
        }
        size_t len = strlen(key); /* a token decodes to at most its key's length in bytes */
        uint8_t *b = len < sizeof buf ? buf : malloc(len);
        if (!b) return bb_fail(BB_ERR_NOMEM, "out of memory");
        bb_status rc = bytelevel_decode(key, ok, inverse, b, &n) ? set_bytes(t, id, b, n) : BB_OK;
        if (b != buf) free(b);
        BB_TRY(rc);
    }
    json_array_foreach(added, i, v) { /* an added token is its content, not byte-level */
        const char *c = json_string_value(json_object_get(v, "content"));
        uint32_t id = (uint32_t)json_integer_value(json_object_get(v, "id"));
        size_t n = strlen(c);
        if (!n) continue;
        BB_TRY(set_bytes(t, id, (const uint8_t *)c, n));
        added_token *a = &t->added[t->added_count++];
        if (!(a->bytes = malloc(n))) return bb_fail(BB_ERR_NOMEM, "out of memory");
        memcpy(a->bytes, c, n), a->len = n, a->id = id;
        t->added_first[(uint8_t)c[0]] = true;
    }
    for (int a = 1; a < t->added_count; a++) /* longest first: the leftmost-longest match */
        for (int b = a; b > 0 && t->added[b].len > t->added[b - 1].len; b--) {
            added_token x = t->added[b];
            t->added[b] = t->added[b - 1], t->added[b - 1] = x;
        }
    if (t->sp.on) return BB_OK; /* its characters are tokens of the vocabulary, the bytes' tokens optional */
    for (int b = 0; b < 256; b++) {
        char s[5] = {0};
        bb_utf8_put(cp[b], s);
        json_t *id = json_object_get(vocab, s);
        if (!json_is_integer(id))
            return bb_fail(BB_ERR_FORMAT, "%s: model.vocab has no token for byte 0x%02x (\"%s\"): a byte-level "
                           "vocabulary holds all 256", path, b, s);
        t->byte_id[b] = (uint32_t)json_integer_value(id);
    }
    if (t->ignore_merges)
        for (uint32_t id = 0; id < t->vocab; id++)
            if (t->bytes[id] && !bb_str_get(&t->whole, t->bytes[id], t->bytes_len[id], id))
                return bb_fail(BB_ERR_NOMEM, "out of memory");
    return BB_OK;
}

/* One merge's halves, "a b" or ["a", "b"], into *a and *b (allocated; any
 * length: a merge of long runs of one character has long halves). false:
 * neither form. */
static bool merge_halves(const json_t *m, char **a, char **b)
{
    const char *s = json_string_value(m), *sp = s ? strchr(s, ' ') : NULL;
    if (sp && !strchr(sp + 1, ' ')) {
        *a = strndup(s, (size_t)(sp - s)), *b = strdup(sp + 1);
    } else if (json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
               json_is_string(json_array_get(m, 1))) {
        *a = strdup(json_string_value(json_array_get(m, 0))), *b = strdup(json_string_value(json_array_get(m, 1)));
    } else {
        *a = *b = NULL;
        return false;
    }
    return true;
}

static bb_status read_merges(bb_tokenizer_t *t, const json_t *vocab, const json_t *merges, const char *path)
{
    size_t i;
    const json_t *m;
    bb_status rc = BB_OK;
    json_array_foreach(merges, i, m) {
        char *a, *b, *ab = NULL;
        if (!merge_halves(m, &a, &b))
            return bb_fail(BB_ERR_FORMAT, "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", path, i);
        size_t la = a ? strlen(a) : 0, lb = b ? strlen(b) : 0;
        if (!a || !b || !(ab = malloc(la + lb + 1))) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
        if (rc == BB_OK) memcpy(ab, a, la), memcpy(ab + la, b, lb + 1);
        const json_t *ia = rc == BB_OK ? json_object_get(vocab, a) : NULL, *ib = ia ? json_object_get(vocab, b) : NULL;
        const json_t *iab = ib ? json_object_get(vocab, ab) : NULL;
        if (rc == BB_OK && !iab)
            rc = bb_fail(BB_ERR_FORMAT, "%s: model.merges[%zu] (\"%.200s\" + \"%.200s\") names a token not in "
                         "model.vocab", path, i, a, b);
        uint64_t *v = NULL;
        if (rc == BB_OK) {
            uint64_t key = bb_pair_key((uint32_t)json_integer_value(ia), (uint32_t)json_integer_value(ib));
            if (!(v = bb_pair_get(&t->merges, key, UINT64_MAX))) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
        }
        if (v && *v == UINT64_MAX) *v = (uint64_t)i << 32 | (uint64_t)json_integer_value(iab); /* the first rank stays */
        free(a), free(b), free(ab);
        if (rc != BB_OK) return rc;
    }
    return BB_OK;
}

/* <unk>: model.unk_token's id, in the vocabulary or an added token. */
static bb_status read_unk(bb_tokenizer_t *t, const json_t *model, const json_t *added, const char *path)
{
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    if (!unk) return BB_OK;
    const json_t *id = json_object_get(json_object_get(model, "vocab"), unk), *v;
    size_t i;
    json_array_foreach(added, i, v) {
        const char *content = json_string_value(json_object_get(v, "content"));
        if (!id && content && !strcmp(content, unk)) id = json_object_get(v, "id");
    }
    if (!json_is_integer(id)) return bb_fail(BB_ERR_FORMAT, "%s: model.unk_token \"%s\" is not a token", path, unk);
    t->sp.unk = (uint32_t)json_integer_value(id);
    return BB_OK;
}

static bb_status parse(bb_tokenizer_t *t, const json_t *root, const char *path)
{
    const json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return bb_fail(BB_ERR_FORMAT, "%s: no \"model\" object: not a tokenizer.json", path);
    if (strcmp(bb_tok_type(model), "BPE"))
        return bb_fail(BB_ERR_FORMAT, "%s: model type %s is not supported (BPE only)", path, bb_tok_type(model));
    BB_TRY(bb_sp_read(root, model, path, &t->sp));
    static const char *const unset[] = {"dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback"};
    for (int i = 0; i < (t->sp.on ? 3 : 4); i++) BB_TRY(require_unset(model, path, "model", unset[i]));
    const char *decoder = bb_tok_type(json_object_get(root, "decoder"));
    if (!t->sp.on && json_is_object(json_object_get(root, "decoder")) && strcmp(decoder, "ByteLevel"))
        return bb_fail(BB_ERR_FORMAT, "%s: decoder %s is not supported (ByteLevel)", path, decoder);
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    const json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    const json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab) || !json_is_array(merges))
        return bb_fail(BB_ERR_FORMAT, "%s: model.vocab (an object) or model.merges (an array) is missing", path);
    if (added && !json_is_array(added) && !json_is_null(added))
        return bb_fail(BB_ERR_FORMAT, "%s: added_tokens is not an array", path);
    if (!t->sp.on) {
        const char *pattern = NULL;
        BB_TRY(read_pretokenizer(root, path, &pattern));
        char what[4200];
        snprintf(what, sizeof what, "%s: pre_tokenizer", path);
        BB_TRY(bb_pretok_compile(pattern, what, &t->re));
    } else {
        BB_TRY(read_unk(t, model, json_is_array(added) ? added : NULL, path));
    }
    BB_TRY(read_vocab(t, vocab, json_is_array(added) ? added : NULL, path));
    return read_merges(t, vocab, merges, path);
}

bb_status bb_tokenizer_load(const char *path, bb_tokenizer_t **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return bb_fail_errno(BB_ERR_IO, "%s: cannot open", path);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (size_t n = 1; n > 0;) {
        if (len + 65536 > cap) {
            char *b = realloc(buf, cap = cap * 2 + 65536);
            if (!b) break;
            buf = b;
        }
        len += n = fread(buf + len, 1, cap - len, f);
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad || !buf) {
        free(buf);
        return bad ? bb_fail(BB_ERR_IO, "%s: cannot read", path) : bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    bb_tokenizer_t *t = calloc(1, sizeof *t);
    json_t *root = NULL;
    bb_status rc = t ? bb_json_load_line(buf, len, path, &root) : bb_fail(BB_ERR_NOMEM, "out of memory");
    if (rc == BB_OK) {
        snprintf(t->path, sizeof t->path, "%s", path);
        t->hash = XXH64(buf, len, 0);
        rc = parse(t, root, path);
    }
    json_decref(root);
    free(buf);
    if (rc != BB_OK) bb_tokenizer_destroy(t);
    else *out = t;
    return rc;
}

/* ---- encoding ----------------------------------------------------------- */
typedef struct encoder {
    const bb_tokenizer_t *t;
    bb_tokens *out;
    uint32_t *id;     /* a piece's symbols, linked: prev, next (-1: none) */
    int32_t *prev, *next;
    uint64_t *heap;   /* rank << 32 | position, smallest first */
    size_t cap;
    bb_sp_buf norm[2]; /* SentencePiece style: the normalized segment */
} encoder;

static void heap_push(uint64_t *h, size_t *n, uint64_t v)
{
    size_t i = (*n)++;
    for (; i > 0 && h[(i - 1) / 2] > v; i = (i - 1) / 2) h[i] = h[(i - 1) / 2];
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n)
{
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c], i = c;
    }
    h[i] = v;
    return top;
}

static void push_pair(encoder *e, size_t *hn, int32_t pos)
{
    if (pos < 0 || e->next[pos] < 0) return;
    const uint64_t *m = bb_pair_find(&e->t->merges, bb_pair_key(e->id[pos], e->id[e->next[pos]]));
    if (m) heap_push(e->heap, hn, (*m >> 32) << 32 | (uint32_t)pos);
}

/* One piece's tokens: its first symbols (byte-level: its bytes';
 * SentencePiece style: its characters'), merged lowest rank first. */
static bb_status encode_piece(void *ctx, const uint8_t *p, size_t n)
{
    encoder *e = ctx;
    const bb_tokenizer_t *t = e->t;
    if (t->ignore_merges) {
        const uint64_t *id = bb_str_find(&t->whole, p, n);
        if (id) return bb_tokens_push(e->out, (uint32_t)*id) ? BB_OK : bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    if (n > e->cap) {
        size_t cap = n * 2;
        free(e->id), free(e->prev), free(e->next), free(e->heap);
        e->id = malloc(cap * sizeof *e->id), e->prev = malloc(cap * sizeof *e->prev);
        e->next = malloc(cap * sizeof *e->next), e->heap = malloc(cap * sizeof *e->heap);
        e->cap = e->id && e->prev && e->next && e->heap ? cap : 0;
        if (!e->cap) return bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    size_t hn = 0;
    if (t->sp.on) n = bb_sp_symbols(&t->sp, &t->whole, p, n, e->id);
    else
        for (size_t i = 0; i < n; i++) e->id[i] = t->byte_id[p[i]];
    if (!n) return BB_OK;
    for (size_t i = 0; i < n; i++) e->prev[i] = (int32_t)i - 1, e->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    for (size_t i = 0; i + 1 < n; i++) push_pair(e, &hn, (int32_t)i);
    while (hn) {
        uint64_t top = heap_pop(e->heap, &hn);
        int32_t pos = (int32_t)(uint32_t)top, nx = e->next[pos];
        if (e->id[pos] == UINT32_MAX || nx < 0) continue; /* merged away, or the last symbol now */
        const uint64_t *m = bb_pair_find(&t->merges, bb_pair_key(e->id[pos], e->id[nx]));
        if (!m || *m >> 32 != top >> 32) continue; /* the pair changed since it was queued */
        e->id[pos] = (uint32_t)*m;
        e->id[nx] = UINT32_MAX;
        e->next[pos] = e->next[nx];
        if (e->next[nx] >= 0) e->prev[e->next[nx]] = pos;
        push_pair(e, &hn, e->prev[pos]);
        push_pair(e, &hn, pos);
    }
    for (int32_t i = 0; i >= 0; i = e->next[i])
        if (!bb_tokens_push(e->out, e->id[i])) return bb_fail(BB_ERR_NOMEM, "out of memory");
    return BB_OK;
}

/* Which added token starts at p (n bytes left), longest first; NULL: none. */
static const added_token *added_at(const bb_tokenizer_t *t, const uint8_t *p, size_t n)
{
    if (!t->added_first[*p]) return NULL;
    for (int i = 0; i < t->added_count; i++)
        if (t->added[i].len <= n && !memcmp(p, t->added[i].bytes, t->added[i].len)) return &t->added[i];
    return NULL;
}

/* The text between two added tokens, from byte `at` of the text. */
static bb_status encode_segment(encoder *e, const uint8_t *text, size_t at, size_t n)
{
    if (!n) return BB_OK;
    if (e->t->sp.on) return bb_sp_each(&e->t->sp, text + at, n, at == 0, e->norm, encode_piece, e);
    return bb_pretok_each(e->t->re, text + at, n, encode_piece, e);
}

bb_status bb_tokenizer_encode(const bb_tokenizer_t *t, const uint8_t *text, size_t n, bb_tokens *out)
{
    encoder e = {.t = t, .out = out};
    bb_status rc = BB_OK;
    size_t start = 0;
    for (size_t i = 0; t->added_count && i < n && rc == BB_OK; i++) {
        const added_token *a = added_at(t, text + i, n - i);
        if (!a) continue;
        rc = encode_segment(&e, text, start, i - start);
        if (rc == BB_OK && !bb_tokens_push(out, a->id)) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
        start = i + a->len, i = start - 1;
    }
    if (rc == BB_OK) rc = encode_segment(&e, text, start, n - start);
    free(e.id), free(e.prev), free(e.next), free(e.heap), free(e.norm[0].p), free(e.norm[1].p);
    return rc;
}

/* ---- on several threads ------------------------------------------------- */
typedef struct parallel {
    const bb_tokenizer_t *t;
    const uint8_t *text;
    size_t *cuts;      /* (chunks + 1) */
    bb_tokens *parts;  /* (chunks) */
    bb_status *rc;     /* (chunks) */
    int chunks;
    atomic_int next;
    pthread_mutex_t lock;
    char error[512];   /* the first failure's message (messages are per thread) */
} parallel;

static void *encode_worker(void *arg)
{
    parallel *p = arg;
    for (int c; (c = atomic_fetch_add(&p->next, 1)) < p->chunks;) {
        p->rc[c] = bb_tokenizer_encode(p->t, p->text + p->cuts[c], p->cuts[c + 1] - p->cuts[c], &p->parts[c]);
        if (p->rc[c] != BB_OK) {
            pthread_mutex_lock(&p->lock);
            if (!p->error[0]) snprintf(p->error, sizeof p->error, "%s", bb_error_message());
            pthread_mutex_unlock(&p->lock);
        }
    }
    return NULL;
}

bb_status bb_tokenizer_encode_parallel(const bb_tokenizer_t *t, const uint8_t *text, size_t n, int threads,
                                       bb_tokens *out)
{
    /* an added token holding a newline could straddle a cut; the SentencePiece style's pieces (and its
     * prepended U+2581) run across newlines */
    bool cut_ok = !t->sp.on;
    for (int i = 0; i < t->added_count; i++) cut_ok &= !memchr(t->added[i].bytes, '\n', t->added[i].len);
    size_t target = n / ((size_t)threads * 4) > (1u << 20) ? n / ((size_t)threads * 4) : 1u << 20;
    if (threads <= 1 || !cut_ok || n < 2 * target) return bb_tokenizer_encode(t, text, n, out);
    parallel p = {.lock = PTHREAD_MUTEX_INITIALIZER, .t = t, .text = text};
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    bb_status rc = bb_pretok_cuts(text, n, target, &p.cuts, &p.chunks);
    int k = p.chunks;
    if (rc == BB_OK && (!(p.parts = calloc((size_t)k, sizeof *p.parts)) || !(p.rc = calloc((size_t)k, sizeof *p.rc)) ||
                        !tid))
        rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    if (rc != BB_OK) goto done;
    int started = 0;
    for (; started < threads && started < k; started++)
        if (pthread_create(&tid[started], NULL, encode_worker, &p)) break;
    if (!started) encode_worker(&p);
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
    size_t total = 0;
    for (int c = 0; c < k && rc == BB_OK; c++) rc = p.rc[c], total += p.parts[c].n;
    if (rc != BB_OK) rc = bb_fail(rc, "%s", p.error);
    if (rc == BB_OK && out->n + total > out->cap) {
        uint32_t *v = realloc(out->v, (out->n + total) * sizeof *v);
        if (!v) rc = bb_fail(BB_ERR_NOMEM, "out of memory for %zu tokens", out->n + total);
        else out->v = v, out->cap = out->n + total;
    }
    for (int c = 0; c < k && rc == BB_OK; c++) {
        memcpy(out->v + out->n, p.parts[c].v, p.parts[c].n * sizeof *out->v);
        out->n += p.parts[c].n;
    }
done:
    for (int c = 0; p.parts && c < p.chunks; c++) bb_tokens_free(&p.parts[c]);
    free(p.cuts), free(p.parts), free(p.rc), free(tid);
    return rc;
}
