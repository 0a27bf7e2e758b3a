/* remote_url.c — where a remote dataset's files are fetched from, and how
 * requests to it are signed: http(s) URLs as given; s3:// URLs mapped to an
 * endpoint and signed with SigV4 from the standard AWS variables and files
 * (read with inih). See remote.h. */
#include "remote_internal.h"

#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool bb_remote_is_url(const char *path)
{
    return path && (!strncmp(path, "s3://", 5) || !strncmp(path, "http://", 7) || !strncmp(path, "https://", 8));
}

/* One profile's keys from an AWS credentials or config file. */
typedef struct ini_pick {
    const char *section;  /* "default", "profile x" or "x" */
    const char *section2; /* an alternative spelling, or NULL */
    char key[128], secret[256], token[2048], region[64];
} ini_pick;

static int on_ini(void *user, const char *section, const char *name, const char *value)
{
    ini_pick *p = user;
    if (strcmp(section, p->section) && (!p->section2 || strcmp(section, p->section2))) return 1;
    if (!strcmp(name, "aws_access_key_id")) snprintf(p->key, sizeof p->key, "%s", value);
    else if (!strcmp(name, "aws_secret_access_key")) snprintf(p->secret, sizeof p->secret, "%s", value);
    else if (!strcmp(name, "aws_session_token")) snprintf(p->token, sizeof p->token, "%s", value);
    else if (!strcmp(name, "region")) snprintf(p->region, sizeof p->region, "%s", value);
    return 1;
}

/* Reads `file` (or $HOME/.aws/`fallback`) into pick; an absent file is no
 * error, one that does not parse is. */
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
    int line = ini_parse(path, on_ini, pick);
    if (line > 0) return bb_fail(BB_ERR_FORMAT, "%s: line %d: not an AWS configuration line", path, line);
    if (line == -2) return bb_fail(BB_ERR_NOMEM, "%s: out of memory", path);
    return BB_OK; /* -1: no such file */
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
    BB_TRY(read_aws_file(env("AWS_SHARED_CREDENTIALS_FILE"), "credentials", &creds));
    BB_TRY(read_aws_file(env("AWS_CONFIG_FILE"), "config", &config));
    if (env("AWS_ACCESS_KEY_ID") && env("AWS_SECRET_ACCESS_KEY")) {
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
