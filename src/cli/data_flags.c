/* data_flags.c — --data given as a URL. See data_flags.h. */
#include "data_flags.h"

#include "commands.h"

bb_status data_flags_resolve(data_flags *d, const char **path)
{
    if (!*path || !bb_remote_is_url(*path)) return BB_OK;
    if (d->used == 2) return bb_fail(BB_ERR_INTERNAL, "more than two remote datasets in one command");
    d->remote.cache_bytes = (uint64_t)(d->cache_gib * (double)(1ull << 30));
    d->remote.interrupted = &bb_cli_interrupted;
    char *out = d->local[d->used];
    d->remote.stats = &d->stats[d->used];
    BB_TRY(bb_remote_mirror(*path, &d->remote, out, sizeof d->local[0]));
    d->used++;
    *path = out;
    return BB_OK;
}
