/* tokenizer_train.c — byte-level BPE training. The text is split by
 * GPT-2's pattern on every thread and its distinct pieces ("words") are
 * counted; each word is then a run of symbols (its bytes at first), every
 * adjacent pair has a count (the sum of the counts of the words holding it)
 * and the list of words it occurs in, and a max-heap of (count, pair) says
 * what to merge next. A merge rewrites only the words of its pair and
 * adjusts the counts of the pairs around each occurrence; a heap entry
 * whose count changed since it was queued is queued again with the count
 * it has now (lazy updates), as `tokenizers`' BpeTrainer does. */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bigbatch/json.h"
#include "tokenizer_internal.h"

/* ---- counting words ------------------------------------------------------ */
typedef struct counter {
    const pcre2_code *re;
    const uint8_t *text;
    const size_t *cuts;
    int chunks;
    atomic_int next;
    bb_str_map *maps; /* one per thread */
    bb_status *rc;
    const volatile sig_atomic_t *interrupted;
} counter;

typedef struct count_ctx {
    bb_str_map *map;
    uint64_t pieces;
} count_ctx;

static bb_status count_piece(void *ctx, const uint8_t *p, size_t n)
{
    count_ctx *c = ctx;
    uint64_t *v = bb_str_get(c->map, p, n, 0);
    if (!v) return bb_fail(BB_ERR_NOMEM, "out of memory counting words");
    ++*v, c->pieces++;
    return BB_OK;
}

typedef struct count_arg {
    counter *c;
    int self;
    uint64_t pieces;
} count_arg;

static void *count_worker(void *arg)
{
    count_arg *a = arg;
    counter *c = a->c;
    count_ctx ctx = {&c->maps[a->self], 0};
    for (int k; (k = atomic_fetch_add(&c->next, 1)) < c->chunks && c->rc[a->self] == BB_OK;) {
        if (c->interrupted && *c->interrupted) break;
        c->rc[a->self] = bb_pretok_each(c->re, c->text + c->cuts[k], c->cuts[k + 1] - c->cuts[k], count_piece, &ctx);
    }
    a->pieces = ctx.pieces;
    return NULL;
}

/* Adds the words of `n` bytes of text into `words` on `threads` threads. */
static bb_status count_words(const pcre2_code *re, const uint8_t *text, size_t n, int threads,
                             const volatile sig_atomic_t *interrupted, bb_str_map *words, uint64_t *pieces)
{
    size_t *cuts = NULL;
    int k = 0;
    bb_status rc = bb_pretok_cuts(text, n, 1u << 20, &cuts, &k);
    bb_str_map *maps = calloc((size_t)threads, sizeof *maps);
    bb_status *rcs = calloc((size_t)threads, sizeof *rcs);
    count_arg *args = calloc((size_t)threads, sizeof *args);
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    if (rc == BB_OK && !(maps && rcs && args && tid)) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    counter c = {.re = re, .text = text, .cuts = cuts, .chunks = k, .maps = maps, .rc = rcs, .interrupted = interrupted};
    int started = 0;
    for (; rc == BB_OK && started < threads; started++) {
        args[started] = (count_arg){&c, started, 0};
        if (pthread_create(&tid[started], NULL, count_worker, &args[started])) break;
    }
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
    if (rc == BB_OK && !started) rc = bb_fail(BB_ERR_INTERNAL, "cannot start a thread to count words");
    for (int i = 0; rc == BB_OK && i < started; i++) {
        if (rcs[i] != BB_OK) rc = bb_fail(rcs[i], "counting words failed (%s)", bb_status_name(rcs[i]));
        *pieces += args[i].pieces;
        for (size_t s = 0; rc == BB_OK && s < maps[i].cap; s++) {
            const struct bb_str_slot *e = &maps[i].slots[s];
            if (!e->used) continue;
            uint64_t *v = bb_str_get(words, maps[i].arena + e->off, e->len, 0);
            if (!v) rc = bb_fail(BB_ERR_NOMEM, "out of memory counting words");
            else *v += e->val;
        }
    }
    if (rc == BB_OK && interrupted && *interrupted) rc = bb_fail(BB_ERR_INTERRUPTED, "interrupted; nothing written");
    for (int i = 0; maps && i < threads; i++) bb_str_free(&maps[i]);
    free(cuts), free(maps), free(rcs), free(args), free(tid);
    return rc;
}

/* ---- merging ------------------------------------------------------------- */
typedef struct pair_info {
    int64_t count;
    uint32_t *where, n, cap; /* words holding the pair (repeats and stale ones allowed) */
    uint32_t stamp;          /* the merge that last queued it (touched) */
} pair_info;

typedef struct trainer {
    uint32_t *syms;     /* every word's symbols, back to back */
    size_t *start;      /* (words + 1) */
    uint32_t *len;      /* (words) symbols left in each word */
    uint64_t *count;    /* (words) */
    size_t words;
    bb_pair_map index;  /* pair → index into pairs */
    pair_info *pairs;
    size_t npairs, pairs_cap;
    struct heap_entry { int64_t count; uint64_t key; } *heap;
    size_t hn, hcap;
    uint64_t *touched;  /* pairs that gained occurrences in this merge */
    size_t ntouched, touched_cap;
    uint32_t stamp;     /* this merge's number, from 1 */
} trainer;

/* Higher count first; among equal counts the smaller pair of ids. */
static bool above(const struct heap_entry *a, const struct heap_entry *b)
{
    return a->count > b->count || (a->count == b->count && a->key < b->key);
}

static bool heap_push(trainer *tr, int64_t count, uint64_t key)
{
    if (tr->hn == tr->hcap) {
        size_t cap = tr->hcap ? tr->hcap * 2 : 4096;
        void *h = realloc(tr->heap, cap * sizeof *tr->heap);
        if (!h) return false;
        tr->heap = h, tr->hcap = cap;
    }
    struct heap_entry v = {count, key};
    size_t i = tr->hn++;
    for (; i > 0 && above(&v, &tr->heap[(i - 1) / 2]); i = (i - 1) / 2) tr->heap[i] = tr->heap[(i - 1) / 2];
    tr->heap[i] = v;
    return true;
}

static struct heap_entry heap_pop(trainer *tr)
{
    struct heap_entry top = tr->heap[0], v = tr->heap[--tr->hn];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= tr->hn) break;
        if (c + 1 < tr->hn && above(&tr->heap[c + 1], &tr->heap[c])) c++;
        if (!above(&tr->heap[c], &v)) break;
        tr->heap[i] = tr->heap[c], i = c;
    }
    tr->heap[i] = v;
    return top;
}

static pair_info *pair_of(trainer *tr, uint32_t a, uint32_t b)
{
    uint64_t *ix = bb_pair_get(&tr->index, bb_pair_key(a, b), UINT64_MAX);
    if (!ix) return NULL;
    if (*ix == UINT64_MAX) {
        if (tr->npairs == tr->pairs_cap) {
            size_t cap = tr->pairs_cap ? tr->pairs_cap * 2 : 4096;
            pair_info *p = realloc(tr->pairs, cap * sizeof *p);
            if (!p) return NULL;
            tr->pairs = p, tr->pairs_cap = cap;
        }
        tr->pairs[tr->npairs] = (pair_info){0};
        *ix = tr->npairs++;
    }
    return &tr->pairs[*ix];
}

/* Adds `delta` to pair (a, b)'s count; a pair gaining occurrences records
 * word w and is queued with its new count. */
static bool add_pair(trainer *tr, uint32_t a, uint32_t b, int64_t delta, uint32_t w)
{
    pair_info *p = pair_of(tr, a, b);
    if (!p) return false;
    p->count += delta;
    if (delta <= 0) return true;
    if (p->stamp != tr->stamp) {
        if (tr->ntouched == tr->touched_cap) {
            size_t cap = tr->touched_cap ? tr->touched_cap * 2 : 1024;
            uint64_t *t = realloc(tr->touched, cap * sizeof *t);
            if (!t) return false;
            tr->touched = t, tr->touched_cap = cap;
        }
        tr->touched[tr->ntouched++] = bb_pair_key(a, b);
        p->stamp = tr->stamp;
    }
    if (!p->n || p->where[p->n - 1] != w) {
        if (p->n == p->cap) {
            uint32_t cap = p->cap ? p->cap * 2 : 4;
            uint32_t *v = realloc(p->where, cap * sizeof *v);
            if (!v) return false;
            p->where = v, p->cap = cap;
        }
        p->where[p->n++] = w;
    }
    return true;
}

/* Replaces every (a, b) in the words holding it by `id`. */
static bool merge(trainer *tr, uint32_t a, uint32_t b, uint32_t id)
{
    pair_info *p = pair_of(tr, a, b);
    if (!p) return false;
    uint32_t *where = p->where, n = p->n;
    tr->ntouched = 0;
    tr->stamp++;
    p->where = NULL, p->n = p->cap = 0; /* the pair is gone; its list is ours */
    bool ok = true;
    for (uint32_t k = 0; k < n && ok; k++) {
        uint32_t w = where[k], *s = tr->syms + tr->start[w], len = tr->len[w];
        int64_t c = (int64_t)tr->count[w];
        uint32_t out = 0;
        for (uint32_t i = 0; i < len && ok; i++) {
            if (i + 1 < len && s[i] == a && s[i + 1] == b) {
                if (out > 0) ok = add_pair(tr, s[out - 1], a, -c, w) && add_pair(tr, s[out - 1], id, c, w);
                if (ok && i + 2 < len) ok = add_pair(tr, b, s[i + 2], -c, w) && add_pair(tr, id, s[i + 2], c, w);
                s[out++] = id;
                i++;
            } else {
                s[out++] = s[i];
            }
        }
        tr->len[w] = out;
    }
    free(where);
    if (ok) pair_of(tr, a, b)->count = 0; /* none is left (the adjustments above do not count the merged ones) */
    /* the pairs with the new symbol: queued with the counts they have now */
    for (size_t i = 0; ok && i < tr->ntouched; i++) {
        const uint64_t *ix = bb_pair_find(&tr->index, tr->touched[i]);
        ok = heap_push(tr, tr->pairs[*ix].count, tr->touched[i]);
    }
    return ok;
}

static void trainer_free(trainer *tr)
{
    for (size_t i = 0; i < tr->npairs; i++) free(tr->pairs[i].where);
    free(tr->pairs), free(tr->heap), free(tr->touched), free(tr->syms), free(tr->start), free(tr->len), free(tr->count);
    bb_pair_free(&tr->index);
}

/* Words (the map's keys) as symbol runs: their bytes, ids 0..255. */
static bb_status trainer_init(trainer *tr, const bb_str_map *words)
{
    tr->words = words->count;
    tr->syms = malloc((words->arena_len + 1) * sizeof *tr->syms);
    tr->start = malloc((tr->words + 1) * sizeof *tr->start);
    tr->len = malloc((tr->words + 1) * sizeof *tr->len);
    tr->count = malloc((tr->words + 1) * sizeof *tr->count);
    if (!tr->syms || !tr->start || !tr->len || !tr->count) return bb_fail(BB_ERR_NOMEM, "out of memory");
    size_t w = 0, at = 0;
    for (size_t s = 0; s < words->cap; s++) {
        const struct bb_str_slot *e = &words->slots[s];
        if (!e->used) continue;
        tr->start[w] = at, tr->len[w] = e->len, tr->count[w] = e->val;
        for (uint32_t i = 0; i < e->len; i++) tr->syms[at + i] = words->arena[e->off + i];
        for (uint32_t i = 0; i + 1 < e->len; i++)
            if (!add_pair(tr, tr->syms[at + i], tr->syms[at + i + 1], (int64_t)e->val, (uint32_t)w))
                return bb_fail(BB_ERR_NOMEM, "out of memory");
        at += e->len, w++;
    }
    for (size_t i = 0; i < tr->index.cap; i++)
        if (tr->index.keys[i] != UINT64_MAX && !heap_push(tr, tr->pairs[tr->index.vals[i]].count, tr->index.keys[i]))
            return bb_fail(BB_ERR_NOMEM, "out of memory");
    return BB_OK;
}

/* Token bytes, id by id: the 256 bytes, then one per merge that made a new one. */
typedef struct token_list {
    bb_str_map ids;      /* bytes → id; its arena holds every token's bytes */
    size_t *at, *len, n, cap; /* (n) each id's bytes: at ids.arena + at[id], len[id] of them */
} token_list;

static const uint8_t *token_at(const token_list *tl, size_t id) { return tl->ids.arena + tl->at[id]; }

static bool token_add(token_list *tl, const uint8_t *b, size_t n)
{
    if (tl->n == tl->cap) {
        size_t cap = tl->cap ? tl->cap * 2 : 1024;
        size_t *at = realloc(tl->at, cap * sizeof *at);
        if (!at) return false;
        tl->at = at;
        size_t *len = realloc(tl->len, cap * sizeof *len);
        if (!len) return false;
        tl->len = len, tl->cap = cap;
    }
    if (!bb_str_get(&tl->ids, b, n, tl->n)) return false; /* a new key: its bytes are the arena's last */
    tl->at[tl->n] = tl->ids.arena_len - n, tl->len[tl->n] = n;
    tl->n++;
    return true;
}

/* The byte-level string of token bytes (GPT-2's alphabet), NUL-terminated. */
static char *bytelevel_string(const uint32_t cp[256], const uint8_t *b, size_t n)
{
    char *s = malloc(2 * n + 1), *o = s;
    if (!s) return NULL;
    for (size_t i = 0; i < n; i++) o += bb_utf8_put(cp[b[i]], o);
    *o = '\0';
    return s;
}

static json_t *bytelevel_step(bool regex_flags)
{
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", false, "trim_offsets",
                     regex_flags, "use_regex", true);
}

/* The tokenizer.json of `tl` (its first 256 tokens the bytes), its merges
 * (pairs of ids, in rank order) and the specials after them. */
static bb_status write_tokenizer(const bb_tokenizer_train_options *o, const token_list *tl, const uint32_t *merges,
                                 uint32_t nmerges, const char *const *specials, int nspecials)
{
    uint32_t cp[256];
    bb_bytelevel_codepoints(cp);
    json_t *vocab = json_object(), *mlist = json_array(), *added = json_array();
    bb_status rc = vocab && mlist && added ? BB_OK : bb_fail(BB_ERR_NOMEM, "out of memory");
    char **names = calloc(tl->n + 1, sizeof *names);
    if (!names) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    for (size_t id = 0; rc == BB_OK && id < tl->n; id++) {
        names[id] = bytelevel_string(cp, token_at(tl, id), tl->len[id]);
        if (!names[id] || json_object_set_new(vocab, names[id], json_integer((json_int_t)id)))
            rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    for (uint32_t m = 0; rc == BB_OK && m < nmerges; m++) {
        size_t la = strlen(names[merges[2 * m]]), lb = strlen(names[merges[2 * m + 1]]);
        char *s = malloc(la + lb + 2);
        if (!s) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
        else {
            memcpy(s, names[merges[2 * m]], la), s[la] = ' ', memcpy(s + la + 1, names[merges[2 * m + 1]], lb + 1);
            if (json_array_append_new(mlist, json_string(s))) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
            free(s);
        }
    }
    for (int i = 0; rc == BB_OK && i < nspecials; i++) {
        json_int_t id = (json_int_t)(tl->n + (size_t)i);
        json_object_set_new(vocab, specials[i], json_integer(id));
        json_array_append_new(added, json_pack("{s:I, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", specials[i],
                                               "single_word", false, "lstrip", false, "rstrip", false, "normalized",
                                               false, "special", true));
    }
    for (size_t id = 0; names && id < tl->n; id++) free(names[id]);
    free(names);
    json_t *root = NULL;
    if (rc == BB_OK) {
        json_t *model = json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:O, s:O}", "type", "BPE", "dropout",
                                  "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", false,
                                  "byte_fallback", false, "ignore_merges", false, "vocab", vocab, "merges", mlist);
        root = json_pack("{s:s, s:n, s:n, s:O, s:n, s:o, s:o, s:o, s:o}", "version", "1.0", "truncation", "padding",
                         "added_tokens", added, "normalizer", "pre_tokenizer", bytelevel_step(true),
                         "post_processor", bytelevel_step(false), "decoder", bytelevel_step(true), "model", model);
        if (!root) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.partial-%d", o->out, (int)getpid());
    if (rc == BB_OK) rc = bb_make_parents(o->out, NULL); /* missing directories are made, as for every output */
    FILE *f = rc == BB_OK ? fopen(tmp, "w") : NULL;
    if (rc == BB_OK && !f) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot create", o->out);
    int tracked = f ? bb_temp_track(tmp) : -1; /* a second signal removes it */
    if (f) {
        if (json_dumpf(root, f, JSON_INDENT(1)) || fputc('\n', f) == EOF || fflush(f) ||
            fsync(fileno(f)))
            rc = bb_fail_errno(BB_ERR_IO, "%s: cannot write", tmp);
        if (fclose(f) && rc == BB_OK) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot write", tmp);
        if (rc == BB_OK && rename(tmp, o->out)) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot rename to %s", tmp, o->out);
        if (rc != BB_OK) unlink(tmp);
        else bb_fsync_dir_of(o->out);
    }
    bb_temp_untrack(tracked);
    json_decref(root), json_decref(vocab), json_decref(mlist), json_decref(added);
    return rc;
}

static bb_status map_input(const char *path, const uint8_t **map, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot open", path);
    struct stat st;
    bb_status rc = BB_OK;
    if (fstat(fd, &st) != 0) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot stat", path);
    else if (!S_ISREG(st.st_mode)) rc = bb_fail(BB_ERR_IO, "%s: not a regular file", path);
    *len = rc == BB_OK ? (size_t)st.st_size : 0, *map = NULL;
    if (rc == BB_OK && *len) {
        void *m = mmap(NULL, *len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot map %zu bytes", path, *len);
        else *map = m;
    }
    close(fd);
    return rc;
}

bb_status bb_tokenizer_train(const bb_tokenizer_train_options *o, bb_tokenizer_train_report *r)
{
    static const char *const default_specials[] = {"<|endoftext|>"};
    const char *const *specials = o->specials ? o->specials : default_specials;
    int nspecials = o->specials ? o->special_count : 1;
    memset(r, 0, sizeof *r);
    if (o->input_count < 1) return bb_fail(BB_ERR_ARG, "--in: no input files");
    if (o->vocab < 256u + (uint32_t)nspecials + 1 || o->vocab > 1u << 24)
        return bb_fail(BB_ERR_ARG, "--vocab %u: must be at least %d (the 256 bytes, the special tokens and one merge) "
                       "and at most 16777216", o->vocab, 256 + nspecials + 1);
    int threads = o->threads > 0 ? o->threads : bb_cpu_count();
    pcre2_code *re = NULL;
    bb_str_map words = {0};
    trainer tr = {0};
    token_list tl = {0};
    uint32_t *merges = NULL;
    bb_status rc = bb_pretok_compile(BB_GPT2_PATTERN, "GPT-2's pre-tokenizer", &re);
    double t0 = bb_clock_seconds();
    for (int i = 0; rc == BB_OK && i < o->input_count; i++) {
        const uint8_t *text = NULL;
        size_t n = 0;
        BB_TRY_GOTO(map_input(o->inputs[i], &text, &n), rc, done);
        rc = count_words(re, text, n, threads, o->interrupted, &words, &r->words);
        if (text) munmap((void *)text, n);
        r->bytes += n;
        if (o->progress)
            fprintf(o->progress, "tokenizer: %s: %.1f MB read, %llu distinct words so far\n", o->inputs[i], n / 1e6,
                    (unsigned long long)words.count);
    }
    if (rc == BB_OK && r->bytes == 0) rc = bb_fail(BB_ERR_IO, "%s: no text to train on (0 bytes)", o->inputs[0]);
    r->unique_words = words.count;
    r->count_seconds = bb_clock_seconds() - t0;
    if (rc == BB_OK) rc = trainer_init(&tr, &words);
    bb_str_free(&words);
    uint32_t want = o->vocab - 256 - (uint32_t)nspecials; /* new tokens to make */
    if (rc == BB_OK && !(merges = malloc(2 * (size_t)want * sizeof *merges))) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    for (int b = 0; rc == BB_OK && b < 256; b++)
        if (!token_add(&tl, (const uint8_t[]){(uint8_t)b}, 1)) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    t0 = bb_clock_seconds();
    uint32_t made = 0, nmerges = 0, cap = want; /* pairs merges holds */
    double last_report = t0;
    while (rc == BB_OK && made < want && tr.hn) {
        if (o->interrupted && *o->interrupted) {
            rc = bb_fail(BB_ERR_INTERRUPTED, "interrupted; %s was not written", o->out);
            break;
        }
        struct heap_entry top = heap_pop(&tr);
        const pair_info *p = &tr.pairs[*bb_pair_find(&tr.index, top.key)];
        if (p->count != top.count) { /* changed since it was queued */
            if (p->count > 0 && !heap_push(&tr, p->count, top.key)) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
            continue;
        }
        if (top.count <= 0) break;
        uint32_t a = (uint32_t)(top.key >> 32), b = (uint32_t)top.key;
        size_t n = tl.len[a] + tl.len[b];
        uint8_t *joined = malloc(n);
        if (!joined) {
            rc = bb_fail(BB_ERR_NOMEM, "out of memory");
            break;
        }
        memcpy(joined, token_at(&tl, a), tl.len[a]), memcpy(joined + tl.len[a], token_at(&tl, b), tl.len[b]);
        const uint64_t *have = bb_str_find(&tl.ids, joined, n);
        uint32_t id = have ? (uint32_t)*have : (uint32_t)tl.n;
        if (!have && !token_add(&tl, joined, n)) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
        free(joined);
        if (nmerges == cap) { /* merges that reuse a token make no new one */
            uint32_t *m = realloc(merges, 2 * (size_t)(cap *= 2) * sizeof *m);
            if (!m) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
            else merges = m;
        }
        if (rc != BB_OK) break;
        merges[2 * nmerges] = a, merges[2 * nmerges + 1] = b, nmerges++;
        made += !have;
        if (!merge(&tr, a, b, id)) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
        if (o->progress && (made & 63) == 0 && bb_clock_seconds() - last_report >= 2) { /* long inputs only */
            last_report = bb_clock_seconds();
            fprintf(o->progress, "tokenizer: %u of %u merges (%.0f s)\n", made, want, last_report - t0);
        }
    }
    r->merges = nmerges;
    r->merge_seconds = bb_clock_seconds() - t0;
    if (rc == BB_OK) rc = write_tokenizer(o, &tl, merges, nmerges, specials, nspecials);
done:
    free(merges);
    bb_str_free(&tl.ids);
    free(tl.at), free(tl.len);
    trainer_free(&tr);
    pcre2_code_free(re);
    return rc;
}
