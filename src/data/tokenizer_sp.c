/* tokenizer_sp.c — the SentencePiece style of tokenizer.json (Llama 2,
 * Mistral, TinyLlama as transformers converts them): its normalizer
 * (Prepend, Replace) or Metaspace pre-tokenizer, its decoder, and the first
 * symbols of a piece (characters; out of the vocabulary: their bytes'
 * <0xNN> tokens, else <unk>), each rule as `tokenizers` 0.19 applies it. */
#include "tokenizer_internal.h"

/* A Replace's pattern: {"String": s} only (a Regex pattern is refused). */
static const char *replace_pattern(const json_t *r)
{
    return json_string_value(json_object_get(json_object_get(r, "pattern"), "String"));
}

static bb_status add_edit(bb_sp_style *sp, const char *from, const char *to, const char *path)
{
    if (sp->edits == BB_SP_EDITS)
        return bb_fail(BB_ERR_FORMAT, "%s: normalizer: more than %d Prepend and Replace steps", path, BB_SP_EDITS);
    bb_sp_edit *e = &sp->edit[sp->edits++];
    e->from = from ? strdup(from) : NULL, e->to = strdup(to);
    if ((from && !e->from) || !e->to) return bb_fail(BB_ERR_NOMEM, "out of memory");
    return BB_OK;
}

static bb_status read_normalizer(const json_t *n, const char *path, bb_sp_style *sp)
{
    const json_t *steps = n;
    bool sequence = !strcmp(bb_tok_type(n), "Sequence");
    if (sequence) steps = json_object_get(n, "normalizers");
    for (size_t i = 0; i < (sequence ? json_array_size(steps) : 1); i++) {
        const json_t *s = sequence ? json_array_get(steps, i) : n;
        const char *type = bb_tok_type(s), *from = replace_pattern(s);
        const char *to = json_string_value(json_object_get(s, !strcmp(type, "Prepend") ? "prepend" : "content"));
        if (!strcmp(type, "Prepend") && to && *to) BB_TRY(add_edit(sp, NULL, to, path));
        else if (!strcmp(type, "Replace") && from && *from && to) BB_TRY(add_edit(sp, from, to, path));
        else if (!strcmp(type, "Replace"))
            return bb_fail(BB_ERR_FORMAT, "%s: normalizer Replace: only a pattern {\"String\": ...} is supported",
                           path);
        else
            return bb_fail(BB_ERR_FORMAT, "%s: normalizer %s is not supported (Prepend, Replace or a Sequence of "
                           "them, as SentencePiece-style BPE has; byte-level BPE has none)", path, type);
    }
    return BB_OK;
}

static bb_status read_metaspace(const json_t *m, const char *path, bb_sp_style *sp)
{
    const char *r = json_string_value(json_object_get(m, "replacement")), *scheme =
        json_string_value(json_object_get(m, "prepend_scheme"));
    if (!r || !*r) return bb_fail(BB_ERR_FORMAT, "%s: pre_tokenizer Metaspace has no replacement", path);
    if (!(sp->meta = strdup(r))) return bb_fail(BB_ERR_NOMEM, "out of memory");
    const json_t *split = json_object_get(m, "split"), *prefix = json_object_get(m, "add_prefix_space");
    sp->meta_split = !split || json_is_true(split);
    if (scheme) { /* older files say add_prefix_space instead */
        sp->meta_prepend = !strcmp(scheme, "always") ? BB_SP_ALWAYS : !strcmp(scheme, "first") ? BB_SP_FIRST
                         : !strcmp(scheme, "never") ? BB_SP_NEVER : -1;
        if (sp->meta_prepend < 0)
            return bb_fail(BB_ERR_FORMAT, "%s: pre_tokenizer Metaspace: prepend_scheme %s is not always, first or "
                           "never", path, scheme);
    } else {
        sp->meta_prepend = !prefix || json_is_true(prefix) ? BB_SP_ALWAYS : BB_SP_NEVER;
    }
    return BB_OK;
}

/* The decoder: Metaspace, or a Sequence of Replace (one), ByteFallback, Fuse and Strip. */
static bb_status read_decoder(const json_t *d, const char *path, bb_sp_style *sp)
{
    if (!json_is_object(d)) return BB_OK;
    const char *type = bb_tok_type(d);
    if (!strcmp(type, "Metaspace")) {
        const char *r = json_string_value(json_object_get(d, "replacement"));
        sp->dec_from = strdup(r ? r : "\u2581"), sp->dec_to = strdup(" ");
        return sp->dec_from && sp->dec_to ? BB_OK : bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    const json_t *list = json_object_get(d, "decoders");
    if (strcmp(type, "Sequence") || !json_is_array(list))
        return bb_fail(BB_ERR_FORMAT, "%s: decoder %s is not supported (Metaspace, or a Sequence of Replace, "
                       "ByteFallback, Fuse and Strip)", path, type);
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *s = json_array_get(list, i);
        const char *t = bb_tok_type(s), *from = replace_pattern(s), *to = json_string_value(json_object_get(s, "content"));
        if (!strcmp(t, "Replace") && !sp->dec_from && from && *from && to) {
            sp->dec_from = strdup(from), sp->dec_to = strdup(to);
            if (!sp->dec_from || !sp->dec_to) return bb_fail(BB_ERR_NOMEM, "out of memory");
        } else if (!strcmp(t, "Strip")) {
            if (json_integer_value(json_object_get(s, "start")) > 1 || json_integer_value(json_object_get(s, "stop")))
                return bb_fail(BB_ERR_FORMAT, "%s: decoder Strip: only one leading character can be stripped", path);
        } else if (strcmp(t, "ByteFallback") && strcmp(t, "Fuse")) {
            return bb_fail(BB_ERR_FORMAT, "%s: decoder Sequence: %s is not supported (one Replace, ByteFallback, "
                           "Fuse, Strip)", path, t);
        }
    }
    return BB_OK;
}

bb_status bb_sp_read(const json_t *root, const json_t *model, const char *path, bb_sp_style *sp)
{
    memset(sp, 0, sizeof *sp);
    memset(sp->fallback, 0xFF, sizeof sp->fallback);
    sp->unk = UINT32_MAX;
    const json_t *norm = json_object_get(root, "normalizer"), *pt = json_object_get(root, "pre_tokenizer");
    bool has_norm = json_is_object(norm), metaspace = json_is_object(pt) && !strcmp(bb_tok_type(pt), "Metaspace");
    if (!has_norm && !metaspace && json_is_object(pt) && !json_is_true(json_object_get(model, "byte_fallback")))
        return BB_OK; /* byte-level */
    sp->on = true;
    if (has_norm) BB_TRY(read_normalizer(norm, path, sp));
    if (metaspace) BB_TRY(read_metaspace(pt, path, sp));
    else if (json_is_object(pt))
        return bb_fail(BB_ERR_FORMAT, "%s: pre_tokenizer %s is not supported with a normalizer or byte_fallback "
                       "(SentencePiece-style BPE has none or Metaspace)", path, bb_tok_type(pt));
    BB_TRY(read_decoder(json_object_get(root, "decoder"), path, sp));
    sp->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    sp->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
    return BB_OK;
}

void bb_sp_free(bb_sp_style *sp)
{
    for (int i = 0; i < sp->edits; i++) free(sp->edit[i].from), free(sp->edit[i].to);
    free(sp->meta), free(sp->dec_from), free(sp->dec_to);
    memset(sp, 0, sizeof *sp);
}

/* ---- text ---------------------------------------------------------------- */
static bool reserve(bb_sp_buf *buf, size_t need)
{
    if (need <= buf->cap) return true;
    uint8_t *b = realloc(buf->p, need * 2);
    if (!b) return false;
    buf->p = b, buf->cap = need * 2;
    return true;
}

/* a then b (not in *buf) into *buf (grown); their length, SIZE_MAX when out of memory. */
static size_t concat(bb_sp_buf *buf, const void *a, size_t an, const void *b, size_t bn)
{
    if (!reserve(buf, an + bn + 1)) return SIZE_MAX;
    memcpy(buf->p, a, an);
    memcpy(buf->p + an, b, bn);
    return an + bn;
}

/* a before the n bytes of *buf; their length, SIZE_MAX when out of memory. */
static size_t put_before(bb_sp_buf *buf, size_t n, const char *a, size_t an)
{
    if (!reserve(buf, an + n + 1)) return SIZE_MAX;
    memmove(buf->p + an, buf->p, n);
    memcpy(buf->p, a, an);
    return an + n;
}

/* s (n bytes) with each `from` replaced by `to`, left to right, into *buf
 * (grown); its length, SIZE_MAX when out of memory. */
static size_t replace_all(const uint8_t *s, size_t n, const char *from, const char *to, bb_sp_buf *buf)
{
    size_t fl = strlen(from), tl = strlen(to), count = 0;
    for (size_t i = 0; i + fl <= n;)
        if (!memcmp(s + i, from, fl)) count++, i += fl;
        else i++;
    if (!reserve(buf, n + count * tl + 1)) return SIZE_MAX;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (i + fl <= n && !memcmp(s + i, from, fl)) memcpy(buf->p + o, to, tl), o += tl, i += fl;
        else buf->p[o++] = s[i++];
    }
    return o;
}

bb_status bb_sp_each(const bb_sp_style *sp, const uint8_t *seg, size_t n, bool at_start, bb_sp_buf bufs[2],
                     bb_piece_fn fn, void *ctx)
{
    if (!n) return BB_OK;
    const uint8_t *s = seg;
    int cur = 0;     /* each step reads s and writes bufs[cur], then the two swap */
    for (int i = 0; i < sp->edits; i++) { /* the normalizer's steps; Prepend: to a segment that is not empty */
        const bb_sp_edit *e = &sp->edit[i];
        size_t len = e->from ? replace_all(s, n, e->from, e->to, &bufs[cur])
                             : concat(&bufs[cur], e->to, strlen(e->to), s, n);
        if (len == SIZE_MAX) return bb_fail(BB_ERR_NOMEM, "out of memory");
        s = bufs[cur].p, n = len, cur = !cur;
    }
    if (sp->meta) { /* Metaspace: spaces as the replacement, which starts the segment as the scheme says */
        size_t rl = strlen(sp->meta), len = replace_all(s, n, " ", sp->meta, &bufs[cur]);
        bool prepend = sp->meta_prepend == BB_SP_ALWAYS || (sp->meta_prepend == BB_SP_FIRST && at_start);
        if (len != SIZE_MAX && prepend && (len < rl || memcmp(bufs[cur].p, sp->meta, rl)))
            len = put_before(&bufs[cur], len, sp->meta, rl);
        if (len == SIZE_MAX) return bb_fail(BB_ERR_NOMEM, "out of memory");
        s = bufs[cur].p, n = len;
        if (sp->meta_split) { /* each replacement starts a piece (merged with what follows it) */
            size_t from = 0;
            for (size_t i = 1; i + rl <= n; i++) {
                if (memcmp(s + i, sp->meta, rl)) continue;
                BB_TRY(fn(ctx, s + from, i - from));
                from = i, i += rl - 1;
            }
            return fn(ctx, s + from, n - from);
        }
    }
    return fn(ctx, s, n);
}

/* The length of the UTF-8 character at p (n bytes left); 1 for a byte that starts none. */
static size_t char_len(const uint8_t *p, size_t n)
{
    size_t k = *p < 0x80 ? 1 : (*p >> 5) == 6 ? 2 : (*p >> 4) == 14 ? 3 : (*p >> 3) == 30 ? 4 : 0;
    if (!k || k > n) return 1;
    for (size_t i = 1; i < k; i++)
        if ((p[i] & 0xC0) != 0x80) return 1;
    return k;
}

size_t bb_sp_symbols(const bb_sp_style *sp, const bb_str_map *pieces, const uint8_t *p, size_t n, uint32_t *ids)
{
    size_t count = 0;
    bool pending = false; /* an <unk> not yet written */
    for (size_t i = 0, k; i < n; i += k) {
        k = char_len(p + i, n - i);
        const uint64_t *id = bb_str_find(pieces, p + i, k);
        if (id) {
            if (pending) ids[count++] = sp->unk, pending = false;
            ids[count++] = (uint32_t)*id;
            continue;
        }
        bool bytes = sp->byte_fallback;
        for (size_t b = 0; bytes && b < k; b++) bytes = sp->fallback[p[i + b]] != UINT32_MAX;
        if (bytes) { /* as tokenizers does, an <unk> waiting stays waiting past them */
            for (size_t b = 0; b < k; b++) ids[count++] = sp->fallback[p[i + b]];
            continue;
        }
        if (sp->unk == UINT32_MAX) continue; /* no <unk>: the character is dropped, as tokenizers drops it */
        if (pending && !sp->fuse_unk) ids[count++] = sp->unk;
        pending = true;
    }
    if (pending) ids[count++] = sp->unk;
    return count;
}

uint8_t *bb_sp_token_bytes(bb_sp_style *sp, const char *key, uint32_t id, size_t *len)
{
    unsigned b;
    char tail;
    size_t n = strlen(key);
    if (sp->byte_fallback && n == 6 && sscanf(key, "<0x%2X%c", &b, &tail) == 2 && tail == '>' &&
        strspn(key + 3, "0123456789ABCDEF") == 2) {
        sp->fallback[b] = id;
        uint8_t *one = malloc(1);
        if (one) *one = (uint8_t)b, *len = 1;
        return one;
    }
    bb_sp_buf buf = {0};
    *len = sp->dec_from ? replace_all((const uint8_t *)key, n, sp->dec_from, sp->dec_to, &buf)
                        : concat(&buf, key, n, "", 0);
    if (*len == SIZE_MAX) free(buf.p), buf.p = NULL;
    return buf.p;
}
