/* remote_internal.h — the pieces of the remote code: where a URL's files
 * come from, how its requests are made, signed and retried (remote_url.c),
 * the session that mirrors a tree's indexes and whole files (remote.c), and
 * the stream that fills a dataset's shards while training reads them
 * (remote_stream.c, stream.h).
 *
 *   bb_remote_site site;
 *   BB_TRY(bb_remote_site_init(&site, "s3://bucket/kjv", NULL));
 *   // site.base: "https://bucket.s3.us-east-1.amazonaws.com/kjv/"
 *   struct curl_slist *h;
 *   BB_TRY(bb_remote_site_setup(&site, easy, &h));  // before each transfer; free h after it
 */
#ifndef BIGBATCH_REMOTE_INTERNAL_H
#define BIGBATCH_REMOTE_INTERNAL_H

#include <curl/curl.h>

#include "bigbatch/remote.h"

typedef struct bb_remote_site {
    char base[2048];  /* URL of the tree's root, ending in '/' */
    char shown[2048]; /* the same as the user wrote it (s3://bucket/prefix/), for messages */
    bool s3;          /* an s3:// URL */
    bool signed_s3;   /* requests carry SigV4 */
    char key[128], secret[256], token[4096], region[64];
} bb_remote_site;

/* Resolves `url` (http(s):// as it is; s3:// through `endpoint`, the
 * environment or AWS) and, for s3://, the credentials and region. Fails with
 * BB_ERR_ARG (no host or bucket, a bad endpoint, too long) or
 * BB_ERR_FORMAT (an AWS file that does not parse, naming it and the line). */
bb_status bb_remote_site_init(bb_remote_site *s, const char *url, const char *endpoint);
/* Sets the user agent and, for signed s3://, SigV4 and its headers on
 * `easy`; *headers (NULL when none) lives until the transfer ends. Fails
 * with BB_ERR_NOMEM. */
bb_status bb_remote_site_setup(const bb_remote_site *s, CURL *easy, struct curl_slist **headers);

/* Starts a transfer of `url` on `multi` with what every request carries:
 * the user agent, SigV4 for signed s3://, redirects over http(s) only, a
 * 10 s connect limit, a stall of o->stall_s without a byte ending it;
 * `write` receives the body (its `ctx` is also CURLOPT_PRIVATE); `range`
 * ("a-b", "a-") or NULL. End it with bb_remote_request_end, whatever
 * happened. Fails with BB_ERR_NOMEM, BB_ERR_UNSUPPORTED (signing with an
 * old libcurl), BB_ERR_INTERNAL (libcurl refused the handle). */
bb_status bb_remote_request(const bb_remote_site *s, const bb_remote_options *o, CURLM *multi, const char *url,
                            curl_write_callback write, void *ctx, const char *range, CURL **easy,
                            struct curl_slist **headers);
/* Takes the transfer off `multi` and frees it; accepts one never started. */
void bb_remote_request_end(CURLM *multi, CURL **easy, struct curl_slist **headers);

/* What a server answered: its status and the start of an error's body. */
typedef struct bb_remote_answer {
    long code;
    char body[200];
    size_t body_len;
} bb_remote_answer;
/* Keeps the start of a body that is not data (an error document). */
void bb_remote_answer_keep(bb_remote_answer *a, const char *data, size_t len);
/* One line of what went wrong: libcurl's words, an S3 error's <Code>, or
 * the body's start: "HTTP 403: SignatureDoesNotMatch". */
void bb_remote_answer_describe(const bb_remote_answer *a, CURLcode cc, char *buf, size_t cap);
/* Whether waiting may mend it: resets, time-outs, stalls, HTTP 408, 416,
 * 429 and 5xx. */
bool bb_remote_retryable(CURLcode cc, long code);

/* The retries of one download: exponential backoff with jitter; the
 * deadline counts from the first failure after which no byte past the most
 * ever held had come. */
typedef struct bb_remote_retry {
    int attempts;
    double fail_since; /* 0: no failure pending */
    uint64_t high;     /* the most bytes ever held */
    double next_try;
} bb_remote_retry;
/* A failure of `what` (`why`: describe's line) with `have` bytes held: sets
 * next_try and says so, or fails with BB_ERR_IO ("gave up after N attempts
 * over S s") once the failure has lasted o->deadline_s. */
bb_status bb_remote_retry_after(bb_remote_retry *r, const bb_remote_options *o, uint64_t *seed, uint64_t have,
                                const char *what, const char *why);

/* Writes what a transfer received at `offset` of `fd`, retrying short
 * writes: 0, or the errno (ENOSPC for a write of nothing). */
int bb_remote_pwrite(int fd, const void *data, size_t len, uint64_t offset);

/* snprintf into `out` that fails with BB_ERR_ARG where it would cut. */
__attribute__((format(printf, 3, 4))) bb_status bb_remote_path_of(char *out, size_t cap, const char *fmt, ...);

/* ---- a mirror session (remote.c) --------------------------------------- */

/* A file an index lists: its path under the tree's root (and the mirror's
 * directory), size and hash, and whether the cache holds it already. */
typedef struct bb_remote_file {
    char rel[4096];
    uint64_t bytes, xxh64;
    bool present;
} bb_remote_file;

typedef struct bb_remote_session {
    bb_remote_options o;
    const char *url;
    bb_remote_site *site;
    char cache[4096], dir[4200];  /* the cache, and this URL's mirror in it */
    bb_remote_file *files;
    size_t count, cap;
    char (*indexes)[4096];        /* the index.json.new files to publish */
    size_t index_count;
    int lock;                     /* the cache's (held from begin to end) */
    int dir_lock;                 /* the mirror's: held while a process changes it */
    double started;
} bb_remote_session;

/* Locks the mirror, then the cache, fetches the indexes, finds which files
 * the cache holds and makes room for the rest under the cap. Fails as
 * bb_remote_mirror; call bb_remote_end in every case. */
bb_status bb_remote_begin(bb_remote_session *s, const char *url, const bb_remote_options *o);
/* Downloads the missing files whose `skip` is false (skip NULL: all),
 * whole, checked; counts them into *files and *bytes. */
bb_status bb_remote_fetch_files(bb_remote_session *s, const bool *skip, uint64_t *files, uint64_t *bytes);
/* The present files marked used now (last to be evicted), the new indexes
 * put in place, the mirror marked in use for the process's life. */
bb_status bb_remote_publish(bb_remote_session *s);
/* Unlocks what is still locked (dir_lock unless taken: set it to -1) and
 * frees the session. */
void bb_remote_end(bb_remote_session *s);

#endif /* BIGBATCH_REMOTE_INTERNAL_H */
