/* test_remote.c — datasets read from a web server and from an S3-compatible
 * store, on loopback: nginx (range requests) behind tests/fault_proxy.py
 * (connection resets mid-file, 503s, stalls, a slow link), and moto's S3
 * server (SigV4 checked against the keys it issued). Each test starts its
 * own servers; nginx or moto absent: the test says skipped. */
#include <curl/curl.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include "bigbatch/pack.h"
#include "bigbatch/remote.h"
#include "test_util.h"


#define NGINX "/usr/sbin/nginx"
#define MOTO_PYTHON "build/s3/bin/python"

typedef struct servers {
    char *dir, *www;
    int nginx_port, proxy_port;
    pid_t nginx, proxy;
} servers;

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* Readiness: the port accepts a connection (polled, 10 s at most). */
static void wait_port(int port, pid_t pid, const char *what)
{
    for (double t0 = now_s(); now_s() - t0 < 10;) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok) return;
        cr_assert_eq(waitpid(pid, NULL, WNOHANG), 0, "%s exited before it listened", what);
        usleep(20000);
    }
    cr_assert_fail("%s did not listen on port %d within 10 s", what, port);
}

/* Runs argv with its stdout on out_fd and, when quiet, its stderr too. */
static pid_t spawn(char *const argv[], int out_fd, bool quiet)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (out_fd >= 0) posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    if (out_fd >= 0 && quiet) posix_spawn_file_actions_adddup2(&fa, out_fd, 2);
    pid_t pid;
    cr_assert_eq(posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ), 0, "cannot run %s", argv[0]);
    posix_spawn_file_actions_destroy(&fa);
    return pid;
}

static servers running; /* what the suite's fini stops, however a test ended */
static pid_t moto;

static void stop_servers(void)
{
    servers *s = &running;
    if (moto > 0) kill(moto, SIGKILL), waitpid(moto, NULL, 0);
    if (s->proxy > 0) kill(s->proxy, SIGKILL), waitpid(s->proxy, NULL, 0);
    if (s->nginx > 0) kill(s->nginx, SIGQUIT), waitpid(s->nginx, NULL, 0);
    if (s->dir) tu_rm_tree(s->dir);
    free(s->www), free(s->dir);
    *s = (servers){0};
    moto = 0;
}

TestSuite(remote, .timeout = 120, .fini = stop_servers);

/* nginx serving s->www, and the fault proxy in front of it (stopped by the suite's fini). */
static servers start_servers(void)
{
    if (access(NGINX, X_OK) != 0) cr_skip_test("skipped: no nginx on this machine (make deps installs nginx-light)");
    servers s = {.dir = tu_temp_dir()};
    running = s;
    s.www = tu_path(s.dir, "www");
    running.www = s.www;
    cr_assert_eq(mkdir(s.www, 0755), 0);
    cr_assert_eq(chmod(s.dir, 0755), 0); /* nginx's workers may run as another user */
    s.nginx_port = free_port();
    char conf[8192], *conf_path = tu_path(s.dir, "nginx.conf");
    snprintf(conf, sizeof conf,
             "daemon off;\n%sworker_processes 1;\npid %s/nginx.pid;\nerror_log %s/error.log;\nevents {}\n"
             "http {\n  access_log off;\n  client_body_temp_path %s;\n  proxy_temp_path %s;\n"
             "  fastcgi_temp_path %s;\n  uwsgi_temp_path %s;\n  scgi_temp_path %s;\n"
             "  server { listen 127.0.0.1:%d; root %s; }\n}\n",
             geteuid() == 0 ? "user root;\n" : "", s.dir, s.dir, s.dir, s.dir, s.dir, s.dir, s.dir, s.nginx_port,
             s.www);
    tu_write_file(conf_path, conf, strlen(conf));
    s.nginx = running.nginx = spawn((char *const[]){NGINX, "-q", "-p", s.dir, "-c", conf_path, NULL}, -1, false);
    free(conf_path);
    wait_port(s.nginx_port, s.nginx, "nginx");
    int pipefd[2];
    cr_assert_eq(pipe(pipefd), 0);
    char upstream[16];
    snprintf(upstream, sizeof upstream, "%d", s.nginx_port);
    s.proxy = running.proxy = spawn((char *const[]){"python3", "tests/fault_proxy.py", upstream, NULL}, pipefd[1],
                                    false);
    close(pipefd[1]);
    FILE *f = fdopen(pipefd[0], "r");
    cr_assert_eq(fscanf(f, "%d", &s.proxy_port), 1, "the fault proxy did not say its port"); /* it listens */
    fclose(f);
    return s;
}


static size_t to_buffer(char *p, size_t size, size_t n, void *arg)
{
    char **buf = arg;
    size_t old = *buf ? strlen(*buf) : 0, len = size * n;
    *buf = realloc(*buf, old + len + 1);
    memcpy(*buf + old, p, len);
    (*buf)[old + len] = 0;
    return len;
}

/* GET http://127.0.0.1:PORT/PATH; the body (malloc'ed, "" when empty). */
static char *http_get(int port, const char *path)
{
    char url[512], *body = NULL;
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, to_buffer);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
    cr_assert_eq(curl_easy_perform(c), CURLE_OK, "GET %s", url);
    curl_easy_cleanup(c);
    return body ? body : strdup("");
}

static void fault(const servers *s, const char *query)
{
    char path[256];
    snprintf(path, sizeof path, "/__fault?%s", query);
    free(http_get(s->proxy_port, path));
}

/* How many requests of the proxy's log ("GET /path range status") contain
 * `needle` and, unless NULL, `also`. */
static int log_lines(const servers *s, const char *needle, const char *also)
{
    char *log = http_get(s->proxy_port, "/__log");
    int n = 0;
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n"))
        n += strstr(line, needle) && (!also || strstr(line, also));
    free(log);
    return n;
}
#define log_count(s, needle) log_lines((s), (needle), NULL)

/* Packs `bytes` random bytes (seed) as text, 64-token records, 10% val,
 * into www/name (pack writes the index files). */
static void pack_into(const servers *s, const char *name, size_t bytes, uint64_t seed)
{
    char *in = tu_path(s->dir, "text.txt"), *out = tu_path(s->www, name);
    uint8_t *text = malloc(bytes);
    tu_fill_random(text, bytes, seed);
    tu_write_file(in, text, bytes);
    free(text);
    bb_pack_options o = bb_pack_defaults();
    const char *inputs[1] = {in};
    o.format = BB_PACK_TEXT, o.inputs = inputs, o.input_count = 1, o.seq_len = 64, o.out_dir = out;
    o.val_fraction = 0.1, o.writer.frame_bytes = 16384;
    bb_pack_report r;
    cr_assert_eq(bb_pack(&o, &r), BB_OK, "%s", bb_error_message());
    unlink(in);
    free(in), free(out);
}

static char *url_of(const servers *s, const char *name)
{
    char *u = malloc(256);
    snprintf(u, 256, "http://127.0.0.1:%d/%s/", s->proxy_port, name);
    return u;
}

static bb_status mirror(const char *url, const char *cache, uint64_t cap, char *local)
{
    bb_remote_options o = bb_remote_defaults();
    o.cache_dir = cache;
    o.cache_bytes = cap;
    o.deadline_s = 20;
    o.stall_s = 1;
    return bb_remote_mirror(url, &o, local, 4096);
}

static void assert_same_file(const char *a, const char *b)
{
    size_t na, nb;
    uint8_t *x = tu_read_file(a, &na), *y = tu_read_file(b, &nb);
    cr_assert(na == nb && memcmp(x, y, na) == 0, "%s and %s differ", a, b);
    free(x), free(y);
}

/* The mirror holds what the server has, byte for byte, and the dataset the
 * same identity; a second mirror fetches the indexes only. */
static void assert_mirror_equals(const servers *s, const char *name, const char *local)
{
    const char *parts[] = {"index.json", "train/index.json", "train/shard-00000.bbs", "val/shard-00000.bbs"};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
        char a[4200], b[4200];
        snprintf(a, sizeof a, "%s/%s/%s", s->www, name, parts[i]);
        snprintf(b, sizeof b, "%s/%s", local, parts[i]);
        assert_same_file(a, b);
    }
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/%s/train", s->www, name);
    snprintf(b, sizeof b, "%s/train", local);
    bb_dataset_t *da, *db;
    cr_assert_eq(bb_dataset_open(a, &da), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_dataset_open(b, &db), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_dataset_identity(da), bb_dataset_identity(db));
    bb_dataset_close(da), bb_dataset_close(db);
}

Test(remote, mirror_is_the_data_and_is_reused)
{
    servers s = start_servers();
    pack_into(&s, "ds", 200000, 1);
    char *cache = tu_path(s.dir, "cache"), *url = url_of(&s, "ds"), local[4096];
    cr_assert_eq(mirror(url, cache, 0, local), BB_OK, "%s", bb_error_message());
    assert_mirror_equals(&s, "ds", local);
    cr_assert_eq(log_count(&s, ".bbs"), 2);
    cr_assert_eq(mirror(url, cache, 0, local), BB_OK, "%s", bb_error_message());
    cr_assert_eq(log_count(&s, ".bbs"), 2, "the second mirror fetched shards again");
    cr_assert_eq(log_count(&s, "index.json"), 6, "each mirror reads the three indexes");
    /* a shard the index no longer lists (the dataset packed again, smaller) would be a foreign shard: removed */
    char extra[4200];
    snprintf(extra, sizeof extra, "%s/train/shard-00001.bbs", local);
    tu_write_file(extra, "old", 3);
    cr_assert_eq(mirror(url, cache, 0, local), BB_OK, "%s", bb_error_message());
    cr_assert(!tu_exists(extra));
    assert_mirror_equals(&s, "ds", local);
    free(cache), free(url);
}

Test(remote, faults_are_waited_out)
{
    servers s = start_servers();
    pack_into(&s, "ds", 400000, 2);
    char *cache = tu_path(s.dir, "cache"), *url = url_of(&s, "ds"), local[4096];
    /* two resets mid-file, two 503s, one stall of 3 s (the mirror gives up on a transfer after 1 s), a slow link */
    fault(&s, "reset=2&after=50000");
    fault(&s, "status=2&code=503");
    fault(&s, "stall=1&seconds=3");
    fault(&s, "rate=4000000");
    cr_assert_eq(mirror(url, cache, 0, local), BB_OK, "%s", bb_error_message());
    assert_mirror_equals(&s, "ds", local);
    cr_assert_eq(log_count(&s, " 503"), 2);
    /* a reset loses what the kernel had not handed over yet: the resume starts at what arrived */
    cr_assert_geq(log_lines(&s, " bytes=", " 206"), 1, "a reset transfer resumes where it stopped");
    free(cache), free(url);
}

/* The first .part file under dir (two levels) whose path holds `within`,
 * its size in *bytes; NULL when none. */
static char *find_part(const char *dir, int depth, const char *within, long *bytes)
{
    DIR *d = opendir(dir);
    if (!d) return NULL;
    char *found = NULL;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *p = tu_path(dir, e->d_name);
        struct stat st;
        if (stat(p, &st) == 0 && S_ISDIR(st.st_mode) && depth < 3)
            found = find_part(p, depth + 1, within, bytes);
        else if (strstr(e->d_name, ".bbs.part") && strstr(p, within)) {
            found = strdup(p);
            *bytes = (long)st.st_size;
        }
        free(p);
    }
    closedir(d);
    return found;
}

Test(remote, a_deadline_ends_with_one_line_and_the_next_run_resumes)
{
    servers s = start_servers();
    pack_into(&s, "ds", 400000, 3);
    char *cache = tu_path(s.dir, "cache"), *url = url_of(&s, "ds"), local[4096];
    /* a shard's transfer is reset after 30000 bytes, then the store answers 503 */
    fault(&s, "reset=1&after=30000&then=503");
    tu_run r = tu_bigbatch("inspect", "--cache-dir", cache, "--data-deadline", "1", url);
    tu_assert_error(&r, "gave up after", "HTTP 503", "--data-deadline", ".bbs");
    cr_assert_not_null(strstr(r.err, url), "the line names the URL: %s", r.err);
    tu_run_free(&r);
    long bytes = 0;
    char *part = find_part(cache, 0, "/train/", &bytes); /* the reset one: the other split's may be empty (503s) */
    if (!part || bytes == 0) free(part), part = find_part(cache, 0, "/val/", &bytes);
    cr_assert_not_null(part, "the partial download stays for the next run");
    cr_assert(bytes > 0 && bytes <= 30000, "%ld bytes kept", bytes); /* a reset may drop what was in flight */
    free(part);
    char resume[64];
    snprintf(resume, sizeof resume, "bytes=%ld- 206", bytes);
    fault(&s, "clear=1");
    r = tu_bigbatch("inspect", "--cache-dir", cache, url);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    cr_assert_eq(log_count(&s, resume), 1, "the next run asks for the rest only (%s)", resume);
    cr_assert_eq(mirror(url, cache, 0, local), BB_OK, "%s", bb_error_message());
    assert_mirror_equals(&s, "ds", local);
    free(cache), free(url);
}

Test(remote, http_errors_are_one_line)
{
    servers s = start_servers();
    pack_into(&s, "ds", 100000, 4);
    char *cache = tu_path(s.dir, "cache"), *missing = url_of(&s, "nothere");
    tu_run r = tu_bigbatch("train", "--cache-dir", cache, "--data", missing, "--steps", "1");
    tu_assert_error(&r, missing, "HTTP 404", "pack --index");
    tu_run_free(&r);
    /* the server's shard no longer matches its index: refused, nothing kept */
    char *shard = tu_path(s.www, "ds/train/shard-00000.bbs"), *url = url_of(&s, "ds");
    tu_flip_byte(shard, 100, 0x40);
    r = tu_bigbatch("inspect", "--cache-dir", cache, url);
    tu_assert_error(&r, "train/shard-00000.bbs", "XXH64", "its index says");
    tu_run_free(&r);
    long bytes;
    char *part = find_part(cache, 0, "/train/", &bytes); /* val's may stay, cut short by the error: it resumes */
    cr_assert_null(part, "a file that failed its check is removed: %s", part);
    /* shorter than its index says (the file changed after the index): one line at once, not a wait */
    tu_truncate(shard, 1000);
    double t0 = now_s();
    r = tu_bigbatch("inspect", "--cache-dir", cache, url);
    tu_assert_error(&r, "train/shard-00000.bbs", "ends before", "index is stale");
    cr_assert_lt(now_s() - t0, 5);
    tu_run_free(&r);
    r = tu_bigbatch("inspect", "--data-endpoint", "ftp://x", "s3://bucket/ds");
    tu_assert_error(&r, "--data-endpoint ftp://x", "http:// or https://");
    tu_run_free(&r);
    free(shard), free(url), free(cache), free(missing);
}

/* Bytes of the dataset's shards as the server has them. */
static uint64_t shard_bytes(const servers *s, const char *name)
{
    uint64_t total = 0;
    const char *splits[] = {"train", "val"};
    for (int i = 0; i < 2; i++) {
        char p[4200];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s/%s/shard-00000.bbs", s->www, name, splits[i]);
        cr_assert_eq(stat(p, &st), 0);
        total += (uint64_t)st.st_size;
    }
    return total;
}

/* A mirror made by a process of its own (`inspect`), which marks the
 * mirror in use while it lives and exits; the local directory in `local`. */
static void mirror_by_process(char *url, char *cache, uint64_t cap, char *local)
{
    char gib[64];
    snprintf(gib, sizeof gib, "%.12f", (double)cap / (double)(1ull << 30));
    tu_run r = tu_bigbatch("inspect", "--cache-dir", cache, "--cache-limit", gib, url);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_eq(sscanf(r.out, "%4095[^\n]", local), 1);
    char *slash = strrchr(local, '/'); /* inspect names DIR/train first */
    cr_assert_not_null(slash);
    *slash = 0;
    tu_run_free(&r);
}

Test(remote, the_cache_evicts_the_least_recently_used)
{
    servers s = start_servers();
    pack_into(&s, "a", 150000, 5);
    pack_into(&s, "b", 150000, 6);
    pack_into(&s, "c", 150000, 7);
    uint64_t a = shard_bytes(&s, "a"), b = shard_bytes(&s, "b"), c = shard_bytes(&s, "c");
    uint64_t cap = a + b + c - 1000; /* two of the three fit */
    char *cache = tu_path(s.dir, "cache"), *ua = url_of(&s, "a"), *ub = url_of(&s, "b"), *uc = url_of(&s, "c");
    char la[4096], lb[4096], lc[4096], p[4200];
    mirror_by_process(ua, cache, cap, la);
    mirror_by_process(ub, cache, cap, lb);
    mirror_by_process(ua, cache, cap, la); /* a used again: b is older */
    mirror_by_process(uc, cache, cap, lc);
    snprintf(p, sizeof p, "%s/train/shard-00000.bbs", lb);
    cr_assert(!tu_exists(p), "b, least recently used, is evicted");
    snprintf(p, sizeof p, "%s/train/shard-00000.bbs", la);
    cr_assert(tu_exists(p), "a, used since, stays");
    mirror_by_process(ub, cache, cap, lb); /* b again: fetched, a goes */
    assert_mirror_equals(&s, "b", lb);
    snprintf(p, sizeof p, "%s/train/shard-00000.bbs", la);
    cr_assert(!tu_exists(p));
    /* a mirror that a running process uses (this one, through the library) is never evicted, even when it
     * is the least recently used: c held here, b used after it, a asks for room for one more */
    char held[4096];
    cr_assert_eq(mirror(uc, cache, cap, held), BB_OK, "%s", bb_error_message());
    mirror_by_process(ub, cache, cap, lb);
    mirror_by_process(ua, cache, a + (b > c ? b : c) + 1000, la);
    snprintf(p, sizeof p, "%s/train/shard-00000.bbs", held);
    cr_assert(tu_exists(p), "the mirror this process holds stays");
    snprintf(p, sizeof p, "%s/train/shard-00000.bbs", lb);
    cr_assert(!tu_exists(p), "b goes instead");
    /* a directory of one's own next to the mirrors is never touched */
    char *own = tu_path(cache, "mine"), *own_shard = tu_path(cache, "mine/shard-00000.bbs");
    cr_assert_eq(mkdir(own, 0755), 0);
    tu_write_file(own_shard, "x", 1);
    mirror_by_process(ua, cache, cap, la);
    cr_assert(tu_exists(own_shard));
    cr_assert_eq(mirror(ua, cache, a - 1, la), BB_ERR_IO);
    cr_assert_not_null(strstr(bb_error_message(), "do not fit the cache's limit"), "%s", bb_error_message());
    free(own), free(own_shard), free(cache), free(ua), free(ub), free(uc);
}

/* A mirror that fails keeps what it finished: the next one fetches the rest only. */
Test(remote, a_failed_mirror_keeps_what_it_finished)
{
    servers s = start_servers();
    pack_into(&s, "ds", 300000, 11);
    char *cache = tu_path(s.dir, "cache"), *url = url_of(&s, "ds"), *val = tu_path(s.www, "ds/val/shard-00000.bbs");
    tu_flip_byte(val, 200, 0x10); /* the server's val shard no longer matches its index */
    tu_run r = tu_bigbatch("inspect", "--cache-dir", cache, url);
    tu_assert_error(&r, "val/shard-00000.bbs", "XXH64");
    tu_run_free(&r);
    tu_flip_byte(val, 200, 0x10); /* mended */
    r = tu_bigbatch("inspect", "--cache-dir", cache, url);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    cr_assert_eq(log_count(&s, "train/shard-00000.bbs"), 1, "the train shard, finished the first time, is kept");
    free(cache), free(url), free(val);
}

/* The "loss" values of a metrics file, in order, as printed. */
static char *losses(const char *path)
{
    char *text = (char *)tu_read_file(path, NULL), *out = calloc(1, strlen(text) + 1);
    for (const char *p = text; (p = strstr(p, "\"loss\": ")); p += 8) {
        size_t n = strcspn(p + 8, ",}");
        strncat(out, p + 8, n);
        strcat(out, " ");
    }
    free(text);
    return out;
}

Test(remote, training_on_remote_data_is_training_on_local_data)
{
    servers s = start_servers();
    pack_into(&s, "ds", 300000, 8);
    char *cache = tu_path(s.dir, "cache"), *url = url_of(&s, "ds"), *local = tu_path(s.www, "ds");
    char *m1 = tu_path(s.dir, "local.jsonl"), *m2 = tu_path(s.dir, "remote.jsonl");
    const char *common[] = {"--layers", "1", "--d-model", "32", "--heads", "2", "--global-batch", "8",
                            "--micro-batch", "4", "--steps", "6", "--eval-every", "3", "--log-every", "1", "--quiet"};
    char *argv[40];
    for (int run = 0; run < 2; run++) {
        int n = 0;
        argv[n++] = (char *)tu_bigbatch_bin();
        argv[n++] = "train";
        argv[n++] = "--data";
        argv[n++] = run ? url : local;
        argv[n++] = "--metrics";
        argv[n++] = run ? m2 : m1;
        argv[n++] = "--cache-dir";
        argv[n++] = cache;
        for (size_t i = 0; i < sizeof common / sizeof *common; i++) argv[n++] = (char *)common[i];
        argv[n] = NULL;
        tu_run r = tu_run_argv(argv);
        cr_assert_eq(r.exit_code, 0, "%s", r.err);
        tu_run_free(&r);
    }
    tu_run plan = tu_bigbatch("plan", "--data", url, "--cache-dir", cache, "--layers", "1", "--d-model", "32", "--heads",
                              "2", "--global-batch", "8", "--json");
    cr_assert_eq(plan.exit_code, 0, "plan --data URL: %s", plan.err);
    tu_run_free(&plan);
    char *a = losses(m1), *b = losses(m2);
    cr_assert_gt(strlen(a), 20, "losses: %s", a);
    cr_assert_str_eq(a, b, "the remote run's losses differ from the local run's");
    char *run_line = (char *)tu_read_file(m2, NULL), want[300];
    snprintf(want, sizeof want, "\"data_url\": \"%s\"", url);
    cr_assert_not_null(strstr(run_line, want), "the metrics' run line says where the data came from");
    free(run_line);
    /* stopped after 3 steps and resumed from the remote data: the uninterrupted run's last steps */
    char *ck = tu_path(s.dir, "ck"), *m3 = tu_path(s.dir, "resumed.jsonl");
    tu_run r = tu_bigbatch("train", "--data", url, "--cache-dir", cache, "--layers", "1", "--d-model", "32", "--heads",
                           "2", "--global-batch", "8", "--micro-batch", "4", "--steps", "6", "--stop-after", "3",
                           "--eval-every", "3", "--save", ck, "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    /* --resume alone, on "another node": an empty cache elsewhere; the checkpoint's URL is fetched again */
    char *cache2 = tu_path(s.dir, "cache2");
    r = tu_bigbatch("train", "--resume", ck, "--cache-dir", cache2, "--steps", "6", "--log-every", "1", "--metrics", m3,
                    "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_str_empty(r.err, "no warning: %s", r.err);
    tu_run_free(&r);
    char *lock = tu_path(cache2, ".lock");
    cr_assert(tu_exists(lock), "the resumed run read the data through the new cache");
    free(lock);
    char *c = losses(m3);
    cr_assert_gt(strlen(c), 10, "losses: %s", c);
    cr_assert_str_eq(a + strlen(a) - strlen(c), c, "resumed %s, uninterrupted %s", c, a);
    /* eval --ckpt: the run's validation split, fetched as the run recorded it */
    r = tu_bigbatch("eval", "--ckpt", ck, "--cache-dir", cache2, "--json");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.out, "\"loss\""), "%s", r.out);
    tu_run_free(&r);
    free(c), free(ck), free(m3), free(cache2);
    free(a), free(b), free(m1), free(m2), free(cache), free(url), free(local);
}

/* Training on a URL streams the training shards: the first step runs once
 * its frames are in, before the last chunk arrives; chunks come by range
 * requests, resets and 503s on the way are waited out, and the losses are
 * the local run's. */
Test(remote, training_streams_its_shards)
{
    servers s = start_servers();
    pack_into(&s, "ds", 6000000, 12);
    char *cache = tu_path(s.dir, "cache"), *url = url_of(&s, "ds"), *local = tu_path(s.www, "ds");
    char *m1 = tu_path(s.dir, "local.jsonl"), *m2 = tu_path(s.dir, "remote.jsonl");
    char *argv[40];
    for (int run = 0; run < 2; run++) {
        if (run) fault(&s, "rate=1000000"), fault(&s, "reset=2&after=300000"), fault(&s, "status=2&code=503");
        int n = 0;
        const char *args[] = {tu_bigbatch_bin(), "train", "--data", run ? url : local, "--metrics", run ? m2 : m1,
                              "--cache-dir", cache, "--layers", "1", "--d-model", "32", "--heads", "2",
                              "--global-batch", "8", "--micro-batch", "8", "--steps", "3", "--eval-every", "0",
                              "--log-every", "1", "--data-deadline", "30", "--shuffle-frames", "8"};
        for (size_t i = 0; i < sizeof args / sizeof *args; i++) argv[n++] = (char *)args[i];
        argv[n] = NULL;
        setenv("BB_LOG", "info", 1); /* the stream's lines */
        tu_run r = tu_run_argv(argv);
        unsetenv("BB_LOG");
        cr_assert_eq(r.exit_code, 0, "%s", r.err);
        if (run) {
            const char *step = strstr(r.err, "step 1/"), *done = strstr(r.err, "streamed shards are complete");
            if (!done) done = strstr(r.err, "streamed shards incomplete");
            cr_assert_not_null(strstr(r.err, "streaming 1 shards"), "%s", r.err);
            cr_assert(step && done && step < done, "the first step ran before the last chunk came: %s", r.err);
        }
        tu_run_free(&r);
    }
    char *a = losses(m1), *b = losses(m2);
    cr_assert_gt(strlen(a), 5, "losses: %s", a);
    cr_assert_str_eq(a, b, "the streamed run's losses differ from the local run's");
    cr_assert_gt(log_lines(&s, "train/shard-00000.bbs bytes=", " 206"), 5, "the shard came in ranges");
    cr_assert_eq(log_lines(&s, "train/shard-00000.bbs -", NULL), 0, "never as a whole file");
    free(a), free(b), free(m1), free(m2), free(cache), free(url), free(local);
}

static tu_run train_streaming(char *url, char *cache, char *deadline)
{
    setenv("BB_LOG", "info", 1);
    tu_run r = tu_bigbatch("train", "--data", url, "--cache-dir", cache, "--layers", "1", "--d-model", "32",
                           "--heads", "2", "--global-batch", "8", "--micro-batch", "8", "--steps", "3",
                           "--eval-every", "0", "--shuffle-frames", "8", "--data-deadline", deadline);
    unsetenv("BB_LOG");
    return r;
}

/* A run that ends before its shards do keeps the chunks it got for the
 * next run; a store down while the shards' metadata is read ends the run
 * with one line after the deadline. */
Test(remote, a_partial_stream_is_kept_for_the_next_run)
{
    servers s = start_servers();
    pack_into(&s, "ds", 6000000, 13);
    char *cache = tu_path(s.dir, "cache"), *url = url_of(&s, "ds");
    fault(&s, "rate=40000"); /* the shard takes 40 s; 3 steps and the final evaluation far less */
    tu_run r = train_streaming(url, cache, "30");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "streamed shards incomplete"), "ended before the shard: %s", r.err);
    tu_run_free(&r);
    int first = log_lines(&s, "train/shard-00000.bbs bytes=", " 206");
    fault(&s, "clear=1");
    fault(&s, "reset=1&after=100&then=503");
    r = train_streaming(url, cache, "1");
    cr_assert_eq(r.exit_code, 1, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "gave up after"), "%s", r.err);
    tu_run_free(&r);
    fault(&s, "clear=1");
    int before = log_lines(&s, "train/shard-00000.bbs bytes=", " 206");
    r = train_streaming(url, cache, "30");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    const char *kept = strstr(r.err, "chunks kept from a run before");
    cr_assert(kept && kept[-2] != '(' && strstr(r.err, "(0 chunks kept") == NULL, "chunks kept: %s", r.err);
    tu_run_free(&r);
    int again = log_lines(&s, "train/shard-00000.bbs bytes=", " 206") - before;
    cr_assert_lt(again, 64 + 2, "the kept chunks are not fetched again (%d requests, %d before)", again, first);
    char local[4096];
    cr_assert_eq(mirror(url, cache, 0, local), BB_OK, "%s", bb_error_message());
    assert_mirror_equals(&s, "ds", local);
    free(cache), free(url);
}

/* Ctrl-C while a step waits for bytes that keep failing (503s, retried for
 * the 300 s deadline) ends the run at once. */
Test(remote, ctrl_c_ends_a_wait_for_streamed_data)
{
    servers s = start_servers();
    pack_into(&s, "ds", 3000000, 14);
    char *cache = tu_path(s.dir, "cache"), *url = url_of(&s, "ds"), *err = tu_path(s.dir, "err.txt");
    fault(&s, "status=1000000000&code=503&skip=3"); /* the val shard and the train shard's metadata, then 503s */
    int fd = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = spawn((char *const[]){(char *)tu_bigbatch_bin(), "train", "--data", url, "--cache-dir", cache, "--layers",
                                      "1", "--d-model", "32", "--heads", "2", "--global-batch", "8", "--micro-batch",
                                      "8", "--steps", "3", "--shuffle-frames", "8", "--quiet", NULL},
                      fd, true);
    close(fd);
    for (double t0 = now_s(); !log_lines(&s, "train/shard-00000.bbs bytes=", " 503");) { /* it waits for a chunk */
        cr_assert_lt(now_s() - t0, 30, "no chunk was asked for");
        usleep(20000);
    }
    kill(pid, SIGINT);
    double t0 = now_s();
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (now_s() - t0 > 10) {
            kill(pid, SIGKILL);
            cr_assert_fail("still waiting 10 s after Ctrl-C");
        }
        usleep(20000);
    }
    char *text = (char *)tu_read_file(err, NULL);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) != 0, "%s", text);
    cr_assert_not_null(strstr(text, "interrupted while"), "%s", text);
    free(text), free(err), free(cache), free(url);
}

/* What a killed run leaves (the staging tree's hard link to the mirror's
 * shard) is never truncated or written through when the dataset, packed
 * again, streams: the mirror ends as the server's files. */
Test(remote, a_stream_never_writes_through_the_mirror)
{
    servers s = start_servers();
    pack_into(&s, "ds", 3000000, 15);
    char *cache = tu_path(s.dir, "cache"), *url = url_of(&s, "ds"), local[4096], from[4200], to[4200];
    cr_assert_eq(mirror(url, cache, 0, local), BB_OK, "%s", bb_error_message());
    snprintf(from, sizeof from, "%s/train/shard-00000.bbs", local);
    snprintf(to, sizeof to, "%s/.stream/train/shard-00000.bbs", local);
    cr_assert_eq(bb_make_parents(to, NULL), BB_OK);
    cr_assert_eq(link(from, to), 0);
    char *www_ds = tu_path(s.www, "ds");
    tu_rm_tree(www_ds);
    pack_into(&s, "ds", 3000000, 16);
    fault(&s, "rate=40000"); /* ends before the shard does */
    tu_run r = train_streaming(url, cache, "30");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "streamed shards incomplete"), "%s", r.err);
    tu_run_free(&r);
    fault(&s, "clear=1");
    cr_assert_eq(mirror(url, cache, 0, local), BB_OK, "%s", bb_error_message());
    assert_mirror_equals(&s, "ds", local);
    free(www_ds), free(cache), free(url);
}

/* The processes of a node share the cache: the first downloads while the
 * others wait on its lock, then find the files (each shard fetched once). */
Test(remote, processes_sharing_a_cache_download_once)
{
    servers s = start_servers();
    pack_into(&s, "ds", 600000, 10);
    fault(&s, "rate=3000000"); /* slow enough that the three overlap */
    char *cache = tu_path(s.dir, "cache"), *url = url_of(&s, "ds");
    int devnull = open("/dev/null", O_WRONLY);
    pid_t pids[3];
    for (int i = 0; i < 3; i++)
        pids[i] = spawn((char *const[]){(char *)tu_bigbatch_bin(), "inspect", "--cache-dir", cache, url, NULL}, devnull,
                        true);
    close(devnull);
    for (int i = 0; i < 3; i++) {
        int status;
        cr_assert_eq(waitpid(pids[i], &status, 0), pids[i]);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "process %d failed", i);
    }
    cr_assert_eq(log_count(&s, ".bbs"), 2, "each shard is downloaded once");
    free(cache), free(url);
}

/* ---- S3: moto's server, SigV4 enforced once the keys exist ----------------- */

Test(remote, s3_requests_are_signed)
{
    if (access(MOTO_PYTHON, X_OK) != 0 || system(MOTO_PYTHON " -c 'import moto.server' 2>/dev/null") != 0)
        cr_skip_test("skipped: no moto in build/s3 (make test installs it: make s3-deps)");
    servers s = start_servers();
    pack_into(&s, "ds", 200000, 9);
    int port = free_port();
    char port_s[16], endpoint[64];
    snprintf(port_s, sizeof port_s, "%d", port);
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%d", port);
    setenv("INITIAL_NO_AUTH_ACTION_COUNT", "3", 1); /* the IAM calls that make the keys; then every request is checked */
    int devnull = open("/dev/null", O_WRONLY);
    moto = spawn((char *const[]){MOTO_PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p", port_s, NULL}, devnull,
                 true);
    close(devnull);
    unsetenv("INITIAL_NO_AUTH_ACTION_COUNT");
    wait_port(port, moto, "moto");
    char *ds = tu_path(s.www, "ds"), *keys = tu_path(s.dir, "keys");
    char cmd[8192];
    snprintf(cmd, sizeof cmd, MOTO_PYTHON " tests/s3_setup.py %s datasets ds %s > %s", endpoint, ds, keys);
    cr_assert_eq(system(cmd), 0, "tests/s3_setup.py failed");
    char key[128] = "", secret[128] = "";
    FILE *f = fopen(keys, "r");
    cr_assert_eq(fscanf(f, "%127s %127s", key, secret), 2);
    fclose(f);
    char *cache = tu_path(s.dir, "cache"), local[4096];
    setenv("AWS_ACCESS_KEY_ID", key, 1);
    setenv("AWS_SECRET_ACCESS_KEY", secret, 1);
    setenv("AWS_REGION", "us-east-1", 1);
    bb_remote_options o = bb_remote_defaults();
    o.cache_dir = cache;
    o.endpoint = endpoint;
    cr_assert_eq(bb_remote_mirror("s3://datasets/ds", &o, local, sizeof local), BB_OK, "%s", bb_error_message());
    assert_mirror_equals(&s, "ds", local);
    setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret", 1);
    tu_run r = tu_bigbatch("inspect", "--cache-dir", cache, "--data-endpoint", endpoint, "s3://datasets/ds");
    tu_assert_error(&r, "s3://datasets/ds/index.json", "HTTP 403", "SignatureDoesNotMatch");
    tu_run_free(&r);
    unsetenv("AWS_ACCESS_KEY_ID"), unsetenv("AWS_SECRET_ACCESS_KEY");
    /* the keys from a credentials file whose other profile holds a session token of 1200 bytes */
    char *creds = tu_path(s.dir, "credentials"), *cache2 = tu_path(s.dir, "cache2"), text[2048];
    int n = snprintf(text, sizeof text, "# test\n[default]\naws_access_key_id = %s\naws_secret_access_key=%s\n\n"
                     "[other]\naws_session_token = ", key, secret);
    memset(text + n, 'T', 1200);
    tu_write_file(creds, text, (size_t)n + 1200);
    setenv("AWS_SHARED_CREDENTIALS_FILE", creds, 1);
    r = tu_bigbatch("inspect", "--cache-dir", cache2, "--data-endpoint", endpoint, "s3://datasets/ds");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    /* training streams the shards by signed range requests */
    char *cache3 = tu_path(s.dir, "cache3");
    setenv("BB_LOG", "info", 1);
    r = tu_bigbatch("train", "--data", "s3://datasets/ds", "--data-endpoint", endpoint, "--cache-dir", cache3,
                    "--layers", "1", "--d-model", "32", "--heads", "2", "--global-batch", "8", "--micro-batch", "8",
                    "--steps", "2", "--shuffle-frames", "8");
    unsetenv("BB_LOG");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "streaming 1 shards"), "%s", r.err);
    tu_run_free(&r);
    free(cache3);
    /* no credentials anywhere: unsigned, refused, and the line says so */
    setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials", 1);
    setenv("AWS_CONFIG_FILE", "/nonexistent/config", 1);
    r = tu_bigbatch("inspect", "--cache-dir", cache2, "--data-endpoint", endpoint, "s3://datasets/ds");
    tu_assert_error(&r, "HTTP 403", "sent unsigned");
    tu_run_free(&r);
    unsetenv("AWS_SHARED_CREDENTIALS_FILE"), unsetenv("AWS_CONFIG_FILE"), unsetenv("AWS_REGION");
    free(creds), free(cache2);
    free(ds), free(keys), free(cache);
}
