/* remote.h — datasets in object storage or behind HTTP(S): `--data
 * s3://bucket/prefix/` or `--data https://host/path/`, mirrored shard by
 * shard into a local cache, then read as local data (the same order, the
 * same identity, the same bits).
 *
 *   bb_remote_options ro = bb_remote_defaults();
 *   ro.endpoint = "http://127.0.0.1:9000";            // an S3-compatible store
 *   char local[4096];
 *   BB_TRY(bb_remote_mirror("s3://datasets/kjv", &ro, local, sizeof local));
 *   BB_TRY(bb_dataset_open(local, &ds));               // or train's --data
 *
 * What is fetched is listed by `index.json` files, which `bigbatch pack`
 * writes into every directory it makes (`bb_index_write`; `bigbatch pack
 * --index DIR` for an older tree): the regular files of the directory with
 * their sizes and XXH64, and its subdirectories (train/, val/) that have an
 * index of their own. An object store needs no listing call, a plain web
 * server (nginx) no directory listing, and every file is checked when it
 * arrives.
 *
 * The cache (--cache-dir, default $XDG_CACHE_HOME/bigbatch or
 * ~/.cache/bigbatch) holds one directory per URL. A file already there whose
 * size and hash the index still gives is used as it is; others are
 * downloaded with libcurl's multi interface (several at once), into
 * NAME.part, resumed with a range request after a failure, checked
 * (size, XXH64), then renamed into place. Connection resets, time-outs,
 * stalls and HTTP 408/429/5xx are retried with exponential backoff until a
 * failure has lasted the deadline; then, or at once for other HTTP errors
 * (403, 404), one line names the URL and what the server said. A file the
 * server finished short of (or past) its index's size fails at once: the
 * index is stale. With a size cap (--cache-limit) whole shards of other
 * mirrors are evicted, least recently used first, but never those of a
 * mirror a living process uses (each holds a shared lock on the mirror's
 * .inuse until it exits) and nothing that is not a mirror directory
 * (NAME-<16 hex digits>); a dataset larger than the cap is refused. One
 * lock file serializes processes sharing a cache (the ranks of one node):
 * the first downloads, the others find the files. Files the index no
 * longer lists leave the mirror.
 *
 * bb_remote_stream_open mirrors as bb_remote_mirror does, except for the
 * shards of the training split (train/ when the tree has one, else the
 * tree's own) that the cache lacks: those are streamed. Training starts as
 * soon as their metadata and seek tables have arrived (two small range
 * requests per shard); a thread downloads the rest in chunks (a 64th of
 * the shard, 64 KiB to 1 MiB), 4 at once (parallel), the
 * chunks the loader waits for first, then the frames of the epoch's order
 * in that order, then everything else, and each shard, once complete and
 * checked against its index, joins the mirror. The dataset to open lies in
 * a staging tree beside the mirror (MIRROR/.stream); the loader reads a
 * frame once its bytes are there, so the order, the identity and the bits
 * are those of local data. A process filling a mirror locks it: another
 * process wanting the same URL waits until the shards are complete (or
 * the stream failed); the staging tree stays one process's until it
 * exits, and another that still needs shards then downloads them whole.
 * A run that ends first keeps its partial shards' chunks for the next. A
 * stream's error (a download past the deadline, an HTTP error, a shard
 * whose hash differs from its index) reaches the loader thread that waits
 * for its bytes; Ctrl-C ends such a wait.
 *
 * s3:// URLs are signed with AWS Signature Version 4 (libcurl's
 * CURLOPT_AWS_SIGV4) from the standard variables and files:
 * AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE,
 * AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials), AWS_CONFIG_FILE
 * (~/.aws/config), AWS_REGION / AWS_DEFAULT_REGION (else us-east-1), and the
 * endpoint from --data-endpoint, AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL
 * (path-style requests: ENDPOINT/bucket/key), else AWS's virtual-hosted
 * https://bucket.s3.REGION.amazonaws.com/key. Without credentials requests
 * go unsigned (a public bucket). */
#ifndef BIGBATCH_REMOTE_H
#define BIGBATCH_REMOTE_H

#include <signal.h>

#include "bigbatch/core.h"

#define BB_INDEX_FILE "index.json"

typedef struct bb_remote_stats {
    uint64_t files, bytes;   /* downloaded by this call (0 when the cache had everything) */
    double seconds;          /* the whole call: indexes, downloads, checks */
} bb_remote_stats;

typedef struct bb_remote_options {
    const char *cache_dir;   /* NULL: $XDG_CACHE_HOME/bigbatch, else $HOME/.cache/bigbatch */
    uint64_t cache_bytes;    /* cap on the cache's shards; 0: none */
    const char *endpoint;    /* s3://: base URL of an S3-compatible store; NULL: the environment's, else AWS */
    double deadline_s;       /* a failure that lasts this long ends the download (default 300) */
    double stall_s;          /* a transfer that moves no byte this long is retried (default 30) */
    int parallel;            /* files downloaded at once (default 4) */
    const volatile sig_atomic_t *interrupted; /* optional: nonzero stops with BB_ERR_INTERRUPTED */
    bb_remote_stats *stats;  /* optional: filled by a successful mirror */
} bb_remote_options;

bb_remote_options bb_remote_defaults(void);

/* True for "s3://", "http://" and "https://" paths. Never fails. */
bool bb_remote_is_url(const char *path);

/* Mirrors the tree at `url` (a dataset directory, or one with train/ and
 * val/ inside, each listed by its index.json) into the cache, marks it in
 * use for the rest of the process's life, and writes the local directory's
 * path to `local` (cap bytes). Fails with BB_ERR_ARG (a malformed URL or
 * options), BB_ERR_IO (a download that failed past the deadline or with an
 * HTTP error, naming the URL; the cache unwritable; no room under the
 * cache's cap), BB_ERR_CORRUPT (a file whose size or hash differs from its
 * index), BB_ERR_FORMAT (an index that is not one, an AWS file that does
 * not parse), BB_ERR_UNSUPPORTED (signing with a libcurl older than 7.87),
 * BB_ERR_INTERRUPTED, BB_ERR_NOMEM, BB_ERR_INTERNAL (libcurl refused a
 * handle); files already complete stay in the cache and partial ones resume
 * on the next call. */
bb_status bb_remote_mirror(const char *url, const bb_remote_options *opts, char *local, size_t cap);

typedef struct bb_remote_stream bb_remote_stream_t;

/* As bb_remote_mirror, streaming the training split's missing shards (see
 * above): `local` receives the directory to open (the staging tree, or the
 * mirror when nothing needed streaming, *out then NULL). Fails as
 * bb_remote_mirror, before any shard byte past the metadata has come; a
 * failure while streaming reaches the reader (bb_dataset_await_frame). */
bb_status bb_remote_stream_open(const char *url, const bb_remote_options *opts, char *local, size_t cap,
                                bb_remote_stream_t **out);
/* Stops the downloads (what is complete stays in the mirror; a partial
 * shard stays in the staging tree with the list of its chunks, for the
 * next stream of the URL), empties the rest of the staging tree and
 * unlocks it. Every dataset opened in it must be closed first. Accepts
 * NULL. */
void bb_remote_stream_close(bb_remote_stream_t *s);

/* Writes DIR/index.json (through a temporary, renamed into place) listing
 * DIR's regular files (hidden ones and index.json apart) and, first, the
 * subdirectories given an index by the same call: with `recursive`, every
 * subdirectory that holds shards or such a subdirectory. Fails with
 * BB_ERR_IO naming the file or directory, BB_ERR_FORMAT when DIR holds
 * neither shards nor such subdirectories. */
bb_status bb_index_write(const char *dir, bool recursive);

#endif /* BIGBATCH_REMOTE_H */
