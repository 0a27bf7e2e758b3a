/* data_flags.c — --data given as a URL. See data_flags.h. */
#include "data_flags.h"

#include "commands.h"

#include <string.h>

bb_status data_flags_resolve(data_flags *d, const char **path, bool stream)
{
    if (!*path || !bb_remote_is_url(*path)) return BB_OK;
    if (d->used == 2) return bb_fail(BB_ERR_INTERNAL, "more than two remote datasets in one command");
    d->remote.cache_bytes = (uint64_t)(d->cache_gib * (double)(1ull << 30));
    d->remote.interrupted = &bb_cli_interrupted;
    char *out = d->local[d->used];
    d->remote.stats = &d->stats[d->used];
    if (stream && !d->wait)
        BB_TRY(bb_remote_stream_open(*path, &d->remote, out, sizeof d->local[0], &d->streams[d->used]));
    else
        BB_TRY(bb_remote_mirror(*path, &d->remote, out, sizeof d->local[0]));
    d->used++;
    *path = out;
    return BB_OK;
}

void data_flags_close(data_flags *d)
{
    for (int i = 0; i < 2; i++) bb_remote_stream_close(d->streams[i]);
    memset(d->streams, 0, sizeof d->streams);
}
