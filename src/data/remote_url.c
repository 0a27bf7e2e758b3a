/* remote_url.c — where a remote dataset's files are fetched from, and how
 * requests to it are signed: http(s) URLs as given; s3:// URLs mapped to an
 * endpoint and signed with SigV4 from the standard AWS variables and files
 * (read by hand: see read_aws_file). See remote.h. */
#include "remote_internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool bb_remote_is_url(const char *path)
{
    return path && (!strncmp(path, "s3://", 5) || !strncmp(path, "http://", 7) || !strncmp(path, "https://", 8));
}

/* One profile's keys from an AWS credentials or config file. */
typedef struct ini_pick {
    const char *section;  /* "default", "profile x" or "x" */
    char key[128], secret[256], token[4096], region[64];
} ini_pick;

static char *trim(char *s)
{
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
    return s;
}

/* Reads `file` (or $HOME/.aws/`fallback`) into pick: [section] lines and
 * `key = value` lines, `#` and `;` comments. By hand: Debian's libinih cuts
 * lines at 200 bytes, and a session token is longer. An absent file is no
 * error; a line that is none of these is. */
static bb_status read_aws_file(const char *file, const char *fallback, ini_pick *pick)
{
    char path[4096];
    const char *home = getenv("HOME");
    if (file && *file)
        snprintf(path, sizeof path, "%s", file);
    else if (home)
        snprintf(path, sizeof path, "%s/.aws/%s", home, fallback);
    else
        return BB_OK;
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT ? BB_OK : bb_fail_errno(BB_ERR_IO, "%s: cannot open", path);
    char *line = NULL, section[256] = "";
    size_t cap = 0;
    bb_status rc = BB_OK;
    for (int number = 1; rc == BB_OK && getline(&line, &cap, f) >= 0; number++) {
        char *t = trim(line), *eq = strchr(t, '=');
        size_t n = strlen(t);
        if (!*t || *t == '#' || *t == ';') continue;
        if (*t == '[' && t[n - 1] == ']') {
            t[n - 1] = 0;
            snprintf(section, sizeof section, "%s", trim(t + 1));
        } else if (!eq) {
            rc = bb_fail(BB_ERR_FORMAT, "%s: line %d: not an AWS configuration line", path, number);
        } else if (!strcmp(section, pick->section)) {
            *eq = 0;
            const char *k = trim(t), *v = trim(eq + 1);
            if (!strcmp(k, "aws_access_key_id")) snprintf(pick->key, sizeof pick->key, "%s", v);
            else if (!strcmp(k, "aws_secret_access_key")) snprintf(pick->secret, sizeof pick->secret, "%s", v);
            else if (!strcmp(k, "aws_session_token")) snprintf(pick->token, sizeof pick->token, "%s", v);
            else if (!strcmp(k, "region")) snprintf(pick->region, sizeof pick->region, "%s", v);
        }
    }
    free(line);
    fclose(f);
    return rc;
}

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

bb_status bb_remote_site_init(bb_remote_site *s, const char *url, const char *endpoint)
{
    *s = (bb_remote_site){0};
    size_t n = strlen(url);
    if (n + 2 > sizeof s->base) return bb_fail(BB_ERR_ARG, "%s: URL too long", url);
    const char *slash = n && url[n - 1] == '/' ? "" : "/";
    snprintf(s->shown, sizeof s->shown, "%s%s", url, slash);
    if (strncmp(url, "s3://", 5)) {
        const char *host = strstr(url, "://") + 3;
        if (!*host || *host == '/') return bb_fail(BB_ERR_ARG, "%s: the URL names no host", url);
        snprintf(s->base, sizeof s->base, "%s%s", url, slash);
        return BB_OK;
    }
    const char *bucket = url + 5, *key = strchr(bucket, '/');
    size_t blen = key ? (size_t)(key - bucket) : strlen(bucket);
    if (blen == 0 || blen > 63) return bb_fail(BB_ERR_ARG, "%s: s3://BUCKET/PREFIX/ names no bucket", url);
    key = key ? key + 1 : "";
    size_t klen = strlen(key);
    const char *kslash = klen && key[klen - 1] != '/' ? "/" : "";

    const char *profile = env("AWS_PROFILE") ? env("AWS_PROFILE") : "default";
    char config_section[160];
    snprintf(config_section, sizeof config_section, "profile %s", profile);
    ini_pick creds = {.section = profile}, config = {.section = strcmp(profile, "default") ? config_section : "default"};
    bool from_env = env("AWS_ACCESS_KEY_ID") && env("AWS_SECRET_ACCESS_KEY");
    bool need_region = !env("AWS_REGION") && !env("AWS_DEFAULT_REGION");
    if (!from_env) BB_TRY(read_aws_file(env("AWS_SHARED_CREDENTIALS_FILE"), "credentials", &creds));
    if (need_region || (!from_env && !*creds.key)) /* the files are read only for what the environment lacks */
        BB_TRY(read_aws_file(env("AWS_CONFIG_FILE"), "config", &config));
    if (from_env) {
        snprintf(s->key, sizeof s->key, "%s", env("AWS_ACCESS_KEY_ID"));
        snprintf(s->secret, sizeof s->secret, "%s", env("AWS_SECRET_ACCESS_KEY"));
        snprintf(s->token, sizeof s->token, "%s", env("AWS_SESSION_TOKEN") ? env("AWS_SESSION_TOKEN") : "");
    } else if (*creds.key && *creds.secret) {
        snprintf(s->key, sizeof s->key, "%s", creds.key);
        snprintf(s->secret, sizeof s->secret, "%s", creds.secret);
        snprintf(s->token, sizeof s->token, "%s", creds.token);
    } else if (*config.key && *config.secret) { /* keys may also sit in config */
        snprintf(s->key, sizeof s->key, "%s", config.key);
        snprintf(s->secret, sizeof s->secret, "%s", config.secret);
        snprintf(s->token, sizeof s->token, "%s", config.token);
    }
    const char *region = env("AWS_REGION")           ? env("AWS_REGION")
                         : env("AWS_DEFAULT_REGION") ? env("AWS_DEFAULT_REGION")
                         : *config.region            ? config.region
                                                     : "us-east-1";
    snprintf(s->region, sizeof s->region, "%s", region);
    s->s3 = true;
    s->signed_s3 = *s->key != 0;
    if (!endpoint) endpoint = env("AWS_ENDPOINT_URL_S3") ? env("AWS_ENDPOINT_URL_S3") : env("AWS_ENDPOINT_URL");
    int w;
    if (endpoint) {
        if (strncmp(endpoint, "http://", 7) && strncmp(endpoint, "https://", 8))
            return bb_fail(BB_ERR_ARG, "--data-endpoint %s: give an http:// or https:// URL", endpoint);
        size_t e = strlen(endpoint);
        while (e && endpoint[e - 1] == '/') e--;
        w = snprintf(s->base, sizeof s->base, "%.*s/%.*s/%s%s", (int)e, endpoint, (int)blen, bucket, key, kslash);
    } else {
        w = snprintf(s->base, sizeof s->base, "https://%.*s.s3.%s.amazonaws.com/%s%s", (int)blen, bucket, s->region,
                     key, kslash);
    }
    if (w < 0 || (size_t)w >= sizeof s->base) return bb_fail(BB_ERR_ARG, "%s: URL too long", url);
    return BB_OK;
}

bb_status bb_remote_site_setup(const bb_remote_site *s, CURL *easy, struct curl_slist **headers)
{
    *headers = NULL;
    curl_easy_setopt(easy, CURLOPT_USERAGENT, "bigbatch");
    if (!s->signed_s3) return BB_OK;
#if LIBCURL_VERSION_NUM < 0x075700 /* 7.87: the payload hash taken from x-amz-content-sha256 (curl PR 9804) */
    return bb_fail(BB_ERR_UNSUPPORTED, "%s: signing S3 requests needs libcurl 7.87 or later (this one is %s)", s->shown,
                   LIBCURL_VERSION);
#endif
    char sigv4[128], userpwd[sizeof s->key + sizeof s->secret + 2], token[sizeof s->token + 32];
    snprintf(sigv4, sizeof sigv4, "aws:amz:%s:s3", s->region);
    snprintf(userpwd, sizeof userpwd, "%s:%s", s->key, s->secret);
    /* S3 wants the payload's hash in a header; curl signs the value given. */
    struct curl_slist *h = curl_slist_append(NULL, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (h && *s->token) {
        snprintf(token, sizeof token, "x-amz-security-token: %s", s->token);
        struct curl_slist *more = curl_slist_append(h, token);
        if (!more) curl_slist_free_all(h);
        h = more;
    }
    if (!h) return bb_fail(BB_ERR_NOMEM, "out of memory for request headers");
    *headers = h;
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(easy, CURLOPT_AWS_SIGV4, sigv4);
    curl_easy_setopt(easy, CURLOPT_USERPWD, userpwd); /* curl copies option strings */
    return BB_OK;
}

/* ---- requests ------------------------------------------------------------ */

bb_status bb_remote_path_of(char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap) return bb_fail(BB_ERR_ARG, "%.80s...: path or URL too long", out);
    return BB_OK;
}

bb_status bb_remote_request(const bb_remote_site *s, const bb_remote_options *o, CURLM *multi, const char *url,
                            curl_write_callback write, void *ctx, const char *range, CURL **easy,
                            struct curl_slist **headers)
{
    *headers = NULL;
    CURL *e = *easy = curl_easy_init();
    if (!e) return bb_fail(BB_ERR_NOMEM, "%s: cannot start a transfer", url);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, ctx);
    curl_easy_setopt(e, CURLOPT_PRIVATE, ctx);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L); /* a stall: no byte for stall_s */
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)ceil(o->stall_s));
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    if (range) curl_easy_setopt(e, CURLOPT_RANGE, range);
    BB_TRY(bb_remote_site_setup(s, e, headers));
    if (curl_multi_add_handle(multi, e) != CURLM_OK)
        return bb_fail(BB_ERR_INTERNAL, "%s: curl_multi_add_handle failed", url);
    return BB_OK;
}

void bb_remote_request_end(CURLM *multi, CURL **easy, struct curl_slist **headers)
{
    if (*easy) {
        curl_multi_remove_handle(multi, *easy);
        curl_easy_cleanup(*easy);
        *easy = NULL;
    }
    curl_slist_free_all(*headers);
    *headers = NULL;
}

int bb_remote_pwrite(int fd, const void *data, size_t len, uint64_t offset)
{
    for (size_t off = 0; off < len;) {
        ssize_t w = pwrite(fd, (const char *)data + off, len - off, (off_t)(offset + off));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? errno : ENOSPC;
        off += (size_t)w;
    }
    return 0;
}

void bb_remote_answer_keep(bb_remote_answer *a, const char *data, size_t len)
{
    size_t room = sizeof a->body - 1 - a->body_len, take = len < room ? len : room;
    memcpy(a->body + a->body_len, data, take);
    a->body_len += take;
    a->body[a->body_len] = 0;
}

void bb_remote_answer_describe(const bb_remote_answer *a, CURLcode cc, char *buf, size_t cap)
{
    if (cc != CURLE_OK) {
        snprintf(buf, cap, "%s", curl_easy_strerror(cc));
        return;
    }
    /* An S3 error is an XML document whose <Code> says it (AccessDenied,
     * SignatureDoesNotMatch, NoSuchKey): that element's text, else the body's
     * start on one line. Only a message is made of it. */
    const char *code = strstr(a->body, "<Code>"), *end = code ? strstr(code, "</Code>") : NULL;
    if (code && end) {
        snprintf(buf, cap, "HTTP %ld: %.*s", a->code, (int)(end - code - 6), code + 6);
        return;
    }
    char body[sizeof a->body];
    size_t n = 0;
    for (size_t i = 0; i < a->body_len && n + 1 < sizeof body; i++) { /* whitespace runs become one space */
        bool space = isspace((unsigned char)a->body[i]);
        if (!space || (n && body[n - 1] != ' ')) body[n++] = space ? ' ' : a->body[i];
    }
    while (n && body[n - 1] == ' ') n--;
    body[n] = 0;
    snprintf(buf, cap, "HTTP %ld%s%.120s", a->code, n ? ": " : "", body);
}

bool bb_remote_retryable(CURLcode cc, long code)
{
    if (cc == CURLE_UNSUPPORTED_PROTOCOL || cc == CURLE_URL_MALFORMAT || cc == CURLE_LOGIN_DENIED ||
        cc == CURLE_REMOTE_ACCESS_DENIED || cc == CURLE_PEER_FAILED_VERIFICATION)
        return false;
    if (code > 0 && code != 200 && code != 206) /* an answer: only these may change by waiting */
        return code == 408 || code == 416 || code == 429 || code >= 500;
    return true; /* no answer, or one cut short: resets, time-outs, stalls */
}

bb_status bb_remote_retry_after(bb_remote_retry *r, const bb_remote_options *o, uint64_t *seed, uint64_t have,
                                const char *what, const char *why)
{
    double now = bb_clock_seconds();
    if (have > r->high || !r->fail_since) r->fail_since = now; /* progress restarts the deadline */
    if (have > r->high) r->high = have;
    r->attempts++;
    if (now - r->fail_since > o->deadline_s)
        return bb_fail(BB_ERR_IO, "%s: gave up after %d attempts over %.0f s (--data-deadline): %s", what,
                       r->attempts, now - r->fail_since, why);
    double backoff = 0.1 * ldexp(1.0, r->attempts - 1 < 6 ? r->attempts - 1 : 6); /* 0.1 s .. 6.4 s */
    double jitter = 0.5 + 0.5 * (double)(bb_splitmix64(seed) >> 11) / 9007199254740992.0;
    r->next_try = now + backoff * jitter;
    BB_INFO("%s: %s; retrying in %.1f s", what, why, backoff * jitter);
    return BB_OK;
}
