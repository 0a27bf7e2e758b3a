/* remote.c — mirroring a remote dataset into the local cache: the indexes,
 * the files they list (libcurl multi, resumed, retried, checked), the
 * cache's lock and its size cap. See remote.h. */
#include "data_index.h"
#include "remote_internal.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "bigbatch/shard.h"

#define INDEX_MAX_BYTES (16u << 20) /* an index larger than this is not one */
#define MAX_DEPTH 2                 /* DIR/index.json lists train/, val/; theirs list files */

bb_remote_options bb_remote_defaults(void)
{
    return (bb_remote_options){.deadline_s = 300, .stall_s = 30, .parallel = 4};
}

/* snprintf that fails, naming the start of the path, where it would cut. */
__attribute__((format(printf, 3, 4))) static bb_status path_of(char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap) return bb_fail(BB_ERR_ARG, "%.80s...: path or URL too long", out);
    return BB_OK;
}

/* ---- transfers ----------------------------------------------------------- */

typedef struct job {
    char url[4096], dest[4096], part[4200];
    char what[4200];       /* the URL as the user gave it (s3://bucket/key), for messages */
    uint64_t bytes;        /* expected size; UINT64_MAX: unknown (an index) */
    uint64_t xxh64;        /* checked when `verify` */
    bool verify;
    int fd;
    uint64_t have;         /* bytes in the .part file */
    CURL *easy;
    struct curl_slist *headers;
    int attempts, bad_hashes;
    uint64_t high;         /* the most bytes the .part ever held: progress is passing it */
    uint64_t received;     /* body bytes of this attempt */
    bool resumed;          /* this attempt asked for the bytes past `have` */
    bool done;
    double fail_since;     /* when the current run of failures began; 0: none */
    double next_try;
    long code;
    char body[200];        /* the start of an error response */
    size_t body_len;
    bool oversize;         /* the server sent more than `bytes` */
    bool complete;         /* the .part held every byte before a transfer started */
    int write_errno;       /* the .part file could not be written */
} job;

typedef struct fetcher {
    const bb_remote_options *o;
    const bb_remote_site *site;
    CURLM *multi;
    uint64_t seed;         /* backoff jitter */
} fetcher;

static size_t on_data(char *data, size_t size, size_t n, void *arg)
{
    job *j = arg;
    size_t len = size * n;
    long code = 0;
    curl_easy_getinfo(j->easy, CURLINFO_RESPONSE_CODE, &code);
    if (code != 200 && code != 206) { /* keep the start of what the server said */
        size_t room = sizeof j->body - 1 - j->body_len, take = len < room ? len : room;
        memcpy(j->body + j->body_len, data, take);
        j->body_len += take;
        j->body[j->body_len] = 0;
        return len;
    }
    if (code == 200 && j->resumed) { /* asked for the rest, sent the whole file: start over */
        if (ftruncate(j->fd, 0) != 0) {
            j->write_errno = errno;
            return 0;
        }
        j->have = 0;
        j->resumed = false;
    }
    uint64_t limit = j->bytes == UINT64_MAX ? INDEX_MAX_BYTES : j->bytes;
    if (j->have + len > limit) {
        j->oversize = true;
        return 0; /* aborts the transfer */
    }
    for (size_t off = 0; off < len;) {
        ssize_t w = pwrite(j->fd, data + off, len - off, (off_t)(j->have + off));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            j->write_errno = w < 0 ? errno : ENOSPC;
            return 0;
        }
        off += (size_t)w;
    }
    j->have += len;
    j->received += len;
    return len;
}

/* A download of `rel` (a path under the tree's root) into `dest`. */
static bb_status job_init(job *j, const bb_remote_site *site, const char *rel, const char *dest, uint64_t bytes,
                          uint64_t xxh64, bool verify)
{
    *j = (job){.bytes = bytes, .xxh64 = xxh64, .verify = verify, .fd = -1};
    BB_TRY(path_of(j->url, sizeof j->url, "%s%s", site->base, rel));
    BB_TRY(path_of(j->what, sizeof j->what, "%s%s", site->shown, rel));
    BB_TRY(path_of(j->dest, sizeof j->dest, "%s", dest));
    return path_of(j->part, sizeof j->part, "%s.part", dest);
}

static bb_status job_start(fetcher *f, job *j)
{
    if (j->fd < 0) {
        j->fd = open(j->part, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (j->fd < 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot create", j->part);
    }
    struct stat st;
    if (fstat(j->fd, &st) != 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot stat", j->part);
    j->have = (uint64_t)st.st_size;
    if (j->bytes != UINT64_MAX && j->have == j->bytes) { /* an earlier run got it all: checked, not fetched */
        j->complete = true;
        return BB_OK;
    }
    if (j->bytes == UINT64_MAX || j->have > j->bytes) { /* an index is small: fetched whole */
        if (ftruncate(j->fd, 0) != 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot truncate", j->part);
        j->have = 0;
    }
    j->received = 0;
    j->oversize = false;
    j->write_errno = 0;
    j->code = 0;
    j->body_len = 0;
    j->body[0] = 0;
    if (!(j->easy = curl_easy_init())) return bb_fail(BB_ERR_NOMEM, "%s: cannot start a transfer", j->what);
    curl_easy_setopt(j->easy, CURLOPT_URL, j->url);
    curl_easy_setopt(j->easy, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(j->easy, CURLOPT_WRITEDATA, j);
    curl_easy_setopt(j->easy, CURLOPT_PRIVATE, j);
    curl_easy_setopt(j->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(j->easy, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(j->easy, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(j->easy, CURLOPT_LOW_SPEED_LIMIT, 1L); /* a stall: no byte for stall_s */
    curl_easy_setopt(j->easy, CURLOPT_LOW_SPEED_TIME, (long)ceil(f->o->stall_s));
    curl_easy_setopt(j->easy, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(j->easy, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    char range[48];
    j->resumed = j->have > 0 && j->have < j->bytes;
    if (j->resumed) {
        snprintf(range, sizeof range, "%llu-", (unsigned long long)j->have);
        curl_easy_setopt(j->easy, CURLOPT_RANGE, range);
    }
    BB_TRY(bb_remote_site_setup(f->site, j->easy, &j->headers));
    if (curl_multi_add_handle(f->multi, j->easy) != CURLM_OK)
        return bb_fail(BB_ERR_INTERNAL, "%s: curl_multi_add_handle failed", j->what);
    return BB_OK;
}

static void job_release(fetcher *f, job *j)
{
    if (j->easy) {
        curl_multi_remove_handle(f->multi, j->easy);
        curl_easy_cleanup(j->easy);
        j->easy = NULL;
    }
    curl_slist_free_all(j->headers);
    j->headers = NULL;
}

/* The whole file arrived: check it and rename it into place. Returns
 * BB_ERR_CORRUPT (the part removed) when its hash differs. */
static bb_status job_finish(job *j)
{
    if (fsync(j->fd) != 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot sync", j->part);
    close(j->fd);
    j->fd = -1;
    if (j->verify) {
        uint64_t bytes, hash;
        BB_TRY(bb_index_hash_file(j->part, &bytes, &hash));
        if (bytes != j->bytes || hash != j->xxh64) {
            unlink(j->part);
            return bb_fail(BB_ERR_CORRUPT, "%s: %llu bytes with XXH64 %016llx where its index says %llu bytes, "
                           "%016llx", j->what, (unsigned long long)bytes, (unsigned long long)hash,
                           (unsigned long long)j->bytes, (unsigned long long)j->xxh64);
        }
    }
    if (rename(j->part, j->dest) != 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot rename into place", j->dest);
    j->done = true;
    return BB_OK;
}

/* One line of what the server said: "HTTP 403: <Code>AccessDenied</Code>…". */
static void describe_failure(const job *j, CURLcode cc, char *buf, size_t cap)
{
    if (cc != CURLE_OK) {
        snprintf(buf, cap, "%s", curl_easy_strerror(cc));
        return;
    }
    /* An S3 error is an XML document whose <Code> says it (AccessDenied,
     * SignatureDoesNotMatch, NoSuchKey): that element's text, else the body's
     * start on one line. Only a message is made of it. */
    const char *code = strstr(j->body, "<Code>"), *end = code ? strstr(code, "</Code>") : NULL;
    if (code && end) {
        snprintf(buf, cap, "HTTP %ld: %.*s", j->code, (int)(end - code - 6), code + 6);
        return;
    }
    char body[sizeof j->body];
    size_t n = 0;
    for (size_t i = 0; i < j->body_len && n + 1 < sizeof body; i++) { /* whitespace runs become one space */
        bool space = isspace((unsigned char)j->body[i]);
        if (!space || (n && body[n - 1] != ' ')) body[n++] = space ? ' ' : j->body[i];
    }
    while (n && body[n - 1] == ' ') n--;
    body[n] = 0;
    snprintf(buf, cap, "HTTP %ld%s%.120s", j->code, n ? ": " : "", body);
}

static bool retryable(CURLcode cc, long code)
{
    if (cc == CURLE_UNSUPPORTED_PROTOCOL || cc == CURLE_URL_MALFORMAT || cc == CURLE_LOGIN_DENIED ||
        cc == CURLE_REMOTE_ACCESS_DENIED || cc == CURLE_PEER_FAILED_VERIFICATION)
        return false;
    if (code > 0 && code != 200 && code != 206) /* an answer: only these may change by waiting */
        return code == 408 || code == 416 || code == 429 || code >= 500;
    return true; /* no answer, or one cut short: resets, time-outs, stalls */
}

/* A transfer ended (cc, HTTP code): finish it, schedule a retry, or fail. */
static bb_status job_done(fetcher *f, job *j, CURLcode cc)
{
    double now = bb_clock_seconds();
    curl_off_t announced = -1;
    curl_easy_getinfo(j->easy, CURLINFO_RESPONSE_CODE, &j->code);
    curl_easy_getinfo(j->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &announced);
    job_release(f, j);
    bool whole = j->bytes == UINT64_MAX || j->have == j->bytes;
    if (cc == CURLE_OK && (j->code == 200 || j->code == 206) && whole) {
        bb_status rc = job_finish(j);
        if (rc != BB_ERR_CORRUPT || ++j->bad_hashes > 1) return rc;
        BB_INFO("%s (downloading again)", bb_error_message()); /* a resume across two versions of the file */
        j->next_try = now; /* job_start makes a new part */
        return BB_OK;
    }
    if (j->write_errno)
        return bb_fail(BB_ERR_IO, "%s: cannot write: %s", j->part, strerror(j->write_errno)); /* a full disk */
    /* A response the server finished, shorter or longer than the index
     * says: the file changed after its index was written. Waiting will not
     * mend it. */
    bool finished = cc == CURLE_OK && (j->code == 200 || j->code == 206) && announced >= 0 &&
                    (uint64_t)announced == j->received; /* all it said it would send, not all the index lists */
    if (finished || j->oversize) {
        unlink(j->part);
        if (j->bytes == UINT64_MAX)
            return bb_fail(BB_ERR_FORMAT, "%s: larger than %u MiB: not an index", j->what, INDEX_MAX_BYTES >> 20);
        return bb_fail(BB_ERR_CORRUPT, "%s: the server's file %s the %llu bytes its index lists: the index is stale "
                       "(`bigbatch pack --index DIR` writes it again)", j->what, j->oversize ? "exceeds" : "ends before",
                       (unsigned long long)j->bytes);
    }
    char why[256];
    describe_failure(j, cc, why, sizeof why);
    if (j->code == 416 && ftruncate(j->fd, 0) != 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot truncate", j->part);
    if (!retryable(cc, j->code))
        return bb_fail(BB_ERR_IO, "%s: %s%s", j->what, why,
                       j->code == 403 && f->site->s3 && !f->site->signed_s3
                           ? " (sent unsigned: no AWS credentials in the environment or ~/.aws)" : "");
    if (j->have > j->high || !j->fail_since) j->fail_since = now; /* progress restarts the deadline */
    if (j->have > j->high) j->high = j->have;
    j->attempts++;
    if (now - j->fail_since > f->o->deadline_s)
        return bb_fail(BB_ERR_IO, "%s: gave up after %d attempts over %.0f s (--data-deadline): %s", j->what,
                       j->attempts, now - j->fail_since, why);
    double backoff = 0.1 * ldexp(1.0, j->attempts - 1 < 6 ? j->attempts - 1 : 6); /* 0.1 s .. 6.4 s */
    double jitter = 0.5 + 0.5 * (double)(bb_splitmix64(&f->seed) >> 11) / 9007199254740992.0;
    j->next_try = now + backoff * jitter;
    BB_INFO("%s: %s; retrying in %.1f s", j->what, why, backoff * jitter);
    return BB_OK;
}

/* Downloads every job, `parallel` at a time. On failure the transfers stop;
 * .part files stay for the next call to resume. */
static bb_status fetch_all(const bb_remote_options *o, const bb_remote_site *site, job *jobs, size_t n)
{
    fetcher f = {.o = o, .site = site, .multi = curl_multi_init(), .seed = (uint64_t)getpid() ^ bb_clock_ns()};
    if (!f.multi) return bb_fail(BB_ERR_NOMEM, "cannot start libcurl");
    bb_status rc = BB_OK;
    size_t finished = 0;
    while (rc == BB_OK && finished < n) {
        if (o->interrupted && *o->interrupted) {
            rc = bb_fail(BB_ERR_INTERRUPTED, "interrupted while downloading %s", site->shown);
            break;
        }
        double now = bb_clock_seconds(), wake = now + 0.5;
        int active = 0;
        for (size_t i = 0; i < n; i++) active += jobs[i].easy != NULL;
        for (size_t i = 0; rc == BB_OK && i < n && active < o->parallel; i++) {
            job *j = &jobs[i];
            if (j->done || j->easy) continue;
            if (j->next_try > now) {
                if (j->next_try < wake) wake = j->next_try;
                continue;
            }
            rc = job_start(&f, j);
            if (rc == BB_OK && j->complete) { /* no transfer: check it, rename it, or fetch it again */
                j->complete = false;
                rc = job_finish(j);
                if (rc == BB_OK) finished++;
                if (rc == BB_ERR_CORRUPT) bb_error_clear(), rc = BB_OK;
                continue;
            }
            active++;
        }
        if (rc != BB_OK) break;
        int running;
        curl_multi_perform(f.multi, &running);
        CURLMsg *m;
        int left;
        while (rc == BB_OK && (m = curl_multi_info_read(f.multi, &left))) {
            if (m->msg != CURLMSG_DONE) continue;
            job *j;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&j);
            rc = job_done(&f, j, m->data.result);
            if (rc == BB_OK && j->done) finished++;
        }
        if (rc != BB_OK || finished == n) break;
        int wait_ms = (int)((wake - bb_clock_seconds()) * 1000);
        curl_multi_poll(f.multi, NULL, 0, wait_ms < 1 ? 1 : wait_ms > 200 ? 200 : wait_ms, NULL);
    }
    for (size_t i = 0; i < n; i++) {
        job_release(&f, &jobs[i]);
        if (jobs[i].fd >= 0) close(jobs[i].fd);
        jobs[i].fd = -1;
    }
    curl_multi_cleanup(f.multi);
    return rc;
}

/* ---- the tree and the cache --------------------------------------------- */

typedef struct entry {
    char rel[4096]; /* under the tree's root (and the mirror's directory): "train/shard-00000.bbs" */
    uint64_t bytes, xxh64;
    bool present; /* already in the cache, as the index gives it */
} entry;

typedef struct tree {
    entry *files;
    size_t count, cap;
    char (*indexes)[4096]; /* the index.json.new files to publish at the end */
    size_t index_count;
} tree;

static bb_status tree_add(tree *t, const char *rel, const bb_index_file *f, bool present)
{
    if (t->count == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        entry *grown = realloc(t->files, cap * sizeof *grown);
        if (!grown) return bb_fail(BB_ERR_NOMEM, "out of memory for the file list");
        t->files = grown;
        t->cap = cap;
    }
    entry *e = &t->files[t->count++];
    snprintf(e->rel, sizeof e->rel, "%s", rel);
    e->bytes = f->bytes;
    e->xxh64 = f->xxh64;
    e->present = present;
    return BB_OK;
}

/* Removes what a mirrored directory holds that its index no longer lists
 * (the dataset was packed again: a leftover shard would be a foreign one,
 * a leftover split a wrong one), partial downloads included; with a NULL
 * index, everything (a split no longer listed, whose own index goes too). */
static bb_status drop_unlisted(const char *local, const bb_index *index)
{
    DIR *d = opendir(local);
    if (!d) return bb_fail_errno(BB_ERR_IO, "%s: cannot list directory", local);
    bb_status rc = BB_OK;
    struct dirent *e;
    while (rc == BB_OK && (e = readdir(d))) {
        char name[256], path[4096];
        snprintf(name, sizeof name, "%s", e->d_name);
        size_t n = strlen(name);
        if (n > 5 && !strcmp(name + n - 5, ".part")) name[n - 5] = 0; /* a download of `name` */
        bool listed = false;
        for (size_t i = 0; index && i < index->dir_count; i++) listed |= !strcmp(index->dirs[i], e->d_name);
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || (e->d_name[0] == '.' && index) || listed ||
            (index && (!strncmp(name, BB_INDEX_FILE, strlen(BB_INDEX_FILE)) || bb_index_find(index, name))))
            continue;
        struct stat st;
        rc = path_of(path, sizeof path, "%s/%s", local, e->d_name);
        if (rc != BB_OK || lstat(path, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
            rc = drop_unlisted(path, NULL);
            if (rc == BB_OK && rmdir(path) != 0)
                rc = bb_fail_errno(BB_ERR_IO, "%s: cannot remove (its index no longer lists it)", path);
        } else if (unlink(path) != 0) {
            rc = bb_fail_errno(BB_ERR_IO, "%s: cannot remove (its index no longer lists it)", path);
        }
        if (rc == BB_OK) BB_INFO("cache: removed %s, which the index no longer lists", path);
    }
    closedir(d);
    return rc;
}

/* Fetches the index of the directory `rel` ("" or "train/": a path under
 * the tree's root) into local/, lists the files it names and walks its
 * subdirectories. */
static bb_status walk(const bb_remote_options *o, const bb_remote_site *site, const char *rel, const char *local,
                      int depth, tree *t)
{
    if (mkdir(local, 0755) != 0 && errno != EEXIST) return bb_fail_errno(BB_ERR_IO, "%s: cannot create", local);
    job ij;
    char name[4096], dest[4096];
    BB_TRY(path_of(name, sizeof name, "%s%s", rel, BB_INDEX_FILE));
    BB_TRY(path_of(dest, sizeof dest, "%s/%s.new", local, BB_INDEX_FILE));
    BB_TRY(job_init(&ij, site, name, dest, UINT64_MAX, 0, false));
    bb_status rc = fetch_all(o, site, &ij, 1);
    if (rc == BB_ERR_IO && ij.code == 404)
        return bb_fail(BB_ERR_IO, "%s: HTTP 404: no dataset index here (`bigbatch pack` writes index.json beside "
                       "the shards; `bigbatch pack --index DIR` writes one for an older dataset before upload)",
                       ij.what);
    BB_TRY(rc);
    if (t->index_count % 16 == 0) {
        void *grown = realloc(t->indexes, (t->index_count + 16) * sizeof *t->indexes);
        if (!grown) return bb_fail(BB_ERR_NOMEM, "out of memory");
        t->indexes = grown;
    }
    memcpy(t->indexes[t->index_count++], ij.dest, sizeof ij.dest);
    bb_index now, before = {0};
    BB_TRY(bb_index_load(ij.dest, ij.what, &now));
    char old[4096];
    BB_TRY(path_of(old, sizeof old, "%s/%s", local, BB_INDEX_FILE));
    if (access(old, F_OK) == 0 && bb_index_load(old, old, &before) != BB_OK) bb_error_clear(); /* refetch all */
    for (size_t i = 0; rc == BB_OK && i < now.file_count; i++) {
        const bb_index_file *f = &now.files[i], *was = bb_index_find(&before, f->name);
        char path[4096], file_rel[4096];
        rc = path_of(path, sizeof path, "%s/%s", local, f->name);
        if (rc == BB_OK) rc = path_of(file_rel, sizeof file_rel, "%s%s", rel, f->name);
        if (rc != BB_OK) break;
        struct stat st;
        bool sized = stat(path, &st) == 0 && (uint64_t)st.st_size == f->bytes;
        bool present = sized && was && was->bytes == f->bytes && was->xxh64 == f->xxh64;
        if (sized && !present) { /* renamed into place by a mirror that did not finish: its index never came */
            uint64_t bytes, hash;
            present = bb_index_hash_file(path, &bytes, &hash) == BB_OK && bytes == f->bytes && hash == f->xxh64;
            bb_error_clear();
        }
        rc = tree_add(t, file_rel, f, present);
    }
    if (rc == BB_OK) rc = drop_unlisted(local, &now);
    if (rc == BB_OK && now.dir_count && depth >= MAX_DEPTH)
        rc = bb_fail(BB_ERR_FORMAT, "%s: lists directories deeper than %d levels", ij.what, MAX_DEPTH);
    for (size_t i = 0; rc == BB_OK && i < now.dir_count; i++) {
        char sub_rel[4096], sub_local[4096];
        rc = path_of(sub_rel, sizeof sub_rel, "%s%s/", rel, now.dirs[i]);
        if (rc == BB_OK) rc = path_of(sub_local, sizeof sub_local, "%s/%s", local, now.dirs[i]);
        if (rc == BB_OK) rc = walk(o, site, sub_rel, sub_local, depth + 1, t);
    }
    bb_index_free(&now);
    bb_index_free(&before);
    return rc;
}

typedef struct cached {
    char path[4096];
    uint64_t bytes;
    struct timespec used;
} cached;

static int by_use(const void *a, const void *b)
{
    const cached *x = a, *y = b;
    if (x->used.tv_sec != y->used.tv_sec) return x->used.tv_sec < y->used.tv_sec ? -1 : 1;
    return (x->used.tv_nsec > y->used.tv_nsec) - (x->used.tv_nsec < y->used.tv_nsec);
}

/* A mirror directory's name: NAME-<16 hex digits> (mirror_dir). Nothing
 * else in a cache directory is ever evicted: --cache-dir pointed at a
 * directory of one's own datasets loses none of them. */
static bool is_mirror_name(const char *name)
{
    size_t n = strlen(name);
    if (n < 18 || name[n - 17] != '-') return false;
    for (size_t i = n - 16; i < n; i++)
        if (!isxdigit((unsigned char)name[i])) return false;
    return true;
}

/* A process that uses a mirror holds a shared lock on its .inuse file
 * until it exits; eviction passes over a mirror it cannot lock alone. */
static bool mirror_in_use(const char *dir)
{
    char path[4200];
    if (path_of(path, sizeof path, "%s/.inuse", dir) != BB_OK) return true; /* cannot tell: spared */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool busy = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd); /* releases the probe's lock */
    return busy;
}

static void mark_in_use(const char *dir)
{
    char path[4200];
    int fd = path_of(path, sizeof path, "%s/.inuse", dir) == BB_OK ? open(path, O_RDONLY | O_CREAT | O_CLOEXEC, 0644)
                                                                    : -1;
    if (fd >= 0 && flock(fd, LOCK_SH) != 0) close(fd), fd = -1;
    if (fd < 0) BB_WARN("%s: cannot mark the mirror in use (%s): another job's --cache-limit may evict it", dir,
                        strerror(errno));
    /* else the descriptor stays open, and the lock held, for the process's life */
}

static bool is_cached_file(const char *name)
{
    size_t n = strlen(name);
    return bb_shard_is_file_name(name) || (n > 5 && !strcmp(name + n - 5, ".part"));
}

/* The shards (and partial downloads) of one mirror, itself and its splits:
 * their bytes added to *total and, unless list is NULL, each appended. */
static bb_status scan_mirror(const char *dir, int depth, cached **list, size_t *n, size_t *cap, uint64_t *total)
{
    DIR *d = opendir(dir);
    if (!d) return BB_OK; /* removed meanwhile */
    struct dirent *e;
    bb_status rc = BB_OK;
    while (rc == BB_OK && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) != 0) continue;
        if (S_ISDIR(st.st_mode) && depth < MAX_DEPTH) {
            rc = scan_mirror(path, depth + 1, list, n, cap, total);
            continue;
        }
        if (!S_ISREG(st.st_mode) || !is_cached_file(e->d_name)) continue;
        *total += (uint64_t)st.st_size;
        if (!list) continue;
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 64;
            cached *grown = realloc(*list, *cap * sizeof *grown);
            if (!grown) {
                rc = bb_fail(BB_ERR_NOMEM, "out of memory scanning the cache");
                break;
            }
            *list = grown;
        }
        cached *c = &(*list)[(*n)++];
        snprintf(c->path, sizeof c->path, "%s", path);
        c->bytes = (uint64_t)st.st_size;
        c->used = st.st_mtim;
    }
    closedir(d);
    return rc;
}

/* Makes room for `need` bytes of this mirror under the cap: the shards of
 * other mirrors that no process uses go, least recently used first. */
static bb_status make_room(const bb_remote_options *o, const char *cache, const char *mine, const char *url,
                           uint64_t need)
{
    if (!o->cache_bytes) return BB_OK;
    char a[16], b[16], c[16];
    if (need > o->cache_bytes)
        return bb_fail(BB_ERR_IO, "%s: the dataset's %s do not fit the cache's limit of %s (--cache-limit) in %s",
                       url, bb_format_bytes(need, a, sizeof a), bb_format_bytes(o->cache_bytes, b, sizeof b), cache);
    cached *list = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0, in_use = 0;
    bb_status rc = BB_OK;
    DIR *d = opendir(cache);
    struct dirent *e;
    while (rc == BB_OK && d && (e = readdir(d))) {
        char dir[4096];
        if (!is_mirror_name(e->d_name) || path_of(dir, sizeof dir, "%s/%s", cache, e->d_name) != BB_OK ||
            !strcmp(dir, mine))
            continue;
        if (mirror_in_use(dir))
            rc = scan_mirror(dir, 0, NULL, NULL, NULL, &in_use); /* counted, never a candidate */
        else
            rc = scan_mirror(dir, 0, &list, &n, &cap, &total);
    }
    if (d) closedir(d);
    if (rc == BB_OK && n) qsort(list, n, sizeof *list, by_use);
    for (size_t i = 0; rc == BB_OK && i < n && total + in_use + need > o->cache_bytes; i++) {
        if (unlink(list[i].path) != 0 && errno != ENOENT) {
            rc = bb_fail_errno(BB_ERR_IO, "%s: cannot evict", list[i].path);
            break;
        }
        BB_INFO("cache: evicted %s (%s, least recently used)", list[i].path,
                bb_format_bytes(list[i].bytes, a, sizeof a));
        total -= list[i].bytes;
    }
    if (rc == BB_OK && total + in_use + need > o->cache_bytes)
        rc = bb_fail(BB_ERR_IO, "%s: no room for the dataset's %s under the cache's limit of %s (--cache-limit) in %s: "
                     "%s of it belong to datasets that running jobs use", url, bb_format_bytes(need, a, sizeof a),
                     bb_format_bytes(o->cache_bytes, b, sizeof b), cache, bb_format_bytes(in_use, c, sizeof c));
    free(list);
    return rc;
}

static bb_status cache_root(const bb_remote_options *o, char *out, size_t cap)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int w;
    if (o->cache_dir)
        w = snprintf(out, cap, "%s", o->cache_dir);
    else if (xdg && *xdg)
        w = snprintf(out, cap, "%s/bigbatch", xdg);
    else if (home && *home)
        w = snprintf(out, cap, "%s/.cache/bigbatch", home);
    else
        return bb_fail(BB_ERR_ARG, "no cache directory: give --cache-dir (neither XDG_CACHE_HOME nor HOME is set)");
    if (w < 0 || (size_t)w >= cap) return bb_fail(BB_ERR_ARG, "--cache-dir: path too long");
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.lock", out);
    BB_TRY(bb_make_parents(probe, NULL));
    return BB_OK;
}

/* cache/<last part of the URL>-<XXH64 of where it comes from>. */
static void mirror_dir(const char *cache, const bb_remote_site *site, char *out, size_t cap)
{
    size_t n = strlen(site->base) - 1; /* before the final '/' */
    size_t start = n;
    while (start && site->base[start - 1] != '/') start--;
    char name[64];
    size_t k = 0;
    for (size_t i = start; i < n && k + 1 < 40; i++) {
        char c = site->base[i];
        name[k++] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                    c == '_' || c == '.' ? c : '_';
    }
    name[k] = 0;
    snprintf(out, cap, "%s/%s-%016llx", cache, k ? name : "data",
             (unsigned long long)XXH64(site->base, strlen(site->base), 0));
}

static void curl_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

bb_status bb_remote_mirror(const char *url, const bb_remote_options *opts, char *local, size_t cap)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, curl_init);
    bb_remote_options o = *opts;
    double started = bb_clock_seconds();
    if (o.parallel < 1 || o.deadline_s <= 0 || o.stall_s < 1)
        return bb_fail(BB_ERR_ARG, "%s: remote options need parallel >= 1, a positive deadline, stall >= 1 s", url);
    bb_remote_site *site = calloc(1, sizeof *site);
    if (!site) return bb_fail(BB_ERR_NOMEM, "out of memory");
    char cache[4096], dir[4200], lockpath[4200];
    tree t = {0};
    int lock = -1;
    bb_status rc = bb_remote_site_init(site, url, o.endpoint);
    if (rc == BB_OK) rc = cache_root(&o, cache, sizeof cache);
    if (rc == BB_OK) {
        mirror_dir(cache, site, dir, sizeof dir);
        snprintf(lockpath, sizeof lockpath, "%s/.lock", cache);
        lock = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (lock < 0) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot open the cache's lock", lockpath);
    }
    if (rc == BB_OK) {
        double t0 = bb_clock_seconds();
        while (rc == BB_OK && flock(lock, LOCK_EX) != 0) {
            if (errno == EINTR && o.interrupted && *o.interrupted)
                rc = bb_fail(BB_ERR_INTERRUPTED, "interrupted while waiting for the cache %s", cache);
            else if (errno != EINTR)
                rc = bb_fail_errno(BB_ERR_IO, "%s: cannot lock the cache", lockpath);
        }
        if (bb_clock_seconds() - t0 > 1) BB_INFO("cache: waited %.0f s for another process", bb_clock_seconds() - t0);
    }
    if (rc == BB_OK) rc = walk(&o, site, "", dir, 0, &t);
    uint64_t need = 0, missing = 0, files = 0;
    for (size_t i = 0; i < t.count; i++) {
        need = need + t.files[i].bytes < need ? UINT64_MAX : need + t.files[i].bytes; /* an absurd index: no wrap */
        if (!t.files[i].present) missing += t.files[i].bytes, files++;
    }
    if (rc == BB_OK) rc = make_room(&o, cache, dir, url, need);
    job *jobs = NULL;
    if (rc == BB_OK && files) {
        char a[16];
        BB_INFO("%s: downloading %llu files, %s, into %s", url, (unsigned long long)files,
                bb_format_bytes(missing, a, sizeof a), dir);
        jobs = calloc(files, sizeof *jobs);
        if (!jobs) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
        size_t k = 0;
        for (size_t i = 0; rc == BB_OK && i < t.count; i++) {
            const entry *e = &t.files[i];
            char dest[4096];
            if (e->present) continue;
            rc = path_of(dest, sizeof dest, "%s/%s", dir, e->rel);
            if (rc == BB_OK) rc = job_init(&jobs[k++], site, e->rel, dest, e->bytes, e->xxh64, true);
        }
        double t0 = bb_clock_seconds();
        if (rc == BB_OK) rc = fetch_all(&o, site, jobs, files);
        if (rc == BB_OK)
            BB_INFO("%s: %s in %.2f s", url, bb_format_bytes(missing, a, sizeof a), bb_clock_seconds() - t0);
    }
    free(jobs);
    for (size_t i = 0; rc == BB_OK && i < t.count; i++) { /* used now: last to be evicted */
        char path[4096];
        rc = path_of(path, sizeof path, "%s/%s", dir, t.files[i].rel);
        if (rc == BB_OK && utimensat(AT_FDCWD, path, NULL, 0) != 0)
            rc = bb_fail_errno(BB_ERR_IO, "%s: cannot touch", path);
    }
    for (size_t i = 0; rc == BB_OK && i < t.index_count; i++) { /* the index that says what is here, last */
        char to[4096];
        snprintf(to, sizeof to, "%.*s", (int)(strlen(t.indexes[i]) - 4), t.indexes[i]);
        if (rename(t.indexes[i], to) != 0) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot rename into place", to);
    }
    if (rc == BB_OK && snprintf(local, cap, "%s", dir) >= (int)cap) rc = bb_fail(BB_ERR_ARG, "cache path too long");
    if (rc == BB_OK) mark_in_use(dir);
    if (rc == BB_OK && o.stats)
        *o.stats = (bb_remote_stats){.files = files, .bytes = missing, .seconds = bb_clock_seconds() - started};
    if (lock >= 0) close(lock); /* releases the lock */
    free(t.files);
    free(t.indexes);
    free(site);
    return rc;
}
