/* data_flags.h — private: where train, eval, inspect, plan and bench
 * loader find data given as a URL (remote.h): the flags, and the mirror
 * that turns --data s3://... or https://... into a local directory.
 *
 *   data_flags df = DATA_FLAGS_DEFAULT;
 *   bb_opt opts[] = {..., DATA_FLAGS_OPTS(df), {0}};
 *   ... bb_cli_parse ...
 *   BB_TRY(data_flags_resolve(&df, &data));   // data now names a local directory
 */
#ifndef BIGBATCH_CLI_DATA_FLAGS_H
#define BIGBATCH_CLI_DATA_FLAGS_H

#include "bigbatch/remote.h"

typedef struct data_flags {
    bb_remote_options remote;
    double cache_gib;         /* --cache-limit; 0: none */
    char local[2][4096];      /* the mirrors of up to two URLs (data, validation) */
    bb_remote_stats stats[2]; /* what each mirror fetched */
    bb_remote_stream_t *streams[2]; /* the shards still arriving (NULL: none) */
    int used;
    bool wait;                /* --wait-for-data: whole files before the first step */
} data_flags;

#define DATA_FLAGS_DEFAULT {.remote = bb_remote_defaults()}

#define DATA_FLAGS_OPTS(d)                                                                                        \
    {"--data-endpoint", BB_OPT_STRING, &(d).remote.endpoint, "URL", "s3:// data: the S3-compatible store to "    \
     "ask, path-style (default: AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, else AWS)"},                             \
    {"--cache-dir", BB_OPT_STRING, &(d).remote.cache_dir, "DIR", "where s3:// and https:// data are mirrored, "  \
     "shard by shard (default: $XDG_CACHE_HOME/bigbatch or ~/.cache/bigbatch)"},                                  \
    {"--cache-limit", BB_OPT_DOUBLE, &(d).cache_gib, "GIB", "cap on the cache's shards: other datasets' go, "     \
     "least recently used first (default: none)", .min = 0.0001, .max = 1e9},                                     \
    {"--data-deadline", BB_OPT_DOUBLE, &(d).remote.deadline_s, "S", "a download that keeps failing this long "   \
     "(resets, 503s, stalls; retried with backoff) ends the command", .min = 1, .max = 1e7}
/* For the command that streams (train). */
#define DATA_FLAGS_WAIT_OPT(d)                                                                                    \
    {"--wait-for-data", BB_OPT_FLAG, &(d).wait, NULL, "s3:// and https:// training data: download every shard "  \
     "before the first step (default: stream them; the first step runs once its frames are in)"}

/* When *path is a URL: mirrors it (bb_remote_mirror, interrupted by
 * Ctrl-C) or, with `stream` and without --wait-for-data, streams its
 * training shards (bb_remote_stream_open), and points *path at the local
 * tree, which lives until data_flags_close. Other paths are left as they
 * are. Fails as bb_remote_mirror. */
bb_status data_flags_resolve(data_flags *d, const char **path, bool stream);
/* Stops the streams (after every dataset opened in them is closed). */
void data_flags_close(data_flags *d);

#endif /* BIGBATCH_CLI_DATA_FLAGS_H */
