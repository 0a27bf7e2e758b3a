/* json.h — every JSON file bigbatch reads or writes goes through jansson
 * (https://jansson.readthedocs.io); these helpers add bigbatch's error
 * conventions: one line naming the file, the line and column, or the key.
 *
 *   json_t *st;
 *   BB_TRY(bb_json_load_file("run/latest/state.json", &st));
 *   uint64_t step;
 *   bb_status rc = bb_json_req_u64(st, "run/latest/state.json", "step", &step);
 *   json_decref(st);
 *
 *   json_t *row = json_object();               // writing a JSON Lines row
 *   json_object_set_new(row, "loss", bb_json_real(loss, 7));
 *   bb_json_write_line(f, row);                // {"loss": 5.55}\n
 *   json_decref(row);
 *
 *   bb_json_stream *s;                         // a 200 MB Chrome trace, one event at a time
 *   BB_TRY(bb_json_stream_open("trace.json", "traceEvents", &s));
 *   json_t *ev;
 *   while ((rc = bb_json_stream_next(s, &ev)) == BB_OK && ev) { ...; json_decref(ev); }
 *   bb_json_stream_close(s);
 *
 * Why jansson: it is strict (RFC 8259: no NaN, no trailing commas, no
 * comments; duplicate keys refused when asked), every decoding error
 * carries a line, a column and a byte position, it keeps an object's keys
 * in insertion order (files read as written), and json_loadb stops after one
 * value (JSON_DISABLE_EOF_CHECK), which is what reading a large array
 * element by element needs. */
#ifndef BIGBATCH_JSON_H
#define BIGBATCH_JSON_H

#include <jansson.h>
#include <stdio.h>

#include "bigbatch/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parses the whole file (small files: state.json, plan --json). Fails with
 * BB_ERR_IO when it cannot be opened, BB_ERR_FORMAT ("PATH: line L, column C:
 * what") when it is not one JSON value, an object when `object` is true. */
bb_status bb_json_load_file(const char *path, bool object, json_t **out);

/* One JSON text in a string of `len` bytes (a line of JSON Lines); `what`
 * prefixes the error ("metrics.jsonl: line 3"). Fails with BB_ERR_FORMAT
 * when it is not one JSON object. */
bb_status bb_json_load_line(const char *text, size_t len, const char *what, json_t **out);

/* obj[key] as the type asked. Fails with BB_ERR_FORMAT naming `file` and
 * `key` when the key is absent, or its value has another type or is out of
 * range (integers: a non-negative integer that fits; doubles: any number;
 * strings: fits in `cap` bytes, NUL included). */
bb_status bb_json_req_u64(const json_t *obj, const char *file, const char *key, uint64_t *out);
bb_status bb_json_req_int(const json_t *obj, const char *file, const char *key, int *out);
bb_status bb_json_req_double(const json_t *obj, const char *file, const char *key, double *out);
bb_status bb_json_req_string(const json_t *obj, const char *file, const char *key, char *out, size_t cap);

/* The same, for keys older files lack: an absent key (or null) leaves *out
 * as it was and is not an error; a present key of the wrong type is. */
bb_status bb_json_opt_u64(const json_t *obj, const char *file, const char *key, uint64_t *out);
bb_status bb_json_opt_int(const json_t *obj, const char *file, const char *key, int *out);
bb_status bb_json_opt_double(const json_t *obj, const char *file, const char *key, double *out);
bb_status bb_json_opt_string(const json_t *obj, const char *file, const char *key, char *out, size_t cap);

/* obj[key] as a number, or NAN when absent, null or not a number (metrics
 * rows, whose fields are null when they do not apply). */
double bb_json_number_or_nan(const json_t *obj, const char *key);

/* A real rounded to `digits` significant digits (so that it prints as
 * 5.556943, not 5.5569429397583008); JSON null when v is NaN or infinite,
 * which JSON cannot hold. `digits` 17 keeps every bit. Never NULL unless out
 * of memory. */
json_t *bb_json_real(double v, int digits);

/* A real rounded to `decimals` places (milliseconds to 3: 5.309); with 0,
 * an integer (a rate: 476225847). */
json_t *bb_json_fixed(double v, int decimals);

/* Writes `v` on one line (`{"a": 1, "b": 2}`), reals to 15 significant
 * digits; _line adds a newline (JSON Lines). Fail with BB_ERR_IO when the
 * stream fails (errno set), BB_ERR_NOMEM when encoding does. */
bb_status bb_json_write(FILE *f, const json_t *v);
bb_status bb_json_write_line(FILE *f, const json_t *v);

/* Writes `v` to `path` indented by 2, synced (fsync) before it returns:
 * state.json. Fails with BB_ERR_IO naming the file. */
bb_status bb_json_write_file(const json_t *v, const char *path);

/* ---- streaming the elements of one large array ---------------------------
 * The file is either that array itself or an object holding it under
 * `member` (Chrome's {"traceEvents": [...]}); other members are skipped.
 * Memory: one buffer as large as the largest element (at least 1 MiB),
 * whatever the file's size. */
typedef struct bb_json_stream bb_json_stream;

/* Fails with BB_ERR_IO when the file cannot be opened, BB_ERR_NOMEM. */
bb_status bb_json_stream_open(const char *path, const char *member, bb_json_stream **out);

/* The next element into *out (the caller's reference), or *out NULL at the
 * end of the array. Fails with BB_ERR_FORMAT ("PATH: byte B: what") when the
 * file is not such JSON or ends inside it; BB_ERR_IO on a read error. An
 * empty file or one without `member` ends at once (*out NULL) and sets
 * bb_json_stream_found() false. */
bb_status bb_json_stream_next(bb_json_stream *s, json_t **out);

/* Whether the array was found (false for an empty file or another JSON). */
bool bb_json_stream_found(const bb_json_stream *s);

void bb_json_stream_close(bb_json_stream *s);

#ifdef __cplusplus
}
#endif
#endif
