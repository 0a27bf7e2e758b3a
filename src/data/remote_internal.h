/* remote_internal.h — the pieces of remote.c: where a URL's files come from
 * and how its requests are signed (remote_url.c).
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

#endif /* BIGBATCH_REMOTE_INTERNAL_H */
