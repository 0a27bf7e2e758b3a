/* remote_stream.c — the training split's shards downloaded while the loader
 * reads them: a staging tree of sparse shards, one thread driving libcurl's
 * multi interface over chunks of them in the order readers need them, the
 * chunks a partial shard holds listed for the next run. See remote.h (what)
 * and stream.h (how the loader asks). */
#include "data_index.h"
#include "remote_internal.h"
#include "shard_format.h"
#include "stream.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK_MAX ((uint64_t)1 << 20) /* a shard comes in 64 ranges or more, of 64 KiB to 1 MiB */
#define CHUNK_MIN ((uint64_t)64 << 10)
#define CHUNKS_PER_FILE 64
#define TAIL_BYTES ((uint64_t)64 << 10) /* the first guess at a seek table's size */
#define STAGING ".stream"
#define KEY(file, chunk) ((uint64_t)(file) << 40 | (chunk))
#define KEY_FILE(key) ((uint32_t)((key) >> 40))
#define KEY_CHUNK(key) ((key) & (((uint64_t)1 << 40) - 1))

enum { CHUNK_MISSING, CHUNK_WANTED, CHUNK_FETCHING, CHUNK_HAVE };

typedef struct sfile {
    char *rel, *path, *final;   /* under the tree; in the staging tree; in the mirror */
    uint64_t bytes, xxh64;
    int fd;
    uint64_t chunk_bytes, chunks, have;
    uint8_t *state;             /* CHUNK_* per chunk */
    bool complete;              /* checked and linked into the mirror */
} sfile;

/* One transfer slot: a chunk, or an exact range (metadata) when `exact`. */
typedef struct xfer {
    struct bb_remote_stream *s;
    bool busy, exact;
    uint32_t file;
    uint64_t chunk, start, end, got;
    CURL *easy;
    struct curl_slist *headers;
    bb_remote_answer answer;
    bb_remote_retry retry;
    int write_errno;
    bool oversize;              /* the server sent more than the range */
    char what[4200];
} xfer;

typedef struct queue {
    uint64_t *keys;
    size_t head, len, cap;
} queue;

typedef struct range { uint32_t file; uint64_t start, end; } range;

struct bb_remote_stream {
    bb_remote_options o;
    bb_remote_site site;
    char url[4096], root[4300];
    sfile *files;
    uint32_t count;
    uint32_t *by_path;          /* file indices sorted by path */
    int dir_lock;               /* the mirror's: held until the thread ends (complete or failed) */
    int stage_lock;             /* the staging tree's: held until close */
    CURLM *multi;
    xfer *xfers;
    uint64_t seed;
    pthread_t thread;
    bool started;

    pthread_mutex_t lock;
    pthread_cond_t changed;
    queue demand, hints;        /* chunk keys: awaited, then wanted */
    range *meta;                /* exact ranges to fetch first */
    size_t meta_len, meta_cap, meta_pending;
    uint32_t scan_file;         /* the background's cursor */
    uint64_t scan_chunk;
    uint32_t files_left;
    uint64_t total_bytes, kept_chunks;
    double opened;
    bool metadata_done;         /* chunks may come now, and the thread end once none is left */
    bool closing;
    bb_status error;
    char message[600];
};

/* ---- the registry: bb_dataset_open finds the stream by path ------------ */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static bb_remote_stream_t *registry[8];

bb_remote_stream_t *bb_stream_of(const char *path)
{
    bb_remote_stream_t *found = NULL;
    pthread_mutex_lock(&registry_lock);
    for (size_t i = 0; i < sizeof registry / sizeof *registry && !found; i++) {
        size_t n = registry[i] ? strlen(registry[i]->root) : 0;
        if (n && !strncmp(path, registry[i]->root, n) && (path[n] == '/' || !path[n])) found = registry[i];
    }
    pthread_mutex_unlock(&registry_lock);
    return found;
}

static const bb_remote_stream_t *sort_stream; /* qsort has no context argument: under registry_lock */
static int by_path(const void *a, const void *b)
{
    return strcmp(sort_stream->files[*(const uint32_t *)a].path, sort_stream->files[*(const uint32_t *)b].path);
}

uint32_t bb_stream_file(const bb_remote_stream_t *s, const char *path)
{
    uint32_t lo = 0, hi = s->count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        int c = strcmp(path, s->files[s->by_path[mid]].path);
        if (!c) return s->by_path[mid];
        if (c < 0) hi = mid; else lo = mid + 1;
    }
    return UINT32_MAX;
}

/* ---- queues (under s->lock) --------------------------------------------- */
static bool queue_push(queue *q, uint64_t key)
{
    if (q->head && q->head == q->len) q->head = q->len = 0;
    if (q->len == q->cap) {
        if (q->head > q->cap / 2) { /* half consumed: slide down rather than grow */
            memmove(q->keys, q->keys + q->head, (q->len - q->head) * sizeof *q->keys);
            q->len -= q->head;
            q->head = 0;
        } else {
            size_t cap = q->cap ? 2 * q->cap : 1024;
            uint64_t *grown = realloc(q->keys, cap * sizeof *grown);
            if (!grown) return false; /* the background scan fetches it anyway */
            q->keys = grown;
            q->cap = cap;
        }
    }
    q->keys[q->len++] = key;
    return true;
}

static void set_error(bb_remote_stream_t *s, bb_status rc)
{
    if (s->error == BB_OK) {
        s->error = rc;
        snprintf(s->message, sizeof s->message, "%s", bb_error_message());
    }
    pthread_cond_broadcast(&s->changed);
}

void bb_stream_want(bb_remote_stream_t *s, uint32_t file, uint64_t offset, uint64_t length)
{
    pthread_mutex_lock(&s->lock);
    sfile *f = &s->files[file];
    for (uint64_t c = offset / f->chunk_bytes; length && c <= (offset + length - 1) / f->chunk_bytes; c++)
        if (f->state[c] == CHUNK_MISSING && queue_push(&s->hints, KEY(file, c))) f->state[c] = CHUNK_WANTED;
    pthread_mutex_unlock(&s->lock);
}

bb_status bb_stream_await(bb_remote_stream_t *s, uint32_t file, uint64_t offset, uint64_t length,
                          const _Atomic bool *stop)
{
    sfile *f = &s->files[file];
    uint64_t first = offset / f->chunk_bytes, last = length ? (offset + length - 1) / f->chunk_bytes : first;
    bb_status rc = BB_OK;
    pthread_mutex_lock(&s->lock);
    bool asked = false;
    for (uint64_t c = first; c <= last && !f->complete; c++) {
        while (f->state[c] != CHUNK_HAVE && !f->complete && rc == BB_OK) {
            if (s->error) {
                rc = bb_fail(s->error, "%s", s->message);
            } else if (stop && atomic_load_explicit(stop, memory_order_acquire)) {
                rc = BB_ERR_CLOSED;
            } else if (s->o.interrupted && *s->o.interrupted) { /* Ctrl-C during a long retry */
                rc = bb_fail(BB_ERR_INTERRUPTED, "interrupted while waiting for %s%s", s->site.shown, f->rel);
            } else {
                if (!asked) { /* the whole range jumps the queue at once */
                    for (uint64_t d = c; d <= last; d++)
                        if (f->state[d] < CHUNK_FETCHING) queue_push(&s->demand, KEY(file, d));
                    curl_multi_wakeup(s->multi);
                    asked = true;
                }
                struct timespec until;
                clock_gettime(CLOCK_REALTIME, &until);
                until.tv_nsec += 50 * 1000000L; /* *stop has no signal of its own */
                if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
                pthread_cond_timedwait(&s->changed, &s->lock, &until);
            }
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* ---- transfers (the stream's thread) ------------------------------------ */
static size_t on_data(char *data, size_t size, size_t n, void *arg)
{
    xfer *x = arg;
    size_t len = size * n;
    long code = 0;
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &code);
    if (code != 206) { /* an error document, or a whole file where a range was asked for */
        bb_remote_answer_keep(&x->answer, data, len);
        return code == 200 ? 0 : len;
    }
    if (x->got + len > x->end - x->start) {
        x->oversize = true;
        return 0; /* more than asked: the transfer fails */
    }
    if ((x->write_errno = bb_remote_pwrite(x->s->files[x->file].fd, data, len, x->start + x->got))) return 0;
    x->got += len;
    return len;
}

static bb_status xfer_start(bb_remote_stream_t *s, xfer *x)
{
    sfile *f = &s->files[x->file];
    char url[8192], range[64];
    BB_TRY(bb_remote_path_of(url, sizeof url, "%s%s", s->site.base, f->rel));
    BB_TRY(bb_remote_path_of(x->what, sizeof x->what, "%s%s", s->site.shown, f->rel));
    snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)(x->start + x->got),
             (unsigned long long)(x->end - 1));
    x->answer = (bb_remote_answer){0};
    x->write_errno = 0;
    x->oversize = false;
    return bb_remote_request(&s->site, &s->o, s->multi, url, on_data, x, range, &x->easy, &x->headers);
}

static void xfer_release(bb_remote_stream_t *s, xfer *x) { bb_remote_request_end(s->multi, &x->easy, &x->headers); }

/* A file's last chunk arrived: its hash checked against the index, then
 * linked into the mirror under its own name (the staging name stays the
 * loader's until the stream closes). Outside s->lock: it reads the file. */
static bb_status file_finish(sfile *f, const char *what)
{
    uint64_t bytes, hash;
    if (fdatasync(f->fd) != 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot sync", f->path);
    BB_TRY(bb_index_hash_file(f->path, &bytes, &hash));
    if (bytes != f->bytes || hash != f->xxh64)
        return bb_fail(BB_ERR_CORRUPT, "%s: %llu bytes with XXH64 %016llx where its index says %llu bytes, %016llx "
                       "(the server's file changed while it was read?)", what, (unsigned long long)bytes,
                       (unsigned long long)hash, (unsigned long long)f->bytes, (unsigned long long)f->xxh64);
    if ((unlink(f->final) != 0 && errno != ENOENT) || link(f->path, f->final) != 0)
        return bb_fail_errno(BB_ERR_IO, "%s: cannot put into the mirror", f->final);
    return BB_OK;
}

/* A transfer ended: the chunk (or range) is in, or retried, or the stream fails. */
static bb_status xfer_done(bb_remote_stream_t *s, xfer *x, CURLcode cc)
{
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->answer.code);
    xfer_release(s, x);
    sfile *f = &s->files[x->file];
    if (cc == CURLE_OK && x->answer.code == 206 && x->got == x->end - x->start) {
        bool finished = false;
        pthread_mutex_lock(&s->lock);
        if (x->exact) {
            s->meta_pending--;
        } else {
            f->state[x->chunk] = CHUNK_HAVE;
            finished = ++f->have == f->chunks;
        }
        x->busy = false;
        pthread_cond_broadcast(&s->changed);
        pthread_mutex_unlock(&s->lock);
        if (!finished) return BB_OK;
        BB_TRY(file_finish(f, x->what));
        pthread_mutex_lock(&s->lock);
        f->complete = true;
        s->files_left--;
        pthread_cond_broadcast(&s->changed);
        pthread_mutex_unlock(&s->lock);
        return BB_OK;
    }
    if (x->write_errno) return bb_fail(BB_ERR_IO, "%s: cannot write: %s", f->path, strerror(x->write_errno));
    if (x->answer.code == 200)
        return bb_fail(BB_ERR_IO, "%s: the server answered a range request with the whole file: it cannot be "
                       "streamed (--wait-for-data downloads whole files first)", x->what);
    if (x->oversize || x->answer.code == 416 || (cc == CURLE_OK && x->answer.code == 206))
        return bb_fail(BB_ERR_CORRUPT, "%s: bytes %llu-%llu: the server's file %s: the index is stale (`bigbatch "
                       "pack --index DIR` writes it again)", x->what, (unsigned long long)x->start,
                       (unsigned long long)(x->end - 1), x->oversize ? "sent more" : "ends before them");
    char why[256];
    bb_remote_answer_describe(&x->answer, cc, why, sizeof why);
    if (!bb_remote_retryable(cc, x->answer.code))
        return bb_fail(BB_ERR_IO, "%s: %s%s", x->what, why, x->answer.code == 403 && s->site.s3 && !s->site.signed_s3
                       ? " (sent unsigned: no AWS credentials in the environment or ~/.aws)" : "");
    return bb_remote_retry_after(&x->retry, &s->o, &s->seed, x->got, x->what, why);
}

/* The next thing to fetch for a free slot: a metadata range, a chunk a
 * reader waits for, one the loader will read, the first one missing. */
static bool pick(bb_remote_stream_t *s, xfer *x)
{
    *x = (xfer){.s = s, .busy = true};
    if (s->meta_len) {
        range r = s->meta[--s->meta_len];
        x->exact = true, x->file = r.file, x->start = r.start, x->end = r.end;
        return true;
    }
    if (!s->metadata_done) { /* every shard's metadata first: training starts on it */
        x->busy = false;
        return false;
    }
    uint64_t key = UINT64_MAX;
    for (queue *q = &s->demand; key == UINT64_MAX && q; q = q == &s->demand ? &s->hints : NULL)
        while (q->head < q->len && key == UINT64_MAX) {
            uint64_t k = q->keys[q->head++];
            if (s->files[KEY_FILE(k)].state[KEY_CHUNK(k)] < CHUNK_FETCHING) key = k;
        }
    for (; key == UINT64_MAX && s->scan_file < s->count; s->scan_chunk = 0, s->scan_file++) {
        sfile *f = &s->files[s->scan_file];
        while (s->scan_chunk < f->chunks && f->state[s->scan_chunk] >= CHUNK_FETCHING) s->scan_chunk++;
        if (s->scan_chunk < f->chunks) {
            key = KEY(s->scan_file, s->scan_chunk);
            break;
        }
    }
    if (key == UINT64_MAX) {
        x->busy = false;
        return false;
    }
    sfile *f = &s->files[KEY_FILE(key)];
    x->file = KEY_FILE(key), x->chunk = KEY_CHUNK(key);
    x->start = x->chunk * f->chunk_bytes;
    x->end = x->start + f->chunk_bytes < f->bytes ? x->start + f->chunk_bytes : f->bytes;
    f->state[x->chunk] = CHUNK_FETCHING;
    return true;
}

static void *stream_main(void *arg)
{
    bb_remote_stream_t *s = arg;
    bb_status rc = BB_OK;
    int parallel = s->o.parallel;
    while (rc == BB_OK) {
        double now = bb_clock_seconds(), wake = now + 0.2;
        pthread_mutex_lock(&s->lock);
        bool closing = s->closing, idle = s->files_left == 0 && s->metadata_done;
        for (int i = 0; i < parallel && !closing; i++)
            if (!s->xfers[i].busy) pick(s, &s->xfers[i]);
        pthread_mutex_unlock(&s->lock);
        if (closing || idle) break;
        for (int i = 0; rc == BB_OK && i < parallel; i++) {
            xfer *x = &s->xfers[i];
            if (!x->busy || x->easy) continue;
            if (x->retry.next_try > now) {
                if (x->retry.next_try < wake) wake = x->retry.next_try;
                continue;
            }
            rc = xfer_start(s, x);
        }
        int running;
        curl_multi_perform(s->multi, &running);
        CURLMsg *m;
        int left;
        bool ended = false; /* a slot may be free: fill it before sleeping */
        while (rc == BB_OK && (m = curl_multi_info_read(s->multi, &left))) {
            if (m->msg != CURLMSG_DONE) continue;
            xfer *x;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
            rc = xfer_done(s, x, m->data.result);
            ended = true;
        }
        int wait_ms = (int)((wake - bb_clock_seconds()) * 1000);
        if (rc == BB_OK && !ended)
            curl_multi_poll(s->multi, NULL, 0, wait_ms < 1 ? 1 : wait_ms > 200 ? 200 : wait_ms, NULL);
    }
    for (int i = 0; i < parallel; i++) xfer_release(s, &s->xfers[i]);
    pthread_mutex_lock(&s->lock);
    if (rc != BB_OK) set_error(s, rc);
    if (!s->files_left) {
        char a[16];
        BB_INFO("%s: the %u streamed shards are complete (%s in %.2f s)", s->url, s->count,
                bb_format_bytes(s->total_bytes, a, sizeof a), bb_clock_seconds() - s->opened);
    }
    if (s->dir_lock >= 0) { /* complete or failed: other processes may fill the mirror (not the staging tree) */
        close(s->dir_lock);
        s->dir_lock = -1;
    }
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* ---- open and close ----------------------------------------------------- */

/* A partial shard's chunks survive its run in PATH.have: a header (magic,
 * the index's size and hash, the chunk size and count, little-endian
 * 64-bit) and one byte per chunk, 1 where it is on disk. Written at close,
 * after the shard's data is synced: a crash later leaves a list of chunks
 * that are all there (perhaps not every one that is). */
#define HAVE_MAGIC 0x3176616862626262ull /* "bbbbhav1" */
#define HAVE_HEADER 40

static void have_path(const sfile *f, char *out, size_t cap) { snprintf(out, cap, "%s.have", f->path); }

static void save_have(const sfile *f)
{
    char path[4300], tmp[4400];
    have_path(f, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    uint8_t header[HAVE_HEADER];
    uint64_t fields[5] = {HAVE_MAGIC, f->bytes, f->xxh64, f->chunk_bytes, f->chunks};
    for (int i = 0; i < 5; i++) bb_put_le64(header + 8 * i, fields[i]);
    uint8_t *bits = malloc(f->chunks ? f->chunks : 1);
    int fd = bits && fdatasync(f->fd) == 0 ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
    for (uint64_t c = 0; bits && c < f->chunks; c++) bits[c] = f->state[c] == CHUNK_HAVE;
    bool ok = fd >= 0 && bb_write_all(fd, tmp, header, sizeof header, -1) == BB_OK &&
              bb_write_all(fd, tmp, bits, f->chunks, -1) == BB_OK && fdatasync(fd) == 0;
    if (fd >= 0) close(fd);
    ok = ok && rename(tmp, path) == 0;
    if (!ok) unlink(tmp), unlink(path); /* the next run fetches the shard again */
    free(bits);
}

/* The chunks an earlier run left of f (its staging file kept), into
 * f->state; nothing when the list is absent or of another file. */
static void load_have(sfile *f)
{
    char path[4300];
    have_path(f, path, sizeof path);
    struct stat st;
    uint8_t header[HAVE_HEADER];
    int fd = stat(f->path, &st) == 0 && (uint64_t)st.st_size == f->bytes ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    bool ok = fd >= 0 && bb_pread_all(fd, path, header, sizeof header, 0) == BB_OK;
    uint64_t want[5] = {HAVE_MAGIC, f->bytes, f->xxh64, f->chunk_bytes, f->chunks};
    for (int i = 0; ok && i < 5; i++) ok = bb_le64(header + 8 * i) == want[i];
    ok = ok && bb_pread_all(fd, path, f->state, f->chunks, HAVE_HEADER) == BB_OK;
    if (fd >= 0) close(fd);
    if (!ok) unlink(path); /* of another file, or of a version of this one gone */
    bb_error_clear();
    f->have = 0;
    for (uint64_t c = 0; c < f->chunks; c++) {
        f->state[c] = ok && f->state[c] == 1 ? CHUNK_HAVE : CHUNK_MISSING;
        f->have += f->state[c] == CHUNK_HAVE;
    }
}

/* What stays in the staging tree (nftw has no context argument: under
 * registry_lock; the staging tree's own lock keeps other processes out). */
static const bb_remote_stream_t *sweeping;

static int sweep_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)ftw;
    if (flag == FTW_DP) {
        rmdir(path); /* fails while something is kept inside */
        return 0;
    }
    char base[4300];
    snprintf(base, sizeof base, "%s", path);
    size_t n = strlen(base);
    if (n > 5 && !strcmp(base + n - 5, ".have")) base[n - 5] = 0;
    uint32_t i = bb_stream_file(sweeping, base);
    /* a hard link shares its inode with the mirror's file: never written through, only unlinked */
    if (i == UINT32_MAX || sweeping->files[i].complete || flag != FTW_F || st->st_nlink != 1) unlink(path);
    return 0;
}

/* Empties the staging tree but for the partial shards of s (and their
 * chunk lists). */
static void sweep(const bb_remote_stream_t *s)
{
    pthread_mutex_lock(&registry_lock);
    sweeping = s;
    nftw(s->root, sweep_entry, 16, FTW_DEPTH | FTW_PHYS);
    sweeping = NULL;
    pthread_mutex_unlock(&registry_lock);
}

/* Fetches exact ranges of files (under s->lock's discipline) and waits. */
static bb_status fetch_ranges(bb_remote_stream_t *s, const range *ranges, size_t n)
{
    pthread_mutex_lock(&s->lock);
    if (s->meta_cap < n) {
        range *grown = realloc(s->meta, n * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&s->lock);
            return bb_fail(BB_ERR_NOMEM, "out of memory");
        }
        s->meta = grown, s->meta_cap = n;
    }
    memcpy(s->meta, ranges, n * sizeof *ranges);
    s->meta_len = s->meta_pending = n;
    curl_multi_wakeup(s->multi);
    bb_status rc = BB_OK;
    while (s->meta_pending && !s->error) {
        if (s->o.interrupted && *s->o.interrupted) {
            rc = bb_fail(BB_ERR_INTERRUPTED, "interrupted while reading the shards' metadata of %s", s->url);
            break;
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec++;
        pthread_cond_timedwait(&s->changed, &s->lock, &until);
    }
    if (rc == BB_OK && s->error) rc = bb_fail(s->error, "%s", s->message);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* Every streamed shard's metadata frame and seek table, so that it opens:
 * the head and the last 64 KiB, then the rest of a larger table. */
static bb_status fetch_metadata(bb_remote_stream_t *s)
{
    range *r = malloc(2 * (size_t)s->count * sizeof *r);
    if (!r) return bb_fail(BB_ERR_NOMEM, "out of memory");
    size_t n = 0;
    for (uint32_t i = 0; i < s->count; i++) {
        uint64_t bytes = s->files[i].bytes, tail = bytes < TAIL_BYTES ? bytes : TAIL_BYTES;
        if (s->files[i].complete) continue;
        r[n++] = (range){i, 0, bytes < BB_SHARD_META_FRAME_SIZE ? bytes : BB_SHARD_META_FRAME_SIZE};
        r[n++] = (range){i, bytes - tail, bytes};
    }
    bb_status rc = fetch_ranges(s, r, n);
    n = 0;
    for (uint32_t i = 0; rc == BB_OK && i < s->count; i++) {
        uint8_t footer[BB_SHARD_FOOTER_SIZE];
        uint64_t bytes = s->files[i].bytes;
        if (s->files[i].complete || bytes <= TAIL_BYTES) continue; /* all of it is there */
        rc = bb_pread_all(s->files[i].fd, s->files[i].path, footer, sizeof footer, bytes - sizeof footer);
        uint32_t entries = bb_le32(footer) < BB_SHARD_MAX_FRAMES ? bb_le32(footer) : 0; /* else open says */
        uint64_t table = 8 + (uint64_t)entries * BB_SHARD_ENTRY_SIZE + BB_SHARD_FOOTER_SIZE;
        if (table > TAIL_BYTES) r[n++] = (range){i, table < bytes ? bytes - table : 0, bytes - TAIL_BYTES};
    }
    if (rc == BB_OK && n) rc = fetch_ranges(s, r, n);
    free(r);
    pthread_mutex_lock(&s->lock);
    s->metadata_done = true;
    curl_multi_wakeup(s->multi);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* The staging tree: the cache's files linked, the streamed ones sparse. */
static bb_status stage(bb_remote_stream_t *s, const bb_remote_session *m, const bool *streamed)
{
    for (size_t i = 0; i < m->count; i++) { /* the streamed shards */
        const bb_remote_file *e = &m->files[i];
        if (!streamed[i]) continue;
        sfile *f = &s->files[s->count++];
        f->fd = -1;
        char path[8192], final[8192];
        BB_TRY(bb_remote_path_of(path, sizeof path, "%s/%s", s->root, e->rel));
        BB_TRY(bb_remote_path_of(final, sizeof final, "%s/%s", m->dir, e->rel));
        if (!(f->rel = strdup(e->rel)) || !(f->path = strdup(path)) || !(f->final = strdup(final)))
            return bb_fail(BB_ERR_NOMEM, "out of memory");
        f->bytes = e->bytes, f->xxh64 = e->xxh64;
        s->total_bytes += f->bytes;
        uint64_t chunk = f->bytes / CHUNKS_PER_FILE;
        f->chunk_bytes = chunk < CHUNK_MIN ? CHUNK_MIN : chunk > CHUNK_MAX ? CHUNK_MAX : chunk;
        f->chunks = (f->bytes + f->chunk_bytes - 1) / f->chunk_bytes;
        if (!(f->state = calloc(f->chunks ? f->chunks : 1, 1))) return bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    s->by_path = malloc((s->count ? s->count : 1) * sizeof *s->by_path);
    if (!s->by_path) return bb_fail(BB_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; i < s->count; i++) s->by_path[i] = i;
    pthread_mutex_lock(&registry_lock);
    sort_stream = s;
    qsort(s->by_path, s->count, sizeof *s->by_path, by_path);
    pthread_mutex_unlock(&registry_lock);
    sweep(s); /* what an earlier run left, but for the partial shards it streamed */
    s->files_left = s->count;
    for (uint32_t i = 0; i < s->count; i++) {
        sfile *f = &s->files[i];
        BB_TRY(bb_make_parents(f->path, NULL));
        load_have(f);
        f->fd = open(f->path, O_RDWR | O_CREAT | (f->have ? 0 : O_TRUNC) | O_CLOEXEC, 0644);
        if (f->fd < 0 || ftruncate(f->fd, (off_t)f->bytes) != 0)
            return bb_fail_errno(BB_ERR_IO, "%s: cannot create", f->path);
        if (f->have == f->chunks) { /* every chunk came; the check did not: check it now */
            char what[4200];
            snprintf(what, sizeof what, "%s%s", s->site.shown, f->rel);
            if (file_finish(f, what) == BB_OK) {
                f->complete = true;
                s->files_left--;
                continue;
            }
            bb_error_clear();
            f->have = 0;
            memset(f->state, CHUNK_MISSING, f->chunks);
        }
        s->kept_chunks += f->have;
    }
    for (size_t i = 0; i < m->count; i++) { /* the cache's files, linked */
        char path[8192], final[8192];
        if (streamed[i]) continue;
        BB_TRY(bb_remote_path_of(path, sizeof path, "%s/%s", s->root, m->files[i].rel));
        BB_TRY(bb_remote_path_of(final, sizeof final, "%s/%s", m->dir, m->files[i].rel));
        BB_TRY(bb_make_parents(path, NULL));
        if ((unlink(path) != 0 && errno != ENOENT) || (link(final, path) != 0 && symlink(final, path) != 0))
            return bb_fail_errno(BB_ERR_IO, "%s: cannot link into %s", final, s->root);
    }
    return BB_OK;
}

/* Whether e is one of the training split's shards (train/'s when the tree
 * has a train/ split, else the tree's own) that the cache lacks. */
static bool is_streamed(const bb_remote_file *e, bool split)
{
    const char *name = split ? (strncmp(e->rel, "train/", 6) ? NULL : e->rel + 6) : e->rel;
    return !e->present && name && !strchr(name, '/') && bb_shard_is_file_name(name);
}

static bb_status start(bb_remote_stream_t *s, bb_remote_session *m, const bool *streamed)
{
    s->site = *m->site;
    snprintf(s->url, sizeof s->url, "%s", m->url);
    BB_TRY(bb_remote_path_of(s->root, sizeof s->root, "%s/%s", m->dir, STAGING));
    s->seed = (uint64_t)getpid() ^ bb_clock_ns();
    s->opened = bb_clock_seconds();
    s->files = calloc(m->count, sizeof *s->files);
    s->xfers = calloc((size_t)s->o.parallel, sizeof *s->xfers);
    if (!s->files || !s->xfers || !(s->multi = curl_multi_init())) return bb_fail(BB_ERR_NOMEM, "out of memory");
    BB_TRY(stage(s, m, streamed));
    int err = pthread_create(&s->thread, NULL, stream_main, s);
    if (err) return bb_fail(BB_ERR_INTERNAL, "cannot start the download thread: %s", strerror(err));
    s->started = true;
    BB_TRY(fetch_metadata(s));
    pthread_mutex_lock(&registry_lock);
    bb_status rc = bb_fail(BB_ERR_UNSUPPORTED, "more than %zu remote datasets streamed at once",
                           sizeof registry / sizeof *registry);
    for (size_t i = 0; i < sizeof registry / sizeof *registry && rc != BB_OK; i++)
        if (!registry[i]) registry[i] = s, rc = BB_OK, bb_error_clear();
    pthread_mutex_unlock(&registry_lock);
    return rc;
}

bb_status bb_remote_stream_open(const char *url, const bb_remote_options *opts, char *local, size_t cap,
                                bb_remote_stream_t **out)
{
    *out = NULL;
    bb_remote_session m;
    bb_remote_stream_t *s = NULL;
    bool *streamed = NULL;
    uint64_t files = 0, bytes = 0, stream_bytes = 0, stream_files = 0;
    int stage_lock = -1;
    bb_status rc = bb_remote_begin(&m, url, opts);
    if (rc == BB_OK && !(streamed = calloc(m.count ? m.count : 1, sizeof *streamed)))
        rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    bool split = false; /* the tree has a train/ split */
    for (size_t i = 0; i < m.count && !split; i++) split = !strncmp(m.files[i].rel, "train/", 6);
    for (size_t i = 0; rc == BB_OK && i < m.count; i++)
        if ((streamed[i] = is_streamed(&m.files[i], split))) stream_bytes += m.files[i].bytes, stream_files++;
    if (rc == BB_OK && stream_files) { /* the staging tree is one process's until it exits */
        char path[4300];
        rc = bb_remote_path_of(path, sizeof path, "%s/%s.lock", m.dir, STAGING);
        if (rc == BB_OK && (stage_lock = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0)
            rc = bb_fail_errno(BB_ERR_IO, "%s: cannot open", path);
        if (rc == BB_OK && flock(stage_lock, LOCK_EX | LOCK_NB) != 0) {
            BB_INFO("%s: another process reads %s/%s: downloading whole shards instead", url, m.dir, STAGING);
            memset(streamed, 0, m.count * sizeof *streamed);
            stream_files = stream_bytes = 0;
        }
    }
    for (size_t i = 0; rc == BB_OK && i < m.count; i++) { /* what the published index would vouch for */
        char path[8192];
        if (!streamed[i]) continue;
        rc = bb_remote_path_of(path, sizeof path, "%s/%s.part", m.dir, m.files[i].rel);
        if (rc == BB_OK) unlink(path), path[strlen(path) - 5] = 0, unlink(path);
    }
    if (rc == BB_OK) rc = bb_remote_fetch_files(&m, streamed, &files, &bytes);
    if (rc == BB_OK) rc = bb_remote_publish(&m);
    if (rc == BB_OK && stream_files) {
        if (!(s = calloc(1, sizeof *s))) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
        if (rc == BB_OK) {
            pthread_mutex_init(&s->lock, NULL);
            pthread_cond_init(&s->changed, NULL);
            s->o = *opts, s->o.stats = NULL;
            s->stage_lock = -1;
            s->dir_lock = m.dir_lock; /* held until the shards are complete */
            m.dir_lock = -1;
            s->stage_lock = stage_lock; /* until close */
            stage_lock = -1;
            rc = start(s, &m, streamed);
        }
        char a[16];
        if (rc == BB_OK)
            BB_INFO("%s: streaming %llu shards, %s, while training reads them (%llu chunks kept from a run before)",
                    url, (unsigned long long)stream_files, bb_format_bytes(stream_bytes, a, sizeof a),
                    (unsigned long long)s->kept_chunks);
    }
    if (rc == BB_OK && snprintf(local, cap, "%s", s ? s->root : m.dir) >= (int)cap)
        rc = bb_fail(BB_ERR_ARG, "cache path too long");
    if (rc == BB_OK && opts->stats)
        *opts->stats = (bb_remote_stats){.files = files + stream_files, .bytes = bytes + stream_bytes,
                                         .seconds = bb_clock_seconds() - m.started};
    bb_remote_end(&m);
    free(streamed);
    if (stage_lock >= 0) close(stage_lock);
    if (rc != BB_OK) {
        char message[600]; /* close may say more: the first failure is the one to report */
        snprintf(message, sizeof message, "%s", bb_error_message());
        bb_remote_stream_close(s);
        return bb_fail(rc, "%s", message);
    }
    *out = s;
    return BB_OK;
}

void bb_remote_stream_close(bb_remote_stream_t *s)
{
    if (!s) return;
    pthread_mutex_lock(&registry_lock);
    for (size_t i = 0; i < sizeof registry / sizeof *registry; i++)
        if (registry[i] == s) registry[i] = NULL;
    pthread_mutex_unlock(&registry_lock);
    if (s->started) {
        pthread_mutex_lock(&s->lock);
        s->closing = true;
        curl_multi_wakeup(s->multi);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->thread, NULL);
    }
    uint64_t chunks = 0, have = 0;
    for (uint32_t i = 0; i < s->count; i++) {
        sfile *f = &s->files[i];
        if (f->complete || f->fd < 0) continue;
        chunks += f->chunks, have += f->have;
        if (f->have) save_have(f);
    }
    if (s->files_left && s->count)
        BB_INFO("%s: %u of %u streamed shards incomplete (%llu of %llu chunks kept for the next run)", s->url,
                s->files_left, s->count, (unsigned long long)have, (unsigned long long)chunks);
    if (s->root[0] && s->by_path) sweep(s); /* the links go; the partial shards stay */
    for (uint32_t i = 0; i < s->count; i++) {
        sfile *f = &s->files[i];
        if (f->fd >= 0) close(f->fd);
        free(f->rel), free(f->path), free(f->final), free(f->state);
    }
    if (s->multi) curl_multi_cleanup(s->multi);
    if (s->dir_lock >= 0) close(s->dir_lock);
    if (s->stage_lock >= 0) close(s->stage_lock);
    free(s->files), free(s->xfers), free(s->by_path), free(s->meta);
    free(s->demand.keys), free(s->hints.keys);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->changed);
    free(s);
}
