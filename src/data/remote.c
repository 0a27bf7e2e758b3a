/* remote.c — mirroring a remote dataset into the local cache: the indexes,
 * the files they list (libcurl multi, resumed, retried, checked), the
 * cache's lock and its size cap. See remote.h. */
#include "data_index.h"
#include "remote_internal.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
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
    int bad_hashes;
    bb_remote_retry retry;
    uint64_t received;     /* body bytes of this attempt */
    bool resumed;          /* this attempt asked for the bytes past `have` */
    bool done;
    bb_remote_answer answer;
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
        bb_remote_answer_keep(&j->answer, data, len);
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
    if ((j->write_errno = bb_remote_pwrite(j->fd, data, len, j->have))) return 0;
    j->have += len;
    j->received += len;
    return len;
}

/* A download of `rel` (a path under the tree's root) into `dest`. */
static bb_status job_init(job *j, const bb_remote_site *site, const char *rel, const char *dest, uint64_t bytes,
                          uint64_t xxh64, bool verify)
{
    *j = (job){.bytes = bytes, .xxh64 = xxh64, .verify = verify, .fd = -1};
    BB_TRY(bb_remote_path_of(j->url, sizeof j->url, "%s%s", site->base, rel));
    BB_TRY(bb_remote_path_of(j->what, sizeof j->what, "%s%s", site->shown, rel));
    BB_TRY(bb_remote_path_of(j->dest, sizeof j->dest, "%s", dest));
    return bb_remote_path_of(j->part, sizeof j->part, "%s.part", dest);
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
    j->answer = (bb_remote_answer){0};
    char range[48];
    j->resumed = j->have > 0 && j->have < j->bytes;
    snprintf(range, sizeof range, "%llu-", (unsigned long long)j->have);
    return bb_remote_request(f->site, f->o, f->multi, j->url, on_data, j, j->resumed ? range : NULL, &j->easy,
                             &j->headers);
}

static void job_release(fetcher *f, job *j) { bb_remote_request_end(f->multi, &j->easy, &j->headers); }

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

/* A transfer ended (cc, HTTP code): finish it, schedule a retry, or fail. */
static bb_status job_done(fetcher *f, job *j, CURLcode cc)
{
    curl_off_t announced = -1;
    curl_easy_getinfo(j->easy, CURLINFO_RESPONSE_CODE, &j->answer.code);
    curl_easy_getinfo(j->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &announced);
    job_release(f, j);
    bool whole = j->bytes == UINT64_MAX || j->have == j->bytes;
    if (cc == CURLE_OK && (j->answer.code == 200 || j->answer.code == 206) && whole) {
        bb_status rc = job_finish(j);
        if (rc != BB_ERR_CORRUPT || ++j->bad_hashes > 1) return rc;
        BB_INFO("%s (downloading again)", bb_error_message()); /* a resume across two versions of the file */
        j->retry.next_try = bb_clock_seconds(); /* job_start makes a new part */
        return BB_OK;
    }
    if (j->write_errno)
        return bb_fail(BB_ERR_IO, "%s: cannot write: %s", j->part, strerror(j->write_errno)); /* a full disk */
    /* A response the server finished, shorter or longer than the index
     * says: the file changed after its index was written. Waiting will not
     * mend it. */
    bool finished = cc == CURLE_OK && (j->answer.code == 200 || j->answer.code == 206) && announced >= 0 &&
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
    bb_remote_answer_describe(&j->answer, cc, why, sizeof why);
    if (j->answer.code == 416 && ftruncate(j->fd, 0) != 0)
        return bb_fail_errno(BB_ERR_IO, "%s: cannot truncate", j->part);
    if (!bb_remote_retryable(cc, j->answer.code))
        return bb_fail(BB_ERR_IO, "%s: %s%s", j->what, why,
                       j->answer.code == 403 && f->site->s3 && !f->site->signed_s3
                           ? " (sent unsigned: no AWS credentials in the environment or ~/.aws)" : "");
    return bb_remote_retry_after(&j->retry, f->o, &f->seed, j->have, j->what, why);
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
            if (j->retry.next_try > now) {
                if (j->retry.next_try < wake) wake = j->retry.next_try;
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
        bool ended = false; /* a slot may be free: fill it before sleeping */
        while (rc == BB_OK && (m = curl_multi_info_read(f.multi, &left))) {
            if (m->msg != CURLMSG_DONE) continue;
            job *j;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&j);
            rc = job_done(&f, j, m->data.result);
            if (rc == BB_OK && j->done) finished++;
            ended = true;
        }
        if (rc != BB_OK || finished == n) break;
        int wait_ms = (int)((wake - bb_clock_seconds()) * 1000);
        if (!ended) curl_multi_poll(f.multi, NULL, 0, wait_ms < 1 ? 1 : wait_ms > 200 ? 200 : wait_ms, NULL);
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

static bb_status add_file(bb_remote_session *t, const char *rel, const bb_index_file *f, bool present)
{
    if (t->count == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        bb_remote_file *grown = realloc(t->files, cap * sizeof *grown);
        if (!grown) return bb_fail(BB_ERR_NOMEM, "out of memory for the file list");
        t->files = grown;
        t->cap = cap;
    }
    bb_remote_file *e = &t->files[t->count++];
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
        rc = bb_remote_path_of(path, sizeof path, "%s/%s", local, e->d_name);
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
static bb_status walk(bb_remote_session *t, const char *rel, const char *local, int depth)
{
    const bb_remote_options *o = &t->o;
    const bb_remote_site *site = t->site;
    if (mkdir(local, 0755) != 0 && errno != EEXIST) return bb_fail_errno(BB_ERR_IO, "%s: cannot create", local);
    job ij;
    char name[4096], dest[4096];
    BB_TRY(bb_remote_path_of(name, sizeof name, "%s%s", rel, BB_INDEX_FILE));
    BB_TRY(bb_remote_path_of(dest, sizeof dest, "%s/%s.new", local, BB_INDEX_FILE));
    BB_TRY(job_init(&ij, site, name, dest, UINT64_MAX, 0, false));
    bb_status rc = fetch_all(o, site, &ij, 1);
    if (rc == BB_ERR_IO && ij.answer.code == 404)
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
    BB_TRY(bb_remote_path_of(old, sizeof old, "%s/%s", local, BB_INDEX_FILE));
    if (access(old, F_OK) == 0 && bb_index_load(old, old, &before) != BB_OK) bb_error_clear(); /* refetch all */
    for (size_t i = 0; rc == BB_OK && i < now.file_count; i++) {
        const bb_index_file *f = &now.files[i], *was = bb_index_find(&before, f->name);
        char path[4096], file_rel[4096];
        rc = bb_remote_path_of(path, sizeof path, "%s/%s", local, f->name);
        if (rc == BB_OK) rc = bb_remote_path_of(file_rel, sizeof file_rel, "%s%s", rel, f->name);
        if (rc != BB_OK) break;
        struct stat st;
        bool sized = stat(path, &st) == 0 && (uint64_t)st.st_size == f->bytes;
        bool present = sized && was && was->bytes == f->bytes && was->xxh64 == f->xxh64;
        if (sized && !present) { /* renamed into place by a mirror that did not finish: its index never came */
            uint64_t bytes, hash;
            present = bb_index_hash_file(path, &bytes, &hash) == BB_OK && bytes == f->bytes && hash == f->xxh64;
            bb_error_clear();
        }
        rc = add_file(t, file_rel, f, present);
    }
    if (rc == BB_OK) rc = drop_unlisted(local, &now);
    if (rc == BB_OK && now.dir_count && depth >= MAX_DEPTH)
        rc = bb_fail(BB_ERR_FORMAT, "%s: lists directories deeper than %d levels", ij.what, MAX_DEPTH);
    for (size_t i = 0; rc == BB_OK && i < now.dir_count; i++) {
        char sub_rel[4096], sub_local[4096];
        rc = bb_remote_path_of(sub_rel, sizeof sub_rel, "%s%s/", rel, now.dirs[i]);
        if (rc == BB_OK) rc = bb_remote_path_of(sub_local, sizeof sub_local, "%s/%s", local, now.dirs[i]);
        if (rc == BB_OK) rc = walk(t, sub_rel, sub_local, depth + 1);
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
    if (bb_remote_path_of(path, sizeof path, "%s/.inuse", dir) != BB_OK) return true; /* cannot tell: spared */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool busy = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd); /* releases the probe's lock */
    return busy;
}

static void mark_in_use(const char *dir)
{
    char path[4200];
    bool named = bb_remote_path_of(path, sizeof path, "%s/.inuse", dir) == BB_OK;
    int fd = named ? open(path, O_RDONLY | O_CREAT | O_CLOEXEC, 0644) : -1;
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

/* The shards (and partial downloads) of one mirror, itself, its splits and
 * its staging tree: their bytes added to *total and, unless list is NULL,
 * each appended. */

static bb_status scan_tree(const char *dir, int depth, bool staged, cached **list, size_t *n, size_t *cap,
                           uint64_t *total)
{
    DIR *d = opendir(dir);
    if (!d) return BB_OK; /* removed meanwhile */
    struct dirent *e;
    bb_status rc = BB_OK;
    while (rc == BB_OK && (e = readdir(d))) {
        bool staging = depth == 0 && !strcmp(e->d_name, ".stream"); /* partial shards a stream left */
        if (e->d_name[0] == '.' && !staging) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) != 0) continue;
        if (S_ISDIR(st.st_mode) && depth < MAX_DEPTH) {
            rc = scan_tree(path, staging ? MAX_DEPTH - 1 : depth + 1, staged || staging, list, n, cap, total);
            continue;
        }
        /* a staged file linked to the mirror's own (nlink 2) is counted there */
        if (!S_ISREG(st.st_mode) || !is_cached_file(e->d_name) || (staged && st.st_nlink > 1)) continue;
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
        if (!is_mirror_name(e->d_name) || bb_remote_path_of(dir, sizeof dir, "%s/%s", cache, e->d_name) != BB_OK ||
            !strcmp(dir, mine))
            continue;
        if (mirror_in_use(dir))
            rc = scan_tree(dir, 0, false, NULL, NULL, NULL, &in_use); /* counted, never a candidate */
        else
            rc = scan_tree(dir, 0, false, &list, &n, &cap, &total);
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

/* flock that waits, unless interrupted; says so when it waited long. */
static bb_status lock_waiting(const bb_remote_options *o, int fd, const char *path, const char *whom)
{
    double t0 = bb_clock_seconds();
    while (flock(fd, LOCK_EX) != 0) {
        if (errno == EINTR && o->interrupted && *o->interrupted)
            return bb_fail(BB_ERR_INTERRUPTED, "interrupted while waiting for %s", path);
        if (errno != EINTR) return bb_fail_errno(BB_ERR_IO, "%s: cannot lock", path);
    }
    if (bb_clock_seconds() - t0 > 1) BB_INFO("cache: waited %.0f s for %s", bb_clock_seconds() - t0, whom);
    return BB_OK;
}

bb_status bb_remote_begin(bb_remote_session *s, const char *url, const bb_remote_options *opts)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, curl_init);
    *s = (bb_remote_session){.o = *opts, .url = url, .lock = -1, .dir_lock = -1, .started = bb_clock_seconds()};
    const bb_remote_options *o = &s->o;
    if (o->parallel < 1 || o->deadline_s <= 0 || o->stall_s < 1)
        return bb_fail(BB_ERR_ARG, "%s: remote options need parallel >= 1, a positive deadline, stall >= 1 s", url);
    if (!(s->site = calloc(1, sizeof *s->site))) return bb_fail(BB_ERR_NOMEM, "out of memory");
    BB_TRY(bb_remote_site_init(s->site, url, o->endpoint));
    BB_TRY(cache_root(o, s->cache, sizeof s->cache));
    mirror_dir(s->cache, s->site, s->dir, sizeof s->dir);
    /* The mirror's lock first (a process streaming into it holds it until
     * its shards are complete), then the cache's: always in this order. */
    char path[4300];
    BB_TRY(bb_remote_path_of(path, sizeof path, "%s/.lock", s->dir));
    BB_TRY(bb_make_parents(path, NULL));
    if ((s->dir_lock = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0)
        return bb_fail_errno(BB_ERR_IO, "%s: cannot open the mirror's lock", path);
    BB_TRY(lock_waiting(o, s->dir_lock, path, "another process filling this mirror"));
    BB_TRY(bb_remote_path_of(path, sizeof path, "%s/.lock", s->cache));
    if ((s->lock = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0)
        return bb_fail_errno(BB_ERR_IO, "%s: cannot open the cache's lock", path);
    BB_TRY(lock_waiting(o, s->lock, path, "another process"));
    BB_TRY(walk(s, "", s->dir, 0));
    uint64_t need = 0;
    for (size_t i = 0; i < s->count; i++) /* an absurd index: no wrap */
        need = need + s->files[i].bytes < need ? UINT64_MAX : need + s->files[i].bytes;
    return make_room(o, s->cache, s->dir, url, need);
}

bb_status bb_remote_fetch_files(bb_remote_session *s, const bool *skip, uint64_t *files, uint64_t *bytes)
{
    *files = *bytes = 0;
    for (size_t i = 0; i < s->count; i++)
        if (!s->files[i].present && !(skip && skip[i])) *bytes += s->files[i].bytes, ++*files;
    if (!*files) return BB_OK;
    char a[16];
    BB_INFO("%s: downloading %llu files, %s, into %s", s->url, (unsigned long long)*files,
            bb_format_bytes(*bytes, a, sizeof a), s->dir);
    job *jobs = calloc(*files, sizeof *jobs);
    if (!jobs) return bb_fail(BB_ERR_NOMEM, "out of memory");
    bb_status rc = BB_OK;
    size_t k = 0;
    for (size_t i = 0; rc == BB_OK && i < s->count; i++) {
        const bb_remote_file *e = &s->files[i];
        char dest[4096];
        if (e->present || (skip && skip[i])) continue;
        rc = bb_remote_path_of(dest, sizeof dest, "%s/%s", s->dir, e->rel);
        if (rc == BB_OK) rc = job_init(&jobs[k++], s->site, e->rel, dest, e->bytes, e->xxh64, true);
    }
    double t0 = bb_clock_seconds();
    if (rc == BB_OK) rc = fetch_all(&s->o, s->site, jobs, *files);
    if (rc == BB_OK)
        BB_INFO("%s: %s in %.2f s", s->url, bb_format_bytes(*bytes, a, sizeof a), bb_clock_seconds() - t0);
    for (size_t i = 0; rc == BB_OK && i < s->count; i++) s->files[i].present |= !(skip && skip[i]);
    free(jobs);
    return rc;
}

bb_status bb_remote_publish(bb_remote_session *s)
{
    for (size_t i = 0; i < s->count; i++) { /* used now: last to be evicted */
        char path[4096];
        if (!s->files[i].present) continue;
        BB_TRY(bb_remote_path_of(path, sizeof path, "%s/%s", s->dir, s->files[i].rel));
        if (utimensat(AT_FDCWD, path, NULL, 0) != 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot touch", path);
    }
    for (size_t i = 0; i < s->index_count; i++) { /* the index that says what is here, last */
        char to[4096];
        snprintf(to, sizeof to, "%.*s", (int)(strlen(s->indexes[i]) - 4), s->indexes[i]);
        if (rename(s->indexes[i], to) != 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot rename into place", to);
    }
    s->index_count = 0;
    mark_in_use(s->dir);
    return BB_OK;
}

void bb_remote_end(bb_remote_session *s)
{
    if (s->lock >= 0) close(s->lock); /* releases the locks */
    if (s->dir_lock >= 0) close(s->dir_lock);
    free(s->files);
    free(s->indexes);
    free(s->site);
    *s = (bb_remote_session){.lock = -1, .dir_lock = -1};
}

bb_status bb_remote_mirror(const char *url, const bb_remote_options *opts, char *local, size_t cap)
{
    bb_remote_session s;
    uint64_t files = 0, bytes = 0;
    bb_status rc = bb_remote_begin(&s, url, opts);
    if (rc == BB_OK) rc = bb_remote_fetch_files(&s, NULL, &files, &bytes);
    if (rc == BB_OK) rc = bb_remote_publish(&s);
    if (rc == BB_OK && snprintf(local, cap, "%s", s.dir) >= (int)cap) rc = bb_fail(BB_ERR_ARG, "cache path too long");
    if (rc == BB_OK && opts->stats)
        *opts->stats = (bb_remote_stats){.files = files, .bytes = bytes, .seconds = bb_clock_seconds() - s.started};
    bb_remote_end(&s);
    return rc;
}
