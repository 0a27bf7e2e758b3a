/* json.c — jansson with bigbatch's errors (json.h), and a reader of one
 * large array element by element. */
#include "bigbatch/json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Objects and lines: strict, and a key given twice is an error (a file
 * written by hand or damaged, not one bigbatch wrote). */
enum { LOAD_FLAGS = JSON_REJECT_DUPLICATES };

bb_status bb_json_load_file(const char *path, bool object, json_t **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return bb_fail_errno(BB_ERR_IO, "%s: cannot open", path);
    json_error_t e;
    json_t *v = json_loadf(f, LOAD_FLAGS | JSON_DECODE_ANY, &e);
    bool failed = ferror(f);
    fclose(f);
    if (failed) {
        json_decref(v);
        return bb_fail(BB_ERR_IO, "%s: read failed", path);
    }
    if (!v) return bb_fail(BB_ERR_FORMAT, "%s: line %d, column %d: not JSON (%s)", path, e.line, e.column, e.text);
    if (object && !json_is_object(v)) {
        json_decref(v);
        return bb_fail(BB_ERR_FORMAT, "%s: not a JSON object", path);
    }
    *out = v;
    return BB_OK;
}

bb_status bb_json_load_line(const char *text, size_t len, const char *what, json_t **out)
{
    json_error_t e;
    *out = json_loadb(text, len, LOAD_FLAGS, &e);
    if (!*out) return bb_fail(BB_ERR_FORMAT, "%s: column %d: not JSON (%s)", what, e.column, e.text);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return bb_fail(BB_ERR_FORMAT, "%s: not a JSON object", what);
    }
    return BB_OK;
}

/* ---- typed getters ---------------------------------------------------- */
static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static bb_status wrong(const char *file, const char *key, const json_t *v, const char *want)
{
    return bb_fail(BB_ERR_FORMAT, "%s: \"%s\" is %s, not %s", file, key, type_name(v), want);
}

/* obj[key]; *v NULL when absent (or null and `optional`). */
static bb_status member(const json_t *obj, const char *file, const char *key, bool optional, json_t **v)
{
    *v = json_object_get(obj, key);
    if (*v && json_is_null(*v) && optional) *v = NULL;
    if (!*v && !optional) return bb_fail(BB_ERR_FORMAT, "%s: \"%s\" is missing", file, key);
    return BB_OK;
}

static bb_status get_u64(const json_t *obj, const char *file, const char *key, bool optional, uint64_t *out)
{
    json_t *v;
    BB_TRY(member(obj, file, key, optional, &v));
    if (!v) return BB_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0) return wrong(file, key, v, "a non-negative integer");
    *out = (uint64_t)json_integer_value(v);
    return BB_OK;
}

static bb_status get_int(const json_t *obj, const char *file, const char *key, bool optional, int *out)
{
    uint64_t v = (uint64_t)*out;
    BB_TRY(get_u64(obj, file, key, optional, &v));
    if (v > (1u << 30))
        return bb_fail(BB_ERR_FORMAT, "%s: \"%s\" is %llu, out of range", file, key, (unsigned long long)v);
    *out = (int)v;
    return BB_OK;
}

static bb_status get_double(const json_t *obj, const char *file, const char *key, bool optional, double *out)
{
    json_t *v;
    BB_TRY(member(obj, file, key, optional, &v));
    if (!v) return BB_OK;
    if (!json_is_number(v)) return wrong(file, key, v, "a number");
    *out = json_number_value(v);
    return BB_OK;
}

static bb_status get_string(const json_t *obj, const char *file, const char *key, bool optional, char *out,
                            size_t cap)
{
    json_t *v;
    BB_TRY(member(obj, file, key, optional, &v));
    if (!v) return BB_OK;
    if (!json_is_string(v)) return wrong(file, key, v, "a string");
    size_t n = json_string_length(v);
    if (n >= cap || strlen(json_string_value(v)) != n) /* too long, or holds a NUL */
        return bb_fail(BB_ERR_FORMAT, "%s: \"%s\" is longer than %zu bytes or holds a NUL", file, key, cap - 1);
    memcpy(out, json_string_value(v), n + 1);
    return BB_OK;
}

/* The required and the optional reader of one type. */
#define READERS(name, type)                                                                                    \
    bb_status bb_json_req_##name(const json_t *o, const char *f, const char *k, type *out)                     \
    {                                                                                                          \
        return get_##name(o, f, k, false, out);                                                                \
    }                                                                                                          \
    bb_status bb_json_opt_##name(const json_t *o, const char *f, const char *k, type *out)                     \
    {                                                                                                          \
        return get_##name(o, f, k, true, out);                                                                 \
    }
READERS(u64, uint64_t)
READERS(int, int)
READERS(double, double)
#undef READERS

bb_status bb_json_req_string(const json_t *o, const char *f, const char *k, char *out, size_t cap)
{
    return get_string(o, f, k, false, out, cap);
}
bb_status bb_json_opt_string(const json_t *o, const char *f, const char *k, char *out, size_t cap)
{
    return get_string(o, f, k, true, out, cap);
}

double bb_json_number_or_nan(const json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* ---- writing ------------------------------------------------------------ */
json_t *bb_json_real(double v, int digits)
{
    if (!isfinite(v)) return json_null();
    char text[48];
    snprintf(text, sizeof text, "%.*g", digits, v);
    return json_real(strtod(text, NULL));
}

json_t *bb_json_fixed(double v, int decimals)
{
    if (!isfinite(v)) return json_null();
    if (decimals <= 0 && fabs(v) < 9e18) return json_integer((json_int_t)llround(v));
    char text[400];
    snprintf(text, sizeof text, "%.*f", decimals, v);
    return json_real(strtod(text, NULL));
}

/* 15 digits print what bb_json_real and bb_json_fixed rounded as written
 * (5.309, not 5.3090000000000002); state.json keeps all 17. */
enum { LINE_FLAGS = JSON_REAL_PRECISION(15) | JSON_ENCODE_ANY };

bb_status bb_json_write(FILE *f, const json_t *v)
{
    char *text = v ? json_dumps(v, LINE_FLAGS) : NULL;
    if (!text) return bb_fail(BB_ERR_NOMEM, "out of memory encoding JSON");
    bool ok = fputs(text, f) >= 0;
    free(text);
    return ok ? BB_OK : bb_fail_errno(BB_ERR_IO, "write failed");
}

bb_status bb_json_write_line(FILE *f, const json_t *v)
{
    BB_TRY(bb_json_write(f, v));
    return fputc('\n', f) != EOF ? BB_OK : bb_fail_errno(BB_ERR_IO, "write failed");
}

bb_status bb_json_write_file(const json_t *v, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) return bb_fail_errno(BB_ERR_IO, "%s: cannot create", path);
    bool ok = json_dumpf(v, f, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) == 0 && fputc('\n', f) != EOF;
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (fclose(f) != 0) ok = false;
    return ok ? BB_OK : bb_fail_errno(BB_ERR_IO, "%s: write failed", path);
}

/* ---- streaming one array ------------------------------------------------ */
struct bb_json_stream {
    FILE *f;
    char *path, *member;
    char *buf;
    size_t cap, start, end; /* unread bytes: buf[start, end) */
    uint64_t offset;        /* the file offset of buf[0] */
    bool eof, found, inside, done;
};

enum { STREAM_MIN = 1 << 20 };

bb_status bb_json_stream_open(const char *path, const char *member, bb_json_stream **out)
{
    *out = NULL;
    bb_json_stream *s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(path)) || !(s->member = strdup(member ? member : "")) ||
        !(s->buf = malloc(s->cap = STREAM_MIN))) {
        bb_json_stream_close(s);
        return bb_fail(BB_ERR_NOMEM, "%s: out of memory", path);
    }
    if (!(s->f = fopen(path, "rb"))) {
        bb_status rc = bb_fail_errno(BB_ERR_IO, "%s: cannot open", path);
        bb_json_stream_close(s);
        return rc;
    }
    *out = s;
    return BB_OK;
}

void bb_json_stream_close(bb_json_stream *s)
{
    if (!s) return;
    if (s->f) fclose(s->f);
    free(s->path), free(s->member), free(s->buf);
    free(s);
}

bool bb_json_stream_found(const bb_json_stream *s) { return s->found; }

/* More bytes after buf[end] (moving the unread ones to the front, growing
 * the buffer when they fill it); false at the end of the file. */
static bb_status refill(bb_json_stream *s, bool *more)
{
    *more = false;
    if (s->eof) return BB_OK;
    if (s->start) {
        memmove(s->buf, s->buf + s->start, s->end - s->start);
        s->offset += s->start, s->end -= s->start, s->start = 0;
    }
    if (s->end == s->cap) {
        char *grown = realloc(s->buf, 2 * s->cap);
        if (!grown) return bb_fail(BB_ERR_NOMEM, "%s: out of memory (an element over %zu bytes)", s->path, s->cap);
        s->buf = grown, s->cap *= 2;
    }
    size_t n = fread(s->buf + s->end, 1, s->cap - s->end, s->f);
    if (n == 0 && ferror(s->f)) return bb_fail_errno(BB_ERR_IO, "%s: read failed", s->path);
    if (n == 0) s->eof = true;
    s->end += n;
    *more = n > 0;
    return BB_OK;
}

/* The next byte that is not white space (not consumed), or EOF. */
static bb_status peek(bb_json_stream *s, int *c)
{
    for (;;) {
        while (s->start < s->end && strchr(" \t\r\n", s->buf[s->start])) s->start++;
        if (s->start < s->end) {
            *c = (unsigned char)s->buf[s->start];
            return BB_OK;
        }
        bool more;
        BB_TRY(refill(s, &more));
        if (!more) {
            *c = EOF;
            return BB_OK;
        }
    }
}

static bb_status bad(bb_json_stream *s, const char *what)
{
    return bb_fail(BB_ERR_FORMAT, "%s: byte %llu: %s", s->path, (unsigned long long)(s->offset + s->start), what);
}

/* jansson's error at the read position. */
static bb_status parse_error(bb_json_stream *s, const json_error_t *e)
{
    if (json_error_code(e) == json_error_premature_end_of_input) return bad(s, "the file ends inside the JSON");
    char what[200];
    snprintf(what, sizeof what, "not JSON (%s)", e->text);
    s->start += (size_t)e->position;
    return bad(s, what);
}

/* One whole JSON value at the read position (any type), consumed. */
static bb_status value(bb_json_stream *s, json_t **out)
{
    int c;
    BB_TRY(peek(s, &c));
    if (c == EOF) return bad(s, "the file ends inside the JSON");
    for (;;) {
        json_error_t e;
        size_t avail = s->end - s->start;
        *out = json_loadb(s->buf + s->start, avail, JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &e);
        /* A value cut by the buffer's end fails (premature end, or a token
         * cut short: "3." of 3.0) near that end, and a scalar there may go
         * on past it: both are decoded again once more bytes follow. */
        bool ok = *out != NULL;
        bool at_end = ok ? (size_t)e.position >= avail
                         : json_error_code(&e) == json_error_premature_end_of_input || (size_t)e.position + 64 >= avail;
        if (ok && (!at_end || s->eof)) {
            s->start += (size_t)e.position;
            return BB_OK;
        }
        if (!ok && (!at_end || s->eof)) return parse_error(s, &e);
        json_decref(*out);
        *out = NULL;
        bool more;
        BB_TRY(refill(s, &more)); /* at the end of the file, the next pass decides */
    }
}

/* Consumes `c` if it is the next byte; *yes tells. */
static bb_status accept(bb_json_stream *s, int want, bool *yes)
{
    int c;
    BB_TRY(peek(s, &c));
    *yes = c == want;
    if (*yes) s->start++;
    return BB_OK;
}

/* Moves into the array: the file's first byte, or `member`'s value. */
static bb_status enter(bb_json_stream *s)
{
    bool yes = false;
    int c;
    BB_TRY(peek(s, &c));
    if (c == EOF) return BB_OK; /* empty: not found */
    if (c == '[') {
        s->start++;
        s->found = s->inside = true;
        return BB_OK;
    }
    if (c != '{') return BB_OK; /* another JSON: not found */
    s->start++;
    for (bool first = true;; first = false) {
        BB_TRY(accept(s, '}', &yes));
        if (yes) return BB_OK;
        if (!first) {
            BB_TRY(accept(s, ',', &yes));
            if (!yes) return bad(s, "expected ',' or '}'");
        }
        json_t *key;
        BB_TRY(value(s, &key));
        bool is_member = json_is_string(key) && !strcmp(json_string_value(key), s->member);
        bool is_key = json_is_string(key);
        json_decref(key);
        if (!is_key) return bad(s, "expected a key");
        BB_TRY(accept(s, ':', &yes));
        if (!yes) return bad(s, "expected ':'");
        BB_TRY(peek(s, &c));
        if (is_member && c == '[') {
            s->start++;
            s->found = s->inside = true;
            return BB_OK;
        }
        json_t *skipped;
        BB_TRY(value(s, &skipped));
        json_decref(skipped);
    }
}

bb_status bb_json_stream_next(bb_json_stream *s, json_t **out)
{
    *out = NULL;
    if (s->done) return BB_OK;
    if (!s->inside) {
        BB_TRY(enter(s));
        if (!s->inside) {
            s->done = true;
            return BB_OK;
        }
        bool empty = false;
        BB_TRY(accept(s, ']', &empty));
        if (empty) {
            s->done = true;
            return BB_OK;
        }
        return value(s, out);
    }
    bool yes = false;
    BB_TRY(accept(s, ']', &yes));
    if (yes) {
        s->done = true;
        return BB_OK;
    }
    BB_TRY(accept(s, ',', &yes));
    if (!yes) return bad(s, "expected ',' or ']' after an element");
    return value(s, out);
}
